//! The permissions `range-driver` needs, in one list. `make manifests` writes them (via
//! `range-driver --print-cluster-role`) into the chart's
//! `files/range-driver-role.yaml`; a test fails when the committed file differs.

use address_controller_controller::rbac::{Rule, render};

/// Name of the driver's ClusterRole in the chart.
pub const CLUSTER_ROLE: &str = "address-controller-range-driver";

const RULES: &[Rule] = &[
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclaims"],
        verbs: &["get", "list", "watch"],
        why: "claims stamped with this driver's provisioner",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddresses"],
        verbs: &["get", "list", "watch", "create"],
        why: "what is taken; creating an address is the allocation (SPEC §8)",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclasses"],
        verbs: &["get", "list", "watch"],
        why: "the CIDRs in spec.parameters",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclasses/status"],
        verbs: &["patch"],
        why: "class capacity and conditions",
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "create", "update"],
        why: "leader election",
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        why: "events",
    },
];

/// The driver's ClusterRole as committed in the chart.
pub fn cluster_role_yaml() -> Result<String, serde_yaml::Error> {
    render(CLUSTER_ROLE, "driver/src/rbac.rs", RULES)
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_cluster_role_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../chart/address-controller/files/range-driver-role.yaml");
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == super::cluster_role_yaml().unwrap(),
            "{} is stale; run `make manifests`",
            path.display()
        );
    }
}
