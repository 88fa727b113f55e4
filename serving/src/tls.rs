//! TLS with rustls: a serving certificate reloaded from disk when it changes (rotation
//! without restart), ALPN h2 + http/1.1, and client certificates requested but not
//! required — their chain is verified per request against the request-header CA alone
//! (authn), so a kubelet probe or Prometheus can connect without one — and [`serve`],
//! the TLS listener that hands each request its peer's certificates, within the
//! [`crate::limits`] of a server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::response::IntoResponse;
use futures::FutureExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use tower::ServiceExt;

use crate::authn::PeerCerts;
use crate::limits::{Activity, Holding, Limits, ServingMetrics};
use crate::status::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: no certificate / key found")]
    Empty(PathBuf),
    #[error("unusable key: {0}")]
    Key(rustls::Error),
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(rcgen::Error),
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    what: &std::path::Path,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &cert_pem[..])
        .filter_map(Result::ok)
        .collect();
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| TlsError::Read(what.to_path_buf(), e))?
        .ok_or_else(|| TlsError::Empty(what.to_path_buf()))?;
    if certs.is_empty() {
        return Err(TlsError::Empty(what.to_path_buf()));
    }
    let signer = provider()
        .key_provider
        .load_private_key(key)
        .map_err(TlsError::Key)?;
    Ok(Arc::new(CertifiedKey::new(certs, signer)))
}

/// Where the serving certificate comes from.
pub enum ServingCert {
    /// PEM files, re-read whenever their modification time changes.
    Files { cert: PathBuf, key: PathBuf },
    /// A self-signed certificate for these DNS names (local runs).
    SelfSigned(Vec<String>),
}

#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Option<SystemTime>, Option<SystemTime>, Arc<CertifiedKey>)>,
}

fn mtime(p: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn load_files(cert: &PathBuf, key: &PathBuf) -> Result<Arc<CertifiedKey>, TlsError> {
    let c = std::fs::read(cert).map_err(|e| TlsError::Read(cert.clone(), e))?;
    let k = std::fs::read(key).map_err(|e| TlsError::Read(key.clone(), e))?;
    certified_key(&c, &k, cert)
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let (c, k) = (mtime(&self.cert), mtime(&self.key));
        {
            let cur = self.current.read().ok()?;
            if cur.0 == c && cur.1 == k {
                return Some(cur.2.clone());
            }
        }
        match load_files(&self.cert, &self.key) {
            Ok(new) => {
                tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                if let Ok(mut cur) = self.current.write() {
                    *cur = (c, k, new.clone());
                }
                Some(new)
            }
            // A half-written rotation: keep serving the old one.
            Err(e) => {
                tracing::warn!(error = %e, "reloading the serving certificate; keeping the old one");
                self.current.read().ok().map(|cur| cur.2.clone())
            }
        }
    }
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Requests a client certificate, accepts any chain (authn verifies it per request against
/// the request-header CA), but does verify the handshake signature: the client proves it
/// holds the certificate's key.
#[derive(Debug)]
struct AnyClientCert(Arc<CryptoProvider>);

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _end: &CertificateDer<'_>,
        _int: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The server configuration.
pub fn server_config(cert: ServingCert) -> Result<Arc<ServerConfig>, TlsError> {
    let resolver: Arc<dyn ResolvesServerCert> = match cert {
        ServingCert::Files { cert, key } => {
            let first = load_files(&cert, &key)?;
            Arc::new(Reloading {
                current: RwLock::new((mtime(&cert), mtime(&key), first)),
                cert,
                key,
            })
        }
        ServingCert::SelfSigned(names) => {
            let rcgen::CertifiedKey { cert, signing_key } =
                rcgen::generate_simple_self_signed(names).map_err(TlsError::SelfSigned)?;
            Arc::new(Fixed(certified_key(
                cert.pem().as_bytes(),
                signing_key.serialize_pem().as_bytes(),
                &PathBuf::from("self-signed"),
            )?))
        }
    };
    let provider = provider();
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(AnyClientCert(provider)))
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` over TLS on `addr` until `shutdown` resolves; then stops accepting and,
/// with `drain`, returns once the connections it has are closed (the supervisor's grace
/// bounds the wait): kube-apiserver's connection to the aggregated API keeps being
/// answered while the endpoint goes, the process exits no later than that.
///
/// Nothing a client does ends it ([`crate::limits`]): an accept error (out of file
/// descriptors, a connection reset before accept) is logged and backed off as Go's
/// `net/http` does; past `limits.max_connections` a new connection is closed at once; a
/// handshake, a request head and an idle connection have deadlines; a handler that panics
/// answers 500 (counted) and the connection goes on. `server` names it in the metrics.
pub async fn serve(
    addr: SocketAddr,
    config: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
    drain: bool,
    server: &'static str,
    limits: Limits,
) -> std::io::Result<()> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot listen");
            return Err(e);
        }
    };
    tracing::info!(%addr, server, max_connections = limits.max_connections, "listening (TLS)");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let places = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
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
                ServingMetrics::refused(server, "accept");
                tracing::warn!(%addr, server, error = %e, retry_in = ?backoff, "accept failed");
                continue;
            }
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            // Closed at once: the descriptor is free again before the next accept.
            ServingMetrics::refused(server, "connections");
            tracing::debug!(%remote, server, "connection refused: --max-connections reached");
            drop(tcp);
            continue;
        };
        let serving = open.clone();
        // As Go's net/http does: without it, several small watch events written back to
        // back on kube-apiserver's one HTTP/2 connection wait for a delayed ACK (~40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _place = place;
            let _counted = ServingMetrics::open(server);
            let tls =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        ServingMetrics::refused(server, "handshake");
                        tracing::debug!(%remote, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        ServingMetrics::refused(server, "handshake");
                        tracing::debug!(%remote, "TLS handshake timed out");
                        return;
                    }
                };
            serve_connection(tls, remote, app, server, &limits).await;
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

/// The most bytes of a request's head, as kube-apiserver's `MaxHeaderBytes` (1 MiB): a
/// 10,500-value selector is about 42 KiB.
const MAX_HEADER_BYTES: usize = 1 << 20;

/// One TLS connection: HTTP/1.1 or HTTP/2, each request with its peer's certificates, a
/// panic in a handler answered 500, the connection closed once idle past its deadline.
async fn serve_connection(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    remote: SocketAddr,
    app: Router,
    server: &'static str,
    limits: &Limits,
) {
    let peer = PeerCerts(
        tls.get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    );
    let activity = Arc::new(Activity::default());
    let requests = activity.clone();
    let service = hyper::service::service_fn(
        move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(peer.clone());
            let busy = requests.begin();
            let call = app.clone().oneshot(req.map(axum::body::Body::new));
            async move {
                let response = match std::panic::AssertUnwindSafe(call).catch_unwind().await {
                    Ok(Ok(r)) => r,
                    Ok(Err(never)) => match never {},
                    Err(_) => {
                        ServingMetrics::panicked(server);
                        tracing::error!(%remote, server, "a request handler panicked; answered 500");
                        ApiError::internal("an internal error occurred").into_response()
                    }
                };
                Ok::<_, std::convert::Infallible>(response.map(|body| Holding::body(body, busy)))
            }
        },
    );
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEADER_BYTES + 4096);
    // hyper's HTTP/2 default is 16 KiB: kube-apiserver's requests for a long selector were
    // reset (the aggregator answered 503) where a CRD answers them.
    builder
        .http2()
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        let due = if closing {
            None
        } else {
            activity.due(limits.header_timeout, limits.idle_timeout)
        };
        // Busy connections are looked at again every idle period (a request may end
        // without waking this task).
        let wake = due.unwrap_or_else(|| Instant::now() + limits.idle_timeout);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%remote, error = %e, "connection ended");
                }
                return;
            }
            () = tokio::time::sleep_until(wake.into()), if !closing => {
                if activity
                    .due(limits.header_timeout, limits.idle_timeout)
                    .is_some_and(|d| d <= Instant::now())
                {
                    ServingMetrics::refused(server, "idle");
                    tracing::debug!(%remote, server, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            () = tokio::time::sleep(limits.handshake_timeout), if closing => {
                // A peer that does not let go after the graceful close: dropped.
                return;
            }
        }
    }
}
