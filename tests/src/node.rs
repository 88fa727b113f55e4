//! The node tier in tests: a cluster with a real node (`cluster.sh up DIR --node`: kubelet,
//! kube-scheduler, containerd, all inside the network namespace `address-controller-node`),
//! the image of this checkout imported into the node's containerd, and the chart installed
//! with `helm upgrade --install` as an operator would. Pods, probes, rollouts and
//! restarts are the kubelet's own.
//!
//! Everything the cluster answers on lives inside that network namespace, so a test's
//! thread joins it (`setns`, per thread) before it builds its runtime: every socket the
//! test opens and every `kubectl` or `helm` it spawns is inside the namespace too. Root
//! only; without root the tests are reported ignored, with the reason ([`main`]).

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::chart::{chart_dir, helm, values_file};
use crate::{Cluster, repo_root, wait_for};

/// The network namespace of the node cluster (deploy/local/node.sh).
pub const NETNS: &str = "address-controller-node";
/// The release's namespace and name.
pub const NAMESPACE: &str = "address-controller-system";
pub const RELEASE: &str = "address-controller";
pub const CONTROLLER: &str = "address-controller";
pub const DRIVER: &str = "address-controller-range-driver";
/// The chart's values for the node tier: its defaults, plus the reference range driver
/// (a claim needs a driver). Nothing the environment forces: the image is present
/// (pullPolicy IfNotPresent, the default reference), pods reach kube-apiserver at the
/// `kubernetes` Service's ClusterIP, the API server reaches the pods on their own addresses.
pub fn values() -> Value {
    json!({"rangeDriver": {"enabled": true}})
}

/// The node cluster of this test process.
pub struct Node {
    pub cluster: &'static Cluster,
    /// The image reference the chart's Deployments use (imported, never pulled).
    pub image: String,
}

/// The nodes' names and network namespaces (`cluster.sh up --nodes 2` makes the second).
pub const NODE_NAMES: [&str; 2] = ["address-controller-node", "address-controller-node-2"];
pub const NETNS_OF: [&str; 2] = [NETNS, "address-controller-node-2"];

static NODE: OnceLock<std::result::Result<Node, String>> = OnceLock::new();
static NODE_COUNT: OnceLock<u8> = OnceLock::new();

/// How many nodes this process's cluster has: 1, unless its `main` was [`main_on_nodes`].
pub fn node_count() -> u8 {
    NODE_COUNT.get().copied().unwrap_or(1)
}

/// [`main`] for a test file whose cluster has NODES nodes (`cluster.sh up --nodes`).
pub fn main_on_nodes(nodes: u8, tests: Vec<(&'static str, fn())>, cozy: Vec<(&'static str, fn())>) {
    let _ = NODE_COUNT.set(nodes);
    main(tests, cozy);
}
static SERIAL: Mutex<()> = Mutex::new(());

/// Why the node tier cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some(
            "the node tier needs root (network and mount namespaces, cgroups, containerd)".into(),
        );
    }
    None
}

/// Moves the calling thread into the node's network namespace (threads and processes it
/// starts afterwards are in it too).
pub fn enter_netns() -> Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{NETNS}"))
        .with_context(|| format!("opening /run/netns/{NETNS}"))?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
    Ok(())
}

/// The `main` of a node-tier test file (`harness = false`): runs TESTS with libtest's
/// arguments and output; without root every one is reported *ignored*, with the reason
/// printed first — never passed. COZY are tests that also need cozy-proxy's source (beside
/// this repository, [`cozy_proxy_missing`]): ignored, with the reason, where it is not.
pub fn main(tests: Vec<(&'static str, fn())>, cozy: Vec<(&'static str, fn())>) {
    let args = libtest_mimic::Arguments::from_args();
    let skip = skip_reason();
    if let Some(why) = &skip {
        println!("node tier skipped (its tests are reported ignored): {why}");
    }
    let no_cozy = cozy_proxy_missing();
    if let (None, Some(why), false) = (&skip, &no_cozy, cozy.is_empty()) {
        println!("cozy-proxy tests skipped (reported ignored): {why}");
    }
    let trial = |(name, test): (&'static str, fn()), ignored: bool| {
        libtest_mimic::Trial::test(name, move || {
            test();
            Ok(())
        })
        .with_ignored_flag(ignored)
    };
    let trials = tests
        .into_iter()
        .map(|t| trial(t, skip.is_some()))
        .chain(
            cozy.into_iter()
                .map(|t| trial(t, skip.is_some() || no_cozy.is_some())),
        )
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

/// Why cozy-proxy cannot be built here, if it cannot: its upstream source is not beside
/// this repository (`COZY_PROXY_SRC`, default `../shared/third_party/cozy-proxy`).
pub fn cozy_proxy_missing() -> Option<String> {
    let src = std::env::var_os("COZY_PROXY_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/third_party/cozy-proxy"));
    (!src.join("go.mod").exists()).then(|| {
        format!(
            "no cozy-proxy source at {} (set COZY_PROXY_SRC to its checkout)",
            src.display()
        )
    })
}

/// The `main` of a node-tier test file: `node_main![test_a, test_b]` runs those functions
/// by their names through [`main`]; `node_main![a, b; cozy_proxy: c]` also `c`, which needs
/// cozy-proxy.
#[macro_export]
macro_rules! node_main {
    ($($test:ident),* $(,)?) => {
        fn main() {
            $crate::node::main(vec![$((stringify!($test), $test as fn())),*], vec![]);
        }
    };
    ($($test:ident),* ; cozy_proxy: $($cozy:ident),* $(,)?) => {
        fn main() {
            $crate::node::main(
                vec![$((stringify!($test), $test as fn())),*],
                vec![$((stringify!($cozy), $cozy as fn())),*],
            );
        }
    };
}

/// Runs one node test alone (the tests share the one release), on this thread moved into
/// the node's namespace, on a runtime built there. The node starts with the first test.
/// Only [`main`] calls the tests, and it ignores them without root.
pub fn run<F, Fut>(body: F)
where
    F: FnOnce(&'static Node) -> Fut,
    Fut: Future<Output = ()>,
{
    if let Some(why) = skip_reason() {
        panic!("a node test ran where it cannot: {why}");
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = match NODE.get_or_init(|| Node::start().map_err(|e| format!("{e:#}"))) {
        Ok(node) => node,
        Err(e) => panic!("the node did not start: {e}"),
    };
    enter_netns().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(body(node));
}

/// The node of this process, once started.
pub fn current() -> Option<&'static Node> {
    NODE.get().and_then(|r| r.as_ref().ok())
}

/// Where the node tests' figures are collected (`make test` empties it first and prints it
/// at the end; both node-tier test files append to it).
pub fn figures_file() -> PathBuf {
    repo_root().join("target/node-figures.txt")
}

/// Prints a figure and appends it to [`figures_file`].
pub fn figure(line: &str) {
    use std::io::Write;
    println!("figure: {line}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(figures_file())
    {
        let _ = writeln!(f, "{line}");
    }
}

fn timed<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t0 = Instant::now();
    let v = f()?;
    figure(&format!("{what}: {:.2}s", t0.elapsed().as_secs_f64()));
    Ok(v)
}

impl Node {
    fn start() -> Result<Node> {
        let script = repo_root().join("deploy/local/cluster.sh");
        // A node cluster that is up already (`cluster.sh up DIR --node`), or a new one that
        // stops with this process.
        let reuse = std::env::var("ADDRESS_CONTROLLER_TEST_NODE_CLUSTER").ok();
        let dir = match &reuse {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(
                String::from_utf8(
                    Command::new("mktemp")
                        .args(["-d", "/tmp/address-controller-node.XXXXXX"])
                        .output()?
                        .stdout,
                )?
                .trim(),
            ),
        };
        crate::ensure_binaries()?;
        if reuse.is_none() {
            Self::up(&script, &dir)?;
        }
        Self::install(&script, &dir)
    }

    fn up(script: &std::path::Path, dir: &std::path::Path) -> Result<()> {
        timed(
            "node cluster up (control plane, containerd, kubelet Ready)",
            || {
                let out = Command::new(script)
                    .arg("up")
                    .arg(dir)
                    .args(["--nodes", &node_count().to_string()])
                    .args(["--watch-pid", &std::process::id().to_string()])
                    .output()
                    .context("cluster.sh up --nodes")?;
                if !out.status.success() {
                    bail!(
                        "cluster.sh up {} --nodes {}: {}",
                        dir.display(),
                        node_count(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                Ok(())
            },
        )
    }

    fn install(script: &std::path::Path, dir: &std::path::Path) -> Result<Node> {
        let cluster = Cluster::use_dir(dir)?;
        let built = timed(
            "image assembled (make image; release binaries cached)",
            || crate::image::build(&repo_root().join("target/image-node"), &[]),
        )?;
        timed("image import into the node's containerd", || {
            let out = Command::new(script)
                .arg("import")
                .arg(dir)
                .arg(&built.archive)
                .output()?;
            if !out.status.success() {
                bail!(
                    "cluster.sh import: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        })?;
        enter_netns()?;
        // The release's namespace enforces the restricted Pod Security Standard, as a
        // hardened cluster's would: every pod of every node test is admitted under it.
        cluster
            .kubectl()
            .args(["create", "namespace", NAMESPACE])
            .output()?;
        cluster.kubectl_ok(&[
            "label",
            "--overwrite",
            "namespace",
            NAMESPACE,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ])?;
        let version = crate::image::app_version();
        let image = format!("ghcr.io/cozystack/address-controller:{version}");
        let node = Node { cluster, image };
        if node_count() > 1 {
            // The two-node tier is where VMs move: KubeVirt's VMI CRD is there before the
            // drivers start, as on the platform (they also find it later, within a
            // discovery recheck).
            crate::migration::install_vmi_crd(&node);
        }
        timed(
            "rollout (helm upgrade --install → both Deployments Available)",
            || {
                node.helm_upgrade(&values(), &[])?;
                node.wait_rollout(CONTROLLER, Duration::from_secs(120))?;
                node.wait_rollout(DRIVER, Duration::from_secs(120))
            },
        )?;
        Ok(node)
    }

    /// `helm upgrade --install` of the chart with `values` (replacing the previous values).
    pub fn helm_upgrade(&self, values: &Value, extra: &[&str]) -> Result<()> {
        let (_dir, file) = values_file(values);
        let out = helm()
            .args(["upgrade", "--install", RELEASE])
            .arg(chart_dir())
            .args(["--namespace", NAMESPACE, "--create-namespace", "-f"])
            .arg(&file)
            .args(extra)
            .output()?;
        if !out.status.success() {
            bail!("helm upgrade: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// `kubectl ARGS -o json`, parsed.
    pub fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.cluster.kubectl_ok(&all)?)?)
    }

    /// Waits until the Deployment's newest generation is rolled out and Available: every
    /// replica updated and ready, no old one left (what `kubectl rollout status` checks).
    pub fn wait_rollout(&self, deployment: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let d = self.json(&["get", "deployment", deployment, "-n", NAMESPACE])?;
            let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
            let st = &d["status"];
            let available = st["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Available" && c["status"] == "True")
            });
            if st["observedGeneration"] == d["metadata"]["generation"]
                && st["updatedReplicas"].as_i64() == Some(want)
                && st["readyReplicas"].as_i64() == Some(want)
                && st["availableReplicas"].as_i64() == Some(want)
                && st["replicas"].as_i64() == Some(want)
                && available
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let pods = self
                    .cluster
                    .kubectl_ok(&["get", "pods", "-n", NAMESPACE, "-o", "wide"])
                    .unwrap_or_default();
                bail!(
                    "deployment {deployment} not rolled out: {st}\n{pods}\n{}",
                    self.why_not_running()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What keeps pods from running, for a failure message: the node's conditions that are
    /// not as a healthy node has them and its taints, the scheduler's and the kubelet's
    /// words on the release's pods (FailedScheduling, FailedCreatePodSandBox, …), whether
    /// the scheduler still runs, and the disk the kubelet measures.
    pub fn why_not_running(&self) -> String {
        let mut out = String::new();
        if let Ok(nodes) = self.json(&["get", "nodes"]) {
            for n in nodes["items"].as_array().into_iter().flatten() {
                let name = n["metadata"]["name"].as_str().unwrap_or("?");
                for c in n["status"]["conditions"].as_array().into_iter().flatten() {
                    let healthy = if c["type"] == "Ready" {
                        "True"
                    } else {
                        "False"
                    };
                    if c["status"] != healthy {
                        out += &format!(
                            "node {name}: {}={} {}: {}\n",
                            c["type"].as_str().unwrap_or("?"),
                            c["status"].as_str().unwrap_or("?"),
                            c["reason"].as_str().unwrap_or(""),
                            c["message"].as_str().unwrap_or("")
                        );
                    }
                }
                out += &format!(
                    "node {name}: taints {}, allocatable {}\n",
                    n["spec"]["taints"], n["status"]["allocatable"]
                );
            }
        }
        if let Ok(events) = self.json(&["get", "events", "-n", NAMESPACE]) {
            for e in events["items"].as_array().into_iter().flatten() {
                if e["type"] == "Warning" {
                    out += &format!(
                        "event {} {}: {} (x{})\n",
                        e["involvedObject"]["name"].as_str().unwrap_or("?"),
                        e["reason"].as_str().unwrap_or("?"),
                        e["message"].as_str().unwrap_or(""),
                        e["count"].as_i64().unwrap_or(1)
                    );
                }
            }
        }
        let pid = std::fs::read_to_string(self.cluster.dir.join("pids/kube-scheduler"))
            .unwrap_or_default();
        let alive = !pid.trim().is_empty()
            && std::path::Path::new(&format!("/proc/{}", pid.trim())).exists();
        out += &format!("kube-scheduler running: {alive}\n");
        if let Ok(df) = Command::new("df").args(["-h", "/var/lib/kubelet"]).output() {
            out += &String::from_utf8_lossy(&df.stdout);
        }
        out
    }

    /// The release's running pods of a component (`controller` or `range-driver`), by name.
    pub fn pods(&self, component: &str) -> Result<Vec<Value>> {
        let list = self.json(&[
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            &format!("app.kubernetes.io/component={component}"),
        ])?;
        Ok(list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect())
    }

    /// A pod of the release, by name.
    pub fn pod(&self, name: &str) -> Result<Value> {
        self.json(&["get", "pod", name, "-n", NAMESPACE])
    }

    /// The holder of a Lease in the release's namespace.
    pub fn lease_holder(&self, lease: &str) -> Result<String> {
        let l = self.json(&["get", "lease", lease, "-n", NAMESPACE])?;
        Ok(l["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }
}

/// Every replica of the controller, for the invariant checker's gauge comparison.
pub fn replicas(node: &Node) -> Vec<crate::invariants::Replica> {
    let token = crate::metrics_token().unwrap();
    node.pods("controller")
        .unwrap()
        .iter()
        .map(|p| crate::invariants::Replica {
            name: pod_name(p),
            url: format!("https://{}:8443/metrics", pod_ip(p)),
            token: token.clone(),
            pid: container_pid(p).ok(),
        })
        .collect()
}

/// Sends SIG (`KILL`, `STOP`, ...) to a process of this host.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid}");
}

/// A pod's container's restart count.
pub fn restarts(pod: &Value) -> i64 {
    pod["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(-1)
}

pub fn pod_name(pod: &Value) -> String {
    pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn pod_ip(pod: &Value) -> String {
    pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The host PID of a pod's (first) container: the process whose cgroup ends with the
/// container's id (the kubelet's cgroupfs layout, `…/pod<uid>/<container id>`).
pub fn container_pid(pod: &Value) -> Result<u32> {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|s| s.strip_prefix("containerd://"))
        .ok_or_else(|| anyhow!("no containerID in {}", pod["status"]))?
        .to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if cg.lines().any(|l| l.ends_with(&format!("/{id}"))) {
            found.push(pid);
        }
    }
    found.sort_unstable();
    // The container's own process is the oldest (lowest) one in its cgroup.
    found
        .first()
        .copied()
        .ok_or_else(|| anyhow!("no process in the cgroup of container {id}"))
}

/// Waits (polling the API) until `probe` gives a value.
pub async fn until<T, F>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Result<Option<T>>,
{
    let mut probe = move || std::future::ready(probe());
    wait_for(what, timeout, &mut probe).await.unwrap()
}

/// The SHA-256 fingerprint of the certificate served at `addr` (host:port).
pub fn served_fingerprint(addr: &str) -> Result<String> {
    let s_client = Command::new("openssl")
        .args(["s_client", "-connect", addr, "-servername", "localhost"])
        .stdin(std::process::Stdio::null())
        .output()?;
    let mut x509 = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        x509.stdin
            .take()
            .ok_or_else(|| anyhow!("no stdin"))?
            .write_all(&s_client.stdout)?;
    }
    let out = x509.wait_with_output()?;
    if !out.status.success() {
        bail!("no certificate served at {addr}");
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// The SHA-256 fingerprint of a PEM certificate file.
pub fn file_fingerprint(path: &std::path::Path) -> Result<String> {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(path)
        .output()?;
    if !out.status.success() {
        bail!("openssl x509 {}", path.display());
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Node I uncordoned when this goes, however the test ends (a failed step must not leave a
/// node cordoned for the file's later tests). A drain cordons too: its guard is this one.
pub struct Uncordon<'a>(pub &'a Node, pub usize);

impl Drop for Uncordon<'_> {
    fn drop(&mut self) {
        let _ = self.0.cluster.kubectl_ok(&["uncordon", NODE_NAMES[self.1]]);
    }
}
