//! The binaries' command lines as Kubernetes components have taught operators to expect
//! them: `--leader-elect-*` names (today's kept as aliases), a bare `--leader-elect`,
//! `--log-level`, one environment prefix for everything (names platforms inject for other
//! purposes, `POD_NAME`, `LEASE_NAME`, are not read), `KUBECONFIG` as a list of files as
//! kubectl reads it, `--version` with the revision, `completion`. Run against the real
//! control plane where the behaviour reaches it (the Lease).

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use address_controller_tests::invariants::{Scope, assert_invariants};
use address_controller_tests::{
    ControllerProcess, TestNamespace, binary, free_port, random_suffix, setup, wait_for,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::Value;

fn run(bin: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(binary(bin)).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The cluster's admin kubeconfig cut in two files — clusters, contexts and the current
/// context in one, the credentials in the other — so only their merge reaches the cluster.
fn split_kubeconfig(admin: &std::path::Path, dir: &std::path::Path) -> (String, String) {
    let out = Command::new("kubectl")
        .args(["config", "view", "--raw", "--flatten", "--kubeconfig"])
        .arg(admin)
        .args(["-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let full: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut first = full.clone();
    first.as_object_mut().unwrap().remove("users");
    let mut second = serde_json::json!({"apiVersion": "v1", "kind": "Config"});
    second["users"] = full["users"].clone();
    let (a, b) = (
        dir.join("clusters.kubeconfig"),
        dir.join("users.kubeconfig"),
    );
    std::fs::write(&a, serde_json::to_vec(&first).unwrap()).unwrap();
    std::fs::write(&b, serde_json::to_vec(&second).unwrap()).unwrap();
    (a.display().to_string(), b.display().to_string())
}

#[tokio::test]
async fn conventional_flags_the_project_env_prefix_and_a_kubeconfig_list_reach_the_cluster() {
    let (cluster, client) = setup().await;
    let ns = TestNamespace::create(&client, "cli").await.unwrap();
    let sfx = random_suffix();
    let dir = address_controller_tests::env::tempdir();
    let (a, b) = split_kubeconfig(&cluster.kubeconfig, &dir);
    let missing = dir.join("absent.kubeconfig").display().to_string();
    let identity = format!("cli-{sfx}");
    let lease = format!("cli-lease-{sfx}");
    let probe = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    // Exactly this environment: the list (a missing file first, as kubectl skips it), the
    // prefixed settings, and the generic names a platform may inject for its own use.
    let env: Vec<(String, String)> = [
        ("KUBECONFIG", format!("{missing}:{a}:{b}")),
        ("ADDRESS_CONTROLLER_POD_NAMESPACE", ns.name.clone()),
        ("ADDRESS_CONTROLLER_POD_NAME", identity.clone()),
        (
            "ADDRESS_CONTROLLER_LEADER_ELECT_RESOURCE_NAME",
            lease.clone(),
        ),
        ("ADDRESS_CONTROLLER_LOG_LEVEL", "debug".into()),
        ("POD_NAME", "injected-by-the-platform".into()),
        ("LEASE_NAME", "injected-lease".into()),
        ("RUST_LOG", "error".into()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .into();
    let argv: Vec<String> = [
        "run",
        "--leader-elect",
        "--apiserver=false",
        "--controller",
        "--leader-elect-lease-duration=15s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-retry-period=1s",
        "--probe-address",
        &probe,
        "--metrics-address",
        &metrics,
    ]
    .map(str::to_string)
    .into();
    let proc = ControllerProcess::launch_program(
        &binary("address-controller"),
        &identity,
        &argv,
        Some(env),
        &argv,
        &probe,
    )
    .await
    .unwrap();

    // The bare --leader-elect elected; the Lease is the prefixed variable's, in the
    // prefixed namespace, held under the prefixed identity — never the injected names.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let holder = wait_for("the Lease is held", Duration::from_secs(60), || {
        let leases = leases.clone();
        let lease = lease.clone();
        async move {
            Ok(leases
                .get_opt(&lease)
                .await?
                .and_then(|l| l.spec?.holder_identity))
        }
    })
    .await
    .unwrap();
    assert_eq!(holder, identity);
    assert!(leases.get_opt("injected-lease").await.unwrap().is_none());
    // --log-level (its variable) wins over RUST_LOG=error: debug lines are written.
    let log = wait_for("debug lines in the log", Duration::from_secs(30), || {
        let log = proc.log.clone();
        async move {
            let text = std::fs::read_to_string(&log)?;
            Ok(text.contains("DEBUG").then_some(text))
        }
    })
    .await
    .unwrap();
    assert!(!log.contains("injected-by-the-platform"));
    drop(proc);
    assert_invariants(&client, &Scope::of(&[ns.name.as_str()], &[]), &[]).await;
}

#[test]
fn booleans_durations_and_log_levels_refuse_what_they_cannot_mean() {
    for (args, want) in [
        (
            &["run", "--leader-elect=maybe"][..],
            "invalid value 'maybe' for '--leader-elect",
        ),
        // Durations in the API's (Go's) grammar, as releaseDelay: "15 sec" is not one.
        (
            &["run", "--leader-elect-lease-duration=15 sec"][..],
            "is not a duration such as 30s, 15m, 24h or 1h30m",
        ),
        (
            &["run", "--log-level=web=loud"][..],
            "is not a log level or filter",
        ),
    ] {
        let (ok, _, err) = run("address-controller", args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
    }
    // Today's names stay accepted (aliases), in --help under the new ones only.
    let (ok, help, _) = run("address-controller", &["run", "--help"]);
    assert!(ok);
    for flag in [
        "--leader-elect[=<LEADER_ELECT>]",
        "--leader-elect-resource-name",
        "--leader-elect-resource-namespace",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--log-level",
        "ADDRESS_CONTROLLER_POD_NAME",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    assert!(!help.contains("--lease-duration"), "{help}");
    // Every variable a binary reads carries the project's prefix (KUBECONFIG, read as
    // kubectl reads it, is not a flag's).
    for bin in ["address-controller", "range-driver", "metallb-driver"] {
        let args: &[&str] = if bin == "address-controller" {
            &["run", "--help"]
        } else {
            &["--help"]
        };
        let (ok, help, _) = run(bin, args);
        assert!(ok, "{bin}");
        for var in help.split("[env: ").skip(1) {
            let name = var.split(['=', ']']).next().unwrap_or_default();
            assert!(
                name.starts_with("ADDRESS_CONTROLLER_"),
                "{bin} reads {name}"
            );
        }
        assert!(help.matches("[env: ").count() >= 10, "{bin}: {help}");
    }
}

#[test]
fn version_completion_and_the_hidden_developer_command() {
    for bin in ["address-controller", "range-driver", "metallb-driver"] {
        let (ok, out, err) = run(bin, &["--version"]);
        assert!(ok, "{err}");
        let want = format!(
            "{bin} {} (revision {})\n",
            env!("CARGO_PKG_VERSION"),
            address_controller_runtime::metrics::REVISION
        );
        assert_eq!(out, want);
    }
    let (ok, script, _) = run("address-controller", &["completion", "bash"]);
    assert!(ok && script.contains("--leader-elect-lease-duration"));
    let (ok, help, _) = run("address-controller", &["--help"]);
    assert!(ok && help.contains("completion") && !help.contains("manifests"));
    let (ok, out, _) = run("address-controller", &["manifests", "--help"]);
    assert!(
        ok && out.contains("--crds-dir"),
        "the developer command still works"
    );
}
