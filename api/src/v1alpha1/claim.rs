use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions_schema;
use crate::Family;

/// A tenant's request for an address. The PersistentVolumeClaim of addresses.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "local.sdn.cozystack.io",
    version = "v1alpha1",
    doc = "An IPAddressClaim is a tenant's request for an address; the address belongs to the claim, not to any workload.",
    kind = "IPAddressClaim",
    plural = "ipaddressclaims",
    shortname = "ipc",
    namespaced,
    status = "IPAddressClaimStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".status.className"}"#,
    printcolumn = r#"{"name":"Family","type":"string","jsonPath":".spec.family"}"#,
    printcolumn = r#"{"name":"Address","type":"string","description":"The claim's (first) address.","jsonPath":".status.addresses[0].address"}"#,
    printcolumn = r#"{"name":"Second Address","type":"string","description":"A Dual claim's address of the other family.","jsonPath":".status.addresses[1].address"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"IPAddress","type":"string","priority":1,"description":"The IPAddress object the claim is bound to (the first, for a Dual claim).","jsonPath":".status.addresses[0].name"}"#,
    printcolumn = r#"{"name":"Attached","type":"integer","priority":1,"description":"How many Services hold the claim's address (status.services.refused: how many were refused).","jsonPath":".status.services.attached"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"description":"The Bound condition's message.","jsonPath":".status.conditions[?(@.type==\"Bound\")].message"}"#,
    category = "addresses",
    selectable = ".spec.className",
    selectable = ".spec.family",
    selectable = ".spec.addressName",
    selectable = ".status.phase",
    selectable = ".status.className",
    validation = Rule::new("!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ['Bound', 'Lost']) || self.spec.family == oldSelf.spec.family")
        .message("spec.family cannot change once the claim is Bound (it would lose its addresses); create another claim for other families")
        .field_path(".spec.family")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.addressName) || self.family != 'Dual'")
    .message("addressName cannot be used with family Dual: a Dual claim needs two addresses"))]
pub struct IPAddressClaimSpec {
    /// Class to draw from; empty means the default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,

    /// Which addresses the claim wants.
    #[serde(default)]
    pub family: ClaimFamily,

    /// Bind exactly this IPAddress (by object name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub address_name: Option<String>,

    /// Whether, and with which namespaces, the claim's address may be shared by several
    /// Services at once (port by port). Absent: `None`, one Service at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// Who may attach a claim's address besides its first holder. The grant is the claim
/// owner's: a Service author cannot grant itself someone else's address.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.policy == 'Namespaces' || !has(self.namespaces) || size(self.namespaces) == 0")
    .message("namespaces is only used with policy Namespaces"))]
pub struct Sharing {
    /// `None` (one Service at a time), `SameNamespace` (any number of Services of the
    /// claim's namespace), or `Namespaces` (those, and Services of the listed namespaces).
    #[serde(default)]
    pub policy: SharingPolicy,
    /// With `Namespaces`: the other namespaces whose Services may attach the address,
    /// naming the claim as `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "namespaces_schema")]
    pub namespaces: Vec<String>,
}

/// At most 32 namespace names, each once.
fn namespaces_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "description": "With policy Namespaces: the other namespaces whose Services may attach the address, naming the claim as <namespace>/<name>.",
        "maxItems": 32,
        "x-kubernetes-list-type": "set",
        "items": {"type": "string", "minLength": 1, "maxLength": 63,
            "pattern": crate::validation::DNS1123_LABEL}
    })
}

/// See [`Sharing`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SharingPolicy {
    #[default]
    None,
    SameNamespace,
    Namespaces,
}

/// The families a claim asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ClaimFamily {
    #[default]
    IPv4,
    IPv6,
    /// One IPv4 and one IPv6 address.
    Dual,
}

impl ClaimFamily {
    /// The address families that satisfy this claim.
    pub fn families(self) -> &'static [Family] {
        match self {
            ClaimFamily::IPv4 => &[Family::IPv4],
            ClaimFamily::IPv6 => &[Family::IPv6],
            ClaimFamily::Dual => &[Family::IPv4, Family::IPv6],
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ClaimFamily::IPv4 => "IPv4",
            ClaimFamily::IPv6 => "IPv6",
            ClaimFamily::Dual => "Dual",
        }
    }
}

/// Lifecycle phase of a claim.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum ClaimPhase {
    Pending,
    Bound,
    Lost,
}

impl ClaimPhase {
    pub const ALL: [ClaimPhase; 3] = [ClaimPhase::Pending, ClaimPhase::Bound, ClaimPhase::Lost];

    pub fn as_str(self) -> &'static str {
        match self {
            ClaimPhase::Pending => "Pending",
            ClaimPhase::Bound => "Bound",
            ClaimPhase::Lost => "Lost",
        }
    }
}

/// Observed state of a claim: a projection of the addresses whose claimRef names it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClaimPhase>,
    /// The class the claim resolved to (sticky).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// The bound addresses, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<ClaimAddress>,
    /// The Services naming this claim, counted by what the driver last said on each (its
    /// `local.sdn.cozystack.io/AddressAttached` condition); absent while none names it.
    /// Another namespace's Service is counted, never named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<ClaimServices>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// How many Services naming a claim hold its address and how many were refused.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClaimServices {
    /// Services whose `AddressAttached` condition is `True`.
    pub attached: u32,
    /// Services whose `AddressAttached` condition is `False` (its reason says why).
    pub refused: u32,
}

/// One address of a claim, as the tenant reads it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimAddress {
    /// Name of the IPAddress object.
    pub name: String,
    /// The address itself.
    pub address: String,
}
