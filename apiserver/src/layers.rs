//! The views' own layers on the [`address_controller_serving::front`] door: request metrics by view
//! ([`metered`]) and readiness ([`ready`]).

use std::sync::Arc;
use std::time::Instant;

use address_controller_serving::authn::UserInfo;
use address_controller_serving::front::{Described, plain, read_verb};
use address_controller_serving::request::RequestInfo;
use axum::extract::{Request, State as AxumState};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::State;

/// Layer: count every request by verb, resource and code, time it, and log it (watches,
/// which stream, are counted but not logged).
pub async fn metered(
    AxumState(state): AxumState<Arc<State>>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let described = Described::from_parts(&parts);
    let (verb, resource) = metric_labels(&state, &parts.method, described.info.as_ref());
    let path = parts.uri.path().to_string();
    let response = next.run(Request::from_parts(parts, body)).await;
    let code = response.status().as_u16();
    state
        .metrics
        .observe(verb, &resource, code, started.elapsed());
    if verb != "watch" {
        let user = response
            .extensions()
            .get::<UserInfo>()
            .map(|u| u.name.as_str())
            .unwrap_or_default();
        tracing::debug!(%path, %user, code, took = ?started.elapsed(), "request");
    }
    response
}

/// Bounded metric labels: the verb, and the resource (`plural` or `plural/sub`) when it is
/// one of ours, `other` for any other resource path, empty for non-resource paths.
fn metric_labels(
    state: &State,
    method: &Method,
    info: Option<&RequestInfo>,
) -> (&'static str, String) {
    let Some(info) = info else {
        return (read_verb(method).unwrap_or("other"), String::new());
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

/// `/readyz`: the views are built from live caches and the front-proxy settings are loaded.
pub async fn ready(AxumState(state): AxumState<Arc<State>>) -> Response {
    if state.ready() {
        plain(StatusCode::OK, "ok")
    } else {
        plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "[-]views failed: reason withheld\nreadyz check failed",
        )
    }
}
