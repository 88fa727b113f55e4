//! Auto-claims for LoadBalancer Services (SPEC §7), as a pure function: the one place the
//! core touches Services.

use std::sync::Arc;

use address_controller_api::names::{
    AUTO_CLAIM_CLASS_ANNOTATION, SERVICE_AUTO_CLAIM_ANNOTATION, SERVICE_CLASS_ANNOTATION,
};
use address_controller_api::service::{cilium, metallb};
use address_controller_api::validation::is_dns1123_subdomain;
use address_controller_api::{ClaimFamily, IPAddressClaim, IPAddressClass, Marked};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use super::PlannedEvent;

/// MetalLB annotations that pin, pool or share an address: such a Service already says
/// where its address comes from.
pub const METALLB_ANNOTATIONS: [&str; 6] = [
    metallb::ADDRESS_POOL,
    metallb::LOAD_BALANCER_IPS,
    metallb::ALLOW_SHARED_IP,
    "metallb.universe.tf/address-pool",
    "metallb.universe.tf/loadBalancerIPs",
    "metallb.universe.tf/allow-shared-ip",
];

/// Event reasons on Services.
pub mod reason {
    pub const AUTO_CLAIM_CREATED: &str = "AutoClaimCreated";
    pub const AMBIGUOUS_AUTO_CLAIM_CLASS: &str = "AmbiguousAutoClaimClass";
    pub const CLASS_NOT_FOUND: &str = "AutoClaimClassNotFound";
    pub const INVALID_ANNOTATION: &str = "InvalidAutoClaimAnnotation";
    pub const FAMILY_UNSUPPORTED: &str = "AutoClaimFamilyUnsupported";
    pub const CLAIM_NAME_TAKEN: &str = "AutoClaimNameTaken";
    pub const NO_LONGER_LOAD_BALANCER: &str = "NoLongerLoadBalancer";
    /// The auto-claim class does not admit the Service's namespace (SPEC §13).
    pub const NAMESPACE_NOT_ADMITTED: &str = "AutoClaimNamespaceNotAdmitted";
}

/// What the auto-claim pass sees.
pub struct ServiceSnapshot<'a> {
    pub service: &'a Service,
    pub classes: &'a [Arc<IPAddressClass>],
    /// The claim named after the Service in its namespace, if any.
    pub claim: Option<&'a IPAddressClaim>,
    /// The labels of the Service's namespace (`None`: not known).
    pub namespace_labels: Option<&'a std::collections::BTreeMap<String, String>>,
}

/// Why a Service gets no auto-claim (no write, no event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    NotLoadBalancer,
    NamesAClaim,
    OptedOut,
    LoadBalancerClass,
    LoadBalancerIp,
    MetalLb,
    /// A Cilium LB-IPAM pin or sharing annotation: the Service already says where its
    /// address comes from.
    Cilium,
    HasIngress,
    NoAutoClaimClass,
}

/// The outcome of one pass.
#[derive(Debug, Clone, PartialEq)]
pub enum ServicePlan {
    Skip(Skip),
    /// Something is wrong with the input; say so on the Service and write nothing.
    Refuse(PlannedEvent),
    /// Create the claim, then annotate the Service with its name.
    Create {
        class: String,
        family: ClaimFamily,
    },
    /// The owned claim exists but the Service does not name it (a crash between the two
    /// writes): annotate.
    Annotate,
    /// The Service stopped being a LoadBalancer; its claim stays (reported once).
    Keep(PlannedEvent),
}

/// Whether the claim is controlled by this Service.
pub fn owned_by(claim: &IPAddressClaim, service: &Service) -> bool {
    claim
        .auto_claim_owner()
        .is_some_and(|r| Some(r.uid.as_str()) == service.metadata.uid.as_deref())
}

/// The family a Service asks for: two families → Dual, one → that one.
pub fn service_family(svc: &Service) -> Result<ClaimFamily, String> {
    let spec = svc.spec.as_ref();
    let families: Vec<&str> = spec
        .and_then(|s| s.ip_families.as_ref())
        .map(|f| f.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let policy = spec.and_then(|s| s.ip_family_policy.as_deref());
    match families.as_slice() {
        [_, _] => Ok(ClaimFamily::Dual),
        ["IPv4"] => Ok(ClaimFamily::IPv4),
        ["IPv6"] => Ok(ClaimFamily::IPv6),
        [] if policy == Some("RequireDualStack") => Ok(ClaimFamily::Dual),
        [] => Ok(ClaimFamily::IPv4),
        other => Err(format!("unsupported spec.ipFamilies {other:?}")),
    }
}

/// Plans one pass over a Service: the skip rules, then the class, then its admission of
/// the namespace, then the family — each step either lets the plan go on or ends it.
pub fn plan_service(s: &ServiceSnapshot<'_>) -> ServicePlan {
    let planned = skip_rules(s)
        .and_then(|()| choose_class(s))
        .and_then(|class| {
            admitted(s, class)?;
            let family = family_for(s.service, class)?;
            Ok(ServicePlan::Create {
                class: class.name_any(),
                family,
            })
        });
    match planned {
        Ok(p) | Err(p) => p,
    }
}

/// Why a Service gets no new claim before any class is looked at: not a LoadBalancer,
/// names a claim, opted out, another load balancer's, already served — or its own claim
/// exists (annotate it) or the name is taken.
fn skip_rules(s: &ServiceSnapshot<'_>) -> Result<(), ServicePlan> {
    let svc = s.service;
    let annotations = svc.annotations();
    let spec = svc.spec.clone().unwrap_or_default();
    let is_lb = address_controller_api::service::is_load_balancer_type(svc);
    let owned_claim = s.claim.filter(|c| owned_by(c, svc));

    if !is_lb {
        // A Service that stops being a LoadBalancer keeps its address (never silently
        // freed); the tenant deletes the claim to give it back.
        return Err(match owned_claim {
            Some(c) => ServicePlan::Keep(PlannedEvent::normal(
                reason::NO_LONGER_LOAD_BALANCER,
                format!(
                    "the Service is no longer of type LoadBalancer; its IPAddressClaim {} and address are kept — delete the claim to release them",
                    c.name_any()
                ),
            )),
            None => ServicePlan::Skip(Skip::NotLoadBalancer),
        });
    }
    if address_controller_api::service::named_claim(svc).is_some() {
        return Err(ServicePlan::Skip(Skip::NamesAClaim));
    }
    match annotations
        .get(SERVICE_AUTO_CLAIM_ANNOTATION)
        .map(String::as_str)
    {
        Some("false") => return Err(ServicePlan::Skip(Skip::OptedOut)),
        None | Some("true") => {}
        Some(other) => {
            return Err(ServicePlan::Refuse(PlannedEvent::warning(
                reason::INVALID_ANNOTATION,
                format!(
                    "{SERVICE_AUTO_CLAIM_ANNOTATION}: {other:?} is not understood; set \"false\" to opt out (no claim created)"
                ),
            )));
        }
    }
    if spec
        .load_balancer_class
        .as_deref()
        .is_some_and(|c| !c.is_empty())
    {
        return Err(ServicePlan::Skip(Skip::LoadBalancerClass));
    }
    if spec
        .load_balancer_ip
        .as_deref()
        .is_some_and(|ip| !ip.is_empty())
    {
        return Err(ServicePlan::Skip(Skip::LoadBalancerIp));
    }
    if METALLB_ANNOTATIONS
        .iter()
        .any(|a| annotations.contains_key(*a))
    {
        return Err(ServicePlan::Skip(Skip::MetalLb));
    }
    if cilium::PIN_ANNOTATIONS
        .iter()
        .any(|a| annotations.contains_key(*a))
    {
        return Err(ServicePlan::Skip(Skip::Cilium));
    }
    let has_ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| i.iter().any(|x| x.ip.is_some() || x.hostname.is_some()));
    if has_ingress {
        return Err(ServicePlan::Skip(Skip::HasIngress));
    }
    if let Some(claim) = s.claim {
        if owned_claim.is_some() {
            return Err(ServicePlan::Annotate);
        }
        return Err(ServicePlan::Refuse(PlannedEvent::warning(
            reason::CLAIM_NAME_TAKEN,
            format!(
                "an IPAddressClaim named {:?} already exists and does not belong to this Service; it is not taken over",
                claim.name_any()
            ),
        )));
    }
    Ok(())
}

/// The class: the Service's annotation, else the single auto-claim class.
fn choose_class<'a>(s: &ServiceSnapshot<'a>) -> Result<&'a IPAddressClass, ServicePlan> {
    let annotations = s.service.annotations();
    let class = match annotations.get(SERVICE_CLASS_ANNOTATION) {
        Some(name) if !is_dns1123_subdomain(name) => {
            return Err(ServicePlan::Refuse(PlannedEvent::warning(
                reason::INVALID_ANNOTATION,
                format!("{SERVICE_CLASS_ANNOTATION}: {name:?} is not a valid class name"),
            )));
        }
        Some(name) => match s.classes.iter().find(|c| c.name_any() == *name) {
            Some(c) => c.as_ref(),
            None => {
                return Err(ServicePlan::Refuse(PlannedEvent::warning(
                    reason::CLASS_NOT_FOUND,
                    format!(
                        "IPAddressClass {name:?} named by {SERVICE_CLASS_ANNOTATION} does not exist; waiting for it"
                    ),
                )));
            }
        },
        None => match IPAddressClass::the_marked(s.classes, AUTO_CLAIM_CLASS_ANNOTATION) {
            Marked::None => return Err(ServicePlan::Skip(Skip::NoAutoClaimClass)),
            Marked::One(one) => one,
            Marked::Several(names) => {
                return Err(ServicePlan::Refuse(PlannedEvent::warning(
                    reason::AMBIGUOUS_AUTO_CLAIM_CLASS,
                    format!(
                        "several IPAddressClasses are marked for auto-claims ({}); no claim created",
                        names.join(", ")
                    ),
                )));
            }
        },
    };
    Ok(class)
}

/// §13: a namespace the class does not admit gets an event, not a claim (an address).
fn admitted(s: &ServiceSnapshot<'_>, class: &IPAddressClass) -> Result<(), ServicePlan> {
    let svc = s.service;
    let ns = svc.namespace().unwrap_or_default();
    if let Some(why) = class.refuses_namespace(&ns, s.namespace_labels) {
        return Err(ServicePlan::Refuse(PlannedEvent::warning(
            reason::NAMESPACE_NOT_ADMITTED,
            format!("{why}; no claim created"),
        )));
    }
    Ok(())
}

/// The family the Service asks for, when the class can serve it.
fn family_for(svc: &Service, class: &IPAddressClass) -> Result<ClaimFamily, ServicePlan> {
    let family = match service_family(svc) {
        Ok(f) => f,
        Err(why) => {
            return Err(ServicePlan::Refuse(PlannedEvent::warning(
                reason::FAMILY_UNSUPPORTED,
                why,
            )));
        }
    };
    // A class whose driver reports capacity says which families it can serve.
    if let Some(cap) = class.status.as_ref().and_then(|s| s.capacity.as_ref()) {
        let serves = |n: Option<i64>| n.unwrap_or(0) > 0;
        let missing: Vec<&str> = family
            .families()
            .iter()
            .filter(|f| match f {
                address_controller_api::Family::IPv4 => !serves(cap.ipv4),
                address_controller_api::Family::IPv6 => !serves(cap.ipv6),
            })
            .map(|f| f.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(ServicePlan::Refuse(PlannedEvent::warning(
                reason::FAMILY_UNSUPPORTED,
                format!(
                    "IPAddressClass {:?} has no {} capacity; the Service asks for {}",
                    class.name_any(),
                    missing.join(" or "),
                    family.as_str()
                ),
            )));
        }
    }
    Ok(family)
}
