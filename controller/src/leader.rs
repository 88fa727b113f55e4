//! Leader election on a `coordination.k8s.io/v1` Lease. Only the leader's reconcilers act;
//! every replica keeps its caches warm (the API server views are served by all of them).
//!
//! Expiry is judged by the local clock from the moment this replica last saw the lease
//! record change, not by comparing timestamps written by another machine, so clock skew
//! between replicas cannot cause two leaders.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

/// Whether this replica leads, observable by the reconcilers.
pub struct Leadership {
    tx: watch::Sender<bool>,
}

impl Leadership {
    /// A replica that is not elected yet.
    pub fn follower() -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(false),
        })
    }

    /// A replica that leads from the start (leader election disabled).
    pub fn always() -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(true),
        })
    }

    pub fn is_leader(&self) -> bool {
        *self.tx.borrow()
    }

    fn set(&self, leader: bool) {
        self.tx
            .send_if_modified(|v| std::mem::replace(v, leader) != leader);
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
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the lease {0}: could not renew it within the renew deadline")]
    Lost(String),
}

/// Runs the election until leadership is lost (an error: the process should exit and be
/// restarted, as client-go's elector does) or `shutdown` resolves (the lease is released
/// so a standby takes over at once).
pub async fn run(
    client: Client,
    cfg: LeaseConfig,
    leadership: Arc<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), LeaderError> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut observed: Option<(LeaseSpec, Instant)> = None;
    let mut last_renew: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        match try_acquire_or_renew(&api, &cfg, &mut observed).await {
            Ok(true) => {
                if !leadership.is_leader() {
                    tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became the leader");
                }
                last_renew = Some(Instant::now());
                leadership.set(true);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(lease = %cfg.name, error = %e, "lease update failed"),
        }
        if leadership.is_leader() && last_renew.is_some_and(|t| t.elapsed() > cfg.renew_deadline) {
            leadership.set(false);
            return Err(LeaderError::Lost(cfg.name.clone()));
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.retry_period) => {}
            _ = &mut shutdown => {
                if leadership.is_leader() {
                    leadership.set(false);
                    release(&api, &cfg).await;
                }
                return Ok(());
            }
        }
    }
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

/// A client from an explicit kubeconfig, else the in-cluster config or `$KUBECONFIG`.
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<Client, Box<dyn std::error::Error + Send + Sync>> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}
