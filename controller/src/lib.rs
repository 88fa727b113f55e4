//! The core binder (SPEC §3–§7, §10): pure decisions in [`decide`], the reconcilers that
//! apply them in [`reconcile`], the indexes that keep each pass independent of the number
//! of objects in [`index`], the wiring of caches, indexes, queues and workers in [`run`],
//! and the ledger metrics in [`metrics`]. The runtime underneath (caches, queues, leader
//! election, events) is `address-controller-runtime`, shared with every driver.

pub mod context;
pub mod decide;
pub mod error;
pub mod index;
pub mod metrics;
pub mod quota;
pub mod rbac;
pub mod recent;
pub mod reconcile;
pub mod run;
