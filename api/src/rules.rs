//! Rules about one object, spelled once, on the types: the core, the driver kit and the
//! views call these instead of reading fields and re-deriving them (SPEC §4.3, §5.6, §5.8).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::family::{Family, family_of};
use crate::names::{self, HELD_ANNOTATION};
use crate::{
    AddressPhase, ClaimPhase, ClaimRef, IPAddress, IPAddressClaim, IPAddressClass, duration,
};

impl ClaimRef {
    /// `namespace/name` of the claim it names (the caches' key).
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether it names something that could exist: a DNS-1123 label and subdomain. A name
    /// admitted before the schema validated it (`"x y"`) names no claim, ever.
    pub fn is_valid(&self) -> bool {
        crate::validation::is_dns1123_label(&self.namespace)
            && crate::validation::is_dns1123_subdomain(&self.name)
    }

    /// Whether it names `claim` by namespace and name (any uid).
    pub fn names(&self, claim: &IPAddressClaim) -> bool {
        Some(self.namespace.as_str()) == claim.metadata.namespace.as_deref()
            && self.name == claim.name_any()
    }
}

impl IPAddress {
    pub fn phase(&self) -> Option<AddressPhase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    /// The phase as written, `Unknown` before the core wrote one (the views' and the
    /// metrics' label).
    pub fn phase_name(&self) -> &'static str {
        self.phase().map_or("Unknown", AddressPhase::as_str)
    }

    /// The family the address counts as, or `None` for an invalid address (never trusted).
    pub fn family(&self) -> Option<Family> {
        family_of(&self.spec.address).ok()
    }

    /// The address itself, or `None` for an invalid one (never trusted).
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        crate::family::parse_address(&self.spec.address).ok()
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// When the core moved the address to `Released`.
    pub fn released_at(&self) -> Option<&Time> {
        self.status.as_ref().and_then(|s| s.released_at.as_ref())
    }

    /// Whether the claimRef names `claim` by namespace and name (any uid).
    pub fn names(&self, claim: &IPAddressClaim) -> bool {
        self.spec.claim_ref.as_ref().is_some_and(|r| r.names(claim))
    }

    /// Whether the address is bound or pre-bound to exactly this claim: same namespace and
    /// name, and a uid that is empty or equal to the claim's (SPEC §4.3). A different uid
    /// is a stale binding to an older claim of the same name, never adopted.
    pub fn belongs_to(&self, claim: &IPAddressClaim) -> bool {
        match &self.spec.claim_ref {
            Some(r) if r.names(claim) => match (&r.uid, &claim.metadata.uid) {
                (None, _) => true,
                (Some(a), Some(c)) => a == c,
                (Some(_), None) => false,
            },
            _ => false,
        }
    }

    /// Whether an admin holds the address back from the release delay (`held: "true"`).
    pub fn is_held(&self) -> bool {
        names::annotation_is_true(self.metadata.annotations.as_ref(), HELD_ANNOTATION)
    }

    /// Whether the binding the address holds is the one that was released (SPEC §5.6,
    /// §5.8): phase `Released` and `spec.claimRef` equal — uid included — to
    /// `status.releasedFrom`, the claimRef the core recorded when it released the address.
    /// Only this binding waits out the release delay and is never bound again; a claimRef
    /// that differs (a bind after the release delay cleared it, an admin's move) is a new
    /// binding or a reservation, whatever the phase still says. An address released before
    /// `releasedFrom` existed has no record: its current claimRef is the released one.
    pub fn is_released(&self) -> bool {
        let Some(r) = self.spec.claim_ref.as_ref() else {
            return false;
        };
        self.phase() == Some(AddressPhase::Released)
            && self
                .status
                .as_ref()
                .and_then(|s| s.released_from.as_ref())
                .is_none_or(|from| from == r)
    }

    /// Whether the address is a released surplus (SPEC §5.7): [`IPAddress::is_released`]
    /// and released because its claim already held another address of the family
    /// (`status.reason: Surplus`). Such an address was never granted to its claim.
    pub fn is_surplus(&self) -> bool {
        self.is_released()
            && self.status.as_ref().and_then(|s| s.reason.as_deref())
                == Some(crate::names::released::SURPLUS)
    }

    /// The phase a driver writes when its `Conflict` or `Lost` ends (SPEC §8): the one the
    /// core computes from the claimRef — `Released` for the binding that was released
    /// (recorded in `releasedFrom`), `Bound` with a claimRef, `Available` without. (The core
    /// refines a pre-binding to `Pending` and keeps a reservation `Available` on its pass.)
    pub fn resting_phase(&self) -> AddressPhase {
        let from = self.status.as_ref().and_then(|s| s.released_from.as_ref());
        match &self.spec.claim_ref {
            Some(r) if from == Some(r) => AddressPhase::Released,
            Some(_) => AddressPhase::Bound,
            None => AddressPhase::Available,
        }
    }

    /// Whether the address is free: no claimRef, `Available`, not being deleted, a valid
    /// address. (A claimRef without a uid is a reservation, not free.)
    pub fn is_free(&self) -> bool {
        self.spec.claim_ref.is_none()
            && self.phase() == Some(AddressPhase::Available)
            && !self.is_deleting()
            && self.family().is_some()
    }

    /// Whether the core shows the address as reserved: `Available` with a claimRef — its
    /// answer to a claimRef without a uid naming a claim that does not exist yet. Neither
    /// free for other claims nor bound (SPEC §5.6).
    pub fn is_reserved(&self) -> bool {
        self.phase() == Some(AddressPhase::Available) && self.spec.claim_ref.is_some()
    }

    /// Whether a driver provisioned the address for `claim` (SPEC §6): marked
    /// `provisioned-by`, its claimRef carrying the claim's uid, and created no earlier than
    /// the claim. An admin's static or reserved address fails it, and so does a driver's
    /// address recycled (after its release delay) to a later claim: their reclaim policy is
    /// the admin's, whatever the claim's owner references say.
    pub fn provisioned_for(&self, claim: &IPAddressClaim) -> bool {
        let marked = self
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(names::PROVISIONED_BY_ANNOTATION));
        let uid = self.spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref());
        let created = |m: &kube::api::ObjectMeta| m.creation_timestamp.as_ref().map(|t| t.0);
        marked
            && self.names(claim)
            && uid.is_some()
            && uid == claim.metadata.uid.as_deref()
            && matches!(
                (created(&self.metadata), created(&claim.metadata)),
                (Some(a), Some(c)) if a >= c
            )
    }

    /// Whether the claimRef carries no uid: a pre-binding, or — while no such claim
    /// exists — a reservation (SPEC §5.6).
    pub fn is_prebound(&self) -> bool {
        self.spec
            .claim_ref
            .as_ref()
            .is_some_and(|r| r.uid.is_none())
    }
}

impl IPAddressClaim {
    /// The claimRef that binds an address to this claim (its uid included).
    pub fn claim_ref(&self) -> ClaimRef {
        ClaimRef {
            namespace: self.namespace().unwrap_or_default(),
            name: self.name_any(),
            uid: self.metadata.uid.clone(),
        }
    }

    /// `namespace/name` (the caches' key).
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.namespace().unwrap_or_default(),
            self.name_any()
        )
    }

    pub fn phase(&self) -> Option<ClaimPhase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    /// The claim's families (in its order) that HAS does not cover: what is still missing.
    pub fn families_missing(&self, has: impl Fn(Family) -> bool) -> Vec<Family> {
        self.spec
            .family
            .families()
            .iter()
            .copied()
            .filter(|f| !has(*f))
            .collect()
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The owner reference the core writes on an auto-claim (SPEC §7): the controller
    /// reference to the `v1` Service the claim is named after. Any other controller
    /// reference is the tenant's own (a tenant may add one to its claim) and makes no
    /// auto-claim: reclaim never deletes an address for it (SPEC §6).
    pub fn auto_claim_owner(&self) -> Option<&OwnerReference> {
        self.metadata.owner_references.as_ref()?.iter().find(|r| {
            r.controller == Some(true)
                && r.api_version == "v1"
                && r.kind == "Service"
                && r.name == self.name_any()
        })
    }

    /// Whether nobody waits on the claim: `Bound` and not being deleted. A new leader (core or
    /// driver) examines the claims that are not settled first
    /// ([`IPAddressClaim::waiting_and_settled`]).
    pub fn is_settled(&self) -> bool {
        !self.is_deleting() && self.phase() == Some(ClaimPhase::Bound)
    }

    /// The keys of `claims` not [settled](IPAddressClaim::is_settled) (new, `Pending`,
    /// `Lost`, being deleted), and those settled, each in the given order.
    pub fn waiting_and_settled<'a>(
        claims: impl IntoIterator<Item = &'a IPAddressClaim>,
    ) -> (Vec<String>, Vec<String>) {
        let (settled, waiting): (Vec<_>, Vec<_>) = claims.into_iter().partition(|c| c.is_settled());
        let keys = |v: Vec<&IPAddressClaim>| v.into_iter().map(Self::key).collect();
        (keys(waiting), keys(settled))
    }
}

impl IPAddressClass {
    /// The class's release delay, if it has a valid one (SPEC §5.8).
    pub fn release_delay(&self) -> Option<Duration> {
        duration::parse(self.spec.release_delay.as_deref()?).ok()
    }

    /// When a `Released` address of this class becomes free by itself: its `releasedAt`
    /// plus the class's release delay, unless an admin holds it or the class has no
    /// delay (then only an admin frees it).
    pub fn release_deadline(&self, address: &IPAddress) -> Option<Timestamp> {
        self.release_deadline_after(address, address.released_at()?)
    }

    /// [`IPAddressClass::release_deadline`] for an address released at `released_at` (one
    /// that is being released in this pass has no `releasedAt` yet).
    pub fn release_deadline_after(
        &self,
        address: &IPAddress,
        released_at: &Time,
    ) -> Option<Timestamp> {
        if address.is_held() {
            return None;
        }
        let delay = SignedDuration::try_from(self.release_delay()?).unwrap_or(SignedDuration::MAX);
        Some(released_at.0.checked_add(delay).unwrap_or(Timestamp::MAX))
    }

    /// Whether the class carries the boolean class annotation `key` as exactly `"true"`.
    pub fn is_marked(&self, key: &str) -> bool {
        names::annotation_is_true(self.metadata.annotations.as_ref(), key)
    }

    /// "The" class marked with `key` (the default class, the auto-claim class): exactly one
    /// must carry it — none and several are both told apart, never guessed.
    pub fn the_marked<'a>(classes: &'a [std::sync::Arc<IPAddressClass>], key: &str) -> Marked<'a> {
        let marked: Vec<&IPAddressClass> = classes
            .iter()
            .map(std::sync::Arc::as_ref)
            .filter(|c| c.is_marked(key))
            .collect();
        match marked.as_slice() {
            [] => Marked::None,
            [one] => Marked::One(one),
            many => {
                let mut names: Vec<String> = many.iter().map(|c| c.name_any()).collect();
                names.sort();
                Marked::Several(names)
            }
        }
    }
}

/// What [`IPAddressClass::the_marked`] found.
#[derive(Debug)]
pub enum Marked<'a> {
    None,
    One(&'a IPAddressClass),
    /// The names of the marked classes, sorted.
    Several(Vec<String>),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    fn address(extra: Value) -> IPAddress {
        let mut v = json!({"metadata": {"name": "a"},
            "spec": {"address": "192.0.2.1", "className": "c", "source": {"fromClass": {}}}});
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(base: &mut Value, patch: Value) {
        match (base, patch) {
            (Value::Object(b), Value::Object(p)) => {
                for (k, v) in p {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
            (b, p) => *b = p,
        }
    }

    #[test]
    fn a_new_leader_examines_the_claims_a_tenant_waits_on_first() {
        let claim = |name: &str, phase: Option<&str>, deleting: bool| -> IPAddressClaim {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "t",
                    "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z")},
                "spec": {}, "status": phase.map(|p| json!({"phase": p}))}))
            .unwrap()
        };
        let claims = [
            claim("a", Some("Bound"), false),
            claim("b", None, false),
            claim("c", Some("Bound"), true),
            claim("d", Some("Bound"), false),
            claim("e", Some("Pending"), false),
            claim("f", Some("Lost"), false),
        ];
        let (waiting, settled) = IPAddressClaim::waiting_and_settled(&claims);
        assert_eq!(waiting, ["t/b", "t/c", "t/e", "t/f"]);
        assert_eq!(settled, ["t/a", "t/d"]);
    }

    #[test]
    fn released_names_exactly_the_binding_that_was_released() {
        let x = json!({"namespace": "t", "name": "x", "uid": "ux"});
        let released = |claim_ref: Value, from: Value| {
            address(json!({"spec": {"claimRef": claim_ref},
                "status": {"phase": "Released", "releasedAt": "2026-01-01T00:00:00Z", "releasedFrom": from}}))
        };
        assert!(released(x.clone(), x.clone()).is_released());
        // Another claim bound after the release (the release delay cleared the claimRef
        // and a claim pass bound it before the status said Available).
        assert!(
            !released(
                json!({"namespace": "t", "name": "y", "uid": "uy"}),
                x.clone()
            )
            .is_released()
        );
        // The same name without the uid: an admin's reservation for a new claim of it.
        assert!(!released(json!({"namespace": "t", "name": "x"}), x.clone()).is_released());
        // Moved to another namespace.
        assert!(!released(json!({"namespace": "u", "name": "x"}), x.clone()).is_released());
        // Released before the record existed: the current claimRef is the released one.
        assert!(released(x.clone(), Value::Null).is_released());
        // No claimRef: nothing is released, whatever the phase says.
        assert!(!released(Value::Null, x.clone()).is_released());
        // Not Released.
        let bound = address(json!({"spec": {"claimRef": x}, "status": {"phase": "Bound"}}));
        assert!(!bound.is_released());
    }

    #[test]
    fn release_deadline_of_the_class() {
        let class: IPAddressClass = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"provisioner": "p", "releaseDelay": "1h30m"}}),
        )
        .unwrap();
        let a =
            address(json!({"status": {"phase": "Released", "releasedAt": "2026-01-01T00:00:00Z"}}));
        assert_eq!(
            class.release_deadline(&a).unwrap().to_string(),
            "2026-01-01T01:30:00Z"
        );
        let held = address(
            json!({"metadata": {"annotations": {HELD_ANNOTATION: "true"}},
            "status": {"phase": "Released", "releasedAt": "2026-01-01T00:00:00Z"}}),
        );
        assert_eq!(class.release_deadline(&held), None);
        let no_delay: IPAddressClass = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"provisioner": "p"}}),
        )
        .unwrap();
        assert_eq!(no_delay.release_deadline(&a), None);
    }
}
