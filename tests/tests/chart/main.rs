//! The Helm chart `chart/address-controller`: `helm lint` / `helm template` over a matrix of
//! values with assertions on the rendered objects, the values schema refusing bad input,
//! and real installs into the local control plane — the binary running on the host as the
//! chart's ServiceAccount with the chart's certificate behind the chart's APIService, the
//! admission policy, and the roles aggregated into view/edit/admin.
//!
//! The local control plane has no kubelet, so the Deployment's pods never start: the
//! cluster tests install with `apiService.service.externalName=localhost` and run the
//! binary themselves, with the Deployment's own arguments.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeSet;

use std::process::Command;
use std::time::Duration;

use address_controller_api::{ClaimPhase, IPAddressClaim};
use address_controller_tests::access::{allowed, kubectl_as};
use address_controller_tests::chart::{
    INSTALL, Release, Runner, chart_dir, create_token, kind_name, run_helm, secret_data,
    values_file,
};
use address_controller_tests::env::{
    APISERVICE, apiservice_available, assert_holdings_bound, b64decode, phase, tempdir,
    wait_lease_holder_in,
};
use address_controller_tests::{
    Cleanup, Cluster, TestNamespace, free_port, random_suffix, repo_root, setup, wait_for,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

mod admission;
mod install;
mod render;
mod rights;
mod schema;

/// `helm template` into namespace `address-controller-system` for Kubernetes 1.36 with
/// `values` and extra flags; the rendered objects, or helm's error.
fn render(values: &Value, extra: &[&str]) -> Result<Vec<Value>, String> {
    address_controller_tests::chart::render("address-controller-system", values, extra)
}

fn kind_names(objs: &[Value]) -> BTreeSet<String> {
    objs.iter().map(kind_name).collect()
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} among {:?}", kind_names(objs)))
}

fn has(objs: &[Value], kind: &str) -> bool {
    objs.iter().any(|o| o["kind"] == kind)
}

fn container(objs: &[Value]) -> &Value {
    &find(objs, "Deployment", "address-controller")["spec"]["template"]["spec"]["containers"][0]
}

fn args(objs: &[Value]) -> Vec<String> {
    container(objs)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// A container as started: its binary, arguments and environment values.
type Started = (String, Vec<String>, Vec<(String, String)>);

/// Every container of `objs` (kind Deployment) as it would be started.
fn containers(objs: &[Value]) -> Vec<Started> {
    objs.iter()
        .filter(|o| o["kind"] == "Deployment")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| {
            let bin = c["command"][0]
                .as_str()
                .map_or("address-controller", |p| p.rsplit('/').next().unwrap_or(p))
                .to_string();
            let strings = |v: &Value| -> Vec<String> {
                v.as_array()
                    .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
                    .unwrap_or_default()
            };
            let env = c["env"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|e| {
                    Some((
                        e["name"].as_str()?.to_string(),
                        e["value"].as_str()?.to_string(),
                    ))
                })
                .collect();
            (bin, strings(&c["args"]), env)
        })
        .collect()
}
