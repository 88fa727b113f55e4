//! An address's history (#44) against the real control plane: who held it and which
//! Services it was on, from when until when, written within the writes that bind, attach,
//! detach and release it — across a leader failover, past its bound, and as the abuse desk
//! asks it ("who held X at T").

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_api::history::{self, HoldingState, ended};
use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::env::{
    Env, WAIT, aphase, env, fast_lease, phase, purge, range_class, wait_lease_holder,
};
use address_controller_tests::{ControllerProcess, TestNamespace, wait_for};
use address_controller_tests::{address_controller_cli as cli, kubectl_admin as kubectl};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn now() -> Timestamp {
    Timestamp::now()
}

/// `t` within `[lo, hi]`, `lo` taken down to its second (the history keeps seconds).
fn within(what: &str, t: &Time, lo: Timestamp, hi: Timestamp) {
    let lo = Timestamp::from_second(lo.as_second()).unwrap();
    assert!(
        lo <= t.0 && t.0 <= hi,
        "{what}: {} not within [{lo}, {hi}]",
        t.0
    );
}

async fn bound(e: &Env, api: &Api<IPAddressClaim>, name: &str) -> (IPAddressClaim, String) {
    let c = wait_for(&format!("claim {name} Bound"), WAIT, || {
        let api = api.clone();
        async move {
            let c = api.get(name).await?;
            Ok((phase(&c) == Some(ClaimPhase::Bound)).then_some(c))
        }
    })
    .await
    .unwrap();
    let a = c.status.as_ref().unwrap().addresses[0].name.clone();
    // The claim says Bound once its address names it (SPEC §4.8); the address's own pass
    // writes its phase Bound — and opens the holding — a moment later: wait for that too,
    // so a time taken after this is after the holding began.
    e.wait_address(&a, "Bound, its holding open", |x| {
        aphase(x) == Some(AddressPhase::Bound)
    })
    .await
    .unwrap();
    (c, a)
}

async fn holders(e: &Env, address: &str, want: &[String]) -> IPAddress {
    e.wait_address(address, &format!("holders {want:?}"), |a| {
        a.is_some_and(|a| a.holder_services() == want)
    })
    .await
    .unwrap()
}

/// One address, two tenants: bound by `web` in one namespace, attached to a Service,
/// detached, the claim deleted (Retain), released after the class's delay, bound by `db`
/// in another namespace. Its history lists both holdings and the Service, in order, with
/// times within the test's own timestamps; "who held X at T" answers each tenant inside
/// its holding and nobody in the gap between.
/// One address, two tenants: bound by `web` in one namespace, attached to a Service,
/// detached, the claim deleted (Retain), released after the class's delay, bound by `db`
/// in another namespace. Its history lists both holdings and the Service, in order, with
/// times within the test's own timestamps; "who held X at T" answers each tenant inside
/// its holding and nobody in the gap between — in the library, from the binary, through
/// kubectl to the abuse desk and to each tenant for its own namespace; the archive exports
/// every record; usage equals the history to the second.
#[tokio::test]
async fn an_address_remembers_who_held_it_and_where_it_was_attached() {
    let mut e = env("hist").await;
    let (ctl, _, _) = e.serve_views().await;
    e.ctl = ctl;
    purge(&e, &["198.18.103."]).await;
    let _drv = ControllerProcess::driver(&format!("drv-hist-{}", e.sfx), &["--leader-elect=false"])
        .await
        .unwrap();
    let story = Story::told(&mut e).await;
    the_history_lists_both_holdings_and_the_service(&story);
    who_held_it_is_answered_at_each_instant(&story).await;
    the_archive_exports_every_record_of_the_period(&story).await;
    kubectl_answers_the_abuse_desk_and_each_tenant_its_own(&e, &story);
    usage_equals_the_history_to_the_second(&story).await;
    // Only the last entry is open, and it is the claimRef: the checker's rule agrees.
    assert!(
        history::problems(&story.a).is_empty(),
        "{:?}",
        history::problems(&story.a)
    );
    let theirs: Api<IPAddressClaim> = Api::namespaced(e.client.clone(), &story.other.name);
    theirs.delete("db", &DeleteParams::default()).await.unwrap();
    e.check().await;
}

/// What the test did to the one address, and when: `t[0]` before `web` was created … `t[6]`
/// after `db` was bound (the instants between each step).
struct Story {
    ns: String,
    other: TestNamespace,
    class: String,
    /// The address's name and its IP.
    name: String,
    ip: String,
    web: IPAddressClaim,
    db: IPAddressClaim,
    t: [Timestamp; 7],
    /// The address at the end.
    a: IPAddress,
}

impl Story {
    async fn told(e: &mut Env) -> Story {
        let class = range_class(
            e,
            "hist",
            json!(["198.18.103.7/32"]),
            json!({"spec": {"releaseDelay": "3s"}}),
        )
        .await;
        let ns = e.ns.name.clone();
        let other = TestNamespace::create(&e.client, "hist-b").await.unwrap();

        let mut t = [now(); 7];
        e.claim("web", json!({"className": class})).await;
        let (web, name) = bound(e, &e.claims(), "web").await;
        t[1] = now();

        let services: Api<Service> = Api::namespaced(e.client.clone(), &ns);
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "site", "annotations": {SERVICE_CLAIM_ANNOTATION: "web"}},
            "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
                "selector": {"app": "site"}}}))
        .unwrap();
        services.create(&PostParams::default(), &svc).await.unwrap();
        let attached = holders(e, &name, &[format!("{ns}/site")]).await;
        // The history keeps seconds: the Service holds the address into a later second, so
        // its span is not empty.
        let since = history::spans(&attached).0[0].from.0;
        wait_for("a second past the attachment", WAIT, || async move {
            Ok((now() >= since + SignedDuration::from_secs(2)).then_some(()))
        })
        .await
        .unwrap();
        t[2] = now();
        services
            .delete("site", &DeleteParams::default())
            .await
            .unwrap();
        holders(e, &name, &[]).await;
        t[3] = now();

        e.claims()
            .delete("web", &DeleteParams::default())
            .await
            .unwrap();
        e.wait_address(&name, "Released", |a| {
            aphase(a) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
        t[4] = now();
        e.wait_address(&name, "Available after the delay", |a| {
            aphase(a) == Some(AddressPhase::Available)
                && a.is_some_and(|a| a.spec.claim_ref.is_none())
        })
        .await
        .unwrap();
        t[5] = now();
        let theirs: Api<IPAddressClaim> = Api::namespaced(e.client.clone(), &other.name);
        let db: IPAddressClaim = serde_json::from_value(
            json!({"metadata": {"name": "db"}, "spec": {"className": class}}),
        )
        .unwrap();
        theirs.create(&PostParams::default(), &db).await.unwrap();
        let (db, again) = bound(e, &theirs, "db").await;
        t[6] = now();
        assert_eq!(again, name, "the one address of the class, bound again");
        let a = e.addresses().get(&name).await.unwrap();
        Story {
            ns,
            other,
            class,
            ip: a.spec.address.clone(),
            name,
            web,
            db,
            t,
            a,
        }
    }
}

/// The history lists both holdings (in order, with their uids, times within the test's own
/// and how the first ended) and the Service's attachment.
fn the_history_lists_both_holdings_and_the_service(story: &Story) {
    let Story {
        ns,
        other,
        web,
        db,
        t,
        a,
        ..
    } = story;
    let (h, dropped) = history::holdings(a);
    assert_eq!(dropped, 0);
    assert_eq!(h.len(), 2, "{h:#?}");
    assert_eq!(
        (h[0].state, h[0].namespace.as_str(), h[0].name.as_str()),
        (HoldingState::Bound, ns.as_str(), "web")
    );
    assert_eq!(h[0].uid, web.metadata.uid);
    within("web bound from", h[0].from.as_ref().unwrap(), t[0], t[1]);
    within("web held until", h[0].until.as_ref().unwrap(), t[3], t[4]);
    assert_eq!(h[0].ended.as_deref(), Some(ended::RELEASED));
    assert_eq!(
        (h[1].state, h[1].namespace.as_str(), h[1].name.as_str()),
        (HoldingState::Bound, other.name.as_str(), "db")
    );
    assert_eq!(h[1].uid, db.metadata.uid);
    within("db bound from", h[1].from.as_ref().unwrap(), t[5], t[6]);
    assert_eq!(h[1].until, None);
    assert!(!h[0].found && !h[1].found);

    let (spans, _) = history::spans(a);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(
        (spans[0].namespace.as_deref(), spans[0].name.as_str()),
        (Some(ns.as_str()), "site")
    );
    within("site attached from", &spans[0].from, t[1], t[2]);
    within(
        "site attached until",
        spans[0].until.as_ref().unwrap(),
        t[2],
        t[3],
    );
}

/// The abuse desk's question, at instants inside each holding and in the gap; the same
/// answers from the binary an operator runs.
async fn who_held_it_is_answered_at_each_instant(story: &Story) {
    let Story {
        ns, other, ip, a, ..
    } = story;
    let (h, _) = history::holdings(a);
    let (spans, _) = history::spans(a);
    let at = |t: Timestamp| Time(t);
    let inside_web = h[0].from.as_ref().unwrap().0;
    assert_eq!(
        history::holder_at(h, &at(inside_web)).map(|x| x.name.as_str()),
        Some("web")
    );
    let (inside_db, gap) = inside_db_and_gap(a);
    assert_eq!(
        history::holder_at(h, &at(inside_db)).map(|x| x.namespace.as_str()),
        Some(other.name.as_str())
    );
    assert!(
        gap < h[1].from.as_ref().unwrap().0,
        "the release delay leaves a gap"
    );
    assert_eq!(history::holder_at(h, &at(gap)), None);
    assert_eq!(history::attached_at(spans, &at(spans[0].from.0)).len(), 1);
    assert!(history::attached_at(spans, &at(gap)).is_empty());

    let (ok, out) = cli(&["holders", ip, "--at", &spans[0].from.0.to_string()]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("{ns}   "))
            && out.contains("web")
            && out.contains(&format!("{ns}/site")),
        "{out}"
    );
    assert!(!out.contains(&other.name), "only the holding at T: {out}");
    let (ok, out) = cli(&["holders", ip, "--at", &gap.to_string()]).await;
    assert!(!ok && out.contains("nobody held it at"), "{out}");
    let (ok, out) = cli(&["holders", ip]).await;
    assert!(
        ok && out.contains(&other.name) && out.contains("Released"),
        "{out}"
    );
}

/// The instant inside `db`'s holding and the instant in the gap between the two.
fn inside_db_and_gap(a: &IPAddress) -> (Timestamp, Timestamp) {
    let (h, _) = history::holdings(a);
    (
        h[1].from.as_ref().unwrap().0 + SignedDuration::from_secs(1),
        h[0].until.as_ref().unwrap().0 + SignedDuration::from_secs(1),
    )
}

/// The archive (#57): every record of the address touching the period, as JSON lines and
/// as CSV, for a store outside the cluster; a namespace's own records alone.
async fn the_archive_exports_every_record_of_the_period(story: &Story) {
    let Story {
        ns,
        other,
        ip,
        web,
        t,
        a,
        ..
    } = story;
    let (h, _) = history::holdings(a);
    let from = (t[0] - SignedDuration::from_secs(1)).to_string();
    let export = |format: &'static str, namespace: Option<String>| {
        let from = from.clone();
        async move {
            let mut args = vec!["history", "export", "--from", from.as_str(), "-o", format];
            if let Some(ns) = namespace.as_deref() {
                args.extend(["-n", ns]);
            }
            let out = tokio::process::Command::new(address_controller_tests::binary(
                "address-controller",
            ))
            .args(&args)
            .arg("--kubeconfig")
            .arg(&address_controller_tests::Cluster::get().kubeconfig)
            .output()
            .await
            .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let lines: Vec<serde_json::Value> = export("jsonl", None)
        .await
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["address"] == ip.as_str())
        .collect();
    let kinds: Vec<String> = lines
        .iter()
        .map(|r| {
            format!(
                "{}:{}/{}",
                r["record"].as_str().unwrap(),
                r["namespace"].as_str().unwrap(),
                r["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            format!("holding:{ns}/web"),
            format!("holding:{}/db", other.name),
            format!("attachment:{ns}/site")
        ],
        "{lines:#?}"
    );
    assert_eq!(lines[0]["uid"], json!(web.metadata.uid));
    assert_eq!(lines[0]["ended"], "Released");
    assert_eq!(lines[0]["until"], json!(h[0].until));
    assert!(
        lines[1].get("until").is_none(),
        "the open holding has no end"
    );
    let csv = export("csv", Some(other.name.clone())).await;
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], history::RECORD_COLUMNS.join(","));
    assert!(
        rows[1..]
            .iter()
            .all(|r| r.contains(&format!(",{},", other.name))),
        "only the namespace's own records: {csv}"
    );
    assert!(
        rows[1..]
            .iter()
            .any(|r| r.starts_with(&format!("holding,{ip},"))),
        "{csv}"
    );
}

/// Through kubectl and the aggregator: the abuse desk (cluster-wide) asks "who held X at
/// T"; each tenant reads its own namespace's holdings and nothing of the other's.
fn kubectl_answers_the_abuse_desk_and_each_tenant_its_own(e: &Env, story: &Story) {
    let Story {
        ns,
        other,
        class,
        name,
        ip,
        a,
        ..
    } = story;
    let (spans, _) = history::spans(a);
    let (inside_db, gap) = inside_db_and_gap(a);
    let holdings_at = |t: &Timestamp| {
        kubectl(&[
            "get",
            "addressholdings",
            "-A",
            "--field-selector",
            &format!("address={ip},heldAt={t}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace}/{.claim.name} {end}",
        ])
    };
    let (ok, out, err) = holdings_at(&spans[0].from.0);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), format!("{ns}/web"));
    let (ok, out, err) = holdings_at(&inside_db);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), format!("{}/db", other.name));
    let (ok, out, err) = holdings_at(&gap);
    assert!(ok && out.trim().is_empty(), "nobody in the gap: {out}{err}");
    let (ok, _, err) = kubectl(&[
        "get",
        "addressholdings",
        "-A",
        "--field-selector",
        "heldAt=yesterday",
    ]);
    assert!(!ok && err.contains("RFC 3339"), "{err}");
    let (ok, table, err) = kubectl(&["get", "addressholdings", "-n", ns, "-o", "wide"]);
    assert!(ok, "{err}");
    println!("kubectl get addressholdings -n {ns} -o wide\n{table}");
    let (_, every, _) = kubectl(&[
        "get",
        "addressholdings",
        "-A",
        "--field-selector",
        &format!("address={ip}"),
    ]);
    println!("kubectl get addressholdings -A --field-selector address={ip}\n{every}");
    assert!(
        table.contains("CLAIM")
            && table.contains("web")
            && table.contains("Released")
            && table.contains("site")
            && table.contains(class.as_str()),
        "{table}"
    );
    let tenant = format!("tenant-{}", e.sfx);
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: holdings, namespace: {ns}}}\n\
         rules: [{{apiGroups: [view.local.sdn.cozystack.io], resources: [addressholdings], verbs: [get, list]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: holdings, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: holdings}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {tenant}}}]\n"
    );
    let dir = address_controller_tests::env::tempdir();
    std::fs::write(dir.join("rbac.yaml"), rbac).unwrap();
    let (ok, _, err) = kubectl(&["apply", "-f", dir.join("rbac.yaml").to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&[
        "get",
        "addressholdings",
        "-n",
        ns,
        "--as",
        &tenant,
        "-o",
        "name",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        format!(
            "addressholding.view.local.sdn.cozystack.io/{}",
            address_controller_api::holding_view_name(
                name,
                a.metadata.uid.as_deref().unwrap_or_default(),
                0
            )
        )
    );
    let (ok, _, err) = kubectl(&["get", "addressholdings", "-n", &other.name, "--as", &tenant]);
    assert!(
        !ok && err.contains("forbidden"),
        "the other namespace's: {err}"
    );
    let (ok, _, err) = kubectl(&["get", "addressholdings", "-A", "--as", &tenant]);
    assert!(!ok && err.contains("forbidden"), "every namespace's: {err}");
}

/// Usage over [t0, end): each namespace's held and attached seconds equal what the test
/// computes from the history it observed, to the second.
async fn usage_equals_the_history_to_the_second(story: &Story) {
    let Story {
        ns,
        other,
        class,
        t,
        a,
        ..
    } = story;
    let (h, _) = history::holdings(a);
    let (spans, _) = history::spans(a);
    let db_from = h[1].from.as_ref().unwrap().0;
    wait_for("a second into db's holding", WAIT, || async move {
        Ok((now() >= db_from + SignedDuration::from_secs(2)).then_some(()))
    })
    .await
    .unwrap();
    let end = Timestamp::from_second(now().as_second()).unwrap();
    let secs = |from: &Time, until: Option<&Time>| {
        until.map_or(end, |u| u.0).as_second() - from.0.as_second()
    };
    let (ok, csv) = cli(&[
        "usage",
        "--from",
        &t[0].to_string(),
        "--to",
        &end.to_string(),
        "-o",
        "csv",
    ])
    .await;
    assert!(ok, "{csv}");
    let row = |namespace: &str| -> Vec<String> {
        csv.lines()
            .map(|l| l.split(',').map(str::to_string).collect::<Vec<_>>())
            .find(|r| r.get(2).map(String::as_str) == Some(namespace) && r.get(3) == Some(class))
            .unwrap_or_else(|| panic!("no row for {namespace} in\n{csv}"))
    };
    let web_row = row(ns);
    let want_web = secs(h[0].from.as_ref().unwrap(), h[0].until.as_ref());
    let want_site = secs(&spans[0].from, spans[0].until.as_ref());
    // No Service of theirs was served by cozy-proxy: no egress seconds.
    assert_eq!(
        web_row[4..9],
        [
            "1".to_string(),
            want_web.to_string(),
            want_site.to_string(),
            "0".to_string(),
            "complete".to_string()
        ],
        "{csv}"
    );
    let db_row = row(&other.name);
    let want_db = secs(h[1].from.as_ref().unwrap(), None);
    assert_eq!(
        db_row[4..9],
        [
            "1".to_string(),
            want_db.to_string(),
            "0".to_string(),
            "0".to_string(),
            "complete".to_string()
        ],
        "{csv}"
    );
}

/// Two replicas with leader election; the leader that wrote the bind is killed before the
/// release. The new leader closes the very holding the old one opened: one entry, closed
/// `Released` at `releasedAt`, nothing open, nothing doubled.
#[tokio::test]
async fn a_leader_failover_between_bind_and_release_keeps_the_history_exact() {
    let mut e = env("histha").await;
    e.ctl.stop();
    let lease = format!("histha-{}", e.sfx);
    let args = fast_lease(&lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = ControllerProcess::start(&format!("ctl-histha-a-{}", e.sfx), &args)
        .await
        .unwrap();
    wait_lease_holder(&e.client, &lease, &first.user).await;
    let second = ControllerProcess::start(&format!("ctl-histha-b-{}", e.sfx), &args)
        .await
        .unwrap();
    let class = e.class("pub", json!({})).await;
    let a = e.address("a", "192.0.2.144", &class, json!({})).await;
    e.claim("web", json!({"className": class, "addressName": a}))
        .await;
    let t0 = now();
    let bound = e
        .wait_address(&a, "Bound", |x| aphase(x) == Some(AddressPhase::Bound))
        .await
        .unwrap();
    let opened = history::holdings(&bound).0.to_vec();
    assert_eq!(opened.len(), 1, "{opened:#?}");
    first.kill();
    wait_lease_holder(&e.client, &lease, &second.user).await;
    e.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let released = e
        .wait_address(&a, "Released by the new leader", |x| {
            aphase(x) == Some(AddressPhase::Released)
        })
        .await
        .unwrap();
    let t1 = now();
    let (h, dropped) = history::holdings(&released);
    assert_eq!((h.len(), dropped), (1, 0), "{h:#?}");
    assert_eq!(
        h[0].from, opened[0].from,
        "the holding the first leader opened"
    );
    assert_eq!(h[0].until, released.status.as_ref().unwrap().released_at);
    within("released at", h[0].until.as_ref().unwrap(), t0, t1);
    assert_eq!(h[0].ended.as_deref(), Some(ended::RELEASED));
    assert!(history::problems(&released).is_empty());
    e.ctl = second;
    e.check().await;
}
