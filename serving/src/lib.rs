//! Secure serving for every binary of the project — the generic half of an API server,
//! after k8s.io/apiserver's: TLS with certificate rotation ([`tls`]), delegated
//! authentication ([`authn`]: front-proxy certificates, TokenReview) and authorization
//! ([`authz`]: SubjectAccessReview), bounded caches and what the network may have
//! ([`limits`]; who holds a server's connections, [`connections`]; the memory of request
//! heads in flight, [`budget`] and [`head_bytes`]; what they hold and refused, as metrics,
//! [`metrics`]), the servers' accept loop ([`listener`]) and
//! the plain probe port ([`probes`]), what a request asks for ([`request`]), the front door's layers
//! ([`front`]), `metav1.Status` errors ([`status`]), content negotiation ([`negotiate`]),
//! the serving flags and the HTTPS `/metrics` endpoint ([`secure`]).
//!
//! Nothing here knows an API group: the group of a request comes from its path. The core's
//! views (`address-controller-apiserver`) are built on it; a driver built on the kit uses
//! it for its `/metrics` and depends on nothing else of the views.

pub mod authn;
pub mod authz;
pub mod budget;
pub mod connections;
pub mod front;
pub mod head_bytes;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod negotiate;
pub mod probes;
pub mod request;
pub mod secure;
pub mod status;
pub mod tls;
