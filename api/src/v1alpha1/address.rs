use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ReclaimPolicy, conditions_schema};

/// One concrete IP address: the reservation and the ledger entry. The PersistentVolume
/// of addresses.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "local.sdn.cozystack.io",
    version = "v1alpha1",
    doc = "An IPAddress is one concrete IP address: the reservation and the ledger entry.",
    kind = "IPAddress",
    plural = "ipaddresses",
    shortname = "ipa",
    status = "IPAddressStatus",
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.className"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Claim Namespace","type":"string","jsonPath":".spec.claimRef.namespace"}"#,
    printcolumn = r#"{"name":"Claim","type":"string","jsonPath":".spec.claimRef.name"}"#,
    printcolumn = r#"{"name":"AttachedTo","type":"string","jsonPath":".status.associatedTo.name"}"#,
    printcolumn = r#"{"name":"ReclaimPolicy","type":"string","jsonPath":".spec.reclaimPolicy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Released","type":"date","priority":1,"description":"Since when the address has been Released (it is kept for its class's releaseDelay).","jsonPath":".status.releasedAt"}"#,
    printcolumn = r#"{"name":"Holders","type":"integer","priority":1,"description":"How many Services hold the address (more than one when its claim shares it).","jsonPath":".status.holderCount"}"#,
    printcolumn = r#"{"name":"Method","type":"string","priority":1,"description":"How the platform's data plane (cozy-proxy) serves the holder: WholeIP or PortList; empty: a load balancer's listed ports.","jsonPath":".status.attachments[0].method"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"description":"Why the address is Released: Surplus (its claim already held another address of the family) or Reclaimed.","jsonPath":".status.reason"}"#,
    category = "addresses",
    selectable = ".spec.address",
    selectable = ".spec.className",
    selectable = ".spec.claimRef.namespace",
    selectable = ".spec.claimRef.name",
    selectable = ".status.phase"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressSpec {
    /// The IPv4 or IPv6 address, without zone or prefix length.
    #[x_kube(
        validation = Rule::new("!self.contains('%')").message("address must not carry a zone (such as %eth0)"),
        validation = Rule::new("isIP(self)").message("address must be a valid IPv4 or IPv6 address"),
        validation = Rule::new("self == oldSelf").message("address is immutable")
    )]
    #[schemars(length(max = 64))]
    pub address: String,

    /// The class this address belongs to.
    #[schemars(length(min = 1))]
    pub class_name: String,

    /// What happens to the address when its claim goes away.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,

    /// The claim this address is bound to: the one authoritative record of a binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_ref: Option<ClaimRef>,

    /// Where the address comes from.
    pub source: AddressSource,
}

/// Reference to the claim an address is bound to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// Namespace of the claim (a DNS-1123 label).
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::validation::DNS1123_LABEL))]
    pub namespace: String,
    /// Name of the claim (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253), regex(pattern = crate::validation::DNS1123_SUBDOMAIN))]
    pub name: String,
    /// UID of the claim; a different UID marks a stale binding to an older claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// Exactly one of `fromClass` or `providerRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.fromClass) != has(self.providerRef)")
    .message("exactly one of fromClass or providerRef must be set"))]
pub struct AddressSource {
    /// Allocated from the class's own range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_class: Option<FromClass>,
    /// Adopted from a provider resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderRef>,
}

impl AddressSource {
    /// Allocated from the class's own range (what the shipped drivers and `adopt` write).
    pub fn from_class() -> AddressSource {
        AddressSource {
            from_class: Some(FromClass {}),
            provider_ref: None,
        }
    }
}

/// Marker: the address comes from the class's range.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct FromClass {}

/// A provider-side identifier of the address.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProviderRef {
    #[schemars(length(min = 1))]
    pub id: String,
}

/// Lifecycle phase of an address. `Conflict` and `Lost` belong to drivers.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum AddressPhase {
    Pending,
    Available,
    Bound,
    Released,
    Conflict,
    Lost,
}

impl AddressPhase {
    pub const ALL: [AddressPhase; 6] = [
        AddressPhase::Pending,
        AddressPhase::Available,
        AddressPhase::Bound,
        AddressPhase::Released,
        AddressPhase::Conflict,
        AddressPhase::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AddressPhase::Pending => "Pending",
            AddressPhase::Available => "Available",
            AddressPhase::Bound => "Bound",
            AddressPhase::Released => "Released",
            AddressPhase::Conflict => "Conflict",
            AddressPhase::Lost => "Lost",
        }
    }

    /// Phases that only a driver sets and clears (SPEC §3).
    pub fn is_driver_owned(self) -> bool {
        matches!(self, AddressPhase::Conflict | AddressPhase::Lost)
    }
}

/// Observed state of an address.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AddressPhase>,
    /// When the core moved the address to Released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// The binding that was released: `spec.claimRef` as it was when the core moved the
    /// address to Released. The release delay concerns this binding only; a claimRef that
    /// differs from it is a new binding or a reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "released_from_schema")]
    pub released_from: Option<ClaimRef>,
    /// Why the core released the address, written with the move to `Released` and kept
    /// until it leaves that phase: `Surplus` — its claim already held another address of
    /// the family (a driver's create that landed after the core bound a free address; it
    /// never counts toward an IPAddressQuota) — or `Reclaimed` (the claim's reclaim policy,
    /// or the safety net for a claim that is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the driver attached the address to — the first holder when the address is
    /// shared; absent = reserved but inert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub associated_to: Option<Association>,
    /// Every holder of the address, the first one first (`associatedTo` names it too), with
    /// the ports each serves on it. Driver-owned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// How many holders `attachments` lists (for `kubectl get -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_count: Option<i64>,
    /// Who held the address, oldest first: the claims it was bound to or reserved for,
    /// from when until when. Core-owned, written only within the status writes that bind,
    /// reserve and release the address. The open holding and the last few closed ones
    /// (`history::HOLDINGS_KEEP`); older ones live on as IPAddressRecords.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::history::HOLDINGS_LIMIT))]
    pub history: Vec<crate::history::Holding>,
    /// How many holdings were dropped from `history` past its bound (before records were
    /// kept: since, a closed holding moves to an IPAddressRecord instead).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_dropped: i64,
    /// How many closed holdings moved from `history` to IPAddressRecords (the oldest ones:
    /// the first kept entry's ordinal is `historyDropped + historyRecorded`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_recorded: i64,
    /// The Services the address was on, from when until when, oldest first. Driver-owned,
    /// written within the ledger writes that attach and detach them. The open spans and the
    /// last few closed ones (`history::SPANS_KEEP`); older ones live on as IPAddressRecords.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachment_history: Vec<crate::history::AttachmentSpan>,
    /// How many spans were dropped from `attachmentHistory` past its bound (before records
    /// were kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attachment_history_dropped: i64,
    /// How many closed spans moved from `attachmentHistory` to IPAddressRecords.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attachment_history_recorded: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// The object a driver attached an address to.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Association {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

/// One holder of an address (`status.attachments`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// What the holder serves on the address, as `<protocol>/<port>` (`TCP/443`); none for a
    /// whole-address holder (its listed port is a placeholder, not a port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// How the platform's data plane (cozy-proxy) serves it, for a Service handed to it by
    /// its `service.kubernetes.io/service-proxy-name: cozy-proxy` label: `WholeIP` or
    /// `PortList`. Either way the holder is the address's only one and its pod's outbound
    /// traffic leaves from the address. Absent: a load balancer's listed ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<AttachmentMethod>,
    /// `PortList`: ICMP reaches the pod too (`networking.cozystack.io/allowICMP`).
    #[serde(
        default,
        rename = "allowICMP",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub allow_icmp: bool,
    /// The node its one workload runs on, as the driver last saw it (a Service cozy-proxy
    /// serves: the node its VirtualMachineInstance names, else its endpoint's); absent when
    /// not known. A change is a move, kept in the open span's `nodes` (the same holding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
}

/// How cozy-proxy serves an address's holder (see [`Attachment::method`]).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttachmentMethod {
    /// Every TCP and UDP port and ICMP go to the Service's pod.
    WholeIP,
    /// The Service's listed ports go to its pod; the rest, and ICMP unless allowed, are
    /// dropped.
    PortList,
}

impl AttachmentMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachmentMethod::WholeIP => "WholeIP",
            AttachmentMethod::PortList => "PortList",
        }
    }
}

impl Association {
    /// The Service it names as `namespace/name` (the caches' key); `None`: not a Service.
    pub fn service_key(&self) -> Option<String> {
        (self.kind == "Service").then(|| {
            format!(
                "{}/{}",
                self.namespace.as_deref().unwrap_or_default(),
                self.name
            )
        })
    }
}

impl Attachment {
    /// The association this holder is (`status.associatedTo`'s shape).
    pub fn association(&self) -> Association {
        Association {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

impl IPAddress {
    /// The states the address counts in for its claim's namespace (the billing gauge
    /// `address_controller_ipaddresses_held`): `bound` (Bound or Conflict), `associated` (a
    /// driver put it on a Service), `shared` (on more than one). Empty without a claimRef.
    pub fn held_states(&self) -> Vec<&'static str> {
        if self.spec.claim_ref.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if matches!(
            self.status.as_ref().and_then(|s| s.phase),
            Some(AddressPhase::Bound | AddressPhase::Conflict)
        ) {
            out.push("bound");
        }
        let holders = self.holders().len();
        if holders > 0 {
            out.push("associated");
        }
        if holders > 1 {
            out.push("shared");
        }
        out
    }

    /// Who holds the address: `status.attachments`, or — written before sharing existed —
    /// the one `status.associatedTo` names.
    pub fn holders(&self) -> Vec<Association> {
        let Some(st) = self.status.as_ref() else {
            return Vec::new();
        };
        if st.attachments.is_empty() {
            st.associated_to.iter().cloned().collect()
        } else {
            st.attachments.iter().map(Attachment::association).collect()
        }
    }

    /// Its holders as attachments: `status.attachments`, or — written before sharing
    /// existed — the one `status.associatedTo` names, as an attachment without ports.
    pub fn attachments(&self) -> Vec<Attachment> {
        match self.status.as_ref() {
            Some(st) if !st.attachments.is_empty() => st.attachments.clone(),
            _ => self
                .holder_services()
                .iter()
                .map(|k| crate::sharing::attachment(k, None))
                .collect(),
        }
    }

    /// The Services that hold the address by the ledger, as `namespace/name`, first holder
    /// first.
    pub fn holder_services(&self) -> Vec<String> {
        self.holders()
            .iter()
            .filter_map(Association::service_key)
            .collect()
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// `status.releasedFrom` is a copy of `spec.claimRef` as it was: recorded as it is, even a
/// name admitted before the schema checked it — the copy must never fail the status write.
fn released_from_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "The binding that was released: spec.claimRef as it was when the core moved the address to Released.",
        "required": ["namespace", "name"],
        "properties": {
            "namespace": {"type": "string"},
            "name": {"type": "string"},
            "uid": {"type": "string"}
        }
    })
}
