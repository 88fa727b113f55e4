//! Packets reach the workload: from the client host to a claimed address, through the real
//! MetalLB speaker (L2: it answers ARP for the address with the node's MAC) or a route to
//! the node (the range driver's addresses), through the node's real kube-proxy, to a pod of
//! the Service that holds the claim — and to nobody else. Root only (the node tier);
//! without root every test here is reported ignored, with the reason, never passed.
//! Figures go to target/node-figures.txt.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use address_controller_api::IPAddressClaim;
use address_controller_tests::invariants::{Scope, assert_invariants};
use address_controller_tests::node::{self, Node, figure, replicas};
use address_controller_tests::wire::{
    self, apply, claim_annotation, client_flush_neighbours, client_neighbour, curl, node_mac,
    percentile, route, service, until_answered, until_silent, workload,
};
use address_controller_tests::{Cleanup, TestNamespace, random_suffix, wait_for};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// How long an address may keep answering, or stay silent, after a change (a bound, not a
/// target: the figures say how long it took).
const SETTLE: Duration = Duration::from_secs(30);

/// Which driver carries the class, and how the client host reaches its addresses.
#[derive(Clone, Copy)]
enum Driver {
    /// MetalLB's pool; the addresses are on the segment, the speaker answers ARP.
    MetalLb,
    /// The range driver's CIDR, routed to the node by the client host (the upstream router).
    Range,
}

impl Driver {
    fn provisioner(self) -> &'static str {
        match self {
            Driver::MetalLb => "metallb.drivers.local.sdn.cozystack.io",
            Driver::Range => "range.drivers.local.sdn.cozystack.io",
        }
    }
    fn parameters(self, cidrs: &[&str]) -> Value {
        match self {
            Driver::MetalLb => json!({"addresses": cidrs}),
            Driver::Range => json!({"cidrs": cidrs}),
        }
    }
    /// The Services' `spec` fields the driver needs (the range driver's load-balancer class).
    fn spec(self) -> Value {
        match self {
            Driver::MetalLb => json!({}),
            Driver::Range => json!({"loadBalancerClass": wire::RANGE_LB_CLASS}),
        }
    }
    fn route(self) -> &'static str {
        match self {
            Driver::MetalLb => "on-link",
            Driver::Range => "via-node",
        }
    }
}

/// One test's world: a tenant, a stranger, a class of DRIVER over CIDRS reached by the
/// client host as the driver needs.
struct World {
    client: Client,
    tenant: TestNamespace,
    stranger: TestNamespace,
    class: String,
    cidrs: Vec<String>,
    _cleanup: Cleanup,
}

impl World {
    async fn new(node: &Node, driver: Driver, cidrs: &[&str]) -> World {
        wire::ready(node);
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

    fn claims(&self) -> Api<IPAddressClaim> {
        Api::namespaced(self.client.clone(), &self.tenant.name)
    }

    async fn create_claim(&self, name: &str, extra: Value) {
        let mut spec = json!({"className": self.class});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        self.claims()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap(),
            )
            .await
            .unwrap();
    }

    /// Waits until the claim is Bound; its (first) address.
    async fn bound(&self, name: &str) -> String {
        self.bound_all(name).await.remove(0)
    }

    /// Waits until the claim is Bound; all its addresses.
    async fn bound_all(&self, name: &str) -> Vec<String> {
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

    async fn check(&self, node: &Node) {
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

/// The IPAddress object holding IP (by spec.address), as JSON.
fn address_object(node: &Node, ip: &str) -> Option<Value> {
    let list = node
        .json(&["get", "ipaddresses.local.sdn.cozystack.io"])
        .unwrap();
    list["items"]
        .as_array()?
        .iter()
        .find(|a| a["spec"]["address"] == ip)
        .cloned()
}

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
    two_services_sharing_an_address_each_answer_on_their_own_port,
];
