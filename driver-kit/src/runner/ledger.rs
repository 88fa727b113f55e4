//! The ledger's reads and writes shared by the association passes: an address's ledger
//! and its records, who shows an address, the kit's own addresses, a Service gone.

use std::net::IpAddr;
use std::sync::Arc;

use address_controller_api::IPAddress;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::driver::Driver;
use crate::runner::{Ctx, Error};
use address_controller_api::Attachment;

pub(crate) fn kube_error(
    action: &'static str,
    object: String,
) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube {
        action,
        object,
        source,
    }
}

/// Patches an address's status with `body`, guarded by the version it was planned from.
pub(crate) async fn patch_address_status(
    ctx: &Ctx<impl Driver>,
    a: &IPAddress,
    status: Value,
) -> Result<(), Error> {
    let body =
        json!({"metadata": {"resourceVersion": a.metadata.resource_version}, "status": status});
    Api::<IPAddress>::all(ctx.client.clone())
        .patch_status(&a.name_any(), &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(kube_error("writing status of address", a.name_any()))?;
    Ok(())
}

/// The ledger's part of the status of `a` with `attachments` as its holders, now — after
/// the records of the spans it moves off the address are created (a closed span is on the
/// address or in a record at every instant).
pub(crate) async fn ledger(
    ctx: &Ctx<impl Driver>,
    a: &IPAddress,
    attachments: Vec<Attachment>,
) -> Result<Value, Error> {
    let now = Time(Timestamp::now());
    let before = a.attachments();
    let (status, records) = a.ledger_status(&before, &attachments, &now, true);
    match ensure_records(ctx, a, &records).await? {
        address_controller_runtime::records::Ensured::Created(_) => Ok(status),
        address_controller_runtime::records::Ensured::Unavailable(why) => {
            tracing::warn!(address = %a.name_any(), "{why}");
            Ok(a.ledger_status(&before, &attachments, &now, false).0)
        }
    }
}

/// Creates the records of the entries a write of `a` moves off it (already there is
/// success).
pub(crate) async fn ensure_records(
    ctx: &Ctx<impl Driver>,
    a: &IPAddress,
    records: &[address_controller_api::history::Record],
) -> Result<address_controller_runtime::records::Ensured, Error> {
    address_controller_runtime::records::ensure(&ctx.client, records)
        .await
        .map_err(kube_error(
            "creating history records of address",
            a.name_any(),
        ))
}

pub(crate) fn attachment_key(h: &Attachment) -> Option<String> {
    h.association().service_key()
}

/// The Services that show `ip` (by the backend's word), the backend's own (a hold) left out.
pub(crate) fn shown_by<D: Driver>(ctx: &Ctx<D>, ip: IpAddr) -> Vec<String> {
    ctx.services
        .mentioning(ip)
        .into_iter()
        .filter(|k| {
            ctx.world
                .services
                .as_ref()
                .and_then(|c| c.get(k))
                .is_some_and(|s| !ctx.driver.internal(&s) && ctx.driver.shown(&s).contains(&ip))
        })
        .collect()
}

/// The cached address of this driver's classes that is `ip`.
pub(crate) fn own_address<D: Driver>(ctx: &Ctx<D>, ip: IpAddr) -> Option<Arc<IPAddress>> {
    ctx.inventory
        .addresses_of(ip)
        .iter()
        .filter_map(|n| ctx.world.addresses.get(n))
        .find(|a| ctx.owns(a))
}

/// Whether the API has no Service `key` (`namespace/name`) — asked when the cache has none.
/// The ledger names a holder by `namespace/name`, and the cache can lag behind a Service
/// deleted and created again under that name (a tenant's `kubectl replace`, a GitOps
/// sync): taking the entry off then leaves the new Service, which names the claim and
/// which MetalLB already serves from the address, with no word from the ledger — a
/// `Conflict` until the next pass lists it again (seen: 85 ms, under load).
pub(crate) async fn service_gone<D: Driver>(ctx: &Ctx<D>, key: &str) -> Result<bool, Error> {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let live = Api::<Service>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(kube_error("reading Service", key.to_string()))?;
    Ok(live.is_none())
}
