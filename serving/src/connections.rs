//! Who may hold a server's connections. A new connection cannot say who it is before it is
//! accepted, so every connection starts as a stranger and the server never refuses one at
//! accept. Strangers are counted by what each one holds in its [`Stage`] — an idle socket
//! about 11 KiB, a handshaking one 24 KiB, an open one 32 KiB (measured, docs/design.md) —
//! against a budget of bytes, and a source address may hold at most its share of it (nginx's
//! `limit_conn` per address, in bytes). When a newcomer or a stranger's progress does not
//! fit, the stranger that has gone **longest without progress** is closed: one that never
//! sent a byte before any that did, the oldest of those first (a socket whose bytes wait
//! unread, its task not yet at them, has sent them: the kernel is asked) — so thousands of idle
//! sockets fit where a few head-bombers cannot, an attacker holding idle sockets only ever
//! closes its own, and a connection whose handshake is progressing is never the one to go
//! while a silent one is there.
//!
//! A stranger whose TLS handshake completed and whose request carries credentials
//! ([`Place::present`]) leaves the strangers at once, before its review: it takes one of
//! the places of the proven (those a token may take), and settles there once reviewed
//! ([`Place::prove`]) or goes back among the strangers if it proved nothing
//! ([`Place::settle`]). A front-proxy client certificate verified at the handshake proves
//! the connection there and then; `front_proxy_reserved` of the proven's places are the
//! aggregator's alone.
//!
//! Go's `net/http`, as kube-apiserver runs it, has no connection cap at all and holds every
//! idle socket; this server holds what its budget allows, and which ones go is the server's
//! choice, not the flood's.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::metrics::Peer;
use crate::metrics::ServingMetrics;

/// How many connections of each kind a server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// Connections that have not proven who they are, at most (the open-file room).
    pub strangers: usize,
    /// Of those, from one source address.
    pub per_source: usize,
    /// The bytes strangers' connections may hold in all, each by its [`Stage`].
    pub stranger_bytes: usize,
    /// Of those, a source address's.
    pub per_source_bytes: usize,
    /// Connections that have proven who they are (front proxy or reviewed token), or are
    /// presenting a token for review.
    pub proven: usize,
    /// Of `proven`, kept for the aggregator's front-proxy certificate.
    pub front_proxy_reserved: usize,
}

/// How far a stranger's connection has come, and what it holds there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Accepted, nothing read: the socket, its task and their first buffers.
    Silent,
    /// Its first bytes read: a TLS handshake under way (rustls' state and buffers).
    Handshaking,
    /// Talking HTTP: its handshake done (or a plain connection's first bytes read),
    /// reading a head, being answered, or idle between requests. Head bytes are the head
    /// budget's ([`crate::budget`]).
    Open,
}

impl Stage {
    /// What a connection at this stage holds, measured (docs/design.md, "What a stranger's
    /// connection costs"): an idle socket 11 KiB, after a TLS handshake and a small head
    /// 32 KiB; the handshake between.
    pub const fn bytes(self) -> usize {
        match self {
            Stage::Silent => 11 << 10,
            Stage::Handshaking => 24 << 10,
            Stage::Open => 32 << 10,
        }
    }
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

/// Where a stranger stands in the order of eviction: never-progressed ones first
/// (`progressed` false), then by the time of their last progress.
type Staleness = (bool, u64);

#[derive(Debug, Default)]
struct Rooms {
    /// Ids and progress times, one counter.
    clock: u64,
    strangers: HashMap<u64, Stranger>,
    /// Strangers by staleness: the first is the next to go.
    order: BTreeMap<Staleness, u64>,
    by_source: HashMap<IpAddr, Source>,
    /// What the strangers hold, in bytes.
    bytes: usize,
    proven_front_proxy: usize,
    /// Reviewed tokens and tokens presented for review.
    proven_token: usize,
}

#[derive(Debug, Default)]
struct Source {
    bytes: usize,
    order: BTreeMap<Staleness, u64>,
}

#[derive(Debug)]
struct Stranger {
    source: IpAddr,
    close: Arc<Notify>,
    stage: Stage,
    staleness: Staleness,
    /// Its socket, to ask the kernel whether bytes wait in it (none in unit tests).
    socket: Option<RawFd>,
}

/// Whether bytes wait unread in `socket`: a peek that takes nothing and never waits. (A
/// descriptor closed and reused meanwhile answers for another socket: at worst one
/// stranger's order is wrong for a moment.)
fn bytes_waiting(socket: RawFd) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    let mut byte = [0u8; 1];
    recv(
        socket,
        &mut byte,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    )
    .is_ok_and(|n| n > 0)
}

/// Why a stranger was closed to make room.
#[derive(Debug, Clone, Copy)]
enum Eviction {
    /// The strangers' budget was full: the stalest stranger went.
    Oldest,
    /// Its source held all its share: the source's stalest went.
    Source,
}

impl Rooms {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn insert(&mut self, id: u64, stranger: Stranger) {
        let source = self.by_source.entry(stranger.source).or_default();
        source.bytes += stranger.stage.bytes();
        source.order.insert(stranger.staleness, id);
        self.bytes += stranger.stage.bytes();
        self.order.insert(stranger.staleness, id);
        self.strangers.insert(id, stranger);
    }

    /// Takes stranger `id` out of the rooms (its place is no longer a stranger's).
    fn remove(&mut self, id: u64) -> Option<Stranger> {
        let s = self.strangers.remove(&id)?;
        self.order.remove(&s.staleness);
        self.bytes -= s.stage.bytes();
        if let Some(source) = self.by_source.get_mut(&s.source) {
            source.order.remove(&s.staleness);
            source.bytes -= s.stage.bytes();
            if source.order.is_empty() {
                self.by_source.remove(&s.source);
            }
        }
        Some(s)
    }

    fn evict(&mut self, id: u64, why: Eviction, server: &str) {
        let Some(s) = self.remove(id) else {
            return;
        };
        s.close.notify_one();
        let reason = match why {
            Eviction::Oldest => "evicted",
            Eviction::Source => "source",
        };
        ServingMetrics::refused(server, reason, Peer::Unauthenticated);
    }

    /// Closes the stalest strangers — the source's first, while it is past its share, then
    /// anyone's — until what `need` asks for fits. Never `need.keep`.
    fn make_room(&mut self, caps: &ConnectionCaps, need: Need, server: &str) {
        while let Some(s) = self.by_source.get(&need.source) {
            let over = s.bytes + need.bytes > caps.per_source_bytes
                || s.order.len() + need.adds > caps.per_source;
            if !over {
                break;
            }
            match self.stalest(Some(need.source), need.keep) {
                Some(v) => self.evict(v, Eviction::Source, server),
                None => break,
            }
        }
        while self.bytes + need.bytes > caps.stranger_bytes
            || self.strangers.len() + need.adds > caps.strangers
        {
            match self.stalest(None, need.keep) {
                Some(v) => self.evict(v, Eviction::Oldest, server),
                None => break,
            }
        }
    }

    /// The stranger to close next — of `source`, or of all — never `keep`. A silent one
    /// whose bytes wait unread in its socket has spoken (its task has not read them yet):
    /// it moves among the progressed, once, and the next is looked at.
    fn stalest(&mut self, source: Option<IpAddr>, keep: Option<u64>) -> Option<u64> {
        loop {
            let order = match source {
                Some(ip) => &self.by_source.get(&ip)?.order,
                None => &self.order,
            };
            let (key, id) = order
                .iter()
                .map(|(k, v)| (*k, *v))
                .find(|(_, v)| Some(*v) != keep)?;
            let spoke = !key.0
                && self
                    .strangers
                    .get(&id)
                    .and_then(|s| s.socket)
                    .is_some_and(bytes_waiting);
            if !spoke {
                return Some(id);
            }
            let s = self.remove(id)?;
            let staleness = (true, self.tick());
            self.insert(id, Stranger { staleness, ..s });
        }
    }
}

/// Room a stranger needs: `bytes` more from `source`, `adds` more connections (a newcomer:
/// 1), never at `keep`'s expense.
#[derive(Debug, Clone, Copy)]
struct Need {
    source: IpAddr,
    bytes: usize,
    adds: usize,
    keep: Option<u64>,
}

impl Door {
    pub fn new(server: &'static str, caps: ConnectionCaps) -> Arc<Door> {
        let strangers = caps.strangers.max(1);
        let stranger_bytes = caps.stranger_bytes.max(Stage::Open.bytes());
        let caps = ConnectionCaps {
            strangers,
            per_source: caps.per_source.clamp(1, strangers),
            stranger_bytes,
            per_source_bytes: caps
                .per_source_bytes
                .clamp(Stage::Open.bytes(), stranger_bytes),
            proven: caps.proven,
            front_proxy_reserved: caps.front_proxy_reserved.min(caps.proven),
        };
        ServingMetrics::connection_caps(server, caps.strangers, caps.proven, caps.stranger_bytes);
        Arc::new(Door {
            server,
            caps,
            rooms: Mutex::new(Rooms::default()),
        })
    }

    pub fn caps(&self) -> ConnectionCaps {
        self.caps
    }

    fn rooms(&self) -> MutexGuard<'_, Rooms> {
        self.rooms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection just accepted from `source` on `socket`, as a stranger —
    /// one that has progressed when its first bytes already wait in the socket (a client's
    /// hello, not an idle socket's silence) — never refused; past the budgets, the source's
    /// stalest stranger (its own share) or the stalest of all is closed instead.
    pub fn enter(self: &Arc<Self>, source: IpAddr, socket: Option<RawFd>) -> Arc<Place> {
        let mut rooms = self.rooms();
        let need = Need {
            source,
            bytes: Stage::Silent.bytes(),
            adds: 1,
            keep: None,
        };
        rooms.make_room(&self.caps, need, self.server);
        let id = rooms.tick();
        let close = Arc::new(Notify::new());
        let stranger = Stranger {
            source,
            close: close.clone(),
            stage: Stage::Silent,
            staleness: (socket.is_some_and(bytes_waiting), id),
            socket,
        };
        rooms.insert(id, stranger);
        ServingMetrics::stranger_bytes(self.server, rooms.bytes);
        Arc::new(Place {
            door: self.clone(),
            id,
            source,
            close,
            standing: Mutex::new(Standing::Stranger),
        })
    }

    /// (strangers, proven) held now; presented tokens count as proven.
    pub fn held(&self) -> (usize, usize) {
        let rooms = self.rooms();
        (
            rooms.strangers.len(),
            rooms.proven_front_proxy + rooms.proven_token,
        )
    }

    /// The bytes strangers hold now.
    pub fn stranger_bytes(&self) -> usize {
        self.rooms().bytes
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Stranger,
    /// A token presented and under review: out of the strangers' budget, in a token's place.
    Presenting,
    Proven(Proof),
}

/// One connection's place at its server's door, given back when it drops.
#[derive(Debug)]
pub struct Place {
    door: Arc<Door>,
    id: u64,
    source: IpAddr,
    close: Arc<Notify>,
    standing: Mutex<Standing>,
}

impl Place {
    fn lock(&self) -> (MutexGuard<'_, Rooms>, MutexGuard<'_, Standing>) {
        let rooms = self.door.rooms();
        let standing = self.standing.lock().unwrap_or_else(PoisonError::into_inner);
        (rooms, standing)
    }

    /// The stranger made progress and is now at `stage` (a later one holds more): it goes
    /// to the back of the order of eviction, and the room it needs more is made by closing
    /// the stalest others. Nothing for a connection that is no stranger (any more).
    pub fn progress(&self, stage: Stage) {
        let door = &self.door;
        let mut rooms = door.rooms();
        let Some(s) = rooms.remove(self.id) else {
            return;
        };
        let stage = stage.max(s.stage);
        let need = Need {
            source: s.source,
            bytes: stage.bytes(),
            adds: 1,
            keep: Some(self.id),
        };
        rooms.make_room(&door.caps, need, door.server);
        let staleness = (true, rooms.tick());
        rooms.insert(
            self.id,
            Stranger {
                stage,
                staleness,
                ..s
            },
        );
        ServingMetrics::stranger_bytes(door.server, rooms.bytes);
    }

    /// The connection's request carries a token (after a completed TLS handshake): it
    /// leaves the strangers before anything else happens to it, for one of the places a
    /// token may take. False when it stays a stranger: closed to make room already, or
    /// those places are full.
    pub fn present(&self) -> bool {
        let (mut rooms, mut standing) = self.lock();
        if *standing != Standing::Stranger {
            return true;
        }
        if !token_room(&rooms, &self.door.caps) {
            ServingMetrics::refused(self.door.server, "connections", Peer::Authenticated);
            return false;
        }
        if rooms.remove(self.id).is_none() {
            return false;
        }
        rooms.proven_token += 1;
        *standing = Standing::Presenting;
        ServingMetrics::stranger_bytes(self.door.server, rooms.bytes);
        true
    }

    /// Moves the connection to the proven's places. False when it is still a stranger:
    /// closed to make room already, or the proven's places (a token's: those not reserved
    /// for the aggregator) are full — it keeps its stranger's place then.
    pub fn prove(&self, proof: Proof) -> bool {
        let (mut rooms, mut standing) = self.lock();
        match (*standing, proof) {
            (Standing::Proven(_), _) => return true,
            (Standing::Presenting, Proof::Token) => {
                *standing = Standing::Proven(Proof::Token);
                return true;
            }
            (Standing::Presenting, Proof::FrontProxy) => {
                // Its token's place is given back for the aggregator's.
                rooms.proven_token -= 1;
                *standing = Standing::Stranger;
                let back = self.returning(&mut rooms);
                rooms.insert(self.id, back);
            }
            (Standing::Stranger, _) => {}
        }
        let caps = self.door.caps;
        let room = match proof {
            Proof::FrontProxy => rooms.proven_front_proxy + rooms.proven_token < caps.proven,
            Proof::Token => token_room(&rooms, &caps),
        };
        if !room {
            ServingMetrics::refused(self.door.server, "connections", Peer::Authenticated);
            return false;
        }
        if rooms.remove(self.id).is_none() {
            return false;
        }
        match proof {
            Proof::FrontProxy => rooms.proven_front_proxy += 1,
            Proof::Token => rooms.proven_token += 1,
        }
        *standing = Standing::Proven(proof);
        ServingMetrics::stranger_bytes(self.door.server, rooms.bytes);
        true
    }

    /// The connection's request proved nothing (its token was refused or not reviewed):
    /// a presenting connection goes back among the strangers, at the back of the order,
    /// and gives back its token's place.
    pub fn settle(&self) {
        let (mut rooms, mut standing) = self.lock();
        if *standing != Standing::Presenting {
            return;
        }
        rooms.proven_token -= 1;
        *standing = Standing::Stranger;
        let need = Need {
            source: self.source,
            bytes: Stage::Open.bytes(),
            adds: 1,
            keep: Some(self.id),
        };
        rooms.make_room(&self.door.caps, need, self.door.server);
        let back = self.returning(&mut rooms);
        rooms.insert(self.id, back);
        ServingMetrics::stranger_bytes(self.door.server, rooms.bytes);
    }

    /// This connection as a stranger again: open, its last progress now.
    fn returning(&self, rooms: &mut Rooms) -> Stranger {
        Stranger {
            source: self.source,
            close: self.close.clone(),
            stage: Stage::Open,
            staleness: (true, rooms.tick()),
            socket: None,
        }
    }

    /// Who the connection is to the budgets: a presented token is not proven yet.
    pub fn peer(&self) -> Peer {
        match *self.standing.lock().unwrap_or_else(PoisonError::into_inner) {
            Standing::Stranger | Standing::Presenting => Peer::Unauthenticated,
            Standing::Proven(_) => Peer::Authenticated,
        }
    }

    /// Resolves once the connection was closed to make room.
    pub async fn closed(&self) {
        self.close.notified().await;
    }
}

/// Whether a token may take one more of the proven's places (those not the aggregator's).
fn token_room(rooms: &Rooms, caps: &ConnectionCaps) -> bool {
    rooms.proven_front_proxy + rooms.proven_token < caps.proven
        && rooms.proven_token < caps.proven - caps.front_proxy_reserved
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut rooms = self.door.rooms();
        match *self
            .standing
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Standing::Stranger => {
                rooms.remove(self.id);
                ServingMetrics::stranger_bytes(self.door.server, rooms.bytes);
            }
            Standing::Proven(Proof::FrontProxy) => rooms.proven_front_proxy -= 1,
            Standing::Presenting | Standing::Proven(Proof::Token) => rooms.proven_token -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SILENT: usize = Stage::Silent.bytes();
    const OPEN: usize = Stage::Open.bytes();

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// A door whose strangers may hold `bytes` (a source `per_source_bytes`), many places.
    fn door(bytes: usize, per_source_bytes: usize, proven: usize, reserved: usize) -> Arc<Door> {
        Door::new(
            "test",
            ConnectionCaps {
                strangers: 10_000,
                per_source: 10_000,
                stranger_bytes: bytes,
                per_source_bytes,
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
    async fn a_newcomer_is_never_refused_the_stalest_silent_stranger_goes() {
        let d = door(2 * SILENT, 2 * SILENT, 10, 0);
        let a = d.enter(ip(1), None);
        let b = d.enter(ip(2), None);
        assert_eq!((d.held(), d.stranger_bytes()), ((2, 0), 2 * SILENT));
        // The smallest budget a door takes is one open connection's: two silent ones.
        let e = d.enter(ip(4), None);
        assert!(was_closed(&a).await);
        assert!(!was_closed(&b).await && !was_closed(&e).await);
        assert_eq!(d.held(), (2, 0));
        // The closed one's drop changes nothing more.
        drop(a);
        assert_eq!((d.held(), d.stranger_bytes()), ((2, 0), 2 * SILENT));
    }

    #[tokio::test]
    async fn idle_sockets_cost_what_they_hold_so_thousands_fit_where_few_open_ones_do() {
        let d = door(100 * OPEN, 100 * OPEN, 10, 0);
        let idle: Vec<_> = (0..290).map(|_| d.enter(ip(1), None)).collect();
        assert_eq!(d.held(), (290, 0));
        assert!(
            !was_closed(&idle[0]).await,
            "290 silent sockets fit 100 open places"
        );
        // Each one that opens holds more: the silent ones make room for it.
        for p in &idle[200..] {
            p.progress(Stage::Open);
        }
        assert_eq!(d.stranger_bytes(), 90 * OPEN + (d.held().0 - 90) * SILENT);
        assert!(d.stranger_bytes() <= 100 * OPEN);
        assert!(was_closed(&idle[0]).await, "the oldest silent socket went");
        for p in &idle[200..] {
            assert!(
                !was_closed(p).await,
                "an open connection went before a silent one"
            );
        }
    }

    #[tokio::test]
    async fn a_progressing_stranger_outlives_every_silent_one_however_old() {
        let d = door(4 * OPEN, 4 * OPEN, 10, 0);
        // The client connects first, and its handshake progresses.
        let client = d.enter(ip(1), None);
        client.progress(Stage::Handshaking);
        // A flood of silent sockets from its own source, reconnecting: 1,000 arrivals.
        let mut flood = Vec::new();
        for _ in 0..1000 {
            flood.push(d.enter(ip(1), None));
        }
        assert!(
            !was_closed(&client).await,
            "a progressing handshake closed for a silent socket"
        );
        client.progress(Stage::Open);
        assert!(!was_closed(&client).await);
        // The positive control: without its progress, a client is the stalest and goes.
        let idle_client = d.enter(ip(1), None);
        for _ in 0..1000 {
            flood.push(d.enter(ip(1), None));
        }
        assert!(was_closed(&idle_client).await);
    }

    #[tokio::test]
    async fn a_client_whose_hello_waits_unread_outlives_silent_newcomers() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let d = door(4 * OPEN, 4 * OPEN, 10, 0);
        // Its hello waits in the socket, unread: at its accept, or later, before its task
        // read it.
        let (mut peer, ours) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut late_peer, late) = std::os::unix::net::UnixStream::pair().unwrap();
        peer.write_all(b"hello").unwrap();
        let client = d.enter(ip(1), Some(ours.as_raw_fd()));
        let late_client = d.enter(ip(1), Some(late.as_raw_fd()));
        late_peer.write_all(b"hello").unwrap();
        let mut flood = Vec::new();
        for _ in 0..1000 {
            flood.push(d.enter(ip(1), None));
        }
        assert!(!was_closed(&client).await);
        assert!(!was_closed(&late_client).await);
        // The positive control: a silent socket is the stalest of the silent ones and goes.
        let (_quiet_peer, quiet) = std::os::unix::net::UnixStream::pair().unwrap();
        let silent = d.enter(ip(1), Some(quiet.as_raw_fd()));
        for _ in 0..1000 {
            flood.push(d.enter(ip(1), None));
        }
        assert!(was_closed(&silent).await);
    }

    #[tokio::test]
    async fn among_progressed_strangers_the_longest_without_progress_goes() {
        let d = door(3 * OPEN, 3 * OPEN, 10, 0);
        let a = d.enter(ip(1), None);
        let b = d.enter(ip(2), None);
        let c = d.enter(ip(3), None);
        for p in [&a, &b, &c] {
            p.progress(Stage::Open);
        }
        // a progresses again: b is now the stalest.
        a.progress(Stage::Open);
        let _newcomer = d.enter(ip(4), None);
        assert!(was_closed(&b).await);
        assert!(!was_closed(&a).await && !was_closed(&c).await);
    }

    #[tokio::test]
    async fn a_source_past_its_share_closes_its_own_stalest_never_anothers() {
        let d = door(100 * SILENT, 3 * SILENT, 10, 0);
        let other = d.enter(ip(9), None);
        let a1 = d.enter(ip(1), None);
        let a2 = d.enter(ip(1), None);
        let a3 = d.enter(ip(1), None);
        let a4 = d.enter(ip(1), None);
        assert!(was_closed(&a1).await, "the source's stalest");
        assert!(
            !was_closed(&other).await,
            "an older connection of another source"
        );
        assert!(!was_closed(&a2).await && !was_closed(&a3).await && !was_closed(&a4).await);
        assert_eq!(d.held(), (4, 0));
    }

    #[tokio::test]
    async fn the_proven_leave_the_strangers_and_are_never_closed_for_them() {
        // Three proven places, one of them the aggregator's alone.
        let d = door(2 * SILENT, 2 * SILENT, 3, 1);
        let t1 = d.enter(ip(2), None);
        assert!(t1.prove(Proof::Token));
        let t2 = d.enter(ip(2), None);
        assert!(t2.prove(Proof::Token));
        let t3 = d.enter(ip(2), None);
        assert!(
            !t3.prove(Proof::Token),
            "the last place is the aggregator's"
        );
        assert_eq!(t3.peer(), Peer::Unauthenticated);
        let agg = d.enter(ip(1), None);
        assert!(agg.prove(Proof::FrontProxy));
        assert_eq!(agg.peer(), Peer::Authenticated);
        // A flood of strangers closes strangers only.
        let flood: Vec<_> = (0..50).map(|_| d.enter(ip(7), None)).collect();
        assert!(!was_closed(&agg).await && !was_closed(&t1).await && !was_closed(&t2).await);
        assert!(was_closed(&t3).await);
        assert_eq!(d.held(), (2, 3));
        drop(flood);
        drop((agg, t1, t2, t3));
        assert_eq!((d.held(), d.stranger_bytes()), ((0, 0), 0));
    }

    #[tokio::test]
    async fn a_presented_token_leaves_the_strangers_before_its_review() {
        let d = door(2 * OPEN, 2 * OPEN, 2, 0);
        let client = d.enter(ip(1), None);
        client.progress(Stage::Open);
        assert!(client.present());
        // Still a stranger to the budgets until reviewed, but no flood closes it.
        assert_eq!(client.peer(), Peer::Unauthenticated);
        assert_eq!(d.held(), (0, 1));
        let _flood: Vec<_> = (0..100).map(|_| d.enter(ip(1), None)).collect();
        assert!(!was_closed(&client).await);
        assert!(client.prove(Proof::Token));
        assert_eq!(client.peer(), Peer::Authenticated);
        assert_eq!(d.held().1, 1);
        drop(client);
        assert_eq!(d.held().1, 0);
    }

    #[tokio::test]
    async fn a_token_that_proved_nothing_goes_back_among_the_strangers() {
        let d = door(2 * OPEN, 2 * OPEN, 1, 0);
        let forger = d.enter(ip(1), None);
        assert!(forger.present());
        // The one token place is taken while it is reviewed.
        let honest = d.enter(ip(2), None);
        assert!(!honest.present());
        forger.settle();
        assert_eq!(d.held(), (2, 0));
        assert!(honest.present(), "the place it gave back");
        // Back among the strangers, it is closed to make room like any: here the stalest.
        let c = d.enter(ip(3), None);
        c.progress(Stage::Open);
        let _e = d.enter(ip(3), None);
        assert!(was_closed(&forger).await);
        assert!(!was_closed(&c).await);
        drop(forger);
        assert_eq!(d.held().1, 1);
    }

    #[tokio::test]
    async fn a_stranger_closed_to_make_room_cannot_prove_itself_back_in() {
        let d = door(SILENT, SILENT, 10, 0);
        let a = d.enter(ip(1), None);
        let _b = d.enter(ip(2), None);
        let _c = d.enter(ip(2), None);
        assert!(was_closed(&a).await);
        assert!(!a.prove(Proof::Token));
        assert!(!a.present());
        a.progress(Stage::Open);
        assert_eq!((d.held(), d.stranger_bytes()), ((2, 0), 2 * SILENT));
    }
}
