//! What a TLS server of this project lets the network have: every limit explicit, every
//! excess refused quickly, nothing a client sends able to end the server (docs/operations.md,
//! "Threat model"). The numbers follow kube-apiserver's generic server where it has one:
//! headers within 32 s, idle connections closed after 90 s, 400 requests in flight, 429 with
//! `Retry-After: 1` past it.
//!
//! - [`Limits`]: per server — connections (refused at accept past the cap, the socket closed
//!   at once), the TLS handshake's deadline, the request head's deadline, the idle deadline;
//!   requests and watches in flight (429 past them).
//! - [`ReviewGate`]: per process — the delegated-auth reviews a stranger's request can cause
//!   (TokenReview, SubjectAccessReview): bounded in flight and by a token bucket that never
//!   goes into debt, so a flood is answered 429 at once instead of queueing work on
//!   kube-apiserver.
//! - [`ServingMetrics`]: what the limits refused, and what a handler's panic cost.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use address_controller_runtime::client::Bucket;
use clap::Args;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A TLS handshake must finish within this (Go's `http.Server` bounds it by its read
/// deadlines; a client that opens a socket and says nothing holds it no longer).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's head must arrive within this (kube-apiserver's `ReadHeaderTimeout`).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(32);
/// A connection with no request in flight is closed after this (kube-apiserver's
/// `IdleTimeout`); a connection that never sent a request, after [`HEADER_TIMEOUT`].
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// File descriptors kept for everything but the servers' connections (the API client's
/// connections, the log, the allocator's and the runtime's own).
pub const RESERVED_FDS: u64 = 128;

/// The limits of the TLS servers (the aggregated API and `/metrics`) and of the delegated
/// auth behind them. Shared by the core and every driver.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Serving limits")]
pub struct ServingLimitArgs {
    /// Most open connections per TLS server; past it a new connection is closed at accept.
    /// Lowered at start to fit the open-file limit.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_MAX_CONNECTIONS",
        default_value_t = 1000
    )]
    pub max_connections: usize,
    /// Most requests in flight per TLS server, watches aside; past it 429 (kube-apiserver's
    /// --max-requests-inflight).
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_MAX_REQUESTS_INFLIGHT",
        default_value_t = 400
    )]
    pub max_requests_inflight: usize,
    /// Most watches open per TLS server; past it 429.
    #[arg(long, env = "ADDRESS_CONTROLLER_MAX_WATCHES", default_value_t = 2000)]
    pub max_watches: usize,
    /// Most TokenReviews and SubjectAccessReviews in flight per process; past it 429.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_AUTH_REVIEWS_INFLIGHT",
        default_value_t = 32
    )]
    pub auth_reviews_inflight: usize,
    /// Reviews per second, sustained, per process, on a client of their own (the
    /// controllers' client and the Lease's never wait for them); past it 429, no debt.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_AUTH_REVIEW_QPS",
        default_value_t = 100.0
    )]
    pub auth_review_qps: f64,
    /// Reviews the bucket saves up after a quiet spell.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_AUTH_REVIEW_BURST",
        default_value_t = 200
    )]
    pub auth_review_burst: u32,
}

impl Default for ServingLimitArgs {
    fn default() -> Self {
        ServingLimitArgs {
            max_connections: 1000,
            max_requests_inflight: 400,
            max_watches: 2000,
            auth_reviews_inflight: 32,
            auth_review_qps: 100.0,
            auth_review_burst: 200,
        }
    }
}

impl ServingLimitArgs {
    /// The limits of one server when `servers` servers share `open_files` descriptors: the
    /// connection cap is lowered so that accept never meets the open-file limit.
    pub fn limits(&self, open_files: u64, servers: u64) -> Limits {
        let fit = open_files.saturating_sub(RESERVED_FDS) / servers.max(1);
        let wanted = self.max_connections.max(1);
        let max_connections = usize::try_from(fit).map_or(wanted, |fit| wanted.min(fit.max(16)));
        if max_connections < wanted {
            tracing::warn!(
                wanted,
                max_connections,
                open_files,
                "--max-connections lowered to fit the open-file limit"
            );
        }
        Limits {
            max_connections,
            max_requests_inflight: self.max_requests_inflight.max(1),
            max_watches: self.max_watches.max(1),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            header_timeout: HEADER_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }

    pub fn review_gate(&self) -> Arc<ReviewGate> {
        Arc::new(ReviewGate::new(
            self.auth_reviews_inflight,
            self.auth_review_qps,
            self.auth_review_burst,
        ))
    }
}

/// The limits of one TLS server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_requests_inflight: usize,
    pub max_watches: usize,
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        ServingLimitArgs::default().limits(u64::MAX, 1)
    }
}

/// Requests in flight on one server: ordinary requests and watches counted apart, as
/// kube-apiserver counts long-running requests apart.
pub struct InFlight {
    requests: Arc<Semaphore>,
    watches: Arc<Semaphore>,
}

impl InFlight {
    pub fn new(limits: &Limits) -> InFlight {
        InFlight {
            requests: Arc::new(Semaphore::new(limits.max_requests_inflight)),
            watches: Arc::new(Semaphore::new(limits.max_watches)),
        }
    }

    /// A place for one request (held until its response body is done), or `None`: 429.
    pub fn admit(&self, watch: bool) -> Option<OwnedSemaphorePermit> {
        let pool = if watch { &self.watches } else { &self.requests };
        pool.clone().try_acquire_owned().ok()
    }
}

/// What one connection is doing: requests in flight and when it last started or ended one.
#[derive(Debug)]
pub struct Activity {
    born: Instant,
    busy: AtomicUsize,
    /// Milliseconds since `born` of the last start or end of a request; `u64::MAX`: none yet.
    last: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            born: Instant::now(),
            busy: AtomicUsize::new(0),
            last: AtomicU64::new(u64::MAX),
        }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// A request starts: the connection is busy until the returned guard drops.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.touch();
        Busy(self.clone())
    }

    /// When the connection is due to be closed for idleness, if nothing happens before:
    /// `None` while a request is in flight. A connection that never sent a request gets
    /// `first` (the head deadline), one that did gets `idle` from its last request.
    pub fn due(&self, first: Duration, idle: Duration) -> Option<Instant> {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        match self.last.load(Ordering::Relaxed) {
            u64::MAX => Some(self.born + first),
            ms => Some(self.born + Duration::from_millis(ms) + idle),
        }
    }
}

/// A request in flight on a connection (see [`Activity::begin`]).
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A response body that holds something (a place in flight, a busy connection) until the
/// body is done — for a watch, until the stream ends.
pub struct Holding<G> {
    inner: axum::body::Body,
    _held: G,
}

impl<G: Send + Unpin + 'static> Holding<G> {
    pub fn body(inner: axum::body::Body, held: G) -> axum::body::Body {
        axum::body::Body::new(Holding { inner, _held: held })
    }
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The budget of delegated-auth reviews of a process: at most `inflight` at once and `qps`
/// a second (burst `burst`), never in debt — a review that finds no room is not made, and
/// the request is answered 429.
#[derive(Debug)]
pub struct ReviewGate {
    inflight: Arc<Semaphore>,
    bucket: Mutex<Bucket>,
}

/// A review under way (see [`ReviewGate::enter`]).
pub type ReviewPermit = OwnedSemaphorePermit;

impl ReviewGate {
    pub fn new(inflight: usize, qps: f64, burst: u32) -> ReviewGate {
        ReviewGate {
            inflight: Arc::new(Semaphore::new(inflight.max(1))),
            bucket: Mutex::new(Bucket::new(qps, burst, Instant::now())),
        }
    }

    /// A gate that lets everything through (unit tests).
    pub fn unlimited() -> Arc<ReviewGate> {
        Arc::new(ReviewGate::new(Semaphore::MAX_PERMITS, 0.0, 1))
    }

    /// Room for one review now, or `None` (the caller answers 429). Counted in
    /// `address_controller_apiserver_refused_total{reason="reviews"}`.
    pub fn enter(&self) -> Option<ReviewPermit> {
        let permit = self.inflight.clone().try_acquire_owned().ok();
        let admitted = permit.filter(|_| {
            self.bucket
                .lock()
                .is_ok_and(|mut b| b.try_take(Instant::now()))
        });
        if admitted.is_none() {
            ServingMetrics::refused("any", "reviews");
        }
        admitted
    }
}

/// What the limits refused and what panicked, for every server of the process:
/// `address_controller_apiserver_connections{server}` (open now),
/// `address_controller_apiserver_refused_total{server, reason}` (reason `connections`,
/// `accept` (an accept error, backed off), `handshake` (failed or too slow), `idle` (closed
/// idle), `requests`, `watches`, `reviews`) and
/// `address_controller_apiserver_panics_total{server}` (a handler panicked: the request got a
/// 500, the connection and the server went on).
pub struct ServingMetrics {
    connections: IntGaugeVec,
    refused: IntCounterVec,
    panics: IntCounterVec,
}

fn serving_metrics() -> Option<&'static ServingMetrics> {
    static METRICS: OnceLock<Option<ServingMetrics>> = OnceLock::new();
    METRICS.get_or_init(|| ServingMetrics::new().ok()).as_ref()
}

impl ServingMetrics {
    fn new() -> Result<Self, prometheus::Error> {
        Ok(ServingMetrics {
            connections: IntGaugeVec::new(
                Opts::new(
                    "address_controller_apiserver_connections",
                    "Open connections of a TLS server (views, metrics)",
                ),
                &["server"],
            )?,
            refused: IntCounterVec::new(
                Opts::new(
                    "address_controller_apiserver_refused_total",
                    "Connections and requests a serving limit refused or closed, by server and reason",
                ),
                &["server", "reason"],
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
        registry.register(Box::new(m.refused.clone()))?;
        registry.register(Box::new(m.panics.clone()))
    }

    pub fn refused(server: &str, reason: &str) {
        if let Some(m) = serving_metrics() {
            m.refused.with_label_values(&[server, reason]).inc();
        }
    }

    pub fn panicked(server: &str) {
        if let Some(m) = serving_metrics() {
            m.panics.with_label_values(&[server]).inc();
        }
    }

    /// One more open connection of `server`, until the guard drops.
    pub fn open(server: &'static str) -> OpenConnection {
        if let Some(m) = serving_metrics() {
            m.connections.with_label_values(&[server]).inc();
        }
        OpenConnection(server)
    }
}

/// An open connection, counted (see [`ServingMetrics::open`]).
pub struct OpenConnection(&'static str);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(m) = serving_metrics() {
            m.connections.with_label_values(&[self.0]).dec();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_connection_cap_fits_the_open_file_limit() {
        let args = ServingLimitArgs::default();
        assert_eq!(args.limits(1 << 20, 2).max_connections, 1000);
        // 1024 descriptors, two servers: (1024 - 128) / 2.
        assert_eq!(args.limits(1024, 2).max_connections, 448);
        // Never below 16, never above what was asked.
        assert_eq!(args.limits(100, 2).max_connections, 16);
        assert_eq!(args.limits(u64::MAX, 1).max_connections, 1000);
    }

    #[test]
    fn the_review_gate_refuses_instead_of_queueing() {
        let gate = ReviewGate::new(2, 1000.0, 3);
        let a = gate.enter().unwrap();
        let b = gate.enter().unwrap();
        // Two in flight: the third is refused at once.
        assert!(gate.enter().is_none());
        drop(a);
        // Room again, and one token left of the burst of 3.
        let c = gate.enter().unwrap();
        drop((b, c));
        // The bucket is empty (3 taken) and does not go into debt: refused, not delayed.
        let slow = ReviewGate::new(10, 0.001, 2);
        assert!(slow.enter().is_some());
        assert!(slow.enter().is_some());
        assert!(slow.enter().is_none());
        assert!(slow.enter().is_none());
    }

    #[test]
    fn activity_counts_requests_and_idleness() {
        let a = Arc::new(Activity::default());
        let first = Duration::from_secs(32);
        let idle = Duration::from_secs(90);
        let never = a.due(first, idle).unwrap();
        assert!(never <= a.born + first);
        let busy = a.begin();
        assert_eq!(a.due(first, idle), None, "busy: never idle");
        drop(busy);
        let after = a.due(first, idle).unwrap();
        assert!(after >= a.born + idle, "idle counts from the request's end");
    }
}
