//! The real MetalLB controller (the IPAM half of MetalLB, which writes
//! `status.loadBalancer.ingress`) against the test's control plane: built from Go modules by
//! `deploy/local/build-binaries.sh` (v0.16.1), its CRDs installed, its namespace and the Pod
//! object it insists on, and the process itself, on free ports, stopped on drop. Never two
//! at once on one cluster (MetalLB has no leader election): tests that run one hold
//! [`METALLB`].

#![allow(clippy::unwrap_used)] // test support: a failed step fails loudly

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

use crate::env::Env;
use serde_json::json;
use tokio::sync::{Mutex, MutexGuard};

use crate::{Cluster, FIELD_MANAGER, TempDir, free_port, http_get};

/// One MetalLB controller per cluster at a time.
pub static METALLB: Mutex<()> = Mutex::const_new(());

/// MetalLB's namespace in the tests.
pub const NAMESPACE: &str = "metallb-system";

fn bin_dir() -> Result<PathBuf> {
    Ok(PathBuf::from(Cluster::get().env_var("METALLB_BIN")?))
}

/// MetalLB's CRDs, as built (one file each).
pub fn crds_dir() -> Result<PathBuf> {
    Ok(bin_dir()?.join("crds"))
}

/// A running MetalLB controller.
pub struct MetalLb {
    child: Child,
    pub health: String,
    pub log: PathBuf,
    _dir: TempDir,
    _one: MutexGuard<'static, ()>,
}

impl MetalLb {
    /// Installs MetalLB's CRDs, namespace and Pod object, starts the controller (serving
    /// Services of `lb_class`, or those without a class) and waits until it is ready.
    pub async fn start(lb_class: Option<&str>) -> Result<MetalLb> {
        let one = METALLB.lock().await;
        let cluster = Cluster::get();
        let crds = crds_dir()?;
        cluster.apply_path(&crds)?;
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            crds.to_str().unwrap_or_default(),
        ])?;
        // Pools that a previous test's MetalLB driver kept for a gone class while an address
        // of it was left, the driver stopped since: nobody else lets go of them, and one
        // overlapping a new pool would make MetalLB refuse the configuration.
        let stale = cluster.kubectl_ok(&[
            "get",
            "ipaddresspools.metallb.io",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/managed-by=address-controller-metallb-driver",
            "-o",
            "jsonpath={range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name}{\"\\n\"}{end}",
        ])?;
        for pool in stale.lines().filter(|l| !l.is_empty()) {
            cluster.kubectl_ok(&[
                "patch",
                "ipaddresspools.metallb.io",
                "-n",
                NAMESPACE,
                pool,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ])?;
        }
        let objects = [
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
            // The controller reads its own Pod (the owner of its ConfigurationState). Without
            // a kubelet it stays Pending; that is all it needs.
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "controller", "namespace": NAMESPACE,
                "labels": {"app": "metallb", "component": "controller"}},
                "spec": {"containers": [{"name": "controller", "image": "quay.io/metallb/controller:v0.16.1"}]}}),
        ];
        for o in objects {
            let mut child = cluster
                .kubectl()
                .args([
                    "apply",
                    "--server-side",
                    "--field-manager",
                    FIELD_MANAGER,
                    "-f",
                    "-",
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()?;
            {
                use std::io::Write;
                let mut stdin = child.stdin.take().context("stdin")?;
                stdin.write_all(o.to_string().as_bytes())?;
            }
            if !child.wait()?.success() {
                bail!("applying {o}");
            }
        }
        let dir = TempDir::new("metallb");
        let log = dir.join("metallb-controller.log");
        let health = format!("127.0.0.1:{}", free_port());
        let health_port = health.rsplit(':').next().unwrap_or_default().to_string();
        let mut args = vec![
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--namespace={NAMESPACE}"),
            "--pod-name=controller".to_string(),
            "--webhook-mode=disabled".to_string(),
            format!("--port={}", free_port()),
            format!("--health-probe-port={health_port}"),
            "--log-level=info".to_string(),
        ];
        if let Some(c) = lb_class {
            args.push(format!("--lb-class={c}"));
        }
        let out = std::fs::File::create(&log)?;
        let child = Command::new(bin_dir()?.join("metallb-controller"))
            .args(&args)
            .stderr(out.try_clone()?)
            .stdout(out)
            .spawn()
            .context("starting metallb-controller")?;
        let mut m = MetalLb {
            child,
            health: health.clone(),
            log,
            _dir: dir,
            _one: one,
        };
        // Readiness waits for its informers; on two busy cores that has taken more than 30 s.
        // A controller that exited is a failure at once, with its log.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let url = format!("http://{health}/readyz");
        let failure = loop {
            if let Some(status) = m.child.try_wait()? {
                break format!("metallb-controller exited: {status}");
            }
            match http_get(&url).await {
                Ok((200, _)) => return Ok(m),
                Ok((code, _)) if std::time::Instant::now() > deadline => {
                    break format!("not ready after 120 s: {url} answers {code}");
                }
                Err(e) if std::time::Instant::now() > deadline => {
                    break format!("not ready after 120 s: {url}: {e:#}");
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let text = std::fs::read_to_string(&m.log).unwrap_or_default();
        let mut tail: Vec<&str> = text.lines().rev().take(20).collect();
        tail.reverse();
        bail!("{failure}; the controller's log ends:\n{}", tail.join("\n"))
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|l| l.contains(needle))
    }
}

impl Drop for MetalLb {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

// Helpers of the tests that run MetalLB.

pub use crate::lb::{ingress, service, services, wait_ingress};

pub fn pools(e: &Env) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("metallb.io", "v1beta1", "IPAddressPool");
    Api::namespaced_with(e.client.clone(), NAMESPACE, &ApiResource::from_gvk(&gvk))
}

/// The events (reason, message) about Service `ns/name` — MetalLB's among them.
pub async fn core_events(e: &Env, ns: &str, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(e.client.clone(), ns);
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|x| x.involved_object.name.as_deref() == Some(name))
        .map(|x| (x.reason.unwrap_or_default(), x.message.unwrap_or_default()))
        .collect()
}
