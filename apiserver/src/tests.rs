//! Router-level tests with `tower::ServiceExt::oneshot`: no sockets, no cluster. Caches
//! are filled by hand; the front-proxy CA and client certificate are made with rcgen.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_runtime::cache::{Cache, key_of};
use address_controller_runtime::health::{Bounds, Health};
use address_controller_runtime::world::World;
use axum::body::Body;
use http::{Request, StatusCode};
use k8s_openapi::api::core::v1::ConfigMap;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::metrics::ApiMetrics;
use crate::store::{HistoryBound, ViewStore};
use crate::{State, router};
use address_controller_serving::authn::{Authenticator, FrontProxy, PeerCerts};
use address_controller_serving::authz::Authorizer;
use address_controller_serving::limits::{InFlight, ReviewGate, ServerLimits};

fn fill<K>(cache: &Cache<K>, objects: Vec<Value>)
where
    K: address_controller_runtime::cache::Object,
{
    for o in objects {
        let o: K = serde_json::from_value(o).unwrap();
        cache.apply(key_of(&o), Some(Arc::new(o)));
    }
    cache.health.mark_synced();
}

/// A client that fails every request: these tests must never reach an API server.
fn offline_client() -> kube::Client {
    let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
        Err::<http::Response<String>, std::io::Error>(std::io::Error::other("offline"))
    });
    kube::Client::new(svc, "default")
}

struct Pki {
    ca_pem: String,
    proxy: Vec<CertificateDer<'static>>,
    stranger: Vec<CertificateDer<'static>>,
    /// The front proxy's CA, a CN not in the allowed names.
    misnamed: Vec<CertificateDer<'static>>,
}

fn client_cert(cn: &str, issuer: &CertifiedIssuer<'_, KeyPair>) -> CertificateDer<'static> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.signed_by(&KeyPair::generate().unwrap(), issuer)
        .unwrap()
        .der()
        .clone()
}

fn ca(cn: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, cn);
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

fn pki() -> Pki {
    let fp = ca("front-proxy-ca");
    let other = ca("cluster-ca");
    Pki {
        ca_pem: fp.pem(),
        proxy: vec![client_cert("front-proxy-client", &fp)],
        stranger: vec![client_cert("front-proxy-client", &other)],
        misnamed: vec![client_cert("some-other-client", &fp)],
    }
}

fn app(pki: &Pki) -> axum::Router {
    app_with(pki).0
}

fn app_with(pki: &Pki) -> (axum::Router, World, Arc<ViewStore>) {
    app_keeping(pki, HistoryBound::changes(100))
}

/// The app, its caches and its store, keeping `history` changes.
fn app_keeping(pki: &Pki, history: HistoryBound) -> (axum::Router, World, Arc<ViewStore>) {
    app_limited(pki, history, ServerLimits::default())
}

/// [`app_keeping`] within `limits`.
fn app_limited(
    pki: &Pki,
    history: HistoryBound,
    limits: ServerLimits,
) -> (axum::Router, World, Arc<ViewStore>) {
    let world = World::new(false, Health::new(Bounds::default()));
    // The store sees the caches from their first object on, as in the binary.
    let store = ViewStore::new(world.clone(), crate::resources::all(), history);
    store.register();
    fill::<IPAddressClaim>(
        &world.claims,
        vec![
            json!({"metadata": {"name": "web", "namespace": "a"}, "spec": {}, "status": {"phase": "Bound", "className": "pub", "addresses": [{"name": "x", "address": "192.0.2.1"}]}}),
            json!({"metadata": {"name": "db", "namespace": "b"}, "spec": {}, "status": {"phase": "Pending", "className": "pub"}}),
            json!({"metadata": {"name": "c", "namespace": "c"}, "spec": {}}),
        ],
    );
    fill::<IPAddress>(
        &world.addresses,
        vec![
            json!({"metadata": {"name": "x"}, "spec": {"address": "192.0.2.1", "className": "pub",
        "source": {"fromClass": {}}, "claimRef": {"namespace": "a", "name": "web"}}, "status": {"phase": "Bound"}}),
        ],
    );
    fill::<IPAddressClass>(
        &world.classes,
        vec![
            json!({"metadata": {"name": "pub", "labels": {"tier": "gold"}}, "spec": {"provisioner": "p"}, "status": {"capacity": {"ipv4": 4}}}),
            json!({"metadata": {"name": "zzz"}, "spec": {"provisioner": "q"}}),
        ],
    );
    world.revision.store(77, Ordering::Release);
    store.recompute();
    let client = offline_client();
    let authn = Authenticator::new(client.clone(), 100, ReviewGate::unlimited());
    let cm: ConfigMap = serde_json::from_value(json!({"data": {
        "requestheader-client-ca-file": pki.ca_pem, "requestheader-allowed-names": "[\"front-proxy-client\"]",
        "requestheader-username-headers": "[\"X-Remote-User\"]", "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]"}}))
    .unwrap();
    authn.set_front_proxy(Some(FrontProxy::from_config_map(&cm).unwrap()));
    let access = address_controller_serving::front::Access {
        authn: authn.clone(),
        authz: Arc::new(Authorizer::new(client, 100, ReviewGate::unlimited())),
        inflight: Arc::new(InFlight::new(&limits)),
    };
    let app = router(
        Arc::new(State {
            store: store.clone(),
            authn,
            metrics: ApiMetrics::unregistered(),
            openapi: crate::openapi::Served::new(None),
        }),
        access,
    );
    (app, world, store)
}

async fn call(
    app: &axum::Router,
    certs: &[CertificateDer<'static>],
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, BTreeMap<String, String>, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::empty()).unwrap();
    req.extensions_mut().insert(PeerCerts(certs.to_vec()));
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let hdrs = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        hdrs,
        serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into())),
    )
}

const ADMIN: [(&str, &str); 2] = [
    ("X-Remote-User", "admin"),
    ("X-Remote-Group", "system:masters"),
];
const BASE: &str = "/apis/view.local.sdn.cozystack.io/v1alpha1";

#[tokio::test]
async fn authentication_trusts_headers_only_from_the_front_proxy() {
    let pki = pki();
    let app = app(&pki);
    let url = format!("{BASE}/namespaceaddresses");
    assert_eq!(
        call(&app, &pki.proxy, "GET", &url, &ADMIN).await.0,
        StatusCode::OK
    );
    // Same CN, wrong CA: 401, the headers are never read.
    let (code, _, body) = call(&app, &pki.stranger, "GET", &url, &ADMIN).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("Unauthorized"))
    );
    // The front proxy's CA, a CN it does not allow (another client the same CA signed):
    // 401 as kube-apiserver answers it (the reason stays in the log), the headers never read.
    let (code, _, body) = call(&app, &pki.misnamed, "GET", &url, &ADMIN).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("Unauthorized")),
        "{body}"
    );
    // No certificate: anonymous; its SubjectAccessReview cannot even be asked offline.
    assert_eq!(
        call(&app, &[], "GET", &url, &ADMIN).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // Probes need nothing.
    assert_eq!(
        call(&app, &[], "GET", "/readyz", &[]).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn negotiation_lists_and_pagination() {
    let pki = pki();
    let app = app(&pki);
    let get = |uri: String, accept: &'static str| {
        let app = app.clone();
        let certs = pki.proxy.clone();
        async move {
            let mut h = ADMIN.to_vec();
            h.push(("Accept", accept));
            call(&app, &certs, "GET", &uri, &h).await
        }
    };
    let (_, _, list) = get(format!("{BASE}/namespaceaddresses"), "application/json").await;
    assert_eq!(list["kind"], "NamespaceAddressesList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(list["metadata"]["resourceVersion"], "77");
    let (_, _, table) = get(
        format!("{BASE}/namespaceaddresses"),
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .await;
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["columnDefinitions"][0]["name"], "Name");
    assert_eq!(table["rows"][0]["cells"][1], 1);
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let (_, _, meta) = get(
        format!("{BASE}/poolavailabilities"),
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    )
    .await;
    assert_eq!(meta["kind"], "PartialObjectMetadataList");
    // limit / continue walk the list in a stable order.
    let (_, _, page1) = get(
        format!("{BASE}/namespaceaddresses?limit=2"),
        "application/json",
    )
    .await;
    assert_eq!(page1["items"].as_array().unwrap().len(), 2);
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, _, page2) = get(
        format!(
            "{BASE}/namespaceaddresses?limit=2&continue={}",
            token.replace('/', "%2F")
        ),
        "application/json",
    )
    .await;
    assert_eq!(page2["items"][0]["metadata"]["name"], "c");
    assert!(page2["metadata"].get("continue").is_none());
    // Selectors.
    let (_, _, sel) = get(
        format!("{BASE}/namespaceaddresses?fieldSelector=metadata.namespace%3Db"),
        "application/json",
    )
    .await;
    assert_eq!(sel["items"].as_array().unwrap().len(), 1);
    let (code, _, body) = get(
        format!("{BASE}/namespaceaddresses?fieldSelector=spec.x%3D1"),
        "application/json",
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("BadRequest"))
    );
    let (_, _, sel) = get(
        format!("{BASE}/poolavailabilities?labelSelector=tier%3Dgold"),
        "application/json",
    )
    .await;
    let names: Vec<&str> = sel["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pub"], "a pool carries its class's labels");
    // One object; an empty namespace has zeros; the pool's numbers.
    let (_, _, empty) = get(
        format!("{BASE}/namespaces/zz/namespaceaddresses/zz"),
        "application/json",
    )
    .await;
    assert_eq!(empty["summary"]["claims"]["total"], 0);
    let (_, _, pool) = get(format!("{BASE}/poolavailabilities/pub"), "application/json").await;
    assert_eq!(
        (
            pool["free"]["ipv4"].as_i64(),
            pool["pendingClaims"].as_i64()
        ),
        (Some(3), Some(1))
    );
}

#[tokio::test]
async fn errors_are_status_objects() {
    let pki = pki();
    let app = app(&pki);
    let cases = [
        (
            "DELETE",
            format!("{BASE}/poolavailabilities/pub"),
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
        ),
        (
            "POST",
            format!("{BASE}/namespaces/a/namespaceaddresses"),
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
        ),
        (
            "GET",
            format!("{BASE}/poolavailabilities/nope"),
            StatusCode::NOT_FOUND,
            "NotFound",
        ),
        (
            "GET",
            format!("{BASE}/namespaces/a/namespaceaddresses/b"),
            StatusCode::NOT_FOUND,
            "NotFound",
        ),
    ];
    // A resource the group does not serve: kube-apiserver's plain-text 404.
    let (got, headers, body) =
        call(&app, &pki.proxy, "GET", &format!("{BASE}/nothing"), &ADMIN).await;
    assert_eq!(
        (got, headers["content-type"].as_str(), body),
        (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Value::String("404 page not found\n".into())
        )
    );
    for (method, uri, code, reason) in cases {
        let (got, _, body) = call(&app, &pki.proxy, method, &uri, &ADMIN).await;
        assert_eq!(
            (got, body["kind"].as_str(), body["reason"].as_str()),
            (code, Some("Status"), Some(reason)),
            "{method} {uri}"
        );
    }
}

#[tokio::test]
async fn discovery_documents() {
    let pki = pki();
    let app = app(&pki);
    let mut h = ADMIN.to_vec();
    h.push((
        "Accept",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
    ));
    let (code, headers, body) = call(&app, &pki.proxy, "GET", "/apis", &h).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        headers["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    assert_eq!(
        body["items"][0]["metadata"]["name"],
        "view.local.sdn.cozystack.io"
    );
    let (_, _, legacy) = call(&app, &pki.proxy, "GET", BASE, &ADMIN).await;
    assert_eq!(legacy["kind"], "APIResourceList");
    let (_, _, group) = call(
        &app,
        &pki.proxy,
        "GET",
        "/apis/view.local.sdn.cozystack.io",
        &ADMIN,
    )
    .await;
    assert_eq!(group["preferredVersion"]["version"], "v1alpha1");
}

/// The lines of a watch that ends by itself (`timeoutSeconds`, or an ERROR event).
async fn watch_lines(
    app: &axum::Router,
    certs: &[CertificateDer<'static>],
    uri: &str,
) -> (StatusCode, Vec<Value>) {
    let mut req = Request::builder().method("GET").uri(uri);
    for (k, v) in ADMIN {
        req = req.header(k, v);
    }
    let mut req = req.body(Body::empty()).unwrap();
    req.extensions_mut().insert(PeerCerts(certs.to_vec()));
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let lines = String::from_utf8_lossy(&bytes)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (status, lines)
}

/// The resourceVersion of a list of namespaceaddresses.
async fn listed_revision(app: &axum::Router, pki: &Pki) -> String {
    let (_, _, list) = call(
        app,
        &pki.proxy,
        "GET",
        &format!("{BASE}/namespaceaddresses"),
        &ADMIN,
    )
    .await;
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_watch_resumes_exactly_where_a_list_left_off() {
    let pki = pki();
    let (app, world, store) = app_with(&pki);
    let listed = listed_revision(&app, &pki).await;
    // A change whose revision the caches have not counted yet (the watch event's revision
    // arrives with it, but the batch may read the counter first): the batch must still be
    // labelled after the list, or a watch from the list's revision would skip it.
    fill::<IPAddressClaim>(
        &world.claims,
        vec![
            json!({"metadata": {"name": "new", "namespace": "d"}, "spec": {}, "status": {"phase": "Pending", "className": "pub"}}),
        ],
    );
    store.recompute();
    let (code, events) = watch_lines(
        &app,
        &pki.proxy,
        &format!("{BASE}/namespaceaddresses?watch=true&resourceVersion={listed}&timeoutSeconds=1"),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    let got: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [("ADDED", "d")], "{events:?}");
    let after: u64 = events[0]["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(after > listed.parse::<u64>().unwrap());
    // From the event's revision on: nothing again.
    let (_, again) = watch_lines(
        &app,
        &pki.proxy,
        &format!("{BASE}/namespaceaddresses?watch=true&resourceVersion={after}&timeoutSeconds=1"),
    )
    .await;
    assert!(again.is_empty(), "{again:?}");
    // Older than the history: the ERROR event 410 Expired, as kube-apiserver sends it.
    let (code, expired) = watch_lines(
        &app,
        &pki.proxy,
        &format!("{BASE}/namespaceaddresses?watch=true&resourceVersion=5"),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        (
            expired.len(),
            expired[0]["type"].as_str(),
            expired[0]["object"]["code"].as_i64(),
            expired[0]["object"]["reason"].as_str()
        ),
        (1, Some("ERROR"), Some(410), Some("Expired"))
    );
    // A watch with initial events: every object, then the bookmark that ends them.
    let (_, initial) = watch_lines(
        &app,
        &pki.proxy,
        &format!("{BASE}/namespaceaddresses?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"),
    )
    .await;
    let kinds: Vec<&str> = initial
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ADDED", "ADDED", "ADDED", "ADDED", "BOOKMARK"]);
    assert_eq!(
        initial[4]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(
        initial[4]["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap(),
        after.to_string()
    );
}

fn names(list: &Value) -> Vec<&str> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn pages_are_consistent_and_an_expired_list_continues_from_now() {
    let pki = pki();
    let (app, world, store) = app_keeping(&pki, HistoryBound::changes(1));
    let get = |uri: String| {
        let (app, certs) = (app.clone(), pki.proxy.clone());
        async move { call(&app, &certs, "GET", &uri, &ADMIN).await }
    };
    let (_, _, page1) = get(format!("{BASE}/namespaceaddresses?limit=1")).await;
    assert_eq!(names(&page1), ["a"]);
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    // A namespace that sorts between the pages appears: the list begun before it goes on
    // without it, as an etcd list at one revision does.
    fill::<IPAddressClaim>(
        &world.claims,
        vec![json!({"metadata": {"name": "n", "namespace": "bb"}, "spec": {}})],
    );
    store.recompute();
    let (code, _, page2) = get(format!(
        "{BASE}/namespaceaddresses?limit=2&continue={token}"
    ))
    .await;
    assert_eq!((code, names(&page2)), (StatusCode::OK, vec!["b", "c"]));
    let (_, _, now) = get(format!("{BASE}/namespaceaddresses")).await;
    assert_eq!(names(&now), ["a", "b", "bb", "c"]);
    // Two more changes: the one-change history no longer reaches back to the first page.
    for ns in ["x", "y"] {
        fill::<IPAddressClaim>(
            &world.claims,
            vec![json!({"metadata": {"name": "n", "namespace": ns}, "spec": {}})],
        );
        store.recompute();
    }
    let (code, _, expired) = get(format!(
        "{BASE}/namespaceaddresses?limit=1&continue={token}"
    ))
    .await;
    assert_eq!(
        (code, expired["reason"].as_str()),
        (StatusCode::GONE, Some("Expired"))
    );
    // kube-apiserver's way on: a token that continues from the current state.
    let again = expired["metadata"]["continue"].as_str().unwrap();
    let (code, _, rest) = get(format!("{BASE}/namespaceaddresses?continue={again}")).await;
    assert_eq!(
        (code, names(&rest)),
        (StatusCode::OK, vec!["b", "bb", "c", "x", "y"])
    );
}

#[tokio::test]
async fn the_metrics_endpoint_passes_the_same_front_door() {
    let pki = pki();
    let client = offline_client();
    let authn = Authenticator::new(client.clone(), 100, ReviewGate::unlimited());
    let cm: ConfigMap = serde_json::from_value(json!({"data": {
        "requestheader-client-ca-file": pki.ca_pem, "requestheader-allowed-names": "[\"front-proxy-client\"]",
        "requestheader-username-headers": "[\"X-Remote-User\"]", "requestheader-group-headers": "[\"X-Remote-Group\"]"}}))
    .unwrap();
    authn.set_front_proxy(Some(FrontProxy::from_config_map(&cm).unwrap()));
    let access = address_controller_serving::front::Access {
        authn,
        authz: Arc::new(Authorizer::new(client, 100, ReviewGate::unlimited())),
        inflight: Arc::new(InFlight::new(&ServerLimits::default())),
    };
    let app = address_controller_serving::secure::metrics_router(
        access,
        Arc::new(|| "up 1\n".to_string()),
    );
    // An allowed principal reads the metrics.
    let (code, _, body) = call(&app, &pki.proxy, "GET", "/metrics", &ADMIN).await;
    assert_eq!(
        (code, body),
        (StatusCode::OK, Value::String("up 1\n".into()))
    );
    // A certificate from the wrong CA is refused before anything is rendered.
    let (code, _, body) = call(&app, &pki.stranger, "GET", "/metrics", &ADMIN).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("Unauthorized"))
    );
    // Anonymous: the SubjectAccessReview cannot be asked offline.
    assert_eq!(
        call(&app, &[], "GET", "/metrics", &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // Any other path is a plain 404, unauthenticated.
    let (code, _, body) = call(&app, &pki.stranger, "GET", "/other", &ADMIN).await;
    assert_eq!(
        (code, body),
        (
            StatusCode::NOT_FOUND,
            Value::String("404 page not found\n".into())
        )
    );
}

#[tokio::test]
async fn only_a_change_of_a_view_object_is_an_event_and_every_format_carries_its_revision() {
    let pki = pki();
    let (app, world, store) = app_with(&pki);
    let listed = listed_revision(&app, &pki).await;
    // The claim again with a new resourceVersion of its own: namespace a's object is
    // recomputed, the same but for its revision — not an event.
    fill::<IPAddressClaim>(
        &world.claims,
        vec![
            json!({"metadata": {"name": "web", "namespace": "a", "resourceVersion": "900"}, "spec": {}, "status": {"phase": "Bound", "className": "pub", "addresses": [{"name": "x", "address": "192.0.2.1"}]}}),
        ],
    );
    world.revision.store(900, Ordering::Release);
    store.recompute();
    let watch =
        format!("{BASE}/namespaceaddresses?watch=true&resourceVersion={listed}&timeoutSeconds=1");
    let (_, none) = watch_lines(&app, &pki.proxy, &watch).await;
    assert!(none.is_empty(), "{none:?}");
    // Positive control: a change the object shows is one event.
    fill::<IPAddressClaim>(
        &world.claims,
        vec![
            json!({"metadata": {"name": "web", "namespace": "a", "resourceVersion": "901"}, "spec": {}, "status": {"phase": "Pending", "className": "pub"}}),
        ],
    );
    world.revision.store(901, Ordering::Release);
    store.recompute();
    let (_, events) = watch_lines(&app, &pki.proxy, &watch).await;
    let got: Vec<(&str, &str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap(),
                e["object"]["metadata"]["resourceVersion"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [("MODIFIED", "a", "901")], "{events:?}");
    // Formats built from the stored serialization: the object, its metadata and a Table
    // row's object at that revision.
    let one = format!("{BASE}/namespaces/a/namespaceaddresses/a");
    let (_, _, json) = call(&app, &pki.proxy, "GET", &one, &ADMIN).await;
    let table_accept = [
        ADMIN[0],
        ADMIN[1],
        ("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io"),
    ];
    let (_, _, table) = call(&app, &pki.proxy, "GET", &one, &table_accept).await;
    let partial_accept = [
        ADMIN[0],
        ADMIN[1],
        (
            "Accept",
            "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
        ),
    ];
    let (_, _, partial) = call(&app, &pki.proxy, "GET", &one, &partial_accept).await;
    assert_eq!(json["metadata"]["resourceVersion"], "901");
    assert_eq!(table["metadata"]["resourceVersion"], "901");
    assert_eq!(table["rows"][0]["object"]["metadata"], json["metadata"]);
    assert_eq!(partial["kind"], "PartialObjectMetadata");
    assert_eq!(partial["metadata"], json["metadata"]);
    let object_table = format!("{one}?includeObject=Object");
    let (_, _, with_object) = call(&app, &pki.proxy, "GET", &object_table, &table_accept).await;
    assert_eq!(with_object["rows"][0]["object"], json);
}

#[tokio::test]
async fn the_history_keeps_what_its_byte_bound_allows() {
    let pki = pki();
    let claim = |rv: &str, phase: &str| {
        json!({"metadata": {"name": "db", "namespace": "b", "resourceVersion": rv}, "spec": {},
            "status": {"phase": phase, "className": "pub"}})
    };
    let change = |world: &World, store: &ViewStore, rv: u64, phase: &str| {
        fill::<IPAddressClaim>(&world.claims, vec![claim(&rv.to_string(), phase)]);
        world.revision.store(rv, Ordering::Release);
        store.recompute();
        store.sizes().history_bytes
    };
    // What one change and two changes weigh, kept whole.
    let (_, world, probe) = app_with(&pki);
    let one = change(&world, &probe, 900, "Lost");
    let two = change(&world, &probe, 901, "Pending");
    assert!(one > 0 && two > one, "{one} {two}");
    // A bound that holds either change, not both.
    let (app, world, store) = app_keeping(
        &pki,
        HistoryBound {
            changes: 100,
            bytes: two - 1,
        },
    );
    let watch_from = |rv: u64| {
        format!("{BASE}/namespaceaddresses?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    };
    let listed = store.revision();
    change(&world, &store, 900, "Lost");
    // Positive control: one change is kept and replayed.
    let (_, first) = watch_lines(&app, &pki.proxy, &watch_from(listed)).await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["type"], "MODIFIED", "{first:?}");
    change(&world, &store, 901, "Pending");
    // The second pushes the first out: from before it, 410 Expired; from after it, the second.
    let (_, expired) = watch_lines(&app, &pki.proxy, &watch_from(listed)).await;
    assert_eq!(expired[0]["type"], "ERROR", "{expired:?}");
    assert_eq!(expired[0]["object"]["code"], 410);
    let (_, second) = watch_lines(&app, &pki.proxy, &watch_from(900)).await;
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(second[0]["object"]["metadata"]["resourceVersion"], "901");
}

#[tokio::test]
async fn the_store_sizes_follow_its_objects_and_its_history() {
    let pki = pki();
    let (_, world, store) = app_with(&pki);
    let held = |store: &ViewStore| {
        (0..store.views.len())
            .map(|v| store.snapshot(v).objects)
            .fold((0, 0), |(n, bytes), objects| {
                (
                    n + objects.len(),
                    bytes + objects.iter().map(|e| e.json.len()).sum::<usize>(),
                )
            })
    };
    store.recompute();
    let base = store.sizes();
    assert!(base.object_bytes > 0, "{base:?}");
    assert_eq!((base.objects, base.object_bytes), held(&store));
    // A claim in a namespace of its own: a new object of the namespace view, one change.
    let q: IPAddressClaim = serde_json::from_value(json!({"metadata": {"name": "q", "namespace": "z", "resourceVersion": "900"}, "spec": {}, "status": {"phase": "Pending", "className": "pub"}})).unwrap();
    world.claims.apply(key_of(&q), Some(Arc::new(q.clone())));
    world.revision.store(900, Ordering::Release);
    store.recompute();
    let grown = store.sizes();
    assert!(grown.object_bytes > base.object_bytes, "{grown:?}");
    assert_eq!((grown.objects, grown.object_bytes), held(&store));
    assert!(grown.history_changes > base.history_changes, "{grown:?}");
    assert!(grown.history_bytes > base.history_bytes, "{grown:?}");
    // Its deletion takes its bytes out of the objects, and is one more change.
    world.claims.apply(key_of(&q), None);
    world.revision.store(901, Ordering::Release);
    store.recompute();
    let shrunk = store.sizes();
    assert!(shrunk.object_bytes < grown.object_bytes, "{shrunk:?}");
    assert_eq!((shrunk.objects, shrunk.object_bytes), held(&store));
    assert!(shrunk.history_changes > grown.history_changes, "{shrunk:?}");
}

/// After the shutdown signal the server stops accepting; draining, it returns only once
/// the connections it has are closed (kube-apiserver's keeps being answered while the
/// endpoint goes), and without draining at once.
#[tokio::test]
async fn a_draining_server_returns_once_its_connections_close() {
    use std::time::Duration;
    let config = address_controller_serving::tls::server_config(
        address_controller_serving::tls::ServingCert::SelfSigned(vec!["localhost".into()]),
    )
    .unwrap();
    for drain in [true, false] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listen = address_controller_serving::listener::Listen {
            addr,
            server: "test",
            transport: address_controller_serving::listener::Transport::Tls(config.clone()),
            limits: ServerLimits::default(),
            budget: address_controller_serving::budget::HeadBudget::unlimited(),
            identify: None,
            drain,
        };
        let server = tokio::spawn(address_controller_serving::listener::serve(
            listen,
            axum::Router::new(),
            async move {
                let _ = stopped.await;
            },
        ));
        // A connection open (its handshake not even begun) when the signal comes.
        let conn = loop {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send(()).unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), async {
            while !server.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok();
        assert_eq!(
            early, !drain,
            "drain {drain}: returned with a connection open: {early}"
        );
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err() || !drain,
            "still accepting while draining"
        );
        drop(conn);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("returned once the connection closed")
            .unwrap()
            .unwrap();
    }
}

/// A GET as the admin whose response is returned as it comes (its body not read).
async fn open(
    app: &axum::Router,
    certs: &[CertificateDer<'static>],
    uri: &str,
) -> axum::response::Response {
    let mut req = Request::builder().method("GET").uri(uri);
    for (k, v) in ADMIN {
        req = req.header(k, v);
    }
    let mut req = req.body(Body::empty()).unwrap();
    req.extensions_mut().insert(PeerCerts(certs.to_vec()));
    app.clone().oneshot(req).await.unwrap()
}

#[tokio::test]
async fn hostile_list_options_are_answered_and_watches_are_bounded() {
    let pki = pki();
    let limits = ServerLimits {
        max_watches: 1,
        ..ServerLimits::default()
    };
    let (app, _, _) = app_limited(&pki, HistoryBound::changes(100), limits);
    // A non-ASCII field selector (it panicked inside the selector parser): an answer.
    let (code, _, _) = call(
        &app,
        &pki.proxy,
        "GET",
        &format!("{BASE}/namespaceaddresses?fieldSelector=metadata.name%3D%C3%A9"),
        &ADMIN,
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    // The largest timeoutSeconds (its deadline overflowed an Instant): a watch, held open.
    let first = open(
        &app,
        &pki.proxy,
        &format!("{BASE}/namespaceaddresses?watch=true&timeoutSeconds=9223372036854775807"),
    )
    .await;
    assert_eq!(first.status(), StatusCode::OK);
    // The one place for a watch is taken: 429 with Retry-After, at once.
    let second = open(
        &app,
        &pki.proxy,
        &format!("{BASE}/namespaceaddresses?watch=1"),
    )
    .await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        second
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let body: Value = serde_json::from_slice(
        &axum::body::to_bytes(second.into_body(), 1 << 20)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(body["reason"], "TooManyRequests");
    // Lists are counted apart from watches.
    assert_eq!(
        call(
            &app,
            &pki.proxy,
            "GET",
            &format!("{BASE}/namespaceaddresses"),
            &ADMIN
        )
        .await
        .0,
        StatusCode::OK
    );
    // The place is freed when the first watch's body goes.
    drop(first);
    let third = open(
        &app,
        &pki.proxy,
        &format!("{BASE}/namespaceaddresses?watch=1&timeoutSeconds=1"),
    )
    .await;
    assert_eq!(third.status(), StatusCode::OK);
}
