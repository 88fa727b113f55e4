//! What a request asks for: the resource attributes authorization needs (kube-apiserver's
//! `RequestInfo`: group, version, namespace, resource, name, subresource, verb) and its raw
//! query. Generic over the API group: the group comes from the path.

use std::collections::BTreeMap;

use axum::http::Method;

/// The resource a request is about (`/apis/<g>/<v>/[namespaces/<ns>/]<resource>[/<name>[/<sub>]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    pub verb: &'static str,
    /// Segments after the subresource: authorized as the subresource (kube-apiserver does
    /// too), served by nothing.
    pub beyond: bool,
}

/// kube-apiserver's verb of a request: METHOD on a NAMED object or a collection, WATCH when
/// a GET asks to watch. The one table, read by [`RequestInfo`] and by the views' refusals.
pub fn verb_of(method: &Method, named: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET | Method::HEAD if named => "get",
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

impl RequestInfo {
    /// `None` for a path that is not a resource path (discovery, OpenAPI, probes).
    pub fn parse(method: &Method, path: &str, query: &Query) -> Option<RequestInfo> {
        let rest = path.strip_prefix("/apis/")?;
        let parts: Vec<&str> = rest.split('/').collect();
        let (group, version, rest) = match parts.as_slice() {
            [g, v, rest @ ..] if !rest.is_empty() => (g.to_string(), v.to_string(), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            // `namespaces/<ns>` alone is the namespace object itself, not ours.
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            r => (None, r),
        };
        let (resource, name, subresource) = match rest {
            [r] => (*r, None, None),
            [r, n] => (*r, Some(n.to_string()), None),
            [r, n, s, ..] => (*r, Some(n.to_string()), Some(s.to_string())),
            [] => return None,
        };
        let beyond = rest.len() > 3;
        let verb = verb_of(method, name.is_some(), query.watch());
        Some(RequestInfo {
            group,
            version,
            namespace,
            resource: resource.to_string(),
            name,
            subresource,
            verb,
            beyond,
        })
    }
}

/// The raw query: the first value of each parameter, decoded (`url.Values.Get`).
#[derive(Debug, Clone, Default)]
pub struct Query(pub BTreeMap<String, String>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(raw.unwrap_or("")).unwrap_or_default();
        let mut m = BTreeMap::new();
        for (k, v) in pairs {
            m.entry(k).or_insert(v);
        }
        Query(m)
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// `watch` as kube-apiserver reads it: a true boolean (`1`, `t`, `true`, …), or any
    /// other non-empty value it cannot parse (kube-apiserver then watches too).
    pub fn watch(&self) -> bool {
        self.get("watch")
            .is_some_and(|w| !w.is_empty() && parse_bool(w) != Some(false))
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_info_follows_kube_apiserver() {
        let q = Query::parse(Some("watch=1"));
        let r = RequestInfo::parse(&Method::GET, "/apis/g/v/namespaces/a/things", &q).unwrap();
        assert_eq!(
            (r.verb, r.namespace.as_deref(), r.resource.as_str()),
            ("watch", Some("a"), "things")
        );
        let r =
            RequestInfo::parse(&Method::GET, "/apis/g/v/things/x/sub", &Query::default()).unwrap();
        assert_eq!(
            (r.verb, r.name.as_deref(), r.subresource.as_deref()),
            ("get", Some("x"), Some("sub"))
        );
        assert_eq!(RequestInfo::parse(&Method::GET, "/apis/g/v", &q), None);
        let r = RequestInfo::parse(&Method::DELETE, "/apis/g/v/things", &q).unwrap();
        assert_eq!(r.verb, "deletecollection");
    }
}
