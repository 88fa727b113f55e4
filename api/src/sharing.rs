//! Sharing one address between Services (the claim owner's grant, port by port), spelled
//! once: the driver kit decides who holds a claim's addresses with [`admit`], the invariant
//! checker judges the ledger with the same function, and the views count holders with
//! [`IPAddress::holders`](crate::IPAddress::holders).
//!
//! * **Who may attach.** A Service of the claim's own namespace, always (one at a time
//!   unless the claim shares); a Service of another namespace only while the claim's
//!   `spec.sharing` is `Namespaces` and lists that namespace. The Service names the claim as
//!   `<namespace>/<name>` then (see [`crate::service::claim_reference`]).
//! * **The first holder keeps the address.** Candidates are judged in order — the holders the
//!   ledger records first, in its order, then the others oldest first — and each is admitted
//!   when it is compatible with every holder admitted before it.
//! * **Compatible** (MetalLB's rule for `allow-shared-ip`, for both drivers): no common
//!   (protocol, port) on a family both serve, and one backend: `externalTrafficPolicy:
//!   Cluster` on both, or `Local` on both with the same selector (with `Local` the address is
//!   announced from the nodes of the pods — one set of pods per address). The range driver
//!   routes its addresses to every node and would not need the backend rule; it applies it
//!   too, so a claim keeps its holders when it moves between classes of different drivers.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::service::{cozy_proxy, service_families};
use crate::{
    Attachment, AttachmentMethod, ClaimServices, Family, IPAddress, IPAddressClaim, SharingPolicy,
};

/// The Service condition the driver kit writes on every Service naming a claim.
pub const CONDITION: &str = "local.sdn.cozystack.io/AddressAttached";

/// Reasons of [`CONDITION`].
pub mod reason {
    /// True: the claim's addresses are on the Service.
    pub const ATTACHED: &str = "Attached";
    /// The Service's annotation is not `<name>` or `<namespace>/<name>`.
    pub const INVALID_CLAIM_REFERENCE: &str = "InvalidClaimReference";
    pub const CLAIM_NOT_FOUND: &str = "ClaimNotFound";
    pub const CLAIM_NOT_BOUND: &str = "ClaimNotBound";
    /// The claim does not share and another Service holds it.
    pub const ATTACHED_ELSEWHERE: &str = "AttachedElsewhere";
    /// A claim of another namespace that does not exist or whose sharing does not include
    /// the Service's namespace: one reason and one message for both
    /// ([`super::not_shared_message`]).
    pub const NOT_SHARED: &str = "NotShared";
    /// The Service uses a (protocol, port) an earlier holder uses on the same family.
    pub const PORT_CONFLICT: &str = "PortConflict";
    /// The Service's traffic policy or (with `Local`) selector differs from a holder's.
    pub const BACKEND_MISMATCH: &str = "BackendMismatch";
    /// None of the claim's addresses is of a family of the Service.
    pub const FAMILY_MISMATCH: &str = "FamilyMismatch";
    /// The backend cannot put the claim's address on a Service (e.g. an admin's static
    /// address outside the class's MetalLB pool).
    pub const ADDRESS_NOT_SERVED: &str = "AddressNotServed";
    /// A Service handed to cozy-proxy holds the address whole, or the Service is one and
    /// another holds the address: such a holder is the address's only one.
    pub const EXCLUSIVE_HOLDER: &str = "ExclusiveHolder";
    /// A Service handed to cozy-proxy names another namespace's claim: its pods' outbound
    /// traffic would leave from someone else's address.
    pub const EGRESS_NOT_OWN: &str = "EgressNotOwn";
    /// A Service handed to cozy-proxy selects more than one workload (ready pods not of one
    /// VM): cozy-proxy forwards the address to one. Refused — after the hold-down
    /// ([`HELD_DOWN`]) when the Service held the address already.
    pub const MULTIPLE_ENDPOINTS: &str = "MultipleEndpoints";
    /// True: a Service handed to cozy-proxy that holds its address selects more than one
    /// workload; the address stays on it for the hold-down
    /// ([`crate::kubevirt::MULTIPLE_WORKLOADS_HOLD_DOWN`]), then it is refused
    /// ([`MULTIPLE_ENDPOINTS`]) unless one workload remains.
    pub const HELD_DOWN: &str = "HeldDown";
    /// True: the VM behind a Service handed to cozy-proxy is moving between nodes (two pods
    /// of one VirtualMachineInstance are ready): it is one backend, the address stays.
    pub const MIGRATING: &str = "Migrating";
    /// A Service handed to cozy-proxy whose EndpointSlices are not known yet: how many pods
    /// it selects is not known, so nothing is put on it (a new Service's slices follow it
    /// within moments).
    pub const WAITING_FOR_ENDPOINTS: &str = "WaitingForEndpoints";
    /// Pinned, and the load balancer does not show the address on the Service (yet).
    pub const WAITING_FOR_LOAD_BALANCER: &str = "WaitingForLoadBalancer";
    /// The load balancer refused the Service (its words in the message).
    pub const LOAD_BALANCER_REFUSED: &str = "LoadBalancerRefused";
}

impl IPAddressClaim {
    /// The claim's sharing policy (absent: `None`).
    pub fn sharing_policy(&self) -> SharingPolicy {
        self.spec
            .sharing
            .as_ref()
            .map_or(SharingPolicy::None, |s| s.policy)
    }

    /// Whether several Services may hold the claim's addresses at once.
    pub fn is_shared(&self) -> bool {
        self.sharing_policy() != SharingPolicy::None
    }

    /// Whether a Service of `namespace` may attach the claim's addresses at all.
    pub fn admits_namespace(&self, namespace: &str) -> bool {
        if self.metadata.namespace.as_deref() == Some(namespace) {
            return true;
        }
        self.sharing_policy() == SharingPolicy::Namespaces
            && self
                .spec
                .sharing
                .iter()
                .flat_map(|s| &s.namespaces)
                .any(|n| n == namespace)
    }
}

/// A Service's [`CONDITION`], when a driver wrote it.
pub fn condition(s: &Service) -> Option<&Condition> {
    s.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)
}

/// What a Service's [`CONDITION`] says: `Some(true)` it holds the claim it names,
/// `Some(false)` it was refused, `None` no driver has judged it (yet).
pub fn attached(s: &Service) -> Option<bool> {
    match condition(s)?.status.as_str() {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}

impl ClaimServices {
    /// Counts the Services naming a claim by their [`CONDITION`]; `None` when none does.
    pub fn count<'a>(services: impl IntoIterator<Item = &'a Service>) -> Option<ClaimServices> {
        let mut n = 0usize;
        let mut c = ClaimServices::default();
        for s in services {
            n += 1;
            match attached(s) {
                Some(true) => c.attached = c.attached.saturating_add(1),
                Some(false) => c.refused = c.refused.saturating_add(1),
                None => {}
            }
        }
        (n > 0).then_some(c)
    }
}

/// A (protocol, port) a Service serves, as `TCP/443` (protocol absent = TCP) — none for a
/// Service cozy-proxy serves whole: the port it lists is a placeholder (the platform
/// renders `65535` for a VM that lists none), never a port of the sharing book.
pub fn ports_of(s: &Service) -> BTreeSet<String> {
    if cozy_proxy(s).is_some_and(|p| p.method == AttachmentMethod::WholeIP) {
        return BTreeSet::new();
    }
    s.spec
        .iter()
        .flat_map(|sp| sp.ports.iter().flatten())
        .map(|p| format!("{}/{}", p.protocol.as_deref().unwrap_or("TCP"), p.port))
        .collect()
}

/// The ledger's record of Service `key` (`namespace/name`) as a holder: what it serves and
/// how — the one spelling of an attachment, for the kit and the admin commands.
pub fn attachment(key: &str, service: Option<&Service>) -> Attachment {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let proxied = service.and_then(cozy_proxy);
    Attachment {
        kind: "Service".into(),
        namespace: Some(ns.to_string()),
        name: name.to_string(),
        ports: service
            .map(|s| ports_of(s).into_iter().collect())
            .unwrap_or_default(),
        method: proxied.map(|p| p.method),
        allow_icmp: proxied.is_some_and(|p| p.allow_icmp && p.method == AttachmentMethod::PortList),
        node: None,
    }
}

impl IPAddress {
    /// The ledger's part of the address's status when its holders change from BEFORE to
    /// AFTER at NOW — the one spelling of the ledger write (the driver kit's, and `adopt`'s,
    /// whose BEFORE is the Service found holding the address): `attachments`,
    /// `associatedTo` (the first), `holderCount` (absent when none), and the Service spans
    /// following them in the same write ([`crate::history::spans_after`]; `found` for a
    /// holder of BEFORE without an open span). With it, the records of the spans the write
    /// moves off the address: the writer creates them before it writes.
    /// `move_to_records` false: the spans stay on the address (their records cannot be made).
    pub fn ledger_status(
        &self,
        before: &[Attachment],
        after: &[Attachment],
        now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
        move_to_records: bool,
    ) -> (serde_json::Value, Vec<crate::history::Record>) {
        use serde_json::json;
        let first = after.first().map(Attachment::association);
        let count = (!after.is_empty()).then_some(after.len());
        let mut out = json!({"attachments": after, "associatedTo": first, "holderCount": count});
        let (spans, _) = crate::history::spans(self);
        let counts = crate::history::Counts::spans(self);
        let mut records = Vec::new();
        if let Some(mut settled) = crate::history::spans_after(spans, counts, before, after, now) {
            if !move_to_records {
                settled = settled.unmove();
            }
            settled.write_spans(&mut out);
            let meta = crate::history::AddressMeta::of(self);
            records = settled
                .moved
                .iter()
                .map(|(o, sp)| meta.span(*o, sp))
                .collect();
        }
        (out, records)
    }

    /// The kit's write that only moves the address's closed spans past
    /// [`crate::history::SPANS_KEEP`] to records (an older version's backlog, when no ledger
    /// write moves it), with the records to create before it; `None` when nothing moves.
    pub fn spans_move(&self) -> Option<(serde_json::Value, Vec<crate::history::Record>)> {
        let (spans, _) = crate::history::spans(self);
        let settled = crate::history::spans_moved(spans, crate::history::Counts::spans(self))?;
        let mut out = serde_json::json!({});
        settled.write_spans(&mut out);
        let meta = crate::history::AddressMeta::of(self);
        let records = settled
            .moved
            .iter()
            .map(|(o, sp)| meta.span(*o, sp))
            .collect();
        Some((out, records))
    }
}

/// What must be equal between holders of one address: empty for `Cluster`, the selector
/// (sorted `k=v`) for `Local`.
pub fn backend_key(s: &Service) -> Option<String> {
    let sp = s.spec.as_ref()?;
    (sp.external_traffic_policy.as_deref() == Some("Local")).then(|| {
        sp.selector
            .iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Why a Service is not admitted as a holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The claim's sharing does not include the Service's namespace.
    NotShared,
    /// The claim does not share; this Service (`namespace/name`) holds it.
    AttachedElsewhere(String),
    /// The holder `with` already serves `port` on a common family.
    PortConflict { with: String, port: String },
    /// The holder `with` has another traffic policy or selector.
    BackendMismatch(String),
    /// `holder` is handed to cozy-proxy and holds the address whole.
    HeldWhole(String),
    /// This Service is handed to cozy-proxy, which takes the address whole, and `holder`
    /// already holds it.
    WantsWhole(String),
    /// This Service is handed to cozy-proxy and names another namespace's claim.
    EgressNotOwn,
}

impl Refusal {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NotShared => reason::NOT_SHARED,
            Refusal::AttachedElsewhere(_) => reason::ATTACHED_ELSEWHERE,
            Refusal::PortConflict { .. } => reason::PORT_CONFLICT,
            Refusal::BackendMismatch(_) => reason::BACKEND_MISMATCH,
            Refusal::HeldWhole(_) | Refusal::WantsWhole(_) => reason::EXCLUSIVE_HOLDER,
            Refusal::EgressNotOwn => reason::EGRESS_NOT_OWN,
        }
    }

    /// The condition message, for a Service naming `claim` (`namespace/name`).
    pub fn message(&self, claim: &str) -> String {
        match self {
            Refusal::NotShared => not_shared_message(claim),
            Refusal::AttachedElsewhere(h) => format!(
                "IPAddressClaim {claim} already serves Service {h} and does not share (its spec.sharing.policy is None)"
            ),
            Refusal::PortConflict { with, port } => format!(
                "{port} is already served on the address of IPAddressClaim {claim} by Service {with}"
            ),
            Refusal::BackendMismatch(h) => format!(
                "Service {h} holds the address of IPAddressClaim {claim} with another externalTrafficPolicy or (Local) selector; Services sharing an address must have one backend"
            ),
            Refusal::HeldWhole(h) => format!(
                "Service {h} holds the address of IPAddressClaim {claim} whole (cozy-proxy forwards all of it to its pod, and sends the pod's outbound traffic from it); no other Service may hold it, whatever the claim's sharing"
            ),
            Refusal::WantsWhole(h) => format!(
                "cozy-proxy takes the whole address (every port forwarded to one pod, its outbound traffic sent from it) and Service {h} already holds the address of IPAddressClaim {claim}"
            ),
            Refusal::EgressNotOwn => format!(
                "a Service handed to cozy-proxy sends its pods' outbound traffic from the address: it may name only a claim of its own namespace, not IPAddressClaim {claim}"
            ),
        }
    }
}

/// What a Service naming another namespace's claim `claim` (`namespace/name`) reads when
/// that claim does not exist or does not share with its namespace — the same words for
/// both, so that a reference is no oracle of another namespace's claim names.
pub fn not_shared_message(claim: &str) -> String {
    format!(
        "IPAddressClaim {claim} does not exist or does not share its address with this namespace (its owner's spec.sharing must list it)"
    )
}

/// One Service that names a claim, as [`admit`] judges it.
pub struct Candidate<'a> {
    /// `namespace/name`.
    pub key: &'a str,
    pub namespace: &'a str,
    pub service: &'a Service,
}

/// Judges `candidates` — in the order of [`order`] — for `claim`: `Ok` holds the claim's
/// addresses, `Err` says why not. Linear in the candidates times the holders.
pub fn admit(claim: &IPAddressClaim, candidates: &[Candidate<'_>]) -> Vec<Result<(), Refusal>> {
    struct Held<'a> {
        key: &'a str,
        families: Vec<Family>,
        ports: BTreeSet<String>,
        backend: Option<String>,
        whole: bool,
    }
    let mut held: Vec<Held<'_>> = Vec::new();
    candidates
        .iter()
        .map(|c| {
            if !claim.admits_namespace(c.namespace) {
                return Err(Refusal::NotShared);
            }
            let whole = cozy_proxy(c.service).is_some();
            // Egress from the address is its owner's alone.
            if whole && claim.metadata.namespace.as_deref() != Some(c.namespace) {
                return Err(Refusal::EgressNotOwn);
            }
            let me = Held {
                key: c.key,
                families: service_families(c.service),
                ports: ports_of(c.service),
                backend: backend_key(c.service),
                whole,
            };
            if let Some(first) = held.first() {
                if first.whole {
                    return Err(Refusal::HeldWhole(first.key.to_string()));
                }
                if whole {
                    return Err(Refusal::WantsWhole(first.key.to_string()));
                }
                if !claim.is_shared() {
                    return Err(Refusal::AttachedElsewhere(first.key.to_string()));
                }
            }
            for h in &held {
                if h.backend != me.backend {
                    return Err(Refusal::BackendMismatch(h.key.to_string()));
                }
                if !h.families.iter().any(|f| me.families.contains(f)) {
                    continue;
                }
                if let Some(port) = h.ports.intersection(&me.ports).next() {
                    return Err(Refusal::PortConflict {
                        with: h.key.to_string(),
                        port: port.clone(),
                    });
                }
            }
            held.push(me);
            Ok(())
        })
        .collect()
}

/// The order [`admit`] judges in: the keys the ledger records as holders (`recorded`, in its
/// order) first, then the others by creation time and key.
pub fn order<'a, T>(
    mut candidates: Vec<T>,
    recorded: &[String],
    key: impl Fn(&T) -> &'a str,
    created: impl Fn(&T) -> Option<i64>,
) -> Vec<T> {
    candidates.sort_by(|a, b| {
        let rank = |x: &T| {
            (
                recorded
                    .iter()
                    .position(|r| r == key(x))
                    .unwrap_or(usize::MAX),
                created(x),
                key(x).to_string(),
            )
        };
        rank(a).cmp(&rank(b))
    });
    candidates
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    fn claim(sharing: Value) -> IPAddressClaim {
        serde_json::from_value(
            json!({"metadata": {"name": "c", "namespace": "t", "uid": "u"},
            "spec": {"sharing": sharing}}),
        )
        .unwrap()
    }

    fn svc(ports: &[(&str, i32)], extra: Value) -> Service {
        let ports: Vec<Value> = ports
            .iter()
            .map(|(p, n)| json!({"protocol": p, "port": n}))
            .collect();
        let mut v =
            json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer", "ports": ports}});
        for part in ["spec", "metadata"] {
            if let Some(fields) = extra.get(part).and_then(Value::as_object) {
                for (k, x) in fields {
                    v[part][k] = x.clone();
                }
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn judge(c: &IPAddressClaim, list: &[(&str, &Service)]) -> Vec<Result<(), &'static str>> {
        let cands: Vec<Candidate<'_>> = list
            .iter()
            .map(|(k, s)| Candidate {
                key: k,
                namespace: k.split_once('/').unwrap().0,
                service: s,
            })
            .collect();
        admit(c, &cands)
            .into_iter()
            .map(|r| r.map_err(|e| e.reason()))
            .collect()
    }

    #[test]
    fn a_claims_services_are_counted_by_their_condition() {
        let with = |status: &str| -> Service {
            serde_json::from_value(json!({"metadata": {"name": "s"}, "status": {"conditions": [
                {"type": "Other", "status": "False", "reason": "X", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": CONDITION, "status": status, "reason": "R", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
            .unwrap()
        };
        let (yes, no, unknown) = (with("True"), with("False"), with("Unknown"));
        let unjudged = svc(&[("TCP", 80)], json!({}));
        assert_eq!(attached(&yes), Some(true));
        assert_eq!(attached(&no), Some(false));
        assert_eq!(attached(&unknown), None);
        assert_eq!(attached(&unjudged), None);
        assert_eq!(ClaimServices::count([]), None);
        assert_eq!(
            ClaimServices::count([&yes, &no, &yes, &unknown, &unjudged]),
            Some(ClaimServices {
                attached: 2,
                refused: 1
            })
        );
        assert_eq!(
            ClaimServices::count([&unjudged]),
            Some(ClaimServices::default())
        );
    }

    /// The platform's VM Service: cozy-proxy's label, its annotations, the placeholder port.
    fn vm(whole: &str, icmp: Option<&str>, ports: &[(&str, i32)]) -> Service {
        let mut ann = json!({"networking.cozystack.io/wholeIP": whole});
        if let Some(i) = icmp {
            ann["networking.cozystack.io/allowICMP"] = json!(i);
        }
        svc(
            ports,
            json!({"metadata": {"labels": {"service.kubernetes.io/service-proxy-name": "cozy-proxy"},
                "annotations": ann},
                "spec": {"externalTrafficPolicy": "Local", "selector": {"vm": "v"}}}),
        )
    }

    #[test]
    fn cozy_proxy_reads_the_method_from_the_label_and_annotations() {
        let whole = vm("true", None, &[("TCP", 65535)]);
        assert_eq!(
            cozy_proxy(&whole),
            Some(crate::service::Proxied {
                method: AttachmentMethod::WholeIP,
                allow_icmp: true
            })
        );
        // The placeholder is never a port.
        assert!(ports_of(&whole).is_empty());
        let listed = vm("false", Some("true"), &[("TCP", 22), ("UDP", 53)]);
        let a = attachment("t/vm", Some(&listed));
        assert_eq!(a.method, Some(AttachmentMethod::PortList));
        assert!(a.allow_icmp);
        assert_eq!(a.ports, ["TCP/22", "UDP/53"]);
        // Anything but "true" is the listed ports, ICMP dropped, as cozy-proxy reads it.
        assert_eq!(
            cozy_proxy(&vm("True", Some("yes"), &[("TCP", 22)])),
            Some(crate::service::Proxied {
                method: AttachmentMethod::PortList,
                allow_icmp: false
            })
        );
        // The label is the only selector: the annotations alone are nothing.
        let mut unlabelled = vm("true", None, &[("TCP", 65535)]);
        unlabelled.metadata.labels = None;
        assert_eq!(cozy_proxy(&unlabelled), None);
        assert_eq!(ports_of(&unlabelled).len(), 1);
        assert_eq!(attachment("t/x", Some(&unlabelled)).method, None);
    }

    #[test]
    fn a_holder_cozy_proxy_serves_is_the_addresses_only_one_whatever_the_sharing() {
        let c = claim(json!({"policy": "SameNamespace"}));
        let whole = vm("true", None, &[("TCP", 65535)]);
        let listed = vm("false", None, &[("TCP", 22)]);
        let web = svc(
            &[("TCP", 80)],
            json!({"spec": {"externalTrafficPolicy": "Local", "selector": {"vm": "v"}}}),
        );
        // Held whole first: a second Service is refused, even on another port.
        assert_eq!(
            judge(&c, &[("t/vm", &whole), ("t/web", &web)]),
            [Ok(()), Err(reason::EXCLUSIVE_HOLDER)]
        );
        // A port holder first: the whole-address Service is refused.
        assert_eq!(
            judge(&c, &[("t/web", &web), ("t/vm", &whole)]),
            [Ok(()), Err(reason::EXCLUSIVE_HOLDER)]
        );
        // PortList is exclusive too (cozy-proxy maps the address, not a port).
        assert_eq!(
            judge(&c, &[("t/vm", &listed), ("t/web", &web)]),
            [Ok(()), Err(reason::EXCLUSIVE_HOLDER)]
        );
        // Two of them: the first keeps it.
        assert_eq!(
            judge(&c, &[("t/vm", &whole), ("t/vm2", &whole)]),
            [Ok(()), Err(reason::EXCLUSIVE_HOLDER)]
        );
    }

    #[test]
    fn another_namespace_never_sends_its_traffic_from_the_address() {
        let c = claim(json!({"policy": "Namespaces", "namespaces": ["o"]}));
        let whole = vm("true", None, &[("TCP", 65535)]);
        let web = svc(&[("TCP", 80)], json!({}));
        // Granted to namespace o: an ordinary Service may attach, one cozy-proxy serves not.
        assert_eq!(judge(&c, &[("o/web", &web)]), [Ok(())]);
        assert_eq!(
            judge(&c, &[("o/vm", &whole)]),
            [Err(reason::EGRESS_NOT_OWN)]
        );
        assert_eq!(judge(&c, &[("t/vm", &whole)]), [Ok(())]);
    }

    #[test]
    fn without_sharing_the_first_holder_keeps_the_address() {
        let c = claim(Value::Null);
        let web = svc(&[("TCP", 80)], json!({}));
        let tls = svc(&[("TCP", 443)], json!({}));
        assert_eq!(
            judge(&c, &[("t/web", &web), ("t/tls", &tls)]),
            [Ok(()), Err(reason::ATTACHED_ELSEWHERE)]
        );
        let c = claim(json!({"policy": "None"}));
        assert_eq!(
            judge(&c, &[("t/tls", &tls), ("t/web", &web)]),
            [Ok(()), Err(reason::ATTACHED_ELSEWHERE)]
        );
    }

    #[test]
    fn sharing_is_port_by_port_per_protocol_and_family() {
        let c = claim(json!({"policy": "SameNamespace"}));
        let web = svc(&[("TCP", 80)], json!({}));
        let tls = svc(&[("TCP", 443)], json!({}));
        let dns_tcp = svc(&[("TCP", 53)], json!({}));
        let dns_udp = svc(&[("UDP", 53)], json!({}));
        let thief = svc(&[("TCP", 8443), ("TCP", 443)], json!({}));
        assert_eq!(
            judge(
                &c,
                &[
                    ("t/web", &web),
                    ("t/tls", &tls),
                    ("t/dns-tcp", &dns_tcp),
                    ("t/dns-udp", &dns_udp),
                    ("t/other", &thief)
                ]
            ),
            [Ok(()), Ok(()), Ok(()), Ok(()), Err(reason::PORT_CONFLICT)]
        );
        // Absent protocol is TCP.
        let bare: Service = serde_json::from_value(
            json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 443}]}}),
        )
        .unwrap();
        assert_eq!(
            judge(&c, &[("t/tls", &tls), ("t/bare", &bare)]),
            [Ok(()), Err(reason::PORT_CONFLICT)]
        );
        // Different families never collide.
        let v6 = svc(&[("TCP", 443)], json!({"spec": {"ipFamilies": ["IPv6"]}}));
        assert_eq!(
            judge(&c, &[("t/tls", &tls), ("t/v6", &v6)]),
            [Ok(()), Ok(())]
        );
        let refusal = admit(
            &c,
            &[
                Candidate {
                    key: "t/tls",
                    namespace: "t",
                    service: &tls,
                },
                Candidate {
                    key: "t/other",
                    namespace: "t",
                    service: &thief,
                },
            ],
        );
        assert_eq!(
            refusal[1],
            Err(Refusal::PortConflict {
                with: "t/tls".into(),
                port: "TCP/443".into()
            })
        );
    }

    #[test]
    fn local_holders_must_select_the_same_pods() {
        let c = claim(json!({"policy": "SameNamespace"}));
        let local = |app: &str, port| {
            svc(
                &[("TCP", port)],
                json!({"spec": {"externalTrafficPolicy": "Local", "selector": {"app": app}}}),
            )
        };
        let (a80, a443, b443) = (local("a", 80), local("a", 443), local("b", 443));
        let cluster = svc(&[("TCP", 8080)], json!({}));
        assert_eq!(
            judge(
                &c,
                &[
                    ("t/a80", &a80),
                    ("t/a443", &a443),
                    ("t/b443", &b443),
                    ("t/cl", &cluster)
                ]
            ),
            [
                Ok(()),
                Ok(()),
                Err(reason::BACKEND_MISMATCH),
                Err(reason::BACKEND_MISMATCH)
            ]
        );
    }

    #[test]
    fn other_namespaces_only_by_the_claims_grant() {
        let web = svc(&[("TCP", 80)], json!({}));
        let tls = svc(&[("TCP", 443)], json!({}));
        for sharing in [
            Value::Null,
            json!({"policy": "SameNamespace"}),
            json!({"policy": "Namespaces", "namespaces": ["x"]}),
        ] {
            let c = claim(sharing.clone());
            assert_eq!(
                judge(&c, &[("u/tls", &tls), ("t/web", &web)]),
                [Err(reason::NOT_SHARED), Ok(())],
                "{sharing}"
            );
        }
        let c = claim(json!({"policy": "Namespaces", "namespaces": ["u"]}));
        assert_eq!(
            judge(&c, &[("t/web", &web), ("u/tls", &tls)]),
            [Ok(()), Ok(())]
        );
        assert!(c.admits_namespace("t") && c.admits_namespace("u") && !c.admits_namespace("v"));
    }

    #[test]
    fn the_ledger_order_comes_first_then_age() {
        let recorded = vec!["t/b".to_string()];
        let got = order(
            vec![("t/a", Some(1)), ("t/c", Some(0)), ("t/b", Some(9))],
            &recorded,
            |x| x.0,
            |x| x.1,
        );
        assert_eq!(
            got.iter().map(|x| x.0).collect::<Vec<_>>(),
            ["t/b", "t/c", "t/a"]
        );
    }
}
