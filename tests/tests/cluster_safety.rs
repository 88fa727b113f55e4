//! The cluster around the aggregated API: an APIService sits in kube-apiserver's critical
//! path — the merged OpenAPI documents every client reads (kubectl explain, client
//! generators, the protobuf `/openapi/v2`), discovery, namespace deletion. These tests look
//! at the cluster, not at the views.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_tests::kubectl_admin as kubectl;
use std::time::{Duration, Instant};

use address_controller_tests::env::{APISERVICE, env, tempdir};
use address_controller_tests::{Cluster, TestNamespace, wait_for};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// What kubectl (and client-go) ask for when they read the protobuf OpenAPI v2.
const PROTO_V2: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// The name of one of the views' definitions in the merged document.
const DEFINITION: &str = "io.cozystack.sdn.local.view.v1alpha1.NamespaceAddresses";

/// `GET path` through kube-apiserver: code and body.
async fn get(client: &kube::Client, path: &str, accept: &str) -> (u16, Vec<u8>) {
    let req = http::Request::builder()
        .uri(path)
        .header("Accept", accept)
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), client.send(req))
        .await
        .expect("an answer within 60s")
        .unwrap();
    let code = resp.status().as_u16();
    (
        code,
        resp.into_body().collect_bytes().await.unwrap().to_vec(),
    )
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The views' OpenAPI documents never break the cluster's: a positive control first (one
/// OpenAPI 3 keyword in the v2 document breaks kube-apiserver's protobuf /openapi/v2, and
/// its log says why); with the real document the cluster's v2 and v3 are whole and include
/// the views, kubectl explains from both, discovery is complete, and kube-apiserver never
/// complains about the group's OpenAPI.
#[tokio::test]
async fn the_clusters_openapi_and_discovery_stay_whole() {
    let mut e = env("safety").await;
    let raw = Cluster::get().raw_client().await.unwrap();

    a_bad_document_breaks_the_clusters_openapi(&mut e, &raw).await;

    // The real document: the cluster's documents are whole and include the views.
    let (ctl, port, _) = e.serve_views().await;
    let started = Instant::now();
    wait_for(
        "the cluster's protobuf /openapi/v2 whole, with the views' definitions",
        Duration::from_secs(180),
        || async {
            let (code, body) = get(&raw, "/openapi/v2", PROTO_V2).await;
            Ok((code == 200 && contains(&body, DEFINITION)).then_some(()))
        },
    )
    .await
    .unwrap();
    println!(
        "the real document: protobuf /openapi/v2 whole again after {:?}",
        started.elapsed()
    );
    // From here on kube-apiserver must not complain about the group's OpenAPI.
    let log = Cluster::get().dir.join("logs/kube-apiserver.log");
    let mark = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let (code, body) = get(&raw, "/openapi/v2", "application/json").await;
    let v2: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(code, 200);
    assert!(v2["definitions"][DEFINITION].is_object());
    assert!(
        v2["definitions"]["io.k8s.api.core.v1.Pod"].is_object(),
        "the cluster's own definitions are there"
    );

    kubectl_explains_from_v2_and_v3(&raw).await;

    // Discovery of the whole cluster is complete.
    let (ok, out, err) = kubectl(&["api-resources"]);
    assert!(ok && !err.contains("unable to retrieve"), "{err}");
    assert!(
        out.contains("namespaceaddresses")
            && out.contains("ipaddressclaims")
            && out.contains("pods")
    );
    // A further download of the document by kube-apiserver (it fetches every minute, or
    // at once when the APIService changes: re-registering makes it fetch now).
    address_controller_tests::env::register_views(&mut e, port).await;
    wait_for(
        "the document fetched again",
        Duration::from_secs(60),
        || async {
            let (code, body) = get(&raw, "/openapi/v2", PROTO_V2).await;
            Ok((code == 200 && contains(&body, DEFINITION)).then_some(()))
        },
    )
    .await
    .unwrap();
    let text = std::fs::read(&log).unwrap_or_default();
    let since = String::from_utf8_lossy(&text[usize::try_from(mark).unwrap().min(text.len())..])
        .into_owned();
    let complaints: Vec<&str> = since
        .lines()
        .filter(|l| {
            l.contains("OpenAPI")
                && (l.contains("view.local.sdn.cozystack.io") || l.contains(DEFINITION))
        })
        .filter(|l| l.contains("rror") || l.contains("failed"))
        .collect();
    assert!(
        complaints.is_empty(),
        "kube-apiserver on the views' OpenAPI: {complaints:#?}"
    );
    e.check_with(&[&ctl]).await;
}

/// Positive control: the views' v2 document with one OpenAPI 3 keyword (what a nullable
/// field becomes without care) — kube-apiserver merges it and then cannot give anyone the
/// protobuf /openapi/v2. This is the failure the test exists to catch.
async fn a_bad_document_breaks_the_clusters_openapi(
    e: &mut address_controller_tests::env::Env,
    raw: &kube::Client,
) {
    let good: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/v2.json"))
            .unwrap(),
    )
    .unwrap();
    let mut bad = good.clone();
    bad["definitions"][DEFINITION]["properties"]["summary"]["anyOf"] =
        json!([{"type": "object"}, {"type": "null"}]);
    let dir = tempdir();
    let bad_file = dir.join("bad-v2.json");
    std::fs::write(&bad_file, bad.to_string()).unwrap();
    let (bad_ctl, _, _) = e
        .serve_views_with(&["--testing-openapi-v2", bad_file.to_str().unwrap()])
        .await;
    let started = Instant::now();
    let (code, body) = wait_for(
        "the cluster's protobuf /openapi/v2 to break on the bad document",
        Duration::from_secs(180),
        || async {
            let (code, body) = get(raw, "/openapi/v2", PROTO_V2).await;
            Ok((code != 200).then_some((code, body)))
        },
    )
    .await
    .unwrap();
    println!(
        "positive control: an anyOf in the views' v2 document → the cluster's protobuf /openapi/v2 answers {code} after {:?}: {}",
        started.elapsed(),
        String::from_utf8_lossy(&body)
            .chars()
            .take(200)
            .collect::<String>()
    );
    // The cause is the document: kube-apiserver says so.
    let log = Cluster::get().dir.join("logs/kube-apiserver.log");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.lines().any(|l| l.contains("Error in OpenAPI handler")
            && l.contains(DEFINITION)
            && l.contains("anyOf")),
        "kube-apiserver's log names the bad field"
    );
    drop(bad_ctl);
}

/// kubectl explain of a built-in kind and of the views, from v2 and from v3; the v3 index
/// lists the group, and its document is served through the cluster.
async fn kubectl_explains_from_v2_and_v3(raw: &kube::Client) {
    let (ok, out, err) = kubectl(&[
        "explain",
        "pods.spec.containers",
        "--output=plaintext-openapiv2",
    ]);
    assert!(ok && out.contains("FIELDS"), "{err}");
    let (ok, out, err) = kubectl(&[
        "explain",
        "namespaceaddresses.summary",
        "--output=plaintext-openapiv2",
    ]);
    assert!(ok && out.contains("releasedRetained"), "{out}{err}");
    // From OpenAPI v3: the aggregator loads a group's v3 document on its own schedule, so
    // kubectl may not find the resource for a moment (CI saw "couldn't find resource" once).
    wait_for(
        "kubectl explain poolavailabilities (v3)",
        Duration::from_secs(60),
        || async {
            let (ok, out, err) = kubectl(&["explain", "poolavailabilities"]);
            if ok && out.contains("pendingClaims") {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{out}{err}"))
            }
        },
    )
    .await
    .unwrap();

    // OpenAPI v3: the index lists the group, and its document is served through the cluster.
    let (code, body) = get(raw, "/openapi/v3", "application/json").await;
    assert_eq!(code, 200);
    let index: Value = serde_json::from_slice(&body).unwrap();
    let url = index["paths"]["apis/view.local.sdn.cozystack.io/v1alpha1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, body) = get(raw, &url, "application/json").await;
    assert_eq!(code, 200);
    let v3: Value = serde_json::from_slice(&body).unwrap();
    assert!(v3["components"]["schemas"][DEFINITION].is_object());
}

/// Waits for a namespace to be gone; how long it took.
async fn gone(client: &kube::Client, name: &str, within: Duration) -> Duration {
    let api: Api<Namespace> = Api::all(client.clone());
    let started = Instant::now();
    wait_for(&format!("namespace {name} gone"), within, || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    started.elapsed()
}

#[tokio::test]
async fn namespace_deletion_waits_while_no_replica_serves_and_resumes() {
    let mut e = env("safety-ns").await;
    let client = e.client.clone();
    let cluster = Cluster::get();
    let (ctl, _, _) = e.serve_views().await;

    // Served: a namespace holding a claim goes away (the controller reclaims the claim).
    let first = TestNamespace::create(&client, "safety-a").await.unwrap();
    let claims: Api<address_controller_api::IPAddressClaim> =
        Api::namespaced(client.clone(), &first.name);
    let claim =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"className": "none"}}))
            .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    cluster
        .kubectl_ok(&["delete", "namespace", &first.name, "--wait=false"])
        .unwrap();
    let took = gone(&client, &first.name, Duration::from_secs(60)).await;
    println!("views served: a namespace with a claim deleted in {took:?}");

    // No replica serving: kube-apiserver marks the APIService unavailable. Reads of other
    // groups and the cluster's OpenAPI go on.
    drop(ctl);
    wait_for(
        "the APIService unavailable",
        Duration::from_secs(120),
        || async {
            let out = cluster.kubectl_ok(&[
                "get",
                "apiservice",
                APISERVICE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ])?;
            Ok((out.trim() == "False").then_some(()))
        },
    )
    .await
    .unwrap();
    let (ok, _, err) = kubectl(&["get", "ipaddressclaims", "-A"]);
    assert!(ok, "other groups are served: {err}");
    let (ok, _, err) = kubectl(&["get", "--raw", "/openapi/v2"]);
    assert!(ok, "the cluster's OpenAPI is served: {err}");

    // A namespace deleted now waits: the namespace controller cannot list what the
    // unavailable group holds, and says so in the namespace's conditions.
    let second = TestNamespace::create(&client, "safety-b").await.unwrap();
    cluster
        .kubectl_ok(&["create", "configmap", "x", "-n", &second.name])
        .unwrap();
    cluster
        .kubectl_ok(&["delete", "namespace", &second.name, "--wait=false"])
        .unwrap();
    let nss: Api<Namespace> = Api::all(client.clone());
    let condition = wait_for(
        "the namespace's discovery failure condition",
        Duration::from_secs(60),
        || async {
            let ns = nss.get(&second.name).await?;
            let failure = ns
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "NamespaceDeletionDiscoveryFailure" && c.status == "True");
            Ok(failure.map(|c| c.message.unwrap_or_default()))
        },
    )
    .await
    .unwrap();
    assert!(
        condition.contains("view.local.sdn.cozystack.io"),
        "{condition}"
    );
    println!("no replica serving: namespace deletion waits — {condition}");

    // Served again: the namespace goes.
    let (ctl, _, _) = e.serve_views().await;
    let took = gone(&client, &second.name, Duration::from_secs(120)).await;
    println!("served again: the waiting namespace deleted {took:?} after the APIService came back");
    drop((first, second));
    e.check_with(&[&ctl]).await;
}

/// The caches take their first state in pages of 500 — by default, as kube-apiserver 1.36
/// spends less CPU on pages than on a streaming list of the same objects — and as streaming
/// lists (a watch with `sendInitialEvents`, served from kube-apiserver's watch cache) with
/// `--streaming-lists`. Both sides say which: the controller's own count of its lists, and
/// kube-apiserver's count of the streaming lists it served.
#[tokio::test]
async fn the_caches_start_from_pages_or_streaming_lists() {
    let served = || -> f64 {
        let text = Cluster::get()
            .kubectl_ok(&["get", "--raw", "/metrics"])
            .unwrap();
        address_controller_tests::sum_samples(
            &text,
            "apiserver_watch_list_duration_seconds_count{",
            |l| l.contains("resource=\"ipaddresses\""),
        )
    };
    for streaming in [false, true] {
        let before = served();
        let flag = format!("--streaming-lists={streaming}");
        let ctl = address_controller_tests::ControllerProcess::start(
            &format!("ctl-stream-{}", address_controller_tests::random_suffix()),
            &["--leader-elect=false", &flag],
        )
        .await
        .unwrap();
        let text = ctl.metrics().await.unwrap();
        let count = |family: &str, kind: &str| -> f64 {
            let series = format!("{family}{{kind=\"{kind}\"}}");
            address_controller_tests::sample(&text, &series).unwrap_or(0.0)
        };
        for kind in ["IPAddress", "IPAddressClaim", "IPAddressClass", "Service"] {
            let lists = count("address_controller_cache_lists_total", kind);
            let streamed = count("address_controller_cache_streaming_lists_total", kind);
            assert!(lists >= 1.0, "{flag}: {kind}: no list at all:\n{text}");
            let expected = if streaming { lists } else { 0.0 };
            assert_eq!(
                streamed, expected,
                "{flag}: {kind}: streaming lists of all lists"
            );
        }
        // Other processes on the shared cluster may take streaming lists of their own, so
        // only their presence is a proof, and only for `--streaming-lists=true`.
        if streaming {
            assert!(
                served() > before,
                "kube-apiserver served no streaming list of ipaddresses"
            );
        }
        drop(ctl);
    }
}
