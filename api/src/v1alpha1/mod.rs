//! `local.sdn.cozystack.io/v1alpha1` (SPEC §1). The CRD YAML is generated from these
//! types by `make manifests`; CEL rules live next to the fields they guard.

mod address;
mod claim;
mod class;
mod quota;
mod record;

pub use address::*;
pub use claim::*;
pub use class::*;
pub use quota::*;
pub use record::*;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What happens to an address when its claim goes away (SPEC §6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ReclaimPolicy {
    /// Keep the address as `Released`, still recording its last claim.
    #[default]
    Retain,
    /// Delete the IPAddress object (a driver finalizer tears down the backend).
    Delete,
}

impl ReclaimPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimPolicy::Retain => "Retain",
            ReclaimPolicy::Delete => "Delete",
        }
    }
}

/// A list of `metav1.Condition`, keyed by type so server-side apply merges per condition.
pub(crate) fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <Vec<Condition>>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}
