//! Objects for the plans' table tests: a Service naming claim `t/c`, the claim, its
//! addresses, a ledger entry.

#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::sync::Arc;

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{IPAddress, IPAddressClaim};
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

/// A JSON merge patch (null removes).
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p,
    }
}

pub fn svc(name: &str, extra: Value) -> Arc<Service> {
    let mut v = json!({"metadata": {"name": name, "namespace": "t",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {SERVICE_CLAIM_ANNOTATION: "c"}},
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv4"]}});
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

pub fn claim(phase: &str, listed: &[(&str, &str)]) -> IPAddressClaim {
    let addresses: Vec<Value> = listed
        .iter()
        .map(|(n, a)| json!({"name": n, "address": a}))
        .collect();
    serde_json::from_value(
        json!({"metadata": {"name": "c", "namespace": "t", "uid": "u"},
        "spec": {"family": "Dual"}, "status": {"phase": phase, "addresses": addresses}}),
    )
    .unwrap()
}

pub fn addr(name: &str, ip: &str, extra: Value) -> Arc<IPAddress> {
    let mut v = json!({"metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"address": ip, "className": "k", "source": {"fromClass": {}},
            "claimRef": {"namespace": "t", "name": "c", "uid": "u"}},
        "status": {"phase": "Bound"}});
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).unwrap())
}

pub fn at(service: &str) -> Value {
    json!({"status": {"associatedTo": {"kind": "Service", "namespace": "t", "name": service},
        "attachments": [{"kind": "Service", "namespace": "t", "name": service}]}})
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
