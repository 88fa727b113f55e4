//! `make bench-scale`: the cost of a bind as the pool grows. For each size, on a fresh local
//! control plane of its own: a static run creates N addresses and lets the controller take
//! them in (each once: its protection finalizer and `Available`, reported apart as the
//! pool's intake), stops it, creates N claims over N/10 namespaces, starts the controller
//! (release build) again and times it until every claim is Bound; a driver run creates the
//! claims only and runs the range driver beside the controller. Prints one row per size and
//! the table at the end; asserts nothing about speed (targets are read, not enforced).
//!
//!     bench-scale [--sizes 1000,5000,10000,20000] [--driver-sizes 1000,10000] [--no-protection-policy]
//!
//! As a default install has it, the chart's protection policy puts the core's finalizers on
//! at creation (`--no-protection-policy`: the core writes them, as before the policy).
//! `--no-write-floor` leaves the write floor out (a restart figure in half the time).
//!
//! Per row: seconds to all Bound and binds per second; API writes per bind on claims and
//! addresses and event writes per bind (kube-apiserver's `apiserver_request_total`); the
//! controller's CPU per 1,000 binds, peak RSS and RSS per cached object; restart → ready
//! against the list floor (medians of three, alternating) and the writes in the 10 s after
//! it; kube-apiserver's CPU per bind; the write floor — a
//! plain client making the same number and kinds of writes on the same objects with the
//! controller's concurrency — and the ratio of the bind time to it; `kubectl get
//! namespaceaddresses -A` and `kubectl get poolavailabilities` next to `kubectl get
//! ipaddressclaims -A` (median of 10; of 3 past 20,000); a leader takeover — two replicas
//! on a 3 s lease, the leader SIGKILLed, a claim created at once: kill → the lease held by
//! the other replica, from then to that claim Bound, and whether the new leader kept the
//! lease; watch fan-out — `--watchers N` (default 1,000, at most one per namespace)
//! tenant-style informers of `namespaceaddresses`, each of its namespace, started at once,
//! then 600 claims created at 20 a second in their namespaces: time to all listed and
//! watching, change → seen p50 / p99, the controller's and kube-apiserver's cores, and a
//! `GET` of a namespace's p99 before and during (the cluster around the views).
//!
//! Sizes past 20,000 (`--sizes 100000`: the big cluster, not in CI) run with an etcd quota
//! of 8 GiB: etcd's default of 2 GiB is about what 200,000 objects and their first writes
//! take before a compaction.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use address_controller_tests::bench::{
    Seen, apply_protection_policy, bound_claims, create_all, create_namespaces, delta, ipv4,
    kas_pid, on_own_control_plane, quantile, view_watcher, writes,
};
use address_controller_tests::env::{
    RANGE_PROVISIONER, fast_lease, lease_holder, register_views_at,
};
use address_controller_tests::{
    Cluster, ControllerProcess, cpu_time, free_port, peak_rss_bytes, rss_bytes, setup, wait_for,
    wait_for_every,
};
use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, ListParams, Patch, PatchParams, PostParams};

use serde_json::{Value, json};

/// Restarts timed against as many list floors (the medians are reported).
const RESTARTS: usize = 3;

/// The write floor's concurrency (the controller's workers per kind).
const WORKERS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Static,
    Driver,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Static => "static",
            Mode::Driver => "driver",
        }
    }
}

fn sizes(v: &str) -> Result<Vec<usize>> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse().with_context(|| format!("size {s:?}")))
        .collect()
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut static_sizes = sizes("1000,5000,10000,20000")?;
    let mut driver_sizes = sizes("1000,10000")?;
    let mut protection = true;
    let mut floor = true;
    let mut watchers = 1_000;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--no-protection-policy" => protection = false,
            "--no-write-floor" => floor = false,
            "--watchers" => watchers = args.next().context("--watchers needs a value")?.parse()?,
            "--sizes" => static_sizes = sizes(&args.next().context("--sizes needs a value")?)?,
            "--driver-sizes" => {
                driver_sizes = sizes(&args.next().context("--driver-sizes needs a value")?)?
            }
            "--one" => {
                let mode = match args.next().as_deref() {
                    Some("static") => Mode::Static,
                    Some("driver") => Mode::Driver,
                    other => bail!("--one static|driver N, not {other:?}"),
                };
                let n: usize = args.next().context("--one needs N")?.parse()?;
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?;
                let row = runtime.block_on(one(mode, n, protection, floor, watchers))?;
                println!("ROW {row}");
                return Ok(());
            }
            other => bail!("unknown argument {other}"),
        }
    }
    // Each size in a process of its own: its own control plane, its own cluster handle.
    let mut rows = Vec::new();
    let runs = static_sizes
        .iter()
        .map(|n| (Mode::Static, *n))
        .chain(driver_sizes.iter().map(|n| (Mode::Driver, *n)));
    for (mode, n) in runs {
        eprintln!("== {} {n}", mode.name());
        let policy = if protection {
            None
        } else {
            Some("--no-protection-policy")
        };
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(policy)
            .args((!floor).then_some("--no-write-floor"))
            .args(["--watchers", &watchers.to_string()])
            .args(["--one", mode.name(), &n.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let row = text
            .lines()
            .find_map(|l| l.strip_prefix("ROW "))
            .ok_or_else(|| anyhow!("{} {n}: no figures (exit {})", mode.name(), out.status))?;
        let row: Value = serde_json::from_str(row)?;
        eprintln!("{}", line(&row));
        rows.push(row);
    }
    println!("{}", table(&rows));
    Ok(())
}

const HEADER: &str = "| run | N | to all Bound | binds/s | writes/bind (claims+addresses) | events/bind | pool intake writes/address | ctl CPU per 1k binds | peak RSS | RSS/object | view store (objects + history) | restart → ready | list floor | writes 10 s after | kube-apiserver CPU/bind | write floor | bind/floor | namespaceaddresses -A | poolavailabilities | ipaddressclaims -A | takeover: kill → lease, lease → first Bound, kept | fan-out: watchers, synced in, change → seen p50 / p99, ctl + kas cores | GET p99 before / during fan-out |";

fn line(r: &Value) -> String {
    let f = |k: &str, d: usize| match r[k].as_f64() {
        Some(v) => format!("{v:.d$}"),
        None => "—".into(),
    };
    format!(
        "| {} | {} | {} s | {} | {} | {} | {} | {} s | {} MiB | {} KiB | {} + {} MiB | {} s | {} s | {} | {} ms | {} | {} | {} ms | {} ms | {} ms | {} s, {} s, {} | {}, {} s, {} / {} ms, {} + {} | {} / {} ms |",
        r["mode"].as_str().unwrap_or(""),
        r["n"],
        f("bind_s", 1),
        f("binds_per_s", 0),
        f("writes_per_bind", 2),
        f("events_per_bind", 2),
        f("pool_writes_per_address", 2),
        f("cpu_per_1k_s", 2),
        f("peak_rss_mib", 0),
        f("rss_per_object_kib", 2),
        f("view_objects_mib", 1),
        f("view_history_mib", 1),
        f("restart_ready_s", 2),
        f("list_floor_s", 2),
        r["writes_after_restart"],
        f("kas_cpu_per_bind_ms", 2),
        match r["floor_s"].as_f64() {
            Some(v) => format!("{v:.1} s"),
            None => "—".into(),
        },
        f("bind_over_floor", 2),
        f("views_list_ms", 0),
        f("pools_list_ms", 0),
        f("claims_list_ms", 0),
        f("takeover_lease_s", 2),
        f("takeover_act_s", 2),
        match r["takeover_kept"].as_bool() {
            Some(true) => "kept",
            Some(false) => "LOST",
            None => "—",
        },
        r["fanout_watchers"],
        f("fanout_synced_s", 2),
        f("fanout_seen_p50_ms", 1),
        f("fanout_seen_p99_ms", 1),
        f("fanout_ctl_cores", 3),
        f("fanout_kas_cores", 3),
        f("get_p99_before_ms", 1),
        f("get_p99_during_ms", 1),
    )
}

fn table(rows: &[Value]) -> String {
    let sep = HEADER
        .split('|')
        .filter(|c| !c.is_empty())
        .map(|_| "---")
        .collect::<Vec<_>>()
        .join("|");
    let mut out = vec![HEADER.to_string(), format!("|{sep}|")];
    out.extend(rows.iter().map(line));
    out.join("\n")
}

/// A ledger gauge of the controller, summed over the series of `phase`.
async fn gauge(ctl: &ControllerProcess, series: &str, phase: &str) -> Result<usize> {
    let text = ctl.metrics().await?;
    let phase = format!("phase=\"{phase}\"");
    Ok(address_controller_tests::sum_samples(&text, series, |l| l.contains(&phase)) as usize)
}

/// The median of `samples` runs of `kubectl ARGS`, in ms.
fn median_ms(args: &[&str], samples_n: usize) -> Result<f64> {
    let mut samples = Vec::new();
    for _ in 0..samples_n {
        let t = Instant::now();
        Cluster::get().kubectl_ok(args)?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(median(&mut samples))
}

/// The middle sample (of an odd count; the upper middle of an even one).
fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A controller serving the views on a port of its own.
async fn controller(name: &str, port: u16) -> Result<ControllerProcess> {
    controller_electing(name, port, &["--leader-elect=false".to_string()]).await
}

/// A controller with these leader-election flags.
async fn controller_electing(
    name: &str,
    port: u16,
    election: &[String],
) -> Result<ControllerProcess> {
    let pki = Cluster::get().dir.join("pki");
    let address = format!("127.0.0.1:{port}");
    let (cert, key) = (pki.join("aggr.crt"), pki.join("aggr.key"));
    let mut args: Vec<&str> = election.iter().map(String::as_str).collect();
    args.extend([
        // The bench measures the API server's floor: no client-side limit.
        "--kube-api-qps=0",
        "--apiserver-address",
        &address,
        "--tls-cert-file",
        cert.to_str().unwrap_or_default(),
        "--tls-private-key-file",
        key.to_str().unwrap_or_default(),
    ]);
    ControllerProcess::start(name, &args).await
}

/// A leader takeover at this size: two replicas electing on a 3 s lease, each ready (its
/// caches hold every object), a free address taken in by the leader; then the leader is
/// SIGKILLed and a claim created at once. Returns (kill → the lease held by the other,
/// the lease held → the claim Bound, whether the new leader still holds the lease two
/// lease durations later): the first is the lease's duration, whatever the size; the
/// second is what the new leader does before it acts — whether its first claim waits
/// behind a pass over everything it caches.
async fn takeover(client: &Client, n: usize, namespace: &str) -> Result<(f64, f64, bool)> {
    let lease = "bench-takeover";
    let election = fast_lease(lease);
    let a = controller_electing("ctl-takeover-a", free_port(), &election).await?;
    wait_for("replica a leading", Duration::from_secs(60), || async {
        Ok((lease_holder(client, lease).await?.as_deref() == Some("ctl-takeover-a")).then_some(()))
    })
    .await?;
    let mut b = controller_electing("ctl-takeover-b", free_port(), &election).await?;
    let addresses: Api<address_controller_api::IPAddress> = Api::all(client.clone());
    let address = "a-takeover";
    addresses
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": address},
                "spec": {"address": ipv4(n), "className": "bench", "source": {"fromClass": {}}}}))?,
        )
        .await?;
    wait_for(
        "the takeover's address Available",
        Duration::from_secs(60),
        || async {
            let a = addresses.get(address).await?;
            Ok((a.status.and_then(|s| s.phase)
                == Some(address_controller_api::AddressPhase::Available))
            .then_some(()))
        },
    )
    .await?;
    let claims: Api<address_controller_api::IPAddressClaim> =
        Api::namespaced(client.clone(), namespace);
    let mut a = a;
    let killed = Instant::now();
    a.kill();
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "c-takeover"}, "spec": {"className": "bench"}}),
            )?,
        )
        .await?;
    let held = wait_for_every(
        "replica b leading",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async {
            Ok(
                (lease_holder(client, lease).await?.as_deref() == Some("ctl-takeover-b"))
                    .then(|| killed.elapsed()),
            )
        },
    )
    .await?;
    let bound = wait_for_every(
        "the takeover's claim Bound",
        Duration::from_secs(300),
        Duration::from_millis(20),
        || async {
            let c = claims.get("c-takeover").await?;
            Ok(
                (c.status.and_then(|s| s.phase) == Some(address_controller_api::ClaimPhase::Bound))
                    .then(|| killed.elapsed()),
            )
        },
    )
    .await?;
    // Did it keep the lease through its first pass over everything? Watched for two lease
    // durations after the bind: at 100,000 a new leader once lost it there, starved.
    let watch_until = Instant::now() + Duration::from_secs(6);
    let mut kept = true;
    while Instant::now() < watch_until {
        if !b.running() || lease_holder(client, lease).await?.as_deref() != Some("ctl-takeover-b") {
            kept = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(b);
    Ok((held.as_secs_f64(), (bound - held).as_secs_f64(), kept))
}

/// What [`fanout`] measured.
struct Fanout {
    watchers: usize,
    /// Watchers started → every one listed and watching.
    synced_s: f64,
    /// Claim created → seen by its namespace's watcher (p50, p99, max), ms.
    seen_ms: [f64; 3],
    missed: usize,
    relists: u64,
    refused: u64,
    /// Cores used during the change phase.
    ctl_cores: f64,
    kas_cores: f64,
    /// The controller's RSS added by the watchers, KiB per watcher.
    rss_per_watcher_kib: f64,
    /// p99 of a `GET` of a namespace through kube-apiserver before the watchers and while
    /// they watch, ms: the cluster around the views.
    get_p99_ms: [f64; 2],
}

/// Watch fan-out: `w` tenant-style informers of `namespaceaddresses` through kube-apiserver,
/// each of one namespace (a field selector on the object's name), all started at once over
/// one client; then claims created at 20 a second for 30 s in the watched namespaces.
async fn fanout(
    client: &Client,
    ctl: &ControllerProcess,
    names: &[String],
    w: usize,
) -> Result<Fanout> {
    let kas = kas_pid()?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let probe = |n: usize| {
        let namespaces = namespaces.clone();
        async move {
            let mut ms = Vec::new();
            for _ in 0..n {
                let t = Instant::now();
                namespaces.get("default").await?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ms.sort_by(f64::total_cmp);
            anyhow::Ok(quantile(&ms, 0.99).unwrap_or(f64::NAN))
        }
    };
    let get_before = probe(100).await?;
    let rss0 = rss_bytes(ctl.pid())?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Instant::now() + Duration::from_secs(3600);
    let started = Instant::now();
    let tasks: Vec<_> = names
        .iter()
        .take(w)
        .enumerate()
        .map(|(id, ns)| {
            tokio::spawn(view_watcher(
                client.clone(),
                id,
                Some(ns.clone()),
                seen.clone(),
                stop,
            ))
        })
        .collect();
    wait_for_every(
        "every watcher listed",
        Duration::from_secs(600),
        Duration::from_millis(50),
        || async { Ok((seen.lock().expect("lock").relists >= w as u64).then_some(())) },
    )
    .await?;
    let synced = started.elapsed();
    let (ctl0, kas0) = (cpu_time(ctl.pid())?, cpu_time(kas)?);
    let t0 = Instant::now();
    let during = tokio::spawn(probe(200));
    let mut created = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    for i in 0..600usize {
        tick.tick().await;
        // Spread over the watched namespaces (a step of 7: 600 different ones of 1,000).
        let id = (i * 7) % w;
        let ns = &names[id];
        let claims: Api<address_controller_api::IPAddressClaim> =
            Api::namespaced(client.clone(), ns);
        let name = format!("fanout-{i}");
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": name}, "spec": {"className": "none"}}),
                )?,
            )
            .await?;
        created.push((id, format!("{ns}/{name}"), Instant::now()));
    }
    let seen_all = wait_for_every(
        "every change seen",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            let s = seen.lock().expect("lock");
            Ok(created
                .iter()
                .all(|(id, key, _)| s.first.contains_key(&(*id, key.clone())))
                .then_some(()))
        },
    )
    .await;
    let elapsed = t0.elapsed().as_secs_f64();
    let (ctl_cpu, kas_cpu) = (
        cpu_time(ctl.pid())?.saturating_sub(ctl0),
        cpu_time(kas)?.saturating_sub(kas0),
    );
    let rss1 = rss_bytes(ctl.pid())?;
    let get_during = during.await??;
    for t in &tasks {
        t.abort();
    }
    let (mut ms, missed, relists, refused) = {
        let s = seen.lock().expect("lock");
        let mut ms = Vec::new();
        let mut missed = 0;
        for (id, key, at) in &created {
            match s.first.get(&(*id, key.clone())) {
                Some(seen_at) => {
                    ms.push(seen_at.saturating_duration_since(*at).as_secs_f64() * 1000.0)
                }
                None => missed += 1,
            }
        }
        (ms, missed, s.relists - w as u64, s.refused)
    };
    if let Err(e) = seen_all {
        eprintln!("fan-out: {missed} changes never seen: {e:#}");
    }
    ms.sort_by(f64::total_cmp);
    for (_, key, _) in &created {
        let (ns, name) = key.split_once('/').context("key")?;
        let claims: Api<address_controller_api::IPAddressClaim> =
            Api::namespaced(client.clone(), ns);
        claims.delete(name, &Default::default()).await?;
    }
    let q = |p: f64| quantile(&ms, p).unwrap_or(f64::NAN);
    Ok(Fanout {
        watchers: w,
        synced_s: synced.as_secs_f64(),
        seen_ms: [q(0.5), q(0.99), q(1.0)],
        missed,
        relists,
        refused,
        ctl_cores: ctl_cpu.as_secs_f64() / elapsed,
        kas_cores: kas_cpu.as_secs_f64() / elapsed,
        rss_per_watcher_kib: (rss1 as f64 - rss0 as f64) / 1024.0 / w as f64,
        get_p99_ms: [get_before, get_during],
    })
}

async fn one(
    mode: Mode,
    n: usize,
    protection: bool,
    floor: bool,
    watchers: usize,
) -> Result<Value> {
    let env: &[(&str, &str)] = if n > 20_000 {
        &[("AC_ETCD_QUOTA_BYTES", "8589934592")]
    } else {
        &[]
    };
    on_own_control_plane("ac-scale", env, || {
        measure(mode, n, protection, floor, watchers)
    })
    .await
}

async fn measure(
    mode: Mode,
    n: usize,
    protection: bool,
    with_floor: bool,
    watchers: usize,
) -> Result<Value> {
    let (_, client) = setup().await;
    if protection {
        apply_protection_policy(&client).await?;
    }
    let namespaces = (n / 10).max(1);
    let names: Vec<String> = (0..namespaces).map(|i| format!("s-{i:05}")).collect();
    create_namespaces(&client, names.clone()).await?;
    let classes: Api<address_controller_api::IPAddressClass> = Api::all(client.clone());
    let class = match mode {
        Mode::Static => {
            json!({"metadata": {"name": "bench"}, "spec": {"provisioner": "static.bench"}})
        }
        Mode::Driver => {
            json!({"metadata": {"name": "bench"}, "spec": {"provisioner": RANGE_PROVISIONER,
            "parameters": {"cidrs": ["10.0.0.0/14"]}}})
        }
    };
    classes
        .create(&PostParams::default(), &serde_json::from_value(class)?)
        .await?;
    let t = Instant::now();
    let mut pool_writes = None;
    if mode == Mode::Static {
        let addresses = (0..n)
            .map(|i| {
                (None, json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
                    "metadata": {"name": format!("a-{i:06}")},
                    "spec": {"address": ipv4(i), "className": "bench", "source": {"fromClass": {}}}}))
            })
            .collect();
        create_all(
            &client,
            &ApiResource::erase::<address_controller_api::IPAddress>(&()),
            addresses,
        )
        .await?;
        // The pool first, as a platform team has it before tenants claim: the controller
        // takes each new address in once (its protection finalizer, `Available`) — a cost
        // per address, not per bind, reported apart.
        let before = writes()?;
        let mut ctl = controller("ctl-scale-pool", free_port()).await?;
        wait_for(
            "every address Available",
            Duration::from_secs(3600),
            || async {
                Ok(
                    (gauge(&ctl, "address_controller_ipaddresses{", "Available").await? >= n)
                        .then_some(()),
                )
            },
        )
        .await?;
        ctl.kill();
        pool_writes = Some(delta(&writes()?, &before, &["ipaddresses"]) / n as f64);
    }
    let claims = (0..n)
        .map(|i| {
            let ns = names[i % namespaces].clone();
            (
                Some(ns),
                json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
                "metadata": {"name": format!("c-{i:06}")}, "spec": {"className": "bench"}}),
            )
        })
        .collect();
    create_all(
        &client,
        &ApiResource::erase::<address_controller_api::IPAddressClaim>(&()),
        claims,
    )
    .await?;
    eprintln!("{} {n}: objects created in {:?}", mode.name(), t.elapsed());

    // Bind.
    let writes0 = writes()?;
    let kas = kas_pid()?;
    let kas_cpu0 = cpu_time(kas)?;
    // The bench waits on a watch of its own (listed before the clock starts), not on the
    // controller's /metrics: scraping 2,000 namespaces' series every 200 ms was itself a
    // fifth of the controller's CPU at 20,000.
    let mut bound = bound_claims(&client).await?;
    let started = Instant::now();
    let mut ctl = controller("ctl-scale", free_port()).await?;
    let mut driver = match mode {
        Mode::Driver => Some(
            ControllerProcess::driver("drv-scale", &["--leader-elect=false", "--kube-api-qps=0"])
                .await?,
        ),
        Mode::Static => None,
    };
    tokio::time::timeout(Duration::from_secs(3600), bound.wait_for(|b| *b >= n))
        .await
        .context("waiting for every claim Bound")?
        .context("the claim watch ended")?;
    let bind = started.elapsed();
    let writes1 = writes()?;
    let kas_cpu = cpu_time(kas)?.saturating_sub(kas_cpu0);
    let ctl_cpu = cpu_time(ctl.pid())?;
    let peak = peak_rss_bytes(ctl.pid())?;
    let rss = rss_bytes(ctl.pid())?;
    let objects = 2 * n + 1;
    // What of that RSS the views' store holds serialized: its objects, and the watch history
    // (bounded by --view-history-bytes, not by N).
    let text = ctl.metrics().await?;
    let view_mib = |part: &str| {
        let series = format!("address_controller_apiserver_view_bytes{{part=\"{part}\"}}");
        address_controller_tests::sample(&text, &series)
            .map(|b| b / 1048576.0)
            .ok_or_else(|| anyhow::anyhow!("no {series} on /metrics"))
    };
    let (view_objects_mib, view_history_mib) = (view_mib("objects")?, view_mib("history")?);
    let object_writes = delta(&writes1, &writes0, &["ipaddresses", "ipaddressclaims"]);
    let events = delta(&writes1, &writes0, &["events"]);
    eprintln!(
        "{} {n}: all Bound in {bind:?}; writes per bind:",
        mode.name()
    );
    for (k, v) in &writes1 {
        let d = v - writes0.get(k).unwrap_or(&0.0);
        if k.contains(' ') && d > 0.0 {
            eprintln!("  {k}: {:.2}", d / n as f64);
        }
    }

    // Restart → ready, then the writes of the 10 s after it (everything is bound).
    ctl.kill();
    if let Some(d) = driver.as_mut() {
        d.kill();
    }
    // Against the restart's floor: a plain client listing both kinds as the caches do
    // (pages of 500, both at once) — what kube-apiserver needs to hand the objects over —
    // taken while nothing else runs (after a restart, the new process's pass over every
    // object would slow it down), and each sample only once kube-apiserver is quiet. One
    // sample of either varied by a second on this VM, so three of each, alternating, and
    // their medians.
    let mut floors = Vec::new();
    let mut restarts = Vec::new();
    // CPU seconds of each sample, to say whose work a restart's excess over its floor is:
    // kube-apiserver's during the floor; kube-apiserver's and the controller's during the
    // restart.
    let mut cpu = Vec::new();
    let mut again: Option<ControllerProcess> = None;
    let mut port = 0;
    for i in 0..RESTARTS {
        if let Some(mut c) = again.take() {
            c.kill();
        }
        quiet_kas(kas).await?;
        let kas0 = cpu_time(kas)?;
        let listed = Instant::now();
        let (a, c) = tokio::join!(
            list_all::<address_controller_api::IPAddress>(&client),
            list_all::<address_controller_api::IPAddressClaim>(&client)
        );
        floors.push(listed.elapsed().as_secs_f64());
        anyhow::ensure!(
            a? + c? >= 2 * n,
            "the list floor saw fewer objects than made"
        );
        quiet_kas(kas).await?;
        let kas1 = cpu_time(kas)?;
        port = free_port();
        let restarted = Instant::now();
        // Returns once /readyz answers 200.
        let c = controller(&format!("ctl-scale-again-{i}"), port).await?;
        restarts.push(restarted.elapsed().as_secs_f64());
        let secs = |d: Duration| (d.as_secs_f64() * 100.0).round() / 100.0;
        cpu.push((
            secs(kas1.saturating_sub(kas0)),
            secs(cpu_time(kas)?.saturating_sub(kas1)),
            secs(cpu_time(c.pid())?),
        ));
        again = Some(c);
    }
    let ctl = again.context("no restart ran")?;
    eprintln!(
        "restart → ready {restarts:.2?} s; list floor {floors:.2?} s; CPU s (kube-apiserver in the floor, in the restart; controller to ready) {cpu:?}"
    );
    let (restart_ready, list_floor) = (median(&mut restarts), median(&mut floors));
    let quiet0 = writes()?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let quiet = delta(
        &writes()?,
        &quiet0,
        &["ipaddresses", "ipaddressclaims", "events"],
    );

    // The views next to the CRD, through the same kube-apiserver.
    register_views_at(port).await;
    // Ten samples each, three past 20,000 (a list of the CRD takes seconds there).
    let samples = if n > 20_000 { 3 } else { 10 };
    let views_ms = median_ms(&["get", "namespaceaddresses", "-A"], samples)?;
    let pools_ms = median_ms(&["get", "poolavailabilities"], samples)?;
    let claims_ms = median_ms(&["get", "ipaddressclaims", "-A"], samples)?;
    let fan = fanout(&client, &ctl, &names, watchers.clamp(1, names.len())).await?;
    eprintln!(
        "fan-out: {} watchers listed and watching in {:.2} s; change → seen p50 / p99 / max {:.1?} ms ({} never seen, {} relists, {} refused); controller {:.3} cores, kube-apiserver {:.3} cores; {:.1} KiB per watcher; GET p99 {:.1?} ms (before, during)",
        fan.watchers,
        fan.synced_s,
        fan.seen_ms,
        fan.missed,
        fan.relists,
        fan.refused,
        fan.ctl_cores,
        fan.kas_cores,
        fan.rss_per_watcher_kib,
        fan.get_p99_ms
    );
    drop(ctl);
    let (takeover_lease, takeover_act, takeover_kept) = takeover(&client, n, &names[0]).await?;
    eprintln!(
        "takeover: SIGKILL → lease held by the other replica {takeover_lease:.2} s; → its first claim Bound {takeover_act:.2} s later; lease {} for 6 s after",
        if takeover_kept { "kept" } else { "LOST" }
    );

    // The write floor: the bind's writes by a plain client.
    let floor = match mode {
        Mode::Static if with_floor => Some(write_floor(&client, object_writes / n as f64).await?),
        _ => None,
    };
    let secs = bind.as_secs_f64();
    Ok(json!({
        "mode": if protection { mode.name().to_string() } else { format!("{} (no policy)", mode.name()) }, "n": n,
        "bind_s": secs, "binds_per_s": n as f64 / secs,
        "writes_per_bind": object_writes / n as f64, "events_per_bind": events / n as f64,
        "pool_writes_per_address": pool_writes,
        "cpu_per_1k_s": ctl_cpu.as_secs_f64() * 1000.0 / n as f64,
        "peak_rss_mib": peak as f64 / 1048576.0, "rss_per_object_kib": rss as f64 / 1024.0 / objects as f64,
        "view_objects_mib": view_objects_mib, "view_history_mib": view_history_mib,
        "restart_ready_s": restart_ready, "list_floor_s": list_floor,
        "writes_after_restart": quiet,
        "kas_cpu_per_bind_ms": kas_cpu.as_secs_f64() * 1000.0 / n as f64,
        "floor_s": floor, "bind_over_floor": floor.map(|f| secs / f),
        "views_list_ms": views_ms, "pools_list_ms": pools_ms, "claims_list_ms": claims_ms,
        "takeover_lease_s": takeover_lease, "takeover_act_s": takeover_act,
        "takeover_kept": takeover_kept,
        "fanout_watchers": fan.watchers, "fanout_synced_s": fan.synced_s,
        "fanout_seen_p50_ms": fan.seen_ms[0], "fanout_seen_p99_ms": fan.seen_ms[1],
        "fanout_missed": fan.missed, "fanout_relists": fan.relists,
        "fanout_ctl_cores": fan.ctl_cores, "fanout_kas_cores": fan.kas_cores,
        "fanout_kib_per_watcher": fan.rss_per_watcher_kib,
        "get_p99_before_ms": fan.get_p99_ms[0], "get_p99_during_ms": fan.get_p99_ms[1],
    }))
}

/// Waits until kube-apiserver is quiet (under a tenth of a core over half a second; at
/// most a minute): after a bind, or after the controller of the sample before was killed,
/// it goes on working for seconds, and a sample taken then carries that work.
async fn quiet_kas(kas: u32) -> Result<()> {
    let window = Duration::from_millis(500);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let before = cpu_time(kas)?;
        tokio::time::sleep(window).await;
        let busy = cpu_time(kas)?.saturating_sub(before);
        if busy < window / 10 {
            return Ok(());
        }
        if Instant::now() > deadline {
            eprintln!("kube-apiserver still busy ({busy:?} CPU per {window:?}); sampling anyway");
            return Ok(());
        }
    }
}

/// Pages through every object of a kind, 500 at a time: the number listed.
async fn list_all<K>(client: &Client) -> Result<usize>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let mut params = ListParams::default().limit(500);
    let mut count = 0;
    loop {
        let page = api.list(&params).await?;
        count += page.items.len();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(count),
        }
    }
}

/// The writes of one static bind made by a plain client — the claim's metadata, the
/// address's spec and metadata, the claim's status, the address's status (as many per
/// claim as the controller made, in that order; the last ones when it made fewer than
/// four) — with the controller's concurrency.
async fn write_floor(client: &Client, per_bind: f64) -> Result<f64> {
    let claims: Api<address_controller_api::IPAddressClaim> = Api::all(client.clone());
    let pairs: Vec<(String, String, String)> = claims
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| {
            let ns = c.metadata.namespace.clone()?;
            let name = c.metadata.name.clone()?;
            let address = c.status?.addresses.first()?.name.clone();
            Some((ns, name, address))
        })
        .collect();
    let per = per_bind.round().max(1.0) as usize;
    let params = PatchParams::default();
    let started = Instant::now();
    let results: Vec<Result<()>> = futures::stream::iter(pairs)
        .map(|(ns, name, address)| {
            let client = client.clone();
            let params = params.clone();
            async move {
                let claims: Api<address_controller_api::IPAddressClaim> = Api::namespaced(client.clone(), &ns);
                let addresses: Api<address_controller_api::IPAddress> = Api::all(client);
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let condition = |t: &str| json!([{"type": t, "status": "True", "reason": "Floor", "message": "", "lastTransitionTime": now}]);
                for step in 0..per {
                    // Fewer than 4 (the protection policy wrote the claim's finalizer): the
                    // last ones of the sequence.
                    let patch = match (step + 4 - per.min(4)) % 4 {
                        0 => claims.patch(&name, &params, &Patch::Merge(json!({"metadata": {"annotations": {"bench/floor": step.to_string()}}}))).await.map(|_| ()),
                        1 => addresses.patch(&address, &params, &Patch::Merge(json!({"metadata": {"annotations": {"bench/floor": step.to_string()}}}))).await.map(|_| ()),
                        2 => claims.patch_status(&name, &params, &Patch::Merge(json!({"status": {"conditions": condition("Floor")}}))).await.map(|_| ()),
                        _ => addresses.patch_status(&address, &params, &Patch::Merge(json!({"status": {"conditions": condition("Floor")}}))).await.map(|_| ()),
                    };
                    patch?;
                }
                Ok(())
            }
        })
        .buffer_unordered(WORKERS)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(started.elapsed().as_secs_f64())
}
