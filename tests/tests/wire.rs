//! Packets reach the workload: from the client host to a claimed address, through the real
//! MetalLB speaker (L2: it answers ARP for the address with the node's MAC) or a route to
//! the node (the range driver's addresses), through the node's real kube-proxy, to a pod of
//! the Service that holds the claim — and to nobody else. Root only (the node tier);
//! without root every test here is reported ignored, with the reason, never passed.
//! Figures go to target/node-figures.txt.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use address_controller_tests::node::{self, Node, figure};
use address_controller_tests::wire::{
    self, Ask, ClientListener, Driver, Method, NODE_WIRE_IP, WAIT, World, address_object, apply,
    claim_annotation, client_flush_neighbours, client_neighbour, curl, egress_source, node_mac,
    percentile, ping, pod_ip_of, route, service, udp, until_answered, until_condition,
    until_silent, vm_service, vm_workload, workload,
};
use address_controller_tests::{random_suffix, wait_for};
use kube::api::DeleteParams;
use serde_json::json;

/// How long an address may keep answering, or stay silent, after a change (a bound, not a
/// target: the figures say how long it took).
const SETTLE: Duration = Duration::from_secs(30);

fn kubectl(node: &Node, args: &[&str]) {
    node.cluster.kubectl_ok(args).unwrap();
}

/// The journey of one claim over one driver, on the wire: claim → Service → the Service's
/// pods answer at the claimed address; the Service deleted: silent; recreated: the same
/// address answers from the new Service; a stranger's Service pinned to the address by hand
/// never receives a packet; the claim deleted under Retain: silent, and the address stays
/// held (a new claim gets another one).
async fn journey(node: &'static Node, driver: Driver, cidr: &str, label: &str) {
    let w = World::new(node, driver, &[cidr]).await;
    let t = &w.tenant.name;
    let s = &w.stranger.name;
    let pods = workload(node, t, "web", 2).unwrap();
    let strangers = workload(node, s, "thief", 1).unwrap();

    let t0 = Instant::now();
    w.create_claim("web", json!({})).await;
    service(
        node,
        t,
        "web",
        "web",
        claim_annotation("web"),
        driver.spec(),
    )
    .unwrap();
    let ip = w.bound("web").await;
    until_answered(&ip, 80, &pods, WAIT);
    figure(&format!(
        "{label}: claim and Service created → first answer at {ip}: {:.2}s",
        t0.elapsed().as_secs_f64()
    ));
    // Both of the Service's pods answer (kube-proxy balances over its endpoints).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        if let Ok(who) = curl(&ip, 80) {
            assert!(pods.contains(&who), "answer from {who}, not from {pods:?}");
            seen.insert(who);
        }
        if seen.len() == pods.len() {
            break;
        }
    }
    assert_eq!(seen.len(), pods.len(), "every pod of the Service answers");
    if let Driver::MetalLb = driver {
        // The address is on the segment: the client asked for it by ARP, and the node's
        // side of the segment answered (the speaker; the kernel owns no such address).
        assert_eq!(
            client_neighbour(&ip).as_deref(),
            Some(node_mac().as_str()),
            "the ARP answer for {ip} comes from the node's MAC"
        );
    }

    // Delete and recreate the Service: silent in the gap (never anybody else), then the
    // same address answers from the new Service.
    kubectl(node, &["delete", "service", "-n", t, "web", "--wait=true"]);
    let gap = until_silent(&ip, 80, &pods, SETTLE);
    figure(&format!(
        "{label}: Service deleted → silent: {:.2}s",
        gap.as_secs_f64()
    ));
    let t1 = Instant::now();
    service(
        node,
        t,
        "web",
        "web",
        claim_annotation("web"),
        driver.spec(),
    )
    .unwrap();
    until_answered(&ip, 80, &pods, WAIT);
    figure(&format!(
        "{label}: Service recreated → {ip} answering again: {:.2}s",
        t1.elapsed().as_secs_f64()
    ));

    // A stranger pins its own Service to the address by hand (MetalLB's annotation and the
    // Service's own field, on the driver's load-balancer class; the fence is off here): the
    // backend refuses it, the traffic stays.
    let mut pin = driver.spec();
    pin["loadBalancerIP"] = json!(ip);
    service(
        node,
        s,
        "steal",
        "thief",
        json!({"metallb.io/loadBalancerIPs": ip}),
        pin,
    )
    .unwrap();
    // MetalLB has seen it: its refusal is an event on the stranger's Service. (Over a range
    // class MetalLB has no pool to refuse from and says nothing; the range driver serves
    // only Services that name a claim.)
    let events = match driver {
        Driver::MetalLb => wait_for("MetalLB refuses the stranger's pin", WAIT, || async {
            let ev = node.cluster.kubectl_ok(&[
                "get",
                "events",
                "-n",
                s,
                "--field-selector",
                "involvedObject.name=steal",
                "-o",
                "jsonpath={range .items[*]}{.reason} {.message}{\"\\n\"}{end}",
            ])?;
            Ok(ev.contains("AllocationFailed").then_some(ev))
        })
        .await
        .unwrap(),
        Driver::Range => String::new(),
    };
    // Spaced over more than two of kube-proxy's sync periods (1 s): a status written for
    // the stranger would have reached the iptables rules within them.
    for i in 0..25 {
        let who = curl(&ip, 80).unwrap_or_else(|e| panic!("request {i} to {ip}: {e}"));
        assert!(
            pods.contains(&who),
            "request {i} to {ip} reached {who}, not the claim's Service ({pods:?}); stranger's pods {strangers:?}; events: {events}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = node.json(&["get", "service", "-n", s, "steal"]).unwrap();
    assert!(
        !status["status"].to_string().contains(&ip),
        "the stranger's Service shows {ip}: {}",
        status["status"]
    );
    kubectl(
        node,
        &["delete", "service", "-n", s, "steal", "--wait=true"],
    );

    // The claim deleted under Retain (its Service still names it): silent, held.
    w.claims()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let gone = until_silent(&ip, 80, &pods, SETTLE);
    figure(&format!(
        "{label}: claim deleted (Retain) → silent: {:.2}s",
        gone.as_secs_f64()
    ));
    let addr = wait_for("the address Released", WAIT, || async {
        Ok(address_object(node, &ip).filter(|a| a["status"]["phase"] == "Released"))
    })
    .await
    .unwrap();
    w.create_claim("next", json!({})).await;
    let next = w.bound("next").await;
    assert_ne!(next, ip, "a new claim took the Released address {ip}");
    assert_eq!(
        address_object(node, &ip).unwrap()["status"]["phase"],
        "Released",
        "{ip} stays held: {addr}"
    );
    assert!(curl(&ip, 80).is_err(), "{ip} answers after its claim went");
    w.check(node).await;
}

async fn metallb_journey(node: &'static Node) {
    journey(node, Driver::MetalLb, "192.0.2.32/28", "metallb l2").await;
}

async fn range_journey(node: &'static Node) {
    journey(node, Driver::Range, "198.51.100.32/28", "range routed").await;
}

/// The speaker and kube-proxy restarted as a kubelet restarts them: the address answers
/// again (bounds measured). The speaker stopped for good: the address falls silent for a
/// client that asks anew (the positive control: it is the speaker that answers).
async fn restarts(node: &'static Node) {
    let w = World::new(node, Driver::MetalLb, &["192.0.2.48/28"]).await;
    let t = &w.tenant.name;
    let pods = workload(node, t, "web", 1).unwrap();
    w.create_claim("web", json!({})).await;
    service(node, t, "web", "web", claim_annotation("web"), json!({})).unwrap();
    let ip = w.bound("web").await;
    until_answered(&ip, 80, &pods, WAIT);

    // The control: no speaker, no ARP answer.
    wire::kill(node, "metallb-speaker");
    client_flush_neighbours();
    until_silent(&ip, 80, &pods, SETTLE);
    assert_eq!(
        client_neighbour(&ip),
        None,
        "someone else answers ARP for {ip}"
    );

    let t0 = Instant::now();
    wire::restart(node, "metallb-speaker");
    client_flush_neighbours();
    until_answered(&ip, 80, &pods, WAIT);
    figure(&format!(
        "metallb l2: speaker restarted → {ip} answering again: {:.2}s",
        t0.elapsed().as_secs_f64()
    ));

    let t1 = Instant::now();
    wire::restart(node, "kube-proxy");
    until_answered(&ip, 80, &pods, WAIT);
    figure(&format!(
        "kube-proxy restarted → {ip} answering again: {:.2}s",
        t1.elapsed().as_secs_f64()
    ));
    // A restarted kube-proxy programs a Service created after it came back.
    kubectl(node, &["delete", "service", "-n", t, "web", "--wait=true"]);
    until_silent(&ip, 80, &pods, SETTLE);
    service(node, t, "web", "web", claim_annotation("web"), json!({})).unwrap();
    until_answered(&ip, 80, &pods, WAIT);
    w.check(node).await;
}

/// Claim created → first answer, over 20 claims, against plain MetalLB (a Service pinned
/// with `metallb.io/loadBalancerIPs` to a pool of its own, the same speaker).
async fn latency(node: &'static Node) {
    const N: usize = 20;
    let w = World::new(node, Driver::MetalLb, &["192.0.2.64/27"]).await;
    let t = &w.tenant.name;
    let pods = workload(node, t, "web", 1).unwrap();
    let mut driver = Vec::new();
    for i in 0..N {
        let name = format!("web-{i}");
        let t0 = Instant::now();
        w.create_claim(&name, json!({})).await;
        service(node, t, &name, "web", claim_annotation(&name), json!({})).unwrap();
        let ip = w.bound(&name).await;
        until_answered(&ip, 80, &pods, WAIT);
        driver.push(t0.elapsed());
    }
    // Plain MetalLB: a pool and an L2Advertisement of its own, pinned Services.
    let pool = format!("wire-plain-{}", random_suffix());
    let plain_cidr = "192.0.2.128/27";
    apply(
        node,
        &json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                "metadata": {"name": pool, "namespace": "metallb-system"},
                "spec": {"addresses": [plain_cidr], "autoAssign": false}}),
    )
    .unwrap();
    apply(
        node,
        &json!({"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
                "metadata": {"name": pool, "namespace": "metallb-system"},
                "spec": {"ipAddressPools": [pool]}}),
    )
    .unwrap();
    route(node, plain_cidr, "on-link");
    let mut plain = Vec::new();
    for i in 0..N {
        let ip = format!("192.0.2.{}", 129 + i);
        let t0 = Instant::now();
        service(
            node,
            t,
            &format!("plain-{i}"),
            "web",
            json!({"metallb.io/loadBalancerIPs": ip}),
            json!({}),
        )
        .unwrap();
        until_answered(&ip, 80, &pods, WAIT);
        plain.push(t0.elapsed());
    }
    for i in 0..N {
        let _ = node.cluster.kubectl_ok(&[
            "delete",
            "service",
            "-n",
            t,
            &format!("plain-{i}"),
            "--wait=true",
        ]);
    }
    let _ = node.cluster.kubectl_ok(&[
        "delete",
        "-n",
        "metallb-system",
        &format!("l2advertisements.metallb.io/{pool}"),
        &format!("ipaddresspools.metallb.io/{pool}"),
    ]);
    route(node, plain_cidr, "none");
    figure(&format!(
        "metallb l2, claim and Service created → first answer (n={N}): p50 {:.2}s, p95 {:.2}s",
        percentile(&driver, 50),
        percentile(&driver, 95)
    ));
    figure(&format!(
        "plain MetalLB, pinned Service created → first answer (n={N}): p50 {:.2}s, p95 {:.2}s",
        percentile(&plain, 50),
        percentile(&plain, 95)
    ));
    figure(&format!(
        "the driver's path adds (p50): {:.2}s",
        percentile(&driver, 50) - percentile(&plain, 50)
    ));
    w.check(node).await;
}

/// A Dual claim on a dual-stack Service answers on both families: over MetalLB (the IPv6
/// address asked for by NDP, answered with the node's MAC) and over the range driver (both
/// ranges routed to the node).
async fn dual_stack(node: &'static Node) {
    for (driver, cidrs, label) in [
        (
            Driver::MetalLb,
            ["192.0.2.160/28", "2001:db8:100:10::/124"],
            "metallb l2",
        ),
        (
            Driver::Range,
            ["198.51.100.160/28", "2001:db8:200:10::/124"],
            "range routed",
        ),
    ] {
        let w = World::new(node, driver, &cidrs).await;
        let t = &w.tenant.name;
        let pods = workload(node, t, "web", 2).unwrap();
        let t0 = Instant::now();
        w.create_claim("web", json!({"family": "Dual"})).await;
        let mut spec = driver.spec();
        spec["ipFamilyPolicy"] = json!("RequireDualStack");
        service(node, t, "web", "web", claim_annotation("web"), spec).unwrap();
        let ips = w.bound_all("web").await;
        assert_eq!(ips.len(), 2, "a Dual claim holds two addresses: {ips:?}");
        for ip in &ips {
            until_answered(ip, 80, &pods, WAIT);
            if let Driver::MetalLb = driver {
                assert_eq!(
                    client_neighbour(ip).as_deref(),
                    Some(node_mac().as_str()),
                    "the ARP/NDP answer for {ip} comes from the node's MAC"
                );
            }
        }
        figure(&format!(
            "{label}: Dual claim and dual-stack Service → both {ips:?} answering: {:.2}s",
            t0.elapsed().as_secs_f64()
        ));
        w.check(node).await;
    }
}

/// Two Services of two workloads share one claim's address (#42), one on :80, one on :443:
/// each port answers from its own Service's pods, never from the other's — over MetalLB (both
/// Services carry the driver's key, MetalLB's speaker announces the one address) and over the
/// range driver (kube-proxy routes each port of the one address to its Service).
async fn shared(node: &'static Node) {
    for (driver, cidr, label) in [
        (Driver::MetalLb, "192.0.2.176/28", "metallb l2"),
        (Driver::Range, "198.51.100.176/28", "range routed"),
    ] {
        let w = World::new(node, driver, &[cidr]).await;
        let t = &w.tenant.name;
        let web = workload(node, t, "web", 1).unwrap();
        let tls = workload(node, t, "tls", 1).unwrap();
        w.create_claim("shop", json!({"sharing": {"policy": "SameNamespace"}}))
            .await;
        let t0 = Instant::now();
        service(
            node,
            t,
            "web",
            "web",
            claim_annotation("shop"),
            driver.spec(),
        )
        .unwrap();
        let mut spec = driver.spec();
        spec["ports"] = json!([{"name": "https", "port": 443, "targetPort": "http"}]);
        service(node, t, "tls", "tls", claim_annotation("shop"), spec).unwrap();
        let ip = w.bound("shop").await;
        until_answered(&ip, 80, &web, WAIT);
        until_answered(&ip, 443, &tls, WAIT);
        figure(&format!(
            "{label}: two Services sharing {ip} (:80, :443) → both answering: {:.2}s",
            t0.elapsed().as_secs_f64()
        ));
        for i in 0..10 {
            let a = curl(&ip, 80).unwrap_or_else(|e| panic!("request {i} to {ip}:80: {e}"));
            assert!(web.contains(&a), ":80 reached {a}, not web's pods {web:?}");
            let b = curl(&ip, 443).unwrap_or_else(|e| panic!("request {i} to {ip}:443: {e}"));
            assert!(tls.contains(&b), ":443 reached {b}, not tls's pods {tls:?}");
        }
        // One holder deleted: its port goes silent, the other keeps answering.
        kubectl(node, &["delete", "service", "-n", t, "web", "--wait=true"]);
        until_silent(&ip, 80, &web, SETTLE);
        for i in 0..5 {
            let b = curl(&ip, 443).unwrap_or_else(|e| panic!("request {i} to {ip}:443: {e}"));
            assert!(tls.contains(&b), ":443 reached {b}, not tls's pods {tls:?}");
        }
        w.check(node).await;
    }
}

// ---- whole addresses through cozy-proxy (#55) ---------------------------------------------

/// Polls a probe from the client host until it fails (the time it took), failing after
/// TIMEOUT while it still succeeds.
fn until_refused(what: &str, timeout: Duration, probe: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    while probe() {
        assert!(
            t0.elapsed() < timeout,
            "{what} still answered after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    t0.elapsed()
}

/// A VM with a public address, as the platform renders it (cozy-proxy's label, `wholeIP`,
/// the placeholder port 65535, `externalTrafficPolicy: Local`): every port and ICMP reach
/// its pod at the claimed address, its outbound traffic leaves from it and no other pod's
/// does, the history says so, a second Service never gets the address, and detached the
/// address falls silent on every port.
async fn whole_ip(node: &'static Node, driver: Driver, cidr: &str, label: &str) {
    assert!(
        wire::cozy_proxy(node),
        "cozy-proxy runs (the harness skips this test without its source)"
    );
    let w = World::new(node, driver, &[cidr]).await;
    let t = &w.tenant.name;
    let s = &w.stranger.name;
    // The VM: a pod listening on TCP 8080, 2222, 7000 and UDP 5353, 6000 — none listed.
    let pods = vm_workload(
        node,
        t,
        "vm",
        1,
        &["8080", "2222", "7000", "u:5353", "u:6000"],
    )
    .unwrap();
    let t0 = Instant::now();
    w.create_claim("vm1", json!({})).await;
    vm_service(node, t, "vm", "vm", "vm1", Method::WholeIp, driver.spec()).unwrap();
    let ip = w.bound("vm1").await;
    until_answered(&ip, 2222, &pods, WAIT);
    figure(&format!(
        "whole IP ({label}): claim and the platform's VM Service created → first answer at an unlisted port of {ip}: {:.2}s",
        t0.elapsed().as_secs_f64()
    ));
    // Three ports it never listed (TCP and UDP), and ICMP echo.
    for port in [8080, 7000] {
        assert_eq!(curl(&ip, port).as_deref(), Ok(pods[0].as_str()), ":{port}");
    }
    for port in [5353, 6000] {
        assert_eq!(
            udp(&ip, port).as_deref(),
            Ok(pods[0].as_str()),
            "udp :{port}"
        );
    }
    assert!(ping(&ip), "ICMP echo at {ip}");
    let m = until_condition(node, t, "vm", "True", "Attached").await;
    assert!(m.contains("whole, by cozy-proxy"), "{m}");
    // Attached and quiet: no controller writes the Service any more (the other driver, which
    // does not serve it, leaves its condition alone).
    let writes = wire::writes_over(node, t, "vm", Duration::from_secs(3)).unwrap();
    figure(&format!(
        "whole IP ({label}): writes to the attached VM Service over 3 s: {writes}"
    ));
    assert!(writes <= 1, "{writes} writes to a quiet Service in 3 s");
    // The ledger: the method, and no port — the placeholder 65535 is never a port.
    let a = address_object(node, &ip).unwrap();
    let holder = &a["status"]["attachments"][0];
    assert_eq!(holder["method"], "WholeIP", "{a}");
    assert!(holder["ports"].as_array().is_none_or(Vec::is_empty), "{a}");
    let wide = node
        .cluster
        .kubectl_ok(&[
            "get",
            "ipa",
            a["metadata"]["name"].as_str().unwrap(),
            "-o",
            "wide",
        ])
        .unwrap();
    println!("{wide}");
    assert!(wide.contains("WholeIP"), "{wide}");
    if let Driver::MetalLb = driver {
        // MetalLB's books: the driver's hold never sits on the VM's placeholder.
        let hold = node
            .json(&[
                "get",
                "service",
                "-n",
                address_controller_tests::node::NAMESPACE,
                &format!("hold-{}", a["metadata"]["name"].as_str().unwrap()),
            ])
            .unwrap();
        let port = hold["spec"]["ports"][0]["port"].as_i64().unwrap();
        assert_ne!(port, 65535, "the hold took the VM's placeholder port");
    }

    // Egress: the VM's connections reach the client host from the claimed address; a pod of
    // another workload in the same namespace, and one of another namespace, from the node's.
    let listener = ClientListener::start(node, 9000).unwrap();
    let n = 20;
    let mut seen = Vec::new();
    let at = k8s_openapi::jiff::Timestamp::now();
    for _ in 0..n {
        seen.push(egress_source(Ask::ThroughAddress(&ip), &listener));
    }
    let from_claimed = seen
        .iter()
        .filter(|s| s.as_deref() == Ok(ip.as_str()))
        .count();
    figure(&format!(
        "whole IP ({label}): the VM's outbound connections seen from the claimed address: {from_claimed} of {n}"
    ));
    assert_eq!(from_claimed, n, "{seen:?}");
    workload(node, t, "plain", 1).unwrap();
    workload(node, s, "other", 1).unwrap();
    for (ns, app) in [(t, "plain"), (s, "other")] {
        let pod = pod_ip_of(node, ns, app).unwrap();
        assert_eq!(
            egress_source(Ask::FromNode(&pod), &listener).as_deref(),
            Ok(NODE_WIRE_IP),
            "{ns}/{app} leaves with the node's address, never the claim's"
        );
    }
    // Who sent traffic from the address at that instant: the claim, through its Service.
    let holders =
        std::process::Command::new(address_controller_tests::binary("address-controller"))
            .env("KUBECONFIG", &node.cluster.kubeconfig)
            .args(["holders", &ip, "--at", &at.to_string()])
            .output()
            .unwrap();
    let said = String::from_utf8_lossy(&holders.stdout);
    println!("{said}");
    assert!(holders.status.success(), "{said}");
    assert!(
        said.contains("vm1") && said.contains("/vm (egress)"),
        "{said}"
    );

    // A second Service naming the claim — port 80, the same pods — is refused, whatever the
    // claim's sharing, and never shows the address.
    let mut spec = driver.spec();
    spec["externalTrafficPolicy"] = json!("Local");
    service(node, t, "web", "vm", claim_annotation("vm1"), spec).unwrap();
    let m = until_condition(node, t, "web", "False", "ExclusiveHolder").await;
    assert!(m.contains("whole"), "{m}");
    kubectl(
        node,
        &[
            "patch",
            "ipaddressclaim",
            "-n",
            t,
            "vm1",
            "--type=merge",
            "-p",
            r#"{"spec":{"sharing":{"policy":"SameNamespace"}}}"#,
        ],
    );
    until_condition(node, t, "web", "False", "ExclusiveHolder").await;
    let web = node.json(&["get", "service", "-n", t, "web"]).unwrap();
    assert!(
        web["status"]["loadBalancer"]["ingress"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{web}"
    );

    // Detached: silent on every port.
    kubectl(
        node,
        &[
            "annotate",
            "service",
            "-n",
            t,
            "vm",
            "local.sdn.cozystack.io/ip-address-claim-",
        ],
    );
    let gap = until_silent(&ip, 2222, &pods, SETTLE);
    figure(&format!(
        "whole IP ({label}): detached → silent: {:.2}s",
        gap.as_secs_f64()
    ));
    assert!(curl(&ip, 7000).is_err(), ":7000 after the detach");
    until_refused("udp :5353", SETTLE, || udp(&ip, 5353).is_ok());
    drop(listener);
    w.check(node).await;
}

async fn metallb_whole_ip(node: &'static Node) {
    whole_ip(node, Driver::MetalLb, "192.0.2.192/28", "metallb l2").await;
}

async fn range_whole_ip(node: &'static Node) {
    whole_ip(node, Driver::Range, "198.51.100.192/28", "range routed").await;
}

/// A port list through cozy-proxy, over MetalLB: the listed ports answer, the others are
/// dropped, ICMP as `allowICMP` says; the pod's outbound traffic leaves from the address.
async fn port_list(node: &'static Node) {
    assert!(
        wire::cozy_proxy(node),
        "cozy-proxy runs (the harness skips this test without its source)"
    );
    let w = World::new(node, Driver::MetalLb, &["192.0.2.208/28"]).await;
    let t = &w.tenant.name;
    let pods = vm_workload(node, t, "vm", 1, &["8080", "2222", "7000"]).unwrap();
    w.create_claim("vm2", json!({})).await;
    vm_service(
        node,
        t,
        "vm",
        "vm",
        "vm2",
        Method::PortList {
            ports: &[8080, 2222],
            icmp: false,
        },
        json!({}),
    )
    .unwrap();
    let ip = w.bound("vm2").await;
    until_answered(&ip, 2222, &pods, WAIT);
    assert_eq!(curl(&ip, 8080).as_deref(), Ok(pods[0].as_str()));
    assert!(curl(&ip, 7000).is_err(), "an unlisted port is dropped");
    assert!(!ping(&ip), "ICMP dropped without allowICMP");
    let m = until_condition(node, t, "vm", "True", "Attached").await;
    assert!(m.contains("ICMP dropped"), "{m}");
    let a = address_object(node, &ip).unwrap();
    let holder = &a["status"]["attachments"][0];
    assert_eq!(holder["method"], "PortList", "{a}");
    assert_eq!(holder["ports"], json!(["TCP/2222", "TCP/8080"]), "{a}");
    // allowICMP: the echo answers.
    kubectl(
        node,
        &[
            "annotate",
            "--overwrite",
            "service",
            "-n",
            t,
            "vm",
            "networking.cozystack.io/allowICMP=true",
        ],
    );
    let t0 = Instant::now();
    while !ping(&ip) {
        assert!(t0.elapsed() < SETTLE, "ICMP still dropped with allowICMP");
        std::thread::sleep(Duration::from_millis(200));
    }
    until_condition(node, t, "vm", "True", "Attached").await;
    let listener = ClientListener::start(node, 9001).unwrap();
    assert_eq!(
        egress_source(Ask::ThroughAddress(&ip), &listener).as_deref(),
        Ok(ip.as_str())
    );
    drop(listener);
    w.check(node).await;
}

/// What cozy-proxy cannot serve is refused readably, never half-served: two ready pods
/// behind the Service (it forwards to one); a claim with no IPv4 address (it is IPv4 only);
/// a Dual claim gives its IPv4 address only, and says so.
async fn cozy_refusals(node: &'static Node) {
    assert!(
        wire::cozy_proxy(node),
        "cozy-proxy runs (the harness skips this test without its source)"
    );
    let w = World::new(
        node,
        Driver::Range,
        &["198.51.100.208/28", "2001:db8:200:20::/124"],
    )
    .await;
    let t = &w.tenant.name;
    vm_workload(node, t, "two", 2, &["8080", "2222"]).unwrap();
    w.create_claim("two", json!({})).await;
    vm_service(
        node,
        t,
        "two",
        "two",
        "two",
        Method::WholeIp,
        Driver::Range.spec(),
    )
    .unwrap();
    let ip = w.bound("two").await;
    let m = until_condition(node, t, "two", "False", "MultipleEndpoints").await;
    assert!(m.contains("2 workloads"), "{m}");
    assert!(curl(&ip, 2222).is_err(), "nothing half-served");
    // One pod again: attached.
    kubectl(
        node,
        &["scale", "deployment", "-n", t, "two", "--replicas=1"],
    );
    let pods = wire::wait_ready_pods(node, t, "two", 1).unwrap();
    until_condition(node, t, "two", "True", "Attached").await;
    until_answered(&ip, 2222, &pods, WAIT);
    // A Dual claim: the IPv4 address only, said in the condition.
    let dual = vm_workload(node, t, "dual", 1, &["8080", "2222"]).unwrap();
    w.create_claim("dual", json!({"family": "Dual"})).await;
    vm_service(
        node,
        t,
        "dual",
        "dual",
        "dual",
        Method::WholeIp,
        Driver::Range.spec(),
    )
    .unwrap();
    let ips = w.bound_all("dual").await;
    let v4 = ips.iter().find(|i| !i.contains(':')).unwrap();
    until_answered(v4, 2222, &dual, WAIT);
    let m = until_condition(node, t, "dual", "True", "Attached").await;
    assert!(m.contains("IPv4 only"), "{m}");
    w.check(node).await;
}

fn a_vms_whole_address_over_metallb_every_port_and_its_egress() {
    node::run(metallb_whole_ip);
}
fn a_vms_whole_address_over_the_range_driver_every_port_and_its_egress() {
    node::run(range_whole_ip);
}
fn a_port_list_through_cozy_proxy_drops_what_it_does_not_list() {
    node::run(port_list);
}
fn what_cozy_proxy_cannot_serve_is_refused_readably() {
    node::run(cozy_refusals);
}

fn metallb_l2_a_claimed_address_answers_from_its_services_pods_and_nobody_else() {
    node::run(metallb_journey);
}
fn range_routed_a_claimed_address_answers_from_its_services_pods_and_nobody_else() {
    node::run(range_journey);
}
fn the_speaker_and_kube_proxy_restarted_the_address_answers_again() {
    node::run(restarts);
}
fn a_dual_claim_answers_on_both_families() {
    node::run(dual_stack);
}
fn claim_to_first_answer_against_plain_metallb() {
    node::run(latency);
}
fn two_services_sharing_an_address_each_answer_on_their_own_port() {
    node::run(shared);
}

address_controller_tests::node_main![
    metallb_l2_a_claimed_address_answers_from_its_services_pods_and_nobody_else,
    range_routed_a_claimed_address_answers_from_its_services_pods_and_nobody_else,
    the_speaker_and_kube_proxy_restarted_the_address_answers_again,
    a_dual_claim_answers_on_both_families,
    claim_to_first_answer_against_plain_metallb,
    two_services_sharing_an_address_each_answer_on_their_own_port;
    cozy_proxy:
    a_vms_whole_address_over_metallb_every_port_and_its_egress,
    a_vms_whole_address_over_the_range_driver_every_port_and_its_egress,
    a_port_list_through_cozy_proxy_drops_what_it_does_not_list,
    what_cozy_proxy_cannot_serve_is_refused_readably,
];
