//! The ledger's invariants, as code: read every claim, address and class (and the ledger
//! gauges of every replica) and report what violates them. Used at the end of every
//! integration test, by the chaos suite, and as a CLI (`invariant-check`) against any
//! cluster.
//!
//! Some states are legitimately transient (an address bound a moment ago and not yet
//! marked Bound; a claim created a moment ago). Those rules are judged over two snapshots
//! `settle` apart: a violation counts only when it is seen in both, on objects that did
//! not change in between. Time-based rules (deletion, release delay) use the objects' own
//! timestamps.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use address_controller_api::entitlement::{QuotaLimits, usage_by_class};
use address_controller_api::family::{Family, family_of};
use address_controller_api::{
    AddressPhase, ClaimPhase, IPAddress, IPAddressClaim, IPAddressClass, IPAddressQuota,
    ReclaimPolicy,
};
use anyhow::Result;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// One invariant: its name, what it means, and the function that finds its violations in
/// one snapshot (`None`: judged from the replicas' `/metrics`, see `gauge_violations`).
pub struct Rule {
    pub name: &'static str,
    pub meaning: &'static str,
    check: Option<fn(&Ctx<'_>, &mut Found)>,
}

/// The rules, in the order the report lists them.
pub const RULES: &[Rule] = &[
    Rule {
        name: "address-listed-twice",
        meaning: "an address listed by more than one claim",
        check: Some(address_listed_twice),
    },
    Rule {
        name: "claim-two-per-family",
        meaning: "a claim holding or listing more than one address of a family",
        check: Some(claim_two_per_family),
    },
    Rule {
        name: "listed-address-wrong",
        meaning: "an address a claim lists is missing, not Bound, or names another claim or uid",
        check: Some(listed_address_wrong),
    },
    Rule {
        name: "bound-address-orphan",
        meaning: "a Bound address whose claim is gone, has another uid, or does not list it",
        check: Some(bound_address_orphan),
    },
    Rule {
        name: "pending-with-free-address",
        meaning: "an unpinned Pending claim while a free address of its class and family stays free",
        check: Some(pending_with_free_address),
    },
    Rule {
        name: "orphan-not-reclaimed",
        meaning: "an address of a gone claim not reclaimed by its policy and release delay",
        check: Some(orphan_not_reclaimed),
    },
    Rule {
        name: "reservation-not-kept",
        meaning: "an address reserved for a claim that does not exist (claimRef without uid) not Available",
        check: Some(reservation_not_kept),
    },
    Rule {
        name: "lost-claim-unexplained",
        meaning: "a Lost claim whose lost address still exists and is neither Lost nor being deleted",
        check: Some(lost_claim_unexplained),
    },
    Rule {
        name: "stuck-deleting",
        meaning: "an object in deletion for longer than the settle time",
        check: Some(stuck_deleting),
    },
    Rule {
        name: "duplicate-ip",
        meaning: "more than one IPAddress for one IP",
        check: Some(duplicate_ip),
    },
    Rule {
        name: "association-dangling",
        meaning: "an address whose ledger lists a holder Service that is gone or does not show it",
        check: Some(association_dangling),
    },
    Rule {
        name: "service-holds-unassociated",
        meaning: "a Service showing a claimed address whose ledger does not list it as a holder (and it is not Conflict)",
        check: Some(service_holds_unassociated),
    },
    Rule {
        name: "holders-incompatible",
        meaning: "holders of one address the claim's sharing does not admit together: not shared, a namespace without the grant, a common port on a common family, or two backends",
        check: Some(holders_incompatible),
    },
    Rule {
        name: "ledger-inconsistent",
        meaning: "an address whose associatedTo is not its first attachment, or whose holderCount is not the number of attachments",
        check: Some(ledger_inconsistent),
    },
    Rule {
        name: "claim-services-miscounted",
        meaning: "a claim whose status.services does not count the Services naming it by their AddressAttached condition",
        check: Some(claim_services_miscounted),
    },
    Rule {
        name: "namespace-over-quota",
        meaning: "a namespace holding more addresses of a class than an IPAddressQuota allows (a released surplus is not a grant)",
        check: Some(namespace_over_quota),
    },
    Rule {
        name: "refusal-stale",
        meaning: "a claim refused NamespaceNotAdmitted or QuotaExceeded that its class and quota admit now",
        check: Some(refusal_stale),
    },
    Rule {
        name: "history-unsound",
        meaning: "an address whose history is out of order, overlapping, open before its last entry, or whose open entry is not its claimRef and phase",
        check: Some(history_unsound),
    },
    Rule {
        name: "history-unrecorded",
        meaning: "an address whose entries moved off it (historyRecorded, attachmentHistoryRecorded) without the IPAddressRecord of each: a closed entry on neither (runs shorter than the retention)",
        check: Some(history_unrecorded),
    },
    Rule {
        name: "gauges-differ",
        meaning: "a replica's ledger gauges differ from the objects",
        check: None,
    },
];

/// Which objects a check looks at (everything when unset).
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub namespaces: Option<BTreeSet<String>>,
    pub classes: Option<BTreeSet<String>>,
}

impl Scope {
    pub fn everything() -> Scope {
        Scope::default()
    }

    /// The objects of a test: claims in `namespaces`, addresses and classes of `classes`
    /// or naming a claim in `namespaces`.
    pub fn of(namespaces: &[&str], classes: &[&str]) -> Scope {
        Scope {
            namespaces: Some(namespaces.iter().map(|s| s.to_string()).collect()),
            classes: Some(classes.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn namespace(&self, ns: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|s| s.contains(ns))
    }

    fn claim(&self, c: &IPAddressClaim) -> bool {
        self.namespace(&c.namespace().unwrap_or_default())
    }

    fn address(&self, a: &IPAddress) -> bool {
        if self.namespaces.is_none() && self.classes.is_none() {
            return true;
        }
        self.classes
            .as_ref()
            .is_some_and(|s| s.contains(&a.spec.class_name))
            || a.spec.claim_ref.as_ref().is_some_and(|r| {
                self.namespaces
                    .as_ref()
                    .is_some_and(|s| s.contains(&r.namespace))
            })
    }
}

/// A replica whose ledger gauges are compared with the objects.
pub struct Replica {
    pub name: String,
    /// `https://host:port/metrics`.
    pub url: String,
    pub token: String,
    /// The local process serving `url`, when known: a replica that does not answer is
    /// described (alive or gone, its threads' states and stacks) in the report.
    pub pid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub rule: &'static str,
    pub object: String,
    pub detail: String,
}

#[derive(Debug, Default)]
pub struct Report {
    pub claims: usize,
    pub addresses: usize,
    pub classes: usize,
    pub violations: Vec<Violation>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// The table of rules with their violation counts, then every violation.
    pub fn table(&self) -> String {
        let mut out = format!(
            "invariants over {} claims, {} addresses, {} classes\n",
            self.claims, self.addresses, self.classes
        );
        let _ = writeln!(out, "  {:<28} {:>10}  meaning", "rule", "violations");
        for r in RULES {
            let n = self.violations.iter().filter(|v| v.rule == r.name).count();
            let _ = writeln!(out, "  {:<28} {n:>10}  {}", r.name, r.meaning);
        }
        for v in &self.violations {
            let _ = writeln!(out, "  ✗ {} {}: {}", v.rule, v.object, v.detail);
        }
        out
    }
}

struct Snapshot {
    claims: Vec<IPAddressClaim>,
    addresses: Vec<IPAddress>,
    classes: Vec<IPAddressClass>,
    services: Vec<Service>,
    quotas: Vec<IPAddressQuota>,
    /// The history's records (none where the kind is not installed).
    records: Vec<address_controller_api::IPAddressRecord>,
    /// Namespace name → labels.
    namespaces: HashMap<String, BTreeMap<String, String>>,
    at: Timestamp,
}

/// Every object of a kind, cluster-wide.
async fn list_all<K>(client: &Client) -> Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    Ok(Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items)
}

async fn snapshot(client: &Client) -> Result<Snapshot> {
    let namespaces = list_all::<Namespace>(client)
        .await?
        .into_iter()
        .map(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            (n.name_any(), labels)
        })
        .collect();
    Ok(Snapshot {
        claims: list_all(client).await?,
        addresses: list_all(client).await?,
        classes: list_all(client).await?,
        services: list_all(client).await?,
        quotas: list_all(client).await?,
        records: match list_all(client).await {
            Ok(r) => r,
            Err(e) if e.to_string().contains("404") => Vec::new(),
            Err(e) => return Err(e),
        },
        namespaces,
        at: Timestamp::now(),
    })
}

/// The state an object was judged on: a violation seen twice on the same state counts.
fn version<K: kube::Resource>(o: &K) -> String {
    o.meta().resource_version.clone().unwrap_or_default()
}

/// What every rule sees: one snapshot, the scope, and the indexes built once for all.
pub struct Ctx<'a> {
    s: &'a Snapshot,
    scope: &'a Scope,
    settle: SignedDuration,
    /// `namespace/name` → claim.
    claims: HashMap<String, &'a IPAddressClaim>,
    /// name → address.
    addresses: HashMap<String, &'a IPAddress>,
    classes: HashMap<String, &'a IPAddressClass>,
    /// `namespace/name` → Service.
    services: HashMap<String, &'a Service>,
    /// `namespace/name` of a claim → the addresses whose claimRef names it.
    naming: HashMap<String, Vec<&'a IPAddress>>,
    by_ip: HashMap<std::net::IpAddr, Vec<&'a IPAddress>>,
}

impl<'a> Ctx<'a> {
    fn new(s: &'a Snapshot, scope: &'a Scope, settle: Duration) -> Ctx<'a> {
        let mut naming: HashMap<String, Vec<&IPAddress>> = HashMap::new();
        let mut by_ip: HashMap<std::net::IpAddr, Vec<&IPAddress>> = HashMap::new();
        for a in &s.addresses {
            if let Some(r) = &a.spec.claim_ref {
                naming.entry(r.key()).or_default().push(a);
            }
            if let Some(ip) = a.ip() {
                by_ip.entry(ip).or_default().push(a);
            }
        }
        Ctx {
            s,
            scope,
            settle: SignedDuration::try_from(settle).unwrap_or(SignedDuration::ZERO),
            claims: s.claims.iter().map(|c| (c.key(), c)).collect(),
            addresses: s.addresses.iter().map(|a| (a.name_any(), a)).collect(),
            classes: s.classes.iter().map(|c| (c.name_any(), c)).collect(),
            services: s
                .services
                .iter()
                .map(|x| (address_controller_runtime::cache::key_of(x), x))
                .collect(),
            naming,
            by_ip,
        }
    }

    fn older_than_settle(&self, t: &Timestamp) -> bool {
        self.s.at.duration_since(*t) > self.settle
    }

    fn claims_in_scope(&self) -> impl Iterator<Item = &'a IPAddressClaim> + '_ {
        self.s.claims.iter().filter(|c| self.scope.claim(c))
    }

    fn addresses_in_scope(&self) -> impl Iterator<Item = &'a IPAddress> + '_ {
        self.s.addresses.iter().filter(|a| self.scope.address(a))
    }

    /// The claim an address's claimRef names (by name; the uid is each rule's business).
    fn claim_of(&self, a: &IPAddress) -> Option<&'a IPAddressClaim> {
        a.spec
            .claim_ref
            .as_ref()
            .and_then(|r| self.claims.get(&r.key()).copied())
    }
}

/// The violations one rule found, each with the versions of the objects it rests on.
pub struct Found {
    rule: &'static str,
    out: Vec<(Violation, String)>,
}

impl Found {
    fn add(&mut self, object: String, detail: String, versions: String) {
        self.out.push((
            Violation {
                rule: self.rule,
                object,
                detail,
            },
            versions,
        ));
    }
}

fn shows(svc: &Service, ip: &str) -> bool {
    let want = address_controller_api::family::parse_address(ip).ok();
    address_controller_api::service::ingress_ips(svc)
        .any(|x| address_controller_api::family::parse_address(x).ok() == want)
}

/// Violations of one snapshot, each with the versions of the objects it rests on: every
/// rule of [`RULES`] that judges a snapshot, in turn.
fn judge(s: &Snapshot, scope: &Scope, settle: Duration) -> Vec<(Violation, String)> {
    let ctx = Ctx::new(s, scope, settle);
    let mut out = Vec::new();
    for r in RULES {
        if let Some(check) = r.check {
            let mut found = Found {
                rule: r.name,
                out: Vec::new(),
            };
            check(&ctx, &mut found);
            out.append(&mut found.out);
        }
    }
    out
}

fn address_listed_twice(x: &Ctx<'_>, found: &mut Found) {
    let mut listed_by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in x.claims_in_scope() {
        for l in c.status.iter().flat_map(|st| &st.addresses) {
            listed_by.entry(l.name.as_str()).or_default().push(c.key());
        }
    }
    for (a, by) in &listed_by {
        if by.len() > 1 {
            found.add(
                format!("IPAddress {a}"),
                format!("listed by {}", by.join(", ")),
                String::new(),
            );
        }
    }
}

fn claim_two_per_family(x: &Ctx<'_>, found: &mut Found) {
    for c in x.claims_in_scope() {
        let key = c.key();
        let uid = c.metadata.uid.clone();
        let held = x.naming.get(&key).into_iter().flatten().filter(|a| {
            !a.is_deleting()
                && !a.is_released()
                && a.spec
                    .claim_ref
                    .as_ref()
                    .is_some_and(|r| r.uid.is_none() || r.uid == uid)
        });
        let mut per_family: BTreeMap<Family, Vec<String>> = BTreeMap::new();
        for a in held {
            if let Ok(f) = family_of(&a.spec.address) {
                per_family.entry(f).or_default().push(a.name_any());
            }
        }
        let mut listed_family: BTreeMap<Family, Vec<String>> = BTreeMap::new();
        for l in c.status.iter().flat_map(|st| &st.addresses) {
            if let Ok(f) = family_of(&l.address) {
                listed_family.entry(f).or_default().push(l.name.clone());
            }
        }
        for (f, names) in per_family.iter().chain(listed_family.iter()) {
            if names.len() > 1 && !c.is_deleting() {
                let versions = names
                    .iter()
                    .filter_map(|n| x.addresses.get(n).map(|a| version(*a)))
                    .chain([version(c)])
                    .collect::<Vec<_>>()
                    .join(",");
                found.add(
                    format!("claim {key}"),
                    format!("{f}: {}", names.join(", ")),
                    versions,
                );
            }
        }
    }
}

fn listed_address_wrong(x: &Ctx<'_>, found: &mut Found) {
    for c in x.claims_in_scope() {
        let key = c.key();
        let uid = c.metadata.uid.clone();
        let claim_phase = c.status.as_ref().and_then(|st| st.phase);
        for l in c.status.iter().flat_map(|st| &st.addresses) {
            let problem = match x.addresses.get(&l.name) {
                None => Some("does not exist".to_string()),
                Some(a) => {
                    let r = a.spec.claim_ref.as_ref();
                    let names_it =
                        r.is_some_and(|r| r.key() == key && (r.uid.is_none() || r.uid == uid));
                    let ok_phase = matches!(
                        (a.phase(), claim_phase),
                        (Some(AddressPhase::Bound | AddressPhase::Conflict), _)
                            | (Some(AddressPhase::Lost), Some(ClaimPhase::Lost))
                    );
                    if !names_it {
                        Some("names another claim or uid".to_string())
                    } else if !ok_phase {
                        Some(format!(
                            "is {}",
                            a.phase().map_or("phaseless", |p| p.as_str())
                        ))
                    } else {
                        None
                    }
                }
            };
            if let Some(p) = problem {
                let versions = format!(
                    "{},{}",
                    version(c),
                    x.addresses
                        .get(&l.name)
                        .map(|a| version(*a))
                        .unwrap_or_default()
                );
                found.add(
                    format!("claim {key}"),
                    format!("lists {} which {p}", l.name),
                    versions,
                );
            }
        }
    }
}

/// A Lost claim names, in its Bound condition, each address it lost and why (the core
/// writes `IPAddress <name> …` per family). Lost is for an address that is Lost, being
/// deleted or gone; one that still exists and is neither was taken from the claim (an
/// undone binding — or an admin's move, which a test cleans up before the check).
fn lost_claim_unexplained(x: &Ctx<'_>, found: &mut Found) {
    for c in x.claims_in_scope() {
        let claim_phase = c.status.as_ref().and_then(|st| st.phase);
        if claim_phase != Some(ClaimPhase::Lost) || c.is_deleting() {
            continue;
        }
        let key = c.key();
        let message = c
            .status
            .iter()
            .flat_map(|st| &st.conditions)
            .find(|x| x.type_ == "Bound")
            .map(|x| x.message.clone())
            .unwrap_or_default();
        let named: Vec<&str> = message
            .split("; ")
            .filter_map(|part| part.strip_prefix("IPAddress "))
            .filter_map(|rest| rest.split([' ', ',']).next())
            .collect();
        if named.is_empty() {
            found.add(
                format!("claim {key}"),
                format!("Lost naming no address: {message:?}"),
                version(c),
            );
        }
        for n in named {
            if let Some(a) = x.addresses.get(n)
                && !a.is_deleting()
                && a.phase() != Some(AddressPhase::Lost)
            {
                found.add(
                    format!("claim {key}"),
                    format!(
                        "Lost ({message}) while IPAddress {n} exists, {}, claimRef {}",
                        a.phase().map_or("phaseless", |p| p.as_str()),
                        a.spec.claim_ref.as_ref().map_or("none".into(), |r| r.key())
                    ),
                    format!("{},{}", version(c), version(*a)),
                );
            }
        }
    }
}

/// Pending with a free address of its class and family.
fn pending_with_free_address(x: &Ctx<'_>, found: &mut Found) {
    for c in x.claims_in_scope() {
        let st = c.status.as_ref();
        let Some(class) = st.and_then(|st| st.class_name.as_deref()) else {
            continue;
        };
        if c.spec.address_name.is_some()
            || c.is_deleting()
            || c.is_refused_entitlement()
            || st.and_then(|st| st.phase) != Some(ClaimPhase::Pending)
        {
            continue;
        }
        let have: Vec<Family> = c
            .status
            .iter()
            .flat_map(|st| &st.addresses)
            .filter_map(|l| family_of(&l.address).ok())
            .collect();
        for f in c
            .spec
            .family
            .families()
            .iter()
            .filter(|f| !have.contains(f))
        {
            let free = x.s.addresses.iter().find(|a| {
                a.spec.claim_ref.is_none()
                    && a.spec.class_name == class
                    && a.phase() == Some(AddressPhase::Available)
                    && !a.is_deleting()
                    && family_of(&a.spec.address).ok() == Some(*f)
            });
            if let Some(a) = free {
                found.add(
                    format!("claim {}", c.key()),
                    format!("Pending for {f} while IPAddress {} is free", a.name_any()),
                    format!("{},{}", version(c), version(a)),
                );
            }
        }
    }
}

/// A claimRef without a uid naming no claim is a reservation (SPEC §5.6), unless it is the
/// binding that was released (a pre-binding reclaimed with its claim).
fn is_reservation(x: &Ctx<'_>, a: &IPAddress) -> bool {
    a.is_prebound()
        && !a.is_released()
        && x.claim_of(a).is_none()
        && a.spec.claim_ref.as_ref().is_some_and(|r| r.is_valid())
}

/// Whether the claim an address's claimRef names is gone (or another claim of its name):
/// never for a reservation.
fn claim_gone(x: &Ctx<'_>, a: &IPAddress) -> bool {
    let same_uid = |c: &IPAddressClaim| {
        a.spec
            .claim_ref
            .as_ref()
            .is_some_and(|r| r.uid.is_none() || r.uid == c.metadata.uid)
    };
    a.spec.claim_ref.is_some() && !is_reservation(x, a) && !x.claim_of(a).is_some_and(same_uid)
}

fn history_unsound(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        let problems = address_controller_api::history::problems(a);
        if !problems.is_empty() {
            found.add(
                format!("IPAddress {}", a.name_any()),
                problems.join("; "),
                version(a),
            );
        }
    }
}

/// Every entry an address moved off (the ordinals between what an older version dropped and
/// the first kept) has its record: a closed entry is on its address or in a record.
fn history_unrecorded(x: &Ctx<'_>, found: &mut Found) {
    use address_controller_api::history::{Counts, RecordOf};
    let names: std::collections::HashSet<&str> =
        x.s.records
            .iter()
            .filter_map(|r| r.metadata.name.as_deref())
            .collect();
    for a in x.addresses_in_scope() {
        let meta = address_controller_api::history::AddressMeta::of(a);
        let mut missing = Vec::new();
        for (of, c) in [
            (RecordOf::Holding, Counts::holdings(a)),
            (RecordOf::Attachment, Counts::spans(a)),
        ] {
            for ordinal in c.dropped..c.base() {
                let name = address_controller_api::RecordSpec {
                    record: of,
                    ordinal,
                    ip_address: meta.ip_address.clone(),
                    address_uid: meta.address_uid.clone(),
                    ..Default::default()
                }
                .object_name();
                if !names.contains(name.as_str()) {
                    missing.push(format!("{} {ordinal}", of.as_str()));
                }
            }
        }
        if !missing.is_empty() {
            found.add(
                format!("IPAddress {}", a.name_any()),
                format!("moved off without a record: {}", missing.join(", ")),
                version(a),
            );
        }
    }
}

fn reservation_not_kept(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        if is_reservation(x, a)
            && !a.is_deleting()
            && !matches!(
                a.phase(),
                Some(AddressPhase::Available | AddressPhase::Conflict | AddressPhase::Lost)
            )
        {
            found.add(
                format!("IPAddress {}", a.name_any()),
                format!(
                    "reserved for {} but {}",
                    a.spec
                        .claim_ref
                        .as_ref()
                        .map(|r| r.key())
                        .unwrap_or_default(),
                    a.phase().map_or("phaseless", |p| p.as_str())
                ),
                version(a),
            );
        }
    }
}

fn bound_address_orphan(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        if a.phase() != Some(AddressPhase::Bound) {
            continue;
        }
        let name = a.name_any();
        let claim = x.claim_of(a);
        let gone = claim_gone(x, a);
        let listed = claim.is_some_and(|c| {
            c.status
                .iter()
                .flat_map(|st| &st.addresses)
                .any(|l| l.name == name)
        });
        if gone || !listed {
            found.add(
                format!("IPAddress {name}"),
                if gone {
                    "its claim is gone".into()
                } else {
                    "its claim does not list it".into()
                },
                format!("{},{}", version(a), claim.map(version).unwrap_or_default()),
            );
        }
    }
}

fn orphan_not_reclaimed(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        let name = a.name_any();
        if claim_gone(x, a) && !a.is_deleting() {
            let problem = match a.spec.reclaim_policy {
                ReclaimPolicy::Delete => Some("reclaim policy Delete, still exists".to_string()),
                ReclaimPolicy::Retain if a.phase() != Some(AddressPhase::Released) => {
                    Some(format!(
                        "reclaim policy Retain, phase {}",
                        a.phase().map_or("none", |p| p.as_str())
                    ))
                }
                _ => None,
            };
            if let Some(p) = problem {
                found.add(format!("IPAddress {name}"), p, version(a));
            }
        }
        // Released with its release delay long elapsed, not held, still claimed.
        if a.is_released()
            && let Some(due) = x
                .classes
                .get(&a.spec.class_name)
                .and_then(|c| c.release_deadline(a))
            && x.older_than_settle(&due)
        {
            found.add(
                format!("IPAddress {name}"),
                format!("release delay elapsed at {due}, still Released"),
                version(a),
            );
        }
    }
}

fn stuck_deleting(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        if let Some(t) = &a.metadata.deletion_timestamp
            && x.older_than_settle(&t.0)
        {
            found.add(
                format!("IPAddress {}", a.name_any()),
                format!("deleting since {}; finalizers {:?}", t.0, a.finalizers()),
                String::new(),
            );
        }
    }
    for c in x.claims_in_scope() {
        if let Some(t) = &c.metadata.deletion_timestamp
            && x.older_than_settle(&t.0)
        {
            found.add(
                format!("claim {}", c.key()),
                format!("deleting since {}; finalizers {:?}", t.0, c.finalizers()),
                String::new(),
            );
        }
    }
}

fn duplicate_ip(x: &Ctx<'_>, found: &mut Found) {
    let mut per_ip: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in x.addresses_in_scope() {
        if let Some(ip) = a.ip() {
            per_ip.entry(ip.to_string()).or_default().push(a.name_any());
        }
    }
    for (ip, names) in per_ip {
        if names.len() > 1 {
            found.add(ip, names.join(", "), String::new());
        }
    }
}

/// Association (SPEC §8): every holder the ledger lists exists and shows the address.
fn association_dangling(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        for to in a.holder_services() {
            let problem = match x.services.get(&to) {
                None => Some("is gone".to_string()),
                Some(svc) if !shows(svc, &a.spec.address) => Some("does not show it".to_string()),
                Some(_) => None,
            };
            if let Some(p) = problem {
                found.add(
                    format!("IPAddress {}", a.name_any()),
                    format!("holder Service {to}, which {p}"),
                    format!(
                        "{},{}",
                        version(a),
                        x.services.get(&to).map(|s| version(*s)).unwrap_or_default()
                    ),
                );
            }
        }
    }
}

/// Association (SPEC §8): a Service showing a claimed address is one of its holders.
fn service_holds_unassociated(x: &Ctx<'_>, found: &mut Found) {
    for svc in
        x.s.services
            .iter()
            .filter(|s| x.scope.namespace(&s.namespace().unwrap_or_default()))
    {
        let key = address_controller_runtime::cache::key_of(svc);
        for ip in address_controller_api::service::ingress_addresses(svc) {
            for a in x.by_ip.get(&ip).into_iter().flatten() {
                let holders = a.holder_services();
                if a.spec.claim_ref.is_some()
                    && a.phase() != Some(AddressPhase::Conflict)
                    && !holders.contains(&key)
                {
                    found.add(
                        format!("Service {key}"),
                        format!(
                            "shows {ip} of IPAddress {} (claim {}), held by {}",
                            a.name_any(),
                            a.spec
                                .claim_ref
                                .as_ref()
                                .map(|r| r.key())
                                .unwrap_or_default(),
                            Some(holders.join(", "))
                                .filter(|h| !h.is_empty())
                                .unwrap_or_else(|| "nothing".into())
                        ),
                        format!("{},{}", version(svc), version(*a)),
                    );
                }
            }
        }
    }
}

/// `associatedTo` names the first attachment and `holderCount` counts them.
fn ledger_inconsistent(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        let Some(st) = a.status.as_ref() else {
            continue;
        };
        let first = st.attachments.first().map(|h| h.association());
        let count = (!st.attachments.is_empty()).then_some(st.attachments.len() as i64);
        if !st.attachments.is_empty() && (st.associated_to != first || st.holder_count != count) {
            found.add(
                format!("IPAddress {}", a.name_any()),
                format!(
                    "associatedTo {:?}, holderCount {:?}, {} attachments",
                    st.associated_to,
                    st.holder_count,
                    st.attachments.len()
                ),
                version(a),
            );
        }
    }
}

/// Sharing: the holders the ledger lists are admitted together by the claim's sharing, in
/// the ledger's order (the rule the kit applies: [`address_controller_api::sharing::admit`]).
fn holders_incompatible(x: &Ctx<'_>, found: &mut Found) {
    for a in x.addresses_in_scope() {
        let Some(claim) = x.claim_of(a).filter(|c| {
            a.spec.claim_ref.as_ref().and_then(|r| r.uid.as_ref()) == c.metadata.uid.as_ref()
        }) else {
            continue;
        };
        let keyed: Vec<(String, &Service)> = a
            .holder_services()
            .into_iter()
            .filter_map(|k| x.services.get(&k).map(|s| (k, *s)))
            .collect();
        let candidates: Vec<address_controller_api::sharing::Candidate<'_>> = keyed
            .iter()
            .map(|(k, s)| address_controller_api::sharing::Candidate {
                key: k,
                namespace: k.split_once('/').map_or("", |(ns, _)| ns),
                service: s,
            })
            .collect();
        let verdicts = address_controller_api::sharing::admit(claim, &candidates);
        for ((k, svc), v) in keyed.iter().zip(verdicts) {
            if let Err(r) = v {
                found.add(
                    format!("IPAddress {}", a.name_any()),
                    format!(
                        "holder Service {k}: {} ({})",
                        r.reason(),
                        r.message(&claim.key())
                    ),
                    format!("{},{},{}", version(a), version(claim), version(*svc)),
                );
            }
        }
    }
}

/// The claim counts the Services naming it (their AddressAttached condition).
fn claim_services_miscounted(x: &Ctx<'_>, found: &mut Found) {
    let mut naming: HashMap<String, Vec<&Service>> = HashMap::new();
    for svc in &x.s.services {
        if let Some(k) = address_controller_api::service::claim_key(svc) {
            naming.entry(k).or_default().push(svc);
        }
    }
    for c in x.claims_in_scope() {
        let key = c.key();
        let of = naming.get(&key).map(Vec::as_slice).unwrap_or_default();
        let want = address_controller_api::ClaimServices::count(of.iter().copied());
        let has = c.status.as_ref().and_then(|st| st.services);
        if !c.is_deleting() && has != want {
            let versions = std::iter::once(version(c))
                .chain(of.iter().map(|s| version(*s)))
                .collect::<Vec<_>>()
                .join(",");
            found.add(
                format!("claim {key}"),
                format!("status.services {has:?}, the Services' conditions say {want:?}"),
                versions,
            );
        }
    }
}

/// The quotas of each namespace.
fn quotas_by_namespace<'a>(x: &Ctx<'a>) -> BTreeMap<&'a str, Vec<&'a IPAddressQuota>> {
    let mut quotas: BTreeMap<&str, Vec<&IPAddressQuota>> = BTreeMap::new();
    for q in &x.s.quotas {
        if let Some(ns) = q.metadata.namespace.as_deref() {
            quotas.entry(ns).or_default().push(q);
        }
    }
    quotas
}

/// The versions a namespace's quota judgement rests on: its quotas and the addresses
/// counted toward them.
fn quota_versions(x: &Ctx<'_>, quotas: &BTreeMap<&str, Vec<&IPAddressQuota>>, ns: &str) -> String {
    let mut v: Vec<String> = quotas
        .get(ns)
        .into_iter()
        .flatten()
        .map(|q| version(*q))
        .collect();
    v.extend(
        x.s.addresses
            .iter()
            .filter(|a| a.quota_slot().is_some_and(|(n, _)| n == ns))
            .map(version),
    );
    v.sort();
    v.join(",")
}

/// §13: no namespace over its quota. A released surplus (SPEC §5.7, `status.reason:
/// Surplus`) was never granted and counts toward nothing (`IPAddress::quota_slot`): a
/// namespace is over its quota only through the addresses it was granted.
fn namespace_over_quota(x: &Ctx<'_>, found: &mut Found) {
    let quotas = quotas_by_namespace(x);
    for (ns, qs) in &quotas {
        if !x.scope.namespace(ns) {
            continue;
        }
        for (class, used) in usage_by_class(ns, x.claims_in_scope(), x.s.addresses.iter()) {
            if let Some(limits) = QuotaLimits::of_class(qs.iter().copied(), &class)
                && limits.exceeded_by(&used)
            {
                found.add(
                    format!("namespace {ns}"),
                    format!(
                        "holds {} IPv4 and {} IPv6 addresses of class {class:?}; limits {limits:?}",
                        used.ipv4, used.ipv6
                    ),
                    quota_versions(x, &quotas, ns),
                );
            }
        }
    }
}

/// §13: no refusal that its class and quota would lift.
fn refusal_stale(x: &Ctx<'_>, found: &mut Found) {
    let quotas = quotas_by_namespace(x);
    for c in x.claims_in_scope() {
        if !c.is_refused_entitlement() {
            continue;
        }
        let ns = c.namespace().unwrap_or_default();
        let Some(class) = c
            .status
            .as_ref()
            .and_then(|st| st.class_name.as_deref())
            .and_then(|n| x.classes.get(n))
        else {
            continue;
        };
        let admitted = class.admits(x.s.namespaces.get(&ns));
        let fits = match QuotaLimits::of_class(
            quotas.get(ns.as_str()).into_iter().flatten().copied(),
            &class.name_any(),
        ) {
            None => true,
            Some(limits) => {
                // Its own invitation is not counted against it (it has none: refused).
                let used = usage_by_class(&ns, x.claims_in_scope(), x.s.addresses.iter())
                    .remove(&class.name_any())
                    .unwrap_or_default();
                limits
                    .admit(&class.name_any(), &used, &c.unlisted_families())
                    .is_ok()
            }
        };
        if admitted && fits {
            found.add(
                format!("claim {}", c.key()),
                "refused for an entitlement that its namespace, class and quota grant now".into(),
                format!(
                    "{},{},{}",
                    version(c),
                    version(*class),
                    quota_versions(x, &quotas, &ns)
                ),
            );
        }
    }
}

/// The ledger gauges an exact replica reports for `s`, zeros dropped.
fn expected_gauges(s: &Snapshot) -> BTreeMap<String, i64> {
    let mut m: BTreeMap<String, i64> = BTreeMap::new();
    for a in &s.addresses {
        let ph = a.phase().map_or("Unknown", |p| p.as_str());
        *m.entry(format!(
            "address_controller_ipaddresses{{class=\"{}\",phase=\"{ph}\"}}",
            a.spec.class_name
        ))
        .or_default() += 1;
    }
    for a in &s.addresses {
        if let Some(f) = a.family() {
            *m.entry(format!(
                "address_controller_ipaddressclass_allocated{{class=\"{}\",family=\"{}\"}}",
                a.spec.class_name,
                f.as_str()
            ))
            .or_default() += 1;
        }
    }
    for a in &s.addresses {
        let Some(r) = a.spec.claim_ref.as_ref() else {
            continue;
        };
        for state in a.held_states() {
            *m.entry(format!(
                "address_controller_ipaddresses_held{{class=\"{}\",namespace=\"{}\",state=\"{state}\"}}",
                a.spec.class_name, r.namespace
            ))
            .or_default() += 1;
        }
    }
    // The quota gauges, for every namespace and class a quota limits.
    let mut quotas: BTreeMap<&str, Vec<&IPAddressQuota>> = BTreeMap::new();
    for q in &s.quotas {
        if let Some(ns) = q.metadata.namespace.as_deref() {
            quotas.entry(ns).or_default().push(q);
        }
    }
    for (ns, qs) in &quotas {
        let mut usage = usage_by_class(ns, s.claims.iter(), s.addresses.iter());
        let classes: BTreeSet<&str> = qs
            .iter()
            .flat_map(|q| q.spec.limits.iter().map(|l| l.class_name.as_str()))
            .collect();
        for class in classes {
            let Some(limits) = QuotaLimits::of_class(qs.iter().copied(), class) else {
                continue;
            };
            let used = usage.remove(class).unwrap_or_default();
            for (family, l, u) in [
                ("all", limits.addresses.as_ref(), used.total()),
                ("IPv4", limits.ipv4.as_ref(), used.ipv4),
                ("IPv6", limits.ipv6.as_ref(), used.ipv6),
            ] {
                let labels =
                    format!("{{class=\"{class}\",family=\"{family}\",namespace=\"{ns}\"}}");
                if let Some(l) = l {
                    m.insert(format!("address_controller_quota_limit{labels}"), l.value);
                }
                m.insert(format!("address_controller_quota_used{labels}"), u);
            }
            let waiting = s
                .claims
                .iter()
                .filter(|c| c.namespace().as_deref() == Some(*ns))
                .filter(|c| {
                    c.status.as_ref().and_then(|st| st.class_name.as_deref()) == Some(class)
                        && c.entitlement_refusal()
                            == Some(address_controller_api::names::reason::QUOTA_EXCEEDED)
                })
                .count();
            m.insert(
                format!("address_controller_quota_waiting_claims{{class=\"{class}\",namespace=\"{ns}\"}}"),
                waiting as i64,
            );
        }
    }
    m.retain(|_, v| *v != 0);
    for c in &s.claims {
        let st = c.status.as_ref();
        let class = st.and_then(|st| st.class_name.clone()).unwrap_or_default();
        let ph = st.and_then(|st| st.phase).map_or("Pending", |p| p.as_str());
        *m.entry(format!(
            "address_controller_ipaddressclaims{{class=\"{class}\",namespace=\"{}\",phase=\"{ph}\"}}",
            c.namespace().unwrap_or_default()
        ))
        .or_default() += 1;
    }
    m
}

/// The ledger gauges in a metrics text, zeros dropped.
pub fn parse_gauges(text: &str) -> BTreeMap<String, i64> {
    text.lines()
        .filter(|l| {
            l.starts_with("address_controller_ipaddresses{")
                || l.starts_with("address_controller_ipaddresses_held{")
                || l.starts_with("address_controller_ipaddressclaims{")
                || l.starts_with("address_controller_ipaddressclass_allocated{")
                || l.starts_with("address_controller_quota_")
        })
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let v: f64 = value.parse().ok()?;
            (v != 0.0).then(|| (series.to_string(), v as i64))
        })
        .collect()
}

/// Times a replica is asked for /metrics before it counts as not answering.
const METRICS_ATTEMPTS: u32 = 3;

fn gauge_violations(s: &Snapshot, replicas: &[Replica]) -> Vec<(Violation, String)> {
    let want = expected_gauges(s);
    let mut out = Vec::new();
    for r in replicas {
        // A replica must answer within curl's 10 s; one that does not is asked twice more,
        // 5 s apart, its threads printed the first time (so a slow answer under a loaded
        // machine is told from a stuck process, and a stuck one is diagnosed either way).
        let mut answer = crate::https_get(&r.url, Some(&r.token));
        for attempt in 2..=METRICS_ATTEMPTS {
            let Err(e) = &answer else { break };
            let state = r.pid.map(crate::process_state).unwrap_or_default();
            println!(
                "replica {} did not answer /metrics (attempt {} of {METRICS_ATTEMPTS}: {e:#}):\n{state}",
                r.name,
                attempt - 1
            );
            std::thread::sleep(Duration::from_secs(5));
            answer = crate::https_get(&r.url, Some(&r.token));
            if answer.is_ok() {
                println!("replica {} answered /metrics at attempt {attempt}", r.name);
            }
        }
        let got = match answer {
            Ok((200, text)) => parse_gauges(&text),
            Ok((code, body)) => {
                out.push((
                    Violation {
                        rule: "gauges-differ",
                        object: r.name.clone(),
                        detail: format!("GET /metrics: {code} {body}"),
                    },
                    String::new(),
                ));
                continue;
            }
            Err(e) => {
                let state = r.pid.map(crate::process_state).unwrap_or_default();
                if !state.is_empty() {
                    println!("replica {} does not answer /metrics:\n{state}", r.name);
                }
                out.push((
                    Violation {
                        rule: "gauges-differ",
                        object: r.name.clone(),
                        detail: format!("GET /metrics: {e:#}"),
                    },
                    String::new(),
                ));
                continue;
            }
        };
        if got != want {
            let mut diff = Vec::new();
            for k in want.keys().chain(got.keys()).collect::<BTreeSet<_>>() {
                let (w, g) = (
                    want.get(k).copied().unwrap_or(0),
                    got.get(k).copied().unwrap_or(0),
                );
                if w != g {
                    diff.push(format!("{k}: objects {w}, gauge {g}"));
                }
            }
            diff.truncate(5);
            out.push((
                Violation {
                    rule: "gauges-differ",
                    object: r.name.clone(),
                    detail: diff.join("; "),
                },
                String::new(),
            ));
        }
    }
    out
}

/// Checks the invariants over `scope`, comparing the gauges of `replicas` (every replica,
/// leader and followers) with the objects. Takes at least `settle` when something looks
/// wrong at first (to tell transient states from violations).
pub async fn check(
    client: &Client,
    scope: &Scope,
    settle: Duration,
    replicas: &[Replica],
) -> Result<Report> {
    let first = snapshot(client).await?;
    let mut seen = judge(&first, scope, settle);
    let gauges_first = gauge_violations(&first, replicas);
    let mut last = first;
    let mut gauges = gauges_first;
    if !seen.is_empty() || !gauges.is_empty() {
        tokio::time::sleep(settle).await;
        let second = snapshot(client).await?;
        let again = judge(&second, scope, settle);
        // Seen twice on the same state (objects unchanged for `settle`); time-based rules
        // carry no versions and count when seen twice.
        seen.retain(|v| again.contains(v));
        // Gauges follow the caches within moments; a replica that still differs after
        // `settle` (each compared with the objects of its own moment) is wrong.
        let deadline = std::time::Instant::now() + settle;
        loop {
            let s = snapshot(client).await?;
            gauges = gauge_violations(&s, replicas);
            if gauges.is_empty() || std::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        last = second;
    }
    let mut violations: Vec<Violation> = seen.into_iter().chain(gauges).map(|(v, _)| v).collect();
    violations.sort();
    violations.dedup();
    Ok(Report {
        claims: last.claims.iter().filter(|c| scope.claim(c)).count(),
        addresses: last.addresses.iter().filter(|a| scope.address(a)).count(),
        classes: last
            .classes
            .iter()
            .filter(|c| {
                scope
                    .classes
                    .as_ref()
                    .is_none_or(|s| s.contains(&c.name_any()))
            })
            .count(),
        violations,
    })
}

/// [`check`], failing with the table when anything is violated.
pub async fn assert_invariants(client: &Client, scope: &Scope, replicas: &[Replica]) {
    let report = check(client, scope, Duration::from_secs(5), replicas)
        .await
        .unwrap_or_else(|e| panic!("invariant check failed to run: {e:#}"));
    assert!(report.ok(), "invariants violated:\n{}", report.table());
    println!("{}", report.table());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn claim(name: &str, uid: &str, phase: &str, listed: &[(&str, &str)]) -> IPAddressClaim {
        let addresses: Vec<_> = listed
            .iter()
            .map(|(n, a)| json!({"name": n, "address": a}))
            .collect();
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "t", "uid": uid, "resourceVersion": "1"},
            "spec": {}, "status": {"phase": phase, "className": "pub", "addresses": addresses}}),
        )
        .unwrap()
    }

    fn addr(name: &str, ip: &str, claim: Option<(&str, &str)>, phase: &str) -> IPAddress {
        let r = claim.map(|(n, u)| json!({"namespace": "t", "name": n, "uid": u}));
        serde_json::from_value(json!({"metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"address": ip, "className": "pub", "source": {"fromClass": {}}, "claimRef": r},
            "status": {"phase": phase}}))
        .unwrap()
    }

    fn rules(s: &Snapshot) -> Vec<&'static str> {
        let mut r: Vec<&str> = judge(s, &Scope::everything(), Duration::from_secs(5))
            .into_iter()
            .map(|(v, _)| v.rule)
            .collect();
        r.sort();
        r
    }

    #[test]
    fn a_history_overlapping_or_naming_another_claim_is_caught() {
        let c = claim("web", "u1", "Bound", &[("a", "192.0.2.1")]);
        let holding = |from: &str, until: Option<&str>, name: &str, uid: &str| {
            json!({"namespace": "t", "name": name, "uid": uid, "state": "Bound",
                "from": from, "until": until})
        };
        let with_history = |h: serde_json::Value| {
            let mut a = addr("a", "192.0.2.1", Some(("web", "u1")), "Bound");
            a.status.as_mut().unwrap().history = serde_json::from_value(h).unwrap();
            a
        };
        let snap = |a: IPAddress| Snapshot {
            claims: vec![c.clone()],
            addresses: vec![a],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: [("t".to_string(), BTreeMap::new())].into(),
            at: Timestamp::now(),
        };
        let sound = with_history(json!([
            holding(
                "2026-01-01T10:00:00Z",
                Some("2026-01-01T11:00:00Z"),
                "old",
                "u0"
            ),
            holding("2026-01-01T11:00:00Z", None, "web", "u1"),
        ]));
        assert!(!rules(&snap(sound)).contains(&"history-unsound"));
        // Overlapping (a failover that wrote from a replica's stale view).
        let overlapping = with_history(json!([
            holding(
                "2026-01-01T10:00:00Z",
                Some("2026-01-01T11:30:00Z"),
                "old",
                "u0"
            ),
            holding("2026-01-01T11:00:00Z", None, "web", "u1"),
        ]));
        assert!(rules(&snap(overlapping)).contains(&"history-unsound"));
        // The open entry names another claim than the claimRef.
        let stale = with_history(json!([holding("2026-01-01T10:00:00Z", None, "old", "u0")]));
        assert!(rules(&snap(stale)).contains(&"history-unsound"));
        // Two open entries.
        let two_open = with_history(json!([
            holding("2026-01-01T10:00:00Z", None, "old", "u0"),
            holding("2026-01-01T11:00:00Z", None, "web", "u1"),
        ]));
        assert!(rules(&snap(two_open)).contains(&"history-unsound"));
    }

    #[test]
    fn an_entry_moved_off_without_its_record_is_caught() {
        use address_controller_api::history::{AddressMeta, Holding, HoldingState};
        let c = claim("web", "u1", "Bound", &[("a", "192.0.2.1")]);
        let mut a = addr("a", "192.0.2.1", Some(("web", "u1")), "Bound");
        a.metadata.uid = Some("0123456789".into());
        let st = a.status.as_mut().unwrap();
        st.history_dropped = 1;
        st.history_recorded = 2;
        let held = |i: i64| Holding {
            namespace: "t".into(),
            name: format!("c{i}"),
            uid: None,
            state: HoldingState::Bound,
            from: None,
            until: None,
            ended: None,
            found: false,
        };
        let meta = AddressMeta::of(&a);
        let record = |i: i64| meta.holding(i, &held(i)).to_object();
        let snap = |records: Vec<address_controller_api::IPAddressRecord>| Snapshot {
            claims: vec![c.clone()],
            addresses: vec![a.clone()],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records,
            namespaces: [("t".to_string(), BTreeMap::new())].into(),
            at: Timestamp::now(),
        };
        // Ordinal 0 was dropped by an older version (no record owed); 1 and 2 were moved.
        assert!(!rules(&snap(vec![record(1), record(2)])).contains(&"history-unrecorded"));
        // The positive control: one record missing is caught.
        assert!(rules(&snap(vec![record(1)])).contains(&"history-unrecorded"));
        assert!(rules(&snap(vec![])).contains(&"history-unrecorded"));
    }

    #[test]
    fn a_released_address_past_its_class_release_delay_is_caught_unless_held() {
        let at = Timestamp::now();
        let class: IPAddressClass = serde_json::from_value(json!({"metadata": {"name": "pub",
            "resourceVersion": "1"}, "spec": {"provisioner": "p", "releaseDelay": "1m"}}))
        .unwrap();
        let released = |ago: i64, held: bool| {
            let mut a = addr("r", "192.0.2.7", Some(("gone", "u0")), "Released");
            let when = at.checked_sub(SignedDuration::from_secs(ago)).unwrap();
            a.status.as_mut().unwrap().released_at =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(when));
            if held {
                a.metadata.annotations = Some(
                    [(
                        address_controller_api::names::HELD_ANNOTATION.to_string(),
                        "true".to_string(),
                    )]
                    .into(),
                );
            }
            a
        };
        let snap = |a: IPAddress| Snapshot {
            claims: vec![],
            addresses: vec![a],
            classes: vec![class.clone()],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: [("t".to_string(), BTreeMap::new())].into(),
            at,
        };
        // Released a moment ago: within its delay.
        assert!(rules(&snap(released(1, false))).is_empty());
        // An hour ago, a one-minute delay: the core should have freed it.
        assert_eq!(
            rules(&snap(released(3600, false))),
            ["orphan-not-reclaimed"]
        );
        // Held by an admin: never freed by the delay.
        assert!(rules(&snap(released(3600, true))).is_empty());
    }

    #[test]
    fn quota_rules_catch_a_namespace_over_its_limit_and_a_refusal_that_no_longer_holds() {
        let at = Timestamp::now();
        let quota = |n: i64| -> IPAddressQuota {
            serde_json::from_value(
                json!({"metadata": {"name": "q", "namespace": "t", "resourceVersion": "1"},
                "spec": {"limits": [{"className": "pub", "addresses": n}]}}),
            )
            .unwrap()
        };
        let class: IPAddressClass = serde_json::from_value(
            json!({"metadata": {"name": "pub", "resourceVersion": "1"}, "spec": {"provisioner": "p"}}),
        )
        .unwrap();
        let refused = {
            let mut c = claim("w", "u2", "Pending", &[]);
            c.status.as_mut().unwrap().conditions = vec![
                serde_json::from_value(json!({"type": "Bound", "status": "False",
                    "reason": "QuotaExceeded", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}))
                .unwrap(),
            ];
            c
        };
        let snap = |limit: i64, addresses: Vec<IPAddress>| Snapshot {
            claims: vec![
                claim("a", "u1", "Bound", &[("x", "192.0.2.1")]),
                refused.clone(),
            ],
            addresses,
            classes: vec![class.clone()],
            services: vec![],
            quotas: vec![quota(limit)],
            records: vec![],
            namespaces: [("t".to_string(), BTreeMap::new())].into(),
            at,
        };
        let held = || vec![addr("x", "192.0.2.1", Some(("a", "u1")), "Bound")];
        // At its limit with a claim waiting: healthy.
        assert!(
            rules(&snap(1, held())).is_empty(),
            "{:?}",
            rules(&snap(1, held()))
        );
        // Over it (the limit lowered, or a double count).
        assert_eq!(rules(&snap(0, held())), ["namespace-over-quota"]);
        // A released surplus (`reason: Surplus`) is not a grant: the namespace is not over
        // its quota through it — also once its claim is gone.
        let surplus = |claim: (&str, &str)| {
            let mut a = addr("s", "192.0.2.9", Some(claim), "Released");
            if let Some(st) = a.status.as_mut() {
                st.reason = Some(address_controller_api::names::released::SURPLUS.into());
            }
            a
        };
        for of in [("a", "u1"), ("gone", "u0")] {
            let with_surplus = vec![
                addr("x", "192.0.2.1", Some(("a", "u1")), "Bound"),
                surplus(of),
            ];
            assert!(
                rules(&snap(1, with_surplus.clone())).is_empty(),
                "{:?}",
                rules(&snap(1, with_surplus))
            );
        }
        // A released and retained address still counts.
        let released = vec![
            addr("x", "192.0.2.1", Some(("a", "u1")), "Bound"),
            addr("r", "192.0.2.7", Some(("gone", "u0")), "Released"),
        ];
        assert_eq!(rules(&snap(1, released)), ["namespace-over-quota"]);
        // Room again but the claim still says QuotaExceeded (a missed wake-up).
        assert_eq!(rules(&snap(2, held())), ["refusal-stale"]);
    }

    #[test]
    fn each_rule_catches_its_violation_and_a_healthy_ledger_passes() {
        let at = Timestamp::now();
        let healthy = Snapshot {
            claims: vec![claim("a", "u1", "Bound", &[("x", "192.0.2.1")])],
            addresses: vec![
                addr("x", "192.0.2.1", Some(("a", "u1")), "Bound"),
                addr("y", "192.0.2.2", None, "Available"),
            ],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert!(rules(&healthy).is_empty(), "{:?}", rules(&healthy));
        // The double allocation of the field report: two Bound IPv4 addresses, both listed.
        let double = Snapshot {
            claims: vec![claim(
                "a",
                "u1",
                "Bound",
                &[("x", "192.0.2.1"), ("z", "192.0.2.3")],
            )],
            addresses: vec![
                addr("x", "192.0.2.1", Some(("a", "u1")), "Bound"),
                addr("z", "192.0.2.3", Some(("a", "u1")), "Bound"),
            ],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert_eq!(
            rules(&double),
            ["claim-two-per-family", "claim-two-per-family"]
        );
        // A Bound address of a deleted claim; a Retain orphan left Bound; a duplicate IP.
        let orphan = Snapshot {
            claims: vec![],
            addresses: vec![
                addr("x", "192.0.2.1", Some(("gone", "u9")), "Bound"),
                addr("x2", "192.0.2.1", None, "Available"),
            ],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert_eq!(
            rules(&orphan),
            [
                "bound-address-orphan",
                "duplicate-ip",
                "orphan-not-reclaimed"
            ]
        );
        // A Pending claim next to a free address.
        let pending = Snapshot {
            claims: vec![claim("a", "u1", "Pending", &[])],
            addresses: vec![addr("y", "192.0.2.2", None, "Available")],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert_eq!(rules(&pending), ["pending-with-free-address"]);

        // Issue #20, case 1 as the chaos run left it: a pinned claim Lost while the address
        // it lost sits Available (its binding undone) or bound to another tenant's claim.
        let lost = |msg: &str| {
            let mut c = claim("p", "u2", "Lost", &[]);
            c.status.as_mut().unwrap().conditions = vec![
                serde_json::from_value(json!({
                "type": "Bound", "status": "False", "reason": "AddressLost", "message": msg,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}))
                .unwrap(),
            ];
            c
        };
        for undone in [
            addr("x", "192.0.2.1", None, "Available"),
            addr("x", "192.0.2.1", Some(("thief", "u3")), "Bound"),
        ] {
            let s = Snapshot {
                claims: vec![lost("IPAddress x (192.0.2.1) no longer names this claim")],
                addresses: vec![undone],
                classes: vec![],
                services: vec![],
                quotas: vec![],
                records: vec![],
                namespaces: Default::default(),
                at,
            };
            assert!(
                rules(&s).contains(&"lost-claim-unexplained"),
                "{:?}",
                rules(&s)
            );
        }
        // Lost for a reason: the address is Lost, being deleted, or gone.
        let really = Snapshot {
            claims: vec![lost("IPAddress x is Lost")],
            addresses: vec![addr("x", "192.0.2.1", Some(("p", "u2")), "Lost")],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert!(rules(&really).is_empty(), "{:?}", rules(&really));
        let gone = Snapshot {
            claims: vec![lost("IPAddress x (192.0.2.1) no longer exists")],
            addresses: vec![],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert!(rules(&gone).is_empty(), "{:?}", rules(&gone));
        // A reservation (claimRef without uid, no such claim) is Available, never Released;
        // the same address Released is a violation — and not an orphan to reclaim.
        let reserved = |phase: &str| {
            let mut a = addr("r", "192.0.2.9", None, phase);
            a.spec.claim_ref = Some(address_controller_api::ClaimRef {
                namespace: "t".into(),
                name: "late".into(),
                uid: None,
            });
            a
        };
        let ok = Snapshot {
            claims: vec![],
            addresses: vec![reserved("Available")],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert!(rules(&ok).is_empty(), "{:?}", rules(&ok));
        let mut wrong = reserved("Released");
        wrong.status.as_mut().unwrap().released_from = Some(address_controller_api::ClaimRef {
            namespace: "t".into(),
            name: "earlier".into(),
            uid: Some("u0".into()),
        });
        let bad = Snapshot {
            claims: vec![],
            addresses: vec![wrong],
            classes: vec![],
            services: vec![],
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert_eq!(rules(&bad), ["reservation-not-kept"]);
    }

    #[test]
    fn the_ledger_and_the_services_agree_on_associations() {
        let at = Timestamp::now();
        let svc = |name: &str, ip: Option<&str>| -> Service {
            let ingress = ip.map(|ip| json!([{"ip": ip}]));
            serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": "t", "resourceVersion": "1"},
                "status": {"loadBalancer": {"ingress": ingress}}}),
            )
            .unwrap()
        };
        let associated = |to: &str| {
            let mut a = addr("x", "192.0.2.1", Some(("a", "u1")), "Bound");
            a.status.as_mut().unwrap().associated_to = Some(address_controller_api::Association {
                kind: "Service".into(),
                namespace: Some("t".into()),
                name: to.into(),
            });
            a
        };
        let snap = |addresses: Vec<IPAddress>, services: Vec<Service>| Snapshot {
            claims: vec![claim("a", "u1", "Bound", &[("x", "192.0.2.1")])],
            addresses,
            classes: vec![],
            services,
            quotas: vec![],
            records: vec![],
            namespaces: Default::default(),
            at,
        };
        assert!(
            rules(&snap(
                vec![associated("web")],
                vec![svc("web", Some("192.0.2.1"))]
            ))
            .is_empty()
        );
        assert_eq!(
            rules(&snap(vec![associated("web")], vec![])),
            ["association-dangling"]
        );
        assert_eq!(
            rules(&snap(vec![associated("web")], vec![svc("web", None)])),
            ["association-dangling"]
        );
        // A thief, or a pin whose ledger entry went first.
        assert_eq!(
            rules(&snap(
                vec![associated("web")],
                vec![
                    svc("web", Some("192.0.2.1")),
                    svc("thief", Some("192.0.2.1"))
                ]
            )),
            ["service-holds-unassociated"]
        );
        assert_eq!(
            rules(&snap(
                vec![addr("x", "192.0.2.1", Some(("a", "u1")), "Bound")],
                vec![svc("web", Some("192.0.2.1"))]
            )),
            ["service-holds-unassociated"]
        );
        // ...unless the address says Conflict.
        let mut conflict = associated("web");
        conflict.status.as_mut().unwrap().phase = Some(AddressPhase::Conflict);
        assert!(
            rules(&snap(
                vec![conflict],
                vec![
                    svc("web", Some("192.0.2.1")),
                    svc("thief", Some("192.0.2.1"))
                ]
            ))
            .is_empty()
        );
    }

    #[test]
    fn a_claim_counts_the_services_naming_it() {
        let at = Timestamp::now();
        let svc = |ns: &str, name: &str, names: &str, status: &str| -> Service {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns,
                "resourceVersion": "1",
                "annotations": {"local.sdn.cozystack.io/ip-address-claim": names}},
                "status": {"conditions": [{"type": address_controller_api::sharing::CONDITION,
                    "status": status, "reason": "R", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
            .unwrap()
        };
        let snap = |counted: Option<(u32, u32)>, services: Vec<Service>| {
            let mut c = claim("a", "u1", "Bound", &[]);
            c.status.as_mut().unwrap().services =
                counted.map(
                    |(attached, refused)| address_controller_api::ClaimServices {
                        attached,
                        refused,
                    },
                );
            Snapshot {
                claims: vec![c],
                addresses: vec![],
                classes: vec![],
                services,
                quotas: vec![],
                records: vec![],
                namespaces: Default::default(),
                at,
            }
        };
        let naming = || {
            vec![
                svc("t", "web", "a", "True"),
                svc("other", "front", "t/a", "False"),
                svc("t", "elsewhere", "b", "True"),
            ]
        };
        assert!(rules(&snap(Some((1, 1)), naming())).is_empty());
        assert!(rules(&snap(None, vec![])).is_empty());
        for wrong in [None, Some((2, 1)), Some((1, 0))] {
            assert_eq!(
                rules(&snap(wrong, naming())),
                ["claim-services-miscounted"],
                "{wrong:?}"
            );
        }
        assert_eq!(
            rules(&snap(Some((0, 0)), vec![])),
            ["claim-services-miscounted"]
        );
    }

    #[test]
    fn gauges_are_parsed_without_zeros() {
        let text = "# HELP x\naddress_controller_ipaddresses{class=\"a\",phase=\"Bound\"} 2\naddress_controller_ipaddresses{class=\"a\",phase=\"Lost\"} 0\nother 1\n";
        let g = parse_gauges(text);
        assert_eq!(g.len(), 1);
        assert_eq!(
            g["address_controller_ipaddresses{class=\"a\",phase=\"Bound\"}"],
            2
        );
    }
}
