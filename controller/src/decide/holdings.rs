//! Which addresses a claim holds (SPEC §4.3, §5.7). Both passes call this one function, so
//! the claim pass (which lists the addresses) and the address pass (which writes phases)
//! can never disagree about which address a claim keeps.
//!
//! A claim holds at most one address per family. Of the addresses bound or pre-bound to
//! it (claimRef names it, uid empty or equal, not being deleted, not released from it), the
//! one kept per family is, in order: the one the claim already lists in `status.addresses`
//! (what the tenant sees stays put), else one already `Bound` (bound first), else the
//! lowest name. Every other one of that family is *surplus* — typically a driver's create
//! that landed after the core bound a free address — and is released by the address pass.
//! A binding that was released ([`IPAddress::is_released`]: the claimRef the address held
//! when it became `Released`, uid included) is never held again: once surplus, always
//! surplus. A claimRef written after that — a bind once the release delay cleared it, an
//! admin's move — is a new binding, whatever the phase still says.

use address_controller_api::family::Family;
use address_controller_api::{AddressPhase, IPAddress, IPAddressClaim};
use kube::ResourceExt;

/// Whether the claim's `status.addresses` lists `a`.
fn listed_by(claim: &IPAddressClaim, a: &IPAddress) -> bool {
    let name = a.name_any();
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.addresses.iter().any(|l| l.name == name))
}

/// The addresses of one claim, sorted out.
#[derive(Debug, Default)]
pub struct Holdings<'a> {
    /// Kept: at most one per family, plus any with an invalid address (which satisfy
    /// nothing), in name order.
    pub held: Vec<&'a IPAddress>,
    /// Bound or pre-bound to the claim, but another address of the family is kept.
    pub surplus: Vec<&'a IPAddress>,
    /// Bound or pre-bound to the claim and being deleted.
    pub deleting: Vec<&'a IPAddress>,
    /// Bound to the claim by a binding that was released (surplus released earlier, or
    /// reclaimed).
    pub released: Vec<&'a IPAddress>,
}

impl<'a> Holdings<'a> {
    /// Sorts `named` — addresses whose claimRef names the claim by namespace and name —
    /// for `claim`.
    pub fn of(claim: &IPAddressClaim, named: impl IntoIterator<Item = &'a IPAddress>) -> Self {
        let mut h = Holdings::default();
        let mut live: Vec<&IPAddress> = Vec::new();
        for a in named {
            if !a.belongs_to(claim) {
                continue; // a stale binding to an older claim of the same name
            }
            if a.is_deleting() {
                h.deleting.push(a);
            } else if a.is_released() {
                h.released.push(a);
            } else {
                live.push(a);
            }
        }
        let listed = |a: &IPAddress| listed_by(claim, a);
        // Best first: listed, then Bound, then by name.
        live.sort_by_key(|a| {
            (
                !listed(a),
                a.phase() != Some(AddressPhase::Bound),
                a.name_any(),
            )
        });
        let mut kept: Vec<Family> = Vec::new();
        for a in live {
            match a.family() {
                Some(f) if kept.contains(&f) => h.surplus.push(a),
                Some(f) => {
                    kept.push(f);
                    h.held.push(a);
                }
                None => h.held.push(a),
            }
        }
        h.held.sort_by_key(|a| a.name_any());
        h.surplus.sort_by_key(|a| a.name_any());
        h
    }

    /// Whether `a` is surplus for this claim.
    pub fn is_surplus(&self, a: &IPAddress) -> bool {
        let name = a.name_any();
        self.surplus.iter().any(|s| s.name_any() == name)
    }

    /// Whether `a` is surplus and may be released now: the address kept for its family is
    /// the one the claim lists. The claim's list is the anchor — a claim pass keeps a listed
    /// address first, so it changes only when that address stops being held — whereas two
    /// address passes judging "kept" from two moments (the claim listing nothing, then the
    /// other) could each find the other kept and release both, losing the claim.
    pub fn is_settled_surplus(&self, claim: &IPAddressClaim, a: &IPAddress) -> bool {
        self.is_surplus(a)
            && a.family()
                .and_then(|f| self.kept(f))
                .is_some_and(|k| listed_by(claim, k))
    }

    /// The address kept for `f`, if any.
    pub fn kept(&self, f: Family) -> Option<&'a IPAddress> {
        self.held.iter().copied().find(|a| a.family() == Some(f))
    }
}
