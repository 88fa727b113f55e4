//! `make bench-watch`: informer-like watchers of `namespaceaddresses` through the aggregator
//! while claims change at a steady rate. Each watcher lists, then watches from the list's
//! resourceVersion with bookmarks and a short server timeout, watching again from the last
//! resourceVersion it saw (a relist only on 410). Prints, per phase: relists, events,
//! the latency from a claim's creation to the watcher seeing it in its namespace's
//! holdings (p50/p99/max), and the server's CPU per watcher. Asserts nothing about speed.
//!
//! ADDRESS_CONTROLLER_BENCH_WATCH_SECONDS (default 300) is the one-watcher phase; the 10-
//! and 100-watcher phases run a fifth of it each. ADDRESS_CONTROLLER_BENCH_RATE (default
//! 10) is claim changes per second.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use address_controller_tests::bench::{Seen, view_watcher};
use address_controller_tests::env::env;
use address_controller_tests::{Cluster, TestNamespace, cpu_time};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::var("ADDRESS_CONTROLLER_BENCH_WATCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rate: u64 = std::env::var("ADDRESS_CONTROLLER_BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut e = env("bench-watch").await;
    let (ctl, _, _) = e.serve_views().await;
    let client = Cluster::get().client().await.expect("client");
    let namespaces: Vec<TestNamespace> = {
        let mut v = Vec::new();
        for _ in 0..10 {
            v.push(
                TestNamespace::create(&client, "bench-watch")
                    .await
                    .expect("namespace"),
            );
        }
        v
    };
    println!(
        "watchers | seconds | changes | events seen | relists | rewatches | latency p50 / p99 / max | server CPU | CPU per extra watcher"
    );
    // The one-watcher phase's CPU rate: the rest of the process (the controller at work).
    let mut base: Option<f64> = None;
    for (watchers, secs) in [(1usize, seconds), (10, seconds / 5), (100, seconds / 5)] {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Instant::now() + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for id in 0..watchers {
            tasks.push(tokio::spawn(view_watcher(
                client.clone(),
                id,
                None,
                seen.clone(),
                stop,
            )));
        }
        // The changes start once every watcher has listed.
        while seen.lock().expect("lock").relists < watchers as u64 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cpu0 = cpu_time(ctl.pid()).expect("cpu");
        let t0 = Instant::now();
        let mut created: Vec<(String, Instant)> = Vec::new();
        let mut live: Vec<(String, String)> = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / rate.max(1)));
        let mut i = 0u64;
        while Instant::now() + Duration::from_secs(3) < stop {
            tick.tick().await;
            let ns = &namespaces[(i % 10) as usize].name;
            let claims: Api<address_controller_api::IPAddressClaim> =
                Api::namespaced(client.clone(), ns);
            // Alternate: create a claim, or delete the oldest one (changes both ways).
            if live.len() < 50 || i.is_multiple_of(2) {
                let name = format!("w{watchers}-{i}");
                let c = serde_json::from_value(
                    json!({"metadata": {"name": name}, "spec": {"className": "none"}}),
                )
                .expect("claim");
                if claims.create(&PostParams::default(), &c).await.is_ok() {
                    created.push((format!("{ns}/{name}"), Instant::now()));
                    live.push((ns.clone(), name));
                }
            } else {
                let (ns, name) = live.remove(0);
                let claims: Api<address_controller_api::IPAddressClaim> =
                    Api::namespaced(client.clone(), &ns);
                let _ = claims.delete(&name, &DeleteParams::default()).await;
            }
            i += 1;
        }
        for t in tasks {
            let _ = t.await;
        }
        let elapsed = t0.elapsed();
        let cpu = cpu_time(ctl.pid()).expect("cpu").saturating_sub(cpu0);
        let rate = cpu.as_secs_f64() / elapsed.as_secs_f64();
        let (events, relists, rewatches, mut latencies, missed) = {
            let s = seen.lock().expect("lock");
            let mut latencies = Vec::new();
            let mut missed = 0usize;
            for w in 0..watchers {
                for (key, at) in &created {
                    match s.first.get(&(w, key.clone())) {
                        Some(seen_at) => latencies.push(seen_at.saturating_duration_since(*at)),
                        None => missed += 1,
                    }
                }
            }
            // The first list of each watcher is not a relist.
            (
                s.events,
                s.relists - watchers as u64,
                s.rewatches,
                latencies,
                missed,
            )
        };
        latencies.sort();
        println!(
            "{watchers:>8} | {:>7} | {:>7} | {:>11} | {:>7} | {:>9} | {:?} / {:?} / {:?}{} | {:.2}s ({:.1}% of a core) | {:.2} ms of CPU per s",
            elapsed.as_secs(),
            i,
            events,
            relists,
            rewatches,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies.last().copied().unwrap_or_default(),
            if missed > 0 {
                format!(" ({missed} never seen: deleted before shown)")
            } else {
                String::new()
            },
            cpu.as_secs_f64(),
            100.0 * rate,
            match base {
                Some(b) if watchers > 1 => 1000.0 * (rate - b) / (watchers - 1) as f64,
                _ => 0.0,
            },
        );
        base.get_or_insert(rate);
        // Clean the phase's claims.
        for (ns, name) in live {
            let claims: Api<address_controller_api::IPAddressClaim> =
                Api::namespaced(client.clone(), &ns);
            let _ = claims.delete(&name, &DeleteParams::default()).await;
        }
    }
    drop(namespaces);
    e.check_with(&[&ctl]).await;
}
