//! Auto-claims for LoadBalancer Services (SPEC §7) on the real control plane, with the
//! controller-manager's garbage collector deleting owned claims.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_api::{AddressPhase, ClaimPhase, IPAddressClaim};
use address_controller_tests::env::{Env, WAIT, aphase, env, phase};
use address_controller_tests::{ControllerProcess, FIELD_MANAGER, wait_for};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const AUTO: &str = "ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class";
const CLAIM: &str = "local.sdn.cozystack.io/ip-address-claim";

fn auto_class() -> Value {
    json!({"metadata": {"annotations": {AUTO: "true"}}})
}

/// Service helpers, as an extension of the shared test environment.
trait Services {
    fn services(&self) -> Api<Service>;
    async fn service(&self, name: &str, extra: Value) -> Service;
    async fn wait_service(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&Service) -> bool,
    ) -> Service;
    async fn claim_opt(&self, name: &str) -> Option<IPAddressClaim>;
}
impl Services for Env {
    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }
    async fn service(&self, name: &str, extra: Value) -> Service {
        let mut v = json!({"metadata": {"name": name},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        address_controller_tests::env::merge(&mut v, extra);
        self.services()
            .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap()
    }
    async fn wait_service(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&Service) -> bool,
    ) -> Service {
        let api = self.services();
        wait_for(&format!("Service {name}: {what}"), WAIT, || {
            let api = api.clone();
            let pred = &pred;
            async move {
                let s = api.get(name).await?;
                Ok(pred(&s).then_some(s))
            }
        })
        .await
        .unwrap()
    }
    async fn claim_opt(&self, name: &str) -> Option<IPAddressClaim> {
        self.claims().get_opt(name).await.unwrap()
    }
}

fn names_claim(s: &Service) -> Option<&str> {
    s.annotations().get(CLAIM).map(String::as_str)
}

#[tokio::test]
async fn skip_rules_leave_services_alone() {
    let mut e = env("ac-skip").await;
    e.class("auto", auto_class()).await;
    let cases = [
        ("cluster-ip", json!({"spec": {"type": "ClusterIP"}})),
        (
            "names-claim",
            json!({"metadata": {"annotations": {CLAIM: "elsewhere"}}}),
        ),
        (
            "opted-out",
            json!({"metadata": {"annotations": {"local.sdn.cozystack.io/auto-claim": "false"}}}),
        ),
        (
            "lb-class",
            json!({"spec": {"loadBalancerClass": "example.com/other-lb"}}),
        ),
        ("lb-ip", json!({"spec": {"loadBalancerIP": "192.0.2.200"}})),
        (
            "metallb-pool",
            json!({"metadata": {"annotations": {"metallb.io/address-pool": "p"}}}),
        ),
        (
            "metallb-ips",
            json!({"metadata": {"annotations": {"metallb.io/loadBalancerIPs": "192.0.2.1"}}}),
        ),
        (
            "metallb-shared",
            json!({"metadata": {"annotations": {"metallb.io/allow-shared-ip": "k"}}}),
        ),
        (
            "metallb-old-pool",
            json!({"metadata": {"annotations": {"metallb.universe.tf/address-pool": "p"}}}),
        ),
        (
            "metallb-old-ips",
            json!({"metadata": {"annotations": {"metallb.universe.tf/loadBalancerIPs": "192.0.2.1"}}}),
        ),
        (
            "metallb-old-shared",
            json!({"metadata": {"annotations": {"metallb.universe.tf/allow-shared-ip": "k"}}}),
        ),
    ];
    for (name, extra) in &cases {
        e.service(name, extra.clone()).await;
    }
    // Already has an address: opted out while the status is set, then opted back in.
    e.service(
        "has-ingress",
        json!({"metadata": {"annotations": {"local.sdn.cozystack.io/auto-claim": "false"}}}),
    )
    .await;
    e.services()
        .patch_status(
            "has-ingress",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.201"}]}}}),
            ),
        )
        .await
        .unwrap();
    e.services()
        .patch(
            "has-ingress",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"local.sdn.cozystack.io/auto-claim": null}}}),
            ),
        )
        .await
        .unwrap();
    // The positive control, created last: once it is handled, the others were seen too.
    e.service("plain", json!({})).await;
    e.wait_service("plain", "annotated", |s| names_claim(s) == Some("plain"))
        .await;
    e.barrier().await;
    for name in cases.iter().map(|(n, _)| *n).chain(["has-ingress"]) {
        assert!(
            e.claim_opt(name).await.is_none(),
            "{name}: a claim was created"
        );
        let s = e.services().get(name).await.unwrap();
        let expected = if name == "names-claim" {
            Some("elsewhere")
        } else {
            None
        };
        assert_eq!(names_claim(&s), expected, "{name}: annotation written");
    }
    // Nothing was written to skipped Services by the controller (the barrier's claim aside).
    let writes = address_controller_tests::audited_writes(&e.ctl.user, |w| {
        w.namespace.as_deref() == Some(e.ns.name.as_str())
            && !w
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(address_controller_tests::env::BARRIER))
    })
    .unwrap();
    assert!(
        writes.iter().all(|w| w.name.as_deref() == Some("plain")),
        "{writes:?}"
    );
    e.check().await;
}

#[tokio::test]
async fn class_selection_and_family_mapping() {
    let mut e = env("ac-class").await;
    // No auto-claim class: nothing happens; a Service naming a class still gets a claim.
    let named = e.class("named", json!({})).await;
    e.service("no-auto", json!({})).await;
    e.service(
        "by-annotation",
        json!({"metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-class": named}}}),
    )
    .await;
    e.wait_service("by-annotation", "annotated", |s| names_claim(s).is_some())
        .await;
    let c = e.claim_opt("by-annotation").await.unwrap();
    assert_eq!(c.spec.class_name.as_deref(), Some(named.as_str()));
    assert!(e.claim_opt("no-auto").await.is_none());

    // A named class that does not exist: a warning, then a claim once it appears.
    let later = e.name("later");
    e.service(
        "waits",
        json!({"metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-class": later}}}),
    )
    .await;
    e.wait_event(&e.ns.name, "waits", "AutoClaimClassNotFound")
        .await;
    assert!(e.claim_opt("waits").await.is_none());
    e.class("later", json!({})).await;
    e.wait_service("waits", "annotated once the class exists", |s| {
        names_claim(s).is_some()
    })
    .await;

    // One auto-claim class: used, with the Service's families.
    let auto = e.class("auto", auto_class()).await;
    e.wait_service(
        "no-auto",
        "annotated once an auto-claim class exists",
        |s| names_claim(s).is_some(),
    )
    .await;
    for (name, spec, family) in [
        (
            "v4",
            json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"]}),
            "IPv4",
        ),
        (
            "v6",
            json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}),
            "IPv6",
        ),
        (
            "dual",
            json!({"ipFamilyPolicy": "RequireDualStack"}),
            "Dual",
        ),
    ] {
        e.service(name, json!({"spec": spec})).await;
        e.wait_service(name, "annotated", |s| names_claim(s) == Some(name))
            .await;
        let c = e.claim_opt(name).await.unwrap();
        assert_eq!(
            (c.spec.family.as_str(), c.spec.class_name.as_deref()),
            (family, Some(auto.as_str())),
            "{name}"
        );
    }

    // Two auto-claim classes: never guess.
    e.class("auto2", auto_class()).await;
    e.service("ambiguous", json!({})).await;
    let note = e
        .wait_event(&e.ns.name, "ambiguous", "AmbiguousAutoClaimClass")
        .await;
    assert!(note.contains(&auto), "{note}");
    assert!(e.claim_opt("ambiguous").await.is_none());
    e.check().await;
}

#[tokio::test]
async fn bad_input_is_reported_and_nothing_is_half_written() {
    let mut e = env("ac-bad").await;
    e.class("auto", auto_class()).await;
    e.service("bad-class", json!({"metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-class": "Not_A_Class"}}})).await;
    e.service(
        "bad-opt-out",
        json!({"metadata": {"annotations": {"local.sdn.cozystack.io/auto-claim": "no"}}}),
    )
    .await;
    let v4_only = e.class("v4-only", json!({})).await;
    e.classes()
        .patch_status(
            &v4_only,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"ipv4": 14, "ipv6": 0}}})),
        )
        .await
        .unwrap();
    e.service(
        "dual-on-v4",
        json!({"metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-class": v4_only}},
        "spec": {"ipFamilyPolicy": "RequireDualStack"}}),
    )
    .await;
    for (svc, reason) in [
        ("bad-class", "InvalidAutoClaimAnnotation"),
        ("bad-opt-out", "InvalidAutoClaimAnnotation"),
        ("dual-on-v4", "AutoClaimFamilyUnsupported"),
    ] {
        e.wait_event(&e.ns.name, svc, reason).await;
        assert!(e.claim_opt(svc).await.is_none(), "{svc}");
        assert_eq!(
            names_claim(&e.services().get(svc).await.unwrap()),
            None,
            "{svc}"
        );
    }
    // Events on transitions only: still one of each after more passes.
    e.services()
        .patch(
            "bad-class",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    e.barrier().await;
    let n = e
        .events(&e.ns.name, "bad-class")
        .await
        .into_iter()
        .filter(|(r, _)| r == "InvalidAutoClaimAnnotation")
        .count();
    assert_eq!(n, 1);
    e.check().await;
}

#[tokio::test]
async fn name_collisions_are_never_taken_over() {
    let mut e = env("ac-taken").await;
    e.class("auto", auto_class()).await;
    e.claim("web", json!({"className": "someone-elses"})).await;
    e.service("web", json!({})).await;
    e.wait_event(&e.ns.name, "web", "AutoClaimNameTaken").await;
    let c = e.claim_opt("web").await.unwrap();
    assert!(c.owner_references().is_empty(), "not adopted");
    assert_eq!(c.spec.class_name.as_deref(), Some("someone-elses"));
    assert_eq!(names_claim(&e.services().get("web").await.unwrap()), None);
    e.check().await;
}

/// The generated ClusterRole, bound to `user`: the controller runs with nothing else.
async fn grant_generated_role(e: &Env, user: &str) {
    let yaml = std::fs::read_to_string(
        address_controller_tests::repo_root()
            .join("chart/address-controller/files/controller-role.yaml"),
    )
    .unwrap();
    // The first document is the ClusterRole (the Role of the release namespace follows).
    let first = yaml.split("\n---\n").next().unwrap();
    let mut role: ClusterRole = serde_yaml::from_str(first).unwrap();
    let role_name = format!("address-controller-{}", e.sfx);
    role.metadata.name = Some(role_name.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Api::<ClusterRole>::all(e.client.clone())
        .patch(&role_name, &params, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]}))
    .unwrap();
    Api::<ClusterRoleBinding>::all(e.client.clone())
        .patch(&role_name, &params, &Patch::Apply(&binding))
        .await
        .unwrap();
}

#[tokio::test]
async fn lifecycle_with_garbage_collection_under_the_generated_role() {
    let mut e = env("ac-life").await;
    // This test's controller has exactly the chart's ClusterRole, not system:masters.
    e.ctl.kill();
    let user = format!("ctl-rbac-{}", e.sfx);
    grant_generated_role(&e, &user).await;
    let ctl = ControllerProcess::start_as(&user, &[], &["--leader-elect=false"])
        .await
        .unwrap();
    let auto = e.class("auto", auto_class()).await; // Retain by default
    let a = e.address("a", "192.0.2.150", &auto, json!({})).await;
    let b = e.address("b", "192.0.2.151", &auto, json!({})).await;
    for x in [&a, &b] {
        e.wait_address(x, "Available", |x| {
            aphase(x) == Some(AddressPhase::Available)
        })
        .await;
    }

    let svc = e.service("web", json!({})).await;
    e.wait_service("web", "annotated", |s| names_claim(s) == Some("web"))
        .await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let owner = &c.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Service", "web", svc.metadata.uid.as_deref().unwrap())
    );
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    e.wait_event(&e.ns.name, "web", "AutoClaimCreated").await;
    // Whichever address the claim got, the other one serves the second half of the test.
    let held = c.status.as_ref().unwrap().addresses[0].name.clone();
    let (a, b) = if held == a { (a, b) } else { (b, a) };

    // Restart: nothing created twice, nothing written at rest.
    drop(ctl);
    let again_user = format!("ctl-rbac2-{}", e.sfx);
    grant_generated_role(&e, &again_user).await;
    let _again = ControllerProcess::start_as(&again_user, &[], &["--leader-elect=false"])
        .await
        .unwrap();
    e.barrier().await;
    assert!(
        e.writes(&again_user).is_empty(),
        "{:?}",
        e.writes(&again_user)
    );
    assert_eq!(
        e.claims()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Deleting the Service deletes the claim (garbage collector). The address is an
    // admin's static one, not provisioned for this claim: its Retain holds (SPEC §6; an
    // address a driver provisioned for the auto-claim goes with it, tests/tests/hostile.rs).
    e.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("web").await;
    e.wait_address(&a, "Released under its Retain", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;

    // An auto-claim whose owner reference was removed is an ordinary claim: Retain applies.
    e.service("kept", json!({})).await;
    e.wait_claim("kept", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
        )
        .await
        .unwrap();
    // The positive control: a sibling whose claim is still owned, its Service deleted in
    // the same moment — the garbage collector collects it, so it did run in the window
    // in which the unowned claim must survive.
    e.service("owned", json!({})).await;
    e.wait_claim("owned", "created for its Service", |c| {
        c.owner_references().iter().any(|r| r.kind == "Service")
    })
    .await;
    for s in ["kept", "owned"] {
        e.services()
            .delete(s, &DeleteParams::default())
            .await
            .unwrap();
    }
    e.wait_claim_gone("owned").await;
    e.barrier().await;
    assert_eq!(
        phase(&e.claims().get("kept").await.unwrap()),
        Some(ClaimPhase::Bound),
        "the claim survives its Service"
    );
    e.claims()
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    let released = e
        .wait_address(&b, "Released", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
    assert_eq!(released.spec.claim_ref.unwrap().name, "kept");
    e.check().await;
}

#[tokio::test]
async fn a_service_that_stops_being_a_load_balancer_keeps_its_claim() {
    let mut e = env("ac-type").await;
    let auto = e.class("auto", auto_class()).await;
    e.address("a", "192.0.2.160", &auto, json!({})).await;
    e.service("web", json!({})).await;
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.services()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    let note = e
        .wait_event(&e.ns.name, "web", "NoLongerLoadBalancer")
        .await;
    assert!(note.contains("kept"), "{note}");
    e.barrier().await;
    assert_eq!(
        phase(&e.claims().get("web").await.unwrap()),
        Some(ClaimPhase::Bound)
    );
    // A crash between creating the claim and annotating the Service is repaired: take the
    // annotation away from a LoadBalancer Service whose owned claim exists.
    e.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"type": "LoadBalancer"}, "metadata": {"annotations": {CLAIM: null}}})))
        .await
        .unwrap();
    e.wait_service("web", "annotated again", |s| names_claim(s) == Some("web"))
        .await;
    assert_eq!(
        e.claims()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    e.check().await;
}
