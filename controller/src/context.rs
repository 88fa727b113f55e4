use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim};
use kube::Client;
use kube::runtime::reflector::Lookup;

use crate::cache::Stores;
use crate::decide::PlannedEvent;
use crate::events::Events;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::recent::{InFlight, RecentWrites};

/// The name the controller reports events and writes under.
pub const CONTROLLER_NAME: &str = "address-controller";

/// Everything a reconcile pass needs, shared by all workers.
pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub leader: Arc<Leadership>,
    /// Every cache completed its initial list. Until then a claim would look unbound
    /// merely because the addresses are not loaded yet, so nothing reconciles.
    pub synced: Arc<std::sync::atomic::AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub events: Events,
    pub recent_claims: RecentWrites<IPAddressClaim>,
    pub recent_addresses: RecentWrites<IPAddress>,
    pub in_flight: InFlight,
}

impl Context {
    pub fn new(
        client: Client,
        stores: Stores,
        leader: Arc<Leadership>,
        synced: Arc<std::sync::atomic::AtomicBool>,
        metrics: Arc<Metrics>,
        instance: String,
    ) -> Self {
        Context {
            events: Events::new(client.clone(), CONTROLLER_NAME, instance),
            client,
            stores,
            leader,
            synced,
            metrics,
            recent_claims: RecentWrites::default(),
            recent_addresses: RecentWrites::default(),
            in_flight: InFlight::default(),
        }
    }

    /// Whether this process may act now: it leads, and its caches are complete.
    pub fn may_act(&self) -> bool {
        self.leader.is_leader() && self.synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Publishes an event on `obj` (see [`Events::publish`]).
    pub async fn publish<K>(&self, obj: &K, ev: &PlannedEvent)
    where
        K: kube::Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    {
        self.events.publish(obj, ev).await;
    }

    /// See [`Events::publish_once`].
    pub async fn publish_once<K>(&self, obj: &K, ev: Option<&PlannedEvent>)
    where
        K: kube::Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    {
        self.events.publish_once(obj, ev).await;
    }
}
