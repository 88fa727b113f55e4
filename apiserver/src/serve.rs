//! The resource handlers: list (and watch), get, subresources — one generic implementation
//! for every view, answering as kube-apiserver answers for a custom resource of the same
//! shape (the differential test in `tests/tests/views_conformance.rs` holds it to that).

// Handlers answer `Result<Response, Response>`: the error is an answer too.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{FromRequestParts, State as AxumState};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};

use crate::group::{GROUP, VERSION};
use crate::list_options::{ContinueToken, ListOptions, RvMatch};
use crate::render::{self, IncludeObject, ListMeta};
use crate::state::State;
use crate::store::Entry;
use address_controller_serving::front::Described;
use address_controller_serving::negotiate::{Format, negotiate};
use address_controller_serving::request::Query;
use address_controller_serving::request::verb_of;
use address_controller_serving::status::{ApiError, page_not_found};

/// How long a request for a resourceVersion newer than this replica's waits for it.
const WAIT_FOR_REVISION: Duration = Duration::from_secs(3);

/// The view a path names, when the path is well formed for it.
fn view_for(
    state: &State,
    group: &str,
    version: &str,
    resource: &str,
    namespaced_path: bool,
) -> Result<usize, Response> {
    if group != GROUP || version != VERSION {
        return Err(page_not_found());
    }
    let Some(i) = state
        .store
        .views
        .iter()
        .position(|v| v.info().plural == resource)
    else {
        return Err(page_not_found());
    };
    // A cluster-scoped resource has no namespaced path.
    if namespaced_path && !state.store.views[i].info().namespaced {
        return Err(page_not_found());
    }
    Ok(i)
}

fn read_only(method: &Method, verb: &'static str, resource: &str) -> Result<(), Response> {
    if *method == Method::GET || *method == Method::HEAD {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed(GROUP, verb, resource).into_response())
    }
}

fn accept(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok())
}

/// Resources are served only from views that are built, from caches that are live: a
/// replica whose watches went silent answers 503 rather than stale holdings.
fn ready(state: &State) -> Result<(), Response> {
    if !state.store.built() {
        Err(ApiError::unavailable("the views are not built yet").into_response())
    } else if !state.store.world.health.caches_live() {
        Err(
            ApiError::unavailable("the views are stale: this replica's watches are not live")
                .into_response(),
        )
    } else {
        Ok(())
    }
}

/// What a resource path names: one of the views, at a namespace or across all, and an
/// object (and its subresource) or the collection. Extracted from the request's
/// [`Described`]; a path that names no view is a plain 404.
pub struct Target {
    view: usize,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl FromRequestParts<Arc<State>> for Target {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Target, Response> {
        let described = Described::from_parts(parts);
        let Some(info) = described.info.as_ref().filter(|i| !i.beyond) else {
            return Err(page_not_found());
        };
        let view = view_for(
            state,
            &info.group,
            &info.version,
            &info.resource,
            info.namespace.is_some(),
        )?;
        Ok(Target {
            view,
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            sub: info.subresource.clone(),
        })
    }
}

/// Every resource request: a collection is listed (or watched), an object got (or its
/// subresource); every write is refused 405.
pub async fn resource(
    AxumState(state): AxumState<Arc<State>>,
    target: Target,
    Extension(described): Extension<Arc<Described>>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let query = &described.query;
    match target.name.clone() {
        None => list_or_watch(&state, target, &method, query, &headers).await,
        Some(name) => get(&state, target, &name, &method, query, &headers),
    }
    .unwrap_or_else(|e| e)
}

async fn list_or_watch(
    state: &Arc<State>,
    target: Target,
    method: &Method,
    query: &Query,
    headers: &HeaderMap,
) -> Result<Response, Response> {
    let Target {
        view,
        namespace: ns,
        ..
    } = target;
    let info = state.store.views[view].info();
    read_only(method, verb_of(method, false, false), info.plural)?;
    let mut opts = ListOptions::parse(query).map_err(IntoResponse::into_response)?;
    opts.resolve_fields(info.field_labels, info.computed_fields)
        .map_err(IntoResponse::into_response)?;
    let format = negotiate(accept(headers)).map_err(IntoResponse::into_response)?;
    ready(state)?;
    let include = IncludeObject::parse(query.get("includeObject"));
    if opts.watch {
        return crate::watch::serve(state.clone(), view, ns, opts, format, include).await;
    }
    list(state, view, ns.as_deref(), &opts, format, include).await
}

async fn list(
    state: &State,
    view: usize,
    ns: Option<&str>,
    opts: &ListOptions,
    format: Format,
    include: IncludeObject,
) -> Result<Response, Response> {
    let store = &state.store;
    if let Some(rv) = opts.resource_version.filter(|rv| *rv > 0)
        && !store.wait_for_revision(rv, WAIT_FOR_REVISION).await
    {
        return Err(ApiError::too_large_resource_version(rv, store.revision()).into_response());
    }
    // Which state: a continued list's (consistent across its pages, as etcd's), an exact
    // revision's, or the latest.
    let snap = match (&opts.continue_from, opts.rv_match, opts.resource_version) {
        (Some(token), _, _) if token.rv > 0 => {
            let rv = token.rv.unsigned_abs();
            match store.snapshot_at(view, rv) {
                Some(s) => s,
                None => {
                    // kube-apiserver's answer: 410, with a token that continues from the
                    // current state instead (an inconsistent list, the client's choice).
                    let again = ContinueToken {
                        v: "meta.k8s.io/v1".into(),
                        rv: -1,
                        start: token.start.clone(),
                    };
                    return Err(ApiError::expired_continue(&again.encode()).into_response());
                }
            }
        }
        (None, Some(RvMatch::Exact), Some(rv)) => match store.snapshot_at(view, rv) {
            Some(s) => s,
            None => {
                return Err(ApiError::gone(format!(
                    "too old resource version: {rv} ({})",
                    store.oldest()
                ))
                .into_response());
            }
        },
        _ => store.snapshot(view),
    };
    let start = opts.continue_from.as_ref().map(|t| t.start.as_str());
    let mut items: Vec<Arc<Entry>> = snap
        .objects
        .into_iter()
        .filter(|e| start.is_none_or(|s| e.key.as_str() >= s))
        .filter(|e| e.selected(ns, opts))
        .collect();
    let mut meta = ListMeta {
        resource_version: snap.revision,
        continue_: None,
        remaining: None,
    };
    // kube-apiserver serves `resourceVersion=0` from its cache, whole: no paging.
    let paged = opts.resource_version != Some(0) || opts.continue_from.is_some();
    if let Some(limit) = opts
        .limit
        .filter(|l| *l > 0 && paged)
        .and_then(|l| usize::try_from(l).ok())
        && items.len() > limit
    {
        let rest = items.len() - limit;
        items.truncate(limit);
        let last = items.last().map(|e| e.key.clone()).unwrap_or_default();
        meta.continue_ = Some(
            ContinueToken {
                v: "meta.k8s.io/v1".into(),
                rv: i64::try_from(snap.revision).unwrap_or(i64::MAX),
                // The next page starts right after the last key.
                start: format!("{last}\u{0}"),
            }
            .encode(),
        );
        // kube-apiserver counts the rest only when nothing filters it.
        if opts.labels.0.is_empty() && opts.fields.0.is_empty() {
            meta.remaining = Some(rest);
        }
    }
    Ok(render::list(
        store.views[view].info(),
        &items,
        &meta,
        format,
        include,
    ))
}

fn get(
    state: &State,
    target: Target,
    name: &str,
    method: &Method,
    query: &Query,
    headers: &HeaderMap,
) -> Result<Response, Response> {
    let Target {
        view,
        namespace: ns,
        sub,
        ..
    } = target;
    let v = &state.store.views[view];
    let info = v.info();
    // A namespaced object has no cluster-scoped path.
    if info.namespaced && ns.is_none() {
        return Err(page_not_found());
    }
    read_only(method, verb_of(method, true, false), info.plural)?;
    let format = negotiate(accept(headers)).map_err(IntoResponse::into_response)?;
    ready(state)?;
    if let Some(sub) = sub {
        if !info.subresources.iter().any(|s| s.name == sub) {
            // kube-apiserver: the object "is not found" under a subresource it lacks.
            return Err(ApiError::not_found(GROUP, info.plural, name).into_response());
        }
        return match v.subresource(&sub, ns.as_deref(), name, query, &state.store.world) {
            Some(Ok(value)) => Ok(match format {
                Format::Yaml => (
                    axum::http::StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/yaml")],
                    serde_yaml::to_string(&value).unwrap_or_default(),
                )
                    .into_response(),
                _ => axum::Json(value).into_response(),
            }),
            Some(Err(e)) => Err(e.into_response()),
            None => Err(page_not_found()),
        };
    }
    let key = match &ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    let (revision, entry) = state.store.get(view, &key);
    let entry = match entry {
        Some(e) => e,
        None => match v.absent(ns.as_deref(), name, &state.store.world) {
            Some(c) => Arc::new(crate::store::entry(key, c, revision)),
            None => return Err(ApiError::not_found(GROUP, info.plural, name).into_response()),
        },
    };
    let include = IncludeObject::parse(query.get("includeObject"));
    Ok(render::one(info, &entry, format, include))
}
