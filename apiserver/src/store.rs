//! The views, materialized. Cache changes only mark the keys they concern dirty (on the
//! watch task: cheap); one task recomputes the dirty objects in batches — each object once
//! per batch however many changes touched it — keeps the result, and appends what changed to
//! a bounded history that watches replay from. Requests read the materialized objects; no
//! request computes a view and no open watch polls.
//!
//! **resourceVersions.** A batch that changes anything is labelled with the highest etcd
//! revision the caches had seen once its dirty keys were taken, or one more than the last
//! label if that is not higher: labels strictly increase from batch to batch, so a list at
//! revision R holds exactly the batches labelled ≤ R, and a watch from R replays exactly the
//! later ones — nothing missed, nothing twice. Because labels follow etcd revisions, they never
//! go backwards across restarts, and replicas label alike (up to the moment each one's caches
//! saw a change: a watch resumed on another replica than the list's is as exact as the two
//! replicas' caches are in step). A watch from a revision older than the history holds (or
//! older than the initial build, which is not history) gets 410 Expired and lists again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use address_controller_runtime::world::World;
use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use crate::list_options::ListOptions;
use crate::resources::{Computed, View};

/// One object of a view as served.
#[derive(Debug)]
pub struct Entry {
    pub key: String,
    pub namespace: Option<String>,
    pub name: String,
    pub rv: u64,
    /// The object serialized, `metadata.resourceVersion` included: what JSON lists and
    /// watches send, and the only form kept. A document tree of it would be several times
    /// its size, for each object and for each change in the history.
    pub json: Bytes,
    pub cells: Vec<Value>,
    pub labels: BTreeMap<String, String>,
    /// Its field labels' values beyond name and namespace ([`Computed::fields`]).
    pub fields: BTreeMap<&'static str, String>,
}

impl Entry {
    /// The object as a document, for the formats that are not sent as stored (YAML, a
    /// Table's `includeObject=Object`).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    /// Its `metadata` alone (PartialObjectMetadata, a Table row's object): the rest of the
    /// object is skipped while parsing, not built.
    pub fn metadata(&self) -> Value {
        #[derive(serde::Deserialize)]
        struct Metadata {
            #[serde(default)]
            metadata: Value,
        }
        serde_json::from_slice::<Metadata>(&self.json)
            .map(|m| m.metadata)
            .unwrap_or(Value::Null)
    }

    /// Whether the object passes a request's namespace and selectors (lists and watches).
    pub fn selected(&self, ns: Option<&str>, opts: &ListOptions) -> bool {
        ns.is_none_or(|ns| self.namespace.as_deref() == Some(ns))
            && opts.labels.matches(&self.labels)
            && opts.fields.matches_terms(|f, value| match f {
                "metadata.name" => self.name == value,
                "metadata.namespace" => self.namespace.as_deref() == Some(value),
                _ => opts
                    .computed_holds(f, &self.fields)
                    .unwrap_or_else(|| self.fields.get(f).is_some_and(|v| v == value)),
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// A change of one object, in order.
#[derive(Debug)]
pub struct Event {
    pub seq: u64,
    pub rv: u64,
    /// Index of the view in the store.
    pub view: usize,
    pub kind: EventType,
    pub entry: Arc<Entry>,
    /// The object before the change (for a list at an earlier revision).
    pub old: Option<Arc<Entry>>,
}

struct Inner {
    objects: Vec<BTreeMap<String, Arc<Entry>>>,
    dirty: Vec<BTreeSet<String>>,
    history: VecDeque<Arc<Event>>,
    /// The serialized size of the history's objects (what [`HistoryBound::bytes`] bounds).
    history_bytes: usize,
    /// The serialized size of the current objects of every view.
    objects_bytes: usize,
    next_seq: u64,
    /// No change at or before this revision can be replayed.
    floor: u64,
    revision: u64,
    built: bool,
}

impl Inner {
    /// The current objects of every view.
    fn object_count(&self) -> usize {
        self.objects.iter().map(BTreeMap::len).sum()
    }
}

/// What a [`ViewStore`] holds (see [`ViewStore::sizes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreSizes {
    pub objects: usize,
    pub object_bytes: usize,
    pub history_changes: usize,
    pub history_bytes: usize,
}

pub struct ViewStore {
    pub world: World,
    pub views: Vec<Arc<dyn View>>,
    inner: Mutex<Inner>,
    dirty_notify: Notify,
    changes: watch::Sender<u64>,
    bound: HistoryBound,
}

/// How much history the store keeps: the oldest changes go once either bound is passed.
/// A change holds its object whole, and an object of a view grows with what its namespace
/// holds, so a count alone does not bound memory.
#[derive(Debug, Clone, Copy)]
pub struct HistoryBound {
    /// Changes kept.
    pub changes: usize,
    /// Serialized bytes of the changes' objects kept.
    pub bytes: usize,
}

impl HistoryBound {
    /// A bound of `changes` only.
    pub fn changes(changes: usize) -> HistoryBound {
        HistoryBound {
            changes,
            bytes: usize::MAX,
        }
    }
}

/// A consistent read of one view: its objects at the store's revision, and where in the
/// history a watch continues from.
pub struct Snapshot {
    pub revision: u64,
    pub next_seq: u64,
    pub objects: Vec<Arc<Entry>>,
}

/// Where a watch from a resourceVersion starts.
pub enum Resume {
    /// Replay the history from this sequence number.
    From(u64),
    /// The resourceVersion is older than what the history holds.
    TooOld { oldest: u64 },
}

/// Per view, per dirty key (in the keys' order): the object as the batch found it.
type Before = Vec<Vec<Option<Arc<Entry>>>>;
/// Per view: each changed key's new entry (`None`: gone).
type Results = Vec<Vec<(String, Option<Entry>)>>;

impl ViewStore {
    /// A store of `views` over `world`, keeping the history `bound` allows. Register it on
    /// the caches ([`ViewStore::register`]) before the watches start, and run
    /// [`ViewStore::run`].
    pub fn new(world: World, views: Vec<Arc<dyn View>>, bound: HistoryBound) -> Arc<ViewStore> {
        let n = views.len();
        Arc::new(ViewStore {
            world,
            views,
            inner: Mutex::new(Inner {
                objects: vec![BTreeMap::new(); n],
                dirty: vec![BTreeSet::new(); n],
                history: VecDeque::new(),
                history_bytes: 0,
                objects_bytes: 0,
                next_seq: 1,
                floor: 0,
                revision: 0,
                built: false,
            }),
            dirty_notify: Notify::new(),
            changes: watch::Sender::new(0),
            bound,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn mark(&self, view: usize, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        self.lock().dirty[view].extend(keys);
        self.dirty_notify.notify_one();
    }

    /// Feeds the views' indexes and dirty sets from the caches.
    pub fn register(self: &Arc<Self>) {
        let s = self.clone();
        self.world.claims.on_change(move |ch| {
            for (i, v) in s.views.iter().enumerate() {
                let mut dirty = Vec::new();
                v.claim_changed(ch.old.as_deref(), ch.new.as_deref(), &mut dirty);
                s.mark(i, dirty);
            }
        });
        let s = self.clone();
        self.world.addresses.on_change(move |ch| {
            for (i, v) in s.views.iter().enumerate() {
                let mut dirty = Vec::new();
                v.address_changed(ch.old.as_deref(), ch.new.as_deref(), &mut dirty);
                s.mark(i, dirty);
            }
        });
        let s = self.clone();
        self.world.classes.on_change(move |ch| {
            for (i, v) in s.views.iter().enumerate() {
                let mut dirty = Vec::new();
                v.class_changed(ch.old.as_deref(), ch.new.as_deref(), &mut dirty);
                s.mark(i, dirty);
            }
        });
        if let Some(r) = &self.world.records {
            let s = self.clone();
            r.on_change(move |ch| {
                for (i, v) in s.views.iter().enumerate() {
                    let mut dirty = Vec::new();
                    v.record_changed(ch.old.as_deref(), ch.new.as_deref(), &s.world, &mut dirty);
                    s.mark(i, dirty);
                }
            });
        }
        if let Some(e) = &self.world.entitlements {
            let s = self.clone();
            e.quotas.on_change(move |ch| {
                for (i, v) in s.views.iter().enumerate() {
                    let mut dirty = Vec::new();
                    v.quota_changed(ch.old.as_deref(), ch.new.as_deref(), &mut dirty);
                    s.mark(i, dirty);
                }
            });
            let s = self.clone();
            e.namespaces.on_change(move |ch| {
                for (i, v) in s.views.iter().enumerate() {
                    let mut dirty = Vec::new();
                    v.namespace_changed(ch.old.as_deref(), ch.new.as_deref(), &mut dirty);
                    s.mark(i, dirty);
                }
            });
        }
    }

    /// The view store has its first complete build (after every cache listed).
    pub fn built(&self) -> bool {
        self.lock().built
    }

    /// Recomputes dirty objects for as long as the process runs.
    pub async fn run(self: Arc<Self>) {
        self.world.health.wait_synced().await;
        loop {
            let notified = self.dirty_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.recompute();
            notified.await;
        }
    }

    /// One batch: every dirty object computed once, the changes applied and announced. One
    /// caller at a time ([`ViewStore::run`]; tests): a batch reads the objects before it
    /// computes and applies its results after.
    pub fn recompute(&self) {
        let started = std::time::Instant::now();
        let (dirty, before, rv) = self.take_dirty();
        let computed = self.compute_dirty(dirty, before, rv);
        self.apply(computed, rv, started);
    }

    /// The dirty keys of each view (taken), what they are now, and the batch's revision.
    fn take_dirty(&self) -> (Vec<BTreeSet<String>>, Before, u64) {
        let mut inner = self.lock();
        let dirty: Vec<BTreeSet<String>> = inner.dirty.iter_mut().map(std::mem::take).collect();
        // What the dirty objects are now: only this task changes them, so they stay so
        // until the results are applied below.
        let before: Before = dirty
            .iter()
            .enumerate()
            .map(|(i, keys)| {
                keys.iter()
                    .map(|k| inner.objects[i].get(k).cloned())
                    .collect()
            })
            .collect();
        // Read after taking the dirty keys: every change they stand for was counted in
        // the revision before it was marked, so the label is never older than them.
        // Strictly above what any earlier batch published, so that a client holding an
        // earlier revision gets this batch's events on resuming, and one holding this
        // batch's revision does not get them again.
        let seen = self.world.revision.load(Ordering::Acquire);
        (dirty, before, seen.max(inner.revision + 1))
    }

    /// Each dirty object computed: its new entry, `None` when it is gone; left out when
    /// unchanged.
    fn compute_dirty(&self, dirty: Vec<BTreeSet<String>>, before: Before, rv: u64) -> Results {
        // Each result is served form as soon as it is computed (or dropped, unchanged): a
        // batch holds one object's document tree at a time, not one per dirty object.
        dirty
            .into_iter()
            .zip(before)
            .enumerate()
            .map(|(i, (keys, before))| {
                keys.into_iter()
                    .zip(before)
                    .filter_map(|(k, old)| match self.views[i].compute(&k, &self.world) {
                        Some(mut c) => {
                            if old.as_deref().is_some_and(|o| unchanged(o, &mut c)) {
                                return None;
                            }
                            let e = entry(k.clone(), c, rv);
                            Some((k, Some(e)))
                        }
                        None => Some((k, None)),
                    })
                    .collect()
            })
            .collect()
    }

    /// The batch's results applied, its events kept for the watches (not the first batch's,
    /// which builds the views), the kept changes bounded, and the watchers told.
    fn apply(&self, computed: Results, rv: u64, started: std::time::Instant) {
        let mut inner = self.lock();
        let first = !inner.built;
        let mut changed = false;
        for (view, results) in computed.into_iter().enumerate() {
            for (key, e) in results {
                let old = inner.objects[view].get(&key).cloned();
                inner.objects_bytes -= old.as_ref().map_or(0, |o| o.json.len());
                let event = match (e, &old) {
                    (Some(entry), old) => {
                        let entry = Arc::new(entry);
                        inner.objects_bytes += entry.json.len();
                        inner.objects[view].insert(key, entry.clone());
                        let kind = if old.is_some() {
                            EventType::Modified
                        } else {
                            EventType::Added
                        };
                        (kind, entry)
                    }
                    (None, Some(o)) => {
                        inner.objects[view].remove(&key);
                        (EventType::Deleted, Arc::new(with_rv(o, rv)))
                    }
                    (None, None) => continue,
                };
                changed = true;
                if !first {
                    let seq = inner.next_seq;
                    inner.next_seq += 1;
                    inner.history_bytes += event.1.json.len();
                    inner.history.push_back(Arc::new(Event {
                        seq,
                        rv,
                        view,
                        kind: event.0,
                        entry: event.1,
                        old,
                    }));
                }
            }
        }
        if changed || first {
            inner.revision = rv;
        } else {
            // Nothing changed: the views are as of what the caches have seen.
            inner.revision = inner
                .revision
                .max(self.world.revision.load(Ordering::Acquire));
        }
        if first {
            inner.built = true;
            inner.floor = rv;
            tracing::info!(
                objects = inner.object_count(),
                took_ms = started.elapsed().as_millis() as u64,
                "views built"
            );
        }
        while inner.history.len() > self.bound.changes || inner.history_bytes > self.bound.bytes {
            let Some(e) = inner.history.pop_front() else {
                break;
            };
            inner.history_bytes -= e.entry.json.len();
            inner.floor = inner.floor.max(e.rv);
        }
        let seq = inner.next_seq;
        drop(inner);
        if changed || first {
            self.changes.send_replace(seq);
        }
    }

    /// The objects of `view` (all of them; callers filter) at the store's revision.
    pub fn snapshot(&self, view: usize) -> Snapshot {
        let inner = self.lock();
        Snapshot {
            revision: inner.revision,
            next_seq: inner.next_seq,
            objects: inner.objects[view].values().cloned().collect(),
        }
    }

    /// The objects of `view` as they were at revision `rv` (a page of a list started
    /// then, or a list at an exact revision): the current ones with the history's later
    /// changes undone — O(objects + changes since `rv`). `None` when the history no longer
    /// reaches back to `rv`.
    pub fn snapshot_at(&self, view: usize, rv: u64) -> Option<Snapshot> {
        let inner = self.lock();
        if rv < inner.floor || rv > inner.revision {
            return None;
        }
        let mut objects = inner.objects[view].clone();
        for e in inner.history.iter().rev().take_while(|e| e.rv > rv) {
            if e.view != view {
                continue;
            }
            match &e.old {
                Some(o) => objects.insert(o.key.clone(), o.clone()),
                None => objects.remove(&e.entry.key),
            };
        }
        Some(Snapshot {
            revision: rv,
            next_seq: inner.next_seq,
            objects: objects.into_values().collect(),
        })
    }

    pub fn get(&self, view: usize, key: &str) -> (u64, Option<Arc<Entry>>) {
        let inner = self.lock();
        (inner.revision, inner.objects[view].get(key).cloned())
    }

    /// The oldest revision a list or watch can still be served from.
    pub fn oldest(&self) -> u64 {
        self.lock().floor
    }

    /// What the store holds: the current objects' serialized bytes, the history's, and the
    /// number of changes in the history.
    pub fn sizes(&self) -> StoreSizes {
        let inner = self.lock();
        StoreSizes {
            objects: inner.object_count(),
            object_bytes: inner.objects_bytes,
            history_changes: inner.history.len(),
            history_bytes: inner.history_bytes,
        }
    }

    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// Where a watch from `rv` resumes.
    pub fn resume(&self, rv: u64) -> Resume {
        let inner = self.lock();
        if rv < inner.floor {
            return Resume::TooOld {
                oldest: inner.floor,
            };
        }
        // The first event newer than rv (events are in revision order).
        let pos = inner.history.partition_point(|e| e.rv <= rv);
        Resume::From(inner.history.get(pos).map_or(inner.next_seq, |e| e.seq))
    }

    /// The history events from sequence `from` on, and the store's revision with them (a
    /// bookmark at that revision misses nothing); `None` when some were dropped already (the
    /// watcher fell too far behind).
    pub fn events_from(&self, from: u64) -> Option<(Vec<Arc<Event>>, u64)> {
        let inner = self.lock();
        let oldest = inner.history.front().map_or(inner.next_seq, |e| e.seq);
        if from < oldest {
            return None;
        }
        let skip = usize::try_from(from - oldest).unwrap_or(usize::MAX);
        Some((
            inner.history.iter().skip(skip).cloned().collect(),
            inner.revision,
        ))
    }

    /// Resolves when the history grows (the sequence number of the next event).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Waits up to `within` for the store's revision to reach `rv`.
    pub async fn wait_for_revision(&self, rv: u64, within: std::time::Duration) -> bool {
        let mut rx = self.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.revision() >= rv {
                return true;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return self.revision() >= rv;
            }
        }
    }
}

/// `value` as served, in an allocation of its size (the serializer's buffer grows by
/// doubling; kept as it is, up to half of every stored object would be slack).
fn serialized(value: &Value) -> Bytes {
    let mut b = serde_json::to_vec(value).unwrap_or_default();
    b.shrink_to_fit();
    Bytes::from(b)
}

/// The served form of a computed object at revision `rv`.
pub fn entry(key: String, mut c: Computed, rv: u64) -> Entry {
    c.value["metadata"]["resourceVersion"] = json!(rv.to_string());
    Entry {
        key,
        namespace: c.namespace,
        name: c.name,
        rv,
        json: serialized(&c.value),
        cells: c.cells,
        labels: c.labels,
        fields: c.fields,
    }
}

/// Whether `c` is `old` but for the resourceVersion (no change to announce). Serialized at
/// the old revision, an unchanged object is byte for byte the old one: the computation and
/// serde_json's key order are deterministic.
fn unchanged(old: &Entry, c: &mut Computed) -> bool {
    if old.cells != c.cells || old.labels != c.labels || old.fields != c.fields {
        return false;
    }
    c.value["metadata"]["resourceVersion"] = json!(old.rv.to_string());
    serde_json::to_vec(&c.value).is_ok_and(|b| b == old.json.as_ref())
}

/// The last state of an entry, at revision `rv` (a deletion's).
fn with_rv(old: &Entry, rv: u64) -> Entry {
    let mut value = old.value();
    value["metadata"]["resourceVersion"] = json!(rv.to_string());
    Entry {
        key: old.key.clone(),
        namespace: old.namespace.clone(),
        name: old.name.clone(),
        rv,
        json: serialized(&value),
        cells: old.cells.clone(),
        labels: old.labels.clone(),
        fields: old.fields.clone(),
    }
}
