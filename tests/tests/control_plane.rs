//! The local control plane is the real thing: a stamped version kubectl and helm accept,
//! RBAC, service-account tokens, the aggregation layer's trust ConfigMap, and the
//! controller-manager's garbage collector and namespace controller.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::time::Duration;

use address_controller_tests::{TestNamespace, api_error_message, setup, wait_for};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn versions_are_real_for_kubectl_and_helm() {
    let (cluster, _) = setup().await;
    let out = cluster.kubectl_ok(&["version", "-o", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["serverVersion"]["gitVersion"], "v1.36.3", "{out}");
    assert_eq!(v["serverVersion"]["minor"], "36", "{out}");

    let helm = cluster.env_var("HELM").unwrap();
    let out = std::process::Command::new(&helm)
        .args(["version", "--short"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("v3.22.0"),
        "{out:?}"
    );
    // helm talks to the cluster (and sees its version through /version).
    let out = std::process::Command::new(&helm)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args(["list", "--all-namespaces", "--output", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn aggregation_layer_trust_is_published() {
    let (_, client) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    let cm = wait_for(
        "extension-apiserver-authentication",
        Duration::from_secs(30),
        || {
            let cms = cms.clone();
            async move { Ok(cms.get_opt("extension-apiserver-authentication").await?) }
        },
    )
    .await
    .unwrap();
    let data = cm.data.unwrap();
    assert!(data["requestheader-client-ca-file"].contains("BEGIN CERTIFICATE"));
    assert!(data["client-ca-file"].contains("BEGIN CERTIFICATE"));
    assert_ne!(
        data["requestheader-client-ca-file"], data["client-ca-file"],
        "front-proxy CA must be its own"
    );
    assert_eq!(
        data["requestheader-allowed-names"],
        r#"["front-proxy-client"]"#
    );
    assert_eq!(
        data["requestheader-username-headers"],
        r#"["X-Remote-User"]"#
    );
    assert_eq!(data["requestheader-group-headers"], r#"["X-Remote-Group"]"#);
    assert_eq!(
        data["requestheader-extra-headers-prefix"],
        r#"["X-Remote-Extra-"]"#
    );
}

#[tokio::test]
async fn rbac_and_service_account_tokens_work() {
    let (cluster, client) = setup().await;
    let ns = TestNamespace::create(&client, "cp-rbac").await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns.name);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "robot"}})).unwrap(),
    )
    .await
    .unwrap();
    let req: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 600}}))
            .unwrap();
    let token = sas
        .create_subresource::<TokenRequest, TokenRequest>(
            "token",
            "robot",
            &PostParams::default(),
            &req,
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap();
    assert!(!token.is_empty());

    // The token authenticates, and RBAC denies what nobody granted.
    let server = cluster.env_var("KUBE_APISERVER_URL").unwrap();
    let ca = cluster.dir.join("pki/ca.crt");
    // kubectl with nothing but the token.
    let as_robot = |args: &[&str]| {
        cluster
            .kubectl()
            .args([
                "--kubeconfig=/dev/null",
                "--server",
                &server,
                "--certificate-authority",
            ])
            .arg(&ca)
            .args(["--token", &token])
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_robot(&["auth", "can-i", "list", "configmaps", "-n", &ns.name]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no", "{out:?}");
    let out = as_robot(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("system:serviceaccount:{}:robot", ns.name)
    );

    // Impersonation through the admin (system:masters) is refused for an ungranted user.
    let denied = cluster
        .kubectl()
        .args(["get", "configmaps", "-n", &ns.name, "--as", "tenant"])
        .output()
        .unwrap();
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("forbidden"));
}

#[tokio::test]
async fn garbage_collector_and_namespace_controller_run() {
    let (_, client) = setup().await;
    let ns = TestNamespace::create(&client, "cp-gc").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let owner = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let uid = owner.metadata.uid.unwrap();
    let dependent = json!({"metadata": {"name": "dependent", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]}});
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(dependent).unwrap(),
    )
    .await
    .unwrap();
    cms.delete("owner", &Default::default()).await.unwrap();
    wait_for(
        "garbage collection of the dependent",
        Duration::from_secs(60),
        || {
            let cms = cms.clone();
            async move { Ok(cms.get_opt("dependent").await?.is_none().then_some(())) }
        },
    )
    .await
    .unwrap();

    // The namespace controller empties and removes a deleted namespace.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(&ns.name, &Default::default())
        .await
        .unwrap();
    wait_for("namespace deletion", Duration::from_secs(60), || {
        let namespaces = namespaces.clone();
        let name = ns.name.clone();
        async move { Ok(namespaces.get_opt(&name).await?.is_none().then_some(())) }
    })
    .await
    .unwrap();
    let err = cms.get("owner").await.unwrap_err();
    assert_eq!(api_error_message(&err).unwrap().0, 404);
}
