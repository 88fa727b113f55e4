//! What the runner indexes from the address and claim caches, so a pass never scans every
//! object: addresses by the claim they name, by IP (in use), by the Service they are
//! associated to, addresses per (class, family), and the claims that found their class
//! exhausted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use address_controller_api::{Family, IPAddress};
use address_controller_runtime::setmap::SetMap;
use kube::ResourceExt;

#[derive(Default)]
struct Inner {
    /// claim `namespace/name` → names of addresses whose claimRef names it.
    by_claim: SetMap<String>,
    /// address → the IPAddress objects carrying it (more than one is an admin's mistake,
    /// still in use).
    by_ip: SetMap<IpAddr>,
    /// Service `namespace/name` → addresses whose ledger lists it as a holder.
    associated: SetMap<String>,
    /// (class, family) → number of addresses.
    per_pool: HashMap<(String, Family), i64>,
    /// class → claims that found it exhausted, retried when one of its addresses goes.
    exhausted: SetMap<String>,
}

#[derive(Default)]
pub struct Inventory {
    inner: Mutex<Inner>,
}

fn claim_key(a: &IPAddress) -> Option<String> {
    a.spec.claim_ref.as_ref().map(|r| r.key())
}

fn ip_and_family(a: &IPAddress) -> Option<(IpAddr, Family)> {
    let ip = a.ip()?;
    Some((ip, address_controller_api::family::family_of_ip(ip)))
}

impl Inventory {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in an address change; returns the claims to pass again (the claims it names,
    /// and — when an address of a class went away — the claims that found it exhausted).
    pub fn address_changed(&self, old: Option<&IPAddress>, new: Option<&IPAddress>) -> Vec<String> {
        let mut s = self.lock();
        let mut wake = Vec::new();
        let name = new.or(old).map(|a| a.name_any()).unwrap_or_default();
        let (old_claim, new_claim) = (old.and_then(claim_key), new.and_then(claim_key));
        wake.extend(old_claim.iter().chain(new_claim.iter()).cloned());
        s.by_claim.moved(&name, old_claim, new_claim);
        for k in old.map(IPAddress::holder_services).unwrap_or_default() {
            s.associated.remove(&k, &name);
        }
        for k in new.map(IPAddress::holder_services).unwrap_or_default() {
            s.associated.insert(k, &name);
        }
        let (old_ip, new_ip) = (old.and_then(ip_and_family), new.and_then(ip_and_family));
        s.by_ip
            .moved(&name, old_ip.map(|(ip, _)| ip), new_ip.map(|(ip, _)| ip));
        // Per pool: what the address counted for before, and after.
        for (a, ipf, delta) in [(old, old_ip, -1), (new, new_ip, 1)] {
            if let (Some(a), Some((_, f))) = (a, ipf) {
                *s.per_pool
                    .entry((a.spec.class_name.clone(), f))
                    .or_default() += delta;
            }
        }
        // An address gone (or moved to another class) may end an exhaustion.
        if let Some(a) = old
            && new.is_none_or(|n| n.spec.class_name != a.spec.class_name)
            && let Some(set) = s.exhausted.take(a.spec.class_name.as_str())
        {
            wake.extend(set);
        }
        wake
    }

    pub fn addresses_naming(&self, claim: &str) -> Vec<String> {
        self.lock().by_claim.names(claim)
    }

    pub fn in_use(&self, ip: IpAddr) -> bool {
        self.lock().by_ip.contains_key(&ip)
    }

    /// The IPAddress objects carrying `ip`.
    pub fn addresses_of(&self, ip: IpAddr) -> Vec<String> {
        self.lock().by_ip.names(&ip)
    }

    /// The addresses whose ledger lists Service `key` as a holder.
    pub fn associated_to(&self, key: &str) -> Vec<String> {
        self.lock().associated.names(key)
    }

    /// Addresses of a class and family.
    pub fn count(&self, class: &str, f: Family) -> i64 {
        self.lock()
            .per_pool
            .get(&(class.to_string(), f))
            .copied()
            .unwrap_or(0)
    }

    /// The classes that addresses name.
    pub fn classes(&self) -> std::collections::BTreeSet<String> {
        self.lock()
            .per_pool
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|((class, _), _)| class.clone())
            .collect()
    }

    /// A claim found `class` exhausted: pass it again when an address of the class goes.
    pub fn exhausted(&self, class: &str, claim: &str) {
        self.lock().exhausted.insert(class.to_string(), claim);
    }
}
