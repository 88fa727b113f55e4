//! Moving in where the Go pair ran (issue #43), against the real MetalLB controller: the Go
//! MetalLB driver's objects recreated exactly as it leaves them — its `iad-<class>` pool and
//! advertisement, its placeholders of both kinds, Go-named IPAddress objects behind its
//! `…/teardown` finalizer and its ledger (`status.associatedTo`), tenants' Services it pinned
//! with its `"true"` marker (facts read in its source) — then
//! `metallb-driver takeover` and this driver in its place. Every address is shown by some
//! Service at every watch event, the pinned Service keeps its address throughout, no address
//! turns Conflict or Lost. A binary of this project refuses to start while a Lease of the Go
//! pair is held. Its own test binary: that Lease would stop every other test's processes.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::{BTreeMap, BTreeSet};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress};
use address_controller_tests::env::{Env, WAIT, aphase, env, phase, purge};
use address_controller_tests::metallb::{
    MetalLb, NAMESPACE, core_events, ingress, pools, services, wait_ingress,
};
use address_controller_tests::{Cluster, ControllerProcess, TestNamespace, binary, wait_for};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

const PROVISIONER: &str = "metallb.drivers.local.sdn.cozystack.io";
const GO_FINALIZER: &str = "metallb.drivers.local.sdn.cozystack.io/teardown";
const OUR_FINALIZER: &str = "metallb.drivers.local.sdn.cozystack.io/hold";
const GO_MARKER: &str = "metallb.drivers.local.sdn.cozystack.io/pinned";
const OUR_MARKER: &str = "metallb-driver.drivers.local.sdn.cozystack.io/pinned";
const NET: &str = "198.18.51.";

/// Runs a binary of this project to its end (60 s at most): its output.
async fn run(bin: &str, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(binary(bin));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(&Cluster::get().kubeconfig)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{bin} {args:?} did not end within 60 s"))
        .unwrap();
    println!(
        "{bin} {args:?} → {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn metallb_api(e: &Env, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("metallb.io", "v1beta1", kind);
    Api::namespaced_with(e.client.clone(), NAMESPACE, &ApiResource::from_gvk(&gvk))
}

async fn create_dynamic(api: &Api<DynamicObject>, v: Value) {
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

fn owner_of<K: Resource<DynamicType = ()>>(o: &K) -> Value {
    json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()), "name": o.meta().name,
        "uid": o.meta().uid, "controller": true, "blockOwnerDeletion": true})
}

/// A Go placeholder Service exactly as metallb-iad writes it.
fn placeholder(name: &str, a: &IPAddress, class: &str, claim: Option<(&str, &str)>) -> Value {
    let mut ann = json!({"metallb.io/address-pool": format!("iad-{class}"),
        "metallb.io/loadBalancerIPs": a.spec.address});
    if let Some((ns, n)) = claim {
        ann["metallb.drivers.local.sdn.cozystack.io/claim-namespace"] = json!(ns);
        ann["metallb.drivers.local.sdn.cozystack.io/claim-name"] = json!(n);
    }
    json!({"metadata": {"name": name,
            "labels": {"metallb.drivers.local.sdn.cozystack.io/placeholder": "true",
                "metallb.drivers.local.sdn.cozystack.io/ip-address": a.name_any()},
            "annotations": ann, "ownerReferences": [owner_of(a)]},
        "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "placeholder", "port": 65535, "protocol": "TCP"}]}})
}

/// What the watchers saw go wrong: an address shown by no Service, the pinned Service
/// without its address, an address Conflict or Lost.
#[derive(Default)]
struct Seen {
    findings: Vec<String>,
    events: usize,
}

/// Watches every Service (the addresses `held` must each be shown by one at every event;
/// `keeps` must show its address at every event) and every address of the test's range
/// (never Conflict nor Lost), until the returned sender is dropped.
fn watch(
    e: &Env,
    held: BTreeSet<String>,
    keeps: (String, String),
) -> (Arc<Mutex<Seen>>, tokio::sync::oneshot::Sender<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let svcs = watcher::watcher(
        Api::<Service>::all(e.client.clone()),
        watcher::Config::default(),
    );
    let addrs = watcher::watcher(
        Api::<IPAddress>::all(e.client.clone()),
        watcher::Config::default(),
    );
    let s = seen.clone();
    tokio::spawn(async move {
        let mut shown: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut synced = false;
        let (mut svcs, mut addrs) = (svcs.boxed(), addrs.boxed());
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                ev = svcs.next() => {
                    let key = |x: &Service| format!("{}/{}", x.namespace().unwrap_or_default(), x.name_any());
                    match ev {
                        Some(Ok(Event::Apply(x) | Event::InitApply(x))) => { shown.insert(key(&x), ingress(&x)); }
                        Some(Ok(Event::Delete(x))) => { shown.remove(&key(&x)); }
                        Some(Ok(Event::Init)) => shown.clear(),
                        Some(Ok(Event::InitDone)) => synced = true,
                        Some(Err(_)) | None => continue,
                    }
                    if !synced { continue; }
                    let mut s = s.lock().unwrap();
                    s.events += 1;
                    for ip in &held {
                        if !shown.values().any(|v| v.contains(ip)) {
                            s.findings.push(format!("{ip} shown by no Service"));
                        }
                    }
                    if !shown.get(&keeps.0).is_some_and(|v| v.contains(&keeps.1)) {
                        s.findings.push(format!("{} lost {}", keeps.0, keeps.1));
                    }
                }
                ev = addrs.next() => {
                    if let Some(Ok(Event::Apply(a) | Event::InitApply(a))) = ev
                        && a.spec.address.starts_with(NET)
                        && matches!(aphase(Some(&a)), Some(AddressPhase::Conflict | AddressPhase::Lost))
                    {
                        s.lock().unwrap().findings.push(format!("{} ({}) {:?}", a.name_any(), a.spec.address, aphase(Some(&a))));
                    }
                }
            }
        }
    });
    (seen, stop)
}

fn go_name(ip: &str) -> String {
    format!("ip-{}", ip.replace('.', "-"))
}

/// What the Go driver leaves — a pool and advertisement owned by the class, its addresses
/// behind its finalizer (one Released, re-armed), its placeholders, the tenants' Services
/// it pinned — is taken over in place: nothing starts while its Lease is held, the dry run
/// writes nothing, the takeover swaps every finalizer and holds every address, this driver
/// adopts the pool, and no claim is renumbered nor any address shown by no Service at any
/// event meanwhile.
#[tokio::test]
async fn the_go_pair_is_taken_over_in_place_without_renumbering() {
    let mut e = env("gotake").await;
    purge(&e, &[NET]).await;
    let _metallb = MetalLb::start(None).await.unwrap();
    let go = GoPair::leaves(&mut e).await;
    nothing_starts_while_the_go_lease_is_held(&e, &go).await;
    // From here on, every address must be shown by some Service at every event, web0 keep
    // .0, and no address turn Conflict or Lost.
    let held: BTreeSet<String> = ["0", "1", "2", "3"]
        .iter()
        .map(|l| format!("{NET}{l}"))
        .collect();
    let (seen, stop) = watch(&e, held, (format!("{}/web0", e.ns.name), format!("{NET}0")));
    the_dry_run_writes_nothing(&e, &go).await;
    the_takeover_holds_every_address_under_this_drivers_finalizer(&e, &go).await;
    // The tenant of web3 withdraws it while no driver runs: the Go pin, read as the
    // driver's, is withdrawn once this driver starts.
    services(&e, &e.ns.name)
        .patch(
            "web3",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    // This driver in the Go driver's place.
    let _driver = ControllerProcess::metallb_driver_holding(
        &format!("drv-gotake-{}", e.sfx),
        &go.holds.name,
        &[],
    )
    .await
    .unwrap();
    this_driver_adopts_the_pool_and_every_claim_keeps_its_address(&e, &go).await;
    let thieves = new_claims_bind_elsewhere_and_a_thief_gets_nothing(&e, &go).await;
    drop(stop);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    println!(
        "watch: {} Service events after the Go pair's objects were up",
        seen.events
    );
    assert!(seen.events > 0);
    assert!(seen.findings.is_empty(), "{:?}", seen.findings);
    a_migrated_delete_claims_address_goes_with_it(&e, &go, &thieves).await;
    e.check().await;
}

/// The uid of the claim an address is bound to.
fn bound_uid(a: &IPAddress) -> String {
    a.spec.claim_ref.as_ref().unwrap().uid.clone().unwrap()
}

/// What the Go pair leaves behind, in the test's namespaces.
struct GoPair {
    /// Where its placeholders live.
    go: TestNamespace,
    /// Where this driver's holds go.
    holds: TestNamespace,
    class: String,
    /// Its pool's and advertisement's name.
    iad: String,
    /// Its addresses by claim: zero (Delete), prov, rel (Released), gone.
    addrs: BTreeMap<&'static str, IPAddress>,
}

impl GoPair {
    /// 1. What the Go driver leaves. Its pool and advertisement, owned by the class, no
    ///    avoidBuggyIPs (it handed out .0); its addresses; its placeholders (a provisioning
    ///    one, a re-armed one); the tenants' Services it pinned, and its ledger of them.
    async fn leaves(e: &mut Env) -> GoPair {
        let go = TestNamespace::create(&e.client, "gotake-iad")
            .await
            .unwrap();
        let holds = TestNamespace::create(&e.client, "gotake-holds")
            .await
            .unwrap();
        let ns = e.ns.name.clone();
        let class = e
            .class(
                "gotake",
                json!({"spec": {"provisioner": PROVISIONER, "reclaimPolicy": "Retain",
                    "parameters": {"addresses": [format!("{NET}0/29")]}}}),
            )
            .await;
        let class_obj = e.classes().get(&class).await.unwrap();
        let iad = format!("iad-{class}");
        create_dynamic(&metallb_api(e, "IPAddressPool"), json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": iad, "namespace": NAMESPACE, "ownerReferences": [owner_of(&class_obj)]},
            "spec": {"addresses": [format!("{NET}0/29")], "autoAssign": false}})).await;
        create_dynamic(&metallb_api(e, "L2Advertisement"), json!({"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": iad, "namespace": NAMESPACE, "ownerReferences": [owner_of(&class_obj)]},
            "spec": {"ipAddressPools": [iad]}})).await;
        // Its addresses: Go-named, behind its finalizer, bound to claims.
        let mut addrs: BTreeMap<&str, IPAddress> = BTreeMap::new();
        for (claim, last, policy) in [
            ("zero", "0", "Delete"),
            ("prov", "1", "Retain"),
            ("rel", "2", "Retain"),
            ("gone", "3", "Retain"),
        ] {
            let c = e.claim(claim, json!({"className": class})).await;
            let ip = format!("{NET}{last}");
            let name = go_name(&ip);
            let a = e.addresses().create(&PostParams::default(), &serde_json::from_value(json!({
                "metadata": {"name": name, "finalizers": [GO_FINALIZER]},
                "spec": {"address": ip, "className": class, "reclaimPolicy": policy, "source": {"fromClass": {}},
                    "claimRef": {"namespace": ns, "name": claim, "uid": c.metadata.uid}}})).unwrap()).await.unwrap();
            e.cleanup.add("ipaddresses.local.sdn.cozystack.io", &name);
            e.wait_claim(claim, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
                .await;
            addrs.insert(claim, a);
        }
        // A Released one (its claim deleted under Retain), re-armed by a placeholder.
        e.claims()
            .delete("rel", &DeleteParams::default())
            .await
            .unwrap();
        let rel = addrs["rel"].name_any();
        wait_for("the Released address", WAIT, || async {
            let a = e.addresses().get(&rel).await?;
            Ok((aphase(Some(&a)) == Some(AddressPhase::Released)).then_some(()))
        })
        .await
        .unwrap();
        // Its placeholders: a provisioning one, a re-armed one.
        let go_svcs = services(e, &go.name);
        let prov_ph = format!("iad-{}-v4", bound_uid(&addrs["prov"]));
        let rel_ph = format!("iad-{rel}");
        for v in [
            placeholder(&prov_ph, &addrs["prov"], &class, Some((&ns, "prov"))),
            placeholder(&rel_ph, &addrs["rel"], &class, None),
        ] {
            go_svcs
                .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
                .await
                .unwrap();
        }
        // Tenants' Services it pinned (no sharing key; its marker "true").
        for (svc, claim, last) in [("web0", "zero", "0"), ("web3", "gone", "3")] {
            let v = json!({"metadata": {"name": svc, "annotations": {SERVICE_CLAIM_ANNOTATION: claim,
                    "metallb.io/loadBalancerIPs": format!("{NET}{last}"), GO_MARKER: "true"}},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
            services(e, &ns)
                .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
                .await
                .unwrap();
        }
        // Its ledger: the Service each address is associated to (`status.associatedTo`).
        for (svc, claim) in [("web0", "zero"), ("web3", "gone")] {
            e.addresses()
                .patch_status(
                    &addrs[claim].name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"associatedTo": {"kind": "Service", "namespace": ns, "name": svc}}})),
                )
                .await
                .unwrap();
        }
        for (n, s, ip) in [
            (&ns, "web0", "0"),
            (&ns, "web3", "3"),
            (&go.name, prov_ph.as_str(), "1"),
            (&go.name, rel_ph.as_str(), "2"),
        ] {
            wait_ingress(e, n, s, &[&format!("{NET}{ip}")]).await;
        }
        GoPair {
            go,
            holds,
            class,
            iad,
            addrs,
        }
    }

    /// The uid of the claim an address of the Go pair is bound to.
    fn claim_uid(&self, claim: &str) -> String {
        bound_uid(&self.addrs[claim])
    }

    /// `metallb-driver takeover` of this pair, with `--yes` when `yes`.
    fn takeover(&self, yes: bool) -> Vec<String> {
        let mut a = vec![
            "takeover".to_string(),
            "--metallb-namespace".into(),
            NAMESPACE.into(),
            "--hold-namespace".into(),
            self.holds.name.clone(),
            "--go-placeholder-namespace".into(),
            self.go.name.clone(),
        ];
        if yes {
            a.push("--yes".into());
        }
        a
    }
}

/// 2. While the Go pair's Lease is held, nothing of this project starts, and `check` names
///    the Lease.
async fn nothing_starts_while_the_go_lease_is_held(e: &Env, pair: &GoPair) {
    let (go, holds) = (&pair.go, &pair.holds);
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), &go.name);
    let now = k8s_openapi::jiff::Timestamp::now();
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
        "metadata": {"name": "a4cfeeab.sdn.cozystack.io"},
        "spec": {"holderIdentity": "address-controller-7d9f_1b2c", "leaseDurationSeconds": 15,
            "acquireTime": now.to_string(), "renewTime": now.to_string()}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let refused = run(
        "metallb-driver",
        &[
            "--leader-elect=false",
            "--probe-address",
            "127.0.0.1:0",
            "--hold-namespace",
            &holds.name,
        ],
    )
    .await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused).contains("the Go address-controller runs (Lease"),
        "{}",
        text(&refused)
    );
    let refused = run(
        "address-controller",
        &[
            "run",
            "--leader-elect=false",
            "--probe-address",
            "127.0.0.1:0",
        ],
    )
    .await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused).contains("the Go address-controller runs"),
        "{}",
        text(&refused)
    );
    let refused = run(
        "metallb-driver",
        &["takeover", "--go-placeholder-namespace", &go.name],
    )
    .await;
    assert_eq!(refused.status.code(), Some(1));
    let checked = run(
        "address-controller",
        &["check", "--skip", "crds,apiservice,classes,access"],
    )
    .await;
    assert_eq!(checked.status.code(), Some(1));
    let row = format!("lease/{}/a4cfeeab.sdn.cozystack.io (Go pair)", go.name);
    assert!(
        text(&checked)
            .lines()
            .any(|l| l.starts_with(&row) && l.contains(" FAIL ")),
        "{}",
        text(&checked)
    );
    leases
        .delete("a4cfeeab.sdn.cozystack.io", &DeleteParams::default())
        .await
        .unwrap();
}

/// 3. The dry run says what it would do and writes nothing.
async fn the_dry_run_writes_nothing(e: &Env, go: &GoPair) {
    let addrs = &go.addrs;
    let holds = &go.holds;
    let args = go.takeover(false);
    let dry = run(
        "metallb-driver",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    let out = text(&dry);
    for want in [
        "would swap finalizer",
        "would record the Go pin",
        "would give it sharing key",
        "would hold",
        "would delete once the hold shows",
        "dry run",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    assert!(
        services(e, &holds.name)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        e.addresses()
            .get(&addrs["zero"].name_any())
            .await
            .unwrap()
            .finalizers()
            .iter()
            .any(|f| f == GO_FINALIZER)
    );
}

/// 4. The takeover: every address under this driver's finalizer and held by a Service with
///    its claim's sharing key, the placeholders gone, the Go pin recorded as this driver's;
///    a second run finds nothing to do.
async fn the_takeover_holds_every_address_under_this_drivers_finalizer(e: &Env, go: &GoPair) {
    let ns = &e.ns.name;
    let holds = &go.holds;
    let go_svcs = services(e, &go.go.name);
    let args = go.takeover(true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = run("metallb-driver", &args).await;
    assert_eq!(done.status.code(), Some(0), "{}", text(&done));
    for a in go.addrs.values() {
        let now = e.addresses().get(&a.name_any()).await.unwrap();
        assert!(
            now.finalizers().iter().any(|f| f == OUR_FINALIZER)
                && !now.finalizers().iter().any(|f| f == GO_FINALIZER),
            "{}: {:?}",
            a.name_any(),
            now.finalizers()
        );
        let hold = wait_ingress(
            e,
            &holds.name,
            &format!("hold-{}", a.name_any()),
            &[&a.spec.address],
        )
        .await;
        let want_key = match now.spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref()) {
            Some(uid) => format!("ac-{uid}"),
            None => format!("ac-{}", a.name_any()),
        };
        assert_eq!(
            hold.annotations().get("metallb.io/allow-shared-ip"),
            Some(&want_key)
        );
    }
    assert!(
        go_svcs
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "the placeholders are gone"
    );
    let web0 = services(e, ns).get("web0").await.unwrap();
    assert_eq!(
        web0.annotations().get(OUR_MARKER).map(String::as_str),
        Some(format!("{NET}0").as_str())
    );
    assert_eq!(web0.annotations().get(GO_MARKER), None);
    assert_eq!(
        web0.annotations().get("metallb.io/allow-shared-ip"),
        Some(&format!("ac-{}", go.claim_uid("zero")))
    );
    // A second run finds nothing to do (every write of it would print a row).
    let again = run("metallb-driver", &args).await;
    assert_eq!(again.status.code(), Some(0));
    assert!(
        text(&again).contains("nothing of the Go driver's is left (4 addresses of 1 classes)"),
        "{}",
        text(&again)
    );
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).lines().count(),
        2,
        "{}",
        text(&again)
    );
}

/// 6. This driver adopts the Go pool in place and takes the Services over: web0 associated
///    through it, web3's withdrawn pin withdrawn; every claim kept its address.
async fn this_driver_adopts_the_pool_and_every_claim_keeps_its_address(e: &Env, go: &GoPair) {
    let (ns, iad, class) = (&e.ns.name, &go.iad, &go.class);
    // The pool is adopted in place — our labels and finalizer, avoidBuggyIPs as it was — and
    // no second pool is made.
    wait_for("the Go pool adopted", WAIT, || async {
        let p = pools(e).get(iad).await?;
        let ours = p
            .labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("address-controller-metallb-driver")
            && p.finalizers()
                .iter()
                .any(|f| f == "metallb.drivers.local.sdn.cozystack.io/pool");
        Ok(ours.then_some(()))
    })
    .await
    .unwrap();
    let p = pools(e).get(iad).await.unwrap();
    assert_ne!(p.data["spec"]["avoidBuggyIPs"], json!(true), "{:?}", p.data);
    assert!(
        pools(e)
            .get_opt(&format!("ipaddressclass-{class}"))
            .await
            .unwrap()
            .is_none()
    );
    // web0 is associated through this driver; web3's pin is withdrawn (its address stays held).
    wait_for("web0 AddressAttached=True", WAIT, || async {
        let s = services(e, ns).get("web0").await?;
        let ok = s
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "local.sdn.cozystack.io/AddressAttached" && c.status == "True");
        Ok(ok.then_some(()))
    })
    .await
    .unwrap();
    wait_for("web3's pin withdrawn", WAIT, || async {
        let s = services(e, ns).get("web3").await?;
        let gone = ingress(&s).is_empty()
            && s.annotations().get("metallb.io/loadBalancerIPs").is_none()
            && s.annotations().get(OUR_MARKER).is_none();
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();
    // Every claim kept its address.
    for (claim, last) in [("zero", "0"), ("prov", "1"), ("gone", "3")] {
        let c = e.claims().get(claim).await.unwrap();
        assert_eq!(phase(&c), Some(ClaimPhase::Bound), "{claim}");
        let listed: Vec<&str> = c
            .status
            .iter()
            .flat_map(|s| &s.addresses)
            .map(|a| a.address.as_str())
            .collect();
        assert_eq!(listed, [format!("{NET}{last}").as_str()], "{claim}");
    }
}

/// A new claim binds to a free address — never to one the Go names hold; a thief pinning a
/// migrated address gets nothing. The thief's namespace is returned.
async fn new_claims_bind_elsewhere_and_a_thief_gets_nothing(e: &Env, go: &GoPair) -> TestNamespace {
    let class = &go.class;
    e.claim("new", json!({"className": class})).await;
    let c = e
        .wait_claim("new", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let got = &c.status.as_ref().unwrap().addresses[0];
    assert!(
        !["0", "1", "2", "3"]
            .iter()
            .any(|l| got.address == format!("{NET}{l}")),
        "{got:?}"
    );
    // A thief pinning a migrated address gets nothing.
    let thieves = TestNamespace::create(&e.client, "gotake-thief")
        .await
        .unwrap();
    services(e, &thieves.name)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "thief",
            "annotations": {"metallb.io/loadBalancerIPs": format!("{NET}1")}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 81}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    wait_for("MetalLB refuses the thief", WAIT, || async {
        let ev = core_events(e, &thieves.name, "thief").await;
        Ok(ev
            .iter()
            .any(|(r, _)| r == "AllocationFailed")
            .then_some(()))
    })
    .await
    .unwrap();
    assert!(ingress(&services(e, &thieves.name).get("thief").await.unwrap()).is_empty());

    thieves
}

/// 7. A migrated Delete claim's address goes with it (the finalizer was swapped).
async fn a_migrated_delete_claims_address_goes_with_it(
    e: &Env,
    go: &GoPair,
    thieves: &TestNamespace,
) {
    let ns = &e.ns.name;
    services(e, ns)
        .delete("web0", &DeleteParams::default())
        .await
        .unwrap();
    e.claims()
        .delete("zero", &DeleteParams::default())
        .await
        .unwrap();
    let zero = go.addrs["zero"].name_any();
    wait_for("the Delete claim's address deleted", WAIT, || async {
        Ok(e.addresses().get_opt(&zero).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    services(e, ns)
        .delete("web3", &DeleteParams::default())
        .await
        .unwrap();
    services(e, &thieves.name)
        .delete("thief", &DeleteParams::default())
        .await
        .unwrap();
}
