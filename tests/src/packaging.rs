//! The platform's wrapper packages (`packaging/cozystack/`) in tests: their directories, their
//! `helm unittest` suites, and the platform's own files beside this repository
//! (`../shared/third_party/cozystack`, upstream and unmodified) — its tenant roles, applied as
//! they are, and a tenant namespace's RoleBindings, rendered from its own template.

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::chart::{parse_docs, run_helm};
use crate::env::tempdir;
use crate::{Cluster, TempDir, repo_root};

/// The platform's packages this repository ships, by directory name.
pub const PACKAGES: [&str; 2] = ["address-controller", "address-controller-metallb"];

/// `packaging/cozystack/NAME`.
pub fn package_dir(name: &str) -> PathBuf {
    repo_root().join("packaging/cozystack").join(name)
}

/// The platform's files (`COZYSTACK_SRC`, default `../shared/third_party/cozystack` beside
/// this repository), or why they are missing.
pub fn platform_dir() -> Result<PathBuf, String> {
    let dir = std::env::var_os("COZYSTACK_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/third_party/cozystack"));
    let roles = dir.join(ROLES);
    if roles.is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "the platform's files are not beside this repository ({} is missing; set COZYSTACK_SRC)",
            roles.display()
        ))
    }
}

/// The platform's tenant roles, plain YAML (`cozy:tenant`, `cozy:tenant:{view,use,admin,super-admin}`).
pub const ROLES: &str = "packages/system/cozystack-basics/templates/clusterroles.yaml";

/// `helm unittest DIR` with the helm-unittest plugin build-binaries.sh built: Ok(output) or
/// Err(output).
pub fn helm_unittest(dir: &Path) -> Result<String, String> {
    let cluster = Cluster::get();
    let out = Command::new(cluster.env_var("HELM").unwrap())
        .env("HELM_PLUGINS", cluster.env_var("HELM_PLUGINS_DIR").unwrap())
        .args(["unittest", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// A copy of the package `name` in a temporary directory (to mutate in a test).
pub fn package_copy(name: &str) -> (TempDir, PathBuf) {
    let dir = tempdir();
    let to = dir.join(name);
    let status = Command::new("cp")
        .args([
            "-R",
            package_dir(name).to_str().unwrap(),
            to.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    (dir, to)
}

/// The objects of the platform's tenant `tenant-NAME` (a child of tenant-root) that bind its
/// roles, rendered by helm from the platform's own template (`packages/apps/tenant/templates/
/// tenant.yaml` with cozy-lib's `_rbac.tpl`) — never hand-written. Two helpers those files
/// call live in files not beside this repository; the render defines them as the platform
/// does for a child of tenant-root: `tenant.name` is the release's name (`tenant-NAME`), and
/// `cozy-lib.checkInput` accepts its (well-formed) input.
pub fn tenant_bindings(platform: &Path, name: &str) -> Vec<Value> {
    let dir = tempdir();
    let chart = dir.join("tenant");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: tenant\nversion: 0.0.0\n",
    )
    .unwrap();
    for (from, to) in [
        ("packages/apps/tenant/templates/tenant.yaml", "tenant.yaml"),
        ("packages/library/cozy-lib/templates/_rbac.tpl", "_rbac.tpl"),
    ] {
        std::fs::copy(platform.join(from), chart.join("templates").join(to)).unwrap();
    }
    std::fs::write(
        chart.join("templates/_platform.tpl"),
        "{{- define \"tenant.name\" -}}{{ .Release.Name }}{{- end -}}\n\
         {{- define \"cozy-lib.checkInput\" -}}{{- end -}}\n",
    )
    .unwrap();
    let release = format!("tenant-{name}");
    parse_docs(
        &run_helm(&[
            "template",
            &release,
            chart.to_str().unwrap(),
            "--namespace",
            "tenant-root",
        ])
        .unwrap_or_else(|e| panic!("rendering the platform's tenant template: {e}")),
    )
}
