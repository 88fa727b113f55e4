use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{ReclaimPolicy, conditions_schema};

/// Which driver provides addresses, and how they are reclaimed and recycled. The
/// StorageClass of addresses.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "local.sdn.cozystack.io",
    version = "v1alpha1",
    doc = "An IPAddressClass names the driver that provides addresses, their reclaim policy and release delay.",
    kind = "IPAddressClass",
    plural = "ipaddressclasses",
    shortname = "ipac",
    status = "IPAddressClassStatus",
    printcolumn = r#"{"name":"Provisioner","type":"string","jsonPath":".spec.provisioner"}"#,
    printcolumn = r#"{"name":"ReclaimPolicy","type":"string","jsonPath":".spec.reclaimPolicy"}"#,
    printcolumn = r#"{"name":"ReleaseDelay","type":"string","jsonPath":".spec.releaseDelay"}"#,
    printcolumn = r#"{"name":"Default","type":"string","description":"\"true\" on the default class (the annotation ipaddressclass.local.sdn.cozystack.io/is-default-class).","jsonPath":".metadata.annotations.ipaddressclass\\.local\\.sdn\\.cozystack\\.io/is-default-class"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Namespaces","type":"string","priority":1,"description":"The namespaceSelector's labels (empty: every namespace may claim).","jsonPath":".spec.namespaceSelector.matchLabels"}"#,
    printcolumn = r#"{"name":"IPv4 Capacity","type":"integer","priority":1,"jsonPath":".status.capacity.ipv4"}"#,
    printcolumn = r#"{"name":"IPv6 Capacity","type":"integer","priority":1,"jsonPath":".status.capacity.ipv6"}"#,
    printcolumn = r#"{"name":"ParametersValid","type":"string","priority":1,"description":"Whether the driver accepted the class's parameters.","jsonPath":".status.conditions[?(@.type==\"ParametersValid\")].status"}"#,
    printcolumn = r#"{"name":"DriverAvailable","type":"string","priority":1,"description":"Whether a driver holding a live Lease for the provisioner runs (the core's condition).","jsonPath":".status.conditions[?(@.type==\"DriverAvailable\")].status"}"#,
    category = "addresses",
    selectable = ".spec.provisioner",
    selectable = ".spec.reclaimPolicy"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClassSpec {
    /// Name of the driver that provisions addresses of this class (the claims' stamp).
    #[x_kube(validation = Rule::new("self == oldSelf").message("provisioner is immutable"))]
    #[schemars(length(min = 1))]
    pub provisioner: String,

    /// Reclaim policy given to the addresses of this class.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,

    /// How long a Released address waits before it returns to Available, as a duration
    /// such as 30s, 15m, 24h or 1h30m. Absent: Released addresses wait for an admin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(
        "self.matches('^([0-9]+(\\\\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+$')"
    ).message("releaseDelay must be a duration such as 30s, 15m, 24h or 1h30m"))]
    #[schemars(length(max = 64))]
    pub release_delay: Option<String>,

    /// Driver parameters; opaque to the core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "parameters_schema")]
    pub parameters: Option<serde_json::Value>,

    /// Which namespaces may claim from this class, by their labels. Absent: every
    /// namespace. Narrowing it never takes back an address a namespace already holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "namespace_selector_schema")]
    pub namespace_selector: Option<LabelSelector>,
}

/// Driver-owned status of a class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClassStatus {
    /// How many addresses the driver's range or provider can hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// Addresses a class can hold, per family.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ipv4: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ipv6: Option<i64>,
}

fn parameters_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "Driver parameters; opaque to the core.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A `metav1.LabelSelector` whose operators and values are checked by the schema, so that a
/// selector the core could not evaluate is refused when it is written.
fn namespace_selector_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <LabelSelector as schemars::JsonSchema>::json_schema(generator);
    schema.insert(
        "description".into(),
        "Which namespaces may claim from this class, by their labels (a metav1.LabelSelector). Absent: every namespace; empty ({}): every namespace too.".into(),
    );
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",
            "message": "matchExpressions operator must be In, NotIn, Exists or DoesNotExist"
        }, {
            "rule": "!has(self.matchExpressions) || self.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",
            "message": "matchExpressions with In or NotIn need values; Exists and DoesNotExist take none"
        }]),
    );
    schema
}
