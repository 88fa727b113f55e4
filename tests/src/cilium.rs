//! The real cilium-operator (v1.19, LB-IPAM on: it writes `status.loadBalancer.ingress` and
//! the `cilium.io/IPAMRequestSatisfied` condition) against the test's control plane: built
//! from its Go module by `deploy/local/build-binaries.sh cilium`, on free loopback ports,
//! stopped once the last test holding it lets go — it would answer every other LoadBalancer
//! Service of the cluster too, and no other test binary expects it.

#![allow(clippy::unwrap_used)] // test support: a failed step fails loudly

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::sync::Mutex;

use crate::{Cluster, TempDir, free_port, http_get};

/// The one operator of this test binary, while a test holds it.
static OPERATOR: Mutex<Weak<Operator>> = Mutex::const_new(Weak::new());

/// A running cilium-operator.
pub struct Operator {
    child: std::sync::Mutex<Child>,
    pub log: PathBuf,
    _dir: TempDir,
}

/// The cilium-operator, started if no test of this binary holds one; it stops when the last
/// holder drops it.
pub async fn operator() -> Result<Arc<Operator>> {
    let mut slot = OPERATOR.lock().await;
    if let Some(op) = slot.upgrade() {
        return Ok(op);
    }
    let op = Arc::new(Operator::start().await?);
    *slot = Arc::downgrade(&op);
    Ok(op)
}

impl Operator {
    async fn start() -> Result<Operator> {
        let cluster = Cluster::get();
        let bin = PathBuf::from(cluster.env_var("CILIUM_BIN")?).join("cilium-operator");
        if !bin.exists() {
            bail!(
                "{} is not built (deploy/local/build-binaries.sh cilium)",
                bin.display()
            );
        }
        let dir = TempDir::new("cilium");
        let log = dir.join("cilium-operator.log");
        let api = format!("127.0.0.1:{}", free_port());
        let out = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .args([
                format!("--k8s-kubeconfig-path={}", cluster.kubeconfig.display()),
                "--cluster-name=local".into(),
                "--identity-allocation-mode=crd".into(),
                "--ipam=kubernetes".into(),
                "--enable-ipv6=false".into(),
                "--enable-gops=false".into(),
                format!("--operator-api-serve-addr={api}"),
                format!("--operator-prometheus-serve-addr=127.0.0.1:{}", free_port()),
            ])
            .stderr(out.try_clone()?)
            .stdout(out)
            .spawn()
            .context("starting cilium-operator")?;
        let op = Operator {
            child: std::sync::Mutex::new(child),
            log,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let url = format!("http://{api}/healthz");
        loop {
            if let Some(status) = op.child.lock().unwrap().try_wait()? {
                bail!("cilium-operator exited: {status}; {}", op.tail());
            }
            let healthy = matches!(http_get(&url).await, Ok((200, _)));
            // Ready for the tests once its pool CRD is served (it creates it as leader).
            if healthy
                && cluster
                    .kubectl_ok(&[
                        "wait",
                        "--for=condition=Established",
                        "--timeout=5s",
                        "crd/ciliumloadbalancerippools.cilium.io",
                    ])
                    .is_ok()
            {
                return Ok(op);
            }
            if std::time::Instant::now() > deadline {
                bail!("cilium-operator not ready after 120 s; {}", op.tail());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut tail: Vec<&str> = text.lines().rev().take(20).collect();
        tail.reverse();
        format!("its log ends:\n{}", tail.join("\n"))
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|l| l.contains(needle))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Ok(mut child) = self.child.lock() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

/// Deletes the CiliumLoadBalancerIPPools over addresses starting with one of `prefixes`
/// (their finalizers first): a previous run's pool, kept by the driver's finalizer after its
/// class went, would take the range from a new class's pool (LB-IPAM marks the later one
/// conflicting, and the earlier one selects none of the new Services).
pub fn purge_pools(prefixes: &[&str]) -> Result<()> {
    let cluster = Cluster::get();
    let Ok(out) = cluster.kubectl_ok(&["get", "ciliumloadbalancerippools", "-o", "json"]) else {
        return Ok(()); // no CRD yet: nothing to purge
    };
    let list: serde_json::Value = serde_json::from_str(&out)?;
    for p in list["items"].as_array().into_iter().flatten() {
        let over = p["spec"]["blocks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["cidr"].as_str().or(b["start"].as_str()))
            .any(|b| prefixes.iter().any(|x| b.starts_with(x)));
        let Some(name) = p["metadata"]["name"].as_str().filter(|_| over) else {
            continue;
        };
        cluster.kubectl_ok(&[
            "patch",
            "ciliumloadbalancerippool",
            name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ])?;
        let _ = cluster.kubectl_ok(&[
            "delete",
            "ciliumloadbalancerippool",
            name,
            "--ignore-not-found",
        ]);
    }
    Ok(())
}
