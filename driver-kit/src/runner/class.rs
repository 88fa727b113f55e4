//! Classes: capacity and the conditions `ParametersValid` and `Exhausted`; the backend's
//! configuration of classes that are gone, let go of once no address names them.

use std::sync::Arc;

use address_controller_api::conditions::set_condition;
use address_controller_api::{Family, IPAddressClass};
use address_controller_runtime::events::PlannedEvent;
use address_controller_runtime::workers::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::driver::Driver;

use super::events;
use super::{Ctx, Error};

/// One pass over a class: capacity and conditions.
pub(crate) async fn class_pass<D: Driver>(
    ctx: Arc<Ctx<D>>,
    name: String,
) -> Result<Outcome, Error> {
    let Some(class) = ctx.world.classes.get(&name) else {
        // Gone (or the empty name, a new leader's sweep): the backend lets go of what it
        // kept for classes no address names any more.
        let in_use = crate::driver::ClassesInUse {
            uids: ctx
                .world
                .classes()
                .iter()
                .filter_map(|k| k.metadata.uid.clone())
                .collect(),
            named: ctx.inventory.classes(),
        };
        let released = ctx
            .driver
            .release_classes(&ctx.client, &in_use)
            .await
            .map_err(|message| Error::Backend {
                object: "classes gone".to_string(),
                message,
            })?;
        // One that exists again is synced anew.
        ctx.queues.classes.add_all(
            released
                .into_iter()
                .filter(|k| ctx.world.classes.get(k).is_some_and(|c| ctx.ours(&c))),
        );
        return Ok(Outcome::Done);
    };
    if !ctx.ours(&class) {
        return Ok(Outcome::Done);
    }
    let Some(parsed) = ctx.params(&name) else {
        return Ok(Outcome::Done);
    };
    let now = Time(Timestamp::now());
    let generation = class.metadata.generation;
    let mut status = class.status.clone().unwrap_or_default();
    match parsed {
        Ok(params) => {
            ctx.driver
                .sync_class(&ctx.client, &class, &params)
                .await
                .map_err(|message| Error::Backend {
                    object: format!("class {name}"),
                    message,
                })?;
            let cap = ctx.driver.capacity(&params);
            status.capacity = Some(address_controller_api::Capacity {
                ipv4: Some(cap.ipv4),
                ipv6: Some(cap.ipv6),
            });
            set_condition(
                &mut status.conditions,
                events::PARAMETERS_VALID,
                true,
                "Valid",
                ctx.driver.describe(&params),
                generation,
                &now,
            );
            let full: Vec<&str> = [Family::IPv4, Family::IPv6]
                .into_iter()
                .filter(|f| cap.of(*f) > 0 && ctx.inventory.count(&name, *f) >= cap.of(*f))
                .map(Family::as_str)
                .collect();
            let (exhausted, reason, msg) = if full.is_empty() {
                (false, "FreeAddresses", "free addresses left".to_string())
            } else {
                (
                    true,
                    "NoFreeAddress",
                    format!("no free {} address left", full.join(" or ")),
                )
            };
            set_condition(
                &mut status.conditions,
                events::EXHAUSTED,
                exhausted,
                reason,
                msg,
                generation,
                &now,
            );
            ctx.events.publish_once(class.as_ref(), None).await;
        }
        Err(why) => {
            status.capacity = None;
            set_condition(
                &mut status.conditions,
                events::PARAMETERS_VALID,
                false,
                events::INVALID_PARAMETERS,
                why.clone(),
                generation,
                &now,
            );
            let ev = PlannedEvent::warning(
                events::INVALID_PARAMETERS,
                format!("{why}; nothing will be allocated from this class"),
            );
            ctx.events.publish_once(class.as_ref(), Some(&ev)).await;
        }
    }
    if class.status.as_ref() != Some(&status) {
        let api: Api<IPAddressClass> = Api::all(ctx.client.clone());
        let body = json!({"metadata": {"resourceVersion": class.metadata.resource_version},
            "status": {"capacity": status.capacity, "conditions": status.conditions}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map_err(|source| Error::Kube {
                action: "writing status of class",
                object: name.clone(),
                source,
            })?;
    }
    Ok(Outcome::Done)
}
