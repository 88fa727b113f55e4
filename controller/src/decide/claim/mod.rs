//! Claim reconciliation (SPEC §4) and the reclaim flow (SPEC §6) as a pure function: a
//! pipeline of named steps, one per SPEC section — [`reclaim`], the finalizer,
//! pre-binding completion, satisfaction and loss, [`resolve`] and [`matching`],
//! [`status`].

pub mod matching;
pub mod reclaim;
pub mod resolve;
pub mod status;

use std::collections::BTreeMap;
use std::sync::Arc;

use address_controller_api::entitlement::{QuotaLimits, Usage};
use address_controller_api::family::{Family, family_of};
use address_controller_api::names::{
    CLAIM_FINALIZER, PROVISIONER_ANNOTATION, condition, event, reason,
};
use address_controller_api::{
    AddressPhase, ClaimPhase, ClaimRef, ClaimServices, IPAddress, IPAddressClaim,
    IPAddressClaimStatus, IPAddressClass,
};
use kube::ResourceExt;

use super::holdings::Holdings;
use super::{Now, PlannedEvent, with_finalizer};
pub use matching::pin_of;
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
    /// An address by name (what the claim listed before, when it no longer names it: the
    /// reason a claim is Lost names where its address went).
    pub address: &'a dyn Fn(&str) -> Option<Arc<IPAddress>>,
    /// Every class.
    pub classes: &'a [Arc<IPAddressClass>],
    /// The labels of the claim's namespace (`None`: not known).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The limits on a class in the claim's namespace, with the usage there not counting
    /// what this claim is invited to or taking; `None`: no quota limits the class.
    pub quota: &'a dyn Fn(&str) -> Option<(QuotaLimits, Usage)>,
    /// The Services naming the claim, counted (`None`: none names it).
    pub services: Option<ClaimServices>,
    pub now: Now,
}

/// The quota a plan takes before its writes (SPEC §13): the families it binds or invites
/// a driver to provision, checked again against the limits it was planned with.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaTake {
    pub class: String,
    pub families: Vec<Family>,
    pub limits: QuotaLimits,
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
    /// Retain on reclaim: phase `Released` with `releasedAt`, recording the binding
    /// released (`releasedFrom`, the claimRef the plan saw) and closing its holding in the
    /// history at the same instant — the address pass's own status write, so the two never
    /// disagree (SPEC §6).
    Release {
        name: String,
        resource_version: Option<String>,
        status: crate::decide::address::AddressStatusWrite,
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
    /// Events on addresses (by name), published once per episode: what the claim's owner
    /// may not read (SPEC §9's tenants read claims, admins read addresses).
    pub address_events: Vec<(String, PlannedEvent)>,
    /// Taken from the namespace's quota before any write.
    pub quota_take: Option<QuotaTake>,
}

impl ClaimPlan {
    pub fn is_empty(&self) -> bool {
        self.metadata.is_none()
            && self.address_writes.is_empty()
            && self.status.is_none()
            && self.finalize.is_none()
            && self.events.is_empty()
            && self.address_events.is_empty()
            && self.quota_take.is_none()
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
    if claim.is_deleting() {
        return reclaim::reclaim(claim, &holdings, &s.now);
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
    let missing = claim.families_missing(|f| satisfied(f, &holdings.held));
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
        waiting = Some((
            reason::ADDRESS_LOST,
            lost_message(claim, &holdings, &missing, s.address),
        ));
    } else {
        // §4.7
        let r = resolve_class(claim, s.classes);
        match &r {
            Resolution::Resolved(class) => {
                let (b, w) = in_class(s, class, &missing, &mut plan, &mut metadata);
                bind = b;
                waiting = w;
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
            claim_ref: claim.claim_ref(),
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
        services: s.services,
    };
    let (new_status, events) = status::status_and_events(claim, &found, &s.now);
    plan.status = new_status;
    plan.events.extend(events);
    plan
}

/// §4.7 within the resolved class: the §13 gate (namespace, then quota) before any
/// matching — a refused claim neither binds nor invites a driver — then the matching, the
/// provisioner stamp (written only in a pass that matched nothing and waits for
/// provisioning, SPEC §5.7: a pass that binds a free address never invites a driver to
/// create a second one) and the quota the plan takes. The addresses to bind, and why the
/// claim waits.
fn in_class(
    s: &ClaimSnapshot<'_>,
    class: &IPAddressClass,
    missing: &[Family],
    plan: &mut ClaimPlan,
    metadata: &mut ClaimMetadata,
) -> (Vec<IPAddress>, Option<(&'static str, String)>) {
    let claim = s.claim;
    let ns = claim.namespace().unwrap_or_default();
    if let Some(why) = class.refuses_namespace(&ns, s.namespace_labels) {
        return (Vec::new(), Some((reason::NAMESPACE_NOT_ADMITTED, why)));
    }
    let class_name = class.name_any();
    let standing = (s.quota)(&class_name);
    if let Some((limits, used)) = &standing
        && let Err(why) = limits.admit(&class_name, used, missing)
    {
        return (Vec::new(), Some((reason::QUOTA_EXCEEDED, why)));
    }
    let m = matching::match_families(claim, class, missing, s.pinned, s.pinned_taken, s.candidate);
    if m.needs_provisioning
        && m.bind.is_empty()
        && claim.annotations().get(PROVISIONER_ANNOTATION) != Some(&class.spec.provisioner)
    {
        metadata.provisioner = Some(class.spec.provisioner.clone());
    }
    let waiting = m.waiting.first().map(|(reason, _)| {
        let message = m
            .waiting
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        (*reason, message)
    });
    if let Some((limits, _)) = standing {
        let mut families: Vec<Family> = m.bind.iter().filter_map(IPAddress::family).collect();
        families.extend(m.provision.iter().copied());
        if !families.is_empty() {
            plan.quota_take = Some(QuotaTake {
                class: class_name,
                families,
                limits,
            });
        }
    }
    plan.address_events = m.address_events;
    (m.bind, waiting)
}

/// §4.5: an address of the family that is not `Lost` satisfies it.
fn satisfied(f: Family, set: &[&IPAddress]) -> bool {
    set.iter()
        .any(|a| a.family() == Some(f) && a.phase() != Some(AddressPhase::Lost))
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
            claim_ref: claim.claim_ref(),
        })
        .collect()
}

/// §4.6: why a claim that was Bound is not any more — per missing family, the address it
/// held and what became of it, each part starting `IPAddress <name>` (the invariant checker
/// reads the names). Once said, the reason stays while nothing new is known (no write on
/// every pass of a steady Lost).
fn lost_message(
    claim: &IPAddressClaim,
    holdings: &Holdings<'_>,
    missing: &[Family],
    address: &dyn Fn(&str) -> Option<Arc<IPAddress>>,
) -> String {
    let status = claim.status.as_ref();
    let mut parts: Vec<String> = Vec::new();
    for f in missing {
        let of_family = |a: &&&IPAddress| a.family() == Some(*f);
        if let Some(a) = holdings.held.iter().find(of_family) {
            parts.push(format!("IPAddress {} is Lost", a.name_any()));
        } else if let Some(a) = holdings.deleting.iter().find(of_family) {
            parts.push(format!("IPAddress {} is being deleted", a.name_any()));
        } else if let Some(l) = status.and_then(|s| {
            s.addresses
                .iter()
                .find(|l| family_of(&l.address).ok() == Some(*f))
        }) {
            let what = match address(&l.name) {
                None => "no longer exists".to_string(),
                Some(a) => match &a.spec.claim_ref {
                    Some(r) if !r.names(claim) => format!("now names claim {}", r.key()),
                    Some(_) if a.is_released() => "was released".to_string(),
                    Some(_) => "is bound to an earlier claim of this name".to_string(),
                    None => "no longer names this claim".to_string(),
                },
            };
            parts.push(format!("IPAddress {} ({}) {what}", l.name, l.address));
        }
    }
    if parts.is_empty() {
        // Said before, on the pass that saw the address go: keep saying it.
        if let Some(c) = status
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::BOUND))
            .filter(|c| c.reason == reason::ADDRESS_LOST)
        {
            return c.message.clone();
        }
        let families: Vec<&str> = missing.iter().map(|f| f.as_str()).collect();
        return format!("no longer bound to an {} address", families.join(" and "));
    }
    parts.join("; ")
}

/// Whether `claim` is pinned to `a` (`spec.addressName`).
pub fn pinned_to(claim: &IPAddressClaim, a: &IPAddress) -> bool {
    pin_of(claim) == Some(a.name_any().as_str())
}
