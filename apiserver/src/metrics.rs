//! Request metrics of the views, in the style of kube-apiserver's `apiserver_request_total`
//! and `apiserver_request_duration_seconds`: by verb, resource and code, with bounded
//! labels (the served resources, or `other`).

use std::time::Duration;

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

/// The delegated-auth caches' sizes, read at scrape time:
/// `address_controller_apiserver_auth_cache_entries{cache="tokens"|"decisions"}`.
pub struct AuthCaches {
    pub authn: std::sync::Arc<crate::authn::Authenticator>,
    pub authz: std::sync::Arc<crate::authz::Authorizer>,
    desc: prometheus::core::Desc,
}

impl AuthCaches {
    pub fn new(
        authn: std::sync::Arc<crate::authn::Authenticator>,
        authz: std::sync::Arc<crate::authz::Authorizer>,
    ) -> Result<AuthCaches, prometheus::Error> {
        let desc = prometheus::core::Desc::new(
            "address_controller_apiserver_auth_cache_entries".into(),
            "Entries in the delegated authentication (tokens) and authorization (decisions) caches; bounded by --auth-cache-size".into(),
            vec!["cache".into()],
            Default::default(),
        )?;
        Ok(AuthCaches { authn, authz, desc })
    }
}

impl prometheus::core::Collector for AuthCaches {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let gauge = |cache: &str, v: u64| -> Option<prometheus::proto::Metric> {
            let g = prometheus::IntGauge::with_opts(
                Opts::new(self.desc.fq_name.clone(), self.desc.help.clone())
                    .const_label("cache", cache),
            )
            .ok()?;
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
            prometheus::core::Collector::collect(&g)
                .pop()
                .and_then(|mut f| f.take_metric().pop())
        };
        let mut family = prometheus::proto::MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(prometheus::proto::MetricType::GAUGE);
        family.set_metric(
            [
                gauge("tokens", self.authn.cached_tokens()),
                gauge("decisions", self.authz.cached()),
            ]
            .into_iter()
            .flatten()
            .collect(),
        );
        vec![family]
    }
}
