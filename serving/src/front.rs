//! The front door: what every request passes before a handler sees it, as tower layers in
//! the order kube-apiserver's filters run — what the request asks for ([`describe`], parsed
//! once), errors in the client's encoding ([`yaml_errors`]), a place in flight ([`admit`]),
//! authentication and authorization ([`authenticate`]). The views' router (which adds its
//! request metrics between them) and the secure `/metrics` router use the same layers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::authn::{self, Authenticator, PeerCerts, UserInfo};
use crate::authz::{Attributes, Authorizer, AuthzError};
use crate::limits::{GuardedBody, InFlight};
use crate::listener::Connection;
use crate::negotiate;
use crate::request::{Query, RequestInfo};
use crate::status::ApiError;

/// What a request asks for, parsed once from its method, path and query: the authorizer,
/// the metrics and the handlers all read this (kube-apiserver's `RequestInfo`).
#[derive(Debug)]
pub struct Described {
    pub query: Query,
    /// `None` for a path that is not a resource path (discovery, OpenAPI, `/metrics`).
    pub info: Option<RequestInfo>,
}

impl Described {
    fn of(method: &Method, uri: &Uri) -> Described {
        let query = Query::parse(uri.query());
        let info = RequestInfo::parse(method, uri.path(), &query);
        Described { query, info }
    }

    /// The description the [`describe`] layer attached (or a fresh one, for a request
    /// that did not pass it).
    fn attached(extensions: &http::Extensions, method: &Method, uri: &Uri) -> Arc<Described> {
        extensions
            .get::<Arc<Described>>()
            .cloned()
            .unwrap_or_else(|| Arc::new(Described::of(method, uri)))
    }

    /// `Described::attached` to a request's parts.
    pub fn from_parts(parts: &Parts) -> Arc<Described> {
        Self::attached(&parts.extensions, &parts.method, &parts.uri)
    }

    /// `Described::attached` to a whole request.
    pub fn of_request(req: &Request) -> Arc<Described> {
        Self::attached(req.extensions(), req.method(), req.uri())
    }
}

/// Layer: parse what the request asks for and attach it as an extension.
pub async fn describe(mut req: Request, next: Next) -> Response {
    let d = Arc::new(Described::of(req.method(), req.uri()));
    req.extensions_mut().insert(d);
    next.run(req).await
}

/// `/apis/g/v/things/` is `/apis/g/v/things` (kube-apiserver answers both). Runs before
/// routing.
pub fn without_trailing_slash(mut req: Request) -> Request {
    let uri = req.uri();
    let path = uri.path();
    if path.len() <= 1 || !path.ends_with('/') {
        return req;
    }
    let trimmed = path.trim_end_matches('/');
    let pq = match uri.query() {
        Some(q) => format!("{trimmed}?{q}"),
        None => trimmed.to_string(),
    };
    if let Ok(u) = pq.parse() {
        *req.uri_mut() = u;
    }
    req
}

/// The delegated authentication and authorization of a server, and its places for
/// requests in flight.
#[derive(Clone)]
pub struct Access {
    pub authn: Arc<Authenticator>,
    pub authz: Arc<Authorizer>,
    pub inflight: Arc<InFlight>,
}

/// Layer: a place in flight for the request — a watch among the watches, any other among
/// the requests — held until its response body is done; none left: 429 with
/// `Retry-After: 1` at once, before any review is asked for (kube-apiserver's max-in-flight
/// filter).
pub async fn admit(State(access): State<Access>, req: Request, next: Next) -> Response {
    let watch = Described::of_request(&req).query.watch();
    let Some(place) = access.inflight.admit(watch) else {
        return ApiError::too_many_requests().into_response();
    };
    next.run(req)
        .await
        .map(|body| GuardedBody::wrap(body, place))
}

/// Layer: authenticate (front-proxy certificate or bearer token) and authorize
/// (SubjectAccessReview) the request: 401, 403 or 503 stop it here. The user rides on the
/// response for the request log.
pub async fn authenticate(State(access): State<Access>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let described = Described::from_parts(&parts);
    let peer = parts
        .extensions
        .get::<PeerCerts>()
        .cloned()
        .unwrap_or_default();
    let user = match access.authn.authenticate(&peer, &parts.headers).await {
        Ok((user, proof)) => {
            // The connection proved who it is: it leaves the strangers' places and budget.
            // Or it proved nothing, and a token it presented sends it back among them.
            if let Some(conn) = parts.extensions.get::<Arc<Connection>>() {
                match proof {
                    Some(proof) => conn.prove(proof),
                    None => conn.settle(),
                }
            }
            user
        }
        Err(e) => {
            if let Some(conn) = parts.extensions.get::<Arc<Connection>>() {
                conn.settle();
            }
            return match e {
                authn::AuthnError::Unauthorized(why) => {
                    tracing::debug!(path = %parts.uri.path(), why, "unauthorized");
                    ApiError::unauthorized().into_response()
                }
                authn::AuthnError::Overloaded => ApiError::too_many_requests().into_response(),
            };
        }
    };
    let attrs = attributes(&parts.method, parts.uri.path(), described.info.as_ref());
    if let Err(denied) = decide(&access.authz, &user, &attrs).await {
        return denied;
    }
    let mut response = next.run(Request::from_parts(parts, body)).await;
    response.extensions_mut().insert(user);
    response
}

/// What the authorizer is asked about a request.
fn attributes(method: &Method, path: &str, info: Option<&RequestInfo>) -> Attributes {
    match info {
        Some(i) => Attributes::Resource {
            verb: i.verb.to_string(),
            group: i.group.clone(),
            version: i.version.clone(),
            resource: i.resource.clone(),
            subresource: i.subresource.clone().unwrap_or_default(),
            namespace: i.namespace.clone(),
            name: i.name.clone(),
        },
        None => Attributes::Path {
            verb: read_verb(method).map_or_else(|| method.as_str().to_lowercase(), String::from),
            path: path.to_string(),
        },
    }
}

/// `get` for a reading method (GET, HEAD), as kube-apiserver names non-resource reads.
pub fn read_verb(method: &Method) -> Option<&'static str> {
    (*method == Method::GET || *method == Method::HEAD).then_some("get")
}

async fn decide(authz: &Authorizer, user: &UserInfo, attrs: &Attributes) -> Result<(), Response> {
    match authz.allowed(user, attrs).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(match attrs {
            Attributes::Resource {
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
                ..
            } => ApiError::forbidden(
                &user.name,
                group,
                verb,
                resource,
                subresource,
                namespace.as_deref(),
                name.as_deref(),
            ),
            Attributes::Path { verb, path } => ApiError::forbidden_path(&user.name, verb, path),
        }
        .into_response()),
        Err(e) if matches!(*e, AuthzError::Overloaded) => {
            Err(ApiError::too_many_requests().into_response())
        }
        Err(e) => {
            tracing::warn!(error = %e, "SubjectAccessReview failed");
            Err(ApiError::unavailable("authorization is unavailable").into_response())
        }
    }
}

/// Layer: errors come in the encoding the client asked for, as kube-apiserver's do — a
/// JSON `Status` is re-encoded as YAML for a client that accepts YAML.
pub async fn yaml_errors(req: Request, next: Next) -> Response {
    let yaml = wants_yaml(req.headers());
    let response = next.run(req).await;
    if yaml && response.status().as_u16() >= 400 {
        status_as_yaml(response).await
    } else {
        response
    }
}

fn wants_yaml(headers: &HeaderMap) -> bool {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    negotiate::negotiate(accept).ok() == Some(negotiate::Format::Yaml)
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

pub fn plain(code: StatusCode, body: &'static str) -> Response {
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

/// `/healthz`, `/livez`: always allowed, never authenticated (kubelet probes are anonymous).
pub async fn alive() -> Response {
    plain(StatusCode::OK, "ok")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The group asked of the authorizer is the request's, not a constant of the views: a
    /// SubjectAccessReview about another group's path names that group.
    #[test]
    fn the_reviewed_group_is_the_requests() {
        let uri: Uri = "/apis/other.example.io/v2/namespaces/a/things/x"
            .parse()
            .unwrap();
        let d = Described::of(&Method::GET, &uri);
        match attributes(&Method::GET, uri.path(), d.info.as_ref()) {
            Attributes::Resource {
                group,
                version,
                resource,
                namespace,
                name,
                verb,
                ..
            } => assert_eq!(
                (
                    group.as_str(),
                    version.as_str(),
                    resource.as_str(),
                    namespace.as_deref(),
                    name.as_deref(),
                    verb.as_str()
                ),
                (
                    "other.example.io",
                    "v2",
                    "things",
                    Some("a"),
                    Some("x"),
                    "get"
                )
            ),
            other => panic!("not a resource: {other:?}"),
        }
        let d = Described::of(&Method::GET, &"/metrics".parse().unwrap());
        assert_eq!(
            attributes(&Method::GET, "/metrics", d.info.as_ref()),
            Attributes::Path {
                verb: "get".into(),
                path: "/metrics".into()
            }
        );
    }
}
