//! The address pass: snapshot from the caches and indexes, [`plan_address`], confirmation
//! by direct reads before anything that rests on another object's state, guarded writes.

use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim};
use address_controller_runtime::events::reference;
use address_controller_runtime::workers::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::guarded;
use crate::context::Context;
use crate::decide::address::{AddressPlan, AddressSnapshot, plan_address};
use crate::error::{Error, Result};

/// One pass over the address `name`.
pub async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Outcome> {
    let Some(cached) = ctx.world.addresses.get(&name) else {
        return Ok(Outcome::Done);
    };
    // The resourceVersion the watch delivered (what a pass is woken by, or not).
    let rv = cached
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    tracing::debug!(address = %name, rv = %rv, "address pass");
    let mut address = ctx.recent_addresses.latest(cached);
    let claim_ref = address.spec.claim_ref.clone();
    let mut claim: Option<Arc<IPAddressClaim>> = claim_ref
        .as_ref()
        .and_then(|r| ctx.world.claims.get(&r.key()))
        .map(|c| ctx.recent_claims.latest(c));
    let mut siblings: Vec<Arc<IPAddress>> = match &claim_ref {
        Some(r) => ctx
            .index
            .addresses_naming(&r.key())
            .iter()
            .filter(|n| **n != name)
            .filter_map(|n| ctx.world.addresses.get(n))
            .map(|a| ctx.recent_addresses.latest(a))
            .collect(),
        None => Vec::new(),
    };
    siblings.push(address.clone());
    let class = ctx.world.classes.get(&address.spec.class_name);
    let plan_for =
        |address: &IPAddress, claim: Option<&IPAddressClaim>, siblings: &[Arc<IPAddress>]| {
            plan_address(&AddressSnapshot {
                address,
                claim,
                siblings,
                class: class.as_deref(),
                now: Time(Timestamp::now()),
            })
        };
    let mut plan = plan_for(&address, claim.as_deref(), &siblings);
    if plan.confirm {
        // SPEC §5.6: never act on the cache's word about other objects alone. The address,
        // its claim and its siblings are read from the API server and the pass is planned
        // again on what it says.
        let api: Api<IPAddress> = Api::all(ctx.client.clone());
        let Some(fresh) = api
            .get_opt(&name)
            .await
            .map_err(Error::kube("re-reading address", name.clone()))?
        else {
            return Ok(Outcome::Done);
        };
        claim = match fresh.spec.claim_ref.as_ref().filter(|r| r.is_valid()) {
            Some(r) => Api::<IPAddressClaim>::namespaced(ctx.client.clone(), &r.namespace)
                .get_opt(&r.name)
                .await
                .map_err(Error::kube_other("confirming claim", r.key()))?
                .map(Arc::new),
            None => None,
        };
        let mut fresh_siblings = Vec::new();
        for s in siblings.iter().filter(|s| s.name_any() != name) {
            if let Some(a) = api
                .get_opt(&s.name_any())
                .await
                .map_err(Error::kube_other("re-reading address", s.name_any()))?
            {
                fresh_siblings.push(Arc::new(a));
            }
        }
        address = Arc::new(fresh);
        fresh_siblings.push(address.clone());
        siblings = fresh_siblings;
        plan = plan_for(&address, claim.as_deref(), &siblings);
    }
    apply(&ctx, &address, claim.as_deref(), plan).await
}

/// The status patch of an address's status write (the address pass's, and the claim's
/// reclaim's): phase, release and, when it changes, the history.
pub(crate) fn status_body(
    status: &crate::decide::address::AddressStatusWrite,
) -> serde_json::Value {
    let mut fields = json!({"phase": status.phase, "releasedAt": status.released_at,
        "releasedFrom": status.released_from, "reason": status.reason});
    if let Some(settled) = &status.history {
        settled.write_holdings(&mut fields);
    }
    json!({ "status": fields })
}

/// Creates the history records a write is about to move off an address (or that a deleted
/// address's finalizer lets go), first: a closed entry is on its address or in a record at
/// every instant, whatever crashes between the two.
/// False when records cannot be made here (the kind not installed, or not allowed): the
/// caller keeps the entries on the address instead.
pub(crate) async fn records_first(
    ctx: &Context,
    records: &[address_controller_api::history::Record],
    name: &str,
) -> Result<bool> {
    use address_controller_runtime::records::{Ensured, ensure};
    match ensure(&ctx.client, records)
        .await
        .map_err(Error::kube_other(
            "creating history records",
            name.to_string(),
        ))? {
        Ensured::Created(n) => {
            ctx.metrics.records_created(n);
            Ok(true)
        }
        Ensured::Unavailable(why) => {
            tracing::warn!(address = %name, "{why}");
            Ok(false)
        }
    }
}

/// The status write to make after its records: as planned, or with nothing moved when the
/// records cannot be made (`None`: nothing left to write).
pub(crate) async fn recorded_write(
    ctx: &Context,
    status: &crate::decide::address::AddressStatusWrite,
    only_moves: bool,
    name: &str,
) -> Result<Option<crate::decide::address::AddressStatusWrite>> {
    Ok(if records_first(ctx, &status.records, name).await? {
        Some(status.clone())
    } else {
        status.unmoved(only_moves)
    })
}

async fn apply(
    ctx: &Context,
    address: &Arc<IPAddress>,
    claim: Option<&IPAddressClaim>,
    plan: AddressPlan,
) -> Result<Outcome> {
    let api: Api<IPAddress> = Api::all(ctx.client.clone());
    let name = address.name_any();
    let params = PatchParams::default();
    let mut current: IPAddress = address.as_ref().clone();

    // A write that only moves an older version's backlog waits for its turn — away from the
    // worker: the pass comes back at it, and other addresses' passes go on meanwhile.
    if plan.moves_history
        && let Some(wait) = ctx.history.moves.slot(&name)
    {
        return Ok(Outcome::RequeueAfter(wait));
    }
    // A deleted address's history: recorded before the finalizer goes — or, when records
    // cannot be made here, said loudly (the deletion is not held up for it).
    if !records_first(ctx, &plan.records, &name).await? {
        tracing::warn!(address = %name, entries = plan.records.len(), "deleted without its history recorded");
    }
    if let Some(finalizers) = &plan.finalizers {
        let body = guarded(
            current.metadata.resource_version.as_deref(),
            json!({"metadata": {"finalizers": finalizers}}),
        );
        let updated = api
            .patch(&name, &params, &Patch::Merge(body))
            .await
            .map_err(Error::kube("patching address finalizers", name.clone()))?;
        ctx.recent_addresses.record(&current, updated.clone());
        current = updated;
    }
    let status = match &plan.status {
        Some(s) => recorded_write(ctx, s, plan.moves_history, &name).await?,
        None => None,
    };
    if let Some(status) = &status {
        let body = guarded(
            current.metadata.resource_version.as_deref(),
            status_body(status),
        );
        let updated = api
            .patch_status(&name, &params, &Patch::Merge(body))
            .await
            .map_err(Error::kube("writing address status", name.clone()))?;
        ctx.recent_addresses.record(&current, updated.clone());
        current = updated;
    }
    if plan.clear_claim_ref {
        let body = guarded(
            current.metadata.resource_version.as_deref(),
            json!({"spec": {"claimRef": null}}),
        );
        let updated = api
            .patch(&name, &params, &Patch::Merge(body))
            .await
            .map_err(Error::kube("clearing claimRef", name.clone()))?;
        ctx.recent_addresses.record(&current, updated);
    }
    if plan.delete {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: address.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube("deleting address", name)(e)),
        }
    }
    for ev in &plan.events {
        tracing::info!(address = %name, reason = ev.reason, "{}", ev.note);
        ctx.events.publish(address.as_ref(), ev).await;
    }
    if let Some(claim) = claim {
        for ev in &plan.claim_events {
            tracing::info!(address = %name, reason = ev.reason, "{}", ev.note);
            ctx.events.publish_on(reference(claim), ev).await;
        }
    }
    ctx.events
        .publish_once(address.as_ref(), plan.once_event.as_ref())
        .await;
    Ok(plan
        .requeue_after
        .map_or(Outcome::Done, Outcome::RequeueAfter))
}
