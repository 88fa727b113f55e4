//! A VM keeps its address while KubeVirt moves it (#64), on the two-node tier: the real
//! MetalLB speaker and cozy-proxy on both nodes, the client host probing the address every
//! 100 ms. KubeVirt itself does not run here (no registry serves it); its VMI CRD is
//! installed (`tests/fixtures/kubevirt-vmi-crd.yaml`, which says why it is hand-written) and
//! a move is played as KubeVirt plays it, with its own labels and fields: a virt-launcher
//! pod per node carrying `kubevirt.io/created-by` (the target also
//! `kubevirt.io/migrationJobUID`), owned by the VMI; the VMI labelled
//! `kubevirt.io/migrationTargetNodeName` while it moves, its `status.activePods` listing both
//! pods, `status.migrationState` the move, and `status.nodeName` flipping to the target's
//! node when the target takes over; a PodDisruptionBudget on the VMI's pods, so that a drain
//! waits for the move as it does on the platform.

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::node::{NODE_NAMES, Node, Uncordon, figure};
use crate::wire::{
    self, CLIENT_NETNS, Driver, HELLO_IMAGE, Method, WAIT, World, address_object,
    attached_condition, in_netns, until_answered, until_condition, vm_service,
};
use crate::{random_suffix, repo_root};

/// The VMI CRD fixture.
fn vmi_crd() -> PathBuf {
    repo_root().join("tests/fixtures/kubevirt-vmi-crd.yaml")
}

/// Installs KubeVirt's VMI CRD (once per cluster; again is a no-op) and waits until served.
pub fn install_vmi_crd(node: &Node) {
    let path = vmi_crd();
    node.cluster
        .kubectl_ok(&[
            "apply",
            "--server-side",
            "-f",
            path.to_str().unwrap_or_default(),
        ])
        .unwrap();
    node.cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/virtualmachineinstances.kubevirt.io",
        ])
        .unwrap();
}

/// A virt-launcher pod: its name, UID and node (0 or 1).
#[derive(Clone, Debug)]
pub struct Launcher {
    pub name: String,
    pub uid: String,
    pub on: usize,
}

/// A VMI of the tenant, and what KubeVirt would write on it.
pub struct Vm<'a> {
    node: &'a Node,
    pub ns: String,
    pub name: String,
    pub uid: String,
}

impl<'a> Vm<'a> {
    /// The VMI object `NAME` in NS (its spec a placeholder: nothing here reads it).
    pub fn create(node: &'a Node, ns: &str, name: &str) -> Vm<'a> {
        wire::apply(
            node,
            &json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "namespace": ns,
                    "labels": {"kubevirt.io/vm": name}},
                "spec": {"domain": {"devices": {}}, "evictionStrategy": "LiveMigrate"}}),
        )
        .unwrap();
        let v = node
            .json(&["get", "virtualmachineinstances.kubevirt.io", "-n", ns, name])
            .unwrap();
        Vm {
            node,
            ns: ns.into(),
            name: name.into(),
            uid: v["metadata"]["uid"].as_str().unwrap_or_default().into(),
        }
    }

    /// A virt-launcher pod of the VM on node ON (0 or 1), as KubeVirt makes one: owned by the
    /// VMI, labelled `kubevirt.io=virt-launcher`, `kubevirt.io/created-by=<VMI uid>` and the
    /// VM's own labels (`app: NAME`, which its Service selects); a migration target also
    /// `kubevirt.io/migrationJobUID`. The pod listens on TCP 2222 and 8080 (the hello
    /// workload answers its own name); READY_AFTER delays its first readiness. Waits until it
    /// runs (and is ready, unless READY_AFTER).
    pub fn launcher(&self, on: usize, migration: Option<&str>, ready_after: u32) -> Launcher {
        let name = format!("virt-launcher-{}-{}", self.name, random_suffix());
        let mut labels = json!({"app": self.name, "kubevirt.io": "virt-launcher",
            "kubevirt.io/created-by": self.uid, "vm.kubevirt.io/name": self.name});
        if let Some(m) = migration {
            labels["kubevirt.io/migrationJobUID"] = json!(m);
        }
        wire::apply(
            self.node,
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.ns, "labels": labels,
                    "ownerReferences": [{"apiVersion": "kubevirt.io/v1",
                        "kind": "VirtualMachineInstance", "name": self.name, "uid": self.uid,
                        "controller": true, "blockOwnerDeletion": true}]},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"kubernetes.io/hostname": NODE_NAMES[on]},
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65535,
                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "compute", "image": HELLO_IMAGE,
                        "imagePullPolicy": "Never", "command": ["/hello"],
                        "args": ["2222", "8080"],
                        "readinessProbe": {"exec": {"command": ["/hello", "probe", "2222"]},
                            "periodSeconds": 1, "initialDelaySeconds": ready_after},
                        "securityContext": {"allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}}}]}}),
        )
        .unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            let p = self
                .node
                .json(&["get", "pod", "-n", &self.ns, &name])
                .unwrap();
            let ready = p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let running = p["status"]["phase"] == "Running";
            if (ready_after == 0 && ready) || (ready_after > 0 && running) {
                return Launcher {
                    name,
                    uid: p["metadata"]["uid"].as_str().unwrap_or_default().into(),
                    on,
                };
            }
            assert!(
                Instant::now() < deadline,
                "{name} not ready: {}",
                p["status"]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Writes what KubeVirt writes on the VMI: it runs on node ON by its word
    /// (`status.nodeName`, the `kubevirt.io/nodeName` label), its pods are ACTIVE, and while
    /// MOVE is given (the target pod, the migration's UID) it moves there
    /// (`kubevirt.io/migrationTargetNodeName`, `status.migrationState`); `completed` says the
    /// target took over.
    pub fn status(
        &self,
        on: usize,
        active: &[&Launcher],
        moving: Option<(&Launcher, &str)>,
        completed: bool,
    ) {
        let pods: serde_json::Map<String, Value> = active
            .iter()
            .map(|l| (l.uid.clone(), json!(NODE_NAMES[l.on])))
            .collect();
        let mut status = json!({"phase": "Running", "nodeName": NODE_NAMES[on],
            "activePods": pods, "migrationState": null});
        let mut target_label = Value::Null;
        if let Some((target, uid)) = moving {
            let source = active.iter().find(|l| l.uid != target.uid);
            status["migrationState"] = json!({
                "migrationUid": uid,
                "sourceNode": source.map(|s| NODE_NAMES[s.on]),
                "sourcePod": source.map(|s| s.name.clone()),
                "targetNode": NODE_NAMES[target.on],
                "targetPod": target.name,
                "completed": completed,
            });
            if !completed {
                target_label = json!(NODE_NAMES[target.on]);
            }
        }
        let patch = |sub: &[&str], body: Value| {
            let vmi = format!("virtualmachineinstances.kubevirt.io/{}", self.name);
            let body = body.to_string();
            let mut args = vec!["patch", vmi.as_str(), "-n", &self.ns, "--type=merge", "-p"];
            args.push(&body);
            args.extend(sub);
            self.node.cluster.kubectl_ok(&args).unwrap();
        };
        patch(&["--subresource=status"], json!({"status": status}));
        patch(
            &[],
            json!({"metadata": {"labels": {
                "kubevirt.io/nodeName": NODE_NAMES[on],
                "kubevirt.io/migrationTargetNodeName": target_label}}}),
        );
    }

    /// Deletes a launcher pod (the source, once the target took over: KubeVirt's source
    /// completes and leaves the endpoints).
    pub fn remove(&self, l: &Launcher) {
        self.node
            .cluster
            .kubectl_ok(&["delete", "pod", "-n", &self.ns, &l.name, "--wait=false"])
            .unwrap();
    }
}

/// One probe of the client host: `curl IP:PORT` with a short timeout (a probe every 100 ms
/// must not wait seconds for a SYN that goes nowhere). The pod that answered.
fn probe(ip: &str, port: u16) -> Option<String> {
    let out = in_netns(CLIENT_NETNS)
        .args(["curl", "-sS", "--max-time", "0.5"])
        .arg(format!("http://{ip}:{port}/"))
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The client host probing an address every 100 ms until stopped.
pub struct Prober {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<(Instant, Option<String>)>>,
}

/// What the prober saw: (when the probe began, who answered).
pub struct Probes(pub Vec<(Instant, Option<String>)>);

impl Prober {
    pub fn start(ip: &str, port: u16) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, ip) = (stop.clone(), ip.to_string());
        let handle = std::thread::spawn(move || {
            let mut seen = Vec::new();
            // Bounded: stops when told, or after ten minutes whatever happens.
            let t0 = Instant::now();
            while !s.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(600) {
                let at = Instant::now();
                seen.push((at, probe(&ip, port)));
                std::thread::sleep(Duration::from_millis(100).saturating_sub(at.elapsed()));
            }
            seen
        });
        Prober { stop, handle }
    }

    /// Stops probing; what was seen.
    pub fn stop(self) -> Probes {
        self.stop.store(true, Ordering::Relaxed);
        Probes(self.handle.join().unwrap_or_default())
    }
}

impl Probes {
    fn within(
        &self,
        from: Instant,
        to: Instant,
    ) -> impl Iterator<Item = &(Instant, Option<String>)> {
        self.0.iter().filter(move |(t, _)| *t >= from && *t < to)
    }

    /// (probes, failed) between FROM and TO.
    pub fn failed(&self, from: Instant, to: Instant) -> (usize, usize) {
        let all: Vec<_> = self.within(from, to).collect();
        let failed = all.iter().filter(|(_, who)| who.is_none()).count();
        (all.len(), failed)
    }

    /// The longest run of failed probes between FROM and TO: from the first failed probe's
    /// start to the next answered one's.
    pub fn longest_outage(&self, from: Instant, to: Instant) -> Duration {
        let mut longest = Duration::ZERO;
        let mut since: Option<Instant> = None;
        for (t, who) in self.within(from, to) {
            match (who, since) {
                (None, None) => since = Some(*t),
                (Some(_), Some(s)) => {
                    longest = longest.max(*t - s);
                    since = None;
                }
                _ => {}
            }
        }
        if let Some(s) = since {
            longest = longest.max(to - s);
        }
        longest
    }

    /// When a probe after FROM was first answered by WHO.
    pub fn first_answer_by(&self, who: &str, from: Instant) -> Option<Instant> {
        self.0
            .iter()
            .find(|(t, w)| *t >= from && w.as_deref() == Some(who))
            .map(|(t, _)| *t)
    }

    /// Every answer came from one of PODS.
    pub fn only_from(&self, pods: &[&str]) -> Result<(), String> {
        match self
            .0
            .iter()
            .find_map(|(_, w)| w.as_deref().filter(|w| !pods.contains(w)))
        {
            Some(w) => Err(format!("answered by {w}, not by {pods:?}")),
            None => Ok(()),
        }
    }
}

/// One span of the address's history for a Service: whether it is still open, and the
/// nodes it records its workload on, in order.
#[derive(Debug)]
pub struct Span {
    pub open: bool,
    pub nodes: Vec<String>,
}

/// The Service spans the address's history holds for Service NS/NAME.
pub fn spans_of(node: &Node, ip: &str, ns: &str, name: &str) -> Vec<Span> {
    let a = address_object(node, ip).unwrap_or_default();
    a["status"]["attachmentHistory"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["namespace"] == ns && s["name"] == name)
        .map(|s| Span {
            open: s["until"].is_null(),
            nodes: s["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["node"].as_str().map(str::to_string))
                .collect(),
        })
        .collect()
}

/// The history holds one open span of the VM's Service, which records the move from node 1
/// to node 2.
fn one_holding_moved(node: &Node, ip: &str, ns: &str) {
    let spans = spans_of(node, ip, ns, "vm");
    assert_eq!(spans.len(), 1, "one holding through the move: {spans:?}");
    assert!(spans[0].open, "still open: {spans:?}");
    assert_eq!(
        spans[0].nodes,
        [NODE_NAMES[0], NODE_NAMES[1]],
        "the holding records the move: {spans:?}"
    );
}

/// The address the Service shows (`status.loadBalancer.ingress`), and whether the ledger
/// lists it as the address's holder.
fn pinned(node: &Node, ip: &str, ns: &str, name: &str) -> (bool, bool) {
    let s = node
        .json(&["get", "service", "-n", ns, name])
        .unwrap_or_default();
    let shown = s["status"]["loadBalancer"]["ingress"]
        .as_array()
        .is_some_and(|i| i.iter().any(|x| x["ip"] == ip));
    let a = address_object(node, ip).unwrap_or_default();
    let ledger = a["status"]["attachments"]
        .as_array()
        .is_some_and(|h| h.iter().any(|x| x["namespace"] == ns && x["name"] == name));
    (shown, ledger)
}

/// The tenant's VM `vm` with a whole address of W's class, its one launcher on node 1
/// answering at it. (the VM, its launcher, the address)
async fn vm_with_address<'a>(
    node: &'a Node,
    w: &World,
    driver: Driver,
) -> (Vm<'a>, Launcher, String) {
    assert!(
        wire::cozy_proxy(node),
        "cozy-proxy runs (the harness skips this test without its source)"
    );
    install_vmi_crd(node);
    let t = &w.tenant.name;
    let vm = Vm::create(node, t, "vm");
    let source = vm.launcher(0, None, 0);
    vm.status(0, &[&source], None, false);
    w.create_claim("vm", json!({})).await;
    vm_service(node, t, "vm", "vm", "vm", Method::WholeIp, driver.spec()).unwrap();
    let ip = w.bound("vm").await;
    until_answered(&ip, 2222, std::slice::from_ref(&source.name), WAIT);
    until_condition(node, t, "vm", "True", "Attached").await;
    (vm, source, ip)
}

/// The tenant's VM with its address ([`vm_with_address`]), probed from the client host;
/// then the move begins as KubeVirt begins it: the target pod on node 2 (Ready READY_AFTER
/// seconds after it starts) and the VMI listing both pods, labelled with the target node.
/// (the VM, the source, the target, the migration's UID, the address, the prober)
async fn begin_move<'a>(
    node: &'a Node,
    w: &World,
    driver: Driver,
    ready_after: u32,
) -> (Vm<'a>, Launcher, Launcher, String, String, Prober) {
    let (vm, source, ip) = vm_with_address(node, w, driver).await;
    let probes = Prober::start(&ip, 2222);
    std::thread::sleep(Duration::from_secs(1));
    let migration = format!("mig-{}", random_suffix());
    let target = vm.launcher(1, Some(&migration), ready_after);
    vm.status(0, &[&source, &target], Some((&target, &migration)), false);
    (vm, source, target, migration, ip, probes)
}

/// The target took over: KubeVirt says so on the VMI, and the source leaves.
fn take_over(vm: &Vm<'_>, source: &Launcher, target: &Launcher, migration: &str) {
    vm.status(
        target.on,
        &[source, target],
        Some((target, migration)),
        true,
    );
    vm.status(target.on, &[target], None, true);
    vm.remove(source);
}

/// Both pods Ready, another IP (KubeVirt's masquerade binding): the target on node 2 Ready
/// beside the source for 10 s, then the target takes over and the source goes. The address
/// stays on the Service throughout (`Migrating`), no probe fails while both are Ready, and
/// the outage after the source goes is short; the history keeps one span.
pub async fn both_ready_another_ip(node: &'static Node, driver: Driver, cidr: &str, label: &str) {
    let w = World::new(node, driver, &[cidr]).await;
    let t = w.tenant.name.clone();
    let (vm, source, target, migration, ip, probes) = begin_move(node, &w, driver, 0).await;
    let both = Instant::now();
    let m = until_condition(node, &t, "vm", "True", "Migrating").await;
    assert!(m.contains("is moving"), "{m}");
    // Both Ready for 10 s, as a migration's memory copy takes; which node the client
    // reaches (MetalLB's announcer) is noted.
    let mut announced = std::collections::BTreeSet::new();
    while both.elapsed() < Duration::from_secs(10) {
        let (shown, ledger) = pinned(node, &ip, &t, "vm");
        assert!(shown && ledger, "{ip} left the Service while the VM moves");
        if let Some(n) = wire::announcer(&ip) {
            announced.insert(n + 1);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let handover = Instant::now();
    take_over(&vm, &source, &target, &migration);
    let gone = Instant::now();
    until_condition(node, &t, "vm", "True", "Attached").await;
    // Answered by the target for 2 s: enough seen.
    let deadline = Instant::now() + WAIT;
    while !target_answers_for(&ip, &target.name, Duration::from_secs(2)) {
        assert!(
            Instant::now() < deadline,
            "{ip} not answering from the target"
        );
    }
    let end = Instant::now();
    let probes = probes.stop();
    probes
        .only_from(&[&source.name, &target.name])
        .unwrap_or_else(|e| panic!("{e}"));
    let (n_both, failed_both) = probes.failed(both, handover);
    let (n_after, failed_after) = probes.failed(gone, end);
    let outage = probes.longest_outage(gone, end);
    let first = probes
        .first_answer_by(&target.name, both)
        .map(|t| t.saturating_duration_since(both).as_secs_f64());
    figure(&format!(
        "VM live migration ({label}), both Ready, another IP: {failed_both} of {n_both} probes failed while both were Ready (10 s; the client reached node(s) {announced:?}); after the source went: {failed_after} of {n_after} failed, longest outage {:.2}s; first answer from the target {} s after it was Ready",
        outage.as_secs_f64(),
        first.map_or("never".to_string(), |f| format!("{f:.2}"))
    ));
    assert_eq!(failed_both, 0, "probes failed while both pods were Ready");
    assert!(
        outage < Duration::from_secs(2),
        "{ip} out for {outage:?} after the source went"
    );
    one_holding_moved(node, &ip, &t);
    w.check(node).await;
}

/// Whether IP answers from WHO on every probe for FOR (a probe every 100 ms).
fn target_answers_for(ip: &str, who: &str, d: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        if probe(ip, 2222).as_deref() != Some(who) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// Neither pod Ready for 3 s between source and target (the window ovn-kubernetes saw): the
/// source leaves before the target is Ready. The pin stays on the Service and in the ledger
/// throughout; what cozy-proxy does meanwhile is measured.
pub async fn neither_ready(node: &'static Node, driver: Driver, cidr: &str, label: &str) {
    let w = World::new(node, driver, &[cidr]).await;
    let t = w.tenant.name.clone();
    // The target is Ready 3 s after it starts.
    let (vm, source, target, migration, ip, probes) = begin_move(node, &w, driver, 3).await;
    let t0 = Instant::now();
    take_over(&vm, &source, &target, &migration);
    let mut lost = 0;
    let mut samples = 0;
    while probe(&ip, 2222).as_deref() != Some(target.name.as_str()) {
        let (shown, ledger) = pinned(node, &ip, &t, "vm");
        samples += 1;
        if !(shown && ledger) {
            lost += 1;
        }
        assert!(t0.elapsed() < WAIT, "{ip} never answered from the target");
    }
    let end = Instant::now();
    let probes = probes.stop();
    let (n, failed) = probes.failed(t0, end);
    figure(&format!(
        "VM live migration ({label}), neither pod Ready for 3 s: the pin off the Service or the ledger in {lost} of {samples} samples; {failed} of {n} probes failed, longest outage {:.2}s (cozy-proxy drops the mapping while no endpoint is ready)",
        probes.longest_outage(t0, end).as_secs_f64()
    ));
    assert_eq!(
        lost, 0,
        "the address left the Service while no pod was Ready"
    );
    assert_eq!(
        attached_condition(node, &t, "vm").map(|c| c.0).as_deref(),
        Some("True")
    );
    w.check(node).await;
}

/// Two different workloads behind one whole-IP Service: the VM and a pod that is not its
/// (another Deployment's, with the same labels). The address stays for the hold-down
/// (`HeldDown`), then the Service is refused (`MultipleEndpoints`) and the address leaves
/// it; the second workload gone, it comes back.
pub async fn two_workloads(node: &'static Node, driver: Driver, cidr: &str, label: &str) {
    let w = World::new(node, driver, &[cidr]).await;
    let t = w.tenant.name.clone();
    let (_vm, source, ip) = vm_with_address(node, &w, driver).await;
    let other = wire::vm_workload(node, &t, "other", 1, &["2222", "8080"]).unwrap();
    node.cluster
        .kubectl_ok(&["label", "pod", "-n", &t, &other[0], "app=vm", "--overwrite"])
        .unwrap();
    let t0 = Instant::now();
    until_condition(node, &t, "vm", "True", "HeldDown").await;
    let m = until_condition(node, &t, "vm", "False", "MultipleEndpoints").await;
    let held = t0.elapsed();
    assert!(m.contains("2 workloads"), "{m}");
    figure(&format!(
        "VM Service ({label}), a second workload behind it: the address kept {:.1}s (hold-down {} s), then refused MultipleEndpoints",
        held.as_secs_f64(),
        address_controller_api::kubevirt::MULTIPLE_WORKLOADS_HOLD_DOWN.as_secs()
    ));
    assert!(
        held >= address_controller_api::kubevirt::MULTIPLE_WORKLOADS_HOLD_DOWN
            - Duration::from_secs(2),
        "refused after {held:?}, before the hold-down"
    );
    let deadline = Instant::now() + WAIT;
    while pinned(node, &ip, &t, "vm").0 {
        assert!(
            Instant::now() < deadline,
            "{ip} still on the refused Service"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The other workload leaves (its Deployment removed): the VM's again.
    node.cluster
        .kubectl_ok(&["delete", "deployment", "-n", &t, "other", "--wait=false"])
        .unwrap();
    node.cluster
        .kubectl_ok(&["delete", "pod", "-n", &t, &other[0], "--wait=false"])
        .unwrap();
    until_condition(node, &t, "vm", "True", "Attached").await;
    until_answered(&ip, 2222, std::slice::from_ref(&source.name), WAIT);
    w.check(node).await;
}

/// A drain of the VM's node, as the platform drains: `kubectl drain` is refused eviction by
/// the VMI's PodDisruptionBudget until KubeVirt has moved the VM (here: the move played when
/// the node is cordoned), then evicts the source. The address answers from the other node;
/// the history shows one holding through the move.
pub async fn drain(node: &'static Node, driver: Driver, cidr: &str, label: &str) {
    let w = World::new(node, driver, &[cidr]).await;
    let t = w.tenant.name.clone();
    let (vm, source, ip) = vm_with_address(node, &w, driver).await;
    // KubeVirt's PodDisruptionBudget of a VMI with evictionStrategy LiveMigrate.
    wire::apply(
        node,
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": format!("kubevirt-disruption-budget-{}", random_suffix()),
                "namespace": t,
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance", "name": vm.name, "uid": vm.uid,
                    "controller": true}]},
            "spec": {"minAvailable": 1,
                "selector": {"matchLabels": {"kubevirt.io/created-by": vm.uid}}}}),
    )
    .unwrap();
    let probes = Prober::start(&ip, 2222);
    std::thread::sleep(Duration::from_secs(1));
    let _uncordon = Uncordon(node, 0);
    let t0 = Instant::now();
    let mut drain: Child = node
        .cluster
        .kubectl()
        .args([
            "drain",
            NODE_NAMES[0],
            "--pod-selector",
            &format!("kubevirt.io/created-by={}", vm.uid),
            "--ignore-daemonsets",
            "--timeout=120s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // KubeVirt sees the node cordoned (its eviction refused) and moves the VM.
    let deadline = Instant::now() + WAIT;
    while node.json(&["get", "node", NODE_NAMES[0]]).unwrap()["spec"]["unschedulable"] != true {
        assert!(
            Instant::now() < deadline,
            "the drain did not cordon the node"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let migration = format!("mig-{}", random_suffix());
    let target = vm.launcher(1, Some(&migration), 0);
    vm.status(0, &[&source, &target], Some((&target, &migration)), false);
    until_condition(node, &t, "vm", "True", "Migrating").await;
    vm.status(1, &[&source, &target], Some((&target, &migration)), true);
    // The drain evicts the source now that the budget allows it.
    let st = drain.wait().unwrap();
    assert!(st.success(), "kubectl drain {} failed", NODE_NAMES[0]);
    let drained = t0.elapsed();
    vm.status(1, &[&target], None, true);
    until_condition(node, &t, "vm", "True", "Attached").await;
    let deadline = Instant::now() + WAIT;
    while !target_answers_for(&ip, &target.name, Duration::from_secs(2)) {
        assert!(Instant::now() < deadline, "{ip} not answering from node 2");
    }
    let end = Instant::now();
    let probes = probes.stop();
    probes
        .only_from(&[&source.name, &target.name])
        .unwrap_or_else(|e| panic!("{e}"));
    let (n, failed) = probes.failed(t0, end);
    figure(&format!(
        "VM live migration ({label}), kubectl drain of its node: drained in {:.1}s; {failed} of {n} probes failed, longest outage {:.2}s",
        drained.as_secs_f64(),
        probes.longest_outage(t0, end).as_secs_f64()
    ));
    one_holding_moved(node, &ip, &t);
    w.check(node).await;
}

/// The Endpoints of a selector-less VM Service as kube-ovn's keep-IP option leaves them
/// during a move: one IP — the VM's, which it keeps — on each node whose launcher pod runs
/// it. The EndpointSlice mirroring controller writes the EndpointSlices from them (they
/// carry cozy-proxy's label, as the Service's own slices would); cozy-proxy reads them.
fn keep_ip_endpoints(node: &Node, vm: &Vm<'_>, ip: &str, on: &[&Launcher]) {
    let addresses: Vec<Value> = on
        .iter()
        .map(|l| {
            json!({"ip": ip, "nodeName": NODE_NAMES[l.on],
                "targetRef": {"kind": "Pod", "namespace": vm.ns, "name": l.name, "uid": l.uid}})
        })
        .collect();
    wire::apply(
        node,
        &json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": vm.name, "namespace": vm.ns,
                "labels": {"service.kubernetes.io/service-proxy-name": "cozy-proxy"}},
            "subsets": [{"addresses": addresses,
                "ports": [{"name": "placeholder", "port": 65535, "protocol": "TCP"}]}]}),
    )
    .unwrap();
}

/// Both pods Ready with the same IP (the platform's kube-ovn with its keep-VM-IP option;
/// emulated with a selector-less Service whose Endpoints list the VM's one IP on both
/// nodes — the node tier's CNI cannot give two pods one IP, so the source pod keeps
/// answering for the VM's IP and only the endpoints say where it runs): the address stays
/// (`Migrating`), and when the VMI names the target's node and the source's endpoint goes,
/// MetalLB announces the address from that node — the address follows the node the VMI
/// names — and the history records the move. Probes lost are reported, not judged: from
/// node 2 the emulated IP is across nodes, which cozy-proxy does not forward.
pub async fn both_ready_same_ip(node: &'static Node, cidr: &str) {
    assert!(
        wire::cozy_proxy(node),
        "cozy-proxy runs (the harness skips this test without its source)"
    );
    install_vmi_crd(node);
    let w = World::new(node, Driver::MetalLb, &[cidr]).await;
    let t = w.tenant.name.clone();
    let vm = Vm::create(node, &t, "vm");
    let source = vm.launcher(0, None, 0);
    vm.status(0, &[&source], None, false);
    let vm_ip = crate::node::pod_ip(&node.json(&["get", "pod", "-n", &t, &source.name]).unwrap());
    keep_ip_endpoints(node, &vm, &vm_ip, &[&source]);
    w.create_claim("vm", json!({})).await;
    vm_service(
        node,
        &t,
        "vm",
        "vm",
        "vm",
        Method::WholeIp,
        json!({"selector": null}),
    )
    .unwrap();
    let ip = w.bound("vm").await;
    let slices = node
        .cluster
        .kubectl_ok(&[
            "get",
            "endpointslices",
            "-n",
            &t,
            "--show-labels",
            "-o",
            "wide",
        ])
        .unwrap_or_default();
    println!("the mirrored slices:\n{slices}");
    until_condition(node, &t, "vm", "True", "Attached").await;
    until_answered(&ip, 2222, std::slice::from_ref(&source.name), WAIT);
    let probes = Prober::start(&ip, 2222);
    std::thread::sleep(Duration::from_secs(1));
    let before = wire::announcer(&ip);
    let migration = format!("mig-{}", random_suffix());
    let target = vm.launcher(1, Some(&migration), 0);
    keep_ip_endpoints(node, &vm, &vm_ip, &[&source, &target]);
    vm.status(0, &[&source, &target], Some((&target, &migration)), false);
    let both = Instant::now();
    let m = until_condition(node, &t, "vm", "True", "Migrating").await;
    assert!(
        m.contains(NODE_NAMES[0]) && m.contains(NODE_NAMES[1]),
        "{m}"
    );
    while both.elapsed() < Duration::from_secs(5) {
        let (shown, ledger) = pinned(node, &ip, &t, "vm");
        assert!(shown && ledger, "{ip} left the Service while the VM moves");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The target takes over: the VMI names node 2, the source's endpoint goes.
    let handover = Instant::now();
    vm.status(1, &[&source, &target], Some((&target, &migration)), true);
    keep_ip_endpoints(node, &vm, &vm_ip, &[&target]);
    vm.status(1, &[&target], None, true);
    let deadline = Instant::now() + WAIT;
    while wire::announcer(&ip) != Some(1) {
        assert!(
            Instant::now() < deadline,
            "{ip} still announced from node {:?}, not from the node the VMI names",
            wire::announcer(&ip).map(|n| n + 1)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let followed = handover.elapsed();
    // Three seconds more of probes. Answers are not expected: the emulated VM's IP stays
    // on node 1 (where kube-ovn would have moved it to node 2), and cozy-proxy's stateless
    // NAT does not carry a connection across nodes — what they say is reported.
    std::thread::sleep(Duration::from_secs(3));
    let end = Instant::now();
    let probes = probes.stop();
    let (n_both, failed_both) = probes.failed(both, handover);
    let (n_after, failed_after) = probes.failed(handover, end);
    figure(&format!(
        "VM live migration (metallb l2), both Ready, the same IP (keep-IP, emulated): {failed_both} of {n_both} probes failed while both were Ready (the client reached node {:?} before); the VMI named node 2 → announced from node 2 in {:.2}s; then {failed_after} of {n_after} probes failed (the emulated IP stays on node 1: cozy-proxy on node 2 forwards across nodes)",
        before.map(|n| n + 1),
        followed.as_secs_f64(),
    ));
    // Probes are reported, not judged, here: while both are Ready MetalLB may announce from
    // either node (both have an endpoint), and from node 2 the emulated IP is across nodes.
    until_condition(node, &t, "vm", "True", "Attached").await;
    one_holding_moved(node, &ip, &t);
    w.check(node).await;
}
