//! The serving side's own metrics: the delegated-auth caches' sizes, and the gauge-family
//! builder the views' collectors use too.

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
        vec![gauges(
            &self.desc,
            "cache",
            &[
                ("tokens", self.authn.cached_tokens()),
                ("decisions", self.authz.cached()),
            ],
        )]
    }
}

/// A gauge family of `desc`, one gauge per `(label value, value)`.
pub fn gauges(
    desc: &prometheus::core::Desc,
    label: &str,
    values: &[(&str, u64)],
) -> prometheus::proto::MetricFamily {
    let metric = |(v, n): &(&str, u64)| {
        let mut pair = prometheus::proto::LabelPair::default();
        pair.set_name(label.to_string());
        pair.set_value((*v).to_string());
        let mut gauge = prometheus::proto::Gauge::default();
        gauge.set_value(*n as f64);
        let mut m = prometheus::proto::Metric::default();
        m.set_label(vec![pair].into_iter().collect());
        m.set_gauge(gauge);
        m
    };
    let mut family = prometheus::proto::MetricFamily::default();
    family.set_name(desc.fq_name.clone());
    family.set_help(desc.help.clone());
    family.set_field_type(prometheus::proto::MetricType::GAUGE);
    family.set_metric(values.iter().map(metric).collect());
    family
}
