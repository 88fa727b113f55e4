//! The plain-HTTP probe port: `/healthz`, `/livez` and `/readyz` only. It is
//! unauthenticated (kubelet probes are anonymous), so it serves nothing else — metrics are
//! served over HTTPS to authorized callers only — and everyone on it is a stranger: a
//! flooding pod closes its own oldest connections, never the kubelet's
//! ([`ServerLimits::probes`]), so the flood cannot turn into a restart loop.
//!
//! It runs on a thread and a runtime of its own: whatever the views and the controllers
//! keep the process's runtime busy with (24 maximal label selectors parsed at once took a
//! probe on the shared runtime to 0.3 s), `/readyz` and `/livez` are answered within
//! milliseconds — a probe that times out restarts a pod that was only busy.

use std::net::SocketAddr;
use std::sync::Arc;

use address_controller_runtime::health::Health;
use address_controller_runtime::process::open_files_limit;
use address_controller_runtime::supervise::{Shutdown, Tasks};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Args;

use crate::budget::HeadBudget;
use crate::limits::ServerLimits;
use crate::listener::{self, Listen, Transport};

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

/// Serves the probes on `args.probe_address` as the supervised task `probes`, within the
/// process's head `budget`, until shutdown (a port that cannot be bound ends the process),
/// on a thread and a single-threaded runtime of their own.
pub fn spawn(
    args: &ProbeArgs,
    health: Arc<Health>,
    budget: Arc<HeadBudget>,
    shutdown: &Shutdown,
    tasks: &mut Tasks,
) {
    let listen = Listen {
        addr: args.probe_address,
        server: "probes",
        transport: Transport::Plain,
        limits: ServerLimits::probes(open_files_limit()),
        budget,
        identify: None,
        drain: false,
    };
    let addr = args.probe_address;
    let app = router(health);
    let stop = shutdown.wait();
    let (done, served) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("probes".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| anyhow::anyhow!("the probes' runtime: {e}"))
                .and_then(|rt| {
                    rt.block_on(listener::serve(listen, app, stop))
                        .map_err(|e| anyhow::anyhow!("binding the probe address {addr}: {e}"))
                });
            let _ = done.send(result);
        });
    tasks.spawn("probes", async move {
        thread.map_err(|e| anyhow::anyhow!("starting the probes' thread: {e}"))?;
        served
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the probes' thread ended unanswered")))
    });
}
