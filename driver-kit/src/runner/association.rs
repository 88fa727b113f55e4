//! The association passes: snapshots from the caches and indexes, the pure plans of
//! [`crate::association`], guarded writes in the plans' order.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use address_controller_api::conditions::set_condition;
use address_controller_api::{IPAddress, IPAddressClaim};
use address_controller_runtime::events::reference;
use address_controller_runtime::workers::Outcome;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::decide::health::{HealthPlan, HealthSnapshot, plan_health};
use crate::decide::service::{
    ServiceCondition, ServicePlan, ServiceSnapshot, is_load_balancer, parse_marker, plan_service,
    render_marker,
};
use crate::driver::{Driver, Presence};
use crate::runner::{Ctx, Error};
use address_controller_api::Attachment;
use address_controller_api::sharing::CONDITION;

fn kube_error(action: &'static str, object: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube {
        action,
        object,
        source,
    }
}

/// Patches an address's status with `body`, guarded by the version it was planned from.
async fn patch_address_status(
    ctx: &Ctx<impl Driver>,
    a: &IPAddress,
    status: Value,
) -> Result<(), Error> {
    let body =
        json!({"metadata": {"resourceVersion": a.metadata.resource_version}, "status": status});
    Api::<IPAddress>::all(ctx.client.clone())
        .patch_status(&a.name_any(), &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(kube_error("writing status of address", a.name_any()))?;
    Ok(())
}

/// The ledger's part of the status of `a` with `attachments` as its holders, now — after
/// the records of the spans it moves off the address are created (a closed span is on the
/// address or in a record at every instant).
async fn ledger(
    ctx: &Ctx<impl Driver>,
    a: &IPAddress,
    attachments: Vec<Attachment>,
) -> Result<Value, Error> {
    let now = Time(Timestamp::now());
    let before = a.attachments();
    let (status, records) = a.ledger_status(&before, &attachments, &now, true);
    match ensure_records(ctx, a, &records).await? {
        address_controller_runtime::records::Ensured::Created(_) => Ok(status),
        address_controller_runtime::records::Ensured::Unavailable(why) => {
            tracing::warn!(address = %a.name_any(), "{why}");
            Ok(a.ledger_status(&before, &attachments, &now, false).0)
        }
    }
}

/// Creates the records of the entries a write of `a` moves off it (already there is
/// success).
async fn ensure_records(
    ctx: &Ctx<impl Driver>,
    a: &IPAddress,
    records: &[address_controller_api::history::Record],
) -> Result<address_controller_runtime::records::Ensured, Error> {
    address_controller_runtime::records::ensure(&ctx.client, records)
        .await
        .map_err(kube_error(
            "creating history records of address",
            a.name_any(),
        ))
}

fn attachment_key(h: &Attachment) -> Option<String> {
    h.association().service_key()
}

/// The Services that show `ip` (by the backend's word), the backend's own (a hold) left out.
pub(crate) fn shown_by<D: Driver>(ctx: &Ctx<D>, ip: IpAddr) -> Vec<String> {
    ctx.services
        .mentioning(ip)
        .into_iter()
        .filter(|k| {
            ctx.world
                .services
                .as_ref()
                .and_then(|c| c.get(k))
                .is_some_and(|s| !ctx.driver.internal(&s) && ctx.driver.shown(&s).contains(&ip))
        })
        .collect()
}

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

/// How often a Service pinned and not yet shown is looked at again (until the load balancer
/// shows it — which wakes the pass by itself — or says why not).
const WAITING_RECHECK: Duration = Duration::from_secs(5);

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

/// Brings the Service's `AddressAttached` condition to `want` (removes it for `None`);
/// writes nothing when it already says so. A strategic merge patch of the status: the
/// condition list is keyed by type, so the Service's other conditions are left alone.
async fn write_condition(
    ctx: &Ctx<impl Driver>,
    svc: &Service,
    want: Option<&ServiceCondition>,
) -> Result<(), Error> {
    let have = address_controller_api::sharing::condition(svc);
    let body = match (have, want) {
        (None, None) => return Ok(()),
        (Some(h), Some((on, why, message)))
            if (h.status == "True") == *on && h.reason == *why && h.message == *message =>
        {
            return Ok(());
        }
        (Some(_), None) => {
            json!({"status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}})
        }
        (_, Some((on, why, message))) => {
            let changed = have.is_none_or(|h| (h.status == "True") != *on);
            let since = match (changed, have) {
                (false, Some(h)) => h.last_transition_time.clone(),
                _ => Time(Timestamp::now()),
            };
            json!({"status": {"conditions": [{"type": CONDITION,
                "status": if *on { "True" } else { "False" },
                "reason": why, "message": message,
                "observedGeneration": svc.metadata.generation,
                "lastTransitionTime": since}]}})
        }
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

/// One pass over an address of this driver's classes: Lost, Conflict, a dangling
/// `associatedTo`.
pub(crate) async fn health_pass<D: Driver>(ctx: &Ctx<D>, a: &IPAddress) -> Result<Outcome, Error> {
    if let Some(Ok(p)) = ctx.params(&a.spec.class_name)
        && !a.is_deleting()
    {
        ctx.driver
            .sync_address(&ctx.client, a, &p)
            .await
            .map_err(|message| Error::Backend {
                object: format!("address {}", a.name_any()),
                message,
            })?;
    }
    // Only what the driver provisioned is in the backend's books: an admin's static address
    // of the class is not the backend's to lose.
    let provisioned = a
        .annotations()
        .get(address_controller_api::names::PROVISIONED_BY_ANNOTATION)
        .is_some_and(|p| p == ctx.driver.provisioner());
    let presence = match ctx.params(&a.spec.class_name) {
        Some(Ok(p)) if provisioned => ctx.driver.presence(&p, a),
        _ => Presence::Unknown,
    };
    let shown_by = a.ip().map(|ip| shown_by(ctx, ip)).unwrap_or_default();
    let gone_holders = gone_holders(ctx, a).await?;
    let plan = plan_health(&HealthSnapshot {
        address: a,
        presence,
        shown_by: &shown_by,
        gone_holders: &gone_holders,
    });
    let writes = plan.phase.is_some() || !plan.clear_holders.is_empty();
    apply_address(ctx, a, plan).await?;
    if writes {
        // Its event brings the pass back; the spans move then.
        return Ok(Outcome::Done);
    }
    move_spans(ctx, a).await
}

/// A pass that writes nothing else moves an older version's backlog of spans to records,
/// a batch per write at the kit's pace (`--history-move-rate`, a turn reserved per address:
/// the pass comes back at it, no worker waits), each record created before its span
/// leaves; nothing when the records cannot be made (the spans stay, and a later ledger
/// write that closes one tries again).
async fn move_spans<D: Driver>(ctx: &Ctx<D>, a: &IPAddress) -> Result<Outcome, Error> {
    let Some((status, records)) = a.spans_move() else {
        return Ok(Outcome::Done);
    };
    if let Some(wait) = ctx.moves.slot(&a.name_any()) {
        return Ok(Outcome::RequeueAfter(wait));
    }
    match ensure_records(ctx, a, &records).await? {
        address_controller_runtime::records::Ensured::Created(_) => {
            patch_address_status(ctx, a, status).await?;
            tracing::info!(address = %a.name_any(), spans = records.len(), "moved an older version's Service spans to records");
        }
        address_controller_runtime::records::Ensured::Unavailable(_) => {}
    }
    Ok(Outcome::Done)
}

/// The cached address of this driver's classes that is `ip`.
fn own_address<D: Driver>(ctx: &Ctx<D>, ip: IpAddr) -> Option<Arc<IPAddress>> {
    ctx.inventory
        .addresses_of(ip)
        .iter()
        .filter_map(|n| ctx.world.addresses.get(n))
        .find(|a| ctx.owns(a))
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

/// The holders the ledger of `a` lists whose Service is gone: gone from the cache, and
/// confirmed gone by the API ([`service_gone`]).
async fn gone_holders<D: Driver>(ctx: &Ctx<D>, a: &IPAddress) -> Result<Vec<String>, Error> {
    let Some(cache) = ctx.world.services.as_ref() else {
        return Ok(Vec::new());
    };
    let mut gone = Vec::new();
    for key in a.holder_services() {
        if cache.get(&key).is_none() && service_gone(ctx, &key).await? {
            gone.push(key);
        }
    }
    Ok(gone)
}

/// Whether the API has no Service `key` (`namespace/name`) — asked when the cache has none.
/// The ledger names a holder by `namespace/name`, and the cache can lag behind a Service
/// deleted and created again under that name (a tenant's `kubectl replace`, a GitOps
/// sync): taking the entry off then leaves the new Service, which names the claim and
/// which MetalLB already serves from the address, with no word from the ledger — a
/// `Conflict` until the next pass lists it again (seen: 85 ms, under load).
async fn service_gone<D: Driver>(ctx: &Ctx<D>, key: &str) -> Result<bool, Error> {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let live = Api::<Service>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(kube_error("reading Service", key.to_string()))?;
    Ok(live.is_none())
}

async fn apply_address<D: Driver>(
    ctx: &Ctx<D>,
    a: &IPAddress,
    plan: HealthPlan,
) -> Result<(), Error> {
    let mut status = serde_json::Map::new();
    if let Some((phase, condition, on, message)) = &plan.phase {
        let mut conditions = a.status.clone().unwrap_or_default().conditions;
        set_condition(
            &mut conditions,
            condition,
            *on,
            if *on { condition } else { "Recovered" },
            message.clone(),
            a.metadata.generation,
            &Time(Timestamp::now()),
        );
        status.insert("phase".into(), json!(phase));
        status.insert("conditions".into(), json!(conditions));
    }
    if !plan.clear_holders.is_empty() {
        let list: Vec<Attachment> = a
            .attachments()
            .into_iter()
            .filter(|h| attachment_key(h).is_none_or(|k| !plan.clear_holders.contains(&k)))
            .collect();
        if let Value::Object(m) = ledger(ctx, a, list).await? {
            status.extend(m);
        }
    }
    if !status.is_empty() {
        patch_address_status(ctx, a, Value::Object(status)).await?;
    }
    for ev in &plan.events {
        tracing::info!(address = %a.name_any(), reason = ev.reason, "{}", ev.note);
        ctx.events.publish(a, ev).await;
    }
    for (key, ev) in &plan.offenders {
        if let Some(s) = ctx.world.services.as_ref().and_then(|c| c.get(key)) {
            ctx.events.publish_on(reference(s.as_ref()), ev).await;
        }
    }
    Ok(())
}
