//! The claim's status, recomputed on every pass (SPEC §4.8), and the events of its
//! transitions — never on every pass of a steady state.

use address_controller_api::names::{condition, event, reason};
use address_controller_api::{
    ClaimAddress, ClaimPhase, ClaimServices, IPAddress, IPAddressClaim, IPAddressClaimStatus,
};
use kube::ResourceExt;

use super::resolve::Resolution;
use crate::decide::{Now, PlannedEvent, set_condition};

/// What the earlier steps found.
pub struct Found<'a, 'c> {
    /// Held plus newly bound addresses, in name order.
    pub addresses: Vec<&'a IPAddress>,
    pub all_satisfied: bool,
    pub was_bound: bool,
    pub resolution: Option<&'a Resolution<'c>>,
    /// (reason, message) of the Bound condition when not all families are satisfied.
    pub waiting: Option<(&'static str, String)>,
    /// This pass binds free addresses (each announced by a `Matched` event).
    pub matched: bool,
    /// The Services naming the claim, counted.
    pub services: Option<ClaimServices>,
}

/// The new status (when it differs from the observed one) and the transition events.
pub fn status_and_events(
    claim: &IPAddressClaim,
    found: &Found<'_, '_>,
    now: &Now,
) -> (Option<IPAddressClaimStatus>, Vec<PlannedEvent>) {
    let old = claim.status.clone().unwrap_or_default();
    let phase = if found.all_satisfied {
        ClaimPhase::Bound
    } else if found.was_bound {
        ClaimPhase::Lost
    } else {
        ClaimPhase::Pending
    };
    let generation = claim.metadata.generation;
    let mut status = old.clone();
    status.phase = Some(phase);
    status.addresses = found
        .addresses
        .iter()
        .map(|a| ClaimAddress {
            name: a.name_any(),
            address: a.spec.address.clone(),
        })
        .collect();
    status.services = found.services;
    match found.resolution {
        Some(Resolution::Resolved(class)) => {
            status.class_name = Some(class.name_any());
            set_condition(
                &mut status.conditions,
                condition::CLASS_RESOLVED,
                true,
                reason::RESOLVED,
                format!("resolved to IPAddressClass {:?}", class.name_any()),
                generation,
                now,
            );
        }
        Some(Resolution::Failed { reason, message }) => set_condition(
            &mut status.conditions,
            condition::CLASS_RESOLVED,
            false,
            reason,
            message.clone(),
            generation,
            now,
        ),
        None => {}
    }
    let (bound_ok, bound_reason, bound_message) = if found.all_satisfied {
        let list = status
            .addresses
            .iter()
            .map(|a| a.address.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        (true, reason::BOUND, format!("bound to {list}"))
    } else {
        let (r, m) = found
            .waiting
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
        now,
    );

    let events = transition_events(&old, found, phase, bound_reason, bound_message);
    let status = (claim.status.as_ref() != Some(&status)).then_some(status);
    (status, events)
}

/// The events of the pass's transition from OLD: a class that fails to resolve (once per
/// reason), a refusal for an entitlement (§13: once, when it starts or changes reason),
/// Bound (unless the pass's `Matched` said it) and Lost.
fn transition_events(
    old: &IPAddressClaimStatus,
    found: &Found<'_, '_>,
    phase: ClaimPhase,
    bound_reason: &'static str,
    bound_message: String,
) -> Vec<PlannedEvent> {
    let mut events = Vec::new();
    if let Some(Resolution::Failed { reason, message }) = found.resolution {
        let old_reason = old
            .conditions
            .iter()
            .find(|c| c.type_ == condition::CLASS_RESOLVED)
            .map(|c| c.reason.as_str());
        if old_reason != Some(*reason) {
            events.push(PlannedEvent::warning(reason, message.clone()));
        }
    }
    // §13: a refusal for an entitlement is said once, when it starts or changes reason.
    let old_bound_reason = old
        .conditions
        .iter()
        .find(|c| c.type_ == condition::BOUND)
        .map(|c| c.reason.as_str());
    if !found.all_satisfied
        && (bound_reason == reason::QUOTA_EXCEEDED
            || bound_reason == reason::NAMESPACE_NOT_ADMITTED)
        && old_bound_reason != Some(bound_reason)
    {
        events.push(PlannedEvent::warning(bound_reason, bound_message.clone()));
    }
    if old.phase != Some(phase) {
        match phase {
            // A pass that matched free addresses already said so (`Matched`): one event
            // per bind.
            ClaimPhase::Bound if !found.matched => {
                events.push(PlannedEvent::normal(event::BOUND, bound_message))
            }
            ClaimPhase::Lost => {
                events.push(PlannedEvent::warning(reason::ADDRESS_LOST, bound_message))
            }
            _ => {}
        }
    }
    events
}
