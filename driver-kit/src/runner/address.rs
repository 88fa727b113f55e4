//! Addresses: backend teardown behind the driver's finalizer, health (Lost, Conflict), a
//! dangling association.

use std::sync::Arc;

use address_controller_api::IPAddress;
use address_controller_api::names::{with_finalizer, without_finalizer};
use address_controller_runtime::workers::Outcome;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::driver::Driver;

use super::{Ctx, Error};

/// One pass over an address: backend teardown behind the driver's finalizer; for an
/// address of this driver's classes, its health (Lost, Conflict) and a dangling association.
pub(crate) async fn address_pass<D: Driver>(
    ctx: Arc<Ctx<D>>,
    name: String,
) -> Result<Outcome, Error> {
    let Some(a) = ctx.world.addresses.get(&name) else {
        return Ok(Outcome::Done);
    };
    let teardown = ctx
        .driver
        .finalizer()
        .filter(|f| a.is_deleting() && a.finalizers().iter().any(|x| x == f));
    let Some(finalizer) = teardown else {
        if ctx.owns(&a) {
            // The driver's finalizer guards its backend state of every address of its
            // classes — an admin's static ones too, not only those it created.
            if let Some(f) = ctx.driver.finalizer()
                && !a.is_deleting()
                && let Some(all) = with_finalizer(a.finalizers(), f)
            {
                let body = json!({"metadata": {"resourceVersion": a.metadata.resource_version, "finalizers": all}});
                Api::<IPAddress>::all(ctx.client.clone())
                    .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                    .await
                    .map_err(|source| Error::Kube {
                        action: "adding the finalizer of",
                        object: name.clone(),
                        source,
                    })?;
                return Ok(Outcome::Done);
            }
            crate::runner::association::health_pass(&ctx, &a).await?;
        }
        return Ok(Outcome::Done);
    };
    // Teardown waits until no Service shows the address any more (its association is
    // withdrawn first): the backend's state is what withdraws it.
    if let Some(ip) = crate::association::ip_of(&a) {
        let shown = crate::runner::association::shown_by(&ctx, ip);
        if let Some(svc) = shown.first() {
            return Err(Error::Backend {
                object: name.clone(),
                message: format!(
                    "Service {svc} still shows {ip}; tearing down after it is withdrawn"
                ),
            });
        }
    }
    ctx.driver
        .release(&ctx.client, &a)
        .await
        .map_err(|message| Error::Allocate {
            claim: name.clone(),
            message,
        })?;
    let remaining =
        without_finalizer(a.finalizers(), finalizer).unwrap_or_else(|| a.finalizers().to_vec());
    let body = json!({"metadata": {"resourceVersion": a.metadata.resource_version, "finalizers": remaining}});
    Api::<IPAddress>::all(ctx.client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(|source| Error::Kube {
            action: "removing the finalizer of",
            object: name.clone(),
            source,
        })?;
    tracing::info!(address = %name, "released in the backend");
    Ok(Outcome::Done)
}
