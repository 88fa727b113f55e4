use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::guarded;
use crate::context::Context;
use crate::decide::address::{AddressPlan, AddressSnapshot, plan_address};
use crate::error::{Error, Result};

pub async fn reconcile(obj: Arc<IPAddress>, ctx: Arc<Context>) -> Result<Action> {
    super::instrumented(&ctx, "address", reconcile_inner(&obj, &ctx)).await
}

async fn reconcile_inner(obj: &IPAddress, ctx: &Context) -> Result<Action> {
    let Some(cached) = ctx.stores.addresses.get(&ObjectRef::from_obj(obj)) else {
        return Ok(Action::await_change());
    };
    let mut address = ctx.recent_addresses.latest(cached);
    let cached_claim: Option<Arc<IPAddressClaim>> = address.spec.claim_ref.as_ref().and_then(|r| {
        ctx.stores
            .claims
            .get(&ObjectRef::new(&r.name).within(&r.namespace))
            .map(|c| ctx.recent_claims.latest(c))
    });
    let class: Option<Arc<IPAddressClass>> = ctx
        .stores
        .classes
        .get(&ObjectRef::new(&address.spec.class_name));
    let plan_for = |address: &IPAddress, claim: Option<&IPAddressClaim>| {
        plan_address(&AddressSnapshot {
            address,
            claim,
            class: class.as_deref(),
            now: Time(Timestamp::now()),
        })
    };
    let mut plan = plan_for(&address, cached_claim.as_deref());
    if plan.confirm_claim_absent {
        // SPEC §5.6: never act destructively on the cache's word alone. Both objects are
        // read directly and the pass is planned again on what the API server says.
        let name = address.name_any();
        let Some(fresh) = Api::<IPAddress>::all(ctx.client.clone())
            .get_opt(&name)
            .await
            .map_err(Error::kube("re-reading address", name.clone()))?
        else {
            return Ok(Action::await_change());
        };
        let fresh_claim = match &fresh.spec.claim_ref {
            Some(r) => Api::<IPAddressClaim>::namespaced(ctx.client.clone(), &r.namespace)
                .get_opt(&r.name)
                .await
                .map_err(Error::kube(
                    "confirming claim",
                    format!("{}/{}", r.namespace, r.name),
                ))?,
            None => None,
        };
        plan = plan_for(&fresh, fresh_claim.as_ref());
        address = Arc::new(fresh);
    }
    apply(ctx, &address, plan).await
}

async fn apply(ctx: &Context, address: &Arc<IPAddress>, plan: AddressPlan) -> Result<Action> {
    let api: Api<IPAddress> = Api::all(ctx.client.clone());
    let name = address.name_any();
    let params = PatchParams::default();
    let mut current: IPAddress = address.as_ref().clone();

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
    if let Some(status) = &plan.status {
        let body = guarded(
            current.metadata.resource_version.as_deref(),
            json!({"status": {"phase": status.phase, "releasedAt": status.released_at}}),
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
        ctx.publish(address.as_ref(), ev).await;
    }
    ctx.publish_once(address.as_ref(), plan.once_event.as_ref())
        .await;
    Ok(plan
        .requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}
