//! `make bench-latency`: what a tenant waits for while others churn. On a local control
//! plane of its own: a base of N bound claims and addresses, two controller replicas (one
//! leading, production flags) and two range-driver replicas; then, per arrival rate, an
//! open-loop stream of arrivals (scheduled at fixed intervals, whatever the answers do):
//!
//! * `static` — a claim of a `Retain` class with free addresses (release delay 1 s, so the
//!   pool recycles);
//! * `driver` — a claim of the range driver's `Delete` class (nothing free: provisioned);
//! * `svc-auto` — a LoadBalancer Service that gets an auto-claim of the driver's class;
//! * `svc-claim` — a claim of the driver's class and a Service annotated with it.
//!
//! Each lives a pseudo-random 1–5 s after it is served, then is deleted. Latencies are
//! taken from the scheduled arrival (so a slow answer delays nothing behind it — no
//! coordinated omission) to what a watch of the bench's own sees: the claim `Bound`, the
//! Service's `status.loadBalancer.ingress`, the address `Released` or gone after the
//! claim's delete. Then the **floor**: the controllers and drivers stopped, a plain client
//! makes the same writes for the same arrivals of every path, in the same order, ending in
//! the same observed write (for the Service paths: the auto-claim's create and the
//! Service's annotation, the driver's bind, `associatedTo`, the Service's ingress). Asserts
//! nothing about speed.
//!
//! ```text
//! bench-latency [--base 10000] [--rates 5,10,20,50,100] [--step 20] [--no-protection-policy]
//!               [--kube-api-qps Q]   (the core's and drivers' client limit; 0: none)
//!               [--takeover RATE]    (then a step at RATE through four leader takeovers)
//! ```
//!
//! As a default install has it, the chart's protection policy puts the core's finalizers on
//! at creation (`--no-protection-policy`: the core writes them).
//!
//! Per rate and path: p50 / p90 / p99 / max of arrival → served (and of the floor), p99
//! over the floor's, delete → released; per rate the CPU of the controllers, the drivers
//! and kube-apiserver per arrival, and the writes (claims, addresses, Services, events) of
//! the controllers and drivers per arrival of each path (from the audit log). The knee:
//! the first rate whose p99 is over twice the lowest rate's.
//!
//! And the profile of the claim paths' tails, ours and the floor's, from the audit log's
//! request and answer times of every write on an arrival's claim and address: where the
//! wait went — before the first write reached kube-apiserver, in kube-apiserver, between one
//! answer and the next request (watches, queues, the work), after the observed write until
//! the bench's watch saw it — for every arrival and for the slowest 1%, and the slowest
//! arrival's writes in turn.
//!
//! `--takeover RATE`: after our steps, one more at RATE through the end of each leader — the
//! core's, then the driver's; each stopped cleanly (SIGTERM) and killed (SIGKILL) — with the
//! time until the other replica held the Lease and what the next 40 s of arrivals waited.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use address_controller_api::names::{
    AUTO_CLAIM_CLASS_ANNOTATION, CLAIM_FINALIZER, PROVISIONER_ANNOTATION, SERVICE_CLAIM_ANNOTATION,
};
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::bench::{
    GoGc, apply_protection_policy, bound_claims, create_all, create_namespaces, delta, go_gcs,
    ipv4, kas_pid, on_own_control_plane, quantile, writes,
};
use address_controller_tests::env::RANGE_PROVISIONER;
use address_controller_tests::{
    AuditedWrite, ControllerProcess, audit_log, cpu_time, http_get, setup, sum_samples,
};
use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Label on everything the load creates (the bench's watches select it).
const LOAD_LABEL: &str = "bench.local.sdn.cozystack.io/load";
/// Namespaces the load spreads over.
const LOAD_NAMESPACES: usize = 20;
/// Free addresses of the static class (recycled through the release delay).
const POOL: usize = 3000;
/// How long one arrival may wait for each step before it counts as timed out.
const PATIENCE: Duration = Duration::from_secs(120);
/// The controllers' and drivers' identities (the audit log's impersonated users).
const PROCESSES: [&str; 4] = ["ctl-a", "ctl-b", "drv-a", "drv-b"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Path {
    Static,
    Driver,
    SvcAuto,
    SvcClaim,
}

impl Path {
    const ALL: [Path; 4] = [Path::Static, Path::Driver, Path::SvcAuto, Path::SvcClaim];

    fn name(self) -> &'static str {
        match self {
            Path::Static => "static",
            Path::Driver => "driver",
            Path::SvcAuto => "svc-auto",
            Path::SvcClaim => "svc-claim",
        }
    }

    /// The prefix of the names of its objects (claims, Services).
    fn prefix(self) -> &'static str {
        match self {
            Path::Static => "st",
            Path::Driver => "dr",
            Path::SvcAuto => "sv",
            Path::SvcClaim => "sc",
        }
    }

    fn of_name(name: &str) -> Option<Path> {
        Path::ALL
            .into_iter()
            .find(|p| name.starts_with(&format!("{}-", p.prefix())))
    }

    /// The `i`-th arrival's path: 8 static, 6 driver, 3 + 3 Services in every 20.
    fn of_arrival(i: usize) -> Path {
        match i % 20 {
            0..=7 => Path::Static,
            8..=13 => Path::Driver,
            14..=16 => Path::SvcAuto,
            _ => Path::SvcClaim,
        }
    }
}

/// What a watch saw, and when.
#[derive(Debug)]
struct Seen {
    at: Instant,
    /// The claim's addresses (for `bound:` keys).
    addresses: Vec<String>,
}

/// The bench's own watches: a waiter registers a key before it writes, the watch fires it.
/// Keys: `bound:NS/NAME` (claim Bound), `ingress:NS/NAME` (Service has an ingress),
/// `released:NAME` (address Released or gone).
#[derive(Default)]
struct Observer {
    waiters: Mutex<HashMap<String, oneshot::Sender<Seen>>>,
    /// Address → the claims its claimRef named, in turn, each with when the watch last
    /// saw the address serving it (for the write attribution: addresses are recycled).
    claims_of: Mutex<Turns>,
}

impl Observer {
    fn expect(&self, key: String) -> oneshot::Receiver<Seen> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.waiters.lock() {
            w.insert(key, tx);
        }
        rx
    }

    fn fire(&self, key: &str, addresses: Vec<String>) {
        let tx = self.waiters.lock().ok().and_then(|mut w| w.remove(key));
        if let Some(tx) = tx {
            let _ = tx.send(Seen {
                at: Instant::now(),
                addresses,
            });
        }
    }

    fn claim(&self, c: &IPAddressClaim) {
        let bound = c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Bound);
        if bound {
            let addresses = c
                .status
                .as_ref()
                .map(|s| s.addresses.iter().map(|a| a.name.clone()).collect())
                .unwrap_or_default();
            self.fire(&format!("bound:{}", ns_name(&c.metadata)), addresses);
        }
    }

    fn address(&self, a: &IPAddress, gone: bool) {
        let name = a.metadata.name.clone().unwrap_or_default();
        if let Ok(mut m) = self.claims_of.lock() {
            let turns = m.entry(name.clone()).or_default();
            let now = Timestamp::now();
            let current = turns.last().map(|(c, _)| c.clone());
            match &a.spec.claim_ref {
                // A new claim's turn, or the current one goes on (released, then freed).
                Some(r) if current.as_ref() != Some(&r.name) => turns.push((r.name.clone(), now)),
                _ => {
                    if let Some(last) = turns.last_mut() {
                        last.1 = now;
                    }
                }
            }
        }
        let released = a.status.as_ref().and_then(|s| s.phase) == Some(AddressPhase::Released);
        if gone || released {
            self.fire(&format!("released:{name}"), vec![]);
        }
    }

    fn service(&self, s: &Service) {
        let served = s
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| !i.is_empty());
        if served {
            self.fire(&format!("ingress:{}", ns_name(&s.metadata)), vec![]);
        }
    }
}

fn ns_name(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or("")
    )
}

/// Starts the three watches; returns once each has listed.
async fn observe(client: &Client) -> Result<Arc<Observer>> {
    let obs = Arc::new(Observer::default());
    let load = watcher::Config::default().labels(LOAD_LABEL);
    let mut listed = Vec::new();
    macro_rules! watch {
        ($api:expr, $config:expr, $apply:expr, $delete:expr) => {{
            let (tx, rx) = oneshot::channel::<()>();
            listed.push(rx);
            let obs = obs.clone();
            let mut events = watcher($api, $config).boxed();
            tokio::spawn(async move {
                let mut tx = Some(tx);
                while let Some(e) = events.next().await {
                    match e {
                        Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => $apply(&obs, &o),
                        Ok(Event::Delete(o)) => $delete(&obs, &o),
                        Ok(Event::InitDone) => {
                            if let Some(t) = tx.take() {
                                let _ = t.send(());
                            }
                        }
                        _ => {}
                    }
                }
            });
        }};
    }
    watch!(
        Api::<IPAddressClaim>::all(client.clone()),
        load.clone(),
        |o: &Observer, c: &IPAddressClaim| o.claim(c),
        |_: &Observer, _: &IPAddressClaim| {}
    );
    watch!(
        Api::<IPAddress>::all(client.clone()),
        watcher::Config::default(),
        |o: &Observer, a: &IPAddress| o.address(a, false),
        |o: &Observer, a: &IPAddress| o.address(a, true)
    );
    watch!(
        Api::<Service>::all(client.clone()),
        load,
        |o: &Observer, s: &Service| o.service(s),
        |_: &Observer, _: &Service| {}
    );
    for rx in listed {
        rx.await.context("a watch ended before listing")?;
    }
    Ok(obs)
}

/// One arrival's figures (seconds); `None` where it timed out.
#[derive(Debug, Default, Clone)]
struct Sample {
    served: Option<f64>,
    released: Option<f64>,
    /// The bench's delete found the Service gone (someone else deleted it): its namespace
    /// and name.
    vanished: Option<(String, String)>,
    /// A claim path's arrival: its claim and, by the wall clock (the audit log's), when it
    /// was scheduled and when the watch saw it `Bound`.
    trace: Option<Trace>,
}

#[derive(Debug, Clone)]
struct Trace {
    claim: String,
    arrived: Timestamp,
    seen: Timestamp,
}

/// Milliseconds from `a` to `b`.
fn ms_between(a: Timestamp, b: Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64() * 1000.0
}

/// `at` by the wall clock.
fn wall(at: Instant) -> Timestamp {
    let now = Instant::now();
    if at <= now {
        Timestamp::now() - now.duration_since(at)
    } else {
        Timestamp::now() + at.duration_since(now)
    }
}

/// A pseudo-random lifetime of 1–5 s from the arrival's index.
fn lifetime(i: usize) -> Duration {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    Duration::from_millis(1000 + x % 4000)
}

struct Load {
    client: Client,
    obs: Arc<Observer>,
    /// `Some`: the floor — a plain client makes the writes (pool addresses by turn).
    floor: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

async fn wait_seen(rx: oneshot::Receiver<Seen>) -> Option<Seen> {
    tokio::time::timeout(PATIENCE, rx).await.ok()?.ok()
}

fn claim_body(name: &str, class: &str) -> Value {
    json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
        "metadata": {"name": name, "labels": {LOAD_LABEL: "1"}}, "spec": {"className": class}})
}

fn service_body(name: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {LOAD_LABEL: "1"}, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
            "selector": {"app": name}, "ports": [{"port": 80}]}})
}

impl Load {
    /// One arrival, from its scheduled time `t0` to the end of its life.
    async fn arrival(
        &self,
        path: Path,
        ns: &str,
        name: &str,
        t0: Instant,
        i: usize,
    ) -> Result<Sample> {
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), ns);
        let services: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let mut sample = Sample::default();
        let class = if path == Path::Static {
            "static"
        } else {
            "driver"
        };
        match path {
            Path::Static | Path::Driver => {
                let rx = self.obs.expect(format!("bound:{ns}/{name}"));
                claims
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(claim_body(name, class))?,
                    )
                    .await
                    .context("creating the claim")?;
                let addresses = match &self.floor {
                    Some(turn) => Some(self.floor_bind(path, ns, name, turn).await?.0),
                    None => None,
                };
                let Some(seen) = wait_seen(rx).await else {
                    return Ok(sample);
                };
                sample.served = Some(seen.at.duration_since(t0).as_secs_f64());
                sample.trace = Some(Trace {
                    claim: name.to_string(),
                    arrived: wall(t0),
                    seen: wall(seen.at),
                });
                tokio::time::sleep(lifetime(i)).await;
                let addresses = addresses.map_or(seen.addresses, |a| vec![a]);
                let Some(address) = addresses.first() else {
                    bail!("{ns}/{name} is Bound with no address");
                };
                let rx = self.obs.expect(format!("released:{address}"));
                let t = Instant::now();
                claims.delete(name, &DeleteParams::default()).await?;
                if self.floor.is_some() {
                    self.floor_release(path, ns, name, address).await?;
                }
                if let Some(seen) = wait_seen(rx).await {
                    sample.released = Some(seen.at.duration_since(t).as_secs_f64());
                }
            }
            Path::SvcAuto | Path::SvcClaim => {
                let annotations = if path == Path::SvcClaim {
                    claims
                        .create(
                            &PostParams::default(),
                            &serde_json::from_value(claim_body(name, class))?,
                        )
                        .await?;
                    json!({SERVICE_CLAIM_ANNOTATION: name})
                } else {
                    json!({})
                };
                let rx = self.obs.expect(format!("ingress:{ns}/{name}"));
                let svc = services
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(service_body(name, annotations))?,
                    )
                    .await?;
                let floor_address = match &self.floor {
                    Some(turn) => Some(self.floor_associate(path, &svc, turn).await?),
                    None => None,
                };
                let Some(seen) = wait_seen(rx).await else {
                    return Ok(sample);
                };
                sample.served = Some(seen.at.duration_since(t0).as_secs_f64());
                tokio::time::sleep(lifetime(i)).await;
                match services.delete(name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        sample.vanished = Some((ns.to_string(), name.to_string()))
                    }
                    r => {
                        r.context("deleting the Service")?;
                    }
                }
                if path == Path::SvcClaim {
                    claims
                        .delete(name, &DeleteParams::default())
                        .await
                        .context("deleting the claim")?;
                }
                if let Some(address) = floor_address {
                    // The auto-claim goes with its Service (garbage collection); its
                    // finalizer and the address's as the core and the driver drop them.
                    self.floor_release(Path::Driver, ns, name, &address).await?;
                }
            }
        }
        Ok(sample)
    }

    /// The floor's association, in the core's and the driver's order: for an auto-claim the
    /// claim's create (owned by the Service) and the Service's claim annotation; the
    /// driver's bind ([`Load::floor_bind`]); the address's `associatedTo`; the Service's
    /// ingress (the write the watch sees). Returns the address.
    async fn floor_associate(
        &self,
        path: Path,
        svc: &Service,
        turn: &std::sync::atomic::AtomicUsize,
    ) -> Result<String> {
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let services: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let pp = PatchParams::default();
        if path == Path::SvcAuto {
            let mut body = claim_body(name, "driver");
            body["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Service",
                "name": name, "uid": svc.metadata.uid, "controller": true}]);
            Api::<IPAddressClaim>::namespaced(self.client.clone(), ns)
                .create(&PostParams::default(), &serde_json::from_value(body)?)
                .await
                .context("creating the auto-claim")?;
            services
                .patch(
                    name,
                    &pp,
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: name}}}),
                    ),
                )
                .await?;
        }
        let (address, ip) = self.floor_bind(Path::Driver, ns, name, turn).await?;
        Api::<IPAddress>::all(self.client.clone())
            .patch_status(
                &address,
                &pp,
                &Patch::Merge(json!({"status": {"associatedTo":
                    {"kind": "Service", "namespace": ns, "name": name}}})),
            )
            .await?;
        services
            .patch_status(
                name,
                &pp,
                &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})),
            )
            .await?;
        Ok(address)
    }

    /// The floor's bind, in the controller's order: the claim's finalizer and stamp; for a
    /// driver claim its `Pending` status, the address's create (claimRef pre-set) and its
    /// protection finalizer; for a static one the address's claimRef; the claim's status
    /// `Bound` (the write the watch sees); the address's status `Bound`. Returns the address
    /// and its IP.
    async fn floor_bind(
        &self,
        path: Path,
        ns: &str,
        name: &str,
        turn: &std::sync::atomic::AtomicUsize,
    ) -> Result<(String, String)> {
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), ns);
        let addresses: Api<IPAddress> = Api::all(self.client.clone());
        let pp = PatchParams::default();
        let claim = claims
            .patch(
                name,
                &pp,
                &Patch::Merge(json!({"metadata": {"finalizers": [CLAIM_FINALIZER],
                    "annotations": {PROVISIONER_ANNOTATION: "floor"}}})),
            )
            .await?;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let claim_ref = json!({"namespace": ns, "name": name, "uid": uid});
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let condition = |reason: &str| {
            json!([{"type": "Bound", "status": if reason == "Bound" { "True" } else { "False" },
                "reason": reason, "message": "", "lastTransitionTime": now}])
        };
        let ip;
        let address = match path {
            Path::Driver => {
                claims
                    .patch_status(
                        name,
                        &pp,
                        &Patch::Merge(json!({"status": {"phase": "Pending",
                            "conditions": condition("WaitingForProvisioning")}})),
                    )
                    .await?;
                let address = format!("fd-{name}");
                let n = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                ip = ipv4(0x0050_0000 + n);
                let body = json!({"metadata": {"name": address},
                    "spec": {"address": ip, "className": "floor",
                        "reclaimPolicy": "Delete", "claimRef": claim_ref, "source": {"fromClass": {}}}});
                addresses
                    .create(&PostParams::default(), &serde_json::from_value(body)?)
                    .await?;
                addresses
                    .patch(
                        &address,
                        &pp,
                        &Patch::Merge(json!({"metadata": {"finalizers": [address_controller_api::names::ADDRESS_FINALIZER]}})),
                    )
                    .await?;
                address
            }
            _ => {
                let n = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let address = pool_name(n % POOL);
                ip = ipv4(0x0020_0000 + n % POOL);
                addresses
                    .patch(
                        &address,
                        &pp,
                        &Patch::Merge(json!({"spec": {"claimRef": claim_ref}})),
                    )
                    .await?;
                address
            }
        };
        claims
            .patch_status(
                name,
                &pp,
                &Patch::Merge(
                    json!({"status": {"phase": "Bound", "addresses": [{"name": address, "address": ip}],
                    "conditions": condition("Bound")}}),
                ),
            )
            .await?;
        addresses
            .patch_status(
                &address,
                &pp,
                &Patch::Merge(json!({"status": {"phase": "Bound"}})),
            )
            .await?;
        Ok((address, ip))
    }

    /// The floor's reclaim: a static address `Released` (the write the watch sees), the
    /// claim's finalizer dropped, then — the release delay — the address free again; a
    /// driver's address deleted (its finalizer first), then the claim's finalizer.
    async fn floor_release(&self, path: Path, ns: &str, name: &str, address: &str) -> Result<()> {
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), ns);
        let addresses: Api<IPAddress> = Api::all(self.client.clone());
        let pp = PatchParams::default();
        let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        match path {
            Path::Driver => {
                addresses.delete(address, &DeleteParams::default()).await?;
                addresses.patch(address, &pp, &unfinalize).await?;
                claims.patch(name, &pp, &unfinalize).await?;
            }
            _ => {
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                addresses
                    .patch_status(
                        address,
                        &pp,
                        &Patch::Merge(json!({"status": {"phase": "Released", "releasedAt": now}})),
                    )
                    .await?;
                claims.patch(name, &pp, &unfinalize).await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
                addresses
                    .patch(
                        address,
                        &pp,
                        &Patch::Merge(json!({"spec": {"claimRef": null}})),
                    )
                    .await?;
                addresses
                    .patch_status(
                        address,
                        &pp,
                        &Patch::Merge(
                            json!({"status": {"phase": "Available", "releasedAt": null}}),
                        ),
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

fn pool_name(i: usize) -> String {
    format!("p-{i:05}")
}

/// One rate's run: arrivals at `rate` per second for `step`, every life to its end.
/// `run` marks the names of its objects (`f`: the floor's, `t`: the takeover's) apart from
/// those of other runs: an auto-claim may still be in deletion (garbage collection after its
/// Service, its finalizer left when the core stopped).
async fn step(
    load: Arc<Load>,
    rate: usize,
    step: Duration,
    run: &'static str,
) -> Result<Vec<(Path, Sample)>> {
    let n = (rate as f64 * step.as_secs_f64()) as usize;
    let start = Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let path = Path::of_arrival(i);
        let t0 = start + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(t0.into()).await;
        let ns = format!("load-{:02}", i % LOAD_NAMESPACES);
        let name = format!("{}-{run}{rate:04}-{i:05}", path.prefix());
        let load = load.clone();
        tasks.push(tokio::spawn(async move {
            let r = load.arrival(path, &ns, &name, t0, i).await;
            (path, r.with_context(|| format!("{ns}/{name}")))
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        let (path, r) = t.await?;
        out.push((path, r?));
    }
    Ok(out)
}

fn summary(samples: &[f64]) -> [Option<f64>; 4] {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    [0.5, 0.9, 0.99, 1.0].map(|q| quantile(&v, q).map(|s| s * 1000.0))
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "—".into())
}

/// CPU seconds of the processes.
fn cpu(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|p| cpu_time(*p).ok())
        .map(|d| d.as_secs_f64())
        .sum()
}

/// Writes of the controllers and drivers to claims and addresses per path and rate, and
/// per path by `resource/subresource verb` (from the audit log). A claim's writes go by its
/// name; an address's to the claim it served when written (the first turn the watch still
/// saw at or after the write).
#[allow(clippy::type_complexity)]
fn audited(
    log: &[AuditedWrite],
    claims_of: &Turns,
) -> (BTreeMap<(Path, usize), f64>, BTreeMap<(Path, String), f64>) {
    let (mut by_rate, mut by_kind) = (BTreeMap::new(), BTreeMap::new());
    for w in log {
        if !PROCESSES.contains(&w.impersonated.as_str()) || w.resource == "services" {
            continue;
        }
        let Some(claim) = claim_of(w, claims_of) else {
            continue;
        };
        let (Some(path), Some(rate)) = (
            Path::of_name(claim),
            claim
                .split('-')
                .nth(1)
                .and_then(|r| r.parse::<usize>().ok()),
        ) else {
            continue;
        };
        *by_rate.entry((path, rate)).or_default() += 1.0;
        let kind = format!(
            "{}{} {}",
            w.resource,
            w.subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default(),
            w.verb
        );
        *by_kind.entry((path, kind)).or_default() += 1.0;
    }
    (by_rate, by_kind)
}

/// Address → the claims its claimRef named, in turn, with when the watch last saw each.
type Turns = HashMap<String, Vec<(String, Timestamp)>>;

/// The claim a write to a claim or an address was for: a claim's own name; for an address
/// the claim it served when written (the first turn the watch still saw at or after it).
fn claim_of<'a>(w: &'a AuditedWrite, claims_of: &'a Turns) -> Option<&'a str> {
    let name = w.name.as_deref()?;
    match w.resource.as_str() {
        "ipaddresses" => {
            let turns = claims_of.get(name)?;
            let at = w.received?;
            turns
                .iter()
                .find(|(_, seen)| *seen >= at)
                .or(turns.last())
                .map(|(c, _)| c.as_str())
        }
        "ipaddressclaims" => Some(name),
        _ => None,
    }
}

/// Where one arrival's wait went, in ms: before its first write reached kube-apiserver
/// (the bench's create), in kube-apiserver (the union of its writes' request → answer),
/// between the writes (watch deliveries, queues, the controllers' and drivers' work, the
/// clients' limits), after the observed write was answered until the bench's watch saw it.
#[derive(Debug, Default, Clone, Copy)]
struct Split {
    before: f64,
    api: f64,
    between: f64,
    after: f64,
    writes: f64,
}

impl Split {
    fn of(t: &Trace, chain: &[&AuditedWrite]) -> Option<Split> {
        let mut spans: Vec<(Timestamp, Timestamp)> = chain
            .iter()
            .filter_map(|w| w.received.zip(w.completed))
            .filter(|(r, c)| *r >= t.arrived && *c <= t.seen)
            .collect();
        spans.sort();
        let first = spans.first()?.0;
        let last = spans.iter().map(|s| s.1).max()?;
        let (mut api, mut reach) = (0.0, first);
        for &(r, c) in &spans {
            let from = r.max(reach);
            if c > from {
                api += ms_between(from, c);
                reach = c;
            }
        }
        Some(Split {
            before: ms_between(t.arrived, first),
            api,
            between: ms_between(first, last) - api,
            after: ms_between(last, t.seen),
            writes: spans.len() as f64,
        })
    }

    fn mean(splits: &[Split]) -> Split {
        let n = splits.len().max(1) as f64;
        let sum = |f: fn(&Split) -> f64| splits.iter().map(f).sum::<f64>() / n;
        Split {
            before: sum(|s| s.before),
            api: sum(|s| s.api),
            between: sum(|s| s.between),
            after: sum(|s| s.after),
            writes: sum(|s| s.writes),
        }
    }

    fn row(&self) -> String {
        format!(
            "{:.0} / {:.0} / {:.0} / {:.0} ({:.1} writes)",
            self.before, self.api, self.between, self.after, self.writes
        )
    }
}

/// The profile of the claim paths' tails: per run, rate and path, where the wait of every
/// arrival and of the slowest 1% went ([`Split`]), and the slowest arrival's writes in turn.
fn profile(
    ours: &Run,
    floor: &Run,
    log: &[AuditedWrite],
    claims_of: &Turns,
    gcs: &[(&str, Vec<GoGc>)],
) -> String {
    let mut chains: HashMap<&str, Vec<&AuditedWrite>> = HashMap::new();
    for w in log {
        if let Some(c) = claim_of(w, claims_of) {
            chains.entry(c).or_default().push(w);
        }
    }
    let mut table = vec![
        "| run | rate/s | path | all: before / in kube-apiserver / between / after ms | slowest 1%: the same | the slowest | the slowest 1% arrived (s into the step) | etcd compactions in the step |".to_string(),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut slowest = Vec::new();
    for (label, run) in [("ours", ours), ("floor", floor)] {
        for (rate, samples) in &run.samples {
            for path in [Path::Static, Path::Driver] {
                let mut traced: Vec<(f64, &Trace, Split)> = samples
                    .iter()
                    .filter(|(p, _)| *p == path)
                    .filter_map(|(_, s)| {
                        let t = s.trace.as_ref()?;
                        let chain = chains.get(t.claim.as_str())?;
                        Some((s.served?, t, Split::of(t, chain)?))
                    })
                    .collect();
                if traced.is_empty() {
                    continue;
                }
                traced.sort_by(|a, b| b.0.total_cmp(&a.0));
                let tail = traced.len().div_ceil(100);
                let all: Vec<Split> = traced.iter().map(|t| t.2).collect();
                let (served, t, split) = traced[0];
                let (began, compactions) = run.steps.get(rate).copied().unwrap_or_default();
                let mut when: Vec<f64> = traced[..tail]
                    .iter()
                    .map(|(_, t, _)| t.arrived.duration_since(began).as_secs_f64())
                    .collect();
                when.sort_by(f64::total_cmp);
                table.push(format!(
                    "| {label} | {rate} | {} | {} | {} | {:.0} ms: {} | {} | {} |",
                    path.name(),
                    Split::mean(&all).row(),
                    Split::mean(&all[..tail]).row(),
                    served * 1000.0,
                    split.row(),
                    when.iter()
                        .map(|w| format!("{w:.1}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if compactions.count > 0.0 {
                        format!(
                            "{:.0}, {:.0} ms, the last ended ~{:.0} s in",
                            compactions.count, compactions.ms, compactions.last
                        )
                    } else {
                        "none".into()
                    },
                ));
                let mut chain = chains.get(t.claim.as_str()).cloned().unwrap_or_default();
                chain.retain(|w| w.received.is_some_and(|r| r >= t.arrived && r <= t.seen));
                chain.sort_by_key(|w| w.received);
                let at = |ts: Timestamp| ms_between(t.arrived, ts);
                let steps: Vec<String> = chain
                    .iter()
                    .map(|w| {
                        format!(
                            "+{:.0} {} {} {}{} {:.0}",
                            w.received.map(at).unwrap_or(0.0),
                            if w.impersonated.is_empty() {
                                "bench"
                            } else {
                                w.impersonated.as_str()
                            },
                            w.verb,
                            w.resource,
                            w.subresource
                                .as_deref()
                                .map(|s| format!("/{s}"))
                                .unwrap_or_default(),
                            w.received
                                .zip(w.completed)
                                .map(|(r, c)| ms_between(r, c))
                                .unwrap_or(0.0),
                        )
                    })
                    .collect();
                slowest.push(format!(
                    "  {label} {rate}/s {}: {} | seen +{:.0}",
                    t.claim,
                    steps.join(" | "),
                    at(t.seen)
                ));
            }
        }
    }
    format!(
        "Where the claim paths' wait went (mean ms; writes by their arrival at kube-apiserver, `between` is the watches, queues and work between one answer and the next request):\n\n{}\n\nThe slowest arrival of each (+ms from its scheduled arrival, who, the request, ms in kube-apiserver):\n{}\n\n{}",
        table.join("\n"),
        slowest.join("\n"),
        collections(ours, floor, gcs),
    )
}

/// Services the bench found deleted when it came to delete them, and who deleted them
/// (the audit log).
fn vanished(run: &Run, log: &[AuditedWrite]) -> String {
    let gone: Vec<&(String, String)> = run
        .samples
        .values()
        .flatten()
        .filter_map(|(_, s)| s.vanished.as_ref())
        .collect();
    if gone.is_empty() {
        return String::new();
    }
    let mut out = format!("\n\n{} Services were deleted by someone else:", gone.len());
    for w in log {
        if w.verb == "delete"
            && w.resource == "services"
            && gone
                .iter()
                .any(|(ns, n)| w.namespace.as_deref() == Some(ns) && w.name.as_deref() == Some(n))
        {
            out.push_str(&format!(
                "\n  {}/{} by {} ({}): {}",
                w.namespace.as_deref().unwrap_or(""),
                w.name.as_deref().unwrap_or(""),
                w.user,
                w.user_agent,
                w.code
            ));
        }
    }
    out
}

/// etcd's compactions (kube-apiserver asks for one every 5 minutes): how many, their total
/// ms, and the unix time of the last one.
#[derive(Debug, Default, Clone, Copy)]
struct Compactions {
    count: f64,
    ms: f64,
    last: f64,
}

impl Compactions {
    async fn now() -> Result<Compactions> {
        let port = address_controller_tests::Cluster::get().env_var("ETCD_PORT")?;
        let (_, m) = http_get(&format!("http://127.0.0.1:{port}/metrics")).await?;
        let v = |name: &str| sum_samples(&m, name, |l| l.starts_with(&format!("{name} ")));
        Ok(Compactions {
            count: v("etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count"),
            ms: v("etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_sum"),
            last: v("etcd_debugging_mvcc_db_compaction_last"),
        })
    }
}

struct Run {
    samples: BTreeMap<usize, Vec<(Path, Sample)>>,
    /// Per rate: when the step began (the wall clock), and etcd's compactions during it
    /// (`last`: the last one's seconds into the step).
    steps: BTreeMap<usize, (Timestamp, Compactions)>,
    /// Per rate: CPU seconds of (controllers, drivers, kube-apiserver).
    cpu: BTreeMap<usize, (f64, f64, f64)>,
    /// Per rate: writes kube-apiserver counted during the step, by resource.
    writes: BTreeMap<usize, BTreeMap<String, f64>>,
}

async fn run(
    load: Arc<Load>,
    rates: &[usize],
    dur: Duration,
    pids: (&[u32], &[u32]),
) -> Result<Run> {
    let kas = kas_pid()?;
    let mut r = Run {
        samples: BTreeMap::new(),
        steps: BTreeMap::new(),
        cpu: BTreeMap::new(),
        writes: BTreeMap::new(),
    };
    for &rate in rates {
        let (c0, d0, k0) = (cpu(pids.0), cpu(pids.1), cpu(&[kas]));
        let w0 = writes()?;
        let e0 = Compactions::now().await?;
        let (t, began) = (Instant::now(), Timestamp::now());
        let marker = if load.floor.is_some() { "f" } else { "" };
        let samples = step(load.clone(), rate, dur, marker).await?;
        let e1 = Compactions::now().await?;
        let began_s = began.as_millisecond() as f64 / 1000.0;
        r.steps.insert(
            rate,
            (
                began,
                Compactions {
                    count: e1.count - e0.count,
                    ms: e1.ms - e0.ms,
                    last: e1.last - began_s,
                },
            ),
        );
        let served = samples.iter().filter(|(_, s)| s.served.is_some()).count();
        eprintln!(
            "{} {rate}/s: {} arrivals, {served} served, in {:.1?}",
            if load.floor.is_some() {
                "floor"
            } else {
                "ours"
            },
            samples.len(),
            t.elapsed()
        );
        r.cpu
            .insert(rate, (cpu(pids.0) - c0, cpu(pids.1) - d0, cpu(&[kas]) - k0));
        r.samples.insert(rate, samples);
        // The last release delay's recycling belongs to this step.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let w1 = writes()?;
        let per: BTreeMap<String, f64> = ["events", "services", "ipaddressclaims", "ipaddresses"]
            .iter()
            .map(|k| (k.to_string(), delta(&w1, &w0, &[k])))
            .collect();
        r.writes.insert(rate, per);
    }
    Ok(r)
}

fn served(samples: &[(Path, Sample)], path: Path) -> Vec<f64> {
    samples
        .iter()
        .filter(|(p, _)| *p == path)
        .filter_map(|(_, s)| s.served)
        .collect()
}

fn knee(p99: &[(usize, Option<f64>)]) -> String {
    let Some(base) = p99.first().and_then(|(_, v)| *v) else {
        return "—".into();
    };
    p99.iter()
        .find(|(_, v)| v.is_none_or(|v| v > 2.0 * base))
        .map(|(r, _)| format!("{r}/s"))
        .unwrap_or_else(|| format!("> {}/s", p99.last().map(|(r, _)| *r).unwrap_or(0)))
}

#[allow(clippy::type_complexity)]
fn report(
    ours: &Run,
    floor: &Run,
    (writes, kinds): &(BTreeMap<(Path, usize), f64>, BTreeMap<(Path, String), f64>),
) -> String {
    let mut out = vec![
        "| rate/s | path | arrivals | timed out | served p50 / p90 / p99 / max ms | floor p50 / p90 / p99 / max ms | p99 / floor p99 | delete → released p50 / p99 ms | writes per arrival |".to_string(),
        "|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for (rate, samples) in &ours.samples {
        for path in Path::ALL {
            let all: Vec<&Sample> = samples
                .iter()
                .filter(|(p, _)| *p == path)
                .map(|(_, s)| s)
                .collect();
            let s = summary(&served(samples, path));
            let f = floor.samples.get(rate).map(|fs| summary(&served(fs, path)));
            let released: Vec<f64> = all.iter().filter_map(|s| s.released).collect();
            let rel = summary(&released);
            let join =
                |v: &[Option<f64>; 4]| v.iter().map(|x| ms(*x)).collect::<Vec<_>>().join(" / ");
            let ratio = match (s[2], f.and_then(|f| f[2])) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "—".into(),
            };
            out.push(format!(
                "| {rate} | {} | {} | {} | {} | {} | {ratio} | {} | {} |",
                path.name(),
                all.len(),
                all.iter().filter(|s| s.served.is_none()).count(),
                join(&s),
                f.map(|f| join(&f)).unwrap_or_else(|| "—".into()),
                if path == Path::Static || path == Path::Driver {
                    format!("{} / {}", ms(rel[0]), ms(rel[2]))
                } else {
                    "—".into()
                },
                match writes.get(&(path, *rate)) {
                    Some(w) if !all.is_empty() => format!("{:.2}", w / all.len() as f64),
                    _ => "—".into(),
                },
            ));
        }
    }
    out.push(String::new());
    out.push("| rate/s | controllers CPU ms/arrival | drivers CPU ms/arrival | kube-apiserver CPU ms/arrival (ours) | kube-apiserver CPU ms/arrival (floor) | events/arrival | Service writes per Service arrival (the bench's create and delete included) |".into());
    out.push("|---|---|---|---|---|---|---|".into());
    for (rate, (c, d, k)) in &ours.cpu {
        let samples = ours
            .samples
            .get(rate)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let n = samples.len().max(1) as f64;
        let services = samples
            .iter()
            .filter(|(p, _)| matches!(p, Path::SvcAuto | Path::SvcClaim))
            .count()
            .max(1) as f64;
        let w = |k: &str| {
            ours.writes
                .get(rate)
                .and_then(|w| w.get(k))
                .copied()
                .unwrap_or(0.0)
        };
        let floor_k = floor
            .cpu
            .get(rate)
            .zip(floor.samples.get(rate))
            .map(|((_, _, k), s)| k * 1000.0 / s.len().max(1) as f64);
        out.push(format!(
            "| {rate} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
            c * 1000.0 / n,
            d * 1000.0 / n,
            k * 1000.0 / n,
            floor_k
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "—".into()),
            w("events") / n,
            w("services") / services,
        ));
    }
    out.push(String::new());
    out.push(
        "Writes of the controllers and drivers per arrival, by path and kind (all rates):".into(),
    );
    for path in Path::ALL {
        let arrivals = ours
            .samples
            .values()
            .flatten()
            .filter(|(p, _)| *p == path)
            .count()
            .max(1) as f64;
        let line: Vec<String> = kinds
            .iter()
            .filter(|((p, _), _)| *p == path)
            .map(|((_, k), v)| format!("{k} {:.2}", v / arrivals))
            .collect();
        out.push(format!("  {}: {}", path.name(), line.join(", ")));
    }
    out.push(String::new());
    for path in Path::ALL {
        let p99 = |r: &Run| -> Vec<(usize, Option<f64>)> {
            r.samples
                .iter()
                .map(|(rate, s)| (*rate, summary(&served(s, path))[2]))
                .collect()
        };
        out.push(format!(
            "knee ({}): ours {}, floor {}",
            path.name(),
            knee(&p99(ours)),
            knee(&p99(floor)),
        ));
    }
    out.join("\n")
}

/// Each replica's end, as a platform's operations bring it, with arrivals going on: the
/// leading core and then the leading driver, each stopped cleanly (a rolling update:
/// SIGTERM, the Lease released) and killed (a node lost: SIGKILL, the Lease runs out —
/// production's 15 s), each started again once the other replica holds the Lease. Per
/// event: how long until the other replica held the Lease, and per path what the arrivals
/// of the next 40 s waited.
async fn takeover(
    load: Arc<Load>,
    rate: usize,
    client: &Client,
    mut procs: Vec<ControllerProcess>,
) -> Result<(String, Vec<ControllerProcess>)> {
    const LEAD_IN: Duration = Duration::from_secs(10);
    const WINDOW: Duration = Duration::from_secs(40);
    let events = [
        ("core", "bench-ctl", false),
        ("core", "bench-ctl", true),
        ("driver", "bench-drv", false),
        ("driver", "bench-drv", true),
    ];
    let dur = LEAD_IN + WINDOW * events.len() as u32;
    let began = Instant::now();
    let arrivals = tokio::spawn(step(load, rate, dur, "t"));
    let mut done = Vec::new();
    for (k, (who, lease, kill)) in events.into_iter().enumerate() {
        tokio::time::sleep_until((began + LEAD_IN + WINDOW * k as u32).into()).await;
        let holder = address_controller_tests::env::lease_holder(client, lease)
            .await?
            .ok_or_else(|| anyhow!("nobody holds {lease}"))?;
        let p = procs
            .iter_mut()
            .find(|p| p.user == holder)
            .ok_or_else(|| anyhow!("{holder} holds {lease}: not one of ours"))?;
        let at = Instant::now();
        if kill {
            p.kill();
        } else {
            p.terminate();
        }
        let moved = loop {
            let now = address_controller_tests::env::lease_holder(client, lease).await?;
            if now.as_ref().is_some_and(|h| *h != holder) {
                break at.elapsed();
            }
            if at.elapsed() > Duration::from_secs(60) {
                bail!("{lease}: no other replica took it within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        p.restart().await?;
        done.push((
            format!(
                "{who} leader {holder} {}",
                if kill { "SIGKILL" } else { "SIGTERM" }
            ),
            at.duration_since(began)
                .saturating_sub(Duration::from_millis(100)),
            moved,
        ));
    }
    let samples = arrivals.await??;
    let mut out = vec![
        format!("A takeover with arrivals going on ({rate}/s; production's Lease: 15 s, renewed within 10 s, tried every 2 s). Per path: how many arrived in the 40 s from the event, served p50 / p99 / max ms, and how many waited over 1 s:"),
        String::new(),
        "| event | s into the step | another replica held the Lease after | static | driver | svc-auto | svc-claim |".into(),
        "|---|---|---|---|---|---|---|".into(),
    ];
    for (event, at, moved) in done {
        let in_window = |path: Path| -> String {
            let served: Vec<f64> = samples
                .iter()
                .enumerate()
                .filter(|(i, (p, _))| {
                    let t = Duration::from_secs_f64(*i as f64 / rate as f64);
                    *p == path && t >= at && t < at + WINDOW
                })
                .filter_map(|(_, (_, s))| s.served)
                .collect();
            let q = summary(&served);
            format!(
                "{}: {} / {} / {}, {} over 1 s",
                served.len(),
                ms(q[0]),
                ms(q[2]),
                ms(q[3]),
                served.iter().filter(|s| **s > 1.0).count()
            )
        };
        out.push(format!(
            "| {event} | {:.1} | {:.2} s | {} | {} | {} | {} |",
            at.as_secs_f64(),
            moved.as_secs_f64(),
            in_window(Path::Static),
            in_window(Path::Driver),
            in_window(Path::SvcAuto),
            in_window(Path::SvcClaim),
        ));
    }
    let timed_out = samples.iter().filter(|(_, s)| s.served.is_none()).count();
    out.push(String::new());
    out.push(format!(
        "{} arrivals, {timed_out} not served within {} s.",
        samples.len(),
        PATIENCE.as_secs()
    ));
    Ok((out.join("\n"), procs))
}

/// The Go components' garbage collections during each step, and how many of the claim
/// paths' arrivals waited through one: of all, and of the slowest 1%.
fn collections(ours: &Run, floor: &Run, gcs: &[(&str, Vec<GoGc>)]) -> String {
    let mut out = vec![
        "Garbage collections of the control plane's Go components (GODEBUG=gctrace=1) during each step: how many, their wall-clock ms (the share of the step), the live heap after them, and of the claim paths' arrivals how many waited through one — all, and the slowest 1%:".to_string(),
        String::new(),
        "| run | rate/s | component | GCs | ms (share of the step) | live heap MB | all arrivals during one | slowest 1% during one |".into(),
        "|---|---|---|---|---|---|---|---|".into(),
    ];
    for (label, run) in [("ours", ours), ("floor", floor)] {
        for (rate, samples) in &run.samples {
            let mut traced: Vec<(f64, &Trace)> = samples
                .iter()
                .filter(|(p, _)| matches!(p, Path::Static | Path::Driver))
                .filter_map(|(_, s)| Some((s.served?, s.trace.as_ref()?)))
                .collect();
            traced.sort_by(|a, b| b.0.total_cmp(&a.0));
            let (Some(began), Some(ended)) = (
                run.steps.get(rate).map(|s| s.0),
                traced.iter().map(|(_, t)| t.seen).max(),
            ) else {
                continue;
            };
            let tail = traced.len().div_ceil(100);
            for (component, all) in gcs {
                let step: Vec<&GoGc> = all
                    .iter()
                    .filter(|g| g.at >= began && g.at <= ended)
                    .collect();
                let during = |t: &Trace| {
                    step.iter().any(|g| {
                        let end = g.at + Duration::from_secs_f64(g.ms / 1000.0);
                        g.at <= t.seen && end >= t.arrived
                    })
                };
                let count = |ts: &[(f64, &Trace)]| ts.iter().filter(|(_, t)| during(t)).count();
                let ms: f64 = step.iter().map(|g| g.ms).sum();
                let span = ms_between(began, ended);
                out.push(format!(
                    "| {label} | {rate} | {component} | {} | {ms:.0} ({:.1}%) | {} | {} of {} | {} of {} |",
                    step.len(),
                    100.0 * ms / span.max(1.0),
                    step.iter()
                        .map(|g| g.heap_mb)
                        .reduce(f64::max)
                        .map(|h| format!("≤ {h:.0}"))
                        .unwrap_or_else(|| "—".into()),
                    count(&traced),
                    traced.len(),
                    count(&traced[..tail]),
                    tail,
                ));
            }
        }
    }
    out.join("\n")
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut base, mut rates, mut dur) = (10_000usize, vec![5, 10, 20, 50, 100], 20u64);
    let mut protection = true;
    let mut qps: Option<String> = None;
    let mut takeover_rate: Option<usize> = None;
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow!("{a} needs a value"));
        match a.as_str() {
            "--base" => base = value()?.parse()?,
            "--step" => dur = value()?.parse()?,
            "--no-protection-policy" => protection = false,
            "--kube-api-qps" => qps = Some(value()?),
            "--takeover" => takeover_rate = Some(value()?.parse().context("--takeover")?),
            "--rates" => {
                rates = value()?
                    .split(',')
                    .map(|r| r.trim().parse().context("--rates"))
                    .collect::<Result<_>>()?
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let out = runtime.block_on(on_own_control_plane(
        "ac-latency",
        // GODEBUG: the Go components print each garbage collection (the tails' profile).
        &[("SERVICE_CIDR", "172.20.0.0/16"), ("GODEBUG", "gctrace=1")],
        || {
            measure(
                base,
                rates,
                Duration::from_secs(dur),
                protection,
                qps,
                takeover_rate,
            )
        },
    ))?;
    println!("{out}");
    Ok(())
}

async fn measure(
    base: usize,
    rates: Vec<usize>,
    dur: Duration,
    protection: bool,
    qps: Option<String>,
    takeover_rate: Option<usize>,
) -> Result<String> {
    let (_, client) = setup().await;
    if protection {
        apply_protection_policy(&client).await?;
    }
    let t = Instant::now();
    let base_namespaces = (base / 10).max(1);
    let names: Vec<String> = (0..base_namespaces)
        .map(|i| format!("base-{i:05}"))
        .chain((0..LOAD_NAMESPACES).map(|i| format!("load-{i:02}")))
        .collect();
    create_namespaces(&client, names).await?;
    let classes: Api<address_controller_api::IPAddressClass> = Api::all(client.clone());
    for class in [
        json!({"metadata": {"name": "base"}, "spec": {"provisioner": "static.bench"}}),
        json!({"metadata": {"name": "static"}, "spec": {"provisioner": "static.bench",
            "reclaimPolicy": "Retain", "releaseDelay": "1s"}}),
        json!({"metadata": {"name": "driver", "annotations": {AUTO_CLAIM_CLASS_ANNOTATION: "true"}},
            "spec": {"provisioner": RANGE_PROVISIONER, "reclaimPolicy": "Delete",
            "parameters": {"cidrs": ["10.64.0.0/14"]}}}),
        json!({"metadata": {"name": "floor"}, "spec": {"provisioner": "floor.bench"}}),
    ] {
        classes
            .create(&PostParams::default(), &serde_json::from_value(class)?)
            .await?;
    }
    let address = |name: String, ip: String, class: &str| {
        (
            None,
            json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
            "metadata": {"name": name},
            "spec": {"address": ip, "className": class, "source": {"fromClass": {}}}}),
        )
    };
    let addresses = (0..base)
        .map(|i| address(format!("b-{i:06}"), ipv4(i), "base"))
        .chain((0..POOL).map(|i| address(pool_name(i), ipv4(0x0020_0000 + i), "static")))
        .collect();
    create_all(&client, &ApiResource::erase::<IPAddress>(&()), addresses).await?;
    let claims = (0..base)
        .map(|i| {
            (
                Some(format!("base-{:05}", i % base_namespaces)),
                json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
                "metadata": {"name": format!("b-{i:06}")}, "spec": {"className": "base"}}),
            )
        })
        .collect();
    create_all(&client, &ApiResource::erase::<IPAddressClaim>(&()), claims).await?;
    eprintln!("base of {base}: created in {:.1?}", t.elapsed());

    // The base is bound by one replica without a client rate limit (a bulk import), then
    // production's shape takes over: two replicas of each, one leading, default flags.
    let mut bound = bound_claims(&client).await?;
    let mut import =
        ControllerProcess::start("ctl-import", &["--leader-elect=false", "--kube-api-qps=0"])
            .await?;
    tokio::time::timeout(Duration::from_secs(3600), bound.wait_for(|b| *b >= base))
        .await
        .context("waiting for the base Bound")?
        .context("the claim watch ended")?;
    import.kill();
    eprintln!("base of {base}: Bound after {:.1?}", t.elapsed());
    let flags = |lease: &'static str| -> Vec<String> {
        let mut f = vec!["--lease-name".to_string(), lease.to_string()];
        if let Some(q) = &qps {
            f.extend(["--kube-api-qps".to_string(), q.clone()]);
        }
        f
    };
    let (ctl, drv) = (flags("bench-ctl"), flags("bench-drv"));
    let ctl: Vec<&str> = ctl.iter().map(String::as_str).collect();
    let drv: Vec<&str> = drv.iter().map(String::as_str).collect();
    let ctl_a = ControllerProcess::start("ctl-a", &ctl).await?;
    let ctl_b = ControllerProcess::start("ctl-b", &ctl).await?;
    let drv_a = ControllerProcess::driver("drv-a", &drv).await?;
    let drv_b = ControllerProcess::driver("drv-b", &drv).await?;

    let obs = observe(&client).await?;
    let ours = Arc::new(Load {
        client: client.clone(),
        obs: obs.clone(),
        floor: None,
    });
    let ctls = [ctl_a.pid(), ctl_b.pid()];
    let drvs = [drv_a.pid(), drv_b.pid()];
    let ours_run = run(ours.clone(), &rates, dur, (&ctls, &drvs)).await?;
    let mut procs = vec![ctl_a, ctl_b, drv_a, drv_b];
    let mut takeover_report = String::new();
    if let Some(rate) = takeover_rate {
        let (report, back) = takeover(ours, rate, &client, procs).await?;
        takeover_report = format!("\n\n{report}");
        procs = back;
    }
    for mut p in procs {
        p.kill();
    }
    let floor = Arc::new(Load {
        client: client.clone(),
        obs: obs.clone(),
        floor: Some(Arc::new(std::sync::atomic::AtomicUsize::new(0))),
    });
    let floor_run = run(floor, &rates, dur, (&[], &[])).await?;
    let log = audit_log()?;
    let claims_of = obs.claims_of.lock().map(|m| m.clone()).unwrap_or_default();
    let writes = audited(&log, &claims_of);
    let vanished = vanished(&ours_run, &log);
    let mut gcs = Vec::new();
    for component in ["kube-apiserver", "etcd", "kube-controller-manager"] {
        gcs.push((component, go_gcs(component)?));
    }
    Ok(format!(
        "base: {base} bound claims and addresses; {} namespaces; client qps {} of the core and the drivers; the chart's protection policy {}\n\n{}",
        base_namespaces + LOAD_NAMESPACES,
        qps.as_deref().unwrap_or("200 (the default)"),
        if protection { "applied" } else { "not applied" },
        report(&ours_run, &floor_run, &writes),
    ) + &vanished
        + "\n\n"
        + &profile(&ours_run, &floor_run, &log, &claims_of, &gcs)
        + &takeover_report)
}
