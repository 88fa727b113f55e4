//! What the range driver does with one claim or one class (SPEC §8), as pure functions.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use address_controller_api::family::{family_of, parse_address};
use address_controller_api::names::PROVISIONER_ANNOTATION;
use address_controller_api::{
    AddressSource, ClaimPhase, ClaimRef, Family, FromClass, IPAddress, IPAddressClaim,
    IPAddressClass, IPAddressSpec,
};
use kube::ResourceExt;
use kube::api::ObjectMeta;

use crate::allocator::{self, Cidr, ParamError};

/// The provisioner name this driver answers to.
pub const PROVISIONER: &str = "range.drivers.local.sdn.cozystack.io";

/// A class of this driver with its parsed ranges, or why they cannot be used.
pub type ClassRange = (Arc<IPAddressClass>, Result<Vec<Cidr>, ParamError>);

/// The parsed ranges of each of this driver's classes, with overlaps between classes
/// reported as errors on every class involved.
pub fn class_ranges(classes: &[Arc<IPAddressClass>]) -> Vec<ClassRange> {
    let ours: Vec<ClassRange> = classes
        .iter()
        .filter(|c| c.spec.provisioner == PROVISIONER)
        .map(|c| {
            (
                c.clone(),
                allocator::parse_parameters(c.spec.parameters.as_ref()),
            )
        })
        .collect();
    ours.iter()
        .map(|(class, parsed)| {
            let checked = parsed.clone().and_then(|mine| {
                for (other, theirs) in &ours {
                    if other.name_any() == class.name_any() {
                        continue;
                    }
                    if let Ok(theirs) = theirs
                        && let Some((a, b)) = allocator::overlap_between(&mine, theirs)
                    {
                        return Err(ParamError::Overlap(
                            a.to_string(),
                            format!("{b} of class {}", other.name_any()),
                        ));
                    }
                }
                Ok(mine)
            });
            (class.clone(), checked)
        })
        .collect()
}

/// What to do for one claim.
#[derive(Debug, Clone)]
pub enum ClaimWork {
    /// Not ours, not pending, pinned, Lost, or fully provisioned.
    Nothing,
    /// Create these addresses (one per missing family), in order.
    Create(Vec<IPAddress>),
    /// The class cannot be used (bad parameters): reported on the class.
    BadClass(String),
    /// No free address for these families in this class.
    Exhausted {
        class: String,
        families: Vec<Family>,
    },
}

/// Plans the addresses one claim still needs. `in_flight` holds (claim uid, family) pairs
/// this process created recently that the cache may not show yet.
pub fn plan_claim(
    claim: &IPAddressClaim,
    ranges: &[ClassRange],
    addresses: &[Arc<IPAddress>],
    in_flight: &HashSet<(String, Family)>,
) -> ClaimWork {
    if claim
        .annotations()
        .get(PROVISIONER_ANNOTATION)
        .map(String::as_str)
        != Some(PROVISIONER)
        || claim.spec.address_name.is_some()
        || claim.metadata.deletion_timestamp.is_some()
    {
        return ClaimWork::Nothing;
    }
    let status = claim.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase),
        Some(ClaimPhase::Bound | ClaimPhase::Lost)
    ) {
        return ClaimWork::Nothing;
    }
    let Some(class_name) = status
        .and_then(|s| s.class_name.clone())
        .or_else(|| claim.spec.class_name.clone())
    else {
        return ClaimWork::Nothing;
    };
    let Some((class, parsed)) = ranges.iter().find(|(c, _)| c.name_any() == class_name) else {
        return ClaimWork::Nothing;
    };
    let cidrs = match parsed {
        Ok(c) => c,
        Err(e) => return ClaimWork::BadClass(e.to_string()),
    };
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let ns = claim.namespace().unwrap_or_default();
    let mine = |a: &IPAddress| {
        a.spec.claim_ref.as_ref().is_some_and(|r| {
            r.namespace == ns
                && r.name == claim.name_any()
                && r.uid.as_deref().is_none_or(|u| u == uid)
        }) && a.metadata.deletion_timestamp.is_none()
    };
    let have: HashSet<Family> = addresses
        .iter()
        .filter(|a| mine(a))
        .filter_map(|a| family_of(&a.spec.address).ok())
        .collect();
    let mut used: HashSet<IpAddr> = addresses
        .iter()
        .filter_map(|a| parse_address(&a.spec.address).ok())
        .collect();
    let mut create = Vec::new();
    let mut exhausted = Vec::new();
    for family in claim.spec.family.families() {
        if have.contains(family) || in_flight.contains(&(uid.clone(), *family)) {
            continue;
        }
        match allocator::first_free(cidrs, *family, &used) {
            Some(ip) => {
                used.insert(ip);
                create.push(IPAddress {
                    metadata: ObjectMeta {
                        name: Some(allocator::object_name(ip)),
                        ..Default::default()
                    },
                    spec: IPAddressSpec {
                        address: ip.to_string(),
                        class_name: class.name_any(),
                        reclaim_policy: class.spec.reclaim_policy,
                        claim_ref: Some(ClaimRef {
                            namespace: ns.clone(),
                            name: claim.name_any(),
                            uid: Some(uid.clone()),
                        }),
                        source: AddressSource {
                            from_class: Some(FromClass {}),
                            provider_ref: None,
                        },
                    },
                    status: None,
                });
            }
            None => exhausted.push(*family),
        }
    }
    if !exhausted.is_empty() {
        // Nothing half-done for a Dual claim: provision both families or neither.
        return ClaimWork::Exhausted {
            class: class.name_any(),
            families: exhausted,
        };
    }
    if create.is_empty() {
        ClaimWork::Nothing
    } else {
        ClaimWork::Create(create)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn class(name: &str, cidrs: Value) -> Arc<IPAddressClass> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"provisioner": PROVISIONER, "reclaimPolicy": "Delete", "parameters": {"cidrs": cidrs}}})).unwrap())
    }

    fn claim(family: &str, extra: Value) -> IPAddressClaim {
        let mut v = json!({"metadata": {"name": "c", "namespace": "t", "uid": "u1",
            "annotations": {PROVISIONER_ANNOTATION: PROVISIONER}},
            "spec": {"className": "r", "family": family}, "status": {"phase": "Pending", "className": "r"}});
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        serde_json::from_value(v).unwrap()
    }

    fn addr(ip: &str, claim: Option<&str>) -> Arc<IPAddress> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": allocator::object_name(ip.parse().unwrap())},
            "spec": {"address": ip, "className": "r", "source": {"fromClass": {}},
                "claimRef": claim.map(|c| json!({"namespace": "t", "name": c}))}}),
            )
            .unwrap(),
        )
    }

    #[test]
    fn creates_one_address_per_missing_family() {
        let ranges = class_ranges(&[class("r", json!(["192.0.2.0/30", "2001:db8::/126"]))]);
        let w = plan_claim(
            &claim("Dual", json!({})),
            &ranges,
            &[addr("192.0.2.1", Some("other"))],
            &HashSet::new(),
        );
        let ClaimWork::Create(list) = w else {
            panic!("{w:?}")
        };
        let got: Vec<(&str, &str)> = list
            .iter()
            .map(|a| (a.metadata.name.as_deref().unwrap(), a.spec.address.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("ipv4-192-0-2-2", "192.0.2.2"),
                ("ipv6-2001-0db8-0000-0000-0000-0000-0000-0000", "2001:db8::")
            ]
        );
        let a = &list[0];
        assert_eq!(
            a.spec.claim_ref.as_ref().unwrap().uid.as_deref(),
            Some("u1")
        );
        assert_eq!(
            a.spec.reclaim_policy.as_str(),
            "Delete",
            "copied from the class"
        );
        assert!(a.spec.source.from_class.is_some());
        // One family already there: only the other is created.
        let w = plan_claim(
            &claim("Dual", json!({})),
            &ranges,
            &[addr("192.0.2.1", Some("c"))],
            &HashSet::new(),
        );
        assert!(
            matches!(w, ClaimWork::Create(l) if l.len() == 1 && l[0].spec.address == "2001:db8::")
        );
        // Created a moment ago, not in the cache yet: not created twice.
        let in_flight = HashSet::from([("u1".to_string(), Family::IPv4)]);
        assert!(matches!(
            plan_claim(&claim("IPv4", json!({})), &ranges, &[], &in_flight),
            ClaimWork::Nothing
        ));
    }

    #[test]
    fn skips_what_is_not_its_business() {
        let ranges = class_ranges(&[class("r", json!(["192.0.2.0/30"]))]);
        for extra in [
            json!({"metadata": {"name": "c", "namespace": "t", "uid": "u1", "annotations": {PROVISIONER_ANNOTATION: "other"}}}),
            json!({"status": {"phase": "Lost", "className": "r"}}),
            json!({"status": {"phase": "Bound", "className": "r"}}),
            json!({"spec": {"className": "r", "family": "IPv4", "addressName": "x"}}),
        ] {
            assert!(
                matches!(
                    plan_claim(&claim("IPv4", extra.clone()), &ranges, &[], &HashSet::new()),
                    ClaimWork::Nothing
                ),
                "{extra}"
            );
        }
    }

    #[test]
    fn exhaustion_and_bad_parameters() {
        let ranges = class_ranges(&[class("r", json!(["192.0.2.0/30"]))]);
        let full = [addr("192.0.2.1", Some("x")), addr("192.0.2.2", Some("y"))];
        assert!(
            matches!(plan_claim(&claim("IPv4", json!({})), &ranges, &full, &HashSet::new()), ClaimWork::Exhausted { families, .. } if families == [Family::IPv4])
        );
        // A Dual claim on a v4-only range: exhausted for IPv6, and nothing half-created.
        assert!(
            matches!(plan_claim(&claim("Dual", json!({})), &ranges, &[], &HashSet::new()), ClaimWork::Exhausted { families, .. } if families == [Family::IPv6])
        );
        // Overlapping classes of this driver are refused, both of them.
        let ranges = class_ranges(&[
            class("r", json!(["192.0.2.0/24"])),
            class("s", json!(["192.0.2.128/25"])),
        ]);
        assert!(
            ranges
                .iter()
                .all(|(_, r)| matches!(r, Err(ParamError::Overlap(..))))
        );
        assert!(
            matches!(plan_claim(&claim("IPv4", json!({})), &ranges, &[], &HashSet::new()), ClaimWork::BadClass(m) if m.contains("overlaps"))
        );
    }
}
