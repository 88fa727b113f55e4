//! Prometheus metrics. The ledger gauges are counted from the caches (kept up to date by
//! their change handlers), so they are exact and never keep a series for an object that is
//! gone. Labels are bounded:
//! class, phase, namespace, controller, result — never object names or error text.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim};
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use address_controller_runtime::world::World;

use crate::quota::QuotaBook;

/// The metrics of one process.
pub struct Metrics {
    pub registry: Registry,
    reconciles: IntCounterVec,
    durations: HistogramVec,
    bind: HistogramVec,
    provision: HistogramVec,
    records: IntCounterVec,
    records_total: prometheus::IntGauge,
}

/// Buckets of the waits tenants see: a bind from the pool takes well under a second, one
/// that waits for a driver seconds to minutes.
const WAIT_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

impl Metrics {
    pub fn new(world: World) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "address_controller_reconcile_total",
                "Reconcile passes by controller and result",
            ),
            &["controller", "result"],
        )?;
        let durations = HistogramVec::new(
            HistogramOpts::new(
                "address_controller_reconcile_duration_seconds",
                "Duration of reconcile passes",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["controller"],
        )?;
        let bind = HistogramVec::new(
            HistogramOpts::new(
                "address_controller_bind_duration_seconds",
                "Time from a claim's creation to its first Bound, by class",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["class"],
        )?;
        let provision = HistogramVec::new(
            HistogramOpts::new(
                "address_controller_provision_duration_seconds",
                "Time a claim waited for its class's provisioner (WaitingForProvisioning until Bound), by class",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["class"],
        )?;
        let records = IntCounterVec::new(
            Opts::new(
                "address_controller_history_records_total",
                "History records (IPAddressRecord) the core created and pruned",
            ),
            &["action"],
        )?;
        registry.register(Box::new(records.clone()))?;
        let records_total = prometheus::IntGauge::new(
            "address_controller_history_records",
            "History records (IPAddressRecord) in the cluster, counted by the leader's retention pass",
        )?;
        registry.register(Box::new(records_total.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(durations.clone()))?;
        registry.register(Box::new(bind.clone()))?;
        registry.register(Box::new(provision.clone()))?;
        registry.register(Box::new(Ledger::new(world)?))?;
        Ok(Self {
            registry,
            reconciles,
            durations,
            bind,
            provision,
            records,
            records_total,
        })
    }

    /// `n` history records created.
    pub fn records_created(&self, n: usize) {
        self.records
            .with_label_values(&["created"])
            .inc_by(n as u64);
    }

    /// `n` history records pruned by the retention.
    pub fn records_pruned(&self, n: usize) {
        self.records.with_label_values(&["pruned"]).inc_by(n as u64);
    }

    /// `n` history records pruned because there were more than `--history-max-records`.
    pub fn records_capped(&self, n: usize) {
        self.records.with_label_values(&["capped"]).inc_by(n as u64);
    }

    /// The records counted by the last retention pass.
    pub fn records_total(&self, n: i64) {
        self.records_total.set(n);
    }

    /// Adds the quota gauges, read from the quota book (the core's process).
    pub fn register_quota(&self, book: Arc<QuotaBook>) -> Result<(), prometheus::Error> {
        self.registry.register(Box::new(QuotaGauges::new(book)?))
    }

    /// A claim's first Bound: how long since its creation, and — when it waited for a
    /// provisioner — since it started waiting.
    pub fn bound(
        &self,
        class: &str,
        created: Option<k8s_openapi::jiff::Timestamp>,
        waited_since: Option<k8s_openapi::jiff::Timestamp>,
    ) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let secs = |t: k8s_openapi::jiff::Timestamp| {
            (now - t)
                .total(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(0.0)
                .max(0.0)
        };
        if let Some(c) = created {
            self.bind.with_label_values(&[class]).observe(secs(c));
        }
        if let Some(w) = waited_since {
            self.provision.with_label_values(&[class]).observe(secs(w));
        }
    }

    /// Records one reconcile pass; `result` is `success` or an error category.
    pub fn observe(&self, controller: &str, result: &str, took: Duration) {
        self.reconciles
            .with_label_values(&[controller, result])
            .inc();
        self.durations
            .with_label_values(&[controller])
            .observe(took.as_secs_f64());
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) =
            prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out)
        {
            tracing::warn!(error = %e, "encoding metrics");
        }
        out
    }
}

/// `address_controller_ipaddresses{class,phase}`,
/// `address_controller_ipaddresses_held{namespace,class,state}` (the billing unit: addresses
/// by the namespace of the claim they are bound to — `bound`, `associated` when a driver
/// put them on a Service, and `shared` when on more than one),
/// `address_controller_ipaddressclaims{namespace,class,phase}`,
/// `address_controller_ipaddressclass_capacity{class,family}` and
/// `address_controller_ipaddressclass_allocated{class,family}` (every IPAddress of the class
/// by family, as `poolavailabilities` counts it: what fills the capacity).
///
/// The counts are kept by the caches' change handlers (registered before the watches start,
/// so every object the store ever holds passes through them, relists included): a scrape
/// costs the number of series, not the number of objects.
struct Ledger {
    world: World,
    counts: Arc<Mutex<Counts>>,
    descs: Vec<Desc>,
}

/// Objects per label set. A claim series whose count drops to zero goes away (namespaces
/// come and go); address series are reported for every phase of every known class.
#[derive(Default)]
struct Counts {
    addresses: HashMap<(String, &'static str), i64>,
    allocated: HashMap<(String, &'static str), i64>,
    held: HashMap<(String, String, &'static str), i64>,
    claims: HashMap<(String, String, &'static str), i64>,
    /// (class, list) → history entries dropped past the bound, over the class's addresses.
    dropped: HashMap<(String, &'static str), i64>,
}

/// What an address counts in `address_controller_address_history_dropped`: (class, list,
/// entries dropped) for both lists of its history.
fn dropped_of(a: &IPAddress) -> [((String, &'static str), i64); 2] {
    let class = a.spec.class_name.clone();
    [
        (
            (class.clone(), "holdings"),
            address_controller_api::history::Counts::holdings(a).dropped,
        ),
        (
            (class, "services"),
            address_controller_api::history::Counts::spans(a).dropped,
        ),
    ]
}

fn tally<K: Eq + std::hash::Hash>(map: &mut HashMap<K, i64>, key: K, delta: i64) {
    match map.entry(key) {
        Entry::Occupied(mut e) => {
            *e.get_mut() += delta;
            if *e.get() == 0 {
                e.remove();
            }
        }
        Entry::Vacant(e) => {
            e.insert(delta);
        }
    }
}

/// One object's move from label set `old` to `new` (either absent on creation/deletion).
fn shift<K: Eq + std::hash::Hash>(map: &mut HashMap<K, i64>, old: Option<K>, new: Option<K>) {
    if let Some(k) = old {
        tally(map, k, -1);
    }
    if let Some(k) = new {
        tally(map, k, 1);
    }
}

fn address_key(a: &IPAddress) -> (String, &'static str) {
    (a.spec.class_name.clone(), a.phase_name())
}

/// The `held` series an address counts in: (claim namespace, class, state) for each of
/// [`IPAddress::held_states`].
fn held_keys(a: &IPAddress) -> Vec<(String, String, &'static str)> {
    let Some(r) = a.spec.claim_ref.as_ref() else {
        return Vec::new();
    };
    a.held_states()
        .into_iter()
        .map(|state| (r.namespace.clone(), a.spec.class_name.clone(), state))
        .collect()
}

fn claim_key(c: &IPAddressClaim) -> (String, String, &'static str) {
    let status = c.status.as_ref();
    (
        c.metadata.namespace.clone().unwrap_or_default(),
        status
            .and_then(|s| s.class_name.clone())
            .unwrap_or_default(),
        status
            .and_then(|s| s.phase)
            .map_or(ClaimPhase::Pending.as_str(), ClaimPhase::as_str),
    )
}

const ADDRESSES: &str = "address_controller_ipaddresses";
const HELD: &str = "address_controller_ipaddresses_held";
const CLAIMS: &str = "address_controller_ipaddressclaims";
const CAPACITY: &str = "address_controller_ipaddressclass_capacity";
const ALLOCATED: &str = "address_controller_ipaddressclass_allocated";
const DROPPED: &str = "address_controller_address_history_dropped";

/// The `allocated` series an address counts in: (class, family).
fn allocated_key(a: &IPAddress) -> Option<(String, &'static str)> {
    Some((a.spec.class_name.clone(), a.family()?.as_str()))
}

impl Ledger {
    fn new(world: World) -> Result<Self, prometheus::Error> {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let c = counts.clone();
        world.addresses.on_change(move |ch| {
            let (old, new) = (
                ch.old.as_deref().map(address_key),
                ch.new.as_deref().map(address_key),
            );
            let (old_held, new_held) = (
                ch.old.as_deref().map(held_keys).unwrap_or_default(),
                ch.new.as_deref().map(held_keys).unwrap_or_default(),
            );
            let (old_alloc, new_alloc) = (
                ch.old.as_deref().and_then(allocated_key),
                ch.new.as_deref().and_then(allocated_key),
            );
            let (old_dropped, new_dropped) = (
                ch.old.as_deref().map(dropped_of),
                ch.new.as_deref().map(dropped_of),
            );
            if old_dropped != new_dropped {
                let mut counts = c.lock().unwrap_or_else(PoisonError::into_inner);
                for (k, n) in old_dropped.into_iter().flatten() {
                    tally(&mut counts.dropped, k, -n);
                }
                for (k, n) in new_dropped.into_iter().flatten() {
                    tally(&mut counts.dropped, k, n);
                }
            }
            if old != new || old_held != new_held || old_alloc != new_alloc {
                let mut counts = c.lock().unwrap_or_else(PoisonError::into_inner);
                shift(&mut counts.addresses, old, new);
                shift(&mut counts.allocated, old_alloc, new_alloc);
                for k in old_held {
                    tally(&mut counts.held, k, -1);
                }
                for k in new_held {
                    tally(&mut counts.held, k, 1);
                }
            }
        });
        let c = counts.clone();
        world.claims.on_change(move |ch| {
            let (old, new) = (
                ch.old.as_deref().map(claim_key),
                ch.new.as_deref().map(claim_key),
            );
            if old != new {
                shift(
                    &mut c.lock().unwrap_or_else(PoisonError::into_inner).claims,
                    old,
                    new,
                );
            }
        });
        let descs = [
            Self::addresses_vec()?,
            Self::held_vec()?,
            Self::claims_vec()?,
            Self::capacity_vec()?,
            Self::allocated_vec()?,
            Self::dropped_vec()?,
        ]
        .iter()
        .flat_map(|v| v.desc().into_iter().cloned())
        .collect();
        Ok(Self {
            world,
            counts,
            descs,
        })
    }

    fn addresses_vec() -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(
            Opts::new(ADDRESSES, "IPAddresses by class and phase"),
            &["class", "phase"],
        )
    }

    fn held_vec() -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(
            Opts::new(
                HELD,
                "IPAddresses by the namespace of their claim, class and state: bound (Bound or Conflict), associated (a driver put it on a Service), shared (on more than one Service: its claim shares it)",
            ),
            &["namespace", "class", "state"],
        )
    }

    fn capacity_vec() -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(
            Opts::new(
                CAPACITY,
                "Addresses a class's driver can hold, by family (the class's status.capacity, when reported)",
            ),
            &["class", "family"],
        )
    }

    fn allocated_vec() -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(
            Opts::new(
                ALLOCATED,
                "IPAddresses of a class by family, every phase: what fills its capacity (as poolavailabilities counts)",
            ),
            &["class", "family"],
        )
    }

    fn dropped_vec() -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(
            Opts::new(
                DROPPED,
                "History entries dropped past the bound from the class's addresses, by list (holdings: claims; services: attachments); export the history before it grows",
            ),
            &["class", "list"],
        )
    }

    fn claims_vec() -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(
            Opts::new(
                CLAIMS,
                "IPAddressClaims by namespace, resolved class and phase",
            ),
            &["namespace", "class", "phase"],
        )
    }
}

const QUOTA_LIMIT: &str = "address_controller_quota_limit";
const QUOTA_USED: &str = "address_controller_quota_used";
const QUOTA_WAITING: &str = "address_controller_quota_waiting_claims";

/// `address_controller_quota_limit{namespace,class,family}` (the strictest limit of the
/// namespace's IPAddressQuotas; `family="all"` for the every-family limit),
/// `address_controller_quota_used{namespace,class,family}` (what counts toward it: the
/// addresses naming the namespace's claims, Released and retained ones included, and the
/// invitations to provision) and `address_controller_quota_waiting_claims{namespace,class}`
/// (claims refused `QuotaExceeded`) — for every namespace and class an IPAddressQuota
/// limits. Read from the quota book the binder decides with: a scrape costs the number of
/// limited (namespace, class) pairs.
struct QuotaGauges {
    book: Arc<QuotaBook>,
    descs: Vec<Desc>,
}

impl QuotaGauges {
    fn new(book: Arc<QuotaBook>) -> Result<Self, prometheus::Error> {
        let (l, u, w) = Self::vecs()?;
        let descs = [l, u, w]
            .iter()
            .flat_map(|v| v.desc().into_iter().cloned())
            .collect();
        Ok(Self { book, descs })
    }

    fn vecs() -> Result<(IntGaugeVec, IntGaugeVec, IntGaugeVec), prometheus::Error> {
        Ok((
            IntGaugeVec::new(
                Opts::new(
                    QUOTA_LIMIT,
                    "The strictest IPAddressQuota limit of a namespace on a class, by family (all: every family together)",
                ),
                &["namespace", "class", "family"],
            )?,
            IntGaugeVec::new(
                Opts::new(
                    QUOTA_USED,
                    "Addresses counted toward a namespace's quota on a class, by family (all: every family together)",
                ),
                &["namespace", "class", "family"],
            )?,
            IntGaugeVec::new(
                Opts::new(
                    QUOTA_WAITING,
                    "Claims of a namespace and class waiting with reason QuotaExceeded",
                ),
                &["namespace", "class"],
            )?,
        ))
    }
}

impl Collector for QuotaGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok((limit, used, waiting)) = Self::vecs() else {
            return Vec::new();
        };
        for s in self.book.standings() {
            let (ns, class) = (s.namespace.as_str(), s.class.as_str());
            for (family, l, u) in [
                ("all", s.limits.addresses.as_ref(), s.used.total()),
                ("IPv4", s.limits.ipv4.as_ref(), s.used.ipv4),
                ("IPv6", s.limits.ipv6.as_ref(), s.used.ipv6),
            ] {
                if let Some(l) = l {
                    limit.with_label_values(&[ns, class, family]).set(l.value);
                }
                used.with_label_values(&[ns, class, family]).set(u);
            }
            waiting
                .with_label_values(&[ns, class])
                .set(s.waiting as i64);
        }
        limit
            .collect()
            .into_iter()
            .chain(used.collect())
            .chain(waiting.collect())
            .collect()
    }
}

impl Collector for Ledger {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (Ok(addresses), Ok(held), Ok(claims), Ok(capacity), Ok(allocated), Ok(dropped)) = (
            Self::addresses_vec(),
            Self::held_vec(),
            Self::claims_vec(),
            Self::capacity_vec(),
            Self::allocated_vec(),
            Self::dropped_vec(),
        ) else {
            return Vec::new();
        };
        // Every phase of every known class is reported, zeros included, so an alert on
        // `Conflict > 0` sees the series drop back to 0 instead of vanishing.
        for class in self.world.classes.store.all() {
            let name = kube::ResourceExt::name_any(class.as_ref());
            if let Some(c) = class.status.as_ref().and_then(|s| s.capacity.as_ref()) {
                for (family, v) in [("IPv4", c.ipv4), ("IPv6", c.ipv6)] {
                    if let Some(v) = v {
                        capacity.with_label_values(&[name.as_str(), family]).set(v);
                    }
                }
            }
            for phase in AddressPhase::ALL {
                addresses
                    .with_label_values(&[name.as_str(), phase.as_str()])
                    .set(0);
            }
            for family in ["IPv4", "IPv6"] {
                allocated.with_label_values(&[name.as_str(), family]).set(0);
            }
            for list in ["holdings", "services"] {
                dropped.with_label_values(&[name.as_str(), list]).set(0);
            }
        }
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        for ((class, phase), n) in &counts.addresses {
            addresses
                .with_label_values(&[class.as_str(), phase])
                .set(*n);
        }
        for ((class, list), n) in &counts.dropped {
            dropped.with_label_values(&[class.as_str(), list]).set(*n);
        }
        for ((class, family), n) in &counts.allocated {
            allocated
                .with_label_values(&[class.as_str(), family])
                .set(*n);
        }
        for ((ns, class, state), n) in &counts.held {
            held.with_label_values(&[ns.as_str(), class.as_str(), state])
                .set(*n);
        }
        for ((ns, class, phase), n) in &counts.claims {
            claims
                .with_label_values(&[ns.as_str(), class.as_str(), phase])
                .set(*n);
        }
        drop(counts);
        addresses
            .collect()
            .into_iter()
            .chain(held.collect())
            .chain(claims.collect())
            .chain(capacity.collect())
            .chain(allocated.collect())
            .chain(dropped.collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use address_controller_runtime::health::{Bounds, Health};
    use serde_json::json;

    fn address(name: &str, class: &str, phase: &str) -> Arc<IPAddress> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"address": "192.0.2.1", "className": class, "source": {"fromClass": {}}},
                "status": {"phase": phase},
            }))
            .unwrap(),
        )
    }

    fn claim(ns: &str, name: &str, class: &str, phase: &str) -> Arc<IPAddressClaim> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": {},
                "status": {"phase": phase, "className": class},
            }))
            .unwrap(),
        )
    }

    fn series(m: &Metrics) -> Vec<String> {
        m.render()
            .lines()
            .filter(|l| l.starts_with("address_controller_ip"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_ledger_follows_every_change_and_drops_series_that_reach_zero() {
        let world = World::new(false, Health::new(Bounds::default()));
        let m = Metrics::new(world.clone()).unwrap();
        let class = serde_json::from_value(json!({
            "metadata": {"name": "gold"},
            "spec": {"provisioner": "p"},
            "status": {"capacity": {"ipv4": 8}},
        }))
        .unwrap();
        world.classes.apply("gold".into(), Some(Arc::new(class)));
        world
            .addresses
            .apply("a".into(), Some(address("a", "gold", "Available")));
        world
            .addresses
            .apply("b".into(), Some(address("b", "gold", "Available")));
        world
            .claims
            .apply("t/c".into(), Some(claim("t", "c", "gold", "Pending")));
        let s = series(&m);
        assert!(
            s.contains(
                &r#"address_controller_ipaddresses{class="gold",phase="Available"} 2"#.to_string()
            ),
            "{s:#?}"
        );
        assert!(
            s.contains(
                &r#"address_controller_ipaddresses{class="gold",phase="Bound"} 0"#.to_string()
            ),
            "{s:#?}"
        );
        assert!(s.contains(&r#"address_controller_ipaddressclaims{class="gold",namespace="t",phase="Pending"} 1"#.to_string()), "{s:#?}");
        assert!(
            s.contains(
                &r#"address_controller_ipaddressclass_capacity{class="gold",family="IPv4"} 8"#
                    .to_string()
            ),
            "{s:#?}"
        );
        for want in [
            r#"address_controller_ipaddressclass_allocated{class="gold",family="IPv4"} 2"#,
            r#"address_controller_ipaddressclass_allocated{class="gold",family="IPv6"} 0"#,
        ] {
            assert!(s.contains(&want.to_string()), "{want}: {s:#?}");
        }

        // A bind moves one address and the claim; a deletion takes its series away.
        world
            .addresses
            .apply("a".into(), Some(address("a", "gold", "Bound")));
        world
            .claims
            .apply("t/c".into(), Some(claim("t", "c", "gold", "Bound")));
        world.addresses.apply("b".into(), None);
        let s = series(&m);
        assert!(
            s.contains(
                &r#"address_controller_ipaddresses{class="gold",phase="Available"} 0"#.to_string()
            ),
            "{s:#?}"
        );
        assert!(
            s.contains(
                &r#"address_controller_ipaddresses{class="gold",phase="Bound"} 1"#.to_string()
            ),
            "{s:#?}"
        );
        assert!(s.contains(&r#"address_controller_ipaddressclaims{class="gold",namespace="t",phase="Bound"} 1"#.to_string()), "{s:#?}");
        // A phase change keeps the address allocated; the deletion frees one.
        assert!(
            s.contains(
                &r#"address_controller_ipaddressclass_allocated{class="gold",family="IPv4"} 1"#
                    .to_string()
            ),
            "{s:#?}"
        );
        assert!(
            !s.iter()
                .any(|l| l.starts_with("address_controller_ipaddressclaims")
                    && l.contains(r#"phase="Pending""#)),
            "{s:#?}"
        );

        // An unchanged object and a deletion of an unknown key change nothing.
        world
            .claims
            .apply("t/c".into(), Some(claim("t", "c", "gold", "Bound")));
        world.claims.apply("t/x".into(), None);
        world.claims.apply("t/c".into(), None);
        let s = series(&m);
        assert!(
            !s.iter()
                .any(|l| l.starts_with("address_controller_ipaddressclaims")),
            "{s:#?}"
        );
    }
}
