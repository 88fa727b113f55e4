//! The class pass: the `DriverAvailable` condition — whether a driver holding a live Lease
//! for the class's provisioner runs ([`live_driver_lease`], the rule `address-controller
//! check` applies too). One write per class when it changes; none while it holds. A live
//! Lease is checked again at its expiry, so a driver that stops renewing is noticed without
//! a watch event.

use std::sync::Arc;
use std::time::Duration;

use address_controller_api::IPAddressClass;
use address_controller_api::conditions::set_condition;
use address_controller_api::names::{condition, reason};
use address_controller_runtime::leader::{lease_expiry, live_driver_lease};
use address_controller_runtime::workers::Outcome;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::guarded;
use crate::context::Context;
use crate::error::{Error, Result};

/// What `DriverAvailable` says for `provisioner`, and when to look again (a live Lease's
/// expiry).
pub fn driver_available(
    leases: &[Arc<k8s_openapi::api::coordination::v1::Lease>],
    provisioner: &str,
    now: Timestamp,
) -> (bool, &'static str, String, Option<Timestamp>) {
    match live_driver_lease(leases.iter().map(AsRef::as_ref), provisioner, now) {
        Some(l) => {
            let holder = l
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default();
            (
                true,
                reason::DRIVER_RUNNING,
                format!(
                    "{provisioner} is served by {holder} (Lease {}/{})",
                    l.namespace().unwrap_or_default(),
                    l.name_any()
                ),
                lease_expiry(l),
            )
        }
        None => (
            false,
            reason::NO_LIVE_DRIVER,
            format!(
                "no driver holds a live Lease for {provisioner}: claims that need a new address wait \
                 (free addresses of the class still bind; a driver run without leader election holds no Lease)"
            ),
            None,
        ),
    }
}

/// One pass over the class `name`.
pub async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Outcome> {
    let Some(class) = ctx.world.classes.get(&name) else {
        return Ok(Outcome::Done);
    };
    let Some(leases) = &ctx.world.driver_leases else {
        return Ok(Outcome::Done);
    };
    let now = Timestamp::now();
    let (ok, why, message, expiry) =
        driver_available(&leases.store.all(), &class.spec.provisioner, now);
    let again = match expiry {
        Some(t) => {
            let secs = (t.as_second() - now.as_second()).max(0) + 1;
            Outcome::RequeueAfter(Duration::from_secs(u64::try_from(secs).unwrap_or(1)))
        }
        None => Outcome::Done,
    };
    let mut conditions = class
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let before = conditions.clone();
    set_condition(
        &mut conditions,
        condition::DRIVER_AVAILABLE,
        ok,
        why,
        message,
        class.metadata.generation,
        &Time(now),
    );
    if conditions == before {
        return Ok(again);
    }
    let api: Api<IPAddressClass> = Api::all(ctx.client.clone());
    let body = guarded(
        class.resource_version().as_deref(),
        json!({"status": {"conditions": conditions}}),
    );
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(Error::kube(
            "writing the DriverAvailable condition of class",
            name.clone(),
        ))?;
    Ok(again)
}
