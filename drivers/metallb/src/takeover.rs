//! `metallb-driver takeover`: moving in where the Go MetalLB driver (metallb-iad) ran,
//! without renumbering and without a moment in which an address is unheld. Run once, with
//! the Go pair stopped, before this driver starts (docs/operations.md, "Migrating to
//! address-controller"); a dry run unless `--yes`; a second run finds nothing to do.
//!
//! What the Go driver left, and what becomes of it:
//! * its finalizer `…/teardown` on each `IPAddress` → this driver's `…/hold` (in one write;
//!   nothing would ever remove the Go one, and a `Delete` reclaim would hang on it);
//! * the marker `…/pinned: "true"` on a tenant's Service: "the Service's current
//!   `metallb.io/loadBalancerIPs` are the driver's" → this driver's record of them, and the
//!   claim's sharing key (MetalLB lets the only user of an address change its key in place);
//! * its placeholders (`--go-placeholder-namespace`): each is given the claim's sharing key
//!   and another port, this driver's hold is created beside it and seen holding the address
//!   in MetalLB's books (its ingress), and only then is the placeholder deleted;
//! * its `iad-<class>` pool and advertisement: left for the driver, which adopts them in
//!   place ([`crate::metallb::MetalLb::pool_of`]); its Go-named `IPAddress` objects stay as they are.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use address_controller_api::family::{ipv4_first, parse_address, sort_ipv4_first};
use address_controller_api::{IPAddress, IPAddressClass};
use address_controller_driver_kit::ingress;
use address_controller_driver_kit::render_marker;
use address_controller_runtime::client::ClientArgs;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::metallb::{ALLOW_SHARED_IP, FINALIZER, LOAD_BALANCER_IPS, MetalLbArgs, PROVISIONER};

/// The Go driver's finalizer on each IPAddress.
pub const GO_FINALIZER: &str = "metallb.drivers.local.sdn.cozystack.io/teardown";
/// The Go driver's marker on a tenant's Service it pinned (`"true"`).
pub const GO_MARKER: &str = "metallb.drivers.local.sdn.cozystack.io/pinned";
/// The Go driver's placeholders: this label `"true"`, and the IPAddress they hold.
pub const GO_PLACEHOLDER_LABEL: &str = "metallb.drivers.local.sdn.cozystack.io/placeholder";
pub const GO_ADDRESS_LABEL: &str = "metallb.drivers.local.sdn.cozystack.io/ip-address";
/// The port a Go placeholder moves to while it shares the address with the hold (the hold's
/// is [`address_controller_driver_kit::holds::HOLD_PORT`]; MetalLB shares an address only between Services of
/// distinct ports).
pub const MOVED_PLACEHOLDER_PORT: i32 = 65533;

/// `metallb-driver takeover`'s flags: the driver's MetalLB flags (their `env` too), and its
/// own.
#[derive(clap::Args, Clone, Debug)]
pub struct TakeoverArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub log: address_controller_runtime::logging::LogArgs,
    #[command(flatten)]
    pub metallb: MetalLbArgs,
    /// Act; without it, print what would be done (never from the environment).
    #[arg(long)]
    pub yes: bool,
    /// The Go driver's `--placeholder-namespace`.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METALLB_DRIVER_GO_PLACEHOLDER_NAMESPACE",
        default_value = "metallb-iad-system"
    )]
    pub go_placeholder_namespace: String,
    /// How long to wait for MetalLB to show each hold holding its address.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METALLB_DRIVER_TAKEOVER_WAIT",
        default_value = "60s",
        value_parser = address_controller_api::duration::parse
    )]
    pub wait: Duration,
}

/// `metallb-driver takeover …`: its logging, a runtime, [`run`]; exit 1 when something was
/// left undone or failed.
pub fn main(args: &TakeoverArgs, controller: &str) -> std::process::ExitCode {
    args.log.init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("metallb-driver takeover: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, controller)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("metallb-driver takeover: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One line of the report: the object, ok or FAIL, what was (or would be) done.
pub use address_controller_runtime::report::Row;

fn row(object: impl Into<String>, action: impl Into<String>, ok: bool) -> Row {
    Row::new(object, ok, action)
}

/// The report as kubectl prints a table.
pub fn table(rows: &[Row]) -> String {
    address_controller_runtime::report::status_table("OBJECT", "ACTION", rows)
}

/// The finalizers of an address with the Go driver's swapped for this driver's (`None`:
/// nothing to swap). Order kept; this driver's never twice.
pub fn swapped_finalizers(finalizers: &[String]) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == GO_FINALIZER) {
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    for f in finalizers {
        let f = if f == GO_FINALIZER { FINALIZER } else { f };
        if !out.iter().any(|o| o == f) {
            out.push(f.to_string());
        }
    }
    Some(out)
}

/// What the Go marker `"true"` on a Service means: the addresses of its current
/// `metallb.io/loadBalancerIPs` were pinned by the driver (empty: not the Go driver's pin).
pub fn go_pins(s: &Service) -> Vec<IpAddr> {
    let ann = s.annotations();
    if ann.get(GO_MARKER).map(String::as_str) != Some("true") {
        return Vec::new();
    }
    ann.get(LOAD_BALANCER_IPS)
        .map(|v| {
            v.split(',')
                .filter_map(|x| parse_address(x.trim()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs the takeover; whether every step succeeded.
pub async fn run(args: &TakeoverArgs, controller: &str) -> anyhow::Result<bool> {
    let client = args.client.client().await?;
    address_controller_runtime::leader::refuse_while_go_pair_leads(&client).await?;
    let driver = args.metallb.driver();
    let marker = address_controller_api::names::driver::pinned_annotation(controller);
    let classes: BTreeSet<String> = Api::<IPAddressClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.spec.provisioner == PROVISIONER)
        .map(|c| c.name_any())
        .collect();
    let addresses: Vec<IPAddress> = Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|a| classes.contains(&a.spec.class_name))
        .collect();
    let services = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let placeholders: Vec<&Service> = services
        .iter()
        .filter(|s| {
            s.namespace().as_deref() == Some(args.go_placeholder_namespace.as_str())
                && s.labels().get(GO_PLACEHOLDER_LABEL).map(String::as_str) == Some("true")
        })
        .collect();
    let mut t = Takeover {
        args,
        client: &client,
        driver: &driver,
        rows: Vec::new(),
    };
    // 1. Finalizers.
    for a in &addresses {
        t.swap_finalizer(a).await;
    }
    // 2. The Go driver's pins on tenants' Services: the claim's key and this driver's record,
    //    then the hold beside each (like the Service, for MetalLB's backend key).
    let like = t
        .convert_pins(&services, &placeholders, &addresses, &marker)
        .await;
    // 3. The Go placeholders: the claim's key and another port, so the hold can share.
    let to_delete = t.prepare_placeholders(&placeholders, &addresses).await;
    // 4. A hold for every address (the driver would create them; here each is seen holding
    //    before a placeholder goes).
    for a in &addresses {
        t.hold(a, like.get(&a.name_any()).copied()).await;
    }
    let held = if args.yes {
        t.wait_held(&addresses).await
    } else {
        BTreeSet::new()
    };
    // 5. The placeholders whose address is held by its hold.
    for (p, a) in to_delete {
        t.delete_placeholder(p, a, &held).await;
    }
    if t.rows.is_empty() {
        t.rows.push(row(
            "-",
            format!(
                "nothing of the Go driver's is left ({} addresses of {} classes)",
                addresses.len(),
                classes.len()
            ),
            true,
        ));
    }
    print!("{}", table(&t.rows));
    if !args.yes {
        println!("(dry run: nothing written; --yes to act)");
    }
    Ok(t.rows.iter().all(|r| r.ok))
}

struct Takeover<'a> {
    args: &'a TakeoverArgs,
    client: &'a Client,
    driver: &'a crate::metallb::MetalLb,
    rows: Vec<Row>,
}

impl Takeover<'_> {
    /// Step 2 over every tenant's Service the Go driver pinned (not a placeholder): each
    /// address it pins, by name, with the Service the hold is made like.
    async fn convert_pins<'s>(
        &mut self,
        services: &'s [Service],
        placeholders: &[&Service],
        addresses: &[IPAddress],
        marker: &str,
    ) -> BTreeMap<String, &'s Service> {
        let by_ip: BTreeMap<IpAddr, &IPAddress> = addresses
            .iter()
            .filter_map(|a| a.ip().map(|ip| (ip, a)))
            .collect();
        let mut like: BTreeMap<String, &Service> = BTreeMap::new();
        for s in services {
            let pins = go_pins(s);
            if pins.is_empty() || placeholders.iter().any(|p| p.uid() == s.uid()) {
                continue;
            }
            let mine: Vec<&IPAddress> = pins
                .iter()
                .filter_map(|ip| by_ip.get(ip).copied())
                .collect();
            self.convert_pin(s, &pins, &mine, marker).await;
            for a in mine {
                like.insert(a.name_any(), s);
            }
        }
        like
    }

    /// Step 3 over the Go placeholders: those made ready to go once their address is held,
    /// with the address.
    async fn prepare_placeholders<'s>(
        &mut self,
        placeholders: &[&'s Service],
        addresses: &'s [IPAddress],
    ) -> Vec<(&'s Service, &'s IPAddress)> {
        let mut to_delete = Vec::new();
        for p in placeholders {
            let name = p
                .labels()
                .get(GO_ADDRESS_LABEL)
                .cloned()
                .unwrap_or_default();
            match addresses.iter().find(|a| a.name_any() == name) {
                Some(a) => {
                    if self.prepare_placeholder(p, a).await {
                        to_delete.push((*p, a));
                    }
                }
                None => self.rows.push(row(
                    format!("service/{}/{}", self.args.go_placeholder_namespace, p.name_any()),
                    format!("left: no IPAddress {name:?} of a class of {PROVISIONER} (delete it yourself once you know what it holds)"),
                    true,
                )),
            }
        }
        to_delete
    }

    fn verb(&self, act: &str, would: &str) -> String {
        if self.args.yes { act } else { would }.to_string()
    }

    async fn swap_finalizer(&mut self, a: &IPAddress) {
        let Some(finalizers) = swapped_finalizers(a.finalizers()) else {
            return;
        };
        let object = format!("ipaddress/{}", a.name_any());
        let action = self.verb("finalizer", "would swap finalizer");
        let what = format!("{action} {GO_FINALIZER} → {FINALIZER}");
        if !self.args.yes {
            self.rows.push(row(object, what, true));
            return;
        }
        let body = json!({"metadata": {"resourceVersion": a.resource_version(), "finalizers": finalizers}});
        let done = Api::<IPAddress>::all(self.client.clone())
            .patch(&a.name_any(), &PatchParams::default(), &Patch::Merge(body))
            .await;
        self.rows.push(match done {
            Ok(_) => row(object, what, true),
            Err(e) => row(object, format!("{what}: {e}"), false),
        });
    }

    async fn convert_pin(
        &mut self,
        s: &Service,
        pins: &[IpAddr],
        mine: &[&IPAddress],
        marker: &str,
    ) {
        let object = format!(
            "service/{}/{}",
            s.namespace().unwrap_or_default(),
            s.name_any()
        );
        if mine.is_empty() {
            self.rows.push(row(
                object,
                format!(
                    "left: its Go pin ({}) names no address of a class of {PROVISIONER}",
                    list(pins)
                ),
                true,
            ));
            return;
        }
        let mut ips: Vec<IpAddr> = pins.to_vec();
        sort_ipv4_first(&mut ips);
        // Invalid addresses (never trusted) last.
        let mut first: Vec<&IPAddress> = mine.to_vec();
        first.sort_by_key(|a| {
            a.ip()
                .map_or((true, None), |ip| (ipv4_first(ip).0, Some(ip)))
        });
        let key = first.first().map(|a| crate::metallb::sharing_key(a));
        let recorded: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| mine.iter().any(|a| a.ip() == Some(*ip)))
            .collect();
        let what = format!(
            "{} the Go pin of {} as this driver's (sharing key {})",
            self.verb("recorded", "would record"),
            list(&recorded),
            key.clone().unwrap_or_default()
        );
        if !self.args.yes {
            self.rows.push(row(object, what, true));
            return;
        }
        let body = json!({"metadata": {"resourceVersion": s.resource_version(), "annotations": {
            ALLOW_SHARED_IP: key, marker: render_marker(&recorded), GO_MARKER: null}}});
        let done =
            Api::<Service>::namespaced(self.client.clone(), &s.namespace().unwrap_or_default())
                .patch(&s.name_any(), &PatchParams::default(), &Patch::Merge(body))
                .await;
        self.rows.push(match done {
            Ok(_) => row(object, what, true),
            Err(e) => row(object, format!("{what}: {e}"), false),
        });
    }

    /// Gives a Go placeholder the claim's sharing key and another port; whether it is ready
    /// to go once the hold holds (or would be, in a dry run).
    async fn prepare_placeholder(&mut self, p: &Service, a: &IPAddress) -> bool {
        let ns = self.args.go_placeholder_namespace.clone();
        let object = format!("service/{ns}/{}", p.name_any());
        let key = crate::metallb::sharing_key(a);
        let moved = p
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .is_some_and(|ports| ports.len() == 1 && ports[0].port == MOVED_PLACEHOLDER_PORT);
        if p.annotations().get(ALLOW_SHARED_IP) == Some(&key) && moved {
            return true;
        }
        let what = format!(
            "{} sharing key {key} and port {MOVED_PLACEHOLDER_PORT} (shares {} with the hold)",
            self.verb("gave it", "would give it"),
            a.spec.address
        );
        if !self.args.yes {
            self.rows.push(row(object, what, true));
            return true;
        }
        let body = json!({"metadata": {"resourceVersion": p.resource_version(), "annotations": {ALLOW_SHARED_IP: key}},
            "spec": {"ports": [{"name": "placeholder", "port": MOVED_PLACEHOLDER_PORT, "protocol": "TCP"}]}});
        let done = Api::<Service>::namespaced(self.client.clone(), &ns)
            .patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(body))
            .await;
        match done {
            Ok(_) => {
                self.rows.push(row(object, what, true));
                true
            }
            Err(e) => {
                self.rows.push(row(object, format!("{what}: {e}"), false));
                false
            }
        }
    }

    async fn hold(&mut self, a: &IPAddress, like: Option<&Service>) {
        let name = crate::metallb::hold_name(&a.name_any());
        let object = format!("service/{}/{name}", self.args.metallb.hold_namespace);
        let api =
            Api::<Service>::namespaced(self.client.clone(), &self.args.metallb.hold_namespace);
        let exists = match api.get_opt(&name).await {
            Ok(h) => h.is_some(),
            Err(e) => {
                self.rows.push(row(object, format!("reading: {e}"), false));
                return;
            }
        };
        if !self.args.yes {
            if !exists {
                self.rows.push(row(
                    object,
                    format!("would hold {} in MetalLB's books", a.spec.address),
                    true,
                ));
            }
            return;
        }
        match self.driver.ensure_hold(self.client, a, like).await {
            Ok(()) if !exists => self.rows.push(row(
                object,
                format!("holds {} in MetalLB's books", a.spec.address),
                true,
            )),
            Ok(()) => {}
            Err(e) => self.rows.push(row(object, e, false)),
        }
    }

    /// Waits (`--wait` at most) until MetalLB shows every hold holding its address: the
    /// names of the addresses held.
    async fn wait_held(&mut self, addresses: &[IPAddress]) -> BTreeSet<String> {
        let api =
            Api::<Service>::namespaced(self.client.clone(), &self.args.metallb.hold_namespace);
        let deadline = tokio::time::Instant::now() + self.args.wait;
        loop {
            let mut held = BTreeSet::new();
            for a in addresses {
                let name = crate::metallb::hold_name(&a.name_any());
                if let Ok(Some(h)) = api.get_opt(&name).await
                    && a.ip().is_some_and(|ip| ingress(&h).contains(&ip))
                {
                    held.insert(a.name_any());
                }
            }
            if held.len() == addresses.len() || tokio::time::Instant::now() >= deadline {
                for a in addresses.iter().filter(|a| !held.contains(&a.name_any())) {
                    self.rows.push(row(
                        format!("service/{}/{}", self.args.metallb.hold_namespace, crate::metallb::hold_name(&a.name_any())),
                        format!("MetalLB did not show {} on the hold within {:?} (its events say why): what held it is left in place", a.spec.address, self.args.wait),
                        false,
                    ));
                }
                return held;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn delete_placeholder(&mut self, p: &Service, a: &IPAddress, held: &BTreeSet<String>) {
        let ns = self.args.go_placeholder_namespace.clone();
        let object = format!("service/{ns}/{}", p.name_any());
        if !self.args.yes {
            self.rows.push(row(
                object,
                format!("would delete once the hold shows {}", a.spec.address),
                true,
            ));
            return;
        }
        if !held.contains(&a.name_any()) {
            self.rows.push(row(
                object,
                format!("kept: the hold does not show {} yet", a.spec.address),
                false,
            ));
            return;
        }
        let uid = p.uid();
        let done = Api::<Service>::namespaced(self.client.clone(), &ns)
            .delete(
                &p.name_any(),
                &DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid,
                        resource_version: None,
                    }),
                    ..Default::default()
                },
            )
            .await;
        self.rows.push(match done {
            Ok(_) => row(
                object,
                format!("deleted (the hold holds {})", a.spec.address),
                true,
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => row(object, "already gone", true),
            Err(e) => row(object, format!("deleting: {e}"), false),
        });
    }
}

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_go_finalizer_is_swapped_for_ours_in_place_and_never_doubled() {
        let f = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(swapped_finalizers(&f(&["a", "b"])), None);
        assert_eq!(
            swapped_finalizers(&f(&[
                "local.sdn.cozystack.io/address-protection",
                GO_FINALIZER
            ])),
            Some(f(&["local.sdn.cozystack.io/address-protection", FINALIZER]))
        );
        assert_eq!(
            swapped_finalizers(&f(&[FINALIZER, GO_FINALIZER])),
            Some(f(&[FINALIZER]))
        );
    }

    #[test]
    fn the_go_marker_means_the_current_pins_are_the_drivers() {
        let svc = |ann: serde_json::Value| -> Service {
            serde_json::from_value(
                json!({"metadata": {"name": "s", "namespace": "t", "annotations": ann}}),
            )
            .unwrap()
        };
        let pinned =
            svc(json!({GO_MARKER: "true", LOAD_BALANCER_IPS: "198.51.100.0, 2001:db8::7"}));
        assert_eq!(
            go_pins(&pinned),
            [
                "198.51.100.0".parse::<IpAddr>().unwrap(),
                "2001:db8::7".parse().unwrap()
            ]
        );
        // No marker, or ours (a list): not the Go driver's pin.
        assert!(go_pins(&svc(json!({LOAD_BALANCER_IPS: "198.51.100.0"}))).is_empty());
        assert!(
            go_pins(&svc(
                json!({GO_MARKER: "198.51.100.0", LOAD_BALANCER_IPS: "198.51.100.0"})
            ))
            .is_empty()
        );
    }
}
