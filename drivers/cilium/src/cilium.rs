//! The Cilium LB-IPAM driver: a [`Driver`] whose classes are `CiliumLoadBalancerIPPool`s and
//! whose addresses the cilium-operator itself holds — LB-IPAM stays the allocator of record.
//!
//! * **Classes.** `spec.parameters.addresses` — CIDRs and `a-b` ranges, the MetalLB driver's
//!   parameters, so a class moves between the two by its provisioner alone. Per class one
//!   cluster-scoped `CiliumLoadBalancerIPPool` `ipaddressclass-<class>` (`allowFirstLastIPs:
//!   Yes`: the class's allocator decides which addresses are handed out), owned by the class
//!   and kept by a finalizer while addresses of the class are left. Its `serviceSelector`
//!   matches only the label [`POOL_LABEL`]` = <pool>`, which only this driver writes (the
//!   fence): LB-IPAM never hands an address of the pool to a Service the driver did not pin.
//! * **Holds.** Every address of the driver's classes is held in LB-IPAM's books by a
//!   placeholder Service in the driver's namespace (`hold-<address>`, the kit's
//!   [`holds`](address_controller_driver_kit::holds): a LoadBalancer without selector, asking
//!   for the address with `lbipam.cilium.io/ips`, owned by the IPAddress), so LB-IPAM refuses
//!   anyone else who asks for it — also while it is reserved, or `Released` under `Retain`.
//!   Its sharing key (`lbipam.cilium.io/sharing-key`) is the claim's (`ac-<claim uid>`); it
//!   shares across namespaces with any Service of that key (`sharing-cross-namespace: *`),
//!   and the claim's Service, pinned with the same key, names the hold's namespace: LB-IPAM
//!   shares only where both sides name each other. **No gap**: the hold has the address at
//!   every instant; handing it to a Service adds a holder, withdrawing it removes one.
//! * **Answers.** `AddressAttached` turns true once LB-IPAM shows the address in the
//!   Service's ingress; while it does not, its `cilium.io/IPAMRequestSatisfied` reason and
//!   message are the Service's.
//! * **Lost.** An address outside its class's current addresses is gone from the pool:
//!   `Missing`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use address_controller_api::family::{family_of_ip, parse_address, sort_ipv4_first};
use address_controller_api::service::SERVICE_PROXY_NAME_LABEL;
use address_controller_api::service::cilium::{
    IPS, REQUEST_SATISFIED, SHARING_CROSS_NAMESPACE, SHARING_KEY,
};
use address_controller_api::{Family, IPAddress, IPAddressClass};
use address_controller_driver_kit::driver::of_load_balancer_class;
use address_controller_driver_kit::holds::{
    backend_source, hold_name, hold_port, is_hold, sharing_key,
};
use address_controller_driver_kit::objects::{ensure, owner, release_pools};
use address_controller_driver_kit::ranges::{self, Cidr};
use address_controller_driver_kit::{
    AllocateError, Allocation, Capacity, ClassesInUse, Driver, Presence, Request,
};
use k8s_openapi::api::core::v1::Service;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// The provisioner name this driver answers to.
pub const PROVISIONER: &str = address_controller_api::names::driver::CILIUM_PROVISIONER;
/// The finalizer behind which the driver lets go of LB-IPAM's hold.
pub const FINALIZER: &str = "cilium.drivers.local.sdn.cozystack.io/hold";
/// The finalizer that keeps a class's pool while addresses of the class are left: LB-IPAM
/// takes every address of a pool that is gone off the Services that show it.
pub const POOL_FINALIZER: &str = "cilium.drivers.local.sdn.cozystack.io/pool";
/// The label a pool's `serviceSelector` matches: on the driver's holds and on the Services
/// it pins, naming the pool. Only the driver writes it (the fence).
pub const POOL_LABEL: &str = "cilium.drivers.local.sdn.cozystack.io/pool";
/// Labels of the driver's own objects.
pub(crate) use address_controller_driver_kit::holds::MANAGED_BY;
pub(crate) const MANAGER: &str = "address-controller-cilium-driver";
const COMPONENT: &str = "app.kubernetes.io/component";
/// The class a pool is made for.
const CLASS_LABEL: &str = "local.sdn.cozystack.io/class";
/// The IPAddress a hold holds.
pub(crate) const HOLDS: &str = "cilium.drivers.local.sdn.cozystack.io/address";

/// A class's parsed parameters: its blocks.
pub type Params = Vec<Cidr>;

pub struct Cilium {
    /// The provisioner it answers to: its own, or the MetalLB driver's after a takeover
    /// (the classes, their claims and addresses name it, and it cannot change).
    pub provisioner: String,
    /// Where the holds live (the driver's own namespace).
    pub hold_namespace: String,
    /// The `spec.loadBalancerClass` LB-IPAM serves for the driver (`None`: Services without
    /// one, where LB-IPAM is the cluster's default).
    pub lb_class: Option<String>,
}

/// The Cilium driver's own flags.
#[derive(clap::Args, Clone, Debug)]
pub struct CiliumArgs {
    /// The provisioner it answers to: `cilium.drivers.local.sdn.cozystack.io`, or the MetalLB
    /// driver's (`metallb.drivers.local.sdn.cozystack.io`) once `takeover --from metallb` has
    /// moved that driver's classes into LB-IPAM — the classes keep their provisioner.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_CILIUM_DRIVER_PROVISIONER",
        default_value = PROVISIONER
    )]
    pub provisioner: String,
    /// Where the holds (placeholder Services) live: the driver's own namespace.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_CILIUM_DRIVER_HOLD_NAMESPACE",
        default_value = "address-controller-system"
    )]
    pub hold_namespace: String,
    /// The `spec.loadBalancerClass` of the Services the driver serves (`io.cilium/l2-announcer`,
    /// `io.cilium/bgp-control-plane`); default: Services without one.
    #[arg(long, env = "ADDRESS_CONTROLLER_CILIUM_DRIVER_LB_CLASS")]
    pub lb_class: Option<String>,
}

impl CiliumArgs {
    /// The driver these flags describe.
    pub fn driver(&self) -> Cilium {
        Cilium {
            provisioner: self.provisioner.clone(),
            hold_namespace: self.hold_namespace.clone(),
            lb_class: self.lb_class.clone(),
        }
    }
}

/// The name of a class's pool.
pub fn pool_name(class: &str) -> String {
    format!("ipaddressclass-{class}")
}

pub(crate) fn pools(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumLoadBalancerIPPool");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

fn annotations(s: &Service) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    s.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

/// The pool of a class as it should be.
pub fn pool_body(class: &IPAddressClass, blocks: &[Cidr]) -> Value {
    let name = pool_name(&class.name_any());
    let blocks: Vec<Value> = blocks
        .iter()
        .map(|b| match b.range {
            Some(last) => json!({"start": b.network.to_string(), "stop": last.to_string()}),
            None => json!({"cidr": b.to_string()}),
        })
        .collect();
    json!({"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
        "metadata": {"name": name, "labels": {MANAGED_BY: MANAGER, CLASS_LABEL: class.name_any()},
            "ownerReferences": [owner(class)], "finalizers": [POOL_FINALIZER]},
        "spec": {"blocks": blocks, "allowFirstLastIPs": "Yes", "disabled": false,
            "serviceSelector": {"matchLabels": {POOL_LABEL: name}}}})
}

/// What LB-IPAM said about a Service it did not satisfy: its
/// `cilium.io/IPAMRequestSatisfied` condition when `False`, as `reason: message`.
pub fn lbipam_refusal(service: &Service) -> Option<String> {
    service
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == REQUEST_SATISFIED && c.status == "False")
        .map(|c| format!("LB-IPAM {}: {}", c.reason, c.message))
}

/// Why LB-IPAM never answers `service`: it names a service proxy
/// (`service.kubernetes.io/service-proxy-name`), and the cilium-operator watches only
/// Services without one.
pub fn unseen(service: &Service) -> Option<String> {
    service.labels().get(SERVICE_PROXY_NAME_LABEL).map(|proxy| {
        format!(
            "LB-IPAM does not see Services labelled {SERVICE_PROXY_NAME_LABEL}={proxy} (the cilium-operator watches only Services without a proxy name); a whole-address VM Service of cozy-proxy needs the MetalLB or the range driver"
        )
    })
}

impl Cilium {
    fn holds(&self, client: &Client) -> Api<Service> {
        Api::namespaced(client.clone(), &self.hold_namespace)
    }

    /// The hold of `a` as it should be; `backend` is the Service whose backend key it must
    /// match (the kit's [`backend_source`]). Unlike the MetalLB driver's, it carries no
    /// `service.kubernetes.io/service-proxy-name`: the cilium-operator watches only Services
    /// without one (its `--k8s-service-proxy-name`, empty by default), so a hold with it
    /// would hold nothing — observed with v1.19.5.
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
                    POOL_LABEL: pool_name(&a.spec.class_name)},
                "annotations": {IPS: ip.to_string(), SHARING_KEY: sharing_key(a),
                    SHARING_CROSS_NAMESPACE: "*", HOLDS: a.name_any()},
                "ownerReferences": [owner(a)]},
            "spec": spec})
    }

    /// Creates the hold of `a`, or brings its pin, key, pool and backend key up to date.
    async fn ensure_hold(
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
        let Some(have) = have else {
            let svc: Service = serde_json::from_value(body).map_err(|e| e.to_string())?;
            return match api.create(&PostParams::default(), &svc).await {
                Ok(_) => {
                    tracing::info!(address = %a.name_any(), hold = %name, "held in LB-IPAM");
                    Ok(())
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(format!("creating the hold {name}: {e}")),
            };
        };
        let want_ann = &body["metadata"]["annotations"];
        let want_labels = &body["metadata"]["labels"];
        let ann = annotations(&have);
        let spec = have.spec.as_ref();
        let same = [IPS, SHARING_KEY, SHARING_CROSS_NAMESPACE]
            .iter()
            .all(|k| ann.get(*k).map(String::as_str) == want_ann[*k].as_str())
            && [POOL_LABEL, SERVICE_PROXY_NAME_LABEL]
                .iter()
                .all(|k| have.labels().get(*k).map(String::as_str) == want_labels[*k].as_str())
            && spec.and_then(|s| s.external_traffic_policy.as_deref())
                == body["spec"]["externalTrafficPolicy"].as_str()
            && (body["spec"]["externalTrafficPolicy"] != "Local"
                || spec.and_then(|s| s.selector.clone()).map(|s| json!(s))
                    == body["spec"].get("selector").cloned())
            && current == Some(port);
        if same {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": have.metadata.resource_version,
            "annotations": want_ann, "labels": want_labels},
            "spec": {"externalTrafficPolicy": body["spec"]["externalTrafficPolicy"],
                "selector": body["spec"].get("selector").cloned().unwrap_or(Value::Null),
                "ports": body["spec"]["ports"]}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| format!("updating the hold {name}: {e}"))
    }

    /// The annotations and pool label that pin `want` on a tenant Service (`None` each:
    /// withdrawn).
    fn pin_keys(&self, want: &[Arc<IPAddress>]) -> (Value, Value) {
        let mut ips: Vec<IpAddr> = want.iter().filter_map(|a| a.ip()).collect();
        sort_ipv4_first(&mut ips);
        match want.first() {
            Some(first) if !ips.is_empty() => (
                json!({IPS: ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                    SHARING_KEY: sharing_key(first),
                    SHARING_CROSS_NAMESPACE: "*"}),
                json!({POOL_LABEL: pool_name(&first.spec.class_name)}),
            ),
            _ => (
                json!({IPS: null, SHARING_KEY: null, SHARING_CROSS_NAMESPACE: null}),
                json!({POOL_LABEL: null}),
            ),
        }
    }
}

/// Whether `service` already carries exactly `ann` and `labels` (a `null`: absent).
fn carries(service: &Service, ann: &Value, labels: &Value) -> bool {
    let has = |map: &BTreeMap<String, String>, want: &Value| {
        want.as_object().is_some_and(|w| {
            w.iter()
                .all(|(k, v)| map.get(k).map(String::as_str) == v.as_str())
        })
    };
    has(annotations(service), ann) && has(service.labels(), labels)
}

impl Driver for Cilium {
    type Params = Params;

    fn provisioner(&self) -> &str {
        &self.provisioner
    }

    /// Each class's addresses; one overlapping another class's is an error on both (LB-IPAM
    /// would mark the later pool conflicting and serve nothing from it).
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<Params, String>> {
        let parsed: Vec<Result<Params, String>> = classes
            .iter()
            .map(|c| {
                ranges::parse_metallb_addresses(c.spec.parameters.as_ref())
                    .map_err(|e| e.to_string())
            })
            .collect();
        address_controller_driver_kit::driver::without_overlaps(classes, &parsed, |b| b.as_slice())
    }

    fn capacity(&self, p: &Params) -> Capacity {
        let (ipv4, ipv6) = ranges::capacity(p);
        Capacity { ipv4, ipv6 }
    }

    fn describe(&self, p: &Params) -> String {
        let list: Vec<String> = p.iter().map(ToString::to_string).collect();
        format!("a Cilium LB-IPAM pool with {}", list.join(", "))
    }

    async fn allocate(&self, req: Request<'_, Params>) -> Result<Allocation, AllocateError> {
        let address = ranges::first_free(req.params, req.family, req.in_use)
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

    /// Lets go of LB-IPAM's hold (the kit calls it once no Service shows the address).
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
        let name = pool_name(&class.name_any());
        ensure(&pools(client), &name, pool_body(class, p)).await
    }

    /// Removes [`POOL_FINALIZER`] from the pools whose class is gone and no address names
    /// any more (the kit's rule, as for the MetalLB driver's pools).
    async fn release_classes(
        &self,
        client: &Client,
        in_use: &ClassesInUse,
    ) -> Result<Vec<String>, String> {
        release_pools(
            &pools(client),
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

    /// Pins `want` on the tenant Service with LB-IPAM's annotations (IPv4 first), the
    /// claim's sharing key, the holds' namespace to share with, and the pool's label — the
    /// holds made to match its backend key first; withdraws by removing all four, only when
    /// what the Service asks for is the kit's own.
    async fn pin(
        &self,
        client: &Client,
        service: &Service,
        ours: &[IpAddr],
        want: &[Arc<IPAddress>],
    ) -> Result<(), String> {
        let pinned: Vec<IpAddr> = annotations(service)
            .get(IPS)
            .map(|v| {
                v.split(',')
                    .filter_map(|s| parse_address(s.trim()).ok())
                    .collect()
            })
            .unwrap_or_default();
        if want.iter().all(|a| a.ip().is_none())
            && (pinned.is_empty() || !pinned.iter().all(|ip| ours.contains(ip)))
        {
            // Withdraw only what the kit pinned.
            return Ok(());
        }
        for a in want {
            self.ensure_hold(client, a, Some(service)).await?;
        }
        let (ann, labels) = self.pin_keys(want);
        if carries(service, &ann, &labels) {
            return Ok(());
        }
        let body = json!({"metadata": {"resourceVersion": service.metadata.resource_version,
            "annotations": ann, "labels": labels}});
        Api::<Service>::namespaced(client.clone(), &service.namespace().unwrap_or_default())
            .patch(
                &service.name_any(),
                &PatchParams::default(),
                &Patch::Merge(body),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("pinning through LB-IPAM's annotations: {e}"))
    }

    /// LB-IPAM says why it did not satisfy a Service in the Service's own condition; a
    /// Service it does not see at all (one naming a service proxy, cozy-proxy's VM Services
    /// among them) never gets one, and is told so.
    async fn refusal(&self, _client: &Client, service: &Service) -> Option<String> {
        lbipam_refusal(service).or_else(|| unseen(service))
    }

    /// In the class's current addresses (its pool), or gone from it: LB-IPAM gives a
    /// Service only an address of a pool that selects it.
    fn servable(&self, p: &Params, address: &IPAddress) -> Result<(), String> {
        match address.ip() {
            Some(ip) if !p.iter().any(|b| b.contains(ip)) => {
                let list: Vec<String> = p.iter().map(ToString::to_string).collect();
                Err(format!(
                    "{ip} is outside the class's LB-IPAM pool ({}): LB-IPAM cannot put it on a Service",
                    list.join(", ")
                ))
            }
            _ => Ok(()),
        }
    }

    fn presence(&self, p: &Params, address: &IPAddress) -> Presence {
        Presence::within_blocks(p, "the class's LB-IPAM pool", address)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn class(name: &str, params: Value) -> Arc<IPAddressClass> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": name, "uid": format!("{name}-uid")},
                "spec": {"provisioner": PROVISIONER, "parameters": params}}),
            )
            .unwrap(),
        )
    }

    fn driver() -> Cilium {
        Cilium {
            provisioner: PROVISIONER.into(),
            hold_namespace: "ac".into(),
            lb_class: None,
        }
    }

    fn address() -> IPAddress {
        serde_json::from_value(json!({"metadata": {"name": "ipv4-192-0-2-0", "uid": "au"},
            "spec": {"address": "192.0.2.0", "className": "a", "source": {"fromClass": {}},
                "claimRef": {"namespace": "t", "name": "c", "uid": "cu"}}}))
        .unwrap()
    }

    #[test]
    fn parameters_are_the_metallb_drivers_and_overlaps_are_refused() {
        let d = driver();
        let classes = [
            class("a", json!({"addresses": ["192.0.2.0/28"]})),
            class("b", json!({"addresses": ["192.0.2.8-192.0.2.9"]})),
            class("c", json!({"addresses": ["198.51.100.10-198.51.100.19"]})),
            class("d", json!({"cidrs": ["198.18.1.0/30"]})),
        ];
        let p = d.parameters(&classes);
        assert!(p[0].as_ref().unwrap_err().contains("of class b"), "{p:?}");
        assert!(p[1].as_ref().unwrap_err().contains("of class a"), "{p:?}");
        assert_eq!(d.capacity(p[2].as_ref().unwrap()).ipv4, 10);
        assert!(p[3].as_ref().unwrap_err().contains("addresses is missing"));
    }

    #[test]
    fn the_pool_serves_only_services_carrying_its_label_and_every_address_of_its_blocks() {
        let c = class("web", json!({}));
        let blocks = ranges::parse_metallb_addresses(Some(
            &json!({"addresses": ["192.0.2.0/31", "192.0.2.4-192.0.2.5"]}),
        ))
        .unwrap();
        let pool = pool_body(&c, &blocks);
        assert_eq!(pool["metadata"]["name"], "ipaddressclass-web");
        assert_eq!(
            pool["spec"]["serviceSelector"],
            json!({"matchLabels": {POOL_LABEL: "ipaddressclass-web"}})
        );
        assert_eq!(pool["spec"]["allowFirstLastIPs"], "Yes");
        assert_eq!(
            pool["spec"]["blocks"],
            json!([{"cidr": "192.0.2.0/31"}, {"start": "192.0.2.4", "stop": "192.0.2.5"}])
        );
        assert_eq!(pool["metadata"]["ownerReferences"][0]["uid"], "web-uid");
        assert_eq!(pool["metadata"]["finalizers"], json!([POOL_FINALIZER]));
    }

    #[test]
    fn a_hold_asks_for_its_address_in_its_pool_under_the_claims_key() {
        let d = driver();
        let a = address();
        let body = d.hold_body(&a, "192.0.2.0".parse().unwrap(), None, 65534);
        let ann = &body["metadata"]["annotations"];
        assert_eq!(ann[IPS], "192.0.2.0");
        assert_eq!(ann[SHARING_KEY], "ac-cu");
        assert_eq!(ann[SHARING_CROSS_NAMESPACE], "*");
        assert_eq!(body["metadata"]["labels"][POOL_LABEL], "ipaddressclass-a");
        assert!(
            body["metadata"]["labels"]
                .get(SERVICE_PROXY_NAME_LABEL)
                .is_none(),
            "the operator never sees a Service with a proxy name"
        );
        let hold: Service = serde_json::from_value(body).unwrap();
        assert!(d.internal(&hold) && !d.serves(&hold));
    }

    #[test]
    fn a_pin_opens_the_namespace_switch_and_a_withdrawal_removes_every_key() {
        let d = driver();
        let a = Arc::new(address());
        let (ann, labels) = d.pin_keys(std::slice::from_ref(&a));
        assert_eq!(
            ann,
            json!({IPS: "192.0.2.0", SHARING_KEY: "ac-cu", SHARING_CROSS_NAMESPACE: "*"})
        );
        assert_eq!(labels, json!({POOL_LABEL: "ipaddressclass-a"}));
        let mut svc: Service =
            serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "t",
            "annotations": {IPS: "192.0.2.0", SHARING_KEY: "ac-cu", SHARING_CROSS_NAMESPACE: "*"},
            "labels": {POOL_LABEL: "ipaddressclass-a"}}}))
            .unwrap();
        assert!(carries(&svc, &ann, &labels));
        let (gone_ann, gone_labels) = d.pin_keys(&[]);
        assert!(!carries(&svc, &gone_ann, &gone_labels));
        svc.metadata.annotations = None;
        svc.metadata.labels = None;
        assert!(carries(&svc, &gone_ann, &gone_labels));
        assert!(!carries(&svc, &ann, &labels));
    }

    #[test]
    fn lbipams_refusal_is_read_from_its_condition() {
        let svc: Service = serde_json::from_value(json!({"metadata": {"name": "s"},
            "status": {"conditions": [{"type": REQUEST_SATISFIED, "status": "False",
                "reason": "already_allocated_incompatible_service",
                "message": "IP 192.0.2.1 already allocated", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
        .unwrap();
        assert_eq!(
            lbipam_refusal(&svc).as_deref(),
            Some("LB-IPAM already_allocated_incompatible_service: IP 192.0.2.1 already allocated")
        );
        let ok: Service = serde_json::from_value(json!({"metadata": {"name": "s"},
            "status": {"conditions": [{"type": REQUEST_SATISFIED, "status": "True",
                "reason": "satisfied", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
        .unwrap();
        assert_eq!(lbipam_refusal(&ok), None);
        let vm: Service = serde_json::from_value(json!({"metadata": {"name": "vm",
            "labels": {SERVICE_PROXY_NAME_LABEL: "cozy-proxy"}}}))
        .unwrap();
        assert!(unseen(&vm).is_some_and(|m| m.contains("cozy-proxy")));
        assert_eq!(unseen(&ok), None);
    }
}
