//! Two nodes on one segment (`cluster.sh up --nodes 2`): a claimed address follows its
//! pods from one node to the other, as the platform's everyday Layer 2 failover does —
//! the tenant's pod rescheduled (cordon + delete), its node drained, a node unplugged from
//! the segment. Each node has its own kubelet, kube-proxy and MetalLB speaker, the two
//! speakers in one memberlist cluster as MetalLB runs them. The client host is on the
//! segment (a bridge, the switch); the answer must come from the tenant's pods, and for
//! MetalLB's addresses from the node its speaker announces — the client's neighbour entry
//! says which. Root only (the node tier); without root every test here is reported
//! ignored, with the reason, never passed. Figures go to target/node-figures.txt.

#![allow(clippy::unwrap_used)]

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use address_controller_tests::migration;
use address_controller_tests::node::{self, NODE_NAMES, Node, Uncordon, figure};
use address_controller_tests::wire::{
    CLIENT_NETNS, Driver, World, announcer, claim_annotation, curl, in_netns, service,
    until_answered, workload, workload_spread,
};
use serde_json::json;

/// How long the address may take to answer from the other node (a bound, not a target:
/// the figures say how long it took).
const MOVE: Duration = Duration::from_secs(90);

fn kubectl(node: &Node, args: &[&str]) {
    node.cluster.kubectl_ok(args).unwrap();
}

/// The node a pod runs on.
fn node_of(node: &Node, ns: &str, pod: &str) -> String {
    let p = node.json(&["get", "pod", "-n", ns, pod]).unwrap();
    p["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Plugs node I's cable into the segment's switch, or pulls it (its port on the client's
/// bridge, `acw-port<I+1>`, up or down): the node, its speaker and memberlist lose the
/// segment — the client, the other node — and nothing on the node itself is told.
fn cable(i: usize, plugged: bool) {
    let st = in_netns(CLIENT_NETNS)
        .args(["ip", "link", "set", &format!("acw-port{}", i + 1)])
        .arg(if plugged { "up" } else { "down" })
        .status()
        .unwrap();
    assert!(st.success(), "ip link set acw-port{} failed", i + 1);
}

/// How a pod leaves its node.
#[derive(Clone, Copy)]
enum Leave {
    /// `kubectl cordon` and `kubectl delete pod`: the Deployment makes another, elsewhere.
    CordonDelete,
    /// `kubectl drain --pod-selector app=APP` (cordons, evicts through the Eviction API).
    Drain,
}

impl Leave {
    fn label(self) -> &'static str {
        match self {
            Leave::CordonDelete => "cordon + delete",
            Leave::Drain => "drain",
        }
    }
}

/// The one pod of `app: APP` in NS (on node FROM) leaves its node as LEAVE says; polls IP:80
/// from the client until a new pod of APP answers. Returns the new pod, the time from the
/// first step to its first answer, and the probes that failed meanwhile. Any answer from
/// anyone but the pods of APP fails the test; the old pod may answer while it terminates.
fn leave(
    node: &Node,
    ns: &str,
    app: &str,
    old: &str,
    from: usize,
    how: Leave,
    ip: &str,
) -> (String, Duration, u32) {
    let t0 = Instant::now();
    let _uncordon = Uncordon(node, from);
    let mut drain: Option<Child> = None;
    match how {
        Leave::CordonDelete => {
            kubectl(node, &["cordon", NODE_NAMES[from]]);
            kubectl(node, &["delete", "pod", "-n", ns, old, "--wait=false"]);
        }
        Leave::Drain => {
            drain = Some(
                node.cluster
                    .kubectl()
                    .args([
                        "drain",
                        NODE_NAMES[from],
                        "--pod-selector",
                        &format!("app={app}"),
                        "--ignore-daemonsets",
                        "--delete-emptydir-data",
                        "--timeout=90s",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
    }
    let prefix = format!("{app}-");
    let mut failed = 0u32;
    let (new, took) = loop {
        match curl(ip, 80) {
            Ok(who) if who == old => {}
            Ok(who) if who.starts_with(&prefix) => break (who, t0.elapsed()),
            Ok(who) => panic!("{ip} answered from {who:?}, not from the pods of {app}"),
            Err(_) => failed += 1,
        }
        assert!(
            t0.elapsed() < MOVE,
            "{ip} not answering from a new pod of {app} {MOVE:?} after its pod left {} ({})",
            NODE_NAMES[from],
            how.label()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Some(mut d) = drain {
        let st = d.wait().unwrap();
        assert!(st.success(), "kubectl drain {} failed", NODE_NAMES[from]);
    }
    (new, took, failed)
}

/// A claim `web` of W's class on a Service `web` (SPEC's fields on top) of the workload
/// PODS: waits until the address answers from them; the address.
async fn claimed(node: &Node, w: &World, pods: &[String], spec: serde_json::Value) -> String {
    let t = &w.tenant.name;
    w.create_claim("web", json!({})).await;
    service(node, t, "web", "web", claim_annotation("web"), spec).unwrap();
    let ip = w.bound("web").await;
    until_answered(&ip, 80, pods, MOVE);
    ip
}

/// One pod of `app: web` in W's tenant, on node 1 (node 2 cordoned while it is scheduled).
fn one_pod_on_node1(node: &Node, w: &World) -> Vec<String> {
    kubectl(node, &["cordon", NODE_NAMES[1]]);
    let pods = {
        let _uncordon = Uncordon(node, 1);
        workload(node, &w.tenant.name, "web", 1).unwrap()
    };
    assert_eq!(node_of(node, &w.tenant.name, &pods[0]), NODE_NAMES[0]);
    pods
}

/// MetalLB (L2, `externalTrafficPolicy: Local`): the tenant's one pod moves from node 1 to
/// node 2 (cordon + delete), then back (a drain). Each time the address answers from the new
/// pod, announced by the speaker of its node (the client's neighbour entry is that node's
/// MAC): with Local, only a node with a ready endpoint may announce.
async fn metallb_follows(node: &'static Node) {
    let w = World::new(node, Driver::MetalLb, &["192.0.2.64/28"]).await;
    let t = &w.tenant.name;
    let pods = one_pod_on_node1(node, &w);
    let ip = claimed(node, &w, &pods, json!({"externalTrafficPolicy": "Local"})).await;
    assert_eq!(
        announcer(&ip),
        Some(0),
        "node 1 announces {ip} (its pod is there)"
    );

    let mut old = pods[0].clone();
    for (from, how) in [(0, Leave::CordonDelete), (1, Leave::Drain)] {
        let to = 1 - from;
        let (new, took, failed) = leave(node, t, "web", &old, from, how, &ip);
        assert_eq!(
            node_of(node, t, &new),
            NODE_NAMES[to],
            "{new} runs on the other node"
        );
        // The answer came through the new node: its speaker announces the address now.
        let deadline = Instant::now() + Duration::from_secs(10);
        while announcer(&ip) != Some(to) {
            assert!(
                Instant::now() < deadline,
                "the client still reaches {ip} at {:?}'s MAC, not node {}'s",
                announcer(&ip),
                to + 1
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        figure(&format!(
            "two nodes, metallb l2 (Local): pod moved node {} → node {} ({}) → {ip} answering from node {}: {:.2}s, {failed} probes failed meanwhile",
            from + 1,
            to + 1,
            how.label(),
            to + 1,
            took.as_secs_f64()
        ));
        old = new;
    }
    w.check(node).await;
}

/// The range driver (`externalTrafficPolicy: Cluster`; the client routes the range to node
/// 1): the tenant's pod moves to node 2, and node 1's kube-proxy sends the address's
/// packets across to it.
async fn range_follows(node: &'static Node) {
    let w = World::new(node, Driver::Range, &["198.51.100.64/28"]).await;
    let t = &w.tenant.name;
    let pods = one_pod_on_node1(node, &w);
    let ip = claimed(node, &w, &pods, Driver::Range.spec()).await;
    let (new, took, failed) = leave(node, t, "web", &pods[0], 0, Leave::CordonDelete, &ip);
    assert_eq!(node_of(node, t, &new), NODE_NAMES[1]);
    figure(&format!(
        "two nodes, range routed (Cluster, via node 1): pod moved node 1 → node 2 (cordon + delete) → {ip} answering across: {:.2}s, {failed} probes failed meanwhile",
        took.as_secs_f64()
    ));
    w.check(node).await;
}

/// MetalLB (L2, Local, a pod on each node): the announcing node is unplugged from the
/// segment. The other speaker learns it from memberlist (nobody tells it through the API:
/// the node is still Ready there) and announces the address; the client's answers come from
/// the other node's pod. Plugged back, the address keeps answering from a rightful pod.
async fn metallb_node_lost(node: &'static Node) {
    let w = World::new(node, Driver::MetalLb, &["192.0.2.80/28"]).await;
    let t = &w.tenant.name;
    let pods = workload_spread(node, t, "web", 2).unwrap();
    let ip = claimed(node, &w, &pods, json!({"externalTrafficPolicy": "Local"})).await;
    let lost = announcer(&ip).expect("the client has the announcing node's MAC");
    let other = 1 - lost;
    let theirs: Vec<String> = pods
        .iter()
        .filter(|p| node_of(node, t, p) == NODE_NAMES[other])
        .cloned()
        .collect();
    assert_eq!(theirs.len(), 1, "one pod on each node: {pods:?}");

    let t0 = Instant::now();
    cable(lost, false);
    let mut failed = 0u32;
    let took = loop {
        match curl(&ip, 80) {
            Ok(who) if who == theirs[0] && announcer(&ip) == Some(other) => break t0.elapsed(),
            Ok(who) if pods.contains(&who) => {}
            Ok(who) => {
                cable(lost, true);
                panic!("{ip} answered from {who:?}, not from the tenant's pods");
            }
            Err(_) => failed += 1,
        }
        if t0.elapsed() > MOVE {
            cable(lost, true);
            panic!(
                "{ip} not answering from node {} {MOVE:?} after node {} was unplugged",
                other + 1,
                lost + 1
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    figure(&format!(
        "two nodes, metallb l2 (Local, a pod on each): announcing node {} unplugged → {ip} answering from node {}: {:.2}s (memberlist), {failed} probes failed meanwhile",
        lost + 1,
        other + 1,
        took.as_secs_f64()
    ));
    cable(lost, true);
    // Back on the segment, both speakers may answer ARP until memberlist joins them again
    // (MetalLB rejoins every minute): either node has a pod, so every answer is rightful.
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(5) {
        if let Ok(who) = curl(&ip, 80) {
            assert!(
                pods.contains(&who),
                "{ip} answered from {who:?} after the replug"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    w.check(node).await;
}

fn a_metallb_address_follows_its_pod_to_the_other_node_and_back() {
    node::run(metallb_follows);
}
fn a_range_address_reaches_its_pod_on_the_other_node() {
    node::run(range_follows);
}
fn the_announcing_node_unplugged_the_other_node_answers() {
    node::run(metallb_node_lost);
}

fn a_vm_keeps_its_address_while_both_pods_are_ready() {
    node::run(|n| {
        migration::both_ready_another_ip(n, Driver::MetalLb, "192.0.2.96/28", "metallb l2")
    });
}
fn a_vm_keeps_its_address_while_neither_pod_is_ready() {
    node::run(|n| migration::neither_ready(n, Driver::MetalLb, "192.0.2.112/28", "metallb l2"));
}
fn two_workloads_behind_a_vm_service_are_refused_after_the_hold_down() {
    node::run(|n| migration::two_workloads(n, Driver::MetalLb, "192.0.2.128/28", "metallb l2"));
}
fn a_drain_moves_the_vm_and_its_address_answers_from_the_other_node() {
    node::run(|n| migration::drain(n, Driver::MetalLb, "192.0.2.144/28", "metallb l2"));
}

fn a_vm_with_one_ip_on_two_nodes_keeps_its_address_and_follows_the_vmi() {
    node::run(|n| migration::both_ready_same_ip(n, "192.0.2.160/28"));
}
fn the_wire_under_day_two_churn() {
    node::run(address_controller_tests::wire_churn::wire_churn);
}

fn main() {
    node::main_on_nodes(
        2,
        vec![
            (
                "the_wire_under_day_two_churn",
                the_wire_under_day_two_churn as fn(),
            ),
            (
                "a_metallb_address_follows_its_pod_to_the_other_node_and_back",
                a_metallb_address_follows_its_pod_to_the_other_node_and_back,
            ),
            (
                "a_range_address_reaches_its_pod_on_the_other_node",
                a_range_address_reaches_its_pod_on_the_other_node,
            ),
            (
                "the_announcing_node_unplugged_the_other_node_answers",
                the_announcing_node_unplugged_the_other_node_answers,
            ),
        ],
        vec![
            (
                "a_vm_keeps_its_address_while_both_pods_are_ready",
                a_vm_keeps_its_address_while_both_pods_are_ready as fn(),
            ),
            (
                "a_vm_keeps_its_address_while_neither_pod_is_ready",
                a_vm_keeps_its_address_while_neither_pod_is_ready,
            ),
            (
                "two_workloads_behind_a_vm_service_are_refused_after_the_hold_down",
                two_workloads_behind_a_vm_service_are_refused_after_the_hold_down,
            ),
            (
                "a_drain_moves_the_vm_and_its_address_answers_from_the_other_node",
                a_drain_moves_the_vm_and_its_address_answers_from_the_other_node,
            ),
            (
                "a_vm_with_one_ip_on_two_nodes_keeps_its_address_and_follows_the_vmi",
                a_vm_with_one_ip_on_two_nodes_keeps_its_address_and_follows_the_vmi,
            ),
        ],
    );
}
