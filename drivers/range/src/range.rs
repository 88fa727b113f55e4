//! The range driver: a [`Driver`] that allocates from the CIDRs in a class's
//! `spec.parameters.cidrs`, in list order, first free address first — and is the load
//! balancer itself: it puts a claim's addresses on the Services that name it by writing
//! their `status.loadBalancer.ingress`, as a cloud provider's or MetalLB's controller does.

use std::net::IpAddr;
use std::sync::Arc;

use address_controller_api::family::family_of_ip;
use address_controller_api::{Family, IPAddress, IPAddressClass};
use address_controller_driver_kit::{
    AllocateError, Allocation, Capacity, Driver, Presence, Request, ingress,
};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use address_controller_driver_kit::driver::of_load_balancer_class;
use address_controller_driver_kit::ranges::{self as allocator, Cidr};

/// The provisioner name this driver answers to.
pub const PROVISIONER: &str = address_controller_api::names::driver::RANGE_PROVISIONER;

/// The driver; `lb_class` is the `spec.loadBalancerClass` of the Services it serves
/// (`None`: Services without one), as MetalLB's `--lb-class`.
#[derive(Default)]
pub struct Range {
    pub lb_class: Option<String>,
}

/// The ingress `ours` becomes when this driver pins `want`: everything that is not ours
/// stays as it was, then `want` (IPv4 first), each with `ipMode: VIP`. `None`: no change.
pub fn ingress_after(
    service: &Service,
    ours: &[IpAddr],
    want: &[IpAddr],
) -> Option<serde_json::Value> {
    let current: Vec<serde_json::Value> = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| {
            i.iter()
                .filter_map(|x| serde_json::to_value(x).ok())
                .collect()
        })
        .unwrap_or_default();
    let is_ours = |v: &serde_json::Value| {
        v.get("ip")
            .and_then(|ip| ip.as_str())
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .is_some_and(|ip| ours.contains(&ip))
    };
    let mut want = want.to_vec();
    want.sort_by_key(|ip| (family_of_ip(*ip) != Family::IPv4, *ip));
    let next: Vec<serde_json::Value> = current
        .iter()
        .filter(|v| !is_ours(v))
        .cloned()
        .chain(
            want.iter()
                .map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"})),
        )
        .collect();
    let same = ingress(service)
        == next
            .iter()
            .filter_map(|v| v.get("ip")?.as_str()?.parse::<IpAddr>().ok())
            .collect::<Vec<_>>();
    (!same).then_some(serde_json::Value::Array(next))
}

impl Driver for Range {
    type Params = Vec<Cidr>;

    fn provisioner(&self) -> &str {
        PROVISIONER
    }

    /// Each class's CIDRs; a range overlapping another class's is an error on both.
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<Vec<Cidr>, String>> {
        let parsed: Vec<Result<Vec<Cidr>, String>> = classes
            .iter()
            .map(|c| {
                allocator::parse_parameters(c.spec.parameters.as_ref()).map_err(|e| e.to_string())
            })
            .collect();
        address_controller_driver_kit::driver::without_overlaps(classes, &parsed, |c| c.as_slice())
    }

    fn capacity(&self, cidrs: &Vec<Cidr>) -> Capacity {
        let (ipv4, ipv6) = allocator::capacity(cidrs);
        Capacity { ipv4, ipv6 }
    }

    fn describe(&self, cidrs: &Vec<Cidr>) -> String {
        let list: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        format!("{} range(s): {}", cidrs.len(), list.join(", "))
    }

    fn serves(&self, service: &Service) -> bool {
        of_load_balancer_class(service, self.lb_class.as_ref())
    }

    /// The range driver is the load balancer: its pin writes the ingress.
    fn pin_shows(&self) -> bool {
        true
    }

    async fn pin(
        &self,
        client: &Client,
        service: &Service,
        ours: &[IpAddr],
        want: &[Arc<IPAddress>],
    ) -> Result<(), String> {
        let want: Vec<IpAddr> = want.iter().filter_map(|a| a.ip()).collect();
        let Some(ingress) = ingress_after(service, ours, &want) else {
            return Ok(());
        };
        let ns = service.namespace().unwrap_or_default();
        let body = json!({"metadata": {"resourceVersion": service.metadata.resource_version},
            "status": {"loadBalancer": {"ingress": ingress}}});
        Api::<Service>::namespaced(client.clone(), &ns)
            .patch_status(
                &service.name_any(),
                &PatchParams::default(),
                &Patch::Merge(body),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("writing status.loadBalancer.ingress: {e}"))
    }

    /// An address of the class's ranges is present; one an admin's shrink left outside is
    /// missing — the driver can no longer hand it out, nor serve it.
    fn presence(&self, cidrs: &Vec<Cidr>, address: &IPAddress) -> Presence {
        Presence::within_blocks(cidrs, "the class's ranges", address)
    }

    async fn allocate(&self, req: Request<'_, Vec<Cidr>>) -> Result<Allocation, AllocateError> {
        let address = allocator::first_free(req.params, req.family, req.in_use)
            .ok_or(AllocateError::Exhausted)?;
        Ok(Allocation {
            address,
            source: address_controller_api::AddressSource::from_class(),
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
        let p = Range::default().parameters(&classes);
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
            Range::default().capacity(p[2].as_ref().unwrap()),
            Capacity { ipv4: 2, ipv6: 0 }
        );
        assert!(p[3].is_err());
    }

    #[tokio::test]
    async fn allocates_the_first_free_address_or_reports_exhaustion() {
        let c = class("a", json!(["192.0.2.0/30", "2001:db8::/127"]));
        let params = Range::default()
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
        let a = Range::default()
            .allocate(req(Family::IPv4, &|_| false))
            .await
            .unwrap();
        assert_eq!(a.address.to_string(), "192.0.2.1");
        let a = Range::default()
            .allocate(req(Family::IPv4, &taken))
            .await
            .unwrap();
        assert_eq!(a.address.to_string(), "192.0.2.2");
        assert_eq!(
            Range::default()
                .allocate(req(Family::IPv4, &|_| true))
                .await,
            Err(AllocateError::Exhausted)
        );
        let a = Range::default()
            .allocate(req(Family::IPv6, &|_| false))
            .await
            .unwrap();
        assert_eq!(a.address.to_string(), "2001:db8::");
    }
}

#[cfg(test)]
mod association_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn svc(ingress: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "t"},
            "spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {"ingress": ingress}}}))
        .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn pins_only_its_own_entries_and_leaves_the_rest() {
        // Someone else's entry stays; ours is added, IPv4 first.
        let s = svc(json!([{"ip": "198.51.100.7"}]));
        let next = ingress_after(
            &s,
            &[ip("2001:db8::1"), ip("192.0.2.1")],
            &[ip("2001:db8::1"), ip("192.0.2.1")],
        )
        .unwrap();
        assert_eq!(
            next,
            json!([{"ip": "198.51.100.7"}, {"ip": "192.0.2.1", "ipMode": "VIP"}, {"ip": "2001:db8::1", "ipMode": "VIP"}])
        );
        // Already so: no write.
        let s = svc(next);
        assert_eq!(
            ingress_after(
                &s,
                &[ip("192.0.2.1"), ip("2001:db8::1")],
                &[ip("192.0.2.1"), ip("2001:db8::1")]
            ),
            None
        );
        // Unpin removes only ours.
        assert_eq!(
            ingress_after(&s, &[ip("192.0.2.1"), ip("2001:db8::1")], &[]).unwrap(),
            json!([{"ip": "198.51.100.7"}])
        );
        // Nothing of ours to do on a Service without status: no write.
        let bare: Service = serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap();
        assert_eq!(ingress_after(&bare, &[], &[]), None);
    }

    #[test]
    fn serves_services_of_its_load_balancer_class_and_knows_its_ranges() {
        let plain = svc(json!([]));
        let classed: Service = serde_json::from_value(
            json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer", "loadBalancerClass": "example.com/lb"}}),
        )
        .unwrap();
        assert!(Range::default().serves(&plain) && !Range::default().serves(&classed));
        let only = Range {
            lb_class: Some("example.com/lb".into()),
        };
        assert!(!only.serves(&plain) && only.serves(&classed));
        let cidrs = vec![Cidr::parse("192.0.2.0/28").unwrap()];
        let a = |ip: &str| -> IPAddress {
            serde_json::from_value(json!({"metadata": {"name": "a"},
                "spec": {"address": ip, "className": "c", "source": {"fromClass": {}}}}))
            .unwrap()
        };
        assert_eq!(
            Range::default().presence(&cidrs, &a("192.0.2.5")),
            Presence::Present
        );
        assert!(
            matches!(Range::default().presence(&cidrs, &a("192.0.2.17")), Presence::Missing(m) if m.contains("192.0.2.0/28"))
        );
    }
}
