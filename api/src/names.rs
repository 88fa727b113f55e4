//! Well-known names (SPEC §2). Everything that two components must spell the same way
//! is defined once here.

/// The CRD group.
pub const GROUP: &str = "local.sdn.cozystack.io";
/// The CRD version.
pub const VERSION: &str = "v1alpha1";

/// Claim annotation naming the provisioner of the resolved class: the drivers' watch key.
pub const PROVISIONER_ANNOTATION: &str = "local.sdn.cozystack.io/provisioner";

/// Service annotation naming a claim in the Service's own namespace.
pub const SERVICE_CLAIM_ANNOTATION: &str = "local.sdn.cozystack.io/ip-address-claim";
/// Service annotation naming the class an auto-claim should use.
pub const SERVICE_CLASS_ANNOTATION: &str = "local.sdn.cozystack.io/ip-address-class";
/// Service annotation; the value `"false"` opts the Service out of auto-claims.
pub const SERVICE_AUTO_CLAIM_ANNOTATION: &str = "local.sdn.cozystack.io/auto-claim";

/// Class annotation marking the default class for claims that name none.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ipaddressclass.local.sdn.cozystack.io/is-default-class";
/// Class annotation marking the class used for auto-claims.
pub const AUTO_CLAIM_CLASS_ANNOTATION: &str =
    "ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class";
/// Address annotation a driver built on the kit puts on the addresses it provisions: the
/// provisioner's name. Only those are the backend's to lose (`Lost`); an admin's static
/// addresses of the class are not in its books.
pub const PROVISIONED_BY_ANNOTATION: &str = "ipaddress.local.sdn.cozystack.io/provisioned-by";
/// Address annotation: a Released address that waits for an admin despite a release delay.
pub const HELD_ANNOTATION: &str = "ipaddress.local.sdn.cozystack.io/held";

/// On a Lease of this project: who holds it — `controller` (the core) or `driver`.
pub const LEASE_COMPONENT_ANNOTATION: &str = "local.sdn.cozystack.io/component";
/// The same, as a label: the core watches the drivers' Leases by it
/// (`local.sdn.cozystack.io/component=driver`) to tell whether a class is served.
pub const LEASE_COMPONENT_LABEL: &str = "local.sdn.cozystack.io/component";
/// On a driver's Lease: the provisioner it serves (`address-controller check` matches
/// classes with it).
pub const LEASE_PROVISIONER_ANNOTATION: &str = "local.sdn.cozystack.io/provisioner";

/// The Leases of the Go pair this project replaces (their controller-runtime election IDs,
/// in whatever namespace they ran): while one is held and renewed, no binary of this
/// project starts — two controllers would write the same objects (docs/operations.md,
/// "Migrating to address-controller").
pub const GO_PAIR_LEASES: &[(&str, &str)] = &[
    ("a4cfeeab.sdn.cozystack.io", "the Go address-controller"),
    (
        "e1633266.iad.cozystack.io",
        "the Go MetalLB driver (metallb-iad)",
    ),
];

/// On a claim and its addresses made by `address-controller adopt`: the Service adopted,
/// `Service/<namespace>/<name>` (what `adopt --undo` reverses).
pub const ADOPTED_FROM: &str = "local.sdn.cozystack.io/adopted-from";
/// On an adopted claim: the Service's annotations and `spec.loadBalancerIP` before the
/// adoption (JSON), restored exactly by `adopt --undo`.
pub const ADOPTED_PRIOR: &str = "local.sdn.cozystack.io/adopted-prior";

/// The APIService of the aggregated views.
pub const VIEWS_APISERVICE: &str = "v1alpha1.view.local.sdn.cozystack.io";

/// Whether a finalizer is this project's: the core's (`local.sdn.cozystack.io/…`) or a
/// driver's (`<driver>.drivers.local.sdn.cozystack.io/…`, e.g. MetalLB's hold) — what
/// `address-controller teardown` removes once nothing runs to remove them.
/// The finalizer list with `finalizer` added, or `None` when it is already there.
pub fn with_finalizer(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let mut out = finalizers.to_vec();
    out.push(finalizer.to_string());
    Some(out)
}

/// The finalizer list without `finalizer`, or `None` when it is not there.
pub fn without_finalizer(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    Some(
        finalizers
            .iter()
            .filter(|f| *f != finalizer)
            .cloned()
            .collect(),
    )
}

pub fn is_project_finalizer(f: &str) -> bool {
    f.split_once('/').is_some_and(|(domain, _)| {
        domain == "local.sdn.cozystack.io" || domain.ends_with(".local.sdn.cozystack.io")
    })
}

/// Whether `v` is a valid label value: at most 63 characters, alphanumerics with `-`, `_`
/// and `.` inside (empty too).
pub fn is_label_value(v: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric();
    v.len() <= 63
        && v.chars().all(|c| ok(c) || matches!(c, '-' | '_' | '.'))
        && v.chars().next().is_none_or(ok)
        && v.chars().last().is_none_or(ok)
}

/// Finalizer the core puts on claims.
pub const CLAIM_FINALIZER: &str = "local.sdn.cozystack.io/claim-protection";
/// Finalizer the core puts on addresses.
pub const ADDRESS_FINALIZER: &str = "local.sdn.cozystack.io/address-protection";

/// Only this exact value turns a boolean annotation on.
pub const TRUE: &str = "true";

/// Whether `annotations[key]` is exactly `"true"`.
pub fn annotation_is_true(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    key: &str,
) -> bool {
    annotations.and_then(|a| a.get(key)).map(String::as_str) == Some(TRUE)
}

/// Claim condition types.
pub mod condition {
    pub const CLASS_RESOLVED: &str = "ClassResolved";
    pub const BOUND: &str = "Bound";
    /// Class condition the core keeps on classes served by a driver: whether a driver
    /// holding a live Lease for the class's provisioner runs.
    pub const DRIVER_AVAILABLE: &str = "DriverAvailable";
}

/// Claim condition reasons.
pub mod reason {
    pub const RESOLVED: &str = "Resolved";
    pub const CLASS_NOT_FOUND: &str = "ClassNotFound";
    pub const NO_DEFAULT_CLASS: &str = "NoDefaultClass";
    pub const MULTIPLE_DEFAULT_CLASSES: &str = "MultipleDefaultClasses";
    pub const BOUND: &str = "Bound";
    pub const WAITING_FOR_PROVISIONING: &str = "WaitingForProvisioning";
    pub const WAITING_FOR_ADDRESS: &str = "WaitingForAddress";
    pub const ADDRESS_LOST: &str = "AddressLost";
    /// `Bound` False: the resolved class's namespaceSelector does not admit the claim's
    /// namespace (SPEC §13).
    pub const NAMESPACE_NOT_ADMITTED: &str = "NamespaceNotAdmitted";
    /// `Bound` False: binding would take the namespace over an IPAddressQuota (SPEC §13).
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// `DriverAvailable` True: a Lease of the provisioner is held and renewed.
    pub const DRIVER_RUNNING: &str = "DriverRunning";
    /// `DriverAvailable` False: no Lease of the provisioner is held and renewed.
    pub const NO_LIVE_DRIVER: &str = "NoLiveDriver";
}

/// Why an address is `Released` (`status.reason`).
pub mod released {
    /// Its claim already held another address of the family (SPEC §5.7): never granted.
    pub const SURPLUS: &str = "Surplus";
    /// The claim's reclaim policy (§6) or the safety net for a claim that is gone (§5.6).
    pub const RECLAIMED: &str = "Reclaimed";
}

/// Event reasons.
pub mod event {
    // on claims
    pub const MATCHED: &str = "Matched";
    /// A claim became Bound to an address it did not match itself (pre-bound by a driver).
    pub const BOUND: &str = "Bound";
    /// An address naming the claim was released because the claim already holds one of
    /// its family (SPEC §5.7).
    pub const SURPLUS_ADDRESS: &str = "SurplusAddress";
    pub const ADDRESS_RELEASED: &str = "AddressReleased";
    pub const ADDRESS_DELETED: &str = "AddressDeleted";
    // on addresses
    pub const INVALID_ADDRESS: &str = "InvalidAddress";
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";
    pub const RECLAIMED: &str = "Reclaimed";
    pub const RELEASE_DELAY_ELAPSED: &str = "ReleaseDelayElapsed";
    /// A claim pins (`spec.addressName`) an address another claim holds: the detail, on the
    /// cluster-scoped address an admin reads — the claim itself reads only "not available".
    pub const PIN_REFUSED: &str = "PinRefused";
}

/// What a driver reports (SPEC §8): the driver kit publishes these and the driver
/// conformance suite expects them.
/// The MetalLB driver's own marks on what it keeps (`drivers/metallb`): one spelling for the
/// driver and for the Cilium driver's `takeover --from metallb`, which moves them.
pub mod metallb_driver {
    /// On each IPAddress: the driver lets go of MetalLB's hold behind it.
    pub const FINALIZER: &str = "metallb.drivers.local.sdn.cozystack.io/hold";
    /// On each class's IPAddressPool while addresses of the class are left.
    pub const POOL_FINALIZER: &str = "metallb.drivers.local.sdn.cozystack.io/pool";
    /// `app.kubernetes.io/managed-by` of its holds, pools and advertisements.
    pub const MANAGER: &str = "address-controller-metallb-driver";
    /// On a hold: the IPAddress it holds.
    pub const HOLDS: &str = "metallb.drivers.local.sdn.cozystack.io/address";
    /// Its binary's name (the kit's record of its pins is named after it).
    pub const NAME: &str = "metallb-driver";
}

pub mod driver {
    /// The provisioner of the range driver this project ships (`drivers/range`).
    pub const RANGE_PROVISIONER: &str = "range.drivers.local.sdn.cozystack.io";
    /// The provisioner of the MetalLB driver this project ships (`drivers/metallb`) — the
    /// same as the Go driver's it replaces.
    pub const METALLB_PROVISIONER: &str = "metallb.drivers.local.sdn.cozystack.io";
    /// The provisioner of the Cilium LB-IPAM driver this project ships (`drivers/cilium`):
    /// its classes take the MetalLB driver's parameters (`addresses`), so a class moves
    /// between the two by its provisioner alone.
    pub const CILIUM_PROVISIONER: &str = "cilium.drivers.local.sdn.cozystack.io";

    /// Class condition: the parameters can be allocated from.
    pub const PARAMETERS_VALID: &str = "ParametersValid";
    /// Class condition: a family's addresses reached its capacity.
    pub const EXHAUSTED: &str = "Exhausted";
    /// Event on a claim: its class's parameters cannot be allocated from.
    pub const INVALID_CLASS_PARAMETERS: &str = "InvalidClassParameters";
    /// Event on a claim: no free address of a family it needs.
    pub const EXHAUSTED_EVENT: &str = "Exhausted";
    /// Event on a claim: allocation failed for another reason.
    pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
    /// Event on a class: its parameters are invalid.
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";

    // Association (SPEC §8): events on the Service.
    /// The claim's addresses were put on the Service.
    pub const ASSOCIATED: &str = "Associated";
    /// The VM behind a Service cozy-proxy serves began to move between nodes; its address
    /// stays on the Service.
    pub const MIGRATING: &str = "Migrating";
    /// More than one workload is behind a Service cozy-proxy serves that holds its
    /// address: it keeps it for the hold-down.
    pub const HELD_DOWN: &str = "HeldDown";
    /// The Service names a claim that does not exist in its namespace.
    pub const CLAIM_NOT_FOUND: &str = "ClaimNotFound";
    /// The Service names a claim that is not Bound (Pending or Lost).
    pub const CLAIM_NOT_BOUND: &str = "ClaimNotBound";
    /// The Service names a claim that already serves another Service, or a claim of another
    /// namespace that does not exist or does not share with the Service's namespace (one
    /// answer for both: a reference never tells whether another namespace's claim exists).
    pub const ASSOCIATION_REJECTED: &str = "AssociationRejected";
    /// Event on a claim: a Service of another namespace names it and was refused (the
    /// namespace named, never the Service).
    pub const SERVICE_REFUSED: &str = "ServiceRefused";
    /// The claim's addresses were taken off the Service.
    pub const DISASSOCIATED: &str = "Disassociated";
    /// An address of the claim is of a family the Service does not have; it is not pinned.
    pub const FAMILY_MISMATCH: &str = "FamilyMismatch";
    /// An address of the claim the backend cannot put on a Service (outside what it serves).
    pub const ADDRESS_NOT_SERVED: &str = "AddressNotServed";

    /// Event on an address and on the Service using it: a Service holds a claimed address
    /// that the ledger does not give it. Also the address condition type (True while it lasts).
    pub const CONFLICT: &str = "Conflict";
    /// Event on an address: the backend no longer has it (also the condition type).
    pub const ADDRESS_LOST: &str = "AddressLost";
    /// Address condition type: the backend has lost the address (True while it lasts).
    pub const LOST: &str = "Lost";
    /// Event on an address: a Conflict or Lost episode ended.
    pub const RECOVERED: &str = "Recovered";

    /// Service annotation the driver kit keeps: the addresses it asked the backend to put
    /// on the Service (comma-separated), so that it withdraws exactly its own pins.
    pub fn pinned_annotation(driver: &str) -> String {
        format!("{driver}.drivers.local.sdn.cozystack.io/pinned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_projects_finalizers_are_told_from_others() {
        for f in [
            CLAIM_FINALIZER,
            ADDRESS_FINALIZER,
            "metallb.drivers.local.sdn.cozystack.io/hold",
        ] {
            assert!(is_project_finalizer(f), "{f}");
        }
        for f in [
            "kubernetes.io/pvc-protection",
            "evil-local.sdn.cozystack.io/x",
            "local.sdn.cozystack.io",
            "foregroundDeletion",
        ] {
            assert!(!is_project_finalizer(f), "{f}");
        }
    }

    #[test]
    fn only_exact_true_counts() {
        let with =
            |v: &str| BTreeMap::from([(DEFAULT_CLASS_ANNOTATION.to_string(), v.to_string())]);
        assert!(annotation_is_true(
            Some(&with("true")),
            DEFAULT_CLASS_ANNOTATION
        ));
        for v in ["True", "TRUE", "yes", "1", "", " true"] {
            assert!(
                !annotation_is_true(Some(&with(v)), DEFAULT_CLASS_ANNOTATION),
                "{v:?}"
            );
        }
        assert!(!annotation_is_true(None, DEFAULT_CLASS_ANNOTATION));
        assert!(!annotation_is_true(Some(&with("true")), HELD_ANNOTATION));
    }
}
