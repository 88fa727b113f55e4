//! The process's memory budget for what clients have sent but not yet turned into a
//! request: request heads on the way in (an HTTP/1.1 head, an HTTP/2 header block with its
//! CONTINUATION frames, a TLS handshake) and the heads of requests being served. One budget
//! for every server of the process, sized from the container's memory limit
//! ([`HeadBudget::sized`]); strangers — connections that have not proven who they are —
//! may fill only their share of it, so authenticated work always finds room. Past its
//! share, a stranger's newest bytes are refused: its connection is closed (or its request
//! answered 503), the connection that sent them and no other.
//!
//! This is Envoy's overload manager applied to one resource: the process, not the peer,
//! decides how much of it a stranger may use.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::metrics::{Peer, ServingMetrics};

/// The head bytes in flight of a process: at most `total`, of which strangers at most
/// `strangers` (half, so that the other half is always the authenticated peers').
#[derive(Debug)]
pub struct HeadBudget {
    total: usize,
    strangers: usize,
    used: AtomicUsize,
    used_strangers: AtomicUsize,
}

/// The budget's share of the process's memory limit: an eighth for heads in flight, half of
/// that for strangers. What a stranger's connection costs besides (TLS state, the
/// connection's buffers and task) is bounded by the connection caps, sized from another
/// eighth (`ServingLimitArgs::limits`).
pub const HEAD_SHARE: u64 = 8;

impl HeadBudget {
    pub fn new(total: usize, strangers: usize) -> Arc<HeadBudget> {
        let budget = Arc::new(HeadBudget {
            total,
            strangers: strangers.min(total),
            used: AtomicUsize::new(0),
            used_strangers: AtomicUsize::new(0),
        });
        ServingMetrics::head_budget(budget.strangers, budget.total);
        budget
    }

    /// The budget of a process whose memory limit is `memory` bytes.
    pub fn sized(memory: u64) -> Arc<HeadBudget> {
        let total = usize::try_from(memory / HEAD_SHARE).unwrap_or(usize::MAX);
        HeadBudget::new(total, total / 2)
    }

    /// A budget nothing fills (unit tests).
    pub fn unlimited() -> Arc<HeadBudget> {
        HeadBudget::new(usize::MAX / 4, usize::MAX / 8)
    }

    /// The bytes a stranger may hold in all.
    pub fn strangers_share(&self) -> usize {
        self.strangers
    }

    /// Bytes in flight now: (strangers', everyone's).
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.used_strangers.load(Ordering::Relaxed),
            self.used.load(Ordering::Relaxed),
        )
    }

    /// Takes `n` bytes for `peer`, or refuses (nothing taken): a stranger past its share or
    /// anyone past the total.
    pub fn take(&self, n: usize, peer: Peer) -> bool {
        if n == 0 {
            return true;
        }
        if peer == Peer::Unauthenticated && !add_within(&self.used_strangers, n, self.strangers) {
            return false;
        }
        if !add_within(&self.used, n, self.total) {
            if peer == Peer::Unauthenticated {
                self.used_strangers.fetch_sub(n, Ordering::Relaxed);
            }
            return false;
        }
        ServingMetrics::head_bytes(peer, i64::try_from(n).unwrap_or(i64::MAX));
        true
    }

    /// Gives back `n` bytes `peer` took.
    pub fn give_back(&self, n: usize, peer: Peer) {
        if n == 0 {
            return;
        }
        if peer == Peer::Unauthenticated {
            self.used_strangers.fetch_sub(n, Ordering::Relaxed);
        }
        self.used.fetch_sub(n, Ordering::Relaxed);
        ServingMetrics::head_bytes(peer, -i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// Adds `n` to `counter` unless that passes `limit`.
fn add_within(counter: &AtomicUsize, n: usize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(n).filter(|after| *after <= limit)
        })
        .is_ok()
}

/// A connection's own allowance of head bytes before it has proven who it is — "a small
/// budget of its own": what a normal client's handshake and first request head take, so
/// that a stranger that filled the strangers' share never refuses a newcomer (the
/// aggregator, a client with a token). Bounded in all by the connection caps.
pub const STRANGER_FLOOR: usize = 16 << 10;

/// The part of [`STRANGER_FLOOR`] a connection has not used, shared by its holders (the
/// bytes on the wire, the heads of its requests).
#[derive(Debug)]
pub struct Floor(AtomicUsize);

impl Floor {
    pub fn new(bytes: usize) -> Arc<Floor> {
        Arc::new(Floor(AtomicUsize::new(bytes)))
    }

    /// Takes up to `n` of what is left; returns what it took.
    fn take(&self, n: usize) -> usize {
        let mut took = 0;
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                took = left.min(n);
                Some(left - took)
            });
        took
    }

    fn give_back(&self, n: usize) {
        self.0.fetch_add(n, Ordering::AcqRel);
    }
}

/// Bytes one holder took, by whom — from its connection's [`Floor`] first while it is a
/// stranger's, then from the [`HeadBudget`] — given back when it drops.
#[derive(Debug)]
pub struct Held {
    budget: Arc<HeadBudget>,
    floor: Arc<Floor>,
    /// Taken from the budget.
    bytes: usize,
    /// Taken from the floor.
    floored: usize,
    peer: Peer,
}

impl Held {
    pub fn new(budget: Arc<HeadBudget>, floor: Arc<Floor>) -> Held {
        Held {
            budget,
            floor,
            bytes: 0,
            floored: 0,
            peer: Peer::Unauthenticated,
        }
    }

    /// Takes `n` more bytes as `peer`; false: refused, nothing more taken. What it holds
    /// already moves to `peer`'s account first (a connection that proved who it is).
    pub fn take(&mut self, n: usize, peer: Peer) -> bool {
        if self.peer != peer && (self.bytes > 0 || self.floored > 0) {
            let all = self.bytes + self.floored;
            self.release();
            self.peer = peer;
            if !self.take(all, peer) {
                return false;
            }
        }
        self.peer = peer;
        let floored = if peer == Peer::Unauthenticated {
            self.floor.take(n)
        } else {
            0
        };
        if !self.budget.take(n - floored, peer) {
            self.floor.give_back(floored);
            return false;
        }
        // The floor's bytes are in flight too: shown, not checked (the caps bound them).
        ServingMetrics::head_bytes(peer, i64::try_from(floored).unwrap_or(i64::MAX));
        self.bytes += n - floored;
        self.floored += floored;
        true
    }

    /// Gives back everything held.
    pub fn release(&mut self) {
        self.budget.give_back(self.bytes, self.peer);
        self.floor.give_back(self.floored);
        ServingMetrics::head_bytes(self.peer, -i64::try_from(self.floored).unwrap_or(i64::MAX));
        self.bytes = 0;
        self.floored = 0;
    }

    /// Bytes held (from the floor and the budget).
    pub fn bytes(&self) -> usize {
        self.bytes + self.floored
    }

    /// Moves what this holds into a new holder (the head on the wire becomes the request
    /// being served): nothing is given back or taken again.
    pub fn hand_over(&mut self) -> Held {
        let moved = Held {
            budget: self.budget.clone(),
            floor: self.floor.clone(),
            bytes: self.bytes,
            floored: self.floored,
            peer: self.peer,
        };
        self.bytes = 0;
        self.floored = 0;
        moved
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strangers_fill_only_their_share_and_the_authenticated_find_room() {
        let b = HeadBudget::new(100, 50);
        assert!(b.take(40, Peer::Unauthenticated));
        // A stranger past its share is refused; nothing is taken.
        assert!(!b.take(11, Peer::Unauthenticated));
        assert_eq!(b.in_flight(), (40, 40));
        // The authenticated have the rest of the total.
        assert!(b.take(60, Peer::Authenticated));
        assert!(!b.take(1, Peer::Authenticated));
        // The total binds strangers too.
        assert!(!b.take(5, Peer::Unauthenticated));
        assert_eq!(b.in_flight(), (40, 100));
        b.give_back(40, Peer::Unauthenticated);
        assert!(b.take(10, Peer::Unauthenticated));
        assert_eq!(b.in_flight(), (10, 70));
    }

    #[test]
    fn a_holder_gives_back_what_it_took_when_dropped() {
        let b = HeadBudget::new(100, 50);
        {
            let mut h = Held::new(b.clone(), Floor::new(0));
            assert!(h.take(30, Peer::Unauthenticated));
            assert!(
                !h.take(30, Peer::Unauthenticated),
                "past the strangers' share"
            );
            assert_eq!(h.bytes(), 30);
            // Proven: what it holds moves to the authenticated account.
            assert!(h.take(30, Peer::Authenticated));
            assert_eq!(b.in_flight(), (0, 60));
            // Handed over: the new holder gives it back.
            let moved = h.hand_over();
            assert_eq!((h.bytes(), moved.bytes()), (0, 60));
            drop(h);
            assert_eq!(b.in_flight(), (0, 60));
        }
        assert_eq!(b.in_flight(), (0, 0));
    }

    #[test]
    fn a_stranger_has_a_floor_of_its_own_that_a_full_share_never_refuses() {
        // Strangers filled their share.
        let b = HeadBudget::new(100, 50);
        let mut flood = Held::new(b.clone(), Floor::new(0));
        assert!(flood.take(50, Peer::Unauthenticated));
        // A newcomer's handshake and head fit its floor; past it, the share refuses.
        let floor = Floor::new(20);
        let mut wire = Held::new(b.clone(), floor.clone());
        assert!(wire.take(15, Peer::Unauthenticated));
        let mut request = Held::new(b.clone(), floor.clone());
        assert!(
            request.take(5, Peer::Unauthenticated),
            "the rest of its floor"
        );
        assert!(!request.take(1, Peer::Unauthenticated));
        // Given back, the floor is there again.
        drop(wire);
        assert!(request.take(15, Peer::Unauthenticated));
        assert_eq!(b.in_flight(), (50, 50), "the floor is not the share's");
    }

    #[test]
    fn the_budget_is_an_eighth_of_the_memory_limit() {
        let b = HeadBudget::sized(512 << 20);
        assert_eq!(b.strangers_share(), 32 << 20);
        assert!(b.take(64 << 20, Peer::Authenticated));
        assert!(!b.take(1, Peer::Authenticated));
    }
}
