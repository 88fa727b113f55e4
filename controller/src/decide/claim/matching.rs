//! Matching (SPEC §4.7): per missing family, the pinned address alone (`spec.addressName`)
//! or the lowest-named free address of the resolved class; none → wait for the driver.

use std::sync::Arc;

use address_controller_api::family::Family;
use address_controller_api::names::{event, reason};
use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use kube::ResourceExt;

use crate::decide::PlannedEvent;

/// The address a claim is pinned to (`spec.addressName`; the schema refuses an empty one).
pub fn pin_of(claim: &IPAddressClaim) -> Option<&str> {
    claim.spec.address_name.as_deref()
}

/// What a tenant reads about a pinned address that is not its to have: the same words
/// whether the address does not exist, is another namespace's claim's, or is being bound by
/// another claim — a tenant learns nothing of other namespaces' holdings by pinning names.
pub fn not_available(pin: &str) -> String {
    format!("IPAddress {pin:?} does not exist or is not available to this claim")
}

/// The detail of a pinned address another claim holds, for a Warning event on the address
/// (cluster-scoped: tenants cannot read it), or `None` when it is not another's.
pub fn held_by_another(a: &IPAddress, claim: &IPAddressClaim) -> Option<String> {
    let r = a.spec.claim_ref.as_ref().filter(|_| !a.belongs_to(claim))?;
    Some(format!(
        "claim {} pins this address (spec.addressName), which is bound to claim {}/{}",
        claim.key(),
        r.namespace,
        r.name
    ))
}

/// Why a pinned address cannot be bound, or `None` when it can. What is about another
/// claim is said as [`not_available`]; the rest (class, family, phase) is about an address
/// offered to this claim.
pub fn pin_problem(
    a: Option<&IPAddress>,
    pin: &str,
    claim: &IPAddressClaim,
    class: &str,
    wanted: Family,
) -> Option<String> {
    let Some(a) = a else {
        return Some(not_available(pin));
    };
    if let Some(r) = a.spec.claim_ref.as_ref().filter(|_| !a.belongs_to(claim)) {
        // A claim of the tenant's own namespace may be named (the tenant reads its claims
        // anyway); another namespace's never.
        return Some(
            if Some(r.namespace.as_str()) == claim.metadata.namespace.as_deref() {
                format!(
                    "IPAddress {pin:?} is already bound to claim {}/{}",
                    r.namespace, r.name
                )
            } else {
                not_available(pin)
            },
        );
    }
    if a.is_deleting() {
        return Some(format!("IPAddress {pin:?} is being deleted"));
    }
    if let Some(p) = a.phase().filter(|p| p.is_driver_owned()) {
        return Some(format!("IPAddress {pin:?} is in phase {}", p.as_str()));
    }
    if a.spec.class_name != class {
        return Some(format!(
            "IPAddress {pin:?} belongs to class {:?}, not {class:?}",
            a.spec.class_name
        ));
    }
    match a.family() {
        None => Some(format!(
            "IPAddress {pin:?} has an invalid address {:?}",
            a.spec.address
        )),
        Some(f) if f != wanted => Some(format!(
            "IPAddress {pin:?} is {f}; the claim wants {wanted}"
        )),
        Some(_) => None,
    }
}

/// What matching found for the missing families.
#[derive(Debug, Default)]
pub struct Matches {
    /// Free (or pinned) addresses to bind now.
    pub bind: Vec<IPAddress>,
    /// (reason, message) per family that cannot be matched now.
    pub waiting: Vec<(&'static str, String)>,
    /// Some family waits for the driver: no candidate exists at all.
    pub needs_provisioning: bool,
    /// The families that wait for the driver.
    pub provision: Vec<Family>,
    /// Warnings for the pinned address (name, event): what the claim may not read.
    pub address_events: Vec<(String, PlannedEvent)>,
}

/// Matches every missing family of `claim` in `class`.
pub fn match_families(
    claim: &IPAddressClaim,
    class: &IPAddressClass,
    missing: &[Family],
    pinned: Option<&IPAddress>,
    pinned_taken: bool,
    candidate: &dyn Fn(&str, Family) -> Option<Arc<IPAddress>>,
) -> Matches {
    let class_name = class.name_any();
    let mut m = Matches::default();
    for f in missing {
        match pin_of(claim) {
            Some(pin) => match pin_problem(pinned, pin, claim, &class_name, *f) {
                Some(p) => {
                    if let Some(detail) = pinned.and_then(|a| held_by_another(a, claim))
                        && m.address_events.is_empty()
                    {
                        m.address_events.push((
                            pin.to_string(),
                            PlannedEvent::warning(event::PIN_REFUSED, detail),
                        ));
                    }
                    m.waiting.push((reason::WAITING_FOR_ADDRESS, p))
                }
                None if pinned_taken => m
                    .waiting
                    .push((reason::WAITING_FOR_ADDRESS, not_available(pin))),
                None => m.bind.extend(pinned.cloned()),
            },
            None => match candidate(&class_name, *f) {
                Some(a) => m.bind.push(a.as_ref().clone()),
                None => {
                    m.needs_provisioning = true;
                    m.provision.push(*f);
                    m.waiting.push((
                        reason::WAITING_FOR_PROVISIONING,
                        format!(
                            "waiting for {} to provision an {f} address of class {class_name:?}",
                            class.spec.provisioner
                        ),
                    ));
                }
            },
        }
    }
    m
}
