//! Metrics every process of the project exports, whatever else it counts: the process
//! (CPU, memory, open files, start time), what was built, whether this replica leads, its
//! calls to kube-apiserver ([`crate::client::ClientMetrics`]), and how each watched cache
//! is doing. Read at scrape time; labels bounded (the watched kinds).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

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
    leader: IntGaugeVec,
    age: GaugeVec,
    objects: IntGaugeVec,
    synced: IntGaugeVec,
    lists: IntCounterVec,
    streaming_lists: IntCounterVec,
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
    let leader = IntGaugeVec::new(
        Opts::new(
            "address_controller_leader",
            "1 while this replica holds the lease (namespace/name; empty without an election) and acts, 0 otherwise",
        ),
        &["lease"],
    )?;
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
    let streaming_lists = IntCounterVec::new(
        Opts::new(
            "address_controller_cache_streaming_lists_total",
            "Of the cache's full lists, those taken as a streaming list (a watch with sendInitialEvents); the rest were paged lists",
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
        streaming_lists.desc(),
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
        streaming_lists,
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
            // One series: the label is empty until the election names its Lease.
            self.leader.reset();
            self.leader
                .with_label_values(&[l.lease()])
                .set(i64::from(l.is_leader()));
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
            sync(
                &self.streaming_lists,
                w.streaming_lists.load(Ordering::Relaxed),
            );
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
            &self.streaming_lists,
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
    longest: GaugeVec,
    unfinished: GaugeVec,
    descs: Vec<Desc>,
}

const QUEUE_WAIT: &str = "address_controller_workqueue_queue_duration_seconds";
const QUEUE_WAIT_HELP: &str =
    "How long keys waited in a work queue, ready, before a worker took them";

/// The queue-wait histograms, built from the queues' own counts.
fn wait_family(series: &[(&'static str, crate::queue::WaitHistogram)]) -> MetricFamily {
    use prometheus::proto::{Bucket, Histogram, LabelPair, Metric, MetricType};
    let mut mf = MetricFamily::default();
    mf.set_name(QUEUE_WAIT.to_string());
    mf.set_help(QUEUE_WAIT_HELP.to_string());
    mf.set_field_type(MetricType::HISTOGRAM);
    for (name, w) in series {
        let mut label = LabelPair::default();
        label.set_name("queue".to_string());
        label.set_value((*name).to_string());
        let mut h = Histogram::default();
        let mut buckets = Vec::with_capacity(crate::queue::WAIT_BUCKETS.len());
        let mut cumulative = 0;
        for (upper, n) in crate::queue::WAIT_BUCKETS.iter().zip(w.buckets) {
            cumulative += n;
            let mut b = Bucket::default();
            b.set_upper_bound(*upper);
            b.set_cumulative_count(cumulative);
            buckets.push(b);
        }
        h.set_bucket(buckets);
        h.set_sample_count(w.count);
        // Microseconds to seconds: exact below 2^53 µs (285 years of waiting).
        #[allow(clippy::cast_precision_loss)]
        h.set_sample_sum(w.sum_micros as f64 / 1e6);
        let mut m = Metric::from_label(vec![label]);
        m.set_histogram(h);
        mf.mut_metric().push(m);
    }
    mf
}

/// Registers the work-queue metrics of `queues` (by name) on `registry`:
/// `address_controller_workqueue_depth{queue,state}` (ready, delayed, running),
/// `address_controller_workqueue_adds_total{queue}` and
/// `address_controller_workqueue_retries_total{queue}` (re-adds with backoff after a failed
/// pass), `address_controller_workqueue_queue_duration_seconds{queue}` (time ready before a
/// worker took the key), `_longest_running_processor_seconds{queue}` and
/// `_unfinished_work_seconds{queue}` — as client-go's workqueue metrics, labels bounded by
/// the queue names.
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
    let longest = GaugeVec::new(
        Opts::new(
            "address_controller_workqueue_longest_running_processor_seconds",
            "How long the longest-running pass of a work queue has been running",
        ),
        &["queue"],
    )?;
    let unfinished = GaugeVec::new(
        Opts::new(
            "address_controller_workqueue_unfinished_work_seconds",
            "Seconds of work in hand, not yet finished, summed over the running passes of a work queue",
        ),
        &["queue"],
    )?;
    let mut descs: Vec<Desc> = [
        depth.desc(),
        adds.desc(),
        retries.desc(),
        longest.desc(),
        unfinished.desc(),
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect();
    descs.push(Desc::new(
        QUEUE_WAIT.to_string(),
        QUEUE_WAIT_HELP.to_string(),
        vec!["queue".to_string()],
        std::collections::HashMap::new(),
    )?);
    registry.register(Box::new(Queues {
        queues,
        depth,
        adds,
        retries,
        longest,
        unfinished,
        descs,
    }))
}

impl Collector for Queues {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut waits = Vec::new();
        for (name, read) in &self.queues {
            let s = read();
            waits.push((*name, s.wait));
            self.longest
                .with_label_values(&[name])
                .set(s.longest_running.as_secs_f64());
            self.unfinished
                .with_label_values(&[name])
                .set(s.unfinished.as_secs_f64());
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
        out.extend(self.longest.collect());
        out.extend(self.unfinished.collect());
        out.push(wait_family(&waits));
        out
    }
}
