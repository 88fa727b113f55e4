//! Publishing events (events.k8s.io/v1) with a reporting controller and instance, and
//! events that must be said once per episode rather than on every pass.
//!
//! Event names are `<object name>.<nanoseconds in hex>`, with the object name shortened so
//! the whole always fits in the 253 characters of an object name — kube's recorder does
//! not shorten, so every event of a claim with a long name was refused.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Resource, ResourceExt};

/// An event to publish on an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl PlannedEvent {
    pub fn normal(reason: &'static str, note: impl Into<String>) -> Self {
        PlannedEvent {
            warning: false,
            reason,
            note: note.into(),
        }
    }
    pub fn warning(reason: &'static str, note: impl Into<String>) -> Self {
        PlannedEvent {
            warning: true,
            reason,
            note: note.into(),
        }
    }
}

/// Longest object name Kubernetes accepts.
const MAX_NAME: usize = 253;
/// The API server refuses notes longer than this (events.k8s.io/v1 validation).
const MAX_NOTE: usize = 1024;
/// "Once" events remembered per object, for at most this long.
const ONCE_TTL: Duration = Duration::from_secs(6 * 3600);
/// Entries kept before old ones are pruned.
const ONCE_PRUNE_AT: usize = 10_000;

/// The name of an event on `object` at `nanos`: always a valid object name.
pub fn event_name(object: &str, nanos: u128) -> String {
    let suffix = format!(".{nanos:x}");
    let room = MAX_NAME - suffix.len();
    let mut prefix: String = object.chars().take(room).collect();
    // A name must end with an alphanumeric character before the dot.
    while prefix.ends_with(['.', '-']) {
        prefix.pop();
    }
    if prefix.is_empty() {
        prefix.push('e');
    }
    format!("{prefix}{suffix}")
}

/// A reference to `obj` for the `regarding` field.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).to_string()),
        kind: Some(K::kind(&()).to_string()),
        name: obj.meta().name.clone(),
        namespace: obj.meta().namespace.clone(),
        uid: obj.meta().uid.clone(),
        resource_version: obj.meta().resource_version.clone(),
        ..Default::default()
    }
}

pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    /// One-shot events already published: object uid → (reason, when).
    once: Mutex<HashMap<String, Vec<(&'static str, Instant)>>>,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: String) -> Self {
        Events {
            client,
            controller: controller.into(),
            instance,
            once: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes an event on `obj`. Failures are logged: an event is never worth a retry.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, ev: &PlannedEvent) {
        self.publish_on(reference(obj), ev).await;
    }

    /// Publishes an event on the object `regarding` refers to.
    pub async fn publish_on(&self, regarding: ObjectReference, ev: &PlannedEvent) {
        let now = Timestamp::now();
        let nanos = u128::try_from(now.as_nanosecond()).unwrap_or_default();
        // Events live in the object's namespace; cluster-scoped objects' in `default`.
        let ns = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let object = regarding.name.clone().unwrap_or_default();
        let note: String = ev.note.chars().take(MAX_NOTE).collect();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name(&object, nanos)),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(ev.reason.to_string()),
            reason: Some(ev.reason.to_string()),
            note: Some(note),
            type_: Some(if ev.warning { "Warning" } else { "Normal" }.to_string()),
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {}
            // The namespace is going away with its claims; nobody will read the event.
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
                tracing::debug!(reason = ev.reason, "namespace terminating; event dropped");
            }
            Err(e) => tracing::warn!(reason = ev.reason, %object, error = %e, "publishing event"),
        }
    }

    /// Publishes `ev` on `obj` unless it was already published for this object; with
    /// `None`, forgets what was published so the next episode is reported again.
    pub async fn publish_once<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        ev: Option<&PlannedEvent>,
    ) {
        let uid = obj.uid().unwrap_or_default();
        if self.remember(&uid, ev)
            && let Some(ev) = ev
        {
            self.publish(obj, ev).await;
        }
    }

    /// True when `ev` is new for `uid` (and is now remembered).
    fn remember(&self, uid: &str, ev: Option<&PlannedEvent>) -> bool {
        let mut once = self.once.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(ev) = ev else {
            once.remove(uid);
            return false;
        };
        if once.len() >= ONCE_PRUNE_AT {
            once.retain(|_, said| {
                said.retain(|(_, at)| at.elapsed() < ONCE_TTL);
                !said.is_empty()
            });
        }
        let said = once.entry(uid.to_string()).or_default();
        match said.iter_mut().find(|(r, _)| *r == ev.reason) {
            Some((_, at)) if at.elapsed() < ONCE_TTL => false,
            Some((_, at)) => {
                *at = Instant::now();
                true
            }
            None => {
                said.push((ev.reason, Instant::now()));
                true
            }
        }
    }

    /// Forgets everything about an object that is gone.
    pub fn forget(&self, uid: &str) {
        self.remember(uid, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_always_fit_and_stay_valid() {
        let long = "a".repeat(253);
        let n = event_name(&long, u128::from(u64::MAX));
        assert_eq!(n.len(), 253);
        assert!(n.ends_with(".ffffffffffffffff"));
        let dotted = format!("{}.-x", "b".repeat(235));
        let n = event_name(&dotted, 1);
        assert!(n.len() <= 253);
        assert!(!n.contains(".-.") && !n.contains("-."), "{n}");
        assert_eq!(event_name("web", 255), "web.ff");
    }
}
