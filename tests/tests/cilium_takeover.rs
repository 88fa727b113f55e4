//! Moving a platform from MetalLB to Cilium LB-IPAM without renumbering:
//! `cilium-driver takeover --from metallb`, with the real MetalLB controller (v0.16.1) and the
//! real cilium-operator (v1.19.5) on the real control plane. Its own test binary: MetalLB's
//! controller would answer the other Cilium tests' Services too.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use address_controller_api::ClaimPhase;
use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_tests::cilium::operator;
use address_controller_tests::env::{Env, WAIT, env, phase, purge};
use address_controller_tests::lb::{ingress, ports_spec, service, services, wait_ingress};
use address_controller_tests::metallb::{MetalLb, NAMESPACE};
use address_controller_tests::{Cluster, ControllerProcess, TestNamespace, wait_for};
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;

const METALLB_PROVISIONER: &str = "metallb.drivers.local.sdn.cozystack.io";
const CILIUM_FINALIZER: &str = "cilium.drivers.local.sdn.cozystack.io/hold";
const METALLB_FINALIZER: &str = "metallb.drivers.local.sdn.cozystack.io/hold";

async fn run(args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(address_controller_tests::binary("cilium-driver"));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(&Cluster::get().kubeconfig)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("cilium-driver takeover ends within 180 s")
        .unwrap();
    println!(
        "cilium-driver {args:?} → {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every second, every Service's ingress; a sample that is not the Service's address counts
/// toward its window (the time it showed another address or none).
struct Poller {
    bad: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    samples: Arc<Mutex<usize>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Poller {
    fn start(
        api: kube::Api<k8s_openapi::api::core::v1::Service>,
        want: BTreeMap<String, String>,
    ) -> Poller {
        let bad = Arc::new(Mutex::new(BTreeMap::<String, Vec<String>>::new()));
        let samples = Arc::new(Mutex::new(0usize));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (b, n) = (bad.clone(), samples.clone());
        let task = tokio::spawn(async move {
            let start = Instant::now();
            loop {
                if let Ok(list) = api.list(&Default::default()).await {
                    let t = start.elapsed().as_secs_f64();
                    let shown: BTreeMap<String, Vec<String>> = list
                        .items
                        .iter()
                        .map(|s| (s.name_any(), ingress(s)))
                        .collect();
                    for (name, ip) in &want {
                        let got = shown.get(name).cloned().unwrap_or_default();
                        if got != [ip.clone()] {
                            b.lock()
                                .unwrap()
                                .entry(name.clone())
                                .or_default()
                                .push(format!("{t:.1}s: {got:?}"));
                        }
                    }
                    *n.lock().unwrap() += 1;
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
        Poller {
            bad,
            samples,
            stop,
            task,
        }
    }

    async fn finish(self) -> (usize, BTreeMap<String, Vec<String>>) {
        let _ = self.stop.send(());
        let _ = self.task.await;
        let n = *self.samples.lock().unwrap();
        let bad = self.bad.lock().unwrap().clone();
        (n, bad)
    }
}

fn report(phase: &str, services: usize, samples: usize, bad: &BTreeMap<String, Vec<String>>) {
    let mut windows: Vec<usize> = bad.values().map(Vec::len).collect();
    windows.resize(services, 0);
    windows.sort_unstable();
    println!(
        "takeover: {phase}: {services} Services polled every second, {samples} polls; window per Service (polls showing another address or none): max {} s, median {} s; Services affected: {}",
        windows.last().copied().unwrap_or(0),
        windows[windows.len() / 2],
        bad.len()
    );
    for (name, s) in bad {
        println!("  {name}: {s:?}");
    }
}

/// Every poll of `poll` showed each Service its own address (and it polled).
async fn kept(poll: Poller, phase: &str, services: usize) {
    let (samples, bad) = poll.finish().await;
    report(phase, services, samples, &bad);
    assert!(samples >= 5, "positive control: the poller ran ({samples})");
    assert!(
        bad.is_empty(),
        "{phase}: a Service showed another address or none: {bad:?}"
    );
}

/// What the MetalLB driver pinned before the move.
struct Pinned {
    /// Each tenant Service's address.
    want: BTreeMap<String, String>,
    /// The released address, its hold and its IP.
    released: String,
    released_hold: String,
    released_ip: String,
}

/// A class of the MetalLB driver: 18 claims on a Service each, a shared claim on two (by
/// port), a claim released (its address kept by its hold); every Service showing its address.
async fn pinned_by_metallb(e: &mut Env, holds: &str) -> Pinned {
    let class = e
        .class(
            "cilmove",
            json!({"spec": {"provisioner": METALLB_PROVISIONER,
                "parameters": {"addresses": ["198.18.79.0/27"]}}}),
        )
        .await;
    let ns = e.ns.name.clone();
    // 18 claims on a Service each, a shared claim on two, a claim released.
    for i in 0..18 {
        e.claim(&format!("c{i}"), json!({"className": class})).await;
    }
    e.claim(
        "shop",
        json!({"className": class, "sharing": {"policy": "SameNamespace"}}),
    )
    .await;
    e.claim("gone", json!({"className": class})).await;
    let mut want: BTreeMap<String, String> = BTreeMap::new();
    let mut claims = Vec::new();
    for i in 0..18 {
        claims.push((format!("c{i}"), format!("s{i}"), json!({})));
    }
    claims.push(("shop".into(), "shop-web".into(), ports_spec(&["TCP/80"])));
    claims.push(("shop".into(), "shop-dns".into(), ports_spec(&["UDP/53"])));
    for (claim, svc, spec) in &claims {
        let c = e
            .wait_claim(claim, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
            .await;
        let ip = c.status.as_ref().unwrap().addresses[0].address.clone();
        service(
            e,
            &ns,
            svc,
            json!({SERVICE_CLAIM_ANNOTATION: claim}),
            spec.clone(),
        )
        .await;
        want.insert(svc.clone(), ip);
    }
    for (svc, ip) in &want {
        wait_ingress(e, &ns, svc, &[ip]).await;
    }
    let gone = e
        .wait_claim("gone", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let released = gone.status.as_ref().unwrap().addresses[0].name.clone();
    e.claims()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&released, "Released", |a| {
        a.and_then(|a| a.status.as_ref()?.phase)
            .is_some_and(|p| p == address_controller_api::AddressPhase::Released)
    })
    .await;
    let released_hold = format!("hold-{released}");
    let released_ip = wait_for("the released address's hold", WAIT, || async {
        Ok(services(e, holds)
            .get_opt(&released_hold)
            .await?
            .and_then(|h| ingress(&h).first().cloned()))
    })
    .await
    .unwrap();

    Pinned {
        want,
        released,
        released_hold,
        released_ip,
    }
}

/// After the takeover: LB-IPAM has every Service and the released address's hold, MetalLB's
/// pins stay (inert until `--finish`), the address's finalizer is the Cilium driver's.
async fn in_lbipam(e: &Env, p: &Pinned, holds: &str) {
    // LB-IPAM has every Service, the released address's hold too; MetalLB's pins stay, inert,
    // until MetalLB's controller is gone (`--finish`).
    for name in p.want.keys() {
        let s = services(e, &e.ns.name).get(name).await.unwrap();
        assert!(
            s.annotations().contains_key("lbipam.cilium.io/ips")
                && s.annotations().contains_key("metallb.io/loadBalancerIPs"),
            "{name}: {:?}",
            s.annotations()
        );
    }
    let hold = services(e, holds).get(&p.released_hold).await.unwrap();
    assert_eq!(ingress(&hold), vec![p.released_ip.clone()]);
    assert_eq!(
        hold.annotations().get("lbipam.cilium.io/ips"),
        Some(&p.released_ip)
    );
    let a = e.addresses().get(&p.released).await.unwrap();
    assert!(
        a.finalizers().iter().any(|f| f == CILIUM_FINALIZER)
            && !a.finalizers().iter().any(|f| f == METALLB_FINALIZER),
        "{:?}",
        a.finalizers()
    );
}

/// After `--undo`: MetalLB's pins again, LB-IPAM's gone, the MetalLB driver's finalizer,
/// every Service showing its address.
async fn in_metallb(e: &Env, p: &Pinned) {
    for name in p.want.keys() {
        let s = services(e, &e.ns.name).get(name).await.unwrap();
        assert!(
            s.annotations().contains_key("metallb.io/loadBalancerIPs")
                && !s.annotations().contains_key("lbipam.cilium.io/ips"),
            "{name}: {:?}",
            s.annotations()
        );
    }
    let a = e.addresses().get(&p.released).await.unwrap();
    assert!(a.finalizers().iter().any(|f| f == METALLB_FINALIZER));
    for (name, ip) in &p.want {
        wait_ingress(e, &e.ns.name, name, &[ip]).await;
    }
}

/// 20 Services pinned by the MetalLB driver — one claim shared by two of them, and a
/// released address among the holds — move into LB-IPAM and back, each keeping its address
/// at every 1 s poll; then MetalLB's controller goes and its pools with it.
#[tokio::test]
async fn twenty_services_move_from_metallb_to_lbipam_and_back_without_renumbering() {
    let mut e = env("cil-move").await;
    purge(&e, &["198.18.79."]).await;
    // Cilium runs all along, as on the platform (LB-IPAM dormant while no pool exists).
    let _op = operator().await.unwrap();
    // No pool of an earlier test left: LB-IPAM stays dormant until the takeover's (with
    // one, it would take MetalLB's addresses off every Service it does not select).
    address_controller_tests::cilium::purge_pools(&[""]).unwrap();
    let metallb = MetalLb::start(None).await.unwrap();
    let holds = TestNamespace::create(&e.client, "cil-move-holds")
        .await
        .unwrap();
    let metallb_driver = ControllerProcess::metallb_driver_holding(
        &format!("drv-mlb-move-{}", e.sfx),
        &holds.name,
        &[],
    )
    .await
    .unwrap();
    let pinned = pinned_by_metallb(&mut e, &holds.name).await;
    let want = pinned.want.clone();
    let ns = e.ns.name.clone();

    // The MetalLB driver stops; the takeover, polled every second.
    drop(metallb_driver);
    let poll = Poller::start(services(&e, &ns), want.clone());
    let move_args = [
        "takeover",
        "--from",
        "metallb",
        "--hold-namespace",
        &holds.name,
        "--metallb-namespace",
        NAMESPACE,
    ];
    let dry = run(&move_args).await;
    assert_eq!(dry.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&dry.stdout).contains("dry run"));
    let mut yes = move_args.to_vec();
    yes.push("--yes");
    let t0 = Instant::now();
    let done = run(&yes).await;
    let took = t0.elapsed();
    assert_eq!(done.status.code(), Some(0));
    let cilium_driver = ControllerProcess::cilium_driver_holding(
        &format!("drv-cil-move-{}", e.sfx),
        &holds.name,
        &["--provisioner", METALLB_PROVISIONER],
    )
    .await
    .unwrap();
    in_lbipam(&e, &pinned, &holds.name).await;
    // A second run finds nothing to do.
    let again = run(&yes).await;
    assert_eq!(again.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&again.stdout).contains("ask LB-IPAM"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    e.check().await;
    kept(poll, "the takeover", want.len()).await;
    let poll = Poller::start(services(&e, &ns), want.clone());

    // --undo: MetalLB's side again (its controller and pools are still there).
    drop(cilium_driver);
    let mut undo = yes.clone();
    undo.push("--undo");
    let back = run(&undo).await;
    assert_eq!(back.status.code(), Some(0));
    let metallb_driver = ControllerProcess::metallb_driver_holding(
        &format!("drv-mlb-back-{}", e.sfx),
        &holds.name,
        &[],
    )
    .await
    .unwrap();
    in_metallb(&e, &pinned).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    e.check().await;
    let (undo_samples, undo_bad) = poll.finish().await;
    // Measured, not asserted: LB-IPAM takes a Service's address off when its pool goes or
    // the Service leaves it, and MetalLB puts it back.
    report("the undo", want.len(), undo_samples, &undo_bad);
    let poll = Poller::start(services(&e, &ns), want.clone());

    // And over again, to the end of the runbook: MetalLB's controller stops, its pools go.
    drop(metallb_driver);
    assert_eq!(run(&yes).await.status.code(), Some(0));
    let cilium_driver = ControllerProcess::cilium_driver_holding(
        &format!("drv-cil-end-{}", e.sfx),
        &holds.name,
        &["--provisioner", METALLB_PROVISIONER],
    )
    .await
    .unwrap();
    drop(metallb);
    let mut finish = yes.clone();
    finish.push("--finish");
    assert_eq!(run(&finish).await.status.code(), Some(0));
    for name in want.keys() {
        let s = services(&e, &ns).get(name).await.unwrap();
        assert!(
            !s.annotations().contains_key("metallb.io/loadBalancerIPs"),
            "{name}: {:?}",
            s.annotations()
        );
    }
    let left = Cluster::get()
        .kubectl_ok(&[
            "get",
            "ipaddresspools.metallb.io",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/managed-by=address-controller-metallb-driver",
            "-o",
            "name",
        ])
        .unwrap();
    assert!(left.trim().is_empty(), "MetalLB's pools are gone: {left}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    kept(
        poll,
        "the takeover again, MetalLB stopped and --finish",
        want.len(),
    )
    .await;
    println!(
        "takeover: `takeover --yes` took {:.1} s",
        took.as_secs_f64()
    );
    // Still served by LB-IPAM alone, the ledger exact.
    for (name, ip) in &want {
        wait_ingress(&e, &ns, name, &[ip]).await;
    }
    e.check().await;
    for name in want.keys() {
        services(&e, &ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    drop(cilium_driver);
}
