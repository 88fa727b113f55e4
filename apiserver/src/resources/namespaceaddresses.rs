//! `namespaceaddresses` (kind `NamespaceAddresses`, namespaced): one object per namespace,
//! named after it — what the namespace holds and retained. Its `addresses` subresource
//! (`NamespaceAddressRecords`) gives the tenant the full records of those IPAddresses, which
//! RBAC keeps from it otherwise (IPAddress is cluster-scoped).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use address_controller_api::entitlement::{
    QuotaLimits, namespace_entitlement_changed, usage_by_class,
};
use address_controller_api::family::family_of;
use address_controller_api::{
    AddressPhase, ClaimPhase, Family, IPAddress, IPAddressClaim, IPAddressClass, IPAddressQuota,
};
use address_controller_runtime::setmap::SetMap;
use address_controller_runtime::world::World;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use super::{Column, Computed, ResourceInfo, Subresource, View, meta};
use crate::group::{API_VERSION, GROUP};
use address_controller_serving::request::Query;
use address_controller_serving::status::ApiError;

/// Counts of claims by phase.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
pub struct ClaimCounts {
    /// Claims in the namespace.
    pub total: i64,
    /// Claims waiting for an address.
    pub pending: i64,
    /// Claims holding all their addresses.
    pub bound: i64,
    /// Claims whose address went away or is lost.
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
    /// Bound addresses held by more than one Service (the claim shares them).
    pub shared: i64,
    /// Holders of the bound addresses, all together (an address is billed once, to the
    /// claim's namespace, however many Services hold it).
    pub holders: i64,
    /// Addresses released by the namespace's former claims and retained (still billed).
    pub released_retained: i64,
    /// Addresses reserved for a claim of the namespace that does not exist yet.
    pub reserved: i64,
}

/// Per-class numbers of a namespace.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassHoldings {
    /// The class.
    pub class_name: String,
    /// Claims of the class in the namespace.
    pub claims: i64,
    /// Addresses of the class bound to the namespace's claims.
    pub addresses_bound: i64,
    /// Addresses of the class released by the namespace's former claims and retained.
    pub released_retained: i64,
}

/// One claim of a namespace with its addresses.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimHolding {
    /// Name of the claim.
    pub name: String,
    /// Its phase: Pending, Bound or Lost.
    pub phase: String,
    /// The class it resolved to (or names).
    pub class_name: String,
    /// The families it asks for: IPv4, IPv6 or Dual.
    pub family: String,
    /// The addresses it holds.
    pub addresses: Vec<String>,
}

/// Numbers of a quota: every family together, and per family (absent: not limited).
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
pub struct QuotaNumbers {
    /// Addresses of every family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addresses: Option<i64>,
    /// IPv4 addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<i64>,
    /// IPv6 addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<i64>,
}

/// The namespace's quota on one class.
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuotaStanding {
    /// The strictest limits of the namespace's IPAddressQuotas.
    pub hard: QuotaNumbers,
    /// What counts: addresses naming the namespace's claims (Released and retained ones
    /// included) and addresses a driver is invited to provision for them.
    pub used: QuotaNumbers,
    /// hard − used, never below zero, for the limits that are set.
    pub remaining: QuotaNumbers,
    /// Claims waiting with reason QuotaExceeded.
    pub waiting_claims: i64,
}

/// What the namespace may draw from one class (SPEC §13).
#[derive(Serialize, JsonSchema, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassEntitlement {
    /// The class.
    pub class_name: String,
    /// Whether the class's namespaceSelector admits the namespace (no selector: true).
    pub admitted: bool,
    /// The namespace's quota on the class, when an IPAddressQuota limits it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaStanding>,
}

/// The holdings of one namespace: what it holds and retained.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceAddresses {
    /// APIVersion of this object: view.local.sdn.cozystack.io/v1alpha1.
    pub api_version: String,
    /// Kind of this object: NamespaceAddresses.
    pub kind: String,
    /// Standard object metadata; the name is the namespace's.
    pub metadata: ObjectMeta,
    /// What the namespace holds, in numbers.
    pub summary: HoldingsSummary,
    /// The numbers per class the namespace draws from.
    pub classes: Vec<ClassHoldings>,
    /// Every claim of the namespace with its addresses.
    pub claims: Vec<ClaimHolding>,
    /// Per class: whether the namespace may claim from it, and its quota there.
    pub entitlements: Vec<ClassEntitlement>,
}

/// The full record of one address a namespace holds or retained.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AddressRecord {
    /// Name of the IPAddress object.
    pub name: String,
    /// The address.
    pub address: String,
    /// IPv4 or IPv6 (Invalid for an address admitted before validation).
    pub family: String,
    /// Its class.
    pub class_name: String,
    /// Its phase: Pending, Available, Bound, Released, Conflict or Lost.
    pub phase: String,
    /// The claim it is (or was) bound to.
    pub claim: String,
    /// Retain or Delete: what happens to it when its claim goes.
    pub reclaim_policy: String,
    /// Where it comes from: fromClass or providerRef.
    pub source: Value,
    /// What a driver attached it to (the first holder), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub associated_to: Option<Value>,
    /// How many Services hold it.
    pub holders: i64,
    /// Its holders: those of the namespace by name, with their ports; a holder of another
    /// namespace (one the claim shares with) by its namespace only — the namespace a tenant
    /// granted, never what another tenant named its Service.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Value>,
    /// When it was released, for a Released address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
}

/// The `addresses` subresource of a NamespaceAddresses: the full records of every address
/// the namespace holds or retained.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceAddressRecords {
    /// APIVersion of this object: view.local.sdn.cozystack.io/v1alpha1.
    pub api_version: String,
    /// Kind of this object: NamespaceAddressRecords.
    pub kind: String,
    /// Standard object metadata; the name is the namespace's.
    pub metadata: ObjectMeta,
    /// The records, by address object name.
    pub items: Vec<AddressRecord>,
}

const COLUMNS: &[Column] = &[
    Column::new("Name", "string", "Namespace", 0),
    Column::new("Claims", "integer", "Claims in the namespace", 0),
    Column::new("Bound", "integer", "Bound claims", 0),
    Column::new("Pending", "integer", "Pending claims", 0),
    Column::new("Lost", "integer", "Lost claims", 0),
    Column::new("IPv4", "integer", "Bound IPv4 addresses", 0),
    Column::new("IPv6", "integer", "Bound IPv6 addresses", 0),
    Column::new("Released", "integer", "Addresses released and retained", 0),
    Column::new(
        "Reserved",
        "integer",
        "Addresses reserved for a claim not created yet",
        1,
    ),
    Column::new(
        "Associated",
        "integer",
        "Bound addresses attached by a driver",
        1,
    ),
    Column::new(
        "Shared",
        "integer",
        "Bound addresses held by more than one Service",
        1,
    ),
    Column::new("Classes", "string", "Classes the namespace draws from", 1),
    Column::new(
        "Quota",
        "string",
        "Per limited class: addresses used/hard (or per family), and claims waiting for room",
        1,
    ),
];

pub static INFO: ResourceInfo = ResourceInfo {
    plural: "namespaceaddresses",
    singular: "namespaceaddresses",
    kind: "NamespaceAddresses",
    namespaced: true,
    short_names: &["nsaddr"],
    categories: &["addresses"],
    verbs: &["get", "list", "watch"],
    subresources: &[Subresource {
        name: "addresses",
        kind: "NamespaceAddressRecords",
        verbs: &["get"],
    }],
    field_labels: &["metadata.name", "metadata.namespace"],
    computed_fields: &[],
    columns: COLUMNS,
};

/// The view, with its indexes: claims and addresses by namespace.
#[derive(Default)]
pub struct NamespaceAddressesView {
    index: Mutex<Index>,
}

#[derive(Default)]
struct Index {
    claims: SetMap<String>,
    /// By the namespace of the claim an address names.
    addresses: SetMap<String>,
    /// IPAddressQuotas by namespace.
    quotas: SetMap<String>,
}

fn key(ns: &str) -> String {
    format!("{ns}/{ns}")
}

impl NamespaceAddressesView {
    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The namespace's claims and addresses, from the caches.
    fn gather(
        &self,
        ns: &str,
        world: &World,
    ) -> (
        Vec<std::sync::Arc<IPAddressClaim>>,
        Vec<std::sync::Arc<IPAddress>>,
    ) {
        let ix = self.lock();
        let claims = ix
            .claims
            .get(ns)
            .map(|s| {
                s.iter()
                    .filter_map(|n| world.claims.get(&format!("{ns}/{n}")))
                    .collect()
            })
            .unwrap_or_default();
        let addresses = ix
            .addresses
            .get(ns)
            .map(|s| s.iter().filter_map(|n| world.addresses.get(n)).collect())
            .unwrap_or_default();
        (claims, addresses)
    }

    /// What decides the namespace's entitlements, from the caches.
    fn entitled(&self, ns: &str, world: &World) -> Entitled {
        let quotas = match &world.entitlements {
            Some(e) => self
                .lock()
                .quotas
                .get(ns)
                .map(|s| {
                    s.iter()
                        .filter_map(|n| e.quotas.get(&format!("{ns}/{n}")))
                        .collect()
                })
                .unwrap_or_default(),
            None => Vec::new(),
        };
        Entitled {
            classes: world.classes(),
            labels: world.namespace_labels(ns),
            quotas,
        }
    }
}

/// The inputs of a namespace's entitlements.
#[derive(Default)]
pub struct Entitled {
    pub classes: Vec<std::sync::Arc<IPAddressClass>>,
    /// The namespace's labels (`None`: not known).
    pub labels: Option<BTreeMap<String, String>>,
    pub quotas: Vec<std::sync::Arc<IPAddressQuota>>,
}

/// Per class: admitted, and the quota standing where a quota limits it.
pub fn entitlements(
    ns: &str,
    claims: &[std::sync::Arc<IPAddressClaim>],
    addresses: &[std::sync::Arc<IPAddress>],
    e: &Entitled,
) -> Vec<ClassEntitlement> {
    let mut usage = usage_by_class(
        ns,
        claims.iter().map(std::sync::Arc::as_ref),
        addresses.iter().map(std::sync::Arc::as_ref),
    );
    let mut classes: Vec<&IPAddressClass> = e.classes.iter().map(std::sync::Arc::as_ref).collect();
    classes.sort_by_key(|c| c.name_any());
    classes
        .into_iter()
        .map(|class| {
            let name = class.name_any();
            let quota = QuotaLimits::of_class(e.quotas.iter().map(std::sync::Arc::as_ref), &name)
                .map(|limits| {
                    let used = usage.remove(&name).unwrap_or_default();
                    let (addresses, ipv4, ipv6) = limits.remaining(&used);
                    let waiting = claims
                        .iter()
                        .filter(|c| {
                            c.status.as_ref().and_then(|s| s.class_name.as_deref())
                                == Some(name.as_str())
                                && c.entitlement_refusal()
                                    == Some(address_controller_api::names::reason::QUOTA_EXCEEDED)
                        })
                        .count();
                    QuotaStanding {
                        hard: QuotaNumbers {
                            addresses: limits.addresses.as_ref().map(|l| l.value),
                            ipv4: limits.ipv4.as_ref().map(|l| l.value),
                            ipv6: limits.ipv6.as_ref().map(|l| l.value),
                        },
                        used: QuotaNumbers {
                            addresses: Some(used.total()),
                            ipv4: Some(used.ipv4),
                            ipv6: Some(used.ipv6),
                        },
                        remaining: QuotaNumbers {
                            addresses,
                            ipv4,
                            ipv6,
                        },
                        waiting_claims: waiting as i64,
                    }
                });
            ClassEntitlement {
                admitted: class.admits(e.labels.as_ref()),
                class_name: name,
                quota,
            }
        })
        .collect()
}

/// The holdings of `ns` from its claims and the addresses naming claims in it.
pub fn namespace_addresses(
    ns: &str,
    claims: &[std::sync::Arc<IPAddressClaim>],
    addresses: &[std::sync::Arc<IPAddress>],
    entitled: &Entitled,
) -> NamespaceAddresses {
    let mut summary = HoldingsSummary::default();
    let mut classes: BTreeMap<String, ClassHoldings> = BTreeMap::new();
    let mut holdings = Vec::new();
    let mut class_of = |name: &str| {
        classes
            .entry(name.to_string())
            .or_insert_with(|| ClassHoldings {
                class_name: name.to_string(),
                ..Default::default()
            });
        name.to_string()
    };
    let mut bump: Vec<(String, i64, i64, i64)> = Vec::new();
    let mut mine: Vec<&std::sync::Arc<IPAddressClaim>> = claims.iter().collect();
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
        bump.push((class_of(&class), 1, 0, 0));
        holdings.push(ClaimHolding {
            name: c.name_any(),
            phase: phase.as_str().to_string(),
            class_name: class,
            family: c.spec.family.as_str().to_string(),
            addresses: status.addresses.iter().map(|a| a.address.clone()).collect(),
        });
    }
    for a in addresses {
        match a.phase() {
            Some(AddressPhase::Released) => {
                summary.released_retained += 1;
                bump.push((class_of(&a.spec.class_name), 0, 0, 1));
            }
            Some(AddressPhase::Bound) => {
                summary.addresses_bound += 1;
                bump.push((class_of(&a.spec.class_name), 0, 1, 0));
                match family_of(&a.spec.address) {
                    Ok(Family::IPv4) => summary.ipv4 += 1,
                    Ok(Family::IPv6) => summary.ipv6 += 1,
                    Err(_) => {}
                }
                let holders = a.holders().len() as i64;
                if holders > 0 {
                    summary.associated += 1;
                }
                summary.holders += holders;
                if holders > 1 {
                    summary.shared += 1;
                }
            }
            Some(AddressPhase::Available) if a.is_reserved() => summary.reserved += 1,
            _ => {}
        }
    }
    for (class, c, b, r) in bump {
        if let Some(h) = classes.get_mut(&class) {
            h.claims += c;
            h.addresses_bound += b;
            h.released_retained += r;
        }
    }
    NamespaceAddresses {
        api_version: API_VERSION.into(),
        kind: "NamespaceAddresses".into(),
        metadata: meta(ns, Some(ns)),
        summary,
        classes: classes.into_values().collect(),
        claims: holdings,
        entitlements: entitlements(ns, claims, addresses, entitled),
    }
}

/// `pub 2/2 (1 waiting),priv ipv4 1/4`: per limited class, used/hard of each set limit.
fn quota_cell(entitlements: &[ClassEntitlement]) -> String {
    let mut parts = Vec::new();
    for e in entitlements {
        let Some(q) = &e.quota else { continue };
        let mut limits = Vec::new();
        for (label, hard, used) in [
            ("", q.hard.addresses, q.used.addresses),
            ("ipv4 ", q.hard.ipv4, q.used.ipv4),
            ("ipv6 ", q.hard.ipv6, q.used.ipv6),
        ] {
            if let Some(h) = hard {
                limits.push(format!("{label}{}/{h}", used.unwrap_or(0)));
            }
        }
        let waiting = if q.waiting_claims > 0 {
            format!(" ({} waiting)", q.waiting_claims)
        } else {
            String::new()
        };
        parts.push(format!("{} {}{waiting}", e.class_name, limits.join(" ")));
    }
    if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    }
}

/// A holder as namespace `ns` sees it: by name (and ports) when it is of `ns`, by its
/// namespace alone otherwise.
fn seen_from(ns: &str, kind: &str, namespace: Option<&str>, name: &str, ports: &[String]) -> Value {
    if namespace.is_none_or(|n| n == ns) {
        let mut v = json!({"kind": kind, "name": name});
        if let Some(n) = namespace {
            v["namespace"] = json!(n);
        }
        if !ports.is_empty() {
            v["ports"] = json!(ports);
        }
        v
    } else {
        json!({"kind": kind, "namespace": namespace})
    }
}

fn computed(v: NamespaceAddresses) -> Computed {
    let s = &v.summary;
    let ns = v.metadata.name.clone().unwrap_or_default();
    let cells = vec![
        json!(ns),
        json!(s.claims.total),
        json!(s.claims.bound),
        json!(s.claims.pending),
        json!(s.claims.lost),
        json!(s.ipv4),
        json!(s.ipv6),
        json!(s.released_retained),
        json!(s.reserved),
        json!(s.associated),
        json!(s.shared),
        json!(
            v.classes
                .iter()
                .map(|c| c.class_name.as_str())
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>()
                .join(",")
        ),
        json!(quota_cell(&v.entitlements)),
    ];
    Computed {
        namespace: Some(ns.clone()),
        name: ns,
        value: serde_json::to_value(v).unwrap_or_default(),
        cells,
        labels: BTreeMap::new(),
        fields: BTreeMap::new(),
    }
}

/// The records of the addresses of `ns`, optionally of one claim.
pub fn address_records(
    ns: &str,
    claim: Option<&str>,
    addresses: &[std::sync::Arc<IPAddress>],
) -> NamespaceAddressRecords {
    let mut items: Vec<AddressRecord> = addresses
        .iter()
        .filter(|a| claim.is_none_or(|c| a.spec.claim_ref.as_ref().is_some_and(|r| r.name == c)))
        .map(|a| AddressRecord {
            name: a.name_any(),
            address: a.spec.address.clone(),
            family: family_of(&a.spec.address)
                .map_or("Invalid", |f| f.as_str())
                .to_string(),
            class_name: a.spec.class_name.clone(),
            phase: a.phase_name().to_string(),
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
                .map(|x| seen_from(ns, &x.kind, x.namespace.as_deref(), &x.name, &[])),
            holders: a.holders().len() as i64,
            attachments: match a.status.as_ref() {
                Some(st) if !st.attachments.is_empty() => st
                    .attachments
                    .iter()
                    .map(|h| seen_from(ns, &h.kind, h.namespace.as_deref(), &h.name, &h.ports))
                    .collect(),
                _ => a
                    .holders()
                    .iter()
                    .map(|h| seen_from(ns, &h.kind, h.namespace.as_deref(), &h.name, &[]))
                    .collect(),
            },
            released_at: a.status.as_ref().and_then(|s| s.released_at.clone()),
        })
        .collect();
    items.sort_by(|x, y| x.name.cmp(&y.name));
    NamespaceAddressRecords {
        api_version: API_VERSION.into(),
        kind: "NamespaceAddressRecords".into(),
        metadata: meta(ns, Some(ns)),
        items,
    }
}

impl View for NamespaceAddressesView {
    fn info(&self) -> &'static ResourceInfo {
        &INFO
    }

    fn claim_changed(
        &self,
        old: Option<&IPAddressClaim>,
        new: Option<&IPAddressClaim>,
        dirty: &mut Vec<String>,
    ) {
        let mut ix = self.lock();
        if let Some(c) = old
            && let Some(ns) = c.namespace()
        {
            ix.claims.remove(ns.as_str(), &c.name_any());
            dirty.push(key(&ns));
        }
        if let Some(c) = new
            && let Some(ns) = c.namespace()
        {
            ix.claims.insert(ns.clone(), &c.name_any());
            dirty.push(key(&ns));
        }
    }

    fn address_changed(
        &self,
        old: Option<&IPAddress>,
        new: Option<&IPAddress>,
        dirty: &mut Vec<String>,
    ) {
        let mut ix = self.lock();
        if let Some(a) = old
            && let Some(r) = &a.spec.claim_ref
        {
            ix.addresses.remove(r.namespace.as_str(), &a.name_any());
            dirty.push(key(&r.namespace));
        }
        if let Some(a) = new
            && let Some(r) = &a.spec.claim_ref
        {
            ix.addresses.insert(r.namespace.clone(), &a.name_any());
            dirty.push(key(&r.namespace));
        }
    }

    fn class_changed(
        &self,
        old: Option<&IPAddressClass>,
        new: Option<&IPAddressClass>,
        dirty: &mut Vec<String>,
    ) {
        // Every namespace shows its entitlement on every class (classes are few, and their
        // selectors rarely change).
        let spec = |c: Option<&IPAddressClass>| c.map(|c| c.spec.namespace_selector.clone());
        if old.is_some() && new.is_some() && spec(old) == spec(new) {
            return;
        }
        let ix = self.lock();
        let all: BTreeSet<&String> = ix
            .claims
            .keys()
            .chain(ix.addresses.keys())
            .chain(ix.quotas.keys())
            .collect();
        dirty.extend(all.into_iter().map(|ns| key(ns)));
    }

    fn quota_changed(
        &self,
        old: Option<&IPAddressQuota>,
        new: Option<&IPAddressQuota>,
        dirty: &mut Vec<String>,
    ) {
        let mut ix = self.lock();
        if let Some(q) = old
            && let Some(ns) = q.namespace()
        {
            ix.quotas.remove(ns.as_str(), &q.name_any());
            dirty.push(key(&ns));
        }
        if let Some(q) = new
            && let Some(ns) = q.namespace()
        {
            ix.quotas.insert(ns.clone(), &q.name_any());
            dirty.push(key(&ns));
        }
    }

    fn namespace_changed(
        &self,
        old: Option<&Namespace>,
        new: Option<&Namespace>,
        dirty: &mut Vec<String>,
    ) {
        if !namespace_entitlement_changed(old, new) {
            return;
        }
        dirty.extend(new.or(old).map(|n| key(&n.name_any())));
    }

    fn compute(&self, key: &str, world: &World) -> Option<Computed> {
        let ns = key.split_once('/').map_or(key, |(ns, _)| ns);
        let (claims, addresses) = self.gather(ns, world);
        let entitled = self.entitled(ns, world);
        if claims.is_empty() && addresses.is_empty() && entitled.quotas.is_empty() {
            return None;
        }
        Some(computed(namespace_addresses(
            ns, &claims, &addresses, &entitled,
        )))
    }

    fn absent(&self, namespace: Option<&str>, name: &str, world: &World) -> Option<Computed> {
        // Every namespace has holdings, zeros when it holds nothing.
        (namespace == Some(name)).then(|| {
            computed(namespace_addresses(
                name,
                &[],
                &[],
                &self.entitled(name, world),
            ))
        })
    }

    fn subresource(
        &self,
        sub: &str,
        namespace: Option<&str>,
        name: &str,
        query: &Query,
        world: &World,
    ) -> Option<Result<Value, ApiError>> {
        if sub != "addresses" {
            return None;
        }
        let ns = namespace.unwrap_or_default();
        if name != ns {
            return Some(Err(ApiError::not_found(GROUP, INFO.plural, name)));
        }
        let (_, addresses) = self.gather(ns, world);
        let records = address_records(ns, query.get("claim"), &addresses);
        Some(Ok(serde_json::to_value(records).unwrap_or_default()))
    }

    fn schemas(&self, g: &mut schemars::SchemaGenerator) -> Vec<(&'static str, schemars::Schema)> {
        vec![
            (
                "NamespaceAddresses",
                g.subschema_for::<NamespaceAddresses>(),
            ),
            (
                "NamespaceAddressRecords",
                g.subschema_for::<NamespaceAddressRecords>(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_shared_address_is_billed_once_and_another_namespaces_holder_shows_only_its_namespace() {
        let a: IPAddress = serde_json::from_value(json!({
            "metadata": {"name": "ipv4-192-0-2-1"},
            "spec": {"address": "192.0.2.1", "className": "k", "source": {"fromClass": {}},
                "claimRef": {"namespace": "shop", "name": "web", "uid": "u"}},
            "status": {"phase": "Bound",
                "associatedTo": {"kind": "Service", "namespace": "blog", "name": "secret-name"},
                "attachments": [
                    {"kind": "Service", "namespace": "blog", "name": "secret-name", "ports": ["TCP/8080"]},
                    {"kind": "Service", "namespace": "shop", "name": "tls", "ports": ["TCP/443"]}],
                "holderCount": 2}}))
        .unwrap();
        let r = address_records("shop", None, &[std::sync::Arc::new(a)]);
        let rec = &r.items[0];
        assert_eq!(rec.holders, 2);
        assert_eq!(
            rec.attachments,
            [
                json!({"kind": "Service", "namespace": "blog"}),
                json!({"kind": "Service", "namespace": "shop", "name": "tls", "ports": ["TCP/443"]})
            ]
        );
        assert_eq!(
            rec.associated_to,
            Some(json!({"kind": "Service", "namespace": "blog"}))
        );
        assert!(
            !serde_json::to_string(&r).unwrap().contains("secret-name"),
            "another tenant's Service name never shows"
        );
    }
}
