//! The class and address passes as pure decisions (read → decide → apply, as the core's
//! `decide/`): what the pass reads is passed in, what it should write comes out as a plan,
//! and [`crate::runner`] applies it. Association's plans are in [`crate::association`].

use std::net::IpAddr;

use address_controller_api::conditions::set_condition;
use address_controller_api::names::{with_finalizer, without_finalizer};
use address_controller_api::{Capacity, Family, IPAddress, IPAddressClass, IPAddressClassStatus};
use address_controller_runtime::events::PlannedEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::driver;
use crate::runner::events;

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

/// What an address pass does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressPlan {
    /// Not this driver's, or nothing to do.
    Nothing,
    /// Put the driver's finalizer on an address of its classes (these finalizers): it
    /// guards the backend's state of every address of them, an admin's static ones too.
    AddFinalizer(Vec<String>),
    /// An address of its classes: judge its health (Lost, Conflict, a dangling association).
    Health,
    /// Being deleted, but `service` still shows `ip`: tear down once it is withdrawn (the
    /// backend's state is what withdraws it).
    WaitForWithdrawal { service: String, ip: IpAddr },
    /// Release it in the backend, then leave these finalizers.
    Teardown { remaining: Vec<String> },
}

/// One address: `owns` says whether it is of this driver's classes, `finalizer` is the
/// driver's, `shown_by` the Services of this driver that show an IP.
pub fn plan_address(
    a: &IPAddress,
    owns: bool,
    finalizer: Option<&str>,
    shown_by: impl Fn(IpAddr) -> Vec<String>,
) -> AddressPlan {
    let ours = finalizer.filter(|f| a.finalizers().iter().any(|x| x == f));
    match ours {
        Some(f) if a.is_deleting() => {
            if let Some(ip) = a.ip()
                && let Some(service) = shown_by(ip).into_iter().next()
            {
                return AddressPlan::WaitForWithdrawal { service, ip };
            }
            let remaining =
                without_finalizer(a.finalizers(), f).unwrap_or_else(|| a.finalizers().to_vec());
            AddressPlan::Teardown { remaining }
        }
        _ if !owns => AddressPlan::Nothing,
        _ => match finalizer
            .filter(|_| !a.is_deleting())
            .and_then(|f| with_finalizer(a.finalizers(), f))
        {
            Some(all) => AddressPlan::AddFinalizer(all),
            None => AddressPlan::Health,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn address(finalizers: &[&str], deleting: bool) -> IPAddress {
        let mut a: IPAddress = serde_json::from_value(json!({
            "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
            "metadata": {"name": "ipv4-192-0-2-1", "finalizers": finalizers},
            "spec": {"address": "192.0.2.1", "className": "c", "source": {"fromClass": {}}}
        }))
        .unwrap();
        if deleting {
            a.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        }
        a
    }

    #[test]
    fn an_address_is_torn_down_only_behind_the_drivers_finalizer_and_once_withdrawn() {
        let none = |_: IpAddr| Vec::new();
        let shown = |_: IpAddr| vec!["a/web".to_string()];
        let f = Some("drv/teardown");
        let rows: Vec<(IPAddress, bool, Option<&str>, bool, AddressPlan)> = vec![
            (address(&[], false), false, f, false, AddressPlan::Nothing),
            (
                address(&[], false),
                true,
                f,
                false,
                AddressPlan::AddFinalizer(vec!["drv/teardown".into()]),
            ),
            (
                address(&["drv/teardown"], false),
                true,
                f,
                false,
                AddressPlan::Health,
            ),
            (address(&[], false), true, None, false, AddressPlan::Health),
            // Being deleted without our finalizer: no finalizer is added back.
            (address(&["x"], true), true, f, false, AddressPlan::Health),
            (
                address(&["x", "drv/teardown"], true),
                false,
                f,
                false,
                AddressPlan::Teardown {
                    remaining: vec!["x".into()],
                },
            ),
            (
                address(&["drv/teardown"], true),
                true,
                f,
                true,
                AddressPlan::WaitForWithdrawal {
                    service: "a/web".into(),
                    ip: "192.0.2.1".parse().unwrap(),
                },
            ),
        ];
        for (i, (a, owns, fin, is_shown, want)) in rows.into_iter().enumerate() {
            let got = if is_shown {
                plan_address(&a, owns, fin, shown)
            } else {
                plan_address(&a, owns, fin, none)
            };
            assert_eq!(got, want, "row {i}");
        }
    }

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
