//! Association (SPEC §8) with the range driver as the load balancer, on the real control
//! plane: a claim's address goes on the Service that names it — and comes back when the
//! Service is recreated; one claim serves one Service; the claim is looked up in the
//! Service's own namespace; withdrawing lets the ledger go last; Dual; auto-claims; a thief
//! makes the address Conflict; a shrunk range makes it Lost; a driver killed mid-handoff
//! converges; two driver replicas never show one address on two Services.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeMap;
use std::time::Duration;

use address_controller_api::names::{AUTO_CLAIM_CLASS_ANNOTATION, SERVICE_CLAIM_ANNOTATION};
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress};
use address_controller_tests::env::{Env, WAIT, aphase, env, phase, purge, range_class};
use address_controller_tests::{
    ControllerProcess, TestNamespace, free_port, https_get, metrics_token, wait_for,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

async fn driver(e: &Env, name: &str, extra: &[&str]) -> ControllerProcess {
    let mut args = vec!["--leader-elect=false"];
    args.extend_from_slice(extra);
    ControllerProcess::driver(&format!("drv-{name}-{}", e.sfx), &args)
        .await
        .unwrap()
}

fn services(e: &Env, ns: &str) -> Api<Service> {
    Api::namespaced(e.client.clone(), ns)
}

/// A LoadBalancer Service `name` in `ns` naming `claim` (if any).
async fn service(e: &Env, ns: &str, name: &str, claim: Option<&str>, extra: Value) -> Service {
    let mut v = json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer",
        "ports": [{"port": 80}], "selector": {"app": name}}});
    if let Some(c) = claim {
        v["metadata"]["annotations"] = json!({SERVICE_CLAIM_ANNOTATION: c});
    }
    address_controller_tests::env::merge(&mut v, extra);
    services(e, ns)
        .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap()
}

fn ingress(s: &Service) -> Vec<String> {
    address_controller_api::service::ingress_ips(s)
        .map(str::to_string)
        .collect()
}

async fn wait_ingress(e: &Env, ns: &str, name: &str, want: &[&str]) -> Service {
    let api = services(e, ns);
    let last = std::sync::Mutex::new(Vec::new());
    wait_for(
        &format!("Service {ns}/{name} ingress {want:?}"),
        WAIT,
        || async {
            let s = api.get(name).await?;
            let got = ingress(&s);
            *last.lock().unwrap() = got.clone();
            Ok((got == want).then_some(s))
        },
    )
    .await
    .unwrap_or_else(|err| panic!("{err}; last {:?}", last.lock().unwrap()))
}

fn associated(a: Option<&IPAddress>) -> Option<(String, String)> {
    let t = a?.status.as_ref()?.associated_to.as_ref()?;
    Some((t.namespace.clone().unwrap_or_default(), t.name.clone()))
}

async fn wait_associated(e: &Env, address: &str, to: Option<(&str, &str)>) -> IPAddress {
    let want = to.map(|(n, s)| (n.to_string(), s.to_string()));
    e.wait_address(address, &format!("associatedTo {want:?}"), |a| {
        associated(a) == want
    })
    .await
    .unwrap()
}

async fn wait_service_event(e: &Env, ns: &str, name: &str, reason: &str) -> String {
    e.wait_event(ns, name, reason).await
}

fn listed_address(c: &address_controller_api::IPAddressClaim) -> (String, String) {
    let a = &c.status.as_ref().unwrap().addresses[0];
    (a.name.clone(), a.address.clone())
}

/// Every change of the Services of a namespace and of one address, ordered by etcd
/// revision (resourceVersions are revisions: one order across both kinds), so the history
/// can be replayed exactly: at no revision may a Service show the address while the ledger
/// (`associatedTo`) names another Service or none — unless the address is Conflict.
/// One change: (revision, the Service or the address, deleted).
type Change = (u64, Option<Service>, Option<IPAddress>, bool);

struct History {
    task: tokio::task::JoinHandle<Vec<Change>>,
    services: Api<Service>,
    addresses: Api<IPAddress>,
    address: String,
    /// The name of the marker that ends the history (see [`History::check`]).
    fence: String,
}

/// The label (on the address) and the name (of a headless Service) that fence a history.
const FENCE_LABEL: &str = "address-controller.test/fence";

impl History {
    async fn watch(e: &Env, ns: &str, address: &str) -> History {
        let svcs = services(e, ns);
        let addrs = e.addresses();
        let mut a = addrs
            .watch(
                &WatchParams::default().fields(&format!("metadata.name={address}")),
                "0",
            )
            .await
            .unwrap()
            .boxed();
        let mut s = svcs
            .watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        let fence = format!("fence-{}", address_controller_tests::random_suffix());
        let marker = fence.clone();
        let task = tokio::spawn(async move {
            let rv = |m: &kube::api::ObjectMeta| {
                m.resource_version
                    .as_deref()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (mut out, mut services_fenced, mut address_fenced) = (Vec::new(), false, false);
            while !(services_fenced && address_fenced) {
                tokio::select! {
                    Some(Ok(ev)) = s.next() => match ev {
                        WatchEvent::Added(x) if x.name_any() == marker => services_fenced = true,
                        WatchEvent::Added(x) | WatchEvent::Modified(x) => out.push((rv(&x.metadata), Some(x), None, false)),
                        WatchEvent::Deleted(x) => out.push((rv(&x.metadata), Some(x), None, true)),
                        _ => {}
                    },
                    Some(Ok(ev)) = a.next() => match ev {
                        WatchEvent::Added(x) | WatchEvent::Modified(x) => {
                            address_fenced |= x.labels().get(FENCE_LABEL) == Some(&marker);
                            out.push((rv(&x.metadata), None, Some(x), false));
                        }
                        WatchEvent::Deleted(x) => {
                            // A deleted address fences its own stream: nothing follows.
                            address_fenced = true;
                            out.push((rv(&x.metadata), None, Some(x), true));
                        }
                        _ => {}
                    },
                    else => break,
                }
            }
            out
        });
        History {
            task,
            services: svcs,
            addresses: addrs,
            address: address.to_string(),
            fence,
        }
    }

    /// Replays the history; returns how often the address was shown (a positive control)
    /// and every revision at which a Service showed it without the ledger's word.
    /// The history ends at a fence the test writes itself: a headless Service in the
    /// namespace and a label on the address. Each watch delivers in revision order, so once
    /// both markers arrived, every change committed before them did too.
    async fn check(self, ip: &str) -> (usize, Vec<String>) {
        let marker: Service = serde_json::from_value(json!({
            "metadata": {"name": self.fence},
            "spec": {"clusterIP": "None"}
        }))
        .unwrap();
        self.services
            .create(&PostParams::default(), &marker)
            .await
            .unwrap();
        let _ = self
            .addresses
            .patch(
                &self.address,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {FENCE_LABEL: self.fence}}})),
            )
            .await;
        let mut events = tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the watches deliver the fence within 60 s")
            .unwrap();
        let _ = self
            .services
            .delete(&self.fence, &DeleteParams::default())
            .await;
        events.sort_by_key(|(rv, ..)| *rv);
        let mut shown: BTreeMap<String, bool> = BTreeMap::new();
        let mut ledger: Option<(String, bool)> = None; // (associatedTo, Conflict)
        let (mut count, mut bad) = (0usize, Vec::new());
        for (rv, svc, addr, deleted) in events {
            if let Some(s) = svc {
                let on = !deleted && ingress(&s).iter().any(|x| x == ip);
                count += usize::from(on);
                shown.insert(s.name_any(), on);
            }
            if let Some(a) = addr {
                ledger = (!deleted).then(|| {
                    (
                        associated(Some(&a)).map(|(_, n)| n).unwrap_or_default(),
                        aphase(Some(&a)) == Some(AddressPhase::Conflict),
                    )
                });
            }
            for (name, _) in shown.iter().filter(|(_, on)| **on) {
                let ok = ledger
                    .as_ref()
                    .is_some_and(|(to, conflict)| to == name || *conflict);
                if !ok {
                    bad.push(format!(
                        "rv {rv}: Service {name} shows {ip}, ledger {ledger:?}"
                    ));
                }
            }
        }
        (count, bad)
    }
}

#[tokio::test]
async fn a_claims_address_goes_on_its_service_and_comes_back_when_the_service_is_recreated() {
    let mut e = env("assoc").await;
    purge(&e, &["198.18.20.", "2001:db8:20::"]).await;
    let _drv = driver(&e, "assoc", &[]).await;
    let class = range_class(
        &mut e,
        "assoc",
        json!(["198.18.20.0/29", "2001:db8:20::/125"]),
        json!({}),
    )
    .await;
    e.claim("shop", json!({"className": class})).await;
    let c = e
        .wait_claim("shop", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed_address(&c);
    let ns = e.ns.name.clone();
    let history = History::watch(&e, &ns, &name).await;

    // The annotated Service gets X; the ledger names it.
    service(&e, &ns, "shop", Some("shop"), json!({})).await;
    wait_ingress(&e, &ns, "shop", &[&x]).await;
    wait_associated(&e, &name, Some((&ns, "shop"))).await;
    wait_service_event(&e, &ns, "shop", "Associated").await;

    // Deleted: the address stays the claim's; recreated: the same X comes back.
    services(&e, &ns)
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    wait_associated(&e, &name, None).await;
    let c = e.claims().get("shop").await.unwrap();
    assert_eq!(phase(&c), Some(ClaimPhase::Bound));
    assert_eq!(listed_address(&c).1, x);
    wait_for("the Service gone", WAIT, || async {
        Ok(services(&e, &ns)
            .get_opt("shop")
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .unwrap();
    service(&e, &ns, "shop", Some("shop"), json!({})).await;
    wait_ingress(&e, &ns, "shop", &[&x]).await;
    wait_associated(&e, &name, Some((&ns, "shop"))).await;

    // A second Service naming the same claim: rejected, no ingress.
    service(&e, &ns, "copy", Some("shop"), json!({})).await;
    let note = wait_service_event(&e, &ns, "copy", "AssociationRejected").await;
    assert!(note.contains("already serves Service"), "{note}");
    assert!(ingress(&services(&e, &ns).get("copy").await.unwrap()).is_empty());

    // A Service in another namespace naming it: the claim is looked up in its own.
    let other = TestNamespace::create(&e.client, "assoc-other")
        .await
        .unwrap();
    service(&e, &other.name, "shop", Some("shop"), json!({})).await;
    wait_service_event(&e, &other.name, "shop", "ClaimNotFound").await;
    assert!(ingress(&services(&e, &other.name).get("shop").await.unwrap()).is_empty());

    // The annotation removed: ingress and associatedTo go; the claim keeps X. Then the
    // waiting second Service takes over (the holder let go).
    services(&e, &ns)
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    wait_ingress(&e, &ns, "shop", &[]).await;
    wait_ingress(&e, &ns, "copy", &[&x]).await;
    wait_associated(&e, &name, Some((&ns, "copy"))).await;
    wait_service_event(&e, &ns, "shop", "Disassociated").await;
    assert_eq!(
        phase(&e.claims().get("shop").await.unwrap()),
        Some(ClaimPhase::Bound)
    );
    services(&e, &ns)
        .delete("copy", &DeleteParams::default())
        .await
        .unwrap();
    services(&e, &ns)
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    wait_associated(&e, &name, None).await;
    // At no revision did a Service show X without the ledger naming it: the ledger went
    // first when pinning and last when withdrawing.
    let (shown, bad) = history.check(&x).await;
    assert!(shown >= 3, "X was shown {shown} times (positive control)");
    assert!(bad.is_empty(), "{bad:#?}");
    e.check().await;
}

/// Ownership is by the address's class, never by the claim's stamp: a claim bound to a
/// static address of the driver's class (no stamp: the core never asked the driver) is
/// put on its Service like any other.
#[tokio::test]
async fn a_claim_bound_to_a_static_address_of_the_class_is_associated_too() {
    let mut e = env("assoc-static").await;
    purge(&e, &["198.18.26."]).await;
    let _drv = driver(&e, "static", &[]).await;
    let class = range_class(&mut e, "static", json!(["198.18.26.0/30"]), json!({})).await;
    let a = e.address("s", "198.18.26.2", &class, json!({})).await;
    e.wait_address(&a, "Available", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;
    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(listed_address(&c), (a.clone(), "198.18.26.2".to_string()));
    assert!(
        !c.annotations()
            .contains_key(address_controller_api::names::PROVISIONER_ANNOTATION),
        "bound to a free address: never stamped"
    );
    let ns = e.ns.name.clone();
    service(&e, &ns, "web", Some("web"), json!({})).await;
    wait_ingress(&e, &ns, "web", &["198.18.26.2"]).await;
    wait_associated(&e, &a, Some((&ns, "web"))).await;
    services(&e, &ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_associated(&e, &a, None).await;
    e.check().await;
}

#[tokio::test]
async fn dual_claims_fill_dual_stack_services_and_auto_claims_need_no_human_step() {
    let mut e = env("assoc-dual").await;
    purge(&e, &["198.18.21.", "2001:db8:21::"]).await;
    let _drv = driver(&e, "dual", &[]).await;
    let class = range_class(
        &mut e,
        "dual",
        json!(["198.18.21.0/29", "2001:db8:21::/125"]),
        json!({"metadata": {"annotations": {AUTO_CLAIM_CLASS_ANNOTATION: "true"}},
            "spec": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    let ns = e.ns.name.clone();
    e.claim("both", json!({"className": class, "family": "Dual"}))
        .await;
    let c = e
        .wait_claim("both", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let ips: Vec<String> = c
        .status
        .unwrap()
        .addresses
        .iter()
        .map(|a| a.address.clone())
        .collect();
    let (v4, v6) = if ips[0].contains(':') {
        (ips[1].clone(), ips[0].clone())
    } else {
        (ips[0].clone(), ips[1].clone())
    };
    service(
        &e,
        &ns,
        "both",
        Some("both"),
        json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}}),
    )
    .await;
    wait_ingress(&e, &ns, "both", &[&v4, &v6]).await;
    // An IPv4-only Service naming a Dual claim: the IPv4 address only, and why.
    services(&e, &ns)
        .delete("both", &DeleteParams::default())
        .await
        .unwrap();
    service(&e, &ns, "v4only", Some("both"), json!({})).await;
    wait_ingress(&e, &ns, "v4only", &[&v4]).await;
    let note = wait_service_event(&e, &ns, "v4only", "FamilyMismatch").await;
    assert!(note.contains(&v6), "{note}");
    services(&e, &ns)
        .delete("v4only", &DeleteParams::default())
        .await
        .unwrap();

    // An auto-claimed Service (SPEC §7): the core claims, the driver puts it on — no human
    // step between `kubectl apply` and an EXTERNAL-IP.
    service(&e, &ns, "auto", None, json!({})).await;
    let s = wait_for("the auto-claimed Service's ingress", WAIT, || async {
        let s = services(&e, &ns).get("auto").await?;
        Ok((!ingress(&s).is_empty()).then_some(s))
    })
    .await
    .unwrap();
    let auto = e
        .wait_claim("auto", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(ingress(&s), [listed_address(&auto).1]);
    assert_eq!(
        s.annotations()
            .get(SERVICE_CLAIM_ANNOTATION)
            .map(String::as_str),
        Some("auto")
    );
    services(&e, &ns)
        .delete("auto", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("auto").await;
    e.claims()
        .delete("both", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("both").await;
    e.check().await;
}

/// A thief — another load balancer's Service showing the claim's address — makes the
/// address Conflict (the rightful Service keeps it, the claim stays Bound) until it lets
/// go; a range shrunk below the address makes it Lost (the ingress withdrawn, no other
/// address given) until restored. The kit's gauges follow, on a `/metrics` authorized as
/// the core's.
#[tokio::test]
async fn a_thief_makes_the_address_conflict_and_a_shrunk_range_makes_it_lost() {
    let mut e = env("assoc-bad").await;
    purge(&e, &["198.18.22.", "198.18.23."]).await;
    let metrics_at = format!("127.0.0.1:{}", free_port());
    let _drv = driver(&e, "bad", &["--metrics-address", &metrics_at]).await;
    let m = KitMetrics {
        url: format!("https://{metrics_at}/metrics"),
        token: metrics_token().unwrap(),
    };
    // The kit's /metrics: delegated authn/authz as the core's.
    assert_eq!(https_get(&m.url, None).unwrap().0, 403, "anonymous");
    assert_eq!(https_get(&m.url, Some("not-a-token")).unwrap().0, 401);
    let class = range_class(&mut e, "bad", json!(["198.18.22.0/30"]), json!({})).await;
    let ns = e.ns.name.clone();
    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed_address(&c);
    service(&e, &ns, "web", Some("web"), json!({})).await;
    wait_ingress(&e, &ns, "web", &[&x]).await;
    let other = a_thief_makes_it_conflict_until_it_lets_go(&e, &m, &name, &x).await;
    a_shrunk_range_makes_it_lost_until_restored(&e, &m, &class, &name, &x).await;
    services(&e, &other.name)
        .delete("thief", &DeleteParams::default())
        .await
        .unwrap();
    services(&e, &ns)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_associated(&e, &name, None).await;
    e.check().await;
}

/// A driver's `/metrics` and a token allowed to read it.
struct KitMetrics {
    url: String,
    token: String,
}

impl KitMetrics {
    /// The kit's address gauge of the test's class in `state`.
    fn gauge(&self, state: &str) -> Option<i64> {
        let (code, text) = https_get(&self.url, Some(&self.token)).ok()?;
        assert_eq!(code, 200);
        text.lines()
            .find(|l| {
                l.starts_with("address_controller_driver_addresses{")
                    && l.contains(&format!("state=\"{state}\""))
                    && l.contains("class=\"bad-")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    /// The runtime's families a driver serves as the core does.
    fn has_the_cores_families(&self) {
        let (_, text) = https_get(&self.url, Some(&self.token)).unwrap();
        for family in [
            "address_controller_reconcile_total{",
            "address_controller_workqueue_depth{",
            "address_controller_workqueue_retries_total{",
            "address_controller_workqueue_queue_duration_seconds_bucket{",
            "address_controller_workqueue_longest_running_processor_seconds{",
            "address_controller_workqueue_unfinished_work_seconds{",
            "address_controller_client_requests_total{",
            "address_controller_client_rate_limiter_duration_seconds_bucket",
            "address_controller_cache_objects{",
            "address_controller_leader",
        ] {
            assert!(text.contains(family), "{family} missing:\n{text}");
        }
    }
}

/// Someone writes the address `x` into another Service's status (a load balancer of its
/// own, say): Conflict, said on the address, on the thief and in the kit's gauge; the
/// rightful Service keeps it, the claim stays Bound; the thief lets go: Bound again. The
/// thief's namespace is returned.
async fn a_thief_makes_it_conflict_until_it_lets_go(
    e: &Env,
    m: &KitMetrics,
    name: &str,
    x: &str,
) -> TestNamespace {
    let ns = &e.ns.name;
    let other = TestNamespace::create(&e.client, "assoc-thief")
        .await
        .unwrap();
    service(
        e,
        &other.name,
        "thief",
        None,
        json!({"spec": {"loadBalancerClass": "example.com/other"}}),
    )
    .await;
    services(e, &other.name)
        .patch_status(
            "thief",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": x}]}}})),
        )
        .await
        .unwrap();
    let a = e
        .wait_address(name, "Conflict", |a| {
            aphase(a) == Some(AddressPhase::Conflict)
        })
        .await
        .unwrap();
    let cond = a
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Conflict")
        .unwrap()
        .clone();
    assert_eq!(cond.status, "True");
    assert!(
        cond.message.contains(&format!("{}/thief", other.name)),
        "{}",
        cond.message
    );
    let on_thief = e.wait_event(&other.name, "thief", "Conflict").await;
    assert!(on_thief.contains(&format!("{ns}/web")), "{on_thief}");
    e.wait_event("default", name, "Conflict").await;
    wait_for("the kit's conflict gauge at 1", WAIT, || async {
        Ok((m.gauge("conflict") == Some(1)).then_some(()))
    })
    .await
    .unwrap();
    m.has_the_cores_families();
    // The rightful Service keeps X; the claim stays Bound.
    assert_eq!(
        ingress(&services(e, ns).get("web").await.unwrap()),
        [x.to_string()]
    );
    assert_eq!(
        phase(&e.claims().get("web").await.unwrap()),
        Some(ClaimPhase::Bound)
    );
    // The thief lets go: back to Bound.
    services(e, &other.name)
        .patch_status(
            "thief",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": null}}})),
        )
        .await
        .unwrap();
    e.wait_address(name, "Bound again", |a| {
        aphase(a) == Some(AddressPhase::Bound)
    })
    .await;
    wait_for("the kit's conflict gauge back to 0", WAIT, || async {
        Ok((m.gauge("conflict") == Some(0)).then_some(()))
    })
    .await
    .unwrap();

    other
}

/// The range shrunk below the address: Lost, the claim Lost, the ingress withdrawn, no
/// other address given; restored: all back.
async fn a_shrunk_range_makes_it_lost_until_restored(
    e: &Env,
    m: &KitMetrics,
    class: &str,
    name: &str,
    x: &str,
) {
    let ns = &e.ns.name;
    let classes = e.classes();
    let shrink = |cidrs: Value| {
        let classes = classes.clone();
        let class = class.to_string();
        async move {
            classes
                .patch(
                    &class,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"parameters": {"cidrs": cidrs}}})),
                )
                .await
                .unwrap();
        }
    };
    shrink(json!(["198.18.23.0/30"])).await;
    e.wait_address(name, "Lost", |a| aphase(a) == Some(AddressPhase::Lost))
        .await;
    e.wait_claim("web", "Lost", |c| phase(c) == Some(ClaimPhase::Lost))
        .await;
    wait_ingress(e, ns, "web", &[]).await;
    wait_associated(e, name, None).await;
    e.wait_event("default", name, "AddressLost").await;
    wait_for("the kit's lost gauge at 1", WAIT, || async {
        Ok((m.gauge("lost") == Some(1)).then_some(()))
    })
    .await
    .unwrap();
    e.barrier().await;
    let c = e.claims().get("web").await.unwrap();
    assert!(
        c.status
            .as_ref()
            .unwrap()
            .addresses
            .iter()
            .all(|a| a.name == name),
        "no replacement: {:?}",
        c.status
    );
    shrink(json!(["198.18.22.0/30"])).await;
    e.wait_address(name, "Bound again", |a| {
        aphase(a) == Some(AddressPhase::Bound)
    })
    .await;
    e.wait_claim("web", "Bound again", |c| {
        phase(c) == Some(ClaimPhase::Bound)
    })
    .await;
    wait_ingress(e, ns, "web", &[x]).await;
}

/// The driver is killed the moment the old holder's ingress is emptied (the middle of a
/// handoff, caught by a watch); restarted, it completes the handoff.
#[tokio::test]
async fn a_driver_killed_mid_handoff_converges() {
    let mut e = env("assoc-kill").await;
    purge(&e, &["198.18.24."]).await;
    let mut drv = driver(&e, "kill", &[]).await;
    let class = range_class(&mut e, "kill", json!(["198.18.24.0/30"]), json!({})).await;
    let ns = e.ns.name.clone();
    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (name, x) = listed_address(&c);
    service(&e, &ns, "old", Some("web"), json!({})).await;
    wait_ingress(&e, &ns, "old", &[&x]).await;
    service(&e, &ns, "new", Some("web"), json!({})).await;
    wait_service_event(&e, &ns, "new", "AssociationRejected").await;

    let api = services(&e, &ns);
    let mut watch = api
        .watch(&WatchParams::default().fields("metadata.name=old"), "0")
        .await
        .unwrap()
        .boxed();
    api.patch(
        "old",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}})),
    )
    .await
    .unwrap();
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = watch.next().await {
            if let Ok(WatchEvent::Modified(s)) = ev
                && ingress(&s).is_empty()
                && !s.annotations().contains_key(SERVICE_CLAIM_ANNOTATION)
            {
                return;
            }
        }
    })
    .await
    .unwrap();
    drv.kill();
    // Killed mid-way: the old holder let go, the new one does not have it yet.
    let at_kill = e.addresses().get(&name).await.unwrap();
    let new_ingress = ingress(&api.get("new").await.unwrap());
    assert!(
        new_ingress.is_empty(),
        "the kill came after the handoff ({new_ingress:?}, {:?})",
        associated(Some(&at_kill))
    );
    drv.restart().await.unwrap();
    wait_ingress(&e, &ns, "new", &[&x]).await;
    wait_associated(&e, &name, Some((&ns, "new"))).await;
    assert!(ingress(&api.get("old").await.unwrap()).is_empty());
    api.delete("new", &DeleteParams::default()).await.unwrap();
    api.delete("old", &DeleteParams::default()).await.unwrap();
    wait_associated(&e, &name, None).await;
    e.check().await;
}

/// Two elected driver replicas, the leader killed while Services naming one claim come and
/// go: a watch of every Service sees the address on at most one Service at any moment.
#[tokio::test]
async fn two_driver_replicas_never_show_one_address_on_two_services() {
    let mut e = env("assoc-ha").await;
    purge(&e, &["198.18.25."]).await;
    let class = range_class(&mut e, "ha", json!(["198.18.25.0/30"]), json!({})).await;
    let lease = e.name("drv-lease");
    let args = address_controller_tests::env::fast_lease(&lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut replicas = vec![
        ControllerProcess::driver(&format!("drv-a-{}", e.sfx), &args)
            .await
            .unwrap(),
        ControllerProcess::driver(&format!("drv-b-{}", e.sfx), &args)
            .await
            .unwrap(),
    ];
    let ns = e.ns.name.clone();
    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let (xname, x) = listed_address(&c);
    let api = services(&e, &ns);
    let history = History::watch(&e, &ns, &xname).await;
    // Watch every Service of the namespace: who shows X, event by event.
    let mut watch = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let observer = tokio::spawn({
        let x = x.clone();
        async move {
            let mut showing: BTreeMap<String, bool> = BTreeMap::new();
            let mut worst = 0usize;
            let mut shown_at_all = 0usize;
            while let Some(ev) = watch.next().await {
                match ev {
                    Ok(WatchEvent::Added(s) | WatchEvent::Modified(s)) => {
                        let has = ingress(&s).contains(&x);
                        shown_at_all += usize::from(has);
                        showing.insert(s.name_any(), has);
                    }
                    Ok(WatchEvent::Deleted(s)) => {
                        showing.remove(&s.name_any());
                    }
                    _ => {}
                }
                worst = worst.max(showing.values().filter(|v| **v).count());
                if showing.contains_key("stop") {
                    break;
                }
            }
            (worst, shown_at_all)
        }
    });
    for round in 0..4 {
        let a = format!("a{round}");
        let b = format!("b{round}");
        service(&e, &ns, &a, Some("web"), json!({})).await;
        service(&e, &ns, &b, Some("web"), json!({})).await;
        wait_ingress(&e, &ns, &a, &[&x]).await;
        if round % 2 == 1 {
            let holder = address_controller_tests::env::lease_holder(&e.client, &lease)
                .await
                .unwrap();
            if let Some(p) = replicas
                .iter_mut()
                .find(|p| Some(&p.user) == holder.as_ref())
            {
                p.kill();
            }
        }
        api.delete(&a, &DeleteParams::default()).await.unwrap();
        wait_ingress(&e, &ns, &b, &[&x]).await;
        api.delete(&b, &DeleteParams::default()).await.unwrap();
        for p in replicas.iter_mut() {
            if !p.running() {
                p.restart().await.unwrap();
            }
        }
    }
    service(
        &e,
        &ns,
        "stop",
        None,
        json!({"spec": {"loadBalancerClass": "example.com/none"}}),
    )
    .await;
    let (worst, shown) = tokio::time::timeout(Duration::from_secs(30), observer)
        .await
        .unwrap()
        .unwrap();
    assert!(shown >= 8, "X was shown {shown} times (positive control)");
    assert_eq!(worst, 1, "X was on {worst} Services at once");
    let (_, bad) = history.check(&x).await;
    assert!(bad.is_empty(), "{bad:#?}");
    api.delete("stop", &DeleteParams::default()).await.unwrap();
    drop(replicas);
    e.check().await;
}
