//! Entitlements (SPEC §13) on the real control plane: which namespaces a class admits (its
//! namespaceSelector), how many addresses a namespace may hold (IPAddressQuota), that the
//! core refuses early and binds by itself once admitted, that it never takes an address
//! back, and that no driver provisions past a quota.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::time::Duration;

use address_controller_api::names::{PROVISIONER_ANNOTATION, reason};
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim, IPAddressQuota};
use address_controller_tests::env::{Env, WAIT, aphase, condition, env, phase, range_class};
use address_controller_tests::invariants::{Scope, check};
use address_controller_tests::{Cluster, ControllerProcess, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn bound_reason(c: &IPAddressClaim) -> String {
    condition(c, "Bound")
        .map(|x| x.reason.clone())
        .unwrap_or_default()
}

fn bound_message(c: &IPAddressClaim) -> String {
    condition(c, "Bound")
        .map(|x| x.message.clone())
        .unwrap_or_default()
}

async fn label_namespace(e: &Env, labels: Value) {
    let api: Api<Namespace> = Api::all(e.client.clone());
    api.patch(
        &e.ns.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": labels}})),
    )
    .await
    .unwrap();
}

fn quotas(e: &Env) -> Api<IPAddressQuota> {
    Api::namespaced(e.client.clone(), &e.ns.name)
}

/// Creates or replaces the namespace's quota `limits` (one quota object, `q`).
async fn set_quota(e: &Env, limits: Value) {
    let body = json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressQuota",
        "metadata": {"name": "q"}, "spec": {"limits": limits}});
    quotas(e)
        .patch(
            "q",
            &PatchParams::apply("entitlements-test").force(),
            &Patch::Apply(body),
        )
        .await
        .unwrap();
}

async fn wait_reason(e: &Env, name: &str, want: &'static str) -> IPAddressClaim {
    e.wait_claim(name, want, |c| {
        phase(c) == Some(ClaimPhase::Pending) && bound_reason(c) == want
    })
    .await
}

async fn wait_bound(e: &Env, name: &str) -> IPAddressClaim {
    e.wait_claim(name, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await
}

fn events_with(events: &[(String, String)], reason: &str) -> usize {
    events.iter().filter(|(r, _)| r == reason).count()
}

#[tokio::test]
async fn a_class_admits_namespaces_by_label_refuses_others_and_never_takes_an_address_back() {
    let mut e = env("entitle").await;
    let class = e
        .class(
            "gold",
            json!({"spec": {"namespaceSelector": {"matchLabels": {"tier": "gold"}}}}),
        )
        .await;
    let a = e.address("a", "192.0.2.60", &class, json!({})).await;
    e.address("b", "192.0.2.61", &class, json!({})).await;

    // Not admitted: Pending with a reason naming the class and why, one event, no stamp
    // (no driver is invited), and the free address stays free.
    e.claim("web", json!({"className": class})).await;
    let c = wait_reason(&e, "web", reason::NAMESPACE_NOT_ADMITTED).await;
    let m = bound_message(&c);
    assert!(
        m.contains(&format!("{class:?}")) && m.contains(&e.ns.name) && m.contains("tier=gold"),
        "{m}"
    );
    assert_eq!(c.annotations().get(PROVISIONER_ANNOTATION), None);
    e.barrier().await;
    let events = e.events(&e.ns.name, "web").await;
    assert_eq!(
        events_with(&events, reason::NAMESPACE_NOT_ADMITTED),
        1,
        "{events:?}"
    );
    let free = e.addresses().get(&a).await.unwrap();
    assert!(free.spec.claim_ref.is_none(), "never bound");
    // The invariant checker sees nothing wrong (a refused claim next to a free address is
    // not "pending with a free address") — and nothing stale.
    e.check().await;

    // Admitted later by a label: it binds by itself.
    label_namespace(&e, json!({"tier": "gold"})).await;
    let c = wait_bound(&e, "web").await;
    assert_eq!(c.status.unwrap().addresses[0].name, a);

    // Un-admitted again: the held address stays, the claim stays Bound; a new claim is
    // refused.
    label_namespace(&e, json!({"tier": null})).await;
    e.claim("api", json!({"className": class})).await;
    wait_reason(&e, "api", reason::NAMESPACE_NOT_ADMITTED).await;
    e.barrier().await;
    let web = e.claims().get("web").await.unwrap();
    assert_eq!(phase(&web), Some(ClaimPhase::Bound));
    let held = e.addresses().get(&a).await.unwrap();
    assert_eq!(aphase(Some(&held)), Some(AddressPhase::Bound));
    assert_eq!(held.spec.claim_ref.unwrap().name, "web");

    // The class widens its selector (matchExpressions): the waiting claim binds by itself.
    e.classes()
        .patch(
            &class,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"namespaceSelector": {"matchLabels": null,
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["frozen"]}]}}})),
        )
        .await
        .unwrap();
    wait_bound(&e, "api").await;

    // A selector the core could not evaluate is refused by the schema.
    let bad = e
        .classes()
        .patch(
            &class,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"namespaceSelector": {"matchExpressions":
                [{"key": "tier", "operator": "In"}]}}})),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("need values"), "{bad}");
    e.check().await;
}

/// A namespace's quota counts a Dual claim twice and Released addresses until they are
/// free; a claim past it waits (said on the claim, in an event, in the tenant's view and in
/// the metrics) and binds by itself when there is room; lowering the limit below usage
/// unbinds nothing; removing the quota lets every waiting claim bind.
#[tokio::test]
async fn quota_counts_a_dual_claim_twice_released_addresses_until_free_and_never_unbinds() {
    let mut e = env("quota").await;
    // This test's controller also serves the views (and its metrics are compared by the
    // invariant checker, quota gauges included).
    let (ctl, _, _) = e.serve_views().await;
    e.ctl = ctl;
    // Retained addresses come back by themselves after a short release delay.
    let class = e
        .class("pub", json!({"spec": {"releaseDelay": "3s"}}))
        .await;
    for i in 0..5 {
        e.address(
            &format!("v4-{i}"),
            &format!("192.0.2.{}", 70 + i),
            &class,
            json!({}),
        )
        .await;
    }
    e.address("v6-0", "2001:db8::70", &class, json!({})).await;
    e.address("v6-1", "2001:db8::71", &class, json!({})).await;
    set_quota(&e, json!([{"className": class, "addresses": 2}])).await;

    // Quota 2: a Dual claim takes both; an IPv4 claim would be a third.
    e.claim("dual", json!({"className": class, "family": "Dual"}))
        .await;
    wait_bound(&e, "dual").await;
    e.claim("v", json!({"className": class})).await;
    let c = wait_reason(&e, "v", reason::QUOTA_EXCEEDED).await;
    let m = bound_message(&c);
    assert!(
        m.contains(&format!(
            "IPAddressQuota {}/q allows 2 address(es)",
            e.ns.name
        )) && m.contains("holds 2 and the claim needs 1"),
        "{m}"
    );
    assert_eq!(c.annotations().get(PROVISIONER_ANNOTATION), None);
    let ev = e.wait_event(&e.ns.name, "v", reason::QUOTA_EXCEEDED).await;
    assert!(ev.contains("allows 2"), "{ev}");
    e.check().await;

    released_addresses_count_until_free(&e, &class).await;

    // Room for one more; the next waits; raising the limit lets it bind.
    e.claim("w", json!({"className": class})).await;
    wait_bound(&e, "w").await;
    e.claim("x", json!({"className": class})).await;
    wait_reason(&e, "x", reason::QUOTA_EXCEEDED).await;
    the_view_and_the_metrics_show_the_quota_full(&e, &class).await;
    set_quota(&e, json!([{"className": class, "addresses": 3}])).await;
    wait_bound(&e, "x").await;

    // Lowering the limit below usage takes nothing back; new claims wait.
    set_quota(&e, json!([{"className": class, "addresses": 1, "ipv6": 0}])).await;
    e.claim("y", json!({"className": class})).await;
    let y = wait_reason(&e, "y", reason::QUOTA_EXCEEDED).await;
    assert!(
        bound_message(&y).contains("holds 3"),
        "{}",
        bound_message(&y)
    );
    e.claim("z6", json!({"className": class, "family": "IPv6"}))
        .await;
    let z = wait_reason(&e, "z6", reason::QUOTA_EXCEEDED).await;
    assert!(
        bound_message(&z).contains("allows 0 IPv6 address(es)"),
        "{}",
        bound_message(&z)
    );
    e.barrier().await;
    for name in ["v", "w", "x"] {
        let c = e.claims().get(name).await.unwrap();
        assert_eq!(
            phase(&c),
            Some(ClaimPhase::Bound),
            "{name} kept its address"
        );
    }
    // The checker's positive control: the namespace is over its (lowered) limit, and that
    // is the only finding.
    let scope = Scope::of(&[e.ns.name.as_str()], &[class.as_str()]);
    let report = check(&e.client, &scope, Duration::from_secs(2), &[])
        .await
        .unwrap();
    let rules: Vec<&str> = report.violations.iter().map(|v| v.rule).collect();
    assert_eq!(rules, ["namespace-over-quota"], "{}", report.table());

    // The quota goes: every waiting claim binds.
    quotas(&e)
        .delete("q", &DeleteParams::default())
        .await
        .unwrap();
    wait_bound(&e, "y").await;
    wait_bound(&e, "z6").await;
    e.check().await;
}

/// Deleting the Dual claim: its addresses are Released and retained — still the
/// namespace's (billed) until the release delay frees them; then the waiting claim `v`
/// binds by itself. The positive control: it was still waiting while they were Released.
async fn released_addresses_count_until_free(e: &Env, class: &str) {
    e.claims()
        .delete("dual", &DeleteParams::default())
        .await
        .unwrap();
    let released = wait_for("both addresses Released", WAIT, || async {
        let list = e.addresses().list(&ListParams::default()).await?;
        let n = list
            .items
            .iter()
            .filter(|a| {
                a.spec.class_name == class && aphase(Some(a)) == Some(AddressPhase::Released)
            })
            .count();
        Ok((n == 2).then_some(()))
    })
    .await;
    let v = e.claims().get("v").await.unwrap();
    assert!(
        released.is_ok() && phase(&v) == Some(ClaimPhase::Pending),
        "v waited while the Released addresses counted: {released:?} {:?}",
        v.status
    );
    let v = wait_bound(e, "v").await;
    let events = e.events(&e.ns.name, "v").await;
    assert_eq!(
        events_with(&events, reason::QUOTA_EXCEEDED),
        1,
        "one event for the refusal: {events:?}"
    );
    assert_eq!(v.status.unwrap().addresses.len(), 1);
}

/// At the limit with one claim waiting: the tenant's view, `kubectl get -o wide`, the pool
/// and the metrics say so.
async fn the_view_and_the_metrics_show_the_quota_full(e: &Env, class: &str) {
    let view = wait_for("the namespace's view shows the quota", WAIT, || async {
        let raw = Cluster::get().kubectl_ok(&[
            "get",
            "--raw",
            &format!(
                "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{0}/namespaceaddresses/{0}",
                e.ns.name
            ),
        ])?;
        let v: Value = serde_json::from_str(&raw)?;
        let ent = v["entitlements"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["className"] == class).cloned());
        Ok(ent.filter(|x| x["quota"]["waitingClaims"] == 1))
    })
    .await
    .unwrap();
    assert_eq!(view["admitted"], true);
    assert_eq!(
        view["quota"],
        json!({"hard": {"addresses": 2}, "used": {"addresses": 2, "ipv4": 2, "ipv6": 0},
            "remaining": {"addresses": 0}, "waitingClaims": 1}),
        "{view:#}"
    );
    let wide = Cluster::get()
        .kubectl_ok(&["get", "namespaceaddresses", "-n", &e.ns.name, "-o", "wide"])
        .unwrap();
    assert!(wide.contains(&format!("{class} 2/2 (1 waiting)")), "{wide}");
    let pool = Cluster::get()
        .kubectl_ok(&[
            "get",
            "--raw",
            &format!("/apis/view.local.sdn.cozystack.io/v1alpha1/poolavailabilities/{class}"),
        ])
        .unwrap();
    let pool: Value = serde_json::from_str(&pool).unwrap();
    assert!(
        pool["admittedNamespaces"].as_i64().unwrap() >= 1,
        "{pool:#}"
    );
    let m = e.ctl.metrics().await.unwrap();
    let labels = format!(
        "class=\"{class}\",family=\"all\",namespace=\"{}\"",
        e.ns.name
    );
    for want in [
        format!("address_controller_quota_limit{{{labels}}} 2"),
        format!("address_controller_quota_used{{{labels}}} 2"),
        format!(
            "address_controller_quota_waiting_claims{{class=\"{class}\",namespace=\"{}\"}} 1",
            e.ns.name
        ),
    ] {
        assert!(m.lines().any(|l| l == want), "{want} not in:\n{m}");
    }
}

/// `status.reason` of an address.
fn released_reason(a: Option<&IPAddress>) -> Option<String> {
    a.and_then(|a| a.status.as_ref())
        .and_then(|s| s.reason.clone())
}

#[tokio::test]
async fn a_released_surplus_counts_toward_no_quota_also_once_its_claim_is_gone() {
    let mut e = env("surplusq").await;
    let class = e
        .class("pub", json!({"spec": {"releaseDelay": "1h"}}))
        .await;
    set_quota(&e, json!([{"className": class, "addresses": 2}])).await;
    let first = e.address("a1", "192.0.2.80", &class, json!({})).await;
    e.claim("c1", json!({"className": class})).await;
    let c1 = wait_bound(&e, "c1").await;
    // A driver's create that lost the race with the core (SPEC §5.7): pre-bound to c1,
    // which already holds an IPv4 address. The core releases it as surplus.
    let late = e
        .address(
            "late",
            "192.0.2.81",
            &class,
            json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": "c1", "uid": c1.metadata.uid}}}),
        )
        .await;
    e.wait_event(&e.ns.name, "c1", "SurplusAddress").await;
    e.wait_address(&late, "Released as Surplus", |a| {
        aphase(a) == Some(AddressPhase::Released)
            && released_reason(a).as_deref() == Some("Surplus")
    })
    .await;
    // Quota 2, the namespace holds c1's address and a surplus nobody asked for: the next
    // claim binds (it waited out the release delay, an hour, when surplus counted).
    let second = e.address("a2", "192.0.2.82", &class, json!({})).await;
    e.claim("c2", json!({"className": class})).await;
    let c2 = wait_bound(&e, "c2").await;
    assert_eq!(
        c2.status
            .unwrap()
            .addresses
            .iter()
            .map(|a| a.name.clone())
            .collect::<Vec<_>>(),
        [second]
    );
    e.check().await;

    // c1 goes: its address is Released and retained (Reclaimed, still the namespace's); the
    // surplus stays surplus — nothing can tell it from a grant but its reason — so the
    // namespace holds 2 of 2, not 3.
    e.claims()
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&first, "Released as Reclaimed", |a| {
        aphase(a) == Some(AddressPhase::Released)
            && released_reason(a).as_deref() == Some("Reclaimed")
    })
    .await;
    let l = e.addresses().get(&late).await.unwrap();
    assert_eq!(released_reason(Some(&l)).as_deref(), Some("Surplus"));
    assert_eq!(
        l.spec.claim_ref.as_ref().map(|r| r.name.as_str()),
        Some("c1")
    );
    // The positive control: a Released address that was granted still counts — a third
    // claim waits, with a free address there for it.
    e.address("a3", "192.0.2.83", &class, json!({})).await;
    e.claim("c3", json!({"className": class})).await;
    let c3 = wait_reason(&e, "c3", reason::QUOTA_EXCEEDED).await;
    assert!(
        bound_message(&c3).contains("holds 2 and the claim needs 1"),
        "{}",
        bound_message(&c3)
    );
    e.check().await;
}

#[tokio::test]
async fn no_driver_provisions_past_the_quota_even_for_claims_created_at_once() {
    let mut e = env("quota-drv").await;
    let class = range_class(
        &mut e,
        "rng",
        json!(["198.51.100.0/28"]),
        json!({"spec": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    let _driver =
        ControllerProcess::driver(&format!("drv-quota-{}", e.sfx), &["--leader-elect=false"])
            .await
            .unwrap();
    set_quota(&e, json!([{"className": class, "ipv4": 2}])).await;
    // Six claims at once, no free address: the core invites a driver for two of them only.
    let api = e.claims();
    let creates = (0..6).map(|i| {
        let api = api.clone();
        let class = class.clone();
        async move {
            let c: IPAddressClaim = serde_json::from_value(
                json!({"metadata": {"name": format!("c{i}")}, "spec": {"className": class}}),
            )
            .unwrap();
            api.create(&PostParams::default(), &c).await.unwrap();
        }
    });
    futures::future::join_all(creates).await;
    let counts = || async {
        let list = e.claims().list(&ListParams::default()).await.unwrap();
        let bound = list
            .items
            .iter()
            .filter(|c| phase(c) == Some(ClaimPhase::Bound))
            .count();
        let refused = list
            .items
            .iter()
            .filter(|c| bound_reason(c) == reason::QUOTA_EXCEEDED)
            .count();
        (bound, refused)
    };
    wait_for("two bound, four refused", WAIT, || async {
        Ok((counts().await == (2, 4)).then_some(()))
    })
    .await
    .unwrap();
    e.barrier().await;
    let of_class = |items: Vec<IPAddress>| {
        items
            .into_iter()
            .filter(|a| a.spec.class_name == class)
            .count()
    };
    let n = of_class(
        e.addresses()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    assert_eq!(n, 2, "the driver provisioned exactly the quota");

    // Freeing one (Delete policy: the address goes) lets exactly one more bind.
    let bound: Vec<String> = e
        .claims()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| phase(c) == Some(ClaimPhase::Bound))
        .map(|c| c.name_any())
        .collect();
    e.claims()
        .delete(&bound[0], &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone(&bound[0]).await;
    wait_for("two bound, three refused", WAIT, || async {
        Ok((counts().await == (2, 3)).then_some(()))
    })
    .await
    .unwrap();
    e.barrier().await;
    let n = of_class(
        e.addresses()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    assert_eq!(n, 2);
    e.check().await;
}

#[tokio::test]
async fn an_auto_claim_class_gives_no_address_to_a_namespace_it_does_not_admit() {
    let mut e = env("entitle-auto").await;
    let class = e
        .class(
            "auto",
            json!({"metadata": {"annotations": {"ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class": "true"}},
                "spec": {"namespaceSelector": {"matchLabels": {"tier": "gold"}}}}),
        )
        .await;
    e.address("a", "192.0.2.90", &class, json!({})).await;
    let services: Api<Service> = Api::namespaced(e.client.clone(), &e.ns.name);
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let note = e
        .wait_event(&e.ns.name, "web", "AutoClaimNamespaceNotAdmitted")
        .await;
    assert!(
        note.contains("does not admit") && note.contains("no claim created"),
        "{note}"
    );
    e.barrier().await;
    assert!(
        e.claims().get_opt("web").await.unwrap().is_none(),
        "no claim"
    );
    // Admitted: the auto-claim is created and bound.
    label_namespace(&e, json!({"tier": "gold"})).await;
    wait_bound(&e, "web").await;
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.check().await;
}
