//! The kit's wiring: what each cache change wakes ([`register`]), and its controllers — a
//! pool per queue on the runtime's one builder ([`controllers`]), the core's too.

use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_runtime::cache::{Change, key_of};
use address_controller_runtime::controllers::{Controllers, bound};
use address_controller_runtime::workers::Observe;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::decide::service;
use crate::driver::Driver;
use crate::{runner, services};

/// The kit's controllers: a pool per queue (one worker for the classes: capacity and
/// the backend's classes are judged across classes); a new leader queues everything of
/// this driver.
pub(crate) fn controllers<D: Driver>(
    ctx: &Arc<runner::Ctx<D>>,
    n: usize,
    observe: Observe,
) -> Controllers {
    let q = &ctx.queues;
    let c = ctx.clone();
    Controllers::new(ctx.gate.clone(), observe)
        .pool("claim", q.claims.clone(), n, bound(ctx, runner::claim_pass))
        .pool(
            "class",
            q.classes.clone(),
            1,
            bound(ctx, runner::class_pass),
        )
        .pool(
            "address",
            q.addresses.clone(),
            n,
            bound(ctx, runner::address_pass),
        )
        .pool(
            "service",
            q.services.clone(),
            n,
            bound(ctx, runner::service::service_pass),
        )
        .on_lead(move || {
            let c = c.clone();
            async move { queue_everything(&c).await }
        })
}

/// What each change wakes.
pub(crate) fn register<D: Driver>(ctx: &Arc<runner::Ctx<D>>) {
    let c = ctx.clone();
    ctx.world
        .addresses
        .on_change(move |ch| address_changed(&c, ch));
    let c = ctx.clone();
    ctx.world.claims.on_change(move |ch| claim_changed(&c, ch));
    if let Some(services) = &ctx.world.services {
        let c = ctx.clone();
        services.on_change(move |ch| service_changed(&c, ch));
    }
    let c = ctx.clone();
    ctx.world.classes.on_change(move |ch| class_changed(&c, ch));
    // A Service cozy-proxy serves is judged again when its ready pods change.
    if let Some(slices) = &ctx.world.proxied_endpoints {
        let c = ctx.clone();
        slices.cache.on_change(move |ch| {
            for slice in [&ch.old, &ch.new].into_iter().flatten() {
                if let Some(svc) = address_controller_runtime::endpoints::service_of(slice) {
                    c.queues.services.add(svc);
                }
            }
        });
        // ... and when a VMI its pods run changes (a move starts, the target takes over).
        let c = ctx.clone();
        let index = Arc::downgrade(slices);
        slices.vmis.on_change(move |ch| {
            for svc in index.upgrade().iter().flat_map(|i| i.services_of_vmi(ch)) {
                c.queues.services.add(svc);
            }
        });
    }
}

fn address_changed<D: Driver>(c: &runner::Ctx<D>, ch: &Change<IPAddress>) {
    let Some(a) = ch.object() else { return };
    // Index first, then end its time in flight (see `runner::wanted`).
    c.queues.claims.add_all(
        c.inventory
            .address_changed(ch.old.as_deref(), ch.new.as_deref()),
    );
    if let Some(new) = &ch.new {
        c.landed(new);
    }
    c.queues.addresses.add(a.name_any());
    // Usage changes the class's Exhausted condition; the last address of a gone class
    // lets the backend forget it.
    let class = &a.spec.class_name;
    match c.world.classes.get(class) {
        Some(k) if c.ours(&k) => c.queues.classes.add(class.clone()),
        Some(_) => {}
        None if ch.new.is_none() && !c.inventory.classes().contains(class) => {
            c.queues.classes.add(class.clone());
        }
        None => {}
    }
    // The Services its claim, its IP and its association concern.
    for x in [ch.old.as_deref(), ch.new.as_deref()].into_iter().flatten() {
        if let Some(r) = &x.spec.claim_ref {
            c.queues.services.add_all(c.services.naming(&r.key()));
        }
        if let Some(ip) = x.ip() {
            c.queues.services.add_all(c.services.mentioning(ip));
        }
        c.queues.services.add_all(x.holder_services());
    }
}

fn claim_changed<D: Driver>(c: &runner::Ctx<D>, ch: &Change<IPAddressClaim>) {
    let stamped =
        |o: Option<&Arc<address_controller_api::IPAddressClaim>>| o.is_some_and(|o| c.stamped(o));
    let Some(o) = ch.object() else { return };
    if stamped(ch.old.as_ref()) || stamped(ch.new.as_ref()) {
        c.queues.claims.add(key_of(o.as_ref()));
    }
    // The Services that name it (its phase and addresses decide what they get).
    c.queues
        .services
        .add_all(c.services.naming(&key_of(o.as_ref())));
}

fn service_changed<D: Driver>(c: &runner::Ctx<D>, ch: &Change<Service>) {
    let Some(o) = ch.object() else { return };
    let key = key_of(o.as_ref());
    let entry = |s: &Option<Arc<k8s_openapi::api::core::v1::Service>>| {
        s.as_ref()
            .map(|s| services::Entry::of(s, c.driver.shown(s), &c.marker))
    };
    let (old, new) = (entry(&ch.old), entry(&ch.new));
    c.services.changed(&key, old.as_ref(), new.as_ref());
    // The addresses it shows (or showed): their health depends on it.
    for e in old.iter().chain(new.iter()) {
        for ip in &e.ips {
            c.queues.addresses.add_all(c.inventory.addresses_of(*ip));
        }
    }
    // The other Services naming the same claim: who holds it may change with this one.
    for e in old.iter().chain(new.iter()) {
        if let Some(claim) = &e.claim {
            c.queues.services.add_all(c.services.naming(claim));
        }
    }
    let associated = c.inventory.associated_to(&key);
    let relevant = old
        .iter()
        .chain(new.iter())
        .any(|e| e.claim.is_some() || !e.ips.is_empty())
        || [&ch.old, &ch.new]
            .into_iter()
            .flatten()
            .any(|s| service::claim_annotation(s).is_some())
        || !associated.is_empty();
    if relevant {
        c.queues.services.add(key);
    }
    c.queues.addresses.add_all(associated);
}

fn class_changed<D: Driver>(c: &runner::Ctx<D>, ch: &Change<IPAddressClass>) {
    // The driver's own status writes do not change what it parsed.
    let spec_changed = match (&ch.old, &ch.new) {
        (Some(o), Some(n)) => {
            o.metadata.generation != n.metadata.generation
                || o.spec.provisioner != n.spec.provisioner
        }
        _ => true,
    };
    if !spec_changed {
        return;
    }
    c.classes_changed();
    // A class gone: the backend may let go of it.
    if ch.new.is_none()
        && let Some(old) = &ch.old
    {
        c.queues.classes.add(old.name_any());
    }
    // Overlaps are judged across classes: every class of ours again; and every claim of
    // ours, which may have been refused for bad parameters; and every address of ours,
    // whose presence in the backend the parameters may change.
    c.queues
        .classes
        .add_all(c.our_classes().iter().map(|k| k.name_any()));
    if ch.object().is_some_and(|k| c.ours(k)) {
        let (waiting, settled) = claims_to_examine(c);
        c.queues.claims.add_all(waiting.into_iter().chain(settled));
        c.queues.addresses.add_all(addresses_to_examine(c));
    }
}

/// The addresses this driver examines: its own, or every one when it holds a finalizer.
fn addresses_to_examine<D: Driver>(c: &runner::Ctx<D>) -> Vec<String> {
    c.world
        .addresses
        .store
        .all()
        .iter()
        .filter(|a| c.owns(a) || c.driver.finalizer().is_some())
        .map(|a| a.name_any())
        .collect()
}

/// The claims stamped with a class of this driver: those a tenant may wait on, and the
/// settled ones.
fn claims_to_examine<D: Driver>(c: &runner::Ctx<D>) -> (Vec<String>, Vec<String>) {
    let claims = c.world.claims.store.all();
    address_controller_api::IPAddressClaim::waiting_and_settled(
        claims
            .iter()
            .filter(|k| c.stamped(k))
            .map(std::sync::Arc::as_ref),
    )
}

/// A new leader examines every object of this driver — claims first, what a tenant waits
/// for, and those waiting alone before the settled ones and what piled up while following —
/// in chunks, so the workers start on the first keys while the rest are queued and the
/// lease's renewal is not held up behind 100,000 keys under one lock.
async fn queue_everything<D: Driver>(c: &runner::Ctx<D>) {
    let q = &c.queues;
    let (waiting, settled) = claims_to_examine(c);
    q.claims
        .lead(waiting, settled, &[&q.addresses, &q.services])
        .await;
    c.queues
        .classes
        .add_all(c.our_classes().iter().map(|k| k.name_any()));
    // The empty name, no class's: what the backend kept for classes that went while
    // another replica led, or none did.
    c.queues.classes.add(String::new());
    c.queues
        .addresses
        .add_all_in_chunks(addresses_to_examine(c))
        .await;
    if let Some(services) = &c.world.services {
        let keys = services
            .store
            .all()
            .iter()
            .filter(|s| {
                service::claim_annotation(s).is_some() || s.annotations().contains_key(&c.marker)
            })
            .map(|s| key_of(s.as_ref()))
            .collect();
        c.queues.services.add_all_in_chunks(keys).await;
    }
}
