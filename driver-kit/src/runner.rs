//! The runner: the driver protocol of SPEC §8 around a [`Driver`].
//!
//! * **Which claims.** Stamped with this provisioner, of a class whose provisioner it is,
//!   `Pending` with the core's `WaitingForProvisioning`, not pinned, not being deleted. Per
//!   family, only when neither the claim's status nor any address naming the claim (in the
//!   cache, or created by this process and not in the cache yet) has that family — a driver
//!   never creates a second address for a family (SPEC §5.7).
//! * **Creating.** One IPAddress per missing family, named by the allocation (by default
//!   after the address, so the create is the lock), `claimRef` pre-set with the claim's uid,
//!   `className`, `reclaimPolicy` copied from the class, the allocation's `source`, and the
//!   driver's finalizer if it has one. A `Dual` claim gets both families or neither. A name
//!   collision with an address already made for this claim (a restart) is success; with
//!   another, the address is taken: allocate again.
//! * **Classes.** `status.capacity`, and the conditions `ParametersValid` and `Exhausted`.
//!   Bad parameters: a Warning on the class once, `InvalidClassParameters` on its claims.
//! * **Teardown.** With a finalizer, an address being deleted is released in the backend,
//!   then the finalizer goes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use address_controller_api::conditions::set_condition;
use address_controller_api::family::family_of;
use address_controller_api::names::PROVISIONER_ANNOTATION;
use address_controller_api::{Family, IPAddress, IPAddressClaim, IPAddressClass, IPAddressSpec};
use address_controller_runtime::events::{Events, PlannedEvent};
use address_controller_runtime::queue::{Backoff, Queue};
use address_controller_runtime::workers::{Gate, Outcome, PassError, Retry};
use address_controller_runtime::world::World;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::driver::{AllocateError, Allocation, Driver, Request, object_name};
use crate::inventory::Inventory;
use crate::services::ServiceIndex;

/// Event reasons and class conditions the runner publishes (SPEC §8).
pub use address_controller_api::names::driver as events;

/// How long an address this process created is assumed to be on its way into the cache.
const IN_FLIGHT_FOR: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} is taken; allocating again")]
    Taken(String),
    #[error("allocating for {claim}: {message}")]
    Allocate { claim: String, message: String },
    #[error("the backend on {object}: {message}")]
    Backend { object: String, message: String },
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        source: kube::Error,
    },
}

impl PassError for Error {
    fn retry(&self) -> Retry {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 404 => Retry::Never,
            _ => Retry::Backoff,
        }
    }
    fn category(&self) -> &'static str {
        match self {
            Error::Taken(_) => "conflict",
            Error::Allocate { .. } => "allocate",
            Error::Backend { .. } => "backend",
            Error::Kube { .. } => "api",
        }
    }
}

type Params<D> = Result<Arc<<D as Driver>::Params>, String>;
/// Parsed parameters of every class of the driver, by class name.
type AllParams<D> = Arc<HashMap<String, Params<D>>>;

pub(crate) struct Queues {
    pub claims: Arc<Queue<String>>,
    pub classes: Arc<Queue<String>>,
    pub addresses: Arc<Queue<String>>,
    pub services: Arc<Queue<String>>,
}

pub(crate) struct Ctx<D: Driver> {
    pub driver: D,
    pub client: Client,
    pub world: World,
    pub inventory: Inventory,
    pub services: ServiceIndex,
    /// The Service annotation that records the kit's pins ([`names::driver::pinned_annotation`]).
    pub marker: String,
    pub gate: Gate,
    pub events: Events,
    pub queues: Queues,
    /// Parsed parameters of this driver's classes; `None` after a class changed.
    params: Mutex<Option<AllParams<D>>>,
    /// (claim uid, family) → when this process created an address for it.
    in_flight: Mutex<HashMap<(String, Family), Instant>>,
    /// Addresses this process is creating (or lost a create race for) right now.
    in_flight_ips: Mutex<HashMap<IpAddr, Instant>>,
    /// Testing only: pause between deciding to create and creating, to let tests race a
    /// free address against the create.
    pub create_delay: Option<Duration>,
}

fn fresh<K: std::hash::Hash + Eq + Clone>(
    m: &Mutex<HashMap<K, Instant>>,
) -> std::sync::MutexGuard<'_, HashMap<K, Instant>> {
    let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
    g.retain(|_, at| at.elapsed() < IN_FLIGHT_FOR);
    g
}

impl<D: Driver> Ctx<D> {
    pub fn new(
        driver: D,
        client: Client,
        world: World,
        gate: Gate,
        controller: &str,
        instance: String,
    ) -> Self {
        Ctx {
            events: Events::new(client.clone(), controller, instance),
            driver,
            client,
            world,
            inventory: Inventory::default(),
            services: ServiceIndex::default(),
            marker: address_controller_api::names::driver::pinned_annotation(controller),
            gate,
            queues: Queues {
                claims: Arc::new(Queue::new(Backoff::default())),
                classes: Arc::new(Queue::new(Backoff::default())),
                addresses: Arc::new(Queue::new(Backoff::default())),
                services: Arc::new(Queue::new(Backoff::default())),
            },
            params: Mutex::new(None),
            in_flight: Mutex::new(HashMap::new()),
            in_flight_ips: Mutex::new(HashMap::new()),
            create_delay: None,
        }
    }

    pub fn ours(&self, class: &IPAddressClass) -> bool {
        class.spec.provisioner == self.driver.provisioner()
    }

    /// Whether an address is of one of this driver's classes (ownership is by the
    /// address's class, never by a claim's stamp).
    pub fn owns(&self, a: &IPAddress) -> bool {
        self.world
            .classes
            .get(&a.spec.class_name)
            .is_some_and(|c| self.ours(&c))
    }

    /// This driver's classes, by name.
    pub fn our_classes(&self) -> Vec<Arc<IPAddressClass>> {
        let mut v: Vec<_> = self
            .world
            .classes()
            .into_iter()
            .filter(|c| self.ours(c))
            .collect();
        v.sort_by_key(|c| c.name_any());
        v
    }

    /// The parsed parameters of class `name`, if it is one of ours.
    pub fn params(&self, name: &str) -> Option<Params<D>> {
        let mut cache = self.params.lock().unwrap_or_else(PoisonError::into_inner);
        let all = match &*cache {
            Some(all) => all.clone(),
            None => {
                let classes = self.our_classes();
                let parsed = self.driver.parameters(&classes);
                let all: AllParams<D> = Arc::new(
                    classes
                        .iter()
                        .zip(parsed)
                        .map(|(c, p)| (c.name_any(), p.map(Arc::new)))
                        .collect(),
                );
                *cache = Some(all.clone());
                all
            }
        };
        all.get(name).cloned()
    }

    /// The cache shows `a`: what this process created for it is no longer in flight.
    pub fn landed(&self, a: &IPAddress) {
        if let Ok(ip) = address_controller_api::family::parse_address(&a.spec.address) {
            fresh(&self.in_flight_ips).remove(&ip);
            let family = address_controller_api::family::family_of_ip(ip);
            if let Some(uid) = a.spec.claim_ref.as_ref().and_then(|r| r.uid.clone()) {
                fresh(&self.in_flight).remove(&(uid, family));
            }
        }
    }

    pub fn classes_changed(&self) {
        *self.params.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Whether a claim is stamped with this driver's provisioner.
    pub fn stamped(&self, c: &IPAddressClaim) -> bool {
        c.annotations()
            .get(PROVISIONER_ANNOTATION)
            .map(String::as_str)
            == Some(self.driver.provisioner())
    }
}

/// What a claim needs from this driver: its class and the families to provision.
pub(crate) fn wanted<D: Driver>(
    ctx: &Ctx<D>,
    claim: &IPAddressClaim,
    key: &str,
) -> Option<(Arc<IPAddressClass>, Vec<Family>)> {
    // Only a claim the core invited: Pending and waiting for provisioning — not before its
    // first pass, not Bound, never Lost, never refused for an entitlement (SPEC §13: the
    // core counts the invitation against the namespace's quota).
    if !ctx.stamped(claim) || !claim.waits_for_provisioning() {
        return None;
    }
    let status = claim.status.as_ref()?;
    let class = ctx.world.classes.get(status.class_name.as_deref()?)?;
    if !ctx.ours(&class) {
        return None;
    }
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    // What this process created is read before the addresses naming the claim: the cache's
    // handler indexes a new address before it ends its time in flight, so one of the two
    // always shows it (read the other way round, a pass between the two could miss both
    // and provision the family twice).
    let in_flight: Vec<Family> = fresh(&ctx.in_flight)
        .keys()
        .filter(|(u, _)| *u == uid)
        .map(|(_, f)| *f)
        .collect();
    let mut have: Vec<Family> = status
        .addresses
        .iter()
        .filter_map(|a| family_of(&a.address).ok())
        .collect();
    for name in ctx.inventory.addresses_naming(key) {
        if let Some(a) = ctx.world.addresses.get(&name)
            && a.metadata.deletion_timestamp.is_none()
            && a.belongs_to(claim)
            && let Ok(f) = family_of(&a.spec.address)
        {
            have.push(f);
        }
    }
    let missing: Vec<Family> = claim
        .spec
        .family
        .families()
        .iter()
        .copied()
        .filter(|f| !have.contains(f) && !in_flight.contains(f))
        .collect();
    (!missing.is_empty()).then_some((class, missing))
}

/// One pass over a claim.
pub(crate) async fn claim_pass<D: Driver>(ctx: Arc<Ctx<D>>, key: String) -> Result<Outcome, Error> {
    let Some(claim) = ctx.world.claims.get(&key) else {
        return Ok(Outcome::Done);
    };
    let Some((class, missing)) = wanted(&ctx, &claim, &key) else {
        ctx.events.publish_once(claim.as_ref(), None).await;
        return Ok(Outcome::Done);
    };
    let class_name = class.name_any();
    let params = match ctx.params(&class_name) {
        Some(Ok(p)) => p,
        Some(Err(why)) => {
            let ev = PlannedEvent::warning(
                events::INVALID_CLASS_PARAMETERS,
                format!("class {class_name:?} cannot be allocated from: {why}"),
            );
            ctx.events.publish_once(claim.as_ref(), Some(&ev)).await;
            return Ok(Outcome::Done);
        }
        None => return Ok(Outcome::Done),
    };
    // Allocate every missing family first: a Dual claim gets both or neither.
    let mut chosen: Vec<(Family, Allocation)> = Vec::new();
    let mut exhausted: Vec<Family> = Vec::new();
    for f in &missing {
        let taken: Vec<IpAddr> = chosen.iter().map(|(_, a)| a.address).collect();
        let busy: Vec<IpAddr> = fresh(&ctx.in_flight_ips).keys().copied().collect();
        let inventory = &ctx.inventory;
        let in_use =
            move |ip: IpAddr| inventory.in_use(ip) || taken.contains(&ip) || busy.contains(&ip);
        let req = Request {
            class: &class,
            params: params.as_ref(),
            claim: &claim,
            family: *f,
            in_use: &in_use,
        };
        match ctx.driver.allocate(req).await {
            Ok(a) => chosen.push((*f, a)),
            Err(AllocateError::Exhausted) => exhausted.push(*f),
            Err(AllocateError::Failed(message)) => {
                let ev = PlannedEvent::warning(events::PROVISIONING_FAILED, message.clone());
                ctx.events.publish_once(claim.as_ref(), Some(&ev)).await;
                return Err(Error::Allocate {
                    claim: key,
                    message,
                });
            }
        }
    }
    if !exhausted.is_empty() {
        ctx.inventory.exhausted(&class_name, &key);
        let families: Vec<&str> = exhausted.iter().map(|f| f.as_str()).collect();
        let ev = PlannedEvent::warning(
            events::EXHAUSTED_EVENT,
            format!(
                "no free {} address left in class {class_name:?}; waiting for one to be freed",
                families.join(" and ")
            ),
        );
        ctx.events.publish_once(claim.as_ref(), Some(&ev)).await;
        return Ok(Outcome::Done);
    }
    if let Some(d) = ctx.create_delay {
        tokio::time::sleep(d).await;
    }
    let api: Api<IPAddress> = Api::all(ctx.client.clone());
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    for (f, a) in chosen {
        let name = a.name.clone().unwrap_or_else(|| object_name(a.address));
        let address = provisioned(
            &name,
            &a,
            &class,
            &claim,
            ctx.driver.provisioner(),
            ctx.driver.finalizer(),
        );
        fresh(&ctx.in_flight_ips).insert(a.address, Instant::now());
        match api.create(&PostParams::default(), &address).await {
            Ok(_) => {
                tracing::info!(claim = %key, address = %a.address, %name, "provisioned");
                fresh(&ctx.in_flight).insert((uid.clone(), f), Instant::now());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Made by an earlier life of this process for this claim: done. Otherwise
                // someone holds this address: allocate again.
                let existing = api.get_opt(&name).await.ok().flatten();
                let mine = existing.as_ref().is_some_and(|e| e.belongs_to(&claim));
                if !mine {
                    return Err(Error::Taken(name));
                }
                fresh(&ctx.in_flight).insert((uid.clone(), f), Instant::now());
            }
            Err(source) => {
                fresh(&ctx.in_flight_ips).remove(&a.address);
                return Err(Error::Kube {
                    action: "creating",
                    object: name,
                    source,
                });
            }
        }
    }
    ctx.events.publish_once(claim.as_ref(), None).await;
    Ok(Outcome::Done)
}

/// The IPAddress a driver creates for an allocation (SPEC §8): named `name`, pre-bound to
/// the claim with its uid, of the claim's class with the class's reclaim policy, the
/// allocation's source, marked as provisioned by `provisioner`, with the driver's finalizer
/// if it has one.
pub(crate) fn provisioned(
    name: &str,
    a: &Allocation,
    class: &IPAddressClass,
    claim: &IPAddressClaim,
    provisioner: &str,
    finalizer: Option<&str>,
) -> IPAddress {
    IPAddress {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            finalizers: finalizer.map(|f| vec![f.to_string()]),
            annotations: Some(std::collections::BTreeMap::from([(
                address_controller_api::names::PROVISIONED_BY_ANNOTATION.to_string(),
                provisioner.to_string(),
            )])),
            ..Default::default()
        },
        spec: IPAddressSpec {
            address: a.address.to_string(),
            class_name: class.name_any(),
            reclaim_policy: class.spec.reclaim_policy,
            claim_ref: Some(claim.claim_ref()),
            source: a.source.clone(),
        },
        status: None,
    }
}

/// One pass over a class: capacity and conditions.
pub(crate) async fn class_pass<D: Driver>(
    ctx: Arc<Ctx<D>>,
    name: String,
) -> Result<Outcome, Error> {
    let Some(class) = ctx.world.classes.get(&name) else {
        return Ok(Outcome::Done);
    };
    if !ctx.ours(&class) {
        return Ok(Outcome::Done);
    }
    let Some(parsed) = ctx.params(&name) else {
        return Ok(Outcome::Done);
    };
    let now = Time(Timestamp::now());
    let generation = class.metadata.generation;
    let mut status = class.status.clone().unwrap_or_default();
    match parsed {
        Ok(params) => {
            ctx.driver
                .sync_class(&ctx.client, &class, &params)
                .await
                .map_err(|message| Error::Backend {
                    object: format!("class {name}"),
                    message,
                })?;
            let cap = ctx.driver.capacity(&params);
            status.capacity = Some(address_controller_api::Capacity {
                ipv4: Some(cap.ipv4),
                ipv6: Some(cap.ipv6),
            });
            set_condition(
                &mut status.conditions,
                events::PARAMETERS_VALID,
                true,
                "Valid",
                ctx.driver.describe(&params),
                generation,
                &now,
            );
            let full: Vec<&str> = [Family::IPv4, Family::IPv6]
                .into_iter()
                .filter(|f| cap.of(*f) > 0 && ctx.inventory.count(&name, *f) >= cap.of(*f))
                .map(Family::as_str)
                .collect();
            let (exhausted, reason, msg) = if full.is_empty() {
                (false, "FreeAddresses", "free addresses left".to_string())
            } else {
                (
                    true,
                    "NoFreeAddress",
                    format!("no free {} address left", full.join(" or ")),
                )
            };
            set_condition(
                &mut status.conditions,
                events::EXHAUSTED,
                exhausted,
                reason,
                msg,
                generation,
                &now,
            );
            ctx.events.publish_once(class.as_ref(), None).await;
        }
        Err(why) => {
            status.capacity = None;
            set_condition(
                &mut status.conditions,
                events::PARAMETERS_VALID,
                false,
                events::INVALID_PARAMETERS,
                why.clone(),
                generation,
                &now,
            );
            let ev = PlannedEvent::warning(
                events::INVALID_PARAMETERS,
                format!("{why}; nothing will be allocated from this class"),
            );
            ctx.events.publish_once(class.as_ref(), Some(&ev)).await;
        }
    }
    if class.status.as_ref() != Some(&status) {
        let api: Api<IPAddressClass> = Api::all(ctx.client.clone());
        let body = json!({"metadata": {"resourceVersion": class.metadata.resource_version},
            "status": {"capacity": status.capacity, "conditions": status.conditions}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map_err(|source| Error::Kube {
                action: "writing status of class",
                object: name.clone(),
                source,
            })?;
    }
    Ok(Outcome::Done)
}

/// One pass over an address: backend teardown behind the driver's finalizer; for an
/// address of this driver's classes, its health (Lost, Conflict) and a dangling association.
pub(crate) async fn address_pass<D: Driver>(
    ctx: Arc<Ctx<D>>,
    name: String,
) -> Result<Outcome, Error> {
    let Some(a) = ctx.world.addresses.get(&name) else {
        return Ok(Outcome::Done);
    };
    let teardown = ctx.driver.finalizer().filter(|f| {
        a.metadata.deletion_timestamp.is_some() && a.finalizers().iter().any(|x| x == f)
    });
    let Some(finalizer) = teardown else {
        if ctx.owns(&a) {
            // The driver's finalizer guards its backend state of every address of its
            // classes — an admin's static ones too, not only those it created.
            if let Some(f) = ctx.driver.finalizer()
                && a.metadata.deletion_timestamp.is_none()
                && !a.finalizers().iter().any(|x| x == f)
            {
                let mut all = a.finalizers().to_vec();
                all.push(f.to_string());
                let body = json!({"metadata": {"resourceVersion": a.metadata.resource_version, "finalizers": all}});
                Api::<IPAddress>::all(ctx.client.clone())
                    .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                    .await
                    .map_err(|source| Error::Kube {
                        action: "adding the finalizer of",
                        object: name.clone(),
                        source,
                    })?;
                return Ok(Outcome::Done);
            }
            crate::association::pass::health_pass(&ctx, &a).await?;
        }
        return Ok(Outcome::Done);
    };
    // Teardown waits until no Service shows the address any more (its association is
    // withdrawn first): the backend's state is what withdraws it.
    if let Some(ip) = crate::association::ip_of(&a) {
        let shown = crate::association::pass::shown_by(&ctx, ip);
        if let Some((svc, _)) = shown.first() {
            return Err(Error::Backend {
                object: name.clone(),
                message: format!(
                    "Service {svc} still shows {ip}; tearing down after it is withdrawn"
                ),
            });
        }
    }
    ctx.driver
        .release(&ctx.client, &a)
        .await
        .map_err(|message| Error::Allocate {
            claim: name.clone(),
            message,
        })?;
    let remaining: Vec<&String> = a.finalizers().iter().filter(|f| *f != finalizer).collect();
    let body = json!({"metadata": {"resourceVersion": a.metadata.resource_version, "finalizers": remaining}});
    Api::<IPAddress>::all(ctx.client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(|source| Error::Kube {
            action: "removing the finalizer of",
            object: name.clone(),
            source,
        })?;
    tracing::info!(address = %name, "released in the backend");
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use address_controller_runtime::cache::key_of;
    use address_controller_runtime::health::{Bounds, Health};
    use address_controller_runtime::leader::Leadership;

    struct Null;
    impl Driver for Null {
        type Params = ();
        fn provisioner(&self) -> &str {
            "p.example"
        }
        fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<(), String>> {
            classes.iter().map(|_| Ok(())).collect()
        }
        fn capacity(&self, _: &()) -> crate::Capacity {
            crate::Capacity::default()
        }
        async fn allocate(&self, _: Request<'_, ()>) -> Result<Allocation, AllocateError> {
            Err(AllocateError::Exhausted)
        }
    }

    /// A client that fails every request: these tests never reach an API server.
    fn offline() -> Client {
        let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            Err::<http::Response<String>, std::io::Error>(std::io::Error::other("offline"))
        });
        Client::new(svc, "default")
    }

    fn ctx() -> Ctx<Null> {
        let health = Health::new(Bounds::default());
        let world = World::new(false, health.clone());
        let gate = Gate {
            leadership: Leadership::always(),
            health,
        };
        let ctx = Ctx::new(Null, offline(), world, gate, "test", "t".into());
        for (name, provisioner) in [("ours", "p.example"), ("theirs", "q.example")] {
            let c: IPAddressClass = serde_json::from_value(
                json!({"metadata": {"name": name}, "spec": {"provisioner": provisioner}}),
            )
            .unwrap();
            ctx.world.classes.apply(key_of(&c), Some(Arc::new(c)));
        }
        ctx
    }

    fn claim(extra: serde_json::Value) -> IPAddressClaim {
        let mut v = json!({"metadata": {"name": "c", "namespace": "t", "uid": "u1",
                "annotations": {PROVISIONER_ANNOTATION: "p.example"}},
            "spec": {"family": "Dual"},
            "status": {"phase": "Pending", "className": "ours", "conditions": [{"type": "Bound", "status": "False",
                "reason": "WaitingForProvisioning", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    /// A JSON merge patch (null removes).
    fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        b.remove(&k);
                    } else {
                        merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
            (b, p) => *b = p,
        }
    }

    fn families(ctx: &Ctx<Null>, c: &IPAddressClaim) -> Option<Vec<Family>> {
        wanted(ctx, c, "t/c").map(|(_, f)| f)
    }

    #[tokio::test]
    async fn serves_only_stamped_pending_claims_waiting_for_it_and_only_missing_families() {
        let ctx = ctx();
        let both = Some(vec![Family::IPv4, Family::IPv6]);
        assert_eq!(families(&ctx, &claim(json!({}))), both);
        let rows: &[(&str, serde_json::Value)] = &[
            (
                "not stamped",
                json!({"metadata": {"annotations": {PROVISIONER_ANNOTATION: null}}}),
            ),
            (
                "stamped for another driver",
                json!({"metadata": {"annotations": {PROVISIONER_ANNOTATION: "q.example"}}}),
            ),
            ("before the core's first pass", json!({"status": null})),
            ("Bound", json!({"status": {"phase": "Bound"}})),
            ("Lost", json!({"status": {"phase": "Lost"}})),
            (
                "waiting for a pinned address",
                json!({"status": {"conditions": [{"type": "Bound", "status": "False",
                "reason": "WaitingForAddress", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
            ),
            (
                "pinned",
                json!({"spec": {"family": "IPv4", "addressName": "x"}}),
            ),
            (
                "being deleted",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
            (
                "a class of another driver",
                json!({"status": {"className": "theirs"}}),
            ),
            (
                "a class that does not exist",
                json!({"status": {"className": "gone"}}),
            ),
        ];
        for (what, extra) in rows {
            assert_eq!(families(&ctx, &claim(extra.clone())), None, "{what}");
        }
        // A family the status lists is not provisioned again.
        let listed =
            claim(json!({"status": {"addresses": [{"name": "a", "address": "192.0.2.1"}]}}));
        assert_eq!(families(&ctx, &listed), Some(vec![Family::IPv6]));
        // Nor one an address in the cache already names (uid empty or equal)...
        let a: IPAddress = serde_json::from_value(json!({"metadata": {"name": "x6"}, "spec": {"address": "2001:db8::1",
            "className": "ours", "source": {"fromClass": {}}, "claimRef": {"namespace": "t", "name": "c", "uid": "u1"}}})).unwrap();
        ctx.world
            .addresses
            .apply(key_of(&a), Some(Arc::new(a.clone())));
        ctx.inventory.address_changed(None, Some(&a));
        assert_eq!(families(&ctx, &claim(json!({}))), Some(vec![Family::IPv4]));
        // ...nor one this process just created (not in the cache yet).
        fresh(&ctx.in_flight).insert(("u1".into(), Family::IPv4), Instant::now());
        assert_eq!(families(&ctx, &claim(json!({}))), None);
    }

    #[test]
    fn a_provisioned_address_is_pre_bound_to_the_claim_with_its_uid_and_the_class_policy() {
        let class: IPAddressClass = serde_json::from_value(json!({"metadata": {"name": "pub"},
            "spec": {"provisioner": "p.example", "reclaimPolicy": "Delete"}}))
        .unwrap();
        let claim: IPAddressClaim = serde_json::from_value(json!({"metadata": {"name": "web",
            "namespace": "t", "uid": "u1"}, "spec": {}}))
        .unwrap();
        let a = Allocation {
            address: "192.0.2.7".parse().unwrap(),
            source: serde_json::from_value(json!({"fromClass": {}})).unwrap(),
            name: None,
        };
        let made = provisioned(
            "ipv4-192-0-2-7",
            &a,
            &class,
            &claim,
            "p.example",
            Some("p.example/hold"),
        );
        let v = serde_json::to_value(&made).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
                "metadata": {"name": "ipv4-192-0-2-7", "finalizers": ["p.example/hold"],
                    "annotations": {"ipaddress.local.sdn.cozystack.io/provisioned-by": "p.example"}},
                "spec": {"address": "192.0.2.7", "className": "pub", "reclaimPolicy": "Delete",
                    "claimRef": {"namespace": "t", "name": "web", "uid": "u1"},
                    "source": {"fromClass": {}}}})
        );
        assert!(made.belongs_to(&claim));
        let bare = provisioned("x", &a, &class, &claim, "p.example", None);
        assert_eq!(bare.metadata.finalizers, None);
    }
}
