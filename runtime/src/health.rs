//! Whether this process's view of the cluster is live, for readiness and for acting.
//!
//! Live means: every watched cache completed its initial list, every watch heard from the
//! API server (an event, a bookmark — kube-apiserver sends one about every minute — or a
//! list) within the silence bound, and no work queue has had work ready that nobody took
//! for longer than the stall bound. A replica that is not live reports not ready, and a
//! leader that is not live does not act. The watchdog restarts a watch that has been
//! silent past the bound (it lists again), so a wedged connection heals by itself.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use clap::Args;

use crate::cache::{WatchConfig, WatchHealth};

type Check = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// The bounds of liveness.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// A watch silent longer than this is not live, and is restarted.
    pub silence: Duration,
    /// A queue with ready work that no worker took for this long is stalled.
    pub stall: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            silence: Duration::from_secs(90),
            stall: Duration::from_secs(60),
        }
    }
}

/// The liveness flags every binary shares.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Liveness of the caches")]
pub struct LivenessArgs {
    /// A watch that heard nothing (no event, no bookmark) for this long makes the process
    /// not ready (a leader stops acting) and is restarted. kube-apiserver sends every watch
    /// a bookmark about once a minute and before the watch's timeout.
    #[arg(long, env = "ADDRESS_CONTROLLER_WATCH_SILENCE_BOUND", default_value = "90s", value_parser = address_controller_api::duration::parse)]
    pub watch_silence_bound: Duration,
    /// Server-side length of one watch request; the watch is renewed after it.
    #[arg(long, env = "ADDRESS_CONTROLLER_WATCH_TIMEOUT", default_value = "290s", value_parser = address_controller_api::duration::parse)]
    pub watch_timeout: Duration,
    /// Take the caches' initial state as streaming lists (a watch with sendInitialEvents)
    /// rather than pages of 500; a server that refuses them gets pages in any case. Off by
    /// default: kube-apiserver 1.36 spends more CPU on a streaming list than on the same
    /// objects in pages (docs/design.md, restart → ready).
    #[arg(long, env = "ADDRESS_CONTROLLER_STREAMING_LISTS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub streaming_lists: bool,
    /// A work queue with ready work that no worker took for this long makes the leader not
    /// ready.
    #[arg(long, env = "ADDRESS_CONTROLLER_QUEUE_STALL_BOUND", default_value = "60s", value_parser = address_controller_api::duration::parse)]
    pub queue_stall_bound: Duration,
}

impl LivenessArgs {
    pub fn bounds(&self) -> Bounds {
        Bounds {
            silence: self.watch_silence_bound,
            stall: self.queue_stall_bound,
        }
    }

    pub fn watch_config(&self) -> WatchConfig {
        WatchConfig {
            timeout: self.watch_timeout,
            streaming_lists: self.streaming_lists,
            ..WatchConfig::default()
        }
    }
}

/// Every watch and every extra check of one process.
pub struct Health {
    pub bounds: Bounds,
    watches: RwLock<Vec<Arc<WatchHealth>>>,
    checks: RwLock<Vec<(&'static str, Check)>>,
}

impl Health {
    pub fn new(bounds: Bounds) -> Arc<Self> {
        Arc::new(Health {
            bounds,
            watches: RwLock::new(Vec::new()),
            checks: RwLock::new(Vec::new()),
        })
    }

    pub fn watch(&self, w: Arc<WatchHealth>) {
        self.watches
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(w);
    }

    /// Adds a named check: `Some(reason)` while it fails.
    pub fn check(
        &self,
        name: &'static str,
        f: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) {
        self.checks
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name, Box::new(f)));
    }

    /// Adds a check that a work queue is not stalled while `active` (a follower's workers
    /// idle on purpose).
    pub fn queue<K>(
        &self,
        name: &'static str,
        q: Arc<crate::queue::Queue<K>>,
        active: impl Fn() -> bool + Send + Sync + 'static,
    ) where
        K: Clone + Eq + std::hash::Hash + Ord + Send + Sync + 'static,
    {
        let bound = self.bounds.stall;
        self.check(name, move || {
            (active() && q.stalled(bound))
                .then(|| format!("work queue has had ready work nobody took for over {bound:?}"))
        });
    }

    pub fn watches(&self) -> Vec<Arc<WatchHealth>> {
        self.watches
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every initial list completed.
    pub fn synced(&self) -> bool {
        self.watches().iter().all(|w| w.synced())
    }

    /// Resolves once every watch completed its initial list.
    pub async fn wait_synced(&self) {
        for w in self.watches() {
            w.wait_synced().await;
        }
    }

    /// Why this process is not live, one line per failing check; empty when live.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for w in self.watches() {
            if !w.synced() {
                out.push(format!("cache {}: initial list not complete", w.kind));
            } else if w.silence() > self.bounds.silence {
                out.push(format!(
                    "cache {}: watch silent for {:?} (bound {:?})",
                    w.kind,
                    w.silence(),
                    self.bounds.silence
                ));
            }
        }
        for (name, f) in self
            .checks
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            if let Some(why) = f() {
                out.push(format!("{name}: {why}"));
            }
        }
        out
    }

    /// Every check passes: what `/readyz` reports.
    pub fn ready(&self) -> bool {
        self.problems().is_empty()
    }

    /// The caches are live: every watch synced and heard from within the silence bound.
    /// This alone gates acting — the extra checks (queues) only affect readiness: a stalled
    /// queue must not stop the workers that would unstall it.
    pub fn caches_live(&self) -> bool {
        self.watches()
            .iter()
            .all(|w| w.synced() && w.silence() <= self.bounds.silence)
    }

    /// Every watch has a stream open on top of a complete state
    /// ([`WatchHealth::connected`]).
    pub fn caches_connected(&self) -> bool {
        self.watches().iter().all(|w| w.connected())
    }

    /// Cuts every watch's backoff short.
    pub fn wake_watches(&self) {
        for w in self.watches() {
            if !w.connected() {
                w.wake();
            }
        }
    }

    /// Restarts watches that are silent past the bound; runs for as long as the process.
    pub async fn watchdog(self: Arc<Self>) {
        let every =
            (self.bounds.silence / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            tokio::time::sleep(every).await;
            for w in self.watches() {
                if w.synced() && w.silence() > self.bounds.silence {
                    w.restart();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cache::Cache;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[tokio::test(start_paused = true)]
    async fn not_live_until_synced_then_when_silent_or_a_queue_stalls() {
        let health = Health::new(Bounds {
            silence: Duration::from_secs(10),
            stall: Duration::from_secs(5),
        });
        let cache: Arc<Cache<ConfigMap>> = Cache::new("ConfigMap", Arc::default());
        health.watch(cache.health.clone());
        assert_eq!(
            health.problems(),
            ["cache ConfigMap: initial list not complete"]
        );
        cache.health.mark_synced();
        assert!(health.ready() && health.caches_live());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(
            health.problems()[0].contains("silent"),
            "{:?}",
            health.problems()
        );

        cache.health.mark_synced();
        let q = Arc::new(crate::queue::Queue::<String>::new(Default::default()));
        health.queue("claims", q.clone(), || true);
        q.add("a".into());
        assert!(health.ready(), "fresh work is not a stall");
        tokio::time::advance(Duration::from_secs(6)).await;
        let p = health.problems();
        assert!(
            p.iter().any(|p| p.starts_with("claims: work queue")),
            "{p:?}"
        );
    }
}
