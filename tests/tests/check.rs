//! `address-controller check` against a control plane of its own (the shared one's CRDs
//! cannot be taken away from the other tests): it fails on missing CRDs, on CRDs of
//! another schema, on a class no live driver serves, on a stopped driver and on what the
//! caller may not do, and passes — exit 0 — once the core and a driver run.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use address_controller_tests::invariants::{Scope, assert_invariants};
use address_controller_tests::{
    Cluster, ControllerProcess, PrivateCluster, binary, repo_root, wait_for,
};
use serde_json::Value;

/// `check` with `args`: (exit code, CHECK → (ok, detail)).
fn check(kubeconfig: &Path, args: &[&str]) -> (i32, Vec<(String, bool, String)>) {
    let out = Command::new(binary("address-controller"))
        .arg("check")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("check {args:?}:\n{text}");
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let status_at = header.find("STATUS").unwrap();
    let detail_at = header.find("DETAIL").unwrap();
    let rows = lines
        .map(|l| {
            (
                l[..status_at].trim().to_string(),
                l[status_at..detail_at].trim() == "ok",
                l[detail_at..].trim().to_string(),
            )
        })
        .collect();
    (out.status.code().unwrap_or(-1), rows)
}

fn find<'a>(rows: &'a [(String, bool, String)], prefix: &str) -> Vec<&'a (String, bool, String)> {
    rows.iter().filter(|r| r.0.starts_with(prefix)).collect()
}

#[tokio::test]
async fn check_fails_on_what_is_broken_and_passes_on_a_working_installation() {
    let private = PrivateCluster::start("ac-check");
    let cluster = Cluster::use_dir(&private.dir).unwrap();
    let kc = cluster.kubeconfig.clone();
    let kubectl_ok = |args: &[&str]| cluster.kubectl_ok(args).unwrap();
    let skip = ["--skip", "apiservice"];

    // 1. Nothing installed: every CRD row fails, and so does the exit code.
    let (code, rows) = check(&kc, &skip);
    assert_eq!(code, 1);
    let crds = find(&rows, "crd/");
    assert_eq!(crds.len(), address_controller_api::manifests::crds().len());
    assert!(
        crds.iter()
            .all(|r| !r.1 && r.2.starts_with("not installed")),
        "{crds:?}"
    );

    // 2. The chart's CRDs: Established, as this binary expects.
    let crd_dir = repo_root().join("chart/address-controller/crds");
    kubectl_ok(&["apply", "--server-side", "-f", crd_dir.to_str().unwrap()]);
    kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ]);
    let (_, rows) = check(&kc, &skip);
    assert!(find(&rows, "crd/").iter().all(|r| r.1), "{rows:?}");
    // The migration guide's first step, before this project's binaries run: the only thing
    // missing is the core's own Lease — expected, and the check passes (#56); without the
    // flag the same cluster fails on that row.
    let (code, rows) = check(&kc, &["--skip", "apiservice,classes", "--before-install"]);
    assert_eq!(code, 0, "{rows:?}");
    assert!(
        find(&rows, "lease (controller)")
            .iter()
            .all(|r| r.1 && r.2.contains("as expected before")),
        "{rows:?}"
    );
    let (code, rows) = check(&kc, &["--skip", "apiservice,classes"]);
    assert_eq!(code, 1, "{rows:?}");
    // CRDs of another chart version (a schema that differs): named.
    kubectl_ok(&[
        "patch",
        "crd",
        "ipaddresses.local.sdn.cozystack.io",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/versions/0/schema/openAPIV3Schema/description","value":"an older chart's"}]"#,
    ]);
    let (code, rows) = check(&kc, &skip);
    assert_eq!(code, 1);
    let row = find(&rows, "crd/ipaddresses.")[0];
    assert!(!row.1 && row.2.contains("schema differs"), "{row:?}");
    kubectl_ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        crd_dir.to_str().unwrap(),
    ]);

    // 3. A class nobody serves, and no core running.
    let class = r#"{"apiVersion":"local.sdn.cozystack.io/v1alpha1","kind":"IPAddressClass",
        "metadata":{"name":"public"},
        "spec":{"provisioner":"range.drivers.local.sdn.cozystack.io","parameters":{"cidrs":["192.0.2.0/28"]}}}"#;
    let file = private.dir.join("class.json");
    std::fs::write(&file, class).unwrap();
    kubectl_ok(&["create", "-f", file.to_str().unwrap()]);
    let (code, rows) = check(&kc, &skip);
    assert_eq!(code, 1);
    let row = find(&rows, "class/public")[0];
    assert!(
        !row.1 && row.2.contains("no live driver serves range.drivers"),
        "{row:?}"
    );
    assert!(find(&rows, "lease (controller)").iter().all(|r| !r.1));

    // 4. The core and the range driver running: every row passes, exit 0. The driver's
    // Lease names what it is and the provisioner it serves.
    let _core = ControllerProcess::start("check-core", &["--apiserver=false"])
        .await
        .unwrap();
    let mut driver = ControllerProcess::driver("check-driver", &[])
        .await
        .unwrap();
    let lease: Value = serde_json::from_str(&kubectl_ok(&[
        "get",
        "lease",
        "-n",
        "default",
        "range-driver",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(
        lease["metadata"]["annotations"]["local.sdn.cozystack.io/component"],
        "driver"
    );
    assert_eq!(
        lease["metadata"]["annotations"]["local.sdn.cozystack.io/provisioner"],
        "range.drivers.local.sdn.cozystack.io"
    );
    let rows = wait_for("every check passes", Duration::from_secs(60), || {
        let kc = kc.clone();
        async move {
            let (code, rows) = check(&kc, &skip);
            Ok((code == 0).then_some(rows))
        }
    })
    .await
    .unwrap();
    assert!(
        find(&rows, "class/public")[0]
            .2
            .contains("served by lease default/range-driver")
    );
    assert_eq!(find(&rows, "lease/").len(), 2, "{rows:?}");

    // 5. The driver stopped (it releases its Lease): its class and its Lease fail.
    driver.stop();
    let (code, rows) = check(&kc, &skip);
    assert_eq!(code, 1);
    assert!(!find(&rows, "class/public")[0].1, "{rows:?}");
    let row = find(&rows, "lease/default/range-driver")[0];
    assert!(!row.1 && row.2.starts_with("not held"), "{row:?}");

    // 6. A caller without rights: the access rows say what it may not do.
    let admin = std::fs::read_to_string(&kc).unwrap();
    let nobody = private.dir.join("nobody.kubeconfig");
    std::fs::write(
        &nobody,
        admin.replace("  user:\n", "  user:\n    as: check-nobody\n"),
    )
    .unwrap();
    let (code, rows) = check(&nobody, &["--skip", "crds,apiservice,leases,classes"]);
    assert_eq!(code, 1);
    let access = find(&rows, "access/");
    assert_eq!(access.len(), 8);
    assert!(
        access.iter().all(|r| !r.1 && r.2.starts_with("denied")),
        "{access:?}"
    );

    let client = cluster.client().await.unwrap();
    assert_invariants(&client, &Scope::everything(), &[]).await;
}
