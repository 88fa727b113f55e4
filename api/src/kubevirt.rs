//! What this project reads of KubeVirt, and the rule that a virtual machine moving between
//! nodes is one backend of its Service — spelled once, for the driver kit's count of the
//! pods behind a Service cozy-proxy serves.
//!
//! KubeVirt's own names, as it writes them (kubevirt.io/api `core/v1`):
//! * a `VirtualMachineInstance` (`kubevirt.io/v1`, plural `virtualmachineinstances`) says in
//!   `status.activePods` which pods run it — pod UID → node name, "multiple pods … for a
//!   single VMI during migration" — and in `status.nodeName` the node it runs on, which
//!   flips to the target's when the target takes over;
//! * during a move it carries the label `kubevirt.io/migrationTargetNodeName`, and the
//!   target pod `kubevirt.io/migrationJobUID`; both pods carry `kubevirt.io/created-by`
//!   (the VMI's UID).
//!
//! Only the fields above are kept (the rest of the object is dropped when it is read): a
//! VMI's spec is large and none of it is needed here.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The label both virt-launcher pods of a VMI carry: the VMI's UID.
pub const CREATED_BY_LABEL: &str = "kubevirt.io/created-by";
/// The label a migration's target pod carries.
pub const MIGRATION_JOB_LABEL: &str = "kubevirt.io/migrationJobUID";
/// The label a VMI carries while it moves: the node it moves to.
pub const MIGRATION_TARGET_NODE_LABEL: &str = "kubevirt.io/migrationTargetNodeName";

/// How long a Service cozy-proxy serves keeps its address while more than one workload is
/// behind it (a Deployment's rollout, a VM's pod the VMI does not list yet): after it the
/// Service is refused as before. Counted by the driver that judges the Service, from the
/// first pass that saw them; a driver that restarts (or a new leader) counts again, so the
/// bound is this long after the driver last began to judge the Service.
pub const MULTIPLE_WORKLOADS_HOLD_DOWN: std::time::Duration = std::time::Duration::from_secs(30);

/// The most pods of one VMI this project keeps (KubeVirt runs two during a move; a VMI
/// object listing more is cut there — it is bounded, whoever wrote it).
pub const MAX_ACTIVE_PODS: usize = 8;

/// A KubeVirt `VirtualMachineInstance`, the part of it this project reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct VirtualMachineInstance {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VirtualMachineInstanceStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Pod UID → node name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub active_pods: BTreeMap<String, String>,
}

impl kube::Resource for VirtualMachineInstance {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "VirtualMachineInstance".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "kubevirt.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "virtualmachineinstances".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl VirtualMachineInstance {
    /// The pods that run it (pod UID → node), at most [`MAX_ACTIVE_PODS`].
    pub fn active_pods(&self) -> impl Iterator<Item = (&str, &str)> {
        self.status
            .iter()
            .flat_map(|s| s.active_pods.iter())
            .take(MAX_ACTIVE_PODS)
            .map(|(p, n)| (p.as_str(), n.as_str()))
    }

    /// The node it runs on (`status.nodeName`).
    pub fn node(&self) -> Option<&str> {
        self.status.as_ref()?.node_name.as_deref()
    }

    /// The node it is moving to, while it moves.
    pub fn moving_to(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(MIGRATION_TARGET_NODE_LABEL)
            .map(String::as_str)
    }
}

/// One ready endpoint of a Service, as its EndpointSlice says: its address, the pod
/// (`targetRef.uid`) and the node (`nodeName`) when given.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: String,
    pub pod_uid: Option<String>,
    pub node: Option<String>,
}

/// The VMI a pod runs (`namespace/name`) and the node the VMI says it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmiOf {
    pub vmi: String,
    pub node: Option<String>,
}

/// Who is behind a Service cozy-proxy serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backends {
    /// No ready endpoint.
    None,
    /// One workload: one address, or one VMI on one pod; the node it runs on (the VMI's
    /// word, else its endpoint's), when known.
    One { node: Option<String> },
    /// One VMI with two (or more) ready pods: it is moving. The nodes its ready pods are
    /// on, and the node the VMI says it runs on.
    Migrating {
        vmi: String,
        nodes: Vec<String>,
        node: Option<String>,
    },
    /// Several workloads (distinct addresses not of one VMI): cozy-proxy forwards the
    /// address to one of them.
    Many(usize),
}

/// Counts the workloads behind a Service from its ready endpoints: the endpoints of the
/// pods of one VMI ([`VmiOf`], found by pod UID) are one workload however many pods and
/// addresses they have; any other endpoint is one workload per address (as before — two
/// endpoints with one address are one).
pub fn backends(endpoints: &[Endpoint], vmi_of: &dyn Fn(&str) -> Option<VmiOf>) -> Backends {
    // Address → the node of its endpoints (the first given).
    let mut addresses: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    /// What the endpoints say of one VMI: its pods, the nodes they are on, its own word.
    #[derive(Default)]
    struct Seen<'a> {
        pods: BTreeSet<&'a str>,
        nodes: BTreeSet<&'a str>,
        node: Option<String>,
    }
    let mut vmis: BTreeMap<String, Seen<'_>> = BTreeMap::new();
    for e in endpoints {
        match e.pod_uid.as_deref().and_then(vmi_of) {
            Some(v) => {
                let seen = vmis.entry(v.vmi).or_default();
                seen.pods.insert(e.pod_uid.as_deref().unwrap_or_default());
                if let Some(n) = e.node.as_deref() {
                    seen.nodes.insert(n);
                }
                seen.node = v.node;
            }
            None => {
                let node = addresses.entry(e.ip.as_str()).or_default();
                *node = node.or(e.node.as_deref());
            }
        }
    }
    // An address also carried by a VMI's pod is that VMI's.
    let vmi_addresses: BTreeSet<&str> = endpoints
        .iter()
        .filter(|e| e.pod_uid.as_deref().and_then(vmi_of).is_some())
        .map(|e| e.ip.as_str())
        .collect();
    addresses.retain(|a, _| !vmi_addresses.contains(a));
    match (addresses.len() + vmis.len(), vmis.into_iter().next()) {
        (0, _) => Backends::None,
        (1, Some((vmi, seen))) if seen.pods.len() > 1 => Backends::Migrating {
            vmi,
            nodes: seen.nodes.into_iter().map(str::to_string).collect(),
            node: seen.node,
        },
        (1, Some((_, seen))) => Backends::One {
            node: seen
                .node
                .or_else(|| seen.nodes.first().map(|n| n.to_string())),
        },
        (1, None) => Backends::One {
            node: addresses.into_values().next().flatten().map(str::to_string),
        },
        (n, _) => Backends::Many(n),
    }
}

impl Backends {
    /// The node the one workload runs on (a VM moving: where its VMI says it runs).
    pub fn node(&self) -> Option<&str> {
        match self {
            Backends::One { node } | Backends::Migrating { node, .. } => node.as_deref(),
            Backends::None | Backends::Many(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ep(ip: &str, pod: Option<&str>, node: &str) -> Endpoint {
        Endpoint {
            ip: ip.into(),
            pod_uid: pod.map(str::to_string),
            node: Some(node.into()),
        }
    }

    /// Pods p1 and p2 run VMI t/vm (on n2 now); p3 runs t/other.
    fn vmi_of(pod: &str) -> Option<VmiOf> {
        match pod {
            "p1" | "p2" => Some(VmiOf {
                vmi: "t/vm".into(),
                node: Some("n2".into()),
            }),
            "p3" => Some(VmiOf {
                vmi: "t/other".into(),
                node: Some("n1".into()),
            }),
            _ => None,
        }
    }

    #[test]
    fn two_pods_of_one_vmi_are_one_backend_moving() {
        // Another IP (masquerade) and the same IP (kube-ovn keep-IP) alike.
        for target_ip in ["10.0.0.2", "10.0.0.1"] {
            let b = backends(
                &[
                    ep("10.0.0.1", Some("p1"), "n1"),
                    ep(target_ip, Some("p2"), "n2"),
                ],
                &vmi_of,
            );
            assert_eq!(
                b,
                Backends::Migrating {
                    vmi: "t/vm".into(),
                    nodes: vec!["n1".into(), "n2".into()],
                    node: Some("n2".into())
                }
            );
        }
        // One pod of the VMI: where the VMI says it runs.
        assert_eq!(
            backends(&[ep("10.0.0.1", Some("p1"), "n1")], &vmi_of),
            Backends::One {
                node: Some("n2".into())
            }
        );
    }

    #[test]
    fn different_workloads_are_counted_apart() {
        // Two VMIs.
        let b = backends(
            &[
                ep("10.0.0.1", Some("p1"), "n1"),
                ep("10.0.0.3", Some("p3"), "n1"),
            ],
            &vmi_of,
        );
        assert_eq!(b, Backends::Many(2));
        // A VMI's pod and a plain pod.
        let b = backends(
            &[
                ep("10.0.0.1", Some("p1"), "n1"),
                ep("10.0.0.9", Some("x"), "n1"),
            ],
            &vmi_of,
        );
        assert_eq!(b, Backends::Many(2));
        // Two plain pods; without a VMI index at all, two pods of one VMI read as two.
        let none = |_: &str| None;
        let b = backends(
            &[
                ep("10.0.0.1", Some("p1"), "n1"),
                ep("10.0.0.2", Some("p2"), "n2"),
            ],
            &none,
        );
        assert_eq!(b, Backends::Many(2));
        // One address listed twice is one.
        let b = backends(
            &[ep("10.0.0.1", None, "n1"), ep("10.0.0.1", None, "n2")],
            &none,
        );
        assert_eq!(
            b,
            Backends::One {
                node: Some("n1".into())
            }
        );
        assert_eq!(backends(&[], &none), Backends::None);
    }

    #[test]
    fn a_vmi_object_is_read_bounded() {
        let pods: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| (format!("uid-{i}"), serde_json::json!("n1")))
            .collect();
        let v: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "t",
                "labels": {MIGRATION_TARGET_NODE_LABEL: "n2"}},
            "spec": {"domain": {"devices": {}}},
            "status": {"nodeName": "n1", "activePods": pods, "phase": "Running"}
        }))
        .unwrap();
        assert_eq!(v.active_pods().count(), MAX_ACTIVE_PODS);
        assert_eq!(v.node(), Some("n1"));
        assert_eq!(v.moving_to(), Some("n2"));
    }
}
