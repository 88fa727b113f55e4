use std::sync::Arc;

use address_controller_api::names::PROVISIONER_ANNOTATION;
use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::guarded;
use crate::context::Context;
use crate::decide::claim::{AddressWrite, ClaimPlan, ClaimSnapshot, plan_claim};
use crate::error::{Error, Result};
use crate::recent::key_of;

/// How often a pass recomputes after losing a race for a candidate to another worker.
const MAX_CANDIDATE_RETRIES: usize = 8;

pub async fn reconcile(obj: Arc<IPAddressClaim>, ctx: Arc<Context>) -> Result<Action> {
    super::instrumented(&ctx, "claim", reconcile_inner(&obj, &ctx)).await
}

async fn reconcile_inner(obj: &IPAddressClaim, ctx: &Context) -> Result<Action> {
    let Some(cached) = ctx.stores.claims.get(&ObjectRef::from_obj(obj)) else {
        return Ok(Action::await_change());
    };
    let claim = ctx.recent_claims.latest(cached);
    let key = key_of(claim.as_ref());
    for _ in 0..MAX_CANDIDATE_RETRIES {
        let addresses = ctx.recent_addresses.overlay(ctx.stores.addresses.state());
        let classes = ctx.stores.classes.state();
        let taken = ctx.in_flight.taken_by_others(&key);
        let now = Time(Timestamp::now());
        let plan = plan_claim(&ClaimSnapshot {
            claim: &claim,
            addresses: &addresses,
            classes: &classes,
            taken: &taken,
            now,
        });
        if plan.is_empty() {
            return Ok(Action::await_change());
        }
        // Reserve the free addresses this plan binds; if another worker got there first,
        // recompute without them rather than fighting over the same object.
        let binds: Vec<&str> = plan
            .address_writes
            .iter()
            .filter(|w| matches!(w, AddressWrite::Bind { .. }))
            .map(AddressWrite::address_name)
            .collect();
        let mut reserved = Vec::new();
        let all = binds.iter().all(|b| {
            let ok = ctx.in_flight.reserve(b, &key);
            if ok {
                reserved.push(b.to_string());
            }
            ok
        });
        if !all {
            reserved.iter().for_each(|r| ctx.in_flight.release(r));
            continue;
        }
        let result = apply(ctx, &claim, &addresses, plan).await;
        reserved.iter().for_each(|r| ctx.in_flight.release(r));
        return result.map(|()| Action::await_change());
    }
    Err(Error::Conflict {
        action: "choosing an address",
        object: key,
    })
}

async fn apply(
    ctx: &Context,
    claim: &Arc<IPAddressClaim>,
    addresses: &[Arc<IPAddress>],
    plan: ClaimPlan,
) -> Result<()> {
    let ns = claim.namespace().unwrap_or_default();
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let address_api: Api<IPAddress> = Api::all(ctx.client.clone());
    let params = PatchParams::default();
    let key = key_of(claim.as_ref());
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
        let name = w.address_name().to_string();
        let before = addresses.iter().find(|a| a.name_any() == name);
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
                        .map_err(Error::kube("binding address", name.clone()))?,
                )
            }
            AddressWrite::Release {
                resource_version, ..
            } => {
                let body = guarded(
                    resource_version.as_deref(),
                    json!({"status": {"phase": "Released", "releasedAt": Time(Timestamp::now())}}),
                );
                Some(
                    address_api
                        .patch_status(&name, &params, &Patch::Merge(body))
                        .await
                        .map_err(Error::kube("releasing address", name.clone()))?,
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
                    Err(e) => return Err(Error::kube("deleting address", name)(e)),
                }
            }
        };
        if let (Some(before), Some(after)) = (before, written) {
            ctx.recent_addresses.record(before.as_ref(), after);
        }
    }

    if let Some(status) = &plan.status {
        tracing::debug!(claim = %key, old = ?current.status, new = ?status, "writing claim status");
        let body = guarded(
            current.metadata.resource_version.as_deref(),
            json!({ "status": status_body(status) }),
        );
        let updated = claims
            .patch_status(&current.name_any(), &params, &Patch::Merge(body))
            .await
            .map_err(Error::kube("writing claim status", key.clone()))?;
        ctx.recent_claims.record(&current, updated.clone());
        current = updated;
    }

    if let Some(finalizers) = &plan.finalize {
        patch_meta(&claims, &current, json!({ "finalizers": finalizers })).await?;
    }

    for ev in &plan.events {
        tracing::info!(claim = %key, reason = ev.reason, "{}", ev.note);
        ctx.publish(claim.as_ref(), ev).await;
    }
    Ok(())
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
    claims
        .patch(
            &current.name_any(),
            &PatchParams::default(),
            &Patch::Merge(body),
        )
        .await
        .map_err(Error::kube("patching claim metadata", key_of(current)))
}

/// The whole core-owned status, with emptied lists written as null so that a merge
/// patch clears them instead of leaving the old values.
fn status_body(s: &IPAddressClaimStatus) -> Value {
    json!({
        "phase": s.phase,
        "className": s.class_name,
        "addresses": if s.addresses.is_empty() { Value::Null } else { json!(s.addresses) },
        "conditions": if s.conditions.is_empty() { Value::Null } else { json!(s.conditions) },
    })
}
