//! Request metrics of the views, in the style of kube-apiserver's `apiserver_request_total`
//! and `apiserver_request_duration_seconds`: by verb, resource and code, with bounded
//! labels (the served resources, or `other`).

use std::time::Duration;

use address_controller_serving::metrics::gauges;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

pub struct ApiMetrics {
    requests: IntCounterVec,
    durations: HistogramVec,
}

impl ApiMetrics {
    pub fn new(registry: &Registry) -> Result<ApiMetrics, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new(
                "address_controller_apiserver_requests_total",
                "Requests to the aggregated API server by verb, resource and HTTP code",
            ),
            &["verb", "resource", "code"],
        )?;
        let durations = HistogramVec::new(
            HistogramOpts::new(
                "address_controller_apiserver_request_duration_seconds",
                "Time to answer a request of the aggregated API server (watches excluded: they stream)",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            &["verb", "resource"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(durations.clone()))?;
        Ok(ApiMetrics {
            requests,
            durations,
        })
    }

    /// Metrics that are not exported (tests, servers without a registry).
    pub fn unregistered() -> ApiMetrics {
        let registry = Registry::new();
        #[allow(clippy::expect_used)]
        ApiMetrics::new(&registry).expect("fresh registry")
    }

    pub fn observe(&self, verb: &str, resource: &str, code: u16, took: Duration) {
        self.requests
            .with_label_values(&[verb, resource, &code.to_string()])
            .inc();
        if verb != "watch" {
            self.durations
                .with_label_values(&[verb, resource])
                .observe(took.as_secs_f64());
        }
    }
}

/// What the view store holds, read at scrape time:
/// `address_controller_apiserver_view_bytes{part="objects"|"history"}` (serialized bytes)
/// and `address_controller_apiserver_view_entries{part="objects"|"history"}` (objects,
/// changes) — the history is bounded by `--view-history-bytes` and its change count.
pub struct ViewSizes {
    store: std::sync::Arc<crate::store::ViewStore>,
    bytes: prometheus::core::Desc,
    entries: prometheus::core::Desc,
}

impl ViewSizes {
    pub fn new(
        store: std::sync::Arc<crate::store::ViewStore>,
    ) -> Result<ViewSizes, prometheus::Error> {
        let desc = |name: &str, help: &str| {
            prometheus::core::Desc::new(
                name.into(),
                help.into(),
                vec!["part".into()],
                Default::default(),
            )
        };
        Ok(ViewSizes {
            store,
            bytes: desc(
                "address_controller_apiserver_view_bytes",
                "Serialized bytes the view store holds: its current objects, and the history of changes watches resume from",
            )?,
            entries: desc(
                "address_controller_apiserver_view_entries",
                "Objects the view store holds, and changes in its history",
            )?,
        })
    }
}

impl prometheus::core::Collector for ViewSizes {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.bytes, &self.entries]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let s = self.store.sizes();
        vec![
            gauges(
                &self.bytes,
                "part",
                &[
                    ("objects", s.object_bytes as u64),
                    ("history", s.history_bytes as u64),
                ],
            ),
            gauges(
                &self.entries,
                "part",
                &[
                    ("objects", s.objects as u64),
                    ("history", s.history_changes as u64),
                ],
            ),
        ]
    }
}
