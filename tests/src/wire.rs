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

use address_controller_api::IPAddressClaim;
use anyhow::{Result, bail};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::invariants::{Scope, assert_invariants};
use crate::node::{self, Node, replicas, values};
use crate::{Cleanup, TestNamespace, random_suffix, repo_root, wait_for};

/// How long a wire test waits for a claim to bind, or for a condition.
pub const WAIT: Duration = Duration::from_secs(60);

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
    curl_path(ip, port, "/")
}

/// A command run in the network namespace NETNS (`nsenter --net=/run/netns/NETNS --`); its
/// program and arguments are added by the caller.
pub fn in_netns(netns: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{netns}")).arg("--");
    c
}

/// The client host's neighbour entry for IP: its link-layer address, if it has one.
pub fn client_neighbour(ip: &str) -> Option<String> {
    let out = in_netns(CLIENT_NETNS)
        .args(["ip", "-j", "neigh", "show", ip])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v.as_array()?
        .iter()
        .find_map(|n| n["lladdr"].as_str().map(str::to_string))
}

/// Forgets the client host's neighbour entries (a customer's host whose cache expired).
pub fn client_flush_neighbours() {
    let _ = in_netns(CLIENT_NETNS)
        .args(["ip", "neigh", "flush", "all"])
        .status();
}

/// The MAC address of the node's side of the segment (the caller is in the node's
/// network namespace, as every node test is).
pub fn node_mac() -> String {
    node_mac_of(crate::node::NETNS)
}

/// Which node's MAC the client host holds for IP (the node whose speaker answered ARP).
pub fn announcer(ip: &str) -> Option<usize> {
    let mac = client_neighbour(ip)?;
    crate::node::NETNS_OF
        .iter()
        .position(|ns| node_mac_of(ns) == mac)
}

/// The MAC address of the segment's side of the node whose network namespace is NETNS.
pub fn node_mac_of(netns: &str) -> String {
    let out = in_netns(netns)
        .args(["ip", "-j", "link", "show", NODE_IF])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["address"].as_str().unwrap_or_default().to_string()
}

/// A Deployment of the hello workload in NS, labelled `app: NAME`, under the restricted
/// Pod Security Standard; waits until every replica is ready. Its pods' names.
pub fn workload(node: &Node, ns: &str, name: &str, replicas: u32) -> Result<Vec<String>> {
    workload_with(node, ns, name, replicas, json!({}))
}

/// [`workload`] whose container also has the fields of `container` (a `lifecycle`, say).
pub fn workload_with(
    node: &Node,
    ns: &str,
    name: &str,
    replicas: u32,
    container: Value,
) -> Result<Vec<String>> {
    workload_spec(node, ns, name, replicas, container, json!({}))
}

/// [`workload`] on as many nodes as it has replicas: one pod per node (a required
/// anti-affinity on the node's hostname).
pub fn workload_spread(node: &Node, ns: &str, name: &str, replicas: u32) -> Result<Vec<String>> {
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": name}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    workload_spec(node, ns, name, replicas, json!({}), anti)
}

/// [`workload`] whose container has the fields of CONTAINER and whose pod spec those of POD.
fn workload_spec(
    node: &Node,
    ns: &str,
    name: &str,
    replicas: u32,
    container: Value,
    pod: Value,
) -> Result<Vec<String>> {
    let mut hello = json!({"name": "hello", "image": HELLO_IMAGE, "imagePullPolicy": "Never",
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]}}});
    overlay(&mut hello, &container);
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65535,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [hello]});
    overlay(&mut spec, &pod);
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
          "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}
    });
    apply(node, &d)?;
    wait_ready_pods(node, ns, name, replicas)
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
    overlay(&mut s, &spec);
    apply(
        node,
        &json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": s
        }),
    )
}

/// The fields of EXTRA (an object) set on BASE (an object), replacing BASE's of the same name.
fn overlay(base: &mut Value, extra: &Value) {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
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
    until_answered_by(
        ip,
        port,
        &format!("{pods:?}"),
        |who| pods.iter().any(|p| p == who),
        timeout,
    )
}

/// Polls `curl ip:port` until a pod of the workload NAME answers (any of them: one that is
/// terminating may still be sent a connection until kube-proxy has caught up, and a
/// well-behaved one answers it), failing at once on an answer from another workload.
pub fn until_workload_answers(ip: &str, port: u16, name: &str, timeout: Duration) -> Duration {
    let prefix = format!("{name}-");
    until_answered_by(
        ip,
        port,
        &format!("the pods of {name}"),
        |who| who.starts_with(&prefix),
        timeout,
    )
}

fn until_answered_by(
    ip: &str,
    port: u16,
    rightful: &str,
    is_rightful: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Duration {
    let t0 = Instant::now();
    loop {
        let last = match curl(ip, port) {
            Ok(who) if is_rightful(&who) => return t0.elapsed(),
            Ok(who) => panic!("{ip}:{port} answered from {who:?}, not from {rightful}"),
            Err(e) => e,
        };
        assert!(
            t0.elapsed() < timeout,
            "{ip}:{port} not answering from {rightful} after {timeout:?}: {last}"
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

// ---- whole addresses through cozy-proxy (#55) ---------------------------------------------

/// The client host's address on the segment (the listener the pods dial lives there).
pub const CLIENT_IP: &str = "10.255.1.2";
/// The node's address on the segment: what a pod's outbound traffic is seen from when it is
/// not a pod cozy-proxy serves (the node masquerades pods, as a cluster's CNI does).
pub const NODE_WIRE_IP: &str = "10.255.1.1";

static COZY: OnceLock<std::result::Result<bool, String>> = OnceLock::new();

/// Once per process: cozy-proxy running on the node (`cluster.sh cozy-proxy`). `false`: its
/// source is not beside this repository (../shared/third_party/cozy-proxy) — the caller says
/// *skipped*, never passed.
pub fn cozy_proxy(node: &Node) -> bool {
    let r = COZY.get_or_init(|| {
        let out = Command::new(repo_root().join("deploy/local/cluster.sh"))
            .arg("cozy-proxy")
            .arg(&node.cluster.dir)
            .output()
            .map_err(|e| e.to_string())?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(3) => Ok(false),
            _ => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    });
    match r {
        Ok(up) => *up,
        Err(e) => panic!("cozy-proxy did not start: {e}"),
    }
}

/// A Deployment of the hello workload as a VM stands in for: `args` are its ports (`N` TCP,
/// `u:N` UDP; the first is its HTTP port), REPLICAS pods, labelled `app: NAME`; waits until
/// every replica is ready. Its pods' names.
pub fn vm_workload(
    node: &Node,
    ns: &str,
    name: &str,
    replicas: u32,
    args: &[&str],
) -> Result<Vec<String>> {
    let first: i32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(8080);
    workload_with(
        node,
        ns,
        name,
        replicas,
        json!({"command": ["/hello"], "args": args,
            "ports": [{"containerPort": first, "name": "http"}],
            // Asked from inside the pod: cozy-proxy rewrites the source of everything a
            // whole-address pod sends, its answers to a probe from the node included.
            "readinessProbe": {"exec": {"command": ["/hello", "probe", first.to_string()]},
                               "periodSeconds": 1}}),
    )
}

/// Waits until REPLICAS pods of `app: NAME` in NS are ready; their names.
pub fn wait_ready_pods(node: &Node, ns: &str, name: &str, replicas: u32) -> Result<Vec<String>> {
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

/// The IP of a ready pod of `app: NAME` in NS.
pub fn pod_ip_of(node: &Node, ns: &str, name: &str) -> Result<String> {
    let pods = node.json(&["get", "pods", "-n", ns, "-l", &format!("app={name}")])?;
    pods["items"]
        .as_array()
        .and_then(|a| a.first())
        .map(crate::node::pod_ip)
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| anyhow::anyhow!("no pod of {ns}/{name} has an IP"))
}

/// How cozy-proxy is to serve a VM's Service.
#[derive(Debug, Clone, Copy)]
pub enum Method {
    /// `wholeIP: "true"`, the platform's placeholder port 65535.
    WholeIp,
    /// `wholeIP: "false"` with these TCP ports, and `allowICMP` as given.
    PortList { ports: &'static [i32], icmp: bool },
}

/// The Service the platform renders for a VM with a public address, exactly: type
/// LoadBalancer, `externalTrafficPolicy: Local`, no node ports, cozy-proxy's label, its
/// annotations, the placeholder `port: 65535` when it lists none — naming CLAIM, with SPEC's
/// fields on top (e.g. a load-balancer class).
pub fn vm_service(
    node: &Node,
    ns: &str,
    name: &str,
    app: &str,
    claim: &str,
    method: Method,
    spec: Value,
) -> Result<()> {
    let (whole, icmp, ports): (&str, Option<bool>, Vec<Value>) = match method {
        Method::WholeIp => (
            "true",
            None,
            vec![json!({"name": "placeholder", "port": 65535, "protocol": "TCP"})],
        ),
        Method::PortList { ports, icmp } => (
            "false",
            Some(icmp),
            ports
                .iter()
                .map(|p| json!({"name": format!("tcp-{p}"), "port": p, "protocol": "TCP"}))
                .collect(),
        ),
    };
    let mut annotations = claim_annotation(claim);
    annotations["networking.cozystack.io/wholeIP"] = json!(whole);
    if let Some(i) = icmp {
        annotations["networking.cozystack.io/allowICMP"] = json!(i.to_string());
    }
    let mut s = json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                       "allocateLoadBalancerNodePorts": false,
                       "selector": {"app": app}, "ports": ports});
    overlay(&mut s, &spec);
    apply(
        node,
        &json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns,
                "labels": {"service.kubernetes.io/service-proxy-name": "cozy-proxy"},
                "annotations": annotations},
            "spec": s
        }),
    )
}

/// One HTTP request from the client host to `ip:port/path`: the body, or why there is none.
pub fn curl_path(ip: &str, port: u16, path: &str) -> std::result::Result<String, String> {
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let out = in_netns(CLIENT_NETNS)
        .args(["curl", "-sS", "--max-time", "2"])
        .arg(format!("http://{host}:{port}{path}"))
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Python in the client host's namespace (UDP and ICMP probes: nothing to install).
fn client_python(code: &str, args: &[&str]) -> std::result::Result<String, String> {
    let out = in_netns(CLIENT_NETNS)
        .args(["python3", "-c", code])
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// One UDP datagram from the client host to `ip:port`: the answer (the pod's name), or why
/// there is none (1 s).
pub fn udp(ip: &str, port: u16) -> std::result::Result<String, String> {
    client_python(
        "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.settimeout(1)\n\
         s.sendto(b'hello',(sys.argv[1],int(sys.argv[2])))\nprint(s.recvfrom(512)[0].decode())",
        &[ip, &port.to_string()],
    )
}

/// One ICMP echo from the client host to `ip`: whether `ip` answered within 1 s.
pub fn ping(ip: &str) -> bool {
    client_python(
        "import socket,struct,sys,time\n\
         def cs(b):\n s=sum((b[i]<<8)+b[i+1] for i in range(0,len(b)-1,2))\n s=(s>>16)+(s&0xffff)\n return (~(s+(s>>16)))&0xffff\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP)\ns.settimeout(1)\n\
         h=struct.pack('!BBHHH',8,0,0,0x4143,1)+b'address-controller'\n\
         p=struct.pack('!BBHHH',8,0,cs(h),0x4143,1)+b'address-controller'\n\
         s.sendto(p,(sys.argv[1],0))\nend=time.time()+1\n\
         while time.time()<end:\n d,a=s.recvfrom(1500)\n if a[0]==sys.argv[1] and d[20]==0:\n  print('pong');break\n\
         else:\n sys.exit(1)",
        &[ip],
    )
    .is_ok_and(|o| o == "pong")
}

/// A listener on the client host — the hello workload's binary, run there — that answers
/// `GET /whoami` with the address a connection came from. Stopped when dropped.
pub struct ClientListener {
    child: std::process::Child,
    pub port: u16,
}

impl ClientListener {
    pub fn start(node: &Node, port: u16) -> Result<ClientListener> {
        let hello = node.cluster.dir.join("node/hello");
        let child = in_netns(CLIENT_NETNS)
            .arg(&hello)
            .arg(port.to_string())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let l = ClientListener { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while curl_path(CLIENT_IP, port, "/").is_err() {
            if Instant::now() > deadline {
                bail!("the client host's listener on :{port} did not come up");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(l)
    }
}

impl Drop for ClientListener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Who asks a pod to dial out: a pod cozy-proxy serves sends **everything** from the claimed
/// address — its answers to the node included — so it is asked by the client host through
/// that address; any other pod by the node at its own IP.
#[derive(Clone, Copy, Debug)]
pub enum Ask<'a> {
    /// The client host, through the claimed address (port 8080 must reach the pod).
    ThroughAddress(&'a str),
    /// The node, at the pod's IP.
    FromNode(&'a str),
}

/// From the pod ASK reaches (its HTTP port 8080): a connection to the client host's
/// listener; the address the client saw it come from.
pub fn egress_source(
    ask: Ask<'_>,
    listener: &ClientListener,
) -> std::result::Result<String, String> {
    let (host, netns) = match ask {
        Ask::ThroughAddress(ip) => (ip, Some(CLIENT_NETNS)),
        Ask::FromNode(ip) => (ip, None),
    };
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = in_netns(ns);
            c.arg("curl");
            c
        }
        None => Command::new("curl"),
    };
    let out = cmd
        .args(["-sS", "--max-time", "5"])
        .arg(format!(
            "http://{host}:8080/dial/{CLIENT_IP}/{}",
            listener.port
        ))
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
    body.split_whitespace()
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| format!("the pod's dial said {body:?}"))
}

/// How many times Service NS/NAME was written during `window`: the events of a watch after
/// its first (the object as it is). A quiet Service's count is 0; two controllers fighting
/// over it write it many times a second (the drivers did, over its condition — #55).
pub fn writes_over(node: &Node, ns: &str, name: &str, window: Duration) -> Result<usize> {
    let mut watch = node
        .cluster
        .kubectl()
        .args(["get", "service", name, "-n", ns, "-w", "-o", "name"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    // The window is the measurement itself, not a wait for something to happen.
    std::thread::sleep(window);
    let _ = watch.kill();
    let out = watch.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .count()
        .saturating_sub(1))
}

/// Which driver carries the class, and how the client host reaches its addresses.
#[derive(Clone, Copy)]
pub enum Driver {
    /// MetalLB's pool; the addresses are on the segment, the speaker answers ARP.
    MetalLb,
    /// The range driver's CIDR, routed to the node by the client host (the upstream router).
    Range,
}

impl Driver {
    pub fn provisioner(self) -> &'static str {
        match self {
            Driver::MetalLb => "metallb.drivers.local.sdn.cozystack.io",
            Driver::Range => "range.drivers.local.sdn.cozystack.io",
        }
    }
    pub fn parameters(self, cidrs: &[&str]) -> Value {
        match self {
            Driver::MetalLb => json!({"addresses": cidrs}),
            Driver::Range => json!({"cidrs": cidrs}),
        }
    }
    /// The Services' `spec` fields the driver needs (the range driver's load-balancer class).
    pub fn spec(self) -> Value {
        match self {
            Driver::MetalLb => json!({}),
            Driver::Range => json!({"loadBalancerClass": RANGE_LB_CLASS}),
        }
    }
    pub fn route(self) -> &'static str {
        match self {
            Driver::MetalLb => "on-link",
            Driver::Range => "via-node",
        }
    }
}

/// One test's world: a tenant, a stranger, a class of DRIVER over CIDRS reached by the
/// client host as the driver needs.
pub struct World {
    pub client: Client,
    pub tenant: TestNamespace,
    pub stranger: TestNamespace,
    pub class: String,
    pub cidrs: Vec<String>,
    _cleanup: Cleanup,
}

impl World {
    pub async fn new(node: &Node, driver: Driver, cidrs: &[&str]) -> World {
        ready(node);
        let client = node.cluster.client().await.unwrap();
        let tenant = TestNamespace::create(&client, "wire-tenant").await.unwrap();
        let stranger = TestNamespace::create(&client, "wire-stranger")
            .await
            .unwrap();
        let class = format!("wire-{}", random_suffix());
        apply(
            node,
            &json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
                "metadata": {"name": class},
                "spec": {"provisioner": driver.provisioner(), "reclaimPolicy": "Retain",
                         "releaseDelay": "24h", "parameters": driver.parameters(cidrs)}}),
        )
        .unwrap();
        let mut cleanup = Cleanup::default();
        cleanup.add("ipaddressclasses.local.sdn.cozystack.io", &class);
        for cidr in cidrs {
            route(node, cidr, driver.route());
        }
        World {
            client,
            tenant,
            stranger,
            class,
            cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            _cleanup: cleanup,
        }
    }

    pub fn claims(&self) -> Api<IPAddressClaim> {
        Api::namespaced(self.client.clone(), &self.tenant.name)
    }

    pub async fn create_claim(&self, name: &str, extra: Value) {
        let mut spec = json!({"className": self.class});
        overlay(&mut spec, &extra);
        self.claims()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap(),
            )
            .await
            .unwrap();
    }

    /// Waits until the claim is Bound; its (first) address.
    pub async fn bound(&self, name: &str) -> String {
        self.bound_all(name).await.remove(0)
    }

    /// Waits until the claim is Bound; all its addresses.
    pub async fn bound_all(&self, name: &str) -> Vec<String> {
        let api = self.claims();
        wait_for(&format!("claim {name} Bound"), WAIT, || {
            let api = api.clone();
            async move {
                let st = api.get(name).await?.status.unwrap_or_default();
                let bound = st.phase.map(|p| format!("{p:?}")).as_deref() == Some("Bound");
                Ok((bound && !st.addresses.is_empty())
                    .then(|| st.addresses.iter().map(|a| a.address.clone()).collect()))
            }
        })
        .await
        .unwrap()
    }

    pub async fn check(&self, node: &Node) {
        assert_invariants(
            &self.client,
            &Scope::of(
                &[self.tenant.name.as_str(), self.stranger.name.as_str()],
                &[self.class.as_str()],
            ),
            &replicas(node),
        )
        .await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(node) = node::current() {
            for cidr in &self.cidrs {
                route(node, cidr, "none");
            }
            // The tenants' Services go before the class (its MetalLB pool goes with it): a
            // Service still showing an address of a deleted pool makes MetalLB's speaker
            // reject every new configuration ("service has no configuration under new
            // config"), and a speaker restarted meanwhile announces nothing until its
            // retries get through — the wire test that waited 60 s for an answer once.
            let _ = node.cluster.kubectl_ok(&[
                "delete",
                "namespace",
                &self.tenant.name,
                &self.stranger.name,
                "--wait=true",
                "--timeout=60s",
                "--ignore-not-found",
            ]);
            // So do the class's retained addresses: over MetalLB each is held by a hold
            // Service showing it, which would outlive the pool the same way (the driver lets
            // go of a hold behind its finalizer when the address is deleted).
            let _ = node.cluster.kubectl_ok(&[
                "delete",
                "ipaddresses.local.sdn.cozystack.io",
                "--field-selector",
                &format!("spec.className={}", self.class),
                "--wait=true",
                "--timeout=60s",
            ]);
        }
    }
}

// ---- what the node tier reads of the API -------------------------------------------------

/// The IPAddress object holding IP (by spec.address), as JSON.
pub fn address_object(node: &Node, ip: &str) -> Option<Value> {
    let list = node
        .json(&["get", "ipaddresses.local.sdn.cozystack.io"])
        .unwrap();
    list["items"]
        .as_array()?
        .iter()
        .find(|a| a["spec"]["address"] == ip)
        .cloned()
}

/// The AddressAttached condition of a Service: (status, reason, message).
pub fn attached_condition(node: &Node, ns: &str, name: &str) -> Option<(String, String, String)> {
    let s = node.json(&["get", "service", "-n", ns, name]).ok()?;
    s["status"]["conditions"].as_array()?.iter().find_map(|c| {
        (c["type"] == "local.sdn.cozystack.io/AddressAttached").then(|| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

/// Waits until the Service's condition has STATUS and REASON; its message.
pub async fn until_condition(
    node: &Node,
    ns: &str,
    name: &str,
    status: &str,
    reason: &str,
) -> String {
    wait_for(
        &format!("Service {ns}/{name} AddressAttached={status} {reason}"),
        WAIT,
        || async {
            Ok(attached_condition(node, ns, name)
                .filter(|(s, r, _)| s == status && r == reason)
                .map(|(_, _, m)| m))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; last {:?}", attached_condition(node, ns, name)))
}
