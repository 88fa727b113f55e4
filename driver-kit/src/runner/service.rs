//! The Service pass: applies [`crate::decide::service`]'s plan for a Service —
//! snapshots from the caches and indexes, guarded writes in the plan's order.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use address_controller_api::{IPAddress, IPAddressClaim};
use address_controller_runtime::workers::Outcome;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::decide::service::{
    ServiceCondition, ServicePlan, ServiceSnapshot, condition_patch, is_load_balancer,
    parse_marker, plan_service, render_marker,
};
use crate::driver::Driver;
use crate::runner::ledger::{
    attachment_key, kube_error, ledger, own_address, patch_address_status, service_gone, shown_by,
};
use crate::runner::{Ctx, Error};
use address_controller_api::Attachment;

/// How often a Service pinned and not yet shown is looked at again (until the load balancer
/// shows it — which wakes the pass by itself — or says why not).
const WAITING_RECHECK: Duration = Duration::from_secs(5);

/// One pass over a Service: who holds its claim, the ledger, the kit's record, the pins.
pub(crate) async fn service_pass<D: Driver>(
    ctx: Arc<Ctx<D>>,
    key: String,
) -> Result<Outcome, Error> {
    let Some(cache) = ctx.world.services.as_ref() else {
        return Ok(Outcome::Done);
    };
    let svc = cache.get(&key);
    if svc.as_ref().is_some_and(|s| ctx.driver.internal(s)) {
        return Ok(Outcome::Done);
    }
    let served = svc
        .as_ref()
        .is_some_and(|s| is_load_balancer(s) && ctx.driver.serves(s));
    let claim_key = svc
        .as_deref()
        .and_then(address_controller_api::service::claim_key);
    let claim: Option<Arc<IPAddressClaim>> =
        claim_key.as_ref().and_then(|k| ctx.world.claims.get(k));
    let mut addresses = Vec::new();
    let mut foreign = 0;
    for l in claim
        .iter()
        .flat_map(|c| c.status.iter().flat_map(|s| &s.addresses))
    {
        match ctx.world.addresses.get(&l.name) {
            Some(a) if ctx.owns(&a) => addresses.push(a),
            _ => foreign += 1,
        }
    }
    let rivals: Vec<Arc<Service>> = claim_key
        .iter()
        .flat_map(|k| ctx.services.naming(k))
        .filter_map(|k| cache.get(&k))
        .filter(|s| is_load_balancer(s) && ctx.driver.serves(s) && !ctx.driver.internal(s))
        .collect();
    let associated_here: Vec<Arc<IPAddress>> = ctx
        .inventory
        .associated_to(&key)
        .iter()
        .filter_map(|n| ctx.world.addresses.get(n))
        .filter(|a| ctx.owns(a))
        .collect();
    let marked = svc
        .as_ref()
        .map(|s| parse_marker(s.annotations().get(&ctx.marker).map(String::as_str)))
        .unwrap_or_default();
    let shown = svc
        .as_ref()
        .map(|s| ctx.driver.shown(s))
        .unwrap_or_default();
    let shown_elsewhere = |ip: IpAddr| shown_by(&ctx, ip);
    let unservable = |a: &IPAddress| match ctx.params(&a.spec.class_name) {
        Some(Ok(p)) => ctx.driver.servable(&p, a).err(),
        _ => None,
    };
    let backends = svc
        .as_deref()
        .and_then(address_controller_api::service::cozy_proxy)
        .and_then(|_| ctx.world.proxied_endpoints.as_ref())
        .and_then(|e| e.backends(&key));
    let plan = plan_service(&ServiceSnapshot {
        key: &key,
        service: svc.as_deref(),
        served,
        claim: claim.as_deref(),
        addresses: &addresses,
        foreign,
        rivals: &rivals,
        associated_here: &associated_here,
        marked: &marked,
        shown: &shown,
        shown_elsewhere: &shown_elsewhere,
        unservable: &unservable,
        backends: backends.clone(),
        multiple_for: ctx.multiple_since(&key, backends.as_ref()),
        pin_shows: ctx.driver.pin_shows(),
    });
    apply_service(&ctx, &key, svc, claim, plan).await
}

/// Ledger first: the Service `key` on every address the plan associates (its record
/// replaced where the ledger had one).
async fn record_holder<D: Driver>(
    ctx: &Ctx<D>,
    key: &str,
    plan: &ServicePlan,
) -> Result<(), Error> {
    for a in &plan.associate {
        let mut list = a.attachments();
        let me = plan
            .attachment
            .clone()
            .unwrap_or_else(|| address_controller_api::sharing::attachment(key, None));
        match list
            .iter_mut()
            .find(|h| attachment_key(h).as_deref() == Some(key))
        {
            Some(h) => *h = me,
            None => list.push(me),
        }
        patch_address_status(ctx, a, ledger(ctx, a, list).await?).await?;
        tracing::info!(address = %a.name_any(), service = %key, "associated");
    }
    Ok(())
}

async fn apply_service<D: Driver>(
    ctx: &Ctx<D>,
    key: &str,
    svc: Option<Arc<Service>>,
    claim: Option<Arc<IPAddressClaim>>,
    plan: ServicePlan,
) -> Result<Outcome, Error> {
    record_holder(ctx, key, &plan).await?;
    let Some(mut svc) = svc.map(|s| s.as_ref().clone()) else {
        if !plan.disassociate.is_empty() && !service_gone(ctx, key).await? {
            // The cache has not seen the Service created again under this name yet: its
            // own event brings this pass back.
            return Ok(Outcome::Done);
        }
        for a in &plan.disassociate {
            detach(ctx, a, &[key.to_string()]).await?;
            tracing::info!(address = %a.name_any(), service = %key, "disassociated (the Service is gone)");
        }
        return Ok(Outcome::Done);
    };
    for ev in plan.ledger_events() {
        tracing::info!(service = %key, reason = ev.reason, "{}", ev.note);
        ctx.events.publish(&svc, ev).await;
    }
    let ns = svc.namespace().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    // A new pin on the ledger's word that this pass did not write itself: the word is
    // confirmed by the API first. Right after the kit's own ledger write the cache can
    // still name a Service deleted and created again under this name — pinned on that
    // stale word, the new Service showed the address with no entry: `Conflict`.
    if let Some(marker) = &plan.marker
        && !ledger_confirms(ctx, key, &svc, marker, &plan.associate).await?
    {
        return Ok(Outcome::RequeueAfter(Duration::from_millis(200)));
    }
    // The kit's record of its pins, before the backend pins.
    if let Some(marker) = &plan.marker {
        let body = json!({"metadata": {"resourceVersion": svc.metadata.resource_version,
            "annotations": {ctx.marker.clone(): render_marker(marker)}}});
        svc = api
            .patch(
                &svc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(body),
            )
            .await
            .map_err(kube_error("recording the pins on Service", key.to_string()))?;
    }
    if let Some((ours, want)) = &plan.pin {
        let want: Vec<Arc<IPAddress>> =
            want.iter().filter_map(|ip| own_address(ctx, *ip)).collect();
        ctx.driver
            .pin(&ctx.client, &svc, ours, &want)
            .await
            .map_err(|message| Error::Backend {
                object: key.to_string(),
                message,
            })?;
    }
    // Withdrawn ones: the backend shows them gone; the ledger lets go last.
    for a in &plan.disassociate {
        detach(ctx, a, &[key.to_string()]).await?;
        tracing::info!(address = %a.name_any(), service = %key, "disassociated");
    }
    // The condition last, once the backend has been asked: written before the pin, it put
    // one more Service update in front of the load balancer's reaction (the node tier's
    // MetalLB speaker, which reprocesses on every Service event, fell a minute behind).
    let (condition, mut outcome) = while_waiting(ctx, &svc, plan.condition.clone()).await;
    if let Some(after) = plan.recheck {
        outcome = match outcome {
            Outcome::RequeueAfter(d) => Outcome::RequeueAfter(d.min(after)),
            _ => Outcome::RequeueAfter(after),
        };
    }
    if !plan.not_ours {
        write_condition(ctx, &svc, condition.as_ref()).await?;
    }
    for ev in plan.closing_events() {
        tracing::info!(service = %key, reason = ev.reason, "{}", ev.note);
        ctx.events.publish(&svc, ev).await;
    }
    ctx.events.publish_once(&svc, plan.problem.as_ref()).await;
    if let (Some(notice), Some(claim)) = (&plan.owner_notice, &claim) {
        ctx.events.publish_once(claim.as_ref(), Some(notice)).await;
    }
    Ok(outcome)
}

/// While the load balancer does not show what was pinned: its refusal, in its words, when it
/// gave one (`False`, `LoadBalancerRefused`); else the pass looks again shortly, and a
/// Service that has no condition yet gets none (nothing judged is not a refusal — and the
/// usual association writes its condition once, `True`).
async fn while_waiting<D: Driver>(
    ctx: &Ctx<D>,
    svc: &Service,
    condition: Option<ServiceCondition>,
) -> (Option<ServiceCondition>, Outcome) {
    let waiting = matches!(&condition, Some((false, why, _)) if *why == address_controller_api::sharing::reason::WAITING_FOR_LOAD_BALANCER);
    if !waiting {
        return (condition, Outcome::Done);
    }
    if let Some(words) = ctx.driver.refusal(&ctx.client, svc).await {
        let message = format!("the load balancer refused the Service: {words}");
        return (
            Some((
                false,
                address_controller_api::sharing::reason::LOAD_BALANCER_REFUSED,
                message,
            )),
            Outcome::Done,
        );
    }
    let keep = address_controller_api::sharing::condition(svc).is_some();
    (
        condition.filter(|_| keep),
        Outcome::RequeueAfter(WAITING_RECHECK),
    )
}

/// Takes the Services `keys` off an address's holders.
async fn detach(ctx: &Ctx<impl Driver>, a: &IPAddress, keys: &[String]) -> Result<(), Error> {
    let list: Vec<Attachment> = a
        .attachments()
        .into_iter()
        .filter(|h| attachment_key(h).is_none_or(|k| !keys.contains(&k)))
        .collect();
    patch_address_status(ctx, a, ledger(ctx, a, list).await?).await
}

/// Brings the Service's `AddressAttached` condition to `want` (removes it for `None`):
/// applies [`condition_patch`]'s patch, if any.
async fn write_condition(
    ctx: &Ctx<impl Driver>,
    svc: &Service,
    want: Option<&ServiceCondition>,
) -> Result<(), Error> {
    let Some(body) = condition_patch(svc, want, Time(Timestamp::now())) else {
        return Ok(());
    };
    let key = crate::decide::service::service_key(svc);
    Api::<Service>::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default())
        .patch_status(
            &svc.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(body),
        )
        .await
        .map_err(kube_error(
            "writing the AddressAttached condition of Service",
            key,
        ))?;
    Ok(())
}

/// Whether the API's ledger names the Service `key` on every address newly in `marker`
/// (not yet in the Service's record of its pins) that the pass did not associate itself.
async fn ledger_confirms<D: Driver>(
    ctx: &Ctx<D>,
    key: &str,
    svc: &Service,
    marker: &[IpAddr],
    associated: &[Arc<IPAddress>],
) -> Result<bool, Error> {
    let had = parse_marker(svc.annotations().get(&ctx.marker).map(String::as_str));
    for ip in marker.iter().filter(|ip| !had.contains(ip)) {
        let Some(a) = own_address(ctx, *ip) else {
            continue;
        };
        if associated.iter().any(|x| x.name_any() == a.name_any()) {
            continue;
        }
        let live = Api::<IPAddress>::all(ctx.client.clone())
            .get_opt(&a.name_any())
            .await
            .map_err(kube_error("reading address", a.name_any()))?;
        if !live.is_some_and(|l| l.holder_services().iter().any(|h| h == key)) {
            return Ok(false);
        }
    }
    Ok(true)
}
