//! `make bench-history`: what the history costs per address, before and after its closed
//! entries moved to `IPAddressRecord`s (#57) — the bytes an IPAddress holds in etcd and ships
//! to every watcher on each write (CRs are stored and watched as JSON), the bytes of a record
//! per entry, and the memory a cache holds per object (measured: N objects deserialized as
//! a watch delivers them, the process's RSS before and after) — and the paper estimate for
//! a million addresses and a year of churn against etcd's 8 GiB.
//!
//! No cluster: the objects are the ones the core and the kit write, built by the same
//! functions (`api::history`), with realistic names.

use std::sync::Arc;

use address_controller_api::history::{
    self, AttachmentSpan, HOLDINGS_KEEP, HOLDINGS_LIMIT, Holding, HoldingState, SPANS_KEEP,
    SPANS_LIMIT, ended,
};
use address_controller_api::{IPAddress, IPAddressRecord};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// An address as the core keeps it: bound, its metadata as kube-apiserver returns it.
fn address(i: u32, holdings: usize, spans: usize) -> IPAddress {
    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let name = format!("ipv4-{}", ip.replace('.', "-"));
    let t0 = Timestamp::from_second(1_790_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
    let at = |s: i64| Time(t0 + SignedDuration::from_secs(s));
    let h: Vec<Holding> = (0..holdings as i64)
        .map(|k| Holding {
            namespace: format!("tenant-{:05}", (i as i64 * 7 + k) % 20_000),
            name: format!("web-frontend-{k}"),
            uid: Some(format!("5e0c3a1e-{k:04}-4f6b-9a57-1c2d3e4f5a6b")),
            state: HoldingState::Bound,
            from: Some(at(86_400 * k)),
            until: (k + 1 < holdings as i64).then(|| at(86_400 * k + 80_000)),
            ended: (k + 1 < holdings as i64).then(|| ended::RELEASED.to_string()),
            found: false,
        })
        .collect();
    let s: Vec<AttachmentSpan> = (0..spans as i64)
        .map(|k| AttachmentSpan {
            kind: "Service".into(),
            namespace: Some(format!("tenant-{:05}", (i as i64 * 7 + k / 2) % 20_000)),
            name: format!("ingress-nginx-controller-{k}"),
            from: at(43_200 * k),
            until: (k + 1 < spans as i64).then(|| at(43_200 * k + 40_000)),
            found: false,
            egress: false,
            nodes: vec![],
        })
        .collect();
    let v = serde_json::json!({
        "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": name, "uid": format!("9d1f0c2b-{i:08x}-4a8e-b7c1-2f3e4d5c6b7a"),
            "resourceVersion": "123456789", "generation": 3,
            "creationTimestamp": "2026-09-01T12:00:00Z",
            "finalizers": ["local.sdn.cozystack.io/address-protection",
                "metallb-driver.drivers.local.sdn.cozystack.io/hold"],
            "annotations": {"ipaddress.local.sdn.cozystack.io/provisioned-by": "metallb.drivers.local.sdn.cozystack.io"}},
        "spec": {"address": ip, "className": "public-v4", "source": {"fromClass": {}},
            "reclaimPolicy": "Retain",
            "claimRef": {"namespace": "tenant-00001", "name": "web-frontend", "uid": "5e0c3a1e-ffff-4f6b-9a57-1c2d3e4f5a6b"}},
        "status": {"phase": "Bound",
            "associatedTo": {"kind": "Service", "namespace": "tenant-00001", "name": "ingress-nginx-controller"},
            "attachments": [{"kind": "Service", "namespace": "tenant-00001", "name": "ingress-nginx-controller", "ports": ["TCP/80", "TCP/443"]}],
            "holderCount": 1,
            "history": h, "attachmentHistory": s,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Announced", "message": "announced by MetalLB",
                "lastTransitionTime": "2026-09-01T12:00:01Z", "observedGeneration": 3}]},
    });
    serde_json::from_value(v).unwrap_or_else(|e| panic!("address: {e}"))
}

/// A record as stored: kube-apiserver adds uid, resourceVersion, creationTimestamp.
fn stored(r: &IPAddressRecord) -> Vec<u8> {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    v["apiVersion"] = "local.sdn.cozystack.io/v1alpha1".into();
    v["kind"] = "IPAddressRecord".into();
    v["metadata"]["uid"] = "0b5c8e2a-1d3f-4e6a-8b9c-0d1e2f3a4b5c".into();
    v["metadata"]["resourceVersion"] = "123456789".into();
    v["metadata"]["creationTimestamp"] = "2026-12-06T12:00:00Z".into();
    v["metadata"]["generation"] = 1.into();
    serde_json::to_vec(&v).unwrap_or_default()
}

fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(0)
}

/// RSS per object of `n` objects deserialized from `json` and held as a cache holds them
/// (`Arc<K>`), in a process of its own (freed memory is not given back, so one process
/// measures one kind).
fn rss_per<K: serde::de::DeserializeOwned>(n: usize, json: &[u8]) -> usize {
    let before = rss_bytes();
    let held: Vec<Arc<K>> = (0..n)
        .map(|_| match serde_json::from_slice::<K>(json) {
            Ok(k) => Arc::new(k),
            Err(e) => panic!("{e}: {}", String::from_utf8_lossy(json)),
        })
        .collect();
    let after = rss_bytes();
    let per = after.saturating_sub(before) / held.len().max(1);
    drop(held);
    per
}

/// The RSS per object of `kind` measured by a child process (this binary, `measure KIND N`).
fn measured(kind: &str, n: usize) -> String {
    let out = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(["measure", kind, &n.to_string()])
            .output()
    });
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Err(e) => format!("({e})"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("measure") {
        let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000);
        let full = serde_json::to_vec(&address(1, HOLDINGS_LIMIT, SPANS_LIMIT)).unwrap_or_default();
        let kept =
            serde_json::to_vec(&address(1, HOLDINGS_KEEP + 1, SPANS_KEEP + 1)).unwrap_or_default();
        let per = match args.get(2).map(String::as_str) {
            Some("full") => rss_per::<IPAddress>(n, &full),
            Some("kept") => rss_per::<IPAddress>(n, &kept),
            _ => {
                let a = address(1, 1, 0);
                let r = history::AddressMeta::of(&a).holding(0, &history::holdings(&a).0[0]);
                rss_per::<IPAddressRecord>(n, &stored(&r.to_object()))
            }
        };
        println!("{per}");
        return;
    }
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let full = address(1, HOLDINGS_LIMIT, SPANS_LIMIT);
    let kept = address(1, HOLDINGS_KEEP + 1, SPANS_KEEP + 1);
    let bare = address(1, 0, 0);
    let meta = history::AddressMeta::of(&full);
    let (hs, _) = history::holdings(&full);
    let (ss, _) = history::spans(&full);
    let hrec = meta.holding(0, &hs[0]).to_object();
    let srec = meta.span(0, &ss[0]).to_object();
    let (h_bytes, s_bytes) = (stored(&hrec), stored(&srec));
    let (full_b, kept_b, bare_b) = (json_len(&full), json_len(&kept), json_len(&bare));
    println!("bytes of JSON (etcd's value for a CR, and a watch event's object):");
    println!("  IPAddress, no history                      {bare_b:>7}");
    println!(
        "  IPAddress, history at the old bound ({HOLDINGS_LIMIT}+{SPANS_LIMIT}) {full_b:>7}   (before)"
    );
    println!(
        "  IPAddress, what it keeps now ({}+{})        {kept_b:>7}   (after)",
        HOLDINGS_KEEP + 1,
        SPANS_KEEP + 1
    );
    println!(
        "  IPAddressRecord of a holding               {:>7}",
        h_bytes.len()
    );
    println!(
        "  IPAddressRecord of a Service span          {:>7}",
        s_bytes.len()
    );
    println!(
        "watch bytes per bind (the bound address to every watcher): before {full_b}, after {kept_b} ({:.1}x less)",
        full_b as f64 / kept_b as f64
    );
    println!("RSS per object held in a cache ({n} objects of a kind per process, measured):");
    println!("  IPAddress before  {:>7} B", measured("full", n));
    println!("  IPAddress after   {:>7} B", measured("kept", n));
    println!("  IPAddressRecord   {:>7} B", measured("record", n));
    // The paper estimate: a million addresses, a year of churn.
    let gib = 1024f64 * 1024.0 * 1024.0;
    let addresses = 1_000_000f64;
    let rec = (h_bytes.len() + 2 * s_bytes.len()) as f64; // a holding and two spans
    println!(
        "a million addresses, etcd's 8 GiB (JSON bytes; etcd adds its own keys and revisions):"
    );
    println!(
        "  before: addresses at the old bound        {:>6.2} GiB, and history beyond 32 holdings lost",
        addresses * full_b as f64 / gib
    );
    println!(
        "  after: the addresses                      {:>6.2} GiB",
        addresses * kept_b as f64 / gib
    );
    for per_year in [12.0, 52.0, 365.0] {
        println!(
            "  after: records of a year, {per_year:>3} holdings (+2 spans each) per address {:>7.1} GiB",
            addresses * per_year * rec / gib
        );
    }
    let room = 8.0 * gib - addresses * kept_b as f64;
    println!(
        "  records that fit beside the addresses in 8 GiB: {:.1} million entries-with-spans ({:.1} holdings per address)",
        room / rec / 1e6,
        room / rec / addresses
    );
}
