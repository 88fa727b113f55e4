//! Pure decisions: a snapshot goes in, a plan of patches and events comes out. Nothing here
//! performs I/O; the reconcilers gather snapshots and apply plans. The modules follow the
//! SPEC: [`claim`] (§4, §6), [`address`] (§5), [`holdings`] (§4.3, §5.7: which addresses a
//! claim keeps), [`release_delay`] (§5.8), [`autoclaim`] (§7).

pub mod address;
pub mod autoclaim;
pub mod claim;
pub mod holdings;
pub mod release_delay;

use address_controller_api::IPAddress;
use address_controller_api::family::Family;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub use address_controller_api::conditions::set_condition;
pub use address_controller_runtime::events::PlannedEvent;

pub use address_controller_api::names::{with_finalizer, without_finalizer};

/// Whether `a` is free for class `class` and family `f` (SPEC §4.7): free
/// ([`IPAddress::is_free`]) and of that class and family. The index of free addresses uses
/// exactly this.
pub fn is_free(a: &IPAddress, class: &str, f: Family) -> bool {
    a.is_free() && a.spec.class_name == class && a.family() == Some(f)
}

/// A point in time, for plans that stamp or compare timestamps.
pub type Now = Time;

#[cfg(test)]
pub(crate) mod tests;
