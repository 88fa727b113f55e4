//! Authentication, as the generic apiserver delegates it: the front-proxy client
//! certificate is verified against the request-header CA (and only that CA) and its CN
//! against the allowed names BEFORE any `X-Remote-*` header is read; bearer tokens go to
//! TokenReview; a request with neither is anonymous; a bad certificate or token is 401.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use rustls::pki_types::{CertificateDer, TrustAnchor, UnixTime};

use crate::connections::Proof;
use crate::limits::ReviewGate;
use crate::metrics::Peer;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn anonymous() -> Self {
        UserInfo {
            name: "system:anonymous".into(),
            uid: None,
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }

    /// Every authenticated user is in `system:authenticated` (as the generic apiserver adds it).
    fn authenticated(mut self) -> Self {
        if !self
            .groups
            .iter()
            .any(|g| g == "system:authenticated" || g == "system:unauthenticated")
        {
            self.groups.push("system:authenticated".into());
        }
        self
    }
}

/// The client certificate chain the TLS handshake presented (leaf first), if any.
#[derive(Debug, Clone, Default)]
pub struct PeerCerts(pub Vec<CertificateDer<'static>>);

/// The request-header settings published in `kube-system/extension-apiserver-authentication`.
#[derive(Debug, Clone)]
pub struct FrontProxy {
    anchors: Vec<TrustAnchor<'static>>,
    allowed_names: Vec<String>,
    username_headers: Vec<String>,
    uid_headers: Vec<String>,
    group_headers: Vec<String>,
    extra_prefixes: Vec<String>,
}

/// The values are JSON arrays of strings; empty or `null` means none.
fn json_list(data: &BTreeMap<String, String>, key: &str) -> Vec<String> {
    data.get(key)
        .and_then(|v| serde_json::from_str::<Option<Vec<String>>>(v).ok())
        .flatten()
        .unwrap_or_default()
}

impl FrontProxy {
    pub fn from_config_map(cm: &ConfigMap) -> Result<FrontProxy, String> {
        let data = cm.data.clone().unwrap_or_default();
        let pem = data
            .get("requestheader-client-ca-file")
            .ok_or("no requestheader-client-ca-file")?;
        let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_bytes())
            .filter_map(Result::ok)
            .collect();
        let anchors = certs
            .iter()
            .filter_map(|c| {
                webpki::anchor_from_trusted_cert(c)
                    .ok()
                    .map(|a| a.to_owned())
            })
            .collect::<Vec<_>>();
        if anchors.is_empty() {
            return Err("requestheader-client-ca-file holds no usable CA".into());
        }
        Ok(FrontProxy {
            anchors,
            allowed_names: json_list(&data, "requestheader-allowed-names"),
            username_headers: json_list(&data, "requestheader-username-headers"),
            uid_headers: json_list(&data, "requestheader-uid-headers"),
            group_headers: json_list(&data, "requestheader-group-headers"),
            extra_prefixes: json_list(&data, "requestheader-extra-headers-prefix"),
        })
    }

    /// Ok(true) when the chain is a valid front-proxy certificate; Ok(false) when it does
    /// not chain to the request-header CA; Err when it does but its CN is not allowed.
    fn verify(&self, chain: &[CertificateDer<'static>]) -> Result<bool, String> {
        let Some(leaf) = chain.first() else {
            return Ok(false);
        };
        let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
            return Ok(false);
        };
        let verified = cert.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &self.anchors,
            &chain[1..],
            UnixTime::now(),
            webpki::KeyUsage::client_auth(),
            None,
            None,
        );
        if verified.is_err() {
            return Ok(false);
        }
        if self.allowed_names.is_empty() {
            return Ok(true);
        }
        let cn = x509_parser::parse_x509_certificate(leaf)
            .ok()
            .and_then(|(_, c)| {
                c.subject()
                    .iter_common_name()
                    .next()
                    .and_then(|n| n.as_str().ok().map(str::to_string))
            })
            .unwrap_or_default();
        if self.allowed_names.contains(&cn) {
            Ok(true)
        } else {
            Err(format!(
                "client certificate CN {cn:?} is not an allowed front proxy"
            ))
        }
    }

    /// The user the front proxy vouches for, read from its headers.
    fn user(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let first = |names: &[String]| {
            names.iter().find_map(|n| {
                headers.get_all(n.as_str()).iter().find_map(|v| {
                    v.to_str()
                        .ok()
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                })
            })
        };
        let name = first(&self.username_headers)?;
        let uid = first(&self.uid_headers);
        let groups = self
            .group_headers
            .iter()
            .flat_map(|h| {
                headers
                    .get_all(h.as_str())
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in headers {
            let key = k.as_str().to_ascii_lowercase();
            for prefix in &self.extra_prefixes {
                if let Some(rest) = key.strip_prefix(&prefix.to_ascii_lowercase())
                    && let Ok(v) = v.to_str()
                {
                    extra
                        .entry(percent_decode(rest))
                        .or_default()
                        .push(v.to_string());
                }
            }
        }
        Some(UserInfo {
            name,
            uid,
            groups,
            extra,
        })
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Authentication state: the watched front-proxy settings and a TokenReview cache.
pub struct Authenticator {
    /// The reviews' own client: no other call of the process waits behind them.
    client: Client,
    gate: Arc<ReviewGate>,
    front_proxy: RwLock<Option<Arc<FrontProxy>>>,
    /// Review results by the SHA-256 of the token (never the token itself): bounded in size
    /// and time, concurrent reviews of one token made once. A failed review is not kept.
    tokens: moka::future::Cache<[u8; 32], Option<UserInfo>>,
    /// The digests of tokens accepted in the last [`KNOWN_TTL`]: a re-review of one (its
    /// cached answer expired) is a proven caller's, in the gate's other lane. Only accepted
    /// tokens enter: a flood of made-up ones can neither fill it nor evict from it.
    known: moka::sync::Cache<[u8; 32], ()>,
}

/// How long a token once accepted is re-reviewed in the proven callers' lane.
const KNOWN_TTL: Duration = Duration::from_secs(600);

const TOKEN_TTL: Duration = Duration::from_secs(10);
/// Longest wait for a TokenReview.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

fn token_digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthnError {
    Unauthorized(String),
    /// No room for the TokenReview now ([`ReviewGate`]): 429, the client retries.
    Overloaded,
}

/// Why a TokenReview was not made or gave no answer; neither is cached.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReviewError {
    Overloaded,
    Failed(String),
}

impl Authenticator {
    /// `capacity`: most tokens kept — a flood of distinct tokens cannot grow memory past it;
    /// `gate`: the process's budget of reviews (shared with the [`crate::authz::Authorizer`]).
    pub fn new(client: Client, capacity: u64, gate: Arc<ReviewGate>) -> Arc<Self> {
        Arc::new(Authenticator {
            client,
            gate,
            front_proxy: RwLock::new(None),
            tokens: moka::future::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(TOKEN_TTL)
                .build(),
            known: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(KNOWN_TTL)
                .build(),
        })
    }

    /// Whether the front-proxy settings have been loaded.
    pub fn ready(&self) -> bool {
        self.front_proxy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    pub fn set_front_proxy(&self, fp: Option<FrontProxy>) {
        *self
            .front_proxy
            .write()
            .unwrap_or_else(PoisonError::into_inner) = fp.map(Arc::new);
    }

    /// Watches `kube-system/extension-apiserver-authentication` (CA rotation and several
    /// kube-apiservers change it) for as long as the process runs.
    pub async fn watch_config(self: Arc<Self>) {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), "kube-system");
        let cfg = kube::runtime::watcher::Config::default()
            .fields("metadata.name=extension-apiserver-authentication");
        let mut stream = std::pin::pin!(kube::runtime::watcher(api, cfg).default_backoff());
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(
                    kube::runtime::watcher::Event::Apply(cm)
                    | kube::runtime::watcher::Event::InitApply(cm),
                ) => match FrontProxy::from_config_map(&cm) {
                    Ok(fp) => self.set_front_proxy(Some(fp)),
                    Err(e) => {
                        tracing::warn!(error = %e, "extension-apiserver-authentication unusable")
                    }
                },
                Ok(kube::runtime::watcher::Event::Delete(_)) => self.set_front_proxy(None),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "watching extension-apiserver-authentication"),
            }
        }
    }

    /// Whether `peer` is a front-proxy client certificate the request-header CA signed, for
    /// an allowed name: the aggregator, known at the handshake.
    pub fn is_front_proxy(&self, peer: &PeerCerts) -> bool {
        !peer.0.is_empty()
            && self
                .front_proxy
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .as_deref()
                .is_some_and(|fp| fp.verify(&peer.0) == Ok(true))
    }

    /// The user of a request, and how its connection proved it (none: anonymous).
    pub async fn authenticate(
        &self,
        peer: &PeerCerts,
        headers: &HeaderMap,
    ) -> Result<(UserInfo, Option<Proof>), AuthnError> {
        let fp = self
            .front_proxy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut cert_error = None;
        if !peer.0.is_empty() {
            match fp.as_deref().map(|fp| fp.verify(&peer.0)) {
                Some(Ok(true)) => {
                    if let Some(user) = fp.as_deref().and_then(|fp| fp.user(headers)) {
                        return Ok((user.authenticated(), Some(Proof::FrontProxy)));
                    }
                }
                Some(Err(e)) => cert_error = Some(e),
                Some(Ok(false)) | None => {
                    cert_error =
                        Some("client certificate is not signed by the request-header CA".into())
                }
            }
        }
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let Some(token) = bearer {
            return match self.review(token).await {
                Ok(Some(user)) => Ok((user.authenticated(), Some(Proof::Token))),
                Ok(None) => Err(AuthnError::Unauthorized("invalid bearer token".into())),
                Err(ReviewError::Overloaded) => Err(AuthnError::Overloaded),
                Err(ReviewError::Failed(e)) => {
                    tracing::warn!(error = %e, "TokenReview failed");
                    Err(AuthnError::Unauthorized(
                        "the token could not be reviewed".into(),
                    ))
                }
            };
        }
        match cert_error {
            Some(e) => Err(AuthnError::Unauthorized(e)),
            None => Ok((UserInfo::anonymous(), None)),
        }
    }

    /// The user of a token: from the cache (a rejected token is cached too, as kube caches
    /// both answers), else by a TokenReview when the gate has room.
    /// A token accepted before is reviewed in the proven callers' lane of the gate.
    async fn review(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let digest = token_digest(token);
        self.tokens
            .try_get_with(digest, async {
                let lane = if self.known.contains_key(&digest) {
                    Peer::Authenticated
                } else {
                    Peer::Unauthenticated
                };
                let _permit = self.gate.enter(lane).ok_or(ReviewError::Overloaded)?;
                let user = self
                    .token_review(token)
                    .await
                    .map_err(ReviewError::Failed)?;
                if user.is_some() {
                    self.known.insert(digest, ());
                }
                Ok(user)
            })
            .await
            .map_err(|e: Arc<ReviewError>| (*e).clone())
    }

    async fn token_review(&self, token: &str) -> Result<Option<UserInfo>, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let api = Api::<TokenReview>::all(self.client.clone());
        let r = tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
            .await
            .map_err(|_| format!("timed out after {REVIEW_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        Ok(r.status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .map(|u| UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid,
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }))
    }

    /// Applies pending evictions and expirations (they are otherwise applied lazily).
    pub async fn upkeep(&self) {
        self.tokens.run_pending_tasks().await;
        self.known.run_pending_tasks();
    }

    /// Tokens held in the cache (as of the last upkeep).
    pub fn cached_tokens(&self) -> u64 {
        self.tokens.entry_count()
    }
}
