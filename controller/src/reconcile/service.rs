//! Auto-claims (SPEC §7): gather the Service, its classes and same-named claim; apply the
//! plan. At most two writes per Service, ever: create the claim, annotate the Service.

use std::sync::Arc;

use address_controller_api::names::SERVICE_CLAIM_ANNOTATION;
use address_controller_api::{IPAddressClaim, IPAddressClaimSpec};
use address_controller_runtime::workers::Outcome;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::guarded;
use crate::context::Context;
use crate::decide::PlannedEvent;
use crate::decide::autoclaim::{ServicePlan, ServiceSnapshot, plan_service, reason};
use crate::error::{Error, Result};

/// One pass over the Service `namespace/name`.
pub async fn reconcile(ctx: Arc<Context>, key: String) -> Result<Outcome> {
    let Some(svc) = ctx.world.services.as_ref().and_then(|s| s.get(&key)) else {
        return Ok(Outcome::Done);
    };
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let claim = ctx
        .world
        .claims
        .get(&key)
        .map(|c| ctx.recent_claims.latest(c));
    let classes = ctx.world.classes();
    let labels = ctx.world.namespace_labels(&ns);
    let plan = plan_service(&ServiceSnapshot {
        service: &svc,
        classes: &classes,
        claim: claim.as_deref(),
        namespace_labels: labels.as_ref(),
    });
    match plan {
        ServicePlan::Skip(_) => ctx.events.publish_once(svc.as_ref(), None).await,
        ServicePlan::Refuse(ev) | ServicePlan::Keep(ev) => {
            ctx.events.publish_once(svc.as_ref(), Some(&ev)).await
        }
        ServicePlan::Annotate => annotate(&ctx, &svc, &key).await?,
        ServicePlan::Create { class, family } => {
            let owner = OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: name.clone(),
                uid: svc.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            };
            let claim = IPAddressClaim {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    owner_references: Some(vec![owner]),
                    ..Default::default()
                },
                spec: IPAddressClaimSpec {
                    class_name: Some(class.clone()),
                    family,
                    address_name: None,
                    sharing: None,
                },
                status: None,
            };
            let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &ns);
            match claims.create(&PostParams::default(), &claim).await {
                Ok(_) => {}
                // Created meanwhile (by a previous life of this process, or by someone
                // else): the next pass decides from the cache whether it is ours.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Err(Error::Conflict {
                        action: "creating auto-claim",
                        object: key,
                    });
                }
                Err(e) => return Err(Error::kube("creating auto-claim", key)(e)),
            }
            tracing::info!(service = %key, class = %class, family = family.as_str(), "created auto-claim");
            annotate(&ctx, &svc, &key).await?;
            let ev = PlannedEvent::normal(
                reason::AUTO_CLAIM_CREATED,
                format!(
                    "created IPAddressClaim {name} ({}, class {class:?}) for this Service",
                    family.as_str()
                ),
            );
            ctx.events.publish(svc.as_ref(), &ev).await;
        }
    }
    Ok(Outcome::Done)
}

async fn annotate(ctx: &Context, svc: &Service, key: &str) -> Result<()> {
    let api: Api<Service> =
        Api::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default());
    let body = guarded(
        svc.metadata.resource_version.as_deref(),
        json!({"metadata": {"annotations": {SERVICE_CLAIM_ANNOTATION: svc.name_any()}}}),
    );
    api.patch(
        &svc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(body),
    )
    .await
    .map_err(Error::kube("annotating Service", key.to_string()))?;
    Ok(())
}
