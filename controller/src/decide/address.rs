//! Address reconciliation (SPEC §5) as a pure function: deletion, the protection finalizer,
//! invalid addresses, the phase, the safety net for addresses whose claim is gone, surplus
//! addresses (§5.7), and the release delay ([`super::release_delay`]).

use std::sync::Arc;
use std::time::Duration;

use address_controller_api::family::family_of;
use address_controller_api::history::{self, AddressMeta, Counts, Held, Holding, Record, Settled};
use address_controller_api::names::{ADDRESS_FINALIZER, event, released};
use address_controller_api::{
    AddressPhase, ClaimRef, IPAddress, IPAddressClaim, IPAddressClass, ReclaimPolicy,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::holdings::Holdings;
use super::release_delay::{self, Due};
use super::{Now, PlannedEvent, with_finalizer, without_finalizer};

/// What the address reconciler sees.
pub struct AddressSnapshot<'a> {
    pub address: &'a IPAddress,
    /// The claim `spec.claimRef` names (by namespace and name), if it exists.
    pub claim: Option<&'a IPAddressClaim>,
    /// Every address whose claimRef names the same claim, this one included: whether this
    /// one is surplus depends on them (§5.7).
    pub siblings: &'a [Arc<IPAddress>],
    /// The address's class, if it exists (only the release delay is read from it).
    pub class: Option<&'a IPAddressClass>,
    pub now: Now,
}

/// The core-owned status fields of an address.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressStatusWrite {
    pub phase: AddressPhase,
    pub released_at: Option<Time>,
    /// The binding a `Released` address was released from (its claimRef then).
    pub released_from: Option<ClaimRef>,
    /// Why it is `Released` (`names::released`); none in any other phase.
    pub reason: Option<String>,
    /// `status.history` and its counts when the write changes them
    /// ([`history::holdings_after`]); `None`: left as they are.
    pub history: Option<Settled<Holding>>,
    /// The records of the holdings the write moves off the address: created before it.
    pub records: Vec<Record>,
}

impl AddressStatusWrite {
    /// The same write with nothing moved to records (they cannot be made): the entries stay
    /// on the address. `None` when nothing is left to write (a write that only moved).
    pub fn unmoved(&self, only_moves: bool) -> Option<AddressStatusWrite> {
        if only_moves {
            return None;
        }
        let mut w = self.clone();
        w.history = w.history.map(Settled::unmove);
        w.records.clear();
        Some(w)
    }

    fn with_history(mut self, a: &IPAddress, settled: Option<Settled<Holding>>) -> Self {
        if let Some(s) = &settled {
            let meta = AddressMeta::of(a);
            self.records = s.moved.iter().map(|(o, h)| meta.holding(*o, h)).collect();
        }
        self.history = settled;
        self
    }
}

/// Everything one pass over an address wants done, in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AddressPlan {
    /// The full finalizer list to write.
    pub finalizers: Option<Vec<String>>,
    pub status: Option<AddressStatusWrite>,
    /// Clear `spec.claimRef` (the release delay elapsed).
    pub clear_claim_ref: bool,
    /// Delete the object (reclaim policy `Delete` of an orphaned or surplus address).
    pub delete: bool,
    /// The steps above rest on the caches' word about *other* objects (the claim is gone;
    /// the claim keeps another address): the reconciler must re-read the address, its claim
    /// and its siblings from the API server and plan again before applying them (§5.6).
    pub confirm: bool,
    pub events: Vec<PlannedEvent>,
    /// Events on the claim the address names (`SurplusAddress`).
    pub claim_events: Vec<PlannedEvent>,
    /// An event to publish once per episode, not on every pass (`DeletionBlocked`,
    /// `InvalidAddress`): the reconciler remembers which it already published.
    pub once_event: Option<PlannedEvent>,
    /// Pass again after this long (the release delay's deadline).
    pub requeue_after: Option<Duration>,
    /// The status write only moves closed holdings to records (an address written before
    /// records were kept): a write of its own, made at the rate the core allows for them.
    pub moves_history: bool,
    /// Records to create before the finalizer goes (a deleted address's holdings).
    pub records: Vec<Record>,
}

/// How the claimRef relates to the claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The binding the address holds is the one that was released
    /// ([`IPAddress::is_released`]): it waits out the release delay, whatever its claim does.
    Released,
    /// The claim exists with this uid and keeps this address.
    Live,
    /// The claim exists, claimRef has no uid yet (pre-bound), and it keeps this address.
    PreBound,
    /// claimRef has no uid and names a claim that does not exist (yet) but could: a
    /// reservation for it — not an orphan (SPEC §5.6).
    Reserved,
    /// The claim exists and is being deleted (its reclaim flow decides).
    Deleting,
    /// claimRef carries a uid and its claim is gone, or has another uid (a stale binding).
    Gone,
    /// The claim is live, keeps another address of this family (§5.7) and lists it.
    Surplus,
    /// The claim is live and keeps another address of this family, but does not list it
    /// yet: left alone until it does (see [`Holdings::is_settled_surplus`]).
    SurplusUnsettled,
}

/// How `address` relates to `claim` and its siblings (`None`: no claimRef).
pub fn holder(
    address: &IPAddress,
    claim: Option<&IPAddressClaim>,
    siblings: &[Arc<IPAddress>],
) -> Option<Holder> {
    let r = address.spec.claim_ref.as_ref()?;
    if address.is_released() {
        return Some(Holder::Released);
    }
    let Some(claim) = claim.filter(|c| r.names(c)) else {
        // No uid: reserved for a claim that may still be created — unless no claim can
        // ever have that name (admitted before the schema checked it).
        return Some(if r.uid.is_none() && r.is_valid() {
            Holder::Reserved
        } else {
            Holder::Gone
        });
    };
    if !address.belongs_to(claim) {
        return Some(Holder::Gone);
    }
    if claim.is_deleting() {
        return Some(Holder::Deleting);
    }
    let holdings = Holdings::of(claim, siblings.iter().map(Arc::as_ref));
    if holdings.is_settled_surplus(claim, address) {
        return Some(Holder::Surplus);
    }
    if holdings.is_surplus(address) {
        return Some(Holder::SurplusUnsettled);
    }
    Some(if r.uid.is_none() {
        Holder::PreBound
    } else {
        Holder::Live
    })
}

/// The status the address should have — `phase_to`, and for `Released` the time and
/// reason `released` gives (ignored for any other phase) and the binding released — with
/// its history brought along at `now` (`record`: the history follows the claimRef; an
/// invalid address's does not); `None` when it has it all.
pub(crate) fn status_write(
    a: &IPAddress,
    phase_to: AddressPhase,
    released: Option<(Time, Option<String>)>,
    record: bool,
    now: &Time,
) -> Option<AddressStatusWrite> {
    let (released_at, reason) = match released {
        Some((at, why)) if phase_to == AddressPhase::Released => (Some(at), why),
        _ => (None, None),
    };
    let (history, _) = history::holdings(a);
    let counts = Counts::holdings(a);
    let want = AddressStatusWrite {
        phase: phase_to,
        released_at,
        released_from: (phase_to == AddressPhase::Released)
            .then(|| a.spec.claim_ref.clone())
            .flatten(),
        reason,
        history: None,
        records: Vec::new(),
    };
    let have = a.phase().map(|p| AddressStatusWrite {
        phase: p,
        released_at: a.released_at().cloned(),
        released_from: a.status.as_ref().and_then(|s| s.released_from.clone()),
        reason: a.status.as_ref().and_then(|s| s.reason.clone()),
        history: None,
        records: Vec::new(),
    });
    // The history rides on a write the phase makes anyway, or on one that ends an open
    // holding the claimRef no longer names (an admin's move of a reservation): never a
    // write of its own for a state that stands — a binding from before the history was
    // kept is recorded when it is released, not written after the upgrade.
    let changes = have.as_ref() != Some(&want);
    let open = history.last().is_some_and(|h| h.until.is_none());
    // The release's own time closes the holding, so the two always agree.
    let at = want.released_at.clone().unwrap_or_else(|| now.clone());
    let unrecorded =
        (!open && phase_to == AddressPhase::Released && a.phase() == Some(AddressPhase::Bound))
            .then_some(a.spec.claim_ref.as_ref())
            .flatten();
    let settled = Held::of(a.spec.claim_ref.as_ref(), phase_to)
        .filter(|_| record && (changes || open))
        .and_then(|held| history::holdings_after(history, counts, held, unrecorded, &at));
    let want = want.with_history(a, settled);
    (changes || want.history.is_some()).then_some(want)
}

/// The status write that only moves an address's closed holdings past
/// [`history::HOLDINGS_KEEP`] to records (`None` when it keeps no more): the address as it
/// is, its history shorter.
fn history_move(a: &IPAddress) -> Option<AddressStatusWrite> {
    let (list, _) = history::holdings(a);
    let settled = history::holdings_moved(list, Counts::holdings(a))?;
    let st = a.status.as_ref()?;
    let write = AddressStatusWrite {
        phase: st.phase?,
        released_at: st.released_at.clone(),
        released_from: st.released_from.clone(),
        reason: st.reason.clone(),
        history: None,
        records: Vec::new(),
    };
    Some(write.with_history(a, Some(settled)))
}

/// The records of every entry a deleted address still keeps — its holdings, and the
/// driver's spans (a driver may have no finalizer to record them behind) — an open one
/// closed at `now` (a holding `Deleted`): what the core creates before its finalizer lets
/// the object go, so the history outlives the address.
pub fn deletion_records(a: &IPAddress, now: &Time) -> Vec<Record> {
    let t = history::Timeline::of(a);
    let holdings = t.holdings.into_iter().map(|(o, mut h)| {
        if h.until.is_none() {
            h.until = Some(now.clone());
            h.ended = Some(history::ended::DELETED.to_string());
        }
        t.meta.holding(o, &h)
    });
    let spans = t.spans.into_iter().map(|(o, mut sp)| {
        sp.until.get_or_insert_with(|| now.clone());
        t.meta.span(o, &sp)
    });
    holdings.chain(spans).collect()
}

fn claim_ref_text(a: &IPAddress) -> String {
    a.spec
        .claim_ref
        .as_ref()
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .unwrap_or_default()
}

/// Plans one pass over an address.
pub fn plan_address(s: &AddressSnapshot<'_>) -> AddressPlan {
    let a = s.address;
    let name = a.name_any();
    let mut plan = AddressPlan::default();
    let holder = holder(a, s.claim, s.siblings);

    // §5.1: deletion waits while a live claim holds the address.
    if a.is_deleting() {
        if a.phase() == Some(AddressPhase::Bound) && holder == Some(Holder::Live) {
            plan.once_event = Some(PlannedEvent::warning(
                event::DELETION_BLOCKED,
                format!(
                    "IPAddress {name} is bound to claim {}; it is deleted once the claim releases it",
                    claim_ref_text(a)
                ),
            ));
        } else if let Some(remaining) = without_finalizer(a.finalizers(), ADDRESS_FINALIZER) {
            plan.finalizers = Some(remaining);
            plan.records = deletion_records(a, &s.now);
            // A Bound address whose claim merely vanished from the cache is confirmed first.
            plan.confirm = a.phase() == Some(AddressPhase::Bound)
                && matches!(
                    holder,
                    Some(Holder::Gone | Holder::Surplus | Holder::SurplusUnsettled)
                );
        }
        return plan;
    }

    // §5.2: the protection finalizer.
    plan.finalizers = with_finalizer(a.finalizers(), ADDRESS_FINALIZER);

    // §5.3: an invalid address is never trusted.
    if let Err(e) = family_of(&a.spec.address) {
        plan.status = status_write(a, AddressPhase::Pending, None, false, &s.now);
        plan.once_event = Some(PlannedEvent::warning(
            event::INVALID_ADDRESS,
            format!("{e}; nothing will bind it"),
        ));
        return plan;
    }

    // §5.4: Conflict and Lost belong to the driver.
    if a.phase().is_some_and(AddressPhase::is_driver_owned) {
        return plan;
    }

    // The phase follows the claimRef (§5.5, §5.6): only the binding that was released is
    // judged by the release delay; any other claimRef is judged as the binding it is.
    match holder {
        // §5.5: free (also after an admin cleared the claimRef of a Released address).
        None => plan.status = status_write(a, AddressPhase::Available, None, true, &s.now),
        // §5.6: reserved for a claim that does not exist yet: Available, and no other claim
        // can take it (only an address without a claimRef is free).
        Some(Holder::Reserved) => {
            plan.status = status_write(a, AddressPhase::Available, None, true, &s.now)
        }
        Some(Holder::Live) => {
            plan.status = status_write(a, AddressPhase::Bound, None, true, &s.now);
            // A new binding next to a stale `Released` (bound again after the release delay
            // cleared the claimRef, or moved by an admin): the claim it names is confirmed
            // by a direct read before the address says Bound — a cache that missed the
            // claim's deletion never binds it.
            plan.confirm = plan.status.is_some() && a.phase() == Some(AddressPhase::Released);
        }
        Some(Holder::PreBound) => {
            plan.status = status_write(a, AddressPhase::Pending, None, true, &s.now)
        }
        Some(Holder::Deleting | Holder::SurplusUnsettled) => {}
        Some(Holder::Released) => {
            let why = format!("released from claim {}", claim_ref_text(a));
            if let Some(note) = orphaned(&mut plan, s, &why, released::RECLAIMED) {
                plan.events
                    .push(PlannedEvent::normal(event::RECLAIMED, note));
            }
        }
        Some(Holder::Gone) => {
            let why = format!("claim {} is gone", claim_ref_text(a));
            if let Some(note) = orphaned(&mut plan, s, &why, released::RECLAIMED) {
                plan.events
                    .push(PlannedEvent::normal(event::RECLAIMED, note));
            }
        }
        Some(Holder::Surplus) => {
            let why = format!(
                "claim {} already holds another {} address",
                claim_ref_text(a),
                family_of(&a.spec.address).map_or("", |f| f.as_str())
            );
            // The tenant's claim says why one of its addresses went away (§5.7).
            if let Some(note) = orphaned(&mut plan, s, &why, released::SURPLUS) {
                plan.claim_events.push(PlannedEvent::normal(
                    event::SURPLUS_ADDRESS,
                    format!("IPAddress {name} ({}): {note}", a.spec.address),
                ));
            }
        }
    }
    with_history_move(plan, a)
}

/// An address written before records were kept moves its backlog, a batch per write, when
/// the pass writes nothing else.
fn with_history_move(mut plan: AddressPlan, a: &IPAddress) -> AddressPlan {
    if plan.status.is_none() && !plan.delete && !plan.confirm {
        plan.status = history_move(a);
        plan.moves_history = plan.status.is_some();
    }
    plan
}

/// The reclaim policy of an address no live claim keeps (§5.6, §5.7): `Delete` → delete
/// the object; `Retain` → `Released` with `releasedAt` and the binding released
/// (`releasedFrom`), then the release delay. Destructive steps are confirmed first. Returns
/// what happened when it happens in this pass (the caller reports it once), `None` when the
/// binding was released before.
fn orphaned(
    plan: &mut AddressPlan,
    s: &AddressSnapshot<'_>,
    why: &str,
    reason: &str,
) -> Option<String> {
    let a = s.address;
    if a.spec.reclaim_policy == ReclaimPolicy::Delete {
        plan.delete = true;
        plan.confirm = true;
        return Some(format!(
            "{why}; deleting the address (reclaim policy Delete)"
        ));
    }
    // Released before, by this very binding: keep its time. A binding released now (also
    // one next to a stale `Released` of an earlier binding) is released as of now.
    let already = a.is_released();
    let at = a
        .released_at()
        .filter(|_| already)
        .cloned()
        .unwrap_or_else(|| s.now.clone());
    // The reason is the one of the release: a binding released before keeps its own
    // (surplus stays surplus once its claim is gone, SPEC §5.7).
    let reason = if already {
        a.status.as_ref().and_then(|st| st.reason.clone())
    } else {
        Some(reason.to_string())
    };
    plan.status = status_write(
        a,
        AddressPhase::Released,
        Some((at.clone(), reason)),
        true,
        &s.now,
    );
    match release_delay::due(a, s.class, &at, &s.now) {
        Due::Never => {}
        // Becomes Released in this pass; recycle on the next.
        Due::Now if !already => plan.requeue_after = Some(Duration::ZERO),
        Due::Now => {
            plan.clear_claim_ref = true;
            plan.events.push(PlannedEvent::normal(
                event::RELEASE_DELAY_ELAPSED,
                format!(
                    "release delay elapsed; the address is free again (was claim {})",
                    claim_ref_text(a)
                ),
            ));
        }
        Due::In(left) => plan.requeue_after = Some(left),
    }
    if already {
        return None;
    }
    plan.confirm = true;
    Some(format!("{why}; the address is retained as Released"))
}
