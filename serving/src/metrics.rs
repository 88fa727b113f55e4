//! The serving side's metrics, all in one place: what the servers of a process hold and
//! what the limits refused — the gauges and counters of [`ServingMetrics`], a connection's
//! state ([`ConnectionState`]) and who it is ([`Peer`]), an open connection counted by
//! both ([`OpenConnection`]); the limits, the budget and the connections all count through
//! it — the delegated-auth caches' sizes ([`AuthCaches`]), and the gauge-family builder
//! the views' collectors use too ([`gauges`]).

use std::sync::{Mutex, OnceLock};

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// Who is spending: a connection that has not proven who it is, or one that has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Unauthenticated,
    Authenticated,
}

impl Peer {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Peer::Unauthenticated => "unauthenticated",
            Peer::Authenticated => "authenticated",
        }
    }
}

/// What the servers hold and what the limits refused, for every server of the process:
/// - `address_controller_apiserver_connections{server}`: open now;
/// - `address_controller_serving_connections{server, state, peer}`: open now by state
///   (`handshaking`, `waiting` — no request completed yet —, `serving`) and peer
///   (`unauthenticated`, `authenticated`);
/// - `address_controller_serving_connection_budget{server, peer}`: the places of each;
/// - `address_controller_serving_connection_bytes{server}` and
///   `…_connection_budget_bytes{server}`: what the strangers' connections hold by their
///   stage, and their budget;
/// - `address_controller_serving_head_bytes{peer}` and `…_head_budget_bytes{peer}`: request
///   head bytes in flight, and the budget (the strangers' share; everyone's total);
/// - `address_controller_apiserver_refused_total{server, reason, peer}`: reason `evicted`
///   (a stranger closed for a newcomer), `source` (closed for a newcomer of its own source),
///   `connections` (the proven's places full), `memory` (the head budget), `accept` (an
///   accept error, backed off), `handshake` (failed or too slow), `idle`, `reviews`;
/// - `address_controller_apiserver_panics_total{server}`: a handler panicked (answered 500;
///   the connection and the server went on).
pub struct ServingMetrics {
    connections: IntGaugeVec,
    by_state: IntGaugeVec,
    caps: IntGaugeVec,
    stranger_bytes: IntGaugeVec,
    stranger_budget: IntGaugeVec,
    head_bytes: IntGaugeVec,
    head_budget: IntGaugeVec,
    refused: IntCounterVec,
    panics: IntCounterVec,
}

fn serving_metrics() -> Option<&'static ServingMetrics> {
    static METRICS: OnceLock<Option<ServingMetrics>> = OnceLock::new();
    METRICS.get_or_init(|| ServingMetrics::new().ok()).as_ref()
}

/// A connection's state, as the gauges name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    Handshaking,
    /// Accepted (and its handshake done), no request completed yet.
    Waiting,
    Serving,
}

impl ConnectionState {
    fn label(self) -> &'static str {
        match self {
            ConnectionState::Handshaking => "handshaking",
            ConnectionState::Waiting => "waiting",
            ConnectionState::Serving => "serving",
        }
    }
}

impl ServingMetrics {
    fn new() -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels)
        };
        Ok(ServingMetrics {
            connections: gauge(
                "address_controller_apiserver_connections",
                "Open connections of a server (views, metrics, probes)",
                &["server"],
            )?,
            by_state: gauge(
                "address_controller_serving_connections",
                "Open connections of a server by state (handshaking, waiting, serving) and peer (unauthenticated, authenticated)",
                &["server", "state", "peer"],
            )?,
            caps: gauge(
                "address_controller_serving_connection_budget",
                "Connections a server holds at most, by peer (strangers past theirs close their oldest)",
                &["server", "peer"],
            )?,
            stranger_bytes: gauge(
                "address_controller_serving_connection_bytes",
                "Bytes the strangers' connections of a server hold, each by its stage (silent, handshaking, open)",
                &["server"],
            )?,
            stranger_budget: gauge(
                "address_controller_serving_connection_budget_bytes",
                "The bytes a server's strangers' connections may hold (past it the stalest is closed)",
                &["server"],
            )?,
            head_bytes: gauge(
                "address_controller_serving_head_bytes",
                "Bytes of request heads in flight (being received or being served), by peer",
                &["peer"],
            )?,
            head_budget: gauge(
                "address_controller_serving_head_budget_bytes",
                "The head bytes a peer class may hold: the strangers' share, everyone's total",
                &["peer"],
            )?,
            refused: IntCounterVec::new(
                Opts::new(
                    "address_controller_apiserver_refused_total",
                    "Connections and requests a serving limit refused or closed, by server, reason and peer",
                ),
                &["server", "reason", "peer"],
            )?,
            panics: IntCounterVec::new(
                Opts::new(
                    "address_controller_apiserver_panics_total",
                    "Requests whose handler panicked (answered 500; the server went on)",
                ),
                &["server"],
            )?,
        })
    }

    /// Registers the serving metrics on `registry` (once per process).
    pub fn register(registry: &Registry) -> Result<(), prometheus::Error> {
        let m = serving_metrics().ok_or_else(|| {
            prometheus::Error::Msg("the serving metrics could not be created".into())
        })?;
        registry.register(Box::new(m.connections.clone()))?;
        registry.register(Box::new(m.by_state.clone()))?;
        registry.register(Box::new(m.caps.clone()))?;
        registry.register(Box::new(m.stranger_bytes.clone()))?;
        registry.register(Box::new(m.stranger_budget.clone()))?;
        registry.register(Box::new(m.head_bytes.clone()))?;
        registry.register(Box::new(m.head_budget.clone()))?;
        registry.register(Box::new(m.refused.clone()))?;
        registry.register(Box::new(m.panics.clone()))
    }

    /// One refusal by `server` for `reason` of a `peer`.
    pub fn refused(server: &str, reason: &str, peer: Peer) {
        if let Some(m) = serving_metrics() {
            m.refused
                .with_label_values(&[server, reason, peer.label()])
                .inc();
        }
    }

    pub fn panicked(server: &str) {
        if let Some(m) = serving_metrics() {
            m.panics.with_label_values(&[server]).inc();
        }
    }

    pub(crate) fn head_bytes(peer: Peer, delta: i64) {
        if let Some(m) = serving_metrics() {
            m.head_bytes.with_label_values(&[peer.label()]).add(delta);
        }
    }

    pub(crate) fn head_budget(strangers: usize, total: usize) {
        if let Some(m) = serving_metrics() {
            let set = |peer: Peer, n: usize| {
                m.head_budget
                    .with_label_values(&[peer.label()])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            };
            set(Peer::Unauthenticated, strangers);
            set(Peer::Authenticated, total);
        }
    }

    /// A server's caps: the strangers' and the proven's places, the strangers' bytes.
    pub(crate) fn connection_caps(server: &str, strangers: usize, proven: usize, bytes: usize) {
        if let Some(m) = serving_metrics() {
            for (peer, n) in [
                (Peer::Unauthenticated, strangers),
                (Peer::Authenticated, proven),
            ] {
                m.caps
                    .with_label_values(&[server, peer.label()])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            m.stranger_budget
                .with_label_values(&[server])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn stranger_bytes(server: &str, bytes: usize) {
        if let Some(m) = serving_metrics() {
            m.stranger_bytes
                .with_label_values(&[server])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// One more open connection of `server`, handshaking as a stranger, until the guard
    /// drops; [`OpenConnection::set`] moves it between states.
    pub fn open(server: &'static str) -> OpenConnection {
        let at = (ConnectionState::Handshaking, Peer::Unauthenticated);
        if let Some(m) = serving_metrics() {
            m.connections.with_label_values(&[server]).inc();
            m.by_state
                .with_label_values(&[server, at.0.label(), at.1.label()])
                .inc();
        }
        OpenConnection {
            server,
            at: Mutex::new(at),
        }
    }
}

/// An open connection, counted by state (see [`ServingMetrics::open`]).
#[derive(Debug)]
pub struct OpenConnection {
    server: &'static str,
    at: Mutex<(ConnectionState, Peer)>,
}

impl OpenConnection {
    /// The connection is in `state` as `peer` now.
    pub fn set(&self, state: ConnectionState, peer: Peer) {
        let mut at = self
            .at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *at == (state, peer) {
            return;
        }
        if let Some(m) = serving_metrics() {
            m.by_state
                .with_label_values(&[self.server, at.0.label(), at.1.label()])
                .dec();
            m.by_state
                .with_label_values(&[self.server, state.label(), peer.label()])
                .inc();
        }
        *at = (state, peer);
    }

    /// Its state now.
    pub fn state(&self) -> ConnectionState {
        self.at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(m) = serving_metrics() {
            let at = *self
                .at
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            m.connections.with_label_values(&[self.server]).dec();
            m.by_state
                .with_label_values(&[self.server, at.0.label(), at.1.label()])
                .dec();
        }
    }
}

/// How many entries a cache holds now, read at scrape time.
pub type CacheSize = Box<dyn Fn() -> u64 + Send + Sync>;

/// The delegated-auth caches' sizes, read at scrape time:
/// `address_controller_apiserver_auth_cache_entries{cache="tokens"|"decisions"}`.
pub struct AuthCaches {
    tokens: CacheSize,
    decisions: CacheSize,
    desc: prometheus::core::Desc,
}

impl AuthCaches {
    pub fn new(tokens: CacheSize, decisions: CacheSize) -> Result<AuthCaches, prometheus::Error> {
        let desc = prometheus::core::Desc::new(
            "address_controller_apiserver_auth_cache_entries".into(),
            "Entries in the delegated authentication (tokens) and authorization (decisions) caches; bounded by --auth-cache-size".into(),
            vec!["cache".into()],
            Default::default(),
        )?;
        Ok(AuthCaches {
            tokens,
            decisions,
            desc,
        })
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
                ("tokens", (self.tokens)()),
                ("decisions", (self.decisions)()),
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
