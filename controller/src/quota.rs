//! The quota book (SPEC §13): per namespace and class, what counts toward its
//! IPAddressQuotas — kept from the watches, so a pass reads the usage without listing
//! anything — and the takes of passes binding or inviting right now.
//!
//! **Exact counting.** Usage is the addresses [`IPAddress::quota_slot`] counts in the
//! namespace, plus every (claim, family) a driver is invited to provision
//! ([`IPAddressClaim::invitation`]) or a pass is taking now, that no address serving the
//! claim covers yet. A pass that binds or invites first *takes* its families here, checking
//! the limits and recording the take under one lock: two workers never both fit into the
//! last slot. A take ends when the cache shows what it stood for (an address serving the
//! claim, an invitation) — it is then counted there — when the claim stops waiting, when
//! the API server refused an invitation's write (not when a bind's failed, nor when an
//! invitation's timed out: they may have landed), or after [`TAKE_TTL`]. Only the leader binds, so with the takes the
//! count is exact.
//!
//! **Two watches, one count.** Claims and addresses come on two watch streams, and either
//! may run ahead of the other (a reconnect after a kube-apiserver restart, one of them
//! waiting out a backoff, a new leader's caches). A pass writes its binds before the
//! claim's status, but the status can arrive first: the claim is `Bound`, its take ends,
//! and the address it lists is not in the cache yet. So a claim's status counts too: every
//! family it lists that no cached address serves is counted, in the class it resolved to,
//! until an address serving it shows ([`IPAddressClaim::listed_families`]). A pass that
//! invites or binds replaces the claim's invitation by its listing in one write, so the slot
//! never goes uncounted between the two caches.
//!
//! **Who is woken.** A claim refused for an entitlement is not in the free-address pump
//! (it would be woken, refused and woken again): it is passed again when its namespace's
//! labels or quotas change, when its class changes, and when the usage of its namespace and
//! class drops.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use address_controller_api::entitlement::{QuotaLimits, Usage};
use address_controller_api::names::reason;
use address_controller_api::{ClaimPhase, Family, IPAddress, IPAddressClaim, IPAddressQuota};
use kube::ResourceExt;

/// A take whose write never showed in the cache is dropped after this long.
pub const TAKE_TTL: Duration = Duration::from_secs(60);

/// (namespace, class).
type Scope = (String, String);
/// (claim key, family).
type Slot = (String, Family);

/// Where one address is counted, and the slot it serves.
#[derive(Default, PartialEq)]
struct Held {
    counted: Option<(Arc<Scope>, Family)>,
    served: Option<Slot>,
}

#[derive(Default)]
struct Inner {
    /// (namespace, class) → family → how many addresses are counted there. The scope is
    /// shared with the addresses' entries in `held`.
    counted: HashMap<Arc<Scope>, BTreeMap<Family, usize>>,
    /// (claim, family) → how many addresses serve it.
    served: HashMap<Slot, usize>,
    /// address → what the two counts above hold of it. Counts and one entry per address,
    /// not the address's name copied into a set per scope and per slot: at 20,000 bound
    /// addresses the sets cost ~0.4 KiB per address (a B-tree node for a slot's one name).
    held: HashMap<String, Held>,
    /// Invitations to provision, from the claims' status.
    invited: HashMap<Scope, BTreeSet<Slot>>,
    invited_of: HashMap<String, (Scope, Vec<Family>)>,
    /// Takes of passes in flight.
    taken: HashMap<Scope, HashMap<Slot, Instant>>,
    /// Slots a claim's status lists that no cached address serves yet: the claim's watch
    /// ahead of the addresses' (see the module documentation). Per scope, and per claim.
    ahead: HashMap<Scope, BTreeSet<Slot>>,
    ahead_of: HashMap<String, (Scope, Vec<Family>)>,
    /// namespace → quota key → quota.
    quotas: HashMap<String, BTreeMap<String, Arc<IPAddressQuota>>>,
    /// namespace → Pending claim key → (its class, the entitlement reason refusing it).
    pending: HashMap<String, BTreeMap<String, (String, Option<&'static str>)>>,
}

/// See the module documentation.
#[derive(Default)]
pub struct QuotaBook {
    inner: Mutex<Inner>,
}

/// One namespace's standing on one class, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    pub namespace: String,
    pub class: String,
    pub limits: QuotaLimits,
    pub used: Usage,
    /// Claims refused with `QuotaExceeded`.
    pub waiting: usize,
}

fn key_ns(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

fn pending_entry(c: &IPAddressClaim) -> Option<(String, Option<&'static str>)> {
    if c.is_deleting() || c.phase().is_some_and(|p| p != ClaimPhase::Pending) {
        return None;
    }
    let class = c
        .status
        .as_ref()
        .and_then(|s| s.class_name.clone())
        .or_else(|| c.spec.class_name.clone())
        .unwrap_or_default();
    Some((class, c.entitlement_refusal()))
}

impl Inner {
    fn usage(&self, scope: &Scope, exclude: &str) -> Usage {
        let mut u = Usage::default();
        if let Some(by_family) = self.counted.get(scope) {
            for (f, n) in by_family {
                u.add(*f, *n as i64);
            }
        }
        let mut slots: BTreeSet<&Slot> = BTreeSet::new();
        if let Some(set) = self.invited.get(scope) {
            slots.extend(set.iter());
        }
        if let Some(m) = self.taken.get(scope) {
            slots.extend(
                m.iter()
                    .filter(|(_, at)| at.elapsed() < TAKE_TTL)
                    .map(|(s, _)| s),
            );
        }
        slots.retain(|slot| slot.0 != exclude);
        // What a claim's status lists is held, its own claim's included.
        if let Some(set) = self.ahead.get(scope) {
            slots.extend(set.iter());
        }
        for slot in slots {
            if !self.served.contains_key(slot) {
                u.add(slot.1, 1);
            }
        }
        u
    }

    /// An address serving `slot` shows in the cache: a listing ahead of it is counted
    /// there now. Returns the scope the listing was counted in.
    fn catch_up(&mut self, slot: &Slot) -> Option<Scope> {
        let (scope, families) = self.ahead_of.get_mut(&slot.0)?;
        if !families.contains(&slot.1) {
            return None;
        }
        families.retain(|f| *f != slot.1);
        let (scope, emptied) = (scope.clone(), families.is_empty());
        if emptied {
            self.ahead_of.remove(&slot.0);
        }
        if let Some(set) = self.ahead.get_mut(&scope) {
            set.remove(slot);
            if set.is_empty() {
                self.ahead.remove(&scope);
            }
        }
        Some(scope)
    }

    fn limits(&self, ns: &str, class: &str) -> Option<QuotaLimits> {
        QuotaLimits::of_class(self.quotas.get(ns)?.values().map(Arc::as_ref), class)
    }

    /// Claims refused with `QuotaExceeded` in `scope`: their usage dropped.
    fn refused_in(&self, scope: &Scope) -> Vec<String> {
        self.pending
            .get(&scope.0)
            .map(|m| {
                m.iter()
                    .filter(|(_, (class, r))| {
                        *class == scope.1 && *r == Some(reason::QUOTA_EXCEEDED)
                    })
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Counts one address of family `f` in `scope`; returns the scope's shared key.
    fn count(&mut self, scope: &Scope, f: Family) -> Arc<Scope> {
        let key = match self.counted.get_key_value(scope) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::new(scope.clone()),
        };
        *self
            .counted
            .entry(Arc::clone(&key))
            .or_default()
            .entry(f)
            .or_default() += 1;
        key
    }

    fn uncount(&mut self, scope: &Scope, f: Family) {
        if let Some(by_family) = self.counted.get_mut(scope) {
            if let Some(n) = by_family.get_mut(&f) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by_family.remove(&f);
                }
            }
            if by_family.is_empty() {
                self.counted.remove(scope);
            }
        }
    }

    fn drop_takes(&mut self, claim: &str) -> Vec<Scope> {
        let mut scopes = Vec::new();
        for (scope, m) in self.taken.iter_mut() {
            let before = m.len();
            m.retain(|(k, _), _| k != claim);
            if m.len() != before {
                scopes.push(scope.clone());
            }
        }
        self.taken.retain(|_, m| !m.is_empty());
        scopes
    }
}

impl QuotaBook {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in an address change; returns the refused claims whose usage dropped.
    pub fn address_changed(&self, old: Option<&IPAddress>, new: Option<&IPAddress>) -> Vec<String> {
        let Some(name) = new.or(old).map(|a| a.name_any()) else {
            return Vec::new();
        };
        let counted = new.and_then(|a| {
            let (ns, f) = a.quota_slot()?;
            Some(((ns.to_string(), a.spec.class_name.clone()), f))
        });
        let served = new.filter(|a| a.serves_its_claim()).and_then(|a| {
            let r = a.spec.claim_ref.as_ref()?;
            Some((r.key(), a.family()?))
        });
        let mut s = self.lock();
        let mut dropped: Vec<Scope> = Vec::new();
        let held = s.held.remove(&name).unwrap_or_default();
        let same_count = held.counted.as_ref().map(|(sc, f)| (&**sc, *f))
            == counted.as_ref().map(|(sc, f)| (sc, *f));
        let counted_now = if same_count {
            held.counted
        } else {
            if let Some((scope, f)) = held.counted {
                s.uncount(&scope, f);
                dropped.push(Scope::clone(&scope));
            }
            counted.as_ref().map(|(scope, f)| (s.count(scope, *f), *f))
        };
        let served_now = if held.served == served {
            held.served
        } else {
            if let Some(slot) = held.served
                && let Some(n) = s.served.get_mut(&slot)
            {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    s.served.remove(&slot);
                }
            }
            if let Some(slot) = &served {
                // What the take stood for is in the cache now: it is counted there.
                if let Some((scope, _)) = &counted
                    && let Some(m) = s.taken.get_mut(scope)
                {
                    m.remove(slot);
                }
                *s.served.entry(slot.clone()).or_default() += 1;
                dropped.extend(s.catch_up(slot));
            }
            served
        };
        let now = Held {
            counted: counted_now,
            served: served_now,
        };
        if now != Held::default() {
            s.held.insert(name, now);
        }
        let mut out: Vec<String> = dropped.iter().flat_map(|sc| s.refused_in(sc)).collect();
        out.sort();
        out.dedup();
        out
    }

    /// Takes in a claim change; returns the refused claims whose usage dropped.
    pub fn claim_changed(
        &self,
        old: Option<&IPAddressClaim>,
        new: Option<&IPAddressClaim>,
    ) -> Vec<String> {
        let Some(key) = new.or(old).map(IPAddressClaim::key) else {
            return Vec::new();
        };
        let ns = key_ns(&key).to_string();
        let invitation = new.and_then(|c| {
            let (class, families) = c.invitation()?;
            Some(((ns.clone(), class.to_string()), families))
        });
        let mut s = self.lock();
        let mut dropped: Vec<Scope> = Vec::new();
        if s.invited_of.get(&key) != invitation.as_ref() {
            if let Some((scope, families)) = s.invited_of.remove(&key) {
                if let Some(set) = s.invited.get_mut(&scope) {
                    for f in families {
                        set.remove(&(key.clone(), f));
                    }
                }
                dropped.push(scope);
            }
            if let Some((scope, families)) = invitation {
                let set = s.invited.entry(scope.clone()).or_default();
                for f in &families {
                    set.insert((key.clone(), *f));
                }
                if let Some(m) = s.taken.get_mut(&scope) {
                    for f in &families {
                        m.remove(&(key.clone(), *f));
                    }
                }
                s.invited_of.insert(key.clone(), (scope, families));
            }
        }
        // The slots its status lists that no cached address serves yet (a claim's status
        // is written after its binds; its watch may deliver it first).
        let ahead = new.and_then(|c| {
            let class = c.status.as_ref()?.class_name.as_deref()?;
            let families: Vec<Family> = c
                .listed_families()
                .into_iter()
                .filter(|f| !s.served.contains_key(&(key.clone(), *f)))
                .collect();
            (!class.is_empty() && !families.is_empty())
                .then(|| ((ns.clone(), class.to_string()), families))
        });
        if s.ahead_of.get(&key) != ahead.as_ref() {
            if let Some((scope, families)) = s.ahead_of.remove(&key) {
                if let Some(set) = s.ahead.get_mut(&scope) {
                    for f in families {
                        set.remove(&(key.clone(), f));
                    }
                    if set.is_empty() {
                        s.ahead.remove(&scope);
                    }
                }
                dropped.push(scope);
            }
            if let Some((scope, families)) = ahead {
                // Rare: the claims' watch ahead of the addresses'.
                tracing::debug!(claim = %key, ?families, "quota: the claim's status lists addresses the cache has not shown yet; counted by the status");
                let set = s.ahead.entry(scope.clone()).or_default();
                for f in &families {
                    set.insert((key.clone(), *f));
                }
                s.ahead_of.insert(key.clone(), (scope, families));
            }
        }
        match new.and_then(pending_entry) {
            Some(entry) => {
                s.pending
                    .entry(ns.clone())
                    .or_default()
                    .insert(key.clone(), entry);
            }
            None => {
                if let Some(m) = s.pending.get_mut(&ns) {
                    m.remove(&key);
                    if m.is_empty() {
                        s.pending.remove(&ns);
                    }
                }
                // No longer waiting: its takes are over (counted by its addresses if bound, or
                // by its listing until they show).
                let scopes = s.drop_takes(&key);
                dropped.extend(scopes);
            }
        }
        let mut out: Vec<String> = dropped.iter().flat_map(|sc| s.refused_in(sc)).collect();
        out.retain(|k| *k != key);
        out.sort();
        out.dedup();
        out
    }

    /// Takes in a quota change; returns every Pending claim of its namespace.
    pub fn quota_changed(
        &self,
        old: Option<&IPAddressQuota>,
        new: Option<&IPAddressQuota>,
    ) -> Vec<String> {
        let Some(q) = new.or(old) else {
            return Vec::new();
        };
        let ns = q.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", q.name_any());
        let mut s = self.lock();
        match new {
            Some(n) => {
                s.quotas
                    .entry(ns.clone())
                    .or_default()
                    .insert(key, Arc::new(n.clone()));
            }
            None => {
                if let Some(m) = s.quotas.get_mut(&ns) {
                    m.remove(&key);
                    if m.is_empty() {
                        s.quotas.remove(&ns);
                    }
                }
            }
        }
        s.pending
            .get(&ns)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Every Pending claim of namespace `ns` (its labels changed).
    pub fn pending_in(&self, ns: &str) -> Vec<String> {
        self.lock()
            .pending
            .get(ns)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Claims of `class` refused for an entitlement (the class changed).
    pub fn refused_of_class(&self, class: &str) -> Vec<String> {
        let s = self.lock();
        s.pending
            .values()
            .flat_map(|m| m.iter())
            .filter(|(_, (c, r))| c == class && r.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The limits on `class` in `ns`, and the usage there without what `claim` is invited
    /// to or taking (its addresses are counted: they are held).
    pub fn standing(&self, ns: &str, class: &str, claim: &str) -> Option<(QuotaLimits, Usage)> {
        let s = self.lock();
        let limits = s.limits(ns, class)?;
        let used = s.usage(&(ns.to_string(), class.to_string()), claim);
        Some((limits, used))
    }

    /// How long until the first take counted in (`ns`, `class`) that is not `claim`'s ends
    /// by its [`TAKE_TTL`] — a write that never showed. A claim refused over quota passes
    /// again then: no cache change would wake it.
    pub fn next_take_expiry(&self, ns: &str, class: &str, claim: &str) -> Option<Duration> {
        let s = self.lock();
        s.taken
            .get(&(ns.to_string(), class.to_string()))?
            .iter()
            .filter(|((k, _), _)| k != claim)
            .filter_map(|(_, at)| TAKE_TTL.checked_sub(at.elapsed()))
            .min()
    }

    /// Takes `families` of `class` for `claim`, if they still fit the limits the pass
    /// planned with — checked and recorded under one lock. False: the pass must replan.
    pub fn take(
        &self,
        claim: &str,
        class: &str,
        families: &[Family],
        limits: &QuotaLimits,
    ) -> bool {
        let ns = key_ns(claim).to_string();
        let scope = (ns.clone(), class.to_string());
        let mut s = self.lock();
        // The limits may have changed since the plan: the stricter of both applies.
        let current = s.limits(&ns, class);
        let used = s.usage(&scope, claim);
        let fits = limits.admit(class, &used, families).is_ok()
            && current.is_none_or(|l| l.admit(class, &used, families).is_ok());
        if !fits {
            return false;
        }
        let now = Instant::now();
        let m = s.taken.entry(scope).or_default();
        for f in families {
            m.insert((claim.to_string(), *f), now);
        }
        true
    }

    /// The pass's writes failed: its takes end. Returns the refused claims to pass.
    pub fn release(&self, claim: &str) -> Vec<String> {
        let mut s = self.lock();
        let scopes = s.drop_takes(claim);
        let mut out: Vec<String> = scopes.iter().flat_map(|sc| s.refused_in(sc)).collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every (namespace, class) some quota limits, with its usage (metrics).
    pub fn standings(&self) -> Vec<Standing> {
        let s = self.lock();
        let mut out = Vec::new();
        for (ns, quotas) in &s.quotas {
            let classes: BTreeSet<&str> = quotas
                .values()
                .flat_map(|q| q.spec.limits.iter().map(|l| l.class_name.as_str()))
                .collect();
            for class in classes {
                let Some(limits) = s.limits(ns, class) else {
                    continue;
                };
                let scope = (ns.clone(), class.to_string());
                out.push(Standing {
                    namespace: ns.clone(),
                    class: class.to_string(),
                    limits,
                    used: s.usage(&scope, ""),
                    waiting: s.refused_in(&scope).len(),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn quota(limits: serde_json::Value) -> IPAddressQuota {
        serde_json::from_value(
            json!({"metadata": {"name": "q", "namespace": "t"}, "spec": {"limits": limits}}),
        )
        .unwrap()
    }

    fn address(name: &str, ip: &str, claim: Option<&str>, phase: &str) -> IPAddress {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"address": ip, "className": "pub", "source": {"fromClass": {}},
                "claimRef": claim.map(|c| json!({"namespace": "t", "name": c}))},
            "status": {"phase": phase}}))
        .unwrap()
    }

    fn claim(name: &str, reason: &str) -> IPAddressClaim {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "t", "generation": 1},
            "spec": {"className": "pub"},
            "status": {"phase": "Pending", "className": "pub", "conditions": [{"type": "Bound",
                "status": "False", "reason": reason, "message": "", "observedGeneration": 1,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        )
        .unwrap()
    }

    #[test]
    fn two_passes_never_both_fit_into_the_last_slot() {
        let book = QuotaBook::default();
        book.quota_changed(None, Some(&quota(json!([{"className": "pub", "ipv4": 2}]))));
        book.address_changed(None, Some(&address("a", "192.0.2.1", Some("x"), "Bound")));
        let (limits, used) = book.standing("t", "pub", "t/y").unwrap();
        assert_eq!(used, Usage { ipv4: 1, ipv6: 0 });
        // Both planned with one slot left; only the first take fits.
        assert!(book.take("t/y", "pub", &[Family::IPv4], &limits));
        assert!(!book.take("t/z", "pub", &[Family::IPv4], &limits));
        // The take ends when its address shows in the cache: still counted, once.
        book.address_changed(None, Some(&address("b", "192.0.2.2", Some("y"), "Bound")));
        assert_eq!(book.standing("t", "pub", "t/z").unwrap().1.ipv4, 2);
        // The first claim's write failed instead: its take ends, the slot is free again.
        let book2 = QuotaBook::default();
        book2.quota_changed(None, Some(&quota(json!([{"className": "pub", "ipv4": 1}]))));
        let (l2, _) = book2.standing("t", "pub", "t/y").unwrap();
        assert!(book2.take("t/y", "pub", &[Family::IPv4], &l2));
        assert!(!book2.take("t/z", "pub", &[Family::IPv4], &l2));
        book2.release("t/y");
        assert!(book2.take("t/z", "pub", &[Family::IPv4], &l2));
    }

    #[test]
    fn a_refused_claim_learns_when_the_takes_it_waits_behind_expire() {
        let book = QuotaBook::default();
        book.quota_changed(None, Some(&quota(json!([{"className": "pub", "ipv4": 1}]))));
        let (limits, _) = book.standing("t", "pub", "t/y").unwrap();
        assert_eq!(book.next_take_expiry("t", "pub", "t/z"), None);
        assert!(book.take("t/y", "pub", &[Family::IPv4], &limits));
        let left = book.next_take_expiry("t", "pub", "t/z").unwrap();
        assert!(left <= TAKE_TTL && left > TAKE_TTL - Duration::from_secs(5));
        assert_eq!(
            book.next_take_expiry("t", "pub", "t/y"),
            None,
            "not its own"
        );
        assert_eq!(book.next_take_expiry("t", "other", "t/z"), None);
    }

    #[test]
    fn invitations_count_until_their_address_serves_the_claim() {
        let book = QuotaBook::default();
        book.quota_changed(
            None,
            Some(&quota(json!([{"className": "pub", "addresses": 1}]))),
        );
        let w = claim("w", reason::WAITING_FOR_PROVISIONING);
        book.claim_changed(None, Some(&w));
        assert_eq!(book.standing("t", "pub", "t/other").unwrap().1.ipv4, 1);
        assert_eq!(
            book.standing("t", "pub", "t/w").unwrap().1.ipv4,
            0,
            "a claim's own invitation is not counted against it"
        );
        book.address_changed(None, Some(&address("a", "192.0.2.1", Some("w"), "Pending")));
        assert_eq!(book.standing("t", "pub", "t/other").unwrap().1.ipv4, 1);
        // A refused claim is woken when usage drops: the address is released and freed.
        let r = claim("r", reason::QUOTA_EXCEEDED);
        book.claim_changed(None, Some(&r));
        let freed = address("a", "192.0.2.1", None, "Available");
        let woken = book.address_changed(
            Some(&address("a", "192.0.2.1", Some("w"), "Released")),
            Some(&freed),
        );
        assert_eq!(woken, ["t/r"]);
        assert_eq!(book.pending_in("t"), ["t/r", "t/w"]);
        assert_eq!(book.refused_of_class("pub"), ["t/r"]);
        let s = book.standings();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].waiting, 1);
    }

    fn bound(name: &str, listed: &[(&str, &str)]) -> IPAddressClaim {
        let addresses: Vec<_> = listed
            .iter()
            .map(|(n, ip)| json!({"name": n, "address": ip}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "t"},
            "spec": {"className": "pub", "family": if listed.len() == 2 { "Dual" } else { "IPv4" }},
            "status": {"phase": "Bound", "className": "pub", "addresses": addresses}}))
        .unwrap()
    }

    #[test]
    fn a_claims_status_counts_before_its_address_shows() {
        // The CI chaos run's namespace at 4 of 3: a bound claim's status arrived before its
        // address (kube-apiserver restarted; the address watch reconnected later), its take
        // ended, and a refused claim woken by that took the slot.
        let book = QuotaBook::default();
        book.quota_changed(
            None,
            Some(&quota(json!([{"className": "pub", "addresses": 2}]))),
        );
        book.claim_changed(None, Some(&claim("r", reason::QUOTA_EXCEEDED)));
        let (limits, _) = book.standing("t", "pub", "t/x").unwrap();
        assert!(book.take("t/x", "pub", &[Family::IPv4, Family::IPv6], &limits));
        // x's status (Bound, listing both) comes first; its addresses not yet.
        let x = bound("x", &[("a", "192.0.2.1"), ("b", "2001:db8::1")]);
        book.claim_changed(None, Some(&x));
        assert_eq!(
            book.standing("t", "pub", "t/r").unwrap().1,
            Usage { ipv4: 1, ipv6: 1 },
            "what the status lists is held"
        );
        assert!(!book.take("t/r", "pub", &[Family::IPv4], &limits));
        // The addresses show: counted once, there.
        book.address_changed(None, Some(&address("a", "192.0.2.1", Some("x"), "Bound")));
        book.address_changed(None, Some(&address("b", "2001:db8::1", Some("x"), "Bound")));
        assert_eq!(
            book.standing("t", "pub", "t/r").unwrap().1,
            Usage { ipv4: 1, ipv6: 1 }
        );
        assert!(book.lock().ahead.is_empty() && book.lock().ahead_of.is_empty());
        // A status seen after its address stopped serving (a lagging claim watch) counts the
        // listing until the claim changes; the claim gone, nothing is left and r is woken.
        let freed = address("a", "192.0.2.1", None, "Available");
        book.address_changed(None, Some(&freed));
        book.claim_changed(Some(&x), Some(&x));
        assert_eq!(book.standing("t", "pub", "t/r").unwrap().1.ipv4, 1);
        let woken = book.claim_changed(Some(&x), None);
        assert_eq!(woken, ["t/r"]);
        assert_eq!(
            book.standing("t", "pub", "t/r").unwrap().1,
            Usage { ipv4: 0, ipv6: 1 }
        );
        assert!(book.lock().ahead.is_empty() && book.lock().ahead_of.is_empty());
    }

    #[test]
    fn released_addresses_count_but_do_not_serve() {
        let book = QuotaBook::default();
        book.quota_changed(None, Some(&quota(json!([{"className": "pub", "ipv4": 5}]))));
        book.address_changed(
            None,
            Some(&address("a", "192.0.2.1", Some("w"), "Released")),
        );
        // A new claim of the same name, invited: the Released address does not cover it.
        book.claim_changed(None, Some(&claim("w", reason::WAITING_FOR_PROVISIONING)));
        assert_eq!(book.standing("t", "pub", "").unwrap().1.ipv4, 2);
        assert_eq!(book.standing("u", "pub", ""), None, "no quota in u");
    }

    #[test]
    fn an_address_counts_once_however_often_it_is_seen() {
        let book = QuotaBook::default();
        book.quota_changed(None, Some(&quota(json!([{"className": "pub", "ipv4": 5}]))));
        let a = address("a", "192.0.2.1", Some("w"), "Bound");
        let b = address("b", "192.0.2.2", Some("w"), "Bound");
        // A relist hands every object over again: still one address each.
        for _ in 0..3 {
            book.address_changed(None, Some(&a));
            book.address_changed(Some(&a), Some(&a));
        }
        book.address_changed(None, Some(&b));
        assert_eq!(book.standing("t", "pub", "").unwrap().1.ipv4, 2);
        // The claim's invitation is covered while any of its two addresses serves it.
        book.claim_changed(None, Some(&claim("w", reason::WAITING_FOR_PROVISIONING)));
        book.address_changed(Some(&a), None);
        assert_eq!(book.standing("t", "pub", "").unwrap().1.ipv4, 1);
        book.address_changed(
            Some(&b),
            Some(&address("b", "192.0.2.2", None, "Available")),
        );
        assert_eq!(
            book.standing("t", "pub", "").unwrap().1.ipv4,
            1,
            "no address serves the invited claim any more: the invitation counts"
        );
        book.address_changed(Some(&b), None);
        let s = book.lock();
        assert!(s.held.is_empty() && s.served.is_empty() && s.counted.is_empty());
    }
}
