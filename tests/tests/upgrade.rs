//! An upgrade from the previous chart with live claims, as an operator with only the
//! packaged chart does it: `helm show crds | kubectl apply --server-side`, `helm upgrade
//! --reset-then-reuse-values`, the new pods. Nothing rebinds, nothing is lost, the ledger is not
//! written. On a control plane of its own (the previous CRDs replace the current ones).
//!
//! "The previous chart" is the chart at [`PREVIOUS`] (no release has been tagged yet; the
//! commit is the last one CI ran green before the chart changes of this issue). The
//! binary is the current one before and after — before, with admin rights, as a stand-in
//! for the previous binary (building it would double the suite's build); after, as the
//! new chart's ServiceAccount with the new Deployment's arguments.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use address_controller_api::{ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::chart::{Release, Runner, chart_dir, run_helm, values_file};
use address_controller_tests::env::tempdir;
use address_controller_tests::{
    Cluster, ControllerProcess, PrivateCluster, binary, create_object, free_port, repo_root,
    sum_samples, wait_for,
};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

/// The commit whose chart is the previous version.
const PREVIOUS: &str = "c73eeba67d6b1aed9a95a6c1e1077cd643a9f734";

const WAIT: Duration = Duration::from_secs(60);

/// `kubectl apply --server-side -f -` of `yaml`.
fn apply(cluster: &Cluster, yaml: &str) {
    let mut child = cluster
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), yaml.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every claim's and address's resourceVersion and binding.
async fn ledger(client: &kube::Client) -> BTreeMap<String, (String, String)> {
    let mut m = BTreeMap::new();
    for c in Api::<IPAddressClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let bound: Vec<String> = c
            .status
            .iter()
            .flat_map(|s| &s.addresses)
            .map(|a| a.address.clone())
            .collect();
        m.insert(
            format!("claim {}/{}", c.namespace().unwrap(), c.name_any()),
            (c.resource_version().unwrap(), bound.join(",")),
        );
    }
    for a in Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let to = a
            .spec
            .claim_ref
            .as_ref()
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .unwrap_or_default();
        m.insert(
            format!("address {}", a.name_any()),
            (a.resource_version().unwrap(), to),
        );
    }
    m
}

#[tokio::test]
async fn an_upgrade_from_the_previous_chart_keeps_every_binding_and_writes_nothing() {
    let (_old, old_chart) = the_previous_chart();
    let private = PrivateCluster::start("ac-upgrade");
    let cluster = Cluster::use_dir(&private.dir).unwrap();
    let client = cluster.client().await.unwrap();
    let ns = "address-controller-system";
    let port = free_port();
    let values = json!({"apiService": {"service": {"externalName": "localhost", "port": port}}});
    let (_vdir, vfile) = values_file(&values);

    // 1. The previous chart with its CRDs (helm installs crds/ on install), its binary
    // stand-in running as the chart's ServiceAccount with the Deployment's arguments.
    let out = run_helm(&[
        "install",
        "address-controller",
        old_chart.to_str().unwrap(),
        "-n",
        ns,
        "--create-namespace",
        "-f",
        vfile.to_str().unwrap(),
    ])
    .unwrap();
    assert!(out.contains("STATUS: deployed"), "{out}");
    let release = Release {
        ns: ns.to_string(),
        name: "address-controller".to_string(),
        notes: out,
    };
    // The previous release's controller: a stand-in with admin rights (this binary needs
    // the new chart's RBAC — it lists Leases — which a real `helm upgrade` applies with
    // the new pods; the previous binary is not built here). It also watches
    // IPAddressQuotas, a kind the previous chart does not have: its CRD — new, so nothing
    // of the previous chart's is replaced — goes in first (without it this binary stays not
    // ready, as the new pods would if an upgrade skipped `helm show crds | kubectl apply`).
    let quota_crd = std::fs::read_to_string(
        chart_dir().join("crds/ipaddressquotas.local.sdn.cozystack.io.yaml"),
    )
    .unwrap();
    apply(cluster, &quota_crd);
    // Likewise the history's records: this binary creates and prunes them.
    let record_crd = std::fs::read_to_string(
        chart_dir().join("crds/ipaddressrecords.local.sdn.cozystack.io.yaml"),
    )
    .unwrap();
    apply(cluster, &record_crd);
    let mut ctl = ControllerProcess::start("upgrade-old", &["--apiserver=false"])
        .await
        .unwrap();

    let (addresses, before) = live_claims_bound(&client).await;
    // The previous CRDs are not this binary's: check names them (the control for step 3).
    let (ok, text) = check(cluster, "previous CRDs");
    // (This version's class has a new field, namespaceSelector: its schema differs.)
    assert!(
        !ok && text.lines().any(
            |l| l.starts_with("crd/ipaddressclasses.local.sdn.cozystack.io")
                && l.contains("FAIL")
                && l.contains("schema differs")
        ),
        "{text}"
    );

    // 2. The upgrade, from the packaged chart only: its CRDs, then the release.
    ctl.stop();
    let crds = run_helm(&["show", "crds", chart_dir().to_str().unwrap()]).unwrap();
    apply(cluster, &crds);
    // `--reuse-values` keeps only the previous release's values, without the keys this
    // chart added: refused at once, saying what to do (not a nil pointer deep inside).
    let err = run_helm(&[
        "upgrade",
        "address-controller",
        chart_dir().to_str().unwrap(),
        "-n",
        ns,
        "--reuse-values",
    ])
    .unwrap_err();
    assert!(err.contains("--reset-then-reuse-values"), "{err}");
    let out = run_helm(&[
        "upgrade",
        "address-controller",
        chart_dir().to_str().unwrap(),
        "-n",
        ns,
        "--reset-then-reuse-values",
    ])
    .unwrap();
    assert!(out.contains("STATUS: deployed"), "{out}");
    let (ok, text) = check(cluster, "upgraded CRDs");
    assert!(ok, "{text}");

    // 3. The new pods (the Deployment's new arguments): every binding kept, not one
    // write to a claim or an address — up to the controller's own barrier: a claim
    // created after its start is bound, so it has looked at everything before.
    let runner = Runner::new(&release, false);
    let new_ctl = runner
        .controller("upgrade-new", Some(port), &[])
        .await
        .unwrap();
    let late: Api<IPAddressClaim> = Api::namespaced(client.clone(), "tenant-a");
    create_object(&addresses, json!({"metadata": {"name": "a5"},
                "spec": {"address": "192.0.2.5", "className": "public", "source": {"fromClass": {}}}})).await;
    create_object(
        &late,
        json!({"metadata": {"name": "late"}, "spec": {"className": "public"}}),
    )
    .await;
    wait_for("the late claim Bound", WAIT, || async {
        let c = late.get("late").await?;
        Ok((c.status.and_then(|s| s.phase) == Some(ClaimPhase::Bound)).then_some(()))
    })
    .await
    .unwrap();
    // ... and its queues are empty, nothing running: every pass it had to make is made.
    wait_for("the new controller's queues drained", WAIT, || async {
        let m = new_ctl.metrics().await?;
        let busy = sum_samples(&m, "address_controller_workqueue_depth{", |l| {
            !l.contains("state=\"delayed\"")
        });
        let passes = sum_samples(&m, "address_controller_reconcile_total{", |_| true);
        Ok((busy == 0.0 && passes >= 10.0).then_some(()))
    })
    .await
    .unwrap();
    let after: BTreeMap<_, _> = ledger(&client)
        .await
        .into_iter()
        .filter(|(k, _)| k != "claim tenant-a/late" && k != "address a5")
        .collect();
    assert_eq!(
        after, before,
        "the upgrade wrote to the ledger or moved a binding"
    );
    println!(
        "upgrade from {PREVIOUS}: {} objects unchanged (resourceVersion and binding)",
        before.len()
    );
    drop(release);
}

/// The previous chart, from history (`git archive` of [`PREVIOUS`]): the directory that
/// holds it, and the chart's path in it.
fn the_previous_chart() -> (address_controller_tests::TempDir, std::path::PathBuf) {
    let old = tempdir();
    let archive = Command::new("git")
        .args(["archive", PREVIOUS, "chart/address-controller"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        archive.status.success(),
        "git archive {PREVIOUS} (a clone with history is needed): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut tar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(&*old)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut tar.stdin.take().unwrap(), &archive.stdout).unwrap();
    assert!(tar.wait().unwrap().success());

    let chart = old.join("chart/address-controller");
    (old, chart)
}

/// Live claims: a class, four addresses, two tenants with two claims each, all Bound; the
/// addresses' API and the ledger as it is then.
async fn live_claims_bound(
    client: &kube::Client,
) -> (Api<IPAddress>, BTreeMap<String, (String, String)>) {
    let cluster = Cluster::get();
    let objects = r#"
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClass
metadata: {name: public}
spec: {provisioner: static.example}
"#;
    apply(cluster, objects);
    let addresses: Api<IPAddress> = Api::all(client.clone());
    for i in 1..=4 {
        create_object(&addresses, json!({"metadata": {"name": format!("a{i}")},
                    "spec": {"address": format!("192.0.2.{i}"), "className": "public", "source": {"fromClass": {}}}})).await;
    }
    for (tenant, claims) in [("tenant-a", ["web", "db"]), ("tenant-b", ["shop", "mail"])] {
        cluster
            .kubectl_ok(&["create", "namespace", tenant])
            .unwrap();
        let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), tenant);
        for c in claims {
            create_object(
                &api,
                json!({"metadata": {"name": c},
                    "spec": {"className": "public"}}),
            )
            .await;
        }
    }
    let all_bound = || async {
        let items = Api::<IPAddressClaim>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        Ok((items.len() == 4
            && items
                .iter()
                .all(|c| c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Bound)))
        .then_some(()))
    };
    wait_for("four claims Bound", WAIT, all_bound)
        .await
        .unwrap();
    let before = ledger(client).await;

    (addresses, before)
}

/// `address-controller check` of the CRDs (and the rest but the APIService, the Leases, the
/// classes and access): whether it passed, and what it printed.
fn check(cluster: &Cluster, label: &str) -> (bool, String) {
    let out = Command::new(binary("address-controller"))
        .args([
            "check",
            "--skip",
            "apiservice,leases,classes,access",
            "--kubeconfig",
        ])
        .arg(&cluster.kubeconfig)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("check ({label}):\n{text}");
    (out.status.success(), text)
}
