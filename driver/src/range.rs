//! The range driver: a [`Driver`] that allocates from the CIDRs in a class's
//! `spec.parameters.cidrs`, in list order, first free address first.

use std::sync::Arc;

use address_controller_api::{AddressSource, FromClass, IPAddressClass};
use address_controller_driver_kit::{AllocateError, Allocation, Capacity, Driver, Request};
use kube::ResourceExt;

use crate::allocator::{self, Cidr, ParamError};

/// The provisioner name this driver answers to.
pub const PROVISIONER: &str = "range.drivers.local.sdn.cozystack.io";

pub struct Range;

impl Driver for Range {
    type Params = Vec<Cidr>;

    fn provisioner(&self) -> &str {
        PROVISIONER
    }

    /// Each class's CIDRs; a range overlapping another class's is an error on both.
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<Vec<Cidr>, String>> {
        let parsed: Vec<Result<Vec<Cidr>, ParamError>> = classes
            .iter()
            .map(|c| allocator::parse_parameters(c.spec.parameters.as_ref()))
            .collect();
        classes
            .iter()
            .zip(&parsed)
            .map(|(class, mine)| {
                let mine = mine.clone().map_err(|e| e.to_string())?;
                for (other, theirs) in classes.iter().zip(&parsed) {
                    if other.name_any() == class.name_any() {
                        continue;
                    }
                    if let Ok(theirs) = theirs
                        && let Some((a, b)) = allocator::overlap_between(&mine, theirs)
                    {
                        return Err(ParamError::Overlap(
                            a.to_string(),
                            format!("{b} of class {}", other.name_any()),
                        )
                        .to_string());
                    }
                }
                Ok(mine)
            })
            .collect()
    }

    fn capacity(&self, cidrs: &Vec<Cidr>) -> Capacity {
        let (ipv4, ipv6) = allocator::capacity(cidrs);
        Capacity { ipv4, ipv6 }
    }

    fn describe(&self, cidrs: &Vec<Cidr>) -> String {
        let list: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        format!("{} range(s): {}", cidrs.len(), list.join(", "))
    }

    async fn allocate(&self, req: Request<'_, Vec<Cidr>>) -> Result<Allocation, AllocateError> {
        let address = allocator::first_free(req.params, req.family, req.in_use)
            .ok_or(AllocateError::Exhausted)?;
        Ok(Allocation {
            address,
            source: AddressSource {
                from_class: Some(FromClass {}),
                provider_ref: None,
            },
            name: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use address_controller_api::Family;
    use serde_json::json;

    fn class(name: &str, cidrs: serde_json::Value) -> Arc<IPAddressClass> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name},
                "spec": {"provisioner": PROVISIONER, "parameters": {"cidrs": cidrs}}}))
            .unwrap(),
        )
    }

    #[test]
    fn overlaps_between_classes_are_errors_on_both() {
        let classes = [
            class("a", json!(["192.0.2.0/28"])),
            class("b", json!(["192.0.2.8/29"])),
            class("c", json!(["198.51.100.0/30"])),
            class("d", json!("not a list")),
        ];
        let p = Range.parameters(&classes);
        assert!(
            p[0].as_ref().unwrap_err().contains("of class b"),
            "{:?}",
            p[0]
        );
        assert!(
            p[1].as_ref().unwrap_err().contains("of class a"),
            "{:?}",
            p[1]
        );
        assert_eq!(
            Range.capacity(p[2].as_ref().unwrap()),
            Capacity { ipv4: 2, ipv6: 0 }
        );
        assert!(p[3].is_err());
    }

    #[tokio::test]
    async fn allocates_the_first_free_address_or_reports_exhaustion() {
        let c = class("a", json!(["192.0.2.0/30", "2001:db8::/127"]));
        let params = Range
            .parameters(std::slice::from_ref(&c))
            .remove(0)
            .unwrap();
        let claim = serde_json::from_value(
            json!({"metadata": {"name": "x", "namespace": "t"}, "spec": {}}),
        )
        .unwrap();
        fn taken(ip: std::net::IpAddr) -> bool {
            ip.to_string() == "192.0.2.1"
        }
        let req =
            |family, in_use: &'static (dyn Fn(std::net::IpAddr) -> bool + Send + Sync)| Request {
                class: &c,
                params: &params,
                claim: &claim,
                family,
                in_use,
            };
        let a = Range.allocate(req(Family::IPv4, &|_| false)).await.unwrap();
        assert_eq!(a.address.to_string(), "192.0.2.1");
        let a = Range.allocate(req(Family::IPv4, &taken)).await.unwrap();
        assert_eq!(a.address.to_string(), "192.0.2.2");
        assert_eq!(
            Range.allocate(req(Family::IPv4, &|_| true)).await,
            Err(AllocateError::Exhausted)
        );
        let a = Range.allocate(req(Family::IPv6, &|_| false)).await.unwrap();
        assert_eq!(a.address.to_string(), "2001:db8::");
    }
}
