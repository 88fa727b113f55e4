//! Addresses: backend teardown behind the driver's finalizer, health (Lost, Conflict), a
//! dangling association.

use std::sync::Arc;

use address_controller_api::IPAddress;
use address_controller_runtime::workers::Outcome;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::decide::address::{AddressPlan, plan_address};
use crate::driver::Driver;

use super::{Ctx, Error};

/// One pass over an address, as [`plan_address`] decides: backend teardown behind the
/// driver's finalizer; for an address of this driver's classes, the finalizer, its health
/// (Lost, Conflict) and a dangling association.
pub(crate) async fn address_pass<D: Driver>(
    ctx: Arc<Ctx<D>>,
    name: String,
) -> Result<Outcome, Error> {
    let Some(a) = ctx.world.addresses.get(&name) else {
        return Ok(Outcome::Done);
    };
    let plan = plan_address(&a, ctx.owns(&a), ctx.driver.finalizer(), |ip| {
        crate::runner::ledger::shown_by(&ctx, ip)
    });
    let finalizers = |all: Vec<String>, action: &'static str| {
        let body = json!({"metadata": {"resourceVersion": a.metadata.resource_version, "finalizers": all}});
        let (client, name) = (ctx.client.clone(), name.clone());
        async move {
            Api::<IPAddress>::all(client)
                .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .map_err(|source| Error::Kube {
                    action,
                    object: name,
                    source,
                })
        }
    };
    match plan {
        AddressPlan::Nothing => {}
        AddressPlan::AddFinalizer(all) => {
            finalizers(all, "adding the finalizer of").await?;
        }
        AddressPlan::Health => return crate::runner::health::health_pass(&ctx, &a).await,
        AddressPlan::WaitForWithdrawal { service, ip } => {
            return Err(Error::Backend {
                object: name.clone(),
                message: format!(
                    "Service {service} still shows {ip}; tearing down after it is withdrawn"
                ),
            });
        }
        AddressPlan::Teardown { remaining } => {
            ctx.driver
                .release(&ctx.client, &a)
                .await
                .map_err(|message| Error::Allocate {
                    claim: name.clone(),
                    message,
                })?;
            finalizers(remaining, "removing the finalizer of").await?;
            tracing::info!(address = %name, "released in the backend");
        }
    }
    Ok(Outcome::Done)
}
