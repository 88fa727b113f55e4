//! The OpenAPI documents of the views (v2 and v3), generated from the resource modules'
//! types with schemars. `make manifests` writes them under `openapi/`; a test fails when the
//! committed files differ. The server serves the same documents.
//!
//! kube-apiserver merges the v2 document into the cluster's own `/openapi/v2` and converts
//! the result to protobuf: one schema keyword Swagger 2.0 does not know (`anyOf`,
//! `nullable`, a list of types) makes that conversion — and so `/openapi/v2` for the whole
//! cluster — fail. The v2 document is therefore generated without OpenAPI 3 constructs,
//! cleaned of any left, and checked against Swagger 2.0's schema keywords by a test.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::group::{GROUP, VERSION};
use crate::resources::{self, View};

/// Reverse-DNS prefix of the schema names (the Kubernetes convention).
const PREFIX: &str = "io.cozystack.sdn.local.view.v1alpha1";

/// The kinds the views serve.
fn kinds(views: &[std::sync::Arc<dyn View>]) -> Vec<&'static str> {
    let mut g = SchemaSettings::openapi3().into_generator();
    views
        .iter()
        .flat_map(|v| v.schemas(&mut g))
        .map(|(k, _)| k)
        .collect()
}

/// Schemas of the kinds and everything they reference, with refs under `ref_prefix`.
fn schemas(settings: SchemaSettings, ref_prefix: &str) -> Map<String, Value> {
    let views = resources::all();
    let kinds = kinds(&views);
    let mut generator = settings.into_generator();
    for v in &views {
        let _ = v.schemas(&mut generator);
    }
    let defs = generator.take_definitions(true);
    let mut out = Map::new();
    for (name, mut schema) in defs {
        let is_kind = kinds.contains(&name.as_str());
        let full = qualified(&name);
        if is_kind && let Some(obj) = schema.as_object_mut() {
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

/// The document name of a schema: schemars names them by their Rust names, which would
/// land unqualified in the cluster's merged document (where every API's definitions live
/// side by side); ours all carry the group's reverse-DNS prefix, as Kubernetes' own do.
fn qualified(name: &str) -> String {
    if name.contains('.') {
        name.to_string()
    } else {
        format!("{PREFIX}.{name}")
    }
}

fn rewrite_refs(v: &mut Value, prefix: &str) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get_mut("$ref") {
                let name = r.rsplit('/').next().unwrap_or_default().to_string();
                *r = format!("{prefix}{}", qualified(&name));
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
    for v in resources::all() {
        let r = v.info();
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
        for s in r.subresources {
            let schema = json!({"$ref": format!("{ref_prefix}{PREFIX}.{}", s.kind)});
            paths.insert(format!("{item_path}/{}", s.name), json!({"get": {"operationId": format!("read{}{}", r.kind, s.kind),
                "description": format!("read the {} of one {}", s.name, r.singular), "tags": [format!("{GROUP}_{VERSION}")],
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": schema}}}}}}));
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

/// The OpenAPI v2 (Swagger 2.0) document of the server.
pub fn v2() -> Value {
    let mut settings = SchemaSettings::openapi3();
    settings.meta_schema = None;
    settings.definitions_path = "/definitions".into();
    // `nullable` and null alternatives are rewritten by `swagger2` below: in Swagger 2.0 an
    // absent field is simply not required.
    let mut definitions = Value::Object(schemas(settings, "#/definitions/"));
    swagger2(&mut definitions);
    let mut doc = json!({"swagger": "2.0", "info": {"title": "address-controller views", "version": VERSION},
        "paths": paths("#/definitions/"), "definitions": definitions});
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

/// Rewrites OpenAPI 3 schema constructs into their Swagger 2.0 equivalents: `nullable`
/// dropped, `anyOf`/`oneOf` with a null alternative replaced by the other alternative (an
/// absent field is the Swagger 2.0 way of "may be null"), a list of types reduced to its
/// non-null type, `const` to a one-value `enum`.
fn swagger2(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.remove("nullable");
            for key in ["anyOf", "oneOf"] {
                if let Some(Value::Array(alts)) = o.remove(key) {
                    let mut keep: Vec<Value> = alts
                        .into_iter()
                        .filter(|a| {
                            a.get("type") != Some(&json!("null"))
                                && a.get("nullable")
                                    .is_none_or(|_| a.as_object().is_some_and(|m| m.len() > 1))
                        })
                        .collect();
                    if keep.len() == 1 {
                        if let Some(Value::Object(only)) = keep.pop() {
                            for (k, val) in only {
                                o.entry(k).or_insert(val);
                            }
                        }
                    } else if !keep.is_empty() {
                        // Several real alternatives: Swagger 2.0 cannot say it; any object.
                        o.insert("type".into(), json!("object"));
                        o.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
                    }
                }
            }
            if let Some(Value::Array(types)) = o.get("type").cloned() {
                let t = types
                    .into_iter()
                    .find(|t| t != "null")
                    .unwrap_or(json!("object"));
                o.insert("type".into(), t);
            }
            // `allOf` of one `$ref` (how a described reference is written in OpenAPI 3) is a
            // plain `$ref` with its description beside it in Kubernetes' v2 documents: the
            // form `kubectl explain` follows.
            if let Some(Value::Array(all)) = o.get("allOf")
                && let [only] = all.as_slice()
                && only.as_object().is_some_and(|m| m.len() == 1)
                && let Some(r) = only.get("$ref").cloned()
            {
                o.remove("allOf");
                o.insert("$ref".into(), r);
            }
            if let Some(c) = o.remove("const") {
                o.insert("enum".into(), json!([c]));
            }
            o.values_mut().for_each(swagger2);
        }
        Value::Array(a) => a.iter_mut().for_each(swagger2),
        _ => {}
    }
}

/// Keywords a Swagger 2.0 schema object may carry (plus `x-` extensions).
const SWAGGER2_SCHEMA_KEYS: &[&str] = &[
    "$ref",
    "format",
    "title",
    "description",
    "default",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxProperties",
    "minProperties",
    "required",
    "enum",
    "type",
    "items",
    "allOf",
    "properties",
    "additionalProperties",
    "discriminator",
    "readOnly",
    "xml",
    "externalDocs",
    "example",
];

/// What in a schema is not Swagger 2.0: `path: keyword` per problem.
pub fn swagger2_problems(schema: &Value, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(o) = schema.as_object() else {
        return out;
    };
    for (k, v) in o {
        if !k.starts_with("x-") && !SWAGGER2_SCHEMA_KEYS.contains(&k.as_str()) {
            out.push(format!("{path}: {k}"));
        }
        match k.as_str() {
            "type" if !v.is_string() => out.push(format!("{path}: type {v}")),
            "properties" => {
                for (p, s) in v.as_object().into_iter().flatten() {
                    out.extend(swagger2_problems(s, &format!("{path}.properties.{p}")));
                }
            }
            "items" | "additionalProperties" if v.is_object() => {
                out.extend(swagger2_problems(v, &format!("{path}.{k}")))
            }
            "allOf" => {
                for (i, s) in v.as_array().into_iter().flatten().enumerate() {
                    out.extend(swagger2_problems(s, &format!("{path}.allOf[{i}]")));
                }
            }
            _ => {}
        }
    }
    out
}

/// A content hash for the v3 index (`?hash=`): uppercase hex SHA-512 of the document, as
/// kube-openapi computes it.
pub fn hash(doc: &Value) -> String {
    let d = ring::digest::digest(&ring::digest::SHA512, doc.to_string().as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}

/// `GET /openapi/v3`: the index.
pub fn v3_index() -> Value {
    let doc = v3();
    json!({"paths": {format!("apis/{GROUP}/{VERSION}"): {"serverRelativeURL": format!("/openapi/v3/apis/{GROUP}/{VERSION}?hash={}", hash(&doc))}}})
}

/// The documents as served: encoded once, with their ETags (kube-apiserver's OpenAPI
/// aggregation downloads `/openapi/v2` every minute with `If-None-Match`: an unchanged
/// document costs it a 304, not a merge).
pub struct Served {
    pub v2: Document,
    pub v3: Document,
    pub v3_index: Document,
}

/// One served document.
pub struct Document {
    pub body: axum::body::Bytes,
    pub etag: String,
}

impl Document {
    fn of(v: &Value) -> Document {
        let body = axum::body::Bytes::from(v.to_string());
        Document {
            etag: format!("\"{}\"", &hash(v)[..32]),
            body,
        }
    }
}

impl Served {
    /// The generated documents; `v2` replaced when given (tests).
    pub fn new(v2: Option<Value>) -> Served {
        Served {
            v2: Document::of(&v2.unwrap_or_else(self::v2)),
            v3: Document::of(&v3()),
            v3_index: Document::of(&v3_index()),
        }
    }
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
    #![allow(clippy::unwrap_used)]
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
    fn v2_is_swagger_2_0_with_nothing_of_openapi_3() {
        let doc = v2();
        let mut problems = Vec::new();
        for (name, schema) in doc["definitions"].as_object().unwrap() {
            problems.extend(swagger2_problems(schema, name));
        }
        assert!(problems.is_empty(), "not Swagger 2.0: {problems:#?}");
        // The check catches what it should.
        let bad = json!({"properties": {"releasedAt": {"anyOf": [{"$ref": "#/definitions/Time"}, {"type": "null"}]},
            "free": {"type": ["integer", "null"]}, "n": {"nullable": true, "type": "integer"}}});
        assert_eq!(
            swagger2_problems(&bad, "X").len(),
            3,
            "{:?}",
            swagger2_problems(&bad, "X")
        );
        // And the cleaner makes such a schema valid.
        let mut cleaned = bad.clone();
        swagger2(&mut cleaned);
        assert!(swagger2_problems(&cleaned, "X").is_empty(), "{cleaned}");
        assert_eq!(
            cleaned["properties"]["releasedAt"]["$ref"],
            "#/definitions/Time"
        );
    }

    #[test]
    fn every_definition_has_a_qualified_name() {
        // They land in the cluster's merged document beside everyone else's.
        for doc in [
            v2()["definitions"].clone(),
            v3()["components"]["schemas"].clone(),
        ] {
            for name in doc.as_object().unwrap().keys() {
                assert!(
                    name.starts_with(PREFIX) || name.starts_with("io.k8s."),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn every_property_has_a_description() {
        let doc = v3();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let mut missing = Vec::new();
        for (name, schema) in schemas
            .iter()
            .filter(|(n, _)| n.starts_with(PREFIX) || !n.contains('.'))
        {
            if name.starts_with(PREFIX) && schema.get("description").is_none() {
                missing.push(name.clone());
            }
            for (p, s) in schema["properties"].as_object().into_iter().flatten() {
                let described = s.get("description").is_some()
                    || s["allOf"]
                        .as_array()
                        .is_some_and(|_| s.get("description").is_some());
                if !described
                    && (name.starts_with(PREFIX) || schemas.contains_key(name))
                    && !is_apimachinery(name)
                {
                    missing.push(format!("{name}.{p}"));
                }
            }
        }
        assert!(missing.is_empty(), "no description: {missing:?}");
    }

    fn is_apimachinery(name: &str) -> bool {
        [
            "ObjectMeta",
            "Time",
            "ManagedFieldsEntry",
            "OwnerReference",
            "FieldsV1",
        ]
        .contains(&name)
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
    }
}
