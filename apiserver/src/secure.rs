//! Secure serving shared by every binary of the project: the serving certificate and the
//! delegated authentication (front-proxy certificates, TokenReview) and authorization
//! (SubjectAccessReview) with their bounded caches — and the HTTPS `/metrics` endpoint
//! built on them. The core serves its views and `/metrics` with it; a driver built on the
//! kit its `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;

use address_controller_runtime::supervise::{Shutdown, Tasks};
use anyhow::Context as _;
use kube::Client;
use prometheus::Registry;

use crate::authn::Authenticator;
use crate::authz::Authorizer;
use crate::metrics::AuthCaches;
use crate::tls::{self, ServingCert};

/// The certificate and the delegated auth of a process.
pub struct SecureServing {
    pub config: Arc<rustls::ServerConfig>,
    pub authn: Arc<Authenticator>,
    pub authz: Arc<Authorizer>,
}

impl SecureServing {
    /// The serving certificate (`cert`, or a self-signed one for localhost), the auth caches
    /// (at most `cache_size` entries each, exported on `registry`) and their upkeep task;
    /// with `front_proxy`, also the watch of kube-system/extension-apiserver-authentication
    /// that makes front-proxy client certificates count (an aggregated API server needs it;
    /// `/metrics` alone takes bearer tokens).
    pub fn start(
        client: &Client,
        cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
        cache_size: u64,
        registry: &Registry,
        front_proxy: bool,
        tasks: &mut Tasks,
    ) -> anyhow::Result<SecureServing> {
        let cert = match cert {
            Some((cert, key)) => ServingCert::Files { cert, key },
            None => ServingCert::SelfSigned(vec!["localhost".into()]),
        };
        let config = tls::server_config(cert)?;
        let authn = Authenticator::new(client.clone(), cache_size);
        let authz = Arc::new(Authorizer::new(client.clone(), cache_size));
        registry.register(Box::new(AuthCaches::new(authn.clone(), authz.clone())?))?;
        if front_proxy {
            tasks.spawn_forever("front-proxy settings watch", authn.clone().watch_config());
        }
        tasks.spawn_forever(
            "auth cache upkeep",
            crate::auth_upkeep(authn.clone(), authz.clone()),
        );
        Ok(SecureServing {
            config,
            authn,
            authz,
        })
    }

    /// Serves `/metrics` (rendered by `render`) over HTTPS on `addr` to principals allowed
    /// to `get` the non-resource path `/metrics`, as a supervised task.
    pub fn spawn_metrics(
        &self,
        addr: &str,
        render: Arc<dyn Fn() -> String + Send + Sync>,
        shutdown: &Shutdown,
        tasks: &mut Tasks,
    ) -> anyhow::Result<()> {
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("metrics address {addr:?}"))?;
        let app = crate::metrics_router(self.authn.clone(), self.authz.clone(), render);
        let serve = crate::serve_tls(addr, self.config.clone(), app, shutdown.wait());
        tasks.spawn("metrics server", async move {
            serve.await.context("metrics server")
        });
        Ok(())
    }
}
