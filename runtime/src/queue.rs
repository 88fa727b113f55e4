//! A work queue with the semantics of client-go's workqueue, which every Kubernetes
//! controller author knows: a key is queued at most once, a key is never processed by two
//! workers at once (a key added while it runs is processed again afterwards), delayed adds
//! keep the earliest deadline, and failures back off exponentially per key until the key
//! succeeds (or is forgotten because its object is gone).
//!
//! Producers (watch handlers) only insert into sets: adding never blocks and never waits
//! for a consumer, so a slow reconciler cannot stall a watch. Stalls are detected instead:
//! [`Queue::stalled`] reports a queue that has work ready while no worker picked anything
//! up for longer than a bound.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Exponential backoff per key: `base * 2^(failures-1)`, capped.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        // client-go's default controller rate limiter: 5 ms doubling up to 1000 s. A lower
        // cap suits a binder: an address that cannot be written for minutes is retried at
        // least every five.
        Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay before retry number `failures` (1 = the first retry).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        self.base
            .checked_mul(1u32 << exp)
            .map_or(self.max, |d| d.min(self.max))
    }
}

struct State<K> {
    /// Keys ready to be handed out, in order.
    ready: VecDeque<K>,
    /// Keys in `ready` (a key is queued once).
    queued: HashSet<K>,
    /// Keys a worker is processing now.
    running: HashSet<K>,
    /// Keys added while running: queued again when their worker finishes.
    dirty: HashSet<K>,
    /// Delayed keys: (deadline, sequence) → key, and each key's earliest deadline.
    delayed: BTreeSet<(Instant, u64, K)>,
    deadline_of: HashMap<K, (Instant, u64)>,
    seq: u64,
    failures: HashMap<K, u32>,
    /// When a worker last took a key (or the queue was created).
    last_take: Instant,
    shut_down: bool,
    /// Keys that became ready (for metrics), and backoff re-adds after a failed pass.
    adds: u64,
    retries: u64,
    /// When each ready key became ready, and each running key started (for metrics).
    ready_at: HashMap<K, Instant>,
    started: HashMap<K, Instant>,
    /// How long keys waited in `ready` before a worker took them.
    wait: WaitHistogram,
}

/// Keys queued under one lock by [`Queue::add_all_in_chunks`].
pub const CHUNK: usize = 1_000;

/// Upper bounds (seconds) of the queue-wait histogram's buckets.
pub const WAIT_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0];

/// How long keys waited to be taken: counts per bucket of [`WAIT_BUCKETS`] (not
/// cumulative), the sum in microseconds, the count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitHistogram {
    pub buckets: [u64; WAIT_BUCKETS.len()],
    pub sum_micros: u64,
    pub count: u64,
}

impl WaitHistogram {
    fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = WAIT_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i] += 1;
        }
        self.sum_micros = self
            .sum_micros
            .saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.count += 1;
    }
}

/// What a queue has done and holds, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub ready: usize,
    pub delayed: usize,
    pub running: usize,
    /// Keys that became ready, since the queue was created.
    pub adds: u64,
    /// Re-adds with backoff after a failed pass, since the queue was created.
    pub retries: u64,
    /// How long keys waited between becoming ready and a worker taking them.
    pub wait: WaitHistogram,
    /// How long the longest-running pass in hand has run, and all of them together
    /// (client-go's longest_running_processor_seconds and unfinished_work_seconds).
    pub longest_running: Duration,
    pub unfinished: Duration,
}

/// See the module documentation.
pub struct Queue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    backoff: Backoff,
}

impl<K: Clone + Eq + Hash + Ord> Queue<K> {
    pub fn new(backoff: Backoff) -> Self {
        Queue {
            state: Mutex::new(State {
                ready: VecDeque::new(),
                queued: HashSet::new(),
                running: HashSet::new(),
                dirty: HashSet::new(),
                delayed: BTreeSet::new(),
                deadline_of: HashMap::new(),
                seq: 0,
                failures: HashMap::new(),
                last_take: Instant::now(),
                shut_down: false,
                adds: 0,
                retries: 0,
                ready_at: HashMap::new(),
                started: HashMap::new(),
                wait: WaitHistogram::default(),
            }),
            notify: Notify::new(),
            backoff,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key` now.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if Self::enqueue(&mut s, key) {
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Queues every key of `keys` now.
    pub fn add_all(&self, keys: impl IntoIterator<Item = K>) {
        let mut s = self.lock();
        let mut n = 0;
        for k in keys {
            if Self::enqueue(&mut s, k) {
                n += 1;
            }
        }
        drop(s);
        for _ in 0..n {
            self.notify.notify_one();
        }
    }

    /// Queues every key of `keys` in chunks of [`CHUNK`], giving way between them — for a
    /// new leader's every object: 200,000 keys under one lock held every worker waiting on
    /// it (and the runtime threads they run on) for a second.
    pub async fn add_all_in_chunks(&self, keys: Vec<K>) {
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            self.add_all(keys.by_ref().take(CHUNK));
            tokio::task::yield_now().await;
        }
    }

    /// How long [`Queue::add_first_then`] waits, at most, for the first keys' passes.
    pub const FIRST_PATIENCE: Duration = Duration::from_secs(1);

    /// Takes every ready key out of the queue (delayed and running keys stay), to be queued
    /// again later — what a follower's queue piled up, held back while a new leader's first
    /// keys run.
    pub fn take_ready(&self) -> Vec<K> {
        let mut s = self.lock();
        let keys: Vec<K> = s.ready.drain(..).collect();
        for k in &keys {
            s.queued.remove(k);
            s.ready_at.remove(k);
        }
        keys
    }

    /// Queues `first` (in chunks), waits until none of them is queued or running — at most
    /// `patience` — then queues `then`. A new leader's claims a tenant waits on go first,
    /// and alone: queued ahead of 20,000 settled claims but run beside them, their passes'
    /// round-trips still waited for the two cores those passes kept busy.
    pub async fn add_first_then(&self, first: Vec<K>, then: Vec<K>, patience: Duration) {
        let until = tokio::time::Instant::now() + patience;
        self.add_all_in_chunks(first.clone()).await;
        while tokio::time::Instant::now() < until {
            let pending = {
                let s = self.lock();
                first
                    .iter()
                    .any(|k| s.queued.contains(k) || s.running.contains(k))
            };
            if !pending {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.add_all_in_chunks(then).await;
    }

    /// A new leader's first passes, the same for the core and every driver: what this
    /// queue and `others` piled up while following (every change since the process
    /// started) is taken out, the keys a tenant waits on (`waiting`) run alone — at most
    /// [`Queue::FIRST_PATIENCE`] — then `settled` and what was taken out are queued again,
    /// this queue's first.
    pub async fn lead(&self, waiting: Vec<K>, settled: Vec<K>, others: &[&Queue<K>]) {
        let parked = self.take_ready();
        let parked_others: Vec<Vec<K>> = others.iter().map(|q| q.take_ready()).collect();
        self.add_first_then(waiting, settled, Self::FIRST_PATIENCE)
            .await;
        self.add_all_in_chunks(parked).await;
        for (q, keys) in others.iter().zip(parked_others) {
            q.add_all_in_chunks(keys).await;
        }
    }

    /// True when the key became ready (it was neither queued nor running).
    fn enqueue(s: &mut State<K>, key: K) -> bool {
        if s.shut_down {
            return false;
        }
        if let Some(at) = s.deadline_of.remove(&key) {
            s.delayed.remove(&(at.0, at.1, key.clone()));
        }
        if s.running.contains(&key) {
            s.dirty.insert(key);
            return false;
        }
        if s.queued.insert(key.clone()) {
            s.ready_at.insert(key.clone(), Instant::now());
            s.ready.push_back(key);
            s.adds += 1;
            return true;
        }
        false
    }

    /// Queues `key` after `delay`; an earlier pending deadline for the key wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut s = self.lock();
        if s.shut_down || s.queued.contains(&key) {
            return;
        }
        if let Some(&(old, seq)) = s.deadline_of.get(&key) {
            if old <= at {
                return;
            }
            s.delayed.remove(&(old, seq, key.clone()));
        }
        s.seq += 1;
        let seq = s.seq;
        s.delayed.insert((at, seq, key.clone()));
        s.deadline_of.insert(key, (at, seq));
        drop(s);
        // A worker may be sleeping until a later deadline.
        self.notify.notify_one();
    }

    /// Queues `key` after its next backoff delay and returns that delay.
    pub fn add_backoff(&self, key: K) -> Duration {
        let failures = {
            let mut s = self.lock();
            s.retries += 1;
            let n = s.failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let delay = self.backoff.delay(failures);
        self.add_after(key, delay);
        delay
    }

    /// Resets the backoff of `key` (it succeeded, or its object is gone).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Failures of `key` since it last succeeded.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Waits for the next key and marks it running. `None` once the queue is shut down.
    pub async fn next(&self) -> Option<K> {
        loop {
            // Registered before the state is read, so a notification sent in between
            // (notify_one or notify_waiters) is not lost.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = {
                let mut s = self.lock();
                if s.shut_down {
                    return None;
                }
                let now = Instant::now();
                // Move due delayed keys to ready.
                while let Some((at, seq, key)) = s.delayed.first().cloned() {
                    if at > now {
                        break;
                    }
                    s.delayed.remove(&(at, seq, key.clone()));
                    s.deadline_of.remove(&key);
                    Self::enqueue(&mut s, key);
                }
                if let Some(key) = s.ready.pop_front() {
                    s.queued.remove(&key);
                    if let Some(at) = s.ready_at.remove(&key) {
                        s.wait.observe(now.saturating_duration_since(at));
                    }
                    s.started.insert(key.clone(), now);
                    s.running.insert(key.clone());
                    s.last_take = now;
                    // Let another worker look at what is left.
                    if !s.ready.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                s.delayed.first().map(|(at, _, _)| *at)
            };
            match wake_at {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at, notified).await;
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` finished; it is queued again if it was added while running.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.running.remove(key);
        s.started.remove(key);
        if s.dirty.remove(key) && Self::enqueue(&mut s, key.clone()) {
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Stops handing out keys; waiting workers get `None`.
    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.notify.notify_waiters();
    }

    /// Whether [`Queue::shut_down`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.lock().shut_down
    }

    /// Keys ready, delayed and running (for metrics).
    pub fn depth(&self) -> (usize, usize, usize) {
        let s = self.lock();
        (s.ready.len(), s.delayed.len(), s.running.len())
    }

    /// Depth and counts, for metrics.
    pub fn stats(&self) -> QueueStats {
        let s = self.lock();
        let now = Instant::now();
        let running = s
            .started
            .values()
            .map(|t| now.saturating_duration_since(*t));
        let (longest_running, unfinished) = running
            .fold((Duration::ZERO, Duration::ZERO), |(l, u), d| {
                (l.max(d), u + d)
            });
        QueueStats {
            ready: s.ready.len(),
            delayed: s.delayed.len(),
            running: s.running.len(),
            adds: s.adds,
            retries: s.retries,
            wait: s.wait,
            longest_running,
            unfinished,
        }
    }

    /// Workers start taking keys now (they could not before): what piled up meanwhile is not
    /// a stall.
    pub fn touch(&self) {
        self.lock().last_take = Instant::now();
    }

    /// Work is ready, yet no worker took any for longer than `bound`: the consumers are
    /// stuck (a worker hangs, or nobody polls the queue).
    pub fn stalled(&self, bound: Duration) -> bool {
        let s = self.lock();
        !s.ready.is_empty() && s.last_take.elapsed() > bound
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Arc;

    fn q() -> Queue<String> {
        Queue::new(Backoff::default())
    }

    /// Every key queued once, a chunk at a time: another task runs between the chunks.
    #[tokio::test(flavor = "current_thread")]
    async fn keys_added_in_chunks_give_way_between_them() {
        let q = Arc::new(q());
        let n = 3 * CHUNK + 7;
        let mut keys: Vec<String> = (0..n).map(|i| format!("k{i:05}")).collect();
        keys.push("k00000".into());
        let seen = {
            let q = q.clone();
            // Runs at the first yield: by then one chunk is queued, not all of them.
            tokio::spawn(async move { q.depth().0 })
        };
        q.add_all_in_chunks(keys).await;
        assert_eq!(seen.await.unwrap(), CHUNK);
        assert_eq!(q.depth().0, n, "each key once");
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_keys_run_alone_until_done_or_out_of_patience() {
        let q = Arc::new(q());
        let adding = {
            let q = q.clone();
            tokio::spawn(async move {
                let first = vec!["a".to_string()];
                let then = vec!["b".to_string(), "c".to_string()];
                q.add_first_then(first, then, Duration::from_secs(1)).await;
            })
        };
        let a = q.next().await.unwrap();
        assert_eq!(a, "a");
        // "a" still running: the others wait.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(q.depth(), (0, 0, 1));
        q.done(&a);
        adding.await.unwrap();
        assert_eq!(q.depth().0, 2, "queued once the first ran");
        // Out of patience: a first key that never finishes does not hold back the rest.
        let q = Arc::new(self::q());
        q.add("x".into());
        let _x = q.next().await.unwrap();
        let started = tokio::time::Instant::now();
        q.add_first_then(
            vec!["x".to_string()],
            vec!["y".to_string()],
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        assert_eq!(q.depth(), (1, 0, 1));
        // What piled up is taken out, and only that.
        q.add_after("z".into(), Duration::from_secs(5));
        assert_eq!(q.take_ready(), ["y"]);
        assert_eq!(q.depth(), (0, 1, 1));
        q.add("y".into());
        assert_eq!(q.depth().0, 1, "queued again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leader_runs_the_waiting_keys_before_what_piled_up() {
        let (claims, addresses) = (Arc::new(q()), Arc::new(q()));
        // A follower's queues hold every change it saw.
        claims.add("piled".into());
        addresses.add("address".into());
        let leading = {
            let (claims, addresses) = (claims.clone(), addresses.clone());
            tokio::spawn(async move {
                let (waiting, settled) = (vec!["new".to_string()], vec!["settled".to_string()]);
                claims.lead(waiting, settled, &[&addresses]).await;
            })
        };
        // The new leader's pass begins before its workers take a key.
        tokio::task::yield_now().await;
        let first = claims.next().await.unwrap();
        assert_eq!(first, "new");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(claims.depth(), (0, 0, 1), "the waiting key runs alone");
        assert_eq!(addresses.depth().0, 0, "held back too");
        claims.done(&first);
        leading.await.unwrap();
        assert_eq!(
            claims.depth().0,
            2,
            "the settled and the piled-up keys, queued again"
        );
        assert_eq!(addresses.next().await.unwrap(), "address");
    }

    #[tokio::test]
    async fn a_key_is_queued_once_and_never_runs_twice_at_once() {
        let q = q();
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.depth().0, 2);
        let a = q.next().await.unwrap();
        assert_eq!(a, "a");
        // Added while running: not handed out to a second worker...
        q.add("a".into());
        assert_eq!(q.next().await.unwrap(), "b");
        assert_eq!(q.depth().0, 0);
        // ...but queued again once the first worker is done.
        q.done(&a);
        assert_eq!(q.next().await.unwrap(), "a");
    }

    #[tokio::test(start_paused = true)]
    async fn waits_and_running_passes_are_measured() {
        let q = q();
        q.add("a".into());
        q.add("b".into());
        tokio::time::advance(Duration::from_millis(30)).await;
        let a = q.next().await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let b = q.next().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let s = q.stats();
        // a waited 30 ms (bucket ≤ 0.05), b 2.03 s (bucket ≤ 5).
        assert_eq!(s.wait.count, 2);
        assert_eq!(s.wait.sum_micros, 30_000 + 2_030_000);
        assert_eq!(s.wait.buckets[3], 1, "{:?}", s.wait);
        assert_eq!(s.wait.buckets[7], 1, "{:?}", s.wait);
        // a has run 3 s, b 1 s.
        assert_eq!(s.longest_running, Duration::from_secs(3));
        assert_eq!(s.unfinished, Duration::from_secs(4));
        q.done(&a);
        q.done(&b);
        let s = q.stats();
        assert_eq!(
            (s.longest_running, s.unfinished),
            (Duration::ZERO, Duration::ZERO)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_adds_keep_the_earliest_deadline_and_an_add_now_wins() {
        let q = q();
        q.add_after("a".into(), Duration::from_secs(10));
        q.add_after("a".into(), Duration::from_secs(20));
        q.add_after("a".into(), Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(q.next().await.unwrap(), "a");
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        q.done(&"a".to_string());
        q.add_after("b".into(), Duration::from_secs(60));
        q.add("b".into());
        let start = Instant::now();
        assert_eq!(q.next().await.unwrap(), "b");
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(q.depth().1, 0, "the delayed entry was replaced");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_per_key_until_forgotten() {
        let q = q();
        let delays: Vec<Duration> = (0..4).map(|_| q.add_backoff("a".into())).collect();
        assert_eq!(
            delays,
            [5, 10, 20, 40].map(Duration::from_millis).to_vec(),
            "per-key doubling"
        );
        assert_eq!(q.add_backoff("b".into()), Duration::from_millis(5));
        assert_eq!(q.failures(&"a".to_string()), 4);
        q.forget(&"a".to_string());
        assert_eq!(q.failures(&"a".to_string()), 0);
        assert_eq!(
            Backoff::default().delay(40),
            Duration::from_secs(300),
            "capped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_nobody_takes_from_reports_a_stall() {
        let q = q();
        assert!(!q.stalled(Duration::from_secs(1)), "empty is not stalled");
        q.add("a".into());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(q.stalled(Duration::from_secs(1)));
        let k = q.next().await.unwrap();
        assert!(!q.stalled(Duration::from_secs(1)));
        q.done(&k);
    }

    #[tokio::test]
    async fn shut_down_releases_waiting_workers() {
        let q = std::sync::Arc::new(q());
        let w = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await })
        };
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(w.await.unwrap(), None);
    }
}
