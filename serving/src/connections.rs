//! Who may hold a server's connections. A new connection cannot say who it is before it is
//! accepted, so every connection starts as a stranger and the server never refuses one at
//! accept: strangers have places of their own, and when those are full the oldest stranger
//! is closed to make room — the newcomer may be the aggregator, and an attacker holding
//! idle sockets only ever closes its own oldest ones. A source address holds at most
//! `per_source` stranger places (nginx's `limit_conn` per address, except that the
//! source's oldest goes rather than its newest). A connection that proves who it is — a
//! front-proxy client certificate verified at the handshake, or a request whose bearer
//! token was reviewed — leaves the strangers for the places of the proven, which strangers
//! can never take; `front_proxy_reserved` of those are the aggregator's alone.
//!
//! Go's `net/http`, as kube-apiserver runs it, has no connection cap at all and holds every
//! idle socket; this server holds a bounded number, and which ones go is the server's
//! choice, not the flood's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::serving_metrics::Peer;
use crate::serving_metrics::ServingMetrics;

/// How many connections of each kind a server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// Connections that have not proven who they are.
    pub strangers: usize,
    /// Of those, from one source address.
    pub per_source: usize,
    /// Connections that have (front proxy or reviewed token).
    pub proven: usize,
    /// Of `proven`, kept for the aggregator's front-proxy certificate.
    pub front_proxy_reserved: usize,
}

/// How a connection proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// The aggregator's front-proxy client certificate.
    FrontProxy,
    /// A request whose bearer token TokenReview accepted.
    Token,
}

/// The connections of one server.
#[derive(Debug)]
pub struct Door {
    server: &'static str,
    caps: ConnectionCaps,
    rooms: Mutex<Rooms>,
}

#[derive(Debug, Default)]
struct Rooms {
    next: u64,
    /// Strangers by age (the order they were accepted in).
    strangers: BTreeMap<u64, Stranger>,
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
    proven_front_proxy: usize,
    proven_token: usize,
}

#[derive(Debug)]
struct Stranger {
    source: IpAddr,
    close: Arc<Notify>,
}

/// Why a stranger was closed to make room.
#[derive(Debug, Clone, Copy)]
enum Eviction {
    /// The strangers' places were full: the oldest stranger went.
    Oldest,
    /// Its source held all its places: the source's oldest went.
    Source,
}

impl Rooms {
    fn evict(&mut self, id: u64, why: Eviction, server: &str) {
        let Some(s) = self.strangers.remove(&id) else {
            return;
        };
        if let Some(ids) = self.by_source.get_mut(&s.source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&s.source);
            }
        }
        s.close.notify_one();
        let reason = match why {
            Eviction::Oldest => "evicted",
            Eviction::Source => "source",
        };
        ServingMetrics::refused(server, reason, Peer::Unauthenticated);
    }

    fn leave(&mut self, id: u64) -> bool {
        let Some(s) = self.strangers.remove(&id) else {
            return false;
        };
        if let Some(ids) = self.by_source.get_mut(&s.source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&s.source);
            }
        }
        true
    }
}

impl Door {
    pub fn new(server: &'static str, caps: ConnectionCaps) -> Arc<Door> {
        let caps = ConnectionCaps {
            strangers: caps.strangers.max(1),
            per_source: caps.per_source.max(1),
            proven: caps.proven,
            front_proxy_reserved: caps.front_proxy_reserved.min(caps.proven),
        };
        ServingMetrics::connection_caps(server, caps.strangers, caps.proven);
        Arc::new(Door {
            server,
            caps,
            rooms: Mutex::new(Rooms::default()),
        })
    }

    pub fn caps(&self) -> ConnectionCaps {
        self.caps
    }

    /// A place for a connection just accepted from `source`, as a stranger: never refused;
    /// past the caps, the source's oldest stranger (its own cap) or the oldest stranger of
    /// all is closed instead.
    pub fn enter(self: &Arc<Self>, source: IpAddr) -> Arc<Place> {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        let of_source = rooms.by_source.get(&source).map_or(0, BTreeSet::len);
        if of_source >= self.caps.per_source {
            if let Some(oldest) = rooms
                .by_source
                .get(&source)
                .and_then(|s| s.first().copied())
            {
                rooms.evict(oldest, Eviction::Source, self.server);
            }
        } else if rooms.strangers.len() >= self.caps.strangers
            && let Some(oldest) = rooms.strangers.keys().next().copied()
        {
            rooms.evict(oldest, Eviction::Oldest, self.server);
        }
        let id = rooms.next;
        rooms.next += 1;
        let close = Arc::new(Notify::new());
        rooms.strangers.insert(
            id,
            Stranger {
                source,
                close: close.clone(),
            },
        );
        rooms.by_source.entry(source).or_default().insert(id);
        Arc::new(Place {
            door: self.clone(),
            id,
            close,
            standing: Mutex::new(Standing::Stranger),
        })
    }

    /// (strangers, proven) held now.
    pub fn held(&self) -> (usize, usize) {
        let rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        (
            rooms.strangers.len(),
            rooms.proven_front_proxy + rooms.proven_token,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Stranger,
    Proven(Proof),
}

/// One connection's place at its server's door, given back when it drops.
#[derive(Debug)]
pub struct Place {
    door: Arc<Door>,
    id: u64,
    close: Arc<Notify>,
    standing: Mutex<Standing>,
}

impl Place {
    /// Moves the connection to the proven's places. False when it is still a stranger:
    /// closed to make room already, or the proven's places (a token's: those not reserved
    /// for the aggregator) are full — it keeps its stranger's place then.
    pub fn prove(&self, proof: Proof) -> bool {
        let mut rooms = self
            .door
            .rooms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut standing = self.standing.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*standing, Standing::Proven(_)) {
            return true;
        }
        let caps = self.door.caps;
        let proven = rooms.proven_front_proxy + rooms.proven_token;
        let room = match proof {
            Proof::FrontProxy => proven < caps.proven,
            Proof::Token => {
                proven < caps.proven && rooms.proven_token < caps.proven - caps.front_proxy_reserved
            }
        };
        if !room {
            ServingMetrics::refused(self.door.server, "connections", Peer::Authenticated);
            return false;
        }
        if !rooms.leave(self.id) {
            return false;
        }
        match proof {
            Proof::FrontProxy => rooms.proven_front_proxy += 1,
            Proof::Token => rooms.proven_token += 1,
        }
        *standing = Standing::Proven(proof);
        true
    }

    /// Who the connection is to the budgets.
    pub fn peer(&self) -> Peer {
        match *self.standing.lock().unwrap_or_else(PoisonError::into_inner) {
            Standing::Stranger => Peer::Unauthenticated,
            Standing::Proven(_) => Peer::Authenticated,
        }
    }

    /// Resolves once the connection was closed to make room.
    pub async fn closed(&self) {
        self.close.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut rooms = self
            .door
            .rooms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match *self
            .standing
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Standing::Stranger => {
                rooms.leave(self.id);
            }
            Standing::Proven(Proof::FrontProxy) => rooms.proven_front_proxy -= 1,
            Standing::Proven(Proof::Token) => rooms.proven_token -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn door(strangers: usize, per_source: usize, proven: usize, reserved: usize) -> Arc<Door> {
        Door::new(
            "test",
            ConnectionCaps {
                strangers,
                per_source,
                proven,
                front_proxy_reserved: reserved,
            },
        )
    }

    async fn was_closed(p: &Place) -> bool {
        tokio::time::timeout(Duration::from_millis(1), p.closed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_newcomer_is_never_refused_the_oldest_stranger_goes() {
        let d = door(3, 10, 10, 0);
        let a = d.enter(ip(1));
        let b = d.enter(ip(2));
        let c = d.enter(ip(3));
        assert_eq!(d.held(), (3, 0));
        // Full: the fourth gets in, the oldest is closed.
        let e = d.enter(ip(4));
        assert!(was_closed(&a).await);
        assert!(!was_closed(&b).await && !was_closed(&c).await && !was_closed(&e).await);
        assert_eq!(d.held(), (3, 0));
        // The closed one's drop changes nothing more.
        drop(a);
        assert_eq!(d.held(), (3, 0));
    }

    #[tokio::test]
    async fn a_source_at_its_cap_closes_its_own_oldest_never_anothers() {
        let d = door(10, 2, 10, 0);
        let other = d.enter(ip(9));
        let a1 = d.enter(ip(1));
        let a2 = d.enter(ip(1));
        let a3 = d.enter(ip(1));
        assert!(was_closed(&a1).await, "the source's oldest");
        assert!(
            !was_closed(&other).await,
            "an older connection of another source"
        );
        assert!(!was_closed(&a2).await && !was_closed(&a3).await);
        assert_eq!(d.held(), (3, 0));
    }

    #[tokio::test]
    async fn the_proven_leave_the_strangers_and_are_never_closed_for_them() {
        // Three proven places, one of them the aggregator's alone.
        let d = door(2, 10, 3, 1);
        let t1 = d.enter(ip(2));
        assert!(t1.prove(Proof::Token));
        let t2 = d.enter(ip(2));
        assert!(t2.prove(Proof::Token));
        let t3 = d.enter(ip(2));
        assert!(
            !t3.prove(Proof::Token),
            "the last place is the aggregator's"
        );
        assert_eq!(t3.peer(), Peer::Unauthenticated);
        let agg = d.enter(ip(1));
        assert!(agg.prove(Proof::FrontProxy));
        assert_eq!(agg.peer(), Peer::Authenticated);
        // A flood of strangers closes strangers only.
        let flood: Vec<_> = (0..50).map(|_| d.enter(ip(7))).collect();
        assert!(!was_closed(&agg).await && !was_closed(&t1).await && !was_closed(&t2).await);
        assert!(was_closed(&t3).await);
        assert_eq!(d.held(), (2, 3));
        drop(flood);
        drop((agg, t1, t2, t3));
        assert_eq!(d.held(), (0, 0));
    }

    #[tokio::test]
    async fn a_stranger_closed_to_make_room_cannot_prove_itself_back_in() {
        let d = door(1, 10, 10, 0);
        let a = d.enter(ip(1));
        let _b = d.enter(ip(2));
        assert!(was_closed(&a).await);
        assert!(!a.prove(Proof::Token));
        assert_eq!(d.held(), (1, 0));
    }
}
