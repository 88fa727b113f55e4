//! Rules about a Service as this product reads it, spelled once for the core's auto-claims
//! and the kit's association (SPEC §7, §8).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::family::parse_address;
use crate::names::SERVICE_CLAIM_ANNOTATION;
use crate::validation::{is_dns1123_label, is_dns1123_subdomain};
use crate::{AttachmentMethod, Family};

/// The label that hands a Service to a proxy other than kube-proxy (kube-proxy skips a
/// Service that carries it), and the value of the platform's own data plane.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
pub const COZY_PROXY: &str = "cozy-proxy";
/// cozy-proxy's annotations: `"true"` forwards every port (absent or anything else: the
/// listed ports only), and with the listed ports, `"true"` lets ICMP through.
pub const WHOLE_IP_ANNOTATION: &str = "networking.cozystack.io/wholeIP";
pub const ALLOW_ICMP_ANNOTATION: &str = "networking.cozystack.io/allowICMP";

/// How cozy-proxy serves a Service (see [`cozy_proxy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proxied {
    pub method: AttachmentMethod,
    /// ICMP reaches the pod (always with `WholeIP`).
    pub allow_icmp: bool,
}

/// How the platform's data plane serves `s`, when its label hands it to cozy-proxy — the
/// label is cozy-proxy's only selector; its annotations choose the method as cozy-proxy
/// reads them (`wholeIP` exactly `"true"`, `allowICMP` exactly `"true"`). cozy-proxy maps the
/// Service's address to its first endpoint whole — DNAT in, SNAT out (its `svc_pod` and
/// `pod_svc` maps are keyed by address alone) — so such a Service holds its address alone,
/// and its pod's outbound traffic leaves from it.
pub fn cozy_proxy(s: &Service) -> Option<Proxied> {
    if s.labels().get(SERVICE_PROXY_NAME_LABEL).map(String::as_str) != Some(COZY_PROXY) {
        return None;
    }
    let yes = |k: &str| s.annotations().get(k).map(String::as_str) == Some("true");
    Some(if yes(WHOLE_IP_ANNOTATION) {
        Proxied {
            method: AttachmentMethod::WholeIP,
            allow_icmp: true,
        }
    } else {
        Proxied {
            method: AttachmentMethod::PortList,
            allow_icmp: yes(ALLOW_ICMP_ANNOTATION),
        }
    })
}

/// `spec.type: LoadBalancer`.
pub fn is_load_balancer_type(s: &Service) -> bool {
    s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) == Some("LoadBalancer")
}

/// The claim a Service names (`local.sdn.cozystack.io/ip-address-claim`; an empty value
/// names none).
pub fn named_claim(s: &Service) -> Option<&str> {
    s.annotations()
        .get(SERVICE_CLAIM_ANNOTATION)
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// The claim a Service names, as `(namespace, name)`: `<name>` names one in the Service's
/// namespace, `<namespace>/<name>` one shared from another namespace. `None`: it names
/// none; `Err`: the value is not a reference (said in the Service's condition).
pub fn claim_reference(s: &Service) -> Option<Result<(String, String), String>> {
    let value = named_claim(s)?;
    let own = s.metadata.namespace.clone().unwrap_or_default();
    let (ns, name) = match value.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name),
        None => (own, value),
    };
    Some(if is_dns1123_label(&ns) && is_dns1123_subdomain(name) {
        Ok((ns, name.to_string()))
    } else {
        Err(format!(
            "{SERVICE_CLAIM_ANNOTATION} must be <name> or <namespace>/<name> of an IPAddressClaim, not {:?}",
            value.chars().take(300).collect::<String>()
        ))
    })
}

/// The claim a Service names as a cache key (`namespace/name`), when the reference is valid.
pub fn claim_key(s: &Service) -> Option<String> {
    match claim_reference(s)? {
        Ok((ns, name)) => Some(format!("{ns}/{name}")),
        Err(_) => None,
    }
}

/// The families of a Service (`spec.ipFamilies`; IPv4 when the API server left it empty).
pub fn service_families(s: &Service) -> Vec<Family> {
    let fams: Vec<Family> = s
        .spec
        .as_ref()
        .and_then(|sp| sp.ip_families.as_ref())
        .map(|f| {
            f.iter()
                .filter_map(|x| match x.as_str() {
                    "IPv4" => Some(Family::IPv4),
                    "IPv6" => Some(Family::IPv6),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if fams.is_empty() {
        vec![Family::IPv4]
    } else {
        fams
    }
}

/// MetalLB's annotations on a Service, as MetalLB v0.16 reads and writes them: one spelling
/// for the driver, the adopter and the core.
pub mod metallb {
    /// Pins the Service to these addresses (comma-separated).
    pub const LOAD_BALANCER_IPS: &str = "metallb.io/loadBalancerIPs";
    /// The sharing key: Services with the same key may share an address.
    pub const ALLOW_SHARED_IP: &str = "metallb.io/allow-shared-ip";
    /// The pool to allocate from.
    pub const ADDRESS_POOL: &str = "metallb.io/address-pool";
    /// MetalLB's own marker, written on every allocation it has converged: the pool the
    /// address came from. Taken off, it comes back only once MetalLB accepts the Service as
    /// it now is.
    pub const ALLOCATED_FROM_POOL: &str = "metallb.io/ip-allocated-from-pool";
}

/// Cilium LB-IPAM's annotations and condition on a Service, as the cilium-operator v1.19
/// reads and writes them: one spelling for the Cilium driver, its fence and the core.
pub mod cilium {
    /// Asks for these addresses (comma-separated).
    pub const IPS: &str = "lbipam.cilium.io/ips";
    /// The sharing key: Services with the same key may share an address.
    pub const SHARING_KEY: &str = "lbipam.cilium.io/sharing-key";
    /// Namespaces (or `*`) a Service may share its address with under its key; both sides
    /// must name each other's.
    pub const SHARING_CROSS_NAMESPACE: &str = "lbipam.cilium.io/sharing-cross-namespace";
    /// The older spellings the operator still reads.
    pub const IPS_ALIAS: &str = "io.cilium/lb-ipam-ips";
    pub const SHARING_KEY_ALIAS: &str = "io.cilium/lb-ipam-sharing-key";
    pub const SHARING_CROSS_NAMESPACE_ALIAS: &str = "io.cilium/lb-ipam-sharing-cross-namespace";
    /// Every annotation that asks LB-IPAM for an address or a share of one.
    pub const PIN_ANNOTATIONS: [&str; 6] = [
        IPS,
        SHARING_KEY,
        SHARING_CROSS_NAMESPACE,
        IPS_ALIAS,
        SHARING_KEY_ALIAS,
        SHARING_CROSS_NAMESPACE_ALIAS,
    ];
    /// LB-IPAM's answer on the Service (`status.conditions`): `True` once it allocated what
    /// the Service asks for, else `False` with its reason (`no_pool`, `out_of_ips`,
    /// `already_allocated_incompatible_service`, ...).
    pub const REQUEST_SATISFIED: &str = "cilium.io/IPAMRequestSatisfied";
}

/// The `ip` values of a Service's `status.loadBalancer.ingress`, as written (entries with
/// only a hostname give none).
pub fn ingress_ips(s: &Service) -> impl Iterator<Item = &str> {
    s.status
        .iter()
        .filter_map(|st| st.load_balancer.as_ref())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| i.ip.as_deref())
}

/// The addresses a Service's `status.loadBalancer.ingress` shows (values that do not
/// parse as an IP are left out).
pub fn ingress_addresses(s: &Service) -> Vec<IpAddr> {
    ingress_ips(s)
        .filter_map(|ip| parse_address(ip).ok())
        .collect()
}

/// A Service the auto-claim controller looks at: a LoadBalancer naming no claim.
pub fn may_want_auto_claim(s: &Service) -> bool {
    is_load_balancer_type(s) && named_claim(s).is_none()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn ingress_reads_ips_and_leaves_hostnames_and_garbage_out() {
        let s: Service = serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "status": {"loadBalancer": {"ingress": [
                {"ip": "192.0.2.1"}, {"hostname": "lb.example"}, {"ip": "2001:db8::1"}, {"ip": "nope"}
            ]}}
        }))
        .unwrap();
        assert_eq!(
            ingress_ips(&s).collect::<Vec<_>>(),
            ["192.0.2.1", "2001:db8::1", "nope"]
        );
        assert_eq!(
            ingress_addresses(&s),
            [
                "192.0.2.1".parse::<IpAddr>().unwrap(),
                "2001:db8::1".parse().unwrap()
            ]
        );
        let none: Service = serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap();
        assert!(ingress_addresses(&none).is_empty());
    }

    #[test]
    fn an_empty_annotation_names_no_claim() {
        let svc = |v: serde_json::Value| -> Service { serde_json::from_value(v).unwrap() };
        let lb = |ann: serde_json::Value| {
            svc(
                json!({"metadata": {"name": "s", "annotations": ann}, "spec": {"type": "LoadBalancer"}}),
            )
        };
        assert_eq!(
            named_claim(&lb(json!({SERVICE_CLAIM_ANNOTATION: "web"}))),
            Some("web")
        );
        assert_eq!(
            named_claim(&lb(json!({SERVICE_CLAIM_ANNOTATION: ""}))),
            None
        );
        assert!(may_want_auto_claim(&lb(
            json!({SERVICE_CLAIM_ANNOTATION: ""})
        )));
        assert!(!may_want_auto_claim(&lb(
            json!({SERVICE_CLAIM_ANNOTATION: "web"})
        )));
        let mut cross = lb(json!({SERVICE_CLAIM_ANNOTATION: "shop/web"}));
        cross.metadata.namespace = Some("blog".into());
        assert_eq!(
            claim_reference(&cross),
            Some(Ok(("shop".into(), "web".into())))
        );
        assert_eq!(claim_key(&cross).as_deref(), Some("shop/web"));
        let mut own = lb(json!({SERVICE_CLAIM_ANNOTATION: "web"}));
        own.metadata.namespace = Some("blog".into());
        assert_eq!(claim_key(&own).as_deref(), Some("blog/web"));
        for bad in ["a/b/c", "/web", "shop/", "Shop/web", "shop/we b"] {
            let s = lb(json!({SERVICE_CLAIM_ANNOTATION: bad}));
            assert!(matches!(claim_reference(&s), Some(Err(_))), "{bad}");
            assert_eq!(claim_key(&s), None, "{bad}");
        }
        let cluster_ip = svc(json!({"metadata": {"name": "s"}, "spec": {"type": "ClusterIP"}}));
        assert!(!is_load_balancer_type(&cluster_ip) && !may_want_auto_claim(&cluster_ip));
    }
}
