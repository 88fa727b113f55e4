//! The aggregated API server for `view.local.sdn.cozystack.io/v1alpha1` (SPEC §9): read-only
//! views computed from the controller's in-memory caches, served over TLS behind
//! kube-apiserver's aggregation layer with delegated authentication and authorization.

pub mod authn;
pub mod authz;
pub mod handlers;
pub mod openapi;
pub mod registry;
pub mod status;
pub mod tls;
pub mod views;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use address_controller_runtime::world::World;
use axum::Router;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::ServiceExt;

use crate::authn::{Authenticator, PeerCerts};
use crate::authz::{Attributes, Authorizer};
use crate::status::ApiError;

/// Shared state of the server.
pub struct State {
    pub world: World,
    pub authn: Arc<Authenticator>,
    pub authz: Arc<Authorizer>,
}

impl State {
    fn ready(&self) -> bool {
        self.world.health.ready() && self.authn.ready()
    }
}

/// The router. Requests carry the TLS peer's certificates as a [`PeerCerts`] extension.
pub fn router(state: Arc<State>) -> Router {
    Router::new().fallback(move |req: Request| {
        let state = state.clone();
        async move { handle(state, req).await }
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

async fn handle(state: Arc<State>, req: Request) -> Response {
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
                    "[-]caches failed: reason withheld\nreadyz check failed",
                )
            };
        }
        _ => {}
    }
    let peer = req
        .extensions()
        .get::<PeerCerts>()
        .cloned()
        .unwrap_or_default();
    let user = match state.authn.authenticate(&peer, req.headers()).await {
        Ok(u) => u,
        Err(authn::AuthnError::Unauthorized(why)) => {
            tracing::debug!(%path, why, "unauthorized");
            return ApiError::unauthorized().into_response();
        }
    };
    let method = req.method().clone();
    let target = handlers::parse_path(&path);
    let query = handlers::query_map(req.uri());
    let attrs = match &target {
        Some(t) => Attributes::Resource {
            verb: handlers::verb(&method, t, &query).to_string(),
            resource: t.resource.clone(),
            subresource: t.subresource.clone().unwrap_or_default(),
            namespace: t.namespace.clone(),
            name: t.name.clone(),
        },
        None => Attributes::Path {
            verb: if method == Method::GET || method == Method::HEAD {
                "get".into()
            } else {
                method.as_str().to_lowercase()
            },
            path: path.clone(),
        },
    };
    match state.authz.allowed(&user, &attrs).await {
        Ok(true) => {}
        Ok(false) => {
            return match &attrs {
                Attributes::Resource {
                    verb,
                    resource,
                    subresource,
                    namespace,
                    name,
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
            .into_response();
        }
        Err(e) => {
            tracing::warn!(error = %e, "SubjectAccessReview failed");
            return ApiError::unavailable("authorization is unavailable").into_response();
        }
    }
    if !state.world.health.synced() {
        return ApiError::unavailable("caches are not synced yet").into_response();
    }
    let headers = req.headers().clone();
    let uri = req.uri().clone();
    let group = format!("/apis/{}", views::GROUP);
    let version = format!("{group}/{}", views::VERSION);
    match (target, path.trim_end_matches('/')) {
        (Some(t), _) => handlers::serve(&state, &method, &uri, &headers, &t),
        (None, "/apis") => {
            let accept = headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if accept.contains("as=APIGroupDiscoveryList") && accept.contains("v=v2") {
                let body =
                    serde_json::to_vec(&registry::aggregated_discovery()).unwrap_or_default();
                (
                    StatusCode::OK,
                    [(
                        header::CONTENT_TYPE,
                        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                    )],
                    body,
                )
                    .into_response()
            } else {
                axum::Json(registry::api_group_list()).into_response()
            }
        }
        (None, p) if p == group => axum::Json(registry::api_group()).into_response(),
        (None, "/openapi/v2") => axum::Json(openapi::v2()).into_response(),
        (None, "/openapi/v3") => axum::Json(openapi::v3_index()).into_response(),
        (None, p) if p == format!("/openapi/v3{group}/{}", views::VERSION) => {
            axum::Json(openapi::v3()).into_response()
        }
        (None, p) if p == version => axum::Json(registry::api_resource_list()).into_response(),
        _ => ApiError::path_not_found().into_response(),
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
                return ApiError::path_not_found().into_response();
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
            match authz.allowed(&user, &attrs).await {
                Ok(true) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    render(),
                )
                    .into_response(),
                Ok(false) => ApiError::forbidden_path(&user.name, "get", &path).into_response(),
                Err(e) => {
                    tracing::warn!(error = %e, "SubjectAccessReview failed");
                    ApiError::unavailable("authorization is unavailable").into_response()
                }
            }
        }
    })
}
