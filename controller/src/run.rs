//! Wiring: the two controllers on the shared caches, and what triggers whom.

use std::future::Future;
use std::sync::Arc;

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{AddressPhase, ClaimPhase, IPAddress, IPAddressClaim, IPAddressClass};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::cache::{Cache, Deletions};
use crate::context::Context;
use crate::decide::claim::{could_use, pinned_to};
use crate::decide::refers_to;
use crate::reconcile::{self, error_policy};

/// Tuning of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Reconciles running at once, per controller.
    pub concurrency: u16,
    /// Create claims for LoadBalancer Services that name none (SPEC §7).
    pub auto_claims: bool,
}

fn unsettled(c: &IPAddressClaim) -> bool {
    !matches!(
        c.status.as_ref().and_then(|s| s.phase),
        Some(ClaimPhase::Bound | ClaimPhase::Lost)
    )
}

fn unsettled_claims(claims: &Store<IPAddressClaim>) -> Vec<ObjectRef<IPAddressClaim>> {
    claims
        .state()
        .iter()
        .filter(|c| unsettled(c))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Claims an address change may concern: the claim it names, the claims pinned to it
/// (their waiting reason follows its state), and — when it is free — every claim still
/// waiting for one that could use it (class, family).
fn claims_for_address(
    claims: &Store<IPAddressClaim>,
    a: &IPAddress,
) -> Vec<ObjectRef<IPAddressClaim>> {
    let free = a.spec.claim_ref.is_none()
        && a.metadata.deletion_timestamp.is_none()
        && a.status.as_ref().and_then(|s| s.phase) == Some(AddressPhase::Available);
    let mut out: Vec<ObjectRef<IPAddressClaim>> = claims
        .state()
        .iter()
        .filter(|c| unsettled(c) && (pinned_to(c, a) || (free && could_use(c, a))))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect();
    if let Some(r) = &a.spec.claim_ref {
        out.push(ObjectRef::new(&r.name).within(&r.namespace));
    }
    out
}

/// Addresses whose claimRef names this claim.
fn addresses_for_claim(
    addresses: &Store<IPAddress>,
    c: &IPAddressClaim,
) -> Vec<ObjectRef<IPAddress>> {
    addresses
        .state()
        .iter()
        .filter(|a| a.spec.claim_ref.as_ref().is_some_and(|r| refers_to(r, c)))
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// LoadBalancer Services that name no claim yet.
fn pending_services(services: &Store<Service>) -> Vec<ObjectRef<Service>> {
    services
        .state()
        .iter()
        .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
        .filter(|s| !s.annotations().contains_key(SERVICE_CLAIM_ANNOTATION))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// The Service an auto-claim would be named after.
fn service_of(c: &IPAddressClaim) -> Option<ObjectRef<Service>> {
    Some(ObjectRef::new(&c.name_any()).within(&c.namespace()?))
}

/// Runs the controllers until `shutdown` resolves.
pub async fn run(
    cache: Cache,
    ctx: Arc<Context>,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown = shutdown.shared();
    let config = controller::Config::default().concurrency(settings.concurrency);
    let service_config = config.clone();
    let service_shutdown = shutdown.clone();
    let service_leader = ctx.leader.acquired();
    let service_ctx = ctx.clone();
    let claims_for_services = cache.claims.clone();
    let classes_for_services = cache.classes.clone();
    let stores = ctx.stores.clone();

    let claims_for_address_store = stores.claims.clone();
    let claims_for_class_store = stores.claims.clone();
    let claims_for_deleted_address = stores.claims.clone();
    let claims_for_deleted_class = stores.claims.clone();
    let Deletions {
        claims: deleted_claims,
        claims_for_services: deleted_claims_for_services,
        addresses: deleted_addresses,
        classes: deleted_classes,
    } = cache.deletions;
    // A deleted address concerns its claim (now Lost); a deleted class, the waiting claims.
    let claim_triggers = futures::stream::select(
        deleted_addresses.flat_map(move |a| {
            futures::stream::iter(claims_for_address(&claims_for_deleted_address, &a))
        }),
        deleted_classes
            .flat_map(move |_| futures::stream::iter(unsettled_claims(&claims_for_deleted_class))),
    );
    let claim_controller =
        Controller::for_shared_stream(cache.claims.clone(), stores.claims.clone())
            .with_config(config.clone())
            .watches_shared_stream(cache.addresses.clone(), move |a: Arc<IPAddress>| {
                claims_for_address(&claims_for_address_store, &a)
            })
            .watches_shared_stream(cache.classes.clone(), move |_class: Arc<IPAddressClass>| {
                unsettled_claims(&claims_for_class_store)
            })
            .reconcile_on(claim_triggers)
            .reconcile_all_on(ctx.leader.acquired())
            .graceful_shutdown_on(shutdown.clone())
            .run(reconcile::claim::reconcile, error_policy, ctx.clone())
            .for_each(|_| async {});

    let addresses_for_claim_store = stores.addresses.clone();
    let addresses_for_deleted_store = stores.addresses.clone();
    let addresses_for_class_store = stores.addresses.clone();
    let deleted = deleted_claims.flat_map(move |c| {
        futures::stream::iter(addresses_for_claim(&addresses_for_deleted_store, &c))
    });
    let address_controller =
        Controller::for_shared_stream(cache.addresses, stores.addresses.clone())
            .with_config(config)
            .watches_shared_stream(cache.claims, move |c: Arc<IPAddressClaim>| {
                addresses_for_claim(&addresses_for_claim_store, &c)
            })
            .watches_shared_stream(cache.classes, move |class: Arc<IPAddressClass>| {
                // A changed release delay concerns the class's Released addresses.
                let name = class.name_any();
                addresses_for_class_store
                    .state()
                    .iter()
                    .filter(|a| {
                        a.spec.class_name == name
                            && a.status.as_ref().and_then(|s| s.phase)
                                == Some(AddressPhase::Released)
                    })
                    .map(|a| ObjectRef::from_obj(a.as_ref()))
                    .collect::<Vec<_>>()
            })
            .reconcile_on(deleted)
            .reconcile_all_on(ctx.leader.acquired())
            .graceful_shutdown_on(shutdown)
            .run(reconcile::address::reconcile, error_policy, ctx)
            .for_each(|_| async {});

    let services_for_class = stores.services.clone();
    let service_controller = async move {
        if !settings.auto_claims {
            return;
        }
        Controller::for_shared_stream(cache.services, stores.services.clone())
            .with_config(service_config)
            // A class appearing or changing may settle Services that were waiting for it.
            .watches_shared_stream(classes_for_services, move |_c: Arc<IPAddressClass>| {
                pending_services(&services_for_class)
            })
            // The same-named claim changing (or going away) changes what the Service gets.
            .watches_shared_stream(claims_for_services, |c: Arc<IPAddressClaim>| service_of(&c))
            .reconcile_on(
                deleted_claims_for_services.flat_map(|c| futures::stream::iter(service_of(&c))),
            )
            .reconcile_all_on(service_leader)
            .graceful_shutdown_on(service_shutdown)
            .run(reconcile::service::reconcile, error_policy, service_ctx)
            .for_each(|_| async {})
            .await;
    };

    futures::join!(claim_controller, address_controller, service_controller);
}
