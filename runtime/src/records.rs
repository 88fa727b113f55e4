//! The history's records (`IPAddressRecord`): created once by the component whose entry
//! closed — the core its holdings, a driver its spans — before the write that moves the
//! entry off the address, so every closed entry is on its address or in a record at every
//! instant, whatever crashes between the two. A second create of one entry (a retry, a
//! crash before the address's write) is refused as already there, and that is success.

use std::collections::HashMap;
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
    /// Turns reserved by [`Pacer::slot`], by key, and when they were last swept.
    slots: Mutex<(HashMap<String, Instant>, Option<Instant>)>,
}

/// A reserved turn nobody came back for is let go this long after it.
const SLOT_KEPT: Duration = Duration::from_secs(60);

impl Pacer {
    /// `per_second` writes a second at most (0: one a second).
    pub fn new(per_second: f64) -> Pacer {
        let per_second = if per_second > 0.0 { per_second } else { 1.0 };
        Pacer {
            interval: Duration::from_secs_f64(1.0 / per_second),
            next: Mutex::new(None),
            slots: Mutex::new((HashMap::new(), None)),
        }
    }

    /// Takes the next free turn, `now` at the earliest: when it is.
    fn reserve(&self, now: Instant) -> Instant {
        let mut next = self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = next.map_or(now, |n| n.max(now));
        *next = Some(at + self.interval);
        at
    }

    /// The turn of `key` without waiting in the caller: `None` when it is now (taken), else
    /// how long until the turn reserved for `key` — the caller comes back then (a worker is
    /// never held asleep, so passes of other keys go on). A key keeps its one reserved turn
    /// however often it asks; a turn nobody comes back for is let go after a minute.
    pub fn slot(&self, key: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut guard = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (slots, swept) = &mut *guard;
        if let Some(at) = slots.get(key).copied() {
            if at <= now {
                slots.remove(key);
                return None;
            }
            return Some(at - now);
        }
        let at = self.reserve(now);
        if at <= now {
            return None;
        }
        if swept.is_none_or(|t| now - t >= SLOT_KEPT) {
            slots.retain(|_, t| *t + SLOT_KEPT > now);
            *swept = Some(now);
        }
        slots.insert(key.to_string(), at);
        Some(at - now)
    }

    /// Waits for this caller's turn.
    pub async fn turn(&self) {
        let at = self.reserve(Instant::now());
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

    #[tokio::test(start_paused = true)]
    async fn a_slot_is_reserved_per_key_and_kept_when_asked_again() {
        let p = Pacer::new(4.0);
        assert_eq!(p.slot("a"), None, "the first turn is now");
        let quarter = Duration::from_millis(250);
        assert_eq!(p.slot("b"), Some(quarter));
        assert_eq!(p.slot("c"), Some(quarter * 2));
        // b asks again early: its place is kept, not a new one taken.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(p.slot("b"), Some(Duration::from_millis(150)));
        assert_eq!(p.slot("d"), Some(Duration::from_millis(650)));
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(p.slot("b"), None, "its turn");
        assert_eq!(
            p.slot("b"),
            Some(Duration::from_millis(750)),
            "then a new one"
        );
        // c never comes back: after a minute its turn is let go at the next sweep.
        tokio::time::advance(Duration::from_secs(120)).await;
        assert_eq!(p.slot("e"), None);
        assert_eq!(p.slot("f"), Some(quarter));
        let (slots, _) = &*p.slots.lock().unwrap();
        assert_eq!(slots.keys().collect::<Vec<_>>(), ["f"]);
    }
}
