//! The history's records (#57) against the real control plane: closed entries leave the
//! address for `IPAddressRecord`s, which outlive the address and its namespace, answer the
//! abuse desk's question for an address deleted since, stay out of tenants' reach, and are
//! pruned past the retention — exactly what is older.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeMap;

use address_controller_api::history::{self, HOLDINGS_KEEP, HoldingState, RecordOf, ended};
use address_controller_api::record_labels;
use address_controller_api::{AddressPhase, IPAddressClaim, IPAddressRecord, RecordSpec};
use address_controller_tests::env::{Env, WAIT, aphase, env, phase};
use address_controller_tests::{ControllerProcess, TestNamespace, wait_for};
use address_controller_tests::{address_controller_cli as cli, kubectl_admin as kubectl};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn records(e: &Env) -> Api<IPAddressRecord> {
    Api::all(e.client.clone())
}

/// Waits until `ctl` counts at least one record `action`ed (`pruned`, `capped`).
async fn counted(ctl: &ControllerProcess, action: &str) {
    let series = format!("address_controller_history_records_total{{action=\"{action}\"}}");
    wait_for(&format!("{series} counted"), WAIT, || {
        let series = series.clone();
        async move {
            let m = ctl.metrics().await?;
            let n = address_controller_tests::sample(&m, &series).unwrap_or(0.0);
            Ok((n >= 1.0).then_some(()))
        }
    })
    .await
    .unwrap();
}

/// Writes `status` on the address `a` as an older version left it (the admin's write).
async fn older_version_wrote(e: &Env, a: &str, status: serde_json::Value) {
    e.addresses()
        .patch_status(
            a,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
}

/// The times of `writes` that moved `moved` entries: one write per batch, printed with
/// the gaps between them.
fn batches(
    what: &str,
    moved: usize,
    writes: &[address_controller_tests::AuditedWrite],
) -> Vec<Timestamp> {
    let times: Vec<Timestamp> = writes.iter().filter_map(|w| w.received).collect();
    println!(
        "{what} in {} writes, {:?} ms apart",
        writes.len(),
        times
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_millis())
            .collect::<Vec<_>>()
    );
    let batch = address_controller_api::history::MOVE_BATCH;
    assert_eq!(writes.len(), moved.div_ceil(batch), "{writes:#?}");
    times
}

/// Waits until the record `name` is gone.
async fn record_gone(e: &Env, what: &str, name: &str) {
    wait_for(what, WAIT, || {
        let api = records(e);
        let n = name.to_string();
        async move { Ok(api.get_opt(&n).await?.is_none().then_some(())) }
    })
    .await
    .unwrap();
}

/// Deletes the records of the address with `uid` (what a test made), as the admin.
async fn delete_records_of(e: &Env, uid: &str) {
    let lp = ListParams::default().labels(&format!("{}={uid}", record_labels::ADDRESS_UID));
    let _ = records(e)
        .delete_collection(&DeleteParams::default(), &lp)
        .await;
}

/// The records of the address with `uid`, by ordinal.
async fn records_of(e: &Env, uid: &str, of: RecordOf) -> Vec<RecordSpec> {
    let lp = ListParams::default().labels(&format!(
        "{}={uid},{}={}",
        record_labels::ADDRESS_UID,
        record_labels::RECORD,
        of.as_str()
    ));
    let mut out: Vec<RecordSpec> = records(e)
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.spec)
        .collect();
    out.sort_by_key(|r| r.ordinal);
    out
}

/// An address re-pointed from reservation to reservation past what it keeps: every closed
/// holding moves to a record (created before the write that takes it off), none is dropped,
/// and the view and `holders` still list every one of them.
#[tokio::test]
async fn past_what_it_keeps_the_history_moves_to_records_and_loses_nothing() {
    let mut e = env("recmove").await;
    let (ctl, _, _) = e.serve_views().await;
    e.ctl = ctl;
    let class = e.class("pub", json!({})).await;
    let ns = e.ns.name.clone();
    let a = e
        .address(
            "a",
            "192.0.2.146",
            &class,
            json!({"spec": {"claimRef": {"namespace": ns, "name": "r0"}}}),
        )
        .await;
    e.wait_address(&a, "Available, reserved for r0", |x| {
        x.is_some_and(|x| history::holdings(x).0.len() == 1)
    })
    .await
    .unwrap();
    let moves = HOLDINGS_KEEP + 9;
    for i in 1..moves {
        let target = format!("r{i}");
        e.addresses()
            .patch(
                &a,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"claimRef": {"namespace": ns, "name": target}}})),
            )
            .await
            .unwrap();
        e.wait_address(&a, &format!("reserved for {target}"), |x| {
            x.is_some_and(|x| {
                history::holdings(x)
                    .0
                    .last()
                    .is_some_and(|h| h.name == target && h.until.is_none())
            })
        })
        .await
        .unwrap();
    }
    let x = e.addresses().get(&a).await.unwrap();
    let uid = x.metadata.uid.clone().unwrap();
    let (kept, base) = history::holdings(&x);
    let st = x.status.as_ref().unwrap();
    assert_eq!(
        kept.len(),
        HOLDINGS_KEEP + 1,
        "the open one and {HOLDINGS_KEEP} closed"
    );
    assert_eq!(st.history_dropped, 0, "nothing dropped");
    assert_eq!(st.history_recorded as usize, moves - HOLDINGS_KEEP - 1);
    assert_eq!(base, st.history_recorded);
    let recorded = records_of(&e, &uid, RecordOf::Holding).await;
    let names: Vec<String> = recorded.iter().map(|r| r.name.clone()).collect();
    let want: Vec<String> = (0..st.history_recorded).map(|i| format!("r{i}")).collect();
    assert_eq!(names, want, "every moved holding has its record, in order");
    assert!(
        recorded
            .iter()
            .enumerate()
            .all(|(i, r)| r.ordinal == i as i64
                && r.ended.as_deref() == Some(ended::MOVED)
                && r.state == Some(HoldingState::Reserved)
                && r.until.is_some())
    );
    // Writes: each closing write is one status write of the address, and each moved entry
    // one create of its record — made once (no retry created it twice).
    let writes = e.writes(&e.ctl.user);
    let status_writes = writes
        .iter()
        .filter(|w| {
            w.name.as_deref() == Some(a.as_str()) && w.subresource.as_deref() == Some("status")
        })
        .count();
    let creates = writes
        .iter()
        .filter(|w| w.resource == "ipaddressrecords" && w.verb == "create")
        .count();
    let bytes = serde_json::to_vec(&x).unwrap().len();
    println!(
        "{} closing writes: {status_writes} status writes, {creates} record creates; the address is {bytes} bytes of JSON as the API returns it",
        moves - 1
    );
    assert_eq!(
        creates, st.history_recorded as usize,
        "one create per moved entry"
    );
    assert!(
        status_writes <= moves + 1,
        "{status_writes} status writes for {moves} holdings"
    );
    // A record is immutable, whoever asks.
    let first = recorded[0].to_object();
    let name = first.metadata.name.clone().unwrap();
    let refused = records(&e)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"name": "someone-else"}})),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "{refused:?}"
    );
    // The view lists every holding, from the address and from the records, one list.
    let (ok, out, err) = kubectl(&[
        "get",
        "addressholdings",
        "-n",
        &ns,
        "-o",
        "jsonpath={range .items[*]}{.claim.name}{\"\\n\"}{end}",
    ]);
    assert!(ok, "{err}");
    let mut listed: Vec<&str> = out.lines().collect();
    listed.sort_unstable();
    let mut all: Vec<String> = (0..moves).map(|i| format!("r{i}")).collect();
    all.sort_unstable();
    assert_eq!(listed, all);
    // `holders` answers from both.
    let (ok, text) = cli(&["holders", "192.0.2.146"]).await;
    assert!(ok, "{text}");
    assert!(
        all.iter().all(|n| text.contains(&format!(" {n} "))),
        "{text}"
    );
    e.addresses()
        .patch(
            &a,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"claimRef": null}})),
        )
        .await
        .unwrap();
    e.check().await;
}

/// An address of a `Delete` class: bound, its claim deleted, the address deleted with it.
/// Its holding is in a record, and the abuse desk's questions — `holders IP --at T`, the
/// view's `heldAt`, `usage` — still answer for it, and for a namespace deleted since. A
/// tenant cannot read the records (they are cluster-scoped, no tenant role names them).
#[tokio::test]
async fn a_deleted_address_and_namespace_keep_their_history_in_records() {
    let mut e = env("recdel").await;
    let (ctl, _, _) = e.serve_views().await;
    e.ctl = ctl;
    let class = e
        .class("del", json!({"spec": {"reclaimPolicy": "Delete"}}))
        .await;
    let gone = TestNamespace::create(&e.client, "recdel-gone")
        .await
        .unwrap();
    let a = e
        .address(
            "a",
            "192.0.2.147",
            &class,
            json!({"spec": {"reclaimPolicy": "Delete"}}),
        )
        .await;
    let addr = e.addresses().get(&a).await.unwrap();
    let uid = addr.metadata.uid.clone().unwrap();
    let claims: Api<IPAddressClaim> = Api::namespaced(e.client.clone(), &gone.name);
    let c: IPAddressClaim =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"className": class}}))
            .unwrap();
    claims.create(&PostParams::default(), &c).await.unwrap();
    let t0 = Timestamp::now();
    wait_for("claim web Bound", WAIT, || {
        let claims = claims.clone();
        async move {
            let c = claims.get("web").await?;
            Ok((phase(&c) == Some(address_controller_api::ClaimPhase::Bound)).then_some(()))
        }
    })
    .await
    .unwrap();
    e.wait_address(&a, "Bound", |x| aphase(x) == Some(AddressPhase::Bound))
        .await
        .unwrap();
    // Held into a later second, so "at T" has an instant inside the holding.
    wait_for("two seconds held", WAIT, || async move {
        Ok((Timestamp::now() >= t0 + SignedDuration::from_secs(2)).then_some(()))
    })
    .await
    .unwrap();
    let inside = Timestamp::now() - SignedDuration::from_secs(1);
    claims
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the address deleted (reclaim policy Delete)", WAIT, || {
        let api = e.addresses();
        let a = a.clone();
        async move { Ok(api.get_opt(&a).await?.is_none().then_some(())) }
    })
    .await
    .unwrap();
    // The namespace goes too: its record stays, for the admin.
    let gone_name = gone.name.clone();
    drop(gone);
    wait_for("namespace gone", WAIT, || {
        let client = e.client.clone();
        let n = gone_name.clone();
        async move {
            let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
            Ok(api.get_opt(&n).await?.is_none().then_some(()))
        }
    })
    .await
    .unwrap();
    let recorded = records_of(&e, &uid, RecordOf::Holding).await;
    assert_eq!(recorded.len(), 1, "{recorded:#?}");
    let r = &recorded[0];
    assert_eq!(
        (r.namespace.as_str(), r.name.as_str()),
        (gone_name.as_str(), "web")
    );
    assert_eq!(r.address, "192.0.2.147");
    assert!(r.from.is_some() && r.until.is_some(), "{r:?}");
    // Who held it at T: the CLI, and the view's field selector, for an address and a
    // namespace that no longer exist.
    let at = inside.to_string();
    let (ok, text) = cli(&["holders", "192.0.2.147", "--at", &at]).await;
    assert!(
        ok && text.contains(&gone_name) && text.contains(" web "),
        "{text}"
    );
    let selector = format!("address=192.0.2.147,heldAt={at}");
    let (ok, out, err) = kubectl(&[
        "get",
        "addressholdings",
        "-A",
        "--field-selector",
        &selector,
        "-o",
        "jsonpath={.items[*].metadata.namespace}/{.items[*].claim.name}",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("{gone_name}/web"));
    let from = (t0 - SignedDuration::from_secs(60)).to_string();
    let (ok, text) = cli(&["usage", "--from", &from, "-n", &gone_name, "-o", "csv"]).await;
    assert!(ok, "{text}");
    let row = text
        .lines()
        .find(|l| l.contains(&format!(",{gone_name},{class},")))
        .unwrap_or_else(|| panic!("no usage row for {gone_name}: {text}"));
    let held: i64 = row.split(',').nth(5).unwrap().parse().unwrap();
    assert!(held >= 2, "{row}");
    let (ok, text) = cli(&[
        "history", "export", "--from", &from, "-n", &gone_name, "-o", "jsonl",
    ])
    .await;
    assert!(
        ok && text.contains("\"record\":\"holding\"") && text.contains(&uid),
        "{text}"
    );
    // A tenant of this namespace reads no record: not by list, watch or a name it guesses.
    let tenant = format!("system:serviceaccount:{}:default", e.ns.name);
    for verb in ["list", "watch", "get"] {
        let (_, out, _) = kubectl(&["auth", "can-i", verb, "ipaddressrecords", "--as", &tenant]);
        assert_eq!(out.trim(), "no", "a tenant may {verb} records");
    }
    let (ok, _, err) = kubectl(&[
        "get",
        "ipaddressrecords",
        &r.to_object().metadata.name.unwrap(),
        "--as",
        &tenant,
    ]);
    assert!(!ok && err.contains("forbidden"), "{err}");
    // The admin deletes what the test made.
    delete_records_of(&e, &uid).await;
    e.check().await;
}

/// The retention prunes exactly what ended longer ago than `--history-retention`: of two
/// records, 2 h and 10 min old, under a 1 h retention, the first goes (the positive
/// control: the pruner ran) and the second stays.
#[tokio::test]
async fn the_retention_prunes_exactly_what_is_older() {
    let e = env("recprune").await;
    let uid = format!("prune-test-{}", e.sfx);
    let now = Timestamp::now();
    let make = |ordinal: i64, ago: i64| RecordSpec {
        record: RecordOf::Holding,
        address: "192.0.2.148".into(),
        ip_address: format!("ipv4-192-0-2-148-{}", e.sfx),
        address_uid: uid.clone(),
        ordinal,
        class_name: "none".into(),
        kind: "IPAddressClaim".into(),
        namespace: e.ns.name.clone(),
        name: format!("c{ordinal}"),
        uid: None,
        state: Some(HoldingState::Bound),
        from: Some(Time(now - SignedDuration::from_secs(ago + 60))),
        until: Some(Time(now - SignedDuration::from_secs(ago))),
        ended: Some(ended::RELEASED.into()),
        found: false,
        egress: false,
        nodes: vec![],
    };
    let old = make(0, 2 * 3600).to_object();
    let young = make(1, 600).to_object();
    for r in [&old, &young] {
        records(&e).create(&PostParams::default(), r).await.unwrap();
    }
    let pruner = ControllerProcess::start(
        &format!("ctl-recprune-b-{}", e.sfx),
        &[
            "--leader-elect=false",
            "--apiserver=false",
            "--history-retention=1h",
            "--history-prune-interval=1s",
        ],
    )
    .await
    .unwrap();
    let old_name = old.metadata.name.clone().unwrap();
    record_gone(&e, "the old record pruned", &old_name).await;
    // The pass that pruned it ends (it may have older records of other tests to prune), and
    // one full pass after it: the young one is still there.
    counted(&pruner, "pruned").await;
    wait_for("another pass of the pruner", WAIT, || {
        let p = &pruner;
        async move {
            let m = p.metrics().await?;
            let passes = address_controller_tests::sample(
                &m,
                "address_controller_reconcile_total{controller=\"records\",result=\"success\"}",
            );
            Ok(passes.filter(|n| *n >= 2.0).map(|_| ()))
        }
    })
    .await
    .unwrap();
    let young_name = young.metadata.name.clone().unwrap();
    assert!(
        records(&e).get_opt(&young_name).await.unwrap().is_some(),
        "a record inside the retention was pruned"
    );
    records(&e)
        .delete(&young_name, &DeleteParams::default())
        .await
        .unwrap();
    drop(pruner);

    // The cap: with one record more than --history-max-records allows, it prunes from the
    // namespace holding the most records, that namespace's oldest first — not the oldest of
    // the cluster, which belongs to a quiet tenant here and stays (a tenant that churns to
    // fill the cap prunes its own history), and never the churner's newest.
    let mut by_ns: BTreeMap<String, usize> = BTreeMap::new();
    for r in records(&e)
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let ns = r
            .metadata
            .labels
            .and_then(|l| l.get(record_labels::NAMESPACE).cloned())
            .unwrap_or_default();
        *by_ns.entry(ns).or_default() += 1;
    }
    let most = by_ns.values().copied().max().unwrap_or(0);
    let churn: Vec<IPAddressRecord> = (0..most as i64 + 2)
        .map(|i| make(10 + i, (390 - i) * 86_400).to_object())
        .collect();
    let newest = make(9, 60).to_object();
    let mut quiet = make(8, 395 * 86_400);
    quiet.namespace = format!("{}-quiet", e.ns.name);
    let quiet = quiet.to_object();
    for r in churn.iter().chain([&newest, &quiet]) {
        records(&e).create(&PostParams::default(), r).await.unwrap();
    }
    let total = records(&e)
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    let max = (total - 1).to_string();
    let capper = ControllerProcess::start(
        &format!("ctl-recprune-c-{}", e.sfx),
        &[
            "--leader-elect=false",
            "--apiserver=false",
            "--history-max-records",
            &max,
            "--history-prune-interval=1s",
        ],
    )
    .await
    .unwrap();
    let oldest_name = churn[0].metadata.name.clone().unwrap();
    record_gone(&e, "the churner's oldest record capped", &oldest_name).await;
    counted(&capper, "capped").await;
    for (r, what) in [
        (&newest, "the churner's newest"),
        (&quiet, "the quiet tenant's"),
    ] {
        let name = r.metadata.name.clone().unwrap();
        assert!(
            records(&e).get_opt(&name).await.unwrap().is_some(),
            "the cap pruned {what} record"
        );
    }
    delete_records_of(&e, &uid).await;
    drop(capper);
}

/// An address written by an older version — 27 closed holdings in its status, past what an
/// address keeps now — moves them to records in writes of its own, a batch each, spaced by
/// `--history-move-rate` (no burst). One record was already there, as a core that died
/// between a record and its write leaves it: it is kept as it was, not made twice. At the
/// end every entry is on the address or in a record; a record deleted behind the core's back
/// is what the checker's `history-unrecorded` rule catches (its positive control).
#[tokio::test]
async fn an_older_versions_history_moves_to_records_at_the_rate_set() {
    use address_controller_api::history::Holding;
    use address_controller_driver_conformance::invariants::{Scope, check};
    let mut e = env("recupg").await;
    let class = e.class("pub", json!({})).await;
    let ns = e.ns.name.clone();
    let closed = 27usize;
    // The open reservation the core records itself.
    let a = e
        .address(
            "a",
            "192.0.2.149",
            &class,
            json!({"spec": {"claimRef": {"namespace": ns, "name": format!("r{closed}")}}}),
        )
        .await;
    let open = e
        .wait_address(&a, "Available, reserved", |x| {
            x.is_some_and(|x| history::holdings(x).0.len() == 1)
        })
        .await
        .unwrap();
    let uid = open.metadata.uid.clone().unwrap();
    // The history an older version wrote: closed reservations, then the open one.
    // Whole seconds: what the API keeps of a time.
    let t0 = Timestamp::from_second(Timestamp::now().as_second() - 86_400).unwrap();
    let at = |s: i64| Time(t0 + SignedDuration::from_secs(s));
    let mut list: Vec<Holding> = (0..closed as i64)
        .map(|i| Holding {
            namespace: ns.clone(),
            name: format!("r{i}"),
            uid: None,
            state: HoldingState::Reserved,
            from: Some(at(10 * i)),
            until: Some(at(10 * i + 10)),
            ended: Some(ended::MOVED.into()),
            found: false,
        })
        .collect();
    let mut last = history::holdings(&open).0[0].clone();
    last.from = Some(at(10 * closed as i64));
    list.push(last);
    // What a core that died after its first record and before its write left behind.
    let meta = history::AddressMeta::of(&open);
    let crashed = meta.holding(0, &list[0]);
    records(&e)
        .create(&PostParams::default(), &crashed.to_object())
        .await
        .unwrap();
    // The new core, its moves paced at 2 a second.
    let user = format!("ctl-recupg-b-{}", e.sfx);
    e.ctl = ControllerProcess::start(&user, &["--leader-elect=false", "--history-move-rate=2"])
        .await
        .unwrap();
    older_version_wrote(&e, &a, json!({"history": list})).await;
    let moved = closed - HOLDINGS_KEEP;
    let x = e
        .wait_address(&a, "the backlog moved", |x| {
            x.is_some_and(|x| {
                x.status
                    .as_ref()
                    .is_some_and(|s| s.history_recorded as usize == moved)
            })
        })
        .await
        .unwrap();
    let (kept, base) = history::holdings(&x);
    assert_eq!(kept.len(), HOLDINGS_KEEP + 1);
    assert_eq!(base as usize, moved);
    assert_eq!(kept[0].name, format!("r{moved}"));
    let recorded = records_of(&e, &uid, RecordOf::Holding).await;
    assert_eq!(
        recorded.len(),
        moved,
        "one record each, the crashed one not made twice"
    );
    for (i, r) in recorded.iter().enumerate() {
        assert_eq!((r.ordinal, r.name.clone()), (i as i64, format!("r{i}")));
        assert_eq!(r.until, Some(at(10 * i as i64 + 10)));
    }
    assert_eq!(
        recorded[0], crashed,
        "the record a crash left is kept as it was"
    );
    // The moves: writes of the core's own to the address, a batch each, spaced by the rate.
    let writes: Vec<_> = e
        .writes(&user)
        .into_iter()
        .filter(|w| {
            w.name.as_deref() == Some(a.as_str()) && w.subresource.as_deref() == Some("status")
        })
        .collect();
    let times = batches(&format!("the core moved {moved} holdings"), moved, &writes);
    // The pacer spaces the turns 500 ms apart; a write follows its batch's creates, so two
    // writes may be closer by a batch's creates, never on average (a burst would be all
    // within a few milliseconds).
    let span = times[times.len() - 1].duration_since(times[0]);
    let gaps = i32::try_from(times.len() - 1).unwrap();
    assert!(
        span >= SignedDuration::from_millis(400) * gaps,
        "moves closer than the rate allows: {times:?}"
    );
    e.check().await;
    // The positive control of `history-unrecorded`: a record deleted behind the core's back.
    records(&e)
        .delete(
            &crashed.to_object().metadata.name.unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let scope = Scope::of(&[ns.as_str()], &[class.as_str()]);
    let report = check(&e.client, &scope, std::time::Duration::from_secs(1), &[])
        .await
        .unwrap();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.rule == "history-unrecorded"),
        "{}",
        report.table()
    );
    records(&e)
        .create(&PostParams::default(), &crashed.to_object())
        .await
        .unwrap();
    e.addresses()
        .patch(
            &a,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"claimRef": null}})),
        )
        .await
        .unwrap();
    e.check().await;
    delete_records_of(&e, &uid).await;
}

/// An address whose Service spans an older version wrote past what it keeps now (20
/// closed, no Service attached since, so no ledger write would ever move them): the driver
/// moves them to records in writes of its own, a batch each, at its `--history-move-rate`
/// — the kit's own part of the history, never the core's.
#[tokio::test]
async fn an_older_versions_service_spans_move_to_records_by_the_driver() {
    use address_controller_api::history::{AttachmentSpan, SPANS_KEEP};
    use address_controller_tests::env::{purge, range_class};
    let mut e = env("recspan").await;
    purge(&e, &["198.18.108."]).await;
    let user = format!("drv-recspan-{}", e.sfx);
    let _drv = ControllerProcess::driver(&user, &["--leader-elect=false", "--history-move-rate=2"])
        .await
        .unwrap();
    let class = range_class(&mut e, "recspan", json!(["198.18.108.3/32"]), json!({})).await;
    e.claim("web", json!({"className": class})).await;
    let c = wait_for("claim web Bound", WAIT, || async {
        let c = e.claims().get("web").await?;
        Ok((phase(&c) == Some(address_controller_api::ClaimPhase::Bound)).then_some(c))
    })
    .await
    .unwrap();
    let a = c.status.as_ref().unwrap().addresses[0].name.clone();
    let x = e.addresses().get(&a).await.unwrap();
    let uid = x.metadata.uid.clone().unwrap();
    let t0 = Timestamp::from_second(Timestamp::now().as_second() - 3_600).unwrap();
    let at = |s: i64| Time(t0 + SignedDuration::from_secs(s));
    let closed = 20usize;
    let spans: Vec<AttachmentSpan> = (0..closed as i64)
        .map(|i| AttachmentSpan {
            kind: "Service".into(),
            namespace: Some(e.ns.name.clone()),
            name: format!("s{i}"),
            from: at(10 * i),
            until: Some(at(10 * i + 5)),
            found: false,
            egress: false,
            nodes: vec![],
        })
        .collect();
    older_version_wrote(&e, &a, json!({"attachmentHistory": spans})).await;
    let moved = closed - SPANS_KEEP;
    let x = e
        .wait_address(&a, "the driver moved the spans", |x| {
            x.and_then(|x| x.status.as_ref())
                .is_some_and(|s| s.attachment_history_recorded as usize == moved)
        })
        .await
        .unwrap();
    let (kept, base) = history::spans(&x);
    assert_eq!((kept.len(), base as usize), (SPANS_KEEP, moved));
    assert_eq!(kept[0].name, format!("s{moved}"));
    let recorded = records_of(&e, &uid, RecordOf::Attachment).await;
    let names: Vec<(i64, String)> = recorded
        .iter()
        .map(|r| (r.ordinal, r.name.clone()))
        .collect();
    let want: Vec<(i64, String)> = (0..moved as i64).map(|i| (i, format!("s{i}"))).collect();
    assert_eq!(names, want, "one record per moved span, in order");
    // The driver's own writes to the address, a batch each, spaced by its rate; each batch's
    // records created by the driver before its write.
    let mine = |keep: &dyn Fn(&address_controller_tests::AuditedWrite) -> bool| {
        address_controller_tests::audited_writes(&user, |w| w.code < 300 && keep(w)).unwrap()
    };
    let writes = mine(&|w| {
        w.name.as_deref() == Some(a.as_str()) && w.subresource.as_deref() == Some("status")
    });
    let times = batches(&format!("the driver moved {moved} spans"), moved, &writes);
    assert!(
        times[1].duration_since(times[0]) >= SignedDuration::from_millis(400),
        "moves closer than the rate allows: {times:?}"
    );
    let created = mine(&|w| w.resource == "ipaddressrecords" && w.verb == "create");
    assert_eq!(created.len(), moved, "the driver made each record once");
    assert!(
        created.last().and_then(|c| c.completed) <= times.last().copied(),
        "the last record before the last write"
    );
    e.check().await;
    delete_records_of(&e, &uid).await;
}
