//! The reclaim flow behind the claim finalizer (SPEC §6): an address a driver provisioned
//! for an auto-claim is deleted whatever its policy; every other address follows its own
//! policy — `Delete` deletes it, `Retain` keeps it as `Released` with its claimRef. The
//! finalizer goes last, after those writes succeeded.

use address_controller_api::names::{CLAIM_FINALIZER, event, released};
use address_controller_api::{AddressPhase, IPAddressClaim, ReclaimPolicy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::{AddressWrite, ClaimPlan};
use crate::decide::holdings::Holdings;
use crate::decide::{PlannedEvent, without_finalizer};

/// Plans the reclaim of a claim being deleted.
pub fn reclaim(claim: &IPAddressClaim, holdings: &Holdings<'_>, now: &Time) -> ClaimPlan {
    let mut plan = ClaimPlan::default();
    let Some(remaining) = without_finalizer(claim.finalizers(), CLAIM_FINALIZER) else {
        return plan;
    };
    let auto_claim = claim.auto_claim_owner().is_some();
    let mut all: Vec<_> = holdings
        .held
        .iter()
        .chain(&holdings.surplus)
        .chain(&holdings.released)
        .copied()
        .collect();
    all.sort_by_key(|a| a.name_any());
    for a in all {
        let name = a.name_any();
        // The admin's Retain is waived only for what a driver provisioned for this very
        // auto-claim: a tenant's own owner reference, or a static, reserved or recycled
        // address, never makes the core delete an address.
        let provisioned_for_auto_claim = auto_claim && a.provisioned_for(claim);
        if provisioned_for_auto_claim || a.spec.reclaim_policy == ReclaimPolicy::Delete {
            plan.address_writes.push(AddressWrite::Delete {
                name: name.clone(),
                uid: a.metadata.uid.clone(),
            });
            let why = if a.spec.reclaim_policy == ReclaimPolicy::Delete {
                "reclaim policy Delete"
            } else {
                "provisioned for the auto-claim of a deleted Service"
            };
            plan.events.push(PlannedEvent::normal(
                event::ADDRESS_DELETED,
                format!("deleting IPAddress {name} ({}): {why}", a.spec.address),
            ));
        } else if !a.is_released()
            && let Some(status) = crate::decide::address::status_write(
                a,
                AddressPhase::Released,
                Some((
                    now.clone(),
                    Some(
                        if holdings.is_surplus(a) {
                            released::SURPLUS
                        } else {
                            released::RECLAIMED
                        }
                        .to_string(),
                    ),
                )),
                true,
                now,
            )
        {
            plan.address_writes.push(AddressWrite::Release {
                name: name.clone(),
                resource_version: a.metadata.resource_version.clone(),
                status,
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
    plan
}
