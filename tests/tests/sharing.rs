//! Sharing one claim's address between Services (#42), with the range driver as the load
//! balancer, on the real control plane: port by port within the claim's namespace, another
//! namespace only by the claim owner's grant, refusals a controller reads in the Service's
//! `local.sdn.cozystack.io/AddressAttached` condition, the first holder deleted without a
//! gap for the others, a Dual claim shared by two dual-stack Services. Every test ends with
//! the invariant checker, whose sharing rules judge the ledger with the kit's own function.
//! (The MetalLB cases are in `metallb.rs`: the real MetalLB controller shares by the key the
//! driver derives from the claim's uid.)

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeSet;

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::sharing::{CONDITION, reason};
use address_controller_api::{ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::env::{Env, WAIT, env, phase, purge, range_class};
use address_controller_tests::{ControllerProcess, TestNamespace, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

async fn driver(e: &Env, name: &str) -> ControllerProcess {
    ControllerProcess::driver(&format!("drv-{name}-{}", e.sfx), &["--leader-elect=false"])
        .await
        .unwrap()
}

fn services(e: &Env, ns: &str) -> Api<Service> {
    Api::namespaced(e.client.clone(), ns)
}

/// A LoadBalancer Service `name` in `ns` naming `claim`, serving `ports` (`"TCP/443"`).
async fn service(e: &Env, ns: &str, name: &str, claim: &str, ports: &[&str], extra: Value) {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| {
            let (proto, port) = p.split_once('/').unwrap();
            json!({"name": format!("{}-{port}", proto.to_lowercase()), "protocol": proto,
                "port": port.parse::<i32>().unwrap()})
        })
        .collect();
    let mut v = json!({"metadata": {"name": name, "annotations": {SERVICE_CLAIM_ANNOTATION: claim}},
        "spec": {"type": "LoadBalancer", "ports": ports, "selector": {"app": "shop"}}});
    address_controller_tests::env::merge(&mut v, extra);
    services(e, ns)
        .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

fn ingress(s: &Service) -> Vec<String> {
    address_controller_api::service::ingress_ips(s)
        .map(str::to_string)
        .collect()
}

async fn wait_ingress(e: &Env, ns: &str, name: &str, want: &[&str]) {
    let api = services(e, ns);
    let last = std::sync::Mutex::new(Vec::new());
    wait_for(
        &format!("Service {ns}/{name} ingress {want:?}"),
        WAIT,
        || async {
            let got = ingress(&api.get(name).await?);
            *last.lock().unwrap() = got.clone();
            Ok((got == want).then_some(()))
        },
    )
    .await
    .unwrap_or_else(|err| panic!("{err}; last {:?}", last.lock().unwrap()));
}

/// The Service's `AddressAttached` condition: (status, reason, message).
fn attached(s: &Service) -> Option<(String, String, String)> {
    address_controller_api::sharing::condition(s)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until the Service's condition has `status` and `why`; returns its message.
async fn wait_condition(e: &Env, ns: &str, name: &str, status: &str, why: &str) -> String {
    let api = services(e, ns);
    let last = std::sync::Mutex::new(None);
    wait_for(
        &format!("Service {ns}/{name} {CONDITION}={status} {why}"),
        WAIT,
        || async {
            let got = attached(&api.get(name).await?);
            *last.lock().unwrap() = got.clone();
            Ok(got.and_then(|(s, r, m)| (s == status && r == why).then_some(m)))
        },
    )
    .await
    .unwrap_or_else(|err| panic!("{err}; last {:?}", last.lock().unwrap()))
}

/// The holders the ledger lists, as `namespace/name`.
fn holders(a: &IPAddress) -> BTreeSet<String> {
    a.holder_services().into_iter().collect()
}

async fn wait_holders(e: &Env, address: &str, want: &[String]) -> IPAddress {
    let want: BTreeSet<String> = want.iter().cloned().collect();
    e.wait_address(address, &format!("holders {want:?}"), |a| {
        a.is_some_and(|a| holders(a) == want)
    })
    .await
    .unwrap()
}

/// Waits until the claim counts `(attached, refused)` Services (`None`: none names it).
async fn wait_services(e: &Env, claim: &str, want: Option<(u32, u32)>) {
    e.wait_claim(
        claim,
        &format!("services (attached, refused) {want:?}"),
        |c| {
            let counted = c.status.as_ref().and_then(|s| s.services);
            counted.map(|s| (s.attached, s.refused)) == want
        },
    )
    .await;
}

async fn bound(e: &Env, claim: &str) -> (String, String) {
    let c = e
        .wait_claim(claim, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let a = &c.status.as_ref().unwrap().addresses[0];
    (a.name.clone(), a.address.clone())
}

async fn delete_service(e: &Env, ns: &str, name: &str) {
    services(e, ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&format!("Service {ns}/{name} gone"), WAIT, || async {
        Ok(services(e, ns).get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
}

/// Services share a claim's address port by port (TCP and UDP of one port too); a Service
/// wanting a port already held is refused with the reason and nothing else moves; the
/// first holder deleted, the others keep the address at every revision; a holder deleted
/// and recreated gets the same address back.
#[tokio::test]
async fn services_share_a_claims_address_port_by_port_and_the_first_holder_leaves_no_gap() {
    let mut e = env("share").await;
    purge(&e, &["198.18.100."]).await;
    let _drv = driver(&e, "share").await;
    let class = range_class(&mut e, "share", json!(["198.18.100.0/29"]), json!({})).await;
    let ns = e.ns.name.clone();
    let key = |n: &str| format!("{ns}/{n}");
    e.claim(
        "shop",
        json!({"className": class, "sharing": {"policy": "SameNamespace"}}),
    )
    .await;
    let (name, x) = bound(&e, "shop").await;

    // :80 and :443 on one address; TCP and UDP of port 53 too.
    service(&e, &ns, "web", "shop", &["TCP/80"], json!({})).await;
    wait_ingress(&e, &ns, "web", &[&x]).await;
    service(&e, &ns, "tls", "shop", &["TCP/443"], json!({})).await;
    service(&e, &ns, "dns-tcp", "shop", &["TCP/53"], json!({})).await;
    service(&e, &ns, "dns-udp", "shop", &["UDP/53"], json!({})).await;
    for s in ["tls", "dns-tcp", "dns-udp"] {
        wait_ingress(&e, &ns, s, &[&x]).await;
        let m = wait_condition(&e, &ns, s, "True", reason::ATTACHED).await;
        assert!(m.contains(&x), "{m}");
    }
    let a = wait_holders(
        &e,
        &name,
        &[key("web"), key("tls"), key("dns-tcp"), key("dns-udp")],
    )
    .await;
    let st = a.status.unwrap();
    assert_eq!(st.holder_count, Some(4));
    assert_eq!(
        st.associated_to.as_ref().map(|t| t.name.as_str()),
        Some("web"),
        "associatedTo keeps naming the first holder"
    );
    let tls = st.attachments.iter().find(|h| h.name == "tls").unwrap();
    assert_eq!(tls.ports, ["TCP/443"]);

    a_port_taken_refuses_only_that_service(&e, &x).await;

    the_first_holder_leaves_no_gap(&e, &name, &x).await;

    // Deleted and recreated, a holder gets the same address back.
    delete_service(&e, &ns, "tls").await;
    service(&e, &ns, "tls", "shop", &["TCP/443"], json!({})).await;
    wait_ingress(&e, &ns, "tls", &[&x]).await;
    for s in ["tls", "dns-tcp", "dns-udp", "clash"] {
        delete_service(&e, &ns, s).await;
    }
    wait_holders(&e, &name, &[]).await;
    wait_services(&e, "shop", None).await;
    e.check().await;
}

/// A third Service on :443 is refused with the reason, and nothing of the others moves; the
/// positive control: the port alone refused it — moved off :443, it is attached.
async fn a_port_taken_refuses_only_that_service(e: &Env, x: &str) {
    let ns = &e.ns.name;
    let key = |n: &str| format!("{ns}/{n}");
    service(e, ns, "clash", "shop", &["TCP/8443", "TCP/443"], json!({})).await;
    let m = wait_condition(e, ns, "clash", "False", reason::PORT_CONFLICT).await;
    assert!(
        m.contains("TCP/443") && m.contains(&key("tls")),
        "the condition names the port and the holder: {m}"
    );
    assert!(ingress(&services(e, ns).get("clash").await.unwrap()).is_empty());
    e.wait_event(ns, "clash", "AssociationRejected").await;
    wait_services(e, "shop", Some((4, 1))).await;
    // The positive control: the port alone refused it — moved off :443, it is attached.
    services(e, ns)
        .patch(
            "clash",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"ports": [{"name": "tcp-8443", "protocol": "TCP", "port": 8443}]}}),
            ),
        )
        .await
        .unwrap();
    wait_ingress(e, ns, "clash", &[x]).await;
    wait_condition(e, ns, "clash", "True", reason::ATTACHED).await;
    wait_services(e, "shop", Some((5, 0))).await;
    for s in ["web", "tls", "dns-tcp", "dns-udp"] {
        wait_ingress(e, ns, s, &[x]).await;
    }
}

/// The first holder deleted: the others keep the address at every revision (a watch on tls
/// up to a fence written after the handoff), and the next in the ledger's order is first.
/// (That order is the order of association: tls, dns-tcp and dns-udp were created within
/// one second, and a pass that finds them all unrecorded takes them oldest first, ties by
/// name — not necessarily tls next.)
async fn the_first_holder_leaves_no_gap(e: &Env, name: &str, x: &str) {
    let ns = &e.ns.name;
    let key = |n: &str| format!("{ns}/{n}");
    let ledger: Vec<String> = e
        .addresses()
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .attachments
        .iter()
        .map(|h| h.name.clone())
        .collect();
    assert_eq!(
        ledger.first().map(String::as_str),
        Some("web"),
        "{ledger:?}"
    );
    let next = ledger[1].clone();
    println!("the ledger before the first holder goes: {ledger:?}");
    let api = services(e, ns);
    let mut watch = api
        .watch(&WatchParams::default().fields("metadata.name=tls"), "0")
        .await
        .unwrap()
        .boxed();
    delete_service(e, ns, "web").await;
    let a = wait_holders(
        e,
        name,
        &[key("tls"), key("dns-tcp"), key("dns-udp"), key("clash")],
    )
    .await;
    assert_eq!(
        a.status.unwrap().associated_to.map(|t| t.name),
        Some(next.clone()),
        "the next holder is first now (the ledger was {ledger:?})"
    );
    // Fence: a label the test writes on tls after the handoff; everything before it was seen.
    api.patch(
        "tls",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"fence": "1"}}})),
    )
    .await
    .unwrap();
    let mut seen = 0;
    tokio::time::timeout(WAIT, async {
        while let Some(Ok(ev)) = watch.next().await {
            if let WatchEvent::Added(s) | WatchEvent::Modified(s) = ev {
                seen += 1;
                assert_eq!(
                    ingress(&s),
                    [x.to_string()],
                    "tls lost the address at {:?}",
                    s.metadata.resource_version
                );
                if s.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("fence"))
                {
                    return;
                }
            }
        }
    })
    .await
    .expect("the fence arrives");
    assert!(
        seen >= 2,
        "the watch saw tls before the fence (positive control): {seen}"
    );
}

#[tokio::test]
async fn another_namespace_attaches_only_by_the_claim_owners_grant() {
    let mut e = env("share-ns").await;
    purge(&e, &["198.18.101."]).await;
    let _drv = driver(&e, "share-ns").await;
    let class = range_class(&mut e, "share-ns", json!(["198.18.101.0/29"]), json!({})).await;
    let ns = e.ns.name.clone();
    let other = TestNamespace::create(&e.client, "share-blog")
        .await
        .unwrap();
    let blog = other.name.clone();
    e.claim(
        "shop",
        json!({"className": class, "sharing": {"policy": "SameNamespace"}}),
    )
    .await;
    let (name, x) = bound(&e, "shop").await;
    service(&e, &ns, "web", "shop", &["TCP/80"], json!({})).await;
    wait_ingress(&e, &ns, "web", &[&x]).await;

    // A Service of another namespace naming the claim: nothing without the owner's grant.
    let reference = format!("{ns}/shop");
    service(&e, &blog, "front", &reference, &["TCP/443"], json!({})).await;
    let m = wait_condition(&e, &blog, "front", "False", reason::NOT_SHARED).await;
    assert!(m.contains(&reference), "{m}");
    assert!(ingress(&services(&e, &blog).get("front").await.unwrap()).is_empty());

    // The owner's claim counts the refusal (the Service is never named there).
    wait_services(&e, "shop", Some((1, 1))).await;
    // The owner grants the namespace: attached; the ledger lists both.
    let claims: Api<IPAddressClaim> = e.claims();
    let grant = |policy: &str, namespaces: Vec<String>| json!({"spec": {"sharing": {"policy": policy, "namespaces": namespaces}}});
    claims
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(grant("Namespaces", vec![blog.clone()])),
        )
        .await
        .unwrap();
    wait_ingress(&e, &blog, "front", &[&x]).await;
    wait_condition(&e, &blog, "front", "True", reason::ATTACHED).await;
    wait_holders(&e, &name, &[format!("{ns}/web"), format!("{blog}/front")]).await;
    wait_services(&e, "shop", Some((2, 0))).await;

    // Withdrawn: taken off that Service only.
    claims
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"sharing": {"policy": "SameNamespace", "namespaces": null}}}),
            ),
        )
        .await
        .unwrap();
    wait_ingress(&e, &blog, "front", &[]).await;
    wait_condition(&e, &blog, "front", "False", reason::NOT_SHARED).await;
    wait_holders(&e, &name, &[format!("{ns}/web")]).await;
    wait_ingress(&e, &ns, "web", &[&x]).await;
    wait_services(&e, "shop", Some((1, 1))).await;

    // A Service author cannot grant itself: naming the claim from its own namespace finds
    // none there.
    service(&e, &blog, "sneaky", "shop", &["TCP/8080"], json!({})).await;
    wait_condition(&e, &blog, "sneaky", "False", reason::CLAIM_NOT_FOUND).await;
    service(&e, &blog, "garbled", "a/b/c", &["TCP/8081"], json!({})).await;
    wait_condition(
        &e,
        &blog,
        "garbled",
        "False",
        reason::INVALID_CLAIM_REFERENCE,
    )
    .await;

    // Sharing off: a second Service is refused as attached elsewhere.
    e.claim("solo", json!({"className": class})).await;
    let (_, y) = bound(&e, "solo").await;
    service(&e, &ns, "one", "solo", &["TCP/80"], json!({})).await;
    wait_ingress(&e, &ns, "one", &[&y]).await;
    service(&e, &ns, "two", "solo", &["TCP/443"], json!({})).await;
    let m = wait_condition(&e, &ns, "two", "False", reason::ATTACHED_ELSEWHERE).await;
    assert!(m.contains(&format!("{ns}/one")), "{m}");
    assert!(ingress(&services(&e, &ns).get("two").await.unwrap()).is_empty());
    wait_services(&e, "solo", Some((1, 1))).await;
    // The claim's owner turns sharing on: the second joins.
    claims
        .patch(
            "solo",
            &PatchParams::default(),
            &Patch::Merge(grant("SameNamespace", vec![])),
        )
        .await
        .unwrap();
    wait_ingress(&e, &ns, "two", &[&y]).await;
    wait_services(&e, "solo", Some((2, 0))).await;
    e.check().await;
    drop(other);
}

#[tokio::test]
async fn a_dual_claim_is_shared_by_two_dual_stack_services() {
    let mut e = env("share-dual").await;
    purge(&e, &["198.18.102.", "2001:db8:102::"]).await;
    let _drv = driver(&e, "share-dual").await;
    let class = range_class(
        &mut e,
        "share-dual",
        json!(["198.18.102.0/29", "2001:db8:102::/125"]),
        json!({}),
    )
    .await;
    let ns = e.ns.name.clone();
    e.claim(
        "both",
        json!({"className": class, "family": "Dual", "sharing": {"policy": "SameNamespace"}}),
    )
    .await;
    let c = e
        .wait_claim("both", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let mut ips: Vec<String> = c
        .status
        .unwrap()
        .addresses
        .iter()
        .map(|a| a.address.clone())
        .collect();
    ips.sort_by_key(|ip| ip.contains(':'));
    let dual =
        json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}});
    service(&e, &ns, "web", "both", &["TCP/80"], dual.clone()).await;
    service(&e, &ns, "tls", "both", &["TCP/443"], dual.clone()).await;
    let want: Vec<&str> = ips.iter().map(String::as_str).collect();
    wait_ingress(&e, &ns, "web", &want).await;
    wait_ingress(&e, &ns, "tls", &want).await;
    // An IPv6-only Service on :80 shares the IPv6 address's ports with both: refused.
    service(
        &e,
        &ns,
        "v6",
        "both",
        &["TCP/80"],
        json!({"spec": {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}}),
    )
    .await;
    wait_condition(&e, &ns, "v6", "False", reason::PORT_CONFLICT).await;
    e.check().await;
}
