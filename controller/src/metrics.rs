//! Prometheus metrics. The ledger gauges are computed from the caches at scrape time, so
//! they are exact and never keep a series for an object that is gone. Labels are bounded:
//! class, phase, namespace, controller, result — never object names or error text.

use std::collections::BTreeMap;
use std::time::Duration;

use address_controller_api::AddressPhase;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use address_controller_runtime::world::World;

/// The metrics of one process.
pub struct Metrics {
    pub registry: Registry,
    reconciles: IntCounterVec,
    durations: HistogramVec,
    bind: HistogramVec,
    provision: HistogramVec,
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
        })
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

/// `address_controller_ipaddresses{class,phase}` and
/// `address_controller_ipaddressclaims{namespace,class,phase}`, counted from the caches.
struct Ledger {
    world: World,
    addresses: IntGaugeVec,
    claims: IntGaugeVec,
    capacity: IntGaugeVec,
}

const ADDRESSES: &str = "address_controller_ipaddresses";
const CLAIMS: &str = "address_controller_ipaddressclaims";
const CAPACITY: &str = "address_controller_ipaddressclass_capacity";

impl Ledger {
    fn new(world: World) -> Result<Self, prometheus::Error> {
        Ok(Self {
            world,
            addresses: Self::addresses_vec()?,
            claims: Self::claims_vec()?,
            capacity: Self::capacity_vec()?,
        })
    }

    fn addresses_vec() -> Result<IntGaugeVec, prometheus::Error> {
        IntGaugeVec::new(
            Opts::new(ADDRESSES, "IPAddresses by class and phase"),
            &["class", "phase"],
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

impl Collector for Ledger {
    fn desc(&self) -> Vec<&Desc> {
        self.addresses
            .desc()
            .into_iter()
            .chain(self.claims.desc())
            .chain(self.capacity.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (Ok(addresses), Ok(claims)) = (Self::addresses_vec(), Self::claims_vec()) else {
            return Vec::new();
        };
        // Every phase of every known class is reported, zeros included, so an alert on
        // `Conflict > 0` sees the series drop back to 0 instead of vanishing.
        let mut per_class: BTreeMap<String, BTreeMap<&'static str, i64>> = BTreeMap::new();
        let zeros = || {
            AddressPhase::ALL
                .iter()
                .map(|p| (p.as_str(), 0))
                .collect::<BTreeMap<_, _>>()
        };
        let Ok(capacity) = Self::capacity_vec() else {
            return Vec::new();
        };
        for class in self.world.classes.store.all() {
            let name = kube::ResourceExt::name_any(class.as_ref());
            if let Some(c) = class.status.as_ref().and_then(|s| s.capacity.as_ref()) {
                for (family, v) in [("IPv4", c.ipv4), ("IPv6", c.ipv6)] {
                    if let Some(v) = v {
                        capacity.with_label_values(&[name.as_str(), family]).set(v);
                    }
                }
            }
            per_class.entry(name).or_insert_with(zeros);
        }
        for a in self.world.addresses.store.all() {
            let phase = a
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map_or("Unknown", AddressPhase::as_str);
            *per_class
                .entry(a.spec.class_name.clone())
                .or_insert_with(zeros)
                .entry(phase)
                .or_default() += 1;
        }
        for (class, phases) in &per_class {
            for (phase, n) in phases {
                addresses
                    .with_label_values(&[class.as_str(), phase])
                    .set(*n);
            }
        }
        for c in self.world.claims.store.all() {
            let status = c.status.as_ref();
            let ns = c.metadata.namespace.clone().unwrap_or_default();
            let class = status
                .and_then(|s| s.class_name.clone())
                .unwrap_or_default();
            let phase = status
                .and_then(|s| s.phase)
                .map_or("Pending", |p| p.as_str());
            claims
                .with_label_values(&[ns.as_str(), class.as_str(), phase])
                .inc();
        }
        addresses
            .collect()
            .into_iter()
            .chain(claims.collect())
            .chain(capacity.collect())
            .collect()
    }
}
