//! Setting a `metav1.Condition` the way Kubernetes controllers do.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets a condition in `conditions`, keeping `lastTransitionTime` unless the status
/// changed, so that recomputing an unchanged condition is a no-op (no status write).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    observed_generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let existing = conditions.iter_mut().find(|c| c.type_ == type_);
    match existing {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now.clone();
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            observed_generation,
            last_transition_time: now.clone(),
        }),
    }
}
