//! `addressholdings` (kind `AddressHolding`, namespaced): one object per holding in an
//! address's history (`api::history`) — a claim of the namespace that held the address, or
//! for which it was reserved, from when until when, with the Services it was on then. The
//! abuse desk asks `kubectl get addressholdings -A --field-selector
//! address=203.0.113.7,heldAt=2026-03-03T14:02:00Z`; a tenant lists its own namespace's
//! holdings, past ones included, and nothing of another namespace (the views' authorization:
//! a namespaced resource, read per namespace).
//!
//! Named `<IPAddress name>.<first 8 of its uid>.<ordinal>`, the ordinal counting from the
//! address's first holding ever: the same name on every replica, after every restart, and
//! whether the holding is still on the address or already in its record
//! (`IPAddressRecord`) — open holdings come from the addresses, closed ones from wherever
//! they are, an address deleted since included, until the retention prunes them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use address_controller_api::history::{self, AddressMeta, AttachmentSpan, Holding, RecordOf};
use address_controller_api::{IPAddress, IPAddressRecord, holding_record_name, holding_view_name};
use address_controller_runtime::world::World;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::json;

use super::{Column, Computed, ResourceInfo, View, meta as meta_of};
use crate::group::API_VERSION;
use crate::list_options::ComputedField;

/// The field selector that answers "who held it at this instant": an RFC 3339 time,
/// matching the holdings that cover it (from inclusive, until exclusive).
pub const HELD_AT: &str = "heldAt";
/// The stored fields `heldAt` is judged on (Unix seconds; `heldUntil` absent while open).
pub const HELD_FROM_FIELD: &str = "heldFrom";
pub const HELD_UNTIL_FIELD: &str = "heldUntil";

/// The claim of a holding.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
pub struct HoldingClaim {
    /// Name of the claim (in the holding's namespace).
    pub name: String,
    /// Its uid (a binding's; a reservation names the claim by name only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// A Service the address was on during the holding.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
pub struct HoldingService {
    /// The Service's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its name; left out for a Service of another namespace (one the claim shared the
    /// address with): that tenant's names are its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When it began holding the address.
    pub from: Time,
    /// When it stopped; absent while it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    /// cozy-proxy served it: its pod's outbound traffic left from the address meanwhile.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
    /// The nodes its workload ran on, each from when it was seen there (a VM's live
    /// migration is a move within the holding); only for a Service of the namespace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<address_controller_api::history::NodeStay>,
}

/// One holding of an address by a claim of the namespace.
#[derive(Serialize, JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AddressHolding {
    /// APIVersion of this object: view.local.sdn.cozystack.io/v1alpha1.
    pub api_version: String,
    /// Kind of this object: AddressHolding.
    pub kind: String,
    /// Standard object metadata: `<IPAddress name>.<ordinal>` in the claim's namespace.
    pub metadata: ObjectMeta,
    /// The address held.
    pub address: String,
    /// The IPAddress object.
    pub address_name: String,
    /// Its class.
    pub class_name: String,
    /// The claim that held it.
    pub claim: HoldingClaim,
    /// `Bound` (the claim held it) or `Reserved` (an admin reserved it for the claim).
    pub state: String,
    /// When the holding began; absent for a binding that began before the history was
    /// kept (`found`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Time>,
    /// When it ended; absent while it lasts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    /// How it ended: Released, Bound (a reservation its claim bound), Moved or Freed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The holding was under way when the history began to be kept (an upgrade): recorded
    /// when it ended, its start unknown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub found: bool,
    /// The Services the address was on during the holding.
    pub services: Vec<HoldingService>,
}

const COLUMNS: &[Column] = &[
    Column::new("Name", "string", "IPAddress name and ordinal", 0),
    Column::new("Address", "string", "The address held", 0),
    Column::new("Claim", "string", "The claim that held it", 0),
    Column::new("State", "string", "Bound or Reserved", 0),
    Column::new("From", "string", "When the holding began", 0),
    Column::new("Until", "string", "When it ended (<none>: it lasts)", 0),
    Column::new("Ended", "string", "How it ended", 0),
    Column::new("Services", "string", "The Services it was on", 0),
    Column::new("Class", "string", "The address's class", 1),
    Column::new("UID", "string", "The claim's uid", 1),
];

pub static INFO: ResourceInfo = ResourceInfo {
    plural: "addressholdings",
    singular: "addressholding",
    kind: "AddressHolding",
    namespaced: true,
    short_names: &["ah"],
    categories: &["addresses"],
    verbs: &["get", "list", "watch"],
    subresources: &[],
    field_labels: &[
        "metadata.name",
        "metadata.namespace",
        "address",
        "claim.name",
        "state",
        HELD_AT,
    ],
    computed_fields: &[ComputedField {
        label: HELD_AT,
        parse: parse_instant,
        holds: held_at,
    }],
    columns: COLUMNS,
};

/// The view, and its index of the records by address uid: the keys of the holdings
/// recorded, and the names of the span records (a holding's Services).
#[derive(Default)]
pub struct AddressHoldingsView {
    by_uid: Mutex<HashMap<String, Recorded>>,
    /// Holdings that left their address (moved to a record, or the address deleted, whose
    /// finalizer records them) before this process saw the record: the record is created
    /// first, but the two watches are not ordered, and without this copy a watch of the
    /// view saw the holding DELETED and ADDED again — a billing pipeline reading the watch
    /// closed the holding. Until the record arrives, at most [`IN_FLIGHT_FOR`].
    in_flight: Mutex<HashMap<String, InFlight>>,
}

/// How long a holding that left its address is shown without its record: far past a
/// records watch's lag, short enough that an address deleted without records (their kind
/// not installed) leaves no holding behind for long.
pub const IN_FLIGHT_FOR: std::time::Duration = std::time::Duration::from_secs(300);

struct InFlight {
    meta: AddressMeta,
    holding: Holding,
    since: std::time::Instant,
}

#[derive(Default)]
struct Recorded {
    /// Keys of the recorded holdings.
    holdings: BTreeSet<String>,
    /// Names of the span records.
    spans: BTreeSet<String>,
}

fn key_of(meta: &AddressMeta, ordinal: i64, ns: &str) -> String {
    format!(
        "{ns}/{}",
        holding_view_name(&meta.ip_address, &meta.address_uid, ordinal)
    )
}

/// The keys of `a`'s holdings.
fn keys(a: &IPAddress, out: &mut Vec<String>) {
    let meta = AddressMeta::of(a);
    let (list, base) = history::holdings(a);
    for (i, h) in (base..).zip(list) {
        out.push(key_of(&meta, i, &h.namespace));
    }
}

/// The holding object for `h` (ordinal `ordinal`) of the address `meta`, the address's
/// spans (wherever they are) at hand.
pub fn holding(
    meta: &AddressMeta,
    spans: &[AttachmentSpan],
    h: &Holding,
    ordinal: i64,
) -> AddressHolding {
    let services = spans
        .iter()
        .filter(|s| s.during(h))
        .map(|s| {
            let own = s.namespace.as_deref() == Some(h.namespace.as_str());
            HoldingService {
                namespace: s.namespace.clone(),
                name: own.then(|| s.name.clone()),
                from: s.from.clone(),
                until: s.until.clone(),
                egress: s.egress,
                nodes: if own { s.nodes.clone() } else { Vec::new() },
            }
        })
        .collect();
    AddressHolding {
        api_version: API_VERSION.into(),
        kind: INFO.kind.into(),
        metadata: meta_of(
            &holding_view_name(&meta.ip_address, &meta.address_uid, ordinal),
            Some(&h.namespace),
        ),
        address: meta.address.clone(),
        address_name: meta.ip_address.clone(),
        class_name: meta.class_name.clone(),
        claim: HoldingClaim {
            name: h.name.clone(),
            uid: h.uid.clone(),
        },
        state: format!("{:?}", h.state),
        from: h.from.clone(),
        until: h.until.clone(),
        ended: h.ended.clone(),
        found: h.found,
        services,
    }
}

fn computed(v: AddressHolding) -> Computed {
    let services: Vec<String> = v
        .services
        .iter()
        .map(|s| match &s.name {
            Some(n) => n.clone(),
            None => format!("({})", s.namespace.as_deref().unwrap_or("")),
        })
        .collect();
    let cells = vec![
        json!(v.metadata.name),
        json!(v.address),
        json!(v.claim.name),
        json!(v.state),
        json!(
            v.from
                .as_ref()
                .map_or("<before history>".to_string(), |t| t.0.to_string())
        ),
        json!(
            v.until
                .as_ref()
                .map_or("<none>".to_string(), |t| t.0.to_string())
        ),
        json!(v.ended.as_deref().unwrap_or("<none>")),
        json!(if services.is_empty() {
            "<none>".to_string()
        } else {
            services.join(",")
        }),
        json!(v.class_name),
        json!(v.claim.uid.as_deref().unwrap_or("<none>")),
    ];
    let mut fields = BTreeMap::new();
    fields.insert("address", v.address.clone());
    fields.insert("claim.name", v.claim.name.clone());
    fields.insert("state", v.state.clone());
    if let Some(f) = &v.from {
        fields.insert(HELD_FROM_FIELD, f.0.as_second().to_string());
    }
    if let Some(u) = &v.until {
        fields.insert(HELD_UNTIL_FIELD, u.0.as_second().to_string());
    }
    Computed {
        namespace: v.metadata.namespace.clone(),
        name: v.metadata.name.clone().unwrap_or_default(),
        value: serde_json::to_value(&v).unwrap_or_default(),
        cells,
        labels: BTreeMap::new(),
        fields,
    }
}

/// A `heldAt` value: an RFC 3339 time, as Unix seconds.
fn parse_instant(value: &str) -> Result<i64, String> {
    value
        .parse::<Timestamp>()
        .map(|t| t.as_second())
        .map_err(|_| {
            format!("invalid {HELD_AT} {value:?}: an RFC 3339 time is expected, e.g. 2026-03-03T14:02:00Z")
        })
}

/// Whether stored `fields` (a holding's) cover the instant `t` (Unix seconds): from
/// inclusive, until exclusive.
fn held_at(fields: &BTreeMap<&'static str, String>, t: i64) -> bool {
    let from = fields
        .get(HELD_FROM_FIELD)
        .and_then(|s| s.parse::<i64>().ok());
    let until = fields
        .get(HELD_UNTIL_FIELD)
        .and_then(|s| s.parse::<i64>().ok());
    from.is_none_or(|f| f <= t) && until.is_none_or(|u| t < u)
}

impl View for AddressHoldingsView {
    fn info(&self) -> &'static ResourceInfo {
        &INFO
    }

    fn claim_changed(
        &self,
        _old: Option<&address_controller_api::IPAddressClaim>,
        _new: Option<&address_controller_api::IPAddressClaim>,
        _dirty: &mut Vec<String>,
    ) {
    }

    fn address_changed(
        &self,
        old: Option<&IPAddress>,
        new: Option<&IPAddress>,
        dirty: &mut Vec<String>,
    ) {
        // Only a change of the history (or of the address's existence) alters holdings.
        if let (Some(o), Some(n)) = (old, new)
            && o.metadata.uid == n.metadata.uid
            && history::holdings(o) == history::holdings(n)
            && history::spans(o) == history::spans(n)
            && o.spec.class_name == n.spec.class_name
        {
            return;
        }
        if let Some(o) = old {
            self.keep_in_flight(o, new, dirty);
        }
        for a in old.into_iter().chain(new) {
            keys(a, dirty);
        }
    }

    fn class_changed(
        &self,
        _old: Option<&address_controller_api::IPAddressClass>,
        _new: Option<&address_controller_api::IPAddressClass>,
        _dirty: &mut Vec<String>,
    ) {
    }

    fn record_changed(
        &self,
        old: Option<&IPAddressRecord>,
        new: Option<&IPAddressRecord>,
        world: &World,
        dirty: &mut Vec<String>,
    ) {
        let mut by = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        for (r, present) in old
            .map(|r| (r, false))
            .into_iter()
            .chain(new.map(|r| (r, true)))
        {
            let spec = &r.spec;
            let entry = by.entry(spec.address_uid.clone()).or_default();
            match spec.record {
                RecordOf::Holding => {
                    let key = format!("{}/{}", spec.namespace, spec.view_name());
                    // Its record is here (or gone for good): no copy is needed any more.
                    self.in_flight
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&key);
                    if present {
                        entry.holdings.insert(key.clone());
                    } else {
                        entry.holdings.remove(&key);
                    }
                    dirty.push(key);
                }
                RecordOf::Attachment => {
                    let name = r.name_any();
                    if present {
                        entry.spans.insert(name);
                    } else {
                        entry.spans.remove(&name);
                    }
                    // The holdings it may be a Service of: every one of the address.
                    dirty.extend(entry.holdings.iter().cloned());
                    if let Some(a) = cached(world, &spec.ip_address, &spec.address_uid) {
                        keys(&a, dirty);
                    }
                }
            }
            if entry.holdings.is_empty() && entry.spans.is_empty() {
                by.remove(&spec.address_uid);
            }
        }
    }

    fn compute(&self, key: &str, world: &World) -> Option<Computed> {
        let (ns, name) = key.split_once('/')?;
        let (rest, ordinal) = name.rsplit_once('.')?;
        let ordinal: i64 = ordinal.parse().ok()?;
        let (address, uid8) = rest.rsplit_once('.')?;
        // On the address, while it keeps the holding; else from its record.
        let on_address = world.addresses.get(address).and_then(|a| {
            let uid = a.metadata.uid.as_deref()?;
            if !uid.starts_with(uid8) {
                return None;
            }
            let (list, base) = history::holdings(&a);
            let h = list.get(usize::try_from(ordinal - base).ok()?)?.clone();
            Some((AddressMeta::of(&a), h))
        });
        let recorded = || {
            let r = world.records.as_ref()?.get(&holding_record_name(name)?)?;
            Some((AddressMeta::of_record(&r.spec), r.spec.as_holding()?))
        };
        let (meta, h) = on_address.or_else(recorded).or_else(|| {
            self.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(key)
                .map(|f| (f.meta.clone(), f.holding.clone()))
        })?;
        if h.namespace != ns {
            return None;
        }
        let spans = self.spans_of(&meta, world);
        Some(computed(holding(&meta, &spans, &h, ordinal)))
    }

    fn schemas(&self, g: &mut schemars::SchemaGenerator) -> Vec<(&'static str, schemars::Schema)> {
        vec![("AddressHolding", g.subschema_for::<AddressHolding>())]
    }
}

/// The cached IPAddress `name`, when it is the one of `uid` (not one deleted and created
/// again under its name).
fn cached(world: &World, name: &str, uid: &str) -> Option<std::sync::Arc<IPAddress>> {
    world
        .addresses
        .get(name)
        .filter(|a| a.metadata.uid.as_deref() == Some(uid))
}

impl AddressHoldingsView {
    /// Keeps a copy of each holding that left the address `old` in this change (`new`: the
    /// address after it, `None` when deleted) and whose record this process has not seen;
    /// drops copies past [`IN_FLIGHT_FOR`] (their keys made dirty, so the view says so).
    fn keep_in_flight(&self, old: &IPAddress, new: Option<&IPAddress>, dirty: &mut Vec<String>) {
        let meta = AddressMeta::of(old);
        let (list, base) = history::holdings(old);
        // The first ordinal still on the address: every holding before it left.
        let kept_from = match new {
            Some(n) if n.metadata.uid == old.metadata.uid => history::holdings(n).1,
            _ => i64::MAX,
        };
        let recorded: BTreeSet<String> = self
            .by_uid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&meta.address_uid)
            .map(|r| r.holdings.clone())
            .unwrap_or_default();
        let now = std::time::Instant::now();
        let mut flying = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (i, h) in (base..).zip(list).take_while(|(i, _)| *i < kept_from) {
            let key = key_of(&meta, i, &h.namespace);
            if !recorded.contains(&key) {
                flying.insert(
                    key,
                    InFlight {
                        meta: meta.clone(),
                        holding: h.clone(),
                        since: now,
                    },
                );
            }
        }
        flying.retain(|key, f| {
            let keep = now.duration_since(f.since) < IN_FLIGHT_FOR;
            if !keep {
                dirty.push(key.clone());
            }
            keep
        });
    }

    /// Every span of the address `meta` (its uid): those it keeps, and those recorded.
    fn spans_of(&self, meta: &AddressMeta, world: &World) -> Vec<AttachmentSpan> {
        let mut t = history::Timeline {
            meta: meta.clone(),
            ..Default::default()
        };
        if let Some(a) = cached(world, &meta.ip_address, &meta.address_uid) {
            t = history::Timeline::of(&a);
        }
        let names: Vec<String> = self
            .by_uid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&meta.address_uid)
            .map(|r| r.spans.iter().cloned().collect())
            .unwrap_or_default();
        if let Some(records) = &world.records {
            for n in names {
                if let Some(r) = records.get(&n) {
                    t.add(&r.spec);
                }
            }
        }
        t.spans.into_iter().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use address_controller_runtime::health::{Bounds, Health};
    use std::sync::Arc;

    /// An address with a closed holding of `old` and the open one of `shop`, the first
    /// `recorded` of them moved to records.
    fn address(recorded: i64) -> IPAddress {
        let all = [
            json!({"namespace": "old", "name": "x", "uid": "u0", "state": "Bound",
                "from": "2026-01-01T00:00:00Z", "until": "2026-01-01T01:00:00Z", "ended": "Released"}),
            json!({"namespace": "shop", "name": "web", "uid": "u", "state": "Bound",
                "from": "2026-01-01T02:00:00Z"}),
        ];
        let kept: Vec<_> = all.iter().skip(recorded as usize).cloned().collect();
        serde_json::from_value(json!({
            "metadata": {"name": "ipv4-192-0-2-1", "uid": "0123456789abcdef"},
            "spec": {"address": "192.0.2.1", "className": "k", "source": {"fromClass": {}},
                "claimRef": {"namespace": "shop", "name": "web", "uid": "u"}},
            "status": {"phase": "Bound", "historyRecorded": recorded, "history": kept}}))
        .unwrap()
    }

    #[test]
    fn a_holding_on_its_way_to_its_record_never_leaves_the_view() {
        let world = World::new(false, Health::new(Bounds::default())).with_records_for(true);
        let view = AddressHoldingsView::default();
        let key = "old/ipv4-192-0-2-1.01234567.0";
        let (before, after) = (address(0), address(1));
        world
            .addresses
            .apply(before.name_any(), Some(Arc::new(before.clone())));
        let shown = view.compute(key, &world).expect("on the address").value;
        // The address's event comes before its record's (the two watches are not ordered).
        world
            .addresses
            .apply(after.name_any(), Some(Arc::new(after.clone())));
        let mut dirty = Vec::new();
        view.address_changed(Some(&before), Some(&after), &mut dirty);
        assert!(dirty.iter().any(|d| d == key));
        assert_eq!(
            view.compute(key, &world).map(|c| c.value),
            Some(shown.clone()),
            "shown as it was while its record is on its way"
        );
        assert!(
            AddressHoldingsView::default()
                .compute(key, &world)
                .is_none(),
            "positive control: without the copy the holding vanished (a DELETED in a watch)"
        );
        // The record arrives: read from it, the copy let go.
        let (list, _) = history::holdings(&before);
        let rec = AddressMeta::of(&before).holding(0, &list[0]).to_object();
        world
            .records
            .as_ref()
            .unwrap()
            .apply(rec.name_any(), Some(Arc::new(rec.clone())));
        view.record_changed(None, Some(&rec), &world, &mut dirty);
        assert!(view.in_flight.lock().unwrap().is_empty());
        assert_eq!(view.compute(key, &world).map(|c| c.value), Some(shown));
    }

    #[test]
    fn a_deleted_addresss_holdings_wait_for_their_records_but_not_forever() {
        let world = World::new(false, Health::new(Bounds::default())).with_records_for(true);
        let view = AddressHoldingsView::default();
        let a = address(0);
        world.addresses.apply(a.name_any(), None);
        let mut dirty = Vec::new();
        view.address_changed(Some(&a), None, &mut dirty);
        let (open, closed) = (
            "shop/ipv4-192-0-2-1.01234567.1",
            "old/ipv4-192-0-2-1.01234567.0",
        );
        assert!(view.compute(open, &world).is_some());
        assert!(view.compute(closed, &world).is_some());
        assert!(
            view.compute("old/ipv4-192-0-2-1.01234567.1", &world)
                .is_none(),
            "a holding shows in its own namespace only"
        );
        // Records that never come (their kind not installed): let go after IN_FLIGHT_FOR.
        for f in view.in_flight.lock().unwrap().values_mut() {
            if let Some(t) = f.since.checked_sub(IN_FLIGHT_FOR) {
                f.since = t;
            }
        }
        // The next change of any address lets them go.
        let mut dirty = Vec::new();
        let other = {
            let mut o = address(0);
            o.metadata.name = Some("ipv4-192-0-2-9".into());
            o.metadata.uid = Some("fedcba9876543210".into());
            o
        };
        view.address_changed(Some(&other), None, &mut dirty);
        let left: Vec<String> = view.in_flight.lock().unwrap().keys().cloned().collect();
        assert!(left.iter().all(|k| k.contains("192-0-2-9")), "{left:?}");
        assert!(
            dirty.iter().any(|d| d == open),
            "the view is told it is gone"
        );
        assert!(view.compute(open, &world).is_none());
    }

    #[test]
    fn a_holding_names_its_own_services_and_only_the_namespace_of_anothers() {
        let a: IPAddress = serde_json::from_value(json!({
            "metadata": {"name": "ipv4-192-0-2-1", "uid": "0123456789abcdef"},
            "spec": {"address": "192.0.2.1", "className": "k", "source": {"fromClass": {}},
                "claimRef": {"namespace": "shop", "name": "web", "uid": "u"}},
            "status": {"phase": "Bound", "historyDropped": 2,
                "history": [
                    {"namespace": "old", "name": "x", "uid": "u0", "state": "Bound",
                     "from": "2026-01-01T00:00:00Z", "until": "2026-01-01T01:00:00Z", "ended": "Released"},
                    {"namespace": "shop", "name": "web", "uid": "u", "state": "Bound",
                     "from": "2026-01-01T02:00:00Z"}],
                "attachmentHistory": [
                    {"kind": "Service", "namespace": "old", "name": "before", "from": "2026-01-01T00:10:00Z",
                     "until": "2026-01-01T00:50:00Z"},
                    {"kind": "Service", "namespace": "blog", "name": "secret-name", "from": "2026-01-01T02:10:00Z"},
                    {"kind": "Service", "namespace": "shop", "name": "tls", "from": "2026-01-01T02:05:00Z"}]}}))
        .unwrap();
        let (list, dropped) = history::holdings(&a);
        let meta = AddressMeta::of(&a);
        let (spans, _) = history::spans(&a);
        let h = holding(&meta, spans, &list[1], dropped + 1);
        assert_eq!(
            h.metadata.name.as_deref(),
            Some("ipv4-192-0-2-1.01234567.3"),
            "the name carries the address's uid: another address of that name is another"
        );
        assert_eq!(h.metadata.namespace.as_deref(), Some("shop"));
        let names: Vec<_> = h
            .services
            .iter()
            .map(|s| (s.namespace.clone(), s.name.clone()))
            .collect();
        assert_eq!(
            names,
            [
                (Some("blog".into()), None),
                (Some("shop".into()), Some("tls".into()))
            ],
            "the earlier holder's Service is not this holding's; another tenant's name never shows"
        );
        let c = computed(h);
        assert!(
            !String::from_utf8(serde_json::to_vec(&c.value).unwrap())
                .unwrap()
                .contains("secret-name")
        );
        let at =
            |f: &BTreeMap<&'static str, String>, t: &str| held_at(f, parse_instant(t).unwrap());
        assert!(at(&c.fields, "2026-01-01T02:00:00Z"));
        assert!(at(&c.fields, "2030-01-01T00:00:00Z"), "open: held since");
        assert!(!at(&c.fields, "2026-01-01T01:59:59Z"));
        let first = computed(holding(&meta, spans, &list[0], dropped));
        assert!(at(&first.fields, "2026-01-01T00:59:59Z"));
        assert!(
            !at(&first.fields, "2026-01-01T01:00:00Z"),
            "until is exclusive"
        );
        assert!(
            parse_instant("not a time")
                .unwrap_err()
                .contains("RFC 3339")
        );
    }
}
