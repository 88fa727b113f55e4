//! The reclaim flow behind the claim finalizer (SPEC §6): every address of the claim is
//! deleted when the claim is an auto-claim (controller owner reference) or the address says
//! `Delete`; otherwise it is retained as `Released` with its claimRef kept. The finalizer
//! goes last, after those writes succeeded.

use address_controller_api::names::{CLAIM_FINALIZER, event, released};
use address_controller_api::{IPAddressClaim, ReclaimPolicy};
use kube::ResourceExt;

use super::{AddressWrite, ClaimPlan};
use crate::decide::holdings::Holdings;
use crate::decide::{PlannedEvent, without_finalizer};

/// Whether a controller owner reference makes this an auto-claim (SPEC §6, §7).
pub fn has_controller_owner(claim: &IPAddressClaim) -> bool {
    claim
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.controller == Some(true)))
}

/// Plans the reclaim of a claim being deleted.
pub fn reclaim(claim: &IPAddressClaim, holdings: &Holdings<'_>) -> ClaimPlan {
    let mut plan = ClaimPlan::default();
    let Some(remaining) = without_finalizer(claim.finalizers(), CLAIM_FINALIZER) else {
        return plan;
    };
    let owned = has_controller_owner(claim);
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
        } else if !a.is_released() {
            plan.address_writes.push(AddressWrite::Release {
                name: name.clone(),
                resource_version: a.metadata.resource_version.clone(),
                released_from: a.spec.claim_ref.clone(),
                reason: if holdings.is_surplus(a) {
                    released::SURPLUS
                } else {
                    released::RECLAIMED
                },
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
