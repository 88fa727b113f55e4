//! Everything a pass needs, shared by all workers (controller-rs's `Context`).

use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim};
use address_controller_runtime::events::Events;
use address_controller_runtime::queue::{Backoff, Queue};
use address_controller_runtime::workers::Gate;
use address_controller_runtime::world::World;
use kube::Client;

use crate::index::Index;
use crate::metrics::Metrics;
use crate::quota::QuotaBook;
use crate::recent::RecentWrites;

/// The name the controller reports events under.
pub const CONTROLLER_NAME: &str = "address-controller";

/// The work queues, keyed by `namespace/name` (claims, Services) or `name` (addresses).
pub struct Queues {
    pub claims: Arc<Queue<String>>,
    pub addresses: Arc<Queue<String>>,
    pub services: Arc<Queue<String>>,
    /// Class names: the `DriverAvailable` condition.
    pub classes: Arc<Queue<String>>,
    /// One key: the retention of the history's records.
    pub records: Arc<Queue<String>>,
}

impl Queues {
    /// The queues by name, for their metrics.
    pub fn readers(
        &self,
    ) -> Vec<(
        &'static str,
        address_controller_runtime::metrics::QueueReader,
    )> {
        [
            ("claims", &self.claims),
            ("addresses", &self.addresses),
            ("services", &self.services),
            ("classes", &self.classes),
            ("records", &self.records),
        ]
        .into_iter()
        .map(|(name, q)| {
            let q = q.clone();
            let read: address_controller_runtime::metrics::QueueReader =
                Arc::new(move || q.stats());
            (name, read)
        })
        .collect()
    }
}

impl Default for Queues {
    fn default() -> Self {
        Queues {
            claims: Arc::new(Queue::new(Backoff::default())),
            addresses: Arc::new(Queue::new(Backoff::default())),
            services: Arc::new(Queue::new(Backoff::default())),
            classes: Arc::new(Queue::new(Backoff::default())),
            records: Arc::new(Queue::new(Backoff::default())),
        }
    }
}

pub struct Context {
    pub client: Client,
    pub world: World,
    pub index: Arc<Index>,
    /// Usage per namespace and class, and the takes in flight (SPEC §13).
    pub quota: Arc<QuotaBook>,
    /// Leadership and liveness: whether this process may act.
    pub gate: Gate,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub recent_claims: RecentWrites<IPAddressClaim>,
    pub recent_addresses: RecentWrites<IPAddress>,
    pub queues: Queues,
    /// Create claims for LoadBalancer Services that name none (SPEC §7).
    pub auto_claims: bool,
    pub history: History,
}

/// The history's records: how long they are kept, and the pace of an upgrade's moves.
pub struct History {
    /// Records whose entry ended longer ago than this are pruned (`--history-retention`).
    pub retention: std::time::Duration,
    /// Paces the writes that only move an older address's backlog to records.
    pub moves: address_controller_runtime::records::Pacer,
    /// Paces the retention's deletes.
    pub prunes: address_controller_runtime::records::Pacer,
    /// How often the retention looks for records to prune.
    pub prune_interval: std::time::Duration,
    /// At most this many records: past it the oldest go before the retention ends.
    pub max_records: i64,
}

impl Context {
    pub fn new(
        client: Client,
        world: World,
        gate: Gate,
        metrics: Arc<Metrics>,
        instance: String,
        auto_claims: bool,
        history: History,
    ) -> Self {
        Context {
            events: Events::new(client.clone(), CONTROLLER_NAME, instance),
            client,
            world,
            index: Arc::new(Index::default()),
            quota: Arc::new(QuotaBook::default()),
            gate,
            metrics,
            recent_claims: RecentWrites::default(),
            recent_addresses: RecentWrites::default(),
            queues: Queues::default(),
            auto_claims,
            history,
        }
    }
}
