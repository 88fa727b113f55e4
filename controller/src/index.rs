//! Indexes fed by the watches, so that the cost of a pass does not grow with the number of
//! objects: free addresses per (class, family) in name order, addresses by the claim they
//! name, waiting claims per (class, family) in age order, claims by pinned address, claims
//! whose class is unresolved, Released addresses per class, Services by the claim they name.
//!
//! **Who is woken when an address becomes free.** Not every waiting claim (that is N passes
//! per free address, N² in all): the index keeps, per (class, family), a set of *woken*
//! claims — queued or running, in age order — and `Index::pump_locked` tops it up to
//! `min(free − being bound, waiting)`. It is called whenever the free set grows, the waiting
//! set grows, or a woken claim's pass ends. Liveness: after every pump, if a free address
//! and a waiting claim of one (class, family) coexist, at least one waiting claim is in
//! flight; every pass of a woken claim either binds (free and waiting both shrink) or finds
//! every free address reserved by other in-flight passes (which will bind them). So free
//! addresses are always handed out, and because the oldest unwoken claim is woken first, a
//! waiting claim is served after at most the claims ahead of it — none starves.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use address_controller_api::family::Family;
use address_controller_api::service::claim_key;
use address_controller_api::sharing::attached;
use address_controller_api::{ClaimPhase, ClaimRef, IPAddress, IPAddressClaim};
use address_controller_runtime::cache::key_of;
use address_controller_runtime::setmap::SetMap;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::decide::claim::pin_of;
use crate::decide::is_free;

/// (class, family).
pub type Pool = (String, Family);

/// A waiting claim's place in its pool: (creation time, claim key), oldest first.
type Place = (String, String);

/// A reservation that never saw its write land in the cache is dropped after this long.
const RESERVATION_TTL: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Inner {
    /// claim key → names of the addresses whose claimRef names it.
    by_claim: SetMap<String>,
    free: HashMap<Pool, BTreeSet<String>>,
    /// address name → its pool, while free.
    free_of: HashMap<String, Pool>,
    released: SetMap<String>,
    released_of: HashMap<String, String>,
    /// pool → (creation time, claim key) of claims waiting for an address of it.
    waiting: HashMap<Pool, BTreeSet<Place>>,
    waiting_of: HashMap<String, Vec<(Pool, Place)>>,
    woken: HashMap<Pool, HashSet<String>>,
    woken_of: HashMap<String, HashSet<Pool>>,
    pinned: SetMap<String>,
    pinned_of: HashMap<String, String>,
    /// claim key → the Services (`namespace/name`) naming it: the claim counts them.
    services: SetMap<String>,
    /// Claims whose class is not resolved: woken by class changes.
    unresolved: BTreeSet<String>,
    /// Free addresses a worker is binding: address → (pool, claim key, since).
    reserved: HashMap<String, (Pool, String, Instant)>,
    reserved_count: HashMap<Pool, usize>,
}

/// See the module documentation.
#[derive(Default)]
pub struct Index {
    inner: Mutex<Inner>,
}

/// Keys to pass after a change.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Wake {
    pub claims: Vec<String>,
    pub addresses: Vec<String>,
}

fn pool_of_free(a: &IPAddress) -> Option<Pool> {
    let f = a.family()?;
    is_free(a, &a.spec.class_name, f).then(|| (a.spec.class_name.clone(), f))
}

/// The pools a claim waits in: it is Pending with a resolved class, not pinned, not being
/// deleted; one pool per family its status does not list yet.
fn waiting_pools(c: &IPAddressClaim) -> Vec<Pool> {
    let Some(status) = c.status.as_ref() else {
        return Vec::new();
    };
    let Some(class) = status.class_name.as_deref().filter(|n| !n.is_empty()) else {
        return Vec::new();
    };
    if c.is_deleting()
        || pin_of(c).is_some()
        || status.phase != Some(ClaimPhase::Pending)
        || c.is_refused_entitlement()
    {
        // A claim refused for an entitlement waits for its namespace, class, quota or
        // usage to change (the quota book wakes it), not for free addresses.
        return Vec::new();
    }
    c.unlisted_families()
        .into_iter()
        .map(|f| (class.to_string(), f))
        .collect()
}

fn unresolved(c: &IPAddressClaim) -> bool {
    !c.is_deleting()
        && c.status
            .as_ref()
            .and_then(|s| s.class_name.as_deref())
            .is_none_or(str::is_empty)
}

fn key_of_claim(c: &IPAddressClaim) -> String {
    format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any())
}

impl Index {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in an address change; returns the claims to pass (those it names before and
    /// after, those pinned to it, and — when it became free — the claims the pump wakes).
    pub fn address_changed(&self, old: Option<&IPAddress>, new: Option<&IPAddress>) -> Wake {
        let mut wake = Wake::default();
        let name = new.or(old).map(|a| a.name_any()).unwrap_or_default();
        let mut s = self.lock();
        // By claim.
        let old_ref = old
            .and_then(|a| a.spec.claim_ref.as_ref())
            .map(ClaimRef::key);
        let new_ref = new
            .and_then(|a| a.spec.claim_ref.as_ref())
            .map(ClaimRef::key);
        wake.claims
            .extend(old_ref.iter().chain(new_ref.iter()).cloned());
        s.by_claim.moved(&name, old_ref, new_ref);
        // Free.
        let new_pool = new.and_then(pool_of_free);
        let old_pool = s.free_of.get(&name).cloned();
        if old_pool != new_pool {
            if let Some(p) = &old_pool {
                s.free.get_mut(p).map(|set| set.remove(&name));
                s.free_of.remove(&name);
            }
            if let Some(p) = &new_pool {
                s.free.entry(p.clone()).or_default().insert(name.clone());
                s.free_of.insert(name.clone(), p.clone());
            }
        }
        // A reservation ends once the cache shows the address taken (or gone).
        if new_pool.is_none() {
            Self::unreserve_locked(&mut s, &name);
        }
        // Released per class.
        let released = new.filter(|a| a.is_released());
        if let Some(class) = s.released_of.remove(&name) {
            s.released.remove(&class, &name);
        }
        if let Some(a) = released {
            s.released.insert(a.spec.class_name.clone(), &name);
            s.released_of
                .insert(name.clone(), a.spec.class_name.clone());
        }
        // Pinned claims follow their address.
        if let Some(pins) = s.pinned.get(&name) {
            wake.claims.extend(pins.iter().cloned());
        }
        if let Some(p) = new_pool
            && old_pool.is_none()
        {
            wake.claims.extend(Self::pump_locked(&mut s, &p));
        }
        wake.claims.sort();
        wake.claims.dedup();
        wake
    }

    /// Takes in a claim change; returns the claims the pump wakes and the addresses to pass
    /// (those naming the claim, when what they depend on changed).
    pub fn claim_changed(
        &self,
        old: Option<&IPAddressClaim>,
        new: Option<&IPAddressClaim>,
    ) -> Wake {
        let mut wake = Wake::default();
        let Some(key) = new.or(old).map(key_of_claim) else {
            return wake;
        };
        let mut s = self.lock();
        // Waiting.
        let before: Vec<Pool> = s
            .waiting_of
            .get(&key)
            .map(|v| v.iter().map(|(p, _)| p.clone()).collect())
            .unwrap_or_default();
        let after: Vec<Pool> = new.map(waiting_pools).unwrap_or_default();
        if before != after {
            for (p, entry) in s.waiting_of.remove(&key).unwrap_or_default() {
                if let Some(set) = s.waiting.get_mut(&p) {
                    set.remove(&entry);
                }
            }
            if let Some(c) = new
                && !after.is_empty()
            {
                let since = c
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default();
                let entries: Vec<(Pool, Place)> = after
                    .iter()
                    .map(|p| (p.clone(), (since.clone(), key.clone())))
                    .collect();
                for (p, e) in &entries {
                    s.waiting.entry(p.clone()).or_default().insert(e.clone());
                }
                s.waiting_of.insert(key.clone(), entries);
            }
            // No longer waiting in a pool: no longer woken there.
            for p in before.iter().filter(|p| !after.contains(p)) {
                Self::unwake_locked(&mut s, &key, p);
            }
            for p in &after {
                wake.claims.extend(Self::pump_locked(&mut s, p));
            }
            for p in &before {
                wake.claims.extend(Self::pump_locked(&mut s, p));
            }
        }
        // Pinned.
        let pin = new.and_then(pin_of).map(str::to_string);
        if s.pinned_of.get(&key) != pin.as_ref() {
            if let Some(old_pin) = s.pinned_of.remove(&key) {
                s.pinned.remove(&old_pin, &key);
            }
            if let Some(p) = pin {
                s.pinned.insert(p.clone(), &key);
                s.pinned_of.insert(key.clone(), p);
            }
        }
        // Unresolved.
        if new.is_some_and(unresolved) {
            s.unresolved.insert(key.clone());
        } else {
            s.unresolved.remove(&key);
        }
        // The addresses naming the claim depend on its existence, uid, deletion and the
        // addresses it lists (§5.6, §5.7).
        let relevant = match (old, new) {
            (Some(o), Some(n)) => {
                o.metadata.uid != n.metadata.uid
                    || o.metadata.deletion_timestamp != n.metadata.deletion_timestamp
                    || o.status.as_ref().map(|s| &s.addresses)
                        != n.status.as_ref().map(|s| &s.addresses)
            }
            _ => true,
        };
        if relevant && let Some(set) = s.by_claim.get(&key) {
            wake.addresses.extend(set.iter().cloned());
        }
        wake.claims.sort();
        wake.claims.dedup();
        wake
    }

    /// A claim's pass ended: it is no longer woken; returns the claims to wake instead.
    pub fn pass_done(&self, claim: &str) -> Vec<String> {
        let mut s = self.lock();
        let pools: Vec<Pool> = s
            .woken_of
            .remove(claim)
            .map(|p| p.into_iter().collect())
            .unwrap_or_default();
        let mut out = Vec::new();
        for p in pools {
            if let Some(set) = s.woken.get_mut(&p) {
                set.remove(claim);
            }
            out.extend(Self::pump_locked(&mut s, &p));
        }
        out
    }

    fn unwake_locked(s: &mut Inner, claim: &str, p: &Pool) {
        if let Some(set) = s.woken.get_mut(p) {
            set.remove(claim);
        }
        if let Some(set) = s.woken_of.get_mut(claim) {
            set.remove(p);
        }
    }

    /// Tops the woken claims of `p` up to min(free − reserved, waiting); returns the newly
    /// woken, oldest first.
    fn pump_locked(s: &mut Inner, p: &Pool) -> Vec<String> {
        let free = s
            .free
            .get(p)
            .map_or(0, BTreeSet::len)
            .saturating_sub(s.reserved_count.get(p).copied().unwrap_or(0));
        let Some(waiting) = s.waiting.get(p) else {
            return Vec::new();
        };
        let want = free.min(waiting.len());
        let woken = s.woken.entry(p.clone()).or_default();
        let mut out = Vec::new();
        if woken.len() >= want {
            return out;
        }
        for (_, k) in waiting {
            if woken.len() >= want {
                break;
            }
            if woken.insert(k.clone()) {
                out.push(k.clone());
            }
        }
        for k in &out {
            s.woken_of.entry(k.clone()).or_default().insert(p.clone());
        }
        out
    }

    /// The lowest-named free address of `p` that nobody is binding and `skip` does not
    /// refuse (the reconciler's view of its own recent writes).
    pub fn candidate(&self, p: &Pool, skip: impl Fn(&str) -> bool) -> Option<String> {
        let s = self.lock();
        s.free
            .get(p)?
            .iter()
            .find(|n| !s.reserved.contains_key(*n) && !skip(n))
            .cloned()
    }

    /// Reserves a free address for `claim` while it binds it; false when another claim
    /// holds the reservation.
    pub fn reserve(&self, address: &str, p: &Pool, claim: &str) -> bool {
        let mut s = self.lock();
        match s.reserved.get(address) {
            Some((_, c, at)) if c != claim && at.elapsed() < RESERVATION_TTL => false,
            Some(_) => true,
            None => {
                s.reserved.insert(
                    address.to_string(),
                    (p.clone(), claim.to_string(), Instant::now()),
                );
                *s.reserved_count.entry(p.clone()).or_default() += 1;
                true
            }
        }
    }

    /// Whether a claim other than `claim` is binding `address` now.
    pub fn reserved_by_other(&self, address: &str, claim: &str) -> bool {
        self.lock()
            .reserved
            .get(address)
            .is_some_and(|(_, c, at)| c != claim && at.elapsed() < RESERVATION_TTL)
    }

    /// Drops a reservation (the bind failed; or the cache shows the outcome).
    pub fn unreserve(&self, address: &str) -> Vec<String> {
        let mut s = self.lock();
        match Self::unreserve_locked(&mut s, address) {
            Some(p) => Self::pump_locked(&mut s, &p),
            None => Vec::new(),
        }
    }

    fn unreserve_locked(s: &mut Inner, address: &str) -> Option<Pool> {
        let (p, _, _) = s.reserved.remove(address)?;
        if let Some(n) = s.reserved_count.get_mut(&p) {
            *n = n.saturating_sub(1);
        }
        Some(p)
    }

    /// Names of the addresses whose claimRef names `claim` (`namespace/name`).
    pub fn addresses_naming(&self, claim: &str) -> Vec<String> {
        self.lock().by_claim.names(claim)
    }

    /// The Services (`namespace/name`) naming a claim.
    pub fn services_naming(&self, claim: &str) -> Vec<String> {
        self.lock().services.names(claim)
    }

    /// A Service changed: the claims whose count of Services it may change — the claim it
    /// named and the one it names, when it changed claims, appeared, went, or its
    /// `AddressAttached` condition changed (not on every status write of a load balancer).
    pub fn service_changed(&self, old: Option<&Service>, new: Option<&Service>) -> Vec<String> {
        let Some(key) = new.or(old).map(key_of) else {
            return Vec::new();
        };
        let (was, is) = (old.and_then(claim_key), new.and_then(claim_key));
        self.lock().services.moved(&key, was.clone(), is.clone());
        if was == is && old.map(attached) == new.map(attached) {
            return Vec::new();
        }
        let mut wake: Vec<String> = was.into_iter().chain(is).collect();
        wake.dedup();
        wake
    }

    /// Claims a class change may concern: those waiting in its pools and those whose class
    /// is unresolved (a default may have appeared or gone).
    pub fn claims_for_class(&self, class: &str) -> Vec<String> {
        let s = self.lock();
        let mut out: BTreeSet<String> = s.unresolved.iter().cloned().collect();
        for (p, set) in &s.waiting {
            if p.0 == class {
                out.extend(set.iter().map(|(_, k)| k.clone()));
            }
        }
        out.into_iter().collect()
    }

    /// Released addresses of a class (a changed release delay concerns them).
    pub fn released_in(&self, class: &str) -> Vec<String> {
        self.lock().released.names(class)
    }

    /// Numbers for tests and metrics: (free, waiting, woken) of a pool.
    pub fn pool_counts(&self, p: &Pool) -> (usize, usize, usize) {
        let s = self.lock();
        (
            s.free.get(p).map_or(0, BTreeSet::len),
            s.waiting.get(p).map_or(0, BTreeSet::len),
            s.woken.get(p).map_or(0, HashSet::len),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn addr(name: &str, ip: &str, extra: serde_json::Value) -> IPAddress {
        let mut v = json!({"metadata": {"name": name}, "spec": {"address": ip, "className": "pub", "source": {"fromClass": {}}},
            "status": {"phase": "Available"}});
        crate::decide::tests::merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn waiting(name: &str, created: &str) -> IPAddressClaim {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "t", "creationTimestamp": created},
            "spec": {}, "status": {"phase": "Pending", "className": "pub"}}),
        )
        .unwrap()
    }

    fn v4() -> Pool {
        ("pub".into(), Family::IPv4)
    }

    #[test]
    fn a_free_address_wakes_one_waiting_claim_the_oldest() {
        let ix = Index::default();
        for (n, t) in [
            ("c", "2026-01-01T00:00:03Z"),
            ("a", "2026-01-01T00:00:01Z"),
            ("b", "2026-01-01T00:00:02Z"),
        ] {
            let w = ix.claim_changed(None, Some(&waiting(n, t)));
            assert!(w.claims.is_empty(), "no free address: nobody is woken");
        }
        let w = ix.address_changed(None, Some(&addr("x1", "192.0.2.1", json!({}))));
        assert_eq!(
            w.claims,
            ["t/a"],
            "one free address wakes exactly one claim"
        );
        let w = ix.address_changed(None, Some(&addr("x2", "192.0.2.2", json!({}))));
        assert_eq!(w.claims, ["t/b"]);
        assert_eq!(ix.pool_counts(&v4()), (2, 3, 2));
        // An IPv6 address or another class wakes nobody here.
        let w = ix.address_changed(None, Some(&addr("y", "2001:db8::1", json!({}))));
        assert!(w.claims.is_empty());
        let w = ix.address_changed(
            None,
            Some(&addr(
                "z",
                "192.0.2.9",
                json!({"spec": {"className": "other"}}),
            )),
        );
        assert!(w.claims.is_empty());
    }

    /// The liveness argument, played out: claims and free addresses arrive in any order;
    /// every pass binds the lowest free address nobody reserved, or ends empty-handed. Every
    /// claim gets an address as long as addresses last, and no free address is left while a
    /// claim waits.
    #[test]
    fn every_waiting_claim_is_served_while_free_addresses_last() {
        let ix = Index::default();
        let mut queue: std::collections::VecDeque<String> = Default::default();
        let mut claims: HashMap<String, IPAddressClaim> = HashMap::new();
        let mut addresses: HashMap<String, IPAddress> = HashMap::new();
        let mut passes = 0;
        // 40 claims and 30 addresses, interleaved.
        for i in 0..40 {
            let c = waiting(&format!("c{i:02}"), &format!("2026-01-01T00:00:{i:02}Z"));
            queue.extend(ix.claim_changed(None, Some(&c)).claims);
            claims.insert(format!("t/c{i:02}"), c);
            if i % 4 != 3 {
                let a = addr(&format!("a{i:02}"), &format!("192.0.2.{i}"), json!({}));
                queue.extend(ix.address_changed(None, Some(&a)).claims);
                addresses.insert(a.name_any(), a);
            }
        }
        while let Some(k) = queue.pop_front() {
            passes += 1;
            assert!(passes < 1000, "no livelock");
            let c = claims[&k].clone();
            if c.status.as_ref().unwrap().phase == Some(ClaimPhase::Pending)
                && let Some(a) = ix.candidate(&v4(), |_| false)
            {
                assert!(ix.reserve(&a, &v4(), &k));
                // The bind lands: the address is taken, the claim is Bound.
                let old = addresses[&a].clone();
                let mut new = old.clone();
                new.spec.claim_ref = Some(address_controller_api::ClaimRef {
                    namespace: "t".into(),
                    name: c.name_any(),
                    uid: None,
                });
                new.status.as_mut().unwrap().phase =
                    Some(address_controller_api::AddressPhase::Bound);
                queue.extend(
                    ix.address_changed(Some(&old), Some(&new))
                        .claims
                        .into_iter()
                        .filter(|x| *x != k),
                );
                addresses.insert(a.clone(), new);
                let mut bound = c.clone();
                let st = bound.status.as_mut().unwrap();
                st.phase = Some(ClaimPhase::Bound);
                st.addresses = vec![address_controller_api::ClaimAddress {
                    name: a.clone(),
                    address: addresses[&a].spec.address.clone(),
                }];
                queue.extend(ix.claim_changed(Some(&c), Some(&bound)).claims);
                claims.insert(k.clone(), bound);
            }
            queue.extend(ix.pass_done(&k));
        }
        let bound = claims
            .values()
            .filter(|c| c.status.as_ref().unwrap().phase == Some(ClaimPhase::Bound))
            .count();
        assert_eq!(bound, 30, "every free address was handed out");
        assert_eq!(ix.pool_counts(&v4()).0, 0, "no free address left");
        // The oldest claims were served first.
        let unserved: BTreeSet<String> = claims
            .iter()
            .filter(|(_, c)| c.status.as_ref().unwrap().phase == Some(ClaimPhase::Pending))
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(unserved.len(), 10);
        assert!(
            passes <= 80,
            "about one pass per claim, not one per claim per address: {passes}"
        );
    }

    #[test]
    fn reservations_hide_a_candidate_and_end_when_the_cache_shows_it_taken() {
        let ix = Index::default();
        let a = addr("x1", "192.0.2.1", json!({}));
        ix.address_changed(None, Some(&a));
        assert_eq!(ix.candidate(&v4(), |_| false).as_deref(), Some("x1"));
        assert!(ix.reserve("x1", &v4(), "t/a"));
        assert!(!ix.reserve("x1", &v4(), "t/b"));
        assert!(ix.reserved_by_other("x1", "t/b"));
        assert_eq!(ix.candidate(&v4(), |_| false), None);
        let mut taken = a.clone();
        taken.spec.claim_ref = Some(address_controller_api::ClaimRef {
            namespace: "t".into(),
            name: "a".into(),
            uid: None,
        });
        ix.address_changed(Some(&a), Some(&taken));
        assert!(!ix.reserved_by_other("x1", "t/b"), "reservation ended");
        assert_eq!(ix.addresses_naming("t/a"), ["x1"]);
    }
}
