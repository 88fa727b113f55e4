//! Wiring: what each cache change updates and wakes, and the workers.
//!
//! Every change runs, on its watch's task and in this order: the recent-writes overlay
//! forgets what the cache now shows, the [`Index`](crate::index::Index) takes the change
//! in, and the keys it concerns are queued. Queueing only inserts into a set: nothing here
//! can block a watch.
//!
//! | change | passes |
//! |---|---|
//! | address | the address; the claims it names (before and after) and the claims pinned to it; when it became free, the waiting claims the pump picks (one per free address) |
//! | claim | the claim; the addresses naming it when its existence, uid, deletion or listed addresses changed; the Service named after it; the pump's picks when it starts or stops waiting |
//! | class | the claims waiting in its pools, the unresolved claims and those refused for an entitlement; its Released addresses (release delay); LoadBalancer Services without a claim |
//! | Service | the Service (auto-claims); the claims it named and names, when it changed claims, appeared, went, or its `AddressAttached` condition changed (their count of Services) |
//! | IPAddressQuota | the Pending claims of its namespace |
//! | namespace labels | the Pending claims of the namespace; its Services without a claim |
//! | usage drop (an address counted, an invitation or a take ends) | the claims of that namespace and class refused with `QuotaExceeded` |
//! | driver Lease | the classes of its provisioner, when it appears, goes, or changes holder (the class pass re-checks at the Lease's expiry) |
//! | leadership acquired | everything |

use std::sync::Arc;

use address_controller_api::entitlement::namespace_entitlement_changed;
use address_controller_api::service::may_want_auto_claim;
use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass, IPAddressQuota};
use address_controller_runtime::cache::{Change, key_of};
use address_controller_runtime::controllers::{Controllers, bound};
use address_controller_runtime::workers::Observe;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::ResourceExt;

use crate::context::Context;
use crate::reconcile;

/// Tuning of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Reconciles running at once, per controller.
    pub concurrency: u16,
}

/// Registers the change handlers on the caches. Call before the watches start.
pub fn register(ctx: &Arc<Context>) {
    let c = ctx.clone();
    ctx.world
        .addresses
        .on_change(move |ch| address_changed(&c, ch));
    let c = ctx.clone();
    ctx.world.claims.on_change(move |ch| claim_changed(&c, ch));
    let c = ctx.clone();
    ctx.world.classes.on_change(move |ch| class_changed(&c, ch));
    if let Some(e) = &ctx.world.entitlements {
        let c = ctx.clone();
        e.quotas.on_change(move |ch| quota_changed(&c, ch));
        let c = ctx.clone();
        e.namespaces.on_change(move |ch| namespace_changed(&c, ch));
    }
    if let Some(leases) = &ctx.world.driver_leases {
        let c = ctx.clone();
        leases.on_change(move |ch| driver_lease_changed(&c, ch));
    }
    if let Some(services) = &ctx.world.services {
        let c = ctx.clone();
        services.on_change(move |ch| service_changed(&c, ch));
    }
}

/// An address changed: see the table at the top.
fn address_changed(c: &Context, ch: &Change<IPAddress>) {
    let Some(obj) = ch.object() else { return };
    let key = key_of(obj.as_ref());
    c.recent_addresses.observe(&key, ch.new.as_deref());
    let wake = c
        .index
        .address_changed(ch.old.as_deref(), ch.new.as_deref());
    c.queues.addresses.add(key);
    c.queues.claims.add_all(wake.claims);
    c.queues.claims.add_all(
        c.quota
            .address_changed(ch.old.as_deref(), ch.new.as_deref()),
    );
    if ch.new.is_none()
        && let Some(uid) = obj.uid()
    {
        c.events.forget(&uid);
    }
}

/// A claim changed.
fn claim_changed(c: &Context, ch: &Change<IPAddressClaim>) {
    let Some(obj) = ch.object() else { return };
    let key = key_of(obj.as_ref());
    c.recent_claims.observe(&key, ch.new.as_deref());
    let wake = c.index.claim_changed(ch.old.as_deref(), ch.new.as_deref());
    c.queues.claims.add(key.clone());
    c.queues.claims.add_all(wake.claims);
    c.queues
        .claims
        .add_all(c.quota.claim_changed(ch.old.as_deref(), ch.new.as_deref()));
    c.queues.addresses.add_all(wake.addresses);
    if c.auto_claims {
        // The same-named claim decides what its Service gets (SPEC §7).
        c.queues.services.add(key);
    }
    if ch.new.is_none()
        && let Some(uid) = obj.uid()
    {
        c.events.forget(&uid);
    }
}

/// A class changed.
fn class_changed(c: &Context, ch: &Change<IPAddressClass>) {
    let Some(obj) = ch.object() else { return };
    let name = obj.name_any();
    c.queues.classes.add(name.clone());
    c.queues.claims.add_all(c.index.claims_for_class(&name));
    c.queues.claims.add_all(c.quota.refused_of_class(&name));
    c.queues.addresses.add_all(c.index.released_in(&name));
    // A class appearing or changing may settle Services waiting for it.
    wake_auto_claims(c, None);
}

/// Queues the Services (of `namespace`, or all) that may want an auto-claim, when the
/// core makes them.
fn wake_auto_claims(c: &Context, namespace: Option<&str>) {
    if let Some(services) = c.world.services.as_ref().filter(|_| c.auto_claims) {
        c.queues.services.add_all(
            services
                .store
                .all()
                .iter()
                .filter(|s| namespace.is_none_or(|ns| s.namespace().as_deref() == Some(ns)))
                .filter(|s| may_want_auto_claim(s))
                .map(|s| key_of(s.as_ref())),
        );
    }
}

/// An IPAddressQuota changed.
fn quota_changed(c: &Context, ch: &Change<IPAddressQuota>) {
    c.queues
        .claims
        .add_all(c.quota.quota_changed(ch.old.as_deref(), ch.new.as_deref()));
}

/// A namespace's labels may have changed.
fn namespace_changed(c: &Context, ch: &Change<Namespace>) {
    if !namespace_entitlement_changed(ch.old.as_deref(), ch.new.as_deref()) {
        return;
    }
    let Some(ns) = ch.object().map(|n| n.name_any()) else {
        return;
    };
    c.queues.claims.add_all(c.quota.pending_in(&ns));
    // Services refused an auto-claim there may be admitted now.
    wake_auto_claims(c, Some(&ns));
}

/// A driver's Lease changed.
fn driver_lease_changed(c: &Context, ch: &Change<Lease>) {
    // Renewals (every few seconds) change only renewTime: the class pass already
    // waits for the Lease's expiry. Appearing, going and a new holder wake it.
    let holder = |l: Option<&Lease>| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.clone())
    };
    if ch.old.is_some()
        && ch.new.is_some()
        && holder(ch.old.as_deref()) == holder(ch.new.as_deref())
    {
        return;
    }
    let provisioners: Vec<String> = [ch.old.as_deref(), ch.new.as_deref()]
        .into_iter()
        .flatten()
        .filter_map(|l| {
            l.annotations()
                .get(address_controller_api::names::LEASE_PROVISIONER_ANNOTATION)
                .cloned()
        })
        .collect();
    c.queues.classes.add_all(
        c.world
            .classes()
            .iter()
            .filter(|k| provisioners.contains(&k.spec.provisioner))
            .map(|k| k.name_any()),
    );
}

/// A Service changed.
fn service_changed(c: &Context, ch: &Change<Service>) {
    // The claims it named and names count their Services.
    c.queues.claims.add_all(
        c.index
            .service_changed(ch.old.as_deref(), ch.new.as_deref()),
    );
    if c.auto_claims
        && let Some(obj) = ch.object()
    {
        c.queues.services.add(key_of(obj.as_ref()));
    }
}

/// The controllers: a pool per queue (claims, addresses, and — when their caches are
/// watched — classes and Services); on every leadership acquisition every object is queued
/// (the new leader re-examines everything).
pub fn controllers(ctx: &Arc<Context>, settings: &Settings) -> Controllers {
    let observe: Observe = {
        let metrics = ctx.metrics.clone();
        Arc::new(move |controller, result, took| metrics.observe(controller, result, took))
    };
    let n = usize::from(settings.concurrency);
    let q = &ctx.queues;
    let mut controllers = Controllers::new(ctx.gate.clone(), observe)
        .pool(
            "claim",
            q.claims.clone(),
            n,
            bound(ctx, reconcile::claim::reconcile),
        )
        .pool(
            "address",
            q.addresses.clone(),
            n,
            bound(ctx, reconcile::address::reconcile),
        );
    if ctx.world.driver_leases.is_some() {
        let pass = bound(ctx, reconcile::class::reconcile);
        controllers = controllers.pool("class", q.classes.clone(), 1, pass);
    }
    if ctx.auto_claims && ctx.world.services.is_some() {
        let pass = bound(ctx, reconcile::service::reconcile);
        controllers = controllers.pool("service", q.services.clone(), n, pass);
    }
    controllers = controllers.pool(
        "records",
        q.records.clone(),
        1,
        bound(ctx, reconcile::records::reconcile),
    );
    let c = ctx.clone();
    controllers.on_lead(move || queue_everything(c.clone()))
}

/// What a new leader queues: claims first, what a tenant waits for. In chunks: the workers
/// start on the first keys while the rest are queued. Those a tenant may wait on run alone
/// before the settled ones: at 100,000 Bound claims a claim created during the takeover
/// waited 1.2 s behind them.
async fn queue_everything(ctx: Arc<Context>) {
    let q = &ctx.queues;
    let (waiting, settled) =
        IPAddressClaim::waiting_and_settled(ctx.world.claims.store.all().iter().map(Arc::as_ref));
    q.claims
        .lead(waiting, settled, &[&q.addresses, &q.services])
        .await;
    q.addresses
        .add_all_in_chunks(ctx.world.addresses.store.keys())
        .await;
    q.classes.add_all(ctx.world.classes.store.keys());
    q.records.add(reconcile::records::KEY.to_string());
    if let Some(s) = ctx.world.services.as_ref().filter(|_| ctx.auto_claims) {
        q.services.add_all_in_chunks(s.store.keys()).await;
    }
}
