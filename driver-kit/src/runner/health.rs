//! The health pass: applies [`crate::decide::health`]'s plan for an address — the
//! holders it lists checked against the Services that show it, spans moved.

use address_controller_api::IPAddress;
use address_controller_api::conditions::set_condition;
use address_controller_runtime::events::reference;
use address_controller_runtime::workers::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::decide::health::{HealthPlan, HealthSnapshot, plan_health};
use crate::driver::{Driver, Presence};
use crate::runner::ledger::{
    attachment_key, ensure_records, ledger, patch_address_status, service_gone, shown_by,
};
use crate::runner::{Ctx, Error};
use address_controller_api::Attachment;

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
