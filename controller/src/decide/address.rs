//! Address reconciliation (SPEC §5), including the safety-net reclaim and the release
//! delay, as a pure function.

use std::time::Duration;

use address_controller_api::family::family_of;
use address_controller_api::names::{self, ADDRESS_FINALIZER, HELD_ANNOTATION, event};
use address_controller_api::{
    AddressPhase, IPAddress, IPAddressClaim, IPAddressClass, ReclaimPolicy, duration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use kube::ResourceExt;

use super::{Now, PlannedEvent, with_finalizer, without_finalizer};

/// What the address reconciler sees.
pub struct AddressSnapshot<'a> {
    pub address: &'a IPAddress,
    /// The claim `spec.claimRef` names (by namespace and name), if it exists.
    pub claim: Option<&'a IPAddressClaim>,
    /// The address's class, if it exists (only the release delay is read from it).
    pub class: Option<&'a IPAddressClass>,
    pub now: Now,
}

/// The core-owned status fields of an address.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressStatusWrite {
    pub phase: AddressPhase,
    pub released_at: Option<Time>,
}

/// Everything one pass over an address wants done, in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AddressPlan {
    /// The full finalizer list to write.
    pub finalizers: Option<Vec<String>>,
    pub status: Option<AddressStatusWrite>,
    /// Clear `spec.claimRef` (the release delay elapsed).
    pub clear_claim_ref: bool,
    /// Delete the object (safety-net reclaim under `Delete`).
    pub delete: bool,
    /// The destructive steps above rest on the claim being absent from the cache: the
    /// reconciler must confirm that with a direct read before applying them (SPEC §5.6).
    pub confirm_claim_absent: bool,
    pub events: Vec<PlannedEvent>,
    /// An event to publish once per episode, not on every pass (`DeletionBlocked`,
    /// `InvalidAddress`): the reconciler remembers which it already published.
    pub once_event: Option<PlannedEvent>,
    /// Pass again after this long (the release delay's deadline).
    pub requeue_after: Option<Duration>,
}

fn phase(a: &IPAddress) -> Option<AddressPhase> {
    a.status.as_ref().and_then(|s| s.phase)
}

fn released_at(a: &IPAddress) -> Option<&Time> {
    a.status.as_ref().and_then(|s| s.released_at.as_ref())
}

/// How the claimRef relates to the claim in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// Claim exists, uid in claimRef equals the claim's.
    Live,
    /// Claim exists, claimRef has no uid yet (pre-bound).
    PreBound,
    /// Claim exists and is being deleted.
    Deleting,
    /// Claim is gone, or claimRef carries another uid (a stale binding).
    Gone,
}

fn holder(address: &IPAddress, claim: Option<&IPAddressClaim>) -> Option<Holder> {
    let r = address.spec.claim_ref.as_ref()?;
    let Some(claim) = claim else {
        return Some(Holder::Gone);
    };
    if claim.namespace().as_deref() != Some(r.namespace.as_str()) || claim.name_any() != r.name {
        return Some(Holder::Gone);
    }
    let same_uid = match (&r.uid, &claim.metadata.uid) {
        (None, _) => None,
        (Some(a), Some(c)) => Some(a == c),
        (Some(_), None) => Some(false),
    };
    Some(match same_uid {
        Some(false) => Holder::Gone,
        _ if claim.metadata.deletion_timestamp.is_some() => Holder::Deleting,
        None => Holder::PreBound,
        Some(true) => Holder::Live,
    })
}

/// The status write that moves the address to `phase_to` / `released_at_to`, or `None`
/// when it is there already.
fn status_write(
    a: &IPAddress,
    phase_to: AddressPhase,
    released_at_to: Option<Time>,
) -> Option<AddressStatusWrite> {
    let want = AddressStatusWrite {
        phase: phase_to,
        released_at: released_at_to,
    };
    let have = phase(a).map(|p| AddressStatusWrite {
        phase: p,
        released_at: released_at(a).cloned(),
    });
    (have.as_ref() != Some(&want)).then_some(want)
}

/// The release delay of a class, if it has a valid one.
pub fn release_delay(class: Option<&IPAddressClass>) -> Option<Duration> {
    duration::parse(class?.spec.release_delay.as_deref()?).ok()
}

/// Plans one pass over an address.
pub fn plan_address(s: &AddressSnapshot<'_>) -> AddressPlan {
    let a = s.address;
    let name = a.name_any();
    let mut plan = AddressPlan::default();
    let holder = holder(a, s.claim);

    // §5.1: deletion waits while a live claim holds the address.
    if a.metadata.deletion_timestamp.is_some() {
        let held = phase(a) == Some(AddressPhase::Bound) && holder == Some(Holder::Live);
        if held {
            let r = a
                .spec
                .claim_ref
                .as_ref()
                .map(|r| format!("{}/{}", r.namespace, r.name))
                .unwrap_or_default();
            plan.once_event = Some(PlannedEvent::warning(
                event::DELETION_BLOCKED,
                format!(
                    "IPAddress {name} is bound to claim {r}; it is deleted once the claim releases it"
                ),
            ));
        } else if let Some(remaining) = without_finalizer(a.finalizers(), ADDRESS_FINALIZER) {
            plan.finalizers = Some(remaining);
            // A Bound address whose claim merely vanished from the cache is confirmed first.
            plan.confirm_claim_absent =
                phase(a) == Some(AddressPhase::Bound) && holder == Some(Holder::Gone);
        }
        return plan;
    }

    // §5.2: the protection finalizer.
    plan.finalizers = with_finalizer(a.finalizers(), ADDRESS_FINALIZER);

    // §5.3: an invalid address is never trusted.
    if let Err(e) = family_of(&a.spec.address) {
        plan.status = status_write(a, AddressPhase::Pending, None);
        plan.once_event = Some(PlannedEvent::warning(
            event::INVALID_ADDRESS,
            format!("{e}; nothing will bind it"),
        ));
        return plan;
    }

    // §5.4: Conflict and Lost belong to the driver.
    if phase(a).is_some_and(AddressPhase::is_driver_owned) {
        return plan;
    }

    match holder {
        // §5.5: free (also after an admin cleared the claimRef of a Released address).
        None => plan.status = status_write(a, AddressPhase::Available, None),
        // §5.6
        Some(Holder::Live) => plan.status = status_write(a, AddressPhase::Bound, None),
        Some(Holder::PreBound) => plan.status = status_write(a, AddressPhase::Pending, None),
        Some(Holder::Deleting) => {}
        Some(Holder::Gone) => {
            let claim_ref = a
                .spec
                .claim_ref
                .as_ref()
                .map(|r| format!("{}/{}", r.namespace, r.name))
                .unwrap_or_default();
            if a.spec.reclaim_policy == ReclaimPolicy::Delete {
                plan.delete = true;
                plan.confirm_claim_absent = true;
                plan.events.push(PlannedEvent::normal(
                    event::RECLAIMED,
                    format!(
                        "claim {claim_ref} is gone; deleting the address (reclaim policy Delete)"
                    ),
                ));
                return plan;
            }
            let already = phase(a) == Some(AddressPhase::Released);
            let at = released_at(a).cloned().unwrap_or_else(|| s.now.clone());
            plan.status = status_write(a, AddressPhase::Released, Some(at.clone()));
            if !already {
                plan.confirm_claim_absent = true;
                plan.events.push(PlannedEvent::normal(
                    event::RECLAIMED,
                    format!("claim {claim_ref} is gone; the address is retained as Released"),
                ));
            }
            // §5.7: the release delay, read from the class now.
            if let Some(delay) = release_delay(s.class)
                && !names::annotation_is_true(a.metadata.annotations.as_ref(), HELD_ANNOTATION)
            {
                let delay = SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX);
                let deadline =
                    at.0.checked_add(delay)
                        .unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
                if s.now.0 >= deadline {
                    if already {
                        plan.clear_claim_ref = true;
                        plan.events.push(PlannedEvent::normal(
                            event::RELEASE_DELAY_ELAPSED,
                            format!("release delay elapsed; the address is free again (was claim {claim_ref})"),
                        ));
                    } else {
                        // Becomes Released in this pass; recycle on the next.
                        plan.requeue_after = Some(Duration::ZERO);
                    }
                } else {
                    let left = deadline.duration_since(s.now.0);
                    plan.requeue_after = Some(Duration::try_from(left).unwrap_or(Duration::ZERO));
                }
            }
        }
    }
    plan
}
