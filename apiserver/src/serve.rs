//! The resource handlers: list (and watch), get, subresources — one generic implementation
//! for every view, answering as kube-apiserver answers for a custom resource of the same
//! shape (the differential test in `tests/tests/views_conformance.rs` holds it to that).

// Handlers answer `Result<Response, Response>`: the error is an answer too.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State as AxumState};
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};

use crate::State;
use crate::negotiate::{Format, negotiate};
use crate::render::{self, IncludeObject, ListMeta};
use crate::request::{ContinueToken, ListOptions, Query, RvMatch};
use crate::status::ApiError;
use crate::store::Entry;
use crate::{GROUP, VERSION};

/// How long a request for a resourceVersion newer than this replica's waits for it.
const WAIT_FOR_REVISION: Duration = Duration::from_secs(3);

/// What kube-apiserver answers for a path that names nothing: a plain-text 404.
pub fn page_not_found() -> Response {
    (
        axum::http::StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

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
        Err(ApiError::method_not_allowed(verb, resource).into_response())
    }
}

/// The verb of a write request (views answer every write 405).
fn write_verb(method: &Method, collection: bool) -> &'static str {
    match (method.as_str(), collection) {
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => "unknown",
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

pub async fn collection(
    AxumState(state): AxumState<Arc<State>>,
    Path((group, version, resource)): Path<(String, String, String)>,
    method: Method,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    respond(
        list_or_watch(
            &state, &group, &version, None, &resource, &method, q, &headers,
        )
        .await,
    )
}

pub async fn collection_ns(
    AxumState(state): AxumState<Arc<State>>,
    Path((group, version, ns, resource)): Path<(String, String, String, String)>,
    method: Method,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    respond(
        list_or_watch(
            &state,
            &group,
            &version,
            Some(ns),
            &resource,
            &method,
            q,
            &headers,
        )
        .await,
    )
}

pub async fn item(
    AxumState(state): AxumState<Arc<State>>,
    Path((group, version, resource, name)): Path<(String, String, String, String)>,
    method: Method,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    respond(get(
        &state, &group, &version, None, &resource, &name, None, &method, q, &headers,
    ))
}

pub async fn item_ns(
    AxumState(state): AxumState<Arc<State>>,
    Path((group, version, ns, resource, name)): Path<(String, String, String, String, String)>,
    method: Method,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    respond(get(
        &state,
        &group,
        &version,
        Some(ns),
        &resource,
        &name,
        None,
        &method,
        q,
        &headers,
    ))
}

pub async fn sub(
    AxumState(state): AxumState<Arc<State>>,
    Path((group, version, resource, name, sub)): Path<(String, String, String, String, String)>,
    method: Method,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    respond(get(
        &state,
        &group,
        &version,
        None,
        &resource,
        &name,
        Some(sub),
        &method,
        q,
        &headers,
    ))
}

pub async fn sub_ns(
    AxumState(state): AxumState<Arc<State>>,
    Path((group, version, ns, resource, name, sub)): Path<(
        String,
        String,
        String,
        String,
        String,
        String,
    )>,
    method: Method,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    respond(get(
        &state,
        &group,
        &version,
        Some(ns),
        &resource,
        &name,
        Some(sub),
        &method,
        q,
        &headers,
    ))
}

fn respond(r: Result<Response, Response>) -> Response {
    r.unwrap_or_else(|e| e)
}

#[allow(clippy::too_many_arguments)]
async fn list_or_watch(
    state: &Arc<State>,
    group: &str,
    version: &str,
    ns: Option<String>,
    resource: &str,
    method: &Method,
    q: Option<String>,
    headers: &HeaderMap,
) -> Result<Response, Response> {
    let view = view_for(state, group, version, resource, ns.is_some())?;
    let query = Query::parse(q.as_deref());
    read_only(method, write_verb(method, true), resource)?;
    let info = state.store.views[view].info();
    let opts = ListOptions::parse(&query).map_err(IntoResponse::into_response)?;
    opts.fields
        .check(info.field_labels)
        .map_err(|e| ApiError::bad_request(e.0).into_response())?;
    let format = negotiate(accept(headers)).map_err(IntoResponse::into_response)?;
    ready(state)?;
    let include = IncludeObject::parse(query.get("includeObject"));
    if opts.watch {
        return crate::watch::serve(state.clone(), view, ns, opts, format, include).await;
    }
    list(state, view, ns.as_deref(), &opts, format, include).await
}

/// Whether an object passes a request's namespace and selectors.
pub fn selected(e: &Entry, ns: Option<&str>, opts: &ListOptions) -> bool {
    ns.is_none_or(|ns| e.namespace.as_deref() == Some(ns))
        && opts.labels.matches(&e.labels)
        && opts.fields.matches(|f| match f {
            "metadata.name" => Some(e.name.clone()),
            "metadata.namespace" => e.namespace.clone(),
            _ => None,
        })
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
        .filter(|e| selected(e, ns, opts))
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

#[allow(clippy::too_many_arguments)]
fn get(
    state: &State,
    group: &str,
    version: &str,
    ns: Option<String>,
    resource: &str,
    name: &str,
    sub: Option<String>,
    method: &Method,
    q: Option<String>,
    headers: &HeaderMap,
) -> Result<Response, Response> {
    let view = view_for(state, group, version, resource, ns.is_some())?;
    let v = &state.store.views[view];
    let info = v.info();
    // A namespaced object has no cluster-scoped path.
    if info.namespaced && ns.is_none() {
        return Err(page_not_found());
    }
    read_only(method, write_verb(method, false), resource)?;
    let format = negotiate(accept(headers)).map_err(IntoResponse::into_response)?;
    ready(state)?;
    let query = Query::parse(q.as_deref());
    if let Some(sub) = sub {
        if !info.subresources.iter().any(|s| s.name == sub) {
            // kube-apiserver: the object "is not found" under a subresource it lacks.
            return Err(ApiError::not_found(info.plural, name).into_response());
        }
        return match v.subresource(&sub, ns.as_deref(), name, &query, &state.store.world) {
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
            None => return Err(ApiError::not_found(info.plural, name).into_response()),
        },
    };
    let include = IncludeObject::parse(query.get("includeObject"));
    Ok(render::one(info, &entry, format, include))
}
