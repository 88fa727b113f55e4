//! The EndpointSlices of the Services cozy-proxy serves, by Service, and the KubeVirt VMIs
//! their pods run: who is behind such a Service (cozy-proxy forwards its address to one
//! workload, SPEC §8 as this project reads cozy-proxy), a VM moving between nodes counted
//! once ([`address_controller_api::kubevirt::backends`]). Only those slices are watched —
//! selected by cozy-proxy's label, which the EndpointSlice controller copies from the
//! Service — and each Service's are found through an index, never by a scan; a VMI's pods
//! through an index by pod UID.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use address_controller_api::kubevirt::{Backends, Endpoint, VirtualMachineInstance, VmiOf};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::cache::{Cache, Change, key, key_of};

/// The label an EndpointSlice names its Service by.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The cache of those slices and its index by Service.
pub struct ProxiedEndpoints {
    pub cache: Arc<Cache<EndpointSlice>>,
    /// `namespace/service` → the keys of its slices.
    by_service: Mutex<HashMap<String, BTreeSet<String>>>,
    /// KubeVirt's VMIs (watched only where KubeVirt's API is served).
    pub vmis: Arc<Cache<VirtualMachineInstance>>,
    /// Pod UID → the VMI (`namespace/name`) whose `status.activePods` lists it.
    vmi_of_pod: Mutex<HashMap<String, String>>,
    /// Pod UID → the Services whose slices list it (a VMI's change wakes them).
    services_of_pod: Mutex<HashMap<String, BTreeSet<String>>>,
}

/// The pod UIDs a slice lists.
fn pods_of(slice: &EndpointSlice) -> impl Iterator<Item = &str> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter_map(|e| e.target_ref.as_ref()?.uid.as_deref())
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
            cache: Cache::new("EndpointSlice", revision.clone()),
            by_service: Mutex::new(HashMap::new()),
            vmis: Cache::new("VirtualMachineInstance", revision),
            vmi_of_pod: Mutex::new(HashMap::new()),
            services_of_pod: Mutex::new(HashMap::new()),
        });
        let index = Arc::downgrade(&me);
        me.cache.on_change(move |ch| {
            if let Some(me) = index.upgrade() {
                me.index(ch);
            }
        });
        let index = Arc::downgrade(&me);
        me.vmis.on_change(move |ch| {
            if let Some(me) = index.upgrade() {
                me.index_vmi(ch);
            }
        });
        me
    }

    fn index_vmi(&self, ch: &Change<VirtualMachineInstance>) {
        let mut by = self
            .vmi_of_pod
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = &ch.old {
            let k = key_of(old.as_ref());
            for (pod, _) in old.active_pods() {
                if by.get(pod) == Some(&k) {
                    by.remove(pod);
                }
            }
        }
        if let Some(new) = &ch.new {
            let k = key_of(new.as_ref());
            for (pod, _) in new.active_pods() {
                by.insert(pod.to_string(), k.clone());
            }
        }
    }

    /// The Services whose slices list a pod of the VMI before or after a change (a VMI's
    /// change is judged again on them).
    pub fn services_of_vmi(&self, ch: &Change<VirtualMachineInstance>) -> BTreeSet<String> {
        let by = self
            .services_of_pod
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        [&ch.old, &ch.new]
            .into_iter()
            .flatten()
            .flat_map(|v| {
                v.active_pods()
                    .map(|(p, _)| p.to_string())
                    .collect::<Vec<_>>()
            })
            .filter_map(|p| by.get(&p))
            .flatten()
            .cloned()
            .collect()
    }

    /// The VMI pod `uid` runs, and the node the VMI says it runs on.
    pub fn vmi_of(&self, uid: &str) -> Option<VmiOf> {
        let key = self
            .vmi_of_pod
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()?;
        let v = self.vmis.get(&key)?;
        Some(VmiOf {
            vmi: key,
            node: v.node().map(str::to_string),
        })
    }

    fn index(&self, ch: &Change<EndpointSlice>) {
        let mut by = self
            .by_service
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut pods = self
            .services_of_pod
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = &ch.old
            && let Some(svc) = service_of(old)
        {
            if let Some(set) = by.get_mut(&svc) {
                set.remove(&key_of(old.as_ref()));
                if set.is_empty() {
                    by.remove(&svc);
                }
            }
            for p in pods_of(old) {
                if let Some(set) = pods.get_mut(p) {
                    set.remove(&svc);
                    if set.is_empty() {
                        pods.remove(p);
                    }
                }
            }
        }
        if let Some(new) = &ch.new
            && let Some(svc) = service_of(new)
        {
            by.entry(svc.clone())
                .or_default()
                .insert(key_of(new.as_ref()));
            for p in pods_of(new) {
                pods.entry(p.to_string()).or_default().insert(svc.clone());
            }
        }
    }

    /// Who is behind Service `service` (`namespace/name`), from its ready endpoints
    /// ([`ProxiedEndpoints::ready`]) and the VMIs their pods run; `None` while it has no
    /// slice at all.
    pub fn backends(&self, service: &str) -> Option<Backends> {
        let ready = self.ready(service)?;
        Some(address_controller_api::kubevirt::backends(&ready, &|uid| {
            self.vmi_of(uid)
        }))
    }

    /// The ready IPv4 endpoints of Service `service` (`namespace/name`): those of its
    /// slices whose `ready` is not false (unset counts as ready, as the API says), each
    /// address with its pod and node; `None` while it has no slice at all — not yet known,
    /// not zero (the EndpointSlice controller writes a Service's first slice, empty or not,
    /// just after the Service).
    pub fn ready(&self, service: &str) -> Option<Vec<Endpoint>> {
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
                    ready.extend(e.addresses.iter().map(|ip| Endpoint {
                        ip: ip.clone(),
                        pod_uid: e.target_ref.as_ref().and_then(|r| r.uid.clone()),
                        node: e.node_name.clone(),
                    }));
                }
            }
        }
        Some(ready.into_iter().collect())
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

    fn n(e: &ProxiedEndpoints, svc: &str) -> Option<usize> {
        e.ready(svc).map(|r| r.len())
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
        assert_eq!(n(&e, "t/vm"), Some(2));
        assert_eq!(n(&e, "t/other"), Some(1));
        assert_eq!(e.ready("t/none"), None, "no slice: not known");
        e.cache.apply("t/vm-def".into(), None);
        assert_eq!(n(&e, "t/vm"), Some(1));
        // A slice with nobody ready: known, zero.
        e.cache
            .apply("t/empty-x".into(), Some(slice("empty-x", "empty", &[])));
        assert_eq!(n(&e, "t/empty"), Some(0));
    }

    #[test]
    fn a_vm_moving_is_one_backend_once_its_vmi_lists_both_pods() {
        let e = ProxiedEndpoints::new(Arc::new(AtomicU64::new(0)));
        let s: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "vm-x", "namespace": "t", "labels": {SERVICE_NAME_LABEL: "vm"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "nodeName": "n1", "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "t", "name": "a", "uid": "p1"}},
                {"addresses": ["10.0.1.1"], "nodeName": "n2", "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "t", "name": "b", "uid": "p2"}}]}))
        .unwrap();
        e.cache.apply("t/vm-x".into(), Some(Arc::new(s)));
        assert_eq!(e.backends("t/vm"), Some(Backends::Many(2)), "no VMI yet");
        let vmi = |pods: serde_json::Value| -> Arc<VirtualMachineInstance> {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "vm", "namespace": "t"},
                    "status": {"nodeName": "n1", "activePods": pods}}))
                .unwrap(),
            )
        };
        let old = vmi(json!({"p1": "n1"}));
        e.vmis.apply("t/vm".into(), Some(old.clone()));
        e.vmis
            .apply("t/vm".into(), Some(vmi(json!({"p1": "n1", "p2": "n2"}))));
        assert_eq!(
            e.backends("t/vm"),
            Some(Backends::Migrating {
                vmi: "t/vm".into(),
                nodes: vec!["n1".into(), "n2".into()],
                node: Some("n1".into())
            })
        );
        let ch = Change {
            old: Some(old),
            new: None,
        };
        assert_eq!(
            e.services_of_vmi(&ch).into_iter().collect::<Vec<_>>(),
            vec!["t/vm".to_string()]
        );
        e.vmis.apply("t/vm".into(), None);
        assert_eq!(e.backends("t/vm"), Some(Backends::Many(2)), "the VMI gone");
    }
}
