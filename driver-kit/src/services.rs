//! What the runner indexes from the Service cache for association (SPEC §8): Services by
//! the claim they name (`namespace/claim`), and by the addresses they show or the kit
//! pinned on them. A pass reads only the Services of one claim or one address.

use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use address_controller_runtime::setmap::SetMap;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::decide::service::parse_marker;

#[derive(Default)]
struct Inner {
    /// `namespace/claim` → Services whose annotation names it.
    by_claim: SetMap<String>,
    /// address → Services that show it or carry the kit's record of it.
    by_ip: SetMap<IpAddr>,
}

/// See the module documentation.
#[derive(Default)]
pub struct ServiceIndex {
    inner: Mutex<Inner>,
}

/// What the index keeps of one Service.
pub struct Entry {
    pub claim: Option<String>,
    pub ips: Vec<IpAddr>,
}

impl Entry {
    /// `shown`: what the backend shows on it; `marker`: the kit's annotation key.
    pub fn of(s: &Service, shown: Vec<IpAddr>, marker: &str) -> Entry {
        let mut ips = shown;
        ips.extend(parse_marker(
            s.annotations().get(marker).map(String::as_str),
        ));
        ips.sort();
        ips.dedup();
        Entry {
            claim: address_controller_api::service::claim_key(s),
            ips,
        }
    }
}

impl ServiceIndex {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in a Service change (its entries before and after).
    pub fn changed(&self, key: &str, old: Option<&Entry>, new: Option<&Entry>) {
        let mut s = self.lock();
        s.by_claim.moved(
            key,
            old.and_then(|e| e.claim.clone()),
            new.and_then(|e| e.claim.clone()),
        );
        for ip in old.iter().flat_map(|e| &e.ips) {
            s.by_ip.remove(ip, key);
        }
        for ip in new.iter().flat_map(|e| &e.ips) {
            s.by_ip.insert(*ip, key);
        }
    }

    /// Services naming the claim `namespace/name`.
    pub fn naming(&self, claim: &str) -> Vec<String> {
        self.lock().by_claim.names(claim)
    }

    /// Services that show `ip` or carry the kit's record of it.
    pub fn mentioning(&self, ip: IpAddr) -> Vec<String> {
        self.lock().by_ip.names(&ip)
    }
}
