//! Correct together, not just alone: a driver's create racing the core, two replicas under
//! claim churn through a kube-apiserver restart, a kube-apiserver that hangs, a server that
//! cannot bind. Every test ends with the invariant check over every replica.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::time::{Duration, Instant};

use address_controller_api::names::PROVISIONER_ANNOTATION;
use address_controller_api::{AddressPhase, ClaimPhase, IPAddressClaim};
use address_controller_tests::env::{
    Env, WAIT, aphase, condition, env, fast_lease, lease_holder, phase, purge, range_class,
    wait_lease_holder,
};
use address_controller_tests::invariants::{self, Scope};
use address_controller_tests::{
    Cluster, ControllerProcess, TestNamespace, audited_writes, binary, free_port, repo_root,
    wait_for,
};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// `claimRef` pre-set to `claim` (with its uid): what a driver creates.
fn prebound(e: &Env, claim: &IPAddressClaim) -> serde_json::Value {
    json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": claim.name_any(), "uid": claim.metadata.uid}}})
}

fn listed(c: &IPAddressClaim) -> Vec<String> {
    c.status
        .iter()
        .flat_map(|s| &s.addresses)
        .map(|a| a.name.clone())
        .collect()
}

#[tokio::test]
async fn a_late_driver_create_is_released_as_surplus_and_the_claim_keeps_its_address() {
    let mut e = env("surplus").await;
    let keep = e
        .class("keep", json!({"spec": {"releaseDelay": "1h"}}))
        .await;
    let drop = e
        .class("drop", json!({"spec": {"reclaimPolicy": "Delete"}}))
        .await;
    for (claim, class, ips) in [
        ("retained", &keep, ["192.0.2.50", "192.0.2.51"]),
        ("deleted", &drop, ["192.0.2.60", "192.0.2.61"]),
    ] {
        // Nothing free: the claim waits for its driver (and is stamped for it).
        e.claim(claim, json!({"className": class})).await;
        let waiting = e
            .wait_claim(claim, "waiting for provisioning", |c| {
                condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForProvisioning")
            })
            .await;
        assert!(waiting.annotations().contains_key(PROVISIONER_ANNOTATION));
        // While the driver provisions, a free address appears: the core binds it.
        let free = e
            .address(&format!("{claim}-free"), ips[0], class, json!({}))
            .await;
        let bound = e
            .wait_claim(claim, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
            .await;
        assert_eq!(listed(&bound), std::slice::from_ref(&free));
        // The driver's create lands after that: an address pre-bound to the same claim.
        let policy = if class == &drop { "Delete" } else { "Retain" };
        let mut late = prebound(&e, &bound);
        late["spec"]["reclaimPolicy"] = json!(policy);
        let late = e
            .address(&format!("{claim}-late"), ips[1], class, late)
            .await;
        let note = e.wait_event(&e.ns.name, claim, "SurplusAddress").await;
        assert!(note.contains(&late), "{note}");
        if policy == "Delete" {
            e.wait_address(&late, "deleted", |a| a.is_none()).await;
        } else {
            let a = e
                .wait_address(&late, "Released", |a| {
                    aphase(a) == Some(AddressPhase::Released)
                        && a.unwrap().status.as_ref().unwrap().released_at.is_some()
                })
                .await
                .unwrap();
            // It keeps naming the claim (the ledger says where it came from) and waits for
            // the release delay like any released address.
            assert_eq!(a.spec.claim_ref.unwrap().name, claim);
        }
        // The claim keeps the address it had, and stays Bound.
        let c = e.claims().get(claim).await.unwrap();
        assert_eq!(listed(&c), std::slice::from_ref(&free));
        assert_eq!(phase(&c), Some(ClaimPhase::Bound));
        assert_eq!(
            e.addresses()
                .get(&free)
                .await
                .unwrap()
                .status
                .unwrap()
                .phase,
            Some(AddressPhase::Bound)
        );
    }
    e.check().await;

    // Positive control of the checker: with no controller to release it, a second address
    // of the family is a violation; the controller, back, heals it.
    e.ctl.stop();
    let c = e.claims().get("retained").await.unwrap();
    let later = e
        .address("retained-later", "192.0.2.52", &keep, prebound(&e, &c))
        .await;
    let scope = Scope::of(&[e.ns.name.as_str()], &[keep.as_str(), drop.as_str()]);
    let report = invariants::check(&e.client, &scope, Duration::from_secs(2), &[])
        .await
        .unwrap();
    println!("{}", report.table());
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.rule == "claim-two-per-family" && v.object.ends_with("/retained")),
        "the checker must see the double allocation"
    );
    e.ctl = ControllerProcess::start(
        &format!("ctl-surplus2-{}", e.sfx),
        &["--leader-elect=false"],
    )
    .await
    .unwrap();
    e.wait_event(&e.ns.name, "retained", "SurplusAddress").await;
    e.wait_address(&later, "Released", |a| {
        aphase(a) == Some(AddressPhase::Released)
    })
    .await;
    e.check().await;
}

#[tokio::test]
async fn a_driver_never_provisions_for_a_claim_bound_to_a_free_address() {
    let mut e = env("stamp").await;
    purge(&e, &["198.18.40.", "198.18.41."]).await;
    let class_name = range_class(&mut e, "ranged", json!(["198.18.40.0/30"]), json!({})).await;
    // Static addresses outside the driver's range, in the driver's class, free.
    for i in 1..=3 {
        let a = e
            .address(
                &format!("static{i}"),
                &format!("198.18.41.{i}"),
                &class_name,
                json!({}),
            )
            .await;
        e.wait_address(&a, "Available", |x| {
            aphase(x) == Some(AddressPhase::Available)
        })
        .await;
    }
    let driver_user = format!("drv-stamp-{}", e.sfx);
    let _drv = ControllerProcess::driver(
        &driver_user,
        &["--lease-name", &format!("drv-stamp-{}", e.sfx)],
    )
    .await
    .unwrap();
    for i in 1..=3 {
        e.claim(&format!("s{i}"), json!({"className": class_name}))
            .await;
    }
    for i in 1..=3 {
        let c = e
            .wait_claim(&format!("s{i}"), "Bound", |c| {
                phase(c) == Some(ClaimPhase::Bound)
            })
            .await;
        assert!(listed(&c)[0].starts_with("static"), "{:?}", listed(&c));
        assert_eq!(
            c.annotations().get(PROVISIONER_ANNOTATION),
            None,
            "never stamped"
        );
    }
    // Positive control: with no free address left, the next claim is provisioned.
    e.claim("dynamic", json!({"className": class_name})).await;
    let c = e
        .wait_claim("dynamic", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(listed(&c), ["ipv4-198-18-40-1"]);
    let creates = audited_writes(&driver_user, |w| {
        w.verb == "create" && w.resource == "ipaddresses" && w.code < 300
    })
    .unwrap();
    assert_eq!(
        creates.len(),
        1,
        "the driver created exactly the one address: {creates:?}"
    );
    e.check().await;
}

/// Two replicas (fast lease) of the controller, `a` leading.
async fn two_replicas(
    e: &mut Env,
    lease: &str,
    extra: &[&str],
) -> (ControllerProcess, ControllerProcess) {
    e.ctl.kill();
    let mut args: Vec<String> = fast_lease(lease);
    args.push("--auto-claims=false".into());
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a_user = format!("{lease}-a");
    let a = ControllerProcess::start(&a_user, &args).await.unwrap();
    wait_lease_holder(&e.client, lease, &a_user).await;
    let b = ControllerProcess::start(&format!("{lease}-b"), &args)
        .await
        .unwrap();
    (a, b)
}

fn cluster_sh(args: &[&str]) {
    let out = std::process::Command::new(repo_root().join("deploy/local/cluster.sh"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn apiserver_pid() -> String {
    std::fs::read_to_string(Cluster::get().dir.join("pids/kube-apiserver")).unwrap()
}

/// Two replicas' caches stay live under churn across namespaces and families and a
/// kube-apiserver restart: both agree with the objects after, and the follower, taking
/// over from a crashed leader, processes deletions and binds new claims.
#[tokio::test]
async fn caches_stay_live_on_leader_and_follower_under_churn_and_an_apiserver_restart() {
    let mut e = env("churn").await;
    let lease = format!("churn-{}", e.sfx);
    // A short stall bound: the follower idles past it before it takes over, and must then
    // work off what piled up (a stalled queue must not stop the workers that unstall it).
    let (mut a, mut b) = two_replicas(&mut e, &lease, &["--queue-stall-bound", "10s"]).await;
    let class = e
        .class("pool", json!({"spec": {"releaseDelay": "2s"}}))
        .await;
    a_pool_of_two_hundred_addresses(&mut e, &class).await;
    let mut namespaces: Vec<TestNamespace> = Vec::new();
    for i in 0..8 {
        namespaces.push(
            TestNamespace::create(&e.client, &format!("churn{i}"))
                .await
                .unwrap(),
        );
    }

    churn_while_kube_apiserver_restarts(&e, &namespaces, &class).await;
    // A leader that could not renew while the API server was away stepped down and
    // exited; like a kubelet, the test starts it again.
    for r in [&mut a, &mut b] {
        if !r.running() {
            let code = r.exit_code();
            println!(
                "{} exited ({code:?}) during the restart; starting it again",
                r.user
            );
            assert!(
                r.log_contains("lost the lease"),
                "only a lost lease ends a replica; {} said: {}",
                r.user,
                r.stderr_tail()
            );
            r.restart().await.unwrap();
        }
    }
    // Every deletion is processed, and both replicas' caches (their gauges and views)
    // agree with the objects.
    let scope_ns: Vec<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
    wait_no_claim_terminating(&e, &scope_ns).await;
    let scope = Scope::of(&scope_ns, &[class.as_str()]);
    invariants::assert_invariants(
        &e.client,
        &scope,
        &[a.replica().unwrap(), b.replica().unwrap()],
    )
    .await;
    for replica in [&a, &b] {
        assert_ready(replica).await;
    }

    // The follower takes over from a crashed leader and acts on live caches: it processes
    // deletions and binds new claims.
    let leader = lease_holder(&e.client, &lease).await.unwrap().unwrap();
    let (dead, survivor) = if leader == a.user {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    dead.kill();
    wait_lease_holder(&e.client, &lease, &survivor.user).await;
    let survivor_user = survivor.user.clone();
    let ns = &namespaces[0].name;
    let api: Api<IPAddressClaim> = Api::namespaced(e.client.clone(), ns);
    let existing: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .take(10)
        .collect();
    for name in &existing {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for i in 0..5 {
        let body =
            json!({"metadata": {"name": format!("after-{i}")}, "spec": {"className": class}});
        api.create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    }
    wait_for("deleted claims gone, new claims settled", WAIT, || async {
        let items = api.list(&Default::default()).await?.items;
        let gone = !items.iter().any(|c| existing.contains(&c.name_any()));
        let settled = items
            .iter()
            .filter(|c| c.name_any().starts_with("after-"))
            .all(|c| {
                phase(c) == Some(ClaimPhase::Bound)
                    || condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForProvisioning")
            });
        Ok((gone && settled).then_some(()))
    })
    .await
    .unwrap();
    let survivor = if a.user == survivor_user { &a } else { &b };
    invariants::assert_invariants(&e.client, &scope, &[survivor.replica().unwrap()]).await;
    drop(namespaces);
    e.check_with(&[survivor]).await;
}

/// 150 IPv4 and 50 IPv6 addresses in `class`, created 16 at a time.
async fn a_pool_of_two_hundred_addresses(e: &mut Env, class: &str) {
    let addresses: Vec<(String, String)> = (0..150)
        .map(|i| {
            (
                format!("v4-{i}"),
                format!("10.77.{}.{}", i / 200, i % 200 + 1),
            )
        })
        .chain((0..50).map(|i| (format!("v6-{i}"), format!("2001:db8:77::{:x}", i + 1))))
        .collect();
    futures::stream::iter(addresses.iter())
        .for_each_concurrent(16, |(n, ip)| {
            let api = e.addresses();
            let body = json!({"metadata": {"name": e.name(n)}, "spec": {"address": ip, "className": class, "source": {"fromClass": {}}}});
            async move {
                api.create(&PostParams::default(), &serde_json::from_value(body).unwrap())
                    .await
                    .unwrap();
            }
        })
        .await;
    for (n, _) in &addresses {
        e.cleanup
            .add("ipaddresses.local.sdn.cozystack.io", &e.name(n));
    }
}

/// Churn: claims created and deleted as fast as six clients go, across `namespaces` and
/// families, for 40 s, while kube-apiserver restarts once (at 15 s).
async fn churn_while_kube_apiserver_restarts(e: &Env, namespaces: &[TestNamespace], class: &str) {
    let ops = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::atomic::AtomicUsize::new(0);
    let stop = Instant::now() + Duration::from_secs(40);
    let pid_before = apiserver_pid();
    let churn = futures::future::join_all((0..6).map(|w| {
        let (client, ops, errors) = (&e.client, &ops, &errors);
        async move {
            let mut mine: Vec<(String, String)> = Vec::new();
            let mut i = 0u32;
            while Instant::now() < stop {
                i += 1;
                let ns = &namespaces[(w * 7 + i as usize) % namespaces.len()].name;
                let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), ns);
                let r = if mine.len() > 5 && i.is_multiple_of(2) {
                    let (ns, name) = mine.remove((i as usize * 13) % mine.len());
                    let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), &ns);
                    api.delete(&name, &DeleteParams::default()).await.map(|_| ())
                } else {
                    let name = format!("c{w}-{i}");
                    let family = ["IPv4", "IPv4", "IPv6", "Dual"][i as usize % 4];
                    let body = json!({"metadata": {"name": name}, "spec": {"className": class, "family": family}});
                    let r = api
                        .create(&PostParams::default(), &serde_json::from_value(body).unwrap())
                        .await
                        .map(|_| ());
                    if r.is_ok() {
                        mine.push((ns.clone(), name));
                    }
                    r
                };
                match r {
                    Ok(()) => {
                        ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        // A client backs off while the API server is away.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }));
    let restart = async {
        tokio::time::sleep(Duration::from_secs(15)).await;
        tokio::task::spawn_blocking(|| {
            cluster_sh(&[
                "restart",
                Cluster::get().dir.to_str().unwrap(),
                "kube-apiserver",
            ])
        })
        .await
        .unwrap();
    };
    futures::join!(churn, restart);
    let ops = ops.into_inner();
    println!(
        "churn: {ops} successful creates and deletes, {} errors",
        errors.into_inner()
    );
    assert!(ops > 300, "the churn was real: {ops}");
    assert_ne!(apiserver_pid(), pid_before, "kube-apiserver restarted");
}

async fn wait_no_claim_terminating(e: &Env, namespaces: &[&str]) {
    wait_for(
        "every deleted claim finalized",
        Duration::from_secs(90),
        || async {
            let mut terminating = 0;
            for ns in namespaces {
                let api: Api<IPAddressClaim> = Api::namespaced(e.client.clone(), ns);
                terminating += api
                    .list(&Default::default())
                    .await?
                    .items
                    .iter()
                    .filter(|c| c.metadata.deletion_timestamp.is_some())
                    .count();
            }
            if terminating == 0 {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{terminating} claims still terminating"))
            }
        },
    )
    .await
    .unwrap();
}

async fn assert_ready(p: &ControllerProcess) {
    let (code, body) = p.readyz().await.unwrap();
    assert_eq!(code, 200, "{}: {body}", p.user);
}

#[tokio::test]
async fn a_hung_api_server_makes_replicas_not_ready_and_the_leader_step_down() {
    let mut e = env("hung").await;
    let lease = format!("hung-{}", e.sfx);
    // Short watches (kube-apiserver bookmarks each shortly before it ends) and a short
    // silence bound, so that a hang is noticed within seconds.
    let (mut a, b) = two_replicas(
        &mut e,
        &lease,
        &["--watch-timeout", "10s", "--watch-silence-bound", "20s"],
    )
    .await;
    assert_ready(&b).await;
    let dir = Cluster::get().dir.to_str().unwrap().to_string();
    let resume = ResumeOnDrop(dir.clone());
    cluster_sh(&["pause", &dir, "kube-apiserver"]);
    let paused = Instant::now();
    // The leader cannot renew: it steps down by its renew deadline even though its
    // request hangs, and exits non-zero (a clean restart), before its lease could expire.
    wait_for("the leader exits", Duration::from_secs(20), || {
        let code = a.exit_code();
        async move { Ok(code) }
    })
    .await
    .map(|code| assert_eq!(code, 1, "non-zero exit"))
    .unwrap();
    println!(
        "leader exited {:?} after the API server hung",
        paused.elapsed()
    );
    assert!(a.log_contains("lost the lease"), "{}", a.log.display());
    // The follower's watches fall silent: it reports not ready, saying why.
    let body = wait_for(
        "the follower not ready",
        Duration::from_secs(40),
        || async {
            let (code, body) = b.readyz().await?;
            Ok((code == 503).then_some(body))
        },
    )
    .await
    .unwrap();
    assert!(body.contains("silent"), "{body}");
    drop(resume);
    // Once the API server answers, the silent watches are listed again, the follower is
    // ready and takes the lease.
    wait_for(
        "the follower ready again",
        Duration::from_secs(60),
        || async { Ok((b.readyz().await?.0 == 200).then_some(())) },
    )
    .await
    .unwrap();
    wait_lease_holder(&e.client, &lease, &b.user).await;
    assert!(b.log_contains("watch silent too long; listing again"));
    let class = e.class("after", json!({})).await;
    e.address("a", "192.0.2.90", &class, json!({})).await;
    e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "Bound by the new leader", |c| {
        phase(c) == Some(ClaimPhase::Bound)
    })
    .await;
    e.check_with(&[&b]).await;
}

/// Resumes a paused kube-apiserver even when the test fails halfway.
struct ResumeOnDrop(String);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo_root().join("deploy/local/cluster.sh"))
            .args(["resume", &self.0, "kube-apiserver"])
            .output();
    }
}

#[tokio::test]
async fn a_server_that_cannot_bind_takes_the_process_down() {
    let _serial = address_controller_tests::env::SERIAL.lock().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let log = address_controller_tests::TempDir::new("ac-bind");
    for (flag, what) in [
        ("--apiserver-address", "aggregated API server"),
        ("--metrics-address", "metrics server"),
        ("--probe-address", "probe address"),
    ] {
        let mut args = vec![
            "run".to_string(),
            "--kubeconfig".into(),
            Cluster::get().kubeconfig.to_str().unwrap().into(),
            "--leader-elect=false".into(),
            "--controller=false".into(),
        ];
        for f in [
            "--apiserver-address",
            "--metrics-address",
            "--probe-address",
        ] {
            let addr = if f == flag {
                format!("127.0.0.1:{port}")
            } else {
                format!("127.0.0.1:{}", free_port())
            };
            args.extend([f.to_string(), addr]);
        }
        let out = log.join("stderr");
        let started = Instant::now();
        let status = std::process::Command::new(binary("address-controller"))
            .args(&args)
            .stderr(std::fs::File::create(&out).unwrap())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        let stderr = std::fs::read_to_string(&out).unwrap();
        assert_eq!(status.code(), Some(1), "{flag}: {stderr}");
        assert!(stderr.contains(what), "{flag}: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(15));
    }
    drop(taken);
}
