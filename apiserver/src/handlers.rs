//! Routing of `/apis/view.local.sdn.cozystack.io/v1alpha1/...` requests to the views, with
//! content negotiation (JSON, Table, PartialObjectMetadata), list options and errors.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::State;
use crate::registry::Resource;
use crate::status::ApiError;
use crate::views::{self, API_VERSION, GROUP, VERSION};

/// What a request asks for, parsed from its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Parses `/apis/<g>/<v>/[namespaces/<ns>/]<resource>[/<name>[/<sub>]]`.
pub fn parse_path(path: &str) -> Option<Target> {
    let rest = path.strip_prefix(&format!("/apis/{GROUP}/{VERSION}/"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    let (namespace, parts) = match parts.as_slice() {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest.to_vec()),
        _ => (None, parts),
    };
    let (resource, name, subresource) = match parts.as_slice() {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(n.to_string()), None),
        [r, n, s] => (*r, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    if resource.is_empty() || name.as_deref() == Some("") {
        return None;
    }
    Some(Target {
        resource: resource.to_string(),
        namespace,
        name,
        subresource,
    })
}

/// The authorization verb of a request.
pub fn verb(method: &Method, target: &Target, query: &BTreeMap<String, String>) -> &'static str {
    match *method {
        Method::GET | Method::HEAD if target.name.is_some() => "get",
        Method::GET | Method::HEAD
            if query.get("watch").is_some_and(|w| w == "true" || w == "1") =>
        {
            "watch"
        }
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if target.name.is_some() => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

pub fn query_map(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| {
            q.split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (decode(k), decode(v))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the client accepts, in order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Json,
    Table,
    PartialMetadata,
}

pub fn negotiate(headers: &HeaderMap) -> Shape {
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    for part in accept.split(',') {
        let p = part.replace(' ', "");
        if p.contains("as=Table")
            && p.contains("g=meta.k8s.io")
            && p.starts_with("application/json")
        {
            return Shape::Table;
        }
        if p.contains("as=PartialObjectMetadata") && p.starts_with("application/json") {
            return Shape::PartialMetadata;
        }
        if p.starts_with("application/json") || p.starts_with("*/*") || p.is_empty() {
            return Shape::Json;
        }
    }
    Shape::Json
}

/// One computed object of a list, with what a Table row needs.
pub(crate) struct Item {
    pub key: String,
    pub value: Value,
    pub cells: Vec<Value>,
}

pub(crate) fn columns(resource: &str) -> Vec<Value> {
    let col = |name: &str, ty: &str, desc: &str, priority: i32| json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" }, "description": desc, "priority": priority});
    match resource {
        "namespaceaddresses" => vec![
            col("Name", "string", "Namespace", 0),
            col("Claims", "integer", "Claims in the namespace", 0),
            col("Bound", "integer", "Bound claims", 0),
            col("Pending", "integer", "Pending claims", 0),
            col("Lost", "integer", "Lost claims", 0),
            col("IPv4", "integer", "Bound IPv4 addresses", 0),
            col("IPv6", "integer", "Bound IPv6 addresses", 0),
            col("Released", "integer", "Addresses released and retained", 0),
            col(
                "Associated",
                "integer",
                "Bound addresses attached by a driver",
                1,
            ),
            col("Classes", "string", "Classes the namespace draws from", 1),
        ],
        _ => vec![
            col("Name", "string", "Class", 0),
            col("Provisioner", "string", "Driver", 0),
            col("Capacity", "string", "IPv4/IPv6 the driver can hold", 0),
            col("Allocated", "string", "IPv4/IPv6 addresses that exist", 0),
            col("Free", "string", "IPv4/IPv6 capacity left", 0),
            col("Pending", "integer", "Claims waiting for an address", 0),
            col("Released", "integer", "Released addresses", 1),
            col("Conflict", "integer", "Addresses in Conflict", 1),
            col("Lost", "integer", "Addresses Lost", 1),
            col(
                "NextRelease",
                "string",
                "When the next Released address becomes Available",
                1,
            ),
        ],
    }
}

fn pair(p: &views::PerFamily) -> String {
    let f = |n: Option<i64>| n.map_or("-".to_string(), |n| n.to_string());
    format!("{}/{}", f(p.ipv4), f(p.ipv6))
}

/// The caches at one moment, and the views computed from them.
pub(crate) struct Snapshot {
    pub rv: String,
    claims: Vec<std::sync::Arc<address_controller_api::IPAddressClaim>>,
    addresses: Vec<std::sync::Arc<address_controller_api::IPAddress>>,
    classes: Vec<std::sync::Arc<address_controller_api::IPAddressClass>>,
}

impl Snapshot {
    pub fn take(state: &State) -> Snapshot {
        // The revision is read first: a view is never newer than the resourceVersion it
        // reports, so a watch resumed from it misses nothing.
        let rv = state.world.revision.load(Ordering::Acquire).to_string();
        Snapshot {
            rv,
            claims: state.world.claims.store.all(),
            addresses: state.world.addresses.store.all(),
            classes: state.world.classes.store.all(),
        }
    }

    fn one(&self, resource: &Resource, ns: Option<&str>, name: &str) -> Result<Item, ApiError> {
        let (claims, addresses, classes, rv) =
            (&self.claims, &self.addresses, &self.classes, &self.rv);
        match resource.plural {
            "namespaceaddresses" => {
                let ns = ns.unwrap_or_default();
                if name != ns {
                    return Err(ApiError::not_found(resource.plural, name));
                }
                let v = views::namespace_addresses(ns, claims, addresses, rv);
                let s = &v.summary;
                let cells = vec![
                    json!(ns),
                    json!(s.claims.total),
                    json!(s.claims.bound),
                    json!(s.claims.pending),
                    json!(s.claims.lost),
                    json!(s.ipv4),
                    json!(s.ipv6),
                    json!(s.released_retained),
                    json!(s.associated),
                    json!(
                        v.classes
                            .iter()
                            .map(|c| c.class_name.as_str())
                            .filter(|c| !c.is_empty())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                ];
                Ok(Item {
                    key: format!("{ns}/{ns}"),
                    value: serde_json::to_value(v).unwrap_or_default(),
                    cells,
                })
            }
            _ => {
                let class = classes
                    .iter()
                    .find(|c| c.name_any() == name)
                    .ok_or_else(|| ApiError::not_found(resource.plural, name))?;
                let v = views::pool_availability(class, claims, addresses, rv);
                let cells = vec![
                    json!(name),
                    json!(v.provisioner),
                    json!(v.capacity.as_ref().map_or("-/-".into(), pair)),
                    json!(pair(&v.allocated)),
                    json!(v.free.as_ref().map_or("-/-".into(), pair)),
                    json!(v.pending_claims),
                    json!(v.phases["Released"]),
                    json!(v.phases["Conflict"]),
                    json!(v.phases["Lost"]),
                    json!(
                        v.next_release
                            .as_ref()
                            .map_or("<none>".to_string(), |t| t.0.to_string())
                    ),
                ];
                Ok(Item {
                    key: name.to_string(),
                    value: serde_json::to_value(v).unwrap_or_default(),
                    cells,
                })
            }
        }
    }

    /// Every object a list or watch of `target` covers, filtered by the selectors, in
    /// stable order.
    pub fn all(
        &self,
        resource: &Resource,
        target: &Target,
        query: &BTreeMap<String, String>,
    ) -> Result<Vec<Item>, ApiError> {
        let names: Vec<(Option<String>, String)> = match resource.plural {
            "namespaceaddresses" => match &target.namespace {
                // A namespace always has its (possibly empty) holdings object.
                Some(ns) => vec![(Some(ns.clone()), ns.clone())],
                None => views::namespaces(&self.claims, &self.addresses)
                    .into_iter()
                    .map(|ns| (Some(ns.clone()), ns))
                    .collect(),
            },
            _ => self.classes.iter().map(|c| (None, c.name_any())).collect(),
        };
        let field = field_selector(query.get("fieldSelector").map(String::as_str).unwrap_or(""))?;
        let labels = query
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or("")
            .trim()
            .to_string();
        let mut items = Vec::new();
        for (ns, name) in names {
            let matches = field.iter().all(|(k, eq, v)| {
                let actual = if k == "metadata.name" {
                    Some(name.as_str())
                } else {
                    ns.as_deref()
                };
                (actual == Some(v.as_str())) == *eq
            });
            // Views carry no labels: any label requirement except a negation excludes them.
            let labelled =
                labels.is_empty() || labels.split(',').all(|r| r.trim().starts_with('!'));
            if matches && labelled {
                items.push(self.one(resource, ns.as_deref(), &name)?);
            }
        }
        items.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(items)
    }
}

/// Serves one request for a view.
pub fn serve(
    state: &std::sync::Arc<State>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    target: &Target,
) -> Response {
    match serve_inner(state, method, uri, headers, target) {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn serve_inner(
    state: &std::sync::Arc<State>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    target: &Target,
) -> Result<Response, ApiError> {
    let Some(resource) = crate::registry::find(&target.resource) else {
        return Err(ApiError::path_not_found());
    };
    if resource.namespaced != target.namespace.is_some() && target.name.is_some() {
        return Err(ApiError::path_not_found());
    }
    let query = query_map(uri);
    if *method != Method::GET && *method != Method::HEAD {
        return Err(ApiError::method_not_allowed(
            verb(method, target, &query),
            resource.plural,
        ));
    }
    if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return crate::watch::serve(
            state.clone(),
            resource,
            target.clone(),
            query,
            negotiate(headers),
        );
    }
    let snap = Snapshot::take(state);

    // GET of one object or its subresource.
    if let Some(name) = &target.name {
        let item = snap.one(resource, target.namespace.as_deref(), name)?;
        return match target.subresource.as_deref() {
            None => Ok(render_one(item, resource.plural, negotiate(headers))),
            Some("addresses") if resource.plural == "namespaceaddresses" => {
                let ns = target.namespace.as_deref().unwrap_or_default();
                let records = views::address_records(
                    ns,
                    query.get("claim").map(String::as_str),
                    &snap.addresses,
                    &snap.rv,
                );
                Ok(Json(records).into_response())
            }
            Some(_) => Err(ApiError::path_not_found()),
        };
    }

    // LIST, with limit / continue (the token is the key of the last item returned).
    let mut items = snap.all(resource, target, &query)?;
    if let Some(after) = query.get("continue").filter(|c| !c.is_empty()) {
        items.retain(|i| i.key.as_str() > after.as_str());
    }
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let more = items.len() > limit;
    items.truncate(limit);
    let next = if more {
        items.last().map(|i| i.key.clone())
    } else {
        None
    };
    Ok(render_list(
        items,
        resource,
        &snap.rv,
        next,
        negotiate(headers),
    ))
}

/// `metadata.name` / `metadata.namespace` with `=`, `==` or `!=`; anything else is a 400.
fn field_selector(s: &str) -> Result<Vec<(String, bool, String)>, ApiError> {
    let mut out = Vec::new();
    for req in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let (k, eq, v) = if let Some((k, v)) = req.split_once("!=") {
            (k, false, v)
        } else if let Some((k, v)) = req.split_once("==") {
            (k, true, v)
        } else if let Some((k, v)) = req.split_once('=') {
            (k, true, v)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid field selector {req:?}"
            )));
        };
        if k != "metadata.name" && k != "metadata.namespace" {
            return Err(ApiError::bad_request(format!(
                "\"{k}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )));
        }
        out.push((k.to_string(), eq, v.to_string()));
    }
    Ok(out)
}

pub(crate) fn partial(value: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": value["metadata"]})
}

fn render_one(item: Item, resource: &str, shape: Shape) -> Response {
    match shape {
        Shape::Json => Json(item.value).into_response(),
        Shape::PartialMetadata => Json(partial(&item.value)).into_response(),
        Shape::Table => {
            let rv = item.value["metadata"]["resourceVersion"].clone();
            Json(json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
                "columnDefinitions": columns(resource), "rows": [{"cells": item.cells, "object": partial(&item.value)}]}))
            .into_response()
        }
    }
}

fn render_list(
    items: Vec<Item>,
    resource: &crate::registry::Resource,
    rv: &str,
    next: Option<String>,
    shape: Shape,
) -> Response {
    let mut meta = json!({"resourceVersion": rv});
    if let Some(n) = next {
        meta["continue"] = json!(n);
    }
    match shape {
        Shape::Json => Json(json!({"kind": format!("{}List", resource.kind), "apiVersion": API_VERSION, "metadata": meta,
            "items": items.into_iter().map(|i| i.value).collect::<Vec<_>>()}))
        .into_response(),
        Shape::PartialMetadata => Json(json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "items": items.iter().map(|i| partial(&i.value)).collect::<Vec<_>>()}))
        .into_response(),
        Shape::Table => Json(json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "columnDefinitions": columns(resource.plural),
            "rows": items.iter().map(|i| json!({"cells": i.cells, "object": partial(&i.value)})).collect::<Vec<_>>()}))
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let p = |s: &str| parse_path(s);
        assert_eq!(
            p("/apis/view.local.sdn.cozystack.io/v1alpha1/namespaceaddresses"),
            Some(Target {
                resource: "namespaceaddresses".into(),
                namespace: None,
                name: None,
                subresource: None
            })
        );
        assert_eq!(
            p(
                "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/a/namespaceaddresses/a/addresses"
            ),
            Some(Target {
                resource: "namespaceaddresses".into(),
                namespace: Some("a".into()),
                name: Some("a".into()),
                subresource: Some("addresses".into())
            })
        );
        assert_eq!(
            p("/apis/view.local.sdn.cozystack.io/v1alpha1/poolavailabilities/pub"),
            Some(Target {
                resource: "poolavailabilities".into(),
                namespace: None,
                name: Some("pub".into()),
                subresource: None
            })
        );
        assert_eq!(p("/apis/other/v1/x"), None);
        assert_eq!(
            p("/apis/view.local.sdn.cozystack.io/v1alpha1/a/b/c/d"),
            None
        );
    }

    #[test]
    fn negotiation_and_selectors() {
        let h = |a: &str| {
            let mut m = HeaderMap::new();
            m.insert(http::header::ACCEPT, a.parse().unwrap());
            negotiate(&m)
        };
        assert_eq!(
            h(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            Shape::Table
        );
        assert_eq!(
            h("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"),
            Shape::PartialMetadata
        );
        assert_eq!(h("application/json"), Shape::Json);
        assert_eq!(h("*/*"), Shape::Json);
        assert!(field_selector("metadata.name=a,metadata.namespace!=b").is_ok());
        assert_eq!(field_selector("spec.x=1").unwrap_err().code, 400);
        assert_eq!(decode("metadata.name%3Da"), "metadata.name=a");
    }
}
