//! `address-controller`: one binary for the core controller and (issue #4) the
//! aggregated API server.

mod admin;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use address_controller_apiserver::authn::Authenticator;
use address_controller_apiserver::authz::Authorizer;
use address_controller_apiserver::tls;
use address_controller_controller::{cache, context::Context, leader, metrics::Metrics, run};
use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use futures_shutdown::Shutdown;

#[derive(Parser)]
#[command(name = "address-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the core controller and the aggregated API server.
    Run(Box<RunArgs>),
    /// Write the generated manifests (CRDs, ClusterRole) into the chart. `make manifests` runs this.
    Manifests {
        /// Directory the CRD YAML files are written to.
        #[arg(long, default_value = "chart/address-controller/crds")]
        crds_dir: PathBuf,
        /// File the ClusterRole is written to.
        #[arg(long, default_value = "chart/address-controller/templates/role.yaml")]
        role: PathBuf,
        /// Directory the OpenAPI documents of the views are written to.
        #[arg(long, default_value = "openapi")]
        openapi_dir: PathBuf,
    },
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    apiserver: ApiServerArgs,
    #[command(flatten)]
    election: ElectionArgs,
    #[command(flatten)]
    ops: OpsArgs,
    /// Reconciles running at once, per controller.
    #[arg(long, env = "ADDRESS_CONTROLLER_CONCURRENCY", default_value_t = 16)]
    concurrency: u16,
    /// Create an IPAddressClaim for every LoadBalancer Service that names none (SPEC §7).
    #[arg(long, env = "ADDRESS_CONTROLLER_AUTO_CLAIMS", default_value_t = true, action = clap::ArgAction::Set)]
    auto_claims: bool,
}

#[derive(Args)]
#[command(next_help_heading = "Kubernetes API")]
struct KubeArgs {
    /// Kubeconfig to use; without it the in-cluster config (or $KUBECONFIG) is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

#[derive(Args)]
#[command(next_help_heading = "Components and the aggregated API server")]
struct ApiServerArgs {
    /// Serve the view.local.sdn.cozystack.io views (every replica serves them).
    #[arg(long = "apiserver", env = "ADDRESS_CONTROLLER_APISERVER", default_value_t = true, action = clap::ArgAction::Set)]
    enabled: bool,
    /// Run the controllers (only the elected leader acts).
    #[arg(long = "controller", env = "ADDRESS_CONTROLLER_CONTROLLER", default_value_t = true, action = clap::ArgAction::Set)]
    controller: bool,
    /// HTTPS address of the aggregated API server.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_APISERVER_ADDRESS",
        default_value = "0.0.0.0:6443"
    )]
    apiserver_address: SocketAddr,
    /// Serving certificate (PEM); reloaded when it changes. Without it a self-signed one is used.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    tls_cert_file: Option<PathBuf>,
    /// Key of the serving certificate (PEM).
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    tls_private_key_file: Option<PathBuf>,
    /// HTTPS address of /metrics (TokenReview + SubjectAccessReview on the path); empty disables it.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METRICS_ADDRESS",
        default_value = "0.0.0.0:8443"
    )]
    metrics_address: String,
}

#[derive(Args)]
#[command(next_help_heading = "Leader election")]
struct ElectionArgs {
    /// Elect a leader among replicas on a coordination.k8s.io Lease; only the leader reconciles.
    #[arg(long, env = "ADDRESS_CONTROLLER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the Lease.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_LEASE_NAME",
        default_value = "address-controller"
    )]
    lease_name: String,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Identity of this replica in the Lease (default: host name and process id).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long a lease stays valid without renewal.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// How long the leader tries to renew before giving up (then the process exits).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    renew_deadline: Duration,
    /// Pause between election attempts.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    retry_period: Duration,
}

#[derive(Args)]
#[command(next_help_heading = "Operations")]
struct OpsArgs {
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_PROBE_ADDRESS",
        default_value = "0.0.0.0:8081"
    )]
    probe_address: SocketAddr,
    /// Log format.
    #[arg(long, env = "ADDRESS_CONTROLLER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Plain,
    Json,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Manifests {
            crds_dir,
            role,
            openapi_dir,
        } => write_manifests(&crds_dir, &role, &openapi_dir),
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(run_controller(*args)),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube_runtime::controller=warn")
    });
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run_controller(args: RunArgs) -> anyhow::Result<()> {
    init_logging(args.ops.log_format);
    let client = leader::client(args.kube.kubeconfig.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("kubernetes client: {e}"))?;
    let identity = args
        .election
        .identity
        .clone()
        .unwrap_or_else(leader::default_identity);
    let shutdown = Shutdown::new();

    let (cache, drive) = cache::start(&client, args.auto_claims);
    let stores = cache.stores.clone();
    tokio::spawn(drive);

    let metrics = Arc::new(Metrics::new(stores.clone())?);
    let ready = Arc::new(AtomicBool::new(false));
    {
        let (stores, ready) = (stores.clone(), ready.clone());
        tokio::spawn(async move {
            if stores.wait_until_ready().await.is_ok() {
                tracing::info!("caches synced");
                ready.store(true, Ordering::Release);
            }
        });
    }
    // The TLS endpoints (views, secure metrics) share the serving certificate and the
    // delegated authentication and authorization.
    let needs_tls = args.apiserver.enabled || !args.apiserver.metrics_address.is_empty();
    let secure = if needs_tls {
        let cert = match (
            &args.apiserver.tls_cert_file,
            &args.apiserver.tls_private_key_file,
        ) {
            (Some(cert), Some(key)) => tls::ServingCert::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => tls::ServingCert::SelfSigned(vec!["localhost".into()]),
        };
        let authn = Authenticator::new(client.clone());
        tokio::spawn(authn.clone().watch_config());
        Some((
            tls::server_config(cert)?,
            authn,
            Arc::new(Authorizer::new(client.clone())),
        ))
    } else {
        None
    };
    let mut servers = Vec::new();
    if let (true, Some((config, authn, authz))) = (args.apiserver.enabled, &secure) {
        let state = Arc::new(address_controller_apiserver::State {
            stores: stores.clone(),
            authn: authn.clone(),
            authz: authz.clone(),
            synced: ready.clone(),
        });
        servers.push(tokio::spawn(address_controller_apiserver::serve_tls(
            args.apiserver.apiserver_address,
            config.clone(),
            address_controller_apiserver::router(state),
            shutdown.wait(),
        )));
    }
    if let (false, Some((config, authn, authz))) =
        (args.apiserver.metrics_address.is_empty(), &secure)
    {
        let addr: SocketAddr = args.apiserver.metrics_address.parse()?;
        let m = metrics.clone();
        let app = address_controller_apiserver::metrics_router(
            authn.clone(),
            authz.clone(),
            Arc::new(move || m.render()),
        );
        servers.push(tokio::spawn(address_controller_apiserver::serve_tls(
            addr,
            config.clone(),
            app,
            shutdown.wait(),
        )));
    }
    let admin = tokio::spawn(admin::serve(
        args.ops.probe_address,
        admin::AdminState {
            ready: ready.clone(),
            metrics: metrics.clone(),
        },
        shutdown.wait(),
    ));

    let leadership = if args.election.leader_elect {
        leader::Leadership::follower()
    } else {
        leader::Leadership::always()
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        stores,
        leadership.clone(),
        ready.clone(),
        metrics,
        identity.clone(),
    ));
    let controllers = if args.apiserver.controller {
        Some(tokio::spawn(run::run(
            cache,
            ctx,
            run::Settings {
                concurrency: args.concurrency,
                auto_claims: args.auto_claims,
            },
            shutdown.wait(),
        )))
    } else {
        drop(cache);
        None
    };

    let election = async {
        if !args.election.leader_elect || !args.apiserver.controller {
            return shutdown.wait().await;
        }
        let cfg = leader::LeaseConfig {
            namespace: args.election.lease_namespace.clone(),
            name: args.election.lease_name.clone(),
            identity: identity.clone(),
            lease_duration: args.election.lease_duration,
            renew_deadline: args.election.renew_deadline,
            retry_period: args.election.retry_period,
        };
        if let Err(e) = leader::run(client.clone(), cfg, leadership.clone(), shutdown.wait()).await
        {
            // Like client-go: a replica that lost the lease exits and is restarted clean.
            tracing::error!(error = %e, "leadership lost; exiting");
            std::process::exit(1);
        }
    };

    let signals = {
        let shutdown = shutdown.clone();
        async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            shutdown.trigger();
        }
    };
    tokio::join!(election, signals);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        if let Some(c) = controllers {
            let _ = c.await;
        }
        for server in servers {
            let _ = server.await;
        }
        let _ = admin.await;
    })
    .await;
    Ok(())
}

async fn wait_for_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn write_manifests(crds_dir: &Path, role: &Path, openapi_dir: &Path) -> anyhow::Result<()> {
    for (name, doc) in address_controller_apiserver::openapi::files() {
        let path = openapi_dir.join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = role.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(
        role,
        address_controller_controller::rbac::cluster_role_yaml()?,
    )
    .with_context(|| format!("writing {}", role.display()))?;
    println!("wrote {}", role.display());
    std::fs::create_dir_all(crds_dir)
        .with_context(|| format!("creating {}", crds_dir.display()))?;
    for (name, yaml) in address_controller_api::manifests::crd_files()? {
        let path = crds_dir.join(name);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// A one-shot, cloneable shutdown signal.
mod futures_shutdown {
    use tokio::sync::watch;

    #[derive(Clone)]
    pub struct Shutdown(watch::Sender<bool>);

    impl Shutdown {
        pub fn new() -> Self {
            Shutdown(watch::Sender::new(false))
        }
        pub fn trigger(&self) {
            self.0.send_replace(true);
        }
        /// Resolves once [`Shutdown::trigger`] was called.
        pub fn wait(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
            let mut rx = self.0.subscribe();
            async move {
                let _ = rx.wait_for(|v| *v).await;
            }
        }
    }
}
