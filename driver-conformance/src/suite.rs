//! A conformance suite for IPAddress drivers (the driver protocol, SPEC §8) — what
//! `csi-sanity` is for storage. It runs against a real cluster where the core controller and
//! the driver run, with a class of the driver set aside for it (`--class`), and checks what
//! any driver must do, case by case:
//!
//! | case | what must happen |
//! |---|---|
//! | `capacity` | the class reports `status.capacity` and `ParametersValid=True` |
//! | `provision-ipv4`, `-ipv6`, `-dual` | a claim of each family the class has capacity for gets exactly one address per family, pre-bound with the claim's uid, the class's name and reclaim policy |
//! | `pinned-left-alone` | a claim pinned to an address (`spec.addressName`) gets nothing from the driver |
//! | `lost-left-alone` | a claim whose address went `Lost` gets no replacement; with `--lose-parameters` the driver itself reports it (the backend lost the address) and recovers it |
//! | `invalid-parameters` | a class with parameters the driver must refuse reports `ParametersValid=False` and its claims an `InvalidClassParameters` event (with `--invalid-parameters`) |
//! | `exhaustion` | with the class full, a claim gets an `Exhausted` event and the class `Exhausted=True`; freeing an address (reclaim policy `Delete`) lets it through (classes of capacity ≤ 16) |
//! | `retain-keeps` | under `Retain` a released address stays out of the pool until an admin releases it (classes of capacity ≤ 16) |
//! | `restart-mid-provision` | restarting the driver while claims are provisioned creates no second address (with a restart command); skipped when the restart did not land mid-provision |
//! | `race-with-the-core` | a free address appearing while the driver provisions ends with one address per family per claim |
//! | `associate` | a Service naming a Bound claim shows its addresses (`status.loadBalancer.ingress`), each `associatedTo` it; deleted and recreated, the same addresses come back (with `--associate`) |
//! | `one-claim-one-service` | a second Service naming the claim gets `AssociationRejected` and none of its addresses (with `--associate`) |
//! | `own-namespace` | a Service naming the claim from another namespace gets `ClaimNotFound` and nothing (with `--associate`) |
//! | `withdraw` | the annotation removed, the addresses leave the Service and `associatedTo` goes; the claim stays Bound (with `--associate`) |
//! | `conflict` | another load balancer's Service showing a claimed address turns it `Conflict`, the rightful Service keeps it; the thief gone, it is `Bound` again (with `--associate`) |
//! | `share-by-port` | a claim that shares (`spec.sharing.policy: SameNamespace`): two Services on different ports both show its addresses and the ledger lists both (`status.attachments`); a third on a used port gets `AddressAttached=False` `PortConflict` and nothing; the first holder deleted, the second keeps the addresses (with `--associate`) |
//! | `share-by-grant` | a Service of another namespace naming `<namespace>/<claim>` gets `NotShared` and nothing; listed in the claim's `spec.sharing.namespaces`, it shows the addresses; the grant withdrawn, it loses them and the claim's own Service keeps them (with `--associate`) |
//! | `conflict-forged-record` | the same thief carrying a forged record of the kit's (`*.drivers.local.sdn.cozystack.io/pinned` naming the address): `Conflict` all the same — the ledger alone says who may show an address — or the thief's pin withdrawn on the record's word; the rightful Service keeps the address (with `--associate`) |
//!
//! Every case ends with the invariant checker over the suite's namespace and the class.
//! The suite changes the class's `reclaimPolicy` for the cases that need one and restores
//! it; it deletes everything it created.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use address_controller_api::family::family_of;
use address_controller_api::names::{SERVICE_CLAIM_ANNOTATION, driver};
use address_controller_api::sharing;
use address_controller_api::{
    ClaimPhase, Family, IPAddress, IPAddressClaim, IPAddressClass, ReclaimPolicy,
};
use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::invariants::{self, Scope};
use crate::{random_suffix, wait_for as until};

/// Restarts the driver under test (a rollout restart, a process kill and start).
pub type Restart = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync>;

/// What the suite is told.
pub struct Options {
    /// The driver's class set aside for the suite.
    pub class: String,
    /// Parameters the driver must refuse (skip `invalid-parameters` without).
    pub invalid_parameters: Option<serde_json::Value>,
    /// Restarts the driver (skip `restart-mid-provision` without).
    pub restart: Option<Restart>,
    /// A free address of the class's pool to race the driver with: an address the driver
    /// would never allocate itself (outside its ranges), of a family the class serves.
    pub race_address: Option<String>,
    /// How long a driver may take to provision one address.
    pub timeout: Duration,
    /// Parameters under which the class's backend no longer has the addresses it handed
    /// out (a shrunk range): `lost-left-alone` applies them, expects the driver to report
    /// `Lost`, and restores the class. Without: the suite writes `Lost` itself.
    pub lose_parameters: Option<serde_json::Value>,
    /// Run the association cases (the driver puts addresses on Services).
    pub associate: bool,
    /// `spec.loadBalancerClass` of the Services the driver serves (`None`: none set).
    pub service_class: Option<String>,
}

/// One case's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub case: &'static str,
    pub outcome: Result<(), String>,
    pub skipped: Option<String>,
    /// What the case saw, when worth saying (which side won a race).
    pub note: Option<String>,
}

pub struct Report {
    pub cases: Vec<CaseResult>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.cases.iter().all(|c| c.outcome.is_ok())
    }

    pub fn table(&self) -> String {
        let mut out = String::from("driver conformance\n");
        for c in &self.cases {
            let (mark, note) = match (&c.outcome, &c.skipped) {
                (_, Some(why)) => ("skip", why.clone()),
                (Ok(()), None) => ("pass", c.note.clone().unwrap_or_default()),
                (Err(e), None) => ("FAIL", e.clone()),
            };
            out.push_str(&format!("  {mark:<5} {:<24} {note}\n", c.case));
        }
        let passed = self
            .cases
            .iter()
            .filter(|c| c.outcome.is_ok() && c.skipped.is_none())
            .count();
        let skipped = self.cases.iter().filter(|c| c.skipped.is_some()).count();
        out.push_str(&format!(
            "{passed} passed, {} failed, {skipped} skipped\n",
            self.cases.len() - passed - skipped
        ));
        out
    }
}

/// The suite's view of the cluster.
struct Suite<'a> {
    client: Client,
    ns: String,
    opts: &'a Options,
    class: IPAddressClass,
    sfx: String,
    note: Option<String>,
}

fn capacity(class: &IPAddressClass, f: Family) -> i64 {
    class
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| match f {
            Family::IPv4 => c.ipv4,
            Family::IPv6 => c.ipv6,
        })
        .unwrap_or(0)
}

fn condition<'c>(
    class: &'c IPAddressClass,
    t: &str,
) -> Option<&'c k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    class
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == t)
}

impl Suite<'_> {
    fn claims(&self) -> Api<IPAddressClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    fn addresses(&self) -> Api<IPAddress> {
        Api::all(self.client.clone())
    }
    fn classes(&self) -> Api<IPAddressClass> {
        Api::all(self.client.clone())
    }

    async fn refresh_class(&mut self) -> Result<()> {
        self.class = self.classes().get(&self.class.name_any()).await?;
        Ok(())
    }

    async fn claim(&self, name: &str, spec: serde_json::Value) -> Result<IPAddressClaim> {
        let body = json!({"metadata": {"name": name}, "spec": spec});
        Ok(self
            .claims()
            .create(&PostParams::default(), &serde_json::from_value(body)?)
            .await?)
    }

    /// Waits until claim `name` passes `check`; returns it as it then was.
    async fn claim_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&IPAddressClaim) -> bool,
    ) -> Result<IPAddressClaim> {
        let api = self.claims();
        until(
            &format!("claim {name} {what}"),
            self.opts.timeout,
            || async {
                let c = api.get(name).await?;
                Ok(check(&c).then_some(c))
            },
        )
        .await
    }

    /// Waits until claim `name` is in `phase`.
    async fn claim_phase(&self, name: &str, phase: ClaimPhase) -> Result<IPAddressClaim> {
        self.claim_until(name, phase.as_str(), |c| {
            c.status.as_ref().and_then(|s| s.phase) == Some(phase)
        })
        .await
    }

    /// Waits until one of claim `name`'s conditions has `reason` (what the core says it
    /// waits for).
    async fn claim_reason(&self, name: &str, reason: &str) -> Result<IPAddressClaim> {
        self.claim_until(name, &format!("saying {reason}"), |c| {
            c.status
                .iter()
                .flat_map(|st| &st.conditions)
                .any(|c| c.reason == reason)
        })
        .await
    }

    async fn bound(&self, name: &str) -> Result<IPAddressClaim> {
        self.claim_phase(name, ClaimPhase::Bound).await
    }

    /// Addresses whose claimRef names `claim`.
    async fn naming(&self, claim: &str) -> Result<Vec<IPAddress>> {
        Ok(self
            .addresses()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|a| {
                a.spec
                    .claim_ref
                    .as_ref()
                    .is_some_and(|r| r.namespace == self.ns && r.name == claim)
            })
            .collect())
    }

    async fn event(&self, object: &str, reason: &str) -> Result<String> {
        self.event_in(&self.ns, object, reason).await
    }

    /// An event with `reason` on `object` in namespace `ns`, once it is there.
    async fn event_in(&self, ns: &str, object: &str, reason: &str) -> Result<String> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), ns);
        until(
            &format!("event {reason} on {object}"),
            self.opts.timeout,
            || async {
                Ok(api
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object)
                    })
                    .map(|e| e.note.unwrap_or_default()))
            },
        )
        .await
    }

    fn services_in(&self, ns: &str) -> Api<Service> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// A LoadBalancer Service the driver serves (its `--service-class`), naming `claim`,
    /// of the families the class serves.
    async fn service(&self, ns: &str, name: &str, claim: Option<&str>) -> Result<Service> {
        self.service_on(ns, name, claim, 80).await
    }

    /// [`Suite::service`] serving TCP `port`.
    async fn service_on(
        &self,
        ns: &str,
        name: &str,
        claim: Option<&str>,
        port: i32,
    ) -> Result<Service> {
        let families: Vec<&str> = self.families().iter().map(|f| f.as_str()).collect();
        let policy = if families.len() > 1 {
            "RequireDualStack"
        } else {
            "SingleStack"
        };
        let mut body = json!({"metadata": {"name": name},
            "spec": {"type": "LoadBalancer", "ports": [{"port": port}],
                "ipFamilyPolicy": policy, "ipFamilies": families}});
        if let Some(c) = claim {
            body["metadata"]["annotations"] = json!({SERVICE_CLAIM_ANNOTATION: c});
        }
        if let Some(lb) = &self.opts.service_class {
            body["spec"]["loadBalancerClass"] = json!(lb);
        }
        Ok(self
            .services_in(ns)
            .create(&PostParams::default(), &serde_json::from_value(body)?)
            .await?)
    }

    async fn delete_service(&self, ns: &str, name: &str) -> Result<()> {
        let api = self.services_in(ns);
        let _ = api.delete(name, &DeleteParams::default()).await;
        until(
            &format!("Service {name} gone"),
            self.opts.timeout,
            || async { Ok(api.get_opt(name).await?.is_none().then_some(())) },
        )
        .await
    }

    /// Waits until Service `ns/name` carries the `AddressAttached` condition with `status`
    /// and `reason`.
    async fn attached(&self, ns: &str, name: &str, status: &str, reason: &str) -> Result<()> {
        let api = self.services_in(ns);
        until(
            &format!("Service {name} {}={status} {reason}", sharing::CONDITION),
            self.opts.timeout,
            || async {
                let svc = api.get(name).await?;
                match sharing::condition(&svc) {
                    Some(c) if c.status == status && c.reason == reason => Ok(Some(())),
                    other => Err(anyhow!(
                        "its condition is {:?}",
                        other.map(|c| (&c.status, &c.reason, &c.message))
                    )),
                }
            },
        )
        .await
    }

    /// Waits until `check` passes on each named address; `check` says what it saw when it
    /// does not. The one poll behind the suite's waits on addresses.
    async fn addresses_until(
        &self,
        addresses: &[String],
        what: &str,
        check: impl Fn(&IPAddress) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let api = self.addresses();
        for a in addresses {
            until(&format!("{a} {what}"), self.opts.timeout, || async {
                check(&api.get(a).await?)
                    .map(Some)
                    .map_err(|saw| anyhow!(saw))
            })
            .await?;
        }
        Ok(())
    }

    /// Waits until every named address lists exactly the Services `holders` (`ns/name`).
    async fn holders(&self, addresses: &[String], holders: &[String]) -> Result<()> {
        let want = sorted(holders.to_vec());
        self.addresses_until(addresses, &format!("held by {want:?}"), |a| {
            let got = sorted(a.holder_services());
            (got == want)
                .then_some(())
                .ok_or(format!("held by {got:?}"))
        })
        .await
    }

    /// Waits until Service `ns/name` shows exactly `want` (in any order).
    async fn shows(&self, ns: &str, name: &str, want: &[String]) -> Result<Service> {
        let api = self.services_in(ns);
        let want = sorted(want.to_vec());
        until(
            &format!("Service {name} to show {want:?}"),
            self.opts.timeout,
            || async {
                let svc = api.get(name).await?;
                let got = sorted(ingress_of(&svc));
                if got == want {
                    Ok(Some(svc))
                } else {
                    Err(anyhow!("it shows {got:?}"))
                }
            },
        )
        .await
    }

    /// Waits until each named address is associated to Service `ns/name` (or to none).
    async fn associated(&self, addresses: &[String], to: Option<(&str, &str)>) -> Result<()> {
        let want = to.map(|(n, s)| (n.to_string(), s.to_string()));
        self.addresses_until(addresses, &format!("associatedTo {to:?}"), |a| {
            let at = a.status.as_ref().and_then(|s| s.associated_to.as_ref());
            let got = at.map(|t| (t.namespace.clone().unwrap_or_default(), t.name.clone()));
            (got == want)
                .then_some(())
                .ok_or(format!("associatedTo {got:?}"))
        })
        .await
    }

    /// Waits until address `name` is in phase `want`.
    async fn phase_is(&self, name: &str, want: address_controller_api::AddressPhase) -> Result<()> {
        self.addresses_until(&[name.to_string()], want.as_str(), |a| {
            (a.phase() == Some(want))
                .then_some(())
                .ok_or(format!("phase {:?}", a.phase()))
        })
        .await
    }

    /// Sets the suite's class's parameters.
    async fn set_parameters(&self, params: serde_json::Value) -> Result<()> {
        let body = json!({"spec": {"parameters": params}});
        self.classes()
            .patch(
                &self.class.name_any(),
                &PatchParams::default(),
                &Patch::Merge(body),
            )
            .await?;
        Ok(())
    }

    /// Sets an address's phase, as a driver reports its backend's state.
    async fn set_phase(&self, address: &str, phase: &str) -> Result<()> {
        let body = json!({"status": {"phase": phase}});
        self.addresses()
            .patch_status(address, &PatchParams::default(), &Patch::Merge(body))
            .await?;
        Ok(())
    }

    /// A Bound claim `claim` and the Service `service` of the suite's namespace naming it,
    /// once it shows the claim's addresses: (the address names, the IPs, the Service).
    async fn claim_on_service(
        &self,
        claim: &str,
        service: &str,
    ) -> Result<(Vec<String>, Vec<String>, Service)> {
        let (names, ips) = self.bound_claim(claim).await?;
        self.service(&self.ns, service, Some(claim)).await?;
        let shown = self.shows(&self.ns, service, &ips).await?;
        Ok((names, ips, shown))
    }

    /// A Bound claim of every family the class serves: (its address names, its IPs).
    async fn bound_claim(&self, name: &str) -> Result<(Vec<String>, Vec<String>)> {
        let family = if self.families().len() > 1 {
            "Dual"
        } else {
            self.families().first().map_or("IPv4", |f| f.as_str())
        };
        self.claim(
            name,
            json!({"className": self.class.name_any(), "family": family}),
        )
        .await?;
        let c = self.bound(name).await?;
        let listed = &c.status.as_ref().context("status")?.addresses;
        Ok((
            listed.iter().map(|a| a.name.clone()).collect(),
            listed.iter().map(|a| a.address.clone()).collect(),
        ))
    }

    async fn delete_claim(&self, name: &str) -> Result<()> {
        self.claims().delete(name, &DeleteParams::default()).await?;
        let api = self.claims();
        until(&format!("claim {name} gone"), self.opts.timeout, || async {
            Ok(api.get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }

    async fn set_policy(&self, policy: ReclaimPolicy) -> Result<()> {
        self.classes()
            .patch(
                &self.class.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"reclaimPolicy": policy.as_str()}})),
            )
            .await?;
        Ok(())
    }

    /// The claim's addresses are one per family it asked for, made the way the protocol
    /// says.
    async fn check_provisioned(&self, c: &IPAddressClaim) -> Result<()> {
        let name = c.name_any();
        let mine = self.naming(&name).await?;
        let mut per_family: BTreeMap<Family, Vec<String>> = BTreeMap::new();
        for a in &mine {
            let f = family_of(&a.spec.address).map_err(|e| anyhow!("{}: {e}", a.name_any()))?;
            per_family.entry(f).or_default().push(a.name_any());
            let r = a.spec.claim_ref.as_ref().unwrap();
            if r.uid != c.metadata.uid {
                bail!("{} is pre-bound without the claim's uid", a.name_any());
            }
            if a.spec.class_name != self.class.name_any() {
                bail!("{} has class {}", a.name_any(), a.spec.class_name);
            }
        }
        for f in c.spec.family.families() {
            match per_family.get(f).map(Vec::len) {
                Some(1) => {}
                Some(n) => bail!("{n} {f} addresses name claim {name}: {:?}", per_family[f]),
                None => bail!("no {f} address names claim {name}"),
            }
        }
        Ok(())
    }

    async fn invariants(&self) -> Result<()> {
        let scope = Scope::of(&[self.ns.as_str()], &[self.class.name_any().as_str()]);
        let report = invariants::check(&self.client, &scope, Duration::from_secs(3), &[]).await?;
        if !report.ok() {
            bail!("invariants:\n{}", report.table());
        }
        Ok(())
    }

    /// Families the class has capacity for.
    /// A barrier on the driver, for the cases that check that it did *not* do something:
    /// a fresh claim of the class, created now, provisioned and then removed with its
    /// addresses. The driver saw every earlier change before this claim (one watch, in
    /// order), so once it has served it, it has had its turn at what the case set up — and
    /// a stopped or stuck driver fails here instead of passing the check unobserved.
    async fn driver_barrier(&self, tag: &str) -> Result<()> {
        let name = format!("barrier-{tag}-{}", self.sfx);
        let family = self.families().first().map_or("IPv4", |f| f.as_str());
        self.claim(
            &name,
            json!({"className": self.class.name_any(), "family": family}),
        )
        .await?;
        self.bound(&name).await?;
        let made = self.naming(&name).await?;
        self.claims()
            .delete(&name, &DeleteParams::default())
            .await?;
        let api = self.claims();
        until(
            &format!("barrier claim {name} gone"),
            self.opts.timeout,
            || async { Ok(api.get_opt(&name).await?.is_none().then_some(())) },
        )
        .await?;
        // Under Retain the released address would keep a slot of the small class.
        let addresses = self.addresses();
        for a in &made {
            let _ = addresses
                .delete(&a.name_any(), &DeleteParams::default())
                .await;
        }
        until(
            &format!("barrier {name}'s addresses gone"),
            self.opts.timeout,
            || async {
                for a in &made {
                    if addresses.get_opt(&a.name_any()).await?.is_some() {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await
    }

    fn families(&self) -> Vec<Family> {
        [Family::IPv4, Family::IPv6]
            .into_iter()
            .filter(|f| capacity(&self.class, *f) > 0)
            .collect()
    }
}

type CaseFn = for<'a> fn(
    &'a mut Suite<'_>,
) -> Pin<Box<dyn Future<Output = Result<Option<String>>> + Send + 'a>>;

/// Runs every case in order against `opts.class`.
pub async fn run(client: &Client, opts: &Options) -> Result<Report> {
    let classes: Api<IPAddressClass> = Api::all(client.clone());
    let class = classes
        .get(&opts.class)
        .await
        .with_context(|| format!("class {}", opts.class))?;
    let original_policy = class.spec.reclaim_policy;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = format!("driver-conformance-{}", random_suffix());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let mut suite = Suite {
        client: client.clone(),
        ns: ns.clone(),
        opts,
        class,
        sfx: random_suffix(),
        note: None,
    };
    let cases: Vec<(&'static str, CaseFn)> = vec![
        ("capacity", |s| Box::pin(capacity_case(s))),
        ("provision-ipv4", |s| Box::pin(provision(s, "IPv4"))),
        ("provision-ipv6", |s| Box::pin(provision(s, "IPv6"))),
        ("provision-dual", |s| Box::pin(provision(s, "Dual"))),
        ("pinned-left-alone", |s| Box::pin(pinned(s))),
        ("lost-left-alone", |s| Box::pin(lost(s))),
        ("invalid-parameters", |s| Box::pin(invalid_parameters(s))),
        ("exhaustion", |s| Box::pin(exhaustion(s))),
        ("retain-keeps", |s| Box::pin(retain_keeps(s))),
        ("restart-mid-provision", |s| Box::pin(restart(s))),
        ("race-with-the-core", |s| Box::pin(race(s))),
        ("associate", |s| Box::pin(associate(s))),
        ("one-claim-one-service", |s| {
            Box::pin(one_claim_one_service(s))
        }),
        ("own-namespace", |s| Box::pin(own_namespace(s))),
        ("withdraw", |s| Box::pin(withdraw(s))),
        ("conflict", |s| Box::pin(conflict(s))),
        ("conflict-forged-record", |s| {
            Box::pin(conflict_forged_record(s))
        }),
        ("share-by-port", |s| Box::pin(share_by_port(s))),
        ("share-by-grant", |s| Box::pin(share_by_grant(s))),
    ];
    let mut results = Vec::new();
    for (case, f) in cases {
        let outcome = match f(&mut suite).await {
            Ok(skipped) => CaseResult {
                case,
                outcome: Ok(()),
                skipped,
                note: suite.note.take(),
            },
            Err(e) => CaseResult {
                case,
                outcome: Err(format!("{e:#}")),
                skipped: None,
                note: suite.note.take(),
            },
        };
        results.push(outcome);
        // Each case leaves the pool as it found it.
        let _ = suite.set_policy(original_policy).await;
        let _ = clear_services(&suite).await;
        let _ = clear_claims(&suite).await;
    }
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    Ok(Report { cases: results })
}

/// Deletes the suite's claims and waits until they and every address of the class being
/// deleted are gone; Released addresses of the suite's claims are deleted too (the suite
/// played admin).
async fn clear_claims(s: &Suite<'_>) -> Result<()> {
    let api = s.claims();
    for c in api.list(&ListParams::default()).await?.items {
        let _ = api.delete(&c.name_any(), &DeleteParams::default()).await;
    }
    until("the suite's claims gone", s.opts.timeout, || async {
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    for a in s.addresses().list(&ListParams::default()).await?.items {
        let ours = a
            .spec
            .claim_ref
            .as_ref()
            .is_some_and(|r| r.namespace == s.ns)
            || a.name_any().contains(&s.sfx);
        if ours {
            let _ = s
                .addresses()
                .patch(
                    &a.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"claimRef": null}})),
                )
                .await;
            let _ = s
                .addresses()
                .delete(&a.name_any(), &DeleteParams::default())
                .await;
        }
    }
    // A claim is gone before its address is: the address goes behind the driver's finalizer
    // (the MetalLB driver's once MetalLB let go of its hold). The next case counts the pool's
    // free addresses (`fill`); one still being deleted would count as taken and be free a
    // moment later — its waiting claim then bound, not Exhausted.
    let class = s.class.name_any();
    until(
        "the class's addresses being deleted gone",
        s.opts.timeout,
        || async {
            let deleting = s
                .addresses()
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|a| a.spec.class_name == class && a.metadata.deletion_timestamp.is_some())
                .count();
            Ok((deleting == 0).then_some(()))
        },
    )
    .await?;
    Ok(())
}

async fn capacity_case(s: &mut Suite<'_>) -> Result<Option<String>> {
    // A class just created may not have been seen by its driver yet.
    let classes = s.classes();
    let name = s.class.name_any();
    until(
        "the driver to publish ParametersValid",
        s.opts.timeout,
        || async {
            let c = classes.get(&name).await?;
            Ok(condition(&c, driver::PARAMETERS_VALID).map(|_| ()))
        },
    )
    .await?;
    s.refresh_class().await?;
    let valid = condition(&s.class, driver::PARAMETERS_VALID).map(|c| c.status.clone());
    if valid.as_deref() != Some("True") {
        bail!("ParametersValid is {valid:?}");
    }
    if s.families().is_empty() {
        bail!(
            "status.capacity reports no family: {:?}",
            s.class.status.as_ref().and_then(|x| x.capacity.as_ref())
        );
    }
    Ok(None)
}

async fn provision(s: &mut Suite<'_>, family: &str) -> Result<Option<String>> {
    let need: Vec<Family> =
        serde_json::from_value::<address_controller_api::ClaimFamily>(json!(family))?
            .families()
            .to_vec();
    if need.iter().any(|f| !s.families().contains(f)) {
        return Ok(Some(format!("the class has no capacity for {family}")));
    }
    let name = format!("{}-{}", family.to_lowercase(), s.sfx);
    s.claim(
        &name,
        json!({"className": s.class.name_any(), "family": family}),
    )
    .await?;
    let c = s.bound(&name).await?;
    s.check_provisioned(&c).await?;
    for a in s.naming(&name).await? {
        if a.spec.reclaim_policy != s.class.spec.reclaim_policy {
            bail!(
                "{} has reclaimPolicy {:?}, the class {:?}",
                a.name_any(),
                a.spec.reclaim_policy,
                s.class.spec.reclaim_policy
            );
        }
    }
    s.invariants().await?;
    Ok(None)
}

async fn pinned(s: &mut Suite<'_>) -> Result<Option<String>> {
    let name = format!("pinned-{}", s.sfx);
    s.claim(
        &name,
        json!({"className": s.class.name_any(), "addressName": format!("nowhere-{}", s.sfx)}),
    )
    .await?;
    // The core says it waits for that address; the driver must not provision meanwhile.
    s.claim_reason(&name, "WaitingForAddress").await?;
    s.driver_barrier("pinned").await?;
    let made = s.naming(&name).await?;
    if !made.is_empty() {
        bail!(
            "the driver made {:?} for a pinned claim",
            made.iter().map(|a| a.name_any()).collect::<Vec<_>>()
        );
    }
    Ok(None)
}

async fn lost(s: &mut Suite<'_>) -> Result<Option<String>> {
    let Some(f) = s.families().first().copied() else {
        return Ok(Some("no capacity".into()));
    };
    let name = format!("lost-{}", s.sfx);
    s.claim(
        &name,
        json!({"className": s.class.name_any(), "family": f.as_str()}),
    )
    .await?;
    s.bound(&name).await?;
    let a = s.naming(&name).await?.remove(0);
    let original = s.class.spec.parameters.clone();
    match &s.opts.lose_parameters {
        // The backend loses the address (a shrunk range): the driver must say so.
        Some(params) => {
            s.set_parameters(params.clone()).await?;
            s.phase_is(&a.name_any(), address_controller_api::AddressPhase::Lost)
                .await?;
            s.event_in("default", &a.name_any(), driver::ADDRESS_LOST)
                .await?;
        }
        // A driver reports Lost when the backend lost the address; here the suite does.
        None => {
            s.set_phase(&a.name_any(), "Lost").await?;
        }
    }
    s.claim_phase(&name, ClaimPhase::Lost).await?;
    s.driver_barrier("lost").await?;
    let now = s.naming(&name).await?;
    if now.len() != 1 {
        bail!(
            "a Lost claim got a replacement: {:?}",
            now.iter().map(|a| a.name_any()).collect::<Vec<_>>()
        );
    }
    // Recovery: the backend has the address again.
    match &s.opts.lose_parameters {
        Some(_) => {
            s.set_parameters(original.clone().unwrap_or_default())
                .await?;
        }
        None => {
            s.set_phase(&a.name_any(), "Bound").await?;
        }
    }
    s.bound(&name).await?;
    Ok(None)
}

async fn invalid_parameters(s: &mut Suite<'_>) -> Result<Option<String>> {
    let Some(params) = s.opts.invalid_parameters.clone() else {
        return Ok(Some("no --invalid-parameters given".into()));
    };
    let name = format!("invalid-{}", s.sfx);
    s.classes()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"provisioner": s.class.spec.provisioner, "parameters": params}}))?,
        )
        .await?;
    let result = async {
        let classes = s.classes();
        let reason = until("ParametersValid=False", s.opts.timeout, || async {
            let c = classes.get(&name).await?;
            Ok(condition(&c, driver::PARAMETERS_VALID)
                .filter(|c| c.status == "False")
                .map(|c| c.message.clone()))
        })
        .await?;
        if reason.is_empty() {
            bail!("ParametersValid=False without a reason");
        }
        let claim = format!("on-invalid-{}", s.sfx);
        s.claim(&claim, json!({"className": name})).await?;
        s.event(&claim, driver::INVALID_CLASS_PARAMETERS).await?;
        if !s.naming(&claim).await?.is_empty() {
            bail!("an address was made from a class with invalid parameters");
        }
        Ok(None)
    }
    .await;
    let _ = clear_claims(s).await;
    let _ = s.classes().delete(&name, &DeleteParams::default()).await;
    result
}

/// Fills a small class's first family; returns the claims made, or why not.
async fn fill(s: &mut Suite<'_>, prefix: &str) -> Result<Result<(Family, Vec<String>), String>> {
    s.refresh_class().await?;
    let Some(f) = s.families().first().copied() else {
        return Ok(Err("no capacity".into()));
    };
    let cap = capacity(&s.class, f);
    if cap > 16 {
        return Ok(Err(format!(
            "the class holds {cap} {f} addresses; exhaustion is tried on classes of at most 16"
        )));
    }
    let used = s
        .addresses()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|a| {
            a.spec.class_name == s.class.name_any() && family_of(&a.spec.address).ok() == Some(f)
        })
        .count() as i64;
    let mut names = Vec::new();
    for i in 0..(cap - used) {
        let name = format!("{prefix}{i}-{}", s.sfx);
        s.claim(
            &name,
            json!({"className": s.class.name_any(), "family": f.as_str()}),
        )
        .await?;
        names.push(name);
    }
    for n in &names {
        s.bound(n).await?;
    }
    Ok(Ok((f, names)))
}

async fn exhaustion(s: &mut Suite<'_>) -> Result<Option<String>> {
    s.set_policy(ReclaimPolicy::Delete).await?;
    let (f, names) = match fill(s, "full").await? {
        Ok(x) => x,
        Err(why) => return Ok(Some(why)),
    };
    let extra = format!("extra-{}", s.sfx);
    s.claim(
        &extra,
        json!({"className": s.class.name_any(), "family": f.as_str()}),
    )
    .await?;
    s.event(&extra, driver::EXHAUSTED_EVENT).await?;
    let classes = s.classes();
    let class_name = s.class.name_any();
    until("the class Exhausted", s.opts.timeout, || async {
        let c = classes.get(&class_name).await?;
        Ok(condition(&c, driver::EXHAUSTED)
            .is_some_and(|c| c.status == "True")
            .then_some(()))
    })
    .await?;
    // Recovery: a claim goes, its address (Delete) goes, the waiting claim gets one.
    s.delete_claim(&names[0]).await?;
    let c = s.bound(&extra).await?;
    s.check_provisioned(&c).await?;
    s.invariants().await?;
    Ok(None)
}

async fn retain_keeps(s: &mut Suite<'_>) -> Result<Option<String>> {
    s.set_policy(ReclaimPolicy::Retain).await?;
    let (f, names) = match fill(s, "kept").await? {
        Ok(x) => x,
        Err(why) => return Ok(Some(why)),
    };
    let gone = &names[0];
    let released = s.naming(gone).await?.remove(0).name_any();
    s.delete_claim(gone).await?;
    let waiting = format!("waiting-{}", s.sfx);
    s.claim(
        &waiting,
        json!({"className": s.class.name_any(), "family": f.as_str()}),
    )
    .await?;
    s.event(&waiting, driver::EXHAUSTED_EVENT).await?;
    // The Released address keeps its IP out of the pool...
    let a = s.addresses().get(&released).await?;
    if a.status.and_then(|st| st.phase) != Some(address_controller_api::AddressPhase::Released) {
        bail!("{released} is not Released under Retain");
    }
    // ...until an admin releases it: then the waiting claim gets it.
    s.addresses()
        .patch(
            &released,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"claimRef": null}})),
        )
        .await?;
    let c = s.bound(&waiting).await?;
    let got: Vec<String> = c
        .status
        .iter()
        .flat_map(|st| &st.addresses)
        .map(|a| a.name.clone())
        .collect();
    if got != [released.clone()] {
        bail!("the waiting claim got {got:?}, not the released {released}");
    }
    s.invariants().await?;
    Ok(None)
}

async fn restart(s: &mut Suite<'_>) -> Result<Option<String>> {
    let Some(restart) = s.opts.restart.as_ref() else {
        return Ok(Some("no restart command given".into()));
    };
    let families = s.families();
    let family = if families.len() == 2 {
        "Dual"
    } else {
        families.first().map(|f| f.as_str()).unwrap_or("IPv4")
    };
    let names: Vec<String> = (0..3).map(|i| format!("restart{i}-{}", s.sfx)).collect();
    for n in &names {
        s.claim(
            n,
            json!({"className": s.class.name_any(), "family": family}),
        )
        .await?;
    }
    restart().await?;
    // The positive control: the restart must land while provisioning is under way — some
    // claim still without an address when the old process is gone. Otherwise the case
    // proves nothing about a restart mid-provision and says so (skipped, not passed).
    let mut waiting = 0;
    for n in &names {
        if s.naming(n).await?.is_empty() {
            waiting += 1;
        }
    }
    for n in &names {
        let c = s.bound(n).await?;
        s.check_provisioned(&c).await?;
    }
    s.invariants().await?;
    if waiting == 0 {
        return Ok(Some(format!(
            "the restart landed after all {} claims were provisioned: nothing was tested (restart sooner, or slow the driver's creates)",
            names.len()
        )));
    }
    s.note = Some(format!(
        "restarted with {waiting} of {} claims not yet provisioned",
        names.len()
    ));
    Ok(None)
}

async fn race(s: &mut Suite<'_>) -> Result<Option<String>> {
    let Some(free_ip) = s.opts.race_address.clone() else {
        return Ok(Some("no --race-address given".into()));
    };
    let f = family_of(&free_ip).map_err(|e| anyhow!("--race-address: {e}"))?;
    let name = format!("race-{}", s.sfx);
    s.claim(
        &name,
        json!({"className": s.class.name_any(), "family": f.as_str()}),
    )
    .await?;
    // While the driver provisions, a free address of the class appears: the core binds it.
    s.claim_reason(&name, "WaitingForProvisioning").await?;
    let static_name = format!("race-free-{}", s.sfx);
    s.addresses()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": static_name}, "spec": {"address": free_ip, "className": s.class.name_any(), "source": {"fromClass": {}}}}))?,
        )
        .await?;
    let c = s.bound(&name).await?;
    // A create the driver decided on before the bind may still be on its way: once the
    // driver has served a later claim, it has landed (or was never sent).
    s.driver_barrier("race").await?;
    // Whoever won, one address per family per claim once things settle (a late create of
    // the driver is released as surplus).
    let api2 = s.claims();
    until("one address per family", s.opts.timeout, || async {
        let held: Vec<IPAddress> = s
            .naming(&name)
            .await?
            .into_iter()
            .filter(|a| {
                a.metadata.deletion_timestamp.is_none()
                    && a.status.as_ref().and_then(|st| st.phase)
                        != Some(address_controller_api::AddressPhase::Released)
            })
            .collect();
        Ok((held.len() == 1).then_some(()))
    })
    .await?;
    let c = api2.get(&c.name_any()).await?;
    let kept: Vec<String> = c
        .status
        .iter()
        .flat_map(|st| &st.addresses)
        .map(|a| a.name.clone())
        .collect();
    let others: Vec<String> = s
        .naming(&name)
        .await?
        .iter()
        .map(|a| a.name_any())
        .filter(|n| !kept.contains(n))
        .collect();
    s.note = Some(if kept == [static_name.clone()] && !others.is_empty() {
        format!(
            "the core bound the free address; the driver's late create ({}) was released as surplus",
            others.join(", ")
        )
    } else if kept == [static_name.clone()] {
        "the core bound the free address before the driver created one".into()
    } else {
        "the driver's address won; the free address stays free".into()
    });
    s.invariants().await?;
    Ok(None)
}

/// The addresses in a Service's `status.loadBalancer.ingress`.
/// `v`, sorted: the waits compare sets.
fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn ingress_of(s: &Service) -> Vec<String> {
    address_controller_api::service::ingress_ips(s)
        .map(str::to_string)
        .collect()
}

/// Deletes the suite's Services (and waits for them to go).
async fn clear_services(s: &Suite<'_>) -> Result<()> {
    let api = s.services_in(&s.ns);
    for svc in api.list(&ListParams::default()).await?.items {
        s.delete_service(&s.ns, &svc.name_any()).await?;
    }
    Ok(())
}

fn skip_association(s: &Suite<'_>) -> Option<Option<String>> {
    (!s.opts.associate).then(|| Some("no --associate given".to_string()))
}

async fn associate(s: &mut Suite<'_>) -> Result<Option<String>> {
    if let Some(skip) = skip_association(s) {
        return Ok(skip);
    }
    let claim = format!("assoc-{}", s.sfx);
    let (names, ips, _) = s.claim_on_service(&claim, "web").await?;
    let ns = s.ns.clone();
    s.associated(&names, Some((&ns, "web"))).await?;
    s.event("web", driver::ASSOCIATED).await?;
    // Deleted: the claim keeps its addresses; recreated: the same ones come back.
    s.delete_service(&ns, "web").await?;
    s.associated(&names, None).await?;
    s.service(&ns, "web", Some(&claim)).await?;
    s.shows(&ns, "web", &ips).await?;
    s.associated(&names, Some((&ns, "web"))).await?;
    s.invariants().await?;
    Ok(None)
}

async fn one_claim_one_service(s: &mut Suite<'_>) -> Result<Option<String>> {
    if let Some(skip) = skip_association(s) {
        return Ok(skip);
    }
    let claim = format!("one-{}", s.sfx);
    let (names, ips, _) = s.claim_on_service(&claim, "first").await?;
    let ns = s.ns.clone();
    s.service(&ns, "second", Some(&claim)).await?;
    s.event("second", driver::ASSOCIATION_REJECTED).await?;
    let second = s.services_in(&ns).get("second").await?;
    if ingress_of(&second).iter().any(|ip| ips.contains(ip)) {
        bail!("the second Service shows {:?}", ingress_of(&second));
    }
    // The holder gone: the second takes over.
    s.delete_service(&ns, "first").await?;
    s.shows(&ns, "second", &ips).await?;
    s.associated(&names, Some((&ns, "second"))).await?;
    s.invariants().await?;
    Ok(None)
}

/// A Bound claim of every family the class serves that shares its addresses with `sharing`.
async fn shared_claim(
    s: &Suite<'_>,
    name: &str,
    sharing: serde_json::Value,
) -> Result<(Vec<String>, Vec<String>)> {
    let (names, ips) = s.bound_claim(name).await?;
    s.claims()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sharing": sharing}})),
        )
        .await?;
    Ok((names, ips))
}

async fn share_by_port(s: &mut Suite<'_>) -> Result<Option<String>> {
    if let Some(skip) = skip_association(s) {
        return Ok(skip);
    }
    let claim = format!("share-{}", s.sfx);
    let (names, ips) = shared_claim(s, &claim, json!({"policy": "SameNamespace"})).await?;
    let ns = s.ns.clone();
    let key = |n: &str| format!("{ns}/{n}");
    s.service_on(&ns, "web", Some(&claim), 80).await?;
    s.shows(&ns, "web", &ips).await?;
    s.service_on(&ns, "tls", Some(&claim), 443).await?;
    s.shows(&ns, "tls", &ips).await?;
    s.attached(&ns, "tls", "True", sharing::reason::ATTACHED)
        .await?;
    s.holders(&names, &[key("web"), key("tls")]).await?;
    s.service_on(&ns, "clash", Some(&claim), 443).await?;
    s.attached(&ns, "clash", "False", sharing::reason::PORT_CONFLICT)
        .await?;
    let clash = s.services_in(&ns).get("clash").await?;
    if ingress_of(&clash).iter().any(|ip| ips.contains(ip)) {
        bail!("a Service on a used port shows {:?}", ingress_of(&clash));
    }
    // The first holder gone: the second keeps the addresses.
    s.delete_service(&ns, "web").await?;
    s.holders(&names, &[key("tls")]).await?;
    s.shows(&ns, "tls", &ips).await?;
    s.invariants().await?;
    Ok(None)
}

async fn share_by_grant(s: &mut Suite<'_>) -> Result<Option<String>> {
    if let Some(skip) = skip_association(s) {
        return Ok(skip);
    }
    let claim = format!("grant-{}", s.sfx);
    let (names, ips) = shared_claim(s, &claim, json!({"policy": "SameNamespace"})).await?;
    let ns = s.ns.clone();
    let other = format!("{}-grant", s.ns);
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other}}))?,
        )
        .await?;
    let result = async {
        s.service_on(&ns, "web", Some(&claim), 80).await?;
        s.shows(&ns, "web", &ips).await?;
        let reference = format!("{ns}/{claim}");
        s.service_on(&other, "front", Some(&reference), 443).await?;
        s.attached(&other, "front", "False", sharing::reason::NOT_SHARED)
            .await?;
        let front = s.services_in(&other).get("front").await?;
        if !ingress_of(&front).is_empty() {
            bail!("a Service without the grant shows {:?}", ingress_of(&front));
        }
        let grant = |policy: &str, list: serde_json::Value| {
            Patch::Merge(json!({"spec": {"sharing": {"policy": policy, "namespaces": list}}}))
        };
        s.claims()
            .patch(
                &claim,
                &PatchParams::default(),
                &grant("Namespaces", json!([other])),
            )
            .await?;
        s.shows(&other, "front", &ips).await?;
        s.holders(&names, &[format!("{ns}/web"), format!("{other}/front")])
            .await?;
        s.claims()
            .patch(
                &claim,
                &PatchParams::default(),
                &grant("SameNamespace", json!(null)),
            )
            .await?;
        s.shows(&other, "front", &[]).await?;
        s.holders(&names, &[format!("{ns}/web")]).await?;
        s.shows(&ns, "web", &ips).await?;
        s.invariants().await
    }
    .await;
    let _ = s.delete_service(&other, "front").await;
    let _ = namespaces.delete(&other, &DeleteParams::default()).await;
    result?;
    Ok(None)
}

async fn own_namespace(s: &mut Suite<'_>) -> Result<Option<String>> {
    if let Some(skip) = skip_association(s) {
        return Ok(skip);
    }
    let claim = format!("own-{}", s.sfx);
    let (names, _) = s.bound_claim(&claim).await?;
    let other = format!("{}-other", s.ns);
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other}}))?,
        )
        .await?;
    let result = async {
        s.service(&other, "web", Some(&claim)).await?;
        s.event_in(&other, "web", driver::CLAIM_NOT_FOUND).await?;
        let svc = s.services_in(&other).get("web").await?;
        if !ingress_of(&svc).is_empty() {
            bail!(
                "a Service of another namespace shows {:?}",
                ingress_of(&svc)
            );
        }
        s.associated(&names, None).await
    }
    .await;
    let _ = namespaces.delete(&other, &DeleteParams::default()).await;
    result?;
    Ok(None)
}

async fn withdraw(s: &mut Suite<'_>) -> Result<Option<String>> {
    if let Some(skip) = skip_association(s) {
        return Ok(skip);
    }
    let claim = format!("wd-{}", s.sfx);
    let (names, _, _) = s.claim_on_service(&claim, "web").await?;
    let ns = s.ns.clone();
    s.services_in(&ns)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: null}}})),
        )
        .await?;
    s.shows(&ns, "web", &[]).await?;
    s.associated(&names, None).await?;
    s.bound(&claim).await?;
    s.invariants().await?;
    Ok(None)
}

async fn conflict(s: &mut Suite<'_>) -> Result<Option<String>> {
    thief(s, "cf", false).await
}

/// The thief carries a forged record of the kit's (the rightful Service's
/// `*.drivers.local.sdn.cozystack.io/pinned` annotation, naming the stolen address): the
/// ledger alone says who may show an address, so it is a thief all the same.
async fn conflict_forged_record(s: &mut Suite<'_>) -> Result<Option<String>> {
    thief(s, "cff", true).await
}

async fn thief(s: &mut Suite<'_>, prefix: &str, forge: bool) -> Result<Option<String>> {
    if let Some(skip) = skip_association(s) {
        return Ok(skip);
    }
    let claim = format!("{prefix}-{}", s.sfx);
    let (names, ips, web) = s.claim_on_service(&claim, "web").await?;
    let ns = s.ns.clone();
    // Another load balancer's Service shows the first address.
    let mut records: BTreeMap<String, String> = web
        .annotations()
        .keys()
        .filter(|k| k.ends_with(".drivers.local.sdn.cozystack.io/pinned"))
        .map(|k| (k.clone(), ips[0].clone()))
        .collect();
    if records.is_empty() {
        records.insert(
            "conformance.drivers.local.sdn.cozystack.io/pinned".into(),
            ips[0].clone(),
        );
    }
    let annotations = if forge { records } else { BTreeMap::new() };
    let thief = json!({"metadata": {"name": "thief", "annotations": annotations},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "conformance.test/thief",
        "ports": [{"port": 80}]}});
    let api = s.services_in(&ns);
    api.create(&PostParams::default(), &serde_json::from_value(thief)?)
        .await?;
    api.patch_status(
        "thief",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": ips[0]}]}}})),
    )
    .await?;
    if forge {
        // Either the address turns Conflict, or the driver — taking the record on the
        // thief at its word — withdraws "its" pin from the thief (a driver that is the load
        // balancer clears the thief's status): the thief does not keep the address
        // unjudged, and the rightful Service keeps it throughout.
        let addresses: Api<IPAddress> = Api::all(s.client.clone());
        until(
            "the forged thief Conflict, or withdrawn",
            s.opts.timeout,
            || async {
                let a = addresses.get(&names[0]).await?;
                let shown = api.get("thief").await?;
                let shows =
                    address_controller_api::service::ingress_ips(&shown).any(|ip| ip == ips[0]);
                Ok(
                    (a.phase() == Some(address_controller_api::AddressPhase::Conflict) || !shows)
                        .then_some(()),
                )
            },
        )
        .await?;
    } else {
        s.phase_is(&names[0], address_controller_api::AddressPhase::Conflict)
            .await?;
        s.event("thief", driver::CONFLICT).await?;
    }
    s.shows(&ns, "web", &ips).await?;
    s.bound(&claim).await?;
    s.delete_service(&ns, "thief").await?;
    s.phase_is(&names[0], address_controller_api::AddressPhase::Bound)
        .await?;
    s.invariants().await?;
    Ok(None)
}
