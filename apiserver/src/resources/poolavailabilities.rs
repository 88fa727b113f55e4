//! `poolavailabilities` (kind `PoolAvailability`, cluster-scoped): one per class — its
//! capacity, what is allocated and free, counts by phase, pending claims, the next release.
//! The numbers are kept per class as objects change (a change costs O(log n), whatever the
//! size of the pool), not counted again on every request.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use address_controller_api::entitlement::namespace_entitlement_changed;
use address_controller_api::{
    AddressPhase, ClaimPhase, Family, IPAddress, IPAddressClaim, IPAddressClass,
};
use address_controller_runtime::world::World;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use super::{Column, Computed, ResourceInfo, View, meta};
use crate::group::API_VERSION;

/// Numbers per family.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
pub struct PerFamily {
    /// IPv4 addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<i64>,
    /// IPv6 addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<i64>,
}

/// The availability of one class's pool.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolAvailability {
    /// APIVersion of this object: view.local.sdn.cozystack.io/v1alpha1.
    pub api_version: String,
    /// Kind of this object: PoolAvailability.
    pub kind: String,
    /// Standard object metadata; the name is the class's.
    pub metadata: ObjectMeta,
    /// The driver of the class.
    pub provisioner: String,
    /// How many addresses the class's driver can hold, when it reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<PerFamily>,
    /// Addresses of the class that exist (any phase).
    pub allocated: PerFamily,
    /// Of those, addresses reserved for a claim that does not exist yet (a claimRef
    /// without a uid): neither free for other claims nor bound.
    pub reserved: PerFamily,
    /// Capacity minus allocated, when the capacity is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free: Option<PerFamily>,
    /// Addresses of the class by phase.
    pub phases: BTreeMap<String, i64>,
    /// Claims of the class still waiting for an address.
    pub pending_claims: i64,
    /// When the next Released address of the class becomes Available (release delay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_release: Option<Time>,
    /// Namespaces the class's namespaceSelector admits (every namespace without one).
    pub admitted_namespaces: i64,
}

const COLUMNS: &[Column] = &[
    Column::new("Name", "string", "Class", 0),
    Column::new("Provisioner", "string", "Driver", 0),
    Column::new(
        "IPv4",
        "string",
        "IPv4 addresses allocated / the class's IPv4 capacity (allocated alone when the driver reports no capacity)",
        0,
    ),
    Column::new("IPv4 Free", "integer", "IPv4 capacity left", 0),
    Column::new(
        "IPv4 Used",
        "string",
        "Share of the IPv4 capacity allocated",
        0,
    ),
    Column::new(
        "IPv6",
        "string",
        "IPv6 addresses allocated / the class's IPv6 capacity (allocated alone when the driver reports no capacity)",
        0,
    ),
    Column::new("IPv6 Free", "integer", "IPv6 capacity left", 0),
    Column::new(
        "IPv6 Used",
        "string",
        "Share of the IPv6 capacity allocated",
        0,
    ),
    Column::new("Pending", "integer", "Claims waiting for an address", 0),
    Column::new(
        "IPv4 Reserved",
        "integer",
        "IPv4 addresses reserved for a claim that does not exist yet",
        1,
    ),
    Column::new(
        "IPv6 Reserved",
        "integer",
        "IPv6 addresses reserved for a claim that does not exist yet",
        1,
    ),
    Column::new("Released", "integer", "Released addresses", 1),
    Column::new("Conflict", "integer", "Addresses in Conflict", 1),
    Column::new("Lost", "integer", "Addresses Lost", 1),
    Column::new(
        "NextRelease",
        "string",
        "When the next Released address becomes Available",
        1,
    ),
    Column::new(
        "Namespaces",
        "integer",
        "Namespaces the class admits (its namespaceSelector)",
        1,
    ),
];

pub static INFO: ResourceInfo = ResourceInfo {
    plural: "poolavailabilities",
    singular: "poolavailability",
    kind: "PoolAvailability",
    namespaced: false,
    short_names: &["pool"],
    categories: &["addresses"],
    verbs: &["get", "list", "watch"],
    subresources: &[],
    field_labels: &["metadata.name"],
    computed_fields: &[],
    columns: COLUMNS,
};

/// The numbers of one class, kept as objects change.
#[derive(Default, Debug)]
struct Numbers {
    phases: BTreeMap<&'static str, i64>,
    ipv4: i64,
    ipv6: i64,
    reserved_ipv4: i64,
    reserved_ipv6: i64,
    pending_claims: i64,
    /// Released, not held, with the time they were released.
    released: BTreeSet<(Timestamp, String)>,
}

#[derive(Default)]
pub struct PoolAvailabilitiesView {
    numbers: Mutex<HashMap<String, Numbers>>,
    admission: Mutex<Admission>,
}

/// Which namespaces each class admits, counted as namespaces and selectors change (a
/// namespace change costs one selector match per class; a selector change, one per
/// namespace).
#[derive(Default)]
struct Admission {
    labels: HashMap<String, BTreeMap<String, String>>,
    selectors: HashMap<String, Option<LabelSelector>>,
    admitted: HashMap<String, i64>,
}

fn admits(selector: &Option<LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    selector
        .as_ref()
        .is_none_or(|s| address_controller_api::entitlement::selector_matches(s, labels))
}

fn pending_class(c: &IPAddressClaim) -> Option<&str> {
    let s = c.status.as_ref()?;
    (s.phase.unwrap_or(ClaimPhase::Pending) == ClaimPhase::Pending)
        .then_some(s.class_name.as_deref()?)
}

/// An address's part in its class's numbers: (+1 or −1).
fn count(n: &mut Numbers, a: &IPAddress, sign: i64) {
    *n.phases.entry(a.phase_name()).or_default() += sign;
    let reserved = i64::from(a.is_reserved());
    match a.family() {
        Some(Family::IPv4) => {
            n.ipv4 += sign;
            n.reserved_ipv4 += sign * reserved;
        }
        Some(Family::IPv6) => {
            n.ipv6 += sign;
            n.reserved_ipv6 += sign * reserved;
        }
        None => {}
    }
    if a.is_released()
        && !a.is_held()
        && let Some(at) = a.released_at()
    {
        let entry = (at.0, a.name_any());
        if sign > 0 {
            n.released.insert(entry);
        } else {
            n.released.remove(&entry);
        }
    }
}

/// The cells of one family: allocated (/ capacity), free, used share. Unknown capacity
/// leaves free and used empty, as kube-apiserver prints a column whose path is absent.
fn family_cells(allocated: Option<i64>, capacity: Option<i64>, free: Option<i64>) -> [Value; 3] {
    let allocated = allocated.unwrap_or(0);
    let used = capacity
        .filter(|c| *c > 0)
        .map(|c| format!("{}%", allocated.saturating_mul(100) / c));
    [
        json!(capacity.map_or(allocated.to_string(), |c| format!("{allocated}/{c}"))),
        json!(free),
        json!(used),
    ]
}

impl View for PoolAvailabilitiesView {
    fn info(&self) -> &'static ResourceInfo {
        &INFO
    }

    fn claim_changed(
        &self,
        old: Option<&IPAddressClaim>,
        new: Option<&IPAddressClaim>,
        dirty: &mut Vec<String>,
    ) {
        let (before, after) = (old.and_then(pending_class), new.and_then(pending_class));
        if before == after {
            return;
        }
        let mut m = self.numbers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = before {
            m.entry(c.to_string()).or_default().pending_claims -= 1;
            dirty.push(c.to_string());
        }
        if let Some(c) = after {
            m.entry(c.to_string()).or_default().pending_claims += 1;
            dirty.push(c.to_string());
        }
    }

    fn address_changed(
        &self,
        old: Option<&IPAddress>,
        new: Option<&IPAddress>,
        dirty: &mut Vec<String>,
    ) {
        let mut m = self.numbers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(a) = old {
            count(m.entry(a.spec.class_name.clone()).or_default(), a, -1);
            dirty.push(a.spec.class_name.clone());
        }
        if let Some(a) = new {
            count(m.entry(a.spec.class_name.clone()).or_default(), a, 1);
            dirty.push(a.spec.class_name.clone());
        }
    }

    fn class_changed(
        &self,
        old: Option<&IPAddressClass>,
        new: Option<&IPAddressClass>,
        dirty: &mut Vec<String>,
    ) {
        dirty.extend(old.or(new).map(|c| c.name_any()));
        let Some(name) = old.or(new).map(|c| c.name_any()) else {
            return;
        };
        let mut a = self
            .admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match new {
            None => {
                a.selectors.remove(&name);
                a.admitted.remove(&name);
            }
            Some(c) => {
                let selector = c.spec.namespace_selector.clone();
                if a.selectors.get(&name) != Some(&selector) {
                    let n = a.labels.values().filter(|l| admits(&selector, l)).count();
                    a.admitted.insert(name.clone(), n as i64);
                    a.selectors.insert(name, selector);
                }
            }
        }
    }

    fn namespace_changed(
        &self,
        old: Option<&Namespace>,
        new: Option<&Namespace>,
        dirty: &mut Vec<String>,
    ) {
        let Some(ns) = new.or(old).map(|n| n.name_any()) else {
            return;
        };
        if !namespace_entitlement_changed(old, new) {
            return;
        }
        let labels =
            |n: Option<&Namespace>| n.map(|n| n.metadata.labels.clone().unwrap_or_default());
        let (before, after) = (labels(old), labels(new));
        let mut a = self
            .admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Admission {
            labels: all,
            selectors,
            admitted,
        } = &mut *a;
        for (class, selector) in selectors.iter() {
            let was = before.as_ref().is_some_and(|l| admits(selector, l));
            let is = after.as_ref().is_some_and(|l| admits(selector, l));
            if was != is {
                *admitted.entry(class.clone()).or_default() += if is { 1 } else { -1 };
                dirty.push(class.clone());
            }
        }
        match after {
            Some(l) => {
                all.insert(ns, l);
            }
            None => {
                all.remove(&ns);
            }
        }
    }

    fn compute(&self, key: &str, world: &World) -> Option<Computed> {
        let class = world.classes.get(key)?;
        let m = self.numbers.lock().unwrap_or_else(PoisonError::into_inner);
        let empty = Numbers::default();
        let n = m.get(key).unwrap_or(&empty);
        let allocated = PerFamily {
            ipv4: Some(n.ipv4),
            ipv6: Some(n.ipv6),
        };
        let reserved = PerFamily {
            ipv4: Some(n.reserved_ipv4),
            ipv6: Some(n.reserved_ipv6),
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
            ipv4: c.ipv4.map(|cap| (cap - n.ipv4).max(0)),
            ipv6: c.ipv6.map(|cap| (cap - n.ipv6).max(0)),
        });
        let phases: BTreeMap<String, i64> = AddressPhase::ALL
            .iter()
            .map(|p| {
                (
                    p.as_str().to_string(),
                    n.phases.get(p.as_str()).copied().unwrap_or(0),
                )
            })
            .chain(
                n.phases
                    .get("Unknown")
                    .filter(|u| **u > 0)
                    .map(|u| ("Unknown".to_string(), *u)),
            )
            .collect();
        // The earliest released address has the earliest deadline: one delay per class.
        let next_release = n
            .released
            .first()
            .and_then(|(_, name)| world.addresses.get(name))
            .and_then(|a| class.release_deadline(&a))
            .map(Time);
        let pending_claims = n.pending_claims;
        drop(m);
        let admitted_namespaces = self
            .admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admitted
            .get(key)
            .copied()
            .unwrap_or(0);
        // The class's labels: `kubectl get pool -l tier=public` selects as for the classes.
        let labels = class.metadata.labels.clone().unwrap_or_default();
        let mut metadata = meta(key, None);
        metadata.labels = Some(labels.clone()).filter(|l| !l.is_empty());
        let v = PoolAvailability {
            api_version: API_VERSION.into(),
            kind: "PoolAvailability".into(),
            metadata,
            provisioner: class.spec.provisioner.clone(),
            capacity,
            allocated,
            reserved,
            free,
            phases,
            pending_claims,
            next_release,
            admitted_namespaces,
        };
        let cells = table_cells(key, &v);
        Some(Computed {
            namespace: None,
            name: key.to_string(),
            value: serde_json::to_value(v).unwrap_or_default(),
            cells,
            labels,
            fields: BTreeMap::new(),
        })
    }

    fn schemas(&self, g: &mut schemars::SchemaGenerator) -> Vec<(&'static str, schemars::Schema)> {
        vec![("PoolAvailability", g.subschema_for::<PoolAvailability>())]
    }
}

/// The table row of a pool (`kubectl get pools`), in its columns' order.
fn table_cells(key: &str, v: &PoolAvailability) -> Vec<serde_json::Value> {
    let capacity = |f: fn(&PerFamily) -> Option<i64>| v.capacity.as_ref().and_then(f);
    let free = |f: fn(&PerFamily) -> Option<i64>| v.free.as_ref().and_then(f);
    let mut cells = vec![json!(key), json!(v.provisioner)];
    for f in [|p: &PerFamily| p.ipv4, |p: &PerFamily| p.ipv6] {
        cells.extend(family_cells(f(&v.allocated), capacity(f), free(f)));
    }
    cells.extend([
        json!(v.pending_claims),
        json!(v.reserved.ipv4),
        json!(v.reserved.ipv6),
        json!(v.phases["Released"]),
        json!(v.phases["Conflict"]),
        json!(v.phases["Lost"]),
        json!(
            v.next_release
                .as_ref()
                .map_or("<none>".to_string(), |t| t.0.to_string())
        ),
        json!(v.admitted_namespaces),
    ]);
    cells
}

#[cfg(test)]
mod tests {
    use super::family_cells;
    use serde_json::{Value, json};

    #[test]
    fn a_familys_cells_read_allocated_of_capacity_free_and_used() {
        // 5 of a range of 14: 9 free, 35 % used (rounded down, as a fill alert compares).
        assert_eq!(
            family_cells(Some(5), Some(14), Some(9)),
            [json!("5/14"), json!(9), json!("35%")]
        );
        assert_eq!(
            family_cells(Some(14), Some(14), Some(0)),
            [json!("14/14"), json!(0), json!("100%")]
        );
        // No capacity reported (a provider-backed class): allocated alone, the rest empty.
        assert_eq!(
            family_cells(Some(3), None, None),
            [json!("3"), Value::Null, Value::Null]
        );
        // A family the class cannot hold at all: no share of nothing.
        assert_eq!(
            family_cells(None, Some(0), Some(0)),
            [json!("0/0"), json!(0), Value::Null]
        );
    }
}
