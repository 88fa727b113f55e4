//! The aggregated API server for `view.local.sdn.cozystack.io/v1alpha1` (SPEC §9): read-only
//! views materialized from the controller's in-memory caches ([`store`]), served over TLS
//! behind kube-apiserver's aggregation layer with delegated authentication and
//! authorization, answering as kube-apiserver answers for a custom resource of the same
//! shape (list options, selectors, paging, watch, content negotiation, errors).
//!
//! One module per concern: [`request`] (what a request asks for), [`selector`],
//! [`negotiate`], [`render`], [`serve`] (list/get/subresources), [`watch`], [`store`]
//! (materialized views and their change history), [`resources`] (one module per view),
//! [`discovery`], [`openapi`], [`authn`]/[`authz`] (delegated, cached), [`metrics`].

pub mod authn;
pub mod authz;
pub mod discovery;
pub mod metrics;
pub mod negotiate;
pub mod openapi;
pub mod render;
pub mod request;
pub mod resources;
pub mod secure;
pub mod selector;
pub mod serve;
pub mod status;
pub mod store;
pub mod tls;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::ServiceExt;

use crate::authn::{Authenticator, PeerCerts, UserInfo};
use crate::authz::{Attributes, Authorizer};
use crate::metrics::ApiMetrics;
use crate::request::{Query, RequestInfo};
use crate::status::ApiError;
use crate::store::ViewStore;

/// The API group of the views.
pub const GROUP: &str = "view.local.sdn.cozystack.io";
/// Its one version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the views' objects.
pub const API_VERSION: &str = "view.local.sdn.cozystack.io/v1alpha1";

/// Shared state of the server.
pub struct State {
    pub store: Arc<ViewStore>,
    pub authn: Arc<Authenticator>,
    pub authz: Arc<Authorizer>,
    pub metrics: ApiMetrics,
    pub openapi: openapi::Served,
}

impl State {
    /// Serving: the views are built from caches that are live, and the front-proxy
    /// settings are loaded.
    fn ready(&self) -> bool {
        self.store.built() && self.store.world.health.ready() && self.authn.ready()
    }
}

/// The router. Requests carry the TLS peer's certificates as a [`PeerCerts`] extension.
pub fn router(state: Arc<State>) -> Router {
    let api = Router::new()
        .route("/apis", any(apis))
        .route("/apis/{group}", any(group))
        .route("/apis/{group}/{version}", any(group_version))
        .route("/openapi/v2", any(openapi_v2))
        .route("/openapi/v3", any(openapi_v3_index))
        .route("/openapi/v3/apis/{group}/{version}", any(openapi_v3))
        .route("/apis/{group}/{version}/{resource}", any(serve::collection))
        .route(
            "/apis/{group}/{version}/{resource}/{name}",
            any(serve::item),
        )
        .route(
            "/apis/{group}/{version}/{resource}/{name}/{sub}",
            any(serve::sub),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{namespace}/{resource}",
            any(serve::collection_ns),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{namespace}/{resource}/{name}",
            any(serve::item_ns),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{namespace}/{resource}/{name}/{sub}",
            any(serve::sub_ns),
        )
        .fallback(|| async { serve::page_not_found() })
        .with_state(state.clone());
    Router::new().fallback(move |req: Request| {
        let (state, api) = (state.clone(), api.clone());
        async move { handle(state, api, req).await }
    })
}

fn plain(code: StatusCode, body: &'static str) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// `/apis/g/v/things/` is `/apis/g/v/things` (kube-apiserver answers both).
fn without_trailing_slash(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    if path.len() <= 1 || !path.ends_with('/') {
        return None;
    }
    let trimmed = path.trim_end_matches('/');
    let pq = match uri.query() {
        Some(q) => format!("{trimmed}?{q}"),
        None => trimmed.to_string(),
    };
    pq.parse().ok()
}

/// Probes, then authentication, authorization, and the request itself; every request
/// counted in the metrics by verb, resource and code.
async fn handle(state: Arc<State>, api: Router, mut req: Request) -> Response {
    if let Some(uri) = without_trailing_slash(req.uri()) {
        *req.uri_mut() = uri;
    }
    let path = req.uri().path().to_string();
    // Probes: always allowed, never authenticated (kubelet probes are anonymous).
    match path.as_str() {
        "/healthz" | "/livez" => return plain(StatusCode::OK, "ok"),
        "/readyz" => {
            return if state.ready() {
                plain(StatusCode::OK, "ok")
            } else {
                plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "[-]views failed: reason withheld\nreadyz check failed",
                )
            };
        }
        _ => {}
    }
    let started = Instant::now();
    let query = Query::parse(req.uri().query());
    let info = RequestInfo::parse(req.method(), &path, &query);
    let (verb, resource) = metric_labels(&state, req.method(), info.as_ref());
    let watch = info.as_ref().is_some_and(|i| i.verb == "watch");
    let peer = req
        .extensions()
        .get::<PeerCerts>()
        .cloned()
        .unwrap_or_default();
    let response = authorized(&state, &peer, req.method(), req.headers(), &path, info).await;
    let user = response
        .as_ref()
        .map(|u| u.name.clone())
        .unwrap_or_default();
    // Errors come in the encoding the client asked for, as kube-apiserver's do.
    let yaml = negotiate::negotiate(
        req.headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    )
    .ok()
        == Some(negotiate::Format::Yaml);
    let response = match response {
        Ok(_) => match api.oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        },
        Err(denied) => denied,
    };
    let response = if yaml && response.status().as_u16() >= 400 {
        status_as_yaml(response).await
    } else {
        response
    };
    let code = response.status().as_u16();
    state
        .metrics
        .observe(verb, &resource, code, started.elapsed());
    if !watch {
        tracing::debug!(%path, %user, code, took = ?started.elapsed(), "request");
    }
    response
}

/// A JSON Status answer re-encoded as YAML.
async fn status_as_yaml(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return ApiError::internal("error encoding the response").into_response();
    };
    let yaml = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| serde_yaml::to_string(&v).ok());
    match yaml {
        Some(y) => {
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/yaml"),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(y))
        }
        None => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}

/// Bounded metric labels: the verb, and the resource (`plural` or `plural/sub`) when it is
/// one of ours, `other` for any other resource path, empty for non-resource paths.
fn metric_labels(
    state: &State,
    method: &Method,
    info: Option<&RequestInfo>,
) -> (&'static str, String) {
    let Some(info) = info else {
        return (
            if *method == Method::GET || *method == Method::HEAD {
                "get"
            } else {
                "other"
            },
            String::new(),
        );
    };
    let resource = state
        .store
        .views
        .iter()
        .map(|v| v.info())
        .find(|r| r.plural == info.resource)
        .map_or_else(
            || "other".to_string(),
            |r| match &info.subresource {
                None => r.plural.to_string(),
                Some(s) if r.subresources.iter().any(|x| x.name == s) => {
                    format!("{}/{s}", r.plural)
                }
                Some(_) => "other".to_string(),
            },
        );
    (info.verb, resource)
}

/// Authentication and authorization of a request: the user, or the answer (401/403/503).
async fn authorized(
    state: &State,
    peer: &PeerCerts,
    method: &Method,
    headers: &axum::http::HeaderMap,
    path: &str,
    info: Option<RequestInfo>,
) -> Result<UserInfo, Response> {
    let user = match state.authn.authenticate(peer, headers).await {
        Ok(u) => u,
        Err(authn::AuthnError::Unauthorized(why)) => {
            tracing::debug!(%path, why, "unauthorized");
            return Err(ApiError::unauthorized().into_response());
        }
    };
    let attrs = match info {
        Some(i) => Attributes::Resource {
            verb: i.verb.to_string(),
            resource: i.resource,
            subresource: i.subresource.unwrap_or_default(),
            namespace: i.namespace,
            name: i.name,
        },
        None => Attributes::Path {
            verb: if *method == Method::GET || *method == Method::HEAD {
                "get".into()
            } else {
                method.as_str().to_lowercase()
            },
            path: path.to_string(),
        },
    };
    decide(state.authz.as_ref(), &user, &attrs).await?;
    Ok(user)
}

async fn decide(authz: &Authorizer, user: &UserInfo, attrs: &Attributes) -> Result<(), Response> {
    match authz.allowed(user, attrs).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(match attrs {
            Attributes::Resource {
                verb,
                resource,
                subresource,
                namespace,
                name,
                ..
            } => ApiError::forbidden(
                &user.name,
                verb,
                resource,
                subresource,
                namespace.as_deref(),
                name.as_deref(),
            ),
            Attributes::Path { verb, path } => ApiError::forbidden_path(&user.name, verb, path),
        }
        .into_response()),
        Err(e) => {
            tracing::warn!(error = %e, "SubjectAccessReview failed");
            Err(ApiError::unavailable("authorization is unavailable").into_response())
        }
    }
}

fn json_with(content_type: &'static str, body: &serde_json::Value) -> Response {
    let mut r = axum::Json(body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

async fn apis(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("as=APIGroupDiscoveryList") && accept.contains("v=v2") {
        json_with(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            &discovery::aggregated(&state.store.views),
        )
    } else {
        axum::Json(discovery::api_group_list()).into_response()
    }
}

async fn group(axum::extract::Path(g): axum::extract::Path<String>) -> Response {
    if g != GROUP {
        return serve::page_not_found();
    }
    axum::Json(discovery::api_group()).into_response()
}

async fn group_version(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    axum::extract::Path((g, v)): axum::extract::Path<(String, String)>,
) -> Response {
    if g != GROUP || v != VERSION {
        return serve::page_not_found();
    }
    axum::Json(discovery::api_resource_list(&state.store.views)).into_response()
}

/// A served OpenAPI document, or 304 when the client holds it already.
fn document(d: &openapi::Document, headers: &axum::http::HeaderMap) -> Response {
    let held = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == d.etag));
    let etag = HeaderValue::from_str(&d.etag).unwrap_or(HeaderValue::from_static("\"\""));
    if held {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::ETAG, etag),
        ],
        d.body.clone(),
    )
        .into_response()
}

async fn openapi_v2(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    headers: axum::http::HeaderMap,
) -> Response {
    document(&state.openapi.v2, &headers)
}

async fn openapi_v3_index(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    headers: axum::http::HeaderMap,
) -> Response {
    document(&state.openapi.v3_index, &headers)
}

async fn openapi_v3(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    axum::extract::Path((g, v)): axum::extract::Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Response {
    if g != GROUP || v != VERSION {
        return serve::page_not_found();
    }
    document(&state.openapi.v3, &headers)
}

/// Keeps the delegated-auth caches within their bounds (evictions and expirations are
/// otherwise applied only as they are used); runs for as long as the process.
pub async fn auth_upkeep(authn: Arc<Authenticator>, authz: Arc<Authorizer>) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        every.tick().await;
        authn.upkeep().await;
        authz.upkeep().await;
    }
}

/// Serves `app` over TLS on `addr` until `shutdown` resolves.
pub async fn serve_tls(
    addr: SocketAddr,
    config: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot listen");
            return Err(e);
        }
    };
    tracing::info!(%addr, "listening (TLS)");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::pin!(shutdown);
    loop {
        let (tcp, remote) = tokio::select! {
            r = listener.accept() => r?,
            _ = &mut shutdown => return Ok(()),
        };
        // As Go's net/http does: without it, several small watch events written back to
        // back on kube-apiserver's one HTTP/2 connection wait for a delayed ACK (~40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let peer = PeerCerts(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            );
            let service = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(peer.clone());
                    app.clone().oneshot(req.map(axum::body::Body::new))
                },
            );
            if let Err(e) = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%remote, error = %e, "connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests;

/// The secure metrics endpoint: `/metrics` over TLS, for principals allowed to `get` the
/// non-resource path `/metrics` (TokenReview + SubjectAccessReview, as for the views).
pub fn metrics_router(
    authn: Arc<Authenticator>,
    authz: Arc<Authorizer>,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> Router {
    Router::new().fallback(move |req: Request| {
        let (authn, authz, render) = (authn.clone(), authz.clone(), render.clone());
        async move {
            let path = req.uri().path().to_string();
            if path != "/metrics" {
                return serve::page_not_found();
            }
            let peer = req
                .extensions()
                .get::<PeerCerts>()
                .cloned()
                .unwrap_or_default();
            let user = match authn.authenticate(&peer, req.headers()).await {
                Ok(u) => u,
                Err(_) => return ApiError::unauthorized().into_response(),
            };
            let attrs = Attributes::Path {
                verb: "get".into(),
                path: path.clone(),
            };
            match decide(&authz, &user, &attrs).await {
                Ok(()) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    render(),
                )
                    .into_response(),
                Err(denied) => denied,
            }
        }
    })
}
