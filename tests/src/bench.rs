//! What the benchmarks share: a control plane of their own, kube-apiserver's write counters,
//! its process, bulk creation, percentiles, and informer-like watchers of the views.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use anyhow::{Result, bail};
use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::watcher;
use serde_json::Value;

use crate::{Cluster, TempDir, repo_root};

/// Objects created at once by [`create_all`].
pub const CREATE_CONCURRENCY: usize = 64;

/// Runs `body` on a local control plane of its own, started with `env` (stopped
/// afterwards, and when this process ends even if it is killed).
pub async fn on_own_control_plane<T, F, Fut>(
    prefix: &str,
    env: &[(&str, &str)],
    body: F,
) -> Result<T>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    crate::ensure_binaries()?;
    let dir = TempDir::new(prefix);
    let script = repo_root().join("deploy/local/cluster.sh");
    let status = std::process::Command::new(&script)
        .args([
            "up",
            path_str(&dir),
            "--watch-pid",
            &std::process::id().to_string(),
        ])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .status()?;
    if !status.success() {
        bail!("starting the local control plane failed");
    }
    Cluster::use_dir(&dir)?;
    let result = body().await;
    let _ = std::process::Command::new(&script)
        .args(["down", path_str(&dir)])
        .status();
    result
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// Writes (POST, PUT, PATCH, DELETE) kube-apiserver has counted: by resource, and by
/// `resource/subresource VERB code` for the breakdown.
pub fn writes() -> Result<BTreeMap<String, f64>> {
    let text = Cluster::get().kubectl_ok(&["get", "--raw", "/metrics"])?;
    let mut out = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let label = |k: &str| {
            l.split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
        };
        if !matches!(label("verb"), "POST" | "PUT" | "PATCH" | "DELETE") {
            continue;
        }
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(label("resource").to_string()).or_default() += v;
        let key = format!(
            "{}/{} {} {}",
            label("resource"),
            label("subresource"),
            label("verb"),
            label("code")
        );
        *out.entry(key).or_default() += v;
    }
    Ok(out)
}

/// The writes to `resources` between two [`writes`] readings.
pub fn delta(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
    resources: &[&str],
) -> f64 {
    resources
        .iter()
        .map(|r| after.get(*r).unwrap_or(&0.0) - before.get(*r).unwrap_or(&0.0))
        .sum()
}

/// The pid of the control plane's kube-apiserver.
pub fn kas_pid() -> Result<u32> {
    component_pid("kube-apiserver")
}

/// The process of a component of the local control plane (`etcd`, `kube-apiserver`, …).
pub fn component_pid(component: &str) -> Result<u32> {
    let pid = std::fs::read_to_string(Cluster::get().dir.join("pids").join(component))?;
    Ok(pid.trim().parse()?)
}

/// One garbage collection of a Go component of the control plane, from the line
/// `GODEBUG=gctrace=1` makes it print: when it began (the wall clock), how long it took (the
/// wall-clock sum of its phases: mostly the concurrent mark, when it takes a share of the
/// cores and makes allocating goroutines help), and the live heap after it.
#[derive(Debug, Clone, Copy)]
pub struct GoGc {
    pub at: k8s_openapi::jiff::Timestamp,
    pub ms: f64,
    pub heap_mb: f64,
}

/// The garbage collections of a component of the local control plane (`kube-apiserver`,
/// `etcd`, `kube-controller-manager`) started with `GODEBUG=gctrace=1`, from its log. A
/// line's `@T` is seconds since the process started, which `/proc` dates (clock ticks of
/// 10 ms).
pub fn go_gcs(component: &str) -> Result<Vec<GoGc>> {
    let started = crate::started_at(component_pid(component)?)?;
    let log = std::fs::read_to_string(
        Cluster::get()
            .dir
            .join("logs")
            .join(format!("{component}.log")),
    )?;
    Ok(log
        .lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            if t.first() != Some(&"gc") {
                return None;
            }
            let since: f64 = t
                .get(2)?
                .strip_prefix('@')?
                .strip_suffix('s')?
                .parse()
                .ok()?;
            let ms = t
                .get(4)?
                .split('+')
                .filter_map(|p| p.parse::<f64>().ok())
                .sum();
            let heap_mb = t
                .iter()
                .find(|x| x.contains("->"))?
                .rsplit("->")
                .next()?
                .parse()
                .ok()?;
            Some(GoGc {
                at: started + Duration::from_secs_f64(since),
                ms,
                heap_mb,
            })
        })
        .collect())
}

/// The `i`-th address of 10.0.0.0/8.
pub fn ipv4(i: usize) -> String {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    std::net::Ipv4Addr::from(0x0a00_0000u32 + i).to_string()
}

/// Creates `objects` (namespace, body) of `resource`, [`CREATE_CONCURRENCY`] at once.
pub async fn create_all(
    client: &Client,
    resource: &ApiResource,
    objects: Vec<(Option<String>, Value)>,
) -> Result<()> {
    let results: Vec<Result<()>> = futures::stream::iter(objects)
        .map(|(ns, v)| {
            let api: Api<DynamicObject> = match &ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                None => Api::all_with(client.clone(), resource),
            };
            async move {
                let o: DynamicObject = serde_json::from_value(v)?;
                api.create(&PostParams::default(), &o).await?;
                Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The number of Bound claims as a watch sees them; returns once the watch has listed.
pub async fn bound_claims(client: &Client) -> Result<tokio::sync::watch::Receiver<usize>> {
    use kube::runtime::watcher::{self, Event};
    let api: Api<address_controller_api::IPAddressClaim> = Api::all(client.clone());
    let (tx, rx) = tokio::sync::watch::channel(0usize);
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let is_bound = |c: &address_controller_api::IPAddressClaim| {
            c.status.as_ref().and_then(|s| s.phase)
                == Some(address_controller_api::ClaimPhase::Bound)
        };
        let key = |c: &address_controller_api::IPAddressClaim| {
            format!(
                "{}/{}",
                c.metadata.namespace.as_deref().unwrap_or(""),
                c.metadata.name.as_deref().unwrap_or("")
            )
        };
        let (mut bound, mut relisting) = (
            std::collections::HashSet::new(),
            std::collections::HashSet::new(),
        );
        let mut listed = Some(listed_tx);
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => relisting.clear(),
                Ok(Event::InitApply(c)) => {
                    if is_bound(&c) {
                        relisting.insert(key(&c));
                    }
                }
                Ok(Event::InitDone) => {
                    bound = std::mem::take(&mut relisting);
                    if let Some(l) = listed.take() {
                        let _ = l.send(());
                    }
                }
                Ok(Event::Apply(c)) => {
                    if is_bound(&c) {
                        bound.insert(key(&c));
                    } else {
                        bound.remove(&key(&c));
                    }
                }
                Ok(Event::Delete(c)) => {
                    bound.remove(&key(&c));
                }
                Err(_) => {}
            }
            if tx.send(bound.len()).is_err() {
                return;
            }
        }
    });
    listed_rx
        .await
        .context("the claim watch ended before listing")?;
    Ok(rx)
}

/// Creates the namespaces `names`, [`CREATE_CONCURRENCY`] at once.
pub async fn create_namespaces(client: &Client, names: Vec<String>) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
                api.create(&PostParams::default(), &ns).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// The `q`-quantile (0..=1) of `sorted` (nearest rank), `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Applies the chart's protection policy (its MutatingAdmissionPolicy and binding, as a
/// default install has them) and waits until kube-apiserver applies it to creates.
pub async fn apply_protection_policy(client: &Client) -> Result<()> {
    let rendered = crate::chart::run_helm(&[
        "template",
        "address-controller",
        path_str(&crate::chart::chart_dir()),
        "--kube-version",
        "1.36.0",
        "--api-versions",
        "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
        "--show-only",
        "templates/protectionpolicy.yaml",
    ])
    .map_err(|e| anyhow::anyhow!("helm template: {e}"))?;
    let mut apply = Cluster::get()
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    if let Some(mut stdin) = apply.stdin.take() {
        use std::io::Write;
        stdin.write_all(rendered.as_bytes())?;
    }
    if !apply.wait()?.success() {
        bail!("kubectl apply of the protection policy failed");
    }
    let addresses: Api<address_controller_api::IPAddress> = Api::all(client.clone());
    let probe: address_controller_api::IPAddress = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "protection-probe"},
        "spec": {"address": "192.0.2.1", "className": "probe", "source": {"fromClass": {}}}}))?;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    crate::wait_for(
        "the protection policy mutating creates",
        std::time::Duration::from_secs(60),
        || async {
            let a = addresses.create(&dry, &probe).await?;
            Ok(a.metadata.finalizers.is_some().then_some(()))
        },
    )
    .await
}

/// What informer-like watchers of `namespaceaddresses` saw: when each claim
/// (`namespace/name`) first appeared in a watcher's view, per watcher id.
#[derive(Default)]
pub struct Seen {
    pub first: HashMap<(usize, String), Instant>,
    pub events: u64,
    /// Lists, each watcher's first included.
    pub relists: u64,
    pub rewatches: u64,
    /// Lists or watches kube-apiserver refused (a 429 under a burst of lists): retried
    /// after a pause, as a reflector backs off.
    pub refused: u64,
}

/// The `namespaceaddresses` view.
pub fn namespace_addresses() -> ApiResource {
    ApiResource {
        group: "view.local.sdn.cozystack.io".into(),
        version: "v1alpha1".into(),
        api_version: "view.local.sdn.cozystack.io/v1alpha1".into(),
        kind: "NamespaceAddresses".into(),
        plural: "namespaceaddresses".into(),
    }
}

fn note(seen: &Mutex<Seen>, watcher: usize, o: &DynamicObject, at: Instant) {
    let ns = o.metadata.name.clone().unwrap_or_default();
    let mut s = seen.lock().expect("lock");
    for c in o.data["claims"].as_array().into_iter().flatten() {
        if let Some(name) = c["name"].as_str() {
            s.first
                .entry((watcher, format!("{ns}/{name}")))
                .or_insert(at);
        }
    }
}

/// One informer-like watcher of `namespaceaddresses` — of every namespace's, or of one
/// namespace's (`only`: a field selector on the object's name, as a tenant's informer has
/// it) — until `stop`: it lists, then watches from the list's resourceVersion with
/// bookmarks and a 60 s server timeout, watching again from the last resourceVersion it saw
/// (a relist only on 410).
pub async fn view_watcher(
    client: Client,
    id: usize,
    only: Option<String>,
    seen: Arc<Mutex<Seen>>,
    stop: Instant,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &namespace_addresses());
    let fields = only.map(|ns| format!("metadata.name={ns}"));
    let mut lp = ListParams::default();
    let mut wp = WatchParams::default().timeout(60);
    if let Some(f) = &fields {
        lp = lp.fields(f);
        wp = wp.fields(f);
    }
    let refused = || {
        seen.lock().expect("lock").refused += 1;
        tokio::time::sleep(Duration::from_millis(200))
    };
    let mut rv: Option<String> = None;
    while Instant::now() < stop {
        let from = match &rv {
            Some(v) => v.clone(),
            None => {
                let Ok(list) = api.list(&lp).await else {
                    refused().await;
                    continue;
                };
                for o in &list.items {
                    note(&seen, id, o, Instant::now());
                }
                seen.lock().expect("lock").relists += 1;
                list.metadata.resource_version.unwrap_or_default()
            }
        };
        rv = Some(from.clone());
        let Ok(stream) = api.watch(&wp, &from).await else {
            refused().await;
            continue;
        };
        let mut stream = stream.boxed();
        loop {
            let next = tokio::time::timeout_at(stop.into(), stream.try_next()).await;
            match next {
                Err(_) => return,
                Ok(Ok(Some(
                    WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o),
                ))) => {
                    note(&seen, id, &o, Instant::now());
                    seen.lock().expect("lock").events += 1;
                    rv = o.metadata.resource_version.clone();
                }
                Ok(Ok(Some(WatchEvent::Bookmark(b)))) => rv = Some(b.metadata.resource_version),
                Ok(Ok(Some(WatchEvent::Error(e)))) => {
                    if e.code == 410 {
                        rv = None;
                    }
                    break;
                }
                Ok(Ok(None)) | Ok(Err(_)) => break,
            }
        }
        seen.lock().expect("lock").rewatches += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&v[..1], 0.99), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
