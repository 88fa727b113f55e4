//! The reconcilers: gather a snapshot from the caches and indexes, call the pure decision,
//! apply the plan with guarded patches. They hold no logic of their own beyond ordering the
//! writes.

pub mod address;
pub mod claim;
pub mod class;
pub mod records;
pub mod service;

#[cfg(test)]
mod tests;

use serde_json::{Value, json};

/// A merge patch guarded by the resourceVersion it was computed from: the API server
/// refuses it with 409 when the object changed in between (SPEC §3).
pub(crate) fn guarded(resource_version: Option<&str>, mut body: Value) -> Value {
    if let (Some(rv), Some(obj)) = (resource_version, body.as_object_mut()) {
        let meta = obj.entry("metadata").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
    }
    body
}
