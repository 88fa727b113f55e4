//! Rendering objects and lists of a view in the negotiated format.

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::group::API_VERSION;
use crate::resources::ResourceInfo;
use crate::store::Entry;
use address_controller_serving::negotiate::Format;
use address_controller_serving::status::ApiError;

/// `PartialObjectMetadata` of an object.
pub fn partial(e: &Entry, version: &str) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": format!("meta.k8s.io/{version}"), "metadata": e.metadata()})
}

pub fn columns(info: &ResourceInfo) -> Vec<Value> {
    info.columns.iter().map(|c| c.definition()).collect()
}

/// `includeObject` of a Table request: `None`, `Metadata` (the default) or `Object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(q: Option<&str>) -> IncludeObject {
        match q {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

pub fn row(e: &Entry, version: &str, include: IncludeObject) -> Value {
    let mut r = json!({"cells": e.cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => r["object"] = partial(e, version),
        IncludeObject::Object => r["object"] = e.value(),
    }
    r
}

fn body(format: Format, v: &Value) -> Response {
    match format {
        Format::Yaml => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/yaml")],
            serde_yaml::to_string(v).unwrap_or_default(),
        )
            .into_response(),
        _ => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(v).unwrap_or_default(),
        )
            .into_response(),
    }
}

/// One object.
pub fn one(info: &ResourceInfo, e: &Entry, format: Format, include: IncludeObject) -> Response {
    match format {
        Format::Json => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(e.json.clone()),
        )
            .into_response(),
        Format::Yaml => body(format, &e.value()),
        Format::Partial(v) => body(format, &partial(e, v)),
        // What kube-apiserver answers when a list's form is asked of one object.
        Format::PartialList(_) => ApiError::internal("content is not a list").into_response(),
        Format::Table(v) => body(
            format,
            &json!({"kind": "Table", "apiVersion": format!("meta.k8s.io/{v}"),
                "metadata": {"resourceVersion": e.rv.to_string()},
                "columnDefinitions": columns(info), "rows": [row(e, v, include)]}),
        ),
    }
}

/// List metadata: resourceVersion, continue, remainingItemCount.
pub struct ListMeta {
    pub resource_version: u64,
    pub continue_: Option<String>,
    pub remaining: Option<usize>,
}

impl ListMeta {
    fn value(&self) -> Value {
        let mut m = json!({"resourceVersion": self.resource_version.to_string()});
        if let Some(c) = &self.continue_ {
            m["continue"] = json!(c);
        }
        if let Some(r) = self.remaining {
            m["remainingItemCount"] = json!(r);
        }
        m
    }
}

/// A list of objects.
pub fn list(
    info: &ResourceInfo,
    items: &[std::sync::Arc<Entry>],
    meta: &ListMeta,
    format: Format,
    include: IncludeObject,
) -> Response {
    match format {
        Format::Json => {
            // Items are sent as serialized: a list costs no re-encoding of its objects.
            let mut out =
                Vec::with_capacity(64 + items.iter().map(|e| e.json.len() + 1).sum::<usize>());
            out.extend_from_slice(
                format!(
                    "{{\"kind\":\"{}List\",\"apiVersion\":\"{API_VERSION}\",\"metadata\":{},\"items\":[",
                    info.kind,
                    meta.value()
                )
                .as_bytes(),
            );
            for (i, e) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&e.json);
            }
            out.extend_from_slice(b"]}");
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                Bytes::from(out),
            )
                .into_response()
        }
        Format::Yaml => body(
            format,
            &json!({"kind": format!("{}List", info.kind), "apiVersion": API_VERSION, "metadata": meta.value(),
                "items": items.iter().map(|e| e.value()).collect::<Vec<_>>()}),
        ),
        Format::Partial(_) => ApiError::not_acceptable_message(
            "you requested PartialObjectMetadata, but the requested object is a list (*unstructured.UnstructuredList)",
        )
        .into_response(),
        Format::PartialList(v) => body(
            format,
            &json!({"kind": "PartialObjectMetadataList", "apiVersion": format!("meta.k8s.io/{v}"), "metadata": meta.value(),
                "items": items.iter().map(|e| partial(e, v)).collect::<Vec<_>>()}),
        ),
        Format::Table(v) => body(
            format,
            &json!({"kind": "Table", "apiVersion": format!("meta.k8s.io/{v}"), "metadata": meta.value(),
                "columnDefinitions": columns(info),
                "rows": items.iter().map(|e| row(e, v, include)).collect::<Vec<_>>()}),
        ),
    }
}
