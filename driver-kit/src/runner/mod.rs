//! The runner: the driver protocol of SPEC §8 around a [`Driver`].
//!
//! * **Which claims.** Stamped with this provisioner, of a class whose provisioner it is,
//!   `Pending` with the core's `WaitingForProvisioning`, not pinned, not being deleted. Per
//!   family, only when neither the claim's status nor any address naming the claim (in the
//!   cache, or created by this process and not in the cache yet) has that family — a driver
//!   never creates a second address for a family (SPEC §5.7).
//! * **Creating.** One IPAddress per missing family, named by the allocation (by default
//!   after the address, so the create is the lock), `claimRef` pre-set with the claim's uid,
//!   `className`, `reclaimPolicy` copied from the class, the allocation's `source`, and the
//!   driver's finalizer if it has one. A `Dual` claim gets both families or neither. A name
//!   collision with an address already made for this claim (a restart) is success; with
//!   another, the address is taken: allocate again.
//! * **Classes.** `status.capacity`, and the conditions `ParametersValid` and `Exhausted`.
//!   Bad parameters: a Warning on the class once, `InvalidClassParameters` on its claims.
//! * **Teardown.** With a finalizer, an address being deleted is released in the backend,
//!   then the finalizer goes.
//!
//! One module per pass: [`claim`] (a plan — `wanted`, the class's parameters, the driver's
//! allocations — then its application), [`class`], [`address`], [`service`] (association:
//! it applies `decide::service`), [`health`] (an address's holders and spans: it applies
//! `decide::health`), and [`ledger`], the ledger's reads and writes the last two share. This
//! module holds what they all share: the context and the errors.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use address_controller_api::names::PROVISIONER_ANNOTATION;
use address_controller_api::{Family, IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_runtime::events::Events;
use address_controller_runtime::queue::{Backoff, Queue};
use address_controller_runtime::workers::{Gate, PassError, Retry};
use address_controller_runtime::world::World;
use kube::{Client, ResourceExt};

use crate::driver::Driver;
use crate::inventory::Inventory;
use crate::services::ServiceIndex;

mod address;
mod claim;
mod class;
pub(crate) mod health;
pub(crate) mod ledger;
pub(crate) mod service;
#[cfg(test)]
mod tests;

pub(crate) use address::address_pass;
pub(crate) use claim::claim_pass;
pub(crate) use class::class_pass;

/// Event reasons and class conditions the runner publishes (SPEC §8).
pub use address_controller_api::names::driver as events;

/// How long an address this process created is assumed to be on its way into the cache.
const IN_FLIGHT_FOR: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} is taken; allocating again")]
    Taken(String),
    #[error("allocating for {claim}: {message}")]
    Allocate { claim: String, message: String },
    #[error("the backend on {object}: {message}")]
    Backend { object: String, message: String },
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        source: kube::Error,
    },
}

impl PassError for Error {
    fn retry(&self) -> Retry {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 404 => Retry::Never,
            _ => Retry::Backoff,
        }
    }
    fn category(&self) -> &'static str {
        match self {
            Error::Taken(_) => "conflict",
            Error::Allocate { .. } => "allocate",
            Error::Backend { .. } => "backend",
            Error::Kube { .. } => "api",
        }
    }
}

type Params<D> = Result<Arc<<D as Driver>::Params>, String>;
/// Parsed parameters of every class of the driver, by class name.
type AllParams<D> = Arc<HashMap<String, Params<D>>>;

pub(crate) struct Queues {
    pub claims: Arc<Queue<String>>,
    pub classes: Arc<Queue<String>>,
    pub addresses: Arc<Queue<String>>,
    pub services: Arc<Queue<String>>,
}

pub(crate) struct Ctx<D: Driver> {
    pub driver: D,
    pub client: Client,
    pub world: World,
    pub inventory: Inventory,
    pub services: ServiceIndex,
    /// The Service annotation that records the kit's pins ([`names::driver::pinned_annotation`]).
    pub marker: String,
    pub gate: Gate,
    pub events: Events,
    pub queues: Queues,
    /// Parsed parameters of this driver's classes; `None` after a class changed.
    params: Mutex<Option<AllParams<D>>>,
    /// (claim uid, family) → when this process created an address for it.
    in_flight: Mutex<HashMap<(String, Family), Instant>>,
    /// Addresses this process is creating (or lost a create race for) right now.
    in_flight_ips: Mutex<HashMap<IpAddr, Instant>>,
    /// Testing only: pause between deciding to create and creating, to let tests race a
    /// free address against the create.
    pub create_delay: Option<Duration>,
    /// Paces the writes that only move an older version's spans to records.
    pub moves: address_controller_runtime::records::Pacer,
    /// Service (`namespace/name`) → since when this process has seen more than one workload
    /// behind it (the hold-down counts from there); only Services that have them now.
    multiple: Mutex<HashMap<String, Instant>>,
}

fn fresh<K: std::hash::Hash + Eq + Clone>(
    m: &Mutex<HashMap<K, Instant>>,
) -> std::sync::MutexGuard<'_, HashMap<K, Instant>> {
    let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
    g.retain(|_, at| at.elapsed() < IN_FLIGHT_FOR);
    g
}

impl<D: Driver> Ctx<D> {
    pub fn new(
        driver: D,
        client: Client,
        world: World,
        gate: Gate,
        controller: &str,
        instance: String,
    ) -> Self {
        Ctx {
            events: Events::new(client.clone(), controller, instance),
            driver,
            client,
            world,
            inventory: Inventory::default(),
            services: ServiceIndex::default(),
            marker: address_controller_api::names::driver::pinned_annotation(controller),
            gate,
            queues: Queues {
                claims: Arc::new(Queue::new(Backoff::default())),
                classes: Arc::new(Queue::new(Backoff::default())),
                addresses: Arc::new(Queue::new(Backoff::default())),
                services: Arc::new(Queue::new(Backoff::default())),
            },
            params: Mutex::new(None),
            in_flight: Mutex::new(HashMap::new()),
            in_flight_ips: Mutex::new(HashMap::new()),
            create_delay: None,
            moves: address_controller_runtime::records::Pacer::new(5.0),
            multiple: Mutex::new(HashMap::new()),
        }
    }

    /// How long more than one workload has been behind Service `key`, by this process's
    /// clock: counted from the first pass that saw them; forgotten when they are not.
    pub fn multiple_since(
        &self,
        key: &str,
        backends: Option<&address_controller_api::kubevirt::Backends>,
    ) -> Option<Duration> {
        let mut m = self.multiple.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(
            backends,
            Some(address_controller_api::kubevirt::Backends::Many(_))
        ) {
            Some(
                m.entry(key.to_string())
                    .or_insert_with(Instant::now)
                    .elapsed(),
            )
        } else {
            m.remove(key);
            None
        }
    }

    pub fn ours(&self, class: &IPAddressClass) -> bool {
        class.spec.provisioner == self.driver.provisioner()
    }

    /// Whether an address is of one of this driver's classes (ownership is by the
    /// address's class, never by a claim's stamp).
    pub fn owns(&self, a: &IPAddress) -> bool {
        self.world
            .classes
            .get(&a.spec.class_name)
            .is_some_and(|c| self.ours(&c))
    }

    /// This driver's classes, by name.
    pub fn our_classes(&self) -> Vec<Arc<IPAddressClass>> {
        let mut v: Vec<_> = self
            .world
            .classes()
            .into_iter()
            .filter(|c| self.ours(c))
            .collect();
        v.sort_by_key(|c| c.name_any());
        v
    }

    /// The parsed parameters of class `name`, if it is one of ours.
    pub fn params(&self, name: &str) -> Option<Params<D>> {
        let mut cache = self.params.lock().unwrap_or_else(PoisonError::into_inner);
        let all = match &*cache {
            Some(all) => all.clone(),
            None => {
                let classes = self.our_classes();
                let parsed = self.driver.parameters(&classes);
                let all: AllParams<D> = Arc::new(
                    classes
                        .iter()
                        .zip(parsed)
                        .map(|(c, p)| (c.name_any(), p.map(Arc::new)))
                        .collect(),
                );
                *cache = Some(all.clone());
                all
            }
        };
        all.get(name).cloned()
    }

    /// The cache shows `a`: what this process created for it is no longer in flight.
    pub fn landed(&self, a: &IPAddress) {
        if let Some(ip) = a.ip() {
            fresh(&self.in_flight_ips).remove(&ip);
            let family = address_controller_api::family::family_of_ip(ip);
            if let Some(uid) = a.spec.claim_ref.as_ref().and_then(|r| r.uid.clone()) {
                fresh(&self.in_flight).remove(&(uid, family));
            }
        }
    }

    pub fn classes_changed(&self) {
        *self.params.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Whether a claim is stamped with this driver's provisioner.
    pub fn stamped(&self, c: &IPAddressClaim) -> bool {
        c.annotations()
            .get(PROVISIONER_ANNOTATION)
            .map(String::as_str)
            == Some(self.driver.provisioner())
    }
}

#[cfg(test)]
mod retry_tests {
    use super::Error;
    use address_controller_runtime::workers::{PassError, Retry};

    fn api(code: u16) -> Error {
        let status = kube::core::Status::failure("", "").with_code(code);
        Error::Kube {
            action: "creating",
            object: "x".into(),
            source: kube::Error::Api(Box::new(status)),
        }
    }

    /// The driver's create of an address in kube-apiserver's admission window (#56: 503
    /// "Resource kind … not found" after each start) is retried with backoff; a gone object
    /// is not.
    #[test]
    fn the_admission_windows_503_is_retried_and_a_gone_object_is_not() {
        for code in [503, 500, 429, 409] {
            assert!(matches!(api(code).retry(), Retry::Backoff), "{code}");
        }
        assert!(matches!(api(404).retry(), Retry::Never));
    }
}
