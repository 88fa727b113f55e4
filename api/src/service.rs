//! Rules about a Service as this product reads it, spelled once for the core's auto-claims
//! and the kit's association (SPEC §7, §8).

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::names::SERVICE_CLAIM_ANNOTATION;

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
        let cluster_ip = svc(json!({"metadata": {"name": "s"}, "spec": {"type": "ClusterIP"}}));
        assert!(!is_load_balancer_type(&cluster_ip) && !may_want_auto_claim(&cluster_ip));
    }
}
