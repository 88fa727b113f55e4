//! The `local.sdn.cozystack.io/v1alpha1` API: the three kinds, the well-known names the
//! controller, drivers and tenants agree on, and the pure IP rules. No I/O lives here.

pub mod conditions;
pub mod duration;
pub mod entitlement;
pub mod family;
pub mod history;
pub mod kubevirt;
pub mod manifests;
pub mod names;
pub mod ranges;
mod rules;
pub mod selector;
pub mod service;
pub mod sharing;
pub mod v1alpha1;
pub mod validation;

pub use family::Family;
pub use rules::Marked;
pub use v1alpha1::*;
