//! Claims: which to serve, what to allocate, the addresses to create (SPEC §8).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use address_controller_api::{Family, IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_runtime::events::PlannedEvent;
use address_controller_runtime::workers::Outcome;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

use crate::decide::claim::{ClaimPlan, ClaimSnapshot, plan_claim, provisioned};
use crate::driver::{AllocateError, Allocation, Driver, Request, object_name};

use super::events;
use super::{Ctx, Error, fresh};

/// What a claim needs from this driver: its class and the families to provision.
pub(crate) fn wanted<D: Driver>(
    ctx: &Ctx<D>,
    claim: &IPAddressClaim,
    key: &str,
) -> Option<(Arc<IPAddressClass>, Vec<Family>)> {
    // Only a claim the core invited: Pending and waiting for provisioning — not before its
    // first pass, not Bound, never Lost, never refused for an entitlement (SPEC §13: the
    // core counts the invitation against the namespace's quota).
    if !ctx.stamped(claim) || !claim.waits_for_provisioning() {
        return None;
    }
    let status = claim.status.as_ref()?;
    let class = ctx.world.classes.get(status.class_name.as_deref()?)?;
    if !ctx.ours(&class) {
        return None;
    }
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    // What this process created is read before the addresses naming the claim: the cache's
    // handler indexes a new address before it ends its time in flight, so one of the two
    // always shows it (read the other way round, a pass between the two could miss both
    // and provision the family twice).
    let in_flight: Vec<Family> = fresh(&ctx.in_flight)
        .keys()
        .filter(|(u, _)| *u == uid)
        .map(|(_, f)| *f)
        .collect();
    let mut have: Vec<Family> = claim.listed_families();
    for name in ctx.inventory.addresses_naming(key) {
        if let Some(a) = ctx.world.addresses.get(&name)
            && !a.is_deleting()
            && a.belongs_to(claim)
            && let Some(f) = a.family()
        {
            have.push(f);
        }
    }
    let missing = claim.families_missing(|f| have.contains(&f) || in_flight.contains(&f));
    (!missing.is_empty()).then_some((class, missing))
}

/// What a pass over a claim does, decided before anything is written.
/// What a pass over a claim reads: which families it misses, the class's parameters, and
/// the driver's allocation of every missing family (in order, stopping at the first that
/// fails: a Dual claim gets both or neither). Writes nothing.
pub(crate) async fn snapshot<D: Driver>(
    ctx: &Ctx<D>,
    claim: &IPAddressClaim,
    key: &str,
) -> ClaimSnapshot {
    let Some((class, missing)) = wanted(ctx, claim, key) else {
        return ClaimSnapshot::NotServed;
    };
    let params = match ctx.params(&class.name_any()) {
        Some(Ok(p)) => p,
        Some(Err(why)) => return ClaimSnapshot::InvalidParameters { class, why },
        None => return ClaimSnapshot::ParametersNotRead,
    };
    let mut allocated: Vec<(Family, Result<Allocation, AllocateError>)> = Vec::new();
    for f in &missing {
        let taken: Vec<IpAddr> = allocated
            .iter()
            .filter_map(|(_, a)| a.as_ref().ok().map(|a| a.address))
            .collect();
        let busy: Vec<IpAddr> = fresh(&ctx.in_flight_ips).keys().copied().collect();
        let inventory = &ctx.inventory;
        // Taken: in the ledger, chosen or being created — or shown by a Service already
        // (a tenant's own pin that the backend honoured outside the ledger): never handed
        // to another claim (#45 item 7; the Service turns the address Conflict once bound).
        let shown = |ip: IpAddr| !crate::runner::ledger::shown_by(ctx, ip).is_empty();
        let in_use = move |ip: IpAddr| {
            inventory.in_use(ip) || taken.contains(&ip) || busy.contains(&ip) || shown(ip)
        };
        let req = Request {
            class: &class,
            params: params.as_ref(),
            claim,
            family: *f,
            in_use: &in_use,
        };
        let result = ctx.driver.allocate(req).await;
        let failed = matches!(result, Err(AllocateError::Failed(_)));
        allocated.push((*f, result));
        if failed {
            break;
        }
    }
    ClaimSnapshot::Allocated { class, allocated }
}

/// The plan for a claim: [`snapshot`], decided.
pub(crate) async fn plan<D: Driver>(ctx: &Ctx<D>, claim: &IPAddressClaim, key: &str) -> ClaimPlan {
    plan_claim(snapshot(ctx, claim, key).await)
}

/// One pass over a claim: its plan, applied.
pub(crate) async fn claim_pass<D: Driver>(ctx: Arc<Ctx<D>>, key: String) -> Result<Outcome, Error> {
    let Some(claim) = ctx.world.claims.get(&key) else {
        return Ok(Outcome::Done);
    };
    match plan(&ctx, &claim, &key).await {
        ClaimPlan::Nothing => {
            ctx.events.publish_once(claim.as_ref(), None).await;
            Ok(Outcome::Done)
        }
        ClaimPlan::Wait => Ok(Outcome::Done),
        ClaimPlan::Refuse {
            event,
            exhausted_in,
        } => {
            if let Some(class) = exhausted_in {
                ctx.inventory.exhausted(&class, &key);
            }
            ctx.events.publish_once(claim.as_ref(), Some(&event)).await;
            Ok(Outcome::Done)
        }
        ClaimPlan::Failed { message } => {
            let ev = PlannedEvent::warning(events::PROVISIONING_FAILED, message.clone());
            ctx.events.publish_once(claim.as_ref(), Some(&ev)).await;
            Err(Error::Allocate {
                claim: key,
                message,
            })
        }
        ClaimPlan::Create { class, chosen } => {
            create(&ctx, &claim, &key, &class, chosen).await?;
            ctx.events.publish_once(claim.as_ref(), None).await;
            Ok(Outcome::Done)
        }
    }
}

/// Creates the planned addresses. A name collision with an address made for this claim (an
/// earlier life of this process) is success; with another, the address is taken.
async fn create<D: Driver>(
    ctx: &Ctx<D>,
    claim: &IPAddressClaim,
    key: &str,
    class: &IPAddressClass,
    chosen: Vec<(Family, Allocation)>,
) -> Result<(), Error> {
    if let Some(d) = ctx.create_delay {
        tokio::time::sleep(d).await;
    }
    let api: Api<IPAddress> = Api::all(ctx.client.clone());
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    for (f, a) in chosen {
        let name = a.name.clone().unwrap_or_else(|| object_name(a.address));
        let address = provisioned(
            &name,
            &a,
            class,
            claim,
            ctx.driver.provisioner(),
            ctx.driver.finalizer(),
        );
        fresh(&ctx.in_flight_ips).insert(a.address, Instant::now());
        match api.create(&PostParams::default(), &address).await {
            Ok(_) => {
                tracing::info!(claim = %key, address = %a.address, %name, "provisioned");
                fresh(&ctx.in_flight).insert((uid.clone(), f), Instant::now());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Made by an earlier life of this process for this claim: done. Otherwise
                // someone holds this address: allocate again.
                let existing = api.get_opt(&name).await.ok().flatten();
                let mine = existing.as_ref().is_some_and(|e| e.belongs_to(claim));
                if !mine {
                    return Err(Error::Taken(name));
                }
                fresh(&ctx.in_flight).insert((uid.clone(), f), Instant::now());
            }
            Err(source) => {
                fresh(&ctx.in_flight_ips).remove(&a.address);
                return Err(Error::Kube {
                    action: "creating",
                    object: name,
                    source,
                });
            }
        }
    }
    Ok(())
}
