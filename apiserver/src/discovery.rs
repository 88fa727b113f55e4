//! Discovery — `/apis` (legacy `APIGroupList`, or aggregated discovery v2 when asked),
//! `/apis/<group>`, `/apis/<group>/<version>` — derived from the resource modules, never
//! written by hand.

use std::sync::Arc;

use axum::extract::{Path, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::group::{GROUP, VERSION};
use crate::openapi;
use crate::resources::View;
use crate::state::State;
use address_controller_serving::status::page_not_found;

/// `GET /apis/<group>/<version>`: the legacy `APIResourceList`.
pub fn api_resource_list(views: &[Arc<dyn View>]) -> Value {
    let mut resources = Vec::new();
    for v in views {
        let r = v.info();
        resources.push(json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs, "shortNames": r.short_names, "categories": r.categories}));
        for s in r.subresources {
            resources.push(
                json!({"name": format!("{}/{}", r.plural, s.name), "singularName": "",
                "namespaced": r.namespaced, "kind": s.kind, "verbs": s.verbs}),
            );
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"), "resources": resources})
}

/// `GET /apis/<group>`: the `APIGroup`.
pub fn api_group() -> Value {
    let gv = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv], "preferredVersion": gv})
}

/// `GET /apis`: the legacy `APIGroupList`.
pub fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]})
}

/// `GET /apis` with the aggregated discovery Accept: `APIGroupDiscoveryList` (v2).
pub fn aggregated(views: &[Arc<dyn View>]) -> Value {
    let resources: Vec<Value> = views
        .iter()
        .map(|v| {
            let r = v.info();
            let subs: Vec<Value> = r
                .subresources
                .iter()
                .map(|s| json!({"subresource": s.name, "responseKind": {"group": GROUP, "version": VERSION, "kind": s.kind}, "verbs": s.verbs}))
                .collect();
            let mut d = json!({"resource": r.plural, "responseKind": {"group": GROUP, "version": VERSION, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" }, "singularResource": r.singular,
                "verbs": r.verbs, "shortNames": r.short_names, "categories": r.categories});
            if !subs.is_empty() {
                d["subresources"] = Value::Array(subs);
            }
            d
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
        "items": [{"metadata": {"name": GROUP, "creationTimestamp": null},
            "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}]}]})
}

// The handlers: discovery and the OpenAPI documents.

fn json_with(content_type: &'static str, body: &serde_json::Value) -> Response {
    let mut r = axum::Json(body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub async fn apis(AxumState(state): AxumState<Arc<State>>, headers: HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("as=APIGroupDiscoveryList") && accept.contains("v=v2") {
        json_with(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            &aggregated(&state.store.views),
        )
    } else {
        axum::Json(api_group_list()).into_response()
    }
}

pub async fn group(Path(g): Path<String>) -> Response {
    if g != GROUP {
        return page_not_found();
    }
    axum::Json(api_group()).into_response()
}

pub async fn group_version(
    AxumState(state): AxumState<Arc<State>>,
    Path((g, v)): Path<(String, String)>,
) -> Response {
    if g != GROUP || v != VERSION {
        return page_not_found();
    }
    axum::Json(api_resource_list(&state.store.views)).into_response()
}

/// A served OpenAPI document, or 304 when the client holds it already.
fn document(d: &openapi::Document, headers: &HeaderMap) -> Response {
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

pub async fn openapi_v2(AxumState(state): AxumState<Arc<State>>, headers: HeaderMap) -> Response {
    document(&state.openapi.v2, &headers)
}

pub async fn openapi_v3_index(
    AxumState(state): AxumState<Arc<State>>,
    headers: HeaderMap,
) -> Response {
    document(&state.openapi.v3_index, &headers)
}

pub async fn openapi_v3(
    AxumState(state): AxumState<Arc<State>>,
    Path((g, v)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if g != GROUP || v != VERSION {
        return page_not_found();
    }
    document(&state.openapi.v3, &headers)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn discovery_lists_every_resource_and_subresource() {
        let views = crate::resources::all();
        let legacy = api_resource_list(&views);
        let names: Vec<&str> = legacy["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "namespaceaddresses",
                "namespaceaddresses/addresses",
                "poolavailabilities",
                "addressholdings"
            ]
        );
        let v2 = aggregated(&views);
        let res = &v2["items"][0]["versions"][0]["resources"];
        assert_eq!(res[0]["subresources"][0]["subresource"], "addresses");
        assert_eq!(res[1]["scope"], "Cluster");
    }
}
