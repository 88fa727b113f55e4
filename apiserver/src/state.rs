//! The server's shared state: what the handlers and the layers read.

use std::sync::Arc;

use crate::metrics::ApiMetrics;
use crate::openapi;
use crate::store::ViewStore;
use address_controller_serving::authn::Authenticator;

/// Shared state of the server.
pub struct State {
    pub store: Arc<ViewStore>,
    pub authn: Arc<Authenticator>,
    pub metrics: ApiMetrics,
    pub openapi: openapi::Served,
}

impl State {
    /// Serving: the views are built from caches that are live, and the front-proxy
    /// settings are loaded.
    pub fn ready(&self) -> bool {
        self.store.built() && self.store.world.health.ready() && self.authn.ready()
    }
}
