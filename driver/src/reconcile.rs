//! The driver's two controllers: claims (provision) and classes (capacity, conditions).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use address_controller_api::family::family_of;
use address_controller_api::{ClaimPhase, Family, IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_controller::cache::{Cache, Stores};
use address_controller_controller::decide::{PlannedEvent, set_condition};
use address_controller_controller::events::Events;
use address_controller_controller::leader::Leadership;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::allocator;
use crate::provision::{ClaimWork, PROVISIONER, class_ranges, plan_claim};

/// How long an address this process created is assumed to be on its way into the cache.
const IN_FLIGHT_FOR: Duration = Duration::from_secs(60);

pub struct Ctx {
    client: Client,
    stores: Stores,
    leader: Arc<Leadership>,
    /// The caches completed their initial list; nothing is allocated before (an address
    /// not loaded yet would look free).
    synced: Arc<std::sync::atomic::AtomicBool>,
    events: Events,
    /// (claim uid, family) → when this process created an address for it.
    in_flight: Mutex<HashMap<(String, Family), Instant>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} already exists; another allocation won the race")]
    Taken(String),
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        source: kube::Error,
    },
}

impl Ctx {
    pub fn new(
        client: Client,
        stores: Stores,
        leader: Arc<Leadership>,
        synced: Arc<std::sync::atomic::AtomicBool>,
        instance: String,
    ) -> Self {
        Ctx {
            synced,
            events: Events::new(client.clone(), "range-driver", instance),
            client,
            stores,
            leader,
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    fn may_act(&self) -> Option<Action> {
        if !self.leader.is_leader() {
            return Some(Action::await_change());
        }
        if !self.synced.load(std::sync::atomic::Ordering::Acquire) {
            return Some(Action::requeue(Duration::from_millis(500)));
        }
        None
    }

    fn in_flight(&self) -> HashSet<(String, Family)> {
        let mut map = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, at| at.elapsed() < IN_FLIGHT_FOR);
        map.keys().cloned().collect()
    }
}

fn ours_and_pending(c: &IPAddressClaim) -> bool {
    c.annotations()
        .get(address_controller_api::names::PROVISIONER_ANNOTATION)
        .map(String::as_str)
        == Some(PROVISIONER)
        && !matches!(
            c.status.as_ref().and_then(|s| s.phase),
            Some(ClaimPhase::Bound | ClaimPhase::Lost)
        )
}

fn pending_claims(claims: &Store<IPAddressClaim>) -> Vec<ObjectRef<IPAddressClaim>> {
    claims
        .state()
        .iter()
        .filter(|c| ours_and_pending(c))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

fn our_classes(classes: &Store<IPAddressClass>) -> Vec<ObjectRef<IPAddressClass>> {
    classes
        .state()
        .iter()
        .filter(|c| c.spec.provisioner == PROVISIONER)
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

async fn reconcile_claim(obj: Arc<IPAddressClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if let Some(wait) = ctx.may_act() {
        return Ok(wait);
    }
    let Some(claim) = ctx.stores.claims.get(&ObjectRef::from_obj(obj.as_ref())) else {
        return Ok(Action::await_change());
    };
    let ranges = class_ranges(&ctx.stores.classes.state());
    let addresses = ctx.stores.addresses.state();
    match plan_claim(&claim, &ranges, &addresses, &ctx.in_flight()) {
        ClaimWork::Nothing => ctx.events.publish_once(claim.as_ref(), None).await,
        ClaimWork::BadClass(why) => {
            let ev = PlannedEvent::warning(
                "InvalidClassParameters",
                format!("the class cannot be allocated from: {why}"),
            );
            ctx.events.publish_once(claim.as_ref(), Some(&ev)).await;
        }
        ClaimWork::Exhausted { class, families } => {
            let families: Vec<&str> = families.iter().map(|f| f.as_str()).collect();
            let ev = PlannedEvent::warning(
                "RangeExhausted",
                format!(
                    "no free {} address left in class {class:?}; waiting for one to be freed",
                    families.join(" and ")
                ),
            );
            ctx.events.publish_once(claim.as_ref(), Some(&ev)).await;
        }
        ClaimWork::Create(list) => {
            let api: Api<IPAddress> = Api::all(ctx.client.clone());
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            for address in list {
                let name = address.name_any();
                match api.create(&PostParams::default(), &address).await {
                    Ok(_) => {
                        tracing::info!(claim = %format!("{}/{}", claim.namespace().unwrap_or_default(), claim.name_any()),
                            address = %address.spec.address, "provisioned");
                        if let Ok(f) = family_of(&address.spec.address) {
                            ctx.in_flight
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .insert((uid.clone(), f), Instant::now());
                        }
                    }
                    // Object-name collision is the lock: someone holds this address.
                    Err(kube::Error::Api(s)) if s.code == 409 => return Err(Error::Taken(name)),
                    Err(source) => {
                        return Err(Error::Kube {
                            action: "creating",
                            object: name,
                            source,
                        });
                    }
                }
            }
            ctx.events.publish_once(claim.as_ref(), None).await;
        }
    }
    Ok(Action::await_change())
}

async fn reconcile_class(obj: Arc<IPAddressClass>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if let Some(wait) = ctx.may_act() {
        return Ok(wait);
    }
    let Some(class) = ctx.stores.classes.get(&ObjectRef::from_obj(obj.as_ref())) else {
        return Ok(Action::await_change());
    };
    if class.spec.provisioner != PROVISIONER {
        return Ok(Action::await_change());
    }
    let name = class.name_any();
    let ranges = class_ranges(&ctx.stores.classes.state());
    let Some((_, parsed)) = ranges.iter().find(|(c, _)| c.name_any() == name) else {
        return Ok(Action::await_change());
    };
    let now = Time(Timestamp::now());
    let mut status = class.status.clone().unwrap_or_default();
    let generation = class.metadata.generation;
    match parsed {
        Ok(cidrs) => {
            let (v4, v6) = allocator::capacity(cidrs);
            status.capacity = Some(address_controller_api::Capacity {
                ipv4: Some(v4),
                ipv6: Some(v6),
            });
            let msg = format!(
                "{} range(s): {}",
                cidrs.len(),
                cidrs
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            set_condition(
                &mut status.conditions,
                "ParametersValid",
                true,
                "Valid",
                msg,
                generation,
                &now,
            );
            // Exhausted: a family with capacity and no free address left.
            let used = |f: Family| {
                ctx.stores
                    .addresses
                    .state()
                    .iter()
                    .filter(|a| {
                        a.spec.class_name == name && family_of(&a.spec.address).ok() == Some(f)
                    })
                    .count()
            };
            let full: Vec<&str> = [(Family::IPv4, v4), (Family::IPv6, v6)]
                .into_iter()
                .filter(|(f, cap)| *cap > 0 && i64::try_from(used(*f)).unwrap_or(i64::MAX) >= *cap)
                .map(|(f, _)| f.as_str())
                .collect();
            let (exhausted, msg) = if full.is_empty() {
                (false, "free addresses left".to_string())
            } else {
                (true, format!("no free {} address left", full.join(" or ")))
            };
            set_condition(
                &mut status.conditions,
                "Exhausted",
                exhausted,
                if exhausted {
                    "NoFreeAddress"
                } else {
                    "FreeAddresses"
                },
                msg,
                generation,
                &now,
            );
            ctx.events.publish_once(class.as_ref(), None).await;
        }
        Err(e) => {
            status.capacity = None;
            set_condition(
                &mut status.conditions,
                "ParametersValid",
                false,
                "InvalidParameters",
                e.to_string(),
                generation,
                &now,
            );
            let ev = PlannedEvent::warning(
                "InvalidParameters",
                format!("{e}; nothing will be allocated from this class"),
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
                action: "writing status of",
                object: name.clone(),
                source,
            })?;
    }
    Ok(Action::await_change())
}

fn error_policy<K>(_: Arc<K>, err: &Error, _: Arc<Ctx>) -> Action {
    match err {
        Error::Taken(_) => Action::requeue(Duration::from_millis(200)),
        Error::Kube { .. } => {
            tracing::warn!(error = %err, "reconcile failed");
            Action::requeue(Duration::from_secs(5))
        }
    }
}

/// Runs both controllers until `shutdown` resolves.
pub async fn run(
    cache: Cache,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    use futures::FutureExt;
    let shutdown = shutdown.shared();
    let stores = cache.stores.clone();
    let config = Config::default().concurrency(4);
    let (pending_a, pending_c, pending_d) = (
        stores.claims.clone(),
        stores.claims.clone(),
        stores.claims.clone(),
    );
    let deleted = cache
        .deletions
        .addresses
        .flat_map(move |_| futures::stream::iter(pending_claims(&pending_d)));
    // Claim deletions need no reaction here (the core reclaims); do not let them pile up.
    drop((cache.deletions.claims, cache.deletions.claims_for_services));
    let classes_for_classes = cache.classes.clone();
    let classes_for_claims = cache.classes.clone();
    let claims = Controller::for_shared_stream(cache.claims, stores.claims.clone())
        .with_config(config.clone())
        // Freed or new addresses may end an exhaustion; new classes may settle claims.
        .watches_shared_stream(cache.addresses.clone(), move |_a: Arc<IPAddress>| {
            pending_claims(&pending_a)
        })
        .watches_shared_stream(classes_for_claims, move |_c: Arc<IPAddressClass>| {
            pending_claims(&pending_c)
        })
        .reconcile_on(deleted)
        .reconcile_all_on(ctx.leader.acquired())
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile_claim, error_policy, ctx.clone())
        .for_each(|_| async {});

    let (classes_a, classes_b, classes_c) = (
        stores.classes.clone(),
        stores.classes.clone(),
        stores.classes.clone(),
    );
    let classes = Controller::for_shared_stream(cache.classes, stores.classes.clone())
        .with_config(config)
        // Overlaps are judged across classes: any change re-examines all of ours.
        .watches_shared_stream(classes_for_classes, move |_c: Arc<IPAddressClass>| {
            our_classes(&classes_c)
        })
        .watches_shared_stream(cache.addresses, move |a: Arc<IPAddress>| {
            our_classes(&classes_a)
                .into_iter()
                .filter(|c| c.name == a.spec.class_name)
                .collect::<Vec<_>>()
        })
        .reconcile_on(
            cache
                .deletions
                .classes
                .flat_map(move |_| futures::stream::iter(our_classes(&classes_b))),
        )
        .reconcile_all_on(ctx.leader.acquired())
        .graceful_shutdown_on(shutdown)
        .run(reconcile_class, error_policy, ctx)
        .for_each(|_| async {});
    futures::join!(claims, classes);
}
