//! Build an IPAddress driver (SPEC §8) the way CSI drivers are built for storage: implement
//! the small [`Driver`] trait — parse a class's parameters, report its capacity, allocate an
//! address, optionally tear one down — and call [`main`]. The runner does the protocol:
//! watches, leader election, which claims to serve, creating pre-bound addresses,
//! idempotency across restarts, class capacity and conditions, events, the teardown
//! finalizer, probes. It never touches what the core owns. `docs/drivers.md` has the
//! contract; `tests/` has a conformance suite any driver can run.

pub(crate) mod decide;
pub mod driver;
pub mod holds;
mod inventory;
pub mod metrics;
pub mod objects;
pub(crate) mod runner;
/// Address ranges (CIDRs and `a-b` ranges): the api crate's, where `address-controller adopt`
/// reads them too.
pub use address_controller_api::ranges;
mod services;
mod wiring;

use std::sync::Arc;
use std::time::Duration;

use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::health::LivenessArgs;
use address_controller_runtime::leader::ElectionArgs;
use address_controller_runtime::logging::LogArgs;
use address_controller_runtime::process::{Acting, Lease, Process};
use address_controller_runtime::rbac::{LEADER_ELECTION_RULES, RUNTIME_RULES, Rule, render};
use address_controller_runtime::workers::Gate;
use address_controller_runtime::world::World;
use address_controller_serving::probes::ProbeArgs;
use address_controller_serving::secure::{Callers, OptionalAddress, SecureServing, Serving};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// The rule every binary's flags follow (each has an `env`), for a driver's own test.
pub use address_controller_runtime::flags;
/// RBAC rule type, for [`Info::extra_rules`].
pub use address_controller_runtime::rbac as runtime_rbac;
pub use decide::service::render_marker;
pub use driver::{
    AllocateError, Allocation, Capacity, ClassesInUse, Driver, Presence, Request, ingress,
    object_name,
};
pub use runner::events;

/// Who the driver is.
pub struct Info {
    /// Binary name; also the default Lease name and the events' reporting controller.
    pub name: &'static str,
    /// Name of its ClusterRole in a chart.
    pub cluster_role: &'static str,
    /// Where its rules are declared (named in the generated file's header).
    pub source: &'static str,
    /// Rules it needs besides the kit's own (a backend's API, say).
    pub extra_rules: &'static [Rule],
    /// Rules it needs in its own namespace only, besides its Lease (the MetalLB driver's
    /// holds): granted by a Role there, never cluster-wide.
    pub own_namespace_rules: &'static [Rule],
}

/// The flags of every driver built on the kit.
#[derive(Args, Clone, Debug)]
pub struct DriverArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub election: ElectionArgs,
    #[command(flatten)]
    pub probes: ProbeArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub liveness: LivenessArgs,
    /// Passes running at once.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_DRIVER_CONCURRENCY",
        default_value_t = 4
    )]
    pub concurrency: u16,
    /// Print the ClusterRole this driver needs (YAML) and exit.
    #[arg(long)]
    pub print_cluster_role: bool,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Writes a second, at most, that move an older version's backlog of Service spans off
    /// an address to IPAddressRecords (8 spans a write; a ledger write moves them anyway).
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_DRIVER_HISTORY_MOVE_RATE",
        default_value_t = 5.0
    )]
    pub history_move_rate: f64,
    /// Testing only: wait this long between deciding to create an address and creating it.
    #[arg(long, hide = true, value_parser = address_controller_api::duration::parse)]
    pub testing_create_delay: Option<Duration>,
}

/// The driver's HTTPS `/metrics` (off unless an address is given).
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// Serve /metrics over HTTPS here (e.g. 0.0.0.0:8443) to principals allowed to `get`
    /// the non-resource path /metrics (TokenReview + SubjectAccessReview); empty: off.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_DRIVER_METRICS_ADDRESS",
        default_value = ""
    )]
    pub metrics_address: OptionalAddress,
    #[command(flatten)]
    pub serving: address_controller_serving::secure::SecureServingArgs,
}

#[derive(Parser)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli<A: Args, C: Subcommand> {
    /// A one-shot subcommand of the driver's own; without one, the driver runs.
    #[command(subcommand)]
    command: Option<C>,
    #[command(flatten)]
    args: DriverArgs,
    #[command(flatten)]
    own: A,
}

/// A driver without flags of its own.
#[derive(Args, Clone, Debug)]
pub struct NoArgs {}

/// A driver without one-shot subcommands.
#[derive(Subcommand, Clone, Debug)]
pub enum NoCommands {}

/// The command line of a driver with flags A and subcommands C: the kit's flags, the
/// driver's, its subcommands; its own name and the project's version line in --help and
/// --version. (A driver's test walks it: every flag has an `env`,
/// [`address_controller_runtime::flags::without_env`].)
pub fn command_line<A: Args, C: Subcommand>(info: &Info) -> clap::Command {
    Cli::<A, C>::command()
        .name(info.name)
        .bin_name(info.name)
        .about(format!(
            "{}: an IPAddress driver built on address-controller's driver kit (docs/drivers.md)",
            info.name
        ))
        .version(address_controller_runtime::metrics::VERSION)
}

/// The kit's own rules: what the runner reads and writes.
pub const KIT_RULES: &[Rule] = &[
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclaims"],
        verbs: &["get", "list", "watch"],
        why: "claims stamped with this driver's provisioner",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddresses"],
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "what is taken; creating an address is the allocation (SPEC §8); removing the driver's finalizer",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclasses"],
        verbs: &["get", "list", "watch"],
        why: "the classes' parameters",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressrecords"],
        verbs: &["create"],
        why: "the history's records of the Service spans a ledger write moves off an address",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclasses/status"],
        verbs: &["patch"],
        why: "class capacity and conditions",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddresses/status"],
        verbs: &["patch"],
        why: "association (associatedTo), Conflict and Lost of the driver's addresses (SPEC §8)",
    },
    Rule {
        group: "",
        resources: &["services"],
        verbs: &["get", "list", "watch", "patch"],
        why: "association: the Services naming claims; the kit's record of its pins (an annotation)",
    },
    Rule {
        group: "discovery.k8s.io",
        resources: &["endpointslices"],
        verbs: &["list", "watch"],
        why: "the ready pods of a Service cozy-proxy serves (its label selects the slices): cozy-proxy forwards the address to one",
    },
    Rule {
        group: "kubevirt.io",
        resources: &["virtualmachineinstances"],
        verbs: &["list", "watch"],
        why: "which pods run one VM (status.activePods): a VM moving between nodes is one backend of its Service, not two (read only where KubeVirt is installed)",
    },
    Rule {
        group: "",
        resources: &["services/status"],
        verbs: &["patch"],
        why: "the AddressAttached condition on a Service naming a claim (the range driver also writes status.loadBalancer)",
    },
    Rule {
        group: "authentication.k8s.io",
        resources: &["tokenreviews"],
        verbs: &["create"],
        why: "HTTPS /metrics: the scraper's bearer token",
    },
    Rule {
        group: "authorization.k8s.io",
        resources: &["subjectaccessreviews"],
        verbs: &["create"],
        why: "HTTPS /metrics: whether the scraper may get /metrics",
    },
];

/// Whether the ClusterRole committed at `path` is the driver's current one — for a
/// driver's own drift test (the file a chart ships; `--print-cluster-role` writes it).
pub fn cluster_role_file_is_current(info: &Info, path: &std::path::Path) -> Result<(), String> {
    let got = std::fs::read_to_string(path).unwrap_or_default();
    match cluster_role_yaml(info) {
        Ok(want) if want == got => Ok(()),
        Ok(_) => Err(format!("{} is stale; run `make manifests`", path.display())),
        Err(e) => Err(format!("rendering the ClusterRole: {e}")),
    }
}

/// The driver's ClusterRole and the Role of its own namespace as YAML
/// (`--print-cluster-role`).
pub fn cluster_role_yaml(info: &Info) -> Result<String, serde_yaml::Error> {
    let cluster: Vec<&Rule> = KIT_RULES
        .iter()
        .chain(RUNTIME_RULES)
        .chain(info.extra_rules)
        .collect();
    let own: Vec<&Rule> = LEADER_ELECTION_RULES
        .iter()
        .chain(info.own_namespace_rules)
        .collect();
    render(info.cluster_role, info.source, &cluster, &own)
}

/// The whole `main` of a driver: flags, logging, runtime, [`run`]. Exits non-zero when a
/// critical task stops.
pub fn main<D: Driver>(driver: D, info: Info) -> anyhow::Result<()> {
    main_with(info, |_: &NoArgs| driver)
}

/// [`main`] for a driver with flags of its own (`A`, flattened next to the kit's): the
/// driver is made from them.
pub fn main_with<A: Args, D: Driver>(info: Info, make: impl FnOnce(&A) -> D) -> anyhow::Result<()> {
    main_with_commands(info, make, |c: NoCommands| match c {}).map(|_| ())
}

/// [`main_with`] for a driver with one-shot subcommands of its own (C, a clap `Subcommand`):
/// `driver <command> …` runs `command` instead of the driver, and its exit code is the
/// process's; without a subcommand the driver runs as [`main_with`] does.
pub fn main_with_commands<A: Args, C: Subcommand, D: Driver>(
    info: Info,
    make: impl FnOnce(&A) -> D,
    command: impl FnOnce(C) -> std::process::ExitCode,
) -> anyhow::Result<std::process::ExitCode> {
    let matches = command_line::<A, C>(&info).get_matches();
    let cli = Cli::<A, C>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(c) = cli.command {
        return Ok(command(c));
    }
    let args = cli.args;
    let driver = make(&cli.own);
    if args.print_cluster_role {
        print!("{}", cluster_role_yaml(&info)?);
        return Ok(std::process::ExitCode::SUCCESS);
    }
    args.log.init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    address_controller_runtime::supervise::exit_when_stalled(runtime.handle(), info.name)?;
    if let Err(e) = runtime.block_on(run(driver, &info, args)) {
        eprintln!("{}: {e:#}", info.name);
        std::process::exit(1);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Runs the driver until SIGTERM (Ok) or until a critical task stops (Err).
pub async fn run<D: Driver>(driver: D, info: &Info, args: DriverArgs) -> anyhow::Result<()> {
    let provisioner = driver.provisioner().to_string();
    let mut p = Process::start(
        &args.client,
        &args.liveness,
        Acting::of(true, &args.election),
    )
    .await?;
    let (client, health, leadership) = (p.client.clone(), p.health.clone(), p.leadership.clone());
    // Services: association (SPEC §8) is part of every driver.
    let world = World::new(true, health.clone()).with_proxied_endpoints();
    let gate = Gate::new(leadership.clone(), health.clone());
    let mut ctx = runner::Ctx::new(
        driver,
        client.clone(),
        world.clone(),
        gate.clone(),
        info.name,
        args.election.identity(),
    );
    ctx.create_delay = args.testing_create_delay;
    ctx.moves = address_controller_runtime::records::Pacer::new(args.history_move_rate);
    let ctx = Arc::new(ctx);
    wiring::register(&ctx);
    let metrics = metrics::KitMetrics::new(
        info.name,
        health.clone(),
        leadership.clone(),
        [
            ("claims", ctx.queues.claims.clone()),
            ("classes", ctx.queues.classes.clone()),
            ("addresses", ctx.queues.addresses.clone()),
            ("services", ctx.queues.services.clone()),
        ]
        .into_iter()
        .map(|(n, q)| {
            let read: address_controller_runtime::metrics::QueueReader =
                Arc::new(move || q.stats());
            (n, read)
        })
        .collect(),
    )?;
    {
        let (c, m) = (ctx.clone(), metrics.clone());
        ctx.world.addresses.on_change(move |ch| {
            let old = ch.old.as_deref().filter(|a| c.owns(a));
            let new = ch.new.as_deref().filter(|a| c.owns(a));
            m.address_changed(old, new);
        });
    }
    // One head budget for the process: its /metrics and its probe port.
    let budget = args.metrics.serving.limits.head_budget();
    if let OptionalAddress(Some(address)) = args.metrics.metrics_address {
        let serving = SecureServing::start(
            Serving {
                reviews: &p.reviews,
                args: &args.metrics.serving,
                servers: 1,
                budget: budget.clone(),
                callers: Callers::Tokens,
            },
            &metrics.registry,
            &mut p.tasks,
        )?;
        let m = metrics.clone();
        serving.spawn_metrics(
            address,
            Arc::new(move || m.render()),
            &p.shutdown,
            &mut p.tasks,
        );
    }
    world.watch(&client, args.liveness.watch_config(), &mut p.tasks);
    wiring::controllers(&ctx, usize::from(args.concurrency), metrics.observe())
        .spawn(&mut p.tasks, &p.shutdown);
    let lease = Lease {
        election: &args.election,
        default_name: info.name,
        component: "driver",
        annotations: [(
            address_controller_api::names::LEASE_PROVISIONER_ANNOTATION.to_string(),
            provisioner,
        )]
        .into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_of_the_kit_has_an_env() {
        let info = Info {
            name: "a-driver",
            cluster_role: "a-driver",
            source: "here",
            extra_rules: &[],
            own_namespace_rules: &[],
        };
        let missing = address_controller_runtime::flags::without_env(&command_line::<
            NoArgs,
            NoCommands,
        >(&info));
        assert!(missing.is_empty(), "flags without env: {missing:?}");
    }
}
