//! A claim the driver serves, one pass: create an address per missing family from the
//! driver's allocations (a Dual claim gets both or neither), or say why not — bad
//! parameters, exhaustion (recorded so that a freed address wakes the claim), a backend
//! that failed. The allocations are read in the snapshot step (`runner::claim::snapshot`:
//! the driver's `allocate` is async); deciding on them is pure.

use std::sync::Arc;

use address_controller_api::names::driver as events;
use address_controller_api::{Family, IPAddress, IPAddressClaim, IPAddressClass, IPAddressSpec};
use address_controller_runtime::events::PlannedEvent;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use crate::driver::{AllocateError, Allocation};

/// What a pass over a claim read.
#[derive(Debug)]
pub enum ClaimSnapshot {
    /// Not this driver's to serve now (not invited, not of its classes), or served.
    NotServed,
    /// The class's parameters are not parsed yet.
    ParametersNotRead,
    /// The class's parameters are unusable, and why.
    InvalidParameters {
        class: Arc<IPAddressClass>,
        why: String,
    },
    /// The driver's answer for each missing family, in order (the last one `Failed` when
    /// the backend failed: nothing after it was asked).
    Allocated {
        class: Arc<IPAddressClass>,
        allocated: Vec<(Family, Result<Allocation, AllocateError>)>,
    },
}

#[derive(Debug)]
pub enum ClaimPlan {
    /// Not this driver's to serve now, or served: the claim's notes settle.
    Nothing,
    /// The class's parameters are not parsed yet: nothing to say, nothing to do.
    Wait,
    /// Tell the claim why it gets nothing (bad parameters; exhaustion, recorded against
    /// `exhausted_in` so a freed address wakes it) and wait.
    Refuse {
        event: PlannedEvent,
        exhausted_in: Option<String>,
    },
    /// The backend failed: tell the claim, and retry.
    Failed { message: String },
    /// Create one address per missing family (a Dual claim gets both or neither).
    Create {
        class: Arc<IPAddressClass>,
        chosen: Vec<(Family, Allocation)>,
    },
}

/// Decides a pass over a claim from what it read.
pub fn plan_claim(s: ClaimSnapshot) -> ClaimPlan {
    let (class, allocated) = match s {
        ClaimSnapshot::NotServed => return ClaimPlan::Nothing,
        ClaimSnapshot::ParametersNotRead => return ClaimPlan::Wait,
        ClaimSnapshot::InvalidParameters { class, why } => {
            return ClaimPlan::Refuse {
                event: PlannedEvent::warning(
                    events::INVALID_CLASS_PARAMETERS,
                    format!(
                        "class {:?} cannot be allocated from: {why}",
                        class.name_any()
                    ),
                ),
                exhausted_in: None,
            };
        }
        ClaimSnapshot::Allocated { class, allocated } => (class, allocated),
    };
    let mut chosen: Vec<(Family, Allocation)> = Vec::new();
    let mut exhausted: Vec<Family> = Vec::new();
    for (f, result) in allocated {
        match result {
            Ok(a) => chosen.push((f, a)),
            Err(AllocateError::Exhausted) => exhausted.push(f),
            Err(AllocateError::Failed(message)) => return ClaimPlan::Failed { message },
        }
    }
    if !exhausted.is_empty() {
        let families: Vec<&str> = exhausted.iter().map(|f| f.as_str()).collect();
        let class_name = class.name_any();
        return ClaimPlan::Refuse {
            event: PlannedEvent::warning(
                events::EXHAUSTED_EVENT,
                format!(
                    "no free {} address left in class {class_name:?}; waiting for one to be freed",
                    families.join(" and ")
                ),
            ),
            exhausted_in: Some(class_name),
        };
    }
    ClaimPlan::Create { class, chosen }
}

/// The IPAddress a driver creates for an allocation (SPEC §8): named `name`, pre-bound to
/// the claim with its uid, of the claim's class with the class's reclaim policy, the
/// allocation's source, marked as provisioned by `provisioner`, with the driver's finalizer
/// if it has one.
pub(crate) fn provisioned(
    name: &str,
    a: &Allocation,
    class: &IPAddressClass,
    claim: &IPAddressClaim,
    provisioner: &str,
    finalizer: Option<&str>,
) -> IPAddress {
    IPAddress {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            finalizers: finalizer.map(|f| vec![f.to_string()]),
            annotations: Some(std::collections::BTreeMap::from([(
                address_controller_api::names::PROVISIONED_BY_ANNOTATION.to_string(),
                provisioner.to_string(),
            )])),
            ..Default::default()
        },
        spec: IPAddressSpec {
            address: a.address.to_string(),
            class_name: class.name_any(),
            reclaim_policy: class.spec.reclaim_policy,
            claim_ref: Some(claim.claim_ref()),
            source: a.source.clone(),
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use address_controller_api::AddressSource;

    fn class() -> Arc<IPAddressClass> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "pub"}, "spec": {"provisioner": "drv"}}))
            .unwrap(),
        )
    }

    fn at(ip: &str) -> Result<Allocation, AllocateError> {
        Ok(Allocation {
            address: ip.parse().unwrap(),
            source: AddressSource::from_class(),
            name: None,
        })
    }

    fn kind(p: &ClaimPlan) -> String {
        match p {
            ClaimPlan::Nothing => "nothing".into(),
            ClaimPlan::Wait => "wait".into(),
            ClaimPlan::Refuse {
                event,
                exhausted_in,
            } => format!("refuse {} {exhausted_in:?}", event.reason),
            ClaimPlan::Failed { message } => format!("failed {message}"),
            ClaimPlan::Create { chosen, .. } => format!(
                "create {}",
                chosen
                    .iter()
                    .map(|(f, a)| format!("{}={}", f.as_str(), a.address))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }

    #[test]
    fn a_dual_claim_gets_both_families_or_neither_and_is_told_why() {
        let allocated =
            |rows: Vec<(Family, Result<Allocation, AllocateError>)>| ClaimSnapshot::Allocated {
                class: class(),
                allocated: rows,
            };
        let rows: Vec<(ClaimSnapshot, &str)> = vec![
            (ClaimSnapshot::NotServed, "nothing"),
            (ClaimSnapshot::ParametersNotRead, "wait"),
            (
                ClaimSnapshot::InvalidParameters {
                    class: class(),
                    why: "no cidrs".into(),
                },
                "refuse InvalidClassParameters None",
            ),
            (
                allocated(vec![
                    (Family::IPv4, at("192.0.2.1")),
                    (Family::IPv6, at("2001:db8::1")),
                ]),
                "create IPv4=192.0.2.1,IPv6=2001:db8::1",
            ),
            // One family exhausted: neither is created, the class is recorded.
            (
                allocated(vec![
                    (Family::IPv4, at("192.0.2.1")),
                    (Family::IPv6, Err(AllocateError::Exhausted)),
                ]),
                "refuse Exhausted Some(\"pub\")",
            ),
            // The backend failed: that wins over an exhaustion before it.
            (
                allocated(vec![
                    (Family::IPv4, Err(AllocateError::Exhausted)),
                    (Family::IPv6, Err(AllocateError::Failed("down".into()))),
                ]),
                "failed down",
            ),
        ];
        for (i, (snapshot, want)) in rows.into_iter().enumerate() {
            assert_eq!(kind(&plan_claim(snapshot)), want, "row {i}");
        }
    }
}
