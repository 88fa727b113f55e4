//! Entitlements (SPEC §13), spelled once: which namespaces a class admits, what counts
//! toward a namespace's quota, and whether a claim fits. The core enforces them at bind
//! time, the views show them, the invariant checker audits them — all through these.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use crate::family::{Family, family_of};
use crate::names::{condition, reason};
use crate::{
    ClaimPhase, IPAddress, IPAddressClaim, IPAddressClaimStatus, IPAddressClass, IPAddressQuota,
};

/// Whether a namespace's change can change what it is entitled to (SPEC §13): it
/// appeared, it went, or its labels changed (no labels and empty labels are the same).
/// Its status and annotations are not news.
pub fn namespace_entitlement_changed(
    old: Option<&k8s_openapi::api::core::v1::Namespace>,
    new: Option<&k8s_openapi::api::core::v1::Namespace>,
) -> bool {
    match (old, new) {
        (Some(o), Some(n)) => o.labels() != n.labels(),
        (None, None) => false,
        _ => true,
    }
}

/// Whether `labels` satisfy `selector` (`metav1.LabelSelector` semantics: every
/// `matchLabels` pair and every expression; an empty selector matches everything). An
/// operator the schema would have refused matches nothing.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    crate::selector::requirements(selector).is_some_and(|rs| rs.iter().all(|r| r.matches(labels)))
}

/// A selector as a label-selector string (`tier=gold,region in (eu,us)`), for messages.
pub fn describe_selector(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => format!("{} {other} ({values})", e.key),
        });
    }
    parts.join(",")
}

impl IPAddressClass {
    /// Whether a namespace with these labels may claim from the class (`None`: the
    /// namespace is unknown — admitted only by a class without a selector).
    pub fn admits(&self, namespace_labels: Option<&BTreeMap<String, String>>) -> bool {
        match &self.spec.namespace_selector {
            None => true,
            Some(sel) => namespace_labels.is_some_and(|l| selector_matches(sel, l)),
        }
    }

    /// Why the class does not admit namespace `ns`, or `None` when it does.
    pub fn refuses_namespace(
        &self,
        ns: &str,
        namespace_labels: Option<&BTreeMap<String, String>>,
    ) -> Option<String> {
        if self.admits(namespace_labels) {
            return None;
        }
        let sel = self
            .spec
            .namespace_selector
            .as_ref()
            .map(describe_selector)
            .unwrap_or_default();
        Some(format!(
            "IPAddressClass {:?} does not admit namespace {ns:?}: its namespaceSelector ({sel}) does not match the namespace's labels",
            self.name_any()
        ))
    }
}

impl IPAddress {
    /// Where the address counts toward a quota: the namespace of the claim its claimRef
    /// names, and its family — whatever its phase (bound, pre-bound, reserved, `Released`
    /// and retained, `Lost`, being deleted). An address without a claimRef is nobody's, and
    /// a released surplus ([`IPAddress::is_surplus`]) was never granted: neither counts.
    pub fn quota_slot(&self) -> Option<(&str, Family)> {
        if self.is_surplus() {
            return None;
        }
        let r = self.spec.claim_ref.as_ref()?;
        Some((r.namespace.as_str(), self.family()?))
    }

    /// Whether the address serves the claim its claimRef names for its family: every
    /// binding but the one that was released (a `Released` address is still counted, but
    /// the claim of that name does not hold it).
    pub fn serves_its_claim(&self) -> bool {
        self.spec.claim_ref.is_some() && !self.is_released()
    }
}

impl IPAddressClaim {
    /// Whether the core invited a driver to provision for this claim: `Pending`, not being
    /// deleted, not pinned, with `Bound` reason `WaitingForProvisioning` judged for the
    /// spec the claim has now (the condition's `observedGeneration` is the claim's
    /// generation). The driver kit provisions only for such a claim; the quota counts it. A
    /// family changed after the invitation is no invitation until the core judged it again
    /// (the entitlement and the quota were counted for the family before).
    pub fn waits_for_provisioning(&self) -> bool {
        let Some(status) = self.status.as_ref() else {
            return false;
        };
        !self.is_deleting()
            && self.spec.address_name.is_none()
            && status.phase == Some(ClaimPhase::Pending)
            && status.conditions.iter().any(|c| {
                c.type_ == condition::BOUND
                    && c.reason == reason::WAITING_FOR_PROVISIONING
                    && c.observed_generation.is_some()
                    && c.observed_generation == self.metadata.generation
            })
    }

    /// The families of the addresses the claim's status lists (SPEC §4.8: the projection of
    /// the claimRefs naming it), each once.
    pub fn listed_families(&self) -> Vec<Family> {
        let mut have: Vec<Family> = self
            .status
            .iter()
            .flat_map(|s| s.addresses.iter())
            .filter_map(|a| family_of(&a.address).ok())
            .collect();
        have.sort();
        have.dedup();
        have
    }

    /// The families of the claim its status does not list yet.
    pub fn unlisted_families(&self) -> Vec<Family> {
        let have = self.listed_families();
        self.families_missing(|f| have.contains(&f))
    }

    /// The (class, families) a driver is invited to provision: what the quota counts for a
    /// claim on top of the addresses naming it.
    pub fn invitation(&self) -> Option<(&str, Vec<Family>)> {
        if !self.waits_for_provisioning() {
            return None;
        }
        let class = self
            .status
            .as_ref()?
            .class_name
            .as_deref()
            .filter(|c| !c.is_empty())?;
        Some((class, self.unlisted_families()))
    }

    /// Whether the core refuses the claim for an entitlement (not admitted, or over quota):
    /// `Pending` with one of those reasons. Such a claim waits for a change of the
    /// namespace, the class, the quota or the usage — not for free addresses.
    pub fn is_refused_entitlement(&self) -> bool {
        self.entitlement_refusal().is_some()
    }

    /// The entitlement reason refusing the claim (`QuotaExceeded` or
    /// `NamespaceNotAdmitted`), when it is `Pending` with one.
    pub fn entitlement_refusal(&self) -> Option<&'static str> {
        self.status.as_ref()?.entitlement_refusal()
    }
}

impl IPAddressClaimStatus {
    /// See [`IPAddressClaim::entitlement_refusal`].
    pub fn entitlement_refusal(&self) -> Option<&'static str> {
        if self.phase != Some(ClaimPhase::Pending) {
            return None;
        }
        let bound = self
            .conditions
            .iter()
            .find(|c| c.type_ == condition::BOUND)?;
        [reason::QUOTA_EXCEEDED, reason::NAMESPACE_NOT_ADMITTED]
            .into_iter()
            .find(|r| *r == bound.reason)
    }
}

/// One limit and the quota that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub value: i64,
    /// `namespace/name` of the IPAddressQuota.
    pub quota: String,
}

/// The limits on one class in one namespace: the strictest of every quota there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Every family together.
    pub addresses: Option<Limit>,
    pub ipv4: Option<Limit>,
    pub ipv6: Option<Limit>,
}

/// Addresses counted toward a quota, per family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub ipv4: i64,
    pub ipv6: i64,
}

impl Usage {
    pub fn of(&self, f: Family) -> i64 {
        match f {
            Family::IPv4 => self.ipv4,
            Family::IPv6 => self.ipv6,
        }
    }

    pub fn add(&mut self, f: Family, n: i64) {
        match f {
            Family::IPv4 => self.ipv4 += n,
            Family::IPv6 => self.ipv6 += n,
        }
    }

    pub fn total(&self) -> i64 {
        self.ipv4 + self.ipv6
    }
}

impl QuotaLimits {
    /// The limit of one family.
    pub fn of(&self, f: Family) -> Option<&Limit> {
        match f {
            Family::IPv4 => self.ipv4.as_ref(),
            Family::IPv6 => self.ipv6.as_ref(),
        }
    }

    /// The strictest limits on `class` among `quotas` (those of one namespace); `None`
    /// when none of them limits the class.
    pub fn of_class<'a>(
        quotas: impl IntoIterator<Item = &'a IPAddressQuota>,
        class: &str,
    ) -> Option<QuotaLimits> {
        fn tighter(slot: &mut Option<Limit>, value: Option<i64>, quota: &str) {
            if let Some(v) = value
                && slot.as_ref().is_none_or(|l| v < l.value)
            {
                *slot = Some(Limit {
                    value: v,
                    quota: quota.to_string(),
                });
            }
        }
        let mut out: Option<QuotaLimits> = None;
        for q in quotas {
            let name = format!("{}/{}", q.namespace().unwrap_or_default(), q.name_any());
            for l in q.spec.limits.iter().filter(|l| l.class_name == class) {
                let limits = out.get_or_insert_with(QuotaLimits::default);
                tighter(&mut limits.addresses, l.addresses, &name);
                tighter(&mut limits.ipv4, l.ipv4, &name);
                tighter(&mut limits.ipv6, l.ipv6, &name);
            }
        }
        out
    }

    /// Whether one more address of each family in `need` fits on top of `used`; the
    /// refusal names the limit, the quota that sets it, the usage and the need.
    pub fn admit(&self, class: &str, used: &Usage, need: &[Family]) -> Result<(), String> {
        let mut want = Usage::default();
        for f in need {
            want.add(*f, 1);
        }
        let mut refusals = Vec::new();
        for f in [Family::IPv4, Family::IPv6] {
            if let Some(l) = self.of(f)
                && want.of(f) > 0
                && used.of(f) + want.of(f) > l.value
            {
                refusals.push(format!(
                    "IPAddressQuota {} allows {} {f} address(es) of class {class:?}; the namespace holds {} and the claim needs {}",
                    l.quota,
                    l.value,
                    used.of(f),
                    want.of(f)
                ));
            }
        }
        if let Some(l) = &self.addresses
            && want.total() > 0
            && used.total() + want.total() > l.value
        {
            refusals.push(format!(
                "IPAddressQuota {} allows {} address(es) of class {class:?}; the namespace holds {} and the claim needs {}",
                l.quota,
                l.value,
                used.total(),
                want.total()
            ));
        }
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(refusals.join("; "))
        }
    }

    /// What remains of each limit given `used` (never below zero).
    pub fn remaining(&self, used: &Usage) -> (Option<i64>, Option<i64>, Option<i64>) {
        let left = |l: Option<&Limit>, u: i64| l.map(|l| (l.value - u).max(0));
        (
            left(self.addresses.as_ref(), used.total()),
            left(self.ipv4.as_ref(), used.ipv4),
            left(self.ipv6.as_ref(), used.ipv6),
        )
    }

    /// Whether `used` exceeds any limit (possible only after a limit was lowered: the core
    /// never takes an address back).
    pub fn exceeded_by(&self, used: &Usage) -> bool {
        self.addresses
            .as_ref()
            .is_some_and(|l| used.total() > l.value)
            || self.ipv4.as_ref().is_some_and(|l| used.ipv4 > l.value)
            || self.ipv6.as_ref().is_some_and(|l| used.ipv6 > l.value)
    }
}

/// The usage of one namespace per class, computed from scratch (the views and the
/// invariant checker; the core keeps the same count incrementally): every address counted
/// by [`IPAddress::quota_slot`] in `ns`, plus every family a claim of `ns` is invited to
/// have provisioned that no address serving it ([`IPAddress::serves_its_claim`]) covers.
pub fn usage_by_class<'a>(
    ns: &str,
    claims: impl IntoIterator<Item = &'a IPAddressClaim>,
    addresses: impl IntoIterator<Item = &'a IPAddress> + Clone,
) -> BTreeMap<String, Usage> {
    let mut out: BTreeMap<String, Usage> = BTreeMap::new();
    let mut served: std::collections::HashSet<(String, Family)> = Default::default();
    for a in addresses {
        let Some((a_ns, f)) = a.quota_slot() else {
            continue;
        };
        if a_ns != ns {
            continue;
        }
        out.entry(a.spec.class_name.clone()).or_default().add(f, 1);
        if a.serves_its_claim()
            && let Some(r) = a.spec.claim_ref.as_ref()
        {
            served.insert((r.name.clone(), f));
        }
    }
    for c in claims {
        if c.namespace().as_deref() != Some(ns) {
            continue;
        }
        if let Some((class, families)) = c.invitation() {
            for f in families {
                if !served.contains(&(c.name_any(), f)) {
                    out.entry(class.to_string()).or_default().add(f, 1);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn an_invitation_is_for_the_spec_the_core_judged() {
        let claim = |generation: i64, observed: Option<i64>| -> IPAddressClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "t", "generation": generation},
                "spec": {"family": "IPv6"},
                "status": {"phase": "Pending", "className": "pub", "conditions": [{
                    "type": "Bound", "status": "False", "reason": "WaitingForProvisioning",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": observed}]}
            }))
            .unwrap()
        };
        assert!(claim(1, Some(1)).waits_for_provisioning());
        assert_eq!(
            claim(1, Some(1)).invitation(),
            Some(("pub", vec![Family::IPv6]))
        );
        // The family changed after the invitation (generation 2): re-judged first.
        assert!(!claim(2, Some(1)).waits_for_provisioning());
        assert_eq!(claim(2, Some(1)).invitation(), None);
        assert!(!claim(1, None).waits_for_provisioning());
    }

    #[test]
    fn a_namespace_change_is_news_when_it_appears_goes_or_relabels() {
        let ns = |v: serde_json::Value| -> k8s_openapi::api::core::v1::Namespace {
            serde_json::from_value(v).unwrap()
        };
        let bare = ns(json!({"metadata": {"name": "t"}}));
        let empty = ns(json!({"metadata": {"name": "t", "labels": {}}}));
        let gold = ns(json!({"metadata": {"name": "t", "labels": {"tier": "gold"}}}));
        let gold_active = ns(
            json!({"metadata": {"name": "t", "labels": {"tier": "gold"}}, "status": {"phase": "Active"}}),
        );
        let changed = |o: Option<&_>, n: Option<&_>| namespace_entitlement_changed(o, n);
        assert!(changed(None, Some(&bare)), "created");
        assert!(changed(Some(&bare), None), "deleted, even without labels");
        assert!(changed(Some(&bare), Some(&gold)), "labelled");
        assert!(
            !changed(Some(&bare), Some(&empty)),
            "no labels are empty labels"
        );
        assert!(
            !changed(Some(&gold), Some(&gold_active)),
            "status is not news"
        );
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_follow_label_selector_semantics() {
        let sel: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"tier": "gold"},
            "matchExpressions": [
                {"key": "region", "operator": "In", "values": ["eu", "us"]},
                {"key": "frozen", "operator": "DoesNotExist"},
                {"key": "env", "operator": "NotIn", "values": ["test"]},
                {"key": "billing", "operator": "Exists"}
            ]
        }))
        .unwrap();
        let ok = labels(&[("tier", "gold"), ("region", "eu"), ("billing", "x")]);
        assert!(selector_matches(&sel, &ok));
        for (k, v) in [("tier", "silver"), ("region", "asia"), ("env", "test")] {
            let mut l = ok.clone();
            l.insert(k.into(), v.into());
            assert!(!selector_matches(&sel, &l), "{k}={v}");
        }
        let mut frozen = ok.clone();
        frozen.insert("frozen".into(), String::new());
        assert!(!selector_matches(&sel, &frozen));
        let mut unbilled = ok.clone();
        unbilled.remove("billing");
        assert!(!selector_matches(&sel, &unbilled));
        assert!(selector_matches(&LabelSelector::default(), &labels(&[])));
        let bad: LabelSelector = serde_json::from_value(
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        )
        .unwrap();
        assert!(!selector_matches(&bad, &labels(&[("a", "2")])));
        assert_eq!(
            describe_selector(&sel),
            "tier=gold,region in (eu,us),!frozen,env notin (test),billing"
        );
    }

    #[test]
    fn a_class_without_selector_admits_every_namespace_even_unknown_ones() {
        let open: IPAddressClass = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"provisioner": "p"}}),
        )
        .unwrap();
        assert!(open.admits(None));
        let closed: IPAddressClass = serde_json::from_value(json!({"metadata": {"name": "c"},
            "spec": {"provisioner": "p", "namespaceSelector": {"matchLabels": {"tier": "gold"}}}}))
        .unwrap();
        assert!(!closed.admits(None));
        assert!(closed.admits(Some(&labels(&[("tier", "gold")]))));
        let why = closed
            .refuses_namespace("t", Some(&labels(&[("tier", "silver")])))
            .unwrap();
        assert!(
            why.contains("\"c\"") && why.contains("\"t\"") && why.contains("tier=gold"),
            "{why}"
        );
    }

    fn quota(name: &str, limits: serde_json::Value) -> IPAddressQuota {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "t"}, "spec": {"limits": limits}}),
        )
        .unwrap()
    }

    #[test]
    fn the_strictest_limit_wins_and_a_dual_claim_needs_two() {
        let a = quota(
            "a",
            json!([{"className": "pub", "addresses": 3, "ipv6": 5}]),
        );
        let b = quota(
            "b",
            json!([{"className": "pub", "addresses": 2}, {"className": "other", "ipv4": 1}]),
        );
        let l = QuotaLimits::of_class([&a, &b], "pub").unwrap();
        assert_eq!(l.addresses.as_ref().unwrap().value, 2);
        assert_eq!(l.addresses.as_ref().unwrap().quota, "t/b");
        assert_eq!(l.ipv6.as_ref().unwrap().value, 5);
        assert_eq!(l.ipv4, None);
        assert_eq!(QuotaLimits::of_class([&a, &b], "none"), None);
        let empty = Usage::default();
        assert!(
            l.admit("pub", &empty, &[Family::IPv4, Family::IPv6])
                .is_ok()
        );
        let one = Usage { ipv4: 1, ipv6: 0 };
        let why = l
            .admit("pub", &one, &[Family::IPv4, Family::IPv6])
            .unwrap_err();
        assert!(
            why.contains("t/b allows 2 address(es)")
                && why.contains("holds 1 and the claim needs 2"),
            "{why}"
        );
        assert!(l.admit("pub", &one, &[Family::IPv6]).is_ok());
        assert!(
            l.admit("pub", &Usage { ipv4: 5, ipv6: 0 }, &[]).is_ok(),
            "needing nothing always fits"
        );
        assert!(l.exceeded_by(&Usage { ipv4: 3, ipv6: 0 }));
        assert!(!l.exceeded_by(&Usage { ipv4: 1, ipv6: 1 }));
        assert_eq!(l.remaining(&one), (Some(1), None, Some(5)));
    }

    #[test]
    fn usage_counts_every_address_naming_the_namespace_and_uncovered_invitations() {
        let addr = |name: &str, ip: &str, claim: &str, phase: &str| -> IPAddress {
            serde_json::from_value(json!({"metadata": {"name": name},
                "spec": {"address": ip, "className": "pub", "source": {"fromClass": {}},
                    "claimRef": {"namespace": "t", "name": claim}},
                "status": {"phase": phase}}))
            .unwrap()
        };
        let waiting = |name: &str, family: &str| -> IPAddressClaim {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "t", "generation": 1},
                "spec": {"family": family},
                "status": {"phase": "Pending", "className": "pub", "conditions": [{"type": "Bound",
                    "status": "False", "reason": "WaitingForProvisioning", "message": "", "observedGeneration": 1,
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
            .unwrap()
        };
        let addresses = [
            addr("a", "192.0.2.1", "x", "Bound"),
            addr("b", "192.0.2.2", "gone", "Released"),
            // The invited claim's address landed before the claim's status moved on.
            addr("c", "2001:db8::1", "d", "Bound"),
        ];
        let claims = [waiting("w", "IPv4"), waiting("d", "Dual")];
        let u = usage_by_class("t", claims.iter(), addresses.iter());
        // a, b (Released still counts), w's invitation, d's IPv4 invitation; d's IPv6 is c.
        assert_eq!(u["pub"], Usage { ipv4: 4, ipv6: 1 });
        assert!(usage_by_class("u", claims.iter(), addresses.iter()).is_empty());
    }
}
