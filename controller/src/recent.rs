//! Bridging the gap between a successful write and the watch event that brings it into
//! the cache. Without this a worker that just bound an address would, on its next pass,
//! still see the address free (or its claim unbound) and act again: a second address for
//! the same claim, or a conflict storm. Reading through [`RecentWrites`] gives each worker
//! its own writes until the cache has caught up; [`InFlight`] keeps workers of one
//! process from racing for the same free address (SPEC §4.7: N claims, ~N writes).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::{Resource, ResourceExt};

/// Entries older than this are dropped even if the cache never showed the object again
/// (it was deleted, or the watch restarted).
const MAX_AGE: Duration = Duration::from_secs(300);

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

/// Objects this process wrote recently, by name (`namespace/name` for namespaced kinds).
pub struct RecentWrites<K> {
    entries: Mutex<HashMap<String, Written<K>>>,
}

impl<K> Default for RecentWrites<K> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

/// The key of an object in [`RecentWrites`] and [`InFlight`].
pub fn key_of<K: Resource>(o: &K) -> String {
    match o.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", o.name_any()),
        None => o.name_any(),
    }
}

impl<K: Resource> RecentWrites<K> {
    /// Records that `before` was replaced by `after`.
    pub fn record(&self, before: &K, after: K) {
        let key = key_of(before);
        let before_rv = before.meta().resource_version.clone();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stale = match entries.remove(&key) {
            // `before` was itself our previous write: the cache may still be older than it.
            Some(prev) if prev.object.meta().resource_version == before_rv => prev.stale,
            _ => HashSet::new(),
        };
        stale.insert(before_rv);
        entries.insert(
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
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get(&key) {
            Some(w) if w.covers(cached.as_ref()) => w.object.clone(),
            Some(_) => {
                // The cache caught up with (or moved past) our write.
                entries.remove(&key);
                cached
            }
            None => cached,
        }
    }

    /// [`Self::latest`] for every object of a cache snapshot.
    pub fn overlay(&self, cached: Vec<Arc<K>>) -> Vec<Arc<K>> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|_, w| w.at.elapsed() < MAX_AGE);
        if entries.is_empty() {
            return cached;
        }
        cached
            .into_iter()
            .map(|o| {
                let key = key_of(o.as_ref());
                match entries.get(&key) {
                    Some(w) if w.covers(o.as_ref()) => w.object.clone(),
                    Some(_) => {
                        entries.remove(&key);
                        o
                    }
                    None => o,
                }
            })
            .collect()
    }
}

/// Free addresses that a worker is binding right now, with the claim binding each.
#[derive(Default)]
pub struct InFlight {
    by_address: Mutex<HashMap<String, String>>,
}

impl InFlight {
    /// Addresses being bound by claims other than `claim`.
    pub fn taken_by_others(&self, claim: &str) -> HashSet<String> {
        let map = self
            .by_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .filter(|(_, c)| *c != claim)
            .map(|(a, _)| a.clone())
            .collect()
    }

    /// Reserves `address` for `claim`; false when another claim holds it.
    pub fn reserve(&self, address: &str, claim: &str) -> bool {
        let mut map = self
            .by_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match map.get(address) {
            Some(c) if c != claim => false,
            _ => {
                map.insert(address.to_string(), claim.to_string());
                true
            }
        }
    }

    pub fn release(&self, address: &str) {
        self.by_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(address);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(rv: &str) -> ConfigMap {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "x", "namespace": "n", "resourceVersion": rv}}),
        )
        .unwrap()
    }

    #[test]
    fn overlay_until_the_cache_catches_up() {
        let recent = RecentWrites::default();
        recent.record(&cm("1"), cm("2"));
        assert_eq!(
            recent
                .latest(Arc::new(cm("1")))
                .metadata
                .resource_version
                .as_deref(),
            Some("2")
        );
        // The cache moved on: the entry is dropped and the cache wins from now on.
        assert_eq!(
            recent
                .latest(Arc::new(cm("3")))
                .metadata
                .resource_version
                .as_deref(),
            Some("3")
        );
        assert_eq!(
            recent
                .latest(Arc::new(cm("1")))
                .metadata
                .resource_version
                .as_deref(),
            Some("1")
        );
    }

    #[test]
    fn two_writes_before_the_cache_saw_the_first() {
        let recent = RecentWrites::default();
        recent.record(&cm("1"), cm("2"));
        recent.record(&cm("2"), cm("3"));
        for cached in ["1", "2"] {
            assert_eq!(
                recent
                    .latest(Arc::new(cm(cached)))
                    .metadata
                    .resource_version
                    .as_deref(),
                Some("3")
            );
        }
        assert_eq!(
            recent.overlay(vec![Arc::new(cm("1"))])[0]
                .metadata
                .resource_version
                .as_deref(),
            Some("3")
        );
        assert_eq!(
            recent
                .latest(Arc::new(cm("3")))
                .metadata
                .resource_version
                .as_deref(),
            Some("3")
        );
    }

    #[test]
    fn in_flight_keeps_claims_apart() {
        let f = InFlight::default();
        assert!(f.reserve("a", "ns/one"));
        assert!(f.reserve("a", "ns/one"), "re-entrant for the same claim");
        assert!(!f.reserve("a", "ns/two"));
        assert_eq!(
            f.taken_by_others("ns/two"),
            HashSet::from(["a".to_string()])
        );
        assert!(f.taken_by_others("ns/one").is_empty());
        f.release("a");
        assert!(f.reserve("a", "ns/two"));
    }
}
