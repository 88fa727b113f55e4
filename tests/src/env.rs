//! A test environment for the controller tests: a throwaway namespace, a controller
//! process of its own, object builders, waiting, events and audited writes. Tests that
//! use it run one at a time ([`SERIAL`]): a controller watches the whole cluster.

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::collections::BTreeMap;
use std::time::Duration;

use address_controller_api::names::reason;
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim, IPAddressClass};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};

use crate::invariants::{Replica, Scope, assert_invariants};
use crate::{
    AuditedWrite, Cleanup, Cluster, ControllerProcess, TestNamespace, audited_writes, free_port,
    random_suffix, setup, wait_for,
};

/// How long a test waits for the controller to converge.
pub const WAIT: Duration = Duration::from_secs(30);

pub static SERIAL: Mutex<()> = Mutex::const_new(());

pub struct Env {
    pub client: Client,
    pub ns: TestNamespace,
    pub sfx: String,
    pub cleanup: Cleanup,
    pub ctl: ControllerProcess,
    /// Classes this test made or used: the invariant check looks at them.
    pub classes: Vec<String>,
    _serial: MutexGuard<'static, ()>,
}

pub async fn env(prefix: &str) -> Env {
    let serial = SERIAL.lock().await;
    let (_, client) = setup().await;
    let ns = TestNamespace::create(&client, prefix).await.unwrap();
    let sfx = random_suffix();
    let ctl = ControllerProcess::start(&format!("ctl-{prefix}-{sfx}"), &["--leader-elect=false"])
        .await
        .unwrap();
    Env {
        client,
        ns,
        sfx,
        cleanup: Cleanup::default(),
        ctl,
        classes: Vec::new(),
        _serial: serial,
    }
}

impl Env {
    pub fn name(&self, base: &str) -> String {
        format!("{base}-{}", self.sfx)
    }
    pub fn claims(&self) -> Api<IPAddressClaim> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }
    pub fn addresses(&self) -> Api<IPAddress> {
        Api::all(self.client.clone())
    }
    pub fn classes(&self) -> Api<IPAddressClass> {
        Api::all(self.client.clone())
    }

    pub async fn class(&mut self, base: &str, extra: Value) -> String {
        let name = self.name(base);
        let mut v = json!({"metadata": {"name": name}, "spec": {"provisioner": format!("{base}.drivers.test")}});
        merge(&mut v, extra);
        self.classes()
            .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
        self.cleanup
            .add("ipaddressclasses.local.sdn.cozystack.io", &name);
        self.classes.push(name.clone());
        if self.ctl.running() {
            // The core's one write to a new class (DriverAvailable) lands before the test
            // goes on, so tests counting the writes of what follows do not see it.
            let api = self.classes();
            wait_for(&format!("class {name}: DriverAvailable"), WAIT, || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let c = api.get(&name).await?;
                    Ok(c.status
                        .iter()
                        .flat_map(|s| &s.conditions)
                        .any(|c| c.type_ == "DriverAvailable")
                        .then_some(()))
                }
            })
            .await
            .unwrap();
        }
        name
    }

    pub async fn address(&mut self, base: &str, ip: &str, class: &str, extra: Value) -> String {
        let name = self.name(base);
        let mut v = json!({"metadata": {"name": name},
            "spec": {"address": ip, "className": class, "source": {"fromClass": {}}}});
        merge(&mut v, extra);
        self.addresses()
            .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
        self.cleanup
            .add("ipaddresses.local.sdn.cozystack.io", &name);
        if !self.classes.iter().any(|c| c == class) {
            self.classes.push(class.to_string());
        }
        name
    }

    pub async fn claim(&self, name: &str, spec: Value) -> IPAddressClaim {
        let v = json!({"metadata": {"name": name}, "spec": spec});
        self.claims()
            .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap()
    }

    pub async fn wait_claim(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&IPAddressClaim) -> bool,
    ) -> IPAddressClaim {
        let api = self.claims();
        let last = std::sync::Mutex::new(None::<IPAddressClaim>);
        let r = wait_for(&format!("claim {name}: {what}"), WAIT, || {
            let api = api.clone();
            let last = &last;
            let pred = &pred;
            async move {
                let c = api.get(name).await?;
                let ok = pred(&c);
                *last.lock().unwrap() = Some(c.clone());
                Ok(ok.then_some(c))
            }
        })
        .await;
        r.unwrap_or_else(|e| {
            panic!(
                "{e}\nlast seen: {:#?}",
                last.lock().unwrap().as_ref().map(|c| &c.status)
            )
        })
    }

    pub async fn wait_address(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(Option<&IPAddress>) -> bool,
    ) -> Option<IPAddress> {
        let api = self.addresses();
        wait_for(&format!("address {name}: {what}"), WAIT, || {
            let api = api.clone();
            let pred = &pred;
            async move {
                let a = api.get_opt(name).await?;
                Ok(pred(a.as_ref()).then_some(a))
            }
        })
        .await
        .unwrap()
    }

    /// Event reasons recorded on an object (claims: their namespace; cluster-scoped: default).
    pub async fn events(&self, namespace: &str, name: &str) -> Vec<(String, String)> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let mut out: Vec<(String, String)> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect();
        out.sort();
        out
    }

    pub async fn wait_event(&self, namespace: &str, name: &str, reason: &str) -> String {
        wait_for(&format!("event {reason} on {name}"), WAIT, || async {
            Ok(self
                .events(namespace, name)
                .await
                .into_iter()
                .find(|(r, _)| r == reason)
                .map(|(_, n)| n))
        })
        .await
        .unwrap()
    }

    /// Successful writes of this test's controller to objects whose name contains the
    /// test suffix or that live in the test namespace (the barriers' own writes left out).
    pub fn writes(&self, user: &str) -> Vec<AuditedWrite> {
        audited_writes(user, |w| {
            (w.code < 300)
                && !w.name.as_deref().is_some_and(|n| n.starts_with(BARRIER))
                && (w.namespace.as_deref() == Some(self.ns.name.as_str())
                    || w.name.as_deref().is_some_and(|n| n.contains(&self.sfx)))
        })
        .unwrap()
    }

    /// Waits until the running controller has seen every change made before this call —
    /// instead of sleeping before a check that something did *not* happen. A claim of a
    /// class that does not exist, created now, is marked `ClassNotFound` by the controller
    /// (the watch delivers changes in order, so the ones made before it were delivered and
    /// queued first), then deleted. It is also the positive control of such a check: the
    /// controller was live and acting, so "nothing happened" is not a dead controller.
    pub async fn barrier(&self) {
        let name = format!("{BARRIER}{}", random_suffix());
        let body = json!({"metadata": {"name": name},
            "spec": {"className": format!("{BARRIER}no-such-class-{}", self.sfx)}});
        self.claims()
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
        self.wait_claim(&name, "marked by the controller (barrier)", |c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|x| x.reason == reason::CLASS_NOT_FOUND)
            })
        })
        .await;
        self.claims()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        self.wait_claim_gone(&name).await;
    }
}

/// `kubectl get namespaceaddresses -A` (through the aggregator) shows `namespace` holding
/// `bound` Bound addresses.
pub fn assert_holdings_bound(namespace: &str, bound: usize) {
    let holdings = Cluster::get()
        .kubectl_ok(&["get", "namespaceaddresses", "-A"])
        .unwrap();
    let row = holdings
        .lines()
        .find(|l| l.starts_with(&format!("{namespace} ")))
        .unwrap_or_else(|| panic!("no row for {namespace}:\n{holdings}"));
    assert_eq!(
        row.split_whitespace().nth(3),
        Some(bound.to_string().as_str()),
        "BOUND: {holdings}"
    );
}

/// Names of barrier claims (see [`Env::barrier`]).
pub const BARRIER: &str = "barrier-";

pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

pub fn phase(c: &IPAddressClaim) -> Option<ClaimPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

pub fn aphase(a: Option<&IPAddress>) -> Option<AddressPhase> {
    a.and_then(|a| a.status.as_ref()).and_then(|s| s.phase)
}

pub fn condition<'a>(
    c: &'a IPAddressClaim,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|x| x.type_ == type_)
}

pub fn count(writes: &[AuditedWrite]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for w in writes {
        let key = format!(
            "{} {}{}",
            w.verb,
            w.resource,
            w.subresource
                .as_ref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        );
        *m.entry(key).or_default() += 1;
    }
    m
}

impl Env {
    /// The invariant check over this test's namespace and classes, with the gauges of the
    /// test's controller when it runs: every test ends with it.
    pub async fn check(&mut self) {
        let replicas: Vec<&ControllerProcess> = if self.ctl.running() {
            vec![&self.ctl]
        } else {
            vec![]
        };
        self.check_with(&replicas).await;
    }

    /// [`Env::check`] comparing the gauges of `replicas` (every replica that runs).
    pub async fn check_with(&self, replicas: &[&ControllerProcess]) {
        let scope = Scope::of(
            &[self.ns.name.as_str()],
            &self.classes.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let replicas: Vec<Replica> = replicas.iter().filter_map(|p| p.replica()).collect();
        assert_invariants(&self.client, &scope, &replicas).await;
    }

    pub async fn wait_claim_gone(&self, name: &str) {
        let api = self.claims();
        wait_for(&format!("claim {name} gone"), WAIT, || {
            let api = api.clone();
            async move { Ok(api.get_opt(name).await?.is_none().then_some(())) }
        })
        .await
        .unwrap();
    }
}

/// The range driver's provisioner name.
pub const RANGE_PROVISIONER: &str = "range.drivers.local.sdn.cozystack.io";

/// A class of the range driver over `cidrs`.
pub async fn range_class(e: &mut Env, base: &str, cidrs: Value, extra: Value) -> String {
    let mut spec =
        json!({"spec": {"provisioner": RANGE_PROVISIONER, "parameters": {"cidrs": cidrs}}});
    merge(&mut spec, extra);
    e.class(base, spec).await
}

/// Removes addresses left in these ranges by earlier runs against the same cluster (driver
/// names derive from the IP, so they would collide), and waits until they are gone.
pub async fn purge(e: &Env, prefixes: &[&str]) {
    let api = e.addresses();
    let stale = |a: &IPAddress| prefixes.iter().any(|p| a.spec.address.starts_with(p));
    for a in api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|a| stale(a))
    {
        let name = a.name_any();
        let _ = api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
    wait_for("stale addresses gone", WAIT, || {
        let api = api.clone();
        async move {
            Ok((!api
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(&stale))
            .then_some(()))
        }
    })
    .await
    .unwrap();
}

/// Leader-election flags with a short lease, so failover happens within seconds.
pub fn fast_lease(lease: &str) -> Vec<String> {
    [
        "--lease-name",
        lease,
        "--lease-duration",
        "3s",
        "--renew-deadline",
        "2s",
        "--retry-period",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Waits until the Lease `name` in `default` is held by `holder`.
pub async fn wait_lease_holder(client: &Client, name: &str, holder: &str) {
    wait_lease_holder_in(client, "default", name, holder).await;
}

/// Waits until `holder` holds the Lease `name` in `namespace`.
pub async fn wait_lease_holder_in(client: &Client, namespace: &str, name: &str, holder: &str) {
    wait_for(
        &format!("lease {namespace}/{name} held by {holder}"),
        WAIT,
        || async move {
            Ok(
                (lease_holder_in(client, namespace, name).await?.as_deref() == Some(holder))
                    .then_some(()),
            )
        },
    )
    .await
    .unwrap();
}

/// Who holds the Lease `name` in `default`, if anyone.
pub async fn lease_holder(client: &Client, name: &str) -> anyhow::Result<Option<String>> {
    lease_holder_in(client, "default", name).await
}

/// Who holds the Lease `name` in `namespace`, if anyone.
pub async fn lease_holder_in(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<String>> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), namespace);
    Ok(leases
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// The APIService of the views.
pub const APISERVICE: &str = "v1alpha1.view.local.sdn.cozystack.io";

/// Registers the views through an APIService whose ExternalName Service points at
/// `localhost:<port>`, and waits until it is Available.
pub async fn register_views(e: &mut Env, port: u16) {
    register_views_at(port).await;
    e.cleanup
        .add("apiservices.apiregistration.k8s.io", APISERVICE);
}

/// [`register_views`] without a test environment (benchmarks): nothing is cleaned up.
pub async fn register_views_at(port: u16) {
    let cluster = Cluster::get();
    let pki = cluster.dir.join("pki");
    let ca = std::fs::read(pki.join("aggr-ca.crt")).unwrap();
    let objects = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "address-controller-system"}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "address-controller-api", "namespace": "address-controller-system"},
            "spec": {"type": "ExternalName", "externalName": "localhost"}}),
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
            "spec": {"group": "view.local.sdn.cozystack.io", "version": "v1alpha1", "groupPriorityMinimum": 1000, "versionPriority": 15,
                "service": {"namespace": "address-controller-system", "name": "address-controller-api", "port": port},
                "caBundle": base64(&ca)}}),
    ];
    let dir = tempdir();
    let file = dir.join("register.yaml");
    std::fs::write(
        &file,
        objects
            .iter()
            .map(|o| serde_yaml::to_string(o).unwrap())
            .collect::<Vec<_>>()
            .join("---\n"),
    )
    .unwrap();
    cluster.apply_path(&file).unwrap();
    wait_for(
        "APIService Available",
        Duration::from_secs(60),
        apiservice_available,
    )
    .await
    .unwrap();
}

impl Env {
    /// Replaces the test's controller by one that also serves the views (and HTTPS
    /// /metrics), registered through the APIService whose ExternalName Service points at
    /// localhost: the controller, the views' port and the metrics port.
    pub async fn serve_views(&mut self) -> (ControllerProcess, u16, u16) {
        self.serve_views_with(&[]).await
    }

    /// [`Env::serve_views`] with extra arguments for the controller.
    pub async fn serve_views_with(&mut self, extra: &[&str]) -> (ControllerProcess, u16, u16) {
        self.serve_views_in(None, extra).await
    }

    /// [`Env::serve_views_with`], the controller's open-file limit set to `soft:hard`.
    pub async fn serve_views_with_open_files(
        &mut self,
        soft_hard: &str,
        extra: &[&str],
    ) -> (ControllerProcess, u16, u16) {
        self.serve_views_in(Some(soft_hard), extra).await
    }

    async fn serve_views_in(
        &mut self,
        open_files: Option<&str>,
        extra: &[&str],
    ) -> (ControllerProcess, u16, u16) {
        self.ctl.kill();
        let cluster = Cluster::get();
        let port = free_port();
        let metrics_port = free_port();
        let pki = cluster.dir.join("pki");
        let address = format!("127.0.0.1:{port}");
        let metrics = format!("127.0.0.1:{metrics_port}");
        let (cert, key) = (pki.join("aggr.crt"), pki.join("aggr.key"));
        let mut args = vec![
            "--leader-elect=false",
            "--apiserver-address",
            &address,
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-private-key-file",
            key.to_str().unwrap(),
            "--metrics-address",
            &metrics,
        ];
        args.extend(extra);
        let user = format!("ctl-views-{}-{}", self.sfx, port);
        let ctl = match open_files {
            None => ControllerProcess::start(&user, &args).await,
            Some(limit) => ControllerProcess::start_with_open_files(&user, limit, &args).await,
        }
        .unwrap();
        register_views(self, port).await;
        (ctl, port, metrics_port)
    }
}

/// `Some(())` once the views' APIService reports `Available=True`: a `wait_for` probe.
pub async fn apiservice_available() -> anyhow::Result<Option<()>> {
    let out = Cluster::get().kubectl_ok(&[
        "get",
        "apiservice",
        APISERVICE,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
    ])?;
    Ok((out.trim() == "True").then_some(()))
}

/// A fresh temporary directory, removed when the returned guard drops.
pub fn tempdir() -> crate::TempDir {
    crate::TempDir::new("ac-test")
}

/// Standard base64 (the APIService's caBundle).
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 decoding (Secret data).
pub fn b64decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| *c != b'=' && *c != b'\n').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= u32::from(val(*c)) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_round_trips_every_padding_length() {
        for data in [&b""[..], b"a", b"ab", b"abc", b"abcd", b"\x00\xff\x10\x80"] {
            let encoded = super::base64(data);
            assert_eq!(encoded.len() % 4, 0);
            assert_eq!(super::b64decode(&encoded), data, "{encoded}");
        }
        assert_eq!(super::base64(b"CA"), "Q0E=");
    }
}
