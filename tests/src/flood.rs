//! Strangers' floods for the hostile suite: many connections to one port, each from one of
//! several loopback source addresses, doing what a hostile pod does — holding a socket and
//! saying nothing, or sending a request head it never finishes (HTTP/1.1, or HTTP/2 with
//! CONTINUATION frames) — and reconnecting at once whenever the server closes it. Bounded:
//! a flood has a fixed number of slots and stops when [`Flood::stop`] is called or it is
//! dropped. Loopback only.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The tests of a hostile binary share the machine with one another (libtest runs two at
/// once); a test that measures latency wants it to itself. Every other test holds
/// [`shared`], a measurement [`alone`]: nothing of its binary runs beside a measurement
/// (the probes' p99 once read 11.8 ms in the full suite, where alone it reads 4.5–8.6 ms:
/// the other test's load).
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Held by a test for as long as it runs, beside others.
pub async fn shared() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().await
}

/// Held by a test that measures latency: no other test of its binary runs meanwhile.
pub async fn alone() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().await
}

/// What each connection of a flood does.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Connects and sends nothing.
    Idle,
    /// TLS, then an HTTP/1.1 request head of about `bytes` that never ends.
    TlsHttp1Head { bytes: usize },
    /// Plain HTTP/1.1 (the probe port): a head of about `bytes` that never ends.
    PlainHttp1Head { bytes: usize },
    /// TLS with ALPN h2: `streams` whole header blocks of about `block` bytes each (requests
    /// left open: no END_STREAM), then one block begun and continued in CONTINUATION frames
    /// up to about `bytes`, never ended.
    TlsHttp2 {
        streams: usize,
        block: usize,
        bytes: usize,
    },
}

/// What a flood did.
#[derive(Debug, Default)]
pub struct FloodStats {
    /// Connections it opened.
    pub connects: AtomicU64,
    /// Connections the server closed (or reset).
    pub closed: AtomicU64,
    /// Connects that failed.
    pub failed: AtomicU64,
}

impl FloodStats {
    pub fn summary(&self) -> String {
        format!(
            "{} connections opened, {} closed by the server, {} connects failed",
            self.connects.load(Ordering::Relaxed),
            self.closed.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed)
        )
    }
}

/// A running flood.
pub struct Flood {
    stop: watch::Sender<bool>,
    slots: Vec<JoinHandle<()>>,
    pub stats: Arc<FloodStats>,
}

/// `n` loopback source addresses other than 127.0.0.1 (which the tests' own clients and
/// kube-apiserver use): 127.0.0.2, 127.0.0.3, ...
pub fn sources(n: u8) -> Vec<IpAddr> {
    (0..n).map(|i| IpAddr::from([127, 0, 0, 2 + i])).collect()
}

/// Raises this process's open-file limit to its hard limit (the floods hold thousands).
pub fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

impl Flood {
    /// Starts `per_source` connections from each of `sources` to `target`, each doing
    /// `kind` and reconnecting whenever it is closed.
    pub fn start(target: SocketAddr, sources: &[IpAddr], per_source: usize, kind: Kind) -> Flood {
        raise_open_files();
        let (stop, stopped) = watch::channel(false);
        let stats = Arc::new(FloodStats::default());
        let tls = Arc::new(tls_config(matches!(kind, Kind::TlsHttp2 { .. })));
        let mut slots = Vec::new();
        for source in sources {
            for _ in 0..per_source {
                let (stats, mut stopped, tls) = (stats.clone(), stopped.clone(), tls.clone());
                let source = *source;
                slots.push(tokio::spawn(async move {
                    while !*stopped.borrow() {
                        tokio::select! {
                            r = slot(source, target, kind, &tls, &stats) => {
                                if r.is_err() {
                                    stats.failed.fetch_add(1, Ordering::Relaxed);
                                    // A failed connect (ports, descriptors) waits a little.
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                } else {
                                    stats.closed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            _ = stopped.changed() => break,
                        }
                    }
                }));
            }
        }
        Flood { stop, slots, stats }
    }

    /// Stops every connection of the flood and waits for them to go.
    pub async fn stop(mut self) -> Arc<FloodStats> {
        let _ = self.stop.send(true);
        for s in self.slots.drain(..) {
            let _ = s.await;
        }
        self.stats.clone()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for s in &self.slots {
            s.abort();
        }
    }
}

/// One connection of a slot, until the server closes it.
async fn slot(
    source: IpAddr,
    target: SocketAddr,
    kind: Kind,
    tls: &Arc<rustls::ClientConfig>,
    stats: &FloodStats,
) -> Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let tcp = tokio::time::timeout(Duration::from_secs(5), socket.connect(target))
        .await
        .context("connect timed out")??;
    stats.connects.fetch_add(1, Ordering::Relaxed);
    match kind {
        Kind::Idle => until_closed(tcp).await,
        Kind::PlainHttp1Head { bytes } => {
            let mut tcp = tcp;
            let _ = send_http1_head(&mut tcp, bytes).await;
            until_closed(tcp).await
        }
        Kind::TlsHttp1Head { bytes } => {
            let Ok(mut s) = handshake(tcp, tls).await else {
                return Ok(());
            };
            let _ = send_http1_head(&mut s, bytes).await;
            until_closed(s).await
        }
        Kind::TlsHttp2 {
            streams,
            block,
            bytes,
        } => {
            let Ok(mut s) = handshake(tcp, tls).await else {
                return Ok(());
            };
            let _ = send_http2(&mut s, streams, block, bytes).await;
            until_closed(s).await
        }
    }
    Ok(())
}

async fn handshake(
    tcp: TcpStream,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let name = ServerName::try_from("localhost")?;
    Ok(tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await?)
}

/// Reads (and drops) whatever the server says until it closes the connection.
async fn until_closed(mut s: impl AsyncRead + Unpin) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// A GET whose head grows by a header of `bytes` and never ends.
async fn send_http1_head(s: &mut (impl AsyncWrite + Unpin), bytes: usize) -> Result<()> {
    s.write_all(b"GET /apis HTTP/1.1\r\nHost: localhost\r\nX-Fill: ")
        .await?;
    let chunk = [b'a'; 16 << 10];
    let mut sent = 0;
    while sent < bytes {
        let n = chunk.len().min(bytes - sent);
        s.write_all(&chunk[..n]).await?;
        sent += n;
    }
    s.flush().await?;
    Ok(())
}

/// An HPACK integer with a `prefix`-bit prefix (RFC 7541 §5.1), its first byte or-ed with
/// `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u8, mut n: usize) {
    let max = (1usize << prefix) - 1;
    if n < max {
        out.push(first | n as u8);
        return;
    }
    out.push(first | max as u8);
    n -= max;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// A literal header field without indexing, new name (RFC 7541 §6.2.2), no Huffman.
fn hpack_literal(out: &mut Vec<u8>, name: &[u8], value_len: usize) {
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name);
    hpack_int(out, 0, 7, value_len);
    out.resize(out.len() + value_len, b'a');
}

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len();
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One header block as HEADERS and CONTINUATION frames of at most 16 KiB; END_HEADERS on
/// the last when `end`.
fn h2_block(stream: u32, block: &[u8], end: bool) -> Vec<u8> {
    const MAX: usize = 16 << 10;
    let mut out = Vec::new();
    let pieces: Vec<&[u8]> = block.chunks(MAX).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let kind = if i == 0 { 0x1 } else { 0x9 };
        let flags = if end && i + 1 == pieces.len() { 0x4 } else { 0 };
        out.extend(h2_frame(kind, flags, stream, piece));
    }
    out
}

/// HTTP/2: the preface, SETTINGS, `streams` whole blocks of about `block` bytes, then one
/// block of about `bytes` that never ends.
async fn send_http2(
    s: &mut (impl AsyncWrite + Unpin),
    streams: usize,
    block: usize,
    bytes: usize,
) -> Result<()> {
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
    s.write_all(&h2_frame(0x4, 0, 0, &[])).await?;
    let head = |fill: usize| {
        // :method GET, :scheme https, :path /, then the filler.
        let mut b = vec![0x82, 0x87, 0x84];
        hpack_literal(&mut b, b"x-fill", fill);
        b
    };
    for k in 0..streams {
        let id = 1 + 2 * u32::try_from(k).unwrap_or(0);
        s.write_all(&h2_block(id, &head(block), true)).await?;
    }
    let id = 1 + 2 * u32::try_from(streams).unwrap_or(0);
    let open = head(bytes);
    // Sent frame by frame: the server may close it part way.
    for frame in h2_block(id, &open, false).chunks(16 << 10) {
        s.write_all(frame).await?;
    }
    s.flush().await?;
    Ok(())
}

/// A TLS client that accepts any server certificate (a stranger does not care) and offers
/// h2 or http/1.1.
fn tls_config(h2: bool) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    config.alpn_protocols = if h2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    config
}

#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end: &CertificateDer<'_>,
        _int: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A slow but honest client: connects to `target` from 127.0.0.1, completes its TLS
/// handshake, waits `pause` (a slow network, a busy scraper), then sends `GET path` with
/// the bearer `token`: the status code, or 0 when the server closed the connection first.
/// On a thread and a runtime of its own, as a client in another process would be: on the
/// test's runtime, beside a flood's thousands of tasks, its ClientHello waited for them.
pub async fn slow_request(target: SocketAddr, path: &str, token: &str, pause: Duration) -> u16 {
    let (path, token) = (path.to_string(), token.to_string());
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_or(0, |rt| {
                rt.block_on(slow_request_here(target, &path, &token, pause))
            })
    })
    .await
    .unwrap_or(0)
}

async fn slow_request_here(target: SocketAddr, path: &str, token: &str, pause: Duration) -> u16 {
    let answer = async {
        let tls = Arc::new(tls_config(false));
        let tcp = TcpStream::connect(target).await?;
        let mut s = handshake(tcp, &tls).await?;
        tokio::time::sleep(pause).await;
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await?;
        // Up to the close (with or without TLS's close_notify).
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = s.read(&mut buf).await {
            out.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&out);
        let code = text.split_whitespace().nth(1).unwrap_or("0").parse()?;
        anyhow::Ok(code)
    };
    tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn hpack_integers_follow_rfc_7541() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        hpack_int(&mut out, 0, 5, 10);
        assert_eq!(out, [10]);
        out.clear();
        hpack_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [31, 154, 10]);
    }

    #[test]
    fn a_block_is_split_into_headers_and_continuations() {
        let block = vec![0u8; 40 << 10];
        let frames = h2_block(3, &block, true);
        // 16 KiB + 16 KiB + 8 KiB, each with a 9-byte header.
        assert_eq!(frames.len(), (40 << 10) + 27);
        assert_eq!(frames[3], 0x1);
        assert_eq!(frames[4], 0);
        let second = 9 + (16 << 10);
        assert_eq!(frames[second + 3], 0x9);
        let third = 2 * second;
        assert_eq!((frames[third + 3], frames[third + 4]), (0x9, 0x4));
    }
}
