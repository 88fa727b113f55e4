//! The history's records (`IPAddressRecord`): created once by the component whose entry
//! closed — the core its holdings, a driver its spans — before the write that moves the
//! entry off the address, so every closed entry is on its address or in a record at every
//! instant, whatever crashes between the two. A second create of one entry (a retry, a
//! crash before the address's write) is refused as already there, and that is success.

use std::sync::Mutex;
use std::time::Duration;

use address_controller_api::IPAddressRecord;
use address_controller_api::history::Record;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;

/// What came of [`ensure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    /// Every record is there; this many were created now.
    Created(usize),
    /// Records cannot be made here: the kind is not installed (an upgrade that skipped the
    /// CRDs) or the writer may not create them. The entries stay on the address — kept,
    /// not moved — and the writer says so.
    Unavailable(String),
}

/// Creates the records of `entries`, skipping those already there.
pub async fn ensure(client: &Client, entries: &[Record]) -> Result<Ensured, kube::Error> {
    if entries.is_empty() {
        return Ok(Ensured::Created(0));
    }
    let api: Api<IPAddressRecord> = Api::all(client.clone());
    let mut created = 0;
    for e in entries {
        match api.create(&PostParams::default(), &e.to_object()).await {
            Ok(_) => created += 1,
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {
                return Ok(Ensured::Unavailable(format!(
                    "IPAddressRecords cannot be created ({} {}): the history stays on the address",
                    s.code, s.message
                )));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Ensured::Created(created))
}

/// Spaces out writes of one kind to at most one per `interval`, whoever asks: the moves of
/// an upgrade's backlog never come as a burst, however many addresses have one.
pub struct Pacer {
    interval: Duration,
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    /// `per_second` writes a second at most (0: one a second).
    pub fn new(per_second: f64) -> Pacer {
        let per_second = if per_second > 0.0 { per_second } else { 1.0 };
        Pacer {
            interval: Duration::from_secs_f64(1.0 / per_second),
            next: Mutex::new(None),
        }
    }

    /// Waits for this caller's turn.
    pub async fn turn(&self) {
        let at = {
            let mut next = self
                .next
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            let at = next.map_or(now, |n| n.max(now));
            *next = Some(at + self.interval);
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pacer_spaces_its_callers_whoever_they_are() {
        let p = std::sync::Arc::new(Pacer::new(4.0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..9 {
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                p.turn().await;
                Instant::now()
            }));
        }
        let mut times = Vec::new();
        for t in tasks {
            times.push(t.await.expect("task") - start);
        }
        times.sort();
        assert_eq!(times[0], Duration::ZERO);
        assert_eq!(times[8], Duration::from_secs(2), "9 turns at 4 a second");
    }
}
