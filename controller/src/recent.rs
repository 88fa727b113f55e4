//! Bridging the gap between a successful write and the watch event that brings it into
//! the cache. Without this a worker that just bound an address would, on its next pass,
//! still see the address free (or its claim unbound) and act again. [`RecentWrites`] holds
//! only this process's recent writes, consulted per object (never copied whole), in shards
//! so workers do not queue on one lock; an entry ends when the cache shows the write (or a
//! newer version), or after a few minutes.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::Resource;

use address_controller_runtime::cache::key_of;

/// Entries older than this are dropped even if the cache never showed the object again
/// (it was deleted, or the watch restarted).
const MAX_AGE: Duration = Duration::from_secs(300);
const SHARDS: usize = 16;

struct Written<K> {
    /// The resourceVersions our writes replaced: while the cache holds one of them, the
    /// cache is older than our latest write. Several when we wrote twice before the cache
    /// saw the first write (a bind, then a status update).
    stale: HashSet<Option<String>>,
    object: Arc<K>,
    at: Instant,
}

impl<K: Resource> Written<K> {
    fn covers(&self, cached: &K) -> bool {
        self.stale.contains(&cached.meta().resource_version) && self.at.elapsed() < MAX_AGE
    }
}

/// Objects this process wrote recently, by key.
pub struct RecentWrites<K> {
    shards: Vec<Mutex<HashMap<String, Written<K>>>>,
    hasher: std::collections::hash_map::RandomState,
}

impl<K> Default for RecentWrites<K> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
        }
    }
}

impl<K: Resource> RecentWrites<K> {
    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Written<K>>> {
        let i = usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or(0);
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `before` was replaced by `after`.
    pub fn record(&self, before: &K, after: K) {
        let key = key_of(before);
        let before_rv = before.meta().resource_version.clone();
        let mut shard = self.shard(&key);
        let mut stale = match shard.remove(&key) {
            // `before` was itself our previous write: the cache may still be older than it.
            Some(prev) if prev.object.meta().resource_version == before_rv => prev.stale,
            _ => HashSet::new(),
        };
        stale.insert(before_rv);
        shard.insert(
            key,
            Written {
                stale,
                object: Arc::new(after),
                at: Instant::now(),
            },
        );
    }

    /// The freshest known version of a cached object.
    pub fn latest(&self, cached: Arc<K>) -> Arc<K> {
        let key = key_of(cached.as_ref());
        let mut shard = self.shard(&key);
        match shard.get(&key) {
            Some(w) if w.covers(cached.as_ref()) => w.object.clone(),
            Some(_) => {
                // The cache caught up with (or moved past) our write.
                shard.remove(&key);
                cached
            }
            None => cached,
        }
    }

    /// The cache now holds `current` (or nothing) under `key`: forget our write unless the
    /// cache is still older than it.
    pub fn observe(&self, key: &str, current: Option<&K>) {
        let mut shard = self.shard(key);
        let keep = match (shard.get(key), current) {
            (Some(w), Some(c)) => w.covers(c),
            (Some(_), None) => false,
            (None, _) => return,
        };
        if !keep {
            shard.remove(key);
        }
    }

    /// Entries held (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(rv: &str) -> ConfigMap {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "x", "namespace": "n", "resourceVersion": rv}}),
        )
        .unwrap()
    }

    fn rv(c: &Arc<ConfigMap>) -> &str {
        c.metadata.resource_version.as_deref().unwrap()
    }

    #[test]
    fn overlay_until_the_cache_catches_up() {
        let recent = RecentWrites::default();
        recent.record(&cm("1"), cm("2"));
        assert_eq!(rv(&recent.latest(Arc::new(cm("1")))), "2");
        // The cache moved on: the entry is dropped and the cache wins from now on.
        assert_eq!(rv(&recent.latest(Arc::new(cm("3")))), "3");
        assert_eq!(rv(&recent.latest(Arc::new(cm("1")))), "1");
        assert!(recent.is_empty());
    }

    #[test]
    fn two_writes_before_the_cache_saw_the_first() {
        let recent = RecentWrites::default();
        recent.record(&cm("1"), cm("2"));
        recent.record(&cm("2"), cm("3"));
        for cached in ["1", "2"] {
            assert_eq!(rv(&recent.latest(Arc::new(cm(cached)))), "3");
        }
        assert_eq!(rv(&recent.latest(Arc::new(cm("3")))), "3");
    }

    #[test]
    fn the_watch_clears_entries_it_has_caught_up_with() {
        let recent = RecentWrites::default();
        recent.record(&cm("1"), cm("2"));
        recent.observe("n/x", Some(&cm("1")));
        assert_eq!(recent.len(), 1, "the cache is still older than our write");
        recent.observe("n/x", Some(&cm("2")));
        assert!(recent.is_empty());
        recent.record(&cm("2"), cm("3"));
        recent.observe("n/x", None);
        assert!(recent.is_empty(), "deleted");
    }
}
