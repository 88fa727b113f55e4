//! Every server of a process — the views and `/metrics` over TLS, the probes in plain HTTP
//! — accepts and serves its connections here, within its [`ServerLimits`] and the process's
//! [`HeadBudget`]:
//!
//! - **accept never refuses**: each connection takes a stranger's place at the server's
//!   [`Door`], costed by its [`Stage`] as it progresses (the stranger longest without
//!   progress, or its source's, closed when the budget is full); an accept
//!   error (out of descriptors, a reset before accept) is backed off as Go's `net/http`
//!   does, never fatal;
//! - **the handshake's bytes and every request head are metered** ([`crate::head_bytes`]) against
//!   the head budget, a stranger's within its share: past it that stranger's connection is
//!   closed;
//! - **the aggregator is known at the handshake** (its front-proxy certificate verified
//!   then, [`Identify`]), a token's bearer after its review ([`Connection::prove`]; the
//!   request that carries it leaves the strangers before the review): from
//!   then on the connection holds a proven place, its heads may be as long as
//!   kube-apiserver's 1 MiB, and it keeps kube-apiserver's deadlines (32 s for a head, 90 s
//!   idle); a stranger's heads are held to a smaller limit, its HTTP/2 to fewer streams and
//!   smaller windows, and it has 5 s for its handshake and 10 s for each request head;
//! - a handler that panics answers 500 (counted) and the connection goes on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::response::IntoResponse;
use futures::FutureExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::ServiceExt;

use crate::authn::PeerCerts;
use crate::budget::{Floor, HeadBudget, Held, STRANGER_FLOOR};
use crate::connections::{Door, Place, Proof, Stage};
use crate::head_bytes::{Account, Framing, Metered};
use crate::limits::{Activity, GuardedBody, ServerLimits};
use crate::metrics::{ConnectionState, OpenConnection, Peer, ServingMetrics};
use crate::status::ApiError;

/// What a server speaks.
#[derive(Clone)]
pub enum Transport {
    Tls(Arc<rustls::ServerConfig>),
    /// Plain HTTP/1.1 (the probe port).
    Plain,
}

/// Whether a TLS peer's client certificate is the aggregator's (checked at the handshake).
pub type Identify = Arc<dyn Fn(&PeerCerts) -> bool + Send + Sync>;

/// One server.
pub struct Listen {
    pub addr: SocketAddr,
    /// Its name in the logs and metrics.
    pub server: &'static str,
    pub transport: Transport,
    pub limits: ServerLimits,
    pub budget: Arc<HeadBudget>,
    pub identify: Option<Identify>,
    /// At shutdown, wait for the open connections to close (the supervisor's grace bounds
    /// the wait): kube-apiserver's connection to the views keeps being answered while the
    /// endpoint goes.
    pub drain: bool,
}

/// What the connections of one server share.
struct Server {
    name: &'static str,
    limits: ServerLimits,
    budget: Arc<HeadBudget>,
    identify: Option<Identify>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
}

/// Serves `app` on `listen.addr` until `shutdown` resolves; then stops accepting and, with
/// `drain`, returns once the connections it has are closed. Nothing a client does ends it.
pub async fn serve(
    listen: Listen,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let Listen {
        addr,
        server: name,
        transport,
        limits,
        budget,
        identify,
        drain,
    } = listen;
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot listen");
            return Err(e);
        }
    };
    let caps = limits.connections;
    tracing::info!(
        %addr,
        server = name,
        tls = matches!(transport, Transport::Tls(_)),
        strangers = caps.strangers,
        per_source = caps.per_source,
        stranger_bytes = caps.stranger_bytes,
        proven = caps.proven,
        "listening"
    );
    let door = Door::new(name, caps);
    let server = Arc::new(Server {
        name,
        limits,
        budget,
        identify,
        acceptor: match transport {
            Transport::Tls(config) => Some(tokio_rustls::TlsAcceptor::from(config)),
            Transport::Plain => None,
        },
        app,
    });
    tokio::pin!(shutdown);
    // The connections open: each holds a clone while it is served.
    let (open, mut counted) = tokio::sync::watch::channel(());
    let mut backoff = Duration::ZERO;
    loop {
        // After an accept error, the next accept waits: Go's net/http backs off 5 ms,
        // doubling, at most 1 s; the listener stays.
        let accept = async {
            if !backoff.is_zero() {
                tokio::time::sleep(backoff).await;
            }
            listener.accept().await
        };
        let accepted = tokio::select! {
            r = accept => r,
            _ = &mut shutdown => break,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => {
                backoff = Duration::ZERO;
                a
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                ServingMetrics::refused(name, "accept", Peer::Unauthenticated);
                tracing::warn!(%addr, server = name, error = %e, retry_in = ?backoff, "accept failed");
                continue;
            }
        };
        let place = door.enter(remote.ip(), Some(std::os::fd::AsRawFd::as_raw_fd(&tcp)));
        // As Go's net/http does: without it, several small watch events written back to
        // back on kube-apiserver's one HTTP/2 connection wait for a delayed ACK (~40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "TCP_NODELAY");
        }
        let serving = open.clone();
        let server = server.clone();
        tokio::spawn(async move {
            connection(tcp, remote, place, &server).await;
            drop(serving);
        });
    }
    // Refused from now on, not queued by the kernel for nobody.
    drop(listener);
    drop(open);
    if drain {
        tracing::info!(%addr, "draining the open connections");
        let _ = counted.changed().await;
    }
    Ok(())
}

/// One connection, from its accept to its close.
async fn connection(
    tcp: tokio::net::TcpStream,
    remote: SocketAddr,
    place: Arc<Place>,
    server: &Arc<Server>,
) {
    let floor = Floor::new(STRANGER_FLOOR);
    let conn = Arc::new(Connection {
        place,
        open: ServingMetrics::open(server.name),
        wire: Mutex::new(Held::new(server.budget.clone(), floor.clone())),
        floor,
        framing: Mutex::new(Framing::default()),
        handshaking: AtomicBool::new(true),
        tls: server.acceptor.is_some(),
        stage: AtomicU8::new(Stage::Silent as u8),
        budget: server.budget.clone(),
        server: server.name,
        activity: Arc::new(Activity::default()),
    });
    let Some(acceptor) = &server.acceptor else {
        conn.handshake_done();
        let io = Metered::plaintext(tcp, conn.clone());
        serve_connection(io, conn, PeerCerts::default(), remote, server).await;
        return;
    };
    let handshake = tokio::time::timeout(
        server.limits.handshake_timeout,
        acceptor.accept(Metered::below_tls(tcp, conn.clone())),
    );
    let tls = tokio::select! {
        r = handshake => match r {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                ServingMetrics::refused(server.name, "handshake", Peer::Unauthenticated);
                tracing::debug!(%remote, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                ServingMetrics::refused(server.name, "handshake", Peer::Unauthenticated);
                tracing::debug!(%remote, "TLS handshake timed out");
                return;
            }
        },
        () = conn.place.closed() => return,
    };
    let peer = PeerCerts(
        tls.get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    );
    conn.handshake_done();
    if server.identify.as_ref().is_some_and(|is| is(&peer)) {
        conn.prove(Proof::FrontProxy);
    }
    let io = Metered::plaintext(tls, conn.clone());
    serve_connection(io, conn, peer, remote, server).await;
}

/// A connection as its requests see it (a request extension, `Arc<Connection>`): who it is
/// to the budgets, and [`Connection::prove`] for authentication to say it proved who it is.
pub struct Connection {
    place: Arc<Place>,
    open: OpenConnection,
    /// Head bytes read and not yet a request (the handshake's, while it lasts).
    wire: Mutex<Held>,
    /// What is left of its own allowance while it is a stranger.
    floor: Arc<Floor>,
    framing: Mutex<Framing>,
    handshaking: AtomicBool,
    /// Over TLS (its handshake done before any request).
    tls: bool,
    /// The furthest [`Stage`] it reached, so that the door hears of each once.
    stage: AtomicU8,
    budget: Arc<HeadBudget>,
    server: &'static str,
    activity: Arc<Activity>,
}

impl Connection {
    /// The connection proved who it is: it moves to the proven's places (when there is
    /// room) and the authenticated's budget.
    pub fn prove(&self, proof: Proof) {
        if self.place.prove(proof) {
            self.open.set(self.open.state(), Peer::Authenticated);
        }
    }

    /// The connection's request proved nothing (no token, or one refused or not
    /// reviewed): if it presented one, it goes back among the strangers.
    pub fn settle(&self) {
        self.place.settle();
    }

    pub fn peer(&self) -> Peer {
        self.place.peer()
    }

    /// The connection reached `stage`: the door hears of it the first time.
    fn reached(&self, stage: Stage) {
        if self.stage.fetch_max(stage as u8, Ordering::AcqRel) < stage as u8 {
            self.place.progress(stage);
        }
    }

    fn handshake_done(&self) {
        self.handshaking.store(false, Ordering::Release);
        if self.tls {
            self.reached(Stage::Open);
        }
        lock(&self.wire).release();
        self.open.set(ConnectionState::Waiting, self.peer());
    }

    /// A request head arrived whole: progress for a stranger; and a TLS connection whose
    /// request carries a bearer token leaves the strangers before its review
    /// ([`Place::present`]).
    fn head_arrived(&self, bearer: bool) {
        if bearer && self.tls {
            self.place.present();
        }
        self.place.progress(Stage::Open);
    }

    /// A request was dispatched with a head of `bytes`: what it holds until its response
    /// is done — an HTTP/1.1 head in flight becomes it as it was counted; an HTTP/2 header
    /// block (given back at its END_HEADERS) is taken again, decoded. `None`: the budget
    /// refused it.
    fn dispatched(&self, bytes: usize) -> Option<Held> {
        self.open.set(ConnectionState::Serving, self.peer());
        if lock(&self.framing).heads_end_at_dispatch() {
            return Some(lock(&self.wire).hand_over());
        }
        let mut held = Held::new(self.budget.clone(), self.floor.clone());
        let peer = self.peer();
        if held.take(bytes, peer) {
            Some(held)
        } else {
            ServingMetrics::refused(self.server, "memory", peer);
            None
        }
    }

    /// When the connection is to be closed for idleness, by the deadlines of who it is.
    fn due(&self, limits: &ServerLimits) -> Option<Instant> {
        match self.peer() {
            Peer::Unauthenticated => self
                .activity
                .due(limits.stranger_timeout, limits.stranger_timeout),
            Peer::Authenticated => self
                .activity
                .due(limits.header_timeout, limits.idle_timeout),
        }
    }
}

impl Account for Connection {
    fn read(&self, bytes: &[u8], below_tls: bool) -> bool {
        let peer = self.peer();
        let taken = if below_tls {
            // The handshake's bytes are a stranger's until it ends; after it, the TLS
            // layer's reads are metered above it.
            if !self.handshaking.load(Ordering::Acquire) {
                return true;
            }
            self.reached(Stage::Handshaking);
            lock(&self.wire).take(bytes.len(), Peer::Unauthenticated)
        } else {
            self.reached(Stage::Open);
            let fed = lock(&self.framing).feed(bytes);
            let mut wire = lock(&self.wire);
            if fed.completed {
                wire.release();
                wire.take(fed.open, peer)
            } else {
                wire.take(fed.head, peer)
            }
        };
        if !taken {
            ServingMetrics::refused(self.server, "memory", peer);
            tracing::debug!(
                server = self.server,
                ?peer,
                "a head refused: the head budget is spent"
            );
        }
        taken
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a request presents a bearer token (which authentication reviews).
fn has_bearer(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes().starts_with(b"Bearer "))
}

/// What a request's head holds once parsed: its line and its headers.
fn head_size<B>(req: &hyper::Request<B>) -> usize {
    let headers: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    req.method().as_str().len() + req.uri().to_string().len() + headers + 16
}

/// HTTP/2 windows of a stranger's connection: the protocol's initial 64 KiB, not hyper's
/// 1 MiB — what a stranger may have buffered of request bodies.
const STRANGER_WINDOW: u32 = 65_535;
/// What may wait to be sent to a stranger per stream.
const STRANGER_SEND_BUFFER: usize = 64 << 10;

/// HTTP/1.1 and HTTP/2 as LIMITS allow a connection, PROVEN or a stranger's: the head's
/// bytes and deadline, and for a stranger's HTTP/2 few streams and small windows.
fn protocol_builder(limits: &ServerLimits, proven: bool) -> Builder<TokioExecutor> {
    let head_bytes = if proven {
        limits.proven_header_bytes
    } else {
        limits.stranger_header_bytes
    };
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(if proven {
            limits.header_timeout
        } else {
            limits.stranger_timeout
        })
        .max_buf_size(head_bytes + 4096);
    // hyper's HTTP/2 default is 16 KiB: kube-apiserver's requests for a long selector were
    // reset (the aggregator answered 503) where a CRD answers them.
    builder
        .http2()
        .max_header_list_size(u32::try_from(head_bytes).unwrap_or(u32::MAX));
    if !proven {
        builder
            .http2()
            .max_concurrent_streams(limits.stranger_streams)
            .initial_stream_window_size(STRANGER_WINDOW)
            .initial_connection_window_size(STRANGER_WINDOW)
            .max_send_buf_size(STRANGER_SEND_BUFFER);
    }
    if limits.http1_only {
        builder.http1_only()
    } else {
        builder
    }
}

/// HTTP/1.1 or HTTP/2 on `io`, each request with its peer's certificates and its
/// connection, a panic in a handler answered 500, the connection closed once idle past its
/// deadline or at once when its place is taken for a newcomer.
async fn serve_connection<I>(
    io: I,
    conn: Arc<Connection>,
    peer: PeerCerts,
    remote: SocketAddr,
    server: &Arc<Server>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = server.limits;
    let name = server.name;
    let proven = conn.peer() == Peer::Authenticated;
    let requests = conn.clone();
    let app = server.app.clone();
    let service = hyper::service::service_fn(
        move |mut req: hyper::Request<hyper::body::Incoming>| {
            requests.head_arrived(has_bearer(req.headers()));
            let held = requests.dispatched(head_size(&req));
            req.extensions_mut().insert(peer.clone());
            req.extensions_mut().insert(requests.clone());
            let busy = requests.activity.begin();
            let call = held
                .is_some()
                .then(|| app.clone().oneshot(req.map(axum::body::Body::new)));
            async move {
                let (Some(held), Some(call)) = (held, call) else {
                    let refused = ApiError::unavailable(
                        "the server's memory for request heads is spent; retry",
                    )
                    .into_response();
                    return Ok::<_, std::convert::Infallible>(refused);
                };
                let response = match std::panic::AssertUnwindSafe(call).catch_unwind().await {
                    Ok(Ok(r)) => r,
                    Ok(Err(never)) => match never {},
                    Err(_) => {
                        ServingMetrics::panicked(name);
                        tracing::error!(%remote, server = name, "a request handler panicked; answered 500");
                        ApiError::internal("an internal error occurred").into_response()
                    }
                };
                Ok(response.map(|body| GuardedBody::wrap(body, (busy, held))))
            }
        },
    );
    let builder = protocol_builder(&limits, proven);
    let http = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(http);
    let mut closing = false;
    loop {
        let due = if closing { None } else { conn.due(&limits) };
        // Busy connections are looked at again every idle period (a request may end
        // without waking this task).
        let wake = due.unwrap_or_else(|| Instant::now() + limits.idle_timeout);
        tokio::select! {
            r = http.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%remote, error = %e, "connection ended");
                }
                return;
            }
            () = tokio::time::sleep_until(wake.into()), if !closing => {
                if conn.due(&limits).is_some_and(|d| d <= Instant::now()) {
                    ServingMetrics::refused(name, "idle", conn.peer());
                    tracing::debug!(%remote, server = name, "closing an idle connection");
                    http.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            () = tokio::time::sleep(limits.handshake_timeout), if closing => {
                // A peer that does not let go after the graceful close: dropped.
                return;
            }
            () = conn.place.closed() => {
                // Its place went to a newcomer: dropped at once.
                return;
            }
        }
    }
}
