//! A LoadBalancer Service's side of the tests of a load balancer the drivers pin through
//! (MetalLB, Cilium LB-IPAM): making one, waiting for its ingress and its `AddressAttached`.

#![allow(clippy::unwrap_used)] // test support: a failed step fails loudly

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::env::{Env, WAIT};
use crate::wait_for;

pub fn services(e: &Env, ns: &str) -> Api<Service> {
    Api::namespaced(e.client.clone(), ns)
}

pub fn ingress(s: &Service) -> Vec<String> {
    address_controller_api::service::ingress_ips(s)
        .map(str::to_string)
        .collect()
}

pub async fn service(e: &Env, ns: &str, name: &str, annotations: Value, spec: Value) -> Service {
    let mut v = json!({"metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    crate::env::merge(&mut v, json!({"spec": spec}));
    services(e, ns)
        .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap()
}

pub async fn wait_ingress(e: &Env, ns: &str, name: &str, want: &[&str]) -> Service {
    let api = services(e, ns);
    wait_for(
        &format!("Service {ns}/{name} ingress {want:?}"),
        WAIT,
        || async {
            let s = api.get(name).await?;
            let mut got = ingress(&s);
            got.sort();
            let mut w: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            w.sort();
            if got == w {
                Ok(Some(s))
            } else {
                Err(anyhow::anyhow!("ingress {got:?}"))
            }
        },
    )
    .await
    .unwrap()
}

/// A Service spec's `ports` from `PROTO/port`s.
pub fn ports_spec(ports: &[&str]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| {
            let (proto, port) = p.split_once('/').unwrap();
            json!({"name": format!("{}-{port}", proto.to_lowercase()), "protocol": proto,
                "port": port.parse::<i32>().unwrap()})
        })
        .collect();
    json!({"ports": ports})
}

/// The Service's `AddressAttached` condition reason once it has `status`.
pub async fn wait_attached(e: &Env, ns: &str, name: &str, status: &str, reason: &str) -> String {
    let api = services(e, ns);
    wait_for(
        &format!("Service {ns}/{name} AddressAttached={status} {reason}"),
        WAIT,
        || async {
            let s = api.get(name).await?;
            match address_controller_api::sharing::condition(&s) {
                Some(c) if c.status == status && c.reason == reason => Ok(Some(c.message.clone())),
                Some(c) => Err(anyhow::anyhow!(
                    "AddressAttached={} {}: {}",
                    c.status,
                    c.reason,
                    c.message
                )),
                None => Err(anyhow::anyhow!("no AddressAttached condition")),
            }
        },
    )
    .await
    .unwrap()
}
