//! An address's history: who held it, and which Services it was on, when. Kept in the
//! address's status, bounded, append-only, written only within the status writes that
//! bind, reserve, release and attach it anyway — never a write of its own.
//!
//! Two lists, each owned by the component that writes the fact it records: `history`
//! (the core: the claims the address was bound to or reserved for) and
//! `attachmentHistory` (the driver: the Services it was on). The views join them.
//!
//! Times are the writer's clock at the write (second precision): a leader failover
//! continues the same list (the open entry is in the object, not in a replica's memory);
//! clock skew between replicas shifts the times written after a failover by the skew.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{AddressPhase, Attachment, ClaimRef, IPAddress};

/// The schema's cap on `status.history` (and the bound before records were kept: past it
/// the oldest closed ones were dropped and counted in `status.historyDropped`).
pub const HOLDINGS_LIMIT: usize = 32;
/// The cap on `status.attachmentHistory` (sharing attaches several at once), as above.
pub const SPANS_LIMIT: usize = 64;
/// How many closed holdings an address keeps besides its open one: the write that closes
/// one more moves the oldest past this to an `IPAddressRecord` (created first).
pub const HOLDINGS_KEEP: usize = 4;
/// How many closed spans an address keeps besides its open ones.
pub const SPANS_KEEP: usize = 8;
/// At most this many entries move to records in one write: an address written before
/// records were kept (up to 32 + 64 closed entries) moves its backlog a few at a time.
pub const MOVE_BATCH: usize = 8;

/// What the address was to a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum HoldingState {
    /// Bound to the claim (phase `Bound`): the claim held it.
    Bound,
    /// Reserved for a claim by name (a claimRef without uid, SPEC §5.6): nobody else could
    /// take it, and the claim named binds it once it exists.
    Reserved,
}

/// How a holding ended.
pub mod ended {
    /// The claim let it go (deleted, reclaimed, surplus): the address went `Released`.
    pub const RELEASED: &str = "Released";
    /// The reservation's claim bound it (the next holding is the binding).
    pub const BOUND: &str = "Bound";
    /// An admin re-pointed the claimRef to another claim (SPEC §5.6).
    pub const MOVED: &str = "Moved";
    /// The claimRef was cleared without a release (an admin freed a reservation).
    pub const FREED: &str = "Freed";
    /// The address was deleted while the holding lasted (recorded by the core's finalizer).
    pub const DELETED: &str = "Deleted";
}

/// One holding: a claim the address was bound to or reserved for, from when until when.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Holding {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's uid (a binding's; a reservation names a claim by name only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `Bound` or `Reserved`.
    pub state: HoldingState,
    /// When it began (the write that recorded it); absent for a binding that began before
    /// the history was kept (an upgrade: `found`), recorded when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Time>,
    /// When it ended; absent while it lasts (only the last entry may be open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    /// How it ended: `Released`, `Bound` (a reservation its claim bound), `Moved` or
    /// `Freed` (an admin's acts, SPEC §5.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The binding was under way when the history began to be kept (an upgrade): it is
    /// recorded when it ends, without `from` — the core writes no entry of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub found: bool,
}

/// One span of a Service (or another object a driver attaches to) holding the address.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentSpan {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// When the driver recorded it as a holder.
    pub from: Time,
    /// When the driver took it off the holders; absent while it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    /// It held the address when the history began to be kept (an upgrade): `from` is when
    /// it was found.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub found: bool,
    /// The holder was served by cozy-proxy: its pod's outbound traffic left from the
    /// address (an egress span — what an abuse report about traffic *from* the address
    /// asks). A holder that stops or starts being one ends its span and begins another.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
    /// The nodes its workload ran on, each from when the driver saw it there (a VM's live
    /// migration is a move within the span, not a new span): "from which node" at T is the
    /// last one that began before T. The last [`NODES_KEEP`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub nodes: Vec<NodeStay>,
}

/// A holder's workload on a node, from a moment (see [`AttachmentSpan::nodes`]).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NodeStay {
    /// The node's name.
    #[schemars(length(max = 253))]
    pub node: String,
    /// When the driver first saw the workload there.
    pub from: Time,
}

/// How many moves a span keeps (the oldest go first; a VM moves on every drain).
pub const NODES_KEEP: usize = 16;

impl AttachmentSpan {
    fn same_holder(&self, a: &Attachment) -> bool {
        self.kind == a.kind
            && self.namespace == a.namespace
            && self.name == a.name
            && self.egress == a.method.is_some()
    }
}

/// What the address is to a claim after a core write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held<'a> {
    /// Bound to the claim the claimRef names.
    Bound(&'a ClaimRef),
    /// Reserved for (or pre-bound to) the claim the claimRef names.
    Reserved(&'a ClaimRef),
    /// Released: the open holding ends `Released`.
    Released,
    /// Nobody's (no claimRef).
    Free,
}

impl<'a> Held<'a> {
    /// What an address with `claim_ref` is in `phase` (the core's phases; `None` for the
    /// driver's `Conflict` / `Lost`, which leave the history as it is).
    pub fn of(claim_ref: Option<&'a ClaimRef>, phase: AddressPhase) -> Option<Held<'a>> {
        Some(match (phase, claim_ref) {
            (AddressPhase::Released, _) => Held::Released,
            (AddressPhase::Conflict | AddressPhase::Lost, _) => return None,
            (_, None) => Held::Free,
            (AddressPhase::Bound, Some(r)) => Held::Bound(r),
            (AddressPhase::Available | AddressPhase::Pending, Some(r)) => Held::Reserved(r),
        })
    }

    fn state(&self) -> Option<(HoldingState, &'a ClaimRef)> {
        match *self {
            Held::Bound(r) => Some((HoldingState::Bound, r)),
            Held::Reserved(r) => Some((HoldingState::Reserved, r)),
            Held::Released | Held::Free => None,
        }
    }
}

impl Holding {
    /// Whether this open holding already records `state` of `r`.
    fn records(&self, state: HoldingState, r: &ClaimRef) -> bool {
        self.state == state
            && self.namespace == r.namespace
            && self.name == r.name
            && (state == HoldingState::Reserved || self.uid == r.uid)
    }

    /// Whether it covers the instant `t` (from inclusive, until exclusive).
    pub fn covers(&self, t: &Time) -> bool {
        self.from.as_ref().is_none_or(|f| f.0 <= t.0)
            && self.until.as_ref().is_none_or(|u| t.0 < u.0)
    }
}

/// Who held the address at `t`: the holding that covers it (a binding or a reservation),
/// `None` in a gap (free, or Released waiting out its delay).
pub fn holder_at<'a>(history: &'a [Holding], t: &Time) -> Option<&'a Holding> {
    history.iter().rev().find(|h| h.covers(t))
}

impl AttachmentSpan {
    /// Whether the span overlaps the holding `h` (a Service the address was on during it).
    pub fn during(&self, h: &Holding) -> bool {
        h.until.as_ref().is_none_or(|u| self.from.0 < u.0)
            && self
                .until
                .as_ref()
                .is_none_or(|u| h.from.as_ref().is_none_or(|f| u.0 > f.0))
    }
}

impl AttachmentSpan {
    /// The node its workload ran on at `t`, as far as the span knows.
    pub fn node_at(&self, t: &Time) -> Option<&str> {
        self.nodes
            .iter()
            .rev()
            .find(|n| n.from.0 <= t.0)
            .map(|n| n.node.as_str())
    }

    /// Records that its holder's workload runs on `node` from `now`, when that is a move;
    /// whether it was.
    fn moved_to(&mut self, node: Option<&str>, now: &Time) -> bool {
        let Some(node) = node else { return false };
        if self.nodes.last().map(|n| n.node.as_str()) == Some(node) {
            return false;
        }
        self.nodes.push(NodeStay {
            node: node.to_string(),
            from: now.clone(),
        });
        let over = self.nodes.len().saturating_sub(NODES_KEEP);
        self.nodes.drain(..over);
        true
    }
}

/// The Services that held the address at `t`.
pub fn attached_at<'a>(spans: &'a [AttachmentSpan], t: &Time) -> Vec<&'a AttachmentSpan> {
    spans
        .iter()
        .filter(|s| s.from.0 <= t.0 && s.until.as_ref().is_none_or(|u| t.0 < u.0))
        .collect()
}

/// What a namespace used of a class over a period: seconds its claims held addresses
/// (`Bound`), and of those the seconds some Service was on them (sharing counts once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Distinct addresses held within the period.
    pub addresses: i64,
    pub held_seconds: i64,
    pub attached_seconds: i64,
    /// Of those, the seconds a holder served by cozy-proxy sent its pod's outbound traffic
    /// from the address (egress spans).
    pub egress_seconds: i64,
    /// The history cannot answer for all of the period: entries that may have covered it
    /// were dropped past the bound, or a binding was found under way (an upgrade).
    pub partial: bool,
}

/// The seconds of `[lo, hi)` within `[from, until)` (`from` absent: from `lo`; `until`
/// absent: open, up to `hi`).
fn overlap(from: Option<&Time>, until: Option<&Time>, lo: i64, hi: i64) -> Option<(i64, i64)> {
    let s = from.map_or(lo, |f| f.0.as_second().max(lo));
    let e = until.map_or(hi, |u| u.0.as_second().min(hi));
    (e > s).then_some((s, e))
}

/// One entry of the history as kept outside the address and as exported: the spec of an
/// `IPAddressRecord` (one spelling for the record in the cluster and the line in an archive).
pub type Record = crate::RecordSpec;
pub use crate::RecordOf;

/// The columns of a [`Record`] in CSV, in order.
pub const RECORD_COLUMNS: &[&str] = &[
    "record",
    "address",
    "ipAddress",
    "className",
    "kind",
    "namespace",
    "name",
    "uid",
    "state",
    "from",
    "until",
    "ended",
    "found",
    "egress",
    "addressUID",
    "ordinal",
];

/// Which address an entry is of: what a record carries besides the entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddressMeta {
    /// The IP.
    pub address: String,
    /// The IPAddress object's name.
    pub ip_address: String,
    pub address_uid: String,
    pub class_name: String,
}

impl AddressMeta {
    pub fn of(a: &IPAddress) -> AddressMeta {
        AddressMeta {
            address: a.spec.address.clone(),
            ip_address: a.metadata.name.clone().unwrap_or_default(),
            address_uid: a.metadata.uid.clone().unwrap_or_default(),
            class_name: a.spec.class_name.clone(),
        }
    }

    /// The address a record is of.
    pub fn of_record(r: &Record) -> AddressMeta {
        AddressMeta {
            address: r.address.clone(),
            ip_address: r.ip_address.clone(),
            address_uid: r.address_uid.clone(),
            class_name: r.class_name.clone(),
        }
    }

    fn base(
        &self,
        record: RecordOf,
        ordinal: i64,
        kind: String,
        namespace: String,
        name: String,
    ) -> Record {
        Record {
            record,
            address: self.address.clone(),
            ip_address: self.ip_address.clone(),
            address_uid: self.address_uid.clone(),
            ordinal,
            class_name: self.class_name.clone(),
            kind,
            namespace,
            name,
            uid: None,
            state: None,
            from: None,
            until: None,
            ended: None,
            found: false,
            egress: false,
            nodes: Vec::new(),
        }
    }

    /// The record of holding `h`, the address's `ordinal`-th.
    pub fn holding(&self, ordinal: i64, h: &Holding) -> Record {
        Record {
            uid: h.uid.clone(),
            state: Some(h.state),
            from: h.from.clone(),
            until: h.until.clone(),
            ended: h.ended.clone(),
            found: h.found,
            ..self.base(
                RecordOf::Holding,
                ordinal,
                "IPAddressClaim".into(),
                h.namespace.clone(),
                h.name.clone(),
            )
        }
    }

    /// The record of span `sp`, the address's `ordinal`-th.
    pub fn span(&self, ordinal: i64, sp: &AttachmentSpan) -> Record {
        Record {
            from: Some(sp.from.clone()),
            until: sp.until.clone(),
            found: sp.found,
            egress: sp.egress,
            nodes: sp.nodes.clone(),
            ..self.base(
                RecordOf::Attachment,
                ordinal,
                sp.kind.clone(),
                sp.namespace.clone().unwrap_or_default(),
                sp.name.clone(),
            )
        }
    }
}

impl Record {
    /// Its cells in [`RECORD_COLUMNS`] order (empty for what it does not have).
    pub fn cells(&self) -> Vec<String> {
        let t = |t: &Option<Time>| t.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
        vec![
            self.record.as_str().to_string(),
            self.address.clone(),
            self.ip_address.clone(),
            self.class_name.clone(),
            self.kind.clone(),
            self.namespace.clone(),
            self.name.clone(),
            self.uid.clone().unwrap_or_default(),
            self.state.map(|s| format!("{s:?}")).unwrap_or_default(),
            t(&self.from),
            t(&self.until),
            self.ended.clone().unwrap_or_default(),
            self.found.to_string(),
            self.egress.to_string(),
            self.address_uid.clone(),
            self.ordinal.to_string(),
        ]
    }

    /// The holding it records (`None` for an attachment's).
    pub fn as_holding(&self) -> Option<Holding> {
        (self.record == RecordOf::Holding).then(|| Holding {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            state: self.state.unwrap_or(HoldingState::Bound),
            from: self.from.clone(),
            until: self.until.clone(),
            ended: self.ended.clone(),
            found: self.found,
        })
    }

    /// The span it records (`None` for a holding's).
    pub fn as_span(&self) -> Option<AttachmentSpan> {
        (self.record == RecordOf::Attachment).then(|| AttachmentSpan {
            kind: self.kind.clone(),
            namespace: (!self.namespace.is_empty()).then(|| self.namespace.clone()),
            name: self.name.clone(),
            from: self
                .from
                .clone()
                .unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            until: self.until.clone(),
            found: self.found,
            egress: self.egress,
            nodes: self.nodes.clone(),
        })
    }
}

/// One address's whole history — what its object keeps and what its records hold — by
/// ordinal: the one input of every answer about the past (`holders`, `usage`, exports,
/// the view), whether the address still exists or not.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub meta: AddressMeta,
    /// Holdings by ordinal, ascending.
    pub holdings: Vec<(i64, Holding)>,
    /// Spans by ordinal, ascending.
    pub spans: Vec<(i64, AttachmentSpan)>,
    /// Entries dropped from the address before records were kept (holdings, spans): gone.
    pub dropped: (i64, i64),
}

impl Timeline {
    /// What the address's object keeps.
    pub fn of(a: &IPAddress) -> Timeline {
        let (list, base) = holdings(a);
        let (spans_list, spans_base) = spans(a);
        let st = a.status.as_ref();
        Timeline {
            meta: AddressMeta::of(a),
            holdings: (base..).zip(list.iter().cloned()).collect(),
            spans: (spans_base..).zip(spans_list.iter().cloned()).collect(),
            dropped: st.map_or((0, 0), |s| {
                (s.history_dropped, s.attachment_history_dropped)
            }),
        }
    }

    /// A timeline of records only (the address is gone, or not read).
    pub fn of_record(r: &Record) -> Timeline {
        let mut t = Timeline {
            meta: AddressMeta::of_record(r),
            ..Timeline::default()
        };
        t.add(r);
        t
    }

    /// Adds a record's entry, unless the timeline has that ordinal already (an entry
    /// recorded and still on the address: the address's copy is the same).
    pub fn add(&mut self, r: &Record) {
        fn insert<T>(list: &mut Vec<(i64, T)>, ordinal: i64, v: Option<T>) {
            let Some(v) = v else { return };
            if let Err(i) = list.binary_search_by_key(&ordinal, |(o, _)| *o) {
                list.insert(i, (ordinal, v));
            }
        }
        match r.record {
            RecordOf::Holding => insert(&mut self.holdings, r.ordinal, r.as_holding()),
            RecordOf::Attachment => insert(&mut self.spans, r.ordinal, r.as_span()),
        }
    }

    /// The timelines of `addresses` and `records`, one per address uid, in IPAddress name
    /// order (an address deleted and created again: the older one first).
    pub fn gather<'a>(
        addresses: impl IntoIterator<Item = &'a IPAddress>,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Vec<Timeline> {
        let mut by: std::collections::HashMap<String, Timeline> = std::collections::HashMap::new();
        for a in addresses {
            let t = Timeline::of(a);
            by.insert(t.meta.address_uid.clone(), t);
        }
        for r in records {
            match by.get_mut(&r.address_uid) {
                Some(t) => t.add(r),
                None => {
                    by.insert(r.address_uid.clone(), Timeline::of_record(r));
                }
            }
        }
        let mut out: Vec<Timeline> = by.into_values().collect();
        let first = |t: &Timeline| {
            t.holdings
                .iter()
                .find_map(|(_, h)| h.from.as_ref().or(h.until.as_ref()).map(|x| x.0))
        };
        out.sort_by(|a, b| {
            (a.meta.ip_address.as_str(), first(a)).cmp(&(b.meta.ip_address.as_str(), first(b)))
        });
        out
    }

    /// Whether entries before the first known one are missing (dropped before records were
    /// kept, or pruned by the retention): for holdings, then spans.
    fn missing_before(&self) -> (bool, bool) {
        (
            self.holdings.first().map_or(self.dropped.0, |(o, _)| *o) > 0,
            self.spans.first().map_or(self.dropped.1, |(o, _)| *o) > 0,
        )
    }
}

/// The holdings and spans of a timeline that touch `[lo, hi)`, holdings first, each
/// in ordinal order; and how many entries before its oldest known one are missing
/// (dropped past the old bound: an export cannot give them back).
pub fn records(
    t: &Timeline,
    lo: k8s_openapi::jiff::Timestamp,
    hi: k8s_openapi::jiff::Timestamp,
) -> (Vec<Record>, i64) {
    // An archive keeps what touches the period, an entry of no length inside it too.
    let touches = |from: Option<&Time>, until: Option<&Time>| {
        from.is_none_or(|f| f.0 < hi) && until.is_none_or(|u| u.0 >= lo)
    };
    let mut out = Vec::new();
    for (o, h) in &t.holdings {
        if touches(h.from.as_ref(), h.until.as_ref()) {
            out.push(t.meta.holding(*o, h));
        }
    }
    for (o, sp) in &t.spans {
        if touches(Some(&sp.from), sp.until.as_ref()) {
            out.push(t.meta.span(*o, sp));
        }
    }
    (out, t.dropped.0 + t.dropped.1)
}

/// What one address was used for within `[lo, hi)` (Unix seconds), by the namespace of
/// each claim it was bound to: the same answer from every replica and after every restart,
/// because it is computed from the objects alone (the address and its records).
pub fn usage_of(t: &Timeline, lo: i64, hi: i64) -> Vec<(String, Usage)> {
    let list: Vec<&Holding> = t.holdings.iter().map(|(_, h)| h).collect();
    let spans: Vec<&AttachmentSpan> = t.spans.iter().map(|(_, s)| s).collect();
    let (missing_holdings, missing_spans) = t.missing_before();
    // Missing entries are older than every known one: they may cover the period's start.
    let lost_before =
        |first: Option<&Time>, missing: bool| missing && first.is_none_or(|f| f.0.as_second() > lo);
    let partial_holdings =
        lost_before(list.first().and_then(|h| h.from.as_ref()), missing_holdings);
    let partial_spans = lost_before(spans.first().map(|s| &s.from), missing_spans);
    let mut out: Vec<(String, Usage)> = Vec::new();
    for h in list.iter().filter(|h| h.state == HoldingState::Bound) {
        let Some((s, e)) = overlap(h.from.as_ref(), h.until.as_ref(), lo, hi) else {
            continue;
        };
        let covered = |egress_only: bool| {
            let mut on: Vec<(i64, i64)> = spans
                .iter()
                .filter(|sp| !egress_only || sp.egress)
                .filter_map(|sp| overlap(Some(&sp.from), sp.until.as_ref(), s, e))
                .collect();
            on.sort_unstable();
            let mut seconds = 0;
            let mut reach = s;
            for (a0, a1) in on {
                let a0 = a0.max(reach);
                if a1 > a0 {
                    seconds += a1 - a0;
                    reach = a1;
                }
            }
            seconds
        };
        let u = Usage {
            addresses: 1,
            held_seconds: e - s,
            attached_seconds: covered(false),
            egress_seconds: covered(true),
            // A binding found under way: its start is not known.
            partial: partial_holdings || partial_spans || h.from.is_none(),
        };
        match out.iter_mut().find(|(ns, _)| *ns == h.namespace) {
            // The same namespace twice (bound, released, bound again): one address.
            Some((_, acc)) => {
                acc.held_seconds += u.held_seconds;
                acc.attached_seconds += u.attached_seconds;
                acc.egress_seconds += u.egress_seconds;
                acc.partial |= u.partial;
            }
            None => out.push((h.namespace.clone(), u)),
        }
    }
    if out.is_empty() && partial_holdings {
        // Nothing kept covers the period, and what was dropped may have: say so.
        out.push((
            String::new(),
            Usage {
                partial: true,
                ..Usage::default()
            },
        ));
    }
    out
}

/// The address's holdings, and the ordinal of the first (how many before it were dropped
/// or moved to records).
pub fn holdings(a: &IPAddress) -> (&[Holding], i64) {
    a.status.as_ref().map_or((&[][..], 0), |s| {
        (&s.history[..], s.history_dropped + s.history_recorded)
    })
}

/// The address's Service spans, and the ordinal of the first.
pub fn spans(a: &IPAddress) -> (&[AttachmentSpan], i64) {
    a.status.as_ref().map_or((&[][..], 0), |s| {
        (
            &s.attachment_history[..],
            s.attachment_history_dropped + s.attachment_history_recorded,
        )
    })
}

/// How many entries came before a list's first: dropped past the old bound, and moved to
/// records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub dropped: i64,
    pub recorded: i64,
}

impl Counts {
    /// The ordinal of the list's first entry.
    pub fn base(self) -> i64 {
        self.dropped + self.recorded
    }
    /// The holdings' counts of `a`.
    pub fn holdings(a: &IPAddress) -> Counts {
        a.status.as_ref().map_or(Counts::default(), |s| Counts {
            dropped: s.history_dropped,
            recorded: s.history_recorded,
        })
    }
    /// The spans' counts of `a`.
    pub fn spans(a: &IPAddress) -> Counts {
        a.status.as_ref().map_or(Counts::default(), |s| Counts {
            dropped: s.attachment_history_dropped,
            recorded: s.attachment_history_recorded,
        })
    }
}

/// A list after a write: what stays on the address, its counts, and the entries that move
/// to records in it (with their ordinals) — their records are created before the write, so
/// an entry is on the address or in a record at every instant, crash or not.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled<T> {
    pub list: Vec<T>,
    pub counts: Counts,
    pub moved: Vec<(i64, T)>,
}

/// The holdings after a core write that leaves the address `held`, at `now`; `None` when
/// they stay as they are (then the write is not made for them). `unrecorded`: a binding
/// that began before the history was kept and that this write releases — recorded, closed,
/// as `found`, without `from`.
pub fn holdings_after(
    history: &[Holding],
    counts: Counts,
    held: Held<'_>,
    unrecorded: Option<&ClaimRef>,
    now: &Time,
) -> Option<Settled<Holding>> {
    let open = history.last().filter(|h| h.until.is_none());
    let want = held.state();
    if let (None, Some(r), Held::Released) = (open, unrecorded, held) {
        let mut out = history.to_vec();
        out.push(Holding {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
            state: HoldingState::Bound,
            from: None,
            until: Some(now.clone()),
            ended: Some(ended::RELEASED.to_string()),
            found: true,
        });
        return Some(settle(
            out,
            counts,
            HOLDINGS_KEEP,
            HOLDINGS_LIMIT,
            true,
            |h| h.until.is_some(),
        ));
    }
    match (open, want) {
        (None, None) => return None,
        (Some(o), Some((state, r))) if o.records(state, r) => return None,
        _ => {}
    }
    let mut out = history.to_vec();
    let closes = open.is_some();
    if let Some(o) = out.last_mut().filter(|h| h.until.is_none()) {
        o.until = Some(now.clone());
        o.ended = Some(
            match (held, want) {
                (Held::Released, _) => ended::RELEASED,
                (_, Some((HoldingState::Bound, r)))
                    if o.state == HoldingState::Reserved
                        && o.namespace == r.namespace
                        && o.name == r.name =>
                {
                    ended::BOUND
                }
                (_, Some(_)) => ended::MOVED,
                (_, None) => ended::FREED,
            }
            .to_string(),
        );
    }
    if let Some((state, r)) = want {
        out.push(Holding {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: if state == HoldingState::Bound {
                r.uid.clone()
            } else {
                None
            },
            state,
            from: Some(now.clone()),
            until: None,
            ended: None,
            found: false,
        });
    }
    Some(settle(
        out,
        counts,
        HOLDINGS_KEEP,
        HOLDINGS_LIMIT,
        closes,
        |h| h.until.is_some(),
    ))
}

/// The holdings after a write of its own that only moves an address's closed holdings past
/// [`HOLDINGS_KEEP`] to records — an address written before records were kept, at a rate the
/// core bounds; `None` when it keeps no more than that.
pub fn holdings_moved(history: &[Holding], counts: Counts) -> Option<Settled<Holding>> {
    let closed = history.iter().filter(|h| h.until.is_some()).count();
    (closed > HOLDINGS_KEEP).then(|| {
        settle(
            history.to_vec(),
            counts,
            HOLDINGS_KEEP,
            HOLDINGS_LIMIT,
            true,
            |h| h.until.is_some(),
        )
    })
}

/// The spans after a write that only moves an address's closed spans past
/// [`SPANS_KEEP`] to records — the backlog of an address an older version wrote, which a
/// ledger write (one that closes a span) moves only with itself; `None` when nothing moves
/// (it keeps no more, or an open span comes first: entries move from the front only, so
/// ordinals never change).
pub fn spans_moved(spans: &[AttachmentSpan], counts: Counts) -> Option<Settled<AttachmentSpan>> {
    let closed = spans.iter().filter(|s| s.until.is_some()).count();
    (closed > SPANS_KEEP)
        .then(|| {
            settle(spans.to_vec(), counts, SPANS_KEEP, SPANS_LIMIT, true, |s| {
                s.until.is_some()
            })
        })
        .filter(|s| !s.moved.is_empty())
}

/// The Service spans after a driver's ledger write that changes the holders from `before`
/// to `after`, at `now`; `None` when they stay as they are. A holder in `after` without an
/// open span gets one (`found` when it was in `before` already: recorded late).
pub fn spans_after(
    spans: &[AttachmentSpan],
    counts: Counts,
    before: &[Attachment],
    after: &[Attachment],
    now: &Time,
) -> Option<Settled<AttachmentSpan>> {
    let mut out = spans.to_vec();
    let mut changed = false;
    let mut closes = false;
    for s in out.iter_mut().filter(|s| s.until.is_none()) {
        match after.iter().find(|a| s.same_holder(a)) {
            None => {
                s.until = Some(now.clone());
                changed = true;
                closes = true;
            }
            Some(a) => changed |= s.moved_to(a.node.as_deref(), now),
        }
    }
    for a in after {
        if !out.iter().any(|s| s.until.is_none() && s.same_holder(a)) {
            out.push(AttachmentSpan {
                nodes: a
                    .node
                    .iter()
                    .map(|n| NodeStay {
                        node: n.clone(),
                        from: now.clone(),
                    })
                    .collect(),
                kind: a.kind.clone(),
                namespace: a.namespace.clone(),
                name: a.name.clone(),
                from: now.clone(),
                until: None,
                found: before
                    .iter()
                    .any(|b| b == a || b.association() == a.association()),
                egress: a.method.is_some(),
            });
            changed = true;
        }
    }
    changed.then(|| {
        settle(out, counts, SPANS_KEEP, SPANS_LIMIT, closes, |s| {
            s.until.is_some()
        })
    })
}

impl<T> Settled<T> {
    /// The same write with nothing moved: the moved entries back at the head of the list
    /// (their records could not be made — the kind not installed yet, or not allowed — so
    /// they stay on the address rather than be lost).
    pub fn unmove(mut self) -> Settled<T> {
        let n = self.moved.len() as i64;
        let mut list: Vec<T> = self.moved.drain(..).map(|(_, e)| e).collect();
        list.append(&mut self.list);
        self.list = list;
        self.counts.recorded -= n;
        self
    }
}

impl<T: Serialize> Settled<T> {
    fn write(&self, status: &mut serde_json::Value, list: &str, dropped: &str, recorded: &str) {
        let n = |v: i64| {
            if v == 0 {
                serde_json::Value::Null
            } else {
                v.into()
            }
        };
        status[list] = serde_json::json!(self.list);
        status[dropped] = n(self.counts.dropped);
        status[recorded] = n(self.counts.recorded);
    }
}

impl Settled<Holding> {
    /// Writes `history` and its counts into a status patch's fields.
    pub fn write_holdings(&self, status: &mut serde_json::Value) {
        self.write(status, "history", "historyDropped", "historyRecorded");
    }
}

impl Settled<AttachmentSpan> {
    /// Writes `attachmentHistory` and its counts into a status patch's fields.
    pub fn write_spans(&self, status: &mut serde_json::Value) {
        self.write(
            status,
            "attachmentHistory",
            "attachmentHistoryDropped",
            "attachmentHistoryRecorded",
        );
    }
}

/// A list after a write: when the write `closes` an entry, the oldest closed entries past
/// `keep` move to records (at most [`MOVE_BATCH`], oldest first — a closed entry always
/// comes before the open ones, so the list's first entries move and the ordinals of the
/// rest stay); past the schema's `limit` the oldest closed are dropped and counted (only
/// an address of an older version, whose backlog was not yet moved, ever gets there).
fn settle<T: Clone>(
    mut list: Vec<T>,
    mut counts: Counts,
    keep: usize,
    limit: usize,
    closes: bool,
    closed: impl Fn(&T) -> bool,
) -> Settled<T> {
    let mut moved = Vec::new();
    if closes {
        while moved.len() < MOVE_BATCH
            && list.iter().filter(|x| closed(x)).count() > keep
            && list.first().is_some_and(&closed)
        {
            moved.push((counts.base(), list.remove(0)));
            counts.recorded += 1;
        }
    }
    while list.len() > limit && list.first().is_some_and(&closed) {
        list.remove(0);
        counts.dropped += 1;
    }
    Settled {
        list,
        counts,
        moved,
    }
}

/// What is wrong with a history, for the invariant checker: entries out of order or
/// overlapping, an open entry that is not the last, or a last open entry that does not
/// match the address's claimRef and phase. Empty when it is sound.
/// The one state the history is never in, not even between two writes: `Released` with
/// its holding still open — the write that releases an address closes its holding (the
/// core's address pass and its claims' reclaim alike). `Some`: what is wrong.
pub fn released_yet_open(a: &IPAddress) -> Option<String> {
    let released = a.status.as_ref().and_then(|s| s.phase) == Some(crate::AddressPhase::Released);
    let (list, _) = holdings(a);
    let open = list.last().filter(|h| h.until.is_none())?;
    released.then(|| {
        format!(
            "Released with its holding of {}/{} still open",
            open.namespace, open.name
        )
    })
}

pub fn problems(a: &IPAddress) -> Vec<String> {
    let (list, _) = holdings(a);
    let mut out = Vec::new();
    for (i, h) in list.iter().enumerate() {
        if let (Some(u), Some(f)) = (&h.until, &h.from)
            && u.0 < f.0
        {
            out.push(format!("entry {i} ends before it begins"));
        }
        if h.until.is_none() && i + 1 != list.len() {
            out.push(format!("entry {i} is open but not the last"));
        }
        if let Some(next) = list.get(i + 1)
            && h.until
                .as_ref()
                .is_some_and(|u| next.from.as_ref().is_none_or(|f| f.0 < u.0))
        {
            out.push(format!("entry {} begins before entry {i} ends", i + 1));
        }
    }
    let phase = a.status.as_ref().and_then(|s| s.phase);
    let held = phase.and_then(|p| Held::of(a.spec.claim_ref.as_ref(), p));
    let open = list.last().filter(|h| h.until.is_none());
    match (held.and_then(|h| h.state()), open) {
        (Some((state, r)), Some(o)) if !o.records(state, r) => out.push(format!(
            "the open entry ({:?} {}/{}) is not the address's {:?} of {}/{}",
            o.state, o.namespace, o.name, state, r.namespace, r.name
        )),
        (None, Some(o)) if held.is_some() => out.push(format!(
            "the open entry ({:?} {}/{}) outlives the holding (phase {:?})",
            o.state, o.namespace, o.name, phase
        )),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    const Z: Counts = Counts {
        dropped: 0,
        recorded: 0,
    };

    fn after(
        h: &[Holding],
        c: Counts,
        held: Held<'_>,
        unrecorded: Option<&ClaimRef>,
        now: &Time,
    ) -> Option<(Vec<Holding>, Counts)> {
        holdings_after(h, c, held, unrecorded, now).map(|s| (s.list, s.counts))
    }

    fn spans_to(
        s: &[AttachmentSpan],
        c: Counts,
        before: &[Attachment],
        after: &[Attachment],
        now: &Time,
    ) -> Option<(Vec<AttachmentSpan>, Counts)> {
        spans_after(s, c, before, after, now).map(|s| (s.list, s.counts))
    }

    fn t(s: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + s).unwrap())
    }
    fn r(ns: &str, name: &str, uid: Option<&str>) -> ClaimRef {
        ClaimRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.map(Into::into),
        }
    }
    fn svc(name: &str) -> Attachment {
        Attachment {
            kind: "Service".into(),
            namespace: Some("a".into()),
            name: name.into(),
            ports: vec!["TCP/80".into()],
            method: None,
            allow_icmp: false,
            node: None,
        }
    }

    #[test]
    fn an_export_keeps_what_touches_the_period_and_says_what_was_dropped() {
        let a: IPAddress = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ipv4-192-0-2-7"},
            "spec": {"address": "192.0.2.7", "className": "pub", "source": {"fromClass": {}}},
            "status": {
                "history": [
                    {"namespace": "a", "name": "web", "uid": "u1", "state": "Bound",
                     "from": t(10), "until": t(20), "ended": "Released"},
                    {"namespace": "b", "name": "db", "uid": "u2", "state": "Bound", "from": t(30)}],
                "historyDropped": 2,
                "attachmentHistory": [
                    {"kind": "Service", "namespace": "a", "name": "site", "from": t(12), "until": t(12)},
                    {"kind": "Service", "namespace": "b", "name": "vm", "from": t(31), "egress": true}]}
        }))
        .unwrap();
        let at = |s: i64| t(s).0;
        let names = |lo: i64, hi: i64| -> Vec<String> {
            records(&Timeline::of(&a), at(lo), at(hi))
                .0
                .iter()
                .map(|r| format!("{}:{}/{}", r.record.as_str(), r.namespace, r.name))
                .collect()
        };
        assert_eq!(
            names(0, 100),
            [
                "holding:a/web",
                "holding:b/db",
                "attachment:a/site",
                "attachment:b/vm"
            ]
        );
        // A span of no length inside the period is kept; the open holding reaches any
        // later period.
        assert_eq!(names(12, 13), ["holding:a/web", "attachment:a/site"]);
        assert_eq!(names(40, 50), ["holding:b/db", "attachment:b/vm"]);
        assert_eq!(names(0, 10), Vec::<String>::new());
        let (rows, dropped) = records(&Timeline::of(&a), at(0), at(100));
        assert_eq!(dropped, 2);
        let cells = rows[0].cells();
        assert_eq!(cells.len(), RECORD_COLUMNS.len());
        assert_eq!(
            (
                cells[1].as_str(),
                cells[7].as_str(),
                cells[8].as_str(),
                cells[11].as_str()
            ),
            ("192.0.2.7", "u1", "Bound", "Released")
        );
        assert_eq!(rows[3].cells()[13], "true", "the egress span says so");
    }

    #[test]
    fn a_binding_opens_and_a_release_closes_it() {
        let c = r("a", "web", Some("u1"));
        let (h, d) = after(&[], Z, Held::Bound(&c), None, &t(1)).unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].state, HoldingState::Bound);
        assert_eq!(h[0].uid.as_deref(), Some("u1"));
        assert!(!h[0].found);
        // Steady: nothing to write.
        assert_eq!(after(&h, d, Held::Bound(&c), None, &t(5)), None);
        let (h, _) = after(&h, d, Held::Released, None, &t(9)).unwrap();
        assert_eq!(h[0].until, Some(t(9)));
        assert_eq!(h[0].ended.as_deref(), Some(ended::RELEASED));
        // Released, then recycled (no claimRef): nothing more.
        assert_eq!(after(&h, Z, Held::Released, None, &t(10)), None);
        assert_eq!(after(&h, Z, Held::Free, None, &t(11)), None);
    }

    #[test]
    fn a_reservation_then_its_binding_then_a_move() {
        let res = r("b", "db", None);
        let (h, d) = after(&[], Z, Held::Reserved(&res), None, &t(1)).unwrap();
        assert_eq!(h[0].state, HoldingState::Reserved);
        assert!(
            !h[0].found,
            "a reservation is recorded when seen, never as found"
        );
        let bound = r("b", "db", Some("u2"));
        let (h, d) = after(&h, d, Held::Bound(&bound), None, &t(2)).unwrap();
        assert_eq!(h[0].ended.as_deref(), Some(ended::BOUND));
        assert_eq!(h[1].uid.as_deref(), Some("u2"));
        let other = r("c", "db", None);
        let (h, d) = after(&h, d, Held::Reserved(&other), None, &t(3)).unwrap();
        assert_eq!(h[1].ended.as_deref(), Some(ended::MOVED));
        let (h, _) = after(&h, d, Held::Free, None, &t(4)).unwrap();
        assert_eq!(h[2].ended.as_deref(), Some(ended::FREED));
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn a_binding_from_before_the_history_is_recorded_when_it_is_released() {
        let c = r("a", "web", Some("u1"));
        let (h, _) = after(&[], Z, Held::Released, Some(&c), &t(9)).unwrap();
        assert_eq!(h.len(), 1);
        assert!(h[0].found);
        assert_eq!((h[0].from.clone(), h[0].until.clone()), (None, Some(t(9))));
        assert_eq!(h[0].ended.as_deref(), Some(ended::RELEASED));
        assert!(h[0].covers(&t(0)) && !h[0].covers(&t(9)));
    }

    #[test]
    fn a_new_claim_of_the_same_name_is_a_new_holding() {
        let old = r("a", "web", Some("u1"));
        let new = r("a", "web", Some("u2"));
        let (h, d) = after(&[], Z, Held::Bound(&old), None, &t(1)).unwrap();
        let (h, _) = after(&h, d, Held::Bound(&new), None, &t(2)).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].ended.as_deref(), Some(ended::MOVED));
    }

    #[test]
    fn a_closing_write_moves_the_oldest_closed_past_the_keep_to_records() {
        let mut h = Vec::new();
        let mut d = Z;
        let mut moved = Vec::new();
        for i in 0..(HOLDINGS_LIMIT as i64 + 5) {
            let c = r("a", "web", Some(&format!("u{i}")));
            (h, d) = after(&h, d, Held::Bound(&c), None, &t(2 * i)).unwrap();
            let s = holdings_after(&h, d, Held::Released, None, &t(2 * i + 1)).unwrap();
            moved.extend(s.moved.iter().map(|(o, h)| (*o, h.uid.clone())));
            (h, d) = (s.list, s.counts);
        }
        let rounds = HOLDINGS_LIMIT + 5;
        assert_eq!(h.len(), HOLDINGS_KEEP);
        assert_eq!(d.dropped, 0, "nothing is dropped: it moves to a record");
        assert_eq!(d.recorded as usize, rounds - HOLDINGS_KEEP);
        // Each closed holding moved exactly once, in order, with its own ordinal.
        assert_eq!(moved.len(), rounds - HOLDINGS_KEEP);
        for (i, (o, uid)) in moved.iter().enumerate() {
            assert_eq!((*o, uid.clone()), (i as i64, Some(format!("u{i}"))));
        }
        assert_eq!(d.base(), (rounds - HOLDINGS_KEEP) as i64);
        // A bind (it closes nothing) moves nothing: nothing is added to the bind path.
        let c = r("a", "web", Some("next"));
        let s = holdings_after(&h, d, Held::Bound(&c), None, &t(1000)).unwrap();
        assert!(s.moved.is_empty());
    }

    #[test]
    fn a_move_undone_keeps_every_entry_where_it_was() {
        let mut h = Vec::new();
        let mut d = Z;
        for i in 0..(HOLDINGS_KEEP as i64 + 1) {
            let c = r("a", "web", Some(&format!("u{i}")));
            (h, d) = after(&h, d, Held::Bound(&c), None, &t(2 * i)).unwrap();
            (h, d) = after(&h, d, Held::Released, None, &t(2 * i + 1)).unwrap();
        }
        let c = r("a", "web", Some("last"));
        let (h2, d2) = after(&h, d, Held::Bound(&c), None, &t(100)).unwrap();
        let s = holdings_after(&h2, d2, Held::Released, None, &t(101)).unwrap();
        assert_eq!(s.moved.len(), 1);
        let kept = s.clone().unmove();
        assert!(kept.moved.is_empty());
        assert_eq!(kept.counts, d2);
        assert_eq!(kept.list.len(), h2.len());
        assert_eq!(kept.list[0], s.moved[0].1);
        assert_eq!(kept.list.last().unwrap().until, Some(t(101)));
    }

    #[test]
    fn an_older_versions_backlog_moves_a_batch_at_a_time() {
        let mut h: Vec<Holding> = (0..HOLDINGS_LIMIT as i64)
            .map(|i| Holding {
                namespace: "a".into(),
                name: format!("c{i}"),
                uid: Some(format!("u{i}")),
                state: HoldingState::Bound,
                from: Some(t(2 * i)),
                until: Some(t(2 * i + 1)),
                ended: Some(ended::RELEASED.into()),
                found: false,
            })
            .collect();
        let mut c = Counts {
            dropped: 7,
            recorded: 0,
        };
        let mut writes = 0;
        while let Some(s) = holdings_moved(&h, c) {
            assert!(s.moved.len() <= MOVE_BATCH);
            assert_eq!(s.moved[0].0, c.base(), "the first moved is the first kept");
            (h, c) = (s.list, s.counts);
            writes += 1;
        }
        assert_eq!(h.len(), HOLDINGS_KEEP);
        assert_eq!(c.recorded as usize, HOLDINGS_LIMIT - HOLDINGS_KEEP);
        assert_eq!(
            writes,
            (HOLDINGS_LIMIT - HOLDINGS_KEEP).div_ceil(MOVE_BATCH)
        );
        assert_eq!(h[0].name, format!("c{}", HOLDINGS_LIMIT - HOLDINGS_KEEP));
    }

    #[test]
    fn a_holders_move_to_another_node_is_the_same_span() {
        let on = |n: Option<&str>| Attachment {
            node: n.map(str::to_string),
            ..svc("vm")
        };
        let (a, b) = (on(Some("n1")), on(Some("n2")));
        let s = spans_after(
            &[],
            Counts::default(),
            &[],
            std::slice::from_ref(&a),
            &t(10),
        )
        .unwrap()
        .list;
        assert_eq!(s.len(), 1);
        // Moved: one span, two stays; the node at each time is answerable.
        let s = spans_after(
            &s,
            Counts::default(),
            std::slice::from_ref(&a),
            std::slice::from_ref(&b),
            &t(20),
        )
        .unwrap()
        .list;
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(s[0].until.is_none());
        assert_eq!(s[0].node_at(&t(15)), Some("n1"));
        assert_eq!(s[0].node_at(&t(25)), Some("n2"));
        assert_eq!(s[0].node_at(&t(5)), None);
        // Not known for a moment (no node): nothing written, nothing moved.
        assert!(
            spans_after(
                &s,
                Counts::default(),
                std::slice::from_ref(&b),
                &[on(None)],
                &t(30)
            )
            .is_none()
        );
        // The same node again: nothing written.
        assert!(
            spans_after(
                &s,
                Counts::default(),
                std::slice::from_ref(&b),
                std::slice::from_ref(&b),
                &t(30)
            )
            .is_none()
        );
        // Bounded: the last NODES_KEEP moves.
        let mut s = s;
        for i in 0..40 {
            let n = on(Some(&format!("m{i}")));
            s = spans_after(
                &s,
                Counts::default(),
                &[],
                std::slice::from_ref(&n),
                &t(100 + i),
            )
            .unwrap()
            .list;
        }
        assert_eq!(s[0].nodes.len(), NODES_KEEP);
        assert_eq!(s[0].node_at(&t(200)), Some("m39"));
    }

    #[test]
    fn an_older_versions_spans_move_a_batch_at_a_time_and_never_past_an_open_one() {
        let span = |i: i64, open: bool| AttachmentSpan {
            kind: "Service".into(),
            namespace: Some("a".into()),
            name: format!("s{i}"),
            from: t(2 * i),
            until: (!open).then(|| t(2 * i + 1)),
            found: false,
            egress: false,
            nodes: vec![],
        };
        let mut l: Vec<AttachmentSpan> = (0..SPANS_LIMIT as i64).map(|i| span(i, false)).collect();
        l.push(span(SPANS_LIMIT as i64, true));
        let mut c = Counts::default();
        let mut writes = 0;
        while let Some(s) = spans_moved(&l, c) {
            assert!(!s.moved.is_empty() && s.moved.len() <= MOVE_BATCH);
            assert_eq!(s.moved[0].0, c.base());
            (l, c) = (s.list, s.counts);
            writes += 1;
        }
        assert_eq!(l.len(), SPANS_KEEP + 1, "the keep and the open one");
        assert_eq!(c.recorded as usize, SPANS_LIMIT - SPANS_KEEP);
        assert_eq!(writes, (SPANS_LIMIT - SPANS_KEEP).div_ceil(MOVE_BATCH));
        // A span still open first (a Service attached since long ago): nothing moves, and
        // no write is asked for (a write that moves nothing would come back forever).
        let mut blocked = vec![span(0, true)];
        blocked.extend((1..=SPANS_KEEP as i64 + 3).map(|i| span(i, false)));
        assert!(spans_moved(&blocked, Counts::default()).is_none());
    }

    #[test]
    fn usage_clips_to_the_period_and_counts_shared_time_once() {
        let mut a: IPAddress = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"address": "192.0.2.1", "className": "pub", "source": {"fromClass": {}}},
            "status": {"phase": "Bound"}}))
        .unwrap();
        let st = a.status.as_mut().unwrap();
        let c1 = r("a", "web", Some("u1"));
        let c2 = r("b", "db", Some("u2"));
        let (h, d) = after(&[], Z, Held::Bound(&c1), None, &t(0)).unwrap();
        let (h, d) = after(&h, d, Held::Released, None, &t(100)).unwrap();
        let (h, _) = after(&h, d, Held::Bound(&c2), None, &t(150)).unwrap();
        st.history = h;
        // Two Services on it 10..60 and 30..80 (shared 30..60), one on the second holding.
        let span = |name: &str, from: i64, until: Option<i64>| AttachmentSpan {
            kind: "Service".into(),
            namespace: Some("a".into()),
            name: name.into(),
            from: t(from),
            until: until.map(t),
            found: false,
            egress: false,
            nodes: vec![],
        };
        st.attachment_history = vec![
            span("x", 10, Some(60)),
            span("y", 30, Some(80)),
            span("z", 160, None),
        ];
        let base = 1_800_000_000;
        let u = usage_of(&Timeline::of(&a), base, base + 200);
        assert_eq!(u.len(), 2);
        assert_eq!(
            (
                u[0].0.as_str(),
                u[0].1.held_seconds,
                u[0].1.attached_seconds
            ),
            ("a", 100, 70)
        );
        // The open holding counts up to the period's end.
        assert_eq!(
            (
                u[1].0.as_str(),
                u[1].1.held_seconds,
                u[1].1.attached_seconds
            ),
            ("b", 50, 40)
        );
        // Clipped: 50..120 holds 50 s of the first, 0 of the second.
        let u = usage_of(&Timeline::of(&a), base + 50, base + 120);
        assert_eq!(u.len(), 1);
        assert_eq!((u[0].1.held_seconds, u[0].1.attached_seconds), (50, 30));
        assert!(!u[0].1.partial);
        assert_eq!(
            u[0].1.egress_seconds, 0,
            "no holder was served by cozy-proxy"
        );
        // The span 30..80 was a cozy-proxy holder's: 30 s of egress in 50..120.
        a.status.as_mut().unwrap().attachment_history[1].egress = true;
        let u = usage_of(&Timeline::of(&a), base + 50, base + 120);
        assert_eq!((u[0].1.attached_seconds, u[0].1.egress_seconds), (30, 30));
        let u = usage_of(&Timeline::of(&a), base, base + 200);
        assert_eq!(u[0].1.egress_seconds, 50);
        // Dropped entries older than everything kept: a period before them is partial.
        a.status.as_mut().unwrap().history_dropped = 3;
        assert!(
            usage_of(&Timeline::of(&a), base - 10, base + 5)[0]
                .1
                .partial
        );
        assert!(
            !usage_of(&Timeline::of(&a), base + 10, base + 20)[0]
                .1
                .partial
        );
    }

    #[test]
    fn spans_follow_the_holders() {
        let (s, d) = spans_to(&[], Z, &[], &[svc("web")], &t(1)).unwrap();
        assert_eq!(s.len(), 1);
        assert!(!s[0].found);
        // A port change is no new span.
        let mut moved = svc("web");
        moved.ports = vec!["TCP/443".into()];
        assert_eq!(spans_to(&s, d, &[svc("web")], &[moved], &t(2)), None);
        let (s, d) = spans_to(&s, d, &[svc("web")], &[svc("web"), svc("api")], &t(3)).unwrap();
        assert_eq!(s.len(), 2);
        let (s, _) = spans_to(&s, d, &[svc("web"), svc("api")], &[svc("api")], &t(4)).unwrap();
        assert_eq!(s[0].until, Some(t(4)));
        assert_eq!(s[1].until, None);
        // A holder from before the history: found.
        let (s, _) = spans_to(&[], Z, &[svc("old")], &[svc("old")], &t(5)).unwrap();
        assert!(s[0].found);
    }

    #[test]
    fn a_holder_cozy_proxy_serves_is_an_egress_span_of_its_own() {
        let mut vm = svc("vm");
        vm.method = Some(crate::AttachmentMethod::WholeIP);
        let (s, d) = spans_to(&[], Z, &[], &[vm.clone()], &t(1)).unwrap();
        assert!(s[0].egress);
        // Switched between WholeIP and PortList: still egress, the same span.
        let mut listed = vm.clone();
        listed.method = Some(crate::AttachmentMethod::PortList);
        assert_eq!(
            spans_to(&s, d, &[vm.clone()], &[listed.clone()], &t(2)),
            None
        );
        // Handed back to kube-proxy (the label removed): the egress span ends, another begins.
        let (s, _) = spans_to(&s, d, &[listed], &[svc("vm")], &t(3)).unwrap();
        assert_eq!((s[0].egress, s[0].until.clone()), (true, Some(t(3))));
        assert_eq!((s[1].egress, s[1].until.clone()), (false, None));
    }
}
