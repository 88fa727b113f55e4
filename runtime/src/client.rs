//! The Kubernetes client, with every call bounded in time.
//!
//! kube's default client has no read timeout: a call to an API server that stops answering
//! hangs forever. Here every request must get its response headers within `--api-timeout`
//! (a tower timeout around the whole stack; a watch gets its headers at once and then
//! streams), and no read on a connection may stall longer than `--api-read-timeout`
//! (watches hear a bookmark about every minute, so this must stay above that).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use clap::Args;
use kube::client::ClientBuilder;
use kube::{Client, Config};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// How to reach the API server.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Kubernetes API")]
pub struct ClientArgs {
    /// Kubeconfig to use. Without it, $KUBECONFIG as kubectl reads it (a list of files, the
    /// first to set a value wins, missing files are skipped), else ~/.kube/config, else the
    /// in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Longest wait for the response to one API request (a watch: for its first byte).
    #[arg(long, env = "ADDRESS_CONTROLLER_API_TIMEOUT", default_value = "30s", value_parser = address_controller_api::duration::parse)]
    pub api_timeout: Duration,
    /// Longest pause between two reads on an API connection (must exceed the ~1 min between
    /// watch bookmarks).
    #[arg(long, env = "ADDRESS_CONTROLLER_API_READ_TIMEOUT", default_value = "150s", value_parser = address_controller_api::duration::parse)]
    pub api_read_timeout: Duration,
    /// Requests per second to kube-apiserver, sustained (a token bucket as client-go's; 0:
    /// no client-side limit, only the server's priority and fairness). The default allows
    /// ~50 binds/s (4 writes each) with bursts of twice that.
    #[arg(long, env = "ADDRESS_CONTROLLER_KUBE_API_QPS", default_value_t = 200.0)]
    pub kube_api_qps: f32,
    /// Requests the client may send at once above --kube-api-qps after a quiet spell.
    #[arg(long, env = "ADDRESS_CONTROLLER_KUBE_API_BURST", default_value_t = 400)]
    pub kube_api_burst: u32,
}

impl Default for ClientArgs {
    fn default() -> Self {
        ClientArgs {
            kubeconfig: None,
            api_timeout: Duration::from_secs(30),
            api_read_timeout: Duration::from_secs(150),
            kube_api_qps: 200.0,
            kube_api_burst: 400,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("inferring the client configuration: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("building the client: {0}")]
    Build(#[from] kube::Error),
}

/// $KUBECONFIG merged as kubectl merges it: a path list, empty entries and files that do
/// not exist skipped, the first file to set a value wins. `None` when it names no existing
/// file (then kube's inference: ~/.kube/config, in-cluster).
fn kubeconfig_from_env() -> Result<Option<(Vec<PathBuf>, kube::config::Kubeconfig)>, ClientError> {
    let Some(value) = std::env::var_os("KUBECONFIG") else {
        return Ok(None);
    };
    let paths: Vec<PathBuf> = std::env::split_paths(&value)
        .filter(|p| !p.as_os_str().is_empty() && p.exists())
        .collect();
    if paths.is_empty() {
        return Ok(None);
    }
    let mut merged = kube::config::Kubeconfig::default();
    for p in &paths {
        let kc =
            kube::config::Kubeconfig::read_from(p).map_err(|source| ClientError::Kubeconfig {
                path: p.clone(),
                source,
            })?;
        merged = merged.merge(kc).map_err(|source| ClientError::Kubeconfig {
            path: p.clone(),
            source,
        })?;
    }
    Ok(Some((paths, merged)))
}

impl ClientArgs {
    /// The client configuration, timeouts applied.
    pub async fn config(&self) -> Result<Config, ClientError> {
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                    ClientError::Kubeconfig {
                        path: path.clone(),
                        source,
                    }
                })?;
                Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|source| ClientError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            None => match kubeconfig_from_env()? {
                Some((paths, kc)) => {
                    Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                        .await
                        .map_err(|source| ClientError::Kubeconfig {
                            path: std::env::join_paths(&paths)
                                .map_or_else(|_| PathBuf::new(), PathBuf::from),
                            source,
                        })?
                }
                None => Config::infer().await?,
            },
        };
        config.connect_timeout = Some(self.api_timeout.min(Duration::from_secs(10)));
        config.read_timeout = Some(self.api_read_timeout);
        // The read timeout counts from the request, not from when a pooled connection
        // went idle.
        config.reset_reader_on_write = true;
        config.write_timeout = Some(self.api_timeout);
        Ok(config)
    }

    /// A client whose every request is bounded (see the module documentation), rate
    /// limited and counted ([`ClientMetrics`]). The limiter is outside the timeout: waiting
    /// for a token does not count against `--api-timeout`.
    pub async fn client(&self) -> Result<Client, ClientError> {
        self.build(Some(Bucket::new(
            f64::from(self.kube_api_qps),
            self.kube_api_burst,
            Instant::now(),
        )))
        .await
    }

    /// A client bounded and counted as [`ClientArgs::client`], without its rate limiter:
    /// for the Lease (which must never wait behind the controllers) and for the delegated
    /// auth reviews (bounded by their own gate, which refuses instead of queueing). Its
    /// requests are not observed by the limiter's histogram.
    pub async fn unlimited_client(&self) -> Result<Client, ClientError> {
        self.build(None).await
    }

    async fn build(&self, bucket: Option<Bucket>) -> Result<Client, ClientError> {
        let config = self.config().await?;
        let instrument = Instrument {
            bucket: bucket.map(|b| Arc::new(Mutex::new(b))),
        };
        Ok(ClientBuilder::try_from(config)?
            .with_layer(&tower::timeout::TimeoutLayer::new(self.api_timeout))
            .with_layer(&instrument)
            .build())
    }
}

/// A token bucket as client-go's: `qps` tokens a second, at most `burst` saved up. Two ways
/// to spend: [`Bucket::reserve`] goes into debt and says how long to wait (the client's
/// limiter: a request waits its turn), [`Bucket::try_take`] never does (a gate that refuses
/// rather than queue). `qps` 0 turns it off.
#[derive(Debug)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Bucket {
            qps,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// The tokens grown since the last call, capped at the burst.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
    }

    /// Takes a token; how long the caller must wait before using it (0 while tokens are
    /// left). Tokens go negative under load, so waiting callers are spaced 1/qps apart.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }

    /// Takes a token if one is there now; never goes into debt.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if self.qps <= 0.0 {
            return true;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What every process counts about its own calls to kube-apiserver, as client-go's
/// `rest_client_*` metrics do: requests by method and status code, their latency (to the
/// response headers: for a watch, its start), and the time spent waiting on the rate limiter.
/// `method` is the HTTP method, `WATCH` for a GET with `watch=true`; `code` is the status,
/// `<error>` when no response came (timeout, connection).
pub struct ClientMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    limiter: Histogram,
}

impl ClientMetrics {
    fn new() -> Result<Self, prometheus::Error> {
        Ok(ClientMetrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "address_controller_client_requests_total",
                    "Requests to kube-apiserver by HTTP method (WATCH for a watch) and status code (<error> for no response)",
                ),
                &["method", "code"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "address_controller_client_request_duration_seconds",
                    "Time from sending a request to kube-apiserver to its response headers, by method",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ]),
                &["method"],
            )?,
            limiter: Histogram::with_opts(
                HistogramOpts::new(
                    "address_controller_client_rate_limiter_duration_seconds",
                    "Time a request waited for the client's rate limiter (--kube-api-qps, --kube-api-burst)",
                )
                .buckets(vec![0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0]),
            )?,
        })
    }

    /// Registers the client metrics on `registry` (once per process; every client of the
    /// process counts into the same series).
    pub fn register(registry: &Registry) -> Result<(), prometheus::Error> {
        let m = client_metrics().ok_or_else(|| {
            prometheus::Error::Msg("the client metrics could not be created".into())
        })?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        registry.register(Box::new(m.limiter.clone()))
    }
}

fn client_metrics() -> Option<&'static ClientMetrics> {
    static METRICS: OnceLock<Option<ClientMetrics>> = OnceLock::new();
    METRICS.get_or_init(|| ClientMetrics::new().ok()).as_ref()
}

/// The client's rate limiter and request metrics, outermost in the stack.
#[derive(Clone)]
struct Instrument {
    /// `None`: no limiter (and none observed).
    bucket: Option<Arc<Mutex<Bucket>>>,
}

impl<S> tower::Layer<S> for Instrument {
    type Service = Instrumented<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Instrumented {
            inner,
            bucket: self.bucket.clone(),
        }
    }
}

#[derive(Clone)]
struct Instrumented<S> {
    inner: S,
    bucket: Option<Arc<Mutex<Bucket>>>,
}

fn method_label(req: &http::Request<kube::client::Body>) -> &'static str {
    let watch = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    match *req.method() {
        http::Method::GET if watch => "WATCH",
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

impl<S, B> tower::Service<http::Request<kube::client::Body>> for Instrumented<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let method = method_label(&req);
        let limited = self.bucket.is_some();
        let wait = self.bucket.as_ref().map_or(Duration::ZERO, |b| {
            b.lock()
                .map_or(Duration::ZERO, |mut b| b.reserve(Instant::now()))
        });
        // The inner future does nothing until polled (hyper sends when polled), so the
        // request leaves only after the wait.
        let fut = self.inner.call(req);
        Box::pin(async move {
            let metrics = client_metrics();
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if let Some(m) = metrics.filter(|_| limited) {
                m.limiter.observe(wait.as_secs_f64());
            }
            let start = Instant::now();
            let res = fut.await;
            if let Some(m) = metrics {
                m.duration
                    .with_label_values(&[method])
                    .observe(start.elapsed().as_secs_f64());
                let code = match &res {
                    Ok(r) => r.status().as_str().to_owned(),
                    Err(_) => "<error>".to_owned(),
                };
                m.requests.with_label_values(&[method, &code]).inc();
            }
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_spends_the_burst_then_spaces_requests_by_one_over_qps() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0, 3, t0);
        for _ in 0..3 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
        // No token left: the 4th waits 100 ms, the 5th 200 ms.
        let w4 = b.reserve(t0);
        let w5 = b.reserve(t0);
        assert!((w4.as_secs_f64() - 0.1).abs() < 1e-9, "{w4:?}");
        assert!((w5.as_secs_f64() - 0.2).abs() < 1e-9, "{w5:?}");
        // A second later the debt (2) is repaid and 8 tokens grew, capped at the burst (3).
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.reserve(t1), Duration::ZERO);
        assert_eq!(b.reserve(t1), Duration::ZERO);
        assert_eq!(b.reserve(t1), Duration::ZERO);
        assert!(b.reserve(t1) > Duration::ZERO);
    }

    #[test]
    fn qps_zero_never_waits() {
        let t0 = Instant::now();
        let mut b = Bucket::new(0.0, 1, t0);
        for _ in 0..100 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
    }
}
