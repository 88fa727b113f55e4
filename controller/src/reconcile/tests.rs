//! The mock-API tier: the claim pass against a client whose answers the test chooses
//! ([`MockApi`]). What the pure tests cannot see — the writes a pass issues, their guards and
//! order, and what it does when kube-apiserver answers 409 or 422 — in milliseconds.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use address_controller_api::names::CLAIM_FINALIZER;
use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_runtime::cache::key_of;
use address_controller_runtime::health::{Bounds, Health};
use address_controller_runtime::leader::Leadership;
use address_controller_runtime::mock_api::{Answer, Call, MockApi};
use address_controller_runtime::workers::{Gate, Outcome, PassError, Retry};
use address_controller_runtime::world::World;
use serde_json::{Value, json};

use crate::context::Context;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::reconcile::claim::reconcile;
use crate::run::register;

const ADDRESS: &str = "/apis/local.sdn.cozystack.io/v1alpha1/ipaddresses/ipv4-192-0-2-1";
const CLAIM_STATUS: &str =
    "/apis/local.sdn.cozystack.io/v1alpha1/namespaces/t/ipaddressclaims/c/status";

/// A core whose caches hold a class `pool`, its one Available address and the claim `t/c`
/// of it, talking to `respond`.
fn core(respond: impl Fn(&Call) -> Answer + Send + Sync + 'static) -> (MockApi, Arc<Context>) {
    let (api, client) = MockApi::new(respond);
    let health = Health::new(Bounds::default());
    let world = World::new(false, health.clone());
    let gate = Gate::new(Leadership::always(), health);
    let metrics = Arc::new(Metrics::new(world.clone()).unwrap());
    let ctx = Arc::new(Context::new(
        client,
        world,
        gate,
        metrics,
        "test".into(),
        false,
        crate::context::History {
            retention: std::time::Duration::from_secs(3600),
            moves: address_controller_runtime::records::Pacer::new(100.0),
            prunes: address_controller_runtime::records::Pacer::new(100.0),
            prune_interval: std::time::Duration::from_secs(600),
            max_records: 1000,
        },
    ));
    register(&ctx);
    let class: IPAddressClass = serde_json::from_value(json!({
        "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
        "metadata": {"name": "pool", "uid": "class-uid"},
        "spec": {"provisioner": "static.example"}}))
    .unwrap();
    ctx.world
        .classes
        .apply(key_of(&class), Some(Arc::new(class)));
    let address: IPAddress = serde_json::from_value(address_json()).unwrap();
    ctx.world
        .addresses
        .apply(key_of(&address), Some(Arc::new(address)));
    let claim: IPAddressClaim = serde_json::from_value(claim_json()).unwrap();
    ctx.world
        .claims
        .apply(key_of(&claim), Some(Arc::new(claim)));
    (api, ctx)
}

fn address_json() -> Value {
    json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": "ipv4-192-0-2-1", "uid": "address-uid", "resourceVersion": "10",
            "finalizers": [address_controller_api::names::ADDRESS_FINALIZER]},
        "spec": {"address": "192.0.2.1", "className": "pool", "source": {"fromClass": {}}},
        "status": {"phase": "Available"}})
}

fn claim_json() -> Value {
    json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
        "metadata": {"name": "c", "namespace": "t", "uid": "claim-uid", "generation": 1,
            "resourceVersion": "5", "finalizers": [CLAIM_FINALIZER]},
        "spec": {"className": "pool"}})
}

/// The object a JSON merge patch (RFC 7386: null removes) makes of `base`.
fn patched(mut base: Value, patch: &Value) -> Value {
    match (&mut base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    let old = b.remove(k).unwrap_or(Value::Null);
                    b.insert(k.clone(), patched(old, v));
                }
            }
            base
        }
        _ => patch.clone(),
    }
}

/// kube-apiserver's answer to the writes of a bind, except the first write to the path
/// `refuse` names, which gets its answer.
fn answers(refuse: Option<(&'static str, Answer)>) -> impl Fn(&Call) -> Answer {
    let refused = AtomicBool::new(false);
    move |call| match (call.method.as_str(), call.path.as_str()) {
        (_, p)
            if refuse.as_ref().is_some_and(|(r, _)| *r == p)
                && !refused.swap(true, Ordering::SeqCst) =>
        {
            refuse.as_ref().map(|(_, a)| a.clone()).unwrap()
        }
        ("PATCH", ADDRESS) => Answer::Object(patched(address_json(), &call.body)),
        ("PATCH", CLAIM_STATUS) => Answer::Object(patched(claim_json(), &call.body)),
        _ => Answer::Status(404, "NotFound"),
    }
}

#[tokio::test]
async fn a_bind_is_a_guarded_address_patch_then_a_guarded_claim_status_patch() {
    let (api, ctx) = core(answers(None));
    let outcome = reconcile(ctx.clone(), "t/c".into()).await.unwrap();
    assert_eq!(outcome, Outcome::Done);
    let writes = api.writes();
    let lines: Vec<String> = writes.iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [format!("PATCH {ADDRESS}"), format!("PATCH {CLAIM_STATUS}")]
    );
    // The address is bound to the claim by uid, guarded by the resourceVersion it was read at.
    assert_eq!(
        writes[0].body,
        json!({"metadata": {"resourceVersion": "10"},
            "spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}}})
    );
    // The claim's status, guarded by its own resourceVersion, names the address.
    let status = &writes[1].body;
    assert_eq!(status["metadata"]["resourceVersion"], "5", "{status}");
    assert_eq!(status["status"]["phase"], "Bound", "{status}");
    assert_eq!(
        status["status"]["addresses"][0]["name"], "ipv4-192-0-2-1",
        "{status}"
    );
}

#[tokio::test]
async fn a_bind_answered_409_writes_no_status_and_frees_the_address_for_the_next_pass() {
    let (api, ctx) = core(answers(Some((ADDRESS, Answer::conflict()))));
    let err = reconcile(ctx.clone(), "t/c".into()).await.unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    assert_eq!(err.retry(), Retry::Backoff);
    assert_eq!(
        api.writes().iter().map(Call::line).collect::<Vec<_>>(),
        [format!("PATCH {ADDRESS}")],
        "nothing is written after the refused bind"
    );
    // The pass reserved the address for the claim while it wrote; refused, it lets go, so
    // another claim's pass may take it.
    assert!(
        !ctx.index.reserved_by_other("ipv4-192-0-2-1", "t/other"),
        "the refused bind left the address reserved"
    );
    // The retry (the cache unchanged: the conflict came from a write it has not seen yet)
    // binds again, guarded as before.
    reconcile(ctx, "t/c".into()).await.unwrap();
    let lines: Vec<String> = api.writes().iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [
            format!("PATCH {ADDRESS}"),
            format!("PATCH {ADDRESS}"),
            format!("PATCH {CLAIM_STATUS}")
        ]
    );
}

#[tokio::test]
async fn a_status_answered_422_is_not_retried_and_the_bind_stands() {
    let (api, ctx) = core(answers(Some((CLAIM_STATUS, Answer::invalid()))));
    let err = reconcile(ctx.clone(), "t/c".into()).await.unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    // Retrying the same write cannot help; the next change of the claim passes it again.
    assert_eq!(err.retry(), Retry::Never);
    assert!(err.refused());
    assert_eq!(
        api.writes().iter().map(Call::line).collect::<Vec<_>>(),
        [format!("PATCH {ADDRESS}"), format!("PATCH {CLAIM_STATUS}")]
    );
}

/// A Bound address whose claim the cache does not show (deleted, or a watch behind).
fn orphan_core(claim_exists: bool) -> (MockApi, Arc<Context>) {
    let bound = patched(
        address_json(),
        &json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
            "status": {"phase": "Bound"}}),
    );
    let served = bound.clone();
    let (api, ctx) = core(
        move |call| match (call.method.as_str(), call.path.as_str()) {
            ("GET", ADDRESS) => Answer::Object(served.clone()),
            ("GET", "/apis/local.sdn.cozystack.io/v1alpha1/namespaces/t/ipaddressclaims/c")
                if claim_exists =>
            {
                Answer::Object(claim_json())
            }
            ("PATCH", p) if p.starts_with(ADDRESS) => {
                Answer::Object(patched(served.clone(), &call.body))
            }
            _ => Answer::Status(404, "NotFound"),
        },
    );
    ctx.world.claims.apply("t/c".into(), None);
    let a: IPAddress = serde_json::from_value(bound).unwrap();
    ctx.world.addresses.apply(key_of(&a), Some(Arc::new(a)));
    (api, ctx)
}

/// SPEC §5.6: nothing destructive rests on the cache's word about another object. The
/// cache lost the claim; kube-apiserver still has it: the pass reads, and writes nothing.
#[tokio::test]
async fn an_address_whose_claim_the_cache_lost_is_kept_when_the_api_server_has_it() {
    let (api, ctx) = orphan_core(true);
    crate::reconcile::address::reconcile(ctx, "ipv4-192-0-2-1".into())
        .await
        .unwrap();
    let calls: Vec<String> = api.writes().iter().map(Call::line).collect();
    assert!(
        calls.iter().all(|c| c.starts_with("GET ")),
        "only reads: {calls:?}"
    );
    assert!(
        calls.iter().any(|c| c.ends_with("/ipaddressclaims/c")),
        "{calls:?}"
    );
}

/// The positive control: the claim is gone from kube-apiserver too, and the address is
/// released — one status patch, guarded by the resourceVersion just read.
#[tokio::test]
async fn an_address_whose_claim_is_gone_is_released_on_the_api_servers_word() {
    let (api, ctx) = orphan_core(false);
    crate::reconcile::address::reconcile(ctx, "ipv4-192-0-2-1".into())
        .await
        .unwrap();
    let writes: Vec<Call> = api
        .writes()
        .into_iter()
        .filter(|c| c.method != "GET")
        .collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].line(), format!("PATCH {ADDRESS}/status"));
    assert_eq!(writes[0].body["metadata"]["resourceVersion"], "10");
    assert_eq!(writes[0].body["status"]["phase"], "Released");
}

/// `address-controller adopt` makes the claim's address first, as a reservation (a
/// claimRef without uid), then the claim: the claim pass completes the reservation and
/// binds no free address of the class.
#[tokio::test]
async fn a_reservation_made_before_its_claim_is_completed_not_passed_over() {
    let (api, ctx) = core(|call| {
        if call.method == "PATCH" {
            return Answer::Object(patched(address_json(), &call.body));
        }
        Answer::Status(404, "NotFound")
    });
    let reservation: IPAddress = serde_json::from_value(json!({
        "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": "ipv4-192-0-2-7", "uid": "r-uid", "resourceVersion": "20"},
        "spec": {"address": "192.0.2.7", "className": "pool", "source": {"fromClass": {}},
            "claimRef": {"namespace": "t", "name": "c"}}}))
    .unwrap();
    ctx.world
        .addresses
        .apply(key_of(&reservation), Some(Arc::new(reservation)));
    let _ = reconcile(ctx, "t/c".into()).await;
    let lines: Vec<String> = api.writes().iter().map(Call::line).collect();
    println!("{lines:?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.ends_with("/ipaddresses/ipv4-192-0-2-1")),
        "the free address was bound: {lines:?}"
    );
}

/// What `adopt` now relies on: a claim pinned to its reservation, seen before the
/// reservation (two watch streams), waits for it and binds no free address; once the
/// reservation shows, the pass completes it.
#[tokio::test]
async fn a_claim_pinned_to_a_reservation_it_has_not_seen_yet_waits_for_it() {
    let (api, ctx) = core(|call| {
        if call.method == "PATCH" && call.path.contains("/ipaddressclaims/") {
            return Answer::Object(patched(claim_json(), &call.body));
        }
        if call.method == "PATCH" {
            return Answer::Object(patched(address_json(), &call.body));
        }
        Answer::Status(404, "NotFound")
    });
    let pinned: IPAddressClaim = serde_json::from_value(patched(
        claim_json(),
        &json!({"spec": {"addressName": "ipv4-192-0-2-7"}}),
    ))
    .unwrap();
    ctx.world
        .claims
        .apply(key_of(&pinned), Some(Arc::new(pinned)));
    let _ = reconcile(ctx.clone(), "t/c".into()).await;
    let first: Vec<String> = api.writes().iter().map(Call::line).collect();
    assert!(
        !first.iter().any(|l| l.contains("/ipaddresses/")),
        "no address is written before the pinned one shows: {first:?}"
    );
    let reservation: IPAddress = serde_json::from_value(json!({
        "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": "ipv4-192-0-2-7", "uid": "r-uid", "resourceVersion": "20"},
        "spec": {"address": "192.0.2.7", "className": "pool", "source": {"fromClass": {}},
            "claimRef": {"namespace": "t", "name": "c"}}}))
    .unwrap();
    ctx.world
        .addresses
        .apply(key_of(&reservation), Some(Arc::new(reservation)));
    let _ = reconcile(ctx, "t/c".into()).await;
    let all: Vec<String> = api.writes().iter().map(Call::line).collect();
    assert!(
        all.iter()
            .any(|l| l.ends_with("/ipaddresses/ipv4-192-0-2-7")),
        "the reservation is completed: {all:?}"
    );
    assert!(
        !all.iter()
            .any(|l| l.ends_with("/ipaddresses/ipv4-192-0-2-1")),
        "the free address is never bound: {all:?}"
    );
}

/// #57's race, held open: a Retain address is released by its claim's reclaim (the claim
/// deleted) and read before the address pass ever runs again — the fresh clone's history
/// test read it then. The one write that releases it closes its open holding at its own
/// `releasedAt`; before, the write carried no history and the holding stayed open until a
/// second write of the address pass (here it never comes: the release write is all there
/// is — without the fix this test fails every time).
#[tokio::test]
async fn the_reclaims_release_closes_the_holding_in_the_same_write() {
    let (api, ctx) = core(|call| match (call.method.as_str(), call.path.as_str()) {
        ("PATCH", p) if p == format!("{ADDRESS}/status") => {
            Answer::Object(patched(address_json(), &call.body))
        }
        ("PATCH", "/apis/local.sdn.cozystack.io/v1alpha1/namespaces/t/ipaddressclaims/c") => {
            Answer::Object(patched(claim_json(), &call.body))
        }
        _ => Answer::Status(404, "NotFound"),
    });
    // The address Bound to the claim, its holding open; the claim being deleted.
    let bound: IPAddress = serde_json::from_value(json!({
        "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": "ipv4-192-0-2-1", "uid": "address-uid", "resourceVersion": "11",
            "finalizers": [address_controller_api::names::ADDRESS_FINALIZER]},
        "spec": {"address": "192.0.2.1", "className": "pool", "source": {"fromClass": {}},
            "claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
        "status": {"phase": "Bound", "history": [{"namespace": "t", "name": "c",
            "uid": "claim-uid", "state": "Bound", "from": "2026-12-01T00:00:00Z"}]}}))
    .unwrap();
    ctx.world
        .addresses
        .apply(key_of(&bound), Some(Arc::new(bound)));
    let mut claim = claim_json();
    claim["metadata"]["deletionTimestamp"] = json!("2026-12-06T00:00:00Z");
    claim["status"] = json!({"phase": "Bound", "addresses": [{"name": "ipv4-192-0-2-1", "address": "192.0.2.1"}]});
    let claim: IPAddressClaim = serde_json::from_value(claim).unwrap();
    ctx.world
        .claims
        .apply(key_of(&claim), Some(Arc::new(claim)));
    reconcile(ctx.clone(), "t/c".into()).await.unwrap();
    let writes = api.writes();
    let release = writes
        .iter()
        .find(|w| w.path.ends_with("/status") && w.path.contains("ipaddresses"))
        .unwrap_or_else(|| {
            panic!(
                "no release: {:?}",
                writes.iter().map(Call::line).collect::<Vec<_>>()
            )
        });
    let status = &release.body["status"];
    assert_eq!(status["phase"], "Released", "{status}");
    assert_eq!(release.body["metadata"]["resourceVersion"], "11");
    let history = status["history"]
        .as_array()
        .expect("the history rides on the release");
    assert_eq!(history.len(), 1, "{status}");
    assert_eq!(history[0]["until"], status["releasedAt"], "{status}");
    assert_eq!(history[0]["ended"], "Released", "{status}");
}
