//! Released addresses, reservations and moves (SPEC §5.6, §5.8) against the real control
//! plane: the phase of an address follows its claimRef — the release delay concerns only
//! the binding that was released; a claimRef without a uid naming a claim that does not
//! exist yet is a reservation; an admin re-points a claimRef to move an address.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::env::{Env, WAIT, aphase, condition, env, phase};
use address_controller_tests::{ControllerProcess, TestNamespace, wait_for};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

fn listed(c: &IPAddressClaim) -> Vec<String> {
    c.status
        .iter()
        .flat_map(|s| &s.addresses)
        .map(|a| a.name.clone())
        .collect()
}

fn claim_ref_of(a: &IPAddress) -> Option<(String, String, Option<String>)> {
    a.spec
        .claim_ref
        .as_ref()
        .map(|r| (r.namespace.clone(), r.name.clone(), r.uid.clone()))
}

async fn patch_address(e: &Env, name: &str, body: serde_json::Value) {
    e.addresses()
        .patch(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .unwrap();
}

/// The address's release delay is over by its own `releasedAt`.
async fn wait_delay_over(a: &IPAddress, delay: SignedDuration) {
    let at = a.status.as_ref().unwrap().released_at.clone().unwrap().0;
    wait_for("the release delay over", WAIT, || async {
        Ok((Timestamp::now().duration_since(at) > delay).then_some(()))
    })
    .await
    .unwrap();
}

/// Issue #20, case 1, played step by step: an address `Released` for claim `old`, whose
/// release delay elapses; the release-delay step clears its claimRef, and before its second
/// write (the status `Available`) lands, the claim pass binds it to the claim pinned to it.
/// The address then carries the new binding next to the old `Released` phase. The new
/// binding must stand: the address goes `Bound` to the pinned claim, which stays `Bound`,
/// and nobody else gets the address.
#[tokio::test]
async fn a_pin_bound_between_the_release_delay_writes_keeps_its_address() {
    let mut e = env("relpin").await;
    let class = e
        .class("pub", json!({"spec": {"releaseDelay": "4s"}}))
        .await;
    let a = e.address("a", "192.0.2.90", &class, json!({})).await;
    e.claim("old", json!({"className": class, "addressName": a}))
        .await;
    e.wait_claim("old", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .delete("old", &DeleteParams::default())
        .await
        .unwrap();
    let released = e
        .wait_address(&a, "Released for the old claim", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
    e.wait_claim_gone("old").await;
    // The controller is stopped: the test makes the two passes' writes itself, in the
    // order the field log showed.
    e.ctl.stop();

    // 1. The release-delay step's first write: claimRef cleared (the phase is still
    //    Released; its second write, Available, has not landed).
    patch_address(&e, &a, json!({"spec": {"claimRef": null}})).await;
    // 2. The claim pass binds the pinned claim (claimRef with its uid) and writes its
    //    status, as it does after a bind.
    let pinned = e
        .claim("pinned", json!({"className": class, "addressName": a}))
        .await;
    e.claims()
        .patch(
            "pinned",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["local.sdn.cozystack.io/claim-protection"]}}),
            ),
        )
        .await
        .unwrap();
    patch_address(
        &e,
        &a,
        json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": "pinned", "uid": pinned.metadata.uid}}}),
    )
    .await;
    let ip = released.spec.address.clone();
    e.claims()
        .patch_status(
            "pinned",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Bound", "className": class,
                "addresses": [{"name": a, "address": ip}],
                "conditions": [
                    {"type": "ClassResolved", "status": "True", "reason": "Resolved",
                     "message": format!("resolved to IPAddressClass {class:?}"),
                     "lastTransitionTime": Timestamp::now().to_string()},
                    {"type": "Bound", "status": "True", "reason": "Bound",
                     "message": format!("bound to {ip}"),
                     "lastTransitionTime": Timestamp::now().to_string()}]}})),
        )
        .await
        .unwrap();
    let mid = e.addresses().get(&a).await.unwrap();
    assert_eq!(
        aphase(Some(&mid)),
        Some(AddressPhase::Released),
        "the state under test: a new binding next to the old Released phase"
    );
    // The old binding's release delay is over: the step that undid the binding would now
    // fire (positive control: it can happen).
    wait_delay_over(&released, SignedDuration::from_secs(4)).await;

    e.ctl = ControllerProcess::start(&format!("ctl-relpin2-{}", e.sfx), &["--leader-elect=false"])
        .await
        .unwrap();
    let bound = e
        .wait_address(&a, "Bound to the pinned claim", |x| {
            aphase(x) == Some(AddressPhase::Bound)
        })
        .await
        .unwrap();
    e.barrier().await;
    let now = e.addresses().get(&a).await.unwrap();
    assert_eq!(
        claim_ref_of(&now),
        Some((
            e.ns.name.clone(),
            "pinned".into(),
            pinned.metadata.uid.clone()
        )),
        "the new binding stands"
    );
    assert_eq!(aphase(Some(&now)), Some(AddressPhase::Bound));
    assert!(
        bound.status.as_ref().unwrap().released_at.is_none(),
        "releasedAt belongs to the old binding"
    );
    let c = e.claims().get("pinned").await.unwrap();
    assert_eq!(phase(&c), Some(ClaimPhase::Bound), "{:?}", c.status);
    assert_eq!(listed(&c), std::slice::from_ref(&a));
    let elapsed: Vec<_> = e
        .events("default", &a)
        .await
        .into_iter()
        .filter(|(r, n)| r == "ReleaseDelayElapsed" && n.contains("pinned"))
        .collect();
    assert!(
        elapsed.is_empty(),
        "the new binding was released: {elapsed:?}"
    );
    e.check().await;
}

/// Issue #20, case 2: an admin reserves an address for a claim that does not exist yet
/// (claimRef by namespace and name, no uid). It stays `Available` and reserved — no other
/// claim, pinned or not, can take it — and binds when the claim is created.
#[tokio::test]
async fn a_reservation_waits_for_its_claim_and_binds_when_it_appears() {
    let mut e = env("reserve").await;
    let class = e.class("pub", json!({})).await;
    let r = e
        .address(
            "r",
            "192.0.2.95",
            &class,
            json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": "late"}}}),
        )
        .await;
    e.wait_address(&r, "Available (reserved)", |x| {
        aphase(x) == Some(AddressPhase::Available)
    })
    .await;
    // Nobody else gets it: an unpinned claim of the class waits for a driver, a claim
    // pinned to it waits with the reason.
    e.claim("other", json!({"className": class})).await;
    e.claim("thief", json!({"className": class, "addressName": r}))
        .await;
    let thief = e
        .wait_claim("thief", "waiting for the address", |c| {
            condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForAddress")
        })
        .await;
    assert!(
        condition(&thief, "Bound")
            .unwrap()
            .message
            .contains(&format!("{}/late", e.ns.name)),
        "{:?}",
        condition(&thief, "Bound")
    );
    e.wait_claim("other", "waiting for provisioning", |c| {
        condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForProvisioning")
    })
    .await;
    e.barrier().await;
    let still = e.addresses().get(&r).await.unwrap();
    assert_eq!(aphase(Some(&still)), Some(AddressPhase::Available));
    assert_eq!(
        claim_ref_of(&still),
        Some((e.ns.name.clone(), "late".into(), None)),
        "the reservation is kept"
    );
    assert!(
        e.events("default", &r)
            .await
            .iter()
            .all(|(reason, _)| reason != "Reclaimed"),
        "a reservation is not an orphan"
    );

    // The claim arrives: it gets the reserved address, uid completed.
    let late = e.claim("late", json!({"className": class})).await;
    let c = e
        .wait_claim("late", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(listed(&c), std::slice::from_ref(&r));
    let bound = e
        .wait_address(&r, "Bound", |x| aphase(x) == Some(AddressPhase::Bound))
        .await
        .unwrap();
    assert_eq!(
        claim_ref_of(&bound),
        Some((e.ns.name.clone(), "late".into(), late.metadata.uid.clone()))
    );
    for c in ["other", "thief"] {
        e.claims()
            .delete(c, &DeleteParams::default())
            .await
            .unwrap();
        e.wait_claim_gone(c).await;
    }
    e.check().await;
}

/// An admin moves a `Released` address to a claim in another namespace by re-pointing its
/// claimRef (namespace and name, no uid): it is reserved for the new claim at once — no
/// release delay — binds when that claim is created, and the old claim's namespace never
/// gets it back.
#[tokio::test]
async fn an_admin_moves_a_released_address_to_another_namespace() {
    let mut e = env("move").await;
    let class = e
        .class("pub", json!({"spec": {"releaseDelay": "24h"}}))
        .await;
    let a = e.address("a", "192.0.2.97", &class, json!({})).await;
    e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&a, "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.wait_claim_gone("web").await;

    let other = TestNamespace::create(&e.client, "move-to").await.unwrap();
    patch_address(
        &e,
        &a,
        json!({"spec": {"claimRef": {"namespace": other.name, "name": "web", "uid": null}}}),
    )
    .await;
    let moved = e
        .wait_address(&a, "Available, reserved for the new claim", |x| {
            aphase(x) == Some(AddressPhase::Available)
        })
        .await
        .unwrap();
    assert!(moved.status.unwrap().released_at.is_none());
    // The old namespace recreates its claim: it does not get the address back.
    e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "waiting", |c| {
        condition(c, "Bound").is_some_and(|x| x.reason == "WaitingForProvisioning")
    })
    .await;
    // The new namespace's claim gets it.
    let there: Api<IPAddressClaim> = Api::namespaced(e.client.clone(), &other.name);
    there
        .create(
            &Default::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "web"}, "spec": {"className": class}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let bound = e
        .wait_address(&a, "Bound in the new namespace", |x| {
            aphase(x) == Some(AddressPhase::Bound)
        })
        .await
        .unwrap();
    let new = there.get("web").await.unwrap();
    assert_eq!(
        claim_ref_of(&bound),
        Some((other.name.clone(), "web".into(), new.metadata.uid.clone()))
    );
    wait_for("the new claim Bound", WAIT, || async {
        let c = there.get("web").await?;
        Ok((phase(&c) == Some(ClaimPhase::Bound) && listed(&c) == [a.clone()]).then_some(()))
    })
    .await
    .unwrap();
    e.barrier().await;
    let old = e.claims().get("web").await.unwrap();
    assert!(listed(&old).is_empty(), "{:?}", old.status);
    there.delete("web", &DeleteParams::default()).await.unwrap();
    e.wait_address(&a, "Released from the new claim", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    wait_for("the new claim gone", WAIT, || async {
        Ok(there.get_opt("web").await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    e.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("web").await;
    e.check().await;
}

/// An admin re-points a `Bound` address to another claim. As with a PersistentVolume whose
/// claimRef is re-pointed, the old claim turns `Lost` — saying where its address went — and
/// is never given another; the new claim gets the address.
#[tokio::test]
async fn an_admin_moves_a_bound_address_and_the_old_claim_is_lost_saying_where_it_went() {
    let mut e = env("movebound").await;
    let class = e.class("pub", json!({})).await;
    let a = e.address("a", "192.0.2.98", &class, json!({})).await;
    let spare = e.address("spare", "192.0.2.99", &class, json!({})).await;
    e.claim("old", json!({"className": class, "addressName": a}))
        .await;
    e.wait_claim("old", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    patch_address(
        &e,
        &a,
        json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": "new", "uid": null}}}),
    )
    .await;
    let old = e
        .wait_claim("old", "Lost", |c| phase(c) == Some(ClaimPhase::Lost))
        .await;
    assert_eq!(
        condition(&old, "Bound").unwrap().message,
        format!(
            "IPAddress {a} (192.0.2.98) now names claim {}/new",
            e.ns.name
        )
    );
    e.claim("new", json!({"className": class})).await;
    let new = e
        .wait_claim("new", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(
        listed(&new),
        std::slice::from_ref(&a),
        "the moved address, not the spare"
    );
    e.barrier().await;
    let s = e.addresses().get(&spare).await.unwrap();
    assert!(
        s.spec.claim_ref.is_none(),
        "a Lost claim gets no other address"
    );
    assert_eq!(
        phase(&e.claims().get("old").await.unwrap()),
        Some(ClaimPhase::Lost)
    );
    // The tenant deletes the Lost claim: nothing of the moved address changes.
    e.claims()
        .delete("old", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("old").await;
    e.barrier().await;
    let moved = e.addresses().get(&a).await.unwrap();
    assert_eq!(aphase(Some(&moved)), Some(AddressPhase::Bound));
    assert_eq!(
        claim_ref_of(&moved),
        Some((e.ns.name.clone(), "new".into(), new.metadata.uid.clone()))
    );
    e.check().await;
}

/// Reservation and move with two replicas, the leader killed between the admin's writes and
/// the claims' creation: the new leader binds each address to the claim it was reserved
/// for, nobody else.
#[tokio::test]
async fn a_reservation_and_a_move_survive_a_leader_kill_before_their_claims_exist() {
    let mut e = env("relha").await;
    e.ctl.kill(); // this test brings its own elected replicas
    let class = e
        .class("pub", json!({"spec": {"releaseDelay": "24h"}}))
        .await;
    let lease = e.name("lease");
    let args = address_controller_tests::env::fast_lease(&lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut replicas = [
        ControllerProcess::start(&format!("ctl-one-{}", e.sfx), &args)
            .await
            .unwrap(),
        ControllerProcess::start(&format!("ctl-two-{}", e.sfx), &args)
            .await
            .unwrap(),
    ];
    let reserved = e.address("r", "192.0.2.100", &class, json!({})).await;
    let moved = e.address("m", "192.0.2.101", &class, json!({})).await;
    // Other claims waiting in the class: if either address were free, they would take it.
    e.claim("old", json!({"className": class, "addressName": moved}))
        .await;
    e.wait_claim("old", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claim("waiting", json!({"className": class})).await;
    e.wait_claim("waiting", "Bound to the free one", |c| {
        phase(c) == Some(ClaimPhase::Bound)
    })
    .await;
    e.claims()
        .delete("old", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&moved, "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.claims()
        .delete("waiting", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address(&reserved, "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.claim("hungry", json!({"className": class})).await;

    // The admin's writes: a reservation for `late`, a move to `other/moved`.
    let other = TestNamespace::create(&e.client, "relha-to").await.unwrap();
    patch_address(
        &e,
        &reserved,
        json!({"spec": {"claimRef": {"namespace": e.ns.name, "name": "late", "uid": null}}}),
    )
    .await;
    patch_address(
        &e,
        &moved,
        json!({"spec": {"claimRef": {"namespace": other.name, "name": "moved", "uid": null}}}),
    )
    .await;
    // The leader dies before the claims exist.
    let holder = address_controller_tests::env::lease_holder(&e.client, &lease)
        .await
        .unwrap()
        .unwrap();
    let (dead, standby): (Vec<_>, Vec<_>) = replicas.iter_mut().partition(|r| r.user == holder);
    let [dead] = <[_; 1]>::try_from(dead).ok().unwrap();
    let [standby] = <[_; 1]>::try_from(standby).ok().unwrap();
    dead.kill();
    address_controller_tests::env::wait_lease_holder(&e.client, &lease, &standby.user).await;
    e.claim("late", json!({"className": class})).await;
    let there: Api<IPAddressClaim> = Api::namespaced(e.client.clone(), &other.name);
    there
        .create(
            &Default::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "moved"}, "spec": {"className": class}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let late = e
        .wait_claim("late", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(listed(&late), std::slice::from_ref(&reserved));
    wait_for("other/moved Bound", WAIT, || async {
        let c = there.get("moved").await?;
        Ok((phase(&c) == Some(ClaimPhase::Bound) && listed(&c) == [moved.clone()]).then_some(()))
    })
    .await
    .unwrap();
    // The binds were the new leader's (positive control: the kill came before them).
    let completed: Vec<_> = e
        .writes(&standby.user)
        .into_iter()
        .filter(|w| w.name.as_deref() == Some(reserved.as_str()) && w.subresource.is_none())
        .collect();
    assert!(
        !completed.is_empty(),
        "the standby completed the reservation"
    );
    let hungry = e.claims().get("hungry").await.unwrap();
    assert!(listed(&hungry).is_empty(), "{:?}", hungry.status);
    for c in ["hungry", "late"] {
        e.claims()
            .delete(c, &DeleteParams::default())
            .await
            .unwrap();
        e.wait_claim_gone(c).await;
    }
    there
        .delete("moved", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("other/moved gone", WAIT, || async {
        Ok(there.get_opt("moved").await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    e.check_with(&[standby]).await;
}
