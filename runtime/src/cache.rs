//! Watched caches: one list+watch per kind feeding an in-memory store, with change
//! handlers and health.
//!
//! Why not kube-runtime's shared reflector: its subscriber stream (`ReflectHandle`) returns
//! `Pending` without registering a waker when the object it was told about has already
//! left the store (a claim created and deleted within one poll). The subscriber is never
//! polled again, its 1024-slot broadcast buffer fills, and the reflector — which waits for
//! room — stops updating the store: a replica whose cache is frozen while it stays ready.
//!
//! Here nothing between the watch and its consumers can fill up or lose a wakeup:
//! handlers run synchronously on the watch task, after the store was updated, in
//! registration order (indexes first, then the triggers that queue keys — queuing only
//! inserts into a set). Bookmarks are requested and seen, so [`WatchHealth`] knows when a
//! watch last heard from the API server; [`crate::health::Health`] turns that into
//! readiness and restarts a watch that has been silent too long.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What a cached kind must be.
pub trait Object:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}
impl<T> Object for T where
    T: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// The key of an object: `namespace/name`, or `name` for cluster-scoped kinds.
pub fn key_of<K: Resource>(o: &K) -> String {
    match o.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", o.meta().name.as_deref().unwrap_or_default()),
        None => o.meta().name.clone().unwrap_or_default(),
    }
}

/// The key of `namespace`/`name`.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// One change of a cached object. `new == None` is a deletion (`old` is the last state).
#[derive(Debug)]
pub struct Change<K> {
    pub old: Option<Arc<K>>,
    pub new: Option<Arc<K>>,
}

impl<K> Change<K> {
    /// The object as it is now, or as it was last seen when deleted.
    pub fn object(&self) -> Option<&Arc<K>> {
        self.new.as_ref().or(self.old.as_ref())
    }
}

/// The objects of one kind, by key.
pub struct Store<K> {
    objects: RwLock<HashMap<String, Arc<K>>>,
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Store {
            objects: RwLock::new(HashMap::new()),
        }
    }
}

impl<K> Store<K> {
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every object (O(n): for full listings and start-up, never for a single decision).
    pub fn all(&self) -> Vec<Arc<K>> {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Every key (O(n)).
    pub fn keys(&self) -> Vec<String> {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Inserts or removes, returning the previous object.
    fn put(&self, key: String, new: Option<Arc<K>>) -> Option<Arc<K>> {
        let mut m = self.objects.write().unwrap_or_else(PoisonError::into_inner);
        match new {
            Some(o) => m.insert(key, o),
            None => m.remove(&key),
        }
    }

    /// Builds a store holding `objects` (for tests of code that reads stores).
    pub fn from_objects(objects: impl IntoIterator<Item = K>) -> Self
    where
        K: Resource,
    {
        Store {
            objects: RwLock::new(
                objects
                    .into_iter()
                    .map(|o| (key_of(&o), Arc::new(o)))
                    .collect(),
            ),
        }
    }
}

/// How a watch is doing. Everything here is cheap to read from probes and metrics.
pub struct WatchHealth {
    pub kind: &'static str,
    synced: AtomicBool,
    last_activity: Mutex<Instant>,
    /// Watch connections opened, lists done, events and bookmarks received.
    pub watches: AtomicU64,
    pub lists: AtomicU64,
    /// Of the lists, those taken as a streaming list (`sendInitialEvents`).
    pub streaming_lists: AtomicU64,
    pub events: AtomicU64,
    pub bookmarks: AtomicU64,
    /// Objects in the store.
    pub objects: AtomicU64,
    /// Asks the watch loop to drop its connection and list again.
    restart: Notify,
    /// A watch stream is open and the cache holds the state it resumed from (not in a
    /// backoff, not in the middle of a streaming list).
    connected: AtomicBool,
    /// Cuts a backoff short (a new leader wants its view now).
    wake: Notify,
    synced_notify: Notify,
}

impl WatchHealth {
    fn new(kind: &'static str) -> Self {
        WatchHealth {
            kind,
            synced: AtomicBool::new(false),
            last_activity: Mutex::new(Instant::now()),
            watches: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            streaming_lists: AtomicU64::new(0),
            events: AtomicU64::new(0),
            bookmarks: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            restart: Notify::new(),
            synced_notify: Notify::new(),
            connected: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// A watch stream is open and delivering changes on top of a complete state: what this
    /// cache does not show yet is at most the stream's latency behind. Not so during a
    /// backoff after an error (kube-apiserver restarting, say), which can last 30 s.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Release);
    }

    /// Retries at once if the watch is waiting out a backoff.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The initial list completed.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Resolves once the initial list completed (no polling).
    pub async fn wait_synced(&self) {
        loop {
            let notified = self.synced_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.synced() {
                return;
            }
            notified.await;
        }
    }

    /// Time since the API server last said anything on this watch (an event, a bookmark,
    /// a completed list).
    pub fn silence(&self) -> Duration {
        self.last_activity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }

    fn heard(&self) {
        *self
            .last_activity
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Marks the cache synced and live without an API server: for caches driven through
    /// [`Cache::apply`] (unit tests, replays).
    pub fn mark_synced(&self) {
        self.heard();
        self.set_connected(true);
        self.synced.store(true, Ordering::Release);
        self.synced_notify.notify_waiters();
    }

    /// Drops the connection and lists again (the watch has been silent too long).
    pub fn restart(&self) {
        self.restart.notify_one();
    }
}

type Handler<K> = Box<dyn Fn(&Change<K>) + Send + Sync>;

/// A watched cache of one kind: the store, its handlers and its health.
pub struct Cache<K> {
    pub store: Arc<Store<K>>,
    pub health: Arc<WatchHealth>,
    handlers: RwLock<Vec<Handler<K>>>,
    /// The highest resourceVersion seen on any watch sharing this counter (etcd revisions
    /// only grow, so this never goes backwards, across restarts and replicas alike).
    revision: Arc<AtomicU64>,
}

/// Settings of a watch.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// Server-side timeout of one watch request; the watch is renewed after it.
    pub timeout: Duration,
    /// Page size of lists.
    pub page_size: u32,
    /// Field selector, if any.
    pub fields: Option<String>,
    /// Label selector, if any.
    pub labels: Option<String>,
    /// Take the initial state as a streaming list (a watch with `sendInitialEvents`, ended
    /// by the `k8s.io/initial-events-end` bookmark) instead of paged lists; a server that
    /// refuses it gets paged lists from then on. Off by default (see
    /// [`crate::health::LivenessArgs`]).
    pub streaming_lists: bool,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            timeout: Duration::from_secs(290),
            page_size: 500,
            fields: None,
            labels: None,
            streaming_lists: false,
        }
    }
}

impl<K: Object> Cache<K> {
    pub fn new(kind: &'static str, revision: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Cache {
            store: Arc::new(Store::default()),
            health: Arc::new(WatchHealth::new(kind)),
            handlers: RwLock::new(Vec::new()),
            revision,
        })
    }

    /// Calls `f` with every change, after the store reflects it. Register handlers before
    /// the watch runs; `f` runs on the watch task and must only do cheap work (update an
    /// index, queue keys).
    pub fn on_change(&self, f: impl Fn(&Change<K>) + Send + Sync + 'static) {
        self.handlers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(f));
    }

    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.store.get(key)
    }

    /// Applies one change to the store and tells the handlers. Public so that tests can
    /// drive a cache without an API server.
    pub fn apply(&self, key: String, new: Option<Arc<K>>) {
        let old = self.store.put(key, new.clone());
        self.health
            .objects
            .store(self.store.len() as u64, Ordering::Relaxed);
        if old.is_none() && new.is_none() {
            return;
        }
        let change = Change { old, new };
        for h in self
            .handlers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            h(&change);
        }
    }

    fn note_revision(&self, rv: Option<&str>) {
        if let Some(rv) = rv.and_then(|v| v.parse::<u64>().ok()) {
            self.revision.fetch_max(rv, Ordering::AcqRel);
        }
    }

    /// The object as stored: without what is most of an object's size and nothing here
    /// reads — its managed fields, and `kubectl apply`'s copy of the object in an
    /// annotation (a claim or a Service a tenant applied carries itself twice). Nothing
    /// writes a stored object back whole: every write is a patch.
    fn strip(mut o: K) -> Arc<K> {
        let meta = o.meta_mut();
        meta.managed_fields = None;
        if let Some(a) = meta.annotations.as_mut() {
            a.remove(LAST_APPLIED);
        }
        Arc::new(o)
    }

    /// Lists every object and brings the store in line: new and changed objects are
    /// applied, objects that disappeared are deleted (a deletion that happened while the
    /// watch was down is still seen by the handlers). Returns the list's resourceVersion.
    async fn relist(&self, api: &Api<K>, cfg: &WatchConfig) -> Result<String, kube::Error> {
        let mut params = ListParams::default().limit(cfg.page_size);
        if let Some(f) = &cfg.fields {
            params = params.fields(f);
        }
        if let Some(l) = &cfg.labels {
            params = params.labels(l);
        }
        let mut seen: HashMap<String, Arc<K>> = HashMap::new();
        let mut version = String::new();
        loop {
            let page = api.list(&params).await?;
            if version.is_empty() {
                version = page.metadata.resource_version.clone().unwrap_or_default();
            }
            for o in page.items {
                let o = Self::strip(o);
                seen.insert(key_of(o.as_ref()), o);
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => params = params.continue_token(&c),
                None => break,
            }
        }
        self.settle(seen, &version);
        Ok(version)
    }

    /// Brings the store in line with a complete listing `seen` at `version`: new and
    /// changed objects are applied, objects that disappeared are deleted (a deletion that
    /// happened while the watch was down is still seen by the handlers); the first one
    /// marks the cache synced.
    fn settle(&self, seen: HashMap<String, Arc<K>>, version: &str) {
        let gone: Vec<String> = self
            .store
            .keys()
            .into_iter()
            .filter(|k| !seen.contains_key(k))
            .collect();
        // Counted before the objects are applied: whoever sees a change of this list also
        // sees a revision at least as new as it.
        self.note_revision(Some(version));
        for k in gone {
            self.apply(k, None);
        }
        for (k, o) in seen {
            let unchanged = self
                .store
                .get(&k)
                .is_some_and(|old| old.resource_version() == o.resource_version());
            if !unchanged {
                self.apply(k, Some(o));
            }
        }
        self.health.lists.fetch_add(1, Ordering::Relaxed);
        self.health.heard();
        if !self.health.synced.swap(true, Ordering::AcqRel) {
            self.health.synced_notify.notify_waiters();
            tracing::info!(
                kind = self.health.kind,
                objects = self.store.len(),
                "cache synced"
            );
        }
    }

    /// Runs the list+watch loop for as long as the process runs. Errors are retried with
    /// a capped exponential backoff; an expired resourceVersion (410) or a restart request
    /// leads to a fresh list.
    pub async fn run(self: Arc<Self>, api: Api<K>, cfg: WatchConfig) {
        let kind = self.health.kind;
        let mut c = Cursor {
            version: None,
            failures: 0,
            streaming: cfg.streaming_lists,
            initial: None,
        };
        let timeout = u32::try_from(cfg.timeout.as_secs()).unwrap_or(290).max(1);
        loop {
            if c.failures > 0 {
                // 0.25 s doubling to 30 s.
                let delay = Duration::from_millis(250)
                    .saturating_mul(1 << c.failures.min(7))
                    .min(Duration::from_secs(30));
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = self.health.wake.notified() => {}
                }
            }
            // `initial`: the objects of a streaming list so far, until its end bookmark.
            let (rv, initial) = match &c.version {
                Some(v) => (v.clone(), None),
                None if c.streaming => (String::new(), Some(HashMap::new())),
                None => match self.relist(&api, &cfg).await {
                    Ok(v) => {
                        c.version = Some(v.clone());
                        (v, None)
                    }
                    Err(e) => {
                        c.failures += 1;
                        tracing::warn!(kind, error = %e, "list failed; retrying");
                        continue;
                    }
                },
            };
            c.initial = initial;
            let mut params = WatchParams::default().timeout(timeout);
            params.bookmarks = true;
            params.send_initial_events = c.initial.is_some();
            if let Some(f) = &cfg.fields {
                params = params.fields(f);
            }
            if let Some(l) = &cfg.labels {
                params = params.labels(l);
            }
            let stream = match api.watch(&params, &rv).await {
                Ok(s) => s,
                Err(e) => {
                    if c.initial.is_some() && refuses_streaming(&e) {
                        c.streaming = false;
                        tracing::info!(kind, error = %e, "no streaming lists here; paged lists from now on");
                        continue;
                    }
                    c.failures += 1;
                    if is_expired(&e) {
                        c.version = None;
                    }
                    tracing::warn!(kind, error = %e, "watch failed; retrying");
                    continue;
                }
            };
            self.health.watches.fetch_add(1, Ordering::Relaxed);
            // Resuming from `version`: the stream replays what happened since, first thing.
            // A streaming list is complete only at its end bookmark.
            self.health.set_connected(c.initial.is_none());
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = tokio::select! {
                    ev = stream.next() => ev,
                    () = self.health.restart.notified() => {
                        tracing::warn!(kind, silent_for = ?self.health.silence(), "watch silent too long; listing again");
                        c.version = None;
                        break;
                    }
                };
                if !self.on_event(&mut c, next) {
                    break;
                }
            }
            self.health.set_connected(false);
        }
    }

    /// One event of the watch: applied to the cache (or to the streaming list being
    /// gathered). `false`: watch again (the stream ended, broke, or its revision expired).
    fn on_event(
        &self,
        c: &mut Cursor<K>,
        next: Option<Result<WatchEvent<K>, kube::Error>>,
    ) -> bool {
        let kind = self.health.kind;
        match next {
            // The server ended the watch (its timeout): watch again from `c.version`.
            None => return false,
            Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) if c.initial.is_some() => {
                // The state at the list's revision, object by object: settled
                // all at once at its end, as a paged list is.
                self.health.heard();
                let o = Self::strip(o);
                if let Some(seen) = c.initial.as_mut() {
                    seen.insert(key_of(o.as_ref()), o);
                }
            }
            Some(Ok(WatchEvent::Deleted(o))) if c.initial.is_some() => {
                if let Some(seen) = c.initial.as_mut() {
                    seen.remove(&key_of(&o));
                }
            }
            Some(Ok(WatchEvent::Bookmark(b))) if c.initial.is_some() => {
                self.health.heard();
                if b.metadata.annotations.contains_key(INITIAL_EVENTS_END) {
                    c.failures = 0;
                    let rv = b.metadata.resource_version.clone();
                    if let Some(seen) = c.initial.take() {
                        self.settle(seen, &rv);
                        self.health.streaming_lists.fetch_add(1, Ordering::Relaxed);
                    }
                    self.health.set_connected(true);
                    c.version = Some(rv);
                }
            }
            Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                c.failures = 0;
                let o = Self::strip(o);
                c.version = o.resource_version();
                self.note_revision(c.version.as_deref());
                self.health.events.fetch_add(1, Ordering::Relaxed);
                self.health.heard();
                self.apply(key_of(o.as_ref()), Some(o));
            }
            Some(Ok(WatchEvent::Deleted(o))) => {
                c.failures = 0;
                c.version = o.resource_version();
                self.note_revision(c.version.as_deref());
                self.health.events.fetch_add(1, Ordering::Relaxed);
                self.health.heard();
                self.apply(key_of(&o), None);
            }
            Some(Ok(WatchEvent::Bookmark(b))) => {
                c.failures = 0;
                c.version = Some(b.metadata.resource_version.clone());
                self.note_revision(c.version.as_deref());
                self.health.bookmarks.fetch_add(1, Ordering::Relaxed);
                self.health.heard();
            }
            Some(Ok(WatchEvent::Error(s))) => {
                if s.code == 410 {
                    tracing::info!(kind, "resourceVersion expired; listing again");
                    c.version = None;
                } else {
                    c.failures += 1;
                    tracing::warn!(kind, code = s.code, message = %s.message, "watch error; retrying");
                }
                return false;
            }
            Some(Err(e)) => {
                c.failures += 1;
                tracing::warn!(kind, error = %e, "watch stream broke; retrying");
                return false;
            }
        }
        true
    }
}

/// Where a cache's list+watch loop stands.
struct Cursor<K> {
    /// The revision to watch from; `None`: list (or stream a list) again.
    version: Option<String>,
    /// Failures in a row (the backoff).
    failures: u32,
    /// Streaming lists (WatchList) are used while the server takes them.
    streaming: bool,
    /// The objects of a streaming list so far, until its end bookmark.
    initial: Option<HashMap<String, Arc<K>>>,
}

fn is_expired(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 410)
}

/// The bookmark annotation that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
/// `kubectl apply`'s record of what was applied: the object again, serialized.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A server without streaming lists (WatchList off, or older than 1.27) refuses
/// `sendInitialEvents` as an invalid or bad request.
fn refuses_streaming(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 400 || s.code == 422)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(name: &str, rv: &str) -> Arc<ConfigMap> {
        Arc::new(
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "n", "resourceVersion": rv}}))
                .unwrap(),
        )
    }

    #[test]
    fn a_stored_object_sheds_managed_fields_and_the_last_applied_copy_only() {
        let o: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {
            "name": "a", "namespace": "n",
            "annotations": {LAST_APPLIED: "{\"big\": true}", "keep": "me"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]}}))
        .unwrap();
        let stored = Cache::<ConfigMap>::strip(o);
        assert_eq!(stored.metadata.managed_fields, None);
        assert_eq!(
            stored.metadata.annotations,
            Some([("keep".to_string(), "me".to_string())].into())
        );
    }

    #[test]
    fn handlers_see_the_updated_store_and_every_change_in_order() {
        let cache: Arc<Cache<ConfigMap>> = Cache::new("ConfigMap", Arc::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        {
            let seen = seen.clone();
            let store = cache.store.clone();
            cache.on_change(move |c| {
                let key = key_of(c.object().unwrap().as_ref());
                seen.lock().unwrap().push((
                    key.clone(),
                    c.old.as_ref().and_then(|o| o.resource_version()),
                    c.new.as_ref().and_then(|o| o.resource_version()),
                    store.get(&key).is_some(),
                ));
            });
        }
        cache.apply("n/a".into(), Some(cm("a", "1")));
        cache.apply("n/a".into(), Some(cm("a", "2")));
        cache.apply("n/a".into(), None);
        // A deletion of an object never seen tells nobody.
        cache.apply("n/b".into(), None);
        let seen = seen.lock().unwrap().clone();
        let v = |s: &str| Some(s.to_string());
        assert_eq!(
            seen,
            vec![
                ("n/a".into(), None, v("1"), true),
                ("n/a".into(), v("1"), v("2"), true),
                ("n/a".into(), v("2"), None, false),
            ]
        );
    }

    /// The failure mode of kube-runtime's shared reflector, as a regression test of ours: an
    /// object created and deleted before any consumer ran, thousands of times over, with a
    /// consumer that is slow. Nothing is lost and the store never stops moving.
    #[test]
    fn churn_with_a_slow_consumer_loses_nothing_and_never_blocks_the_watch() {
        let cache: Arc<Cache<ConfigMap>> = Cache::new("ConfigMap", Arc::default());
        let queue: Arc<crate::queue::Queue<String>> =
            Arc::new(crate::queue::Queue::new(Default::default()));
        {
            let queue = queue.clone();
            cache.on_change(move |c| queue.add(key_of(c.object().unwrap().as_ref())));
        }
        for i in 0..5000 {
            let name = format!("c{i}");
            cache.apply(format!("n/{name}"), Some(cm(&name, "1")));
            cache.apply(format!("n/{name}"), None);
        }
        assert!(cache.store.is_empty());
        assert_eq!(queue.depth().0, 5000, "every key is queued once");
    }

    #[test]
    fn keys() {
        assert_eq!(key_of(cm("a", "1").as_ref()), "n/a");
        assert_eq!(key("n", "a"), "n/a");
    }
}
