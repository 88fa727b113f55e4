//! `address-controller adopt`: the "backwards inventory" — LoadBalancer Services that show
//! an address of a class and name no claim get one, without renumbering. For each such
//! Service: a claim in its namespace named after it (not owned by it: the address must
//! outlive the Service), an IPAddress pre-bound to the claim with the very address the
//! Service shows, then the Service's claim annotation (and its `spec.loadBalancerIP`
//! cleared: MetalLB refuses a Service that has it next to its own pin annotation), the
//! address's ledger listing the Service as its holder (which it is). The
//! driver then holds the address and pins it where it already is: with MetalLB the Service
//! keeps it at every instant (its sharing key changes in place — it is the address's only
//! user — and the change makes MetalLB retry the hold, which then shares).
//!
//! Reported and never touched: an address outside the class, one already in the ledger, a
//! Service whose name is taken by a claim, a namespace the class does not admit; over a
//! quota, listed, and adopted only with `--over-quota` (the admin decides, as for a
//! reservation). A dry run unless `--yes`. `--undo` reverses what adopt did, restoring each
//! Service's annotations and `spec.loadBalancerIP` exactly as they were, the Service keeping
//! its address throughout.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use address_controller_api::entitlement::{QuotaLimits, Usage};
use address_controller_api::family::{family_of_ip, object_name, parse_address, sort_ipv4_first};
use address_controller_api::names::{ADOPTED_FROM, ADOPTED_PRIOR, SERVICE_CLAIM_ANNOTATION};
use address_controller_api::ranges::{Cidr, shipped_class_blocks};
use address_controller_api::service::{ingress_ips, is_load_balancer_type, metallb};
use address_controller_api::{
    ClaimFamily, ClaimPhase, ClaimRef, Family, IPAddress, IPAddressClaim, IPAddressClaimSpec,
    IPAddressClass, IPAddressQuota, IPAddressSpec,
};
use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::report::{Row, status_table};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

#[derive(clap::Args)]
pub struct AdoptArgs {
    #[command(flatten)]
    kube: ClientArgs,
    /// The class to adopt into: a Service is adopted when every address it shows lies in
    /// the class's addresses (classes of the range and MetalLB drivers).
    #[arg(long, env = "ADDRESS_CONTROLLER_ADOPT_CLASS")]
    class: String,
    /// Only Services of this namespace.
    #[arg(long, short = 'n', env = "ADDRESS_CONTROLLER_ADOPT_NAMESPACE")]
    namespace: Option<String>,
    /// Only Services matching this label selector.
    #[arg(long, short = 'l', env = "ADDRESS_CONTROLLER_ADOPT_SELECTOR")]
    selector: Option<String>,
    /// Act; without it, print what would be done.
    #[arg(long)]
    yes: bool,
    /// Adopt also where it takes a namespace past its IPAddressQuota (listed either way).
    #[arg(long)]
    over_quota: bool,
    /// Reverse what adopt did for the class (and scope): claims and addresses deleted, each
    /// Service as it was.
    #[arg(long)]
    undo: bool,
    /// How long to wait for each claim to bind and each Service to be attached.
    #[arg(
        long,
        env = "ADDRESS_CONTROLLER_ADOPT_WAIT",
        default_value = "60s",
        value_parser = address_controller_api::duration::parse
    )]
    wait: Duration,
}

/// What adopt does with one Service.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Adopt these addresses (one per family, IPv4 first) into a claim of this family;
    /// `over_quota`: past a quota, adopted because `--over-quota` says so.
    Adopt {
        ips: Vec<IpAddr>,
        family: ClaimFamily,
        over_quota: Option<String>,
    },
    /// Left alone, and why.
    Leave(String),
}

/// What is known around one Service when it is judged.
pub struct Facts<'a> {
    pub class: &'a str,
    pub blocks: &'a [Cidr],
    /// The ledger: address → IPAddress name.
    pub ledger: &'a BTreeMap<IpAddr, String>,
    /// Whether a claim named after the Service exists in its namespace.
    pub claim_taken: bool,
    /// Why the class does not admit the namespace, if it does not.
    pub refused: Option<String>,
    /// The namespace's limits on the class, and what it holds of it (adoptions judged
    /// before this one included).
    pub limits: Option<&'a QuotaLimits>,
    pub used: Usage,
    pub over_quota: bool,
}

/// Whether and how one Service is adopted (`None`: not a candidate — not a LoadBalancer,
/// showing no address, or naming a claim already).
pub fn judge(s: &Service, f: &Facts<'_>) -> Option<Verdict> {
    if !is_load_balancer_type(s) || s.annotations().contains_key(SERVICE_CLAIM_ANNOTATION) {
        return None;
    }
    let mut ips: Vec<IpAddr> = ingress_ips(s)
        .filter_map(|x| parse_address(x).ok())
        .collect();
    if ips.is_empty() {
        return None;
    }
    sort_ipv4_first(&mut ips);
    let shown = list(&ips);
    let leave = |why: String| Some(Verdict::Leave(format!("shows {shown}: {why}")));
    let outside: Vec<IpAddr> = ips
        .iter()
        .copied()
        .filter(|ip| !f.blocks.iter().any(|b| b.contains(*ip)))
        .collect();
    if !outside.is_empty() {
        return leave(format!(
            "{} outside class {:?}'s addresses",
            list(&outside),
            f.class
        ));
    }
    if let Some((ip, name)) = ips.iter().find_map(|ip| f.ledger.get(ip).map(|n| (ip, n))) {
        return leave(format!("{ip} is in the ledger already (ipaddress/{name})"));
    }
    let families: Vec<Family> = ips.iter().map(|ip| family_of_ip(*ip)).collect();
    let family = match families.as_slice() {
        [Family::IPv4] => ClaimFamily::IPv4,
        [Family::IPv6] => ClaimFamily::IPv6,
        [Family::IPv4, Family::IPv6] => ClaimFamily::Dual,
        _ => return leave("not one address per family".into()),
    };
    if f.claim_taken {
        return leave(format!(
            "a claim named {:?} exists in its namespace",
            s.name_any()
        ));
    }
    if let Some(why) = &f.refused {
        return leave(why.clone());
    }
    let over = f
        .limits
        .and_then(|l| l.admit(f.class, &f.used, &families).err());
    match over {
        Some(why) if !f.over_quota => leave(format!(
            "over quota — {why} (--over-quota adopts it anyway)"
        )),
        over_quota => Some(Verdict::Adopt {
            ips,
            family,
            over_quota,
        }),
    }
}

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs adopt (or `--undo`); whether every step succeeded.
pub async fn run(args: &AdoptArgs) -> anyhow::Result<bool> {
    let client = args.kube.client().await?;
    let class = Api::<IPAddressClass>::all(client.clone())
        .get_opt(&args.class)
        .await?
        .ok_or_else(|| anyhow::anyhow!("IPAddressClass {:?} not found", args.class))?;
    let blocks = match shipped_class_blocks(&class.spec.provisioner, class.spec.parameters.as_ref())
    {
        Some(Ok(b)) => b,
        Some(Err(e)) => anyhow::bail!("class {:?}: {e}", args.class),
        None => anyhow::bail!(
            "class {:?} is provisioned by {}: adopt reads the addresses of the range and MetalLB drivers' classes only",
            args.class,
            class.spec.provisioner
        ),
    };
    let mut a = Adopt {
        args,
        client: &client,
        class: &class,
        rows: Vec::new(),
    };
    if args.undo {
        a.undo().await?;
    } else {
        a.adopt(&blocks).await?;
    }
    if a.rows.is_empty() {
        a.rows.push(Row::new("-", true, "nothing to do"));
    }
    print!("{}", status_table("OBJECT", "ACTION", &a.rows));
    if !args.yes {
        println!("(dry run: nothing written; --yes to act)");
    }
    Ok(a.rows.iter().all(|r| r.ok))
}

/// What adopt reads before it judges ([`Adopt::read`]).
struct World {
    /// In scope, by namespace and name.
    services: Vec<Service>,
    ledger: BTreeMap<IpAddr, String>,
    /// The class's addresses per namespace.
    used: BTreeMap<String, Usage>,
    claims: BTreeSet<(String, String)>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    quotas: Vec<IPAddressQuota>,
}

struct Adopt<'a> {
    args: &'a AdoptArgs,
    client: &'a Client,
    class: &'a IPAddressClass,
    rows: Vec<Row>,
}

fn service_object(ns: &str, name: &str) -> String {
    format!("service/{ns}/{name}")
}

impl Adopt<'_> {
    fn row(&mut self, object: String, ok: bool, action: String) {
        self.rows.push(Row::new(object, ok, action));
    }

    fn services(&self, ns: &str) -> Api<Service> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// What adopt judges by: the Services in scope, who holds which IP, the class's usage
    /// per namespace, the claims' names, the namespaces' labels, the quotas.
    async fn read(&self) -> anyhow::Result<World> {
        let class = self.class.name_any();
        let mut lp = ListParams::default();
        if let Some(sel) = &self.args.selector {
            lp = lp.labels(sel);
        }
        let mut services = match &self.args.namespace {
            Some(ns) => self.services(ns).list(&lp).await?.items,
            None => {
                Api::<Service>::all(self.client.clone())
                    .list(&lp)
                    .await?
                    .items
            }
        };
        services.sort_by_key(|s| (s.namespace(), s.name_any()));
        let addresses = Api::<IPAddress>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let ledger: BTreeMap<IpAddr, String> = addresses
            .iter()
            .filter_map(|a| a.ip().map(|ip| (ip, a.name_any())))
            .collect();
        let mut used: BTreeMap<String, Usage> = BTreeMap::new();
        for a in addresses.iter().filter(|a| a.spec.class_name == class) {
            if let Some((ns, f)) = a.quota_slot() {
                used.entry(ns.to_string()).or_default().add(f, 1);
            }
        }
        let claims: BTreeSet<(String, String)> = Api::<IPAddressClaim>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|c| (c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        let namespaces: BTreeMap<String, BTreeMap<String, String>> =
            Api::<Namespace>::all(self.client.clone())
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(|n| (n.name_any(), n.labels().clone()))
                .collect();
        let quotas = Api::<IPAddressQuota>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        Ok(World {
            services,
            ledger,
            used,
            claims,
            namespaces,
            quotas,
        })
    }

    async fn adopt(&mut self, blocks: &[Cidr]) -> anyhow::Result<()> {
        let class = self.class.name_any();
        let World {
            services,
            ledger,
            mut used,
            claims,
            namespaces,
            quotas,
        } = self.read().await?;
        for s in &services {
            let ns = s.namespace().unwrap_or_default();
            let limits = QuotaLimits::of_class(
                quotas
                    .iter()
                    .filter(|q| q.namespace().as_deref() == Some(ns.as_str())),
                &class,
            );
            let facts = Facts {
                class: &class,
                blocks,
                ledger: &ledger,
                claim_taken: claims.contains(&(ns.clone(), s.name_any())),
                refused: self.class.refuses_namespace(&ns, namespaces.get(&ns)),
                limits: limits.as_ref(),
                used: used.get(&ns).copied().unwrap_or_default(),
                over_quota: self.args.over_quota,
            };
            let object = service_object(&ns, &s.name_any());
            match judge(s, &facts) {
                None => {}
                Some(Verdict::Leave(why)) => self.row(object, true, format!("left: {why}")),
                Some(Verdict::Adopt {
                    ips,
                    family,
                    over_quota,
                }) => {
                    let u = used.entry(ns.clone()).or_default();
                    for ip in &ips {
                        u.add(family_of_ip(*ip), 1);
                    }
                    let note = over_quota
                        .map(|q| format!(" (over quota, as --over-quota says: {q})"))
                        .unwrap_or_default();
                    if self.args.yes {
                        match self.adopt_one(s, &ips, family).await {
                            Ok(done) => self.row(object, true, format!("{done}{note}")),
                            Err(e) => self.row(object, false, format!("{e:#}")),
                        }
                    } else {
                        self.row(
                            object,
                            true,
                            format!(
                                "would adopt {} into claim {ns}/{} of class {class}{note}",
                                list(&ips),
                                s.name_any()
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The Service's annotation, the addresses reserved for its claim with the Service in
    /// their ledger, then the claim, which binds them; then wait for Bound and attached.
    async fn adopt_one(
        &self,
        s: &Service,
        ips: &[IpAddr],
        family: ClaimFamily,
    ) -> anyhow::Result<String> {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        let prior = json!({"annotations": s.annotations(),
            "loadBalancerIP": s.spec.as_ref().and_then(|sp| sp.load_balancer_ip.clone())});
        self.name_the_claim(s).await?;
        // The addresses first, as reservations for the claim (a claimRef without uid: no
        // other claim can match them), then the claim, which binds them — created the other
        // way round, the core could bind the new claim to any free address of the class.
        let mut made: Vec<String> = Vec::new();
        for ip in ips {
            if let Err(e) = self.reserve(s, *ip, &mut made).await {
                self.forget(&made, s).await;
                return Err(e);
            }
        }
        let claim = self.claim_for(s, family, &made, &prior);
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = claims.create(&PostParams::default(), &claim).await {
            self.forget(&made, s).await;
            return Err(e.into());
        }
        let bound = wait(self.args.wait, || async {
            let c = claims.get(&name).await?;
            Ok(c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Bound))
        })
        .await?;
        if !bound {
            anyhow::bail!(
                "claim {ns}/{name} created with its addresses but not Bound within {:?} (is the core running?): the Service names it; --undo reverses the adoption",
                self.args.wait
            );
        }
        let attached = wait(self.args.wait, || async {
            let s = self.services(&ns).get(&name).await?;
            Ok(address_controller_api::sharing::condition(&s).is_some_and(|c| c.status == "True"))
        })
        .await?;
        Ok(format!(
            "adopted {} into claim {ns}/{name}{}",
            list(ips),
            if attached {
                ", attached by the driver"
            } else {
                " — not attached by a driver yet (is one running?)"
            }
        ))
    }

    /// The Service names the claim before there is one (and drops `spec.loadBalancerIP`):
    /// once the claim binds, the driver finds its Service waiting and never sees the address
    /// shown by a Service that does not name its claim (Conflict).
    async fn name_the_claim(&self, s: &Service) -> anyhow::Result<()> {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        let mut body = json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: name}}});
        if s.spec
            .as_ref()
            .and_then(|sp| sp.load_balancer_ip.as_ref())
            .is_some()
        {
            body["spec"] = json!({"loadBalancerIP": null});
        }
        self.services(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(body))
            .await?;
        Ok(())
    }

    /// IP reserved for the Service's claim (its name pushed on MADE once created), with the
    /// Service in its ledger: without it, the moment the claim binds, the address is shown
    /// by a Service its ledger does not list — Conflict, until the driver's next pass
    /// associates it. Its history says so too: a span found under way (it held the address
    /// before).
    async fn reserve(&self, s: &Service, ip: IpAddr, made: &mut Vec<String>) -> anyhow::Result<()> {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        let mut a = IPAddress::new(
            &object_name(ip),
            IPAddressSpec {
                address: ip.to_string(),
                class_name: self.class.name_any(),
                reclaim_policy: self.class.spec.reclaim_policy,
                claim_ref: Some(ClaimRef {
                    namespace: ns.clone(),
                    name: name.clone(),
                    uid: None,
                }),
                source: address_controller_api::AddressSource::from_class(),
            },
        );
        a.metadata.annotations =
            Some([(ADOPTED_FROM.to_string(), format!("Service/{ns}/{name}"))].into());
        let addresses: Api<IPAddress> = Api::all(self.client.clone());
        let created = addresses.create(&PostParams::default(), &a).await?;
        made.push(created.name_any());
        let attachment =
            address_controller_api::sharing::attachment(&format!("{ns}/{name}"), Some(s));
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let one = std::slice::from_ref(&attachment);
        // One holder before and after: the ledger write opens its span, and moves none.
        let (status, _) = a.ledger_status(one, one, &now, false);
        let ledger = json!({ "status": status });
        addresses
            .patch_status(
                &object_name(ip),
                &PatchParams::default(),
                &Patch::Merge(ledger),
            )
            .await?;
        Ok(())
    }

    /// The Service's claim, with what the Service was (`prior`) to undo it. One address: the
    /// claim is pinned to it. The reservation being made first is not enough: the core
    /// watches claims and addresses on two streams, and when the claim arrives first it
    /// would match a free address of the class (the fresh-clone CI caught it: `auto` bound
    /// to another Service's address). A pinned claim waits for its address. (A Dual claim
    /// cannot be pinned; its adoption keeps that race.)
    fn claim_for(
        &self,
        s: &Service,
        family: ClaimFamily,
        made: &[String],
        prior: &serde_json::Value,
    ) -> IPAddressClaim {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        let mut claim = IPAddressClaim::new(
            &name,
            IPAddressClaimSpec {
                class_name: Some(self.class.name_any()),
                family,
                address_name: match made {
                    [one] => Some(one.clone()),
                    _ => None,
                },
                sharing: None,
            },
        );
        claim.metadata.annotations = Some(
            [
                (ADOPTED_FROM.to_string(), format!("Service/{ns}/{name}")),
                (ADOPTED_PRIOR.to_string(), prior.to_string()),
            ]
            .into(),
        );
        claim
    }

    /// Undoes a half-made adoption: the reservations made for a claim that could not be
    /// created, and the Service's annotation and `spec.loadBalancerIP` as they were.
    async fn forget(&self, names: &[String], s: &Service) {
        let addresses: Api<IPAddress> = Api::all(self.client.clone());
        for n in names {
            if let Err(e) = addresses.delete(n, &DeleteParams::default()).await {
                eprintln!("address-controller adopt: deleting the reservation {n}: {e}");
            }
        }
        let lb_ip = s.spec.as_ref().and_then(|sp| sp.load_balancer_ip.clone());
        let body = json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}},
            "spec": {"loadBalancerIP": lb_ip}});
        let ns = s.namespace().unwrap_or_default();
        if let Err(e) = self
            .services(&ns)
            .patch(&s.name_any(), &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            eprintln!(
                "address-controller adopt: restoring Service {ns}/{}: {e}",
                s.name_any()
            );
        }
    }

    async fn undo(&mut self) -> anyhow::Result<()> {
        let class = self.class.name_any();
        let claims = match &self.args.namespace {
            Some(ns) => {
                Api::<IPAddressClaim>::namespaced(self.client.clone(), ns)
                    .list(&ListParams::default())
                    .await?
                    .items
            }
            None => {
                Api::<IPAddressClaim>::all(self.client.clone())
                    .list(&ListParams::default())
                    .await?
                    .items
            }
        };
        for c in claims
            .iter()
            .filter(|c| c.spec.class_name.as_deref() == Some(class.as_str()))
        {
            let Some(from) = c.annotations().get(ADOPTED_FROM) else {
                continue;
            };
            let ns = c.namespace().unwrap_or_default();
            let object = format!("ipaddressclaim/{ns}/{}", c.name_any());
            let svc = from.rsplit('/').next().unwrap_or_default().to_string();
            if !self.args.yes {
                self.row(
                    object,
                    true,
                    format!("would delete it and its addresses, and restore {from} as it was"),
                );
                continue;
            }
            match self.undo_one(c, &svc).await {
                Ok(()) => self.row(
                    object,
                    true,
                    format!("deleted with its addresses; {from} restored as it was"),
                ),
                Err(e) => self.row(object, false, format!("{e:#}")),
            }
        }
        Ok(())
    }

    /// The Service first stops naming the claim and loses the driver's record (so no driver
    /// withdraws its pin); the claim and its addresses go (the driver's finalizer removed:
    /// the Service still shows the address, which is the point); once the holds are gone
    /// the Service is its address's only user, and gets its annotations and
    /// `spec.loadBalancerIP` back exactly — MetalLB lets the only user change them in place.
    async fn undo_one(&self, c: &IPAddressClaim, svc: &str) -> anyhow::Result<()> {
        let ns = c.namespace().unwrap_or_default();
        let prior: Value = serde_json::from_str(
            c.annotations()
                .get(ADOPTED_PRIOR)
                .map(String::as_str)
                .unwrap_or("{}"),
        )?;
        let services = self.services(&ns);
        if let Some(now) = services.get_opt(svc).await? {
            let mut drop: serde_json::Map<String, Value> = serde_json::Map::new();
            drop.insert(SERVICE_CLAIM_ANNOTATION.into(), Value::Null);
            for k in now.annotations().keys() {
                if k.ends_with(".drivers.local.sdn.cozystack.io/pinned") {
                    drop.insert(k.clone(), Value::Null);
                }
            }
            services
                .patch(
                    svc,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": drop}})),
                )
                .await?;
        }
        let owned = self.delete_claim_and_addresses(c).await?;
        // The holds (owned by the addresses) go with them: wait for the garbage collector.
        let all: Api<Service> = Api::all(self.client.clone());
        let gone = wait(self.args.wait, || async {
            let left = all
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|s| s.owner_references().iter().any(|o| owned.contains(&o.uid)));
            Ok(!left)
        })
        .await?;
        if !gone {
            anyhow::bail!(
                "the driver's objects owned by the claim's addresses are still there after {:?}: {svc} keeps the claim's sharing key until they go (run --undo again)",
                self.args.wait
            );
        }
        let Some(now) = services.get_opt(svc).await? else {
            return Ok(());
        };
        let want = prior["annotations"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let lb_ip = prior.get("loadBalancerIP").cloned().unwrap_or(Value::Null);
        if !want.contains_key(metallb::ALLOCATED_FROM_POOL) {
            // Not MetalLB's Service before adoption: restored in one write.
            return restore(&services, &now, &want, &lb_ip).await;
        }
        self.restore_through_metallb(&services, svc, want, &lb_ip)
            .await
    }

    /// Restores a Service MetalLB allocated, in steps MetalLB confirms. MetalLB may still
    /// count the deleted hold as a user of the address for a moment after the API has
    /// forgotten it (v0.16.1: a "reprocess all" that began on a cache that had not yet seen
    /// the deletion assigns the hold again, until the deletion's own turn comes). A Service
    /// whose sharing key changes in that moment loses its address — and gets another if
    /// nothing pins it. So:
    /// 1. everything as it was but the sharing key, which stays the claim's (the hold's), and
    ///    pinned to its address if nothing pinned it before;
    /// 2. the sharing key as it was;
    /// 3. the pin taken off, if step 1 added it.
    ///
    /// Each step takes MetalLB's marker off and waits until MetalLB has written it back with
    /// the address still shown: MetalLB has accepted the Service as it now is. Once step 1 is
    /// confirmed, MetalLB has processed an event newer than the hold's deletion, so the
    /// deletion's turn has come or is queued ahead of step 2.
    async fn restore_through_metallb(
        &self,
        services: &Api<Service>,
        svc: &str,
        mut want: serde_json::Map<String, Value>,
        lb_ip: &Value,
    ) -> anyhow::Result<()> {
        let now = services.get(svc).await?;
        let shows = shown(&now);
        if shows.is_empty() {
            // No address shown (MetalLB down, or it let go): nothing to keep, one write.
            return restore(services, &now, &want, lb_ip).await;
        }
        want.remove(metallb::ALLOCATED_FROM_POOL);
        let pinned = want.contains_key(metallb::LOAD_BALANCER_IPS) || !lb_ip.is_null();
        let mut steps = Vec::new();
        let mut first = want.clone();
        match now.annotations().get(metallb::ALLOW_SHARED_IP) {
            Some(key) => first.insert(metallb::ALLOW_SHARED_IP.into(), json!(key)),
            None => first.remove(metallb::ALLOW_SHARED_IP),
        };
        let pin = json!(shows.iter().cloned().collect::<Vec<_>>().join(","));
        if !pinned {
            first.insert(metallb::LOAD_BALANCER_IPS.into(), pin.clone());
        }
        steps.push(first);
        if !pinned {
            let mut second = want.clone();
            second.insert(metallb::LOAD_BALANCER_IPS.into(), pin);
            steps.push(second);
        }
        steps.push(want);
        for (i, target) in steps.iter().enumerate() {
            let now = services.get(svc).await?;
            restore(services, &now, target, lb_ip).await?;
            let confirmed =
                wait(self.args.wait, || async {
                    let s = services.get(svc).await?;
                    Ok(s.annotations().contains_key(metallb::ALLOCATED_FROM_POOL)
                        && shown(&s) == shows)
                })
                .await?;
            if !confirmed {
                anyhow::bail!(
                    "MetalLB has not confirmed step {} of {} of restoring {svc} (showing {shows:?}, its marker {} back) after {:?}: run --undo again",
                    i + 1,
                    steps.len(),
                    metallb::ALLOCATED_FROM_POOL,
                    self.args.wait
                );
            }
        }
        Ok(())
    }

    /// Deletes the adopted claim C and the addresses adopt made for it (their finalizers
    /// taken off: the Service still shows the address, which is the point); the uids of
    /// those addresses, whose owned objects (the holds) the garbage collector removes.
    async fn delete_claim_and_addresses(
        &self,
        c: &IPAddressClaim,
    ) -> anyhow::Result<BTreeSet<String>> {
        let ns = c.namespace().unwrap_or_default();
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), &ns);
        let addresses: Api<IPAddress> = Api::all(self.client.clone());
        let uid = c.uid();
        let mine: Vec<IPAddress> = addresses
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|a| {
                a.annotations().contains_key(ADOPTED_FROM)
                    && a.spec.claim_ref.as_ref().is_some_and(|r| {
                        r.namespace == ns
                            && r.name == c.name_any()
                            && (r.uid.is_none() || r.uid == uid)
                    })
            })
            .collect();
        match claims.delete(&c.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        // Deleted first, then the finalizers taken off: an object being deleted takes no
        // new finalizer, so no controller can put its own back in between.
        for a in &mine {
            match addresses
                .delete(&a.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => return Err(e.into()),
            }
            match addresses
                .patch(
                    &a.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(mine.iter().filter_map(|a| a.uid()).collect())
    }
}

/// Writes the Service `now` to have exactly the annotations `want` (MetalLB's marker, when
/// `want` lacks it, taken off too) and `spec.loadBalancerIP` `lb_ip`.
async fn restore(
    services: &Api<Service>,
    now: &Service,
    want: &serde_json::Map<String, Value>,
    lb_ip: &Value,
) -> anyhow::Result<()> {
    let mut ann: serde_json::Map<String, Value> = now
        .annotations()
        .keys()
        .filter(|k| !want.contains_key(*k))
        .map(|k| (k.clone(), Value::Null))
        .collect();
    ann.extend(want.clone());
    services
        .patch(
            &now.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": ann},
                "spec": {"loadBalancerIP": lb_ip}})),
        )
        .await?;
    Ok(())
}

/// The addresses a Service's ingress shows, as written.
fn shown(s: &Service) -> BTreeSet<String> {
    ingress_ips(s).map(str::to_string).collect()
}

/// Polls `done` every 500 ms until it is true or `within` passed: whether it became true.
async fn wait<F, Fut>(within: Duration, done: F) -> anyhow::Result<bool>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if done().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use address_controller_api::ranges::parse_parameters;

    fn svc(v: Value) -> Service {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    fn lb(name: &str, ips: &[&str], annotations: Value) -> Service {
        let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        svc(
            json!({"metadata": {"name": name, "namespace": "t", "annotations": annotations},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": ingress}}}),
        )
    }

    #[test]
    fn a_service_is_adopted_only_when_every_address_it_shows_is_the_classs_and_free() {
        let blocks = parse_parameters(Some(&json!({"cidrs": ["192.0.2.0/28", "2001:db8::/120"]})))
            .unwrap_or_else(|e| panic!("{e}"));
        let ledger = BTreeMap::from([(
            "192.0.2.9".parse().unwrap_or_else(|e| panic!("{e}")),
            "ipv4-192-0-2-9".to_string(),
        )]);
        let facts = |claim_taken, refused: Option<String>| Facts {
            class: "pub",
            blocks: &blocks,
            ledger: &ledger,
            claim_taken,
            refused,
            limits: None,
            used: Usage::default(),
            over_quota: false,
        };
        let f = facts(false, None);
        let verdict = |s: &Service| judge(s, &f);
        let adopt = |ips: &[&str], family| {
            Some(Verdict::Adopt {
                ips: ips
                    .iter()
                    .map(|ip| ip.parse().unwrap_or_else(|e| panic!("{e}")))
                    .collect(),
                family,
                over_quota: None,
            })
        };
        assert_eq!(
            verdict(&lb("a", &["192.0.2.5"], json!({}))),
            adopt(&["192.0.2.5"], ClaimFamily::IPv4)
        );
        assert_eq!(
            verdict(&lb("d", &["2001:db8::7", "192.0.2.6"], json!({}))),
            adopt(&["192.0.2.6", "2001:db8::7"], ClaimFamily::Dual)
        );
        let leave = |s: &Service| match verdict(s) {
            Some(Verdict::Leave(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(leave(&lb("o", &["198.51.100.1"], json!({}))).contains("outside class \"pub\""));
        assert!(
            leave(&lb("p", &["192.0.2.5", "198.51.100.1"], json!({})))
                .contains("198.51.100.1 outside")
        );
        assert!(leave(&lb("l", &["192.0.2.9"], json!({}))).contains("ipaddress/ipv4-192-0-2-9"));
        assert!(
            leave(&lb("two", &["192.0.2.1", "192.0.2.2"], json!({})))
                .contains("one address per family")
        );
        // Not candidates at all: naming a claim, showing nothing, not a LoadBalancer.
        assert_eq!(
            verdict(&lb(
                "c",
                &["192.0.2.5"],
                json!({SERVICE_CLAIM_ANNOTATION: "x"})
            )),
            None
        );
        assert_eq!(verdict(&lb("n", &[], json!({}))), None);
        let mut cip = lb("i", &["192.0.2.5"], json!({}));
        if let Some(sp) = cip.spec.as_mut() {
            sp.type_ = Some("ClusterIP".into());
        }
        assert_eq!(verdict(&cip), None);
        let taken = facts(true, None);
        assert!(
            matches!(judge(&lb("a", &["192.0.2.5"], json!({})), &taken), Some(Verdict::Leave(w)) if w.contains("a claim named"))
        );
        let refused = facts(false, Some("not admitted".into()));
        assert!(
            matches!(judge(&lb("a", &["192.0.2.5"], json!({})), &refused), Some(Verdict::Leave(w)) if w.contains("not admitted"))
        );
    }

    #[test]
    fn over_quota_is_listed_and_adopted_only_when_the_admin_says_so() {
        let blocks = parse_parameters(Some(&json!({"cidrs": ["192.0.2.0/28"]})))
            .unwrap_or_else(|e| panic!("{e}"));
        let ledger = BTreeMap::new();
        let quota: IPAddressQuota = serde_json::from_value(json!({
            "metadata": {"name": "q", "namespace": "t"},
            "spec": {"limits": [{"className": "pub", "addresses": 1}]}}))
        .unwrap_or_else(|e| panic!("{e}"));
        let limits = QuotaLimits::of_class([&quota], "pub");
        let mut used = Usage::default();
        used.add(Family::IPv4, 1);
        let mut f = Facts {
            class: "pub",
            blocks: &blocks,
            ledger: &ledger,
            claim_taken: false,
            refused: None,
            limits: limits.as_ref(),
            used,
            over_quota: false,
        };
        let s = lb("a", &["192.0.2.5"], json!({}));
        assert!(
            matches!(judge(&s, &f), Some(Verdict::Leave(w)) if w.contains("over quota") && w.contains("t/q allows 1"))
        );
        f.over_quota = true;
        assert!(
            matches!(judge(&s, &f), Some(Verdict::Adopt { over_quota: Some(q), .. }) if q.contains("t/q allows 1"))
        );
    }
}
