//! Reading what a process exposes: its `/metrics` samples, a plain HTTP GET, the token
//! allowed to scrape.

use super::*;

/// The value of one series in a `/metrics` text: `series` is its name and labels exactly as
/// printed; `None` when the text has no such series.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sum of the series in a `/metrics` text whose lines start with `prefix` (a name, or a
/// name and its first labels) and pass `keep` — a counter or gauge over some of its labels.
pub fn sum_samples(metrics: &str, prefix: &str, keep: impl Fn(&str) -> bool) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A minimal HTTP/1.1 GET on loopback: (status, body).
pub async fn http_get(url: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("only http:// URLs"))?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad HTTP response"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A token allowed to `get /metrics` (a ServiceAccount of the harness, made once per test
/// process).
pub fn metrics_token() -> Result<String> {
    static TOKEN: OnceLock<String> = OnceLock::new();
    if let Some(t) = TOKEN.get() {
        return Ok(t.clone());
    }
    let cluster = Cluster::get();
    let objects = [
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "test-metrics-scraper", "namespace": "default"}}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "address-controller-test-metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "address-controller-test-metrics-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "address-controller-test-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "test-metrics-scraper", "namespace": "default"}]}),
    ];
    cluster
        .apply(&objects)
        .context("applying the metrics scraper's RBAC")?;
    let token = cluster
        .kubectl_ok(&[
            "create",
            "token",
            "test-metrics-scraper",
            "-n",
            "default",
            "--duration",
            "24h",
        ])?
        .trim()
        .to_string();
    Ok(TOKEN.get_or_init(|| token).clone())
}
