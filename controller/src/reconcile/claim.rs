//! The claim pass: snapshot from the caches and indexes, [`plan_claim`], guarded writes.

use std::sync::Arc;

use address_controller_api::family::Family;
use address_controller_api::names::{PROVISIONER_ANNOTATION, condition, reason};
use address_controller_api::service::claim_key;
use address_controller_api::{
    ClaimPhase, ClaimServices, IPAddress, IPAddressClaim, IPAddressClaimStatus,
};
use address_controller_runtime::workers::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::guarded;
use crate::context::Context;
use crate::decide::claim::{AddressWrite, ClaimPlan, ClaimSnapshot, pin_of, plan_claim};
use crate::decide::is_free;
use crate::error::{Error, Result};
use crate::index::Pool;

/// How often a pass recomputes after losing a race for a candidate to another worker.
const MAX_CANDIDATE_RETRIES: usize = 8;

/// One pass over the claim `namespace/name`.
pub async fn reconcile(ctx: Arc<Context>, key: String) -> Result<Outcome> {
    let result = pass(&ctx, &key).await;
    // The claim is no longer woken for a free address: let the pump wake the next one.
    ctx.queues.claims.add_all(ctx.index.pass_done(&key));
    result
}

async fn pass(ctx: &Context, key: &str) -> Result<Outcome> {
    let Some(cached) = ctx.world.claims.get(key) else {
        return Ok(Outcome::Done);
    };
    let claim = ctx.recent_claims.latest(cached);
    let latest = |name: &str| {
        ctx.world
            .addresses
            .get(name)
            .map(|a| ctx.recent_addresses.latest(a))
    };
    let named: Vec<Arc<IPAddress>> = ctx
        .index
        .addresses_naming(key)
        .iter()
        .filter_map(|n| latest(n))
        .collect();
    let pin = pin_of(&claim).map(str::to_string);
    let pinned = pin.as_deref().and_then(latest);
    let pinned_taken = pin
        .as_deref()
        .is_some_and(|p| ctx.index.reserved_by_other(p, key));
    let classes = ctx.world.classes();
    // The lowest free address nobody is binding, as this process last wrote it.
    let candidate = |class: &str, f: Family| -> Option<Arc<IPAddress>> {
        let pool: Pool = (class.to_string(), f);
        let name = ctx
            .index
            .candidate(&pool, |n| latest(n).is_none_or(|a| !is_free(&a, class, f)))?;
        latest(&name)
    };
    let ns = claim.namespace().unwrap_or_default();
    let labels = ctx.world.namespace_labels(&ns);
    let quota = |class: &str| ctx.quota.standing(&ns, class, key);
    let services = services_of(ctx, key);
    for _ in 0..MAX_CANDIDATE_RETRIES {
        let plan = plan_claim(&ClaimSnapshot {
            claim: &claim,
            named: &named,
            pinned: pinned.as_deref(),
            pinned_taken,
            candidate: &candidate,
            address: &latest,
            classes: &classes,
            namespace_labels: labels.as_ref(),
            quota: &quota,
            services,
            now: Time(Timestamp::now()),
        });
        // Refused over quota behind a take that may never show: pass again when it expires.
        let recheck = plan
            .status
            .as_ref()
            .or(claim.status.as_ref())
            .filter(|st| st.entitlement_refusal() == Some(reason::QUOTA_EXCEEDED))
            .and_then(|st| st.class_name.as_deref())
            .and_then(|class| ctx.quota.next_take_expiry(&ns, class, key));
        if plan.is_empty() {
            return Ok(recheck.map_or(Outcome::Done, Outcome::RequeueAfter));
        }
        // Reserve what this plan binds, so other workers plan around it instead of fighting
        // over the lowest name; if another got there first, recompute.
        let Some(reserved) = reserve(ctx, &plan, key, &latest) else {
            continue;
        };
        // Then the quota (§13): another worker may have taken the last slot since the
        // plan read the usage; then replan, and the plan says QuotaExceeded.
        let took = plan
            .quota_take
            .as_ref()
            .map(|t| ctx.quota.take(key, &t.class, &t.families, &t.limits));
        if took == Some(false) {
            unreserve(ctx, &reserved);
            continue;
        }
        let binds = plan.binds().next().is_some();
        let result = apply(ctx, &claim, plan).await;
        if let Err(e) = &result {
            undo_reservations(
                ctx,
                key,
                &reserved,
                took == Some(true) && !binds && e.refused(),
            );
        }
        return result.map(|()| recheck.map_or(Outcome::Done, Outcome::RequeueAfter));
    }
    Err(Error::Conflict {
        action: "choosing an address",
        object: key.to_string(),
    })
}

/// The Services naming claim KEY, counted for its status (`None` without a Service cache).
fn services_of(ctx: &Context, key: &str) -> Option<ClaimServices> {
    ctx.world.services.as_ref().and_then(|cache| {
        let naming: Vec<_> = ctx
            .index
            .services_naming(key)
            .iter()
            .filter_map(|k| cache.get(k))
            .filter(|s| claim_key(s).as_deref() == Some(key))
            .collect();
        ClaimServices::count(naming.iter().map(|s| s.as_ref()))
    })
}

/// Reserves in the index every address `plan` binds, so other workers plan around them.
/// `None` when another worker got one first (what this pass reserved is released).
fn reserve(
    ctx: &Context,
    plan: &ClaimPlan,
    key: &str,
    latest: &dyn Fn(&str) -> Option<Arc<IPAddress>>,
) -> Option<Vec<String>> {
    let mut reserved: Vec<String> = Vec::new();
    for name in plan.binds() {
        let pool = latest(name).and_then(|a| Some((a.spec.class_name.clone(), a.family()?)));
        match pool {
            Some(p) if ctx.index.reserve(name, &p, key) => reserved.push(name.to_string()),
            _ => {
                unreserve(ctx, &reserved);
                return None;
            }
        }
    }
    Some(reserved)
}

fn unreserve(ctx: &Context, reserved: &[String]) {
    for r in reserved {
        ctx.queues.claims.add_all(ctx.index.unreserve(r));
    }
}

/// A plan whose writes failed: the addresses it reserved are free again for others. (After
/// a successful bind the reservation ends when the cache shows the address taken.)
///
/// `end_take`: a take for an invitation alone ends when the API server refused its write. A
/// take stays when the write may have landed — a bind's (a later write may have failed
/// after it), or an invitation's answered by a timeout, a 5xx or a broken connection
/// (kube-apiserver answers 504 to a write it completes; the chaos run's kube-apiserver
/// restart took a namespace past its quota that way, the slot freed while the invitation
/// stood): no resourceVersion guards a namespace's count, so it ends when the cache shows
/// the address or the invitation, when the claim stops waiting, or after its TTL (stricter,
/// never looser, in the meantime).
fn undo_reservations(ctx: &Context, key: &str, reserved: &[String], end_take: bool) {
    unreserve(ctx, reserved);
    if end_take {
        ctx.queues.claims.add_all(ctx.quota.release(key));
    }
}

async fn apply(ctx: &Context, claim: &Arc<IPAddressClaim>, plan: ClaimPlan) -> Result<()> {
    let ns = claim.namespace().unwrap_or_default();
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let key = format!("{ns}/{}", claim.name_any());
    let mut current: IPAddressClaim = claim.as_ref().clone();
    if let Some(meta) = &plan.metadata {
        let mut m = serde_json::Map::new();
        if let Some(f) = &meta.finalizers {
            m.insert("finalizers".into(), json!(f));
        }
        if let Some(p) = &meta.provisioner {
            m.insert("annotations".into(), json!({ PROVISIONER_ANNOTATION: p }));
        }
        let updated = patch_meta(&claims, &current, Value::Object(m)).await?;
        ctx.recent_claims.record(&current, updated.clone());
        current = updated;
    }
    for w in &plan.address_writes {
        write_address(ctx, w).await?;
    }
    if let Some(status) = &plan.status {
        current = write_status(ctx, &claims, current, status, &key).await?;
    }
    if let Some(finalizers) = &plan.finalize {
        patch_meta(&claims, &current, json!({ "finalizers": finalizers })).await?;
    }
    for ev in &plan.events {
        tracing::info!(claim = %key, reason = ev.reason, "{}", ev.note);
        ctx.events.publish(claim.as_ref(), ev).await;
    }
    for (name, ev) in &plan.address_events {
        if let Some(a) = ctx.world.addresses.get(name) {
            ctx.events.publish_once(a.as_ref(), Some(ev)).await;
        }
    }
    Ok(())
}

/// One write of the plan to an address (bind, complete the uid, release, delete), each
/// guarded; what it wrote is remembered until the cache shows it.
async fn write_address(ctx: &Context, w: &AddressWrite) -> Result<()> {
    let address_api: Api<IPAddress> = Api::all(ctx.client.clone());
    let params = PatchParams::default();
    let name = w.address_name().to_string();
    let before = ctx
        .world
        .addresses
        .get(&name)
        .map(|a| ctx.recent_addresses.latest(a));
    let written = match w {
        AddressWrite::Bind {
            resource_version,
            claim_ref,
            ..
        }
        | AddressWrite::CompleteUid {
            resource_version,
            claim_ref,
            ..
        } => {
            let body = guarded(
                resource_version.as_deref(),
                json!({"spec": {"claimRef": claim_ref}}),
            );
            Some(
                address_api
                    .patch(&name, &params, &Patch::Merge(body))
                    .await
                    .map_err(Error::kube_other("binding address", name.clone()))?,
            )
        }
        AddressWrite::Release {
            resource_version,
            status,
            ..
        } => {
            let status = crate::reconcile::address::recorded_write(ctx, status, false, &name)
                .await?
                .unwrap_or_else(|| status.clone());
            let body = guarded(
                resource_version.as_deref(),
                crate::reconcile::address::status_body(&status),
            );
            Some(
                address_api
                    .patch_status(&name, &params, &Patch::Merge(body))
                    .await
                    .map_err(Error::kube_other("releasing address", name.clone()))?,
            )
        }
        AddressWrite::Delete { uid, .. } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: uid.clone(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match address_api.delete(&name, &dp).await {
                Ok(_) => None,
                Err(kube::Error::Api(s)) if s.code == 404 => None,
                Err(e) => return Err(Error::kube_other("deleting address", name)(e)),
            }
        }
    };
    if let (Some(before), Some(after)) = (before, written) {
        ctx.recent_addresses.record(before.as_ref(), after);
    }
    Ok(())
}

/// The claim's status write, guarded by `current`'s resourceVersion; a first bind is
/// timed for the bind-latency histogram.
async fn write_status(
    ctx: &Context,
    claims: &Api<IPAddressClaim>,
    current: IPAddressClaim,
    status: &IPAddressClaimStatus,
    key: &str,
) -> Result<IPAddressClaim> {
    tracing::debug!(claim = %key, old = ?current.status, new = ?status, "writing claim status");
    let first_bind = status.phase == Some(ClaimPhase::Bound)
        && current
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_none_or(|p| p == ClaimPhase::Pending);
    let waited_since = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::BOUND))
        .filter(|c| c.reason == reason::WAITING_FOR_PROVISIONING)
        .map(|c| c.last_transition_time.0);
    let body = guarded(
        current.metadata.resource_version.as_deref(),
        json!({ "status": status_body(status) }),
    );
    let updated = claims
        .patch_status(
            &current.name_any(),
            &PatchParams::default(),
            &Patch::Merge(body),
        )
        .await
        .map_err(Error::kube("writing claim status", key.to_string()))?;
    ctx.recent_claims.record(&current, updated.clone());
    if first_bind {
        let class = status.class_name.as_deref().unwrap_or_default();
        let created = updated.metadata.creation_timestamp.as_ref().map(|t| t.0);
        ctx.metrics.bound(class, created, waited_since);
    }
    Ok(updated)
}

async fn patch_meta(
    claims: &Api<IPAddressClaim>,
    current: &IPAddressClaim,
    meta: Value,
) -> Result<IPAddressClaim> {
    let body = guarded(
        current.metadata.resource_version.as_deref(),
        json!({ "metadata": meta }),
    );
    let key = format!(
        "{}/{}",
        current.namespace().unwrap_or_default(),
        current.name_any()
    );
    claims
        .patch(
            &current.name_any(),
            &PatchParams::default(),
            &Patch::Merge(body),
        )
        .await
        .map_err(Error::kube("patching claim metadata", key))
}

/// The whole core-owned status, with emptied lists written as null so that a merge
/// patch clears them instead of leaving the old values.
fn status_body(s: &IPAddressClaimStatus) -> Value {
    json!({
        "phase": s.phase,
        "className": s.class_name,
        "addresses": if s.addresses.is_empty() { Value::Null } else { json!(s.addresses) },
        "services": s.services,
        "conditions": if s.conditions.is_empty() { Value::Null } else { json!(s.conditions) },
    })
}
