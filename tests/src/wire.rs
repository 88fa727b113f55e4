//! The wire in tests: packets from the client host (the network namespace
//! `address-controller-client`, deploy/local/node.sh) to a claimed address, through the
//! node's real kube-proxy (iptables mode) and — for the MetalLB driver's classes — the real
//! MetalLB speaker answering ARP on the node's side of the segment. The workload is the
//! node tier's `hello` image: it answers HTTP with its pod's name, so an answer says which
//! Service's pods it came from.
//!
//! Every client request is `curl` run in the client's namespace with a 2 s bound; nothing
//! outside the two namespaces the scripts made is dialled.

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::node::{Node, values};
use crate::repo_root;

/// The client host's network namespace.
pub const CLIENT_NETNS: &str = "address-controller-client";
/// The node's side of the segment (MetalLB's speaker answers ARP there).
pub const NODE_IF: &str = "acw-node";
/// The workload image every wire test runs (imported by `cluster.sh up --node`).
pub const HELLO_IMAGE: &str = "localhost/address-controller/hello:1";
/// The MetalLB driver's Deployment in the release.
pub const METALLB_DRIVER: &str = "address-controller-metallb-driver";

static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// The `spec.loadBalancerClass` the range driver serves in the wire tests: MetalLB serves
/// the Services without one, and two load balancers must never serve the same Service.
pub const RANGE_LB_CLASS: &str = "local.sdn.cozystack.io/range";

/// The chart's values of the wire tests: both drivers, the range driver on a load-balancer
/// class of its own; the MetalLB fence off, so a thief's pin reaches MetalLB and the test
/// sees what the backend itself does with it.
pub fn wire_values() -> Value {
    let mut v = values();
    v["rangeDriver"]["lbClass"] = json!(RANGE_LB_CLASS);
    v["metallbDriver"] = json!({"enabled": true, "admissionPolicy": {"enabled": false}});
    v
}

/// Once per process: MetalLB's controller and speaker on the node (`cluster.sh metallb`),
/// the chart upgraded to run both drivers, every Deployment rolled out.
pub fn ready(node: &Node) {
    let r = READY.get_or_init(|| {
        (|| -> Result<()> {
            let out = Command::new(repo_root().join("deploy/local/cluster.sh"))
                .arg("metallb")
                .arg(&node.cluster.dir)
                .output()?;
            if !out.status.success() {
                bail!(
                    "cluster.sh metallb: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            node.helm_upgrade(&wire_values(), &[])?;
            node.wait_rollout(METALLB_DRIVER, Duration::from_secs(120))?;
            node.wait_rollout(crate::node::DRIVER, Duration::from_secs(120))?;
            node.wait_rollout(crate::node::CONTROLLER, Duration::from_secs(120))?;
            // A pod of this rollout leads each driver (the figures measure the path, not a
            // lease left by pods of an earlier release expiring).
            for (lease, component) in [
                (METALLB_DRIVER, "metallb-driver"),
                (crate::node::DRIVER, "range-driver"),
            ] {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let pods: Vec<String> = node
                        .pods(component)?
                        .iter()
                        .map(crate::node::pod_name)
                        .collect();
                    if pods.contains(&node.lease_holder(lease).unwrap_or_default()) {
                        break;
                    }
                    if Instant::now() > deadline {
                        bail!("no pod of {component} ({pods:?}) leads {lease}");
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            Ok(())
        })()
        .map_err(|e| format!("{e:#}"))
    });
    if let Err(e) = r {
        panic!("the wire did not come up: {e}");
    }
}

fn script(node: &Node, args: &[&str]) -> Result<String> {
    let out = Command::new(repo_root().join("deploy/local/cluster.sh"))
        .arg(args[0])
        .arg(&node.cluster.dir)
        .args(&args[1..])
        .output()?;
    if !out.status.success() {
        bail!(
            "cluster.sh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How the client host reaches CIDR: `on-link` (the segment: ARP/NDP), `via-node` (routed
/// to the node), `none`.
pub fn route(node: &Node, cidr: &str, how: &str) {
    script(node, &["route", cidr, how]).unwrap();
}

/// Restarts a component of the node (`kube-proxy`, `metallb-speaker`) as a kubelet restarts
/// a container: TERM, the same command again, until healthy.
pub fn restart(node: &Node, component: &str) {
    script(node, &["restart", component]).unwrap();
}

/// Stops a component of the node for good (a mutation check: what the wire does without it).
pub fn kill(node: &Node, component: &str) {
    let pid = std::fs::read_to_string(node.cluster.dir.join(format!("pids/{component}")))
        .unwrap()
        .trim()
        .to_string();
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{pid}")])
        .status();
}

/// One HTTP request from the client host: the body's first line, or why there is none.
pub fn curl(ip: &str, port: u16) -> std::result::Result<String, String> {
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{CLIENT_NETNS}"))
        .args(["--", "curl", "-sS", "--max-time", "2"])
        .arg(format!("http://{host}:{port}/"))
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The client host's neighbour entry for IP: its link-layer address, if it has one.
pub fn client_neighbour(ip: &str) -> Option<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{CLIENT_NETNS}"))
        .args(["--", "ip", "-j", "neigh", "show", ip])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v.as_array()?
        .iter()
        .find_map(|n| n["lladdr"].as_str().map(str::to_string))
}

/// Forgets the client host's neighbour entries (a customer's host whose cache expired).
pub fn client_flush_neighbours() {
    let _ = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{CLIENT_NETNS}"))
        .args(["--", "ip", "neigh", "flush", "all"])
        .status();
}

/// The MAC address of the node's side of the segment (the caller is in the node's
/// network namespace, as every node test is).
pub fn node_mac() -> String {
    let out = Command::new("ip")
        .args(["-j", "link", "show", NODE_IF])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["address"].as_str().unwrap_or_default().to_string()
}

/// A Deployment of the hello workload in NS, labelled `app: NAME`, under the restricted
/// Pod Security Standard; waits until every replica is ready. Its pods' names.
pub fn workload(node: &Node, ns: &str, name: &str, replicas: u32) -> Result<Vec<String>> {
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
          "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65535,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "hello", "image": HELLO_IMAGE, "imagePullPolicy": "Never",
              "ports": [{"containerPort": 8080, "name": "http"}],
              "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
              "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                  "capabilities": {"drop": ["ALL"]}}}]}}}
    });
    apply(node, &d)?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let pods = node.json(&["get", "pods", "-n", ns, "-l", &format!("app={name}")])?;
        let ready: Vec<String> = pods["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && p["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            })
            .map(crate::node::pod_name)
            .collect();
        if ready.len() == replicas as usize {
            return Ok(ready);
        }
        if Instant::now() > deadline {
            bail!("workload {ns}/{name}: {} of {replicas} ready", ready.len());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A LoadBalancer Service of port 80 to the `app: APP` pods' `http` port, with ANNOTATIONS
/// and SPEC's fields on top (e.g. `loadBalancerClass`).
pub fn service(
    node: &Node,
    ns: &str,
    name: &str,
    app: &str,
    annotations: Value,
    spec: Value,
) -> Result<()> {
    let mut s = json!({"type": "LoadBalancer", "selector": {"app": app},
                       "ports": [{"name": "http", "port": 80, "targetPort": "http"}]});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    apply(
        node,
        &json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": s
        }),
    )
}

/// The claim annotation of a Service.
pub fn claim_annotation(claim: &str) -> Value {
    json!({"local.sdn.cozystack.io/ip-address-claim": claim})
}

/// `kubectl apply` (server-side, as the harness) of one object.
pub fn apply(node: &Node, obj: &Value) -> Result<()> {
    node.cluster.apply(std::slice::from_ref(obj))
}

/// Polls `curl ip:port` until the answer is one of PODS (the time it took), failing at
/// once on an answer from anyone else and after TIMEOUT without one.
pub fn until_answered(ip: &str, port: u16, pods: &[String], timeout: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let last = match curl(ip, port) {
            Ok(who) if pods.contains(&who) => return t0.elapsed(),
            Ok(who) => panic!("{ip}:{port} answered from {who:?}, not from {pods:?}"),
            Err(e) => e,
        };
        assert!(
            t0.elapsed() < timeout,
            "{ip}:{port} not answering from {pods:?} after {timeout:?}: {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls until `curl ip:port` fails (the time it took), failing at once on an answer from
/// anyone but PODS (the rightful ones, whose answers may linger for a moment).
pub fn until_silent(ip: &str, port: u16, pods: &[String], timeout: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        match curl(ip, port) {
            Ok(who) if pods.contains(&who) => {}
            Ok(who) => panic!("{ip}:{port} answered from {who:?} while it should fall silent"),
            Err(_) => return t0.elapsed(),
        }
        assert!(
            t0.elapsed() < timeout,
            "{ip}:{port} still answering after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The p-th percentile (0..=100) of DURATIONS, in seconds.
pub fn percentile(durations: &[Duration], p: usize) -> f64 {
    let mut v: Vec<f64> = durations.iter().map(Duration::as_secs_f64).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) * p).div_ceil(100);
    v[i.min(v.len() - 1)]
}
