//! The reconcilers: gather a snapshot from the caches, call the pure decision, apply the
//! plan with guarded patches. They hold no logic of their own beyond ordering the writes.

pub mod address;
pub mod claim;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::context::Context;
use crate::error::Error;

/// A merge patch guarded by the resourceVersion it was computed from: the API server
/// refuses it with 409 when the object changed in between (SPEC §3).
pub(crate) fn guarded(resource_version: Option<&str>, mut body: Value) -> Value {
    if let (Some(rv), Some(obj)) = (resource_version, body.as_object_mut()) {
        obj.insert(
            "metadata".into(),
            merge_meta(obj.get("metadata").cloned(), rv),
        );
    }
    body
}

fn merge_meta(existing: Option<Value>, rv: &str) -> Value {
    let mut meta = existing.unwrap_or_else(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    meta
}

/// Runs one pass when this process may act (it leads and its caches are complete), and
/// records its outcome and duration.
pub(crate) async fn instrumented(
    ctx: &Context,
    controller: &'static str,
    pass: impl std::future::Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    if !ctx.may_act() {
        // Not the leader: nothing to do. Caches incomplete: look again shortly.
        return Ok(if ctx.leader.is_leader() {
            Action::requeue(Duration::from_millis(500))
        } else {
            Action::await_change()
        });
    }
    let start = std::time::Instant::now();
    let result = pass.await;
    let label = result.as_ref().map_or_else(Error::category, |_| "success");
    ctx.metrics.observe(controller, label, start.elapsed());
    result
}

/// Requeue policy by error kind: a lost race is retried at once (the cache is about to
/// catch up), anything else with a backoff.
pub fn error_policy<K>(_obj: Arc<K>, err: &Error, _ctx: Arc<Context>) -> Action {
    match err {
        Error::Conflict { .. } => Action::requeue(Duration::from_millis(100)),
        Error::Kube { .. } => {
            tracing::warn!(error = %err, "reconcile failed");
            Action::requeue(Duration::from_secs(5))
        }
    }
}
