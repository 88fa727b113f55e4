//! Workers that run a reconcile function over a [`Queue`], only while this process may act
//! (it leads, and its caches are live), with the retry policy decided by the error.

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::health::Health;
use crate::leader::Leadership;
use crate::queue::Queue;

/// What a successful pass asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing until the object (or something it depends on) changes.
    Done,
    /// Pass again after this long (a real deadline, such as a release delay).
    RequeueAfter(Duration),
}

/// How a failed pass is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// With the key's exponential backoff (conflicts start at 5 ms and double).
    Backoff,
    /// Not at all: the object is gone, or the error can only be fixed by a change that
    /// will trigger a pass by itself.
    Never,
}

/// An error of a pass.
pub trait PassError: Display {
    fn retry(&self) -> Retry;
    /// A short static label for metrics.
    fn category(&self) -> &'static str;
}

/// Whether this process may act: it leads and its view is live — and, once per term, the
/// takeover barrier: a replica that just became the leader acts only once every watch has
/// a stream open ([`Health::caches_connected`]). A follower's watch can still be waiting
/// out a backoff when the lease comes to it (kube-apiserver back from a restart, the old
/// leader killed meanwhile); its cache then lacks the old leader's last writes — binds,
/// invitations, releases — and a new leader acting on it would count a quota short or
/// invite a driver for a claim already served. The barrier cuts those backoffs short and
/// waits for the reconnect, whose stream replays what the cache missed.
#[derive(Clone)]
pub struct Gate {
    pub leadership: Arc<Leadership>,
    pub health: Arc<Health>,
    /// The term whose barrier passed.
    fresh_term: Arc<std::sync::atomic::AtomicU64>,
}

impl Gate {
    pub fn new(leadership: Arc<Leadership>, health: Arc<Health>) -> Self {
        Gate {
            leadership,
            health,
            fresh_term: Arc::default(),
        }
    }

    pub fn may_act(&self) -> bool {
        use std::sync::atomic::Ordering;
        if !(self.leadership.is_leader() && self.health.caches_live()) {
            return false;
        }
        let term = self.leadership.term();
        if self.fresh_term.load(Ordering::Acquire) == term {
            return true;
        }
        if self.health.caches_connected() {
            if self.fresh_term.swap(term, Ordering::AcqRel) != term {
                tracing::info!(term, "leading with every watch connected");
            }
            return true;
        }
        self.health.wake_watches();
        false
    }

    /// Resolves once the process may act (`Some(true)` when it had to wait), or with `None`
    /// once `closed` says the work is over while it may not.
    pub async fn ready(&self, closed: impl Fn() -> bool) -> Option<bool> {
        let mut waited = false;
        while !self.may_act() {
            if closed() {
                return None;
            }
            waited = true;
            tokio::select! {
                () = self.leadership.changed() => {}
                // Liveness has no change notification; this only runs while not acting.
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
        Some(waited)
    }
}

/// Records one pass (controller, result label, duration).
pub type Observe = Arc<dyn Fn(&'static str, &'static str, Duration) + Send + Sync>;

/// Runs `workers` workers of `controller` until the queue shuts down.
pub async fn run<K, F, Fut, E>(
    controller: &'static str,
    queue: Arc<Queue<K>>,
    workers: usize,
    gate: Gate,
    reconcile: F,
    observe: Observe,
) where
    K: Clone + Eq + Hash + Ord + Display + Send + Sync + 'static,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Outcome, E>> + Send,
    E: PassError,
{
    let reconcile = Arc::new(reconcile);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (queue, gate, reconcile, observe) = (
            queue.clone(),
            gate.clone(),
            reconcile.clone(),
            observe.clone(),
        );
        set.spawn(async move {
            loop {
                let Some(waited) = gate.ready(|| queue.is_shut_down()).await else {
                    // A follower's workers end with the queue too (shutdown), not only
                    // the leader's: the supervisor waits for them.
                    return;
                };
                if waited {
                    // Keys piled up while this process could not act (a follower's queue):
                    // the stall clock starts now, not when they arrived.
                    queue.touch();
                }
                let Some(key) = queue.next().await else {
                    return;
                };
                if !gate.may_act() {
                    // Leadership or liveness went away while waiting: keep the key.
                    queue.done(&key);
                    queue.add(key);
                    continue;
                }
                // The pass's result ends in this block, before the yield below: its error
                // type need not be Send.
                {
                    let start = Instant::now();
                    // A pass that panics is a failed pass: retried with backoff, its worker
                    // and its key's place in flight kept (a panic here used to end the
                    // worker and leave the key in flight for good).
                    let result = AssertUnwindSafe(reconcile(key.clone()))
                        .catch_unwind()
                        .await;
                    let label = match &result {
                        Ok(Ok(_)) => "success",
                        Ok(Err(e)) => e.category(),
                        Err(_) => "panic",
                    };
                    observe(controller, label, start.elapsed());
                    let Ok(result) = result else {
                        let delay = queue.add_backoff(key.clone());
                        tracing::error!(controller, %key, ?delay, "pass panicked; retried with backoff");
                        queue.done(&key);
                        continue;
                    };
                    match result {
                        Ok(Outcome::Done) => queue.forget(&key),
                        Ok(Outcome::RequeueAfter(d)) => {
                            queue.forget(&key);
                            queue.add_after(key.clone(), d);
                        }
                        Err(e) => match e.retry() {
                            Retry::Backoff => {
                                let delay = queue.add_backoff(key.clone());
                                let failures = queue.failures(&key);
                                if failures >= 3 {
                                    tracing::warn!(controller, %key, failures, ?delay, error = %e, "pass failed");
                                } else {
                                    tracing::debug!(controller, %key, ?delay, error = %e, "pass failed");
                                }
                            }
                            Retry::Never => {
                                tracing::debug!(controller, %key, error = %e, "pass failed; not retried");
                                queue.forget(&key);
                            }
                        },
                    }
                    queue.done(&key);
                }
                // A pass that waited on nothing (a cache read and no write — every pass over
                // a settled object) never returned to the runtime, nor did `next` with keys
                // ready: a queue of 100,000 held both runtime threads until it was empty, and
                // a new leader missed its lease renewal behind its first pass over
                // everything. Now every worker gives way once its cooperative budget is spent.
                tokio::task::coop::consume_budget().await;
            }
        });
    }
    while set.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::Bounds;
    use std::sync::Mutex;

    #[derive(Debug)]
    struct E(Retry);
    impl Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }
    impl PassError for E {
        fn retry(&self) -> Retry {
            self.0
        }
        fn category(&self) -> &'static str {
            "test"
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_leader_acts_and_errors_and_panics_retry_by_kind() {
        let leadership = Leadership::follower();
        let gate = Gate::new(leadership.clone(), Health::new(Bounds::default()));
        let queue = Arc::new(Queue::<String>::new(Default::default()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let runner = {
            let seen = seen.clone();
            tokio::spawn(run(
                "test",
                queue.clone(),
                2,
                gate,
                move |k: String| {
                    let seen = seen.clone();
                    async move {
                        let n = {
                            let mut s = seen.lock().unwrap();
                            s.push(k.clone());
                            s.iter().filter(|x| **x == k).count()
                        };
                        match (k.as_str(), n) {
                            ("flaky", 1 | 2) => Err(E(Retry::Backoff)),
                            ("panics", 1) => panic!("a pass panicked"),
                            ("gone", _) => Err(E(Retry::Never)),
                            _ => Ok(Outcome::Done),
                        }
                    }
                },
                Arc::new(|_, _, _| {}),
            ))
        };
        queue.add_all(["flaky", "gone", "ok", "panics"].map(String::from));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(seen.lock().unwrap().is_empty(), "a follower does nothing");
        leadership_set(&leadership, true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        // The pass that panicked was retried (and its worker lived on to do it).
        assert_eq!(
            got,
            ["flaky", "flaky", "flaky", "gone", "ok", "panics", "panics"]
        );
        queue.shut_down();
        runner.await.unwrap();
    }

    /// Passes that finish without waiting on anything do not hold the runtime thread for the
    /// whole queue: a timer (the lease's renewal) fires while the queue is still being worked
    /// off.
    #[tokio::test(flavor = "current_thread")]
    async fn workers_give_way_to_other_tasks_between_passes() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const N: usize = 20_000;
        let leadership = Leadership::follower();
        leadership_set(&leadership, true);
        let gate = Gate::new(leadership, Health::new(Bounds::default()));
        let queue = Arc::new(Queue::<String>::new(Default::default()));
        queue.add_all((0..N).map(|i| format!("k{i}")));
        let done = Arc::new(AtomicUsize::new(0));
        let runner = {
            let done = done.clone();
            tokio::spawn(run(
                "test",
                queue.clone(),
                2,
                gate,
                move |_k: String| {
                    let done = done.clone();
                    async move {
                        done.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, E>(Outcome::Done)
                    }
                },
                Arc::new(|_, _, _| {}),
            ))
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let at_timer = done.load(Ordering::Relaxed);
        tokio::time::timeout(Duration::from_secs(60), async {
            while done.load(Ordering::Relaxed) < N {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap();
        assert!(
            at_timer < N,
            "the timer fired only after every pass ({at_timer} of {N})"
        );
        queue.shut_down();
        runner.await.unwrap();
    }

    /// A follower's queue fills for longer than the stall bound; when it becomes the leader
    /// its workers act (they must not wait for a readiness that only their work restores).
    #[tokio::test(start_paused = true)]
    async fn a_new_leader_works_off_what_piled_up_as_a_follower() {
        let leadership = Leadership::follower();
        let health = Health::new(Bounds {
            silence: Duration::from_secs(3600),
            stall: Duration::from_secs(60),
        });
        let queue = Arc::new(Queue::<String>::new(Default::default()));
        {
            let (l, q) = (leadership.clone(), queue.clone());
            health.queue("claims", q, move || l.is_leader());
        }
        let (runner, done) = recording(&queue, 2, Gate::new(leadership.clone(), health.clone()));
        queue.add_all((0..10).map(|i| format!("k{i}")));
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(done.lock().unwrap().len(), 0, "a follower does nothing");
        assert!(health.ready(), "a follower's idle queue is not a stall");
        leadership_set(&leadership, true);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            done.lock().unwrap().len(),
            10,
            "the new leader works the backlog off"
        );
        assert!(health.ready(), "{:?}", health.problems());
        queue.shut_down();
        runner.await.unwrap();
    }

    /// The takeover barrier: a new term acts only once every watch has a stream open; a
    /// watch reconnecting in the middle of a term does not stop the leader.
    #[tokio::test(start_paused = true)]
    async fn a_new_leader_waits_for_its_watches_to_reconnect_once_per_term() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let leadership = Leadership::follower();
        let health = Health::new(Bounds {
            silence: Duration::from_secs(3600),
            stall: Duration::from_secs(3600),
        });
        let cache = crate::cache::Cache::<ConfigMap>::new("ConfigMap", Arc::default());
        health.watch(cache.health.clone());
        cache.health.mark_synced();
        let queue = Arc::new(Queue::<String>::new(Default::default()));
        let (runner, done) = recording(&queue, 1, Gate::new(leadership.clone(), health.clone()));
        let acted = |k: &str| done.lock().unwrap().iter().any(|x| x == k);
        // Term 1, every watch connected: acts (the positive control).
        leadership_set(&leadership, true);
        queue.add("first".to_string());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(acted("first"));
        // Mid-term, a watch drops and reconnects: the leader keeps acting meanwhile.
        cache.health.set_connected(false);
        queue.add("mid-term".to_string());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(acted("mid-term"), "the barrier is once per term");
        // Leadership lost and won again while the watch is still down (in a backoff):
        // nothing is done until it is back — however long that takes.
        leadership_set(&leadership, false);
        leadership_set(&leadership, true);
        assert_eq!(leadership.term(), 2);
        queue.add("takeover".to_string());
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(
            !acted("takeover"),
            "a new leader with a disconnected watch waits"
        );
        cache.health.set_connected(true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(acted("takeover"), "and acts once it is back");
        queue.shut_down();
        runner.await.unwrap();
    }

    /// Runs `workers` workers whose passes record their key and succeed.
    fn recording(
        queue: &Arc<Queue<String>>,
        workers: usize,
        gate: Gate,
    ) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Vec<String>>>) {
        let done = Arc::new(Mutex::new(Vec::new()));
        let d = done.clone();
        let runner = tokio::spawn(run(
            "test",
            queue.clone(),
            workers,
            gate,
            move |k: String| {
                let d = d.clone();
                async move {
                    d.lock().unwrap().push(k);
                    Ok::<_, E>(Outcome::Done)
                }
            },
            Arc::new(|_, _, _| {}),
        ));
        (runner, done)
    }

    fn leadership_set(l: &Leadership, v: bool) {
        l.set(v);
    }

    /// A follower's workers wait for leadership; at shutdown they end with their queue, as
    /// the leader's do — before, they waited on leadership for good, and the supervisor
    /// gave them its whole grace.
    #[tokio::test(start_paused = true)]
    async fn a_followers_workers_end_when_their_queue_shuts_down() {
        let gate = Gate::new(Leadership::follower(), Health::new(Bounds::default()));
        let queue = Arc::new(Queue::<String>::new(Default::default()));
        let workers = tokio::spawn(run(
            "test",
            queue.clone(),
            2,
            gate,
            |_k: String| async { Ok::<_, E>(Outcome::Done) },
            Arc::new(|_, _, _| {}),
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!workers.is_finished(), "a follower's workers wait");
        queue.shut_down();
        tokio::time::timeout(Duration::from_secs(1), workers)
            .await
            .expect("the follower's workers ended within a second of the shutdown")
            .unwrap();
    }
}
