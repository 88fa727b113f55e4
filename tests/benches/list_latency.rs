//! `make bench`: list latency of `kubectl get namespaceaddresses -A` through the aggregator
//! next to `kubectl get ipaddressclaims -A` on the same data, and the time to bind the
//! claims. Prints figures; asserts nothing about speed (targets are read, not enforced).
//!
//! Scale with ADDRESS_CONTROLLER_BENCH_CLAIMS (default 2000) spread over 100 namespaces.

use std::time::{Duration, Instant};

use address_controller_tests::env::{env, register_views};
use address_controller_tests::{Cluster, ControllerProcess, free_port, wait_for};
use futures::StreamExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

fn time_kubectl(args: &[&str], runs: usize) -> (Duration, Duration) {
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = Cluster::get()
                .kubectl()
                .args(args)
                .output()
                .expect("kubectl");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            t.elapsed()
        })
        .collect();
    samples.sort();
    (samples[runs / 2], samples[runs - 1])
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("ADDRESS_CONTROLLER_BENCH_CLAIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let namespaces = 100usize;
    let mut e = env("bench").await;
    e.ctl.kill();
    let cluster = Cluster::get();
    let pki = cluster.dir.join("pki");
    let port = free_port();
    let ctl = ControllerProcess::start(
        &format!("ctl-bench-{}", e.sfx),
        &[
            "--leader-elect=false",
            "--apiserver-address",
            &format!("127.0.0.1:{port}"),
            "--tls-cert-file",
            pki.join("aggr.crt").to_str().expect("utf-8"),
            "--tls-private-key-file",
            pki.join("aggr.key").to_str().expect("utf-8"),
        ],
    )
    .await
    .expect("controller");
    register_views(&mut e, port).await;

    let class = e.class("bench", json!({})).await;
    let client = e.client.clone();
    let ns_names: Vec<String> = (0..namespaces)
        .map(|i| format!("bench-{}-{i:03}", e.sfx))
        .collect();
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in &ns_names {
        ns_api
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns"),
            )
            .await
            .expect("create ns");
    }
    let t = Instant::now();
    let addresses: Api<address_controller_api::IPAddress> = Api::all(client.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let addresses = addresses.clone();
            let (class, sfx) = (class.clone(), e.sfx.clone());
            async move {
                let body = json!({"metadata": {"name": format!("bench-{sfx}-{i:05}")},
                    "spec": {"address": format!("198.18.{}.{}", 100 + i / 250, i % 250 + 1), "className": class, "source": {"fromClass": {}}}});
                addresses.create(&PostParams::default(), &serde_json::from_value(body).expect("addr")).await.expect("create addr");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let (class, ns) = (class.clone(), ns_names[i % namespaces].clone());
            async move {
                let claims: Api<address_controller_api::IPAddressClaim> =
                    Api::namespaced(client, &ns);
                let body =
                    json!({"metadata": {"name": format!("c{i:05}")}, "spec": {"className": class}});
                claims
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(body).expect("claim"),
                    )
                    .await
                    .expect("create claim");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    let created = t.elapsed();
    let all: Api<address_controller_api::IPAddressClaim> = Api::all(client.clone());
    wait_for(
        "all bench claims Bound",
        Duration::from_secs(600),
        || async {
            let bound = all
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|c| c.spec.class_name.as_deref() == Some(class.as_str()))
                .filter(|c| {
                    c.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()) == Some("Bound")
                })
                .count();
            Ok((bound == n).then_some(()))
        },
    )
    .await
    .expect("bound");
    let bound = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let views = time_kubectl(&["get", "namespaceaddresses", "-A"], 7);
    let crds = time_kubectl(&["get", "ipaddressclaims", "-A"], 7);
    let pools = time_kubectl(&["get", "poolavailabilities"], 7);
    println!(
        "bench: {n} claims + {n} addresses in {namespaces} namespaces; created in {created:.1?}, all Bound after {bound:.1?}"
    );
    println!(
        "bench: kubectl get namespaceaddresses -A  median {:.0?}  max {:.0?}",
        views.0, views.1
    );
    println!(
        "bench: kubectl get ipaddressclaims -A     median {:.0?}  max {:.0?}",
        crds.0, crds.1
    );
    println!(
        "bench: kubectl get poolavailabilities     median {:.0?}  max {:.0?}",
        pools.0, pools.1
    );
    drop(ctl);
    // Throwaway namespaces go; the addresses of this run are released under Retain.
    for ns in &ns_names {
        let _ = ns_api.delete(ns, &Default::default()).await;
    }
}
