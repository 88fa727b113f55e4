//! Metrics every process of the project exports, whatever else it counts: the process
//! (CPU, memory, open files, start time), what was built, whether this replica leads, its
//! calls to kube-apiserver ([`crate::client::ClientMetrics`]), and how each watched cache
//! is doing. Read at scrape time; labels bounded (the watched kinds).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::health::Health;
use crate::leader::Leadership;

/// The revision the binary was built from (`git rev-parse --short=12 HEAD`).
pub const REVISION: &str = env!("ADDRESS_CONTROLLER_REVISION");

/// What `--version` prints after the binary's name: the version and the revision.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("ADDRESS_CONTROLLER_REVISION"),
    ")"
);

struct Runtime {
    health: Arc<Health>,
    leadership: Option<Arc<Leadership>>,
    build: IntGaugeVec,
    leader: IntGauge,
    age: GaugeVec,
    objects: IntGaugeVec,
    synced: IntGaugeVec,
    lists: IntCounterVec,
    watches: IntCounterVec,
    descs: Vec<Desc>,
}

/// Registers the process collector and the runtime's metrics on `registry`; `version` is
/// the binary's (`CARGO_PKG_VERSION`), `leadership` absent for processes that never lead.
pub fn register(
    registry: &Registry,
    version: &str,
    health: Arc<Health>,
    leadership: Option<Arc<Leadership>>,
) -> Result<(), prometheus::Error> {
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    crate::client::ClientMetrics::register(registry)?;
    let build = IntGaugeVec::new(
        Opts::new(
            "address_controller_build_info",
            "The version and revision of the running binary (always 1)",
        ),
        &["version", "revision"],
    )?;
    build.with_label_values(&[version, REVISION]).set(1);
    let leader = IntGauge::with_opts(Opts::new(
        "address_controller_leader",
        "1 while this replica holds the lease and acts, 0 otherwise",
    ))?;
    let age = GaugeVec::new(
        Opts::new(
            "address_controller_cache_last_activity_age_seconds",
            "Seconds since the API server last said anything on the cache's watch (event, bookmark or list)",
        ),
        &["kind"],
    )?;
    let objects = IntGaugeVec::new(
        Opts::new("address_controller_cache_objects", "Objects in the cache"),
        &["kind"],
    )?;
    let synced = IntGaugeVec::new(
        Opts::new(
            "address_controller_cache_synced",
            "1 once the cache's initial list completed",
        ),
        &["kind"],
    )?;
    let lists = IntCounterVec::new(
        Opts::new(
            "address_controller_cache_lists_total",
            "Full lists of the cache (the initial one, then after an expired watch or a silent one)",
        ),
        &["kind"],
    )?;
    let watches = IntCounterVec::new(
        Opts::new(
            "address_controller_cache_watches_total",
            "Watch connections the cache opened",
        ),
        &["kind"],
    )?;
    let descs = [
        build.desc(),
        leader.desc(),
        age.desc(),
        objects.desc(),
        synced.desc(),
        lists.desc(),
        watches.desc(),
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect();
    registry.register(Box::new(Runtime {
        health,
        leadership,
        build,
        leader,
        age,
        objects,
        synced,
        lists,
        watches,
        descs,
    }))
}

impl Collector for Runtime {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if let Some(l) = &self.leadership {
            self.leader.set(i64::from(l.is_leader()));
        }
        for w in self.health.watches() {
            let kind = [w.kind];
            self.age
                .with_label_values(&kind)
                .set(w.silence().as_secs_f64());
            self.objects
                .with_label_values(&kind)
                .set(i64::try_from(w.objects.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
            self.synced
                .with_label_values(&kind)
                .set(i64::from(w.synced()));
            // Counters follow the cache's own counts.
            let sync = |c: &IntCounterVec, v: u64| {
                let c = c.with_label_values(&kind);
                let have = c.get();
                if v > have {
                    c.inc_by(v - have);
                }
            };
            sync(&self.lists, w.lists.load(Ordering::Relaxed));
            sync(&self.watches, w.watches.load(Ordering::Relaxed));
        }
        let mut out = Vec::new();
        out.extend(self.build.collect());
        if self.leadership.is_some() {
            out.extend(self.leader.collect());
        }
        for c in [
            &self.age as &dyn Collector,
            &self.objects,
            &self.synced,
            &self.lists,
            &self.watches,
        ] {
            out.extend(c.collect());
        }
        out
    }
}

/// The stats of one named work queue, read at scrape time.
pub type QueueReader = Arc<dyn Fn() -> crate::queue::QueueStats + Send + Sync>;

struct Queues {
    queues: Vec<(&'static str, QueueReader)>,
    depth: IntGaugeVec,
    adds: IntCounterVec,
    retries: IntCounterVec,
    descs: Vec<Desc>,
}

/// Registers the work-queue metrics of `queues` (by name) on `registry`:
/// `address_controller_workqueue_depth{queue,state}` (ready, delayed, running),
/// `address_controller_workqueue_adds_total{queue}` and
/// `address_controller_workqueue_retries_total{queue}` (re-adds with backoff after a failed
/// pass) — as client-go's workqueue metrics, labels bounded by the queue names.
pub fn register_queues(
    registry: &Registry,
    queues: Vec<(&'static str, QueueReader)>,
) -> Result<(), prometheus::Error> {
    let depth = IntGaugeVec::new(
        Opts::new(
            "address_controller_workqueue_depth",
            "Keys in a work queue: ready for a worker, delayed (backoff or a deadline), running",
        ),
        &["queue", "state"],
    )?;
    let adds = IntCounterVec::new(
        Opts::new(
            "address_controller_workqueue_adds_total",
            "Keys that became ready in a work queue",
        ),
        &["queue"],
    )?;
    let retries = IntCounterVec::new(
        Opts::new(
            "address_controller_workqueue_retries_total",
            "Keys re-queued with backoff after a failed pass",
        ),
        &["queue"],
    )?;
    let descs = [depth.desc(), adds.desc(), retries.desc()]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    registry.register(Box::new(Queues {
        queues,
        depth,
        adds,
        retries,
        descs,
    }))
}

impl Collector for Queues {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        for (name, read) in &self.queues {
            let s = read();
            for (state, n) in [
                ("ready", s.ready),
                ("delayed", s.delayed),
                ("running", s.running),
            ] {
                self.depth
                    .with_label_values(&[name, state])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            for (c, v) in [(&self.adds, s.adds), (&self.retries, s.retries)] {
                let c = c.with_label_values(&[name]);
                let have = c.get();
                if v > have {
                    c.inc_by(v - have);
                }
            }
        }
        let mut out = self.depth.collect();
        out.extend(self.adds.collect());
        out.extend(self.retries.collect());
        out
    }
}
