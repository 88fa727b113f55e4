//! The health of an address of this driver's classes, one pass: the backend's word (`Lost`
//! and back), Services that show it without the ledger's word (`Conflict` and back), and
//! ledger entries whose Service is gone.

use address_controller_api::AddressPhase;
use address_controller_api::IPAddress;
use address_controller_api::names::driver as reason;
use address_controller_runtime::events::PlannedEvent;
use kube::ResourceExt;

use crate::driver::Presence;

/// What a pass over one address of this driver's classes sees.
pub struct HealthSnapshot<'a> {
    pub address: &'a IPAddress,
    /// The backend's word on it (`Unknown` when the class's parameters are unusable).
    pub presence: Presence,
    /// Services that show the address.
    pub shown_by: &'a [String],
    /// The holders the ledger lists whose Service is gone.
    pub gone_holders: &'a [String],
}

/// What one pass over an address does (driver-owned state only).
#[derive(Debug, Default, PartialEq)]
pub struct HealthPlan {
    /// A phase to write (`Conflict`, `Lost`, or the resting phase that ends them), with
    /// the condition that says why.
    pub phase: Option<(AddressPhase, &'static str, bool, String)>,
    /// Take these holders (Service keys) off the ledger: their Services are gone.
    pub clear_holders: Vec<String>,
    pub events: Vec<PlannedEvent>,
    /// Warning events on the Services that hold it without the ledger's word.
    pub offenders: Vec<(String, PlannedEvent)>,
}

/// Plans one pass over an address: Lost, Conflict, and a dangling `associatedTo`.
pub fn plan_health(s: &HealthSnapshot<'_>) -> HealthPlan {
    let a = s.address;
    let mut plan = HealthPlan::default();
    if a.is_deleting() {
        return plan;
    }
    plan.clear_holders = s.gone_holders.to_vec();
    // Lost: the backend's word wins over everything else.
    if lost_or_back(a, &s.presence, &mut plan) {
        return plan;
    }
    conflict_or_back(a, s.shown_by, &mut plan);
    plan
}

/// Lost by the backend's word, or back from it: whether the backend's word decided the
/// pass (nothing else is judged then).
fn lost_or_back(a: &IPAddress, presence: &Presence, plan: &mut HealthPlan) -> bool {
    let name = a.name_any();
    match (presence, a.phase()) {
        (Presence::Missing(why), p) if p != Some(AddressPhase::Lost) => {
            plan.phase = Some((AddressPhase::Lost, reason::LOST, true, why.clone()));
            plan.events.push(PlannedEvent::warning(
                reason::ADDRESS_LOST,
                format!("IPAddress {name} ({}) is Lost: {why}", a.spec.address),
            ));
            true
        }
        (Presence::Missing(_), _) => true,
        (Presence::Present, Some(AddressPhase::Lost)) => {
            let to = a.resting_phase();
            plan.phase = Some((
                to,
                reason::LOST,
                false,
                "the backend has the address again".into(),
            ));
            plan.events.push(PlannedEvent::normal(
                reason::RECOVERED,
                format!(
                    "IPAddress {name} ({}) is back; {}",
                    a.spec.address,
                    to.as_str()
                ),
            ));
            true
        }
        (_, Some(AddressPhase::Lost)) => true,
        _ => false,
    }
}

/// Conflict: Services (SHOWN_BY) that show a claimed address without the ledger's word;
/// or back from it once none does.
fn conflict_or_back(a: &IPAddress, shown_by: &[String], plan: &mut HealthPlan) {
    let name = a.name_any();
    let holders = a.holder_services();
    let phase = a.phase();
    let claimed = a.spec.claim_ref.is_some();
    let offenders: Vec<&String> = shown_by
        .iter()
        .filter(|svc| !holders.contains(svc))
        .collect();
    let claim = a
        .spec
        .claim_ref
        .as_ref()
        .map(|r| r.key())
        .unwrap_or_default();
    if claimed && !offenders.is_empty() {
        if phase != Some(AddressPhase::Conflict) {
            let list: Vec<&str> = offenders.iter().map(|s| s.as_str()).collect();
            let why = format!(
                "Service {} holds {}, which belongs to IPAddressClaim {claim}{}",
                list.join(", "),
                a.spec.address,
                if holders.is_empty() {
                    String::new()
                } else {
                    format!(" (held by Service {})", holders.join(", "))
                }
            );
            plan.phase = Some((AddressPhase::Conflict, reason::CONFLICT, true, why.clone()));
            plan.events
                .push(PlannedEvent::warning(reason::CONFLICT, why));
            for o in offenders {
                plan.offenders.push((
                    o.clone(),
                    PlannedEvent::warning(
                        reason::CONFLICT,
                        format!(
                            "{} is claimed by IPAddressClaim {claim} and not given to this Service; remove it from the Service",
                            a.spec.address
                        ),
                    ),
                ));
            }
        }
    } else if phase == Some(AddressPhase::Conflict) {
        let to = a.resting_phase();
        plan.phase = Some((
            to,
            reason::CONFLICT,
            false,
            "no Service holds the address without the ledger's word".into(),
        ));
        plan.events.push(PlannedEvent::normal(
            reason::RECOVERED,
            format!(
                "IPAddress {name} ({}) is no longer in conflict; {}",
                a.spec.address,
                to.as_str()
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::decide::fixtures::*;
    use serde_json::json;

    fn health(a: &IPAddress, presence: Presence, shown_by: &[&str], exists: bool) -> HealthPlan {
        let shown_by: Vec<String> = shown_by.iter().map(|s| s.to_string()).collect();
        let gone = if exists { vec![] } else { a.holder_services() };
        plan_health(&HealthSnapshot {
            address: a,
            presence,
            shown_by: &shown_by,
            gone_holders: &gone,
        })
    }

    #[test]
    fn a_thief_makes_a_claimed_address_conflict_until_it_lets_go() {
        let x = addr("x", "192.0.2.1", at("web"));
        // The rightful Service: no conflict.
        assert_eq!(
            health(&x, Presence::Present, &["t/web"], true),
            HealthPlan::default()
        );
        // Someone else's Service shows it — whatever record of the kit's it carries (a
        // tenant may forge one on its own Service): the ledger alone says who may.
        let p = health(&x, Presence::Present, &["t/web", "u/thief"], true);
        let (phase, cond, on, why) = p.phase.clone().unwrap();
        assert_eq!(
            (phase, cond, on),
            (AddressPhase::Conflict, reason::CONFLICT, true)
        );
        assert!(why.contains("u/thief") && why.contains("t/c"), "{why}");
        assert_eq!(p.events[0].reason, reason::CONFLICT);
        assert_eq!(p.offenders[0].0, "u/thief");
        // Already Conflict: said once.
        let c = addr("x", "192.0.2.1", {
            let mut v = at("web");
            merge(&mut v, json!({"status": {"phase": "Conflict"}}));
            v
        });
        assert_eq!(
            health(&c, Presence::Present, &["u/thief"], true),
            HealthPlan::default()
        );
        // The thief let go: the phase the core would compute.
        let p = health(&c, Presence::Present, &["t/web"], true);
        assert_eq!(p.phase.unwrap().0, AddressPhase::Bound);
        // An unclaimed address is nobody's to defend.
        let free = addr(
            "f",
            "192.0.2.9",
            json!({"spec": {"claimRef": null}, "status": {"phase": "Available"}}),
        );
        assert_eq!(
            health(&free, Presence::Present, &["u/thief"], false),
            HealthPlan::default()
        );
        // A Released one is: and it goes back to Released.
        let released = addr(
            "r",
            "192.0.2.8",
            json!({"status": {"phase": "Conflict",
            "releasedFrom": {"namespace": "t", "name": "c", "uid": "u"}}}),
        );
        assert_eq!(
            health(&released, Presence::Present, &[], false)
                .phase
                .unwrap()
                .0,
            AddressPhase::Released
        );
    }

    #[test]
    fn the_backends_word_makes_an_address_lost_and_back() {
        let x = addr("x", "192.0.2.1", json!({}));
        let p = health(
            &x,
            Presence::Missing("outside 198.51.100.0/24".into()),
            &[],
            false,
        );
        assert_eq!(p.phase.clone().unwrap().0, AddressPhase::Lost);
        assert_eq!(p.events[0].reason, reason::ADDRESS_LOST);
        let lost = addr("x", "192.0.2.1", json!({"status": {"phase": "Lost"}}));
        assert_eq!(
            health(&lost, Presence::Missing("x".into()), &["u/thief"], false),
            HealthPlan::default()
        );
        assert_eq!(
            health(&lost, Presence::Unknown, &[], false),
            HealthPlan::default()
        );
        let p = health(&lost, Presence::Present, &[], false);
        assert_eq!(p.phase.unwrap().0, AddressPhase::Bound);
        assert_eq!(p.events[0].reason, reason::RECOVERED);
    }

    #[test]
    fn an_association_to_a_gone_service_is_cleared() {
        let x = addr("x", "192.0.2.1", at("web"));
        assert_eq!(
            health(&x, Presence::Present, &[], false).clear_holders,
            ["t/web"]
        );
        assert!(
            health(&x, Presence::Present, &[], true)
                .clear_holders
                .is_empty()
        );
    }
}
