//! The core controller (SPEC §3–§6, §10): pure binding decisions in [`decide`], the
//! reconcilers that apply them in [`reconcile`], the shared caches in [`cache`], leader
//! election in [`leader`] and the ledger metrics in [`metrics`].

pub mod cache;
pub mod context;
pub mod decide;
pub mod error;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod rbac;
pub mod recent;
pub mod reconcile;
pub mod run;
