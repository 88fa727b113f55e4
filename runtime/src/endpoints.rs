//! The EndpointSlices of the Services cozy-proxy serves, by Service: how many ready pods
//! such a Service selects (cozy-proxy forwards its address to one, SPEC §8 as this project
//! reads cozy-proxy). Only those slices are watched — selected by cozy-proxy's label, which
//! the EndpointSlice controller copies from the Service — and each Service's are found
//! through an index, never by a scan.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::cache::{Cache, Change, key, key_of};

/// The label an EndpointSlice names its Service by.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The cache of those slices and its index by Service.
pub struct ProxiedEndpoints {
    pub cache: Arc<Cache<EndpointSlice>>,
    /// `namespace/service` → the keys of its slices.
    by_service: Mutex<HashMap<String, BTreeSet<String>>>,
}

/// The Service (`namespace/name`) a slice belongs to.
pub fn service_of(slice: &EndpointSlice) -> Option<String> {
    let ns = slice.metadata.namespace.as_deref()?;
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(key(ns, name))
}

impl ProxiedEndpoints {
    pub fn new(revision: Arc<AtomicU64>) -> Arc<ProxiedEndpoints> {
        let me = Arc::new(ProxiedEndpoints {
            cache: Cache::new("EndpointSlice", revision),
            by_service: Mutex::new(HashMap::new()),
        });
        let index = Arc::downgrade(&me);
        me.cache.on_change(move |ch| {
            if let Some(me) = index.upgrade() {
                me.index(ch);
            }
        });
        me
    }

    fn index(&self, ch: &Change<EndpointSlice>) {
        let mut by = self
            .by_service
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = &ch.old
            && let Some(svc) = service_of(old)
            && let Some(set) = by.get_mut(&svc)
        {
            set.remove(&key_of(old.as_ref()));
            if set.is_empty() {
                by.remove(&svc);
            }
        }
        if let Some(new) = &ch.new
            && let Some(svc) = service_of(new)
        {
            by.entry(svc).or_default().insert(key_of(new.as_ref()));
        }
    }

    /// The ready IPv4 endpoints of Service `service` (`namespace/name`): distinct addresses
    /// of its slices whose `ready` is not false (unset counts as ready, as the API says);
    /// `None` while it has no slice at all — not yet known, not zero (the EndpointSlice
    /// controller writes a Service's first slice, empty or not, just after the Service).
    pub fn ready(&self, service: &str) -> Option<usize> {
        let keys: Vec<String> = self
            .by_service
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(service)
            .map(|s| s.iter().cloned().collect())?;
        let mut ready = BTreeSet::new();
        for slice in keys.iter().filter_map(|k| self.cache.get(k)) {
            if slice.address_type != "IPv4" {
                continue;
            }
            for e in slice.endpoints.iter().flatten() {
                if e.conditions.as_ref().and_then(|c| c.ready) != Some(false) {
                    ready.extend(e.addresses.iter().cloned());
                }
            }
        }
        Some(ready.len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn slice(name: &str, svc: &str, ready: &[(&str, Option<bool>)]) -> Arc<EndpointSlice> {
        let endpoints: Vec<_> = ready
            .iter()
            .map(|(ip, r)| json!({"addresses": [ip], "conditions": {"ready": r}}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "t",
                "labels": {SERVICE_NAME_LABEL: svc}},
                "addressType": "IPv4", "endpoints": endpoints}))
            .unwrap(),
        )
    }

    #[test]
    fn a_services_ready_pods_are_counted_from_its_slices_alone() {
        let e = ProxiedEndpoints::new(Arc::new(AtomicU64::new(0)));
        e.cache.apply(
            "t/vm-abc".into(),
            Some(slice(
                "vm-abc",
                "vm",
                &[("10.0.0.1", Some(true)), ("10.0.0.2", Some(false))],
            )),
        );
        e.cache.apply(
            "t/vm-def".into(),
            Some(slice(
                "vm-def",
                "vm",
                &[("10.0.0.3", None), ("10.0.0.1", Some(true))],
            )),
        );
        e.cache.apply(
            "t/other-x".into(),
            Some(slice("other-x", "other", &[("10.0.0.9", Some(true))])),
        );
        // .1 (twice) and .3 (unset counts as ready); .2 is not ready.
        assert_eq!(e.ready("t/vm"), Some(2));
        assert_eq!(e.ready("t/other"), Some(1));
        assert_eq!(e.ready("t/none"), None, "no slice: not known");
        e.cache.apply("t/vm-def".into(), None);
        assert_eq!(e.ready("t/vm"), Some(1));
        // A slice with nobody ready: known, zero.
        e.cache
            .apply("t/empty-x".into(), Some(slice("empty-x", "empty", &[])));
        assert_eq!(e.ready("t/empty"), Some(0));
    }
}
