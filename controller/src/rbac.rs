//! The permissions the binary needs, in one list. `make manifests` renders them as the
//! chart's ClusterRole; a test fails when the committed file differs.

use address_controller_runtime::rbac::{
    LEADER_ELECTION_RULES, RUNTIME_RULES, Rule, cluster_role_of, render,
};
use k8s_openapi::api::rbac::v1::ClusterRole;

/// Name of the generated ClusterRole.
pub const CLUSTER_ROLE: &str = "address-controller";

const RULES: &[Rule] = &[
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclaims"],
        verbs: &["get", "list", "watch", "patch", "create"],
        why: "bind claims (finalizer, provisioner stamp); create auto-claims",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclaims/status"],
        verbs: &["patch"],
        why: "claim status",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddresses"],
        verbs: &["get", "list", "watch", "patch", "delete"],
        why: "claimRef, finalizer, reclaim",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddresses/status"],
        verbs: &["patch"],
        why: "address phase",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclasses"],
        verbs: &["get", "list", "watch"],
        why: "class resolution",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressrecords"],
        verbs: &["get", "list", "watch", "create", "delete"],
        why: "the history's records: create those of closed holdings, serve them in the views, prune them past the retention",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressclasses/status"],
        verbs: &["patch"],
        why: "the classes' DriverAvailable condition",
    },
    Rule {
        group: "local.sdn.cozystack.io",
        resources: &["ipaddressquotas"],
        verbs: &["get", "list", "watch"],
        why: "entitlements: the namespaces' quotas (never written: they are the admin's)",
    },
    Rule {
        group: "",
        resources: &["namespaces"],
        verbs: &["get", "list", "watch"],
        why: "entitlements: the namespace labels a class's namespaceSelector admits",
    },
    Rule {
        group: "",
        resources: &["services"],
        verbs: &["get", "list", "watch", "patch"],
        why: "auto-claims: read Services, name their claim; count the Services naming each claim",
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["list", "watch"],
        why: "DriverAvailable: the drivers' Leases (label local.sdn.cozystack.io/component=driver)",
    },
    Rule {
        group: "authentication.k8s.io",
        resources: &["tokenreviews"],
        verbs: &["create"],
        why: "aggregated API server and /metrics: delegated authentication of bearer tokens",
    },
    Rule {
        group: "authorization.k8s.io",
        resources: &["subjectaccessreviews"],
        verbs: &["create"],
        why: "aggregated API server and /metrics: delegated authorization",
    },
];

/// Everything the binary needs cluster-wide: its own rules and the runtime's (events).
fn cluster_rules() -> Vec<&'static Rule> {
    RULES.iter().chain(RUNTIME_RULES).collect()
}

/// The ClusterRole of the binary.
pub fn cluster_role() -> ClusterRole {
    cluster_role_of(CLUSTER_ROLE, &cluster_rules())
}

/// The ClusterRole and the Role of its own namespace (its Lease) as committed under
/// `chart/address-controller/files/controller-role.yaml`, with a comment per rule saying why it is
/// needed.
pub fn cluster_role_yaml() -> Result<String, serde_yaml::Error> {
    let own: Vec<&Rule> = LEADER_ELECTION_RULES.iter().collect();
    render(
        CLUSTER_ROLE,
        "controller/src/rbac.rs",
        &cluster_rules(),
        &own,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_cluster_role_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../chart/address-controller/files/controller-role.yaml");
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == super::cluster_role_yaml().unwrap(),
            "{} is stale; run `make manifests`",
            path.display()
        );
    }
}
