//! The OpenAPI documents of the views (v2 and v3), generated from the view types with
//! schemars. `make manifests` writes them under `openapi/`; a test fails when the
//! committed files differ. The server serves the same documents.

use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::registry::RESOURCES;
use crate::views::{GROUP, NamespaceAddressRecords, NamespaceAddresses, PoolAvailability, VERSION};

/// Reverse-DNS prefix of the schema names (the Kubernetes convention).
const PREFIX: &str = "io.cozystack.sdn.local.view.v1alpha1";

/// A kind and how to generate its schema.
type KindSchema = (&'static str, fn(&mut SchemaGenerator) -> schemars::Schema);

fn kinds() -> [KindSchema; 3] {
    [
        ("NamespaceAddresses", |g| {
            g.subschema_for::<NamespaceAddresses>()
        }),
        ("NamespaceAddressRecords", |g| {
            g.subschema_for::<NamespaceAddressRecords>()
        }),
        ("PoolAvailability", |g| {
            g.subschema_for::<PoolAvailability>()
        }),
    ]
}

/// Schemas of the kinds and everything they reference, with refs under `ref_prefix`.
fn schemas(settings: SchemaSettings, ref_prefix: &str) -> Map<String, Value> {
    let mut generator = settings.into_generator();
    for (_, schema) in kinds() {
        let _ = schema(&mut generator);
    }
    let defs = generator.take_definitions(true);
    let mut out = Map::new();
    for (name, mut schema) in defs {
        let full = if kinds().iter().any(|(k, _)| *k == name) {
            format!("{PREFIX}.{name}")
        } else {
            name.clone()
        };
        if let Some(obj) = schema.as_object_mut()
            && kinds().iter().any(|(k, _)| *k == name)
        {
            obj.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": GROUP, "version": VERSION, "kind": name}]),
            );
        }
        rewrite_refs(&mut schema, ref_prefix);
        out.insert(full, schema);
    }
    out
}

/// schemars names the kinds by their Rust names; the documents use the prefixed ones.
fn rewrite_refs(v: &mut Value, prefix: &str) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get_mut("$ref") {
                let name = r.rsplit('/').next().unwrap_or_default().to_string();
                let full = if kinds().iter().any(|(k, _)| *k == name) {
                    format!("{PREFIX}.{name}")
                } else {
                    name
                };
                *r = format!("{prefix}{full}");
            }
            o.values_mut().for_each(|x| rewrite_refs(x, prefix));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite_refs(x, prefix)),
        _ => {}
    }
}

fn paths(ref_prefix: &str) -> Map<String, Value> {
    let mut paths = Map::new();
    let base = format!("/apis/{GROUP}/{VERSION}");
    for r in RESOURCES {
        let schema = json!({"$ref": format!("{ref_prefix}{PREFIX}.{}", r.kind)});
        // kubectl explain finds the kind of a resource from these operation extensions.
        let op = |id: &str, desc: &str, action: &str| {
            json!({"operationId": id, "description": desc, "tags": [format!("{GROUP}_{VERSION}")],
            "x-kubernetes-action": action, "x-kubernetes-group-version-kind": {"group": GROUP, "version": VERSION, "kind": r.kind},
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": schema}}}}})
        };
        let (list_path, item_path) = if r.namespaced {
            (
                format!("{base}/namespaces/{{namespace}}/{}", r.plural),
                format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural),
            )
        } else {
            (
                format!("{base}/{}", r.plural),
                format!("{base}/{}/{{name}}", r.plural),
            )
        };
        paths.insert(
            list_path,
            json!({"get": op(&format!("list{}", r.kind), &format!("list {}", r.plural), "list")}),
        );
        paths.insert(item_path.clone(), json!({"get": op(&format!("read{}", r.kind), &format!("read one {}", r.singular), "get")}));
        for (sub, kind, _) in r.subresources {
            let s = json!({"$ref": format!("{ref_prefix}{PREFIX}.{kind}")});
            paths.insert(format!("{item_path}/{sub}"), json!({"get": {"operationId": format!("read{}{}", r.kind, kind),
                "description": format!("read the {sub} of one {}", r.singular), "tags": [format!("{GROUP}_{VERSION}")],
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": s}}}}}}));
        }
    }
    paths
}

/// The OpenAPI v3 document of `apis/<group>/<version>` (self-contained).
pub fn v3() -> Value {
    let mut settings = SchemaSettings::openapi3();
    settings.meta_schema = None;
    json!({"openapi": "3.0.0", "info": {"title": "address-controller views", "version": VERSION},
        "paths": paths("#/components/schemas/"), "components": {"schemas": schemas(settings, "#/components/schemas/")}})
}

/// The OpenAPI v2 (Swagger) document of the server.
pub fn v2() -> Value {
    let mut settings = SchemaSettings::openapi3();
    settings.meta_schema = None;
    settings.definitions_path = "/definitions".into();
    let mut doc = json!({"swagger": "2.0", "info": {"title": "address-controller views", "version": VERSION},
        "paths": paths("#/definitions/"), "definitions": schemas(settings, "#/definitions/")});
    // Swagger 2.0 responses carry the schema directly, not per content type.
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            let schema =
                item["get"]["responses"]["200"]["content"]["application/json"]["schema"].clone();
            item["get"]["responses"]["200"] = json!({"description": "OK", "schema": schema});
            item["get"]["produces"] = json!(["application/json"]);
        }
    }
    doc
}

/// A content hash for the v3 index (`?hash=`): changes whenever the document does.
pub fn hash(doc: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    doc.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `GET /openapi/v3`: the index.
pub fn v3_index() -> Value {
    let doc = v3();
    json!({"paths": {format!("apis/{GROUP}/{VERSION}"): {"serverRelativeURL": format!("/openapi/v3/apis/{GROUP}/{VERSION}?hash={}", hash(&doc))}}})
}

/// `(file name, pretty JSON)` of the committed documents under `openapi/`.
pub fn files() -> Vec<(String, String)> {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    vec![
        ("v2.json".into(), pretty(&v2())),
        (format!("v3/apis__{GROUP}__{VERSION}.json"), pretty(&v3())),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_documents_are_up_to_date() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi");
        for (name, want) in files() {
            let got = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
            assert!(got == want, "openapi/{name} is stale; run `make manifests`");
        }
    }

    #[test]
    fn v3_is_valid_openapi_with_gvk_extensions() {
        let doc: openapiv3::OpenAPI =
            serde_json::from_value(v3()).expect("a valid OpenAPI v3 document");
        let schemas = doc.components.expect("components").schemas;
        let ns = schemas
            .get(&format!("{PREFIX}.NamespaceAddresses"))
            .expect("NamespaceAddresses");
        let ns = serde_json::to_value(ns).unwrap();
        assert_eq!(
            ns["x-kubernetes-group-version-kind"][0]["kind"],
            "NamespaceAddresses"
        );
        // Self-contained: every $ref resolves inside the document.
        let text = v3().to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = r.split('"').next().unwrap();
            assert!(schemas.contains_key(name), "dangling $ref {name}");
        }
        let defs: Vec<String> = v2()["definitions"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert!(defs.iter().any(|d| d.contains("ObjectMeta")), "{defs:?}");
    }
}
