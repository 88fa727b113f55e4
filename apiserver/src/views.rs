//! The computed views (SPEC §9), as pure functions of the cached objects.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use address_controller_api::family::family_of;
use address_controller_api::{
    AddressPhase, ClaimPhase, Family, IPAddress, IPAddressClaim, IPAddressClass,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt;
use schemars::JsonSchema;
use serde::Serialize;

pub const GROUP: &str = "view.local.sdn.cozystack.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "view.local.sdn.cozystack.io/v1alpha1";

/// Counts of claims by phase.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
pub struct ClaimCounts {
    pub total: i64,
    pub pending: i64,
    pub bound: i64,
    pub lost: i64,
}

/// What a namespace holds, in numbers.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HoldingsSummary {
    /// Claims by phase.
    pub claims: ClaimCounts,
    /// Addresses bound to the namespace's claims.
    pub addresses_bound: i64,
    /// Bound addresses that are IPv4.
    pub ipv4: i64,
    /// Bound addresses that are IPv6.
    pub ipv6: i64,
    /// Bound addresses a driver attached to something.
    pub associated: i64,
    /// Addresses released by the namespace's former claims and retained (still billed).
    pub released_retained: i64,
}

/// Per-class numbers of a namespace.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassHoldings {
    pub class_name: String,
    pub claims: i64,
    pub addresses_bound: i64,
    pub released_retained: i64,
}

/// One claim of a namespace with its addresses.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimHolding {
    pub name: String,
    pub phase: String,
    pub class_name: String,
    pub family: String,
    pub addresses: Vec<String>,
}

/// `NamespaceAddresses`: the holdings of one namespace, named after it.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceAddresses {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub summary: HoldingsSummary,
    pub classes: Vec<ClassHoldings>,
    pub claims: Vec<ClaimHolding>,
}

/// The full record of one address a namespace holds or retained.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AddressRecord {
    pub name: String,
    pub address: String,
    pub family: String,
    pub class_name: String,
    pub phase: String,
    pub claim: String,
    pub reclaim_policy: String,
    pub source: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub associated_to: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
}

/// `NamespaceAddressRecords`: the `addresses` subresource of a `NamespaceAddresses`.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceAddressRecords {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub items: Vec<AddressRecord>,
}

/// Per-family numbers.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
pub struct PerFamily {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<i64>,
}

/// `PoolAvailability`: one per class.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolAvailability {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub provisioner: String,
    /// From the class status, when its driver reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<PerFamily>,
    /// Addresses of the class that exist (any phase).
    pub allocated: PerFamily,
    /// capacity − allocated, when the capacity is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free: Option<PerFamily>,
    /// Addresses by phase.
    pub phases: BTreeMap<String, i64>,
    /// Claims of the class still waiting for an address.
    pub pending_claims: i64,
    /// When the next Released address of the class becomes Available (release delay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_release: Option<Time>,
}

fn meta(name: &str, namespace: Option<&str>, resource_version: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        resource_version: Some(resource_version.to_string()),
        ..Default::default()
    }
}

fn aphase(a: &IPAddress) -> Option<AddressPhase> {
    a.status.as_ref().and_then(|s| s.phase)
}

fn phase_name(a: &IPAddress) -> String {
    aphase(a)
        .map_or("Unknown", AddressPhase::as_str)
        .to_string()
}

/// Namespaces that hold or retained anything, sorted.
pub fn namespaces(
    claims: &[Arc<IPAddressClaim>],
    addresses: &[Arc<IPAddress>],
) -> BTreeSet<String> {
    claims
        .iter()
        .filter_map(|c| c.namespace())
        .chain(
            addresses
                .iter()
                .filter_map(|a| a.spec.claim_ref.as_ref().map(|r| r.namespace.clone())),
        )
        .collect()
}

/// The addresses whose claimRef points into `ns` (held or retained).
fn of_namespace<'a>(
    addresses: &'a [Arc<IPAddress>],
    ns: &'a str,
) -> impl Iterator<Item = &'a Arc<IPAddress>> + 'a {
    addresses
        .iter()
        .filter(move |a| a.spec.claim_ref.as_ref().is_some_and(|r| r.namespace == ns))
}

pub fn namespace_addresses(
    ns: &str,
    claims: &[Arc<IPAddressClaim>],
    addresses: &[Arc<IPAddress>],
    rv: &str,
) -> NamespaceAddresses {
    let mut summary = HoldingsSummary::default();
    let mut classes: BTreeMap<String, ClassHoldings> = BTreeMap::new();
    let mut holdings = Vec::new();
    fn class_entry<'a>(
        classes: &'a mut BTreeMap<String, ClassHoldings>,
        name: &str,
    ) -> &'a mut ClassHoldings {
        classes
            .entry(name.to_string())
            .or_insert_with(|| ClassHoldings {
                class_name: name.to_string(),
                ..Default::default()
            })
    }
    let mut mine: Vec<&Arc<IPAddressClaim>> = claims
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(ns))
        .collect();
    mine.sort_by_key(|c| c.name_any());
    for c in mine {
        let status = c.status.clone().unwrap_or_default();
        let phase = status.phase.unwrap_or(ClaimPhase::Pending);
        summary.claims.total += 1;
        match phase {
            ClaimPhase::Pending => summary.claims.pending += 1,
            ClaimPhase::Bound => summary.claims.bound += 1,
            ClaimPhase::Lost => summary.claims.lost += 1,
        }
        let class = status
            .class_name
            .clone()
            .or_else(|| c.spec.class_name.clone())
            .unwrap_or_default();
        class_entry(&mut classes, &class).claims += 1;
        holdings.push(ClaimHolding {
            name: c.name_any(),
            phase: phase.as_str().to_string(),
            class_name: class,
            family: c.spec.family.as_str().to_string(),
            addresses: status.addresses.iter().map(|a| a.address.clone()).collect(),
        });
    }
    for a in of_namespace(addresses, ns) {
        match aphase(a) {
            Some(AddressPhase::Released) => {
                summary.released_retained += 1;
                class_entry(&mut classes, &a.spec.class_name).released_retained += 1;
            }
            Some(AddressPhase::Bound) => {
                summary.addresses_bound += 1;
                class_entry(&mut classes, &a.spec.class_name).addresses_bound += 1;
                match family_of(&a.spec.address) {
                    Ok(Family::IPv4) => summary.ipv4 += 1,
                    Ok(Family::IPv6) => summary.ipv6 += 1,
                    Err(_) => {}
                }
                if a.status.as_ref().is_some_and(|s| s.associated_to.is_some()) {
                    summary.associated += 1;
                }
            }
            _ => {}
        }
    }
    NamespaceAddresses {
        api_version: API_VERSION.into(),
        kind: "NamespaceAddresses".into(),
        metadata: meta(ns, Some(ns), rv),
        summary,
        classes: classes.into_values().collect(),
        claims: holdings,
    }
}

pub fn address_records(
    ns: &str,
    claim: Option<&str>,
    addresses: &[Arc<IPAddress>],
    rv: &str,
) -> NamespaceAddressRecords {
    let mut items: Vec<AddressRecord> = of_namespace(addresses, ns)
        .filter(|a| claim.is_none_or(|c| a.spec.claim_ref.as_ref().is_some_and(|r| r.name == c)))
        .map(|a| AddressRecord {
            name: a.name_any(),
            address: a.spec.address.clone(),
            family: family_of(&a.spec.address)
                .map_or("Invalid", |f| f.as_str())
                .to_string(),
            class_name: a.spec.class_name.clone(),
            phase: phase_name(a),
            claim: a
                .spec
                .claim_ref
                .as_ref()
                .map(|r| r.name.clone())
                .unwrap_or_default(),
            reclaim_policy: a.spec.reclaim_policy.as_str().to_string(),
            source: serde_json::to_value(&a.spec.source).unwrap_or_default(),
            associated_to: a
                .status
                .as_ref()
                .and_then(|s| s.associated_to.as_ref())
                .and_then(|x| serde_json::to_value(x).ok()),
            released_at: a.status.as_ref().and_then(|s| s.released_at.clone()),
        })
        .collect();
    items.sort_by(|x, y| x.name.cmp(&y.name));
    NamespaceAddressRecords {
        api_version: API_VERSION.into(),
        kind: "NamespaceAddressRecords".into(),
        metadata: meta(ns, Some(ns), rv),
        items,
    }
}

pub fn pool_availability(
    class: &IPAddressClass,
    claims: &[Arc<IPAddressClaim>],
    addresses: &[Arc<IPAddress>],
    rv: &str,
) -> PoolAvailability {
    let name = class.name_any();
    let mine: Vec<&Arc<IPAddress>> = addresses
        .iter()
        .filter(|a| a.spec.class_name == name)
        .collect();
    let count = |f: Family| {
        mine.iter()
            .filter(|a| family_of(&a.spec.address).ok() == Some(f))
            .count() as i64
    };
    let allocated = PerFamily {
        ipv4: Some(count(Family::IPv4)),
        ipv6: Some(count(Family::IPv6)),
    };
    let capacity = class
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .map(|c| PerFamily {
            ipv4: c.ipv4,
            ipv6: c.ipv6,
        });
    let free = capacity.as_ref().map(|c| PerFamily {
        ipv4: c.ipv4.map(|n| (n - allocated.ipv4.unwrap_or(0)).max(0)),
        ipv6: c.ipv6.map(|n| (n - allocated.ipv6.unwrap_or(0)).max(0)),
    });
    let mut phases: BTreeMap<String, i64> = AddressPhase::ALL
        .iter()
        .map(|p| (p.as_str().to_string(), 0))
        .collect();
    for a in &mine {
        *phases.entry(phase_name(a)).or_default() += 1;
    }
    let pending_claims = claims
        .iter()
        .filter(|c| {
            let s = c.status.as_ref();
            s.and_then(|s| s.class_name.as_deref()) == Some(name.as_str())
                && s.and_then(|s| s.phase).unwrap_or(ClaimPhase::Pending) == ClaimPhase::Pending
        })
        .count() as i64;
    let held = |a: &IPAddress| {
        address_controller_api::names::annotation_is_true(
            a.metadata.annotations.as_ref(),
            address_controller_api::names::HELD_ANNOTATION,
        )
    };
    let next_release = address_controller_controller::decide::release_delay::release_delay(Some(
        class,
    ))
    .and_then(|delay| {
        let delay = k8s_openapi::jiff::SignedDuration::try_from(delay).ok()?;
        mine.iter()
            .filter(|a| aphase(a) == Some(AddressPhase::Released) && !held(a))
            .filter_map(|a| {
                a.status
                    .as_ref()?
                    .released_at
                    .as_ref()?
                    .0
                    .checked_add(delay)
                    .ok()
            })
            .min()
            .map(Time)
    });
    PoolAvailability {
        api_version: API_VERSION.into(),
        kind: "PoolAvailability".into(),
        metadata: meta(&name, None, rv),
        provisioner: class.spec.provisioner.clone(),
        capacity,
        allocated,
        free,
        phases,
        pending_claims,
        next_release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(
        ns: &str,
        name: &str,
        phase: &str,
        class: &str,
        addrs: &[&str],
    ) -> Arc<IPAddressClaim> {
        let addresses: Vec<_> = addrs
            .iter()
            .map(|a| json!({"name": format!("n-{a}"), "address": a}))
            .collect();
        Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
            "spec": {"className": class}, "status": {"phase": phase, "className": class, "addresses": addresses}})).unwrap())
    }

    fn addr(
        name: &str,
        ip: &str,
        class: &str,
        ns: &str,
        claim: &str,
        phase: &str,
        extra: serde_json::Value,
    ) -> Arc<IPAddress> {
        let mut v = json!({"metadata": {"name": name}, "spec": {"address": ip, "className": class, "source": {"fromClass": {}},
            "claimRef": {"namespace": ns, "name": claim}}, "status": {"phase": phase}});
        if let (Some(o), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            for (k, val) in e {
                o.insert(k, val);
            }
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn holdings_count_what_a_namespace_holds_and_retained() {
        let claims = [
            claim("a", "web", "Bound", "pub", &["192.0.2.1"]),
            claim("a", "mail", "Bound", "pub", &["192.0.2.2", "2001:db8::1"]),
            claim("a", "new", "Pending", "pub", &[]),
            claim("b", "db", "Bound", "pub", &["192.0.2.9"]),
        ];
        let addresses = [
            addr(
                "x1",
                "192.0.2.1",
                "pub",
                "a",
                "web",
                "Bound",
                json!({"status": {"phase": "Bound", "associatedTo": {"kind": "Service", "name": "s"}}}),
            ),
            addr("x2", "192.0.2.2", "pub", "a", "mail", "Bound", json!({})),
            addr("x3", "2001:db8::1", "pub", "a", "mail", "Bound", json!({})),
            addr("x4", "192.0.2.7", "old", "a", "gone", "Released", json!({})),
            addr("x9", "192.0.2.9", "pub", "b", "db", "Bound", json!({})),
        ];
        let v = namespace_addresses("a", &claims, &addresses, "42");
        assert_eq!(
            v.summary.claims,
            ClaimCounts {
                total: 3,
                pending: 1,
                bound: 2,
                lost: 0
            }
        );
        assert_eq!(
            (
                v.summary.addresses_bound,
                v.summary.ipv4,
                v.summary.ipv6,
                v.summary.associated,
                v.summary.released_retained
            ),
            (3, 2, 1, 1, 1)
        );
        let classes: Vec<(&str, i64, i64, i64)> = v
            .classes
            .iter()
            .map(|c| {
                (
                    c.class_name.as_str(),
                    c.claims,
                    c.addresses_bound,
                    c.released_retained,
                )
            })
            .collect();
        assert_eq!(classes, [("old", 0, 0, 1), ("pub", 3, 3, 0)]);
        assert_eq!(
            v.claims.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["mail", "new", "web"]
        );
        assert_eq!(v.metadata.resource_version.as_deref(), Some("42"));
        // An empty namespace is all zeros.
        let empty = namespace_addresses("zzz", &claims, &addresses, "42");
        assert_eq!(empty.summary, HoldingsSummary::default());
        assert!(namespaces(&claims, &addresses).contains("b"));

        let r = address_records("a", None, &addresses, "42");
        assert_eq!(
            r.items.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["x1", "x2", "x3", "x4"]
        );
        assert_eq!(r.items[3].phase, "Released");
        let r = address_records("a", Some("mail"), &addresses, "42");
        assert_eq!(
            r.items
                .iter()
                .map(|i| i.family.as_str())
                .collect::<Vec<_>>(),
            ["IPv4", "IPv6"]
        );
    }

    #[test]
    fn pool_availability_numbers() {
        let class: IPAddressClass = serde_json::from_value(json!({"metadata": {"name": "pub"},
            "spec": {"provisioner": "p", "releaseDelay": "1h"}, "status": {"capacity": {"ipv4": 14, "ipv6": 16}}})).unwrap();
        let claims = [
            claim("a", "new", "Pending", "pub", &[]),
            claim("a", "web", "Bound", "pub", &["192.0.2.1"]),
        ];
        let addresses = [
            addr("x1", "192.0.2.1", "pub", "a", "web", "Bound", json!({})),
            addr(
                "x4",
                "192.0.2.7",
                "pub",
                "a",
                "gone",
                "Released",
                json!({"status": {"phase": "Released", "releasedAt": "2026-01-01T10:00:00Z"}}),
            ),
            addr(
                "x5",
                "192.0.2.8",
                "pub",
                "a",
                "gone2",
                "Released",
                json!({"status": {"phase": "Released", "releasedAt": "2026-01-01T09:00:00Z"},
                "metadata": {"name": "x5", "annotations": {"ipaddress.local.sdn.cozystack.io/held": "true"}}}),
            ),
            addr("y", "2001:db8::1", "other", "a", "z", "Bound", json!({})),
        ];
        let p = pool_availability(&class, &claims, &addresses, "7");
        assert_eq!((p.allocated.ipv4, p.allocated.ipv6), (Some(3), Some(0)));
        assert_eq!(
            p.free,
            Some(PerFamily {
                ipv4: Some(11),
                ipv6: Some(16)
            })
        );
        assert_eq!(
            (
                p.phases["Bound"],
                p.phases["Released"],
                p.phases["Conflict"]
            ),
            (1, 2, 0)
        );
        assert_eq!(p.pending_claims, 1);
        // The held address does not count; the other is released 1h after 10:00.
        assert_eq!(
            p.next_release.unwrap().0.to_string(),
            "2026-01-01T11:00:00Z"
        );
    }
}
