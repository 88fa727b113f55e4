//! Differential conformance: kube-apiserver is the oracle. The test serves the very objects
//! of each view from a custom resource of the same shape and scope (`mirror.views.test`,
//! plural `mirror<plural>`, the same printer columns), sends one battery of requests to both
//! through the same kube-apiserver, and compares the answers: status code, Status reason and
//! message, kind, the names in order, paging (`continue` present, `remainingItemCount`),
//! Table columns and cells, content type, watch events. Every difference must be one the
//! `EXPLAINED` table lists with its reason, and every explanation must still be needed; the
//! whole comparison is printed.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeMap;
use std::time::Duration;

use address_controller_api::{ClaimPhase, IPAddressClaim};
use address_controller_tests::env::{Env, env, phase};
use address_controller_tests::{Cluster, TestNamespace, wait_for};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const VIEW_GROUP: &str = "view.local.sdn.cozystack.io";
const MIRROR_GROUP: &str = "mirror.views.test";

/// Differences kube-apiserver's answer for a CRD and the view's answer are allowed to have:
/// (case, field, why).
const EXPLAINED: &[(&str, &str, &str)] = &[
    (EMPTY_NS, "code", ZEROS),
    (EMPTY_NS, "reason", ZEROS),
    (EMPTY_NS, "kind", ZEROS),
    (EMPTY_NS, "message", ZEROS),
    (EMPTY_NS, "names", ZEROS),
    (EMPTY_NS, "details", ZEROS),
    (EMPTY_NS, "continue", ZEROS),
    (EMPTY_NS, "remainingItemCount", ZEROS),
    (" as protobuf only", "content-type", NO_PROTOBUF),
    (" as protobuf only", "text", NO_PROTOBUF),
    (" as protobuf only", "kind", NO_PROTOBUF),
    (" as protobuf only", "reason", NO_PROTOBUF),
    (" as protobuf only", "message", NO_PROTOBUF),
    (" as protobuf only", "details", NO_PROTOBUF),
    (" as text/html", "message", NO_PROTOBUF),
    (" as cbor only", "message", NO_PROTOBUF),
    (" watch as yaml", "message", NO_PROTOBUF),
];

/// The case of a namespace holding nothing.
const EMPTY_NS: &str = "namespaceaddresses get of a namespace holding nothing";

/// Why `get` of a namespace holding nothing differs.
const ZEROS: &str =
    "every namespace has holdings: one holding nothing gets zeros (SPEC §9), not 404";
/// Why protobuf requests differ.
const NO_PROTOBUF: &str =
    "the views have no protobuf encoding: the 406 Status is JSON and lists JSON and YAML only";

/// Writes: the views are read-only, so every write is 405 MethodNotAllowed where the CRD
/// takes it (or refuses the body).
const WRITES: &[(&str, &str)] = &[
    ("POST", "collection"),
    ("PUT", "item"),
    ("PATCH", "item"),
    ("DELETE", "item"),
    ("DELETE", "collection"),
];

struct Resource {
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    /// Printer columns of the mirror CRD: (name, type, priority, jsonPath). The Name
    /// column comes first by itself.
    columns: &'static [(&'static str, &'static str, i64, &'static str)],
}

const RESOURCES: &[Resource] = &[
    Resource {
        plural: "namespaceaddresses",
        kind: "NamespaceAddresses",
        namespaced: true,
        columns: &[
            ("Claims", "integer", 0, ".summary.claims.total"),
            ("Bound", "integer", 0, ".summary.claims.bound"),
            ("Pending", "integer", 0, ".summary.claims.pending"),
            ("Lost", "integer", 0, ".summary.claims.lost"),
            ("IPv4", "integer", 0, ".summary.ipv4"),
            ("IPv6", "integer", 0, ".summary.ipv6"),
            ("Released", "integer", 0, ".summary.releasedRetained"),
            ("Reserved", "integer", 1, ".summary.reserved"),
            ("Associated", "integer", 1, ".summary.associated"),
            ("Shared", "integer", 1, ".summary.shared"),
            ("Classes", "string", 1, ".classes[*].className"),
            // The view renders used/hard per limited class; a CRD prints the JSON (string
            // cells are compared by column only).
            ("Quota", "string", 1, ".entitlements[*].quota"),
        ],
    },
    Resource {
        plural: "poolavailabilities",
        kind: "PoolAvailability",
        namespaced: false,
        columns: &[
            ("Provisioner", "string", 0, ".provisioner"),
            ("IPv4", "string", 0, ".allocated.ipv4"),
            ("IPv4 Free", "integer", 0, ".free.ipv4"),
            ("IPv4 Used", "string", 0, ".allocated.ipv4"),
            ("IPv6", "string", 0, ".allocated.ipv6"),
            ("IPv6 Free", "integer", 0, ".free.ipv6"),
            ("IPv6 Used", "string", 0, ".allocated.ipv6"),
            ("Pending", "integer", 0, ".pendingClaims"),
            ("IPv4 Reserved", "integer", 1, ".reserved.ipv4"),
            ("IPv6 Reserved", "integer", 1, ".reserved.ipv6"),
            ("Released", "integer", 1, ".phases.Released"),
            ("Conflict", "integer", 1, ".phases.Conflict"),
            ("Lost", "integer", 1, ".phases.Lost"),
            ("NextRelease", "string", 1, ".nextRelease"),
            ("Namespaces", "integer", 1, ".admittedNamespaces"),
        ],
    },
];

/// One answer.
struct Reply {
    code: u16,
    content_type: String,
    body: Vec<u8>,
}

async fn send(
    client: &Client,
    method: &str,
    path: &str,
    accept: Option<&str>,
    body: Option<&Value>,
) -> Reply {
    let mut req = http::Request::builder().method(method).uri(path);
    if let Some(a) = accept {
        req = req.header("Accept", a);
    }
    let body = match body {
        Some(b) => {
            let ct = if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            req = req.header("Content-Type", ct);
            kube::client::Body::from(serde_json::to_vec(b).unwrap())
        }
        None => kube::client::Body::empty(),
    };
    let resp = tokio::time::timeout(
        Duration::from_secs(30),
        client.send(req.body(body).unwrap()),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} {path}: no answer within 30s"))
    .unwrap();
    let code = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect_bytes())
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: body not complete within 30s"))
        .map(|b| b.to_vec())
        .unwrap_or_default();
    Reply {
        code,
        content_type,
        body,
    }
}

/// What of an answer is compared, field by field.
fn shape(r: &Reply, plural: &str, kind: &str) -> BTreeMap<&'static str, String> {
    let text = String::from_utf8_lossy(&r.body).into_owned();
    // The mirror's names become the view's, so messages compare.
    let text = text
        .replace(&format!("mirror{plural}"), plural)
        .replace(&format!("Mirror{kind}"), kind)
        .replace(MIRROR_GROUP, VIEW_GROUP);
    let mut out = BTreeMap::new();
    out.insert("code", r.code.to_string());
    let ct = r.content_type.split(';').next().unwrap_or("").to_string();
    out.insert("content-type", ct.clone());
    let v: Option<Value> = match ct.as_str() {
        "application/json" => serde_json::from_str(&text)
            .ok()
            .or_else(|| watch_events(&text)),
        "application/yaml" => serde_yaml::from_str(&text).ok(),
        _ => None,
    };
    let Some(v) = v else {
        out.insert("text", text.trim().to_string());
        return out;
    };
    if let Some(events) = v.get("events") {
        out.insert("events", events.to_string());
        return out;
    }
    out.insert("kind", v["kind"].as_str().unwrap_or("").to_string());
    if v["kind"] == "Status" {
        out.insert("reason", v["reason"].as_str().unwrap_or("").to_string());
        // Revisions differ between the two (one etcd, different moments): not compared.
        let message = v["message"].as_str().unwrap_or("");
        let message = match message.split_once("current: ") {
            Some((head, _)) => format!("{head}current: <revision>"),
            None => message.to_string(),
        };
        out.insert("message", message);
        out.insert("details", v["details"]["causes"].to_string());
        return out;
    }
    let name = |o: &Value| o["metadata"]["name"].as_str().unwrap_or("").to_string();
    let names: Vec<String> = if let Some(items) = v["items"].as_array() {
        items.iter().map(name).collect()
    } else if let Some(rows) = v["rows"].as_array() {
        rows.iter().map(|r| name(&r["object"])).collect()
    } else {
        vec![name(&v)]
    };
    out.insert("names", names.join(","));
    out.insert(
        "continue",
        (!v["metadata"]["continue"].as_str().unwrap_or("").is_empty()).to_string(),
    );
    out.insert(
        "remainingItemCount",
        v["metadata"]["remainingItemCount"].to_string(),
    );
    if let Some(cols) = v["columnDefinitions"].as_array() {
        let cols: Vec<String> = cols
            .iter()
            .map(|c| {
                format!(
                    "{}:{}:{}",
                    c["name"].as_str().unwrap_or(""),
                    c["type"].as_str().unwrap_or(""),
                    c["priority"]
                )
            })
            .collect();
        out.insert("columns", cols.join(","));
        // Integer cells: the CRD computes them from the same JSON paths.
        let ints: Vec<String> = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r["cells"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .zip(v["columnDefinitions"].as_array().unwrap())
                    .filter(|(_, c)| c["type"] == "integer")
                    .map(|(x, _)| x.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        out.insert("integer cells", ints.join(" | "));
        out.insert(
            "row object kind",
            v["rows"][0]["object"]["kind"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
    }
    out
}

/// The events of a watch body (one JSON object per line) as `{"events": [...]}`.
fn watch_events(text: &str) -> Option<Value> {
    let events: Vec<Value> = text
        .lines()
        .map(serde_json::from_str::<Value>)
        .collect::<Result<_, _>>()
        .ok()?;
    let summary: Vec<String> = events
        .iter()
        .map(|e| {
            let o = &e["object"];
            let end = o["metadata"]["annotations"]["k8s.io/initial-events-end"]
                .as_str()
                .unwrap_or("");
            match e["type"].as_str().unwrap_or("") {
                "ERROR" => format!("ERROR {} {}", o["code"], o["reason"].as_str().unwrap_or("")),
                "BOOKMARK" => format!("BOOKMARK {} end={end}", o["kind"].as_str().unwrap_or("")),
                t => {
                    // A Table event carries its object in its one row.
                    let row = &o["rows"][0]["object"];
                    let name = o["metadata"]["name"]
                        .as_str()
                        .or(row["metadata"]["name"].as_str());
                    let cols = o["columnDefinitions"].as_array().map_or(0, Vec::len);
                    format!(
                        "{t} {} {} columns={cols}",
                        o["kind"].as_str().unwrap_or(""),
                        name.unwrap_or("")
                    )
                }
            }
        })
        .collect();
    Some(json!({"events": summary}))
}

/// The mirror CRD of a view.
fn mirror_crd(r: &Resource) -> Value {
    let mut columns = vec![];
    for (name, t, priority, path) in r.columns {
        columns.push(json!({"name": name, "type": t, "priority": priority, "jsonPath": path}));
    }
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("mirror{}.{MIRROR_GROUP}", r.plural)},
        "spec": {"group": MIRROR_GROUP, "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
            "names": {"plural": format!("mirror{}", r.plural), "singular": format!("mirror{}", r.kind.to_lowercase()),
                "kind": format!("Mirror{}", r.kind), "listKind": format!("Mirror{}List", r.kind)},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "additionalPrinterColumns": columns}]}})
}

/// Paths of one view and of its mirror.
struct Paths {
    view: String,
    mirror: String,
}

impl Paths {
    fn new(r: &Resource, ns: Option<&str>, rest: &str) -> Paths {
        let scope = ns.map(|n| format!("namespaces/{n}/")).unwrap_or_default();
        Paths {
            view: format!("/apis/{VIEW_GROUP}/v1alpha1/{scope}{}{rest}", r.plural),
            mirror: format!(
                "/apis/{MIRROR_GROUP}/v1alpha1/{scope}mirror{}{rest}",
                r.plural
            ),
        }
    }
}

/// The result of one case.
struct Outcome {
    id: String,
    view_code: u16,
    mirror_code: u16,
    diffs: Vec<(String, String, String)>,
}

struct Runner<'a> {
    client: &'a Client,
    outcomes: Vec<Outcome>,
}

impl Runner<'_> {
    async fn case(
        &mut self,
        id: String,
        r: &Resource,
        method: &str,
        p: &Paths,
        accept: Option<&str>,
        body: Option<&Value>,
    ) -> (Reply, Reply) {
        let view = send(self.client, method, &p.view, accept, body).await;
        let mirror_body = body.map(|b| {
            let mut b = b.clone();
            b["apiVersion"] = json!(format!("{MIRROR_GROUP}/v1alpha1"));
            b["kind"] = json!(format!("Mirror{}", r.kind));
            b
        });
        let mirror = send(self.client, method, &p.mirror, accept, mirror_body.as_ref()).await;
        let (a, b) = (
            shape(&view, r.plural, r.kind),
            shape(&mirror, r.plural, r.kind),
        );
        let mut diffs = Vec::new();
        for k in a
            .keys()
            .chain(b.keys())
            .collect::<std::collections::BTreeSet<_>>()
        {
            let (x, y) = (
                a.get(k).cloned().unwrap_or_default(),
                b.get(k).cloned().unwrap_or_default(),
            );
            if x != y {
                diffs.push((k.to_string(), x, y));
            }
        }
        self.outcomes.push(Outcome {
            id,
            view_code: view.code,
            mirror_code: mirror.code,
            diffs,
        });
        (view, mirror)
    }

    /// Walks `limit`-sized pages on both sides, comparing each page.
    async fn pages(&mut self, id: &str, r: &Resource, ns: Option<&str>, limit: u32, extra: &str) {
        let start = (String::new(), String::new());
        self.walk(id, r, ns, limit, extra, start, 0, 1000).await;
    }

    /// Pages `first..first + count` of a list on both sides from the continue tokens
    /// `(view, mirror)`; the tokens of the next page, if there is one.
    #[allow(clippy::too_many_arguments)]
    async fn walk(
        &mut self,
        id: &str,
        r: &Resource,
        ns: Option<&str>,
        limit: u32,
        extra: &str,
        (mut vc, mut mc): (String, String),
        first: usize,
        count: usize,
    ) -> Option<(String, String)> {
        let cont = |c: &str| {
            if c.is_empty() {
                String::new()
            } else {
                format!("&continue={c}")
            }
        };
        for page in first..first + count {
            let p = Paths {
                view: Paths::new(r, ns, &format!("?limit={limit}{extra}{}", cont(&vc))).view,
                mirror: Paths::new(r, ns, &format!("?limit={limit}{extra}{}", cont(&mc))).mirror,
            };
            let (v, m) = self
                .case(format!("{id} page {page}"), r, "GET", &p, None, None)
                .await;
            let token = |b: &[u8]| {
                serde_json::from_slice::<Value>(b)
                    .ok()
                    .and_then(|v| v["metadata"]["continue"].as_str().map(str::to_string))
                    .unwrap_or_default()
            };
            vc = token(&v.body);
            mc = token(&m.body);
            if vc.is_empty() || mc.is_empty() {
                return None;
            }
        }
        Some((vc, mc))
    }
}

/// Creates the mirror of one view object (its namespace too, when it no longer exists:
/// returned, to be deleted after).
async fn mirror_item(client: &Client, r: &Resource, item: &Value) -> Option<String> {
    let mut o = item.clone();
    o["apiVersion"] = json!(format!("{MIRROR_GROUP}/v1alpha1"));
    o["kind"] = json!(format!("Mirror{}", r.kind));
    let meta = &item["metadata"];
    o["metadata"] = json!({"name": meta["name"], "labels": meta["labels"]});
    let mut made = None;
    let path = match meta["namespace"].as_str().filter(|_| r.namespaced) {
        Some(ns) => {
            o["metadata"]["namespace"] = json!(ns);
            let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
            if nss.get_opt(ns).await.unwrap().is_none() {
                let n = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
                nss.create(&PostParams::default(), &n).await.unwrap();
                made = Some(ns.to_string());
            }
            format!(
                "/apis/{MIRROR_GROUP}/v1alpha1/namespaces/{ns}/mirror{}",
                r.plural
            )
        }
        None => format!("/apis/{MIRROR_GROUP}/v1alpha1/mirror{}", r.plural),
    };
    let created = send(client, "POST", &path, None, Some(&o)).await;
    assert_eq!(
        created.code,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    made
}

/// The view's objects, as the mirror's: their names, in order.
async fn fill_mirror(client: &Client, r: &Resource, made: &mut Vec<String>) -> Vec<String> {
    let list = send(
        client,
        "GET",
        &format!("/apis/{VIEW_GROUP}/v1alpha1/{}", r.plural),
        None,
        None,
    )
    .await;
    assert_eq!(list.code, 200, "{}", String::from_utf8_lossy(&list.body));
    let list: Value = serde_json::from_slice(&list.body).unwrap();
    let mut names = Vec::new();
    for item in list["items"].as_array().unwrap() {
        made.extend(mirror_item(client, r, item).await);
        names.push(item["metadata"]["name"].as_str().unwrap().to_string());
    }
    names
}

/// No namespace the view lists is being deleted (an earlier test's, whose claims the
/// controller is still reclaiming): the view's lists stay put while the battery runs. A
/// namespace that is gone may stay listed for good (its released addresses are retained).
async fn settled(client: &Client) -> anyhow::Result<Option<()>> {
    let list = send(
        client,
        "GET",
        &format!("/apis/{VIEW_GROUP}/v1alpha1/namespaceaddresses"),
        None,
        None,
    )
    .await;
    let v: Value = serde_json::from_slice(&list.body)?;
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for item in v["items"].as_array().into_iter().flatten() {
        let ns = item["metadata"]["name"].as_str().unwrap_or("");
        let n = nss.get_opt(ns).await?;
        if n.is_some_and(|n| n.metadata.deletion_timestamp.is_some()) {
            return Ok(None);
        }
    }
    Ok(Some(()))
}

/// Query strings sent to every view's collection (`{first}`, `{last}`, `{ns}` filled in).
const QUERIES: &[(&str, &str)] = &[
    ("list", ""),
    ("limit=0", "?limit=0"),
    ("limit=-1", "?limit=-1"),
    ("limit=abc", "?limit=abc"),
    ("continue=bogus", "?continue=bogus"),
    ("continue not base64", "?continue=%21%21"),
    ("continue truncated JSON", "?continue=eyJ2Ijo"),
    ("continue without version", "?continue=e30"),
    (
        "continue of an expired list",
        "?limit=1&continue=eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJ4In0",
    ),
    ("resourceVersion=0", "?resourceVersion=0"),
    ("resourceVersion=abc", "?resourceVersion=abc"),
    ("resourceVersion=0+limit=1", "?resourceVersion=0&limit=1"),
    ("resourceVersion too large", "?resourceVersion=999999999999"),
    ("rvMatch without rv", "?resourceVersionMatch=NotOlderThan"),
    (
        "rvMatch=Exact rv=0",
        "?resourceVersion=0&resourceVersionMatch=Exact",
    ),
    (
        "rvMatch=Bogus",
        "?resourceVersion=1&resourceVersionMatch=Bogus",
    ),
    ("sendInitialEvents on list", "?sendInitialEvents=true"),
    ("timeoutSeconds=abc", "?timeoutSeconds=abc"),
    ("label tier=gold", "?labelSelector=tier%3Dgold"),
    ("label tier!=gold", "?labelSelector=tier%21%3Dgold"),
    ("label !tier", "?labelSelector=%21tier"),
    ("label tier", "?labelSelector=tier"),
    ("label in", "?labelSelector=tier%20in%20%28gold%2Csilver%29"),
    ("label notin", "?labelSelector=tier%20notin%20%28gold%29"),
    ("label x/y=z", "?labelSelector=x%2Fy%3Dz"),
    ("label a==", "?labelSelector=a%3D%3D"),
    ("label unclosed", "?labelSelector=a%20in%20%28x"),
    ("label gt not integer", "?labelSelector=a%3Ex"),
    ("label bad value", "?labelSelector=a%3D-x"),
    (
        "label set with a bad value",
        "?labelSelector=a%20in%20%28x%2C-y%29",
    ),
    (
        "label value too long",
        "?labelSelector=a%3Dvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv",
    ),
    ("label trailing comma", "?labelSelector=a%2C"),
    (
        "label combination",
        "?labelSelector=tier%20in%20%28gold%2Csilver%29%2C%21x%2Fy",
    ),
    (
        "label whitespace",
        "?labelSelector=%20%20tier%20%20%3D%20%20gold%20%20",
    ),
    (
        "label exists and not-equal",
        "?labelSelector=tier%2Ctier%21%3Dsilver",
    ),
    ("label bad key", "?labelSelector=-a"),
    ("label key with two slashes", "?labelSelector=a%2Fb%2Fc"),
    (
        "label key uppercase prefix",
        "?labelSelector=Example.com%2Fa%3Db",
    ),
    ("label key empty prefix", "?labelSelector=%2Fa"),
    ("label key empty name", "?labelSelector=a%2F"),
    ("field name=", "?fieldSelector=metadata.name%3D{first}"),
    ("field name!=", "?fieldSelector=metadata.name%21%3D{first}"),
    ("field name==", "?fieldSelector=metadata.name%3D%3D{last}"),
    (
        "field namespace=",
        "?fieldSelector=metadata.namespace%3D{ns}",
    ),
    ("field unsupported", "?fieldSelector=spec.x%3D1"),
    ("field no operator", "?fieldSelector=metadata.name"),
    (
        "watch rvMatch without sendInitialEvents",
        "?watch=true&resourceVersion=1&resourceVersionMatch=NotOlderThan",
    ),
    (
        "watch sendInitialEvents without rvMatch",
        "?watch=true&sendInitialEvents=true",
    ),
    (
        "watch initial events",
        "?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2",
    ),
    (
        "watch from rv=1",
        "?watch=true&resourceVersion=1&timeoutSeconds=2",
    ),
    (
        "watch from rv=0",
        "?watch=true&resourceVersion=0&timeoutSeconds=2",
    ),
    (
        "watch with selector",
        "?watch=true&labelSelector=tier%3Dgold&timeoutSeconds=2",
    ),
    (
        "watch initial events without bookmarks",
        "?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=2",
    ),
    (
        "watch with bookmarks",
        "?watch=true&allowWatchBookmarks=true&timeoutSeconds=2",
    ),
    ("trailing slash", "/"),
];

/// Accept headers sent to every view's collection and to one of its objects.
const ACCEPTS: &[(&str, &str)] = &[
    (
        "Table v1",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    ),
    (
        "Table v1beta1",
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
    ),
    (
        "PartialObjectMetadataList",
        "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
    ),
    (
        "PartialObjectMetadata",
        "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
    ),
    ("protobuf only", "application/vnd.kubernetes.protobuf"),
    (
        "protobuf or json",
        "application/vnd.kubernetes.protobuf,application/json",
    ),
    ("cbor only", "application/cbor"),
    ("yaml", "application/yaml"),
    ("text/html", "text/html"),
    ("any", "*/*"),
];

/// Each view answers every read as kube-apiserver answers it for a CRD with the same
/// objects (a mirror CRD per view): queries, pages, content types, watches, missing
/// objects, a change between pages, and writes refused; every difference is explained in
/// `EXPLAINED`, and every explanation is still needed.
#[tokio::test]
async fn views_answer_as_kube_apiserver_answers_for_a_crd() {
    let mut e = env("views-diff").await;
    let (ctl, _, _) = e.serve_views().await;
    let client = e.client.clone();
    let other = objects_for_both_sides(&mut e).await;
    let filled = mirror_crds_filled(&mut e).await;
    // An expired continue token must be expired for kube-apiserver too: a young cluster's
    // etcd has not been compacted yet (kube-apiserver compacts every five minutes).
    let cluster = Cluster::get();
    let compacted = cluster.compact_etcd().unwrap();
    assert!(compacted > 1, "etcd at revision {compacted}");
    // Answers as they come: kube's client would retry the 503s and 504s.
    let raw = cluster.raw_client().await.unwrap();
    let mut run = Runner {
        client: &raw,
        outcomes: Vec::new(),
    };
    let ns = e.ns.name.clone();
    let mut late = Vec::new();
    for r in RESOURCES {
        let names = &filled[r.plural];
        assert!(names.len() >= 3, "{}: {names:?}", r.plural);
        let (first, last) = (names[0].clone(), names[names.len() - 1].clone());
        let item = if r.namespaced {
            ns.clone()
        } else {
            first.clone()
        };
        let at = At {
            r,
            ns: &ns,
            item_ns: r.namespaced.then_some(ns.as_str()),
            item: &item,
            first: &first,
            last: &last,
            empty: &other[2].name,
        };
        run.reads(&at).await;
        late.extend(run.pages_across_a_change(&at, &mut e, &client).await);
        // Writes last: the CRD takes them.
        run.writes(&at).await;
    }
    the_differences_are_explained(&run.outcomes);
    drop(other);
    drop(late);
    e.check_with(&[&ctl]).await;
}

/// Objects for both views: three namespaces (two holding claims), three classes (two
/// labelled) admitting exactly this test's namespaces — so the pools' admitted namespaces
/// do not move with the rest of the cluster while the two sides are compared. The other
/// namespaces are returned, the empty one last.
async fn objects_for_both_sides(e: &mut Env) -> [TestNamespace; 3] {
    let client = e.client.clone();
    let other = [
        TestNamespace::create(&client, "views-diff-b")
            .await
            .unwrap(),
        TestNamespace::create(&client, "views-diff-c")
            .await
            .unwrap(),
        TestNamespace::create(&client, "views-diff-empty")
            .await
            .unwrap(),
    ];
    let ours: Vec<&str> = std::iter::once(e.ns.name.as_str())
        .chain(other.iter().map(|n| n.name.as_str()))
        .collect();
    let admits = json!({"spec": {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ours}]}}});
    let with = |mut v: Value| {
        address_controller_tests::env::merge(&mut v, admits.clone());
        v
    };
    let gold = e
        .class(
            "gold",
            with(json!({"metadata": {"labels": {"tier": "gold"}}})),
        )
        .await;
    let silver = e
        .class(
            "silver",
            with(json!({"metadata": {"labels": {"tier": "silver", "x/y": "z"}}})),
        )
        .await;
    e.class("plain", with(json!({}))).await;
    e.address("g1", "192.0.2.201", &gold, json!({})).await;
    e.address("g2", "192.0.2.202", &gold, json!({})).await;
    e.address("s1", "2001:db8::201", &silver, json!({})).await;
    e.claim("web", json!({"className": gold})).await;
    e.claim("v6", json!({"className": silver, "family": "IPv6"}))
        .await;
    for (ns, class) in [(&other[0].name, &gold), (&other[1].name, &silver)] {
        let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), ns);
        let c = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"className": class}}),
        )
        .unwrap();
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.wait_claim("v6", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    wait_for(
        "namespaces of earlier tests gone from the view",
        Duration::from_secs(120),
        || settled(&client),
    )
    .await
    .unwrap();

    other
}

/// The mirror CRDs, filled with the views' objects: their names, by view.
async fn mirror_crds_filled(e: &mut Env) -> BTreeMap<&'static str, Vec<String>> {
    let client = e.client.clone();
    let cluster = Cluster::get();
    let dir = address_controller_tests::env::tempdir();
    for r in RESOURCES {
        // Fresh: a run that was killed may have left them.
        let crd = format!("crd/mirror{}.{MIRROR_GROUP}", r.plural);
        cluster
            .kubectl_ok(&["delete", &crd, "--ignore-not-found", "--wait=true"])
            .unwrap();
        let file = dir.join(format!("{}.yaml", r.plural));
        std::fs::write(&file, serde_yaml::to_string(&mirror_crd(r)).unwrap()).unwrap();
        cluster
            .kubectl_ok(&["apply", "-f", file.to_str().unwrap()])
            .unwrap();
        e.cleanup.add(
            "customresourcedefinitions.apiextensions.k8s.io",
            &format!("mirror{}.{MIRROR_GROUP}", r.plural),
        );
        cluster
            .kubectl_ok(&["wait", "--for=condition=Established", "--timeout=60s", &crd])
            .unwrap();
    }
    let mut filled = BTreeMap::new();
    let mut made = Vec::new();
    for r in RESOURCES {
        filled.insert(r.plural, fill_mirror(&client, r, &mut made).await);
    }
    for ns in &made {
        e.cleanup.add("namespaces", ns);
    }

    filled
}

/// Where the cases of one view are asked: its resource, the test's namespace, the item a
/// get names, the first and last names of its list, a namespace holding nothing.
struct At<'a> {
    r: &'a Resource,
    ns: &'a str,
    item_ns: Option<&'a str>,
    item: &'a str,
    first: &'a str,
    last: &'a str,
    empty: &'a str,
}

impl At<'_> {
    /// The item's path with `rest` after it.
    fn get(&self, rest: &str) -> Paths {
        Paths::new(self.r, self.item_ns, &format!("/{}{rest}", self.item))
    }
}

impl Runner<'_> {
    /// Every read of one view: the queries, lists by namespace or across, pages, each
    /// content type, watches, gets, missing objects, HEAD, an unknown subresource.
    async fn reads(&mut self, at: &At<'_>) {
        let (r, ns, item, item_ns) = (at.r, at.ns, at.item, at.item_ns);
        let (first, last) = (at.first, at.last);
        let p = r.plural;
        let get = |rest: &str| at.get(rest);
        for (id, q) in QUERIES {
            let q = q
                .replace("{first}", first)
                .replace("{last}", last)
                .replace("{ns}", ns);
            self.case(
                format!("{p} {id}"),
                r,
                "GET",
                &Paths::new(r, None, &q),
                None,
                None,
            )
            .await;
        }
        if r.namespaced {
            let empty = at.empty;
            self.case(
                format!("{p} get of a namespace holding nothing"),
                r,
                "GET",
                &Paths::new(r, Some(empty), &format!("/{empty}")),
                None,
                None,
            )
            .await;
            self.case(
                format!("{p} namespaced list"),
                r,
                "GET",
                &Paths::new(r, Some(ns), ""),
                None,
                None,
            )
            .await;
            self.pages(&format!("{p} namespaced pages"), r, Some(ns), 1, "")
                .await;
            self.case(
                format!("{p} item without namespace"),
                r,
                "GET",
                &Paths::new(r, None, &format!("/{item}")),
                None,
                None,
            )
            .await;
        } else {
            self.case(
                format!("{p} under a namespace path"),
                r,
                "GET",
                &Paths::new(r, Some(ns), ""),
                None,
                None,
            )
            .await;
            self.case(
                format!("{p} item under a namespace path"),
                r,
                "GET",
                &Paths::new(r, Some(ns), &format!("/{item}")),
                None,
                None,
            )
            .await;
        }
        self.pages(&format!("{p} pages of 1"), r, None, 1, "").await;
        self.pages(&format!("{p} pages of 2"), r, None, 2, "").await;
        self.pages(
            &format!("{p} pages with a selector"),
            r,
            None,
            1,
            "&labelSelector=%21nothing",
        )
        .await;
        for (id, a) in ACCEPTS {
            self.case(
                format!("{p} list as {id}"),
                r,
                "GET",
                &Paths::new(r, None, ""),
                Some(a),
                None,
            )
            .await;
            self.case(
                format!("{p} get as {id}"),
                r,
                "GET",
                &get(""),
                Some(a),
                None,
            )
            .await;
        }
        self.case(format!("{p} watch as Table"), r, "GET",
            &Paths::new(r, None, "?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=2"),
            Some(ACCEPTS[0].1), None).await;
        self.case(
            format!("{p} watch as yaml"),
            r,
            "GET",
            &Paths::new(r, None, "?watch=true&timeoutSeconds=1"),
            Some("application/yaml"),
            None,
        )
        .await;
        self.case(format!("{p} get"), r, "GET", &get(""), None, None)
            .await;
        self.case(
            format!("{p} get-missing as yaml"),
            r,
            "GET",
            &Paths::new(r, item_ns, "/no-such-object"),
            Some("application/yaml"),
            None,
        )
        .await;
        self.case(
            format!("{p} get-missing"),
            r,
            "GET",
            &Paths::new(r, item_ns, "/no-such-object"),
            None,
            None,
        )
        .await;
        self.case(
            format!("{p} HEAD list"),
            r,
            "HEAD",
            &Paths::new(r, None, ""),
            None,
            None,
        )
        .await;
        // A HEAD answer carries the headers GET's would: a missing object's Status is YAML
        // for a client that asked for YAML.
        self.case(
            format!("{p} HEAD get-missing as yaml"),
            r,
            "HEAD",
            &Paths::new(r, item_ns, "/no-such-object"),
            Some("application/yaml"),
            None,
        )
        .await;
        self.case(
            format!("{p} unknown subresource"),
            r,
            "GET",
            &get("/bogus"),
            None,
            None,
        )
        .await;
    }

    /// Paging is consistent: an object that appears between two pages is not in the later
    /// pages of the list started before it (it sorts last on both sides). The namespace
    /// made for it is returned, if one was.
    async fn pages_across_a_change(
        &mut self,
        at: &At<'_>,
        e: &mut Env,
        client: &Client,
    ) -> Option<TestNamespace> {
        let (r, p) = (at.r, at.r.plural);
        let mut late = None;
        let tokens = self
            .walk(
                &format!("{p} pages across a change"),
                r,
                None,
                1,
                "",
                (String::new(), String::new()),
                0,
                1,
            )
            .await
            .expect("more than one page");
        let key = if r.namespaced {
            let n = TestNamespace::create(client, "zz-views-diff")
                .await
                .unwrap();
            let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), &n.name);
            let c = serde_json::from_value(
                json!({"metadata": {"name": "late"}, "spec": {"className": "no-such-class"}}),
            )
            .unwrap();
            api.create(&PostParams::default(), &c).await.unwrap();
            let name = n.name.clone();
            late = Some(n);
            format!("namespaces/{name}/{p}/{name}")
        } else {
            format!("{p}/{}", e.class("zz-late", json!({})).await)
        };
        let view_list = format!("/apis/{VIEW_GROUP}/v1alpha1/{p}");
        let name = key.rsplit('/').next().unwrap().to_string();
        let raw = self.client;
        let item = wait_for(
            "the late object in the view's list",
            Duration::from_secs(30),
            || {
                let (view_list, name) = (&view_list, &name);
                async move {
                    let list: Value = serde_json::from_slice(
                        &send(raw, "GET", view_list, None, None).await.body,
                    )?;
                    Ok(list["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|i| i["metadata"]["name"] == json!(name))
                        .cloned())
                }
            },
        )
        .await
        .unwrap();
        mirror_item(client, r, &item).await;
        self.walk(
            &format!("{p} pages across a change"),
            r,
            None,
            1,
            "",
            tokens,
            1,
            1000,
        )
        .await;
        self.case(
            format!("{p} list after the change"),
            r,
            "GET",
            &Paths::new(r, None, ""),
            None,
            None,
        )
        .await;
        late
    }

    /// Writes, refused as kube-apiserver refuses a verb a resource does not have.
    async fn writes(&mut self, at: &At<'_>) {
        let (r, p, item_ns, item) = (at.r, at.r.plural, at.item_ns, at.item);
        let get = |rest: &str| at.get(rest);
        for (method, target) in WRITES {
            let (path, body) = match *target {
                "collection" => (
                    Paths::new(r, item_ns, ""),
                    Some(json!({"metadata": {"name": "new-one"}})),
                ),
                _ => (
                    get(""),
                    (*method != "DELETE").then(|| json!({"metadata": {"name": item}})),
                ),
            };
            self.case(
                format!("{p} {method} {target}"),
                r,
                method,
                &path,
                None,
                body.as_ref(),
            )
            .await;
        }
    }
}

/// The comparison table: every difference explained (`EXPLAINED`), every explanation
/// still needed, and writes refused 405.
fn the_differences_are_explained(outcomes: &[Outcome]) {
    let writes = |id: &str| {
        WRITES
            .iter()
            .any(|(m, t)| id.ends_with(&format!(" {m} {t}")))
    };
    let explained = |id: &str, field: &str| {
        EXPLAINED
            .iter()
            .find(|(c, f, _)| id.contains(c) && *f == field)
            .map(|(_, _, why)| *why)
    };
    let mut unexplained = Vec::new();
    let mut used = std::collections::BTreeSet::new();
    println!("{:<62} {:>5} {:>5}  result", "case", "view", "crd");
    for o in outcomes {
        let mut notes = Vec::new();
        for (field, v, m) in o.diffs.iter().filter(|_| !writes(&o.id)) {
            match explained(&o.id, field) {
                Some(why) => {
                    used.insert(
                        EXPLAINED
                            .iter()
                            .position(|(c, f, _)| o.id.contains(c) && f == field),
                    );
                    notes.push(format!("{field}: explained — {why}"));
                }
                None => {
                    notes.push(format!("{field}: view {v:?} ≠ crd {m:?}"));
                    unexplained.push(format!("{}: {field}: view {v:?} ≠ crd {m:?}", o.id));
                }
            }
        }
        let result = match (o.diffs.is_empty(), writes(&o.id)) {
            (true, _) => "same".to_string(),
            (false, true) => "read-only: 405 MethodNotAllowed".into(),
            (false, false) => notes.join("; "),
        };
        println!(
            "{:<62} {:>5} {:>5}  {result}",
            o.id, o.view_code, o.mirror_code
        );
        // Writes are refused as kube-apiserver refuses a verb a resource does not have.
        if writes(&o.id) {
            assert_eq!(o.view_code, 405, "{}", o.id);
        }
    }
    let stale: Vec<_> = EXPLAINED
        .iter()
        .enumerate()
        .filter(|(i, _)| !used.contains(&Some(*i)))
        .map(|(_, x)| x)
        .collect();
    println!(
        "{} cases, {} differences unexplained",
        outcomes.len(),
        unexplained.len()
    );
    assert!(
        unexplained.is_empty(),
        "differences from kube-apiserver:\n{}",
        unexplained.join("\n")
    );
    assert!(stale.is_empty(), "explanations no longer needed: {stale:?}");
}
