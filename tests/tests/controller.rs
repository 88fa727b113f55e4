//! The core controller (`address-controller run`) against the real control plane: every
//! row of SPEC §4–§6, zero writes at rest (also across a restart), leader election, crash
//! recovery, and the ledger metrics.
//!
//! Controllers watch the whole cluster, so the tests of this file run one at a time.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use address_controller_api::names::{HELD_ANNOTATION, PROVISIONER_ANNOTATION};
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::env::{Env, WAIT, aphase, condition, count, env, phase};
use address_controller_tests::{ControllerProcess, audited_writes, sample, wait_for};
use futures::StreamExt;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;

// ---- binding ------------------------------------------------------------------------------

#[tokio::test]
async fn static_binding_costs_four_writes_and_converges_to_zero_also_after_restart() {
    let mut e = env("bind").await;
    let class = e.class("pub", json!({})).await;
    let a = e.address("a", "192.0.2.10", &class, json!({})).await;
    let b = e.address("b", "192.0.2.11", &class, json!({})).await;
    e.wait_address(&b, "Available", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;
    e.wait_address(&a, "Available", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;
    let before = e.writes(&e.ctl.user).len();

    e.claim("web", json!({"className": class})).await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let s = c.status.clone().unwrap();
    assert_eq!(s.class_name.as_deref(), Some(class.as_str()));
    assert_eq!(s.addresses.len(), 1);
    assert_eq!(s.addresses[0].name, a, "the lowest name wins");
    // A claim bound to a free address is never stamped: no driver is asked to provision
    // a second address for it (SPEC §5.7).
    assert_eq!(c.annotations().get(PROVISIONER_ANNOTATION), None);
    assert!(
        c.finalizers()
            .iter()
            .any(|f| f == "local.sdn.cozystack.io/claim-protection")
    );
    let generation = c.metadata.generation;
    for t in ["ClassResolved", "Bound"] {
        let cond = condition(&c, t).unwrap();
        assert_eq!(
            (cond.status.as_str(), cond.observed_generation),
            ("True", generation),
            "{t}"
        );
    }
    let addr = e
        .wait_address(&a, "Bound", |x| aphase(x) == Some(AddressPhase::Bound))
        .await
        .unwrap();
    let r = addr.spec.claim_ref.unwrap();
    assert_eq!(
        (r.namespace.as_str(), r.name.as_str(), r.uid.as_deref()),
        (e.ns.name.as_str(), "web", c.metadata.uid.as_deref())
    );
    assert_eq!(
        aphase(e.addresses().get_opt(&b).await.unwrap().as_ref()),
        Some(AddressPhase::Available)
    );
    e.wait_event(&e.ns.name, "web", "Matched").await;

    // Writes for one static bind: claim metadata + claim status, address spec + status.
    let want: BTreeMap<String, usize> = [
        ("patch ipaddressclaims", 1),
        ("patch ipaddressclaims/status", 1),
        ("patch ipaddresses", 1),
        ("patch ipaddresses/status", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    wait_for("the bind's writes", WAIT, || async {
        let bind = count(&e.writes(&e.ctl.user)[before..]);
        if bind == want {
            Ok(Some(()))
        } else {
            Err(anyhow::anyhow!("{bind:?}"))
        }
    })
    .await
    .unwrap();
    println!("writes per static bind: {want:?}");

    // At rest: zero writes, up to a barrier (everything before it was seen and handled).
    let settled = e.writes(&e.ctl.user).len();
    e.barrier().await;
    assert_eq!(
        e.writes(&e.ctl.user).len(),
        settled,
        "a converged system writes nothing"
    );

    // Across a restart: a new process re-examines everything and writes nothing (up to a
    // barrier it handled after its start-up pass). The old one exits at once on SIGTERM:
    // its watches do not hold it for the 10 s of grace (they did, every rolling update).
    let took = e.ctl.stop();
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM → exit took {took:?}"
    );
    let user = format!("ctl-bind-restart-{}", e.sfx);
    let again = ControllerProcess::start(&user, &["--leader-elect=false"])
        .await
        .unwrap();
    e.barrier().await;
    assert!(
        e.writes(&user).is_empty(),
        "restart wrote: {:?}",
        e.writes(&user)
    );
    let m = again.metrics().await.unwrap();
    assert!(
        m.contains("address_controller_reconcile_total{controller=\"claim\",result=\"success\"}"),
        "{m}"
    );
    e.check().await;
}

#[tokio::test]
async fn class_resolution_failures_are_reported_and_recovered() {
    let mut e = env("classes").await;
    e.claim("named", json!({"className": e.name("missing")}))
        .await;
    let c = e
        .wait_claim("named", "ClassNotFound", |c| {
            condition(c, "ClassResolved").is_some_and(|x| x.reason == "ClassNotFound")
        })
        .await;
    assert_eq!(phase(&c), Some(ClaimPhase::Pending));
    e.wait_event(&e.ns.name, "named", "ClassNotFound").await;

    // The class appears: the claim resolves and waits for the driver.
    let class = e.class("missing", json!({})).await;
    let c = e
        .wait_claim("named", "resolved", |c| {
            condition(c, "ClassResolved").is_some_and(|x| x.status == "True")
        })
        .await;
    assert_eq!(
        c.status.as_ref().unwrap().class_name.as_deref(),
        Some(class.as_str())
    );
    let bound = condition(&c, "Bound").unwrap();
    assert_eq!(bound.reason, "WaitingForProvisioning");
    assert!(
        bound.message.contains("missing.drivers.test"),
        "{}",
        bound.message
    );

    // No default class, then two of them, then exactly one.
    e.claim("defaulted", json!({})).await;
    e.wait_claim("defaulted", "NoDefaultClass", |c| {
        condition(c, "ClassResolved").is_some_and(|x| x.reason == "NoDefaultClass")
    })
    .await;
    let default = json!({"metadata": {"annotations": {"ipaddressclass.local.sdn.cozystack.io/is-default-class": "true"}}});
    let d1 = e.class("d1", default.clone()).await;
    let d2 = e.class("d2", default).await;
    // A claim created while two defaults exist never guesses.
    e.claim("multi", json!({})).await;
    let c = e
        .wait_claim("multi", "MultipleDefaultClasses", |c| {
            condition(c, "ClassResolved").is_some_and(|x| x.reason == "MultipleDefaultClasses")
        })
        .await;
    let message = &condition(&c, "ClassResolved").unwrap().message;
    assert!(message.contains(&d1) && message.contains(&d2), "{message}");
    e.wait_event(&e.ns.name, "multi", "MultipleDefaultClasses")
        .await;
    e.classes()
        .delete(&d2, &DeleteParams::default())
        .await
        .unwrap();
    let c = e
        .wait_claim("multi", "resolved to d1", |c| {
            c.status.as_ref().and_then(|s| s.class_name.as_deref()) == Some(d1.as_str())
        })
        .await;
    assert_eq!(
        c.annotations()
            .get(PROVISIONER_ANNOTATION)
            .map(String::as_str),
        Some("d1.drivers.test")
    );
    e.wait_claim("defaulted", "resolved to d1", |c| {
        c.status.as_ref().and_then(|s| s.class_name.as_deref()) == Some(d1.as_str())
    })
    .await;

    // Sticky: marking another default later does not move the claim.
    e.classes()
        .patch(&d1, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"ipaddressclass.local.sdn.cozystack.io/is-default-class": null}}})))
        .await
        .unwrap();
    e.barrier().await;
    let c = e.claims().get("multi").await.unwrap();
    assert_eq!(
        c.status.as_ref().and_then(|s| s.class_name.as_deref()),
        Some(d1.as_str())
    );
    assert_eq!(condition(&c, "ClassResolved").unwrap().status, "True");
    e.check().await;
}

#[tokio::test]
async fn pinned_address_waits_with_a_reason_then_binds() {
    let mut e = env("pin").await;
    let class = e.class("pub", json!({})).await;
    let other = e.class("other", json!({})).await;
    let wrong_class = e.address("wc", "192.0.2.20", &other, json!({})).await;
    let v6 = e.address("v6", "2001:db8::20", &class, json!({})).await;

    for (claim, pin, want) in [
        ("missing", e.name("nope"), "does not exist"),
        ("wrong-class", wrong_class.clone(), "belongs to class"),
        ("wrong-family", v6.clone(), "is IPv6; the claim wants IPv4"),
    ] {
        e.claim(claim, json!({"className": class, "addressName": pin}))
            .await;
        let c = e
            .wait_claim(claim, "WaitingForAddress", |c| {
                condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForAddress")
            })
            .await;
        let msg = &condition(&c, "Bound").unwrap().message;
        assert!(msg.contains(want), "{claim}: {msg}");
    }

    // Bound elsewhere: another claim holds it.
    let held = e.address("held", "192.0.2.21", &class, json!({})).await;
    e.claim("first", json!({"className": class, "addressName": held}))
        .await;
    e.wait_claim("first", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claim("second", json!({"className": class, "addressName": held}))
        .await;
    let c = e
        .wait_claim("second", "WaitingForAddress", |c| {
            condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForAddress")
        })
        .await;
    // A claim of its own namespace is named (another namespace's never:
    // hostile::pinning_names_maps_nobodys_holdings); the admin reads it on the address.
    let message = &condition(&c, "Bound").unwrap().message;
    assert!(
        message.contains(&format!("already bound to claim {}/first", e.ns.name)),
        "{message}"
    );
    let note = e.wait_event("default", &held, "PinRefused").await;
    assert!(
        note.contains(&format!("bound to claim {}/first", e.ns.name)),
        "{note}"
    );

    // Conflict (driver-owned) on a free address is refused too.
    let conflicted = e.address("conflict", "192.0.2.22", &class, json!({})).await;
    e.wait_address(&conflicted, "Available", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;
    e.addresses()
        .patch_status(
            &conflicted,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Conflict"}})),
        )
        .await
        .unwrap();
    e.claim(
        "conflicted",
        json!({"className": class, "addressName": conflicted}),
    )
    .await;
    let c = e
        .wait_claim("conflicted", "WaitingForAddress", |c| {
            condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForAddress")
        })
        .await;
    assert!(
        condition(&c, "Bound")
            .unwrap()
            .message
            .contains("in phase Conflict")
    );

    // The missing one appears: the claim binds exactly it.
    let late = e.address("nope", "192.0.2.23", &class, json!({})).await;
    let c = e
        .wait_claim("missing", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(c.status.unwrap().addresses[0].name, late);
    e.check().await;
}

#[tokio::test]
async fn dual_claims_bind_both_families_and_prebindings_are_completed() {
    let mut e = env("dual").await;
    let class = e.class("pub", json!({})).await;
    let v4 = e.address("v4", "192.0.2.30", &class, json!({})).await;
    e.claim("dual", json!({"className": class, "family": "Dual"}))
        .await;
    let c = e
        .wait_claim("dual", "Pending with v4", |c| {
            c.status.as_ref().is_some_and(|s| s.addresses.len() == 1)
        })
        .await;
    assert_eq!(phase(&c), Some(ClaimPhase::Pending));
    assert!(condition(&c, "Bound").unwrap().message.contains("IPv6"));
    let v6 = e.address("v6", "2001:db8::30", &class, json!({})).await;
    let c = e
        .wait_claim("dual", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let names: Vec<String> = c
        .status
        .unwrap()
        .addresses
        .into_iter()
        .map(|a| a.name)
        .collect();
    let mut want = vec![v4, v6];
    want.sort();
    assert_eq!(names, want);

    // A driver pre-binds an address without the uid: the core completes it.
    let claim = e
        .claim("prebound", json!({"className": class, "family": "IPv6"}))
        .await;
    let pre = e
        .address(
            "pre",
            "2001:db8::31",
            &class,
            json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": "prebound"}}}),
        )
        .await;
    let a = e
        .wait_address(&pre, "uid completed and Bound", |x| {
            x.is_some_and(|a| {
                a.spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref())
                    == claim.metadata.uid.as_deref()
            }) && aphase(x) == Some(AddressPhase::Bound)
        })
        .await;
    assert!(a.is_some());
    e.wait_claim("prebound", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.check().await;
}

#[tokio::test]
async fn lost_is_surfaced_not_replaced_and_recovers() {
    let mut e = env("lost").await;
    let class = e.class("pub", json!({})).await;
    let a = e.address("a", "192.0.2.40", &class, json!({})).await;
    e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let spare = e.address("spare", "192.0.2.41", &class, json!({})).await;
    e.wait_address(&spare, "Available", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;

    // The driver reports the backend lost the address.
    e.addresses()
        .patch_status(
            &a,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Lost"}})),
        )
        .await
        .unwrap();
    let c = e
        .wait_claim("web", "Lost", |c| phase(c) == Some(ClaimPhase::Lost))
        .await;
    assert_eq!(condition(&c, "Bound").unwrap().reason, "AddressLost");
    e.wait_event(&e.ns.name, "web", "AddressLost").await;
    e.barrier().await;
    let s = e.addresses().get(&spare).await.unwrap();
    assert!(
        s.spec.claim_ref.is_none(),
        "a Lost claim is never given a replacement"
    );
    assert_eq!(
        aphase(Some(&e.addresses().get(&a).await.unwrap())),
        Some(AddressPhase::Lost),
        "Lost is sticky for the core"
    );

    // The driver clears it: the claim is Bound again by itself.
    e.addresses()
        .patch_status(
            &a,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await
        .unwrap();
    e.wait_claim("web", "Bound again", |c| {
        phase(c) == Some(ClaimPhase::Bound)
    })
    .await;

    // Deleting the class never disturbs the binding.
    e.classes()
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
    e.barrier().await;
    assert_eq!(
        phase(&e.claims().get("web").await.unwrap()),
        Some(ClaimPhase::Bound)
    );
    e.check().await;
}

// ---- reclaim --------------------------------------------------------------------------------

#[tokio::test]
async fn reclaim_retain_delete_driver_finalizer_and_owned_claims() {
    let mut e = env("reclaim").await;
    let class = e.class("pub", json!({})).await;
    let keep = e.address("keep", "192.0.2.50", &class, json!({})).await;
    let drop_ = e
        .address("drop", "2001:db8::50", &class, json!({"metadata": {"finalizers": ["driver.test/teardown"]}, "spec": {"reclaimPolicy": "Delete"}}))
        .await;
    e.claim("web", json!({"className": class, "family": "Dual"}))
        .await;
    let c = e
        .wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();

    let kept = e
        .wait_address(&keep, "Released", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
    let r = kept.spec.claim_ref.as_ref().unwrap();
    assert_eq!(
        (r.name.as_str(), r.uid.as_deref()),
        ("web", c.metadata.uid.as_deref()),
        "claimRef kept"
    );
    assert!(kept.status.as_ref().unwrap().released_at.is_some());

    // Delete: the object is being deleted, held by the driver's finalizer until it lets go.
    let d = e
        .wait_address(&drop_, "being deleted", |x| {
            x.is_some_and(|a| a.metadata.deletion_timestamp.is_some())
        })
        .await
        .unwrap();
    assert!(d.finalizers().iter().any(|f| f == "driver.test/teardown"));
    e.wait_address(&drop_, "core finalizer released", |x| {
        x.is_some_and(|a| a.finalizers() == ["driver.test/teardown".to_string()])
    })
    .await;
    e.addresses()
        .patch(
            &drop_,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    e.wait_address(&drop_, "gone", |x| x.is_none()).await;
    e.wait_claim_gone("web").await;
    let events = e.events(&e.ns.name, "web").await;
    assert!(
        events.iter().any(|(r, _)| r == "AddressReleased"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(r, _)| r == "AddressDeleted"),
        "{events:?}"
    );

    // A claim with a controller owner of the tenant's own making (here a ConfigMap) is no
    // auto-claim: the admin's Retain holds (SPEC §6; this deleted the address before).
    let owned_addr = e.address("owned", "192.0.2.51", &class, json!({})).await;
    let owner: k8s_openapi::api::core::v1::ConfigMap =
        Api::namespaced(e.client.clone(), &e.ns.name)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
            )
            .await
            .unwrap();
    let v = json!({"metadata": {"name": "auto", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "owner", "uid": owner.metadata.uid, "controller": true}]}, "spec": {"className": class}});
    e.claims()
        .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
    e.wait_claim("auto", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .delete("auto", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("auto").await;
    e.wait_address(&owned_addr, "Released under its Retain", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.check().await;
}

#[tokio::test]
async fn a_release_delay_ends_on_a_scheduled_wake_not_a_poll() {
    let mut e = env("wake").await;
    let class = e
        .class("pub", json!({"spec": {"releaseDelay": "6s"}}))
        .await;
    let a = e.address("a", "192.0.2.70", &class, json!({})).await;
    e.claim("c", json!({"className": class, "addressName": a}))
        .await;
    e.wait_claim("c", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .delete("c", &DeleteParams::default())
        .await
        .unwrap();
    let released = e
        .wait_address(&a, "Released", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
    let released_at = released
        .status
        .as_ref()
        .unwrap()
        .released_at
        .clone()
        .unwrap()
        .0;
    // The deadline the core computes: releasedAt (second precision) plus the delay.
    let deadline = released_at + SignedDuration::from_secs(6);
    let passes = || e.ctl.log_lines(&["address pass", &format!("address={a}")]);
    // Quiet from here to the deadline: the core has passed over the Released object its
    // watch delivered, and its address queue has nothing ready or running (echoes of the
    // release, wake-ups from the claim's deletion — late on a loaded machine — are done).
    let rv = format!("rv={}", released.resource_version().unwrap());
    e.barrier().await;
    wait_for("the core quiet after the release", WAIT, || async {
        let seen = passes().iter().any(|l| l.contains(&rv));
        let m = e.ctl.metrics().await?;
        let busy = sample(
            &m,
            "address_controller_workqueue_depth{queue=\"addresses\",state=\"ready\"}",
        )
        .unwrap_or(0.0)
            + sample(
                &m,
                "address_controller_workqueue_depth{queue=\"addresses\",state=\"running\"}",
            )
            .unwrap_or(0.0);
        // (The series must be there: a misspelt one would read as an idle queue.)
        let exported =
            m.contains("address_controller_workqueue_depth{queue=\"addresses\",state=\"running\"}");
        Ok((seen && exported && busy == 0.0).then_some(()))
    })
    .await
    .unwrap();
    let before = passes().len();
    e.wait_address(&a, "Available", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;
    e.barrier().await;
    let at = |line: &String| -> Timestamp {
        line.split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap()
    };
    let later: Vec<Timestamp> = passes()[before..].iter().map(at).collect();
    let waiting = later.iter().filter(|t| **t < deadline).count();
    let woke = later.iter().filter(|t| **t >= deadline).min().copied();
    // The positive control: the log shows this address's passes — the bind and the release
    // before, the wake after — so a poller's passes would show too.
    assert!(
        before >= 2,
        "{before} passes logged before the release delay"
    );
    let woke = woke.expect("a pass at the deadline");
    // Scheduled: no pass while it waited (~5 s; a poller every second makes four or more),
    // and a pass at the deadline.
    assert_eq!(
        waiting, 0,
        "passes over the address while it waited: {later:?}"
    );
    let late = woke.duration_since(deadline);
    assert!(
        late < SignedDuration::from_secs(2),
        "woke {late:?} after the deadline"
    );
    println!("no pass while waiting; woke {late:?} after the deadline");
    e.check().await;
}

#[tokio::test]
async fn release_delay_held_annotation_and_admin_recycling() {
    let mut e = env("delay").await;
    let class = e
        .class("pub", json!({"spec": {"releaseDelay": "3s"}}))
        .await;
    let nodelay = e.class("manual", json!({})).await;
    let a = e.address("a", "192.0.2.60", &class, json!({})).await;
    let held = e
        .address(
            "held",
            "192.0.2.61",
            &class,
            json!({"metadata": {"annotations": {HELD_ANNOTATION: "true"}}}),
        )
        .await;
    let manual = e.address("manual", "192.0.2.62", &nodelay, json!({})).await;
    e.claim("one", json!({"className": class, "addressName": a}))
        .await;
    e.claim("two", json!({"className": class, "addressName": held}))
        .await;
    e.claim("three", json!({"className": nodelay})).await;
    for c in ["one", "two", "three"] {
        e.wait_claim(c, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
            .await;
        e.claims()
            .delete(c, &DeleteParams::default())
            .await
            .unwrap();
    }
    let released = e
        .wait_address(&a, "Released", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
    let released_at = released.status.unwrap().released_at.unwrap().0;
    // Not early: Available once the 3s delay is over, with claimRef cleared (that it ends
    // on a scheduled wake, not a poll: `a_release_delay_ends_on_a_scheduled_wake_not_a_poll`).
    let free = e
        .wait_address(&a, "Available", |x| {
            aphase(x) == Some(AddressPhase::Available)
        })
        .await
        .unwrap();
    assert!(free.spec.claim_ref.is_none());
    let waited = k8s_openapi::jiff::Timestamp::now().duration_since(released_at);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::from_secs(3),
        "released early: {waited:?}"
    );
    e.wait_event("default", &a, "ReleaseDelayElapsed").await;

    // Held: still Released once the delay is over (by its own release time, and the
    // controller has handled everything up to a barrier); removing the annotation releases
    // it at once.
    let held_at = e
        .wait_address(&held, "Released", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap()
        .status
        .unwrap()
        .released_at
        .unwrap()
        .0;
    wait_for("the held address's release delay over", WAIT, || async {
        let over = k8s_openapi::jiff::Timestamp::now().duration_since(held_at)
            > k8s_openapi::jiff::SignedDuration::from_secs(3);
        Ok(over.then_some(()))
    })
    .await
    .unwrap();
    e.barrier().await;
    assert_eq!(
        aphase(e.addresses().get_opt(&held).await.unwrap().as_ref()),
        Some(AddressPhase::Released)
    );
    e.addresses()
        .patch(
            &held,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {HELD_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    e.wait_address(&held, "Available at once", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;

    // No delay on the class: waits for an admin; clearing claimRef recycles it.
    e.wait_address(&manual, "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.addresses()
        .patch(
            &manual,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"claimRef": null}})),
        )
        .await
        .unwrap();
    let m = e
        .wait_address(&manual, "Available", |x| {
            aphase(x) == Some(AddressPhase::Available)
        })
        .await
        .unwrap();
    assert!(m.status.unwrap().released_at.is_none());
    e.check().await;
}

#[tokio::test]
async fn safety_net_reclaims_addresses_of_missing_or_replaced_claims() {
    let mut e = env("safety").await;
    let class = e.class("pub", json!({})).await;
    let orphan = e
        .address(
            "orphan",
            "192.0.2.70",
            &class,
            json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": "ghost", "uid": "gone"}}}),
        )
        .await;
    let orphan_delete = e
        .address("orphan-del", "192.0.2.71", &class,
            json!({"spec": {"reclaimPolicy": "Delete", "claimRef": {"namespace": e.ns.name, "name": "ghost", "uid": "gone"}}}))
        .await;
    e.wait_address(&orphan, "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.wait_address(&orphan_delete, "deleted", |x| x.is_none())
        .await;
    e.wait_event("default", &orphan, "Reclaimed").await;

    // A claim of the same name with another uid does not inherit the binding.
    e.claim("ghost", json!({"className": class})).await;
    let c = e
        .wait_claim("ghost", "Pending", |c| {
            phase(c) == Some(ClaimPhase::Pending)
        })
        .await;
    assert!(c.status.unwrap().addresses.is_empty());
    let o = e.addresses().get(&orphan).await.unwrap();
    assert_eq!(
        o.spec.claim_ref.as_ref().unwrap().uid.as_deref(),
        Some("gone")
    );
    assert_eq!(aphase(Some(&o)), Some(AddressPhase::Released));
    e.check().await;
}

#[tokio::test]
async fn deleting_a_bound_address_is_blocked_until_its_claim_lets_go() {
    let mut e = env("blocked").await;
    let class = e.class("pub", json!({})).await;
    let a = e.address("a", "192.0.2.80", &class, json!({})).await;
    e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.addresses()
        .delete(&a, &DeleteParams::default())
        .await
        .unwrap();
    e.wait_event("default", &a, "DeletionBlocked").await;
    e.barrier().await;
    let still = e.addresses().get(&a).await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(
        aphase(Some(&still)),
        Some(AddressPhase::Bound),
        "the address still serves its claim"
    );
    // The tenant sees why: an address of a bound claim that is being deleted no longer
    // counts (SPEC §4.3), so the claim is Lost with the reason.
    let c = e
        .wait_claim("web", "Lost", |c| phase(c) == Some(ClaimPhase::Lost))
        .await;
    assert_eq!(
        condition(&c, "Bound").unwrap().message,
        format!("IPAddress {a} is being deleted")
    );
    let blocked: Vec<_> = e
        .events("default", &a)
        .await
        .into_iter()
        .filter(|(r, _)| r == "DeletionBlocked")
        .collect();
    assert_eq!(blocked.len(), 1, "emitted once: {blocked:?}");
    e.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&a, "gone", |x| x.is_none()).await;
    e.wait_claim_gone("web").await;
    e.check().await;
}

// ---- scale, crashes, leader election ------------------------------------------------------

const MANY: usize = 300;

/// Every address bound to at most one claim; every claim's status equals its claimRefs.
async fn assert_invariants(e: &Env, class: &str) {
    let addresses = e
        .addresses()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut by_claim: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in addresses.iter().filter(|a| a.spec.class_name == class) {
        if let Some(r) = &a.spec.claim_ref {
            by_claim
                .entry(r.name.clone())
                .or_default()
                .push(a.name_any());
        }
    }
    let claims = e.claims().list(&ListParams::default()).await.unwrap().items;
    for c in &claims {
        let mut status: Vec<String> = c
            .status
            .as_ref()
            .map(|s| s.addresses.iter().map(|a| a.name.clone()).collect())
            .unwrap_or_default();
        status.sort();
        let mut refs = by_claim.get(&c.name_any()).cloned().unwrap_or_default();
        refs.sort();
        assert_eq!(status, refs, "claim {} status vs claimRefs", c.name_any());
        assert!(refs.len() <= 1, "claim {} holds {refs:?}", c.name_any());
    }
}

async fn create_many(e: &mut Env, class: &str) {
    create_addresses(e, class).await;
    create_claims(e, class).await;
}

/// MANY free addresses (198.18.0.0/15, the benchmarking range), waited for until Available.
async fn create_addresses(e: &mut Env, class: &str) {
    let mut names = Vec::new();
    for i in 0..MANY {
        names.push(
            e.address(
                &format!("m{i:03}"),
                &format!("198.18.{}.{}", i / 250, i % 250 + 1),
                class,
                json!({}),
            )
            .await,
        );
    }
    let addresses = e.addresses();
    let sfx = e.sfx.clone();
    wait_for("all addresses Available", Duration::from_secs(120), || {
        let addresses = addresses.clone();
        let sfx = sfx.clone();
        async move {
            let n = addresses
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|a| {
                    a.name_any().contains(&sfx) && aphase(Some(a)) == Some(AddressPhase::Available)
                })
                .count();
            Ok((n == MANY).then_some(()))
        }
    })
    .await
    .unwrap();
}

async fn create_claims(e: &Env, class: &str) {
    let claims = e.claims();
    // "At once": 50 creates in flight at a time.
    futures::stream::iter(0..MANY)
        .map(|i| {
            let claims = claims.clone();
            let class = class.to_string();
            async move {
                let v =
                    json!({"metadata": {"name": format!("c{i:03}")}, "spec": {"className": class}});
                claims
                    .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(50)
        .collect::<Vec<()>>()
        .await;
}

async fn wait_all_bound(e: &Env, timeout: Duration) {
    let claims = e.claims();
    wait_for("all claims Bound", timeout, || {
        let claims = claims.clone();
        async move {
            let items = claims.list(&ListParams::default()).await?.items;
            let bound = items
                .iter()
                .filter(|c| phase(c) == Some(ClaimPhase::Bound))
                .count();
            if bound == MANY {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{bound}/{MANY} bound"))
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn hundreds_of_claims_bind_without_double_binding_or_conflict_storms() {
    let mut e = env("many").await;
    let class = e.class("pub", json!({})).await;
    create_many(&mut e, &class).await;
    let start = std::time::Instant::now();
    wait_all_bound(&e, Duration::from_secs(180)).await;
    println!("{MANY} claims bound in {:?}", start.elapsed());
    assert_invariants(&e, &class).await;
    let all = audited_writes(&e.ctl.user, |w| {
        w.name.as_deref().is_some_and(|n| n.contains(&e.sfx))
            && w.resource == "ipaddresses"
            && w.subresource.is_none()
    })
    .unwrap();
    let ok = all.iter().filter(|w| w.code < 300).count();
    let conflicts = all.iter().filter(|w| w.code == 409).count();
    println!(
        "address spec writes for {MANY} binds: {ok} succeeded, {conflicts} conflicts (plus {MANY} finalizer patches)"
    );
    // N binds + N finalizers, and a conflict count far below N.
    assert_eq!(
        ok,
        2 * MANY,
        "spec writes: one finalizer and one bind per address"
    );
    assert!(conflicts < MANY / 10, "{conflicts} conflicts");
    let claim_conflicts = audited_writes(&e.ctl.user, |w| {
        w.namespace.as_deref() == Some(e.ns.name.as_str()) && w.code == 409
    })
    .unwrap()
    .len();
    println!("claim write conflicts: {claim_conflicts}");

    // The ledger gauges are exact.
    let m = e.ctl.metrics().await.unwrap();
    let line =
        format!("address_controller_ipaddresses{{class=\"{class}\",phase=\"Bound\"}} {MANY}");
    assert!(m.contains(&line), "missing {line}");
    let line = format!(
        "address_controller_ipaddressclaims{{class=\"{class}\",namespace=\"{}\",phase=\"Bound\"}} {MANY}",
        e.ns.name
    );
    assert!(m.contains(&line), "missing {line}");
    e.check().await;
}

type ClaimEvents = futures::stream::BoxStream<'static, kube::Result<WatchEvent<IPAddressClaim>>>;

/// A watch of the test namespace's claims from now on.
async fn watch_claims(e: &Env) -> ClaimEvents {
    let rv = e
        .claims()
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    e.claims()
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed()
}

/// Waits for the first event `pred` accepts.
async fn first_event(events: &mut ClaimEvents, pred: impl Fn(&WatchEvent<IPAddressClaim>) -> bool) {
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = events.next().await {
            if ev.as_ref().is_ok_and(&pred) {
                return;
            }
        }
        panic!("the claims' watch ended first");
    })
    .await
    .expect("the awaited claim event");
}

#[tokio::test]
async fn a_controller_killed_mid_binding_and_mid_reclaim_converges_after_restart() {
    let mut e = env("crash").await;
    let class = e.class("pub", json!({})).await;
    create_addresses(&mut e, &class).await;
    e.ctl.kill();
    create_claims(&e, &class).await;
    // Mid-binding: a fresh controller is killed the moment it bound its first claim (a
    // watch, not a poll: 300 binds take a few seconds), another finishes.
    let mut events = watch_claims(&e).await;
    let mut first =
        ControllerProcess::start(&format!("ctl-crash1-{}", e.sfx), &["--leader-elect=false"])
            .await
            .unwrap();
    first_event(
        &mut events,
        |ev| matches!(ev, WatchEvent::Modified(c) if phase(c) == Some(ClaimPhase::Bound)),
    )
    .await;
    first.kill();
    drop(events);
    let bound = || async {
        let items = e.claims().list(&ListParams::default()).await?.items;
        anyhow::Ok(
            items
                .iter()
                .filter(|c| phase(c) == Some(ClaimPhase::Bound))
                .count(),
        )
    };
    let bound_at_kill = bound().await.unwrap();
    println!("killed mid-binding with {bound_at_kill}/{MANY} claims bound");
    assert!(
        bound_at_kill < MANY,
        "the kill came after the binding, not in it"
    );
    let second =
        ControllerProcess::start(&format!("ctl-crash2-{}", e.sfx), &["--leader-elect=false"])
            .await
            .unwrap();
    wait_all_bound(&e, Duration::from_secs(180)).await;
    assert_invariants(&e, &class).await;

    // Mid-reclaim: delete every claim, kill while releasing, restart.
    drop(second);
    // One worker: the reclaim (an address released and a claim finalized per claim) takes
    // seconds instead of a fraction of one, and a watch, not a poll, kills the controller
    // the moment the first claim is finalized — in the middle of it.
    let mut third = ControllerProcess::start(
        &format!("ctl-crash3-{}", e.sfx),
        &["--leader-elect=false", "--concurrency=1"],
    )
    .await
    .unwrap();
    let mut events = watch_claims(&e).await;
    e.claims()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    first_event(&mut events, |ev| matches!(ev, WatchEvent::Deleted(_))).await;
    third.kill();
    drop(events);
    // The reclaim is claims finalized and their addresses released: some of it is left.
    let claims_left = e
        .claims()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    let still_bound = e
        .addresses()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|a| a.spec.class_name == class && aphase(Some(a)) == Some(AddressPhase::Bound))
        .count();
    println!(
        "killed mid-reclaim: {claims_left}/{MANY} claims left, {still_bound}/{MANY} addresses still Bound"
    );
    assert!(
        claims_left + still_bound > 0,
        "the kill came after the reclaim, not in it"
    );
    let _fourth =
        ControllerProcess::start(&format!("ctl-crash4-{}", e.sfx), &["--leader-elect=false"])
            .await
            .unwrap();
    let claims = e.claims();
    wait_for("all claims gone", Duration::from_secs(180), || {
        let claims = claims.clone();
        async move {
            Ok(claims
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        }
    })
    .await
    .unwrap();
    let addresses = e
        .addresses()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mine: Vec<&IPAddress> = addresses
        .iter()
        .filter(|a| a.spec.class_name == class)
        .collect();
    assert_eq!(mine.len(), MANY, "Retain: nothing deleted");
    let released = mine
        .iter()
        .filter(|a| aphase(Some(a)) == Some(AddressPhase::Released))
        .count();
    let refs: HashSet<&str> = mine
        .iter()
        .filter_map(|a| a.spec.claim_ref.as_ref().map(|r| r.name.as_str()))
        .collect();
    assert_eq!(
        (released, refs.len()),
        (MANY, MANY),
        "every address Released, each keeping its own claim"
    );
    e.check().await;
}

#[tokio::test]
async fn a_standby_replica_takes_over_when_the_leader_dies() {
    let mut e = env("leader").await;
    e.ctl.kill(); // this test brings its own elected replicas
    let class = e.class("pub", json!({})).await;
    let lease = e.name("lease");
    let args = address_controller_tests::env::fast_lease(&lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut one = ControllerProcess::start(&format!("ctl-one-{}", e.sfx), &args)
        .await
        .unwrap();
    let mut two = ControllerProcess::start(&format!("ctl-two-{}", e.sfx), &args)
        .await
        .unwrap();
    e.address("a", "192.0.2.90", &class, json!({})).await;
    e.claim("first", json!({"className": class})).await;
    e.wait_claim("first", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let holder = address_controller_tests::env::lease_holder(&e.client, &lease)
        .await
        .unwrap()
        .unwrap();
    // Whichever replica won the election leads; the other stands by.
    let (leader, standby) = if holder == one.user {
        (&mut one, &two)
    } else {
        assert_eq!(holder, two.user, "the Lease names neither replica");
        (&mut two, &one)
    };
    assert!(
        e.writes(&standby.user).is_empty(),
        "the standby wrote: {:?}",
        e.writes(&standby.user)
    );

    leader.kill();
    e.address("b", "192.0.2.91", &class, json!({})).await;
    e.claim("second", json!({"className": class})).await;
    e.wait_claim("second", "Bound by the new leader", |c| {
        phase(c) == Some(ClaimPhase::Bound)
    })
    .await;
    let holder = address_controller_tests::env::lease_holder(&e.client, &lease)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder, standby.user);
    assert!(!e.writes(&standby.user).is_empty());
    e.check().await;
}

#[tokio::test]
async fn an_invalid_address_admitted_before_validation_is_never_trusted() {
    let mut e = env("invalid").await;
    let class = e.class("pub", json!({})).await;
    // Admit an invalid address the way an old API server would have: the CRD without its
    // CEL rules on spec.address, for as long as it takes to create one object.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(e.client.clone());
    let mut lax = <IPAddress as kube::CustomResourceExt>::crd();
    let mut schema = serde_json::to_value(&lax.spec.versions[0].schema).unwrap();
    let spec = &mut schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
    spec["address"]
        .as_object_mut()
        .unwrap()
        .remove("x-kubernetes-validations");
    spec["claimRef"]["properties"]["name"]
        .as_object_mut()
        .unwrap()
        .remove("pattern");
    lax.spec.versions[0].schema = serde_json::from_value(schema).unwrap();
    let name = lax.metadata.name.clone().unwrap();
    let params = PatchParams::apply(address_controller_tests::FIELD_MANAGER).force();
    crds.patch(&name, &params, &Patch::Apply(&lax))
        .await
        .unwrap();
    let bad = e.name("bad");
    let body: IPAddress = serde_json::from_value(json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": bad}, "spec": {"address": "192.0.2.999", "className": class, "source": {"fromClass": {}}}}))
    .unwrap();
    // And one naming a claim by a name no object can have.
    let unreadable = e.name("unreadable");
    let unreadable_body: IPAddress = serde_json::from_value(json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": unreadable}, "spec": {"address": "192.0.2.98", "className": class, "source": {"fromClass": {}},
            "claimRef": {"namespace": e.ns.name, "name": "x y"}}}))
    .unwrap();
    let addresses = e.addresses();
    let created = wait_for("the lax CRD to admit an invalid address", WAIT, || {
        let addresses = addresses.clone();
        let (body, unreadable_body) = (body.clone(), unreadable_body.clone());
        async move {
            for b in [&body, &unreadable_body] {
                if addresses.get_opt(&b.name_any()).await?.is_none() {
                    addresses.create(&PostParams::default(), b).await?;
                }
            }
            Ok(Some(()))
        }
    })
    .await;
    e.cleanup.add("ipaddresses.local.sdn.cozystack.io", &bad);
    e.cleanup
        .add("ipaddresses.local.sdn.cozystack.io", &unreadable);
    address_controller_tests::install_crds(&e.client)
        .await
        .unwrap();
    created.unwrap();

    let a = e
        .wait_address(&bad, "Pending", |x| {
            aphase(x) == Some(AddressPhase::Pending)
        })
        .await
        .unwrap();
    assert!(
        a.finalizers()
            .iter()
            .any(|f| f == "local.sdn.cozystack.io/address-protection")
    );
    let note = e.wait_event("default", &bad, "InvalidAddress").await;
    assert!(note.contains("192.0.2.999"), "{note}");
    // Nothing binds it, even when asked to by name.
    e.claim("pinned", json!({"className": class, "addressName": bad}))
        .await;
    let c = e
        .wait_claim("pinned", "WaitingForAddress", |c| {
            condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForAddress")
        })
        .await;
    assert!(
        condition(&c, "Bound")
            .unwrap()
            .message
            .contains("invalid address")
    );
    // An unreadable claim name is an absent claim: the address is reclaimed by its policy
    // (Retain: Released) once, and then left alone — no pass loops on it.
    e.wait_address(&unreadable, "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.wait_event("default", &unreadable, "Reclaimed").await;
    let writes =
        |w: &address_controller_tests::AuditedWrite| w.name.as_deref() == Some(unreadable.as_str());
    let settled = audited_writes(&e.ctl.user, writes).unwrap().len();
    // A pass that looped would retry within milliseconds (the queue's first backoff steps):
    // by the barrier, it would have written again.
    e.barrier().await;
    assert_eq!(
        audited_writes(&e.ctl.user, writes).unwrap().len(),
        settled,
        "no more writes"
    );
    assert!(
        !e.ctl.log_contains("invalid uri"),
        "{}",
        e.ctl.log.display()
    );
    e.check().await;
}

#[tokio::test]
async fn a_claim_with_the_longest_name_gets_its_events() {
    let mut e = env("longname").await;
    let class = e.class("pub", json!({})).await;
    e.address("a", "192.0.2.120", &class, json!({})).await;
    // 253 characters: the longest object name; an event name must still fit.
    let name = format!("{}-end", "l".repeat(249));
    assert_eq!(name.len(), 253);
    e.claim(&name, json!({"className": class})).await;
    e.wait_claim(&name, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let note = e.wait_event(&e.ns.name, &name, "Matched").await;
    assert!(note.contains("192.0.2.120"), "{note}");
    e.check().await;
}

#[tokio::test]
async fn ledger_gauges_follow_objects_and_drop_series_of_gone_ones() {
    let mut e = env("gauges").await;
    let class = e.class("pub", json!({})).await;
    let a = e.address("a", "192.0.2.100", &class, json!({})).await;
    e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.wait_address(&a, "Bound", |x| aphase(x) == Some(AddressPhase::Bound))
        .await;
    let claim_series = format!(
        "address_controller_ipaddressclaims{{class=\"{class}\",namespace=\"{}\",phase=\"Bound\"}} 1",
        e.ns.name
    );
    let bound = format!("address_controller_ipaddresses{{class=\"{class}\",phase=\"Bound\"}} 1");
    let m = e.ctl.metrics().await.unwrap();
    assert!(m.contains(&claim_series) && m.contains(&bound), "{m}");

    e.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&a, "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    let released =
        format!("address_controller_ipaddresses{{class=\"{class}\",phase=\"Released\"}} 1");
    let ctl = &e.ctl;
    wait_for("gauges to follow", WAIT, || async {
        let m = ctl.metrics().await?;
        let claim_gone = !m.contains(&format!("namespace=\"{}\"", e.ns.name));
        Ok((claim_gone && m.contains(&released)).then_some(()))
    })
    .await
    .unwrap();
    let m = e.ctl.metrics().await.unwrap();
    assert!(
        m.contains(&format!(
            "address_controller_ipaddresses{{class=\"{class}\",phase=\"Bound\"}} 0"
        )),
        "{m}"
    );
    e.check().await;
}

/// Five addresses and five claims of `class`, waited on until every claim is Bound.
async fn bind_five(e: &mut Env, class: &str, round: &str, first: u8) {
    for i in 0..5u8 {
        let ip = format!("192.0.2.{}", first + i);
        e.address(&format!("{round}{i}"), &ip, class, json!({}))
            .await;
    }
    for i in 0..5u8 {
        e.claim(&format!("{round}-{i}"), json!({"className": class}))
            .await;
    }
    for i in 0..5u8 {
        e.wait_claim(&format!("{round}-{i}"), "Bound", |c| {
            phase(c) == Some(ClaimPhase::Bound)
        })
        .await;
    }
}

#[tokio::test]
async fn the_client_rate_limiter_spaces_requests_and_every_call_is_counted() {
    let mut e = env("qps").await;
    let class = e.class("pub", json!({})).await;
    // Control: the defaults (200/s, burst 400) never make five binds wait.
    bind_five(&mut e, &class, "a", 10).await;
    let m = e.ctl.metrics().await.unwrap();
    let waited = sample(
        &m,
        "address_controller_client_rate_limiter_duration_seconds_sum",
    )
    .unwrap_or(0.0);
    assert!(waited < 0.05, "the default limiter waited {waited} s");
    for series in [
        "address_controller_client_requests_total{code=\"200\",method=\"PATCH\"}",
        "address_controller_client_requests_total{code=\"200\",method=\"WATCH\"}",
        "address_controller_client_requests_total{code=\"200\",method=\"GET\"}",
        "address_controller_client_request_duration_seconds_count{method=\"PATCH\"}",
    ] {
        assert!(
            sample(&m, series).is_some_and(|v| v >= 1.0),
            "{series} missing:\n{m}"
        );
    }

    // 5 requests/s, no burst: the same work waits on the limiter — and still binds.
    e.ctl.stop();
    e.ctl = ControllerProcess::start(
        &format!("ctl-qps2-{}", e.sfx),
        &[
            "--leader-elect=false",
            "--kube-api-qps=5",
            "--kube-api-burst=1",
        ],
    )
    .await
    .unwrap();
    bind_five(&mut e, &class, "b", 20).await;
    let m = e.ctl.metrics().await.unwrap();
    let waited = sample(
        &m,
        "address_controller_client_rate_limiter_duration_seconds_sum",
    )
    .unwrap_or(0.0);
    let requests = address_controller_tests::sum_samples(
        &m,
        "address_controller_client_requests_total{",
        |_| true,
    );
    // 5 binds are 20 writes; at 5/s with a burst of 1, the queue alone waits seconds.
    assert!(requests >= 20.0, "{requests} requests:\n{m}");
    assert!(
        waited >= 2.0,
        "waited only {waited} s for {requests} requests"
    );
    println!("qps=5: {requests} requests, {waited:.1} s waited on the limiter");
    e.check().await;
}
