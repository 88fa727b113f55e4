use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// How many addresses the namespace it lives in may hold, per class and family. Written by
/// the platform admin, never by the tenant (the chart gives tenants read access only). The
/// ResourceQuota of addresses: every quota of a namespace applies, the strictest wins.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "local.sdn.cozystack.io",
    version = "v1alpha1",
    doc = "An IPAddressQuota limits how many addresses the claims of its namespace may hold, per class and family. Usage is shown by the namespaceaddresses view.",
    kind = "IPAddressQuota",
    plural = "ipaddressquotas",
    shortname = "ipaq",
    namespaced,
    printcolumn = r#"{"name":"Classes","type":"string","description":"The classes it limits.","jsonPath":".spec.limits[*].className"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    category = "addresses"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressQuotaSpec {
    /// One limit per class; a class not listed is not limited by this quota.
    #[schemars(length(max = 64))]
    #[schemars(schema_with = "limits_schema")]
    pub limits: Vec<QuotaLimit>,
}

/// The limits on one class. Every address whose claimRef names a claim of the namespace
/// counts — bound, pre-bound, `Released` and retained (the namespace is still billed for
/// it until it returns to `Available`) — and every address the core invited a driver to
/// provision for such a claim. A `Dual` claim counts once per family.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.addresses) || has(self.ipv4) || has(self.ipv6)")
    .message("a limit sets addresses, ipv4 or ipv6"))]
pub struct QuotaLimit {
    /// The class limited.
    #[schemars(length(min = 1, max = 253))]
    pub class_name: String,
    /// Addresses of the class, every family together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub addresses: Option<i64>,
    /// IPv4 addresses of the class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ipv4: Option<i64>,
    /// IPv6 addresses of the class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ipv6: Option<i64>,
}

/// The limits, one per class (a list map keyed by className: two limits on one class in one
/// quota are refused).
fn limits_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <Vec<QuotaLimit> as schemars::JsonSchema>::json_schema(generator);
    schema.insert("maxItems".into(), 64.into());
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["className"]),
    );
    schema.insert(
        "description".into(),
        "One limit per class; a class not listed is not limited by this quota.".into(),
    );
    schema
}
