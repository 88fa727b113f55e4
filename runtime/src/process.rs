//! The frame every binary of the project runs in (kubert's `Runtime` plays this part for
//! linkerd): the client, the shutdown signal, the supervised tasks, health and leadership
//! at the start; the Lease, the signal handler and supervision at the end.
//! The core and a driver built on the kit differ only in what they put in between.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use address_controller_api::names::{LEASE_COMPONENT_ANNOTATION, LEASE_COMPONENT_LABEL};
use kube::Client;

use crate::client::ClientArgs;
use crate::health::{Health, LivenessArgs};
use crate::leader::{self, ElectionArgs, Leadership, LeaseConfig};
use crate::supervise::{Shutdown, Tasks, signal};

/// How long tasks get to finish after a signal.
const GRACE: Duration = Duration::from_secs(10);

/// Who acts: nobody in this process, this process always, or whoever holds the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acting {
    Never,
    Always,
    Elected,
}

impl Acting {
    /// An acting process elects a leader when `--leader-elect` says so.
    pub fn of(acts: bool, election: &ElectionArgs) -> Acting {
        match (acts, election.leader_elect) {
            (false, _) => Acting::Never,
            (true, false) => Acting::Always,
            (true, true) => Acting::Elected,
        }
    }
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime does at start (a
/// container gets 1024 soft under containerd 2.x: one client holding that many idle
/// connections would otherwise exhaust the process). What is in force after is
/// [`open_files_limit`].
pub fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(
                from = soft,
                to = hard,
                "open-file limit raised to the hard limit"
            ),
            Err(e) => tracing::warn!(soft, hard, error = %e, "raising the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "reading the open-file limit"),
    }
}

/// The soft limit on open files now in force (`u64::MAX` when unknown).
pub fn open_files_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(u64::MAX, |(soft, _)| soft)
}

/// The memory limit of the process's container, from its cgroup (v2 `memory.max`, else v1
/// `memory.limit_in_bytes`); `None` when there is none (`max`, or v1's page-rounded
/// `i64::MAX`) or it cannot be read.
pub fn memory_limit() -> Option<u64> {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/memory.max");
    let v1 = || std::fs::read_to_string("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    parse_memory_limit(&v2.or_else(|_| v1()).ok()?)
}

/// A cgroup memory limit as its file spells it.
fn parse_memory_limit(text: &str) -> Option<u64> {
    // Anything from 2^60 up is "no limit" (v1 writes i64::MAX rounded down to a page).
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|b| *b > 0 && *b < 1 << 60)
}

/// A running binary's shared parts.
pub struct Process {
    /// The controllers' client: rate limited (--kube-api-qps).
    pub client: Client,
    /// The client of the delegated-auth reviews, without the controllers' rate limit: the
    /// secure serving's review gate bounds them instead, refusing rather than queueing.
    pub reviews: Client,
    /// The Lease's own client: no request of a stranger and no burst of the controllers
    /// delays a renewal.
    lease_client: Client,
    pub shutdown: Shutdown,
    pub tasks: Tasks,
    pub health: Arc<Health>,
    pub leadership: Arc<Leadership>,
    acting: Acting,
}

impl Process {
    /// Connects to kube-apiserver and sets up shutdown, supervision, health and
    /// leadership (a follower until elected, when it elects; never leading when it does
    /// not act).
    pub async fn start(
        client: &ClientArgs,
        liveness: &LivenessArgs,
        acting: Acting,
    ) -> anyhow::Result<Process> {
        raise_open_files_limit();
        let (reviews, lease_client) = (
            client.unlimited_client().await?,
            client.unlimited_client().await?,
        );
        let client = client.client().await?;
        if acting != Acting::Never {
            leader::refuse_while_go_pair_leads(&lease_client).await?;
        }
        let shutdown = Shutdown::default();
        let tasks = Tasks::new(shutdown.clone());
        let leadership = match acting {
            Acting::Always => Leadership::always(),
            Acting::Never | Acting::Elected => Leadership::follower(),
        };
        Ok(Process {
            client,
            reviews,
            lease_client,
            shutdown,
            tasks,
            health: Health::new(liveness.bounds()),
            leadership,
            acting,
        })
    }

    /// Takes part in the election of `lease` (when the process elects), stops on
    /// SIGTERM/SIGINT, and supervises every task (the probe port's among them, spawned by
    /// the binary): returns an error when a critical task stops.
    pub async fn run(mut self, lease: Lease<'_>) -> anyhow::Result<()> {
        if self.acting == Acting::Elected {
            let cfg = lease.config()?;
            let (client, leadership, stop) = (
                self.lease_client.clone(),
                self.leadership.clone(),
                self.shutdown.wait(),
            );
            self.tasks.spawn("leader election", async move {
                leader::run(client, cfg, leadership, stop).await?;
                Ok(())
            });
        }
        let shutdown = self.shutdown.clone();
        self.tasks.spawn("signals", async move {
            signal().await;
            tracing::info!("shutting down");
            shutdown.trigger();
            Ok(())
        });
        self.tasks.supervise(GRACE).await?;
        Ok(())
    }
}

/// The Lease a component is elected by, marked with its component (the core finds the
/// drivers' Leases by that label, `check` reads the annotations).
pub struct Lease<'a> {
    pub election: &'a ElectionArgs,
    /// The Lease's name unless `--leader-elect-lease-name` gives one.
    pub default_name: &'a str,
    /// `controller` or `driver`.
    pub component: &'a str,
    /// Annotations besides the component's.
    pub annotations: BTreeMap<String, String>,
}

impl Lease<'_> {
    fn config(&self) -> anyhow::Result<LeaseConfig> {
        let mut cfg = self.election.config(self.default_name)?;
        cfg.annotations = self.annotations.clone();
        cfg.annotations.insert(
            LEASE_COMPONENT_ANNOTATION.to_string(),
            self.component.to_string(),
        );
        cfg.labels = [(
            LEASE_COMPONENT_LABEL.to_string(),
            self.component.to_string(),
        )]
        .into();
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_memory_limit_is_read_as_its_file_spells_it() {
        assert_eq!(parse_memory_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_memory_limit("max\n"), None);
        // cgroup v1 without a limit.
        assert_eq!(parse_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_memory_limit("0"), None);
        assert_eq!(parse_memory_limit("garbage"), None);
    }
}
