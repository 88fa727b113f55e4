//! Pure decisions: a snapshot goes in, a plan of patches and events comes out. Nothing here
//! performs I/O; the reconcilers gather snapshots and apply plans. The modules follow the
//! SPEC: [`claim`] (§4, §6), [`address`] (§5), [`holdings`] (§4.3, §5.7: which addresses a
//! claim keeps), [`release_delay`] (§5.8), [`autoclaim`] (§7).

pub mod address;
pub mod autoclaim;
pub mod claim;
pub mod holdings;
pub mod release_delay;

use address_controller_api::family::{Family, family_of};
use address_controller_api::{AddressPhase, ClaimRef, IPAddress, IPAddressClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

pub use address_controller_api::conditions::set_condition;
pub use address_controller_runtime::events::PlannedEvent;

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

/// The claimRef that binds an address to `claim`.
pub fn claim_ref_of(claim: &IPAddressClaim) -> ClaimRef {
    ClaimRef {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        uid: claim.metadata.uid.clone(),
    }
}

/// The family an address counts as, or `None` for an invalid address (never trusted).
pub fn family(a: &IPAddress) -> Option<Family> {
    family_of(&a.spec.address).ok()
}

pub fn phase(a: &IPAddress) -> Option<AddressPhase> {
    a.status.as_ref().and_then(|s| s.phase)
}

pub fn is_deleting<K: kube::Resource>(o: &K) -> bool {
    o.meta().deletion_timestamp.is_some()
}

/// Whether `a` is free for class `class` and family `f`: unbound, `Available`, not being
/// deleted, a valid address of that family. The index of free addresses uses exactly this.
pub fn is_free(a: &IPAddress, class: &str, f: Family) -> bool {
    a.spec.claim_ref.is_none()
        && a.spec.class_name == class
        && phase(a) == Some(AddressPhase::Available)
        && !is_deleting(a)
        && family(a) == Some(f)
}

/// `namespace/name` of the claim an address names.
pub fn claim_key(r: &ClaimRef) -> String {
    format!("{}/{}", r.namespace, r.name)
}

/// A point in time, for plans that stamp or compare timestamps.
pub type Now = Time;

#[cfg(test)]
pub(crate) mod tests;
