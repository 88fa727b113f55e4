//! Secure serving shared by every binary of the project: its flags ([`SecureServingArgs`]),
//! the serving certificate and the delegated authentication (front-proxy certificates,
//! TokenReview) and authorization (SubjectAccessReview) with their bounded caches — and the
//! HTTPS `/metrics` endpoint built on them. The core serves its views and `/metrics` with
//! it; a driver built on the kit its `/metrics`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use address_controller_runtime::process::open_files_limit;
use address_controller_runtime::supervise::{Shutdown, Tasks};
use clap::Args;
use kube::Client;
use prometheus::Registry;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::any;

use crate::authn::Authenticator;
use crate::authz::Authorizer;
use crate::budget::HeadBudget;
use crate::front;
use crate::limits::{InFlight, ServerLimits, ServingLimitArgs};
use crate::listener::{self, Listen, Transport};
use crate::metrics::AuthCaches;
use crate::metrics::ServingMetrics;
use crate::status::page_not_found;
use crate::tls::{self, ServingCert};

/// The certificate, the delegated auth and the serving limits of a process.
pub struct SecureServing {
    pub config: Arc<rustls::ServerConfig>,
    pub authn: Arc<Authenticator>,
    pub authz: Arc<Authorizer>,
    /// The limits of each of its TLS servers.
    pub limits: ServerLimits,
    /// The process's head budget (its probe port's too).
    pub budget: Arc<HeadBudget>,
    /// Who its servers authenticate.
    callers: Callers,
}

/// Why secure serving could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the serving certificate: {0}")]
    Certificate(#[from] tls::TlsError),
    #[error("registering the serving metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Who a process's TLS servers authenticate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callers {
    /// Bearer tokens (TokenReview) only: a process that serves `/metrics` alone.
    Tokens,
    /// The aggregator's front-proxy client certificates too: an aggregated API server (it
    /// watches kube-system/extension-apiserver-authentication for the front proxy's CA).
    AggregatorAndTokens,
}

/// A listening address that may be off: a flag whose empty value turns its server off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionalAddress(pub Option<SocketAddr>);

impl std::str::FromStr for OptionalAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Ok(OptionalAddress(None));
        }
        s.parse()
            .map(|a| OptionalAddress(Some(a)))
            .map_err(|_| format!("{s:?} is not an address like 0.0.0.0:8443 (empty: off)"))
    }
}

/// The serving flags every binary of the project takes: the certificate, the auth caches'
/// bound and the limits of what the network may have.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Secure serving")]
pub struct SecureServingArgs {
    /// Serving certificate (PEM); reloaded when it changes. Without it and the key, a
    /// self-signed one for localhost.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of the serving certificate (PEM).
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,
    /// Most entries of each delegated-auth cache (TokenReview results, SubjectAccessReview
    /// decisions): a flood of distinct tokens cannot grow memory past it.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_AUTH_CACHE_SIZE",
        default_value_t = 10_000
    )]
    pub auth_cache_size: u64,
    #[command(flatten)]
    pub limits: ServingLimitArgs,
}

/// Where a process's secure serving comes from.
pub struct Serving<'a> {
    /// The reviews' own client (TokenReview, SubjectAccessReview, the front-proxy
    /// settings): nothing else of the process waits behind a stranger's reviews.
    pub reviews: &'a Client,
    pub args: &'a SecureServingArgs,
    /// How many TLS servers the process runs (they share the open-file limit).
    pub servers: u64,
    /// The process's head budget ([`ServingLimitArgs::head_budget`]).
    pub budget: Arc<HeadBudget>,
    /// Who its servers authenticate.
    pub callers: Callers,
}

impl SecureServing {
    /// The serving certificate (`cert`, or a self-signed one for localhost), the auth caches
    /// (at most `cache_size` entries each, exported on `registry`) and their upkeep task;
    /// for [`Callers::AggregatorAndTokens`], also the watch of
    /// kube-system/extension-apiserver-authentication that makes front-proxy client
    /// certificates count.
    pub fn start(
        serving: Serving<'_>,
        registry: &Registry,
        tasks: &mut Tasks,
    ) -> Result<SecureServing, StartError> {
        let args = serving.args;
        let cert = match (&args.tls_cert_file, &args.tls_private_key_file) {
            (Some(cert), Some(key)) => ServingCert::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => ServingCert::SelfSigned(vec!["localhost".into()]),
        };
        let config = tls::server_config(cert)?;
        let gate = args.limits.review_gate();
        let client = serving.reviews;
        let authn = Authenticator::new(client.clone(), args.auth_cache_size, gate.clone());
        let authz = Arc::new(Authorizer::new(client.clone(), args.auth_cache_size, gate));
        let (tokens, decisions) = (authn.clone(), authz.clone());
        registry.register(Box::new(AuthCaches::new(
            Box::new(move || tokens.cached_tokens()),
            Box::new(move || decisions.cached()),
        )?))?;
        ServingMetrics::register(registry)?;
        let limits = args.limits.limits(open_files_limit(), serving.servers);
        if serving.callers == Callers::AggregatorAndTokens {
            tasks.spawn_forever("front-proxy settings watch", authn.clone().watch_config());
        }
        tasks.spawn_forever(
            "auth cache upkeep",
            auth_upkeep(authn.clone(), authz.clone()),
        );
        Ok(SecureServing {
            config,
            authn,
            authz,
            limits,
            budget: serving.budget,
            callers: serving.callers,
        })
    }

    /// The front door of one of its servers: the delegated auth, and places in flight of
    /// its own.
    pub fn access(&self) -> front::Access {
        front::Access {
            authn: self.authn.clone(),
            authz: self.authz.clone(),
            inflight: Arc::new(InFlight::new(&self.limits)),
        }
    }

    /// Serves `/metrics` (rendered by `render`) over HTTPS on `addr` to principals allowed
    /// to `get` the non-resource path `/metrics`, as a supervised task.
    pub fn spawn_metrics(
        &self,
        addr: SocketAddr,
        render: Arc<dyn Fn() -> String + Send + Sync>,
        shutdown: &Shutdown,
        tasks: &mut Tasks,
    ) {
        let app = metrics_router(self.access(), render);
        // Nothing to drain: a scrape that fails is retried at the next interval.
        self.spawn_server(Server::METRICS, addr, app, false, shutdown, tasks);
    }

    /// Serves `app` over TLS on `addr` with this process's certificate and limits, as the
    /// supervised task `server.task`; with `drain`, requests in flight finish at shutdown.
    pub fn spawn_server(
        &self,
        server: Server,
        addr: SocketAddr,
        app: Router,
        drain: bool,
        shutdown: &Shutdown,
        tasks: &mut Tasks,
    ) {
        let authn = self.authn.clone();
        let identify: Option<listener::Identify> = self
            .callers
            .eq(&Callers::AggregatorAndTokens)
            .then(|| Arc::new(move |peer: &_| authn.is_front_proxy(peer)) as listener::Identify);
        let listen = Listen {
            addr,
            server: server.name,
            transport: Transport::Tls(self.config.clone()),
            limits: self.limits,
            budget: self.budget.clone(),
            identify,
            drain,
        };
        let serve = listener::serve(listen, app, shutdown.wait());
        let task = server.task;
        // The supervisor's tasks end in its own error type.
        tasks.spawn(task, async move {
            serve.await.map_err(|e| anyhow::Error::new(e).context(task))
        });
    }
}

/// The names of one of a process's TLS servers: in its logs and metrics, and its task's.
#[derive(Debug, Clone, Copy)]
pub struct Server {
    pub name: &'static str,
    pub task: &'static str,
}

impl Server {
    /// The secure `/metrics` endpoint.
    pub const METRICS: Server = Server {
        name: "metrics",
        task: "metrics server",
    };
}

/// Keeps the delegated-auth caches within their bounds (evictions and expirations are
/// otherwise applied only as they are used); runs for as long as the process.
pub async fn auth_upkeep(authn: Arc<Authenticator>, authz: Arc<Authorizer>) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        every.tick().await;
        authn.upkeep().await;
        authz.upkeep().await;
    }
}

/// The secure metrics endpoint: `/metrics` over TLS, for principals allowed to `get` the
/// non-resource path `/metrics` (the same [`front`] layers as the views: TokenReview +
/// SubjectAccessReview). Any other path is a plain 404, unauthenticated.
pub fn metrics_router(
    access: front::Access,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> Router {
    Router::new()
        .route(
            "/metrics",
            any(move || {
                let render = render.clone();
                async move {
                    (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        render(),
                    )
                }
            }),
        )
        .route_layer(from_fn_with_state(access.clone(), front::authenticate))
        .route_layer(from_fn_with_state(access, front::admit))
        .route_layer(from_fn(front::describe))
        .fallback(|| async { page_not_found() })
}

#[cfg(test)]
mod tests {
    use super::OptionalAddress;

    #[test]
    fn an_empty_address_is_off_and_a_bad_one_is_refused_at_the_flag() {
        assert_eq!("".parse::<OptionalAddress>(), Ok(OptionalAddress(None)));
        assert_eq!(
            "127.0.0.1:8443".parse::<OptionalAddress>(),
            Ok(OptionalAddress(Some(([127, 0, 0, 1], 8443).into())))
        );
        assert_eq!(
            "[::]:8443".parse::<OptionalAddress>(),
            Ok(OptionalAddress(Some("[::]:8443".parse().unwrap())))
        );
        for bad in ["localhost:8443", "8443", " ", "0.0.0.0"] {
            let e = bad.parse::<OptionalAddress>().unwrap_err();
            assert!(e.contains("empty: off"), "{bad}: {e}");
        }
    }
}
