//! The MetalLB driver against the real MetalLB controller (v0.16.1, built from Go modules)
//! on the real control plane: MetalLB writes the ingress, holds every address of the
//! driver's classes in its own books, refuses thieves, hands over without a gap.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeMap;
use std::time::Duration;

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{AddressPhase, ClaimPhase};
use address_controller_tests::env::{Env, WAIT, aphase, env, phase, purge};
use address_controller_tests::lb::{ports_spec, wait_attached};
use address_controller_tests::metallb::{
    MetalLb, NAMESPACE, core_events, ingress, pools, service, services, wait_ingress,
};
use address_controller_tests::{ControllerProcess, TestNamespace, sum_samples, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

const PROVISIONER: &str = "metallb.drivers.local.sdn.cozystack.io";

struct Setup {
    e: Env,
    _metallb: MetalLb,
    driver: ControllerProcess,
    holds: TestNamespace,
    class: String,
}

/// The core (the test env's), MetalLB, the MetalLB driver, and a class of it over `addresses`.
async fn setup(prefix: &str, addresses: Value, class_extra: Value) -> Setup {
    let mut e = env(prefix).await;
    let metallb = MetalLb::start(None).await.unwrap();
    let holds = TestNamespace::create(&e.client, &format!("{prefix}-holds"))
        .await
        .unwrap();
    let metrics = format!("127.0.0.1:{}", address_controller_tests::free_port());
    let driver = ControllerProcess::metallb_driver_holding(
        &format!("drv-{prefix}-{}", e.sfx),
        &holds.name,
        &["--metrics-address", &metrics],
    )
    .await
    .unwrap();
    let mut spec =
        json!({"spec": {"provisioner": PROVISIONER, "parameters": {"addresses": addresses}}});
    address_controller_tests::env::merge(&mut spec, class_extra);
    let class = e.class(prefix, spec).await;
    Setup {
        e,
        _metallb: metallb,
        driver,
        holds,
        class,
    }
}

fn listed(c: &address_controller_api::IPAddressClaim) -> Vec<(String, String)> {
    c.status
        .iter()
        .flat_map(|s| &s.addresses)
        .map(|a| (a.name.clone(), a.address.clone()))
        .collect()
}

#[tokio::test]
async fn metallb_puts_the_claims_address_on_its_service_and_refuses_a_thief() {
    let mut s = setup("mlb", json!(["198.18.40.0/28"]), json!({})).await;
    purge(&s.e, &["198.18.40."]).await;
    let e = &mut s.e;
    let class = s.class.clone();
    let ns = e.ns.name.clone();
    // The class's pool, rendered for MetalLB: autoAssign off, owned by the class.
    let pool = wait_for("the class's MetalLB pool", WAIT, || async {
        Ok(pools(e).get_opt(&format!("ipaddressclass-{class}")).await?)
    })
    .await
    .unwrap();
    assert_eq!(pool.data["spec"]["autoAssign"], false);
    assert_eq!(pool.data["spec"]["addresses"], json!(["198.18.40.0/28"]));
    assert_eq!(
        pool.metadata.owner_references.as_ref().unwrap()[0].name,
        class
    );

    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed(&c).remove(0);
    // Held in MetalLB's books: the hold shows X, written by MetalLB.
    let hold = wait_ingress(e, &s.holds.name, &format!("hold-{name}"), &[&x]).await;
    assert_eq!(
        hold.annotations().get("metallb.io/ip-allocated-from-pool"),
        Some(&format!("ipaddressclass-{class}"))
    );

    // The claim's Service gets X — from MetalLB.
    service(
        e,
        &ns,
        "web",
        json!({SERVICE_CLAIM_ANNOTATION: "web"}),
        json!({}),
    )
    .await;
    let svc = wait_ingress(e, &ns, "web", &[&x]).await;
    assert_eq!(
        svc.annotations().get("metallb.io/ip-allocated-from-pool"),
        Some(&format!("ipaddressclass-{class}"))
    );
    let writers: Vec<String> = svc
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.to_string().contains("f:loadBalancer"))
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(writers, ["metallb-controller"], "MetalLB wrote the ingress");
    e.wait_address(&name, "associated", |a| {
        a.and_then(|a| a.status.as_ref()?.associated_to.as_ref())
            .is_some_and(|t| t.name == "web")
    })
    .await;

    // A plain LoadBalancer Service stays pending (the pool does not auto-assign).
    service(e, &ns, "plain", json!({}), json!({})).await;
    // A thief pinned to X through MetalLB's own annotation: MetalLB refuses it.
    service(
        e,
        &ns,
        "thief",
        json!({"metallb.io/loadBalancerIPs": x}),
        json!({}),
    )
    .await;
    let refused = wait_for("MetalLB refuses the thief", WAIT, || async {
        Ok(core_events(e, &ns, "thief")
            .await
            .into_iter()
            .find(|(r, _)| r == "AllocationFailed"))
    })
    .await
    .unwrap();
    assert!(refused.1.contains("address also in use"), "{refused:?}");
    wait_for("MetalLB refuses the plain Service", WAIT, || async {
        Ok(core_events(e, &ns, "plain")
            .await
            .into_iter()
            .find(|(r, _)| r == "AllocationFailed"))
    })
    .await
    .unwrap();
    for n in ["plain", "thief"] {
        assert!(
            ingress(&services(e, &ns).get(n).await.unwrap()).is_empty(),
            "{n}"
        );
    }
    // Delete the Service, recreate it: the same X.
    services(e, &ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&name, "not associated", |a| {
        a.and_then(|a| a.status.as_ref()?.associated_to.as_ref())
            .is_none()
    })
    .await;
    service(
        e,
        &ns,
        "web",
        json!({SERVICE_CLAIM_ANNOTATION: "web"}),
        json!({}),
    )
    .await;
    wait_ingress(e, &ns, "web", &[&x]).await;
    for n in ["web", "plain", "thief"] {
        services(e, &ns)
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
    e.check().await;
    let _ = &s.driver;
}

/// Every change of the Services of `namespaces`, in etcd revision order, until fenced.
/// One change: (revision, `namespace/name`, the addresses it shows, deleted).
type Change = (u64, String, Vec<String>, bool);

struct Watcher {
    task: tokio::task::JoinHandle<Vec<Change>>,
    /// One Services API per namespace watched: where the fence goes.
    apis: Vec<Api<Service>>,
    /// The name of the headless Service that ends the history in each namespace.
    fence: String,
}

impl Watcher {
    async fn start(e: &Env, namespaces: &[&str]) -> Watcher {
        let mut streams = Vec::new();
        let mut apis = Vec::new();
        for ns in namespaces {
            let api = services(e, ns);
            streams.push(
                api.watch(&WatchParams::default(), "0")
                    .await
                    .unwrap()
                    .boxed(),
            );
            apis.push(api);
        }
        let mut all = futures::stream::select_all(streams);
        let fence = format!("fence-{}", address_controller_tests::random_suffix());
        let (marker, mut unfenced) = (fence.clone(), namespaces.len());
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            while unfenced > 0 {
                tokio::select! {
                    Some(Ok(ev)) = all.next() => {
                        let (s, deleted) = match ev {
                            WatchEvent::Added(s) if s.name_any() == marker => {
                                unfenced -= 1;
                                continue;
                            }
                            WatchEvent::Added(s) | WatchEvent::Modified(s) => (s, false),
                            WatchEvent::Deleted(s) => (s, true),
                            _ => continue,
                        };
                        let rv = s.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
                        let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
                        out.push((rv, key, ingress(&s), deleted));
                    }
                    else => break,
                }
            }
            out
        });
        Watcher { task, apis, fence }
    }

    /// Replays the history in revision order: (who held `ip` at each revision where the
    /// holders changed).
    /// The history ends at a fence the test writes itself: a headless Service in every
    /// namespace watched. A watch delivers in revision order, so once every marker arrived,
    /// every change committed before them did too.
    async fn holders(self, ip: &str) -> Vec<(u64, Vec<String>)> {
        let marker: Service = serde_json::from_value(json!({
            "metadata": {"name": self.fence},
            "spec": {"clusterIP": "None"}
        }))
        .unwrap();
        for api in &self.apis {
            api.create(&PostParams::default(), &marker).await.unwrap();
        }
        let mut events = tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the watches deliver the fences within 60 s")
            .unwrap();
        for api in &self.apis {
            let _ = api.delete(&self.fence, &DeleteParams::default()).await;
        }
        events.sort_by_key(|e| e.0);
        let mut showing: BTreeMap<String, bool> = BTreeMap::new();
        let mut out: Vec<(u64, Vec<String>)> = Vec::new();
        for (rv, key, ips, deleted) in events {
            showing.insert(key, !deleted && ips.iter().any(|x| x == ip));
            let now: Vec<String> = showing
                .iter()
                .filter(|(_, v)| **v)
                .map(|(k, _)| k.clone())
                .collect();
            if out.last().is_none_or(|(_, last)| *last != now) {
                out.push((rv, now));
            }
        }
        out
    }
}

/// The handoff the Go driver leaves open (it deletes the hold before pinning the Service):
/// here the address is held at every revision — by the hold, the Service, or both — and a
/// thief pinned to it, racing every handoff, never gets it.
#[tokio::test]
async fn handoffs_leave_no_gap_and_a_thief_racing_them_never_wins() {
    let mut s = setup("mlb-gap", json!(["198.18.41.0/29"]), json!({})).await;
    let e = &mut s.e;
    let class = s.class.clone();
    let ns = e.ns.name.clone();
    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed(&c).remove(0);
    let hold = format!("{}/hold-{name}", s.holds.name);
    wait_ingress(e, &s.holds.name, &format!("hold-{name}"), &[&x]).await;
    let watcher = Watcher::start(e, &[&ns, &s.holds.name]).await;
    const ROUNDS: usize = 6;
    let mut attempts = 0usize;
    for round in 0..ROUNDS {
        let (a, b, thief) = (
            format!("a{round}"),
            format!("b{round}"),
            format!("thief{round}"),
        );
        service(
            e,
            &ns,
            &a,
            json!({SERVICE_CLAIM_ANNOTATION: "web"}),
            json!({}),
        )
        .await;
        wait_ingress(e, &ns, &a, &[&x]).await;
        // The thief pins X through MetalLB's annotation, then the claim moves from a to b
        // (a's annotation goes, b names the claim): each step makes MetalLB reconsider it.
        service(
            e,
            &ns,
            &thief,
            json!({"metallb.io/loadBalancerIPs": x}),
            json!({}),
        )
        .await;
        services(e, &ns)
            .patch(
                &a,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}}),
                ),
            )
            .await
            .unwrap();
        service(
            e,
            &ns,
            &b,
            json!({SERVICE_CLAIM_ANNOTATION: "web"}),
            json!({}),
        )
        .await;
        wait_ingress(e, &ns, &b, &[&x]).await;
        wait_ingress(e, &ns, &a, &[]).await;
        // And away again: b deleted (the address back to the hold alone).
        services(e, &ns)
            .delete(&b, &DeleteParams::default())
            .await
            .unwrap();
        e.wait_address(&name, "not associated", |x| {
            x.and_then(|x| x.status.as_ref()?.associated_to.as_ref())
                .is_none()
        })
        .await;
        attempts += core_events(e, &ns, &thief)
            .await
            .iter()
            .filter(|(r, _)| r == "AllocationFailed")
            .count()
            .max(1);
        for n in [&a, &thief] {
            services(e, &ns)
                .delete(n, &DeleteParams::default())
                .await
                .unwrap();
        }
    }
    let history = watcher.holders(&x).await;
    let unheld: Vec<_> = history
        .iter()
        .skip(1)
        .filter(|(_, h)| h.is_empty())
        .collect();
    let won: Vec<_> = history
        .iter()
        .filter(|(_, h)| h.iter().any(|k| k.contains("/thief")))
        .collect();
    println!(
        "handoff race: {ROUNDS} rounds, the thief refused {attempts} times (AllocationFailed), won {}; {} changes of holders, unheld at {} revisions",
        won.len(),
        history.len(),
        unheld.len()
    );
    assert!(
        history.len() >= ROUNDS * 2,
        "positive control: the holders changed: {history:?}"
    );
    assert!(
        history
            .iter()
            .all(|(_, h)| h.contains(&hold) || !h.is_empty())
    );
    assert!(unheld.is_empty(), "X was unheld: {unheld:?}");
    assert!(won.is_empty(), "the thief won: {won:?}");
    assert!(attempts >= ROUNDS);
    e.check().await;
}

/// Retain keeps the address held while Released (MetalLB still refuses others); Delete
/// frees it in MetalLB's books (the pool's status); Dual claims get one pinned address of
/// each family on a dual-stack Service.
#[tokio::test]
async fn retain_keeps_the_hold_delete_frees_it_and_dual_pins_both_families() {
    let mut s = setup(
        "mlb-life",
        json!(["198.18.42.0/29", "2001:db8:42::/125"]),
        json!({"spec": {"reclaimPolicy": "Retain"}}),
    )
    .await;
    let e = &mut s.e;
    let class = s.class.clone();
    let ns = e.ns.name.clone();
    e.claim("keep", json!({"className": class})).await;
    let c = e
        .wait_claim("keep", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed(&c).remove(0);
    e.claims()
        .delete("keep", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&name, "Released", |a| {
        aphase(a) == Some(AddressPhase::Released)
    })
    .await;
    // Still held: a thief is refused.
    service(
        e,
        &ns,
        "thief",
        json!({"metallb.io/loadBalancerIPs": x}),
        json!({}),
    )
    .await;
    wait_for(
        "the thief refused while the address is Released",
        WAIT,
        || async {
            Ok(core_events(e, &ns, "thief")
                .await
                .into_iter()
                .find(|(r, m)| r == "AllocationFailed" && m.contains("address also in use")))
        },
    )
    .await
    .unwrap();
    assert!(ingress(&services(e, &ns).get("thief").await.unwrap()).is_empty());
    services(e, &ns)
        .delete("thief", &DeleteParams::default())
        .await
        .unwrap();

    // Delete: the address goes, and with it MetalLB's hold (the pool counts one less).
    let pool = format!("ipaddressclass-{class}");
    let assigned = || async {
        let p = pools(e).get(&pool).await.ok()?;
        p.data["status"]["assignedIPv4"].as_i64()
    };
    wait_for("the pool counts the held address", WAIT, || async {
        Ok((assigned().await == Some(1)).then_some(()))
    })
    .await
    .unwrap();
    e.addresses()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&name, "gone", |a| a.is_none()).await;
    wait_for("the hold gone, the pool free", WAIT, || async {
        let hold = services(e, &s.holds.name)
            .get_opt(&format!("hold-{name}"))
            .await?;
        Ok((hold.is_none() && assigned().await == Some(0)).then_some(()))
    })
    .await
    .unwrap();

    // Dual on a dual-stack Service: both families, pinned one each, through MetalLB.
    e.claim("both", json!({"className": class, "family": "Dual"}))
        .await;
    let c = e
        .wait_claim("both", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let ips: Vec<String> = listed(&c).into_iter().map(|(_, a)| a).collect();
    service(
        e,
        &ns,
        "both",
        json!({SERVICE_CLAIM_ANNOTATION: "both"}),
        json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}),
    )
    .await;
    let refs: Vec<&str> = ips.iter().map(String::as_str).collect();
    let svc = wait_ingress(e, &ns, "both", &refs).await;
    let pinned = svc
        .annotations()
        .get("metallb.io/loadBalancerIPs")
        .cloned()
        .unwrap_or_default();
    assert!(pinned.starts_with("198.18.42."), "IPv4 first: {pinned}");
    services(e, &ns)
        .delete("both", &DeleteParams::default())
        .await
        .unwrap();
    e.claims()
        .delete("both", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("both").await;
    e.check().await;
}

/// The class's addresses shrunk below X: MetalLB withdraws it, the driver reports Lost, the
/// claim is Lost and nothing replaces it; grown back, all is back. The class deleted: its
/// pool and advertisement go with it.
#[tokio::test]
async fn pool_edits_lose_and_restore_and_the_pool_outlives_its_class_while_an_address_is_left() {
    let mut s = setup("mlb-pool", json!(["198.18.43.0/30"]), json!({})).await;
    purge(&s.e, &["198.18.43."]).await;
    let e = &mut s.e;
    let class = s.class.clone();
    let ns = e.ns.name.clone();
    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed(&c).remove(0);
    service(
        e,
        &ns,
        "web",
        json!({SERVICE_CLAIM_ANNOTATION: "web"}),
        json!({}),
    )
    .await;
    wait_ingress(e, &ns, "web", &[&x]).await;
    let set = |addresses: Value| {
        let classes = e.classes();
        let class = class.clone();
        async move {
            classes
                .patch(
                    &class,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"parameters": {"addresses": addresses}}})),
                )
                .await
                .unwrap();
        }
    };
    set(json!(["198.18.44.0/30"])).await;
    e.wait_address(&name, "Lost", |a| aphase(a) == Some(AddressPhase::Lost))
        .await;
    e.wait_claim("web", "Lost", |c| phase(c) == Some(ClaimPhase::Lost))
        .await;
    wait_ingress(e, &ns, "web", &[]).await;
    e.barrier().await;
    assert_eq!(
        listed(&e.claims().get("web").await.unwrap()),
        [(name.clone(), x.clone())],
        "no replacement"
    );
    set(json!(["198.18.43.0/30"])).await;
    e.wait_address(&name, "Bound again", |a| {
        aphase(a) == Some(AddressPhase::Bound)
    })
    .await;
    e.wait_claim("web", "Bound again", |c| {
        phase(c) == Some(ClaimPhase::Bound)
    })
    .await;
    wait_ingress(e, &ns, "web", &[&x]).await;
    services(e, &ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("web").await;
    e.check().await;
    // The class goes while its address is retained (Released, MetalLB's hold showing it):
    // the garbage collector deletes the pool, and the driver's finalizer keeps it — MetalLB's
    // speaker refuses every new configuration while a Service shows an address of a pool
    // that is gone.
    let hold = format!("hold-{name}");
    wait_ingress(e, &s.holds.name, &hold, &[&x]).await;
    e.classes()
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
    let pool = format!("ipaddressclass-{class}");
    let deleting = wait_for(
        "the pool being deleted with its class, kept",
        Duration::from_secs(60),
        || async {
            let p = pools(e).get_opt(&pool).await?;
            anyhow::ensure!(p.is_some(), "the pool is gone while address {name} is left");
            Ok(p.filter(|p| p.metadata.deletion_timestamp.is_some()))
        },
    )
    .await
    .unwrap();
    assert!(
        deleting
            .finalizers()
            .iter()
            .any(|f| f == "metallb.drivers.local.sdn.cozystack.io/pool"),
        "{:?}",
        deleting.finalizers()
    );
    e.barrier().await;
    wait_ingress(e, &s.holds.name, &hold, &[&x]).await;
    assert!(pools(e).get_opt(&pool).await.unwrap().is_some());
    // The last address of the class goes (its hold first): so does the pool.
    e.addresses()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the pool gone after the class's last address",
        Duration::from_secs(60),
        || async { Ok(pools(e).get_opt(&pool).await?.is_none().then_some(())) },
    )
    .await
    .unwrap();
    assert!(
        services(e, &s.holds.name)
            .get_opt(&hold)
            .await
            .unwrap()
            .is_none()
    );
}

/// The driver conformance suite, every case, for a MetalLB class — with the real MetalLB
/// writing the ingress.
#[tokio::test]
async fn the_metallb_driver_passes_the_driver_conformance_suite() {
    use address_controller_tests::conformance::{Options, Restart, run};
    use std::sync::Arc;
    use tokio::sync::Mutex;
    let mut e = env("mlb-conf").await;
    purge(
        &e,
        &[
            "198.18.45.",
            "198.18.46.",
            "198.18.47.",
            "2001:db8:45::",
            "2001:db8:47::",
        ],
    )
    .await;
    let _metallb = MetalLb::start(None).await.unwrap();
    let holds = TestNamespace::create(&e.client, "mlb-conf-holds")
        .await
        .unwrap();
    let class = e
        .class(
            "mlbconf",
            json!({"spec": {"provisioner": PROVISIONER,
                "parameters": {"addresses": ["198.18.45.0/29", "2001:db8:45::/125"]}}}),
        )
        .await;
    let driver = Arc::new(Mutex::new(
        ControllerProcess::metallb_driver(
            &format!("drv-mlbconf-{}", e.sfx),
            &[
                "--lease-name",
                &format!("drv-mlbconf-{}", e.sfx),
                "--metallb-namespace",
                NAMESPACE,
                "--hold-namespace",
                &holds.name,
                "--testing-create-delay",
                "1500ms",
            ],
        )
        .await
        .unwrap(),
    ));
    let restart: Restart = {
        let driver = driver.clone();
        Box::new(move || {
            let driver = driver.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(700)).await;
                driver.lock().await.restart().await?;
                Ok(())
            })
        })
    };
    let report = run(
        &e.client,
        &Options {
            class: class.clone(),
            invalid_parameters: Some(json!({"addresses": "not a list"})),
            restart: Some(restart),
            race_address: Some("198.18.46.1".into()),
            timeout: Duration::from_secs(60),
            lose_parameters: Some(json!({"addresses": ["198.18.47.0/29", "2001:db8:47::/125"]})),
            associate: true,
            service_class: None,
        },
    )
    .await
    .unwrap();
    println!("{}", report.table());
    assert!(report.ok(), "{}", report.table());
    assert!(
        report.cases.iter().all(|c| c.skipped.is_none()),
        "{}",
        report.table()
    );
    drop(driver);
    e.check().await;
}

/// Two elected replicas of the MetalLB driver, the leader killed in the middle of
/// provisioning and of a handoff: one address per claim, the handoff completes, no gap.
#[tokio::test]
async fn two_metallb_driver_replicas_survive_a_leader_kill_mid_provision_and_mid_handoff() {
    let mut e = env("mlb-ha").await;
    purge(&e, &["198.18.48."]).await;
    let _metallb = MetalLb::start(None).await.unwrap();
    let holds = TestNamespace::create(&e.client, "mlb-ha-holds")
        .await
        .unwrap();
    let class = e
        .class(
            "mlbha",
            json!({"spec": {"provisioner": PROVISIONER, "parameters": {"addresses": ["198.18.48.0/28"]}}}),
        )
        .await;
    let lease = e.name("mlb-lease");
    let mut args = address_controller_tests::env::fast_lease(&lease);
    args.extend(
        [
            "--metallb-namespace",
            NAMESPACE,
            "--hold-namespace",
            &holds.name,
            "--testing-create-delay",
            "1s",
        ]
        .map(str::to_string),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut replicas = [
        ControllerProcess::metallb_driver(&format!("drv-mlb-a-{}", e.sfx), &args)
            .await
            .unwrap(),
        ControllerProcess::metallb_driver(&format!("drv-mlb-b-{}", e.sfx), &args)
            .await
            .unwrap(),
    ];
    let leader = || async {
        let h = address_controller_tests::env::lease_holder(&e.client, &lease)
            .await
            .unwrap();
        h.unwrap_or_default()
    };
    wait_for("a driver leader", WAIT, || async {
        Ok((!leader().await.is_empty()).then_some(()))
    })
    .await
    .unwrap();
    // Mid-provision: the claims are waiting for the driver (inside its create pause).
    for i in 0..3 {
        e.claim(&format!("c{i}"), json!({"className": class})).await;
    }
    e.wait_claim("c0", "waiting for provisioning", |c| {
        address_controller_tests::env::condition(c, "Bound")
            .is_some_and(|x| x.reason == "WaitingForProvisioning")
    })
    .await;
    let holder = leader().await;
    replicas
        .iter_mut()
        .find(|r| r.user == holder)
        .unwrap()
        .kill();
    for i in 0..3 {
        e.wait_claim(&format!("c{i}"), "Bound", |c| {
            phase(c) == Some(ClaimPhase::Bound)
        })
        .await;
    }
    // Mid-handoff: a Service holds c0's address, the claim moves to another Service, and the
    // leader dies right after the first Service lets go.
    for r in replicas.iter_mut() {
        if !r.running() {
            r.restart().await.unwrap();
        }
    }
    let ns = e.ns.name.clone();
    let c0 = e.claims().get("c0").await.unwrap();
    let (name, x) = listed(&c0).remove(0);
    let watcher = Watcher::start(&e, &[&ns, &holds.name]).await;
    service(
        &e,
        &ns,
        "old",
        json!({SERVICE_CLAIM_ANNOTATION: "c0"}),
        json!({}),
    )
    .await;
    wait_ingress(&e, &ns, "old", &[&x]).await;
    service(
        &e,
        &ns,
        "new",
        json!({SERVICE_CLAIM_ANNOTATION: "c0"}),
        json!({}),
    )
    .await;
    services(&e, &ns)
        .patch(
            "old",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    wait_ingress(&e, &ns, "old", &[]).await;
    let holder = leader().await;
    replicas
        .iter_mut()
        .find(|r| r.user == holder)
        .unwrap()
        .kill();
    wait_ingress(&e, &ns, "new", &[&x]).await;
    e.wait_address(&name, "associated to new", |a| {
        a.and_then(|a| a.status.as_ref()?.associated_to.as_ref())
            .is_some_and(|t| t.name == "new")
    })
    .await;
    let history = watcher.holders(&x).await;
    assert!(
        history.iter().skip(1).all(|(_, h)| !h.is_empty()),
        "unheld: {history:?}"
    );
    // One address per claim, each held.
    let all = e.addresses().list(&Default::default()).await.unwrap().items;
    let mine: Vec<_> = all.iter().filter(|a| a.spec.class_name == class).collect();
    assert_eq!(
        mine.len(),
        3,
        "{:?}",
        mine.iter().map(|a| a.name_any()).collect::<Vec<_>>()
    );
    for n in ["new", "old"] {
        services(&e, &ns)
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
    for r in replicas.iter_mut() {
        if !r.running() {
            r.restart().await.unwrap();
        }
    }
    e.check().await;
}

/// Taking over from another driver of the same provisioner (the Go driver): its addresses
/// and the claims bound to them are there when this driver starts in its place; nothing is
/// re-allocated — each address is held in MetalLB's books and the claim's Service gets it.
#[tokio::test]
async fn a_takeover_from_another_driver_reallocates_nothing() {
    let mut e = env("mlb-take").await;
    purge(&e, &["198.18.49."]).await;
    let _metallb = MetalLb::start(None).await.unwrap();
    let holds = TestNamespace::create(&e.client, "mlb-take-holds")
        .await
        .unwrap();
    let class = e
        .class(
            "mlbtake",
            json!({"spec": {"provisioner": PROVISIONER, "parameters": {"addresses": ["198.18.49.0/29"]}}}),
        )
        .await;
    // What the previous driver left: a claim waiting for provisioning, then its address
    // created pre-bound as any driver creates it (with a finalizer of its own).
    let claim = e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "waiting for provisioning", |c| {
        address_controller_tests::env::condition(c, "Bound")
            .is_some_and(|x| x.reason == "WaitingForProvisioning")
    })
    .await;
    let old = e
        .address(
            "old",
            "198.18.49.3",
            &class,
            json!({"metadata": {"finalizers": ["metallb.cozystack.io/previous-driver"]},
                "spec": {"claimRef": {"namespace": e.ns.name, "name": "web", "uid": claim.metadata.uid}}}),
        )
        .await;
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let before: Vec<String> = e
        .addresses()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|a| a.spec.class_name == class)
        .map(|a| a.name_any())
        .collect();
    // This driver starts in its place.
    let _driver = ControllerProcess::metallb_driver_holding(
        &format!("drv-mlbtake-{}", e.sfx),
        &holds.name,
        &[],
    )
    .await
    .unwrap();
    wait_ingress(&e, &holds.name, &format!("hold-{old}"), &["198.18.49.3"]).await;
    let ns = e.ns.name.clone();
    service(
        &e,
        &ns,
        "web",
        json!({SERVICE_CLAIM_ANNOTATION: "web"}),
        json!({}),
    )
    .await;
    wait_ingress(&e, &ns, "web", &["198.18.49.3"]).await;
    let after: Vec<String> = e
        .addresses()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|a| a.spec.class_name == class)
        .map(|a| a.name_any())
        .collect();
    assert_eq!(before, after, "nothing re-allocated");
    let a = e.addresses().get(&old).await.unwrap();
    assert!(
        a.finalizers()
            .iter()
            .any(|f| f == "metallb.drivers.local.sdn.cozystack.io/hold")
    );
    assert_eq!(
        listed(&e.claims().get("web").await.unwrap()),
        [(old.clone(), "198.18.49.3".to_string())]
    );
    services(&e, &ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    // The previous driver's finalizer is its own to remove; the test plays it.
    e.addresses()
        .patch(
            &old,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["local.sdn.cozystack.io/address-protection", "metallb.drivers.local.sdn.cozystack.io/hold"]}})),
        )
        .await
        .unwrap();
    e.check().await;
}

/// #45 finding 7, with the fence off (as here: the chart's admission policy is not
/// installed): a tenant's own MetalLB pin takes a free address of the class outside the
/// ledger. Before, the driver then provisioned that very address for another namespace's
/// claim (`Bound`, not `Conflict`), and a forged record of the kit's
/// (`metallb-driver.drivers.local.sdn.cozystack.io/pinned`) exempted the squatter from
/// Conflict. Now the address is never handed out while a Service shows it; once the ledger
/// has it, the squatter makes it `Conflict`; and a forged record only makes the kit
/// withdraw the forger's own pin.
#[tokio::test]
async fn a_tenants_own_pin_is_never_handed_to_another_and_a_forged_record_is_no_excuse() {
    let mut s = setup(
        "mlb-squat",
        json!(["198.18.92.1/32", "198.18.92.2/32"]),
        json!({"spec": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    purge(&s.e, &["198.18.92."]).await;
    let e = &mut s.e;
    let class = s.class.clone();
    let squatters = TestNamespace::create(&e.client, "mlb-squatters")
        .await
        .unwrap();
    let sq = squatters.name.clone();
    wait_for("the class's MetalLB pool", WAIT, || async {
        Ok(pools(e).get_opt(&format!("ipaddressclass-{class}")).await?)
    })
    .await
    .unwrap();
    // The squatter pins .1 itself; MetalLB gives it.
    service(
        e,
        &sq,
        "squat",
        json!({"metallb.io/loadBalancerIPs": "198.18.92.1"}),
        json!({}),
    )
    .await;
    wait_ingress(e, &sq, "squat", &["198.18.92.1"]).await;
    // Another tenant's claim gets .2, never the squatted .1; a second one finds the class
    // exhausted rather than .1.
    e.claim("first", json!({"className": class})).await;
    let c = e
        .wait_claim("first", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(listed(&c)[0].1, "198.18.92.2");
    e.claim("second", json!({"className": class})).await;
    e.wait_event(&e.ns.name, "second", "Exhausted").await;
    assert!(
        e.claims()
            .get("second")
            .await
            .unwrap()
            .status
            .is_none_or(|st| st.addresses.is_empty())
    );
    e.claims()
        .delete("second", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("second").await;
    // The admin enters .1 in the ledger and a claim pins it: the squatter is a thief.
    let admins = e
        .address("squatted", "198.18.92.1", &class, json!({}))
        .await;
    e.claim(
        "rightful",
        json!({"className": class, "addressName": admins}),
    )
    .await;
    e.wait_claim("rightful", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.wait_address(&admins, "Conflict", |a| {
        aphase(a) == Some(AddressPhase::Conflict)
    })
    .await;
    e.wait_event(&sq, "squat", "Conflict").await;
    // It forges the kit's record of a pin. Once the driver has passed over the address
    // since (its address passes counted, its queues empty), the address is still
    // Conflict while the squatter shows it: the record is no excuse. (Before, a Service
    // carrying the record was no offender: the address went Bound again.)
    let passes = |m: &str| {
        sum_samples(m, "address_controller_reconcile_total{", |l| {
            l.contains("controller=\"address\"")
        })
    };
    let before = passes(&s.driver.metrics().await.unwrap());
    services(e, &sq)
        .patch(
            "squat",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "metallb-driver.drivers.local.sdn.cozystack.io/pinned": "198.18.92.1"}}})),
        )
        .await
        .unwrap();
    let driver = &s.driver;
    wait_for("the driver's pass over the address since", WAIT, || async {
        let m = driver.metrics().await?;
        let idle = sum_samples(&m, "address_controller_workqueue_depth{", |_| true) == 0.0;
        Ok((passes(&m) > before && idle).then_some(()))
    })
    .await
    .unwrap();
    let shown = ingress(&services(e, &sq).get("squat").await.unwrap());
    let now = aphase(e.addresses().get_opt(&admins).await.unwrap().as_ref());
    assert!(
        (shown.is_empty() && now == Some(AddressPhase::Bound))
            || now == Some(AddressPhase::Conflict),
        "the squatter shows {shown:?}, the address is {now:?}"
    );
    // The squatter lets go: the address is the claim's again.
    services(e, &sq)
        .delete("squat", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&admins, "Bound again", |a| {
        aphase(a) == Some(AddressPhase::Bound)
    })
    .await;
    for c in ["first", "rightful"] {
        e.claims()
            .delete(c, &DeleteParams::default())
            .await
            .unwrap();
        e.wait_claim_gone(c).await;
    }
    let _ = e
        .addresses()
        .delete(&admins, &DeleteParams::default())
        .await;
    drop(squatters);
    e.check().await;
}

/// A Service with `ports` (`"TCP/443"`) naming `claim`.
/// An admin's static address of a MetalLB class outside the class's pool: MetalLB refuses
/// to assign it ("is not allowed in config"), so the driver never pins it and says why on the
/// Service — the chaos run found holders in the ledger that MetalLB never showed.
#[tokio::test]
async fn a_static_address_outside_the_pool_is_refused_readably_not_pinned() {
    let mut s = setup("mlb-static", json!(["198.18.47.0/30"]), json!({})).await;
    purge(&s.e, &["198.18.47.", "198.18.48."]).await;
    let e = &mut s.e;
    let class = s.class.clone();
    let ns = e.ns.name.clone();
    let outside = e.address("outside", "198.18.48.9", &class, json!({})).await;
    e.claim("kept", json!({"className": class, "addressName": outside}))
        .await;
    e.wait_claim("kept", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    service(
        e,
        &ns,
        "web",
        json!({SERVICE_CLAIM_ANNOTATION: "kept"}),
        json!({}),
    )
    .await;
    let m = wait_attached(e, &ns, "web", "False", "AddressNotServed").await;
    assert!(
        m.contains("198.18.48.9") && m.contains("198.18.47.0/30"),
        "{m}"
    );
    let web = services(e, &ns).get("web").await.unwrap();
    assert!(
        !web.annotations().contains_key("metallb.io/loadBalancerIPs"),
        "never pinned: {:?}",
        web.annotations()
    );
    e.wait_address(&outside, "no holder", |a| {
        a.is_some_and(|a| a.holders().is_empty())
    })
    .await;
    // The positive control: an address of the pool, the same way, is attached.
    let inside = e.address("inside", "198.18.47.1", &class, json!({})).await;
    e.claim("fine", json!({"className": class, "addressName": inside}))
        .await;
    e.wait_claim("fine", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    service(
        e,
        &ns,
        "ok",
        json!({SERVICE_CLAIM_ANNOTATION: "fine"}),
        json!({}),
    )
    .await;
    wait_attached(e, &ns, "ok", "True", "Attached").await;
    wait_ingress(e, &ns, "ok", &["198.18.47.1"]).await;
    e.check().await;
}

/// Sharing through the real MetalLB (#42): the driver writes one sharing key derived from
/// the claim's uid on every holder; MetalLB puts the address on each; the ports are judged
/// by the kit before MetalLB sees them; the first holder deleted, the others keep it at every
/// revision; a thief copying the key by hand (no fence here) makes the address Conflict.
#[tokio::test]
async fn a_shared_claim_gives_metallbs_address_to_each_holder_and_a_copied_key_is_a_conflict() {
    let mut s = setup("mlb-share", json!(["198.18.103.0/28"]), json!({})).await;
    purge(&s.e, &["198.18.103."]).await;
    let e = &mut s.e;
    let class = s.class.clone();
    let ns = e.ns.name.clone();
    e.claim(
        "shop",
        json!({"className": class, "sharing": {"policy": "SameNamespace"}}),
    )
    .await;
    let c = e
        .wait_claim("shop", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let key = format!("ac-{}", c.metadata.uid.clone().unwrap());
    let (name, x) = listed(&c).remove(0);
    wait_ingress(e, &s.holds.name, &format!("hold-{name}"), &[&x]).await;
    let claim = json!({SERVICE_CLAIM_ANNOTATION: "shop"});
    service(e, &ns, "web", claim.clone(), ports_spec(&["TCP/80"])).await;
    wait_ingress(e, &ns, "web", &[&x]).await;
    service(e, &ns, "tls", claim.clone(), ports_spec(&["TCP/443"])).await;
    service(e, &ns, "dns", claim.clone(), ports_spec(&["UDP/53"])).await;
    for n in ["tls", "dns"] {
        let svc = wait_ingress(e, &ns, n, &[&x]).await;
        assert_eq!(
            svc.annotations().get("metallb.io/allow-shared-ip"),
            Some(&key),
            "the driver's key, from the claim's uid"
        );
        wait_attached(e, &ns, n, "True", "Attached").await;
    }
    e.wait_address(&name, "three holders", |a| {
        a.and_then(|a| a.status.as_ref()?.holder_count) == Some(3)
    })
    .await;
    // A colliding port is refused by the kit; MetalLB never gets a pin for it.
    service(e, &ns, "clash", claim.clone(), ports_spec(&["TCP/443"])).await;
    let m = wait_attached(e, &ns, "clash", "False", "PortConflict").await;
    assert!(m.contains("TCP/443"), "{m}");
    let clash = services(e, &ns).get("clash").await.unwrap();
    assert!(ingress(&clash).is_empty());
    assert!(
        !clash
            .annotations()
            .contains_key("metallb.io/loadBalancerIPs")
    );

    // The first holder deleted: tls and dns keep X at every revision.
    let watcher = Watcher::start(e, &[&ns]).await;
    services(e, &ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&name, "two holders", |a| {
        a.and_then(|a| a.status.as_ref()?.holder_count) == Some(2)
    })
    .await;
    let history = watcher.holders(&x).await;
    // From the first revision at which both held X (the watch replays from the start).
    let both =
        |h: &Vec<String>| h.contains(&format!("{ns}/tls")) && h.contains(&format!("{ns}/dns"));
    let dropped: Vec<_> = history
        .iter()
        .skip_while(|(_, h)| !both(h))
        .filter(|(_, h)| !both(h))
        .collect();
    assert!(
        history
            .last()
            .is_some_and(|(_, h)| both(h) && !h.contains(&format!("{ns}/web"))),
        "tls and dns hold X at the end, web does not: {history:?}"
    );
    assert!(
        history
            .iter()
            .any(|(_, h)| h.contains(&format!("{ns}/web"))),
        "positive control: web held X in the history: {history:?}"
    );
    assert!(dropped.is_empty(), "a holder lost X: {dropped:?}");

    // A thief copies the driver's key and pins X by hand on a free port: MetalLB shares with
    // it (the key matches), the ledger does not list it — the address is Conflict.
    let thieves = TestNamespace::create(&e.client, "mlb-share-thief")
        .await
        .unwrap();
    service(
        e,
        &thieves.name,
        "thief",
        json!({"metallb.io/loadBalancerIPs": x, "metallb.io/allow-shared-ip": key}),
        ports_spec(&["TCP/8080"]),
    )
    .await;
    wait_ingress(e, &thieves.name, "thief", &[&x]).await;
    e.wait_address(&name, "Conflict", |a| {
        aphase(a) == Some(AddressPhase::Conflict)
    })
    .await;
    services(e, &thieves.name)
        .delete("thief", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&name, "Bound again", |a| {
        aphase(a) == Some(AddressPhase::Bound)
    })
    .await;
    for n in ["tls", "dns", "clash"] {
        services(e, &ns)
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
    e.check().await;
    drop(thieves);
    let _ = &s.driver;
}
