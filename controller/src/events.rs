//! Publishing events (events.k8s.io/v1) with a reporting controller name, and events that
//! must be said once per episode rather than on every pass.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Lookup;

use crate::decide::PlannedEvent;

pub struct Events {
    recorder: Recorder,
    /// One-shot events already published: (object uid, reason).
    once: Mutex<HashSet<(String, &'static str)>>,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: String) -> Self {
        let reporter = Reporter {
            controller: controller.into(),
            instance: Some(instance),
        };
        Events {
            recorder: Recorder::new(client, reporter),
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
