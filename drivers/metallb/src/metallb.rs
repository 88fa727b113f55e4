//! The MetalLB driver: a [`Driver`] whose classes are MetalLB pools and whose addresses
//! MetalLB itself holds — MetalLB stays the allocator of record.
//!
//! * **Classes.** `spec.parameters.addresses` — CIDRs and `a-b` ranges, as MetalLB's
//!   `IPAddressPool.spec.addresses` — and optionally `advertisement: L2 | BGP` (default L2).
//!   Per class one `IPAddressPool` (`autoAssign: false`, `avoidBuggyIPs: true`) and one
//!   `L2Advertisement` or `BGPAdvertisement`, named `ipaddressclass-<class>` in MetalLB's
//!   namespace and owned by the class (they go with it). The Go driver's `iad-<class>` pool
//!   and advertisement, when a class has them, are adopted in place instead.
//! * **Holds.** Every address of the driver's classes is held in MetalLB's books by a
//!   placeholder Service in the driver's namespace (`hold-<address>`: a LoadBalancer without
//!   selector, pinned to the address with `metallb.io/loadBalancerIPs`, on port 65535, owned by
//!   the IPAddress), so MetalLB refuses anyone else who pins it — also while it is `Released`
//!   under `Retain`. Its sharing key (`metallb.io/allow-shared-ip`) is the claim's
//!   (`ac-<claim uid>`): the claim's Service pins the address with the same key and shares it
//!   with the hold. **No gap**: the address is held by the hold at every instant; handing it
//!   to a Service adds a holder, withdrawing it removes one (removing the key from the
//!   Service makes MetalLB clear it there, because the hold's key differs — observed with the
//!   real controller). The hold goes, behind the driver's finalizer, once no Service shows
//!   the address.
//! * **Lost.** An address outside its class's current addresses is gone from the pool:
//!   `Missing`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use address_controller_api::family::{family_of_ip, parse_address};
use address_controller_api::service::SERVICE_PROXY_NAME_LABEL;
use address_controller_api::{Family, IPAddress, IPAddressClass};
use address_controller_driver_kit::driver::of_load_balancer_class;
use address_controller_driver_kit::holds::{
    HOLD_PROXY_NAME, MANAGED_BY, backend_source, hold_port, is_hold,
};
pub use address_controller_driver_kit::holds::{hold_name, sharing_key};
use address_controller_driver_kit::objects::{ensure, owner};
use address_controller_driver_kit::ranges::{self, Cidr, ParamError};
use address_controller_driver_kit::{
    AllocateError, Allocation, Capacity, ClassesInUse, Driver, Presence, Request, ingress,
};
use k8s_openapi::api::core::v1::Service;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

/// The provisioner name this driver answers to (the same as the Go driver's).
pub const PROVISIONER: &str = address_controller_api::names::driver::METALLB_PROVISIONER;
/// The finalizer behind which the driver lets go of MetalLB's hold.
pub const FINALIZER: &str = address_controller_api::names::metallb_driver::FINALIZER;

/// The finalizer that keeps a class's IPAddressPool while addresses of the class are left:
/// MetalLB's speaker refuses every new configuration while a Service shows an address of a
/// pool that is gone (its `SetConfig`, v0.16.1), so a class deleted before its retained
/// addresses would stop every announcement change of the cluster.
pub const POOL_FINALIZER: &str = address_controller_api::names::metallb_driver::POOL_FINALIZER;

/// MetalLB's annotations.
pub use address_controller_api::service::metallb::{ALLOW_SHARED_IP, LOAD_BALANCER_IPS};
/// Labels of the driver's own objects.
const MANAGER: &str = address_controller_api::names::metallb_driver::MANAGER;
const COMPONENT: &str = "app.kubernetes.io/component";
/// The class a pool or advertisement is made for.
const CLASS_LABEL: &str = "local.sdn.cozystack.io/class";
/// The IPAddress a hold holds.
const HOLDS: &str = address_controller_api::names::metallb_driver::HOLDS;
/// On a hold: the Service (`name@resourceVersion`) for which the driver last asked MetalLB
/// to try the hold again.
const RETRIED_FOR: &str = "metallb.drivers.local.sdn.cozystack.io/retried-for";

/// How a class's addresses are announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advertisement {
    L2,
    Bgp,
}

/// A class's parsed parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub blocks: Vec<Cidr>,
    pub advertisement: Advertisement,
}

pub struct MetalLb {
    /// Where MetalLB reads its pools and advertisements (its `--namespace`).
    pub metallb_namespace: String,
    /// Where the holds live (the driver's own namespace).
    pub hold_namespace: String,
    /// The `spec.loadBalancerClass` MetalLB serves (its `--lb-class`; `None`: none set).
    pub lb_class: Option<String>,
}

/// The MetalLB driver's own flags (the driver's and `takeover`'s: one spelling).
#[derive(clap::Args, Clone, Debug)]
pub struct MetalLbArgs {
    /// MetalLB's namespace (its `--namespace`): where the pools and advertisements go.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METALLB_DRIVER_METALLB_NAMESPACE",
        default_value = "metallb-system"
    )]
    pub metallb_namespace: String,
    /// Where the holds (placeholder Services) live: the driver's own namespace.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_METALLB_DRIVER_HOLD_NAMESPACE",
        default_value = "address-controller-system"
    )]
    pub hold_namespace: String,
    /// The `spec.loadBalancerClass` MetalLB serves (its `--lb-class`); default: Services
    /// without one.
    #[arg(long, env = "ADDRESS_CONTROLLER_METALLB_DRIVER_LB_CLASS")]
    pub lb_class: Option<String>,
}

impl MetalLbArgs {
    /// The driver these flags describe.
    pub fn driver(&self) -> MetalLb {
        MetalLb {
            metallb_namespace: self.metallb_namespace.clone(),
            hold_namespace: self.hold_namespace.clone(),
            lb_class: self.lb_class.clone(),
        }
    }
}

fn parse(parameters: Option<&Value>) -> Result<Params, String> {
    let blocks =
        ranges::parse_metallb_addresses(parameters).map_err(|e: ParamError| e.to_string())?;
    let advertisement = match parameters
        .and_then(|p| p.get("advertisement"))
        .map(|v| v.as_str())
    {
        None | Some(Some("L2")) => Advertisement::L2,
        Some(Some("BGP")) => Advertisement::Bgp,
        Some(other) => {
            return Err(format!(
                "spec.parameters.advertisement must be L2 or BGP, not {}",
                other.map_or("a non-string".to_string(), |s| format!("{s:?}"))
            ));
        }
    };
    Ok(Params {
        blocks,
        advertisement,
    })
}

/// The name of the pool and advertisement of a class.
pub fn pool_name(class: &str) -> String {
    format!("ipaddressclass-{class}")
}

/// The name the Go driver (metallb-iad) gave the pool and advertisement of a class: a
/// class that has one is served through it, adopted in place (see [`MetalLb::pool_of`]).
pub fn go_pool_name(class: &str) -> String {
    format!("iad-{class}")
}

fn annotations(s: &Service) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    s.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

fn metallb_api(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("metallb.io", "v1beta1", kind);
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

impl MetalLb {
    /// The name of `class`'s pool and advertisement, and the pool's `avoidBuggyIPs`: the Go
    /// driver's `iad-<class>` when it is there and owned by this very class (by uid) —
    /// adopted in place, keeping `avoidBuggyIPs` as it was (the Go pool handed out `.0`
    /// addresses; MetalLB would refuse them on their Services under `true`). A second pool
    /// beside it is no option: MetalLB refuses a pool overlapping another, and deleting
    /// the Go pool first would leave its pinned Services outside every pool. Otherwise
    /// `ipaddressclass-<class>` with `avoidBuggyIPs: true`.
    async fn pool_of(
        &self,
        client: &Client,
        class: &IPAddressClass,
    ) -> Result<(String, Option<bool>), String> {
        let go = go_pool_name(&class.name_any());
        let pools = metallb_api(client, &self.metallb_namespace, "IPAddressPool");
        match pools.get_opt(&go).await {
            Ok(Some(p))
                if class.meta().uid.is_some()
                    && p.owner_references()
                        .iter()
                        .any(|o| Some(&o.uid) == class.meta().uid.as_ref()) =>
            {
                let avoid = p.data["spec"]["avoidBuggyIPs"].as_bool();
                Ok((go, avoid))
            }
            Ok(_) => Ok((pool_name(&class.name_any()), Some(true))),
            Err(e) => Err(format!("reading IPAddressPool {go}: {e}")),
        }
    }

    fn holds(&self, client: &Client) -> Api<Service> {
        Api::namespaced(client.clone(), &self.hold_namespace)
    }

    /// The hold of `a` as it should be; `backend` is the Service whose backend key it must
    /// match ([`backend_source`]: MetalLB shares an address only between Services of one
    /// externalTrafficPolicy, and with `Local` of one selector). kube-proxy skips it (its
    /// service-proxy-name): a hold that copies a tenant's selector never opens its port on
    /// the tenant's pods.
    fn hold_body(&self, a: &IPAddress, ip: IpAddr, backend: Option<&Service>, port: i32) -> Value {
        let family = match family_of_ip(ip) {
            Family::IPv4 => "IPv4",
            Family::IPv6 => "IPv6",
        };
        let local = backend
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local");
        let mut spec = json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
            "ports": [{"name": "hold", "port": port, "protocol": "TCP"}],
            "ipFamilies": [family], "ipFamilyPolicy": "SingleStack",
            "externalTrafficPolicy": if local { "Local" } else { "Cluster" }});
        if local
            && let Some(sel) = backend
                .and_then(|s| s.spec.as_ref())
                .and_then(|s| s.selector.clone())
        {
            spec["selector"] = json!(sel);
        }
        if let Some(lb) = &self.lb_class {
            spec["loadBalancerClass"] = json!(lb);
        }
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": hold_name(&a.name_any()), "namespace": self.hold_namespace,
                "labels": {MANAGED_BY: MANAGER, COMPONENT: "hold",
                    SERVICE_PROXY_NAME_LABEL: HOLD_PROXY_NAME},
                "annotations": {LOAD_BALANCER_IPS: ip.to_string(), ALLOW_SHARED_IP: sharing_key(a),
                    HOLDS: a.name_any()},
                "ownerReferences": [owner(a)]},
            "spec": spec})
    }

    /// Creates the hold of `a`, or brings its pin, key and backend key up to date.
    pub(crate) async fn ensure_hold(
        &self,
        client: &Client,
        a: &IPAddress,
        like: Option<&Service>,
    ) -> Result<(), String> {
        let Some(ip) = a.ip() else { return Ok(()) };
        let api = self.holds(client);
        let name = hold_name(&a.name_any());
        let have = api.get_opt(&name).await.map_err(|e| e.to_string())?;
        let current = have
            .as_ref()
            .and_then(|h| h.spec.as_ref())
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .map(|p| p.port);
        let port = hold_port(a, like, current);
        let body = self.hold_body(a, ip, backend_source(a, ip, have.as_ref(), like), port);
        match have {
            None => {
                let svc: Service = serde_json::from_value(body).map_err(|e| e.to_string())?;
                match api.create(&PostParams::default(), &svc).await {
                    Ok(_) => {
                        tracing::info!(address = %a.name_any(), hold = %name, "held in MetalLB");
                        Ok(())
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(format!("creating the hold {name}: {e}")),
                }
            }
            Some(have) => {
                let want_ann = &body["metadata"]["annotations"];
                let ann = annotations(&have);
                let spec = have.spec.as_ref();
                let same = [LOAD_BALANCER_IPS, ALLOW_SHARED_IP]
                    .iter()
                    .all(|k| ann.get(*k).map(String::as_str) == want_ann[*k].as_str())
                    && spec.and_then(|s| s.external_traffic_policy.as_deref())
                        == body["spec"]["externalTrafficPolicy"].as_str()
                    && (body["spec"]["externalTrafficPolicy"] != "Local"
                        || spec.and_then(|s| s.selector.clone()).map(|s| json!(s))
                            == body["spec"].get("selector").cloned())
                    && current == Some(port)
                    && have
                        .labels()
                        .get(SERVICE_PROXY_NAME_LABEL)
                        .map(String::as_str)
                        == Some(HOLD_PROXY_NAME);
                // MetalLB refused the hold while the Service held the address under another
                // key (the Service MetalLB gave it to before it was claimed: an adoption, a
                // takeover); the Service has the claim's key now, but MetalLB retries a
                // refused Service only on its own "reprocess all", which a failed status
                // write of its own can swallow — observed with v0.16.1. A write on the hold
                // makes it try again (once per version of the Service).
                let retry = like
                    .filter(|t| {
                        !ingress(&have).contains(&ip)
                            && ingress(t).contains(&ip)
                            && annotations(t).get(ALLOW_SHARED_IP)
                                == want_ann[ALLOW_SHARED_IP]
                                    .as_str()
                                    .map(str::to_string)
                                    .as_ref()
                    })
                    .map(|t| {
                        format!(
                            "{}@{}",
                            t.name_any(),
                            t.resource_version().unwrap_or_default()
                        )
                    });
                let retry = retry.filter(|r| annotations(&have).get(RETRIED_FOR) != Some(r));
                if same && retry.is_none() {
                    return Ok(());
                }
                let mut want_ann = want_ann.clone();
                if let Some(r) = &retry {
                    want_ann[RETRIED_FOR] = json!(r);
                    tracing::info!(address = %a.name_any(), hold = %name, service = %r, "MetalLB refused the hold while the Service held the address under another key: asking again");
                }
                if current != Some(port) {
                    tracing::info!(address = %a.name_any(), hold = %name, from = ?current, to = port, "the hold moves off a port a Service of the address lists");
                }
                let patch = json!({"metadata": {"resourceVersion": have.metadata.resource_version,
                    "annotations": want_ann, "labels": body["metadata"]["labels"]},
                    "spec": {"externalTrafficPolicy": body["spec"]["externalTrafficPolicy"],
                        "selector": body["spec"].get("selector").cloned().unwrap_or(Value::Null),
                        "ports": body["spec"]["ports"]}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("updating the hold {name}: {e}"))
            }
        }
    }
}

impl Driver for MetalLb {
    type Params = Params;

    fn provisioner(&self) -> &str {
        PROVISIONER
    }

    /// Each class's addresses; one overlapping another class's is an error on both (MetalLB
    /// would refuse the whole configuration).
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<Params, String>> {
        let parsed: Vec<Result<Params, String>> = classes
            .iter()
            .map(|c| parse(c.spec.parameters.as_ref()))
            .collect();
        address_controller_driver_kit::driver::without_overlaps(classes, &parsed, |p| {
            p.blocks.as_slice()
        })
    }

    fn capacity(&self, p: &Params) -> Capacity {
        let (ipv4, ipv6) = ranges::capacity(&p.blocks);
        Capacity { ipv4, ipv6 }
    }

    fn describe(&self, p: &Params) -> String {
        let list: Vec<String> = p.blocks.iter().map(ToString::to_string).collect();
        format!(
            "a MetalLB pool with {} ({:?} advertisement)",
            list.join(", "),
            p.advertisement
        )
    }

    async fn allocate(&self, req: Request<'_, Params>) -> Result<Allocation, AllocateError> {
        let address = ranges::first_free(&req.params.blocks, req.family, req.in_use)
            .ok_or(AllocateError::Exhausted)?;
        Ok(Allocation {
            address,
            source: address_controller_api::AddressSource::from_class(),
            name: None,
        })
    }

    fn finalizer(&self) -> Option<&'static str> {
        Some(FINALIZER)
    }

    /// Lets go of MetalLB's hold (the kit calls it once no Service shows the address).
    async fn release(&self, client: &Client, address: &IPAddress) -> Result<(), String> {
        match self
            .holds(client)
            .delete(&hold_name(&address.name_any()), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!("deleting the hold: {e}")),
        }
    }

    async fn sync_class(
        &self,
        client: &Client,
        class: &IPAddressClass,
        p: &Params,
    ) -> Result<(), String> {
        let (name, avoid_buggy_ips) = self.pool_of(client, class).await?;
        let meta = json!({"name": name, "namespace": self.metallb_namespace,
            "labels": {MANAGED_BY: MANAGER, CLASS_LABEL: class.name_any()},
            "ownerReferences": [owner(class)]});
        let mut pool_meta = meta.clone();
        pool_meta["finalizers"] = json!([POOL_FINALIZER]);
        let mut spec = json!({"addresses": p.blocks.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "autoAssign": false});
        if let Some(avoid) = avoid_buggy_ips {
            spec["avoidBuggyIPs"] = json!(avoid);
        }
        let pool = json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": pool_meta,
            "spec": spec});
        ensure(
            &metallb_api(client, &self.metallb_namespace, "IPAddressPool"),
            &name,
            pool,
        )
        .await?;
        let (kind, other) = match p.advertisement {
            Advertisement::L2 => ("L2Advertisement", "BGPAdvertisement"),
            Advertisement::Bgp => ("BGPAdvertisement", "L2Advertisement"),
        };
        let adv = json!({"apiVersion": "metallb.io/v1beta1", "kind": kind, "metadata": meta,
            "spec": {"ipAddressPools": [name]}});
        ensure(
            &metallb_api(client, &self.metallb_namespace, kind),
            &name,
            adv,
        )
        .await?;
        // The other kind of advertisement, when the class switched.
        match metallb_api(client, &self.metallb_namespace, other)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(e) => Err(format!("deleting the {other}: {e}")),
        }
    }

    /// Removes [`POOL_FINALIZER`] from the pools whose class (by its uid) is gone and whose
    /// class name no address names any more: every hold of theirs is gone then (an address's
    /// hold goes before its finalizer), and no tenant's Service shows their addresses (the
    /// kit unpins first). The garbage collector deletes them then (or already did, and they
    /// go). Whether the collector has marked one yet does not matter: the finalizer goes
    /// first either way.
    async fn release_classes(
        &self,
        client: &Client,
        in_use: &ClassesInUse,
    ) -> Result<Vec<String>, String> {
        let api = metallb_api(client, &self.metallb_namespace, "IPAddressPool");
        address_controller_driver_kit::objects::release_pools(
            &api,
            &format!("{MANAGED_BY}={MANAGER}"),
            CLASS_LABEL,
            POOL_FINALIZER,
            in_use,
        )
        .await
    }

    async fn sync_address(
        &self,
        client: &Client,
        a: &IPAddress,
        _p: &Params,
    ) -> Result<(), String> {
        self.ensure_hold(client, a, None).await
    }

    fn serves(&self, service: &Service) -> bool {
        !self.internal(service) && of_load_balancer_class(service, self.lb_class.as_ref())
    }

    fn internal(&self, service: &Service) -> bool {
        is_hold(service, &self.hold_namespace, MANAGER)
    }

    /// Pins `want` on the tenant Service with MetalLB's annotations (IPv4 first) and the
    /// claim's sharing key, the holds made to match its backend key first; withdraws by
    /// removing both — only when what the Service names is the kit's own.
    async fn pin(
        &self,
        client: &Client,
        service: &Service,
        ours: &[IpAddr],
        want: &[Arc<IPAddress>],
    ) -> Result<(), String> {
        let ann = annotations(service);
        let pinned: Vec<IpAddr> = ann
            .get(LOAD_BALANCER_IPS)
            .map(|v| {
                v.split(',')
                    .filter_map(|s| parse_address(s.trim()).ok())
                    .collect()
            })
            .unwrap_or_default();
        let mut ips: Vec<IpAddr> = want.iter().filter_map(|a| a.ip()).collect();
        address_controller_api::family::sort_ipv4_first(&mut ips);
        let (lb_ips, key): (Option<String>, Option<String>) = if ips.is_empty() {
            // Withdraw only what the kit pinned.
            if pinned.is_empty() || !pinned.iter().all(|ip| ours.contains(ip)) {
                return Ok(());
            }
            (None, None)
        } else {
            for a in want {
                self.ensure_hold(client, a, Some(service)).await?;
            }
            (
                Some(
                    ips.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                want.first().map(|a| sharing_key(a)),
            )
        };
        if ann.get(LOAD_BALANCER_IPS) == lb_ips.as_ref() && ann.get(ALLOW_SHARED_IP) == key.as_ref()
        {
            return Ok(());
        }
        let body = json!({"metadata": {"resourceVersion": service.metadata.resource_version,
            "annotations": {LOAD_BALANCER_IPS: lb_ips, ALLOW_SHARED_IP: key}}});
        Api::<Service>::namespaced(client.clone(), &service.namespace().unwrap_or_default())
            .patch(
                &service.name_any(),
                &PatchParams::default(),
                &Patch::Merge(body),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("pinning through MetalLB's annotations: {e}"))
    }

    /// MetalLB says why it did not assign a Service in an event (`AllocationFailed`), never
    /// in the Service: its latest such event's words.
    async fn refusal(&self, client: &Client, service: &Service) -> Option<String> {
        let uid = service.uid()?;
        let ns = service.namespace().unwrap_or_default();
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
        let lp = ListParams::default()
            .fields(&format!("involvedObject.uid={uid},reason=AllocationFailed"));
        let list = events.list(&lp).await.ok()?;
        list.items
            .into_iter()
            .max_by_key(|e| {
                e.last_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .or(e.event_time.as_ref().map(|t| t.0))
            })
            .and_then(|e| e.message)
    }

    /// In the class's current addresses (its rendered pool), or gone from it.
    /// MetalLB assigns a pinned address only from a pool: an admin's static address of the
    /// class outside its `addresses` would be refused ("is not allowed in config") while the
    /// ledger said it held.
    fn servable(&self, p: &Params, address: &IPAddress) -> Result<(), String> {
        match address.ip() {
            Some(ip) if !p.blocks.iter().any(|b| b.contains(ip)) => {
                let list: Vec<String> = p.blocks.iter().map(ToString::to_string).collect();
                Err(format!(
                    "{ip} is outside the class's MetalLB pool ({}): MetalLB cannot put it on a Service",
                    list.join(", ")
                ))
            }
            _ => Ok(()),
        }
    }

    fn presence(&self, p: &Params, address: &IPAddress) -> Presence {
        Presence::within_blocks(&p.blocks, "the class's MetalLB pool", address)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use address_controller_driver_kit::holds::HOLD_PORT;

    fn class(name: &str, params: Value) -> Arc<IPAddressClass> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name},
                "spec": {"provisioner": PROVISIONER, "parameters": params}}))
            .unwrap(),
        )
    }

    fn driver() -> MetalLb {
        MetalLb {
            metallb_namespace: "metallb-system".into(),
            hold_namespace: "ac".into(),
            lb_class: None,
        }
    }

    #[test]
    fn parameters_are_metallbs_addresses_and_overlaps_are_refused() {
        let d = driver();
        let classes = [
            class(
                "a",
                json!({"addresses": ["192.0.2.0/28", "2001:db8::/124"]}),
            ),
            class("b", json!({"addresses": ["192.0.2.8-192.0.2.9"]})),
            class(
                "c",
                json!({"addresses": ["198.51.100.10-198.51.100.19"], "advertisement": "BGP"}),
            ),
            class(
                "d",
                json!({"addresses": ["198.18.0.0/30"], "advertisement": "OSPF"}),
            ),
            class("e", json!({"cidrs": ["198.18.1.0/30"]})),
        ];
        let p = d.parameters(&classes);
        assert!(
            p[0].as_ref().unwrap_err().contains("of class b"),
            "{:?}",
            p[0]
        );
        assert!(
            p[1].as_ref().unwrap_err().contains("of class a"),
            "{:?}",
            p[1]
        );
        let c = p[2].as_ref().unwrap();
        assert_eq!(c.advertisement, Advertisement::Bgp);
        assert_eq!(d.capacity(c), Capacity { ipv4: 10, ipv6: 0 });
        assert!(p[3].as_ref().unwrap_err().contains("L2 or BGP"));
        assert!(
            p[4].as_ref()
                .unwrap_err()
                .contains("spec.parameters.addresses is missing")
        );
    }

    #[test]
    fn holds_are_named_keyed_by_the_claim_and_refuse_the_tenants_port() {
        let a: IPAddress =
            serde_json::from_value(json!({"metadata": {"name": "ipv4-192-0-2-1", "uid": "au"},
            "spec": {"address": "192.0.2.1", "className": "a", "source": {"fromClass": {}},
                "claimRef": {"namespace": "t", "name": "c", "uid": "cu"}}}))
            .unwrap();
        let d = driver();
        let body = d.hold_body(&a, "192.0.2.1".parse().unwrap(), None, HOLD_PORT);
        assert_eq!(
            body["metadata"]["annotations"][LOAD_BALANCER_IPS],
            "192.0.2.1"
        );
        assert_eq!(body["metadata"]["annotations"][ALLOW_SHARED_IP], "ac-cu");
        assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "IPAddress");
        assert_eq!(body["spec"]["externalTrafficPolicy"], "Cluster");
        let hold: Service = serde_json::from_value(body).unwrap();
        assert!(d.internal(&hold) && !d.serves(&hold));
        // A Local tenant: the hold matches its backend key.
        let tenant: Service = serde_json::from_value(json!({"metadata": {"name": "t", "namespace": "t"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": {"app": "web"}}}))
        .unwrap();
        let body = d.hold_body(&a, "192.0.2.1".parse().unwrap(), Some(&tenant), HOLD_PORT);
        assert_eq!(body["spec"]["externalTrafficPolicy"], "Local");
        assert_eq!(body["spec"]["selector"], json!({"app": "web"}));
        assert!(d.serves(&tenant));
    }

    #[test]
    fn a_hold_is_never_served_by_a_proxy() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let a: IPAddress = serde_json::from_value(json!({"metadata": {"name": "ipv4-192-0-2-1"},
            "spec": {"address": "192.0.2.1", "className": "a", "source": {"fromClass": {}}}}))
        .unwrap();
        let vm: Service = serde_json::from_value(json!({"metadata": {"name": "vm", "namespace": "t"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": {"app": "vm"}}}))
        .unwrap();
        let body = driver().hold_body(&a, ip, Some(&vm), HOLD_PORT);
        assert_eq!(
            body["metadata"]["labels"][SERVICE_PROXY_NAME_LABEL],
            HOLD_PROXY_NAME
        );
        assert_eq!(body["spec"]["selector"], json!({"app": "vm"}));
    }
}
