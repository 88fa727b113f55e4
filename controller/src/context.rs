use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use address_controller_api::{IPAddress, IPAddressClaim};
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Lookup;

use crate::cache::Stores;
use crate::decide::PlannedEvent;
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
    pub metrics: Arc<Metrics>,
    recorder: Recorder,
    pub recent_claims: RecentWrites<IPAddressClaim>,
    pub recent_addresses: RecentWrites<IPAddress>,
    pub in_flight: InFlight,
    /// One-shot address events already published: (uid, reason).
    once: Mutex<HashSet<(String, &'static str)>>,
}

impl Context {
    pub fn new(
        client: Client,
        stores: Stores,
        leader: Arc<Leadership>,
        metrics: Arc<Metrics>,
        instance: String,
    ) -> Self {
        let reporter = Reporter {
            controller: CONTROLLER_NAME.into(),
            instance: Some(instance),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            stores,
            leader,
            metrics,
            recent_claims: RecentWrites::default(),
            recent_addresses: RecentWrites::default(),
            in_flight: InFlight::default(),
            once: Mutex::new(HashSet::new()),
        }
    }

    /// Publishes an event on `obj`. Failures are logged: an event is never worth a retry.
    pub async fn publish<K>(&self, obj: &K, ev: &PlannedEvent)
    where
        K: kube::Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    {
        let event = Event {
            type_: if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: ev.reason.to_string(),
            note: Some(ev.note.clone()),
            action: ev.reason.to_string(),
            secondary: None,
        };
        match self.recorder.publish(&event, &obj.object_ref(&())).await {
            Ok(()) => {}
            // The namespace is going away with its claims; nobody will read the event.
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
                tracing::debug!(reason = ev.reason, "namespace terminating; event dropped");
            }
            Err(e) => tracing::warn!(reason = ev.reason, error = %e, "publishing event"),
        }
    }

    /// Publishes `ev` on `obj` unless it was already published for this object; with
    /// `None`, forgets what was published so the next episode is reported again.
    pub async fn publish_once<K>(&self, obj: &K, ev: Option<&PlannedEvent>)
    where
        K: kube::Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    {
        let uid = obj.meta().uid.clone().unwrap_or_default();
        let fresh = {
            let mut once = self.once.lock().unwrap_or_else(PoisonError::into_inner);
            match ev {
                Some(ev) => once.insert((uid, ev.reason)),
                None => {
                    once.retain(|(u, _)| *u != uid);
                    false
                }
            }
        };
        if let (true, Some(ev)) = (fresh, ev) {
            self.publish(obj, ev).await;
        }
    }
}
