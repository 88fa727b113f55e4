//! The chaos suite: the system as an operator runs it — the chart installed, two
//! address-controller and two range-driver replicas as the chart's ServiceAccounts with the
//! Deployments' arguments — under claim churn (IPv4, IPv6 and Dual; a Retain class with a
//! release delay and a Delete class; claims pinned to Available and Released addresses;
//! LoadBalancer Services with auto-claims), while leaders are SIGKILLed and restarted and
//! kube-apiserver and etcd restart. At the end every replica is alive, the churn stops, and
//! the invariant checker judges the ledger and every replica's gauges.

#![allow(clippy::unwrap_used)] // test support: a failed step fails loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim};
use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;

use crate::chart::{Release, Runner};
use crate::env::lease_holder_in;
use crate::invariants::{self, Replica, Report, Scope};
use crate::{
    Cleanup, Cluster, ControllerProcess, TestNamespace, free_port, random_suffix, repo_root,
    wait_for,
};

/// How hard and how long.
#[derive(Debug, Clone)]
pub struct Config {
    pub duration: Duration,
    pub namespaces: usize,
    /// Claim and Service operations per second, over all clients.
    pub ops_per_second: f64,
    /// Pause between two leader kills: uniformly in this range.
    pub kill_every: (Duration, Duration),
    pub apiserver_restarts: usize,
    pub etcd_restarts: usize,
    /// Settle time of the invariant check.
    pub settle: Duration,
    /// The driver of the run's classes: the range driver, the MetalLB driver with the real
    /// MetalLB controller beside it, or the Cilium driver with the real cilium-operator.
    pub driver: Driver,
}

/// Which driver a chaos run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Range,
    MetalLb,
    Cilium,
}

impl Driver {
    fn kind(self) -> crate::chart::DriverKind {
        match self {
            Driver::Range => crate::chart::RANGE,
            Driver::MetalLb => crate::chart::METALLB,
            Driver::Cilium => crate::chart::CILIUM,
        }
    }
    fn provisioner(self) -> &'static str {
        match self {
            Driver::Range => "range.drivers.local.sdn.cozystack.io",
            Driver::MetalLb => "metallb.drivers.local.sdn.cozystack.io",
            Driver::Cilium => "cilium.drivers.local.sdn.cozystack.io",
        }
    }
    /// A class's parameters over `ranges`.
    fn parameters(self, ranges: &[&str]) -> serde_json::Value {
        match self {
            Driver::Range => json!({"cidrs": ranges}),
            Driver::MetalLb | Driver::Cilium => json!({"addresses": ranges}),
        }
    }
}

impl Config {
    /// `make chaos`: about ten minutes.
    pub fn full(duration: Duration) -> Config {
        Config {
            duration,
            namespaces: 20,
            ops_per_second: 5.0,
            kill_every: (Duration::from_secs(30), Duration::from_secs(60)),
            apiserver_restarts: 2,
            etcd_restarts: 1,
            settle: Duration::from_secs(30),
            driver: Driver::Range,
        }
    }

    /// The short run in `make test`: about two minutes, three leader kills, one
    /// kube-apiserver restart.
    pub fn short() -> Config {
        Config {
            duration: Duration::from_secs(90),
            namespaces: 6,
            ops_per_second: 5.0,
            // A crashed leader's lease (the chart's 15 s) must expire before the next one
            // leads: each round is this pause plus about 16 s.
            kill_every: (Duration::from_secs(6), Duration::from_secs(9)),
            apiserver_restarts: 1,
            etcd_restarts: 0,
            settle: Duration::from_secs(10),
            driver: Driver::Range,
        }
    }
}

/// What happened.
#[derive(Debug, Default)]
pub struct Stats {
    pub claims_created: AtomicUsize,
    pub claims_deleted: AtomicUsize,
    pub pinned_created: AtomicUsize,
    /// Released static addresses an admin re-pointed at a claim to be created later (in
    /// any namespace: a reservation, and a move), and those claims once created.
    pub reservations: AtomicUsize,
    pub reserved_claims_created: AtomicUsize,
    /// A reserved address found bound to another claim, or a reservation's claim that did
    /// not get its address: each one fails the run.
    pub reservation_failures: std::sync::Mutex<Vec<String>>,
    /// Addresses seen — at any instant of the run, by a watch — in a state the history is
    /// never in, not even between two writes (`history::released_yet_open`): the
    /// `history-unsound` rule, held live (#57: the end-of-run check judges a settled
    /// ledger, where a second write had long closed the holding).
    pub history_live: std::sync::Mutex<Vec<String>>,
    pub services_created: AtomicUsize,
    /// Services created naming a claim (of all Services created), re-annotated ones, and
    /// thieves (a Service of another load balancer showing a claimed address).
    pub named_services_created: AtomicUsize,
    /// Of those, the platform's VM shape (#55: cozy-proxy's label, whole, port 65535).
    pub vm_services_created: AtomicUsize,
    pub reannotated: AtomicUsize,
    pub thieves: AtomicUsize,
    /// Sharing (#42): claims whose `spec.sharing` changed (granted, widened to another
    /// namespace, withdrawn), and Services naming a claim of another namespace.
    pub sharing_changes: AtomicUsize,
    pub cross_namespace_services: AtomicUsize,
    /// The hostile tenant (#45): thieves carrying a forged record of a driver's, pins of
    /// addresses other namespaces hold, claims given controller owner references of the
    /// tenant's own.
    pub forged_thieves: AtomicUsize,
    pub foreign_pins: AtomicUsize,
    pub self_owned_claims: AtomicUsize,
    /// What the hostile tenant got that it must not (an admin's static address deleted):
    /// each one fails the run.
    pub hostile_wins: std::sync::Mutex<Vec<String>>,
    pub services_deleted: AtomicUsize,
    pub api_errors: AtomicUsize,
    pub leader_kills: AtomicUsize,
    pub driver_kills: AtomicUsize,
    pub apiserver_restarts: AtomicUsize,
    pub etcd_restarts: AtomicUsize,
    pub lease_losses: AtomicUsize,
    /// Replicas that ended for another reason than a lost lease or a kill of ours (a stalled
    /// runtime, a crash): each one fails the run.
    pub unexpected_exits: std::sync::Mutex<Vec<String>>,
}

pub struct Outcome {
    pub stats: Stats,
    /// Claims `Lost` at the end (the workload never takes an address from a claim: each one
    /// is a finding; the checker's lost-claim rule judges why).
    pub lost_claims: Vec<String>,
    /// Namespaces held to an IPAddressQuota, and claims waiting with QuotaExceeded at the
    /// end.
    pub quota_namespaces: usize,
    pub quota_waiting: usize,
    /// Released surplus at the end (SPEC §5.7: a driver's create that lost the race with
    /// the core), and how many of those their claim has gone from since — what no reader
    /// but `status.reason` can tell from a grant.
    pub surplus_at_end: (usize, usize),
    /// The association events the run produced, by reason (on the chaos namespaces'
    /// Services, and on addresses from the driver).
    pub association_events: std::collections::BTreeMap<String, usize>,
    pub report: Report,
    /// Per failover round: (kill → lease taken, kill → next claim Bound).
    pub failovers: Vec<(Duration, Duration)>,
    /// Services written more than once in a quiet spell at the end (nothing runs but the
    /// controllers and the drivers): each `ns/name: N writes` (the drivers' fight over a
    /// condition wrote one ~90 times a second, #55). And the writes the run's own noisy
    /// writer was seen making in a second spell (the positive control: at least 3).
    pub rewritten_while_quiet: Vec<String>,
    pub noise_seen: usize,
    pub took: Duration,
}

impl Outcome {
    /// No invariant violated, every reservation kept, and no replica ended unexpectedly.
    pub fn ok(&self) -> bool {
        self.report.ok()
            && self.unexpected_exits().is_empty()
            && self.reservation_failures().is_empty()
            && self.history_live().is_empty()
            && self.hostile_wins().is_empty()
            && self.lost_claims.is_empty()
            && self.rewritten_while_quiet.is_empty()
            && self.noise_seen >= NOISE_WRITES
    }

    pub fn hostile_wins(&self) -> Vec<String> {
        self.stats
            .hostile_wins
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    pub fn history_live(&self) -> Vec<String> {
        self.stats
            .history_live
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    pub fn reservation_failures(&self) -> Vec<String> {
        self.stats
            .reservation_failures
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    pub fn unexpected_exits(&self) -> Vec<String> {
        self.stats
            .unexpected_exits
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// What the run did, the failover figures and the invariants table.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let n = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        let mut out = format!(
            "chaos: {:.0?} — claims created {}, deleted {} ({} pinned); addresses reserved or moved by an admin {} (their claims created {}); Services created {}, deleted {}; \
             leader kills {} (controller) + {} (driver); kube-apiserver restarts {}, etcd restarts {}; \
             replicas restarted after losing their lease {}; API errors seen by clients {}\n",
            self.took,
            n(&s.claims_created),
            n(&s.claims_deleted),
            n(&s.pinned_created),
            n(&s.reservations),
            n(&s.reserved_claims_created),
            n(&s.services_created),
            n(&s.services_deleted),
            n(&s.leader_kills),
            n(&s.driver_kills),
            n(&s.apiserver_restarts),
            n(&s.etcd_restarts),
            n(&s.lease_losses),
            n(&s.api_errors),
        );
        if !self.failovers.is_empty() {
            let mut lease: Vec<Duration> = self.failovers.iter().map(|f| f.0).collect();
            let mut bound: Vec<Duration> = self.failovers.iter().map(|f| f.1).collect();
            lease.sort();
            bound.sort();
            let mmm = |v: &[Duration]| {
                format!(
                    "min {:.1?} / median {:.1?} / max {:.1?}",
                    v[0],
                    v[v.len() / 2],
                    v[v.len() - 1]
                )
            };
            out.push_str(&format!(
                "failover over {} rounds: SIGKILL → lease taken {}; SIGKILL → next claim Bound {}\n",
                self.failovers.len(),
                mmm(&lease),
                mmm(&bound)
            ));
        }
        let s = &self.stats;
        out.push_str(&format!(
            "association: Services naming a claim {} (the VM shape {}), re-annotated {}, thieves {}; events {:?}\n",
            n(&s.named_services_created),
            n(&s.vm_services_created),
            n(&s.reannotated),
            n(&s.thieves),
            self.association_events
        ));
        out.push_str(&format!(
            "sharing: claims whose sharing changed {}, Services naming another namespace's claim {} (ports drawn from TCP/80, TCP/443, UDP/53: some collide)\n",
            n(&s.sharing_changes),
            n(&s.cross_namespace_services)
        ));
        out.push_str(&format!(
            "quotas: {} namespaces held to an IPAddressQuota; claims waiting with QuotaExceeded at the end {}; released surplus at the end {} (their claim gone since: {})\n",
            self.quota_namespaces, self.quota_waiting, self.surplus_at_end.0, self.surplus_at_end.1
        ));
        out.push_str(&format!(
            "claims Lost at the end: {} {:?}\n",
            self.lost_claims.len(),
            self.lost_claims
        ));
        out.push_str(&format!(
            "quiet spell ({QUIET:?}): Services written more than once {:?}; the noisy writer's {NOISE_WRITES} writes seen {}\n",
            self.rewritten_while_quiet, self.noise_seen
        ));
        for e in self.unexpected_exits() {
            out.push_str(&format!("UNEXPECTED EXIT: {e}\n"));
        }
        for e in self.reservation_failures() {
            out.push_str(&format!("RESERVATION NOT KEPT: {e}\n"));
        }
        for e in self.history_live() {
            out.push_str(&format!("HISTORY UNSOUND (seen live): {e}\n"));
        }
        out.push_str(&format!(
            "hostile tenant: thieves with a forged record {}, pins of other namespaces' addresses {}, claims owned by the tenant's own objects {}\n",
            n(&s.forged_thieves),
            n(&s.foreign_pins),
            n(&s.self_owned_claims)
        ));
        for e in self.hostile_wins() {
            out.push_str(&format!("HOSTILE TENANT WON: {e}\n"));
        }
        out.push_str(&self.report.table());
        out
    }
}

/// Watches every IPAddress until `stop_at`, recording each one seen in a state the history
/// is never in (`history::released_yet_open`). A broken watch (kube-apiserver restarts under
/// the churn) is watched again.
async fn watch_history(client: &Client, stats: &Stats, stop_at: Instant) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<IPAddress> = Api::all(client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    loop {
        let next = tokio::time::timeout_at(stop_at.into(), stream.next()).await;
        let Ok(Some(ev)) = next else { return };
        let Ok(a) = ev else { continue };
        if let Some(why) = address_controller_api::history::released_yet_open(&a)
            && let Ok(mut v) = stats.history_live.lock()
        {
            v.push(format!(
                "IPAddress {} at resourceVersion {}: {why}",
                a.name_any(),
                a.resource_version().unwrap_or_default()
            ));
        }
    }
}

/// A replica that the harness restarts when it dies, as a kubelet would.
struct Pod {
    process: ControllerProcess,
}

/// Runs the scenario against the current [`Cluster`].
/// Prints the events regarding object `ns/name` (a finding's context; a failed list says
/// nothing).
async fn say_events(client: &Client, what: &str, ns: &str, name: &str) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let Ok(list) = events.list(&ListParams::default()).await else {
        return;
    };
    for e in list
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
    {
        eprintln!(
            "chaos: {what} {ns}/{name}: event {} {} {}",
            e.reporting_controller.as_deref().unwrap_or_default(),
            e.reason.as_deref().unwrap_or_default(),
            e.note.as_deref().unwrap_or_default()
        );
    }
}

/// `field=value` of the string fields of a JSON log line (MetalLB's), in `fields` order.
fn log_fields(v: &serde_json::Value, fields: &[&str]) -> String {
    fields
        .iter()
        .filter_map(|f| v[f].as_str().map(|x| format!("{f}={x}")))
        .collect::<Vec<_>>()
        .join(" ")
}

pub async fn run(cfg: &Config) -> Result<Outcome> {
    let started = Instant::now();
    let run_started = k8s_openapi::jiff::Timestamp::now();
    let cluster = Cluster::get();
    let client = cluster.client().await?;
    crate::install_crds(&client).await?;
    let sfx = random_suffix();
    let port = free_port();
    let kind = cfg.driver.kind();
    let values = match cfg.driver {
        Driver::Range => json!({"rangeDriver": {"enabled": true}}),
        Driver::MetalLb => json!({"metallbDriver": {"enabled": true}}),
        Driver::Cilium => json!({"ciliumDriver": {"enabled": true}}),
    };
    // With the MetalLB driver, the real MetalLB controller (one per cluster).
    let _metallb = match cfg.driver {
        Driver::MetalLb => Some(crate::metallb::MetalLb::start(None).await?),
        Driver::Range | Driver::Cilium => None,
    };
    // With the Cilium driver, the real cilium-operator (LB-IPAM), no pool of an earlier run.
    let _cilium = match cfg.driver {
        Driver::Cilium => {
            let op = crate::cilium::operator().await?;
            crate::cilium::purge_pools(&["10.201.", "10.202."])?;
            Some(op)
        }
        Driver::Range | Driver::MetalLb => None,
    };
    let release = Release::new(port, &values).await;
    let ns = release.ns.clone();
    let runner = Runner::with(&release, Some(kind));
    let stats = Arc::new(Stats::default());

    // The classes: a Retain class with a release delay (recycled addresses meet driver
    // provisioning: the race that once double-allocated), a Delete class for auto-claims,
    // and a static class for failover probes.
    let mut cleanup = Cleanup::default();
    let retain = format!("chaos-retain-{sfx}");
    let delete = format!("chaos-delete-{sfx}");
    let probe = format!("chaos-probe-{sfx}");
    let classes = json!([
        {"metadata": {"name": retain}, "spec": {"provisioner": cfg.driver.provisioner(), "reclaimPolicy": "Retain", "releaseDelay": "20s",
            "parameters": cfg.driver.parameters(&["10.201.0.0/22", "2001:db8:c1::/118"])}},
        {"metadata": {"name": delete, "annotations": {"ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class": "true"}},
            "spec": {"provisioner": cfg.driver.provisioner(), "reclaimPolicy": "Delete", "parameters": cfg.driver.parameters(&["10.202.0.0/22", "2001:db8:c2::/118"])}},
        {"metadata": {"name": probe}, "spec": {"provisioner": "none.chaos.test"}},
    ]);
    let class_api: Api<address_controller_api::IPAddressClass> = Api::all(client.clone());
    for c in classes.as_array().unwrap() {
        class_api
            .create(&PostParams::default(), &serde_json::from_value(c.clone())?)
            .await?;
        cleanup.add(
            "ipaddressclasses.local.sdn.cozystack.io",
            c["metadata"]["name"].as_str().unwrap(),
        );
    }
    // Static addresses of the Retain class (outside the driver's range) to pin claims to.
    let addresses: Api<IPAddress> = Api::all(client.clone());
    for i in 0..STATICS {
        let name = format!("chaos-static-{sfx}-{i}");
        let body = json!({"metadata": {"name": name}, "spec": {"address": format!("10.203.0.{}", i + 1), "className": retain, "source": {"fromClass": {}}}});
        addresses
            .create(&PostParams::default(), &serde_json::from_value(body)?)
            .await?;
        cleanup.add("ipaddresses.local.sdn.cozystack.io", &name);
    }
    let mut namespaces = Vec::new();
    for i in 0..cfg.namespaces {
        namespaces.push(TestNamespace::create(&client, &format!("chaos{i}")).await?);
    }
    let ns_names: Vec<String> = namespaces.iter().map(|n| n.name.clone()).collect();
    // Entitlements (SPEC §13): every other namespace is held to a quota small enough for
    // the workload to hit — on the Retain class (whose Released addresses count until the
    // release delay frees them) every family together, on the auto-claim class IPv4.
    let quotas_in: Vec<&String> = ns_names
        .iter()
        .enumerate()
        .filter(|(i, _)| held_to_quota(*i))
        .map(|(_, n)| n)
        .collect();
    for ns in &quotas_in {
        let quotas: Api<address_controller_api::IPAddressQuota> =
            Api::namespaced(client.clone(), ns);
        let q = json!({"metadata": {"name": "chaos"}, "spec": {"limits": [
            {"className": retain, "addresses": 3},
            {"className": delete, "ipv4": 2}]}});
        quotas
            .create(&PostParams::default(), &serde_json::from_value(q)?)
            .await?;
    }

    // The replicas. The first controller serves the port the chart's APIService names.
    let controllers = Arc::new(Mutex::new(vec![
        Pod {
            process: runner
                .controller(&format!("ctl-a-{sfx}"), Some(port), &[])
                .await?,
        },
        Pod {
            process: runner
                .controller(&format!("ctl-b-{sfx}"), None, &[])
                .await?,
        },
    ]));
    let drivers = Arc::new(Mutex::new(vec![
        Pod {
            process: runner.driver(&format!("drv-a-{sfx}"), &[]).await?,
        },
        Pod {
            process: runner.driver(&format!("drv-b-{sfx}"), &[]).await?,
        },
    ]));

    let stop_at = Instant::now() + cfg.duration;
    let reserved = std::sync::Mutex::new(Vec::new());
    let workload = workload(
        &client, &ns_names, &retain, &delete, &stats, cfg, stop_at, &reserved,
    );
    let chaos = disruptions(
        &client,
        &ns,
        &probe,
        &controllers,
        &drivers,
        &stats,
        cfg,
        stop_at,
        &mut cleanup,
    );
    let live = watch_history(&client, &stats, stop_at);
    let (w, failovers, ()) = tokio::join!(workload, chaos, live);
    w?;
    let failovers = failovers?;

    // Every replica alive; every claim deletion processed; then the judgement.
    revive(&controllers, &stats).await?;
    revive(&drivers, &stats).await?;
    wait_for(
        "every deleted claim finalized",
        Duration::from_secs(120),
        || async {
            let n = Api::<IPAddressClaim>::all(client.clone())
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|c| {
                    ns_names.contains(&c.namespace().unwrap_or_default())
                        && c.metadata.deletion_timestamp.is_some()
                })
                .count();
            if n == 0 {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{n} claims terminating"))
            }
        },
    )
    .await?;
    let replicas: Vec<Replica> = controllers
        .lock()
        .await
        .iter()
        .filter_map(|p| p.process.replica())
        .collect();
    let scope = Scope {
        namespaces: Some(ns_names.iter().cloned().collect()),
        classes: Some(
            [retain.clone(), delete.clone(), probe.clone()]
                .into_iter()
                .collect(),
        ),
    };
    let report = invariants::check(&client, &scope, cfg.settle, &replicas).await?;
    let lost_claims: Vec<String> = Api::<IPAddressClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            ns_names.contains(&c.namespace().unwrap_or_default())
                && c.phase() == Some(ClaimPhase::Lost)
        })
        .map(|c| {
            // The claim's word on why (its Bound condition), and the events on it: a Lost
            // claim at the end is a finding, and its report says where to look.
            let why = c
                .status
                .iter()
                .flat_map(|st| &st.conditions)
                .find(|k| k.type_ == "Bound")
                .map(|k| format!("{}: {}", k.reason, k.message))
                .unwrap_or_default();
            format!("{} ({why})", c.key())
        })
        .collect();
    for key in &lost_claims {
        if let Some((ns, name)) = key.split(' ').next().and_then(|k| k.split_once('/')) {
            say_events(&client, "Lost claim", ns, name).await;
        }
    }
    // A holder that does not show its address: what the Service carries and what was said
    // on it (MetalLB's AllocationFailed names its reason), so the report says where to look.
    for v in report
        .violations
        .iter()
        .filter(|v| v.rule == "association-dangling")
    {
        let Some((ns, name)) = v
            .detail
            .strip_prefix("holder Service ")
            .and_then(|d| d.split(',').next())
            .and_then(|k| k.split_once('/'))
        else {
            continue;
        };
        let svc = Api::<Service>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?;
        if let Some(svc) = &svc {
            let annotations: Vec<String> = svc
                .annotations()
                .iter()
                .filter(|(k, _)| {
                    k.contains("metallb") || k.contains("lbipam") || k.contains("cozystack")
                })
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            eprintln!(
                "chaos: dangling holder {ns}/{name}: annotations {annotations:?}, ingress {:?}, condition {:?}, ports {:?}",
                address_controller_api::service::ingress_ips(svc).collect::<Vec<_>>(),
                address_controller_api::sharing::condition(svc).map(|c| (&c.reason, &c.message)),
                address_controller_api::sharing::ports_of(svc),
            );
        }
        if let Some(m) = &_metallb {
            // MetalLB's word on it (its JSON log, the Service dumps left out).
            let log = std::fs::read_to_string(&m.log).unwrap_or_default();
            let key = format!("{ns}/{name}");
            let mut said: Vec<String> = Vec::new();
            for l in log.lines().filter(|l| l.contains(&key)) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
                    continue;
                };
                if v["level"] == "debug" {
                    continue;
                }
                let line = log_fields(&v, &["ts", "level", "op", "event", "msg", "error"]);
                if said.last() != Some(&line) {
                    said.push(line);
                }
            }
            for l in said.iter().rev().take(8).rev() {
                eprintln!("chaos: dangling holder {key}: metallb {l}");
            }
        }
        say_events(&client, "dangling holder", ns, name).await;
    }
    // MetalLB's configuration troubles over the run (a pool it did not have).
    if let Some(m) = _metallb.as_ref().filter(|_| !report.violations.is_empty()) {
        let log = std::fs::read_to_string(&m.log).unwrap_or_default();
        let mut said: Vec<String> = Vec::new();
        for v in log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["level"] == "error" && v["service"].is_null() && v["name"].is_null())
        {
            let line = log_fields(&v, &["ts", "controller", "op", "event", "msg", "error"]);
            said.push(line);
        }
        for l in said.iter().take(20) {
            eprintln!("chaos: metallb error {l}");
        }
    }
    let association_events = association_events(&client, &ns_names, run_started).await?;
    // Claims still waiting for room in their namespace's quota: expected where the
    // workload left more claims than the quota allows (the checker's refusal-stale rule
    // says none of them could bind).
    let quota_waiting = Api::<IPAddressClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            ns_names.contains(&c.namespace().unwrap_or_default())
                && c.entitlement_refusal()
                    == Some(address_controller_api::names::reason::QUOTA_EXCEEDED)
        })
        .count();
    let surplus_at_end = {
        let claims: std::collections::HashMap<(String, String), Option<String>> =
            Api::<IPAddressClaim>::all(client.clone())
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(|c| {
                    (
                        (c.namespace().unwrap_or_default(), c.name_any()),
                        c.metadata.uid,
                    )
                })
                .collect();
        let surplus: Vec<IPAddress> = Api::<IPAddress>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|a| a.is_surplus())
            .filter(|a| {
                a.spec
                    .claim_ref
                    .as_ref()
                    .is_some_and(|r| ns_names.contains(&r.namespace))
            })
            .collect();
        let gone = surplus
            .iter()
            .filter(|a| {
                a.spec.claim_ref.as_ref().is_some_and(|r| {
                    claims.get(&(r.namespace.clone(), r.name.clone())) != Some(&r.uid)
                })
            })
            .count();
        (surplus.len(), gone)
    };
    // Quiet stays quiet: with the workload stopped, no Service is rewritten; the control,
    // a writer of the run's own patching one Service, is seen.
    let rewritten_while_quiet = writes_in_quiet(&client, &ns_names, None).await?;
    let noise_seen = match noisy_target(&client, &ns_names).await? {
        Some(target) => {
            let seen = writes_in_quiet(&client, &ns_names, Some(&target)).await?;
            seen.iter()
                .find(|l| l.starts_with(&format!("{}/{}:", target.0, target.1)))
                .and_then(|l| l.rsplit(": ").next())
                .and_then(|n| n.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        }
        None => 0,
    };
    check_reservations(&client, &reserved.into_inner().unwrap_or_default(), &stats).await?;
    hostile_wins(&client, &format!("chaos-static-{sfx}-"), STATICS, &stats).await?;

    // Leave nothing behind: claims and Services go with their namespaces while the
    // replicas still run; then the release.
    drop(namespaces);
    wait_for(
        "chaos namespaces gone",
        Duration::from_secs(120),
        || async {
            let left = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|n| ns_names.contains(&n.name_any()))
                .count();
            Ok((left == 0).then_some(()))
        },
    )
    .await?;
    drop(controllers);
    drop(drivers);
    drop(cleanup);
    purge_class_addresses(&client, &[&retain, &delete, &probe]).await?;
    drop(release);
    let stats = Arc::try_unwrap(stats).unwrap_or_default();
    Ok(Outcome {
        stats,
        lost_claims,
        quota_namespaces: quotas_in.len(),
        quota_waiting,
        surplus_at_end,
        association_events,
        report,
        failovers,
        rewritten_while_quiet,
        noise_seen,
        took: started.elapsed(),
    })
}

/// Static addresses of the Retain class an admin made: none may be deleted by the run.
const STATICS: usize = 30;

/// Whether the run's `i`-th namespace is held to an IPAddressQuota (every other one).
fn held_to_quota(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// Restarts every replica that is not running: killed by us (a signal), or ended by a lost
/// lease (by design, it says so last on stderr); any other end is recorded as unexpected.
async fn revive(pods: &Mutex<Vec<Pod>>, stats: &Stats) -> Result<()> {
    for p in pods.lock().await.iter_mut() {
        if !p.process.running() {
            let code = p.process.exit_code();
            let said = p.process.stderr_tail();
            let last = said.lines().last().unwrap_or_default();
            if code.is_some() && last.contains("lost the lease") {
                stats.lease_losses.fetch_add(1, Ordering::Relaxed);
            } else if code.is_some()
                && let Ok(mut v) = stats.unexpected_exits.lock()
            {
                v.push(format!("{} exited ({code:?}): {last}", p.process.user));
            }
            p.process.restart().await?;
        }
    }
    Ok(())
}

/// A reservation an admin made: the address, and the claim (namespace, name) it waits for.
type Reservation = (String, String, String);

/// The claims, pins and Services clients create and delete; and, now and then, an admin
/// re-pointing a Released static address at a claim that a client creates a few operations
/// later, in any namespace (a reservation, and a move between namespaces).
#[allow(clippy::too_many_arguments)]
async fn workload(
    client: &Client,
    namespaces: &[String],
    retain: &str,
    delete: &str,
    stats: &Stats,
    cfg: &Config,
    stop_at: Instant,
    reserved: &std::sync::Mutex<Vec<Reservation>>,
) -> Result<()> {
    let clients = 3usize;
    let pause = Duration::from_secs_f64(clients as f64 / cfg.ops_per_second);
    let workers = (0..clients).map(|w| async move {
        let mut rng = Rng::new(w as u64 + 1);
        let mut claims: Vec<(String, String)> = Vec::new();
        let mut services: Vec<(String, String)> = Vec::new();
        // Services naming a claim, and thieves.
        let mut named: Vec<(String, String)> = Vec::new();
        // Reservations whose claim is not created yet, with the operation it is due at.
        let mut waiting: Vec<(Reservation, u32)> = Vec::new();
        let mut i = 0u32;
        while Instant::now() < stop_at {
            i += 1;
            tokio::time::sleep(pause).await;
            let ns_index = rng.below(namespaces.len());
            let ns = &namespaces[ns_index];
            let roll = rng.below(100);
            let due = waiting.iter().position(|(_, at)| *at <= i);
            let result: Result<(), kube::Error> = if let Some(k) = due {
                // The reserved claim arrives: its address must still wait for it.
                let ((address, cns, name), _) = waiting.remove(k);
                let a = Api::<IPAddress>::all(client.clone()).get(&address).await;
                if let Ok(a) = &a {
                    let r = a.spec.claim_ref.as_ref();
                    if r.is_none_or(|r| r.namespace != cns || r.name != name || r.uid.is_some()) {
                        fail_reservation(stats, format!(
                            "{address}, reserved for {cns}/{name}, names {:?} before that claim exists",
                            r.map(|r| r.key())
                        ));
                    }
                }
                let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), &cns);
                let body = json!({"metadata": {"name": name}, "spec": {"className": retain}});
                api.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.map(|_| {
                    stats.claims_created.fetch_add(1, Ordering::Relaxed);
                    stats.reserved_claims_created.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut v) = reserved.lock() {
                        v.push((address.clone(), cns.clone(), name.clone()));
                    }
                    claims.push((cns.clone(), name.clone()));
                })
            } else if roll < 3 && !held_to_quota(ns_index) {
                // (Not into a namespace held to a quota: an admin's reservation is the
                // admin's decision, and may take a namespace past its limit.)
                // The admin: a Released static address, re-pointed (guarded by the version
                // it was read at, as a careful tool does) at a claim that does not exist yet.
                match reserve(client, retain, ns, &format!("r{w}-{i}"), &mut rng).await {
                    Some(Ok(address)) => {
                        stats.reservations.fetch_add(1, Ordering::Relaxed);
                        let at = i + 3 + rng.below(10) as u32;
                        waiting.push(((address, ns.clone(), format!("r{w}-{i}")), at));
                        Ok(())
                    }
                    Some(Err(e)) => Err(e),
                    None => Ok(()),
                }
            } else if roll < 42 {
                // A claim: IPv4, IPv6 or Dual, of either class; sometimes pinned.
                let class = if rng.below(3) == 0 { delete } else { retain };
                let family = ["IPv4", "IPv4", "IPv6", "Dual"][rng.below(4)];
                let name = format!("c{w}-{i}");
                let mut spec = json!({"className": class, "family": family});
                let mut pinned = false;
                if family == "IPv4" && class == retain && rng.below(5) == 0 {
                    // Pin to an Available or Released address of the class.
                    if let Some(target) = pick_pin_target(client, retain, &mut rng).await {
                        spec["addressName"] = json!(target);
                        pinned = true;
                    }
                }
                let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), ns);
                let body = json!({"metadata": {"name": name}, "spec": spec});
                api.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.map(|_| {
                    stats.claims_created.fetch_add(1, Ordering::Relaxed);
                    if pinned {
                        stats.pinned_created.fetch_add(1, Ordering::Relaxed);
                    }
                    claims.push((ns.clone(), name));
                })
            } else if roll < 72 && !claims.is_empty() {
                let (cns, name) = claims.remove(rng.below(claims.len()));
                let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), &cns);
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        stats.claims_deleted.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            } else if roll < 80 || (roll < 91 && claims.is_empty()) {
                // A LoadBalancer Service: the core claims an address for it (auto-claim).
                let name = format!("svc{w}-{i}");
                let api: Api<Service> = Api::namespaced(client.clone(), ns);
                let body = json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
                api.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.map(|_| {
                    stats.services_created.fetch_add(1, Ordering::Relaxed);
                    services.push((ns.clone(), name));
                })
            } else if roll < 87 {
                // A Service naming one of this client's claims (it may be Pending, Bound, or
                // already serve another Service; it may share): the driver puts the claim's
                // addresses on it. Its port is drawn from three, so sharers collide at times;
                // one in four is in another namespace, naming the claim as <namespace>/<name>
                // (attached only while the claim's sharing lists that namespace).
                let (cns, claim) = claims[rng.below(claims.len())].clone();
                let name = format!("named{w}-{i}");
                let (sns, reference) = if rng.below(4) == 0 {
                    (namespaces[rng.below(namespaces.len())].clone(), format!("{cns}/{claim}"))
                } else {
                    (cns.clone(), claim)
                };
                let port = [json!({"port": 80}), json!({"port": 443}), json!({"port": 53, "protocol": "UDP"})][rng.below(3)].clone();
                let api: Api<Service> = Api::namespaced(client.clone(), &sns);
                // One in five is the platform's VM shape (#55): handed to cozy-proxy, whole,
                // the placeholder port 65535, Local — exclusive, its owner's namespace only.
                let vm = rng.below(5) == 0;
                let body = if vm {
                    json!({"metadata": {"name": name,
                            "labels": {"service.kubernetes.io/service-proxy-name": "cozy-proxy"},
                            "annotations": {SERVICE_CLAIM_ANNOTATION: reference, "networking.cozystack.io/wholeIP": "true"}},
                        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                            "allocateLoadBalancerNodePorts": false, "selector": {"vm": name.clone()},
                            "ports": [{"port": 65535, "protocol": "TCP"}]}})
                } else {
                    json!({"metadata": {"name": name, "annotations": {SERVICE_CLAIM_ANNOTATION: reference}},
                        "spec": {"type": "LoadBalancer", "ports": [port]}})
                };
                api.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.map(|_| {
                    stats.services_created.fetch_add(1, Ordering::Relaxed);
                    stats.named_services_created.fetch_add(1, Ordering::Relaxed);
                    if vm {
                        stats.vm_services_created.fetch_add(1, Ordering::Relaxed);
                    }
                    if sns != cns {
                        stats.cross_namespace_services.fetch_add(1, Ordering::Relaxed);
                    }
                    named.push((sns.clone(), name));
                })
            } else if roll < 88 && !claims.is_empty() {
                // The claim's owner changes its sharing: off, its namespace, or another
                // namespace of the run too — granted and withdrawn under the Services' feet.
                let (cns, claim) = claims[rng.below(claims.len())].clone();
                let other = namespaces[rng.below(namespaces.len())].clone();
                let sharing = match rng.below(3) {
                    0 => json!({"policy": "None", "namespaces": null}),
                    1 => json!({"policy": "SameNamespace", "namespaces": null}),
                    _ => json!({"policy": "Namespaces", "namespaces": [other]}),
                };
                let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), &cns);
                api.patch(&claim, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"spec": {"sharing": sharing}})))
                    .await
                    .map(|_| {
                        stats.sharing_changes.fetch_add(1, Ordering::Relaxed);
                    })
                    .or_else(|e| match e {
                        kube::Error::Api(s) if s.code == 404 => Ok(()),
                        e => Err(e),
                    })
            } else if roll < 90 && !named.is_empty() {
                // Re-annotated: to another claim of the namespace, or to none.
                let (sns, name) = named[rng.below(named.len())].clone();
                let other = claims.iter().filter(|(n, _)| *n == sns).map(|(_, c)| c.clone()).nth(rng.below(3));
                let api: Api<Service> = Api::namespaced(client.clone(), &sns);
                let body = json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: other}}});
                api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(body))
                    .await
                    .map(|_| {
                        stats.reannotated.fetch_add(1, Ordering::Relaxed);
                    })
                    .or_else(|e| match e {
                        kube::Error::Api(s) if s.code == 404 => Ok(()),
                        e => Err(e),
                    })
            } else if roll < 91 {
                // A thief: a Service of another load balancer whose status someone sets to a
                // claimed address of the chaos classes. The address must turn Conflict and
                // its rightful Service keep it; the thief goes a few operations later.
                thief(client, ns, &format!("thief{w}-{i}"), &[retain, delete], false, &mut rng)
                    .await
                    .map(|made| {
                        if let Some(name) = made {
                            stats.thieves.fetch_add(1, Ordering::Relaxed);
                            named.push((ns.clone(), name));
                        }
                    })
            } else if roll < 94 {
                // The hostile tenant (#45): a thief forging a driver's record of its pins, a
                // pin of an address another namespace holds, or a claim whose controller
                // owner reference is an object of its own (it must not waive the admin's
                // Retain when deleted by the churn later).
                match rng.below(3) {
                    0 => thief(client, ns, &format!("thief{w}-{i}"), &[retain, delete], true, &mut rng)
                        .await
                        .map(|made| {
                            if let Some(name) = made {
                                stats.forged_thieves.fetch_add(1, Ordering::Relaxed);
                                named.push((ns.clone(), name));
                            }
                        }),
                    1 => foreign_pin(client, ns, &format!("f{w}-{i}"), &mut rng)
                        .await
                        .map(|made| {
                            if let Some(name) = made {
                                stats.foreign_pins.fetch_add(1, Ordering::Relaxed);
                                claims.push((ns.clone(), name));
                            }
                        }),
                    _ => {
                        let name = format!("o{w}-{i}");
                        let target = pick_pin_target(client, retain, &mut rng).await;
                        self_owned_claim(client, ns, &name, retain, target.as_deref())
                            .await
                            .map(|()| {
                                stats.self_owned_claims.fetch_add(1, Ordering::Relaxed);
                                stats.claims_created.fetch_add(1, Ordering::Relaxed);
                                claims.push((ns.clone(), name));
                            })
                    }
                }
            } else if !services.is_empty() || !named.is_empty() {
                let pool = if named.is_empty() || (!services.is_empty() && rng.below(2) == 0) {
                    &mut services
                } else {
                    &mut named
                };
                let (sns, name) = pool.remove(rng.below(pool.len()));
                let api: Api<Service> = Api::namespaced(client.clone(), &sns);
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        stats.services_deleted.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            } else {
                Ok(())
            };
            if result.is_err() {
                stats.api_errors.fetch_add(1, Ordering::Relaxed);
                // A client backs off while the API server is away.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        // No thief outlives the run: the invariants judge a ledger at rest. (A delete that
        // meets a kube-apiserver restart is retried: a surviving thief kept its address
        // Conflict, and its claim's reclaim waited for the driver, at judgement.)
        for (sns, name) in named.iter().filter(|(_, n)| n.starts_with("thief")) {
            let api: Api<Service> = Api::namespaced(client.clone(), sns);
            if let Err(e) = delete_surely(&api, name).await {
                stats.api_errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("chaos: the thief {sns}/{name} could not be deleted: {e:#}");
            }
        }
    });
    futures::future::join_all(workers).await;
    Ok(())
}

/// The association events since `since`: on Services of the run's namespaces, and the
/// driver's on addresses.
async fn association_events(
    client: &Client,
    namespaces: &[String],
    since: k8s_openapi::jiff::Timestamp,
) -> Result<std::collections::BTreeMap<String, usize>> {
    use address_controller_api::names::driver as r;
    const REASONS: &[&str] = &[
        r::ASSOCIATED,
        r::ASSOCIATION_REJECTED,
        r::CLAIM_NOT_FOUND,
        r::CLAIM_NOT_BOUND,
        r::DISASSOCIATED,
        r::FAMILY_MISMATCH,
        r::CONFLICT,
        r::ADDRESS_LOST,
        r::RECOVERED,
    ];
    let mut out = std::collections::BTreeMap::new();
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    for e in events {
        let ns = e.metadata.namespace.clone().unwrap_or_default();
        let kind = e
            .regarding
            .as_ref()
            .and_then(|x| x.kind.clone())
            .unwrap_or_default();
        let ours = (namespaces.contains(&ns) && kind == "Service")
            || (kind == "IPAddress"
                && matches!(
                    e.reporting_controller.as_deref(),
                    Some("range-driver" | "metallb-driver" | "cilium-driver")
                ));
        let recent = e.event_time.as_ref().is_some_and(|t| t.0 >= since);
        let reason = e.reason.clone().unwrap_or_default();
        if ours && recent && REASONS.contains(&reason.as_str()) {
            *out.entry(format!("{kind}/{reason}")).or_default() += 1;
        }
    }
    Ok(out)
}

/// Creates a Service `name` of another load balancer in `ns` and writes a claimed, Bound
/// address of `classes` into its status; `None` when there is no such address right now.
/// The records the kit keeps on a Service of its pins, for both shipped drivers: what a
/// hostile tenant forges.
const FORGED_RECORDS: [&str; 3] = [
    "range-driver.drivers.local.sdn.cozystack.io/pinned",
    "metallb-driver.drivers.local.sdn.cozystack.io/pinned",
    "cilium-driver.drivers.local.sdn.cozystack.io/pinned",
];

/// A claim of the hostile tenant pinned to an address another namespace's claim holds: it
/// must never bind while that claim holds it (the invariants' `address-listed-twice`).
async fn foreign_pin(
    client: &Client,
    ns: &str,
    name: &str,
    rng: &mut Rng,
) -> Result<Option<String>, kube::Error> {
    let all = Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let held: Vec<&IPAddress> = all
        .iter()
        .filter(|a| {
            a.phase() == Some(AddressPhase::Bound)
                && a.spec.claim_ref.as_ref().is_some_and(|r| r.namespace != ns)
        })
        .collect();
    let Some(victim) = held.get(rng.below(held.len().max(1))) else {
        return Ok(None);
    };
    let body = json!({"metadata": {"name": name},
        "spec": {"className": victim.spec.class_name, "addressName": victim.name_any()}});
    let claim: IPAddressClaim = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    Api::<IPAddressClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &claim)
        .await?;
    Ok(Some(name.to_string()))
}

/// A claim of the hostile tenant with a controller owner reference to a ConfigMap of its
/// own, pinned to `target` (a static address of the Retain class) when there is one.
async fn self_owned_claim(
    client: &Client,
    ns: &str,
    name: &str,
    class: &str,
    target: Option<&str>,
) -> Result<(), kube::Error> {
    let owner = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap_or_default(),
        )
        .await?;
    let mut spec = json!({"className": class});
    if let Some(t) = target {
        spec["addressName"] = json!(t);
    }
    let body = json!({"metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1",
        "kind": "ConfigMap", "name": name, "uid": owner.metadata.uid, "controller": true}]},
        "spec": spec});
    let claim: IPAddressClaim = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    Api::<IPAddressClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &claim)
        .await?;
    Ok(())
}

/// What the hostile tenant must never have won, read at the end: every static address of
/// the Retain class still there (`statics` of them: its self-owned claims pinned some, and
/// the churn deleted those claims). A foreign pin that bound while the address was
/// another's would list it twice — the invariants' rule — and one that bound after its
/// victim let go and the release delay recycled the address bound legitimately.
async fn hostile_wins(
    client: &Client,
    static_prefix: &str,
    statics: usize,
    stats: &Stats,
) -> Result<()> {
    let left = Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|a| {
            a.name_any().starts_with(static_prefix) && a.metadata.deletion_timestamp.is_none()
        })
        .count();
    if left != statics
        && let Ok(mut v) = stats.hostile_wins.lock()
    {
        v.push(format!(
            "{} of the admin's {statics} static Retain addresses deleted",
            statics - left.min(statics)
        ));
    }
    Ok(())
}

async fn thief(
    client: &Client,
    ns: &str,
    name: &str,
    classes: &[&str],
    forge: bool,
    rng: &mut Rng,
) -> Result<Option<String>, kube::Error> {
    let all = Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let claimed: Vec<&IPAddress> = all
        .iter()
        .filter(|a| {
            classes.contains(&a.spec.class_name.as_str())
                && a.spec.claim_ref.is_some()
                && a.phase() == Some(AddressPhase::Bound)
        })
        .collect();
    let Some(victim) = claimed.get(rng.below(claimed.len().max(1))) else {
        return Ok(None);
    };
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let records: serde_json::Map<String, serde_json::Value> = FORGED_RECORDS
        .iter()
        .filter(|_| forge)
        .map(|k| (k.to_string(), json!(victim.spec.address)))
        .collect();
    let body = json!({"metadata": {"name": name, "annotations": records}, "spec": {"type": "LoadBalancer",
        "loadBalancerClass": "chaos.test/thief", "ports": [{"port": 80}]}});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap_or_default(),
    )
    .await?;
    api.patch_status(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"status": {"loadBalancer": {"ingress": [{"ip": victim.spec.address}]}}}),
        ),
    )
    .await?;
    Ok(Some(name.to_string()))
}

/// The admin's act: re-points a `Released` static address of `class` at the claim
/// `ns/name`, which does not exist yet, with the resourceVersion it was read at. `None`
/// when no static address is Released right now, or it changed in between.
async fn reserve(
    client: &Client,
    class: &str,
    ns: &str,
    name: &str,
    rng: &mut Rng,
) -> Option<Result<String, kube::Error>> {
    let api = Api::<IPAddress>::all(client.clone());
    let all = api.list(&ListParams::default()).await.ok()?.items;
    let released: Vec<&IPAddress> = all
        .iter()
        .filter(|a| {
            a.spec.class_name == class && a.spec.address.starts_with("10.203.") && a.is_released()
        })
        .collect();
    let a = released.get(rng.below(released.len().max(1)))?;
    let body = json!({"metadata": {"resourceVersion": a.metadata.resource_version},
        "spec": {"claimRef": {"namespace": ns, "name": name, "uid": null}}});
    match api
        .patch(
            &a.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(body),
        )
        .await
    {
        Ok(_) => Some(Ok(a.name_any())),
        Err(kube::Error::Api(s)) if s.code == 409 => None,
        Err(e) => Some(Err(e)),
    }
}

fn fail_reservation(stats: &Stats, what: String) {
    if let Ok(mut v) = stats.reservation_failures.lock() {
        v.push(what);
    }
}

/// Every reservation whose claim was created: while that claim exists, it holds the
/// reserved address (nobody else got it in between).
async fn check_reservations(client: &Client, made: &[Reservation], stats: &Stats) -> Result<()> {
    for (address, ns, name) in made {
        let claim = Api::<IPAddressClaim>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?;
        let Some(claim) = claim.filter(|c| c.metadata.deletion_timestamp.is_none()) else {
            continue; // deleted by the churn since: its address went the usual way
        };
        let lists = claim
            .status
            .iter()
            .flat_map(|s| &s.addresses)
            .any(|a| a.name == *address);
        if !lists {
            fail_reservation(
                stats,
                format!(
                    "claim {ns}/{name} ({:?}) does not hold {address}, which was reserved for it",
                    claim.status.as_ref().and_then(|s| s.phase)
                ),
            );
        }
    }
    Ok(())
}

/// An Available or Released address of `class`, to pin a claim to.
async fn pick_pin_target(client: &Client, class: &str, rng: &mut Rng) -> Option<String> {
    let all = Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ok()?
        .items;
    let candidates: Vec<String> = all
        .iter()
        .filter(|a| a.spec.class_name == class && a.spec.address.starts_with("10.203."))
        .filter(|a| {
            matches!(
                a.status.as_ref().and_then(|s| s.phase),
                Some(AddressPhase::Available | AddressPhase::Released)
            )
        })
        .map(|a| a.name_any())
        .collect();
    (!candidates.is_empty()).then(|| candidates[rng.below(candidates.len())].clone())
}

/// Creates a probe object, retrying for up to 30 s: a create may meet kube-apiserver while
/// another disruption restarts it. A retry of a create that landed but whose answer was lost
/// finds it there (409) — created all the same.
async fn create_surely<K>(api: &Api<K>, body: serde_json::Value) -> Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object: K = serde_json::from_value(body)?;
    wait_for(
        "a probe object created",
        Duration::from_secs(30),
        || async {
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(())),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await
}

/// Deletes `name`, retrying for up to 30 s while kube-apiserver is away; gone (404) is done.
async fn delete_surely<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    wait_for(
        &format!("{name} deleted"),
        Duration::from_secs(30),
        || async {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(Some(())),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await
}

/// Leader kills (with failover probes), driver kills, kube-apiserver and etcd restarts.
#[allow(clippy::too_many_arguments)]
async fn disruptions(
    client: &Client,
    lease_ns: &str,
    probe_class: &str,
    controllers: &Mutex<Vec<Pod>>,
    drivers: &Mutex<Vec<Pod>>,
    stats: &Stats,
    cfg: &Config,
    stop_at: Instant,
    cleanup: &mut Cleanup,
) -> Result<Vec<(Duration, Duration)>> {
    let mut rng = Rng::new(99);
    let start = Instant::now();
    // When to restart the control plane: spread over the run.
    let mut restarts: Vec<(Duration, &str)> = Vec::new();
    for k in 0..cfg.apiserver_restarts {
        restarts.push((
            cfg.duration
                .mul_f64((k as f64 + 0.5) / (cfg.apiserver_restarts as f64 + 0.5)),
            "kube-apiserver",
        ));
    }
    for k in 0..cfg.etcd_restarts {
        restarts.push((
            cfg.duration
                .mul_f64((k as f64 + 0.75) / (cfg.etcd_restarts as f64 + 0.75)),
            "etcd",
        ));
    }
    restarts.sort();
    let probe_ns = TestNamespace::create(client, "chaos-probe").await?;
    let mut failovers = Vec::new();
    let mut round = 0;
    loop {
        let (lo, hi) = cfg.kill_every;
        let wait = lo + (hi - lo).mul_f64(rng.below(1000) as f64 / 1000.0);
        let next = Instant::now() + wait;
        // Control-plane restarts due before the next kill.
        while let Some((at, what)) = restarts.first().copied() {
            if start + at > next || start + at > stop_at {
                break;
            }
            tokio::time::sleep_until((start + at).into()).await;
            restarts.remove(0);
            let dir = Cluster::get().dir.to_str().unwrap().to_string();
            let what = what.to_string();
            let component = what.clone();
            tokio::task::spawn_blocking(move || {
                let out = std::process::Command::new(repo_root().join("deploy/local/cluster.sh"))
                    .args(["restart", &dir, &component])
                    .output()?;
                if !out.status.success() {
                    bail!(
                        "restarting {component}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                Ok(())
            })
            .await??;
            if what == "etcd" {
                stats.etcd_restarts.fetch_add(1, Ordering::Relaxed);
            } else {
                stats.apiserver_restarts.fetch_add(1, Ordering::Relaxed);
            }
            // Replicas that lost their lease meanwhile come back, as a kubelet would.
            revive(controllers, stats).await?;
            revive(drivers, stats).await?;
        }
        if next > stop_at {
            break;
        }
        tokio::time::sleep_until(next.into()).await;
        revive(controllers, stats).await?;
        revive(drivers, stats).await?;
        round += 1;
        // SIGKILL the controllers' leader; probe how long until a claim binds again.
        if let Some(holder) = lease_holder_in(client, lease_ns, "address-controller")
            .await
            .ok()
            .flatten()
        {
            let address = format!("chaos-probe-{round}-{}", random_suffix());
            let body = json!({"metadata": {"name": address}, "spec": {"address": format!("10.204.{}.{}", round / 200, round % 200 + 1), "className": probe_class, "source": {"fromClass": {}}}});
            create_surely(&Api::<IPAddress>::all(client.clone()), body).await?;
            cleanup.add("ipaddresses.local.sdn.cozystack.io", &address);
            tokio::time::sleep(Duration::from_secs(1)).await;
            let killed = {
                let mut pods = controllers.lock().await;
                match pods.iter_mut().find(|p| p.process.user == holder) {
                    Some(p) => {
                        p.process.kill();
                        true
                    }
                    None => false,
                }
            };
            if killed {
                stats.leader_kills.fetch_add(1, Ordering::Relaxed);
                let t0 = Instant::now();
                let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), &probe_ns.name);
                let name = format!("probe-{round}");
                let body = json!({"metadata": {"name": name}, "spec": {"className": probe_class}});
                create_surely(&claims, body).await?;
                let lease = wait_for(
                    "a new controller leader",
                    Duration::from_secs(60),
                    || async {
                        let h = lease_holder_in(client, lease_ns, "address-controller").await?;
                        Ok(h.filter(|h| *h != holder).map(|_| t0.elapsed()))
                    },
                )
                .await?;
                let bound = wait_for("the probe claim Bound", Duration::from_secs(90), || async {
                    let c = claims.get(&name).await?;
                    Ok((c.status.and_then(|s| s.phase) == Some(ClaimPhase::Bound))
                        .then(|| t0.elapsed()))
                })
                .await?;
                failovers.push((lease, bound));
                revive(controllers, stats).await?;
            }
        }
        // And sometimes the drivers' leader.
        if round % 2 == 0
            && let Some(holder) = lease_holder_in(client, lease_ns, cfg.driver.kind().deployment)
                .await
                .ok()
                .flatten()
        {
            let mut pods = drivers.lock().await;
            if let Some(p) = pods.iter_mut().find(|p| p.process.user == holder) {
                p.process.kill();
                stats.driver_kills.fetch_add(1, Ordering::Relaxed);
                p.process.restart().await?;
            }
        }
    }
    drop(probe_ns);
    Ok(failovers)
}

/// Deletes what is left of the run's classes' addresses (their finalizers included).
async fn purge_class_addresses(client: &Client, classes: &[&str]) -> Result<()> {
    let api: Api<IPAddress> = Api::all(client.clone());
    for a in api.list(&ListParams::default()).await?.items {
        if classes.contains(&a.spec.class_name.as_str()) {
            let name = a.name_any();
            let _ = api
                .patch(
                    &name,
                    &Default::default(),
                    &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// A small deterministic generator (xorshift): the run is reproducible from its seeds.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// How long the quiet spell at the end of a run lasts.
const QUIET: Duration = Duration::from_secs(5);
/// How many writes the run's noisy writer makes in its spell (the positive control).
const NOISE_WRITES: usize = 3;

/// A Service of the run to be noisy on: the first of the namespaces'.
async fn noisy_target(client: &Client, namespaces: &[String]) -> Result<Option<(String, String)>> {
    for ns in namespaces {
        let list = Api::<Service>::namespaced(client.clone(), ns)
            .list(&ListParams::default().limit(1))
            .await?;
        if let Some(s) = list.items.first() {
            return Ok(Some((ns.clone(), s.name_any())));
        }
    }
    Ok(None)
}

/// The Services of NAMESPACES modified more than once during [`QUIET`], as
/// `ns/name: N writes`, read from a watch that starts at the current revision. With NOISE,
/// this function patches that Service [`NOISE_WRITES`] times within the spell itself.
async fn writes_in_quiet(
    client: &Client,
    namespaces: &[String],
    noise: Option<&(String, String)>,
) -> Result<Vec<String>> {
    use futures::StreamExt;
    use kube::api::{Patch, PatchParams, WatchEvent, WatchParams};
    let api = Api::<Service>::all(client.clone());
    let rv = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let params = WatchParams::default().timeout(u32::try_from(QUIET.as_secs()).unwrap_or(5));
    let mut stream = api.watch(&params, &rv).await?.boxed();
    let writer = noise.cloned().map(|(ns, name)| {
        let api = Api::<Service>::namespaced(client.clone(), &ns);
        tokio::spawn(async move {
            for k in 0..NOISE_WRITES {
                let body = json!({"metadata": {"labels": {"chaos-noise": k.to_string()}}});
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                    .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    });
    let mut writes: std::collections::BTreeMap<String, usize> = Default::default();
    let deadline = tokio::time::Instant::now() + QUIET + Duration::from_secs(2);
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.next()).await {
        if let Ok(WatchEvent::Modified(s)) = ev {
            let ns = s.namespace().unwrap_or_default();
            if namespaces.contains(&ns) {
                *writes.entry(format!("{ns}/{}", s.name_any())).or_default() += 1;
            }
        }
    }
    if let Some(w) = writer {
        let _ = w.await;
    }
    Ok(writes
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, n)| format!("{k}: {n} writes"))
        .collect())
}
