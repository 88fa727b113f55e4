//! The reference `range` driver with the core controller on the real control plane.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClass};
use address_controller_tests::env::{
    Env, RANGE_PROVISIONER, WAIT, aphase, env, phase, purge, range_class,
};
use address_controller_tests::{ControllerProcess, wait_for};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn driver(e: &Env, name: &str) -> ControllerProcess {
    ControllerProcess::driver(&format!("drv-{name}-{}", e.sfx), &["--leader-elect=false"])
        .await
        .unwrap()
}

async fn wait_class(
    e: &Env,
    name: &str,
    what: &str,
    pred: impl Fn(&IPAddressClass) -> bool,
) -> IPAddressClass {
    let api = e.classes();
    wait_for(&format!("class {name}: {what}"), WAIT, || {
        let api = api.clone();
        let pred = &pred;
        async move {
            let c = api.get(name).await?;
            Ok(pred(&c).then_some(c))
        }
    })
    .await
    .unwrap()
}

fn class_condition<'a>(
    c: &'a IPAddressClass,
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    c.status.as_ref()?.conditions.iter().find(|x| x.type_ == t)
}

/// Waits until the class reports ParametersValid=False and returns the reason given.
async fn invalid_parameters(e: &Env, class: &str) -> String {
    let c = wait_class(e, class, "ParametersValid=False", |c| {
        class_condition(c, "ParametersValid").is_some_and(|x| x.status == "False")
    })
    .await;
    class_condition(&c, "ParametersValid")
        .unwrap()
        .message
        .clone()
}

async fn address_named(e: &Env, name: &str) -> IPAddress {
    e.addresses().get(name).await.unwrap()
}

#[tokio::test]
async fn claims_bind_to_driver_made_addresses_and_delete_frees_them() {
    let mut e = env("drv-basic").await;
    purge(&e, &["198.18.10.", "2001:db8:10::"]).await;
    let _drv = driver(&e, "basic").await;
    // Distinct ranges per test: the driver refuses overlaps between its classes.
    let class = range_class(
        &mut e,
        "del",
        json!(["198.18.10.0/30", "2001:db8:10::/126"]),
        json!({"spec": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    let c = e.claim("v4", json!({"className": class})).await;
    let bound = e
        .wait_claim("v4", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let s = bound.status.unwrap();
    assert_eq!(s.addresses.len(), 1);
    assert_eq!(
        (
            s.addresses[0].name.as_str(),
            s.addresses[0].address.as_str()
        ),
        ("ipv4-198-18-10-1", "198.18.10.1")
    );
    let a = address_named(&e, "ipv4-198-18-10-1").await;
    assert_eq!(
        a.spec.claim_ref.as_ref().unwrap().uid,
        c.metadata.uid,
        "claimRef pre-set with the uid"
    );
    assert_eq!(
        a.spec.reclaim_policy.as_str(),
        "Delete",
        "copied from the class"
    );
    assert!(a.spec.source.from_class.is_some());
    assert_eq!(aphase(Some(&a)), Some(AddressPhase::Bound));

    e.claim("dual", json!({"className": class, "family": "Dual"}))
        .await;
    let dual = e
        .wait_claim("dual", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    let got: Vec<String> = dual
        .status
        .unwrap()
        .addresses
        .into_iter()
        .map(|a| a.address)
        .collect();
    assert_eq!(
        got,
        ["198.18.10.2", "2001:db8:10::"],
        "sorted by object name: ipv4-… before ipv6-…"
    );

    // The range is full for IPv4: the next claim waits, with an event and a class condition.
    e.claim("third", json!({"className": class})).await;
    let note = e.wait_event(&e.ns.name, "third", "Exhausted").await;
    assert!(note.contains(&class), "{note}");
    wait_class(&e, &class, "Exhausted", |c| {
        class_condition(c, "Exhausted").is_some_and(|x| x.status == "True")
    })
    .await;

    // Delete reclaim frees the address; the waiting claim gets it.
    e.claims()
        .delete("v4", &DeleteParams::default())
        .await
        .unwrap();
    let third = e
        .wait_claim("third", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(third.status.unwrap().addresses[0].address, "198.18.10.1");
    wait_class(&e, &class, "not exhausted... then exhausted again", |c| {
        class_condition(c, "Exhausted").is_some()
    })
    .await;
    e.check().await;
}

#[tokio::test]
async fn retain_keeps_an_address_out_of_the_range_until_released() {
    let mut e = env("drv-retain").await;
    purge(&e, &["198.18.20."]).await;
    let _drv = driver(&e, "retain").await;
    let class = range_class(&mut e, "ret", json!(["198.18.20.0/31"]), json!({})).await; // 2 usable, Retain
    e.claim("a", json!({"className": class})).await;
    e.wait_claim("a", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    e.claims()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_address("ipv4-198-18-20-0", "Released", |x| {
        aphase(x) == Some(AddressPhase::Released)
    })
    .await;
    e.claim("b", json!({"className": class})).await;
    let b = e
        .wait_claim("b", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(
        b.status.unwrap().addresses[0].address,
        "198.18.20.1",
        "the Released address is not handed out again"
    );
    e.claim("c", json!({"className": class})).await;
    e.wait_event(&e.ns.name, "c", "Exhausted").await;
    // An admin releases the retained address: the core binds it to the waiting claim.
    e.addresses()
        .patch(
            "ipv4-198-18-20-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"claimRef": null}})),
        )
        .await
        .unwrap();
    let c = e
        .wait_claim("c", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    assert_eq!(c.status.unwrap().addresses[0].address, "198.18.20.0");
    e.check().await;
}

#[tokio::test]
async fn capacity_and_bad_parameters_are_published_on_the_class() {
    let mut e = env("drv-params").await;
    let _drv = driver(&e, "params").await;
    let ok = range_class(
        &mut e,
        "ok",
        json!(["198.18.30.0/28", "198.18.31.0/31", "2001:db8:30::/120"]),
        json!({}),
    )
    .await;
    let c = wait_class(&e, &ok, "capacity", |c| {
        c.status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .is_some()
    })
    .await;
    let cap = c.status.as_ref().unwrap().capacity.clone().unwrap();
    assert_eq!((cap.ipv4, cap.ipv6), (Some(14 + 2), Some(256)));
    assert_eq!(
        class_condition(&c, "ParametersValid").unwrap().status,
        "True"
    );

    for (base, params, want) in [
        ("missing", json!(null), "spec.parameters.cidrs is missing"),
        ("not-a-list", json!("198.18.32.0/28"), "must be a list"),
        ("bad-cidr", json!(["198.18.32.0/33"]), "is not a CIDR"),
        ("overlap", json!(["198.18.30.8/29"]), "overlaps"),
    ] {
        let name = if params.is_null() {
            e.class(base, json!({"spec": {"provisioner": RANGE_PROVISIONER}}))
                .await
        } else {
            range_class(&mut e, base, params, json!({})).await
        };
        let message = invalid_parameters(&e, &name).await;
        assert!(message.contains(want), "{base}: {message}");
        e.wait_event("default", &name, "InvalidParameters").await;
        // Nothing is allocated from it.
        let claim = format!("claim-{base}");
        e.claim(&claim, json!({"className": name})).await;
        e.wait_event(&e.ns.name, &claim, "InvalidClassParameters")
            .await;
    }
    // The overlap is reported on both classes.
    assert!(invalid_parameters(&e, &ok).await.contains("overlaps"));
    let ours = e
        .addresses()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        !ours.iter().any(|a| a.spec.class_name.contains(&e.sfx)),
        "nothing allocated from bad classes"
    );
    e.check().await;
}

#[tokio::test]
async fn two_replicas_with_one_leader_never_double_allocate() {
    let mut e = env("drv-ha").await;
    purge(&e, &["198.18.40.", "2001:db8:40::"]).await;
    let lease = e.name("drv-lease");
    let args = address_controller_tests::env::fast_lease(&lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut one = ControllerProcess::driver(&format!("drv-one-{}", e.sfx), &args)
        .await
        .unwrap();
    let two = ControllerProcess::driver(&format!("drv-two-{}", e.sfx), &args)
        .await
        .unwrap();
    let class = range_class(
        &mut e,
        "ha",
        json!(["198.18.40.0/24", "2001:db8:40::/120"]),
        json!({}),
    )
    .await;
    for i in 0..20 {
        e.claim(
            &format!("c{i:02}"),
            json!({"className": class, "family": if i % 2 == 0 { "IPv4" } else { "Dual" }}),
        )
        .await;
    }
    let claims = e.claims();
    let all_bound = || {
        let claims = claims.clone();
        async move {
            let items = claims.list(&ListParams::default()).await?.items;
            let n = items
                .iter()
                .filter(|c| phase(c) == Some(ClaimPhase::Bound))
                .count();
            if n == items.len() {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{n}/{} bound", items.len()))
            }
        }
    };
    wait_for("20 claims bound", Duration::from_secs(60), all_bound)
        .await
        .unwrap();
    let holder = address_controller_tests::env::lease_holder(&e.client, &lease)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder, one.user, "the first replica leads");

    // The leader dies; the standby takes over and serves new claims.
    one.kill();
    address_controller_tests::env::wait_lease_holder(&e.client, &lease, &two.user).await;
    for i in 20..26 {
        e.claim(&format!("c{i:02}"), json!({"className": class}))
            .await;
    }
    wait_for(
        "26 claims bound after failover",
        Duration::from_secs(60),
        all_bound,
    )
    .await
    .unwrap();

    // Invariants: one address per IP (the object name is the lock), each claim exactly
    // its families, each address with exactly one claim.
    let addresses: Vec<IPAddress> = e
        .addresses()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|a| a.spec.class_name == class)
        .collect();
    let ips: HashSet<&str> = addresses.iter().map(|a| a.spec.address.as_str()).collect();
    assert_eq!(ips.len(), addresses.len());
    let mut per_claim: BTreeMap<String, usize> = BTreeMap::new();
    for a in &addresses {
        *per_claim
            .entry(a.spec.claim_ref.as_ref().unwrap().name.clone())
            .or_default() += 1;
    }
    for c in e.claims().list(&ListParams::default()).await.unwrap().items {
        let want = if c.spec.family.as_str() == "Dual" {
            2
        } else {
            1
        };
        assert_eq!(
            per_claim.get(&c.name_any()).copied(),
            Some(want),
            "{}",
            c.name_any()
        );
        assert_eq!(c.status.unwrap().addresses.len(), want);
    }
    // Creating an address by hand with a taken name fails: the lock holds for anyone.
    let dup: IPAddress = serde_json::from_value(json!({"metadata": {"name": "ipv4-198-18-40-1"},
        "spec": {"address": "198.18.40.1", "className": class, "source": {"fromClass": {}}}}))
    .unwrap();
    assert!(
        e.addresses()
            .create(&PostParams::default(), &dup)
            .await
            .is_err()
    );
    e.check().await;
}

#[tokio::test]
async fn a_class_says_whether_a_driver_with_a_live_lease_serves_it() {
    let mut e = env("drv-avail").await;
    let class = range_class(&mut e, "avail", json!(["198.18.41.0/28"]), json!({})).await;
    let available = |c: &IPAddressClass| {
        class_condition(c, "DriverAvailable").map(|x| (x.status.clone(), x.reason.clone()))
    };
    let none = (String::from("False"), String::from("NoLiveDriver"));
    let running = (String::from("True"), String::from("DriverRunning"));
    // No driver runs: the class says so.
    let c = wait_class(&e, &class, "DriverAvailable=False", |c| {
        available(c) == Some(none.clone())
    })
    .await;
    let msg = &class_condition(&c, "DriverAvailable").unwrap().message;
    assert!(msg.contains(RANGE_PROVISIONER), "{msg}");

    // A driver with leader election: True, naming its Lease; the kit's own condition
    // (ParametersValid) sits next to the core's.
    let lease = e.name("avail-lease");
    let args = address_controller_tests::env::fast_lease(&lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut drv = ControllerProcess::driver(&format!("drv-avail-{}", e.sfx), &args)
        .await
        .unwrap();
    let c = wait_class(
        &e,
        &class,
        "DriverAvailable=True, ParametersValid=True",
        |c| {
            available(c) == Some(running.clone())
                && class_condition(c, "ParametersValid").is_some_and(|x| x.status == "True")
        },
    )
    .await;
    let msg = &class_condition(&c, "DriverAvailable").unwrap().message;
    assert!(msg.contains(&format!("Lease default/{lease}")), "{msg}");

    // At rest the core writes nothing to the class, although the Lease is renewed twice a
    // second: two more class passes (expiry checks) go by without a write.
    let settled = e.writes(&e.ctl.user).len();
    let passes = || async {
        let m = e.ctl.metrics().await?;
        Ok::<f64, anyhow::Error>(address_controller_tests::sum_samples(
            &m,
            "address_controller_reconcile_total{controller=\"class\"",
            |_| true,
        ))
    };
    let before = passes().await.unwrap();
    wait_for("two class passes at rest", WAIT, || async {
        Ok((passes().await? >= before + 2.0).then_some(()))
    })
    .await
    .unwrap();
    e.barrier().await;
    let since: Vec<_> = e.writes(&e.ctl.user)[settled..].to_vec();
    assert!(since.is_empty(), "writes at rest: {since:?}");

    // SIGKILL: the Lease stays held (nobody releases it) and stops being renewed; the core
    // notices at its expiry, with no watch event to tell it.
    drv.kill();
    wait_class(
        &e,
        &class,
        "DriverAvailable=False after the Lease expired",
        |c| available(c) == Some(none.clone()),
    )
    .await;
    let holder = address_controller_tests::env::lease_holder(&e.client, &lease)
        .await
        .unwrap();
    assert!(
        holder.is_some_and(|h| !h.is_empty()),
        "the Lease still names its dead holder: the flip came from the expiry"
    );
    let _ =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(e.client.clone(), "default")
            .delete(&lease, &DeleteParams::default())
            .await;
    e.check().await;
}
