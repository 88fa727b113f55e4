//! A class of this driver, one pass: its capacity and its conditions `ParametersValid` and
//! `Exhausted`, and the one event of its current state.

use address_controller_api::conditions::set_condition;
use address_controller_api::{Capacity, Family, IPAddressClass, IPAddressClassStatus};
use address_controller_runtime::events::PlannedEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::driver;
use address_controller_api::names::driver as events;

/// What a class pass writes: the status (written only when it differs from the class's)
/// and the one event of its current state (`None`: none, and a later change is told anew).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassPlan {
    pub status: IPAddressClassStatus,
    pub event: Option<PlannedEvent>,
}

impl ClassPlan {
    /// Whether the status differs from the class's.
    pub fn writes(&self, class: &IPAddressClass) -> bool {
        class.status.as_ref() != Some(&self.status)
    }
}

/// What the parameters of a class of this driver came to.
pub enum Parsed<'a> {
    /// Valid: the class's capacity and the driver's one line about them.
    Valid {
        capacity: driver::Capacity,
        described: String,
    },
    Invalid(&'a str),
}

/// The class's `status.capacity` and its conditions `ParametersValid` and `Exhausted`:
/// a family is exhausted when it has a capacity and `count` of it (the addresses of the
/// class) reaches it.
pub fn plan_class(
    class: &IPAddressClass,
    parsed: Parsed<'_>,
    count: impl Fn(Family) -> i64,
    now: &Time,
) -> ClassPlan {
    let generation = class.metadata.generation;
    let mut status = class.status.clone().unwrap_or_default();
    let conditions = &mut status.conditions;
    match parsed {
        Parsed::Valid {
            capacity,
            described,
        } => {
            status.capacity = Some(Capacity {
                ipv4: Some(capacity.ipv4),
                ipv6: Some(capacity.ipv6),
            });
            set_condition(
                conditions,
                events::PARAMETERS_VALID,
                true,
                "Valid",
                described,
                generation,
                now,
            );
            let full: Vec<&str> = [Family::IPv4, Family::IPv6]
                .into_iter()
                .filter(|f| capacity.of(*f) > 0 && count(*f) >= capacity.of(*f))
                .map(Family::as_str)
                .collect();
            let (exhausted, reason, msg) = if full.is_empty() {
                (false, "FreeAddresses", "free addresses left".to_string())
            } else {
                (
                    true,
                    "NoFreeAddress",
                    format!("no free {} address left", full.join(" or ")),
                )
            };
            set_condition(
                conditions,
                events::EXHAUSTED,
                exhausted,
                reason,
                msg,
                generation,
                now,
            );
            ClassPlan {
                status,
                event: None,
            }
        }
        Parsed::Invalid(why) => {
            status.capacity = None;
            set_condition(
                conditions,
                events::PARAMETERS_VALID,
                false,
                events::INVALID_PARAMETERS,
                why.to_string(),
                generation,
                now,
            );
            let event = PlannedEvent::warning(
                events::INVALID_PARAMETERS,
                format!("{why}; nothing will be allocated from this class"),
            );
            ClassPlan {
                status,
                event: Some(event),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    #[test]
    fn a_class_is_exhausted_per_family_at_its_capacity_and_invalid_parameters_are_told_once() {
        let class: IPAddressClass = serde_json::from_value(json!({
            "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
            "metadata": {"name": "c", "generation": 3},
            "spec": {"provisioner": "drv"}
        }))
        .unwrap();
        let now = Time(Timestamp::now());
        let valid = || Parsed::Valid {
            capacity: driver::Capacity { ipv4: 2, ipv6: 0 },
            described: "2 addresses".into(),
        };
        let cond = |p: &ClassPlan, t: &str| {
            p.status
                .conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
                .unwrap()
        };
        let free = plan_class(&class, valid(), |_| 1, &now);
        assert_eq!(cond(&free, events::EXHAUSTED).1, "FreeAddresses");
        assert_eq!(free.event, None);
        assert!(free.writes(&class));
        let full = plan_class(&class, valid(), |f| i64::from(f == Family::IPv4) * 2, &now);
        assert_eq!(
            cond(&full, events::EXHAUSTED),
            (
                "True".into(),
                "NoFreeAddress".into(),
                "no free IPv4 address left".into()
            )
        );
        // No IPv6 capacity: never exhausted for it.
        assert_eq!(
            full.status.capacity,
            Some(Capacity {
                ipv4: Some(2),
                ipv6: Some(0)
            })
        );
        let bad = plan_class(&class, Parsed::Invalid("bad range"), |_| 0, &now);
        assert_eq!(bad.status.capacity, None);
        assert_eq!(cond(&bad, events::PARAMETERS_VALID).0, "False");
        assert_eq!(bad.event.unwrap().reason, events::INVALID_PARAMETERS);
        // The status as written: nothing to write again.
        let mut written = class.clone();
        written.status = Some(free.status.clone());
        assert!(!plan_class(&written, valid(), |_| 1, &now).writes(&written));
    }
}
