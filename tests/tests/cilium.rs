//! The Cilium LB-IPAM driver against the real cilium-operator (v1.19.5, built from its Go
//! module, LB-IPAM on) on the real control plane: LB-IPAM writes the ingress, holds every
//! address of the driver's classes in its own books, refuses thieves and says why.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use address_controller_api::ClaimPhase;
use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_tests::cilium::{Operator, operator};
use address_controller_tests::env::{Env, WAIT, env, phase, purge};
use address_controller_tests::lb::{
    ingress, ports_spec, service, services, wait_attached, wait_ingress,
};
use address_controller_tests::{ControllerProcess, TestNamespace, wait_for};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

const PROVISIONER: &str = "cilium.drivers.local.sdn.cozystack.io";
const POOL_LABEL: &str = "cilium.drivers.local.sdn.cozystack.io/pool";
const SATISFIED: &str = "cilium.io/IPAMRequestSatisfied";

struct Setup {
    e: Env,
    _operator: Arc<Operator>,
    _driver: ControllerProcess,
    holds: TestNamespace,
    class: String,
}

/// The core (the test env's), the cilium-operator, the Cilium driver, and a class of it
/// over `addresses`.
async fn setup(prefix: &str, addresses: Value) -> Setup {
    let mut e = env(prefix).await;
    let op = operator().await.unwrap();
    address_controller_tests::cilium::purge_pools(&[&match_prefix(&addresses)]).unwrap();
    let holds = TestNamespace::create(&e.client, &format!("{prefix}-holds"))
        .await
        .unwrap();
    let driver = ControllerProcess::cilium_driver_holding(
        &format!("drv-{prefix}-{}", e.sfx),
        &holds.name,
        &[],
    )
    .await
    .unwrap();
    let class = e
        .class(
            prefix,
            json!({"spec": {"provisioner": PROVISIONER, "parameters": {"addresses": addresses}}}),
        )
        .await;
    Setup {
        e,
        _operator: op,
        _driver: driver,
        holds,
        class,
    }
}

/// The first three octets (and the dot) of a class's first block: its test's own range.
fn match_prefix(addresses: &Value) -> String {
    let first = addresses[0].as_str().unwrap_or_default();
    let mut parts: Vec<&str> = first.split('.').take(3).collect();
    parts.push("");
    parts.join(".")
}

fn pools(e: &Env) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumLoadBalancerIPPool");
    Api::all_with(e.client.clone(), &ApiResource::from_gvk(&gvk))
}

fn listed(c: &address_controller_api::IPAddressClaim) -> Vec<(String, String)> {
    c.status
        .iter()
        .flat_map(|s| &s.addresses)
        .map(|a| (a.name.clone(), a.address.clone()))
        .collect()
}

/// LB-IPAM's condition on a Service, as (status, reason).
fn satisfied(s: &Service) -> Option<(String, String)> {
    s.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == SATISFIED)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn wait_satisfied(e: &Env, ns: &str, name: &str, status: &str) -> String {
    let api = services(e, ns);
    wait_for(
        &format!("Service {ns}/{name} {SATISFIED}={status}"),
        WAIT,
        || async {
            let s = api.get(name).await?;
            Ok(satisfied(&s)
                .filter(|(st, _)| st == status)
                .map(|(_, reason)| reason))
        },
    )
    .await
    .unwrap()
}

/// The class's pool serves only what the driver marks; a claim's address is held by LB-IPAM
/// at once and put on its Service by LB-IPAM; a thief asking for it, or an unmarked Service,
/// gets nothing and LB-IPAM's reason; a withdrawn pin leaves the address held.
#[tokio::test]
async fn lbipam_puts_the_claims_address_on_its_service_and_refuses_a_thief() {
    let mut s = setup("cil", json!(["198.18.73.0/28"])).await;
    purge(&s.e, &["198.18.73."]).await;
    let e = &mut s.e;
    let class = s.class.clone();
    let ns = e.ns.name.clone();
    let pool_name = format!("ipaddressclass-{class}");
    let pool = wait_for("the class's LB-IPAM pool", WAIT, || async {
        Ok(pools(e).get_opt(&pool_name).await?)
    })
    .await
    .unwrap();
    assert_eq!(
        pool.data["spec"]["serviceSelector"],
        json!({"matchLabels": {POOL_LABEL: pool_name}})
    );
    assert_eq!(
        pool.metadata.owner_references.as_ref().unwrap()[0].name,
        class
    );

    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed(&c).remove(0);
    // Held in LB-IPAM's books before any Service of the tenant names the claim.
    wait_ingress(e, &s.holds.name, &format!("hold-{name}"), &[&x]).await;
    wait_satisfied(e, &s.holds.name, &format!("hold-{name}"), "True").await;

    // The claim's Service gets X — written by the cilium-operator.
    service(
        e,
        &ns,
        "web",
        json!({SERVICE_CLAIM_ANNOTATION: "web"}),
        json!({}),
    )
    .await;
    let svc = wait_ingress(e, &ns, "web", &[&x]).await;
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
    assert!(
        !writers.is_empty() && writers.iter().all(|w| w.contains("cilium-operator")),
        "the cilium-operator wrote the ingress: {writers:?}"
    );
    wait_attached(e, &ns, "web", "True", "Attached").await;
    e.wait_address(&name, "associated", |a| {
        a.and_then(|a| a.status.as_ref()?.associated_to.as_ref())
            .is_some_and(|t| t.name == "web")
    })
    .await;

    // A plain LoadBalancer Service: no pool selects it.
    service(e, &ns, "plain", json!({}), json!({})).await;
    assert_eq!(wait_satisfied(e, &ns, "plain", "False").await, "no_pool");
    // A thief copying the pool's label and asking for X (no fence here): refused, X stays.
    let thieves = TestNamespace::create(&e.client, "cil-thief").await.unwrap();
    let thief = json!({"metadata": {"name": "thief", "labels": {POOL_LABEL: pool_name},
        "annotations": {"lbipam.cilium.io/ips": x}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 8080}]}});
    services(e, &thieves.name)
        .create(&Default::default(), &serde_json::from_value(thief).unwrap())
        .await
        .unwrap();
    let why = wait_satisfied(e, &thieves.name, "thief", "False").await;
    assert!(why.starts_with("already_allocated"), "{why}");
    assert!(ingress(&services(e, &thieves.name).get("thief").await.unwrap()).is_empty());
    assert_eq!(
        ingress(&services(e, &ns).get("web").await.unwrap()),
        vec![x.clone()]
    );

    // The claim named no more: the pin is withdrawn, LB-IPAM takes X off the Service, the
    // hold keeps it.
    let api = services(e, &ns);
    api.patch(
        "web",
        &Default::default(),
        &kube::api::Patch::Merge(
            json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}}),
        ),
    )
    .await
    .unwrap();
    wait_ingress(e, &ns, "web", &[]).await;
    let web = api.get("web").await.unwrap();
    assert!(!web.labels().contains_key(POOL_LABEL), "{:?}", web.labels());
    assert!(
        !web.annotations().contains_key("lbipam.cilium.io/ips"),
        "{:?}",
        web.annotations()
    );
    let hold = services(e, &s.holds.name)
        .get(&format!("hold-{name}"))
        .await
        .unwrap();
    assert_eq!(ingress(&hold), vec![x.clone()]);
    for n in ["web", "plain"] {
        api.delete(n, &DeleteParams::default()).await.unwrap();
    }
    drop(thieves);
    e.check().await;
}

/// Sharing by port through LB-IPAM: one key from the claim's uid on every holder; a port
/// collision is the kit's refusal; a Service LB-IPAM cannot share with (another
/// externalTrafficPolicy) gets LB-IPAM's own words on its `AddressAttached`.
#[tokio::test]
async fn a_shared_claim_gives_lbipams_address_to_each_holder_and_lbipams_refusal_is_readable() {
    let mut s = setup("cil-share", json!(["198.18.74.0/28"])).await;
    purge(&s.e, &["198.18.74."]).await;
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
    service(e, &ns, "dns", claim.clone(), ports_spec(&["UDP/53"])).await;
    for n in ["web", "dns"] {
        let svc = wait_ingress(e, &ns, n, &[&x]).await;
        assert_eq!(
            svc.annotations().get("lbipam.cilium.io/sharing-key"),
            Some(&key)
        );
        assert_eq!(
            svc.annotations()
                .get("lbipam.cilium.io/sharing-cross-namespace"),
            Some(&"*".to_string()),
            "LB-IPAM's namespace switch open: the key, which only the driver writes, is the guard"
        );
        wait_attached(e, &ns, n, "True", "Attached").await;
    }
    e.wait_address(&name, "two holders", |a| {
        a.and_then(|a| a.status.as_ref()?.holder_count) == Some(2)
    })
    .await;
    // A colliding port: the kit's refusal; LB-IPAM never gets a pin for it.
    service(e, &ns, "clash", claim.clone(), ports_spec(&["TCP/80"])).await;
    let m = wait_attached(e, &ns, "clash", "False", "PortConflict").await;
    assert!(m.contains("TCP/80"), "{m}");
    let clash = services(e, &ns).get("clash").await.unwrap();
    assert!(!clash.annotations().contains_key("lbipam.cilium.io/ips"));
    // Another externalTrafficPolicy: the kit's refusal, before LB-IPAM sees a pin.
    service(
        e,
        &ns,
        "local",
        claim.clone(),
        json!({"ports": [{"port": 8443}], "externalTrafficPolicy": "Local",
            "selector": {"app": "local"}}),
    )
    .await;
    wait_attached(e, &ns, "local", "False", "BackendMismatch").await;
    // What only LB-IPAM refuses: under `Local`, it shares an address only between Services
    // that select pods, and the hold must share with the Service. A Service without a
    // selector (its endpoints written by hand) is refused — in LB-IPAM's words.
    e.claim("manual", json!({"className": class})).await;
    let m = e
        .wait_claim("manual", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (_, y) = listed(&m).remove(0);
    service(
        e,
        &ns,
        "manual",
        json!({SERVICE_CLAIM_ANNOTATION: "manual"}),
        json!({"externalTrafficPolicy": "Local"}),
    )
    .await;
    let m = wait_attached(e, &ns, "manual", "False", "LoadBalancerRefused").await;
    assert!(m.contains("LB-IPAM already_allocated"), "{m}");
    let manual = services(e, &ns).get("manual").await.unwrap();
    assert!(ingress(&manual).is_empty());
    assert_eq!(
        manual.annotations().get("lbipam.cilium.io/ips"),
        Some(&y),
        "pinned: the refusal is LB-IPAM's"
    );
    // The holders kept X throughout.
    for n in ["web", "dns"] {
        assert_eq!(
            ingress(&services(e, &ns).get(n).await.unwrap()),
            vec![x.clone()]
        );
    }
    for n in ["web", "dns", "clash", "local", "manual"] {
        services(e, &ns)
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
    e.check().await;
}

/// The driver conformance suite, every case, for a Cilium class — with the real
/// cilium-operator writing the ingress.
#[tokio::test]
async fn the_cilium_driver_passes_the_driver_conformance_suite() {
    use address_controller_tests::conformance::{Options, Restart, run};
    use tokio::sync::Mutex;
    let mut e = env("cil-conf").await;
    purge(
        &e,
        &[
            "198.18.75.",
            "198.18.76.",
            "198.18.77.",
            "2001:db8:75::",
            "2001:db8:77::",
        ],
    )
    .await;
    let _op = operator().await.unwrap();
    address_controller_tests::cilium::purge_pools(&["198.18.75.", "198.18.77."]).unwrap();
    let holds = TestNamespace::create(&e.client, "cil-conf-holds")
        .await
        .unwrap();
    let class = e
        .class(
            "cilconf",
            json!({"spec": {"provisioner": PROVISIONER,
                "parameters": {"addresses": ["198.18.75.0/29", "2001:db8:75::/125"]}}}),
        )
        .await;
    let lease = format!("drv-cilconf-{}", e.sfx);
    let driver = Arc::new(Mutex::new(
        ControllerProcess::cilium_driver_holding(
            &lease,
            &holds.name,
            &[
                "--leader-elect=true",
                "--lease-name",
                &lease,
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
            race_address: Some("198.18.76.1".into()),
            timeout: Duration::from_secs(60),
            lose_parameters: Some(json!({"addresses": ["198.18.77.0/29", "2001:db8:77::/125"]})),
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
        "every case runs here: {}",
        report.table()
    );
    drop(driver);
    e.check().await;
}

/// Each of `policies` type-checked by kube-apiserver, without a warning.
async fn type_checked(policies: &[&str]) {
    let cluster = address_controller_tests::Cluster::get();
    for policy in policies {
        let checked = wait_for("policy type-checked", WAIT, || async {
            let p: Value = serde_json::from_str(&cluster.kubectl_ok(&[
                "get",
                "validatingadmissionpolicy",
                policy,
                "-o",
                "json",
            ])?)?;
            Ok((p["status"]["observedGeneration"] == p["metadata"]["generation"]).then_some(p))
        })
        .await
        .unwrap();
        assert!(
            checked["status"]["typeChecking"]
                .get("expressionWarnings")
                .is_none(),
            "{policy}: {:#}",
            checked["status"]
        );
    }
}

/// Pools: a user whom RBAC lets create one (the positive control) is refused by the fence;
/// the driver's ServiceAccount is not. `prefix` names what the step creates.
async fn pools_are_the_drivers_and_the_admins(driver_sa: &str, prefix: &str) {
    use address_controller_tests::Cluster;
    use address_controller_tests::access::{allowed, kubectl_as};
    let cluster = Cluster::get();
    // Pools: a user whom RBAC lets create one (the positive control) is refused by the
    // fence; the driver's ServiceAccount is not.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": format!("{}-pools", prefix)},
        "rules": [{"apiGroups": ["cilium.io"], "resources": ["ciliumloadbalancerippools"],
            "verbs": ["create", "delete"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{}-pools", prefix)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": format!("{}-pools", prefix)},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "pool-tenant"}]});
    for o in [&role, &binding] {
        kubectl_as(
            "admin",
            &["system:masters"],
            &["create", "-f", "-"],
            &o.to_string(),
        )
        .unwrap();
    }
    wait_for("RBAC lets pool-tenant create pools", WAIT, || async {
        Ok(allowed(
            "pool-tenant",
            &[],
            "create",
            "ciliumloadbalancerippools.cilium.io",
            "",
        )
        .then_some(()))
    })
    .await
    .unwrap();
    let pool = |name: &str| {
        json!({"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
            "metadata": {"name": name},
            "spec": {"blocks": [{"cidr": "198.18.78.0/30"}]}})
        .to_string()
    };
    let tenant_pool = format!("{}-tenant", prefix);
    let err = kubectl_as(
        "pool-tenant",
        &[],
        &["create", "-f", "-"],
        &pool(&tenant_pool),
    )
    .unwrap_err();
    assert!(
        err.contains("may not create, change or delete a CiliumLoadBalancerIPPool"),
        "{err}"
    );
    let driver_pool = format!("{}-driver", prefix);
    kubectl_as(
        driver_sa,
        &["system:serviceaccounts"],
        &["create", "-f", "-"],
        &pool(&driver_pool),
    )
    .unwrap();
    cluster
        .kubectl_ok(&["delete", "ciliumloadbalancerippool", &driver_pool])
        .unwrap();
    for kind in ["clusterrolebinding", "clusterrole"] {
        let _ = cluster.kubectl_ok(&["delete", kind, &format!("{}-pools", prefix)]);
    }
}

/// The fence, on by default with the driver (the chart's policies, installed by helm): a
/// tenant can neither ask LB-IPAM for an address (`lbipam.cilium.io/ips`, naming another
/// tenant's), nor share one, nor mark its Service for a class's pool, nor create a pool; the
/// driver's ServiceAccount can, and the tenant edits the rest of its Service freely.
#[tokio::test]
async fn the_fence_keeps_tenants_off_lbipams_annotations_and_pools() {
    use address_controller_tests::access::kubectl_as;
    use address_controller_tests::chart::Release;
    use address_controller_tests::{free_port, setup as cluster_setup};
    let _op = operator().await.unwrap();
    let (cluster, client) = cluster_setup().await;
    let release = Release::new(
        free_port(),
        &json!({"ciliumDriver": {"enabled": true, "admissionPolicy": {
            "namespaceSelector": {"matchLabels": {"address-controller.test/cilium": "guarded"}}}}}),
    )
    .await;
    type_checked(&[
        "address-controller-cilium-pins",
        "address-controller-cilium-pools",
    ])
    .await;
    let guarded = TestNamespace::create(&client, "cil-fence").await.unwrap();
    cluster
        .kubectl_ok(&[
            "label",
            "namespace",
            &guarded.name,
            "address-controller.test/cilium=guarded",
        ])
        .unwrap();
    let g = guarded.name.as_str();
    let svc = |name: &str, ann: Value, labels: Value, spec: Value| {
        let mut v = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": g, "annotations": ann, "labels": labels},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        for (k, x) in spec.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        v.to_string()
    };
    let create = ["create", "-f", "-"];
    let tenant =
        |args: &[&str], stdin: &str| kubectl_as("tenant", &["system:masters"], args, stdin);
    let driver_sa = format!(
        "system:serviceaccount:{}:address-controller-cilium-driver",
        release.ns
    );
    // Another tenant's address, asked for by name: refused (each attempt a fresh name while
    // the policy becomes active).
    let ask = json!({"lbipam.cilium.io/ips": "198.18.73.1"});
    let attempt = std::sync::atomic::AtomicU32::new(0);
    let denied = wait_for("the policy denies a tenant's ask", WAIT, || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match tenant(
            &create,
            &svc(&format!("ask-{n}"), ask.clone(), json!({}), json!({})),
        ) {
            Ok(_) => Ok(None),
            Err(e) if e.contains("ValidatingAdmissionPolicy") => Ok(Some(e)),
            Err(e) => Err(anyhow::anyhow!(e)),
        }
    })
    .await
    .unwrap();
    assert!(
        denied.contains("may not set, change or remove Cilium LB-IPAM annotations"),
        "{denied}"
    );
    for (name, ann, labels, spec) in [
        (
            "share",
            json!({"lbipam.cilium.io/sharing-key": "ac-x"}),
            json!({}),
            json!({}),
        ),
        (
            "cross",
            json!({"lbipam.cilium.io/sharing-cross-namespace": "*"}),
            json!({}),
            json!({}),
        ),
        (
            "alias",
            json!({"io.cilium/lb-ipam-ips": "198.18.73.1"}),
            json!({}),
            json!({}),
        ),
        (
            "marked",
            json!({}),
            json!({POOL_LABEL: "ipaddressclass-x"}),
            json!({}),
        ),
        (
            "byip",
            json!({}),
            json!({}),
            json!({"loadBalancerIP": "198.18.73.2"}),
        ),
    ] {
        let err = tenant(&create, &svc(name, ann, labels, spec)).unwrap_err();
        assert!(err.contains("Cilium LB-IPAM annotations"), "{name}: {err}");
    }
    tenant(&create, &svc("plain", json!({}), json!({}), json!({}))).unwrap();
    // The driver's ServiceAccount pins the tenant's Service; the tenant edits the rest, not
    // the pin nor the pool label.
    tenant(&create, &svc("web", json!({}), json!({}), json!({}))).unwrap();
    kubectl_as(
        &driver_sa,
        &["system:serviceaccounts"],
        &[
            "patch",
            "svc",
            "web",
            "-n",
            g,
            "--type=merge",
            "-p",
            &json!({"metadata": {"annotations": ask.clone(),
                "labels": {POOL_LABEL: "ipaddressclass-x"}}})
            .to_string(),
        ],
        "",
    )
    .unwrap();
    let patch = |body: Value| {
        tenant(
            &[
                "patch",
                "svc",
                "web",
                "-n",
                g,
                "--type=merge",
                "-p",
                &body.to_string(),
            ],
            "",
        )
    };
    patch(json!({"metadata": {"labels": {"tier": "web"}}})).unwrap();
    let err = patch(json!({"metadata": {"annotations": {"lbipam.cilium.io/ips": "198.18.73.9"}}}))
        .unwrap_err();
    assert!(err.contains("Cilium LB-IPAM annotations"), "{err}");
    let err = patch(json!({"metadata": {"labels": {POOL_LABEL: null}}})).unwrap_err();
    assert!(err.contains("Cilium LB-IPAM annotations"), "{err}");

    pools_are_the_drivers_and_the_admins(&driver_sa, &guarded.name).await;
    drop(release);
}
