//! What the core controller and every driver share (linkerd's `kubert` plays this part
//! there): the Kubernetes client with every call bounded ([`client`]), watched caches with
//! change handlers and health ([`cache`], [`health`]), a work queue and its workers
//! ([`queue`], [`workers`]) and one way to run controllers over them ([`controllers`]), leader election ([`leader`]), events ([`events`]), task
//! supervision and shutdown ([`supervise`]), the frame every
//! binary starts and ends in ([`process`]), logging
//! ([`logging`]) and ClusterRole rendering ([`rbac`]).

pub mod cache;
pub mod client;
pub mod controllers;
pub mod endpoints;
pub mod events;
pub mod flags;
pub mod health;
pub mod leader;
pub mod logging;
pub mod metrics;
#[cfg(feature = "mock-api")]
pub mod mock_api;
pub mod process;
pub mod queue;
pub mod rbac;
pub mod records;
pub mod report;
pub mod setmap;
pub mod supervise;
pub mod workers;
pub mod world;
