//! Discovery — `/apis` (legacy `APIGroupList`, or aggregated discovery v2 when asked),
//! `/apis/<group>`, `/apis/<group>/<version>` — derived from the resource modules, never
//! written by hand.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::View;
use crate::{GROUP, VERSION};

/// `GET /apis/<group>/<version>`: the legacy `APIResourceList`.
pub fn api_resource_list(views: &[Arc<dyn View>]) -> Value {
    let mut resources = Vec::new();
    for v in views {
        let r = v.info();
        resources.push(json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs, "shortNames": r.short_names, "categories": r.categories}));
        for s in r.subresources {
            resources.push(
                json!({"name": format!("{}/{}", r.plural, s.name), "singularName": "",
                "namespaced": r.namespaced, "kind": s.kind, "verbs": s.verbs}),
            );
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
pub fn aggregated(views: &[Arc<dyn View>]) -> Value {
    let resources: Vec<Value> = views
        .iter()
        .map(|v| {
            let r = v.info();
            let subs: Vec<Value> = r
                .subresources
                .iter()
                .map(|s| json!({"subresource": s.name, "responseKind": {"group": GROUP, "version": VERSION, "kind": s.kind}, "verbs": s.verbs}))
                .collect();
            let mut d = json!({"resource": r.plural, "responseKind": {"group": GROUP, "version": VERSION, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" }, "singularResource": r.singular,
                "verbs": r.verbs, "shortNames": r.short_names, "categories": r.categories});
            if !subs.is_empty() {
                d["subresources"] = Value::Array(subs);
            }
            d
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
        "items": [{"metadata": {"name": GROUP, "creationTimestamp": null},
            "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}]}]})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn discovery_lists_every_resource_and_subresource() {
        let views = crate::resources::all();
        let legacy = api_resource_list(&views);
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
        let v2 = aggregated(&views);
        let res = &v2["items"][0]["versions"][0]["resources"];
        assert_eq!(res[0]["subresources"][0]["subresource"], "addresses");
        assert_eq!(res[1]["scope"], "Cluster");
    }
}
