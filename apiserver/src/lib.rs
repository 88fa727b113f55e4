//! The aggregated API server for `view.local.sdn.cozystack.io/v1alpha1` (SPEC §9): read-only
//! views materialized from the controller's in-memory caches ([`store`]), served over TLS
//! behind kube-apiserver's aggregation layer with delegated authentication and
//! authorization, answering as kube-apiserver answers for a custom resource of the same
//! shape (list options, selectors, paging, watch, content negotiation, errors).
//!
//! The generic half — TLS, delegated authentication and authorization, limits, what a
//! request asks for, Status errors, negotiation — is the
//! [`serving`](address_controller_serving) crate, shared with the drivers. Here, one module
//! per concern of the views: [`layers`] (the views' request metrics and readiness on
//! serving's front door), [`list_options`], [`selector`], [`render`], [`serve`]
//! (list/get/subresources), [`watch`], [`store`] (materialized views and their change
//! history), [`resources`] (one module per view), [`discovery`] (and the OpenAPI documents'
//! handlers), [`openapi`], [`metrics`], [`group`], [`state`]. This file only assembles
//! the router and spawns the server.

pub mod discovery;
pub mod group;
pub mod layers;
pub mod list_options;
pub mod metrics;
pub mod openapi;
pub mod render;
pub mod resources;
pub mod selector;
pub mod serve;
pub mod state;
pub mod store;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use address_controller_runtime::supervise::{Shutdown, Tasks};
use address_controller_runtime::world::World;
use address_controller_serving::front as door;
use address_controller_serving::secure;
use axum::Router;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::any;
use tower::ServiceExt;

pub use crate::group::{API_VERSION, GROUP, VERSION};
pub use crate::state::State;

/// The router. Requests carry the TLS peer's certificates as a
/// [`PeerCerts`](address_controller_serving::authn::PeerCerts) extension. Probes answer
/// anonymously; everything else passes the [`front`](address_controller_serving::front) layers.
pub fn router(state: Arc<State>, access: door::Access) -> Router {
    let api = Router::new()
        .route("/apis", any(discovery::apis))
        .route("/apis/{group}", any(discovery::group))
        .route("/apis/{group}/{version}", any(discovery::group_version))
        .route("/openapi/v2", any(discovery::openapi_v2))
        .route("/openapi/v3", any(discovery::openapi_v3_index))
        .route(
            "/openapi/v3/apis/{group}/{version}",
            any(discovery::openapi_v3),
        )
        // Every resource path (and any other): the target is read from the description.
        .fallback(serve::resource)
        .layer(from_fn_with_state(access.clone(), door::authenticate))
        .layer(from_fn_with_state(access, door::admit))
        .layer(from_fn(door::yaml_errors))
        .layer(from_fn_with_state(state.clone(), layers::metered))
        .layer(from_fn(door::describe));
    let app = Router::new()
        .route("/healthz", any(door::alive))
        .route("/livez", any(door::alive))
        .route("/readyz", any(layers::ready))
        .merge(api)
        .with_state(state);
    Router::new().fallback_service(app.map_request(door::without_trailing_slash))
}

/// How a process serves the views.
pub struct Views {
    /// The HTTPS address.
    pub address: SocketAddr,
    /// Changes kept for watches to resume from.
    pub history: store::HistoryBound,
    /// Testing only: served as `/openapi/v2` instead of the generated document.
    pub openapi_v2: Option<serde_json::Value>,
}

/// Serves the views of `world` as supervised tasks: the store, its readiness check
/// (`views`: not ready before the first build), and the TLS server with `serving`'s
/// certificate and delegated auth, its request metrics on `registry`. Call it before the
/// caches' watches start: the store registers on them and must see their first lists.
pub fn spawn(
    views: Views,
    world: &World,
    serving: &secure::SecureServing,
    registry: &prometheus::Registry,
    shutdown: &Shutdown,
    tasks: &mut Tasks,
) -> anyhow::Result<()> {
    let store = store::ViewStore::new(world.clone(), resources::all(), views.history);
    store.register();
    registry.register(Box::new(metrics::ViewSizes::new(store.clone())?))?;
    tasks.spawn_forever("view store", store.clone().run());
    let built = store.clone();
    world.health.check("views", move || {
        (!built.built()).then(|| "not built yet".to_string())
    });
    let state = Arc::new(State {
        store,
        authn: serving.authn.clone(),
        metrics: metrics::ApiMetrics::new(registry)?,
        openapi: openapi::Served::new(views.openapi_v2),
    });
    let server = secure::Server {
        name: "views",
        task: "aggregated API server",
    };
    let app = router(state, serving.access());
    serving.spawn_server(server, views.address, app, true, shutdown, tasks);
    Ok(())
}

#[cfg(test)]
mod tests;
