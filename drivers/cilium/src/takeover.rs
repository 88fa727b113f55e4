//! `cilium-driver takeover --from metallb`: moving the MetalLB driver's classes into Cilium
//! LB-IPAM without renumbering and without a moment in which a Service shows no address.
//! Run with the MetalLB driver stopped and MetalLB's controller still running; a dry run
//! unless `--yes`; a second run finds nothing to do; `--undo` moves everything back.
//!
//! The classes keep their provisioner (`metallb.drivers.local.sdn.cozystack.io`: it is
//! immutable, and every claim and address of them names it); the Cilium driver then runs with
//! `--provisioner metallb.drivers.local.sdn.cozystack.io` in the MetalLB driver's place. What
//! the takeover does, in this order (docs/operations.md, "From MetalLB to Cilium LB-IPAM"):
//! 1. each class gets its `CiliumLoadBalancerIPPool` (the driver's own, as it would make it);
//! 2. each hold and each Service the MetalLB driver pinned asks LB-IPAM for the same address
//!    under the same key (`lbipam.cilium.io/ips`, `sharing-key`, the pool label); LB-IPAM
//!    *imports* the address already in the ingress — the Service's status never changes
//!    (measured with v1.19.5 beside MetalLB v0.16.1). The holds become the Cilium driver's,
//!    the kit's record of the pins moves to the Cilium driver's key;
//! 3. once LB-IPAM says `IPAMRequestSatisfied=True` for every one, MetalLB's pin annotations
//!    go (MetalLB keeps an address still inside one of its pools: nothing changes), the
//!    addresses' finalizer becomes the Cilium driver's, and MetalLB's pools lose the MetalLB
//!    driver's finalizer — **they stay**: deleting them while MetalLB's controller runs makes
//!    MetalLB and LB-IPAM take the address from each other every second (measured). Stop
//!    MetalLB's controller first, then delete them (the report says how).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use address_controller_api::names::driver::pinned_annotation;
use address_controller_api::names::metallb_driver as mlb;
use address_controller_api::service::SERVICE_PROXY_NAME_LABEL;
use address_controller_api::service::cilium::{IPS, SHARING_CROSS_NAMESPACE, SHARING_KEY};
use address_controller_api::service::metallb::{ALLOW_SHARED_IP, LOAD_BALANCER_IPS};
use address_controller_api::{IPAddress, IPAddressClass};
use address_controller_driver_kit::holds::{HOLD_PROXY_NAME, hold_name};
use address_controller_driver_kit::objects::ensure;
use address_controller_driver_kit::ranges;
use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::report::Row;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::cilium::{
    CiliumArgs, FINALIZER, HOLDS, MANAGED_BY, MANAGER, POOL_LABEL, pool_body, pool_name, pools,
};

/// Where the addresses come from.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum From {
    /// The MetalLB driver (`metallb-driver`) of this project.
    Metallb,
}

/// `cilium-driver takeover`'s flags: the driver's (their `env` too), and its own.
#[derive(clap::Args, Clone, Debug)]
pub struct TakeoverArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub log: address_controller_runtime::logging::LogArgs,
    #[command(flatten)]
    pub cilium: CiliumArgs,
    /// The driver whose classes move into LB-IPAM (its holds are in --hold-namespace).
    #[arg(
        long,
        value_enum,
        env = "ADDRESS_CONTROLLER_CILIUM_DRIVER_TAKEOVER_FROM"
    )]
    pub from: From,
    /// MetalLB's namespace: where its pools are.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_CILIUM_DRIVER_METALLB_NAMESPACE",
        default_value = "metallb-system"
    )]
    pub metallb_namespace: String,
    /// How long to wait for LB-IPAM to take over every address.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_CILIUM_DRIVER_TAKEOVER_WAIT",
        default_value = "120s",
        value_parser = address_controller_api::duration::parse
    )]
    pub wait: Duration,
    /// Act; without it, print what would be done (never from the environment).
    #[arg(long)]
    pub yes: bool,
    /// Move back: MetalLB's pins, holds and finalizers again, LB-IPAM's taken off, the
    /// classes' LB-IPAM pools deleted (MetalLB's controller and pools must be there).
    #[arg(long, conflicts_with = "finish")]
    pub undo: bool,
    /// The last step, once MetalLB's controller is stopped: MetalLB's pin annotations off the
    /// moved Services and holds, the MetalLB driver's pools deleted. Before it, they are
    /// inert beside LB-IPAM's — and taking them off while MetalLB runs makes MetalLB refuse
    /// a shared address (measured).
    #[arg(long)]
    pub finish: bool,
}

/// `cilium-driver takeover …`: its logging, a runtime, [`run`]; exit 1 when something was
/// left undone or failed.
pub fn main(args: &TakeoverArgs, controller: &str) -> std::process::ExitCode {
    args.log.init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(args, controller)));
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cilium-driver takeover: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What one Service (a hold or a tenant's) should carry on each side: annotations and labels
/// to set (`null`: remove).
#[derive(Debug, Clone, PartialEq)]
pub struct Marks {
    pub annotations: Value,
    pub labels: Value,
}

/// The marks that make a MetalLB-pinned Service (`hold`: one of the MetalLB driver's holds)
/// LB-IPAM's, for `class`'s pool; `None` when it carries no MetalLB pin.
pub fn to_cilium(
    s: &Service,
    class: &str,
    hold: bool,
    marker_from: &str,
    marker_to: &str,
) -> Option<Marks> {
    let ann = s.annotations();
    let ips = ann.get(LOAD_BALANCER_IPS)?;
    let mut annotations = json!({IPS: ips, SHARING_CROSS_NAMESPACE: "*"});
    if let Some(key) = ann.get(ALLOW_SHARED_IP) {
        annotations[SHARING_KEY] = json!(key);
    }
    let mut labels = json!({POOL_LABEL: pool_name(class)});
    if hold {
        annotations[HOLDS] = json!(ann.get(mlb::HOLDS));
        labels[MANAGED_BY] = json!(MANAGER);
        labels[SERVICE_PROXY_NAME_LABEL] = Value::Null;
    } else if let Some(pins) = ann.get(marker_from) {
        annotations[marker_to] = json!(pins);
        annotations[marker_from] = Value::Null;
    }
    Some(Marks {
        annotations,
        labels,
    })
}

/// The marks that make an LB-IPAM-pinned Service MetalLB's again (`--undo`); `None` when it
/// carries no LB-IPAM pin.
pub fn to_metallb(s: &Service, hold: bool, marker_from: &str, marker_to: &str) -> Option<Marks> {
    let ann = s.annotations();
    let ips = ann.get(IPS)?;
    let mut annotations = json!({LOAD_BALANCER_IPS: ips, IPS: null, SHARING_KEY: null,
        SHARING_CROSS_NAMESPACE: null});
    if let Some(key) = ann.get(SHARING_KEY) {
        annotations[ALLOW_SHARED_IP] = json!(key);
    }
    let mut labels = json!({POOL_LABEL: null});
    if hold {
        annotations[mlb::HOLDS] = json!(ann.get(HOLDS));
        annotations[HOLDS] = Value::Null;
        labels[MANAGED_BY] = json!(mlb::MANAGER);
        labels[SERVICE_PROXY_NAME_LABEL] = json!(HOLD_PROXY_NAME);
    } else if let Some(pins) = ann.get(marker_from) {
        annotations[marker_to] = json!(pins);
        annotations[marker_from] = Value::Null;
    }
    Some(Marks {
        annotations,
        labels,
    })
}

/// The finalizers with `from` swapped for `to` (`None`: nothing to swap); order kept, `to`
/// never twice.
pub fn swapped(finalizers: &[String], from: &str, to: &str) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == from) {
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    for f in finalizers {
        let f = if f == from { to } else { f.as_str() };
        if !out.iter().any(|o| o == f) {
            out.push(f.to_string());
        }
    }
    Some(out)
}

/// The `cilium.io/IPsUsed` count a pool's status reports.
pub fn ips_used(pool: &Value) -> Option<usize> {
    pool["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "cilium.io/IPsUsed")?["message"]
        .as_str()?
        .parse()
        .ok()
}

/// Whether `s` carries every mark already.
fn carries(s: &Service, m: &Marks) -> bool {
    let fits = |have: &BTreeMap<String, String>, want: &Value| {
        want.as_object().is_some_and(|w| {
            w.iter()
                .all(|(k, v)| have.get(k).map(String::as_str) == v.as_str())
        })
    };
    fits(s.annotations(), &m.annotations) && fits(s.labels(), &m.labels)
}

struct Takeover<'a> {
    args: &'a TakeoverArgs,
    client: &'a Client,
    rows: Vec<Row>,
}

/// What the takeover reads before it acts: the MetalLB driver's classes, their addresses,
/// and every Service.
struct Books {
    classes: Vec<IPAddressClass>,
    addresses: Vec<IPAddress>,
    /// The class of each address, by its address: a pinned Service names addresses.
    class_of: BTreeMap<String, String>,
    /// The holds' names (one per address).
    holds: BTreeSet<String>,
    services: Vec<Service>,
}

impl Books {
    async fn read(client: &Client) -> anyhow::Result<Books> {
        let classes: Vec<IPAddressClass> = Api::<IPAddressClass>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|c| {
                c.spec.provisioner == address_controller_api::names::driver::METALLB_PROVISIONER
            })
            .collect();
        let names: BTreeSet<String> = classes.iter().map(|c| c.name_any()).collect();
        let addresses: Vec<IPAddress> = Api::<IPAddress>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|a| names.contains(&a.spec.class_name))
            .collect();
        let class_of = addresses
            .iter()
            .map(|a| (a.spec.address.clone(), a.spec.class_name.clone()))
            .collect();
        let holds = addresses.iter().map(|a| hold_name(&a.name_any())).collect();
        let services = Api::<Service>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        Ok(Books {
            classes,
            addresses,
            class_of,
            holds,
            services,
        })
    }

    /// Whether `s` is the hold of one of the addresses, in the drivers' hold namespace.
    fn is_hold(&self, s: &Service, hold_namespace: &str) -> bool {
        s.namespace().as_deref() == Some(hold_namespace) && self.holds.contains(&s.name_any())
    }

    /// The number of addresses of each class.
    fn held(&self) -> BTreeMap<String, usize> {
        let mut held: BTreeMap<String, usize> = BTreeMap::new();
        for a in &self.addresses {
            *held.entry(a.spec.class_name.clone()).or_default() += 1;
        }
        held
    }
}

/// Runs the takeover (or its undo); whether every step succeeded.
pub async fn run(args: &TakeoverArgs, controller: &str) -> anyhow::Result<bool> {
    let client = args.client.client().await?;
    let books = Books::read(&client).await?;
    let mut t = Takeover {
        args,
        client: &client,
        rows: Vec::new(),
    };
    let ours = pinned_annotation(controller);
    if args.finish {
        t.finish(&books, &ours).await;
        return Ok(t.report(&books.addresses, &books.classes));
    }
    let (moved, others) = t.mark_all(&books, &ours).await;
    if !args.undo {
        // The pools after the pins: LB-IPAM is dormant while no pool exists, and imports
        // each Service's address as it wakes up; a pool first would have it take the address
        // off every Service not yet marked for it.
        t.bystanders(&others);
        for c in &books.classes {
            t.pool(c).await;
        }
        if args.yes {
            t.pools_seen(&books.classes).await;
        }
    }
    if args.yes && !args.undo {
        if t.satisfied(&moved, &books.held()).await {
            for a in &books.addresses {
                t.finalizer(a, mlb::FINALIZER, FINALIZER).await;
            }
            t.release_metallb_pools().await;
        }
    } else if args.undo {
        for a in &books.addresses {
            t.finalizer(a, FINALIZER, mlb::FINALIZER).await;
        }
        t.delete_pools(&books.classes).await;
    }
    Ok(t.report(&books.addresses, &books.classes))
}

impl<'b> Takeover<'_> {
    /// `--finish`: MetalLB's pins off every Service LB-IPAM holds for the Cilium driver, and
    /// the MetalLB driver's pools deleted (MetalLB's controller stopped first).
    async fn finish(&mut self, books: &Books, ours: &str) {
        for s in &books.services {
            let hold = books.is_hold(s, &self.args.cilium.hold_namespace);
            let ann = s.annotations();
            if ann.contains_key(IPS)
                && (hold || ann.contains_key(ours))
                && (ann.contains_key(LOAD_BALANCER_IPS) || ann.contains_key(ALLOW_SHARED_IP))
            {
                self.strip_metallb(s).await;
            }
        }
        self.delete_metallb_pools().await;
    }

    /// Marks every hold and every Service the driver being moved from pinned for the other
    /// side; the ones marked, and the Services with one of the addresses that driver did
    /// not pin (bystanders).
    async fn mark_all(
        &mut self,
        books: &'b Books,
        ours: &str,
    ) -> (Vec<&'b Service>, Vec<&'b Service>) {
        let (undo, theirs) = (self.args.undo, pinned_annotation(mlb::NAME));
        let mut moved = Vec::new();
        let mut others = Vec::new();
        for s in &books.services {
            let hold = books.is_hold(s, &self.args.cilium.hold_namespace);
            let first = s
                .annotations()
                .get(if undo { IPS } else { LOAD_BALANCER_IPS });
            let Some(class) = first
                .and_then(|v| v.split(',').next())
                .and_then(|ip| books.class_of.get(ip.trim()))
            else {
                continue;
            };
            let from = if undo { ours } else { theirs.as_str() };
            if !hold && !s.annotations().contains_key(from) {
                others.push(s);
                continue; // not pinned by the driver being moved from
            }
            let marks = if undo {
                to_metallb(s, hold, ours, &theirs)
            } else {
                to_cilium(s, class, hold, &theirs, ours)
            };
            if let Some(m) = marks
                && self.mark(s, &m).await
            {
                moved.push(s);
            }
        }
        (moved, others)
    }
}

impl Takeover<'_> {
    /// Prints the report and what is left to do; whether every step succeeded.
    fn report(&mut self, addresses: &[IPAddress], classes: &[IPAddressClass]) -> bool {
        let args = self.args;
        let t = self;
        if t.rows.is_empty() {
            t.rows.push(Row::new(
                "-",
                true,
                format!(
                    "nothing to move ({} addresses of {} classes)",
                    addresses.len(),
                    classes.len()
                ),
            ));
        }
        print!(
            "{}",
            address_controller_runtime::report::status_table("OBJECT", "ACTION", &t.rows)
        );
        if !args.yes {
            println!("(dry run: nothing written; --yes to act)");
        } else if !args.undo && !args.finish {
            println!(
                "then: run cilium-driver --provisioner {} in the MetalLB driver's place; stop MetalLB's controller; then takeover --from metallb --finish --yes",
                address_controller_api::names::driver::METALLB_PROVISIONER,
            );
        }
        t.rows.iter().all(|r| r.ok)
    }
}

impl Takeover<'_> {
    fn push(&mut self, object: String, result: Result<(), String>, action: String) {
        match result {
            Ok(()) => self.rows.push(Row::new(object, true, action)),
            Err(e) => self
                .rows
                .push(Row::new(object, false, format!("{action}: {e}"))),
        }
    }

    async fn pool(&mut self, class: &IPAddressClass) {
        let name = pool_name(&class.name_any());
        let object = format!("ciliumloadbalancerippool/{name}");
        let blocks = match ranges::parse_metallb_addresses(class.spec.parameters.as_ref()) {
            Ok(b) => b,
            Err(e) => return self.push(object, Err(e.to_string()), "the class's pool".into()),
        };
        if pools(self.client)
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .is_some()
        {
            return;
        }
        let result = if self.args.yes {
            ensure(&pools(self.client), &name, pool_body(class, &blocks)).await
        } else {
            Ok(())
        };
        self.push(object, result, "create the class's LB-IPAM pool".into());
    }

    /// Warns of the LoadBalancer Services with an address that LB-IPAM will answer once a
    /// pool exists and that do not move (not the MetalLB driver's): LB-IPAM takes off every
    /// address outside a pool that selects the Service (measured with v1.19.5), and their
    /// load balancer puts it back — they flap until they move or get a `loadBalancerClass`.
    fn bystanders(&mut self, others: &[&Service]) {
        for s in others {
            let spec = s.spec.as_ref();
            let lb = spec.and_then(|x| x.type_.as_deref()) == Some("LoadBalancer");
            let class = spec.and_then(|x| x.load_balancer_class.as_ref());
            if !lb
                || class != self.args.cilium.lb_class.as_ref()
                || address_controller_driver_kit::ingress(s).is_empty()
            {
                continue;
            }
            self.rows.push(Row::new(
                format!("service/{}/{}", s.namespace().unwrap_or_default(), s.name_any()),
                true,
                "WARNING: not the MetalLB driver's; LB-IPAM will take its address off once a pool exists (give it a loadBalancerClass, or a claim first)".to_string(),
            ));
        }
    }

    /// Waits until LB-IPAM has taken in every class's pool (its `IPsTotal` condition, of
    /// the pool's generation): a Service that asks for an address of a pool LB-IPAM does not
    /// know yet is answered `no_pool` — and its address taken off the Service.
    async fn pools_seen(&mut self, classes: &[IPAddressClass]) {
        let deadline = tokio::time::Instant::now() + self.args.wait;
        let api = pools(self.client);
        for c in classes {
            let name = pool_name(&c.name_any());
            let seen = loop {
                let p = api.get_opt(&name).await.ok().flatten();
                let seen = p.as_ref().is_some_and(|p| {
                    p.data["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c["type"] == "cilium.io/IPsTotal"
                                && c["observedGeneration"].as_i64() == p.metadata.generation
                        })
                    })
                });
                if seen || tokio::time::Instant::now() > deadline {
                    break seen;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            if !seen {
                self.push(
                    format!("ciliumloadbalancerippool/{name}"),
                    Err("LB-IPAM did not take the pool in (is the cilium-operator running with LB-IPAM?)".into()),
                    "wait for LB-IPAM".into(),
                );
            }
        }
    }

    /// Sets `m` on `s` (nothing when it carries it); whether it carries it now (or would).
    async fn mark(&mut self, s: &Service, m: &Marks) -> bool {
        let object = format!(
            "service/{}/{}",
            s.namespace().unwrap_or_default(),
            s.name_any()
        );
        if carries(s, m) {
            return true;
        }
        let action = if self.args.undo {
            "back to MetalLB's pins"
        } else {
            "ask LB-IPAM for its address"
        };
        let result = if self.args.yes {
            self.patch(
                s,
                json!({"metadata": {"annotations": m.annotations, "labels": m.labels}}),
            )
            .await
        } else {
            Ok(())
        };
        let ok = result.is_ok();
        self.push(object, result, action.into());
        ok
    }

    async fn patch(&self, s: &Service, body: Value) -> Result<(), String> {
        Api::<Service>::namespaced(self.client.clone(), &s.namespace().unwrap_or_default())
            .patch(&s.name_any(), &PatchParams::default(), &Patch::Merge(body))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Whether LB-IPAM took in every Service moved, within `--wait`: its books hold every
    /// address of the classes (each pool's `IPsUsed`), and each Service still shows what it
    /// asks for (LB-IPAM takes an address off a Service it does not accept). Its condition
    /// alone does not tell: a Service whose address LB-IPAM *imported* gets none, and one
    /// from before the move can be stale.
    async fn satisfied(&mut self, moved: &[&Service], held: &BTreeMap<String, usize>) -> bool {
        let deadline = tokio::time::Instant::now() + self.args.wait;
        let mut waiting: Vec<String> = Vec::new();
        loop {
            waiting.clear();
            for (class, count) in held {
                let name = pool_name(class);
                let used = pools(self.client)
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|p| ips_used(&p.data));
                if used.is_none_or(|u| u < *count) {
                    waiting.push(format!(
                        "pool {name}: {used:?} of {count} addresses in LB-IPAM's books"
                    ));
                }
            }
            for s in moved {
                let ns = s.namespace().unwrap_or_default();
                let live = Api::<Service>::namespaced(self.client.clone(), &ns)
                    .get_opt(&s.name_any())
                    .await
                    .ok()
                    .flatten();
                let Some(live) = live else { continue };
                let asks: Vec<String> = live
                    .annotations()
                    .get(IPS)
                    .map(|v| v.split(',').map(|x| x.trim().to_string()).collect())
                    .unwrap_or_default();
                let shows: Vec<String> = address_controller_api::service::ingress_ips(&live)
                    .map(str::to_string)
                    .collect();
                if !asks.iter().all(|ip| shows.contains(ip)) {
                    let said = crate::cilium::lbipam_refusal(&live).unwrap_or_default();
                    waiting.push(format!("{ns}/{} shows {shows:?} {said}", s.name_any()));
                }
            }
            if waiting.is_empty() || tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let ok = waiting.is_empty();
        self.push(
            "-".into(),
            if ok {
                Ok(())
            } else {
                Err(format!("not yet LB-IPAM's: {}", waiting.join(", ")))
            },
            format!(
                "LB-IPAM holds every address and {} Services show theirs",
                moved.len()
            ),
        );
        ok
    }

    async fn strip_metallb(&mut self, s: &Service) {
        let object = format!(
            "service/{}/{}",
            s.namespace().unwrap_or_default(),
            s.name_any()
        );
        let result = self
            .patch(s, json!({"metadata": {"annotations": {LOAD_BALANCER_IPS: null, ALLOW_SHARED_IP: null}}}))
            .await;
        self.push(object, result, "MetalLB's pin annotations removed".into());
    }

    async fn finalizer(&mut self, a: &IPAddress, from: &str, to: &str) {
        let Some(list) = swapped(a.finalizers(), from, to) else {
            return;
        };
        let object = format!("ipaddress/{}", a.name_any());
        let result = if self.args.yes {
            Api::<IPAddress>::all(self.client.clone())
                .patch(
                    &a.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"resourceVersion": a.resource_version(),
                        "finalizers": list}})),
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        self.push(object, result, format!("finalizer {from} → {to}"));
    }

    fn metallb_pools(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("metallb.io", "v1beta1", "IPAddressPool");
        Api::namespaced_with(
            self.client.clone(),
            &self.args.metallb_namespace,
            &ApiResource::from_gvk(&gvk),
        )
    }

    /// MetalLB's pools lose the MetalLB driver's finalizer (that driver is gone); they stay
    /// until MetalLB's controller is stopped.
    async fn release_metallb_pools(&mut self) {
        let api = self.metallb_pools();
        let lp = ListParams::default().labels(&format!("{MANAGED_BY}={}", mlb::MANAGER));
        let Ok(list) = api.list(&lp).await else {
            return;
        };
        for p in list.items {
            let keep: Vec<&String> = p
                .finalizers()
                .iter()
                .filter(|f| *f != mlb::POOL_FINALIZER)
                .collect();
            if keep.len() == p.finalizers().len() {
                continue;
            }
            let result = api
                .patch(
                    &p.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": keep}})),
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            self.push(
                format!("ipaddresspool/{}", p.name_any()),
                result,
                "kept, without the MetalLB driver's finalizer: delete it once MetalLB's controller is stopped".into(),
            );
        }
    }

    /// `--finish`: MetalLB's pools of the MetalLB driver go (its finalizer first) — only once
    /// MetalLB's controller is stopped: deleting them while it runs makes MetalLB and LB-IPAM
    /// take the address from each other every second (measured).
    async fn delete_metallb_pools(&mut self) {
        let api = self.metallb_pools();
        let lp = ListParams::default().labels(&format!("{MANAGED_BY}={}", mlb::MANAGER));
        let Ok(list) = api.list(&lp).await else {
            return;
        };
        for p in list.items {
            let result = if self.args.yes {
                delete_unkept(&api, &p.name_any()).await
            } else {
                Ok(())
            };
            self.push(
                format!("ipaddresspool/{}", p.name_any()),
                result,
                "deleted".into(),
            );
        }
    }

    /// `--undo`: the classes' LB-IPAM pools go (their finalizer first).
    async fn delete_pools(&mut self, classes: &[IPAddressClass]) {
        let api = pools(self.client);
        for c in classes {
            let name = pool_name(&c.name_any());
            if api.get_opt(&name).await.ok().flatten().is_none() {
                continue;
            }
            let result = if self.args.yes {
                delete_unkept(&api, &name).await
            } else {
                Ok(())
            };
            self.push(
                format!("ciliumloadbalancerippool/{name}"),
                result,
                "deleted".into(),
            );
        }
    }
}

/// Deletes the object `name` of `api`, its finalizers dropped first (the takeover moves
/// what kept it).
async fn delete_unkept(api: &Api<DynamicObject>, name: &str) -> Result<(), String> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .map_err(|e| e.to_string())?;
    api.delete(name, &Default::default())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn svc(ann: Value, labels: Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "t",
            "annotations": ann, "labels": labels}}))
        .unwrap()
    }

    #[test]
    fn a_metallb_pin_becomes_lbipams_under_the_same_key_and_back() {
        let (cil, mlb_marker) = (
            pinned_annotation("cilium-driver"),
            pinned_annotation("metallb-driver"),
        );
        let s = svc(
            json!({LOAD_BALANCER_IPS: "192.0.2.0", ALLOW_SHARED_IP: "ac-cu", mlb_marker.clone(): "192.0.2.0"}),
            json!({}),
        );
        let m = to_cilium(&s, "web", false, &mlb_marker, &cil).unwrap();
        assert_eq!(m.annotations[IPS], "192.0.2.0");
        assert_eq!(m.annotations[SHARING_KEY], "ac-cu");
        assert_eq!(m.annotations[SHARING_CROSS_NAMESPACE], "*");
        assert_eq!(m.annotations[cil.as_str()], "192.0.2.0");
        assert!(m.annotations[mlb_marker.as_str()].is_null());
        assert_eq!(m.labels[POOL_LABEL], "ipaddressclass-web");
        // Applied (a merge patch), then undone: MetalLB's pin and key again.
        let mut after = s.clone();
        let ann = after.metadata.annotations.get_or_insert_default();
        for (k, v) in m.annotations.as_object().unwrap() {
            match v.as_str() {
                Some(v) => ann.insert(k.clone(), v.to_string()),
                None => ann.remove(k),
            };
        }
        after.metadata.labels = Some(BTreeMap::from([(
            POOL_LABEL.to_string(),
            "ipaddressclass-web".to_string(),
        )]));
        assert!(carries(&after, &m));
        let back = to_metallb(&after, false, &cil, &mlb_marker).unwrap();
        assert_eq!(back.annotations[LOAD_BALANCER_IPS], "192.0.2.0");
        assert_eq!(back.annotations[ALLOW_SHARED_IP], "ac-cu");
        assert_eq!(back.annotations[mlb_marker.as_str()], "192.0.2.0");
        assert!(back.annotations[IPS].is_null() && back.labels[POOL_LABEL].is_null());
        // Nothing pinned: nothing to move.
        assert!(to_cilium(&svc(json!({}), json!({})), "web", false, &mlb_marker, &cil).is_none());
    }

    #[test]
    fn a_hold_becomes_the_cilium_drivers_and_visible_to_lbipam() {
        let (cil, mlb_marker) = (
            pinned_annotation("cilium-driver"),
            pinned_annotation("metallb-driver"),
        );
        let hold = svc(
            json!({LOAD_BALANCER_IPS: "192.0.2.1", ALLOW_SHARED_IP: "ac-cu", mlb::HOLDS: "ipv4-192-0-2-1"}),
            json!({MANAGED_BY: mlb::MANAGER, SERVICE_PROXY_NAME_LABEL: HOLD_PROXY_NAME}),
        );
        let m = to_cilium(&hold, "web", true, &mlb_marker, &cil).unwrap();
        assert_eq!(m.labels[MANAGED_BY], MANAGER);
        assert!(
            m.labels[SERVICE_PROXY_NAME_LABEL].is_null(),
            "LB-IPAM ignores a proxy-named Service"
        );
        assert_eq!(m.annotations[HOLDS], "ipv4-192-0-2-1");
    }

    #[test]
    fn lbipams_books_are_read_from_the_pools_ips_used() {
        let pool = json!({"status": {"conditions": [
            {"type": "cilium.io/IPsTotal", "message": "32"},
            {"type": "cilium.io/IPsUsed", "message": "20"}]}});
        assert_eq!(ips_used(&pool), Some(20));
        assert_eq!(ips_used(&json!({"status": {}})), None);
    }

    #[test]
    fn finalizers_are_swapped_in_place_once() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            swapped(&f(&["a", mlb::FINALIZER, "b"]), mlb::FINALIZER, FINALIZER),
            Some(f(&["a", FINALIZER, "b"]))
        );
        assert_eq!(
            swapped(&f(&[FINALIZER, mlb::FINALIZER]), mlb::FINALIZER, FINALIZER),
            Some(f(&[FINALIZER]))
        );
        assert_eq!(swapped(&f(&["a"]), mlb::FINALIZER, FINALIZER), None);
    }
}
