//! TLS with rustls: a serving certificate reloaded from disk when it changes (rotation
//! without restart), ALPN h2 + http/1.1, and client certificates requested but not
//! required — their chain is verified against the request-header CA alone (authn: at the
//! handshake, to know the aggregator, and per request), so a kubelet probe or Prometheus can
//! connect without one. The listener is [`crate::listener`].

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};

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
