//! The kit's passes as pure decisions, as the core's `decide/`: what a pass reads comes in as
//! a snapshot, what it should write comes out as a plan, and [`crate::runner`] reads the
//! snapshot and applies the plan — nothing here reads a cache or writes to the API.
//!
//! * [`class`]: a class's capacity and conditions.
//! * [`address`]: the driver's finalizer and the teardown of an address; else its
//!   [`health`]: `Lost` by the backend's word, `Conflict` by a Service without the ledger's
//!   word, ledger entries of gone Services.
//! * [`service`]: association (SPEC §8) — which Services hold a claim's addresses, the
//!   ledger, the kit's record and the pins, the Service's condition.
//!
//! * [`claim`]: the addresses to create for a claim from the driver's allocations, or why
//!   not (the allocations, async, are read in the snapshot step, `runner::claim::snapshot`).

pub mod address;
pub mod claim;
pub mod class;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod health;
pub mod service;
