//! What a server of this project lets the network have: every limit explicit, every excess
//! refused quickly, nothing a client sends able to end the server or take the process past
//! its memory (docs/operations.md, "Threat model"; docs/design.md, "Before it knows who is
//! calling"). The numbers follow kube-apiserver's generic server where it has one: headers
//! within 32 s, idle connections closed after 90 s, 400 requests in flight, 429 with
//! `Retry-After: 1` past it.
//!
//! - [`ServerLimits`]: per server — the connections of strangers and of the proven
//!   ([`crate::connections`]), the deadlines of each, the request head's size for each;
//!   requests and watches in flight (429 past them).
//! - [`crate::budget::HeadBudget`]: per process — the bytes of request heads in flight.
//! - [`ReviewGate`]: per process — the delegated-auth reviews a stranger's request can cause
//!   (TokenReview, SubjectAccessReview): bounded in flight and by a token bucket that never
//!   goes into debt, so a flood is answered 429 at once instead of queueing work on
//!   kube-apiserver.
//! - [`crate::metrics::ServingMetrics`]: connections by state, head bytes in flight, what the limits
//!   refused, and what a handler's panic cost.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use address_controller_runtime::client::Bucket;
use clap::Args;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::budget::HeadBudget;
use crate::connections::{ConnectionCaps, Stage};
use crate::metrics::{Peer, ServingMetrics};

/// A TLS handshake must finish within this (Go's `http.Server` bounds it by its read
/// deadlines); a client that opens a socket and says nothing holds it no longer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection that has not proven who it is must send a whole request head within this of
/// its accept or of its last request, or it is closed.
pub const STRANGER_TIMEOUT: Duration = Duration::from_secs(10);
/// A proven connection's request head must arrive within this (kube-apiserver's
/// `ReadHeaderTimeout`).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(32);
/// A proven connection with no request in flight is closed after this (kube-apiserver's
/// `IdleTimeout`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// File descriptors kept for everything but the servers' connections (the API client's
/// connections, the log, the allocator's and the runtime's own).
pub const RESERVED_FDS: u64 = 128;
/// The most bytes of a proven connection's request head, as kube-apiserver's
/// `MaxHeaderBytes` (1 MiB): a 10,500-value selector through the aggregator is about 42 KiB.
pub const PROVEN_HEADER_BYTES: usize = 1 << 20;
/// The memory the serving budgets are sized from when the container has no limit and no
/// flag gives one: the chart's default limit.
pub const DEFAULT_MEMORY: u64 = 512 << 20;
/// The share of the memory limit the strangers' connections of all TLS servers may hold,
/// each by what it holds in its stage ([`crate::connections::Stage`]): an eighth. At the
/// chart's 512Mi and two TLS servers, 32 MiB each: about 2,900 idle sockets or 1,000
/// handshaken connections a server.
pub const CONNECTION_SHARE: u64 = 8;
/// A source address may hold this fraction of a server's strangers' bytes: a quarter.
pub const SOURCE_SHARE: usize = 4;

/// The limits of the servers (the aggregated API, `/metrics`, the probes) and of the
/// delegated auth behind them. Shared by the core and every driver.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Serving limits")]
pub struct ServingLimitArgs {
    /// Most connections per TLS server that have proven who they are (the aggregator's
    /// front-proxy certificate, a reviewed bearer token). Strangers never take these places.
    /// Lowered at start to fit the open-file limit.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_MAX_CONNECTIONS",
        default_value_t = 1000
    )]
    pub max_connections: usize,
    /// Of --max-connections, places only the aggregator's front-proxy certificate may take.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_FRONT_PROXY_CONNECTIONS",
        default_value_t = 32
    )]
    pub front_proxy_connections: usize,
    /// Most connections per TLS server that have not proven who they are; past it the
    /// stalest of them is closed for the newcomer (never the newcomer refused). Lowered at
    /// start to fit the open-file limit. What binds first is their bytes: an eighth of
    /// --memory-limit across the TLS servers, each connection by what it holds.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_MAX_UNAUTHENTICATED_CONNECTIONS",
        default_value_t = 10_000
    )]
    pub max_unauthenticated_connections: usize,
    /// Of those, most from one source address (which may also hold only a quarter of
    /// their bytes); past it that source's stalest is closed.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_MAX_CONNECTIONS_PER_SOURCE",
        default_value_t = 1000
    )]
    pub max_connections_per_source: usize,
    /// Most bytes of a request head on a connection that has not proven who it is at its
    /// handshake (431 past it); the aggregator's connections take kube-apiserver's 1 MiB.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_MAX_UNAUTHENTICATED_HEADER_BYTES",
        default_value = "64Ki",
        value_parser = parse_bytes
    )]
    pub max_unauthenticated_header_bytes: u64,
    /// The memory the serving budgets are sized from, in bytes (or with Ki, Mi, Gi): an
    /// eighth of it for request heads in flight, half of that for strangers. Default: the
    /// container's cgroup limit, else 512Mi. The chart passes the pod's limit.
    #[arg(long, env = "ADDRESS_CONTROLLER_MEMORY_LIMIT", value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
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
    /// Most TokenReviews and SubjectAccessReviews in flight per process and lane (strangers'
    /// tokens; proven callers); past it 429.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_AUTH_REVIEWS_INFLIGHT",
        default_value_t = 32
    )]
    pub auth_reviews_inflight: usize,
    /// Reviews per second, sustained, per process and lane, on a client of their own (the
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

/// A byte count as a flag or the downward API spells it: `536870912`, `512Mi`, `1G`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 536870912 or 512Mi)"))?;
    let factor: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000 * 1000,
        "G" => 1000 * 1000 * 1000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (Ki, Mi, Gi, K, M, G)"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is too large"))
}

impl Default for ServingLimitArgs {
    fn default() -> Self {
        ServingLimitArgs {
            max_connections: 1000,
            front_proxy_connections: 32,
            max_unauthenticated_connections: 10_000,
            max_connections_per_source: 1000,
            max_unauthenticated_header_bytes: 64 << 10,
            memory_limit: None,
            max_requests_inflight: 400,
            max_watches: 2000,
            auth_reviews_inflight: 32,
            auth_review_qps: 100.0,
            auth_review_burst: 200,
        }
    }
}

impl ServingLimitArgs {
    /// The memory the budgets are sized from: the flag, else the container's limit, else
    /// [`DEFAULT_MEMORY`].
    pub fn memory(&self) -> u64 {
        self.memory_limit
            .or_else(address_controller_runtime::process::memory_limit)
            .unwrap_or(DEFAULT_MEMORY)
    }

    /// The process's head budget, sized from [`Self::memory`].
    pub fn head_budget(&self) -> Arc<HeadBudget> {
        let memory = self.memory();
        tracing::info!(memory, "serving budgets sized from the memory limit");
        HeadBudget::sized(memory)
    }

    /// The limits of one TLS server when `servers` servers share `open_files` descriptors:
    /// the connection caps are lowered so that accept never meets the open-file limit (half
    /// the room for each kind), and the strangers' connections given an eighth of the
    /// memory limit across the servers, in bytes ([`CONNECTION_SHARE`]).
    pub fn limits(&self, open_files: u64, servers: u64) -> ServerLimits {
        let servers = servers.max(1);
        let fit = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let probes = u64::try_from(ServerLimits::probes(open_files).connections.strangers)
            .unwrap_or(u64::MAX);
        let room = fit(open_files
            .saturating_sub(RESERVED_FDS)
            .saturating_sub(probes)
            / servers);
        let stranger_bytes = fit(self.memory() / CONNECTION_SHARE / servers);
        let proven = self.max_connections.max(1).min((room / 2).max(8));
        let strangers = self
            .max_unauthenticated_connections
            .max(1)
            .min((room - room.min(proven)).max(8));
        if proven < self.max_connections || strangers < self.max_unauthenticated_connections {
            tracing::info!(
                proven,
                strangers,
                open_files,
                memory = self.memory(),
                "connection caps fitted to the open-file and memory limits"
            );
        }
        ServerLimits {
            connections: ConnectionCaps {
                strangers,
                per_source: self.max_connections_per_source.max(1).min(strangers),
                stranger_bytes,
                per_source_bytes: stranger_bytes / SOURCE_SHARE,
                proven,
                front_proxy_reserved: self.front_proxy_connections.min(proven),
            },
            stranger_header_bytes: usize::try_from(self.max_unauthenticated_header_bytes)
                .unwrap_or(usize::MAX)
                .clamp(MIN_HEADER_BYTES, PROVEN_HEADER_BYTES),
            ..ServerLimits::default()
        }
        .with_inflight(self.max_requests_inflight, self.max_watches)
    }

    pub fn review_gate(&self) -> Arc<ReviewGate> {
        Arc::new(ReviewGate::new(
            self.auth_reviews_inflight,
            self.auth_review_qps,
            self.auth_review_burst,
        ))
    }
}

/// The smallest head limit a server takes (hyper's HTTP/1.1 read buffer cannot be smaller).
pub const MIN_HEADER_BYTES: usize = 8 << 10;

/// The limits of one server.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub connections: ConnectionCaps,
    pub max_requests_inflight: usize,
    pub max_watches: usize,
    pub handshake_timeout: Duration,
    /// A stranger's: its first request head, and its idleness after a request.
    pub stranger_timeout: Duration,
    /// A proven connection's request head.
    pub header_timeout: Duration,
    /// A proven connection's idleness.
    pub idle_timeout: Duration,
    pub stranger_header_bytes: usize,
    pub proven_header_bytes: usize,
    /// HTTP/2 streams open at once on a stranger's connection (the proven: hyper's 200).
    pub stranger_streams: u32,
    /// Only HTTP/1.1 (the plain probe port).
    pub http1_only: bool,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            connections: ConnectionCaps {
                strangers: 10_000,
                per_source: 1000,
                stranger_bytes: (DEFAULT_MEMORY / CONNECTION_SHARE / 2) as usize,
                per_source_bytes: (DEFAULT_MEMORY / CONNECTION_SHARE / 2) as usize / SOURCE_SHARE,
                proven: 1000,
                front_proxy_reserved: 32,
            },
            max_requests_inflight: 400,
            max_watches: 2000,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            stranger_timeout: STRANGER_TIMEOUT,
            header_timeout: HEADER_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            stranger_header_bytes: 64 << 10,
            proven_header_bytes: PROVEN_HEADER_BYTES,
            stranger_streams: 16,
            http1_only: false,
        }
    }
}

impl ServerLimits {
    fn with_inflight(mut self, requests: usize, watches: usize) -> Self {
        self.max_requests_inflight = requests.max(1);
        self.max_watches = watches.max(1);
        self
    }

    /// The plain probe port's: everyone is a stranger there (kubelet probes are anonymous),
    /// so only the strangers' places, per source as everywhere (a flooding pod closes its
    /// own connections, never the kubelet's), heads of 8 KiB, 5 s to send one.
    /// Fitted to `open_files` (an eighth of them at most), each place open.
    pub fn probes(open_files: u64) -> ServerLimits {
        let strangers = usize::try_from(open_files / 8).map_or(256, |n| n.clamp(8, 256));
        let per_source = strangers.min(32);
        ServerLimits {
            connections: ConnectionCaps {
                strangers,
                per_source,
                stranger_bytes: strangers * Stage::Open.bytes(),
                per_source_bytes: per_source * Stage::Open.bytes(),
                proven: 0,
                front_proxy_reserved: 0,
            },
            max_requests_inflight: 64,
            max_watches: 1,
            stranger_timeout: Duration::from_secs(5),
            stranger_header_bytes: MIN_HEADER_BYTES,
            stranger_streams: 1,
            http1_only: true,
            ..ServerLimits::default()
        }
    }
}

/// Requests in flight on one server: ordinary requests and watches counted apart, as
/// kube-apiserver counts long-running requests apart.
pub struct InFlight {
    requests: Arc<Semaphore>,
    watches: Arc<Semaphore>,
}

impl InFlight {
    pub fn new(limits: &ServerLimits) -> InFlight {
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

/// A response body that keeps guards (a place in flight, a busy connection) until the
/// body is done — for a watch, until the stream ends.
pub struct GuardedBody<G> {
    inner: axum::body::Body,
    _held: G,
}

impl<G: Send + Unpin + 'static> GuardedBody<G> {
    pub fn wrap(inner: axum::body::Body, held: G) -> axum::body::Body {
        axum::body::Body::new(GuardedBody { inner, _held: held })
    }
}

impl<G: Unpin> http_body::Body for GuardedBody<G> {
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
/// the request is answered 429. Two lanes, each with that budget: the strangers' (a token
/// never accepted before) and the proven callers' (a token accepted before, whose cached
/// answer expired; an authenticated user's access reviews). A flood of made-up tokens
/// empties only its own lane: a scraper whose token is re-reviewed mid-flood is not
/// refused (it was, one time in a full suite: a limit the strangers could fill was a lock).
#[derive(Debug)]
pub struct ReviewGate {
    strangers: Lane,
    proven: Lane,
}

#[derive(Debug)]
struct Lane {
    inflight: Arc<Semaphore>,
    bucket: Mutex<Bucket>,
}

impl Lane {
    fn new(inflight: usize, qps: f64, burst: u32) -> Lane {
        Lane {
            inflight: Arc::new(Semaphore::new(inflight.max(1))),
            bucket: Mutex::new(Bucket::new(qps, burst, Instant::now())),
        }
    }

    fn enter(&self) -> Option<ReviewPermit> {
        let permit = self.inflight.clone().try_acquire_owned().ok();
        permit.filter(|_| {
            self.bucket
                .lock()
                .is_ok_and(|mut b| b.try_take(Instant::now()))
        })
    }
}

/// A review under way (see [`ReviewGate::enter`]).
pub type ReviewPermit = OwnedSemaphorePermit;

impl ReviewGate {
    pub fn new(inflight: usize, qps: f64, burst: u32) -> ReviewGate {
        ReviewGate {
            strangers: Lane::new(inflight, qps, burst),
            proven: Lane::new(inflight, qps, burst),
        }
    }

    /// A gate that lets everything through (unit tests).
    pub fn unlimited() -> Arc<ReviewGate> {
        Arc::new(ReviewGate::new(Semaphore::MAX_PERMITS, 0.0, 1))
    }

    /// Room for one review of a request of `peer` now, in its lane (`Authenticated`: a
    /// proven caller's), or `None` (the caller answers 429). Counted in
    /// `address_controller_apiserver_refused_total{reason="reviews"}`.
    pub fn enter(&self, peer: Peer) -> Option<ReviewPermit> {
        let lane = match peer {
            Peer::Unauthenticated => &self.strangers,
            Peer::Authenticated => &self.proven,
        };
        let admitted = lane.enter();
        if admitted.is_none() {
            ServingMetrics::refused("any", "reviews", peer);
        }
        admitted
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_connection_caps_fit_the_open_file_and_memory_limits() {
        let caps = |args: &ServingLimitArgs, fds, servers| {
            let c = args.limits(fds, servers).connections;
            (c.proven, c.strangers)
        };
        let big = ServingLimitArgs {
            memory_limit: Some(4 << 30),
            ..ServingLimitArgs::default()
        };
        assert_eq!(caps(&big, 1 << 20, 2), (1000, 10_000));
        // 1024 descriptors: 128 kept, 128 for the probes, half of each server's 384 for
        // the proven, the rest for strangers.
        assert_eq!(caps(&big, 1024, 2), (192, 192));
        // Never below 8 of each.
        assert_eq!(caps(&big, 100, 2), (8, 8));
        // 512Mi: the strangers' connections of two servers hold at most an eighth of it,
        // in bytes — 2,978 silent sockets or 1,024 open connections a server — and a
        // source a quarter of a server's.
        let chart = ServingLimitArgs {
            memory_limit: Some(512 << 20),
            ..ServingLimitArgs::default()
        };
        let c = chart.limits(1 << 20, 2).connections;
        assert_eq!((c.stranger_bytes, c.per_source_bytes), (32 << 20, 8 << 20));
        assert_eq!(c.stranger_bytes / Stage::Silent.bytes(), 2978);
        assert_eq!(c.stranger_bytes / Stage::Open.bytes(), 1024);
        assert_eq!(
            chart.limits(1 << 20, 1).connections.stranger_bytes,
            64 << 20
        );
        // The probes: 256 at most, an eighth of the descriptors.
        assert_eq!(ServerLimits::probes(1 << 20).connections.strangers, 256);
        assert_eq!(ServerLimits::probes(256).connections.strangers, 32);
    }

    #[test]
    fn byte_counts_parse_as_the_downward_api_and_people_spell_them() {
        assert_eq!(parse_bytes("536870912"), Ok(512 << 20));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert!(parse_bytes("12Qi").is_err());
        assert!(parse_bytes("Mi").is_err());
        assert!(parse_bytes("99999999999999999999Gi").is_err());
    }

    #[test]
    fn the_review_gate_refuses_instead_of_queueing() {
        let gate = ReviewGate::new(2, 1000.0, 3);
        let a = gate.enter(Peer::Unauthenticated).unwrap();
        let b = gate.enter(Peer::Unauthenticated).unwrap();
        // Two in flight: the third is refused at once.
        assert!(gate.enter(Peer::Unauthenticated).is_none());
        drop(a);
        // Room again, and one token left of the burst of 3.
        let c = gate.enter(Peer::Unauthenticated).unwrap();
        drop((b, c));
        // The bucket is empty (3 taken) and does not go into debt: refused, not delayed.
        let slow = ReviewGate::new(10, 0.001, 2);
        assert!(slow.enter(Peer::Unauthenticated).is_some());
        assert!(slow.enter(Peer::Unauthenticated).is_some());
        assert!(slow.enter(Peer::Unauthenticated).is_none());
        assert!(slow.enter(Peer::Unauthenticated).is_none());
    }

    #[test]
    fn strangers_emptying_their_lane_leave_the_proven_callers_theirs() {
        let gate = ReviewGate::new(2, 0.001, 2);
        let held: Vec<_> = (0..2)
            .map(|_| gate.enter(Peer::Unauthenticated).unwrap())
            .collect();
        assert!(gate.enter(Peer::Unauthenticated).is_none(), "full");
        drop(held);
        assert!(
            gate.enter(Peer::Unauthenticated).is_none(),
            "the bucket empty"
        );
        // A proven caller's review has its own lane, with the same budget.
        let proven: Vec<_> = (0..2)
            .map(|_| gate.enter(Peer::Authenticated).unwrap())
            .collect();
        assert!(gate.enter(Peer::Authenticated).is_none());
        drop(proven);
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
