//! Leader election on a `coordination.k8s.io/v1` Lease. Only the leader acts; every replica
//! keeps its caches warm.
//!
//! Expiry is judged by the local clock from the moment this replica last saw the lease
//! record change, never by comparing timestamps another machine wrote, so clock skew cannot
//! make two leaders. Every attempt is bounded in time, and the leader steps down the moment
//! its last successful renewal is older than the renew deadline — even while a renewal
//! request hangs — so it stops acting before any other replica may consider the lease
//! expired (lease duration > renew deadline).

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use futures::Stream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

/// The election flags every binary shares.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Leader election")]
pub struct ElectionArgs {
    /// Elect a leader among replicas on a coordination.k8s.io Lease; only the leader acts.
    /// A bare `--leader-elect` means true, as for the Kubernetes components.
    #[arg(long, env = "ADDRESS_CONTROLLER_LEADER_ELECT", default_value_t = true,
          action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub leader_elect: bool,
    /// Name of the Lease [default: the binary's name].
    #[arg(
        long = "leader-elect-resource-name",
        alias = "lease-name",
        env = "ADDRESS_CONTROLLER_LEADER_ELECT_RESOURCE_NAME"
    )]
    pub lease_name: Option<String>,
    /// Namespace of the Lease (the chart sets the pod's own).
    #[arg(
        long = "leader-elect-resource-namespace",
        alias = "lease-namespace",
        env = "ADDRESS_CONTROLLER_POD_NAMESPACE",
        default_value = "default"
    )]
    pub lease_namespace: String,
    /// Identity of this replica in the Lease [default: host name and process id; the
    /// chart sets the pod's name].
    #[arg(long, env = "ADDRESS_CONTROLLER_POD_NAME")]
    pub identity: Option<String>,
    /// How long a lease stays valid without renewal.
    #[arg(long = "leader-elect-lease-duration", alias = "lease-duration",
          env = "ADDRESS_CONTROLLER_LEADER_ELECT_LEASE_DURATION", default_value = "15s",
          value_parser = address_controller_api::duration::parse)]
    pub lease_duration: Duration,
    /// How long the leader tries to renew before it steps down (then the process exits).
    #[arg(long = "leader-elect-renew-deadline", alias = "renew-deadline",
          env = "ADDRESS_CONTROLLER_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s",
          value_parser = address_controller_api::duration::parse)]
    pub renew_deadline: Duration,
    /// Pause between election attempts.
    #[arg(long = "leader-elect-retry-period", alias = "retry-period",
          env = "ADDRESS_CONTROLLER_LEADER_ELECT_RETRY_PERIOD", default_value = "2s",
          value_parser = address_controller_api::duration::parse)]
    pub retry_period: Duration,
}

impl ElectionArgs {
    /// This replica's identity.
    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(default_identity)
    }

    /// The Lease settings, with `default_name` when `--leader-elect-resource-name` is not given.
    pub fn config(&self, default_name: &str) -> Result<LeaseConfig, ElectionError> {
        if self.renew_deadline >= self.lease_duration {
            return Err(ElectionError::Settings(format!(
                "--leader-elect-renew-deadline ({:?}) must be shorter than --leader-elect-lease-duration ({:?})",
                self.renew_deadline, self.lease_duration
            )));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ElectionError::Settings(format!(
                "--leader-elect-retry-period ({:?}) must be shorter than --leader-elect-renew-deadline ({:?})",
                self.retry_period, self.renew_deadline
            )));
        }
        Ok(LeaseConfig {
            namespace: self.lease_namespace.clone(),
            name: self
                .lease_name
                .clone()
                .unwrap_or_else(|| default_name.to_string()),
            identity: self.identity(),
            annotations: std::collections::BTreeMap::new(),
            labels: std::collections::BTreeMap::new(),
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        })
    }
}

/// Whether this replica leads, observable by workers and metrics.
pub struct Leadership {
    tx: watch::Sender<bool>,
    /// How many times this replica became the leader.
    terms: std::sync::atomic::AtomicU64,
    /// `namespace/name` of the Lease once the election runs (the leader gauge's label).
    lease: std::sync::OnceLock<String>,
}

impl Leadership {
    /// A replica that is not elected yet.
    pub fn follower() -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(false),
            terms: std::sync::atomic::AtomicU64::new(0),
            lease: std::sync::OnceLock::new(),
        })
    }

    /// A replica that leads from the start (leader election disabled).
    pub fn always() -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(true),
            terms: std::sync::atomic::AtomicU64::new(1),
            lease: std::sync::OnceLock::new(),
        })
    }

    pub fn is_leader(&self) -> bool {
        *self.tx.borrow()
    }

    /// The Lease elected on (`namespace/name`); empty without an election.
    pub fn lease(&self) -> &str {
        self.lease.get().map_or("", String::as_str)
    }

    /// How many times this replica became the leader: the current term while it leads.
    pub fn term(&self) -> u64 {
        self.terms.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn set(&self, leader: bool) {
        self.tx.send_if_modified(|v| {
            let changed = std::mem::replace(v, leader) != leader;
            if changed && leader {
                self.terms.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            changed
        });
    }

    /// Resolves at the next change of leadership.
    pub async fn changed(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.changed().await;
    }

    /// A receiver of leadership changes.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Yields once each time this replica becomes the leader (also at once, if it already
    /// leads): the controllers re-examine everything then.
    pub fn acquired(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.tx.subscribe();
        futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if first && *rx.borrow_and_update() {
                return Some(((), (rx, false)));
            }
            loop {
                rx.changed().await.ok()?;
                if *rx.borrow_and_update() {
                    return Some(((), (rx, false)));
                }
            }
        })
    }
}

/// Settings of the election.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// Written on the Lease with every acquisition and renewal: what the holder is (the
    /// core, or a driver and its provisioner) for `address-controller check`.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Written the same way: the labels others select the Lease by (the core watches the
    /// drivers' Leases).
    pub labels: std::collections::BTreeMap<String, String>,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error("lost the lease {0}: could not renew it within the renew deadline")]
    Lost(String),
    #[error("leader election settings: {0}")]
    Settings(String),
}

/// Runs the election until leadership is lost (an error: the process should exit and be
/// restarted, as client-go's elector does) or `shutdown` resolves (the lease is released
/// so a standby takes over at once).
pub async fn run(
    client: Client,
    cfg: LeaseConfig,
    leadership: Arc<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ElectionError> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let _ = leadership
        .lease
        .set(format!("{}/{}", cfg.namespace, cfg.name));
    let mut observed: Option<(LeaseSpec, Instant)> = None;
    let mut last_renew: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        // An attempt may not outlive the renew deadline of a leader, nor a retry period
        // by much for a follower.
        let budget = match (leadership.is_leader(), last_renew) {
            (true, Some(t)) => cfg.renew_deadline.saturating_sub(t.elapsed()),
            _ => cfg.renew_deadline,
        };
        let attempt = tokio::time::timeout(budget, try_acquire_or_renew(&api, &cfg, &mut observed));
        let outcome = tokio::select! {
            r = attempt => Some(r),
            () = &mut shutdown => None,
        };
        match outcome {
            None => return step_down_on_shutdown(&api, &cfg, &leadership).await,
            Some(Ok(Ok(true))) => {
                if !leadership.is_leader() {
                    tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became the leader");
                }
                last_renew = Some(Instant::now());
                leadership.set(true);
            }
            Some(Ok(Ok(false))) => {
                if leadership.is_leader() {
                    // Someone else holds the lease now (it expired from their view).
                    leadership.set(false);
                    return Err(ElectionError::Lost(cfg.name.clone()));
                }
            }
            Some(Ok(Err(e))) => {
                tracing::warn!(lease = %cfg.name, error = %e, "lease update failed")
            }
            Some(Err(_)) => tracing::warn!(lease = %cfg.name, "lease update timed out"),
        }
        if leadership.is_leader() && last_renew.is_some_and(|t| t.elapsed() >= cfg.renew_deadline) {
            leadership.set(false);
            return Err(ElectionError::Lost(cfg.name.clone()));
        }
        // Sleep until the next attempt — for a leader, never past its renew deadline.
        let mut pause = cfg.retry_period;
        if let (true, Some(t)) = (leadership.is_leader(), last_renew) {
            pause = pause.min(cfg.renew_deadline.saturating_sub(t.elapsed()));
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = &mut shutdown => return step_down_on_shutdown(&api, &cfg, &leadership).await,
        }
    }
}

async fn step_down_on_shutdown(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    leadership: &Leadership,
) -> Result<(), ElectionError> {
    if leadership.is_leader() {
        leadership.set(false);
        if tokio::time::timeout(
            cfg.retry_period.max(Duration::from_secs(1)),
            release(api, cfg),
        )
        .await
        .is_err()
        {
            tracing::warn!(lease = %cfg.name, "releasing the lease timed out");
        }
    }
    Ok(())
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// One step: create, renew or take over the lease. Ok(true) when this replica holds it.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Option<(LeaseSpec, Instant)>,
) -> Result<bool, kube::Error> {
    let duration_secs = i32::try_from(cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let mine = |transitions: i32, acquired: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(duration_secs),
        acquire_time: acquired.or_else(|| Some(now())),
        renew_time: Some(now()),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                annotations: Some(cfg.annotations.clone()).filter(|a| !a.is_empty()),
                labels: Some(cfg.labels.clone()).filter(|a| !a.is_empty()),
                ..Default::default()
            },
            spec: Some(mine(0, None)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    if observed.as_ref().map(|(s, _)| s) != Some(&spec) {
        *observed = Some((spec.clone(), Instant::now()));
    }
    let held_by_me = holder.as_deref() == Some(cfg.identity.as_str());
    let valid_for =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
    let expired = holder.is_none()
        || observed
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() > valid_for);
    if !held_by_me && !expired {
        return Ok(false);
    }
    let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!held_by_me);
    let acquired = held_by_me.then(|| spec.acquire_time.clone()).flatten();
    lease.spec = Some(mine(transitions, acquired));
    if !cfg.annotations.is_empty() {
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .extend(cfg.annotations.clone());
    }
    if !cfg.labels.is_empty() {
        lease
            .metadata
            .labels
            .get_or_insert_default()
            .extend(cfg.labels.clone());
    }
    // `replace` carries the resourceVersion read above: two replicas racing for an expired
    // lease cannot both win.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the lease up on a clean shutdown.
async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(lease = %cfg.name, "released the lease"),
        Err(e) => tracing::warn!(lease = %cfg.name, error = %e, "could not release the lease"),
    }
}

/// This replica's identity when none is configured: host name and process id.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    format!("{host}-{}", std::process::id())
}

/// Allowed clock difference between the holder of a Lease and its reader, in seconds.
pub const SKEW_SECONDS: i64 = 5;

/// Whether a Lease, read by another process, is held and was renewed within its duration
/// (plus [`SKEW_SECONDS`]): `Ok` with the holder, `Err` with why not. The one rule for "is
/// this component running", used by `address-controller check` and the core's
/// `DriverAvailable` class condition.
pub fn lease_liveness(
    l: &k8s_openapi::api::coordination::v1::Lease,
    now: Timestamp,
) -> Result<String, String> {
    let spec = l.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Err("not held (no replica running, or all stepped down)".into());
    };
    let Some(renewed) = spec.renew_time.map(|t| t.0) else {
        return Err(format!("held by {holder}, never renewed"));
    };
    let ago = now.as_second() - renewed.as_second();
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    if ago > duration + SKEW_SECONDS {
        Err(format!(
            "held by {holder} but not renewed for {ago}s (lease duration {duration}s): the holder is gone or hung"
        ))
    } else {
        Ok(format!("held by {holder}, renewed {}s ago", ago.max(0)))
    }
}

/// When a live Lease stops being live unless renewed again (its renewal + duration + skew).
pub fn lease_expiry(l: &k8s_openapi::api::coordination::v1::Lease) -> Option<Timestamp> {
    let spec = l.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    renewed
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            duration + SKEW_SECONDS,
        ))
        .ok()
}

/// Which of `leases` are a Go pair's ([`GO_PAIR_LEASES`](address_controller_api::names::GO_PAIR_LEASES))
/// held and renewed now: `(namespace/name, who, how it is held)`. The one rule behind the
/// binaries' refusal to start and `address-controller check`'s row.
pub fn go_pair_leases_held<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    now: Timestamp,
) -> Vec<(String, &'static str, String)> {
    use kube::ResourceExt;
    leases
        .into_iter()
        .filter_map(|l| {
            let name = l.name_any();
            let (_, who) = address_controller_api::names::GO_PAIR_LEASES
                .iter()
                .find(|(n, _)| *n == name)?;
            let held = lease_liveness(l, now).ok()?;
            Some((
                format!("{}/{name}", l.namespace().unwrap_or_default()),
                *who,
                held,
            ))
        })
        .collect()
}

/// Refuses to go on while the Go pair runs (a Lease of it held, in any namespace): what
/// this process would write, the Go pair writes too. A cluster that cannot be asked (a
/// connection error) is not taken for a yes — the process starts and the Lease of its own
/// is the next thing it needs anyway; being forbidden to ask is an error (the chart grants
/// it).
pub async fn refuse_while_go_pair_leads(client: &Client) -> Result<(), GoPair> {
    let api: Api<Lease> = Api::all(client.clone());
    let mut found = Vec::new();
    for (name, _) in address_controller_api::names::GO_PAIR_LEASES {
        let by_name = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
        match api.list(&by_name).await {
            Ok(l) => found.extend(l.items),
            Err(kube::Error::Api(s)) => {
                return Err(GoPair::CannotTell {
                    lease: name,
                    message: s.message,
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, lease = name, "cannot tell whether the Go pair runs; starting");
                return Ok(());
            }
        }
    }
    let held = go_pair_leases_held(&found, Timestamp::now());
    if let Some((lease, who, how)) = held.into_iter().next() {
        return Err(GoPair::Runs { lease, who, how });
    }
    Ok(())
}

/// Why [`refuse_while_go_pair_leads`] refused.
#[derive(Debug, thiserror::Error)]
pub enum GoPair {
    #[error(
        "cannot tell whether the Go pair runs (listing Leases named {lease}: {message}); the ClusterRole must grant list on coordination.k8s.io leases"
    )]
    CannotTell {
        lease: &'static str,
        message: String,
    },
    #[error(
        "{who} runs (Lease {lease} {how}): stop it before this starts — both would write the same objects (docs/operations.md, \"Migrating to address-controller\")"
    )]
    Runs {
        lease: String,
        who: &'static str,
        how: String,
    },
}

/// The driver Lease (annotated with `provisioner`) that serves it now, if any.
pub fn live_driver_lease<'a>(
    leases: impl IntoIterator<Item = &'a k8s_openapi::api::coordination::v1::Lease>,
    provisioner: &str,
    now: Timestamp,
) -> Option<&'a k8s_openapi::api::coordination::v1::Lease> {
    use kube::ResourceExt;
    leases.into_iter().find(|l| {
        l.annotations()
            .get(address_controller_api::names::LEASE_PROVISIONER_ANNOTATION)
            .is_some_and(|p| p == provisioner)
            && lease_liveness(l, now).is_ok()
    })
}
