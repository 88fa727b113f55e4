//! The plain-HTTP probe port: `/healthz`, `/livez` and `/readyz` only. It is
//! unauthenticated (kubelet probes are anonymous), so it serves nothing else — metrics are
//! served over HTTPS to authorized callers only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Args;

use crate::health::Health;

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Probes")]
pub struct ProbeArgs {
    /// Plain-HTTP address of /healthz, /livez and /readyz (probes only).
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_PROBE_ADDRESS",
        default_value = "0.0.0.0:8081"
    )]
    pub probe_address: SocketAddr,
}

/// The probe routes: `/readyz` is 200 while `health` is live, else 503 with the reasons.
pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health)
}

async fn readyz(State(h): State<Arc<Health>>) -> (StatusCode, String) {
    let problems = h.problems();
    if problems.is_empty() {
        (StatusCode::OK, "ok".into())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("\n") + "\n")
    }
}

/// Binds the probe port (an error if it cannot: the caller exits) and serves until
/// `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the probe address {addr}: {e}"))?;
    tracing::info!(%addr, "probes (healthz, livez, readyz) listening");
    axum::serve(listener, router(health))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
