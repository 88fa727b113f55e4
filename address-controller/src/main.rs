//! `address-controller`: one binary for the core controller and the aggregated API server.
//! `main` wires the parts and supervises them: any critical task that stops ends the
//! process with a non-zero exit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use address_controller_apiserver::Views;
use address_controller_controller::context::Context;
use address_controller_controller::metrics::Metrics;
use address_controller_controller::run;
use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::health::LivenessArgs;
use address_controller_runtime::leader::ElectionArgs;
use address_controller_runtime::logging::LogArgs;
use address_controller_runtime::process::{Acting, Lease, Process};
use address_controller_runtime::workers::Gate;
use address_controller_runtime::world::World;
use address_controller_serving::probes::ProbeArgs;
use address_controller_serving::secure::{
    Callers, OptionalAddress, SecureServing, SecureServingArgs, Serving,
};
use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

/// jemalloc, not the C library's malloc: at 20,000 claims + 20,000 addresses the process
/// holds 13% less memory for the same objects (docs/design.md, "jemalloc").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod adopt;
mod chart_docs;
mod check;
mod history;
mod teardown;

#[derive(Parser)]
#[command(name = "address-controller", version = address_controller_runtime::metrics::VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the core controller and the aggregated API server.
    Run(Box<RunArgs>),
    /// Check the installation: CRDs, the views' APIService, the Leases of the core and the
    /// drivers, every class served by a live driver, the caller's permissions. Exit 1 when
    /// a check fails.
    Check(Box<check::CheckArgs>),
    /// Give LoadBalancer Services that show an address of a class and name no claim a
    /// claim of their own, without renumbering; a dry run unless --yes; --undo reverses it.
    Adopt(Box<adopt::AdoptArgs>),
    /// Who held an address, and when (the abuse desk's question): its holdings from its
    /// history, each with the Services it was on; with --at, the one holding at that
    /// instant. Exit 1 when nobody held it then.
    Holders(Box<history::HoldersArgs>),
    /// Address-seconds per namespace and class over a period — held (Bound) and attached
    /// (on a Service) — from the addresses' history: what to bill.
    Usage(Box<history::UsageArgs>),
    /// The history for an archive outside the cluster, where it outlives the addresses.
    #[command(subcommand)]
    History(HistoryCommand),
    /// After `helm uninstall`, remove the product for good: refuse while a component
    /// still runs, remove this project's finalizers from every claim and address (so tenant
    /// namespaces and the CRDs can be deleted), delete the views' APIService, and with
    /// --delete-crds the CRDs (the ledger). Prints what it would do unless --yes.
    Teardown(Box<teardown::TeardownArgs>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion { shell: clap_complete::Shell },
    /// Write the generated manifests (CRDs, ClusterRole) into the chart. `make manifests` runs this.
    #[command(hide = true)]
    Manifests {
        /// Directory the CRD YAML files are written to.
        #[arg(
            long,
            env = "ADDRESS_CONTROLLER_MANIFESTS_CRDS_DIR",
            default_value = "chart/address-controller/crds"
        )]
        crds_dir: PathBuf,
        /// File the ClusterRole is written to.
        #[arg(
            long,
            env = "ADDRESS_CONTROLLER_MANIFESTS_ROLE",
            default_value = "chart/address-controller/files/controller-role.yaml"
        )]
        role: PathBuf,
        /// Directory the OpenAPI documents of the views are written to.
        #[arg(
            long,
            env = "ADDRESS_CONTROLLER_MANIFESTS_OPENAPI_DIR",
            default_value = "openapi"
        )]
        openapi_dir: PathBuf,
    },
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    kube: ClientArgs,
    #[command(flatten)]
    apiserver: ApiServerArgs,
    #[command(flatten)]
    election: ElectionArgs,
    #[command(flatten)]
    probes: ProbeArgs,
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    liveness: LivenessArgs,
    /// Reconciles running at once, per controller.
    #[arg(long, env = "ADDRESS_CONTROLLER_CONCURRENCY", default_value_t = 16)]
    concurrency: u16,
    /// Create an IPAddressClaim for every LoadBalancer Service that names none (SPEC §7).
    #[arg(long, env = "ADDRESS_CONTROLLER_AUTO_CLAIMS", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    auto_claims: bool,
    #[command(flatten)]
    history: HistoryArgs,
}

/// The history's records (`IPAddressRecord`).
#[derive(Args)]
#[command(next_help_heading = "History records")]
struct HistoryArgs {
    /// How long a record is kept after its entry ended (a Go duration). The default, 9600h
    /// (400 days), answers an abuse report or a billing dispute about any day of the past
    /// year, with a month to spare for reports that come late.
    #[arg(long, env = "ADDRESS_CONTROLLER_HISTORY_RETENTION", default_value = "9600h", value_parser = parse_duration)]
    history_retention: std::time::Duration,
    /// How often the leader looks for records past the retention.
    #[arg(long, env = "ADDRESS_CONTROLLER_HISTORY_PRUNE_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    history_prune_interval: std::time::Duration,
    /// Writes a second, at most, that only move an address's history kept by an older version
    /// to records (an upgrade's backlog).
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_HISTORY_MOVE_RATE",
        default_value_t = 5.0
    )]
    history_move_rate: f64,
    /// Records a second, at most, the retention deletes.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_HISTORY_PRUNE_RATE",
        default_value_t = 50.0
    )]
    history_prune_rate: f64,
    /// At most this many records in the cluster: past it the namespace holding the most loses
    /// its oldest before their retention ends (`address_controller_history_records_total{action="capped"}`
    /// counts them). 50,000 records are ~45 MB of etcd and ~100 MB of each replica's views'
    /// cache (2 KB each): within the chart's 512 MiB limit and etcd's default 2 GiB quota.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_HISTORY_MAX_RECORDS",
        default_value_t = 50_000
    )]
    history_max_records: i64,
}

impl HistoryArgs {
    fn history(&self) -> address_controller_controller::context::History {
        use address_controller_runtime::records::Pacer;
        address_controller_controller::context::History {
            retention: self.history_retention,
            moves: Pacer::new(self.history_move_rate),
            prunes: Pacer::new(self.history_prune_rate),
            prune_interval: self.history_prune_interval,
            max_records: self.history_max_records,
        }
    }
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    address_controller_api::duration::parse(s).map_err(|e| e.to_string())
}

#[derive(Args)]
#[command(next_help_heading = "Components and the aggregated API server")]
struct ApiServerArgs {
    /// Serve the view.local.sdn.cozystack.io views (every replica serves them).
    #[arg(long = "apiserver", env = "ADDRESS_CONTROLLER_APISERVER", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enabled: bool,
    /// Run the controllers (only the elected leader acts).
    #[arg(long = "controller", env = "ADDRESS_CONTROLLER_CONTROLLER", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    controller: bool,
    /// HTTPS address of the aggregated API server.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_APISERVER_ADDRESS",
        default_value = "0.0.0.0:6443"
    )]
    apiserver_address: SocketAddr,
    /// HTTPS address of /metrics (TokenReview + SubjectAccessReview on the path); empty disables it.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METRICS_ADDRESS",
        default_value = "0.0.0.0:8443"
    )]
    metrics_address: OptionalAddress,
    /// Changes of the views kept for watches to resume from; a watch further behind lists
    /// again (410 Expired).
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_VIEW_HISTORY",
        default_value_t = 10_000
    )]
    view_history: usize,
    /// Most bytes of the views' kept changes (their objects serialized): an object of a
    /// view grows with what its namespace holds, so the count alone does not bound memory.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_VIEW_HISTORY_BYTES",
        default_value_t = 64 << 20
    )]
    view_history_bytes: usize,
    /// Testing only: serve this file as /openapi/v2 instead of the generated document.
    #[arg(long, hide = true)]
    testing_openapi_v2: Option<PathBuf>,
    #[command(flatten)]
    serving: SecureServingArgs,
}

/// Runs a one-shot command on a current-thread runtime: it exits 0 when the command
/// answers yes, 1 when it answers no, and on an error prints it as
/// `address-controller NAME: …` and exits with `code_of` it.
fn one_shot(
    name: &str,
    command: impl Future<Output = anyhow::Result<bool>>,
    code_of: fn(&anyhow::Error) -> i32,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match runtime.block_on(command) {
        Ok(true) => Ok(()),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("address-controller {name}: {e:#}");
            std::process::exit(code_of(&e))
        }
    }
}

/// A command that answers nothing but success: yes when it succeeds.
async fn yes(command: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<bool> {
    command.await.map(|()| true)
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Every holding (claim) and attachment span (Service) of every address that touches
    /// [--from, --to), one record per line (JSON Lines or CSV), to keep in a store the
    /// platform already runs: an address's history dies with the address.
    Export(Box<history::ExportArgs>),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Check(args) => one_shot("check", check::run(&args), |_| 1),
        Command::Adopt(args) => one_shot("adopt", adopt::run(&args), |_| 1),
        Command::Holders(args) => one_shot("holders", history::holders(&args), |_| 1),
        Command::Usage(args) => one_shot("usage", yes(history::usage(&args)), |_| 1),
        Command::History(HistoryCommand::Export(args)) => {
            one_shot("history export", yes(history::export(&args)), |_| 1)
        }
        Command::Teardown(args) => one_shot("teardown", yes(teardown::run(&args)), |e| {
            if e.is::<teardown::Refusal>() { 2 } else { 1 }
        }),
        Command::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "address-controller", &mut script);
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
                _ => Ok(()),
            }
        }
        Command::Manifests {
            crds_dir,
            role,
            openapi_dir,
        } => write_manifests(&crds_dir, &role, &openapi_dir),
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            address_controller_runtime::supervise::exit_when_stalled(
                runtime.handle(),
                "address-controller",
            )?;
            if let Err(e) = runtime.block_on(run(*args)) {
                // A critical task stopped (a server could not bind, the lease was lost, ...):
                // exit non-zero so the pod is restarted clean.
                eprintln!("address-controller: {e:#}");
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    args.log.init();
    let controller = args.apiserver.controller;
    let mut p = Process::start(
        &args.kube,
        &args.liveness,
        Acting::of(controller, &args.election),
    )
    .await?;
    // Entitlements (namespaces, quotas) are read by the binder and shown by the views.
    // The core reads Services for auto-claims and for the count of Services on each claim.
    let world = World::new(controller, p.health.clone())
        .with_entitlements()
        .with_records_for(args.apiserver.enabled);
    let world = if controller {
        world.with_driver_leases()
    } else {
        world
    };
    let metrics = Arc::new(Metrics::new(world.clone())?);
    address_controller_runtime::metrics::register(
        &metrics.registry,
        env!("CARGO_PKG_VERSION"),
        p.health.clone(),
        controller.then(|| p.leadership.clone()),
    )?;
    let ctx = Arc::new(Context::new(
        p.client.clone(),
        world.clone(),
        Gate::new(p.leadership.clone(), p.health.clone()),
        metrics.clone(),
        args.election.identity(),
        args.auto_claims,
        args.history.history(),
    ));
    if controller {
        // Handlers first: they must see the initial lists.
        run::register(&ctx);
        metrics.register_quota(ctx.quota.clone())?;
        address_controller_runtime::metrics::register_queues(
            &metrics.registry,
            ctx.queues.readers(),
        )?;
    }
    // The TLS endpoints (views, secure metrics) share the serving certificate and the
    // delegated authentication and authorization.
    let a = &args.apiserver;
    // One head budget for the process: its views, its /metrics and its probe port.
    let budget = a.serving.limits.head_budget();
    let metrics_address = a.metrics_address.0;
    let serving = if a.enabled || metrics_address.is_some() {
        Some(SecureServing::start(
            Serving {
                reviews: &p.reviews,
                args: &a.serving,
                servers: u64::from(a.enabled) + u64::from(metrics_address.is_some()),
                budget: budget.clone(),
                callers: Callers::AggregatorAndTokens,
            },
            &metrics.registry,
            &mut p.tasks,
        )?)
    } else {
        None
    };
    if let Some(serving) = serving.as_ref().filter(|_| a.enabled) {
        // Before the watches: the views' store keeps its indexes from the caches' changes.
        spawn_views(a, serving, &world, &metrics, &mut p)?;
    }
    world.watch(&p.client, args.liveness.watch_config(), &mut p.tasks);
    if let (Some(serving), Some(address)) = (serving.as_ref(), metrics_address) {
        let m = metrics.clone();
        serving.spawn_metrics(
            address,
            Arc::new(move || m.render()),
            &p.shutdown,
            &mut p.tasks,
        );
    }
    if controller {
        let settings = run::Settings {
            concurrency: args.concurrency,
        };
        run::controllers(&ctx, &settings).spawn(&mut p.tasks, &p.shutdown);
    }
    let lease = Lease {
        election: &args.election,
        default_name: "address-controller",
        component: "controller",
        annotations: Default::default(),
    };
    address_controller_serving::probes::spawn(
        &args.probes,
        p.health.clone(),
        budget,
        &p.shutdown,
        &mut p.tasks,
    );
    p.run(lease).await
}

/// The aggregated API server's views, served with SERVING from WORLD's caches.
fn spawn_views(
    a: &ApiServerArgs,
    serving: &SecureServing,
    world: &World,
    metrics: &Metrics,
    p: &mut Process,
) -> anyhow::Result<()> {
    let openapi_v2 = match &a.testing_openapi_v2 {
        Some(path) => Some(serde_json::from_slice(
            &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        )?),
        None => None,
    };
    let views = Views {
        address: a.apiserver_address,
        history: address_controller_apiserver::store::HistoryBound {
            changes: a.view_history,
            bytes: a.view_history_bytes,
        },
        openapi_v2,
    };
    address_controller_apiserver::spawn(
        views,
        world,
        serving,
        &metrics.registry,
        &p.shutdown,
        &mut p.tasks,
    )
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
    // The chart's README: its values table from values.yaml (next to the CRDs' chart).
    if let Some(chart) = crds_dir.parent() {
        let values = std::fs::read_to_string(chart.join("values.yaml"))
            .with_context(|| format!("reading {}", chart.join("values.yaml").display()))?;
        let path = chart.join("README.md");
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, chart_docs::readme(&current, &values)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_flag_of_every_subcommand_has_an_env() {
        let cmd = <super::Cli as clap::CommandFactory>::command();
        let missing = address_controller_runtime::flags::without_env(&cmd);
        assert!(missing.is_empty(), "flags without env: {missing:?}");
    }
}
