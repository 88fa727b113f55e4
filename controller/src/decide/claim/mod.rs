//! Claim reconciliation (SPEC §4) and the reclaim flow (SPEC §6) as a pure function.

use std::collections::HashSet;
use std::sync::Arc;

use address_controller_api::family::{Family, family_of};
use address_controller_api::names::{
    self, CLAIM_FINALIZER, DEFAULT_CLASS_ANNOTATION, PROVISIONER_ANNOTATION, condition, event,
    reason,
};
use address_controller_api::{
    AddressPhase, ClaimAddress, ClaimPhase, ClaimRef, IPAddress, IPAddressClaim,
    IPAddressClaimStatus, IPAddressClass, ReclaimPolicy,
};
use kube::ResourceExt;

use super::{Now, PlannedEvent, belongs_to, set_condition, with_finalizer, without_finalizer};

/// What the claim reconciler sees.
pub struct ClaimSnapshot<'a> {
    pub claim: &'a IPAddressClaim,
    /// Every address in the cache.
    pub addresses: &'a [Arc<IPAddress>],
    /// Every class in the cache.
    pub classes: &'a [Arc<IPAddressClass>],
    /// Addresses other workers of this process are binding right now: never candidates.
    pub taken: &'a HashSet<String>,
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
}

/// The outcome of class resolution (SPEC §4.7).
#[derive(Debug, Clone)]
pub enum Resolution<'a> {
    Resolved(&'a IPAddressClass),
    Failed {
        reason: &'static str,
        message: String,
    },
}

/// The class a claim names: `spec.className`, else the sticky `status.className`.
fn named_class(claim: &IPAddressClaim) -> Option<&str> {
    claim
        .spec
        .class_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            claim
                .status
                .as_ref()
                .and_then(|s| s.class_name.as_deref())
                .filter(|n| !n.is_empty())
        })
}

/// Resolves the class of a claim: `spec.className`, else the sticky `status.className`,
/// else the single default class. Never guesses.
pub fn resolve_class<'a>(
    claim: &IPAddressClaim,
    classes: &'a [Arc<IPAddressClass>],
) -> Resolution<'a> {
    if let Some(name) = named_class(claim) {
        return match classes.iter().find(|c| c.name_any() == name) {
            Some(c) => Resolution::Resolved(c),
            None => Resolution::Failed {
                reason: reason::CLASS_NOT_FOUND,
                message: format!("IPAddressClass {name:?} does not exist"),
            },
        };
    }
    let defaults: Vec<&IPAddressClass> = classes
        .iter()
        .filter(|c| {
            names::annotation_is_true(c.metadata.annotations.as_ref(), DEFAULT_CLASS_ANNOTATION)
        })
        .map(Arc::as_ref)
        .collect();
    match defaults.as_slice() {
        [one] => Resolution::Resolved(one),
        [] => Resolution::Failed {
            reason: reason::NO_DEFAULT_CLASS,
            message: "the claim names no class and no IPAddressClass is marked as the default"
                .into(),
        },
        many => {
            let mut names: Vec<String> = many.iter().map(|c| c.name_any()).collect();
            names.sort();
            Resolution::Failed {
                reason: reason::MULTIPLE_DEFAULT_CLASSES,
                message: format!(
                    "several IPAddressClasses are marked as the default: {}",
                    names.join(", ")
                ),
            }
        }
    }
}

/// The family an address counts as, or `None` for an invalid address (never trusted).
fn address_family(a: &IPAddress) -> Option<Family> {
    family_of(&a.spec.address).ok()
}

fn phase(a: &IPAddress) -> Option<AddressPhase> {
    a.status.as_ref().and_then(|s| s.phase)
}

fn is_deleting<K: kube::Resource>(o: &K) -> bool {
    o.meta().deletion_timestamp.is_some()
}

/// Why a pinned address (`spec.addressName`) cannot be bound, or `None` when it can.
fn pin_problem(
    a: Option<&IPAddress>,
    pin: &str,
    claim: &IPAddressClaim,
    class: &str,
    family: Family,
) -> Option<String> {
    let Some(a) = a else {
        return Some(format!("IPAddress {pin:?} does not exist"));
    };
    if is_deleting(a) {
        return Some(format!("IPAddress {pin:?} is being deleted"));
    }
    if let Some(r) = &a.spec.claim_ref
        && !belongs_to(a, claim)
    {
        return Some(format!(
            "IPAddress {pin:?} is already bound to claim {}/{}",
            r.namespace, r.name
        ));
    }
    if let Some(p) = phase(a).filter(|p| p.is_driver_owned()) {
        return Some(format!("IPAddress {pin:?} is in phase {}", p.as_str()));
    }
    if a.spec.class_name != class {
        return Some(format!(
            "IPAddress {pin:?} belongs to class {:?}, not {class:?}",
            a.spec.class_name
        ));
    }
    match address_family(a) {
        None => Some(format!(
            "IPAddress {pin:?} has an invalid address {:?}",
            a.spec.address
        )),
        Some(f) if f != family => Some(format!(
            "IPAddress {pin:?} is {f}; the claim wants {family}"
        )),
        Some(_) => None,
    }
}

/// A free address of the class and family: unbound, `Available`, not being deleted, not
/// taken by another worker. Candidates are tried in name order.
fn is_candidate(a: &IPAddress, class: &str, family: Family, taken: &HashSet<String>) -> bool {
    a.spec.claim_ref.is_none()
        && a.spec.class_name == class
        && phase(a) == Some(AddressPhase::Available)
        && !is_deleting(a)
        && address_family(a) == Some(family)
        && !taken.contains(&a.name_any())
}

/// The address a claim is pinned to (`spec.addressName`; the schema refuses an empty one).
fn pin_of(claim: &IPAddressClaim) -> Option<&str> {
    claim.spec.address_name.as_deref()
}

/// Whether `claim` is pinned to `a` (`spec.addressName`).
pub fn pinned_to(claim: &IPAddressClaim, a: &IPAddress) -> bool {
    pin_of(claim) == Some(a.name_any().as_str())
}

/// Whether the free address `a` could ever satisfy `claim`: its pin, its named (or sticky)
/// class and its family allow it. A claim for which this is false can never bind `a`, so a
/// change of `a` need not wake it. Claims of the default class (nothing named) are kept:
/// which class is the default can change.
pub fn could_use(claim: &IPAddressClaim, a: &IPAddress) -> bool {
    if pin_of(claim).is_some() {
        return pinned_to(claim, a);
    }
    if named_class(claim).is_some_and(|n| n != a.spec.class_name) {
        return false;
    }
    address_family(a).is_some_and(|f| claim.spec.family.families().contains(&f))
}

fn claim_ref_of(claim: &IPAddressClaim) -> ClaimRef {
    ClaimRef {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        uid: claim.metadata.uid.clone(),
    }
}

/// Whether a controller owner reference makes this an auto-claim (SPEC §6, §7).
pub fn has_controller_owner(claim: &IPAddressClaim) -> bool {
    claim
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.controller == Some(true)))
}

/// Plans one pass over a claim.
pub fn plan_claim(s: &ClaimSnapshot<'_>) -> ClaimPlan {
    let claim = s.claim;
    let mut plan = ClaimPlan::default();
    let finalizers = claim.finalizers();

    // §4.3: the addresses bound or pre-bound to this claim, in name order.
    let mut collected: Vec<&IPAddress> = s
        .addresses
        .iter()
        .map(Arc::as_ref)
        .filter(|a| belongs_to(a, claim) && !is_deleting(*a))
        .collect();
    collected.sort_by_key(|a| a.name_any());

    // §4.1 / §6: reclaim behind the finalizer.
    if is_deleting(claim) {
        if let Some(remaining) = without_finalizer(finalizers, CLAIM_FINALIZER) {
            let owned = has_controller_owner(claim);
            for a in &collected {
                let name = a.name_any();
                if owned || a.spec.reclaim_policy == ReclaimPolicy::Delete {
                    plan.address_writes.push(AddressWrite::Delete {
                        name: name.clone(),
                        uid: a.metadata.uid.clone(),
                    });
                    let why = if owned {
                        "the claim is owned by a controller"
                    } else {
                        "reclaim policy Delete"
                    };
                    plan.events.push(PlannedEvent::normal(
                        event::ADDRESS_DELETED,
                        format!("deleting IPAddress {name} ({}): {why}", a.spec.address),
                    ));
                } else if phase(a) != Some(AddressPhase::Released) {
                    plan.address_writes.push(AddressWrite::Release {
                        name: name.clone(),
                        resource_version: a.metadata.resource_version.clone(),
                    });
                    plan.events.push(PlannedEvent::normal(
                        event::ADDRESS_RELEASED,
                        format!(
                            "IPAddress {name} ({}) is retained as Released",
                            a.spec.address
                        ),
                    ));
                }
            }
            plan.finalize = Some(remaining);
        }
        return plan;
    }

    // §4.2: the finalizer (the stamp joins this patch below when it is due too).
    let mut metadata = ClaimMetadata {
        finalizers: with_finalizer(finalizers, CLAIM_FINALIZER),
        provisioner: None,
    };

    // §4.4: complete pre-bindings.
    for a in &collected {
        if a.spec.claim_ref.as_ref().is_some_and(|r| r.uid.is_none())
            && claim.metadata.uid.is_some()
        {
            plan.address_writes.push(AddressWrite::CompleteUid {
                name: a.name_any(),
                resource_version: a.metadata.resource_version.clone(),
                claim_ref: claim_ref_of(claim),
            });
        }
    }

    // §4.5: which families are satisfied.
    let wanted = claim.spec.family.families();
    let satisfied = |f: Family, set: &[&IPAddress]| {
        set.iter()
            .any(|a| address_family(a) == Some(f) && phase(a) != Some(AddressPhase::Lost))
    };
    let missing: Vec<Family> = wanted
        .iter()
        .copied()
        .filter(|f| !satisfied(*f, &collected))
        .collect();
    let old_status = claim.status.clone().unwrap_or_default();
    let was_bound = matches!(old_status.phase, Some(ClaimPhase::Bound | ClaimPhase::Lost));

    let mut resolution: Option<Resolution<'_>> = None;
    let mut newly_bound: Vec<IPAddress> = Vec::new();
    // (reason, message) of the Bound condition when not all families are satisfied.
    let mut waiting: Option<(&'static str, String)> = None;

    if missing.is_empty() {
        // All satisfied: the class is not consulted at all (§4.5).
    } else if was_bound {
        // §4.6: a degraded binding is surfaced, never silently replaced.
        let lost: Vec<String> = collected
            .iter()
            .filter(|a| phase(a) == Some(AddressPhase::Lost))
            .map(|a| a.name_any())
            .collect();
        let deleting: Vec<String> = s
            .addresses
            .iter()
            .filter(|a| belongs_to(a, claim) && is_deleting(a.as_ref()))
            .map(|a| a.name_any())
            .collect();
        let message = if !lost.is_empty() {
            format!("IPAddress {} is Lost", lost.join(", "))
        } else if !deleting.is_empty() {
            format!("IPAddress {} is being deleted", deleting.join(", "))
        } else {
            let families: Vec<&str> = missing.iter().map(|f| f.as_str()).collect();
            format!("no longer bound to an {} address", families.join(" and "))
        };
        waiting = Some((reason::ADDRESS_LOST, message));
    } else {
        let r = resolve_class(claim, s.classes);
        match &r {
            Resolution::Resolved(class) => {
                let class_name = class.name_any();
                if claim.annotations().get(PROVISIONER_ANNOTATION) != Some(&class.spec.provisioner)
                {
                    metadata.provisioner = Some(class.spec.provisioner.clone());
                }
                let mut problems = Vec::new();
                for family in &missing {
                    match pin_of(claim) {
                        Some(pin) => {
                            let a = s
                                .addresses
                                .iter()
                                .find(|a| a.name_any() == pin)
                                .map(Arc::as_ref);
                            match pin_problem(a, pin, claim, &class_name, *family) {
                                Some(p) => problems.push((reason::WAITING_FOR_ADDRESS, p)),
                                None if s.taken.contains(pin) => problems.push((
                                    reason::WAITING_FOR_ADDRESS,
                                    format!("IPAddress {pin:?} is being bound by another claim"),
                                )),
                                None => newly_bound.extend(a.cloned()),
                            }
                        }
                        None => {
                            let best = s
                                .addresses
                                .iter()
                                .filter(|a| is_candidate(a, &class_name, *family, s.taken))
                                .min_by_key(|a| a.name_any());
                            match best {
                                Some(a) => newly_bound.push(a.as_ref().clone()),
                                None => problems.push((
                                    reason::WAITING_FOR_PROVISIONING,
                                    format!(
                                        "waiting for {} to provision an {family} address of class {class_name:?}",
                                        class.spec.provisioner
                                    ),
                                )),
                            }
                        }
                    }
                }
                if let Some((reason, _)) = problems.first() {
                    let message = problems
                        .iter()
                        .map(|(_, m)| m.as_str())
                        .collect::<Vec<_>>()
                        .join("; ");
                    waiting = Some((reason, message));
                }
            }
            Resolution::Failed { reason, message } => waiting = Some((reason, message.clone())),
        }
        resolution = Some(r);
    }

    for a in &newly_bound {
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

    // §4.8: status, recomputed.
    let mut bound_set: Vec<&IPAddress> = collected.clone();
    bound_set.extend(newly_bound.iter());
    bound_set.sort_by_key(|a| a.name_any());
    let all_satisfied = wanted.iter().all(|f| satisfied(*f, &bound_set));
    let phase = if all_satisfied {
        ClaimPhase::Bound
    } else if was_bound {
        ClaimPhase::Lost
    } else {
        ClaimPhase::Pending
    };
    let generation = claim.metadata.generation;
    let mut status = old_status.clone();
    status.phase = Some(phase);
    status.addresses = bound_set
        .iter()
        .map(|a| ClaimAddress {
            name: a.name_any(),
            address: a.spec.address.clone(),
        })
        .collect();
    match &resolution {
        Some(Resolution::Resolved(class)) => {
            status.class_name = Some(class.name_any());
            set_condition(
                &mut status.conditions,
                condition::CLASS_RESOLVED,
                true,
                reason::RESOLVED,
                format!("resolved to IPAddressClass {:?}", class.name_any()),
                generation,
                &s.now,
            );
        }
        Some(Resolution::Failed { reason, message }) => set_condition(
            &mut status.conditions,
            condition::CLASS_RESOLVED,
            false,
            reason,
            message.clone(),
            generation,
            &s.now,
        ),
        None => {}
    }
    let (bound_ok, bound_reason, bound_message) = if all_satisfied {
        let list = status
            .addresses
            .iter()
            .map(|a| a.address.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        (true, reason::BOUND, format!("bound to {list}"))
    } else {
        let (r, m) = waiting
            .clone()
            .unwrap_or((reason::WAITING_FOR_PROVISIONING, String::new()));
        (false, r, m)
    };
    set_condition(
        &mut status.conditions,
        condition::BOUND,
        bound_ok,
        bound_reason,
        bound_message.clone(),
        generation,
        &s.now,
    );

    // Events on transitions only, never on every pass of a steady state.
    if let Some(Resolution::Failed { reason, message }) = &resolution {
        let old_reason = old_status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::CLASS_RESOLVED)
            .map(|c| c.reason.as_str());
        if old_reason != Some(*reason) {
            plan.events
                .push(PlannedEvent::warning(reason, message.clone()));
        }
    }
    if old_status.phase != Some(phase) {
        match phase {
            ClaimPhase::Bound => plan
                .events
                .push(PlannedEvent::normal(reason::BOUND, bound_message)),
            ClaimPhase::Lost => plan
                .events
                .push(PlannedEvent::warning(reason::ADDRESS_LOST, bound_message)),
            ClaimPhase::Pending => {}
        }
    }

    if claim.status.as_ref() != Some(&status) {
        plan.status = Some(status);
    }
    plan
}
