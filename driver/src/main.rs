//! `range-driver`: the reference driver (SPEC §8). It provisions IPAddresses for claims of
//! classes whose provisioner is `range.drivers.local.sdn.cozystack.io`, from the CIDRs in
//! the class's `spec.parameters.cidrs`, and publishes each class's capacity. It does no
//! association: there is no backend to pin an address to.

mod allocator;
mod provision;
mod rbac;
mod reconcile;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use address_controller_controller::{cache, leader};
use axum::Router;
use axum::routing::get;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "range-driver",
    version,
    about = "Reference IPAddress driver: allocates from the CIDRs of a class"
)]
struct Args {
    /// Kubeconfig to use; without it the in-cluster config (or $KUBECONFIG) is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Elect a leader among replicas; only the leader provisions.
    #[arg(long, env = "RANGE_DRIVER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    #[arg(long, default_value = "range-driver")]
    lease_name: String,
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Identity in the Lease (default: host name and process id).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    renew_deadline: Duration,
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    retry_period: Duration,
    /// Plain-HTTP address of /healthz and /readyz.
    #[arg(
        long,
        env = "RANGE_DRIVER_PROBE_ADDRESS",
        default_value = "0.0.0.0:8082"
    )]
    probe_address: SocketAddr,
    /// Print the ClusterRole this driver needs (YAML) and exit; `make manifests` uses it.
    #[arg(long)]
    print_cluster_role: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.print_cluster_role {
        print!("{}", rbac::cluster_role_yaml()?);
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,kube_runtime::controller=warn")
            }),
        )
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let client = leader::client(args.kubeconfig.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("kubernetes client: {e}"))?;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(leader::default_identity);
    let (cache, drive) = cache::start(&client, false);
    tokio::spawn(drive);

    let ready = Arc::new(AtomicBool::new(false));
    {
        let (stores, ready) = (cache.stores.clone(), ready.clone());
        tokio::spawn(async move {
            if stores.wait_until_ready().await.is_ok() {
                ready.store(true, Ordering::Release);
            }
        });
    }
    let listener = tokio::net::TcpListener::bind(args.probe_address).await?;
    let probe_ready = ready.clone();
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = probe_ready.clone();
                async move {
                    if ready.load(Ordering::Acquire) {
                        (axum::http::StatusCode::OK, "ok")
                    } else {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            "caches not synced",
                        )
                    }
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, probes).await });

    let leadership = if args.leader_elect {
        leader::Leadership::follower()
    } else {
        leader::Leadership::always()
    };
    let ctx = Arc::new(reconcile::Ctx::new(
        client.clone(),
        cache.stores.clone(),
        leadership.clone(),
        ready.clone(),
        identity.clone(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let controllers = tokio::spawn(reconcile::run(cache, ctx, stopped()));
    let election = async {
        if !args.leader_elect {
            return stopped().await;
        }
        let cfg = leader::LeaseConfig {
            namespace: args.lease_namespace.clone(),
            name: args.lease_name.clone(),
            identity: identity.clone(),
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        };
        if let Err(e) = leader::run(client.clone(), cfg, leadership.clone(), stopped()).await {
            tracing::error!(error = %e, "leadership lost; exiting");
            std::process::exit(1);
        }
    };
    let signals = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
        anyhow::Ok(())
    };
    let (_, signalled) = tokio::join!(election, signals);
    signalled?;
    let _ = tokio::time::timeout(Duration::from_secs(10), controllers).await;
    Ok(())
}
