//! `address-controller adopt` against the real MetalLB controller and the MetalLB driver
//! (issue #43, the "backwards inventory"): LoadBalancer Services that show an address of a
//! class and name no claim — pinned through MetalLB's annotation, through
//! `spec.loadBalancerIP`, or given one by MetalLB itself — get a claim each, without
//! renumbering; the Service keeps its address at every watch event, through the adoption and
//! through `--undo`, which restores each Service exactly. An address outside the class, one
//! already in the ledger, and a namespace over its quota are reported and left alone.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::env::{Env, WAIT, aphase, env, phase, purge};
use address_controller_tests::metallb::{MetalLb, NAMESPACE, ingress, services, wait_ingress};
use address_controller_tests::{Cluster, ControllerProcess, TestNamespace, binary, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};

const PROVISIONER: &str = "metallb.drivers.local.sdn.cozystack.io";
const NET: &str = "198.18.52.";

async fn adopt(args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(binary("address-controller"));
    cmd.arg("adopt")
        .args(args)
        .arg("--kubeconfig")
        .arg(&Cluster::get().kubeconfig)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(240), cmd.output())
        .await
        .expect("adopt ends within 240 s")
        .unwrap();
    println!(
        "adopt {args:?} → {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The row of `object` in adopt's table.
fn row(o: &Output, object: &str) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.starts_with(&format!("{object} ")))
        .unwrap_or_else(|| {
            panic!(
                "no row for {object}:\n{}",
                String::from_utf8_lossy(&o.stdout)
            )
        })
        .to_string()
}

async fn create(e: &Env, ns: &str, name: &str, annotations: Value, spec: Value) {
    let mut v = json!({"metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    address_controller_tests::env::merge(&mut v, json!({"spec": spec}));
    services(e, ns)
        .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

/// What a Service is to adopt: its annotations and `spec.loadBalancerIP`.
fn state(s: &Service) -> (BTreeMap<String, String>, Option<String>) {
    (
        s.annotations().clone(),
        s.spec.as_ref().and_then(|sp| sp.load_balancer_ip.clone()),
    )
}

/// Service events seen, and what went wrong.
type Seen = Arc<Mutex<(usize, Vec<String>)>>;

/// Watches every Service — each of `keeps` (`namespace/name` → address) must show its
/// address at every event — and every address of the test's range — never Conflict nor
/// Lost; what went wrong is collected until the sender is dropped.
fn watch(e: &Env, keeps: BTreeMap<String, String>) -> (Seen, tokio::sync::oneshot::Sender<()>) {
    let seen = Arc::new(Mutex::new((0, Vec::new())));
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let mut stream = watcher::watcher(
        Api::<Service>::all(e.client.clone()),
        watcher::Config::default(),
    )
    .boxed();
    let mut addrs = watcher::watcher(
        Api::<IPAddress>::all(e.client.clone()),
        watcher::Config::default(),
    )
    .boxed();
    let s = seen.clone();
    tokio::spawn(async move {
        let mut shown: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut synced = false;
        loop {
            let ev = tokio::select! {
                _ = &mut stopped => return,
                ev = stream.next() => ev,
                a = addrs.next() => {
                    if let Some(Ok(Event::Apply(a) | Event::InitApply(a))) = a
                        && a.spec.address.starts_with(NET)
                        && matches!(aphase(Some(&a)), Some(AddressPhase::Conflict | AddressPhase::Lost))
                    {
                        s.lock().unwrap().1.push(format!("{} ({}) {:?}", a.name_any(), a.spec.address, aphase(Some(&a))));
                    }
                    continue;
                }
            };
            let key =
                |x: &Service| format!("{}/{}", x.namespace().unwrap_or_default(), x.name_any());
            match ev {
                Some(Ok(Event::Apply(x) | Event::InitApply(x))) => {
                    shown.insert(key(&x), ingress(&x));
                }
                Some(Ok(Event::Delete(x))) => {
                    shown.remove(&key(&x));
                }
                Some(Ok(Event::Init)) => shown.clear(),
                Some(Ok(Event::InitDone)) => synced = true,
                Some(Err(_)) | None => continue,
            }
            if !synced {
                continue;
            }
            let mut s = s.lock().unwrap();
            s.0 += 1;
            for (svc, ip) in &keeps {
                if !shown.get(svc).is_some_and(|v| v.contains(ip)) {
                    s.1.push(format!("{svc} without {ip}: {:?}", shown.get(svc)));
                }
            }
        }
    });
    (seen, stop)
}

/// Services that show addresses and name no claim — pinned, legacy `loadBalancerIP`,
/// auto-assigned by MetalLB — are adopted into claims of a class without renumbering; the
/// dry run writes nothing, what is left is said and why (outside the class, in the ledger
/// already, over quota); the address outlives its Service; the undo restores each Service
/// exactly and keeps its address. A watch meanwhile sees no Service lose its address.
#[tokio::test]
async fn services_are_adopted_without_renumbering_and_undone_exactly() {
    let mut e = env("adopt").await;
    purge(&e, &[NET]).await;
    let _metallb = MetalLb::start(None).await.unwrap();
    // A failed run's Services (their namespaces still terminating) would hold the addresses.
    wait_for(
        "no Service left showing the test's addresses",
        WAIT,
        || async {
            let all = Api::<Service>::all(e.client.clone())
                .list(&Default::default())
                .await?;
            let left = all.items.iter().any(|s| {
                s.annotations().values().any(|v| v.contains(NET))
                    || ingress(s).iter().any(|ip| ip.starts_with(NET))
            });
            Ok((!left).then_some(()))
        },
    )
    .await
    .unwrap();
    let holds = TestNamespace::create(&e.client, "adopt-holds")
        .await
        .unwrap();
    let _driver = ControllerProcess::metallb_driver_holding(
        &format!("drv-adopt-{}", e.sfx),
        &holds.name,
        &[],
    )
    .await
    .unwrap();
    let b = Before::made(&mut e).await;
    let ns = e.ns.name.clone();
    let keeps: BTreeMap<String, String> = [
        (format!("{ns}/pinned"), format!("{NET}5")),
        (format!("{ns}/auto"), b.auto_ip.clone()),
    ]
    .into();
    let (seen, stop) = watch(&e, keeps);
    the_dry_run_says_what_it_would_adopt_and_writes_nothing(&e, &b).await;
    adoption_binds_each_service_to_its_own_address(&mut e, &b, &holds).await;
    the_address_outlives_its_service(&e).await;
    the_undo_restores_each_service_exactly(&e, &b, &holds).await;
    drop(stop);
    let (events, findings) = std::mem::take(&mut *seen.lock().unwrap());
    println!("watch: {events} Service events from before the adoption to after the undo");
    assert!(events > 0);
    assert!(findings.is_empty(), "{findings:?}");
    let (over_ns, pools, other) = (&b.over_ns, &b.pools, &b.other);
    for (n, s) in [
        (&ns, "pinned"),
        (&ns, "legacy"),
        (&ns, "auto"),
        (&ns, "outside"),
        (&ns, "early"),
        (&over_ns.name, "over"),
    ] {
        services(&e, n)
            .delete(s, &DeleteParams::default())
            .await
            .unwrap();
    }
    pools.delete(other, &DeleteParams::default()).await.unwrap();
    e.check().await;
}

/// What a cluster has before: a class of the driver's, another MetalLB pool of no class, a
/// namespace whose quota allows none, and Services with addresses and no claims — one of
/// them showing an address already in the ledger.
struct Before {
    class: String,
    pools: Api<DynamicObject>,
    /// The other pool's name.
    other: String,
    over_ns: TestNamespace,
    /// The address MetalLB gave `auto`.
    auto_ip: String,
    /// The ledger's address `early` shows.
    early: String,
    /// Each adopted Service's annotations and loadBalancerIP as they were.
    before: BTreeMap<String, (BTreeMap<String, String>, Option<String>)>,
}

impl Before {
    async fn made(e: &mut Env) -> Before {
        let class = e
            .class(
                "adopt",
                json!({"spec": {"provisioner": PROVISIONER, "reclaimPolicy": "Retain",
                    "parameters": {"addresses": [format!("{NET}0/28")]}}}),
            )
            .await;
        let pool = format!("ipaddressclass-{class}");
        let pools: Api<DynamicObject> = Api::namespaced_with(
            e.client.clone(),
            NAMESPACE,
            &ApiResource::from_gvk(&GroupVersionKind::gvk(
                "metallb.io",
                "v1beta1",
                "IPAddressPool",
            )),
        );
        wait_for("the class's pool", WAIT, || async {
            Ok(pools.get_opt(&pool).await?)
        })
        .await
        .unwrap();
        // Another MetalLB pool, not of any class (one a failed run left would overlap it, and
        // MetalLB refuses a configuration with overlapping pools).
        let other = "adopt-other".to_string();
        let _ = pools.delete(&other, &DeleteParams::default()).await;
        wait_for("no pool adopt-other", WAIT, || async {
            Ok(pools.get_opt(&other).await?.is_none().then_some(()))
        })
        .await
        .unwrap();
        pools
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"apiVersion": "metallb.io/v1beta1",
                "kind": "IPAddressPool", "metadata": {"name": other, "namespace": NAMESPACE},
                "spec": {"addresses": ["198.18.53.0/30"], "autoAssign": false}}))
                .unwrap(),
            )
            .await
            .unwrap();
        let ns = e.ns.name.clone();
        let over_ns = TestNamespace::create(&e.client, "adopt-over")
            .await
            .unwrap();
        let quotas: Api<DynamicObject> = Api::namespaced_with(
            e.client.clone(),
            &over_ns.name,
            &ApiResource::from_gvk(&GroupVersionKind::gvk(
                "local.sdn.cozystack.io",
                "v1alpha1",
                "IPAddressQuota",
            )),
        );
        quotas
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1",
                "kind": "IPAddressQuota", "metadata": {"name": "none"},
                "spec": {"limits": [{"className": class, "addresses": 0}]}}))
                .unwrap(),
            )
            .await
            .unwrap();

        // What a cluster has before: Services with addresses and no claims.
        create(
            e,
            &ns,
            "pinned",
            json!({"metallb.io/loadBalancerIPs": format!("{NET}5")}),
            json!({}),
        )
        .await;
        create(
            e,
            &ns,
            "legacy",
            json!({}),
            json!({"loadBalancerIP": format!("{NET}6")}),
        )
        .await;
        create(
            e,
            &ns,
            "auto",
            json!({"metallb.io/address-pool": pool}),
            json!({}),
        )
        .await;
        create(
            e,
            &ns,
            "outside",
            json!({"metallb.io/loadBalancerIPs": "198.18.53.1"}),
            json!({}),
        )
        .await;
        create(
            e,
            &ns,
            "early",
            json!({"metallb.io/loadBalancerIPs": format!("{NET}9")}),
            json!({}),
        )
        .await;
        create(
            e,
            &over_ns.name,
            "over",
            json!({"metallb.io/loadBalancerIPs": format!("{NET}7")}),
            json!({}),
        )
        .await;
        for (n, s, ip) in [
            (&ns, "pinned", format!("{NET}5")),
            (&ns, "legacy", format!("{NET}6")),
            (&ns, "outside", "198.18.53.1".to_string()),
            (&ns, "early", format!("{NET}9")),
            (&over_ns.name, "over", format!("{NET}7")),
        ] {
            wait_ingress(e, n, s, &[&ip]).await;
        }
        let auto_ip = wait_for("MetalLB gives auto an address", WAIT, || async {
            let s = services(e, &ns).get("auto").await?;
            Ok(ingress(&s).first().cloned())
        })
        .await
        .unwrap();
        // An address already in the ledger, shown by a Service that names no claim.
        let early = e
            .address("early", &format!("{NET}9"), &class, json!({}))
            .await;
        let before: BTreeMap<String, (BTreeMap<String, String>, Option<String>)> = {
            let mut m = BTreeMap::new();
            for n in ["pinned", "legacy", "auto"] {
                m.insert(
                    n.to_string(),
                    state(&services(e, &ns).get(n).await.unwrap()),
                );
            }
            m
        };
        Before {
            class,
            pools,
            other,
            over_ns,
            auto_ip,
            early,
            before,
        }
    }
}

/// 1. The dry run: what would be adopted, what is left and why; nothing written. Scoped by
///    namespace and by label selector.
async fn the_dry_run_says_what_it_would_adopt_and_writes_nothing(e: &Env, b: &Before) {
    let (ns, class, over_ns, early) = (&e.ns.name, &b.class, &b.over_ns, &b.early);
    let class_arg = ["--class", class.as_str()];
    let dry = adopt(&class_arg).await;
    assert_eq!(dry.status.code(), Some(0));
    for n in ["pinned", "legacy", "auto"] {
        assert!(
            row(&dry, &format!("service/{ns}/{n}")).contains("would adopt"),
            "{n}"
        );
    }
    assert!(row(&dry, &format!("service/{ns}/outside")).contains("outside class"));
    assert!(
        row(&dry, &format!("service/{ns}/early"))
            .contains(&format!("in the ledger already (ipaddress/{early})"))
    );
    let over = row(&dry, &format!("service/{}/over", over_ns.name));
    assert!(
        over.contains("over quota") && over.contains("allows 0"),
        "{over}"
    );
    assert!(
        e.claims()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Scoped by namespace and by label selector.
    let scoped = adopt(&["--class", class, "-n", &over_ns.name]).await;
    let rows: Vec<String> = String::from_utf8_lossy(&scoped.stdout)
        .lines()
        .filter(|l| l.starts_with("service/"))
        .map(str::to_string)
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].starts_with(&format!("service/{}/over", over_ns.name)));
    let none = adopt(&["--class", class, "-l", "app=nothing-has-this"]).await;
    assert!(row(&none, "-").contains("nothing to do"));
}

/// 2. Adoption: each Service's claim Bound to the address it showed, not owned by the
///    Service, named by it, the address held; what was left is left.
async fn adoption_binds_each_service_to_its_own_address(
    e: &mut Env,
    b: &Before,
    holds: &TestNamespace,
) {
    let ns = &e.ns.name.clone();
    let (class, auto_ip) = (&b.class, &b.auto_ip);
    let yes = adopt(&["--class", class, "--yes"]).await;
    assert_eq!(yes.status.code(), Some(0));
    for (n, ip) in [
        ("pinned", format!("{NET}5")),
        ("legacy", format!("{NET}6")),
        ("auto", auto_ip.clone()),
    ] {
        assert!(
            row(&yes, &format!("service/{ns}/{n}")).contains("attached by the driver"),
            "{n}"
        );
        let c: IPAddressClaim = e.claims().get(n).await.unwrap();
        assert_eq!(phase(&c), Some(ClaimPhase::Bound));
        let listed: Vec<&str> = c
            .status
            .iter()
            .flat_map(|s| &s.addresses)
            .map(|a| a.address.as_str())
            .collect();
        assert_eq!(listed, [ip.as_str()], "{n}");
        assert!(
            c.owner_references().is_empty(),
            "an adopted claim is not owned by its Service"
        );
        let s = services(e, ns).get(n).await.unwrap();
        assert_eq!(
            s.annotations().get(SERVICE_CLAIM_ANNOTATION),
            Some(&n.to_string())
        );
        wait_ingress(
            e,
            &holds.name,
            &format!("hold-ipv4-{}", ip.replace('.', "-")),
            &[&ip],
        )
        .await;
    }
    assert_eq!(
        services(e, ns)
            .get("legacy")
            .await
            .unwrap()
            .spec
            .unwrap()
            .load_balancer_ip,
        None
    );
    assert!(e.claims().get_opt("outside").await.unwrap().is_none());
    assert!(e.claims().get_opt("early").await.unwrap().is_none());

    e.check().await;
}

/// 3. The address outlives its Service: delete and recreate it, naming the claim.
async fn the_address_outlives_its_service(e: &Env) {
    let ns = &e.ns.name;
    services(e, ns)
        .delete("legacy", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("legacy gone", WAIT, || async {
        Ok(services(e, ns)
            .get_opt("legacy")
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .unwrap();
    create(
        e,
        ns,
        "legacy",
        json!({SERVICE_CLAIM_ANNOTATION: "legacy"}),
        json!({}),
    )
    .await;
    wait_ingress(e, ns, "legacy", &[&format!("{NET}6")]).await;
}

/// 4. Undo: claims and addresses gone, each Service exactly as it was, its address kept; a
///    second undo finds nothing to do.
async fn the_undo_restores_each_service_exactly(e: &Env, b: &Before, holds: &TestNamespace) {
    let (ns, class, early, before) = (&e.ns.name, &b.class, &b.early, &b.before);
    let undo = adopt(&["--class", class, "--undo", "--yes"]).await;
    assert_eq!(undo.status.code(), Some(0));
    for n in ["pinned", "legacy", "auto"] {
        wait_for(&format!("claim {n} gone"), WAIT, || async {
            Ok(e.claims().get_opt(n).await?.is_none().then_some(()))
        })
        .await
        .unwrap();
        let s = services(e, ns).get(n).await.unwrap();
        assert_eq!(state(&s), before[n], "{n} restored exactly");
    }
    let adopted: Vec<String> = e
        .addresses()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|a| {
            a.annotations()
                .contains_key("local.sdn.cozystack.io/adopted-from")
        })
        .map(|a| a.name_any())
        .collect();
    assert!(adopted.is_empty(), "{adopted:?}");
    assert!(
        services(e, &holds.name)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|h| h
                .annotations()
                .get("metallb.drivers.local.sdn.cozystack.io/address")
                == Some(early))
    );
    wait_ingress(e, ns, "legacy", &[&format!("{NET}6")]).await;
    let again = adopt(&["--class", class, "--undo", "--yes"]).await;
    assert!(row(&again, "-").contains("nothing to do"));
}
