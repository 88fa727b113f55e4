//! `IPAddressRecord`: one closed entry of an address's history — a holding of a claim, or a
//! span of a holder — kept after it left the address. Cluster-scoped, so it
//! outlives the address, the claim and the namespace it describes; immutable; written once
//! by the component that owned the entry (the core its holdings, the driver its spans);
//! deleted only by the core's retention.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::history::HoldingState;

/// What a record is of.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum RecordOf {
    /// A holding: the claim the address was bound to or reserved for.
    #[default]
    Holding,
    /// A span of a holder (a Service) the address was on.
    Attachment,
}

impl RecordOf {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordOf::Holding => "holding",
            RecordOf::Attachment => "attachment",
        }
    }
    /// The letter before the ordinal in a record's name.
    fn letter(self) -> char {
        match self {
            RecordOf::Holding => 'h',
            RecordOf::Attachment => 'a',
        }
    }
}

/// One entry of an address's history, as kept after it left the address (`IPAddressRecord`)
/// and as exported (`address-controller history export`).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "local.sdn.cozystack.io",
    version = "v1alpha1",
    doc = "An IPAddressRecord is one closed entry of an address's history (a holding of a claim, or a span of a Service), kept after it left the IPAddress: immutable, cluster-scoped, pruned by the controller's --history-retention.",
    kind = "IPAddressRecord",
    plural = "ipaddressrecords",
    shortname = "ipr",
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"Record","type":"string","jsonPath":".spec.record"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace"}"#,
    printcolumn = r#"{"name":"Holder","type":"string","jsonPath":".spec.name"}"#,
    printcolumn = r#"{"name":"From","type":"string","jsonPath":".spec.from"}"#,
    printcolumn = r#"{"name":"Until","type":"string","jsonPath":".spec.until"}"#,
    category = "addresses"
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("a record is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct RecordSpec {
    /// `holding` or `attachment`.
    pub record: RecordOf,
    /// The IP.
    #[schemars(length(max = 64))]
    pub address: String,
    /// The IPAddress object's name.
    #[schemars(length(max = 253))]
    pub ip_address: String,
    /// The IPAddress object's uid: an address deleted and created again is another one.
    #[serde(rename = "addressUID", default)]
    #[schemars(length(max = 64))]
    pub address_uid: String,
    /// The entry's place in the address's list, counted from its first entry ever.
    #[serde(default)]
    pub ordinal: i64,
    #[schemars(length(max = 253))]
    pub class_name: String,
    /// `IPAddressClaim` for a holding; the holder's kind for an attachment.
    #[schemars(length(max = 63))]
    pub kind: String,
    /// The claim's or the holder's namespace (empty for a cluster-scoped holder).
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uid: Option<String>,
    /// A holding's `Bound` or `Reserved`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<HoldingState>,
    /// Absent for a binding found under way (an upgrade): its start is not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Time>,
    /// Absent while it lasts (only in an export: a record is of a closed entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub ended: Option<String>,
    #[serde(default)]
    pub found: bool,
    #[serde(default)]
    pub egress: bool,
    /// An attachment span's nodes (see the span's `nodes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub nodes: Vec<crate::history::NodeStay>,
}

/// Labels of a record: the lookups "what did namespace N hold" (`namespace`), "the history
/// of this IPAddress" (`address-uid`, and `ip-address` where its name fits a label value),
/// and the retention's "what ended in month M" (`until-month`).
pub mod record_labels {
    pub const NAMESPACE: &str = "local.sdn.cozystack.io/namespace";
    pub const ADDRESS_UID: &str = "local.sdn.cozystack.io/address-uid";
    pub const IP_ADDRESS: &str = "local.sdn.cozystack.io/ip-address";
    pub const RECORD: &str = "local.sdn.cozystack.io/record";
    pub const UNTIL_MONTH: &str = "local.sdn.cozystack.io/until-month";
}

/// The name of the `addressholdings` view object of an address's `ordinal`-th holding:
/// `<IPAddress>.<first 8 of its uid>.<ordinal>` — the same whether the holding is still on
/// the address or already in its record, and another for an address of the same name
/// deleted and created again.
pub fn holding_view_name(ip_address: &str, address_uid: &str, ordinal: i64) -> String {
    let uid: String = address_uid.chars().take(8).collect();
    format!("{ip_address}.{uid}.{ordinal}")
}

/// The record name of a holding's view name (`None` when it is not one).
pub fn holding_record_name(view_name: &str) -> Option<String> {
    let (rest, ordinal) = view_name.rsplit_once('.')?;
    ordinal.parse::<i64>().ok()?;
    Some(format!("{rest}.h{ordinal}"))
}

/// The month label of an instant: `2026-12`.
pub fn until_month(t: &Time) -> String {
    t.0.strftime("%Y-%m").to_string()
}

impl RecordSpec {
    /// The record's name: `<IPAddress>.<first 8 of its uid>.<h|a><ordinal>` — the same
    /// for every writer, so a second create of one entry is refused as already there.
    pub fn object_name(&self) -> String {
        let uid: String = self.address_uid.chars().take(8).collect();
        let address: String = self.ip_address.chars().take(200).collect();
        format!("{address}.{uid}.{}{}", self.record.letter(), self.ordinal)
    }

    /// The name of the addressholdings view object of a holding.
    pub fn view_name(&self) -> String {
        holding_view_name(&self.ip_address, &self.address_uid, self.ordinal)
    }

    /// The record object of this entry, with its name and labels.
    pub fn to_object(&self) -> IPAddressRecord {
        use record_labels as l;
        let mut labels = BTreeMap::new();
        labels.insert(l::NAMESPACE.to_string(), self.namespace.clone());
        labels.insert(l::ADDRESS_UID.to_string(), self.address_uid.clone());
        labels.insert(l::RECORD.to_string(), self.record.as_str().to_string());
        if crate::names::is_label_value(&self.ip_address) {
            labels.insert(l::IP_ADDRESS.to_string(), self.ip_address.clone());
        }
        if let Some(u) = &self.until {
            labels.insert(l::UNTIL_MONTH.to_string(), until_month(u));
        }
        IPAddressRecord {
            metadata: ObjectMeta {
                name: Some(self.object_name()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: self.clone(),
        }
    }
}
