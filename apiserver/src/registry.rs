//! The one registry of served resources. Discovery (legacy and aggregated), routing of
//! verbs and the Table columns are all derived from it.

use serde_json::{Value, json};

use crate::views::{GROUP, VERSION};

/// A served resource.
pub struct Resource {
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub verbs: &'static [&'static str],
    /// Subresources: (name, kind, verbs).
    pub subresources: &'static [(&'static str, &'static str, &'static [&'static str])],
    pub categories: &'static [&'static str],
}

pub const RESOURCES: &[Resource] = &[
    Resource {
        plural: "namespaceaddresses",
        singular: "namespaceaddresses",
        kind: "NamespaceAddresses",
        namespaced: true,
        short_names: &["nsaddr"],
        verbs: &["get", "list", "watch"],
        subresources: &[("addresses", "NamespaceAddressRecords", &["get"])],
        categories: &["addresses"],
    },
    Resource {
        plural: "poolavailabilities",
        singular: "poolavailability",
        kind: "PoolAvailability",
        namespaced: false,
        short_names: &["pool"],
        verbs: &["get", "list", "watch"],
        subresources: &[],
        categories: &["addresses"],
    },
];

pub fn find(plural: &str) -> Option<&'static Resource> {
    RESOURCES.iter().find(|r| r.plural == plural)
}

/// `GET /apis/<group>/<version>`: the legacy `APIResourceList`.
pub fn api_resource_list() -> Value {
    let mut resources = Vec::new();
    for r in RESOURCES {
        resources.push(json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs, "shortNames": r.short_names, "categories": r.categories}));
        for (sub, kind, verbs) in r.subresources {
            resources.push(json!({"name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": kind, "verbs": verbs}));
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"), "resources": resources})
}

/// `GET /apis/<group>`: the `APIGroup`.
pub fn api_group() -> Value {
    let gv = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv], "preferredVersion": gv})
}

/// `GET /apis`: the legacy `APIGroupList`.
pub fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]})
}

/// `GET /apis` with the aggregated discovery Accept: `APIGroupDiscoveryList` (v2).
pub fn aggregated_discovery() -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .map(|r| {
            let subs: Vec<Value> = r
                .subresources
                .iter()
                .map(|(sub, kind, verbs)| json!({"subresource": sub, "responseKind": {"group": GROUP, "version": VERSION, "kind": kind}, "verbs": verbs}))
                .collect();
            let mut v = json!({"resource": r.plural, "responseKind": {"group": GROUP, "version": VERSION, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" }, "singularResource": r.singular,
                "verbs": r.verbs, "shortNames": r.short_names, "categories": r.categories});
            if !subs.is_empty() {
                v["subresources"] = Value::Array(subs);
            }
            v
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
        "items": [{"metadata": {"name": GROUP, "creationTimestamp": null},
            "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}]}]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_documents_list_every_resource_and_subresource() {
        let legacy = api_resource_list();
        let names: Vec<&str> = legacy["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "namespaceaddresses",
                "namespaceaddresses/addresses",
                "poolavailabilities"
            ]
        );
        let v2 = aggregated_discovery();
        let res = &v2["items"][0]["versions"][0]["resources"];
        assert_eq!(res[0]["subresources"][0]["subresource"], "addresses");
        assert_eq!(res[1]["scope"], "Cluster");
    }
}
