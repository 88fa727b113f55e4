//! `helm uninstall` leaves claims and addresses with finalizers only the controller removes:
//! deleting a tenant namespace, or the CRDs, would then wait forever. `address-controller
//! teardown` is the way out, on a control plane of its own (it deletes the CRDs).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use address_controller_api::names::is_project_finalizer;
use address_controller_api::{ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::{
    Cluster, ControllerProcess, PrivateCluster, binary, create_object, install_crds, wait_for,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// `teardown ARGS`: (exit code, stdout + stderr).
fn teardown(kubeconfig: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(binary("address-controller"))
        .arg("teardown")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("teardown {args:?}:\n{text}");
    (out.status.code().unwrap_or(-1), text)
}

/// After `helm uninstall` the claims' finalizers hold a tenant's namespace (the trap);
/// `teardown` refuses while the core or the chart's Deployment is there, says what it
/// would do in a dry run, backs the ledger up, lets the namespace, the addresses, the
/// APIService and a MetalLB pool the driver kept go (`--force` for claims being deleted),
/// and deletes the CRDs only with the count of what goes confirmed.
#[tokio::test]
async fn after_uninstall_teardown_lets_namespaces_and_crds_be_deleted() {
    let private = PrivateCluster::start("ac-teardown");
    let cluster = Cluster::use_dir(&private.dir).unwrap();
    let kc = cluster.kubeconfig.clone();
    let client = cluster.client().await.unwrap();
    install_crds(&client).await.unwrap();
    let mut core = ControllerProcess::start("td-core", &["--apiserver=false"])
        .await
        .unwrap();
    let claims = a_tenant_holding_two_addresses(&private.dir, &client).await;
    // 1. While the core runs, teardown refuses and changes nothing.
    let (code, out) = teardown(&kc, &["--yes"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("Lease default/address-controller"), "{out}");
    for c in claims.list(&ListParams::default()).await.unwrap().items {
        assert!(c.finalizers().iter().any(|f| is_project_finalizer(f)));
    }

    core.stop();
    a_charts_deployment_left_is_refused_too(&kc);
    the_namespace_hangs_on_the_claims_finalizer(&client).await;
    a_dry_run_does_nothing(&kc, &claims).await;
    let backup = private.dir.join("ledger.yaml");
    teardown_backs_the_ledger_up_and_leaves_claims_being_deleted(&kc, &backup);
    a_pool_the_metallb_driver_kept(&private.dir);
    with_force_the_namespace_the_addresses_and_the_pool_go(&kc, &backup, &client).await;
    the_crds_go_only_with_the_count_confirmed(&kc, &private.dir, &client).await;
}

/// A tenant holding two addresses of a static pool (and an APIService nothing serves): its
/// claims.
async fn a_tenant_holding_two_addresses(dir: &Path, client: &kube::Client) -> Api<IPAddressClaim> {
    let cluster = Cluster::get();
    cluster
        .kubectl_ok(&["create", "namespace", "tenant"])
        .unwrap();
    let objects = r#"
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClass
metadata: {name: public}
spec: {provisioner: static.example}
---
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddress
metadata: {name: a1}
spec: {address: 192.0.2.1, className: public, source: {fromClass: {}}}
---
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddress
metadata: {name: a2}
spec: {address: 192.0.2.2, className: public, source: {fromClass: {}}}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1alpha1.view.local.sdn.cozystack.io}
spec:
  group: view.local.sdn.cozystack.io
  version: v1alpha1
  service: {name: address-controller-api, namespace: default, port: 443}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 1000
  versionPriority: 15
"#;
    let file = dir.join("objects.yaml");
    std::fs::write(&file, objects).unwrap();
    cluster
        .kubectl_ok(&["apply", "-f", file.to_str().unwrap()])
        .unwrap();
    let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), "tenant");
    for name in ["web", "db"] {
        create_object(
            &claims,
            json!({"metadata": {"name": name},
                    "spec": {"className": "public"}}),
        )
        .await;
    }
    wait_for("both claims Bound", WAIT, || async {
        let items = claims.list(&ListParams::default()).await?.items;
        Ok(items
            .iter()
            .all(|c| c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Bound))
            .then_some(()))
    })
    .await
    .unwrap();

    claims
}

/// A Deployment of the chart still there (its pods would come back and put the finalizers
/// back): refused too, even with no Lease held.
fn a_charts_deployment_left_is_refused_too(kc: &Path) {
    let cluster = Cluster::get();
    cluster
        .kubectl_ok(&[
            "create",
            "deployment",
            "address-controller",
            "--image=registry.invalid/address-controller:0",
            "-n",
            "default",
        ])
        .unwrap();
    cluster
        .kubectl_ok(&[
            "label",
            "deployment",
            "address-controller",
            "-n",
            "default",
            "app.kubernetes.io/name=address-controller",
        ])
        .unwrap();
    let (code, out) = teardown(kc, &["--yes"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("the Deployment default/address-controller"),
        "{out}"
    );
    cluster
        .kubectl_ok(&[
            "delete",
            "deployment",
            "address-controller",
            "-n",
            "default",
        ])
        .unwrap();
}

/// 2. The controller gone, as after `helm uninstall`: deleting the tenant's namespace hangs
///    on the claims' finalizer (the trap).
async fn the_namespace_hangs_on_the_claims_finalizer(client: &kube::Client) {
    Api::<Namespace>::all(client.clone())
        .delete("tenant", &DeleteParams::default())
        .await
        .unwrap();
    let stuck = wait_for("the namespace stuck on finalizers", WAIT, || async {
        let ns = Api::<Namespace>::all(client.clone()).get("tenant").await?;
        Ok(ns
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "NamespaceFinalizersRemaining" && c.status == "True")
            .and_then(|c| c.message))
    })
    .await
    .unwrap();
    assert!(
        stuck.contains("local.sdn.cozystack.io/claim-protection"),
        "{stuck}"
    );
}

/// 3. A dry run says what it would do and does nothing.
async fn a_dry_run_does_nothing(kc: &Path, claims: &Api<IPAddressClaim>) {
    let (code, out) = teardown(kc, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("would remove the finalizers from 0 claim(s) and 2 address(es)")
            && out.contains("left 2 claim(s) and 0 address(es) already being deleted")
            && out.contains("would delete the APIService")
            && out.contains("dry run"),
        "{out}"
    );
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
}

/// 4. Teardown: first a backup of the ledger; the claims being deleted (their namespace
///    is) are left without --force — their reclaim is still due.
fn teardown_backs_the_ledger_up_and_leaves_claims_being_deleted(kc: &Path, backup: &Path) {
    let backup_arg = backup.to_str().unwrap();
    let (code, out) = teardown(kc, &["--yes", "--backup-file", backup_arg]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("removed the finalizers from 0 claim(s) and 2 address(es)")
            && out.contains("left 2 claim(s) and 0 address(es) already being deleted"),
        "{out}"
    );
    let ledger: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(backup).unwrap()).unwrap();
    let mut kinds: Vec<String> = ledger["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(address_controller_tests::chart::kind_name)
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "IPAddress/a1",
            "IPAddress/a2",
            "IPAddressClaim/db",
            "IPAddressClaim/web",
            "IPAddressClass/public"
        ],
        "the backup holds the ledger as it was"
    );
}

/// A MetalLB pool the MetalLB driver kept for a gone class, in a namespace being deleted:
/// with the driver uninstalled, nothing else would let go of it.
fn a_pool_the_metallb_driver_kept(dir: &Path) {
    let cluster = Cluster::get();
    let crds = address_controller_tests::metallb::crds_dir().unwrap();
    let crds = crds.to_str().unwrap();
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", crds])
        .unwrap();
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            crds,
        ])
        .unwrap();
    cluster.kubectl_ok(&["create", "namespace", "lb"]).unwrap();
    let pool = r#"{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "ipaddressclass-gone", "namespace": "lb",
          "labels": {"app.kubernetes.io/managed-by": "address-controller-metallb-driver"},
          "finalizers": ["metallb.drivers.local.sdn.cozystack.io/pool"]},
        "spec": {"addresses": ["192.0.2.64/30"], "autoAssign": false}}"#;
    let file = dir.join("pool.json");
    std::fs::write(&file, pool).unwrap();
    cluster
        .kubectl_ok(&["create", "-f", file.to_str().unwrap()])
        .unwrap();
    cluster
        .kubectl_ok(&["delete", "namespace", "lb", "--wait=false"])
        .unwrap();
}

/// With --force the namespace goes, the addresses are free of finalizers, the APIService
/// nothing serves is gone; so does the pool, and its namespace.
async fn with_force_the_namespace_the_addresses_and_the_pool_go(
    kc: &Path,
    backup: &Path,
    client: &kube::Client,
) {
    let cluster = Cluster::get();
    let backup_arg = backup.to_str().unwrap();
    let (code, out) = teardown(kc, &["--yes", "--force", "--backup-file", backup_arg]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("removed the finalizers from 2 claim(s) and 0 address(es)"),
        "{out}"
    );
    assert!(
        out.contains("removed the finalizers from 1 MetalLB IPAddressPool(s)"),
        "{out}"
    );
    wait_for("the MetalLB pool's namespace deleted", WAIT, || async {
        Ok(Api::<Namespace>::all(client.clone())
            .get_opt("lb")
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .unwrap();
    wait_for("the namespace deleted", WAIT, || async {
        Ok(Api::<Namespace>::all(client.clone())
            .get_opt("tenant")
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .unwrap();
    for a in Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        assert!(
            !a.finalizers().iter().any(|f| is_project_finalizer(f)),
            "{}",
            a.name_any()
        );
    }
    let apiservice = cluster.kubectl_ok(&[
        "get",
        "apiservice",
        "v1alpha1.view.local.sdn.cozystack.io",
        "--ignore-not-found",
    ]);
    assert_eq!(apiservice.unwrap().trim(), "");
}

/// 5. And the CRDs, with the ledger: only with the count of what goes confirmed (the two
///    addresses and the class).
async fn the_crds_go_only_with_the_count_confirmed(kc: &Path, dir: &Path, client: &kube::Client) {
    let backup = dir.join("ledger-2.yaml");
    let backup_arg = backup.to_str().unwrap();
    for wrong in [vec![], vec!["--objects", "2"]] {
        let mut args = vec!["--yes", "--delete-crds", "--backup-file", backup_arg];
        args.extend(wrong);
        let (code, out) = teardown(kc, &args);
        assert_eq!(code, 2, "{out}");
        assert!(out.contains("pass --objects 3 to confirm"), "{out}");
    }
    assert!(!backup.exists(), "refused before anything was written");
    let (code, out) = teardown(
        kc,
        &[
            "--yes",
            "--delete-crds",
            "--objects",
            "3",
            "--backup-file",
            backup_arg,
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("destroyed 3 objects with the CRDs"), "{out}");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for("the CRDs deleted", WAIT, || async {
        for crd in address_controller_api::manifests::crds() {
            if crds.get_opt(&crd.name_any()).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
    .unwrap();
}
