//! Classes: capacity and the conditions `ParametersValid` and `Exhausted`; the backend's
//! configuration of classes that are gone, let go of once no address names them.

use std::sync::Arc;

use address_controller_api::IPAddressClass;
use address_controller_runtime::workers::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::decide::class::{Parsed, plan_class};
use crate::driver::Driver;

use super::{Ctx, Error};

/// One pass over a class: the backend syncs it, then [`plan_class`]'s capacity and
/// conditions are written.
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
    let parsed = match parsed {
        Ok(params) => {
            ctx.driver
                .sync_class(&ctx.client, &class, &params)
                .await
                .map_err(|message| Error::Backend {
                    object: format!("class {name}"),
                    message,
                })?;
            Ok((ctx.driver.capacity(&params), ctx.driver.describe(&params)))
        }
        Err(why) => Err(why),
    };
    let plan = plan_class(
        &class,
        match &parsed {
            Ok((capacity, described)) => Parsed::Valid {
                capacity: *capacity,
                described: described.clone(),
            },
            Err(why) => Parsed::Invalid(why),
        },
        |f| ctx.inventory.count(&name, f),
        &Time(Timestamp::now()),
    );
    ctx.events
        .publish_once(class.as_ref(), plan.event.as_ref())
        .await;
    if plan.writes(&class) {
        let status = plan.status;
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
