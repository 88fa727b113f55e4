//! Test harness for the integration tests: a real local control plane (started by
//! `deploy/local/cluster.sh`), the CRDs applied and Established, a throwaway namespace per
//! test, and waiting with a timeout and a useful failure message.
//!
//! The cluster comes from `ADDRESS_CONTROLLER_TEST_CLUSTER` (a cluster directory, as
//! `make test` sets it). Without it the harness starts — or reuses — the development
//! cluster (`make cluster-up`), so `cargo test -p address-controller-tests` works alone.
//!
//! Helpers by topic, each re-exported here: [`cluster`] (the control plane, namespaces,
//! cleanup), [`process`] (the binaries under test), [`scrape`] (metrics, plain GETs),
//! [`audit`] (requests counted from the audit log), [`procfs`] (a process's CPU and
//! memory), [`env`](mod@env) (a test's environment: classes, claims, Services, waits); and one module
//! per tier or suite ([`chart`], [`metallb`], [`cilium`], [`node`], [`wire`], [`chaos`],
//! [`migration`], [`flood`], [`bench`](mod@bench), …). This file keeps what every one of them uses.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Field manager of everything the harness writes.
pub const FIELD_MANAGER: &str = "address-controller-tests";

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A directory under the system's temporary directory, removed (with everything in it)
/// when dropped: tests leave nothing behind in /tmp — unless the test failed, when it stays
/// for its logs.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("{prefix}-{}", random_suffix()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
        TempDir(d)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed test keeps its logs (a driver's, MetalLB's) for whoever reads why.
            eprintln!("kept {} (the test failed)", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates the object `value` (JSON, as a manifest) through `api`; panics on failure.
pub async fn create_object<K>(api: &Api<K>, value: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(value).expect("a valid object");
    api.create(&kube::api::PostParams::default(), &obj)
        .await
        .expect("create")
}

/// Deletes a cluster-scoped object and ignores "not found".
pub async fn delete_ignore_missing<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The message of an API error, for asserting on admission failures.
pub fn api_error_message(err: &kube::Error) -> Option<(u16, String)> {
    match err {
        kube::Error::Api(s) => Some((s.code, s.message.clone())),
        _ => None,
    }
}

pub use address_controller_driver_conformance::suite as conformance;
pub use address_controller_driver_conformance::{
    condense_backtraces, https_get, invariants, process_state, random_suffix, wait_for,
    wait_for_every,
};

pub mod access;
pub mod audit;
pub mod bench;
pub mod chaos;
pub mod chart;
pub mod cilium;
pub mod cluster;
pub mod env;
pub mod flood;
pub mod image;
pub mod lb;
pub mod metallb;
pub mod migration;
pub mod node;
pub mod packaging;
pub mod process;
pub mod procfs;
pub mod scrape;
pub mod wire;
pub mod wire_churn;

pub use audit::*;
pub use cluster::*;
pub use process::*;
pub use procfs::*;
pub use scrape::*;
