//! Who may do what: requests as another user (kubectl's impersonation) and
//! SubjectAccessReviews, for the tests of RBAC and admission.

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use serde_json::json;

use crate::{Cluster, output_with_stdin};

/// `kubectl ARGS` as `user` in `groups`, with `stdin`: Ok(stdout) or Err(stderr).
pub fn kubectl_as(
    user: &str,
    groups: &[&str],
    args: &[&str],
    stdin: &str,
) -> Result<String, String> {
    let mut cmd = Cluster::get().kubectl();
    cmd.args(args).args(["--as", user]);
    for g in groups {
        cmd.args(["--as-group", g]);
    }
    let out = output_with_stdin(&mut cmd, stdin.as_bytes()).unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Whether `user` (in `groups`) may `verb` `resource` (`plural[.group][/subresource]`) in
/// namespace `ns` (empty: the cluster scope), by a SubjectAccessReview with these explicit
/// attributes (no discovery involved, so the answer does not depend on an aggregated API).
pub fn allowed(user: &str, groups: &[String], verb: &str, resource: &str, ns: &str) -> bool {
    let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
    let (resource, group) = resource.split_once('.').unwrap_or((resource, ""));
    let sar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": {"verb": verb,
            "group": group, "resource": resource, "subresource": sub, "namespace": ns}}});
    kubectl_as(
        "admin",
        &["system:masters"],
        &["create", "-f", "-", "-o", "jsonpath={.status.allowed}"],
        &sar.to_string(),
    )
    .unwrap()
        == "true"
}
