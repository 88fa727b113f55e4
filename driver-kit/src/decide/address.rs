//! An address, one pass: the driver's finalizer on the addresses of its classes, the
//! teardown of one being deleted once no Service shows it, else its health
//! ([`super::health`]).

use std::net::IpAddr;

use address_controller_api::IPAddress;
use address_controller_api::names::{with_finalizer, without_finalizer};
use kube::ResourceExt;

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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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
}
