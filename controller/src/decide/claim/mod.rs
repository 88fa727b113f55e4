//! Claim reconciliation (SPEC §4) and the reclaim flow (SPEC §6) as a pure function: a
//! pipeline of named steps, one per SPEC section — [`reclaim`], the finalizer,
//! pre-binding completion, satisfaction and loss, [`resolve`] and [`matching`],
//! [`status`].

pub mod matching;
pub mod reclaim;
pub mod resolve;
pub mod status;

use std::sync::Arc;

use address_controller_api::family::Family;
use address_controller_api::names::{CLAIM_FINALIZER, PROVISIONER_ANNOTATION, event, reason};
use address_controller_api::{
    AddressPhase, ClaimPhase, ClaimRef, IPAddress, IPAddressClaim, IPAddressClaimStatus,
    IPAddressClass,
};
use kube::ResourceExt;

use super::holdings::Holdings;
use super::{Now, PlannedEvent, claim_ref_of, family, is_deleting, phase, with_finalizer};
pub use matching::pin_of;
pub use reclaim::has_controller_owner;
pub use resolve::{Resolution, named_class, resolve_class};

/// What the claim reconciler sees.
pub struct ClaimSnapshot<'a> {
    pub claim: &'a IPAddressClaim,
    /// Every address whose claimRef names the claim by namespace and name (any uid, being
    /// deleted or not).
    pub named: &'a [Arc<IPAddress>],
    /// The address `spec.addressName` names, when the claim is pinned and it exists.
    pub pinned: Option<&'a IPAddress>,
    /// Another worker is binding the pinned address right now.
    pub pinned_taken: bool,
    /// The lowest-named free address of a class and family that no other worker is
    /// binding right now.
    pub candidate: &'a dyn Fn(&str, Family) -> Option<Arc<IPAddress>>,
    /// Every class.
    pub classes: &'a [Arc<IPAddressClass>],
    pub now: Now,
}

/// One write to an address, guarded by the resourceVersion the plan was computed from.
#[derive(Debug, Clone, PartialEq)]
pub enum AddressWrite {
    /// Set `spec.claimRef` on a free address (SPEC §4.7).
    Bind {
        name: String,
        resource_version: Option<String>,
        claim_ref: ClaimRef,
    },
    /// Write the claim's uid into a pre-binding (SPEC §4.4).
    CompleteUid {
        name: String,
        resource_version: Option<String>,
        claim_ref: ClaimRef,
    },
    /// Retain on reclaim: phase `Released` with `releasedAt` (SPEC §6).
    Release {
        name: String,
        resource_version: Option<String>,
    },
    /// Delete on reclaim (SPEC §6); the uid precondition never deletes a newer object.
    Delete { name: String, uid: Option<String> },
}

impl AddressWrite {
    pub fn address_name(&self) -> &str {
        match self {
            AddressWrite::Bind { name, .. }
            | AddressWrite::CompleteUid { name, .. }
            | AddressWrite::Release { name, .. }
            | AddressWrite::Delete { name, .. } => name,
        }
    }
}

/// Claim metadata the core owns: the protection finalizer and the provisioner stamp,
/// written together in one patch when both are due.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimMetadata {
    /// The full finalizer list to write (computed from the observed one).
    pub finalizers: Option<Vec<String>>,
    /// The provisioner annotation value to write.
    pub provisioner: Option<String>,
}

/// Everything one pass over a claim wants done, in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimPlan {
    pub metadata: Option<ClaimMetadata>,
    pub address_writes: Vec<AddressWrite>,
    /// The new status, only when it differs from the observed one.
    pub status: Option<IPAddressClaimStatus>,
    /// Reclaim done: the finalizer list without ours, written last (SPEC §6).
    pub finalize: Option<Vec<String>>,
    pub events: Vec<PlannedEvent>,
}

impl ClaimPlan {
    pub fn is_empty(&self) -> bool {
        self.metadata.is_none()
            && self.address_writes.is_empty()
            && self.status.is_none()
            && self.finalize.is_none()
            && self.events.is_empty()
    }

    /// The free addresses this plan binds.
    pub fn binds(&self) -> impl Iterator<Item = &str> {
        self.address_writes.iter().filter_map(|w| match w {
            AddressWrite::Bind { name, .. } => Some(name.as_str()),
            _ => None,
        })
    }
}

/// Plans one pass over a claim.
pub fn plan_claim(s: &ClaimSnapshot<'_>) -> ClaimPlan {
    let claim = s.claim;
    let holdings = Holdings::of(claim, s.named.iter().map(Arc::as_ref));

    // §4.1 / §6
    if is_deleting(claim) {
        return reclaim::reclaim(claim, &holdings);
    }
    let mut plan = ClaimPlan::default();
    // §4.2: the finalizer (the stamp joins this patch when it is due too).
    let mut metadata = ClaimMetadata {
        finalizers: with_finalizer(claim.finalizers(), CLAIM_FINALIZER),
        provisioner: None,
    };
    // §4.4
    plan.address_writes = complete_prebindings(claim, &holdings);

    // §4.5: which families are satisfied.
    let missing: Vec<Family> = claim
        .spec
        .family
        .families()
        .iter()
        .copied()
        .filter(|f| !satisfied(*f, &holdings.held))
        .collect();
    let was_bound = matches!(
        claim.status.as_ref().and_then(|st| st.phase),
        Some(ClaimPhase::Bound | ClaimPhase::Lost)
    );

    let mut resolution = None;
    let mut bind: Vec<IPAddress> = Vec::new();
    let mut waiting = None;
    if missing.is_empty() {
        // All satisfied: the class is not consulted at all (§4.5).
    } else if was_bound {
        // §4.6: a degraded binding is surfaced, never silently replaced.
        waiting = Some((reason::ADDRESS_LOST, lost_message(&holdings, &missing)));
    } else {
        // §4.7
        let r = resolve_class(claim, s.classes);
        match &r {
            Resolution::Resolved(class) => {
                let m = matching::match_families(
                    claim,
                    class,
                    &missing,
                    s.pinned,
                    s.pinned_taken,
                    s.candidate,
                );
                // The stamp tells the driver to provision. It is written only in a pass
                // that matched nothing and waits for provisioning (SPEC §5.7): a pass that
                // binds a free address never invites a driver to create a second one.
                if m.needs_provisioning
                    && m.bind.is_empty()
                    && claim.annotations().get(PROVISIONER_ANNOTATION)
                        != Some(&class.spec.provisioner)
                {
                    metadata.provisioner = Some(class.spec.provisioner.clone());
                }
                if let Some((reason, _)) = m.waiting.first() {
                    let message = m
                        .waiting
                        .iter()
                        .map(|(_, m)| m.as_str())
                        .collect::<Vec<_>>()
                        .join("; ");
                    waiting = Some((*reason, message));
                }
                bind = m.bind;
            }
            Resolution::Failed { reason, message } => waiting = Some((reason, message.clone())),
        }
        resolution = Some(r);
    }

    for a in &bind {
        let name = a.name_any();
        plan.address_writes.push(AddressWrite::Bind {
            name: name.clone(),
            resource_version: a.metadata.resource_version.clone(),
            claim_ref: claim_ref_of(claim),
        });
        plan.events.push(PlannedEvent::normal(
            event::MATCHED,
            format!("matched IPAddress {name} ({})", a.spec.address),
        ));
    }
    if metadata.finalizers.is_some() || metadata.provisioner.is_some() {
        plan.metadata = Some(metadata);
    }

    // §4.8
    let mut addresses: Vec<&IPAddress> = holdings.held.clone();
    addresses.extend(bind.iter());
    addresses.sort_by_key(|a| a.name_any());
    let all_satisfied = claim
        .spec
        .family
        .families()
        .iter()
        .all(|f| satisfied(*f, &addresses));
    let found = status::Found {
        addresses,
        all_satisfied,
        was_bound,
        resolution: resolution.as_ref(),
        waiting,
        matched: !bind.is_empty(),
    };
    let (new_status, events) = status::status_and_events(claim, &found, &s.now);
    plan.status = new_status;
    plan.events.extend(events);
    plan
}

/// §4.5: an address of the family that is not `Lost` satisfies it.
fn satisfied(f: Family, set: &[&IPAddress]) -> bool {
    set.iter()
        .any(|a| family(a) == Some(f) && phase(a) != Some(AddressPhase::Lost))
}

/// §4.4: write the claim's uid into held pre-bindings that lack it.
fn complete_prebindings(claim: &IPAddressClaim, holdings: &Holdings<'_>) -> Vec<AddressWrite> {
    if claim.metadata.uid.is_none() {
        return Vec::new();
    }
    holdings
        .held
        .iter()
        .filter(|a| a.spec.claim_ref.as_ref().is_some_and(|r| r.uid.is_none()))
        .map(|a| AddressWrite::CompleteUid {
            name: a.name_any(),
            resource_version: a.metadata.resource_version.clone(),
            claim_ref: claim_ref_of(claim),
        })
        .collect()
}

/// §4.6: why a claim that was Bound is not any more.
fn lost_message(holdings: &Holdings<'_>, missing: &[Family]) -> String {
    let lost: Vec<String> = holdings
        .held
        .iter()
        .filter(|a| phase(a) == Some(AddressPhase::Lost))
        .map(|a| a.name_any())
        .collect();
    let deleting: Vec<String> = holdings.deleting.iter().map(|a| a.name_any()).collect();
    if !lost.is_empty() {
        format!("IPAddress {} is Lost", lost.join(", "))
    } else if !deleting.is_empty() {
        format!("IPAddress {} is being deleted", deleting.join(", "))
    } else {
        let families: Vec<&str> = missing.iter().map(|f| f.as_str()).collect();
        format!("no longer bound to an {} address", families.join(" and "))
    }
}

/// Whether `claim` is pinned to `a` (`spec.addressName`).
pub fn pinned_to(claim: &IPAddressClaim, a: &IPAddress) -> bool {
    pin_of(claim) == Some(a.name_any().as_str())
}
