//! One module per served resource (metrics-server's shape): each declares what it is
//! (`ResourceInfo`: names, scope, verbs, subresources, field labels, Table columns, OpenAPI
//! schema) and how its objects are computed from the caches ([`View`]). Discovery, OpenAPI,
//! routing and the view store are derived from the registry ([`all`]); adding a view is
//! adding a module.

pub mod addressholdings;
pub mod namespaceaddresses;
pub mod poolavailabilities;

use std::collections::BTreeMap;
use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass, IPAddressQuota};
use address_controller_runtime::world::World;
use k8s_openapi::api::core::v1::Namespace;
use serde_json::{Value, json};

use address_controller_serving::request::Query;

use crate::list_options::ComputedField;
use address_controller_serving::status::ApiError;

/// A subresource of a resource.
pub struct Subresource {
    pub name: &'static str,
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
}

/// A Table column.
pub struct Column {
    pub name: &'static str,
    pub type_: &'static str,
    pub description: &'static str,
    /// 0: always shown; 1: with `-o wide`.
    pub priority: i32,
}

impl Column {
    pub const fn new(
        name: &'static str,
        type_: &'static str,
        description: &'static str,
        priority: i32,
    ) -> Column {
        Column {
            name,
            type_,
            description,
            priority,
        }
    }

    pub fn definition(&self) -> Value {
        json!({"name": self.name, "type": self.type_, "format": if self.name == "Name" { "name" } else { "" },
            "description": self.description, "priority": self.priority})
    }
}

/// What a served resource is.
pub struct ResourceInfo {
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub subresources: &'static [Subresource],
    /// Field selectors it supports (kube-apiserver: `metadata.name`, and `metadata.namespace`
    /// for namespaced kinds).
    pub field_labels: &'static [&'static str],
    /// Those of its field labels the server computes at request time.
    pub computed_fields: &'static [ComputedField],
    pub columns: &'static [Column],
}

/// An object of a view, computed: its JSON (`metadata.resourceVersion` is set by the store)
/// and its Table cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Computed {
    pub namespace: Option<String>,
    pub name: String,
    pub value: Value,
    pub cells: Vec<Value>,
    pub labels: BTreeMap<String, String>,
    /// The values of its field labels beyond `metadata.name` / `metadata.namespace` (the
    /// field selectors it supports, [`ResourceInfo::field_labels`]).
    pub fields: BTreeMap<&'static str, String>,
}

/// A served, computed resource.
pub trait View: Send + Sync + 'static {
    fn info(&self) -> &'static ResourceInfo;

    /// Keys (`namespace/name` or `name`) whose objects a change may alter; keeps the view's
    /// own indexes in step. Called on the watch task: cheap work only.
    fn claim_changed(
        &self,
        old: Option<&IPAddressClaim>,
        new: Option<&IPAddressClaim>,
        dirty: &mut Vec<String>,
    );
    fn address_changed(
        &self,
        old: Option<&IPAddress>,
        new: Option<&IPAddress>,
        dirty: &mut Vec<String>,
    );
    fn class_changed(
        &self,
        old: Option<&IPAddressClass>,
        new: Option<&IPAddressClass>,
        dirty: &mut Vec<String>,
    );

    /// An IPAddressQuota changed (SPEC §13).
    fn quota_changed(
        &self,
        _old: Option<&IPAddressQuota>,
        _new: Option<&IPAddressQuota>,
        _dirty: &mut Vec<String>,
    ) {
    }
    /// A namespace changed (its labels decide which classes admit it).
    fn namespace_changed(
        &self,
        _old: Option<&Namespace>,
        _new: Option<&Namespace>,
        _dirty: &mut Vec<String>,
    ) {
    }

    /// A history record changed (created, or pruned by the retention).
    fn record_changed(
        &self,
        _old: Option<&address_controller_api::IPAddressRecord>,
        _new: Option<&address_controller_api::IPAddressRecord>,
        _world: &World,
        _dirty: &mut Vec<String>,
    ) {
    }

    /// The object of `key`, or `None` when it does not exist (lists leave it out).
    fn compute(&self, key: &str, world: &World) -> Option<Computed>;

    /// A GET of a name with no object: some views answer anyway (the holdings of a
    /// namespace holding nothing are zeros). `None`: 404.
    fn absent(&self, _namespace: Option<&str>, _name: &str, _world: &World) -> Option<Computed> {
        None
    }

    /// A GET of a subresource: `None` when it has none of that name.
    fn subresource(
        &self,
        _sub: &str,
        _namespace: Option<&str>,
        _name: &str,
        _query: &Query,
        _world: &World,
    ) -> Option<Result<Value, ApiError>> {
        None
    }

    /// The OpenAPI schemas of the kinds it serves (the object's first).
    fn schemas(
        &self,
        generator: &mut schemars::SchemaGenerator,
    ) -> Vec<(&'static str, schemars::Schema)>;
}

/// Every served resource, in discovery order.
pub fn all() -> Vec<Arc<dyn View>> {
    vec![
        Arc::new(namespaceaddresses::NamespaceAddressesView::default()),
        Arc::new(poolavailabilities::PoolAvailabilitiesView::default()),
        Arc::new(addressholdings::AddressHoldingsView::default()),
    ]
}

/// `metadata` of a view object.
pub fn meta(
    name: &str,
    namespace: Option<&str>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        ..Default::default()
    }
}
