//! The wire under day-two churn (#56): N tenants' addresses probed continuously from the
//! client host while the platform does its ordinary work — leaders killed, kube-apiserver,
//! speakers and kube-proxy restarted, the chart upgraded, pods rolled, and with two nodes
//! each node drained in turn. A table of probes and failed probes per event; any answer from
//! the wrong pods fails it. Run by `tests/tests/nodes.rs` (one round in `make test`) and
//! `make chaos-wire` (AC_WIRE_CHURN_ROUNDS rounds).

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::time::{Duration, Instant};

use serde_json::json;

use crate::node::{self, NODE_NAMES, Node, figure, node_count};
use crate::wire::{self, Driver, World, claim_annotation, curl, service, until_answered};

const WAIT: Duration = Duration::from_secs(60);

fn kubectl(node: &Node, args: &[&str]) {
    node.cluster.kubectl_ok(args).unwrap();
}

/// Deletes the pod holding LEASE (as a node's eviction would) and waits until DEPLOYMENT
/// has rolled out again.
fn kill_leader(node: &Node, lease: &str, deployment: &str) {
    let leader = node.lease_holder(lease).unwrap();
    kubectl(
        node,
        &[
            "delete",
            "pod",
            "-n",
            node::NAMESPACE,
            &leader,
            "--wait=false",
        ],
    );
    node.wait_rollout(deployment, Duration::from_secs(120))
        .unwrap();
}

/// One probe of the wire: which address, when, and who answered (`None`: nobody).
struct Probe {
    at: Instant,
    ip: String,
    who: Option<String>,
}

/// Probes every address of `targets` — `(ip, port, workload)` — from the client host, one
/// after the other, until `stop`: an answer from anyone but a pod of the address's own
/// workload (a Deployment's pods are named `<workload>-…`, old and rolled alike) is recorded
/// in `wrong`.
fn probe_loop(
    targets: &[(String, u16, String)],
    stop: &std::sync::atomic::AtomicBool,
    out: &std::sync::Mutex<Vec<Probe>>,
    wrong: &std::sync::Mutex<Vec<String>>,
) {
    use std::sync::atomic::Ordering;
    while !stop.load(Ordering::Relaxed) {
        for (ip, port, workload) in targets {
            let at = Instant::now();
            let who = curl(ip, *port).ok();
            if let Some(w) = &who
                && !w.starts_with(&format!("{workload}-"))
            {
                wrong
                    .lock()
                    .unwrap()
                    .push(format!("{ip}:{port} answered from {w}"));
            }
            out.lock().unwrap().push(Probe {
                at,
                ip: ip.clone(),
                who,
            });
        }
    }
}

/// The addresses of N tenants' Services are probed continuously from the client host while
/// the platform does its day-two work, one event at a time: the core's leader killed, the
/// driver's leader killed, kube-apiserver restarted, the speaker restarted, kube-proxy
/// restarted, the chart upgraded with a changed value, the tenants' pods rolled; with two
/// nodes also the second node's speaker and kube-proxy restarted, and each node drained. Per event:
/// probes sent and failed, the longest outage; every answer from the rightful pods; the
/// invariants at the end. `AC_WIRE_CHURN_ROUNDS` repeats the sequence (`make chaos-wire`).
pub async fn wire_churn(node: &'static Node) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let rounds: usize = std::env::var("AC_WIRE_CHURN_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let w = World::new(node, Driver::MetalLb, &["192.0.2.224/28"]).await;
    let t = &w.tenant.name;
    let mut targets = Vec::new();
    for k in 0..3 {
        let name = format!("churn{k}");
        // A well-behaved workload: it keeps answering for a moment after it is told to stop,
        // until kube-proxy has forgotten it (without it, a roll cost 3 probes timing out, up
        // to 2.3 s: the old pod gone while kube-proxy still sent to it — not the address).
        let pods = wire::workload_with(
            node,
            t,
            &name,
            2,
            json!({"lifecycle": {"preStop": {"sleep": {"seconds": 3}}}}),
        )
        .unwrap();
        // And it has a PodDisruptionBudget: a drain evicts one replica at a time, the next
        // once the first is Ready elsewhere (without it, the second node's drain evicted
        // both replicas of each workload at once — 14 probes failed, 2.44 s, until the new
        // pods were Ready: the workload's gap, not the address's).
        wire::apply(
            node,
            &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": t},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}}}),
        )
        .unwrap();
        w.create_claim(&name, json!({})).await;
        service(node, t, &name, &name, claim_annotation(&name), json!({})).unwrap();
        let ip = w.bound(&name).await;
        until_answered(&ip, 80, &pods, WAIT);
        targets.push((ip, 80u16, pods, name));
    }
    let (stop, probes, wrong) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(Vec::<Probe>::new())),
        Arc::new(Mutex::new(Vec::<String>::new())),
    );
    // The rolled pods have new names, each its workload's: the prober knows the workloads.
    let rightful: Vec<(String, u16, String)> = targets
        .iter()
        .map(|(ip, port, _, name)| (ip.clone(), *port, name.clone()))
        .collect();
    let prober = {
        let (stop, probes, wrong) = (stop.clone(), probes.clone(), wrong.clone());
        std::thread::spawn(move || {
            node::enter_netns().unwrap();
            probe_loop(&rightful, &stop, &probes, &wrong);
        })
    };
    let mut rows: Vec<(String, Instant, Instant)> = Vec::new();
    let settle = |what: &str| {
        // After the event: every address answers again (bounded), then a quiet 5 s measured.
        // A rolled workload's old pods may still answer (kube-proxy catching up; their
        // preStop keeps them serving): any pod of the workload is rightful, as for the prober.
        for (ip, port, _, name) in &targets {
            if let Err(e) = wire::wait_ready_pods(node, t, name, 2) {
                panic!("after {what}: {e:#}");
            }
            wire::until_workload_answers(ip, *port, name, WAIT);
        }
    };
    for round in 0..rounds {
        type Event<'a> = (&'static str, Box<dyn Fn() + 'a>);
        let mut events: Vec<Event<'_>> = vec![
            (
                "core leader killed",
                Box::new(|| kill_leader(node, "address-controller", node::CONTROLLER)),
            ),
            (
                "MetalLB driver leader killed",
                Box::new(|| kill_leader(node, wire::METALLB_DRIVER, wire::METALLB_DRIVER)),
            ),
            (
                "kube-apiserver restarted",
                Box::new(|| wire::restart(node, "kube-apiserver")),
            ),
            (
                "MetalLB speaker restarted",
                Box::new(|| wire::restart(node, "metallb-speaker")),
            ),
            (
                "kube-proxy restarted",
                Box::new(|| wire::restart(node, "kube-proxy")),
            ),
            (
                "chart upgraded (a changed value)",
                Box::new(move || {
                    let mut v = wire::wire_values();
                    v["logLevel"] = json!(if round % 2 == 0 { "debug" } else { "info" });
                    node.helm_upgrade(&v, &[]).unwrap();
                    for d in [node::CONTROLLER, wire::METALLB_DRIVER, node::DRIVER] {
                        node.wait_rollout(d, Duration::from_secs(180)).unwrap();
                    }
                }),
            ),
            (
                "tenants' pods rolled",
                Box::new(|| {
                    for (_, _, _, name) in &targets {
                        kubectl(node, &["rollout", "restart", "deployment", "-n", t, name]);
                    }
                    for (_, _, _, name) in &targets {
                        kubectl(
                            node,
                            &[
                                "rollout",
                                "status",
                                "deployment",
                                "-n",
                                t,
                                name,
                                "--timeout=120s",
                            ],
                        );
                    }
                }),
            ),
        ];
        if node_count() == 2 {
            events.push((
                "node 2's speaker restarted",
                Box::new(|| wire::restart(node, "metallb-speaker-2")),
            ));
            events.push((
                "node 2's kube-proxy restarted",
                Box::new(|| wire::restart(node, "kube-proxy-2")),
            ));
            for (what, from) in [
                ("node 1 drained (its pods to node 2)", 0),
                ("node 2 drained (its pods to node 1)", 1),
            ] {
                events.push((
                    what,
                    Box::new(move || {
                        // A drain as an operator runs it: every pod but DaemonSets' evicted
                        // through the Eviction API (the core's PodDisruptionBudget holds one
                        // replica until the other is Ready elsewhere), then the node back.
                        kubectl(
                            node,
                            &[
                                "drain",
                                NODE_NAMES[from],
                                "--ignore-daemonsets",
                                "--delete-emptydir-data",
                                "--timeout=180s",
                            ],
                        );
                        kubectl(node, &["uncordon", NODE_NAMES[from]]);
                    }),
                ));
            }
        }
        for (what, event) in events {
            // Printed, so that a failure names the event it happened in.
            println!("churn round {round}: {what}");
            let t0 = Instant::now();
            event();
            settle(what);
            // A quiet spell after each event, measured too.
            std::thread::sleep(Duration::from_secs(3));
            rows.push((what.to_string(), t0, Instant::now()));
        }
    }
    stop.store(true, Ordering::Relaxed);
    prober.join().unwrap();
    let probes = std::mem::take(&mut *probes.lock().unwrap());
    let rate = probes.len() as f64
        / probes
            .last()
            .zip(probes.first())
            .map_or(1.0, |(l, f)| (l.at - f.at).as_secs_f64().max(1.0));
    figure(&format!(
        "wire under churn (metallb l2, {} addresses, {rounds} round(s)): {} probes at {rate:.1}/s",
        targets.len(),
        probes.len()
    ));
    let mut table =
        String::from("  event                                 probes  failed  longest outage\n");
    for (what, from, to) in &rows {
        let during: Vec<&Probe> = probes
            .iter()
            .filter(|p| p.at >= *from && p.at < *to)
            .collect();
        let failed = during.iter().filter(|p| p.who.is_none()).count();
        // The longest run of failures of one address, in time.
        let mut longest = Duration::ZERO;
        for (ip, ..) in &targets {
            let mut start: Option<Instant> = None;
            for p in during.iter().filter(|p| &p.ip == ip) {
                match (p.who.is_none(), start) {
                    (true, None) => start = Some(p.at),
                    (false, Some(s)) => {
                        longest = longest.max(p.at - s);
                        start = None;
                    }
                    _ => {}
                }
            }
            if let Some(s) = start {
                longest = longest.max(*to - s);
            }
        }
        table.push_str(&format!(
            "  {what:<37} {:>6}  {failed:>6}  {:.2}s\n",
            during.len(),
            longest.as_secs_f64()
        ));
    }
    for line in table.lines() {
        figure(line);
    }
    let wrong = std::mem::take(&mut *wrong.lock().unwrap());
    assert!(wrong.is_empty(), "answers from the wrong pods: {wrong:?}");
    w.check(node).await;
}
