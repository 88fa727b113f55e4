//! Pure decisions: a snapshot of the cache goes in, a plan of patches and events comes
//! out. Nothing here performs I/O; the reconcilers gather snapshots and apply plans.

pub mod address;
pub mod autoclaim;
pub mod claim;
mod conditions;

use address_controller_api::{ClaimRef, IPAddress, IPAddressClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

pub use conditions::set_condition;

/// An event to publish on the object being reconciled.
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

/// The finalizer list with `finalizer` added, or `None` when it is already there.
pub fn with_finalizer(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let mut out = finalizers.to_vec();
    out.push(finalizer.to_string());
    Some(out)
}

/// The finalizer list without `finalizer`, or `None` when it is not there.
pub fn without_finalizer(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    Some(
        finalizers
            .iter()
            .filter(|f| *f != finalizer)
            .cloned()
            .collect(),
    )
}

/// Whether an address's claimRef names this claim by namespace and name.
pub fn refers_to(claim_ref: &ClaimRef, claim: &IPAddressClaim) -> bool {
    Some(claim_ref.namespace.as_str()) == claim.metadata.namespace.as_deref()
        && claim_ref.name == claim.name_any()
}

/// Whether the address is bound or pre-bound to exactly this claim: same namespace and
/// name, and a uid that is empty or equal to the claim's (SPEC §4.3).
pub fn belongs_to(address: &IPAddress, claim: &IPAddressClaim) -> bool {
    match &address.spec.claim_ref {
        Some(r) if refers_to(r, claim) => match (&r.uid, &claim.metadata.uid) {
            (None, _) => true,
            (Some(a), Some(c)) => a == c,
            (Some(_), None) => false,
        },
        _ => false,
    }
}

/// A point in time, for plans that stamp or compare timestamps.
pub type Now = Time;

#[cfg(test)]
mod tests;
