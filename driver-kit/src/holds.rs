//! Holds: placeholder Services through which a driver keeps every address of its classes
//! in a load balancer's own books (MetalLB's, Cilium LB-IPAM's), so that the load balancer
//! refuses anyone else who asks for it — also while the address is reserved or `Released`.
//! What is the same for every such backend is here, one spelling: the hold's name, the
//! claim's sharing key, the port a hold takes, and whose backend key it follows. Both
//! backends share an address only between Services with the same key, disjoint (protocol,
//! port)s, one `externalTrafficPolicy`, and under `Local` one selector.

use std::net::IpAddr;

use address_controller_api::IPAddress;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::ingress;

/// The label naming the driver that made an object (its holds, pools and the like).
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Whether `service` is one of the holds of the driver `manager` (`MANAGED_BY`): in its
/// hold namespace and labelled as its own. A tenant cannot make one there.
pub fn is_hold(service: &Service, hold_namespace: &str, manager: &str) -> bool {
    service.namespace().as_deref() == Some(hold_namespace)
        && service.labels().get(MANAGED_BY).map(String::as_str) == Some(manager)
}

/// The `service.kubernetes.io/service-proxy-name` of a hold: no proxy serves it — kube-proxy
/// skips a Service that names another proxy, and cozy-proxy serves only its own name.
pub const HOLD_PROXY_NAME: &str = "address-controller-hold";
/// The port a new hold takes: TCP/65534 — not 65535, the placeholder the platform's VM
/// Services list (cozy-proxy's own example and the platform's chart render `port: 65535`
/// for a VM that lists none). MetalLB and Cilium's LB-IPAM share an address only between Services
/// whose (protocol, port)s are disjoint, so a hold never keeps a port a Service holding its
/// address lists: it moves to the highest free one below before that Service is pinned
/// ([`hold_port`]).
pub const HOLD_PORT: i32 = 65534;

/// The name of the hold of an address (a DNS label: long names are shortened by a hash).
pub fn hold_name(address: &str) -> String {
    let name = format!("hold-{address}");
    if name.len() <= 63 {
        return name;
    }
    // FNV-1a: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in address.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let head: String = address.chars().take(40).collect();
    format!("hold-{}-{h:016x}", head.trim_end_matches(['-', '.']))
}

/// The sharing key of an address: its claim's (so the claim's Service shares every one of
/// its addresses with their holds), or its own while it has no claim.
pub fn sharing_key(a: &IPAddress) -> String {
    match a.spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref()) {
        Some(uid) => format!("ac-{uid}"),
        None => format!("ac-{}", a.name_any()),
    }
}

/// The (protocol, port)s the Services holding `a` list, as a load balancer that shares by port counts them: `like`'s
/// (the Service being pinned) as its spec lists them, the ledger's holders' as recorded.
fn ports_in_use(
    a: &IPAddress,
    like: Option<&Service>,
) -> std::collections::BTreeSet<(String, i32)> {
    let mut used: std::collections::BTreeSet<(String, i32)> = like
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| (p.protocol.clone().unwrap_or_else(|| "TCP".into()), p.port))
        .collect();
    for h in a.status.iter().flat_map(|st| &st.attachments) {
        for p in &h.ports {
            if let Some((proto, port)) = p.split_once('/')
                && let Ok(port) = port.parse()
            {
                used.insert((proto.to_string(), port));
            }
        }
    }
    used
}

/// The port of `a`'s hold: `current` while no holder lists it, else the highest TCP port
/// from [`HOLD_PORT`] down that none lists.
pub fn hold_port(a: &IPAddress, like: Option<&Service>, current: Option<i32>) -> i32 {
    let used = ports_in_use(a, like);
    let free = |p: i32| !used.contains(&("TCP".to_string(), p));
    match current {
        Some(p) if free(p) => p,
        _ => (1..=HOLD_PORT)
            .rev()
            .find(|p| free(*p))
            .unwrap_or(HOLD_PORT),
    }
}

/// The Service whose backend key (MetalLB's: `externalTrafficPolicy: Local` and the
/// selector, or none) `a`'s hold takes. MetalLB shares an address only between Services of
/// one backend key, and never takes an address from a Service that has it for one that asks
/// for it: a hold that changes its backend key under the Service holding the address loses
/// the address, and then nothing refuses that Service when it is detached — it keeps the
/// address (observed with v0.16.1: a VM's `Local` Service kept its address after its claim
/// annotation was removed while the hold was pending). So the hold follows `like` (the
/// Service being pinned) only when that cannot happen: `like` has the address, or nobody
/// else holds it in the ledger; otherwise — and when no Service is being pinned — it keeps
/// its own (`have`; a new hold without `like`: none, `Cluster`).
pub fn backend_source<'s>(
    a: &IPAddress,
    ip: IpAddr,
    have: Option<&'s Service>,
    like: Option<&'s Service>,
) -> Option<&'s Service> {
    let Some(like) = like else { return have };
    let (ns, name) = (like.namespace().unwrap_or_default(), like.name_any());
    let others = a.status.iter().flat_map(|st| &st.attachments).any(|h| {
        !(h.kind == "Service" && h.namespace.as_deref() == Some(ns.as_str()) && h.name == name)
    });
    let hold_has = have.is_some_and(|h| ingress(h).contains(&ip));
    let like_has = ingress(like).contains(&ip);
    let follow = if hold_has {
        !others
    } else {
        like_has || !others
    };
    if follow || have.is_none() {
        Some(like)
    } else {
        have
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn holds_are_named_per_address_and_keyed_by_the_claim() {
        let a: IPAddress =
            serde_json::from_value(json!({"metadata": {"name": "ipv4-192-0-2-1", "uid": "au"},
            "spec": {"address": "192.0.2.1", "className": "a", "source": {"fromClass": {}},
                "claimRef": {"namespace": "t", "name": "c", "uid": "cu"}}}))
            .unwrap();
        assert_eq!(hold_name("ipv4-192-0-2-1"), "hold-ipv4-192-0-2-1");
        let long = "x".repeat(200);
        assert!(hold_name(&long).len() <= 63);
        assert_ne!(hold_name(&long), hold_name(&format!("{long}y")));
        assert_eq!(sharing_key(&a), "ac-cu");
        let mut unclaimed = a.clone();
        unclaimed.spec.claim_ref = None;
        assert_eq!(sharing_key(&unclaimed), "ac-ipv4-192-0-2-1");
    }

    #[test]
    fn a_hold_never_changes_its_backend_key_under_the_service_that_has_the_address() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let mut a: IPAddress =
            serde_json::from_value(json!({"metadata": {"name": "ipv4-192-0-2-1"},
            "spec": {"address": "192.0.2.1", "className": "a", "source": {"fromClass": {}}}}))
            .unwrap();
        let svc = |name: &str, local: Option<&str>, shows: bool| -> Service {
            let mut s = json!({"metadata": {"name": name, "namespace": "t"},
                "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Cluster"}});
            if let Some(app) = local {
                s["spec"]["externalTrafficPolicy"] = json!("Local");
                s["spec"]["selector"] = json!({"app": app});
            }
            if shows {
                s["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
            }
            serde_json::from_value(s).unwrap()
        };
        let name = |s: Option<&Service>| s.map(|s| s.name_any());
        let hold = svc("hold", None, true);
        let vm = svc("vm", Some("vm"), false);
        // The address's first holder: the hold takes its backend key, new or existing.
        assert_eq!(
            name(backend_source(&a, ip, None, Some(&vm))),
            Some("vm".into())
        );
        assert_eq!(
            name(backend_source(&a, ip, Some(&hold), Some(&vm))),
            Some("vm".into())
        );
        // No Service being pinned (the address's own pass): the hold keeps its own — never
        // back to Cluster under a Local holder.
        assert_eq!(
            name(backend_source(&a, ip, Some(&hold), None)),
            Some("hold".into())
        );
        assert_eq!(name(backend_source(&a, ip, None, None)), None);
        // Another holder in the ledger while the hold has the address: kept.
        a.status = serde_json::from_value(json!({"attachments": [
            {"kind": "Service", "namespace": "t", "name": "vm"}]}))
        .unwrap();
        let web = svc("web", None, false);
        assert_eq!(
            name(backend_source(&a, ip, Some(&hold), Some(&web))),
            Some("hold".into())
        );
        // ...and the ledger's own holder is not "another".
        assert_eq!(
            name(backend_source(&a, ip, Some(&hold), Some(&vm))),
            Some("vm".into())
        );
        // The hold lost the address to a Service that has it: it follows that Service.
        let pending = svc("hold", None, false);
        let vm_has = svc("vm", Some("vm"), true);
        assert_eq!(
            name(backend_source(&a, ip, Some(&pending), Some(&vm_has))),
            Some("vm".into())
        );
        assert_eq!(
            name(backend_source(&a, ip, Some(&pending), Some(&web))),
            Some("hold".into())
        );
    }

    #[test]
    fn a_hold_never_keeps_a_port_a_service_of_its_address_lists() {
        let mut a: IPAddress =
            serde_json::from_value(json!({"metadata": {"name": "ipv4-192-0-2-1"},
            "spec": {"address": "192.0.2.1", "className": "a", "source": {"fromClass": {}}}}))
            .unwrap();
        // A new hold: 65534, never the platform's VM placeholder 65535.
        assert_eq!(hold_port(&a, None, None), 65534);
        // The VM Service lists 65535 (a placeholder): an old hold there moves below it.
        let vm: Service =
            serde_json::from_value(json!({"metadata": {"name": "vm", "namespace": "t"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 65535, "protocol": "TCP"}]}}))
            .unwrap();
        assert_eq!(hold_port(&a, Some(&vm), Some(65535)), 65534);
        // Kept while nobody lists it.
        assert_eq!(hold_port(&a, Some(&vm), Some(65534)), 65534);
        assert_eq!(hold_port(&a, None, Some(65535)), 65535);
        // A tenant on 65534 and a ledger holder on 65533: the next free is 65532; a UDP
        // port of the same number does not count.
        let tenant: Service = serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "t"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 65534}, {"port": 65532, "protocol": "UDP"}]}}))
        .unwrap();
        a.status = serde_json::from_value(json!({"attachments": [
            {"kind": "Service", "namespace": "t", "name": "y", "ports": ["TCP/65533"]}]}))
        .unwrap();
        assert_eq!(hold_port(&a, Some(&tenant), Some(65534)), 65532);
    }

    #[test]
    fn a_hold_is_the_drivers_own_in_its_namespace_only() {
        let svc = |ns: &str, manager: &str| -> Service {
            serde_json::from_value(
                json!({"metadata": {"name": "hold-192.0.2.1", "namespace": ns,
                "labels": {MANAGED_BY: manager}}}),
            )
            .unwrap()
        };
        assert!(is_hold(&svc("system", "d"), "system", "d"));
        assert!(!is_hold(&svc("tenant", "d"), "system", "d"));
        assert!(!is_hold(&svc("system", "another"), "system", "d"));
    }
}
