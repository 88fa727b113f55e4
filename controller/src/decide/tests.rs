//! Table-style tests of the pure decisions, one per row of SPEC §4–§6.

#![allow(clippy::type_complexity)] // the case tables read better inline

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use address_controller_api::entitlement::{QuotaLimits, usage_by_class};
use address_controller_api::names::{
    ADDRESS_FINALIZER, CLAIM_FINALIZER, DEFAULT_CLASS_ANNOTATION, HELD_ANNOTATION,
    PROVISIONED_BY_ANNOTATION, PROVISIONER_ANNOTATION, event, reason, released,
};
use address_controller_api::{
    AddressPhase, ClaimPhase, ClaimRef, IPAddress, IPAddressClaim, IPAddressClass, IPAddressQuota,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use address_controller_api::family::Family;
use kube::ResourceExt;

use super::address::{AddressSnapshot, AddressStatusWrite, plan_address};
use super::claim::{AddressWrite, ClaimPlan, ClaimSnapshot, pin_of, plan_claim};
use super::is_free;

fn now() -> Time {
    Time("2026-01-01T12:00:00Z".parse::<Timestamp>().unwrap())
}

fn at(s: &str) -> Time {
    Time(s.parse::<Timestamp>().unwrap())
}

fn class(name: &str, extra: Value) -> Arc<IPAddressClass> {
    let mut v = json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
        "metadata": {"name": name}, "spec": {"provisioner": format!("{name}.drivers.example")}});
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn default_class(name: &str) -> Arc<IPAddressClass> {
    class(
        name,
        json!({"metadata": {"annotations": {DEFAULT_CLASS_ANNOTATION: "true"}}}),
    )
}

fn addr(name: &str, ip: &str, class: &str, extra: Value) -> Arc<IPAddress> {
    let mut v = json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "10",
            "finalizers": [ADDRESS_FINALIZER]},
        "spec": {"address": ip, "className": class, "source": {"fromClass": {}}},
        "status": {"phase": "Available"}});
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

fn bound_to(uid: Option<&str>) -> Value {
    json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": uid}}, "status": {"phase": "Bound"}})
}

fn claim(extra: Value) -> IPAddressClaim {
    let mut v = json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
        "metadata": {"name": "c", "namespace": "t", "uid": "claim-uid", "generation": 3,
            "resourceVersion": "5", "finalizers": [CLAIM_FINALIZER]},
        "spec": {}});
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

pub(crate) fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

fn plan(
    c: &IPAddressClaim,
    addresses: &[Arc<IPAddress>],
    classes: &[Arc<IPAddressClass>],
) -> ClaimPlan {
    plan_taken(c, addresses, classes, &HashSet::new())
}

fn plan_taken(
    c: &IPAddressClaim,
    addresses: &[Arc<IPAddress>],
    classes: &[Arc<IPAddressClass>],
    taken: &HashSet<String>,
) -> ClaimPlan {
    plan_entitled(c, addresses, classes, taken, &BTreeMap::new(), &[])
}

/// With the namespace's labels and quotas; the usage is computed from `addresses` by the
/// API's rule (the quota book keeps the same count incrementally).
fn plan_entitled(
    c: &IPAddressClaim,
    addresses: &[Arc<IPAddress>],
    classes: &[Arc<IPAddressClass>],
    taken: &HashSet<String>,
    labels: &BTreeMap<String, String>,
    quotas: &[IPAddressQuota],
) -> ClaimPlan {
    // The snapshot the reconciler builds from its indexes, built here by scanning.
    let named: Vec<Arc<IPAddress>> = addresses.iter().filter(|a| a.names(c)).cloned().collect();
    let pinned = pin_of(c).and_then(|p| addresses.iter().find(|a| a.name_any() == p));
    let candidate = |class: &str, f: Family| {
        addresses
            .iter()
            .filter(|a| is_free(a, class, f) && !taken.contains(&a.name_any()))
            .min_by_key(|a| a.name_any())
            .cloned()
    };
    plan_claim(&ClaimSnapshot {
        claim: c,
        named: &named,
        pinned: pinned.map(Arc::as_ref),
        pinned_taken: pin_of(c).is_some_and(|p| taken.contains(p)),
        candidate: &candidate,
        address: &|name: &str| addresses.iter().find(|a| a.name_any() == name).cloned(),
        classes,
        namespace_labels: Some(labels),
        quota: &|class: &str| {
            let limits = QuotaLimits::of_class(quotas.iter(), class)?;
            let used = usage_by_class("t", [], addresses.iter().map(Arc::as_ref))
                .remove(class)
                .unwrap_or_default();
            Some((limits, used))
        },
        services: None,
        now: now(),
    })
}

fn binds(p: &ClaimPlan) -> Vec<&str> {
    p.address_writes
        .iter()
        .filter_map(|w| match w {
            AddressWrite::Bind { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

fn condition<'a>(p: &'a ClaimPlan, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = p
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap();
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn phase(p: &ClaimPlan) -> ClaimPhase {
    p.status.as_ref().unwrap().phase.unwrap()
}

/// Applies a plan's status and metadata to the claim, as the API server would.
fn applied(c: &IPAddressClaim, p: &ClaimPlan) -> IPAddressClaim {
    let mut c = c.clone();
    if let Some(s) = &p.status {
        c.status = Some(s.clone());
    }
    if let Some(m) = &p.metadata {
        if let Some(f) = &m.finalizers {
            c.metadata.finalizers = Some(f.clone());
        }
        if let Some(v) = &m.provisioner {
            c.metadata
                .annotations
                .get_or_insert_default()
                .insert(PROVISIONER_ANNOTATION.into(), v.clone());
        }
    }
    c
}

// ---- §13 entitlements ---------------------------------------------------------------------

fn gold_class() -> Arc<IPAddressClass> {
    class(
        "pub",
        json!({"metadata": {"annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "spec": {"namespaceSelector": {"matchLabels": {"tier": "gold"}}}}),
    )
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn quota(limits: Value) -> IPAddressQuota {
    serde_json::from_value(
        json!({"metadata": {"name": "q", "namespace": "t"}, "spec": {"limits": limits}}),
    )
    .unwrap()
}

#[test]
fn a_namespace_the_class_does_not_admit_waits_without_binding_or_inviting_a_driver() {
    let c = claim(json!({"status": {"phase": "Pending"}}));
    let classes = [gold_class()];
    let free = [addr("a", "192.0.2.1", "pub", json!({}))];
    let none = HashSet::new();
    let p = plan_entitled(
        &c,
        &free,
        &classes,
        &none,
        &labels(&[("tier", "silver")]),
        &[],
    );
    assert!(binds(&p).is_empty(), "never bound");
    assert!(
        p.metadata.is_none(),
        "no stamp: no driver provisions for it"
    );
    assert_eq!(phase(&p), ClaimPhase::Pending);
    let (st, r, m) = condition(&p, "Bound");
    assert_eq!((st, r), ("False", reason::NAMESPACE_NOT_ADMITTED));
    assert!(
        m.contains("\"pub\"") && m.contains("\"t\"") && m.contains("tier=gold"),
        "{m}"
    );
    assert_eq!(p.events.len(), 1, "one event: {:?}", p.events);
    assert_eq!(p.events[0].reason, reason::NAMESPACE_NOT_ADMITTED);
    // The next pass says nothing new.
    let again = plan_entitled(&applied(&c, &p), &free, &classes, &none, &labels(&[]), &[]);
    assert!(
        again.events.is_empty() && again.status.is_none(),
        "{again:?}"
    );
    // Labelled: it binds, as any claim.
    let p = plan_entitled(
        &applied(&c, &p),
        &free,
        &classes,
        &none,
        &labels(&[("tier", "gold")]),
        &[],
    );
    assert_eq!(binds(&p), ["a"]);
    assert_eq!(
        p.quota_take, None,
        "no quota in the namespace: nothing to take"
    );
}

#[test]
fn a_bound_claim_keeps_its_address_when_the_namespace_is_no_longer_admitted_or_over_quota() {
    let c = claim(json!({"status": {"phase": "Bound", "className": "pub",
        "addresses": [{"name": "a", "address": "192.0.2.1"}]}}));
    let held = [addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid")))];
    let q = [quota(json!([{"className": "pub", "addresses": 0}]))];
    let p = plan_entitled(
        &c,
        &held,
        &[gold_class()],
        &HashSet::new(),
        &labels(&[]),
        &q,
    );
    assert!(p.address_writes.is_empty(), "{p:?}");
    assert_eq!(phase(&p), ClaimPhase::Bound);
    assert_eq!(condition(&p, "Bound").1, reason::BOUND);
    assert!(p.events.iter().all(|e| e.reason != reason::QUOTA_EXCEEDED));
}

#[test]
fn a_dual_claim_counts_twice_and_the_next_claim_waits_with_quota_exceeded() {
    // Quota 2: the namespace's Dual claim holds two addresses; an IPv4 claim would be a third.
    let dual = |name: &str, ip: &str| {
        addr(
            name,
            ip,
            "pub",
            json!({"spec": {"claimRef": {"namespace": "t", "name": "d", "uid": "d-uid"}},
            "status": {"phase": "Bound"}}),
        )
    };
    let addresses = [
        dual("d4", "192.0.2.1"),
        dual("d6", "2001:db8::1"),
        addr("free", "192.0.2.9", "pub", json!({})),
    ];
    let classes = [default_class("pub")];
    let q = [quota(json!([{"className": "pub", "addresses": 2}]))];
    let c = claim(json!({"status": {"phase": "Pending"}}));
    let p = plan_entitled(&c, &addresses, &classes, &HashSet::new(), &labels(&[]), &q);
    assert!(binds(&p).is_empty());
    assert!(p.metadata.is_none(), "no stamp");
    let (_, r, m) = condition(&p, "Bound");
    assert_eq!(r, reason::QUOTA_EXCEEDED);
    assert!(
        m.contains("IPAddressQuota t/q allows 2 address(es) of class \"pub\"")
            && m.contains("holds 2 and the claim needs 1"),
        "{m}"
    );
    assert_eq!(p.events.len(), 1);
    // A limit of 3 admits it: it binds and takes its family from the quota.
    let q3 = [quota(json!([{"className": "pub", "addresses": 3}]))];
    let p = plan_entitled(
        &applied(&c, &p),
        &addresses,
        &classes,
        &HashSet::new(),
        &labels(&[]),
        &q3,
    );
    assert_eq!(binds(&p), ["free"]);
    let take = p.quota_take.as_ref().unwrap();
    assert_eq!(
        (take.class.as_str(), take.families.as_slice()),
        ("pub", &[Family::IPv4][..])
    );
    // A per-family limit: IPv6 full, IPv4 open.
    let q6 = [quota(json!([{"className": "pub", "ipv6": 1}]))];
    let v6 = claim(json!({"spec": {"family": "IPv6"}, "status": {"phase": "Pending"}}));
    let p = plan_entitled(
        &v6,
        &addresses,
        &classes,
        &HashSet::new(),
        &labels(&[]),
        &q6,
    );
    assert_eq!(condition(&p, "Bound").1, reason::QUOTA_EXCEEDED);
    let p = plan_entitled(&c, &addresses, &classes, &HashSet::new(), &labels(&[]), &q6);
    assert_eq!(binds(&p), ["free"]);
}

#[test]
fn a_claim_invited_to_provision_takes_its_families_from_the_quota() {
    let c = claim(json!({"spec": {"family": "Dual"}, "status": {"phase": "Pending"}}));
    let q = [quota(json!([{"className": "pub", "addresses": 2}]))];
    let p = plan_entitled(
        &c,
        &[],
        &[default_class("pub")],
        &HashSet::new(),
        &labels(&[]),
        &q,
    );
    assert_eq!(condition(&p, "Bound").1, reason::WAITING_FOR_PROVISIONING);
    assert!(
        p.metadata.as_ref().unwrap().provisioner.is_some(),
        "stamped"
    );
    assert_eq!(
        p.quota_take.as_ref().unwrap().families,
        [Family::IPv4, Family::IPv6]
    );
}

// ---- §4.2 finalizer and stamp -------------------------------------------------------------

#[test]
fn a_new_claim_that_binds_a_free_address_gets_the_finalizer_and_no_stamp() {
    let c = claim(json!({"metadata": {"finalizers": null}}));
    let classes = [default_class("pub")];
    let addresses = [
        addr("b", "192.0.2.2", "pub", json!({})),
        addr("a", "192.0.2.1", "pub", json!({})),
    ];
    let p = plan(&c, &addresses, &classes);
    let m = p.metadata.as_ref().unwrap();
    assert_eq!(
        m.finalizers.as_deref(),
        Some(&[CLAIM_FINALIZER.to_string()][..])
    );
    // SPEC §5.7: a pass that binds a free address never invites a driver to provision.
    assert_eq!(m.provisioner, None);
    assert_eq!(binds(&p), ["a"]);
    assert_eq!(phase(&p), ClaimPhase::Bound);
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.class_name.as_deref(), Some("pub"));
    assert_eq!(s.addresses[0].address, "192.0.2.1");
    assert_eq!(
        condition(&p, "ClassResolved"),
        (
            "True",
            reason::RESOLVED,
            "resolved to IPAddressClass \"pub\""
        )
    );
    assert_eq!(condition(&p, "Bound").1, reason::BOUND);
    // One event per bind: `Matched` says it; no separate `Bound`.
    let events: Vec<&str> = p.events.iter().map(|e| e.reason).collect();
    assert_eq!(events, [event::MATCHED]);
    // observedGeneration on every condition.
    assert!(
        s.conditions
            .iter()
            .all(|c| c.observed_generation == Some(3))
    );
}

#[test]
fn a_new_claim_without_a_candidate_gets_finalizer_and_stamp_in_one_patch() {
    let c = claim(json!({"metadata": {"finalizers": null}}));
    let p = plan(&c, &[], &[default_class("pub")]);
    let m = p.metadata.as_ref().unwrap();
    assert_eq!(
        m.finalizers.as_deref(),
        Some(&[CLAIM_FINALIZER.to_string()][..])
    );
    assert_eq!(m.provisioner.as_deref(), Some("pub.drivers.example"));
    assert_eq!(condition(&p, "Bound").1, reason::WAITING_FOR_PROVISIONING);
}

#[test]
fn a_dual_claim_that_binds_one_family_is_stamped_only_on_a_later_pass() {
    let classes = [default_class("pub")];
    let c = claim(json!({"spec": {"family": "Dual"}}));
    let v4 = addr("a", "192.0.2.1", "pub", json!({}));
    let p = plan(&c, std::slice::from_ref(&v4), &classes);
    assert_eq!(binds(&p), ["a"]);
    assert!(
        p.metadata.is_none(),
        "no stamp in a pass that binds: {:?}",
        p.metadata
    );
    // Next pass: the IPv4 address is held, IPv6 has no candidate → now the driver is asked.
    let c2 = applied(&c, &p);
    let held = addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let p2 = plan(&c2, &[held], &classes);
    assert_eq!(
        p2.metadata.unwrap().provisioner.as_deref(),
        Some("pub.drivers.example")
    );
}

#[test]
fn stamp_follows_retargeting_while_unbound() {
    let c = claim(
        json!({"metadata": {"annotations": {PROVISIONER_ANNOTATION: "old.drivers.example"}},
        "spec": {"className": "new"}}),
    );
    let p = plan(&c, &[], &[class("new", json!({}))]);
    let m = p.metadata.unwrap();
    assert_eq!(m.provisioner.as_deref(), Some("new.drivers.example"));
    assert_eq!(m.finalizers, None, "finalizer already present");
}

// ---- §4.7 class resolution ----------------------------------------------------------------

#[test]
fn class_resolution_rows() {
    let cases: Vec<(&str, Value, Vec<Arc<IPAddressClass>>, &str, Option<&str>)> = vec![
        (
            "named",
            json!({"spec": {"className": "x"}}),
            vec![class("x", json!({})), default_class("d")],
            reason::RESOLVED,
            Some("x"),
        ),
        (
            "default",
            json!({}),
            vec![class("x", json!({})), default_class("d")],
            reason::RESOLVED,
            Some("d"),
        ),
        (
            "sticky status",
            json!({"status": {"className": "x"}}),
            vec![class("x", json!({})), default_class("d")],
            reason::RESOLVED,
            Some("x"),
        ),
        (
            "named missing",
            json!({"spec": {"className": "nope"}}),
            vec![default_class("d")],
            reason::CLASS_NOT_FOUND,
            None,
        ),
        (
            "no default",
            json!({}),
            vec![class("x", json!({}))],
            reason::NO_DEFAULT_CLASS,
            None,
        ),
        (
            "default only when exactly true",
            json!({}),
            vec![class(
                "x",
                json!({"metadata": {"annotations": {DEFAULT_CLASS_ANNOTATION: "True"}}}),
            )],
            reason::NO_DEFAULT_CLASS,
            None,
        ),
        (
            "several defaults",
            json!({}),
            vec![default_class("d1"), default_class("d2")],
            reason::MULTIPLE_DEFAULT_CLASSES,
            None,
        ),
    ];
    for (what, extra, classes, want_reason, want_class) in cases {
        let c = claim(extra);
        let p = plan(&c, &[], &classes);
        let (status, reason_, message) = condition(&p, "ClassResolved");
        assert_eq!(reason_, want_reason, "{what}: {message}");
        assert_eq!(status == "True", want_class.is_some(), "{what}");
        if let Some(want) = want_class {
            assert_eq!(
                p.status.as_ref().unwrap().class_name.as_deref(),
                Some(want),
                "{what}"
            );
            assert_eq!(
                condition(&p, "Bound").1,
                reason::WAITING_FOR_PROVISIONING,
                "{what}"
            );
        } else {
            assert_eq!(phase(&p), ClaimPhase::Pending, "{what}");
            assert!(
                p.events
                    .iter()
                    .any(|e| e.warning && e.reason == want_reason),
                "{what}: warning event"
            );
            assert!(
                p.metadata
                    .as_ref()
                    .and_then(|m| m.provisioner.as_ref())
                    .is_none(),
                "{what}: no stamp"
            );
        }
    }
    let p = plan(
        &claim(json!({})),
        &[],
        &[default_class("d2"), default_class("d1")],
    );
    assert!(condition(&p, "ClassResolved").2.contains("d1, d2"));
}

#[test]
fn class_failure_event_is_not_repeated_in_steady_state() {
    let c = claim(json!({"spec": {"className": "nope"}}));
    let p1 = plan(&c, &[], &[]);
    assert_eq!(p1.events.len(), 1);
    let c2 = applied(&c, &p1);
    let p2 = plan(&c2, &[], &[]);
    assert!(p2.is_empty(), "steady state must plan nothing: {p2:?}");
}

// ---- §4.3–4.5 collection, pre-binding, satisfaction ----------------------------------------

#[test]
fn prebinding_is_completed_with_the_uid_and_counts_as_bound() {
    let c = claim(json!({}));
    let a = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c"}}, "status": {"phase": "Pending"}}),
    );
    let p = plan(&c, &[a], &[]);
    assert!(
        matches!(&p.address_writes[..], [AddressWrite::CompleteUid { name, claim_ref, resource_version }]
        if name == "a" && claim_ref.uid.as_deref() == Some("claim-uid") && resource_version.as_deref() == Some("10"))
    );
    assert_eq!(phase(&p), ClaimPhase::Bound);
}

#[test]
fn stale_binding_of_an_older_claim_is_never_adopted() {
    let c = claim(json!({"spec": {"className": "pub"}}));
    let stale = addr("a", "192.0.2.1", "pub", bound_to(Some("older-uid")));
    let p = plan(&c, &[stale], &[class("pub", json!({}))]);
    assert!(p.address_writes.is_empty());
    assert_eq!(phase(&p), ClaimPhase::Pending);
    assert!(p.status.unwrap().addresses.is_empty());
}

#[test]
fn bound_claim_ignores_its_class_even_when_deleted() {
    let c = claim(json!({"spec": {"className": "gone"},
        "status": {"phase": "Bound", "className": "gone"}}));
    let a = addr("a", "192.0.2.1", "gone", bound_to(Some("claim-uid")));
    let p1 = plan(&c, std::slice::from_ref(&a), &[]);
    assert_eq!(phase(&p1), ClaimPhase::Bound);
    assert!(
        p1.status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.type_ != "ClassResolved")
    );
    let p2 = plan(&applied(&c, &p1), &[a], &[]);
    assert!(p2.is_empty(), "converged: {p2:?}");
}

// ---- static matching ---------------------------------------------------------------------

#[test]
fn static_matching_by_class_and_family_lowest_name() {
    let classes = [class("pub", json!({}))];
    let addresses = [
        addr("a0", "192.0.2.9", "other", json!({})), // wrong class
        addr("a1", "2001:db8::1", "pub", json!({})), // wrong family
        addr(
            "a2",
            "192.0.2.2",
            "pub",
            json!({"status": {"phase": "Pending"}}),
        ), // not Available
        addr(
            "a3",
            "192.0.2.3",
            "pub",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ),
        addr("a4", "192.0.2.4", "pub", bound_to(Some("x"))), // bound elsewhere
        addr("a5", "192.0.2.5", "pub", json!({})),           // taken by another worker
        addr("a7", "192.0.2.7", "pub", json!({})),
        addr("a6", "192.0.2.6", "pub", json!({})),
        addr("a8", "bogus", "pub", json!({})),
    ];
    let taken = HashSet::from(["a5".to_string()]);
    let p = plan_taken(
        &claim(json!({"spec": {"className": "pub"}})),
        &addresses,
        &classes,
        &taken,
    );
    assert_eq!(binds(&p), ["a6"]);
    assert!(
        matches!(&p.address_writes[0], AddressWrite::Bind { claim_ref, .. } if claim_ref.uid.as_deref() == Some("claim-uid"))
    );
}

#[test]
fn ipv4_mapped_ipv6_counts_as_ipv4() {
    let p = plan(
        &claim(json!({"spec": {"className": "pub", "family": "IPv6"}})),
        &[addr("m", "::ffff:192.0.2.1", "pub", json!({}))],
        &[class("pub", json!({}))],
    );
    assert!(binds(&p).is_empty());
    let p = plan(
        &claim(json!({"spec": {"className": "pub"}})),
        &[addr("m", "::ffff:192.0.2.1", "pub", json!({}))],
        &[class("pub", json!({}))],
    );
    assert_eq!(binds(&p), ["m"]);
}

#[test]
fn dual_claim_binds_one_of_each_family_or_waits_for_the_missing_one() {
    let classes = [class("pub", json!({}))];
    let c = claim(json!({"spec": {"className": "pub", "family": "Dual"}}));
    let both = [
        addr("v4", "192.0.2.1", "pub", json!({})),
        addr("v6", "2001:db8::1", "pub", json!({})),
    ];
    let p = plan(&c, &both, &classes);
    assert_eq!(binds(&p), ["v4", "v6"]);
    assert_eq!(phase(&p), ClaimPhase::Bound);

    let only_v4 = [addr("v4", "192.0.2.1", "pub", json!({}))];
    let p = plan(&c, &only_v4, &classes);
    assert_eq!(binds(&p), ["v4"]);
    assert_eq!(phase(&p), ClaimPhase::Pending);
    let (_, r, m) = condition(&p, "Bound");
    assert_eq!(r, reason::WAITING_FOR_PROVISIONING);
    assert!(m.contains("IPv6"), "{m}");
}

#[test]
fn no_candidate_waits_for_the_driver() {
    let p = plan(
        &claim(json!({"spec": {"className": "pub"}})),
        &[],
        &[class("pub", json!({}))],
    );
    assert_eq!(phase(&p), ClaimPhase::Pending);
    let (s, r, m) = condition(&p, "Bound");
    assert_eq!((s, r), ("False", reason::WAITING_FOR_PROVISIONING));
    assert!(m.contains("pub.drivers.example"), "{m}");
}

// ---- spec.addressName pinning ------------------------------------------------------------

#[test]
fn pinned_address_rows() {
    let classes = [class("pub", json!({})), class("other", json!({}))];
    let cases: Vec<(&str, Option<Arc<IPAddress>>, Option<&str>)> = vec![
        ("free", Some(addr("p", "192.0.2.1", "pub", json!({}))), None),
        (
            "free even if not Available yet",
            Some(addr("p", "192.0.2.1", "pub", json!({"status": null}))),
            None,
        ),
        ("missing", None, Some("does not exist")),
        (
            "wrong class",
            Some(addr("p", "192.0.2.1", "other", json!({}))),
            Some("belongs to class \"other\""),
        ),
        (
            "wrong family",
            Some(addr("p", "2001:db8::1", "pub", json!({}))),
            Some("is IPv6; the claim wants IPv4"),
        ),
        (
            "bound elsewhere",
            Some(addr(
                "p",
                "192.0.2.1",
                "pub",
                json!({"spec": {"claimRef": {"namespace": "x", "name": "y", "uid": "u"}}}),
            )),
            Some("does not exist or is not available to this claim"),
        ),
        (
            "conflict",
            Some(addr(
                "p",
                "192.0.2.1",
                "pub",
                json!({"status": {"phase": "Conflict"}}),
            )),
            Some("in phase Conflict"),
        ),
        (
            "lost",
            Some(addr(
                "p",
                "192.0.2.1",
                "pub",
                json!({"status": {"phase": "Lost"}}),
            )),
            Some("in phase Lost"),
        ),
        (
            "deleting",
            Some(addr(
                "p",
                "192.0.2.1",
                "pub",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            )),
            Some("being deleted"),
        ),
    ];
    for (what, a, problem) in cases {
        let c = claim(json!({"spec": {"className": "pub", "addressName": "p"}}));
        let addresses: Vec<Arc<IPAddress>> = a
            .into_iter()
            .chain([addr("z-free", "192.0.2.50", "pub", json!({}))])
            .collect();
        let p = plan(&c, &addresses, &classes);
        match problem {
            None => assert_eq!(binds(&p), ["p"], "{what}"),
            Some(want) => {
                assert!(
                    binds(&p).is_empty(),
                    "{what}: never falls back to another address"
                );
                let (s, r, m) = condition(&p, "Bound");
                assert_eq!((s, r), ("False", reason::WAITING_FOR_ADDRESS), "{what}");
                assert!(m.contains(want), "{what}: {m}");
            }
        }
    }
}

// ---- §4.6 Lost ---------------------------------------------------------------------------

#[test]
fn lost_is_surfaced_not_replaced_and_recovers() {
    let classes = [class("pub", json!({}))];
    let c = claim(
        json!({"spec": {"className": "pub"}, "status": {"phase": "Bound", "className": "pub"}}),
    );
    let lost = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
        "status": {"phase": "Lost"}}),
    );
    let spare = addr("b", "192.0.2.2", "pub", json!({}));
    let p = plan(&c, &[lost.clone(), spare.clone()], &classes);
    assert!(binds(&p).is_empty(), "no replacement");
    assert_eq!(phase(&p), ClaimPhase::Lost);
    let (_, r, m) = condition(&p, "Bound");
    assert_eq!(r, reason::ADDRESS_LOST);
    assert!(m.contains("a is Lost"), "{m}");
    assert!(
        p.events
            .iter()
            .any(|e| e.warning && e.reason == reason::ADDRESS_LOST)
    );
    let lost_claim = applied(&c, &p);
    assert!(
        plan(&lost_claim, &[lost, spare.clone()], &classes).is_empty(),
        "steady Lost"
    );

    // The driver clears Lost: the claim is Bound again by itself.
    let recovered = addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let p = plan(&lost_claim, &[recovered, spare], &classes);
    assert_eq!(phase(&p), ClaimPhase::Bound);
    assert!(binds(&p).is_empty());
}

#[test]
fn bound_claim_whose_address_is_being_deleted_is_lost() {
    let c = claim(json!({"status": {"phase": "Bound", "className": "pub"}}));
    let mut v = bound_to(Some("claim-uid"));
    merge(
        &mut v,
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    );
    let p = plan(
        &c,
        &[addr("a", "192.0.2.1", "pub", v)],
        &[class("pub", json!({}))],
    );
    assert_eq!(phase(&p), ClaimPhase::Lost);
    assert_eq!(condition(&p, "Bound").2, "IPAddress a is being deleted");
}

#[test]
fn bound_claim_whose_address_disappeared_is_lost() {
    let c = claim(json!({"status": {"phase": "Bound", "className": "pub"}}));
    let p = plan(
        &c,
        &[addr("b", "192.0.2.2", "pub", json!({}))],
        &[class("pub", json!({}))],
    );
    assert_eq!(phase(&p), ClaimPhase::Lost);
    assert!(binds(&p).is_empty());
}

// ---- steady state ------------------------------------------------------------------------

#[test]
fn converged_bound_claim_plans_nothing() {
    let classes = [default_class("pub")];
    let c = claim(json!({"metadata": {"finalizers": null}}));
    let a = addr("a", "192.0.2.1", "pub", json!({}));
    let p1 = plan(&c, std::slice::from_ref(&a), &classes);
    let c2 = applied(&c, &p1);
    let a2 = addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let p2 = plan(&c2, &[a2], &classes);
    assert!(p2.is_empty(), "{p2:?}");
}

// ---- §6 reclaim --------------------------------------------------------------------------

#[test]
fn reclaim_rows() {
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
    let owned = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Service", "name": "c", "uid": "svc", "controller": true}]}});
    let retain = addr("r", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let delete = addr("d", "2001:db8::1", "pub", {
        let mut v = bound_to(Some("claim-uid"));
        merge(&mut v, json!({"spec": {"reclaimPolicy": "Delete"}}));
        v
    });
    let released = addr("x", "192.0.2.3", "pub", {
        let mut v = bound_to(Some("claim-uid"));
        merge(
            &mut v,
            json!({"status": {"phase": "Released", "releasedFrom": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
        );
        v
    });
    let other = addr("o", "192.0.2.4", "pub", bound_to(Some("another-claim")));

    let p = plan(
        &claim(deleting.clone()),
        &[
            retain.clone(),
            delete.clone(),
            released.clone(),
            other.clone(),
        ],
        &[],
    );
    assert_eq!(p.address_writes.len(), 2, "{:?}", p.address_writes);
    assert_eq!(
        p.address_writes[0],
        AddressWrite::Delete {
            name: "d".into(),
            uid: Some("uid-d".into())
        }
    );
    let AddressWrite::Release {
        name,
        resource_version,
        status,
    } = &p.address_writes[1]
    else {
        panic!("not a release: {:?}", p.address_writes[1]);
    };
    assert_eq!(
        (name.as_str(), resource_version.as_deref()),
        ("r", Some("10"))
    );
    assert_eq!(status.phase, AddressPhase::Released);
    assert_eq!(
        status.released_from,
        Some(ClaimRef {
            namespace: "t".into(),
            name: "c".into(),
            uid: Some("claim-uid".into())
        })
    );
    assert_eq!(status.reason.as_deref(), Some(released::RECLAIMED));
    // The history rides on the release, closed at its releasedAt: never a Released address
    // with its holding still open (the race the fresh clone's history test met: the
    // address pass used to close it in a second write).
    let history = &status
        .history
        .as_ref()
        .expect("the history rides on the release")
        .list;
    let last = history.last().unwrap();
    assert_eq!(last.until, status.released_at);
    assert_eq!(last.ended.as_deref(), Some("Released"));
    assert_eq!(
        p.finalize,
        Some(vec![]),
        "finalizer dropped after the address writes"
    );
    assert!(p.metadata.is_none());
    let reasons: Vec<&str> = p.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, [event::ADDRESS_DELETED, event::ADDRESS_RELEASED]);

    // A surplus not yet released when its claim goes is released as surplus (it never
    // counts toward a quota); the address the claim kept is reclaimed.
    let extra = addr("s", "192.0.2.5", "pub", bound_to(Some("claim-uid")));
    let mut listing = claim(deleting.clone());
    listing.status = Some(
        serde_json::from_value(json!({"addresses": [
        {"name": "r", "address": "192.0.2.1"}]}))
        .unwrap(),
    );
    let p = plan(&listing, &[retain.clone(), extra], &[]);
    let reasons: Vec<(&str, &str)> = p
        .address_writes
        .iter()
        .filter_map(|w| match w {
            AddressWrite::Release { name, status, .. } => {
                Some((name.as_str(), status.reason.as_deref().unwrap_or_default()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        [("r", released::RECLAIMED), ("s", released::SURPLUS)]
    );

    // An auto-claim (the core's owner reference: a v1 Service of the claim's name) deletes
    // what a driver provisioned for it, whatever the policy; an admin's static address and
    // one recycled from an earlier claim keep their own policy (SPEC §6).
    let created = |t: &str| json!({"metadata": {"creationTimestamp": t}});
    let with = |a: &Arc<IPAddress>, extra: Value| {
        let mut v = serde_json::to_value(a.as_ref()).unwrap();
        merge(&mut v, extra);
        Arc::new(serde_json::from_value::<IPAddress>(v).unwrap())
    };
    let mut owned_claim = claim(owned);
    owned_claim.metadata.creation_timestamp =
        serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap();
    let provisioned = with(
        &addr("p", "192.0.2.6", "pub", bound_to(Some("claim-uid"))),
        json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:01Z",
            "annotations": {PROVISIONED_BY_ANNOTATION: "range.drivers.local.sdn.cozystack.io"}}}),
    );
    let recycled = with(
        &provisioned,
        json!({"metadata": {"name": "q", "creationTimestamp": "2025-12-31T23:00:00Z"}}),
    );
    let static_retain = with(&retain, created("2026-01-01T00:00:02Z"));
    let p = plan(
        &owned_claim,
        &[
            static_retain.clone(),
            delete.clone(),
            provisioned.clone(),
            recycled,
            other,
        ],
        &[],
    );
    let writes: Vec<(&str, bool)> = p
        .address_writes
        .iter()
        .map(|w| (w.address_name(), matches!(w, AddressWrite::Delete { .. })))
        .collect();
    assert_eq!(
        writes,
        [("d", true), ("p", true), ("q", false), ("r", false)],
        "delete: the Delete policy and the address provisioned for the auto-claim; release the rest"
    );
    // A tenant's own controller owner reference (a ConfigMap, or a Service of another
    // name) makes no auto-claim: the admin's Retain holds.
    for forged in [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "cm", "controller": true}),
        json!({"apiVersion": "v1", "kind": "Service", "name": "other", "uid": "svc", "controller": true}),
    ] {
        let mut c = claim(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "ownerReferences": [forged]}}),
        );
        c.metadata.creation_timestamp = owned_claim.metadata.creation_timestamp.clone();
        let p = plan(&c, &[static_retain.clone(), provisioned.clone()], &[]);
        assert!(
            p.address_writes
                .iter()
                .all(|w| matches!(w, AddressWrite::Release { .. })),
            "{:?}",
            p.address_writes
        );
    }

    // Without our finalizer there is nothing left to do.
    let mut gone = claim(deleting);
    gone.metadata.finalizers = Some(vec!["someone-else".into()]);
    assert!(plan(&gone, &[released], &[]).is_empty());
}

// ---- §5 addresses ------------------------------------------------------------------------

fn aplan(
    a: &IPAddress,
    c: Option<&IPAddressClaim>,
    class: Option<&IPAddressClass>,
    now: Time,
) -> super::address::AddressPlan {
    aplan_with(a, c, &[], class, now)
}

/// With the other addresses naming the same claim.
fn aplan_with(
    a: &IPAddress,
    c: Option<&IPAddressClaim>,
    others: &[Arc<IPAddress>],
    class: Option<&IPAddressClass>,
    now: Time,
) -> super::address::AddressPlan {
    history_blind(a, aplan_recorded(a, c, others, class, now))
}

/// The plan as [`plan_address`] makes it, the history included.
fn aplan_recorded(
    a: &IPAddress,
    c: Option<&IPAddressClaim>,
    others: &[Arc<IPAddress>],
    class: Option<&IPAddressClass>,
    now: Time,
) -> super::address::AddressPlan {
    let mut siblings: Vec<Arc<IPAddress>> = others.to_vec();
    siblings.push(Arc::new(a.clone()));
    plan_address(&AddressSnapshot {
        address: a,
        claim: c,
        siblings: &siblings,
        class,
        now,
    })
}

/// The plan with the history left out (the phase rows judge phases; the history has
/// tests of its own below): a status write that only records history is none.
fn history_blind(
    a: &IPAddress,
    mut plan: super::address::AddressPlan,
) -> super::address::AddressPlan {
    if let Some(st) = plan.status.as_mut() {
        st.history = None;
        let have = a.status.as_ref();
        if Some(st.phase) == a.phase()
            && st.released_at.as_ref() == a.released_at()
            && st.released_from.as_ref() == have.and_then(|h| h.released_from.as_ref())
            && st.reason.as_ref() == have.and_then(|h| h.reason.as_ref())
        {
            plan.status = None;
        }
    }
    plan
}

fn w(phase: AddressPhase, released_at: Option<Time>) -> Option<AddressStatusWrite> {
    Some(AddressStatusWrite {
        phase,
        released_at,
        released_from: None,
        reason: None,
        history: None,
        records: Vec::new(),
    })
}

/// `Released` at `at`, recording the binding `t/c` with `uid` as the one released, for
/// `reason` (`names::released`).
fn released_write(at: Time, uid: Option<&str>, reason: Option<&str>) -> Option<AddressStatusWrite> {
    Some(AddressStatusWrite {
        phase: AddressPhase::Released,
        released_at: Some(at),
        released_from: Some(ClaimRef {
            namespace: "t".into(),
            name: "c".into(),
            uid: uid.map(str::to_string),
        }),
        reason: reason.map(str::to_string),
        history: None,
        records: Vec::new(),
    })
}

#[test]
fn address_phase_rows() {
    let live = claim(json!({}));
    let deleting_claim = claim(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
    let cases: Vec<(
        &str,
        Arc<IPAddress>,
        Option<&IPAddressClaim>,
        Option<AddressStatusWrite>,
    )> = vec![
        (
            "free, new",
            addr("a", "192.0.2.1", "pub", json!({"status": null})),
            None,
            w(AddressPhase::Available, None),
        ),
        (
            "free, steady",
            addr("a", "192.0.2.1", "pub", json!({})),
            None,
            None,
        ),
        (
            "bound",
            addr(
                "a",
                "192.0.2.1",
                "pub",
                json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
            ),
            Some(&live),
            w(AddressPhase::Bound, None),
        ),
        (
            "pre-bound",
            addr(
                "a",
                "192.0.2.1",
                "pub",
                json!({"spec": {"claimRef": {"namespace": "t", "name": "c"}}, "status": null}),
            ),
            Some(&live),
            w(AddressPhase::Pending, None),
        ),
        (
            "claim deleting: wait",
            addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid"))),
            Some(&deleting_claim),
            None,
        ),
        (
            "conflict is sticky",
            addr(
                "a",
                "192.0.2.1",
                "pub",
                json!({"spec": {"claimRef": {"namespace": "t", "name": "c"}},
            "status": {"phase": "Conflict"}}),
            ),
            None,
            None,
        ),
        (
            "lost is sticky",
            addr(
                "a",
                "192.0.2.1",
                "pub",
                json!({"status": {"phase": "Lost"}}),
            ),
            None,
            None,
        ),
        (
            "admin cleared claimRef of Released",
            addr(
                "a",
                "192.0.2.1",
                "pub",
                json!({"status": {"phase": "Released", "releasedAt": "2026-01-01T00:00:00Z"}}),
            ),
            None,
            w(AddressPhase::Available, None),
        ),
    ];
    for (what, a, c, want) in cases {
        let p = aplan(&a, c, None, now());
        assert_eq!(p.status, want, "{what}");
        assert!(!p.delete && !p.clear_claim_ref, "{what}");
    }
}

#[test]
fn address_gets_its_finalizer() {
    let a = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"metadata": {"finalizers": ["driver.example/teardown"]}}),
    );
    let p = aplan(&a, None, None, now());
    assert_eq!(
        p.finalizers,
        Some(vec![
            "driver.example/teardown".into(),
            ADDRESS_FINALIZER.into()
        ])
    );
}

#[test]
fn invalid_address_is_pending_with_a_one_shot_event() {
    let a = addr(
        "a",
        "192.0.2.999",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
    );
    let p = aplan(&a, Some(&claim(json!({}))), None, now());
    assert_eq!(p.status, w(AddressPhase::Pending, None));
    assert_eq!(p.once_event.unwrap().reason, event::INVALID_ADDRESS);
}

#[test]
fn safety_net_reclaim_rows() {
    // Claim gone, Retain: Released now, confirmed first.
    let a = addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let p = aplan(&a, None, None, now());
    assert_eq!(
        p.status,
        released_write(now(), Some("claim-uid"), Some(released::RECLAIMED))
    );
    assert!(p.confirm && !p.delete);
    assert_eq!(p.events[0].reason, event::RECLAIMED);

    // uid mismatch (a newer claim of the same name): same.
    let newer = claim(json!({"metadata": {"uid": "newer"}}));
    let p = aplan(&a, Some(&newer), None, now());
    assert_eq!(
        p.status,
        released_write(now(), Some("claim-uid"), Some(released::RECLAIMED))
    );

    // Claim gone, Delete: delete the object, confirmed first.
    let d = addr("a", "192.0.2.1", "pub", {
        let mut v = bound_to(Some("claim-uid"));
        merge(&mut v, json!({"spec": {"reclaimPolicy": "Delete"}}));
        v
    });
    let p = aplan(&d, None, None, now());
    assert!(p.delete && p.confirm);

    // Already Released: steady, no event, releasedAt kept.
    let r = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
        "status": {"phase": "Released", "releasedAt": "2026-01-01T00:00:00Z",
            "releasedFrom": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
    );
    assert_eq!(aplan(&r, None, None, now()), Default::default());
}

#[test]
fn deletion_is_blocked_while_a_live_claim_holds_the_address() {
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
    let mut v = bound_to(Some("claim-uid"));
    merge(&mut v, deleting.clone());
    let a = addr("a", "192.0.2.1", "pub", v);
    let p = aplan(&a, Some(&claim(json!({}))), None, now());
    assert_eq!(p.finalizers, None);
    assert_eq!(p.once_event.unwrap().reason, event::DELETION_BLOCKED);

    // Claim being deleted, gone, or another uid: the finalizer goes.
    for (what, c) in [
        ("claim deleting", Some(claim(deleting.clone()))),
        ("claim gone", None),
        (
            "another uid",
            Some(claim(json!({"metadata": {"uid": "newer"}}))),
        ),
    ] {
        let p = aplan(&a, c.as_ref(), None, now());
        assert_eq!(p.finalizers, Some(vec![]), "{what}");
        assert_eq!(p.confirm, what != "claim deleting", "{what}");
    }
    // Not bound: the finalizer goes at once.
    let mut v = json!({});
    merge(&mut v, deleting);
    let free = addr("a", "192.0.2.1", "pub", v);
    let p = aplan(&free, None, None, now());
    assert_eq!(p.finalizers, Some(vec![]));
    assert!(!p.confirm);
}

#[test]
fn release_delay_rows() {
    let delayed = class("pub", json!({"spec": {"releaseDelay": "1h"}}));
    let released = |extra: Value| {
        let mut v = json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
            "status": {"phase": "Released", "releasedAt": "2026-01-01T11:30:00Z",
            "releasedFrom": {"namespace": "t", "name": "c", "uid": "claim-uid"}}});
        merge(&mut v, extra);
        addr("a", "192.0.2.1", "pub", v)
    };
    // Before the deadline: scheduled for the moment it elapses, no polling.
    let p = aplan(&released(json!({})), None, Some(&delayed), now());
    assert_eq!(p.requeue_after, Some(std::time::Duration::from_secs(1800)));
    assert!(!p.clear_claim_ref);
    // After: claimRef cleared, event.
    let p = aplan(
        &released(json!({})),
        None,
        Some(&delayed),
        at("2026-01-01T12:30:00Z"),
    );
    assert!(p.clear_claim_ref);
    assert_eq!(p.events[0].reason, event::RELEASE_DELAY_ELAPSED);
    // Held: waits for an admin, nothing scheduled.
    let held = released(json!({"metadata": {"annotations": {HELD_ANNOTATION: "true"}}}));
    let p = aplan(&held, None, Some(&delayed), at("2026-01-01T12:30:00Z"));
    assert!(!p.clear_claim_ref && p.requeue_after.is_none());
    // "held: false" is not held.
    let not_held = released(json!({"metadata": {"annotations": {HELD_ANNOTATION: "false"}}}));
    assert!(aplan(&not_held, None, Some(&delayed), at("2026-01-01T12:30:00Z")).clear_claim_ref);
    // No delay on the class, or no class: waits for an admin.
    assert_eq!(
        aplan(
            &released(json!({})),
            None,
            Some(&class("pub", json!({}))),
            at("2030-01-01T00:00:00Z")
        ),
        Default::default()
    );
    assert_eq!(
        aplan(&released(json!({})), None, None, at("2030-01-01T00:00:00Z")),
        Default::default()
    );
    // The claim just went away: Released now, recycled on the next pass once elapsed.
    let zero = class("pub", json!({"spec": {"releaseDelay": "0s"}}));
    let p = aplan(
        &addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid"))),
        None,
        Some(&zero),
        now(),
    );
    assert_eq!(
        p.status,
        released_write(now(), Some("claim-uid"), Some(released::RECLAIMED))
    );
    assert_eq!(p.requeue_after, Some(std::time::Duration::ZERO));
}

// ---- §7 auto-claims ----------------------------------------------------------------------

mod autoclaim {
    use super::*;
    use crate::decide::autoclaim::{ServicePlan, ServiceSnapshot, Skip, plan_service, reason as r};
    use address_controller_api::ClaimFamily;
    use k8s_openapi::api::core::v1::Service;

    fn svc(extra: Value) -> Service {
        let mut v = json!({"metadata": {"name": "web", "namespace": "t", "uid": "svc-uid"},
            "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}});
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn auto_class(name: &str) -> Arc<IPAddressClass> {
        class(
            name,
            json!({"metadata": {"annotations": {"ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class": "true"}}}),
        )
    }

    fn plan(
        s: &Service,
        classes: &[Arc<IPAddressClass>],
        c: Option<&IPAddressClaim>,
    ) -> ServicePlan {
        plan_service(&ServiceSnapshot {
            service: s,
            classes,
            claim: c,
            namespace_labels: Some(&BTreeMap::new()),
        })
    }

    fn owned_claim() -> IPAddressClaim {
        claim(json!({"metadata": {"name": "web", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-uid", "controller": true}]}}))
    }

    #[test]
    fn skip_rules() {
        let classes = [auto_class("auto")];
        let cases = [
            (
                json!({"spec": {"type": "ClusterIP"}}),
                Skip::NotLoadBalancer,
            ),
            (
                json!({"metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-claim": "mine"}}}),
                Skip::NamesAClaim,
            ),
            (
                json!({"metadata": {"annotations": {"local.sdn.cozystack.io/auto-claim": "false"}}}),
                Skip::OptedOut,
            ),
            (
                json!({"spec": {"loadBalancerClass": "example.com/lb"}}),
                Skip::LoadBalancerClass,
            ),
            (
                json!({"spec": {"loadBalancerIP": "192.0.2.1"}}),
                Skip::LoadBalancerIp,
            ),
            (
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}),
                Skip::HasIngress,
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(
                plan(&svc(extra.clone()), &classes, None),
                ServicePlan::Skip(want),
                "{extra}"
            );
        }
        for a in crate::decide::autoclaim::METALLB_ANNOTATIONS {
            let s = svc(json!({"metadata": {"annotations": {a: "x"}}}));
            assert_eq!(
                plan(&s, &classes, None),
                ServicePlan::Skip(Skip::MetalLb),
                "{a}"
            );
        }
        for a in address_controller_api::service::cilium::PIN_ANNOTATIONS {
            let s = svc(json!({"metadata": {"annotations": {a: "x"}}}));
            assert_eq!(
                plan(&s, &classes, None),
                ServicePlan::Skip(Skip::Cilium),
                "{a}"
            );
        }
        assert_eq!(
            plan(&svc(json!({})), &[class("plain", json!({}))], None),
            ServicePlan::Skip(Skip::NoAutoClaimClass)
        );
    }

    #[test]
    fn class_selection() {
        let s = svc(json!({}));
        assert_eq!(
            plan(&s, &[auto_class("auto"), class("x", json!({}))], None),
            ServicePlan::Create {
                class: "auto".into(),
                family: ClaimFamily::IPv4
            }
        );
        let named = svc(
            json!({"metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-class": "x"}}}),
        );
        assert_eq!(
            plan(&named, &[auto_class("auto"), class("x", json!({}))], None),
            ServicePlan::Create {
                class: "x".into(),
                family: ClaimFamily::IPv4
            }
        );
        // Named but missing: a warning, retried when classes change.
        assert!(
            matches!(plan(&named, &[auto_class("auto")], None), ServicePlan::Refuse(e) if e.reason == r::CLASS_NOT_FOUND)
        );
        // Several auto-claim classes: never guess.
        assert!(
            matches!(plan(&s, &[auto_class("a"), auto_class("b")], None),
            ServicePlan::Refuse(e) if e.reason == r::AMBIGUOUS_AUTO_CLAIM_CLASS && e.note.contains("a, b"))
        );
    }

    #[test]
    fn family_mapping() {
        let classes = [auto_class("auto")];
        for (fams, policy, want) in [
            (json!(["IPv4"]), "SingleStack", ClaimFamily::IPv4),
            (json!(["IPv6"]), "SingleStack", ClaimFamily::IPv6),
            (
                json!(["IPv4", "IPv6"]),
                "PreferDualStack",
                ClaimFamily::Dual,
            ),
            (
                json!(["IPv6", "IPv4"]),
                "RequireDualStack",
                ClaimFamily::Dual,
            ),
        ] {
            let s = svc(json!({"spec": {"ipFamilies": fams, "ipFamilyPolicy": policy}}));
            assert_eq!(
                plan(&s, &classes, None),
                ServicePlan::Create {
                    class: "auto".into(),
                    family: want
                }
            );
        }
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let classes = [auto_class("auto")];
        for (extra, want) in [
            (
                json!({"metadata": {"annotations": {"local.sdn.cozystack.io/auto-claim": "no"}}}),
                r::INVALID_ANNOTATION,
            ),
            (
                json!({"metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-class": "Not_A_Name"}}}),
                r::INVALID_ANNOTATION,
            ),
        ] {
            assert!(
                matches!(plan(&svc(extra.clone()), &classes, None), ServicePlan::Refuse(e) if e.reason == want),
                "{extra}"
            );
        }
        // A class whose driver reports no IPv6 capacity cannot serve a dual-stack Service.
        let v4_only = class(
            "v4",
            json!({"metadata": {"annotations": {"ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class": "true"}},
            "status": {"capacity": {"ipv4": 14, "ipv6": 0}}}),
        );
        let dual = svc(
            json!({"spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}}),
        );
        assert!(
            matches!(plan(&dual, std::slice::from_ref(&v4_only), None), ServicePlan::Refuse(e) if e.reason == r::FAMILY_UNSUPPORTED && e.note.contains("IPv6"))
        );
        assert!(matches!(
            plan(&svc(json!({})), &[v4_only], None),
            ServicePlan::Create { .. }
        ));
        // "true" is an explicit opt-in.
        let yes = svc(
            json!({"metadata": {"annotations": {"local.sdn.cozystack.io/auto-claim": "true"}}}),
        );
        assert!(matches!(
            plan(&yes, &classes, None),
            ServicePlan::Create { .. }
        ));
    }

    #[test]
    fn existing_claims() {
        let classes = [auto_class("auto")];
        // Ours, but the Service was not annotated (crash between the two writes): repair.
        assert_eq!(
            plan(&svc(json!({})), &classes, Some(&owned_claim())),
            ServicePlan::Annotate
        );
        // Someone else's: never taken over.
        let foreign = claim(json!({"metadata": {"name": "web"}}));
        assert!(
            matches!(plan(&svc(json!({})), &classes, Some(&foreign)), ServicePlan::Refuse(e) if e.reason == r::CLAIM_NAME_TAKEN)
        );
        // No longer a LoadBalancer: the claim is kept, and the Service is told.
        let cluster_ip = svc(
            json!({"spec": {"type": "ClusterIP"}, "metadata": {"annotations": {"local.sdn.cozystack.io/ip-address-claim": "web"}}}),
        );
        assert!(
            matches!(plan(&cluster_ip, &classes, Some(&owned_claim())), ServicePlan::Keep(e) if e.reason == r::NO_LONGER_LOAD_BALANCER && !e.warning)
        );
        assert_eq!(
            plan(&cluster_ip, &classes, Some(&foreign)),
            ServicePlan::Skip(Skip::NotLoadBalancer)
        );
    }
}

// ---- §5.7 one address per family per claim -----------------------------------------------

/// A claim bound to `a` (listed in its status).
fn holding(names: &[(&str, &str)]) -> IPAddressClaim {
    let addresses: Vec<Value> = names
        .iter()
        .map(|(n, ip)| json!({"name": n, "address": ip}))
        .collect();
    claim(json!({"status": {"phase": "Bound", "className": "pub", "addresses": addresses}}))
}

fn prebound(name: &str, ip: &str, extra: Value) -> Arc<IPAddress> {
    let mut v = json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
        "status": {"phase": "Pending"}});
    merge(&mut v, extra);
    addr(name, ip, "pub", v)
}

#[test]
fn holdings_keep_the_listed_then_the_bound_then_the_lowest_name() {
    use super::holdings::Holdings;
    let f = addr("f", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let x = prebound("x", "192.0.2.9", json!({}));
    let y = prebound("a-y", "192.0.2.8", json!({}));
    let v6 = prebound("z6", "2001:db8::1", json!({}));
    let old = addr("old", "192.0.2.7", "pub", bound_to(Some("older")));
    let names = |v: &[&IPAddress]| v.iter().map(|a| a.name_any()).collect::<Vec<_>>();
    let rows: &[(&str, IPAddressClaim, Vec<&IPAddress>, [&[&str]; 2])] = &[
        (
            "listed wins",
            holding(&[("x", "192.0.2.9")]),
            vec![&f, &x],
            [&["x"], &["f"]],
        ),
        (
            "bound wins when none is listed",
            claim(json!({})),
            vec![&x, &f],
            [&["f"], &["x"]],
        ),
        (
            "lowest name among equals",
            claim(json!({})),
            vec![&x, &y],
            [&["a-y"], &["x"]],
        ),
        (
            "one per family: an IPv6 address is no rival",
            holding(&[("f", "192.0.2.1")]),
            vec![&f, &x, &v6],
            [&["f", "z6"], &["x"]],
        ),
        (
            "a stale binding of an older claim is not this claim's",
            holding(&[("f", "192.0.2.1")]),
            vec![&f, &old],
            [&["f"], &[]],
        ),
    ];
    for (what, c, named, [held, surplus]) in rows {
        let h = Holdings::of(c, named.iter().copied());
        assert_eq!(names(&h.held), *held, "{what}: held");
        assert_eq!(names(&h.surplus), *surplus, "{what}: surplus");
    }
}

#[test]
fn a_claim_never_lists_a_surplus_address_nor_completes_it() {
    let classes = [default_class("pub")];
    let c = holding(&[("f", "192.0.2.1")]);
    let f = addr("f", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    // A driver's create that landed after the bind, without uid yet.
    let x = addr(
        "x",
        "192.0.2.9",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c"}}, "status": {"phase": "Pending"}}),
    );
    let c = applied(&c, &plan(&c, std::slice::from_ref(&f), &classes));
    let p = plan(&c, &[f, x], &classes);
    assert!(
        p.is_empty(),
        "the claim keeps f alone and writes nothing: {p:?}"
    );
    // A legacy double binding (both listed): the claim keeps one.
    let both = holding(&[("f", "192.0.2.1"), ("x", "192.0.2.9")]);
    let x_bound = addr("x", "192.0.2.9", "pub", bound_to(Some("claim-uid")));
    let f = addr("f", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let p = plan(&both, &[f, x_bound], &classes);
    let listed: Vec<String> = p
        .status
        .unwrap()
        .addresses
        .into_iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(listed, ["f"]);
}

#[test]
fn a_surplus_is_released_only_once_the_claim_lists_the_address_it_keeps() {
    // The chaos run's Lost claim: two address passes judged "kept" from two moments — the
    // claim listing nothing (b, Bound, kept; a surplus), then listing a (b surplus) — and
    // released both. Anchored to the claim's list, the first pass waits.
    let cls = class("pub", json!({}));
    let a = prebound("a", "192.0.2.1", json!({}));
    let b = addr("b", "192.0.2.2", "pub", bound_to(Some("claim-uid")));
    let unlisted = holding(&[]);
    let p = aplan_with(
        &a,
        Some(&unlisted),
        std::slice::from_ref(&b),
        Some(&cls),
        now(),
    );
    assert!(
        p.status.is_none() && !p.delete && p.claim_events.is_empty(),
        "a waits while the claim lists nothing: {p:?}"
    );
    // The claim lists b: a is released.
    let lists_b = holding(&[("b", "192.0.2.2")]);
    let p = aplan_with(
        &a,
        Some(&lists_b),
        std::slice::from_ref(&b),
        Some(&cls),
        now(),
    );
    assert_eq!(
        p.status,
        released_write(now(), Some("claim-uid"), Some(released::SURPLUS))
    );
    // The claim lists a instead (its pass saw a first): b is the surplus, a is kept.
    let lists_a = holding(&[("a", "192.0.2.1")]);
    let p = aplan_with(
        &b,
        Some(&lists_a),
        std::slice::from_ref(&a),
        Some(&cls),
        now(),
    );
    assert_eq!(
        p.status,
        released_write(now(), Some("claim-uid"), Some(released::SURPLUS))
    );
    let p = aplan_with(
        &a,
        Some(&lists_a),
        std::slice::from_ref(&b),
        Some(&cls),
        now(),
    );
    assert!(p.claim_events.is_empty() && !p.delete, "{p:?}");
}

#[test]
fn a_surplus_address_is_released_with_an_event_on_the_claim_then_follows_its_policy() {
    let c = holding(&[("f", "192.0.2.1")]);
    let f = addr("f", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let cls = class("pub", json!({"spec": {"releaseDelay": "1h"}}));

    // Retain: Released now, confirmed first, said on the claim, then the release delay.
    let x = prebound("x", "192.0.2.9", json!({}));
    let p = aplan_with(&x, Some(&c), std::slice::from_ref(&f), Some(&cls), now());
    assert_eq!(
        p.status,
        released_write(now(), Some("claim-uid"), Some(released::SURPLUS))
    );
    assert!(p.confirm && !p.delete);
    assert_eq!(p.claim_events.len(), 1);
    assert_eq!(p.claim_events[0].reason, event::SURPLUS_ADDRESS);
    assert!(
        p.claim_events[0]
            .note
            .contains("already holds another IPv4 address"),
        "{}",
        p.claim_events[0].note
    );
    assert!(p.events.is_empty(), "said on the claim, not twice");
    assert_eq!(p.requeue_after, Some(std::time::Duration::from_secs(3600)));

    // Once Released it stays surplus: never Bound again, no second event; the delay runs.
    let released = prebound(
        "x",
        "192.0.2.9",
        json!({"status": {"phase": "Released", "releasedAt": "2026-01-01T11:30:00Z",
            "releasedFrom": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
    );
    let p = aplan_with(
        &released,
        Some(&c),
        std::slice::from_ref(&f),
        Some(&cls),
        now(),
    );
    assert_eq!(p.status, None);
    assert!(p.claim_events.is_empty() && !p.confirm);
    assert_eq!(p.requeue_after, Some(std::time::Duration::from_secs(1800)));
    let p = aplan_with(
        &released,
        Some(&c),
        std::slice::from_ref(&f),
        Some(&cls),
        at("2026-01-01T12:30:00Z"),
    );
    assert!(p.clear_claim_ref, "release delay elapsed: free again");

    // Its claim is deleted meanwhile: still Released as surplus (the reason is the
    // release's, kept), so it never counts toward a quota; the same delay runs.
    let surplus = prebound(
        "x",
        "192.0.2.9",
        json!({"status": {"phase": "Released", "releasedAt": "2026-01-01T11:30:00Z",
            "releasedFrom": {"namespace": "t", "name": "c", "uid": "claim-uid"},
            "reason": released::SURPLUS}}),
    );
    assert!(surplus.is_surplus() && surplus.quota_slot().is_none());
    let p = aplan(&surplus, None, Some(&cls), now());
    assert_eq!(p.status, None, "the reason stays Surplus");
    assert_eq!(p.requeue_after, Some(std::time::Duration::from_secs(1800)));
    // Positive control: the same binding released as Reclaimed counts.
    let mut reclaimed = IPAddress::clone(&surplus);
    if let Some(st) = reclaimed.status.as_mut() {
        st.reason = Some(released::RECLAIMED.into());
    }
    assert!(!reclaimed.is_surplus() && reclaimed.quota_slot().is_some());
    // And once the delay cleared the claimRef and it is bound again, it is a grant.
    let rebound = addr(
        "x",
        "192.0.2.9",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "d", "uid": "d-uid"}},
            "status": {"phase": "Released", "releasedAt": "2026-01-01T11:30:00Z",
            "releasedFrom": {"namespace": "t", "name": "c", "uid": "claim-uid"},
            "reason": released::SURPLUS}}),
    );
    assert!(!rebound.is_surplus() && rebound.quota_slot().is_some());

    // Delete: deleted (confirmed first), said on the claim.
    let x = prebound(
        "x",
        "192.0.2.9",
        json!({"spec": {"reclaimPolicy": "Delete"}}),
    );
    let p = aplan_with(&x, Some(&c), std::slice::from_ref(&f), Some(&cls), now());
    assert!(p.delete && p.confirm);
    assert_eq!(p.claim_events[0].reason, event::SURPLUS_ADDRESS);

    // The kept address is Bound as ever.
    let p = aplan_with(&f, Some(&c), &[x], Some(&cls), now());
    assert_eq!(p.status, None);
    assert!(!p.delete && !p.confirm);
}

#[test]
fn a_released_address_is_never_moved_back_to_bound() {
    // The claim still exists with the uid the address names (a cache that missed the
    // deletion would show exactly this): Released stays Released.
    let c = claim(json!({"status": {"phase": "Bound", "className": "pub"}}));
    let released = addr(
        "r",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
            "status": {"phase": "Released", "releasedAt": "2026-01-01T11:00:00Z",
            "releasedFrom": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
    );
    let p = aplan(&released, Some(&c), None, now());
    assert_ne!(
        p.status.as_ref().map(|s| s.phase),
        Some(AddressPhase::Bound),
        "{p:?}"
    );
    // Nor does the claim take it back.
    let p = plan(&c, &[released], &[default_class("pub")]);
    assert!(p.address_writes.is_empty());
    assert!(p.status.as_ref().is_some_and(|s| s.addresses.is_empty()));
}

// ---- the phase follows the claimRef (issue #20) -------------------------------------------

/// An address `Released` from claim `t/x` (uid `ux`) at 11:00, then `extra`.
fn released_from_x(extra: Value) -> Arc<IPAddress> {
    let mut v = json!({"spec": {"claimRef": {"namespace": "t", "name": "x", "uid": "ux"}},
        "status": {"phase": "Released", "releasedAt": "2026-01-01T11:00:00Z",
            "releasedFrom": {"namespace": "t", "name": "x", "uid": "ux"}}});
    merge(&mut v, extra);
    addr("a", "192.0.2.1", "pub", v)
}

/// The claim `t/c` pinned to `a`, as its own pass left it after binding `a`.
fn pinned_bound() -> IPAddressClaim {
    claim(json!({"spec": {"addressName": "a"},
        "status": {"phase": "Bound", "className": "pub",
            "addresses": [{"name": "a", "address": "192.0.2.1"}]}}))
}

#[test]
fn the_release_delay_judges_only_the_binding_that_was_released() {
    let delayed = class("pub", json!({"spec": {"releaseDelay": "30m"}}));
    let elapsed = now(); // 12:00: the 30 minutes since 11:00 are over
    let pinned = pinned_bound();

    // The release delay's first write: claimRef cleared. The address is free, whatever the
    // phase still says; the next write makes it Available.
    let cleared = released_from_x(json!({"spec": {"claimRef": null}}));
    let p = aplan(&cleared, None, Some(&delayed), elapsed.clone());
    assert_eq!(p.status, w(AddressPhase::Available, None));
    assert!(!p.clear_claim_ref && !p.confirm && p.events.is_empty());

    // Order 1: the claim pass bound the pinned claim before that second write landed. The
    // address carries the new binding next to the old Released: it is the new binding's —
    // Bound, confirmed by a direct read of the claim first; never cleared again.
    let rebound = released_from_x(
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
    );
    let p = aplan(&rebound, Some(&pinned), Some(&delayed), elapsed.clone());
    assert_eq!(p.status, w(AddressPhase::Bound, None), "{p:?}");
    assert!(
        p.confirm,
        "Released → Bound only on a live read of the claim"
    );
    assert!(
        !p.clear_claim_ref && !p.delete && p.events.is_empty(),
        "{p:?}"
    );
    // ...and the claim keeps it: it lists the address and stays Bound (not Lost).
    let cp = plan(
        &pinned,
        std::slice::from_ref(&rebound),
        std::slice::from_ref(&delayed),
    );
    assert_eq!(phase(&cp), ClaimPhase::Bound, "{cp:?}");
    assert_eq!(cp.status.as_ref().unwrap().addresses[0].name, "a");
    assert!(cp.address_writes.is_empty());

    // Order 2: Available landed first, then the bind: the ordinary path.
    let after_available = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}),
    );
    let p = aplan(
        &after_available,
        Some(&pinned),
        Some(&delayed),
        elapsed.clone(),
    );
    assert_eq!(p.status, w(AddressPhase::Bound, None));
    assert!(!p.confirm);

    // The binding that was released (claimRef = releasedFrom) still waits out the delay and
    // is cleared when it is over — the guard names that binding, nothing else.
    let p = aplan(
        &released_from_x(json!({})),
        None,
        Some(&delayed),
        elapsed.clone(),
    );
    assert!(p.clear_claim_ref);
    assert_eq!(p.events[0].reason, event::RELEASE_DELAY_ELAPSED);

    // The new binding's claim is gone too (uid set): the safety net releases the new
    // binding, as of now — not as of the old binding's releasedAt.
    let p = aplan(&rebound, None, Some(&delayed), elapsed.clone());
    assert_eq!(
        p.status,
        released_write(
            elapsed.clone(),
            Some("claim-uid"),
            Some(released::RECLAIMED)
        )
    );
    assert!(p.confirm && !p.clear_claim_ref);
    assert_eq!(p.requeue_after, Some(std::time::Duration::from_secs(1800)));
}

#[test]
fn a_pass_working_from_its_own_older_write_is_replaced_by_the_newer_state() {
    // The address pass cleared the claimRef (its own write, overlaid until the cache shows
    // it); the claim pass's bind lands after it. The overlay never hides the newer bind, so
    // the address pass plans on the bind — and a plan made from the overlaid version carries
    // that version's resourceVersion, which the API server refuses (409) once the bind landed.
    let recent = crate::recent::RecentWrites::<IPAddress>::default();
    let before = released_from_x(json!({"metadata": {"resourceVersion": "1"}}));
    let cleared =
        released_from_x(json!({"metadata": {"resourceVersion": "2"}, "spec": {"claimRef": null}}));
    recent.record(&before, cleared.as_ref().clone());
    // The cache still shows version 1: the pass sees its own write.
    let seen = recent.latest(before.clone());
    assert!(seen.spec.claim_ref.is_none());
    // The cache shows the claim pass's bind (version 3): that is what the pass sees.
    let bound = released_from_x(json!({"metadata": {"resourceVersion": "3"},
        "spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}}}));
    let seen = recent.latest(bound.clone());
    assert_eq!(seen.metadata.resource_version.as_deref(), Some("3"));
    let p = aplan(
        &seen,
        Some(&pinned_bound()),
        Some(&class("pub", json!({"spec": {"releaseDelay": "30m"}}))),
        now(),
    );
    assert!(!p.clear_claim_ref);
    assert_eq!(p.status, w(AddressPhase::Bound, None));
}

#[test]
fn a_reservation_is_available_and_kept_for_its_claim() {
    let reserved = |extra: Value| {
        let mut v = json!({"spec": {"claimRef": {"namespace": "t", "name": "c"}}, "status": null});
        merge(&mut v, extra);
        addr("a", "192.0.2.1", "pub", v)
    };
    // No such claim: Available, not an orphan — no release, no delete, no event.
    for policy in ["Retain", "Delete"] {
        let p = aplan(
            &reserved(json!({"spec": {"reclaimPolicy": policy}})),
            None,
            None,
            now(),
        );
        assert_eq!(p.status, w(AddressPhase::Available, None), "{policy}");
        assert!(!p.delete && !p.confirm && p.events.is_empty(), "{policy}");
    }
    // Not free: no other claim matches it, pinned or not.
    let r = reserved(json!({"status": {"phase": "Available"}}));
    assert!(!is_free(&r, "pub", Family::IPv4));
    let mut other = claim(json!({"metadata": {"name": "other"}, "spec": {"className": "pub"}}));
    let p = plan(&other, std::slice::from_ref(&r), &[class("pub", json!({}))]);
    assert!(binds(&p).is_empty());
    other.spec.address_name = Some("a".into());
    let p = plan(&other, std::slice::from_ref(&r), &[class("pub", json!({}))]);
    assert!(binds(&p).is_empty());
    // A claim of the tenant's own namespace is named; the admin reads it on the
    // (cluster-scoped) address too.
    let (_, _, message) = condition(&p, "Bound");
    assert!(message.contains("already bound to claim t/c"), "{message}");
    assert_eq!(p.address_events.len(), 1);
    assert_eq!(p.address_events[0].0, "a");
    assert_eq!(p.address_events[0].1.reason, event::PIN_REFUSED);
    assert!(p.address_events[0].1.note.contains("bound to claim t/c"));
    // From another namespace the tenant reads "not available", never the claim's name.
    let mut stranger = other.clone();
    stranger.metadata.namespace = Some("u".into());
    let p = plan(
        &stranger,
        std::slice::from_ref(&r),
        &[class("pub", json!({}))],
    );
    let (_, _, message) = condition(&p, "Bound");
    assert!(
        message.contains("is not available to this claim"),
        "{message}"
    );
    assert!(!message.contains("t/c"), "{message}");
    assert!(p.address_events[0].1.note.contains("bound to claim t/c"));
    // The claim appears: it is pre-bound (Pending), and the claim completes the uid.
    let c = claim(json!({}));
    assert_eq!(
        aplan(&r, Some(&c), None, now()).status,
        w(AddressPhase::Pending, None)
    );
    let p = plan(&c, std::slice::from_ref(&r), &[class("pub", json!({}))]);
    assert!(matches!(
        p.address_writes.as_slice(),
        [AddressWrite::CompleteUid { name, .. }] if name == "a"
    ));
    assert_eq!(phase(&p), ClaimPhase::Bound);
    // A claim of that name being deleted: wait.
    let deleting = claim(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
    assert_eq!(aplan(&r, Some(&deleting), None, now()), Default::default());
    // A name no claim can ever have (admitted before the schema checked it) reserves for
    // nobody: the address is an orphan, reclaimed by its policy.
    let unreadable = reserved(json!({"spec": {"claimRef": {"name": "x y"}}}));
    let p = aplan(&unreadable, None, None, now());
    assert_eq!(
        p.status.as_ref().map(|s| s.phase),
        Some(AddressPhase::Released)
    );
    assert_eq!(p.events[0].reason, event::RECLAIMED);
}

#[test]
fn an_admin_moves_a_released_address_by_re_pointing_its_claim_ref() {
    let delayed = class("pub", json!({"spec": {"releaseDelay": "24h"}}));
    // Re-pointed to a claim in another namespace that does not exist yet: reserved for it
    // at once (no release delay), releasedAt and releasedFrom cleared.
    let moved = released_from_x(
        json!({"spec": {"claimRef": {"namespace": "u", "name": "z", "uid": null}}}),
    );
    let p = aplan(&moved, None, Some(&delayed), now());
    assert_eq!(p.status, w(AddressPhase::Available, None));
    assert!(!p.clear_claim_ref && p.requeue_after.is_none());
    // It exists: pre-bound, then bound by its claim.
    let z = claim(json!({"metadata": {"name": "z", "namespace": "u", "uid": "uz"}}));
    assert_eq!(
        aplan(&moved, Some(&z), Some(&delayed), now()).status,
        w(AddressPhase::Pending, None)
    );
    // The uid removed, the name kept: a reservation for a new claim of that name (how an
    // admin gives a retained address back to a recreated claim, as for PersistentVolumes).
    let again = released_from_x(
        json!({"spec": {"claimRef": {"namespace": "t", "name": "x", "uid": null}}}),
    );
    let x2 = claim(json!({"metadata": {"name": "x", "uid": "ux2"}}));
    assert_eq!(
        aplan(&again, Some(&x2), Some(&delayed), now()).status,
        w(AddressPhase::Pending, None)
    );
    // The old claim of that name (same uid, a stale cache) never takes it back: the
    // released binding is exactly the one recorded.
    let x = claim(
        json!({"metadata": {"name": "x", "uid": "ux"}, "status": {"phase": "Bound", "className": "pub"}}),
    );
    let p = aplan(&released_from_x(json!({})), Some(&x), Some(&delayed), now());
    assert_ne!(
        p.status.as_ref().map(|s| s.phase),
        Some(AddressPhase::Bound)
    );
    assert!(
        plan(
            &x,
            &[released_from_x(json!({}))],
            std::slice::from_ref(&delayed)
        )
        .address_writes
        .is_empty()
    );
}

#[test]
fn a_bound_address_moved_away_leaves_its_claim_lost_with_where_it_went() {
    let c = claim(json!({"status": {"phase": "Bound", "className": "pub",
        "addresses": [{"name": "a", "address": "192.0.2.1"}]}}));
    let moved = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "u", "name": "z"}}}),
    );
    let free = addr("b", "192.0.2.2", "pub", json!({}));
    let p = plan(
        &c,
        &[moved.clone(), free.clone()],
        &[class("pub", json!({}))],
    );
    assert_eq!(phase(&p), ClaimPhase::Lost);
    assert!(binds(&p).is_empty(), "a Lost claim is never given another");
    let (_, r, m) = condition(&p, "Bound");
    assert_eq!(r, reason::ADDRESS_LOST);
    assert_eq!(m, "IPAddress a (192.0.2.1) now names claim u/z");
    // The next pass (the claim no longer lists it) keeps the reason: no write.
    let lost = applied(&c, &p);
    let p = plan(&lost, &[moved, free], &[class("pub", json!({}))]);
    assert!(p.is_empty(), "{p:?}");
    // Gone entirely.
    let p = plan(&c, &[], &[class("pub", json!({}))]);
    assert_eq!(
        condition(&p, "Bound").2,
        "IPAddress a (192.0.2.1) no longer exists"
    );
}

#[test]
fn an_address_released_before_the_record_existed_gets_it_once() {
    // Written by an earlier version: Released, no releasedFrom. Its claimRef is the binding
    // released (as that version meant it); the record is written once, nothing else.
    let legacy = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c", "uid": "claim-uid"}},
            "status": {"phase": "Released", "releasedAt": "2026-01-01T11:30:00Z"}}),
    );
    assert!(legacy.is_released());
    let delayed = class("pub", json!({"spec": {"releaseDelay": "1h"}}));
    let p = aplan(&legacy, None, Some(&delayed), now());
    assert_eq!(
        p.status,
        released_write(at("2026-01-01T11:30:00Z"), Some("claim-uid"), None)
    );
    assert!(p.events.is_empty() && !p.confirm && !p.clear_claim_ref);
    assert_eq!(p.requeue_after, Some(std::time::Duration::from_secs(1800)));
}

/// The history rides on the phase writes: a bind opens a holding, the steady state writes
/// nothing, a release closes it at `releasedAt`, a binding from before the history (an
/// upgrade) is left unwritten and recorded at its release — each in the status write the
/// phase makes anyway.
#[test]
fn the_history_rides_on_the_phase_writes() {
    use address_controller_api::history::{HoldingState, ended};
    let live = claim(json!({}));
    // Available → Bound: the write that binds opens the holding.
    let a = addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid")));
    let mut fresh = (*a).clone();
    fresh.status.as_mut().unwrap().phase = Some(AddressPhase::Available);
    let p = aplan_recorded(&fresh, Some(&live), &[], None, now());
    let st = p.status.expect("the bind's write");
    assert_eq!(st.phase, AddressPhase::Bound);
    let settled = st.history.expect("the bind opens a holding");
    let h = settled.list;
    assert_eq!(settled.counts.base(), 0);
    assert_eq!(h.len(), 1);
    assert_eq!(
        (h[0].state, h[0].namespace.as_str(), h[0].name.as_str()),
        (HoldingState::Bound, "t", "c")
    );
    assert_eq!(h[0].uid.as_deref(), Some("claim-uid"));
    assert_eq!((h[0].from.clone(), h[0].until.clone()), (Some(now()), None));
    assert!(!h[0].found);
    // Bound with that holding: nothing to write.
    let mut steady = (*a).clone();
    steady.status.as_mut().unwrap().history = h.clone();
    let p = aplan_recorded(&steady, Some(&live), &[], None, at("2026-01-01T13:00:00Z"));
    assert_eq!(p.status, None, "a steady state writes nothing");
    // Bound without any (bound before the history was kept, an upgrade): no write of its
    // own — the upgrade writes nothing — and its release records it, found, without a start.
    let p = aplan_recorded(&a, Some(&live), &[], None, now());
    assert_eq!(p.status, None, "an upgrade writes nothing");
    let p = aplan_recorded(&a, None, &[], None, at("2026-01-01T15:00:00Z"));
    let h2 = p
        .status
        .and_then(|s| s.history)
        .expect("recorded at its release")
        .list;
    assert!(h2[0].found);
    assert_eq!(h2[0].from, None);
    assert_eq!(h2[0].until, Some(at("2026-01-01T15:00:00Z")));
    assert_eq!(h2[0].uid.as_deref(), Some("claim-uid"));
    // The claim is gone (Retain): Released closes the holding at releasedAt.
    let gone = at("2026-01-01T14:00:00Z");
    let p = aplan_recorded(&steady, None, &[], None, gone.clone());
    let st = p.status.expect("the release's write");
    assert_eq!(st.phase, AddressPhase::Released);
    let h3 = st
        .history
        .clone()
        .expect("the release closes the holding")
        .list;
    assert_eq!(h3[0].until, st.released_at);
    assert_eq!(h3[0].until, Some(gone));
    assert_eq!(h3[0].ended.as_deref(), Some(ended::RELEASED));
    // An invalid address's history is left alone.
    let mut bad = (*a).clone();
    bad.spec.address = "not-an-ip".into();
    let p = aplan_recorded(&bad, Some(&live), &[], None, now());
    assert_eq!(p.status.and_then(|s| s.history), None);
}

/// A reservation (§5.6) is recorded as what it is, and its claim's binding ends it.
#[test]
fn a_reservation_is_recorded_and_ended_by_its_binding() {
    use address_controller_api::history::{HoldingState, ended};
    let reserved = addr(
        "a",
        "192.0.2.1",
        "pub",
        json!({"spec": {"claimRef": {"namespace": "t", "name": "c"}}, "status": {"phase": "Released",
            "releasedFrom": {"namespace": "old", "name": "x", "uid": "u0"}}}),
    );
    let p = aplan_recorded(&reserved, None, &[], None, now());
    let st = p.status.expect("Released → Available");
    let h = st.history.expect("the reservation recorded").list;
    assert_eq!(h[0].state, HoldingState::Reserved);
    assert_eq!(h[0].uid, None);
    let later = at("2026-01-01T12:05:00Z");
    let mut bound = (*addr("a", "192.0.2.1", "pub", bound_to(Some("claim-uid")))).clone();
    bound.status.as_mut().unwrap().phase = Some(AddressPhase::Available);
    bound.status.as_mut().unwrap().history = h;
    let p = aplan_recorded(&bound, Some(&claim(json!({}))), &[], None, later.clone());
    let h = p
        .status
        .and_then(|s| s.history)
        .expect("the binding recorded")
        .list;
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].ended.as_deref(), Some(ended::BOUND));
    assert_eq!(h[0].until, Some(later.clone()));
    assert_eq!(
        (h[1].state, h[1].from.clone()),
        (HoldingState::Bound, Some(later))
    );
}
