//! The caches of this API's kinds — claims, addresses, classes, and Services where needed —
//! one watch per kind per process, shared by every consumer in it (the core's reconcilers
//! and the aggregated views, or a driver's runner).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use address_controller_api::{
    IPAddress, IPAddressClaim, IPAddressClass, IPAddressQuota, IPAddressRecord,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::{Api, Client};

use crate::cache::{Cache, WatchConfig};
use crate::endpoints::ProxiedEndpoints;
use crate::health::Health;
use crate::supervise::Tasks;

/// The caches entitlements are decided from.
#[derive(Clone)]
pub struct Entitlements {
    pub namespaces: Arc<Cache<Namespace>>,
    pub quotas: Arc<Cache<IPAddressQuota>>,
}

#[derive(Clone)]
pub struct World {
    pub claims: Arc<Cache<IPAddressClaim>>,
    pub addresses: Arc<Cache<IPAddress>>,
    pub classes: Arc<Cache<IPAddressClass>>,
    /// Only where Services are read: the core (auto-claims, the claims' count of Services) and
    /// the drivers (association).
    pub services: Option<Arc<Cache<Service>>>,
    /// Only in the core: the drivers' Leases (labelled
    /// `local.sdn.cozystack.io/component=driver`, every namespace), for the classes'
    /// `DriverAvailable`. Their renewals every few seconds do not move [`World::revision`].
    pub driver_leases: Option<Arc<Cache<Lease>>>,
    /// Only in the core's process (the binder and the views): what entitlements are decided
    /// from (SPEC §13) — the namespaces (their labels) and the IPAddressQuotas.
    pub entitlements: Option<Entitlements>,
    /// Only in the drivers: the EndpointSlices of the Services cozy-proxy serves (selected by
    /// its label, which the EndpointSlice controller copies from the Service) — how many
    /// ready pods such a Service has (cozy-proxy forwards the address to one).
    pub proxied_endpoints: Option<Arc<ProxiedEndpoints>>,
    /// Only where the views are served: the history's records (`addressholdings` answers
    /// closed holdings from them). Their changes move [`World::revision`].
    pub records: Option<Arc<Cache<IPAddressRecord>>>,
    /// The highest resourceVersion any of the watches has seen.
    pub revision: Arc<AtomicU64>,
    pub health: Arc<Health>,
}

impl World {
    /// The caches, empty until [`World::watch`] runs them; register change handlers first.
    pub fn new(with_services: bool, health: Arc<Health>) -> World {
        let revision = Arc::new(AtomicU64::new(0));
        let w = World {
            claims: Cache::new("IPAddressClaim", revision.clone()),
            addresses: Cache::new("IPAddress", revision.clone()),
            classes: Cache::new("IPAddressClass", revision.clone()),
            services: with_services.then(|| Cache::new("Service", revision.clone())),
            driver_leases: None,
            entitlements: None,
            proxied_endpoints: None,
            records: None,
            revision,
            health,
        };
        w.health.watch(w.claims.health.clone());
        w.health.watch(w.addresses.health.clone());
        w.health.watch(w.classes.health.clone());
        if let Some(s) = &w.services {
            w.health.watch(s.health.clone());
        }
        w
    }

    /// Adds the cache of the drivers' Leases (the core's).
    #[must_use]
    pub fn with_driver_leases(mut self) -> World {
        let leases = Cache::new("Lease", Arc::new(AtomicU64::new(0)));
        self.health.watch(leases.health.clone());
        self.driver_leases = Some(leases);
        self
    }

    /// Adds the caches of namespaces and IPAddressQuotas (the core's process). Their
    /// changes move [`World::revision`]: the views show what they decide.
    #[must_use]
    pub fn with_entitlements(mut self) -> World {
        let e = Entitlements {
            namespaces: Cache::new("Namespace", self.revision.clone()),
            quotas: Cache::new("IPAddressQuota", self.revision.clone()),
        };
        self.health.watch(e.namespaces.health.clone());
        self.health.watch(e.quotas.health.clone());
        self.entitlements = Some(e);
        self
    }

    /// Adds the cache of the EndpointSlices of the Services cozy-proxy serves (the drivers').
    /// Their changes move [`World::revision`].
    #[must_use]
    pub fn with_proxied_endpoints(mut self) -> World {
        let slices = ProxiedEndpoints::new(self.revision.clone());
        self.health.watch(slices.cache.health.clone());
        self.proxied_endpoints = Some(slices);
        self
    }

    /// Adds the cache of the history's records when `views` are served (they answer closed
    /// holdings from it).
    #[must_use]
    pub fn with_records_for(mut self, views: bool) -> World {
        if !views {
            return self;
        }
        let records = Cache::new("IPAddressRecord", self.revision.clone());
        self.health.watch(records.health.clone());
        self.records = Some(records);
        self
    }

    /// The labels of namespace `ns`, when the namespaces are cached and it is known.
    pub fn namespace_labels(&self, ns: &str) -> Option<std::collections::BTreeMap<String, String>> {
        let n = self.entitlements.as_ref()?.namespaces.get(ns)?;
        Some(n.metadata.labels.clone().unwrap_or_default())
    }

    /// Runs every watch, and the watchdog that restarts silent ones, as supervised tasks.
    pub fn watch(&self, client: &Client, cfg: WatchConfig, tasks: &mut Tasks) {
        tasks.spawn_forever(
            "watch IPAddressClaims",
            self.claims
                .clone()
                .run(Api::all(client.clone()), cfg.clone()),
        );
        tasks.spawn_forever(
            "watch IPAddresses",
            self.addresses
                .clone()
                .run(Api::all(client.clone()), cfg.clone()),
        );
        tasks.spawn_forever(
            "watch IPAddressClasses",
            self.classes
                .clone()
                .run(Api::all(client.clone()), cfg.clone()),
        );
        if let Some(s) = &self.services {
            tasks.spawn_forever(
                "watch Services",
                s.clone().run(Api::all(client.clone()), cfg.clone()),
            );
        }
        if let Some(e) = &self.entitlements {
            tasks.spawn_forever(
                "watch Namespaces",
                e.namespaces
                    .clone()
                    .run(Api::all(client.clone()), cfg.clone()),
            );
            tasks.spawn_forever(
                "watch IPAddressQuotas",
                e.quotas.clone().run(Api::all(client.clone()), cfg.clone()),
            );
        }
        if let Some(r) = &self.records {
            tasks.spawn_forever(
                "watch IPAddressRecords",
                r.clone().run(Api::all(client.clone()), cfg.clone()),
            );
        }
        if let Some(e) = &self.proxied_endpoints {
            let slices = WatchConfig {
                labels: Some(format!(
                    "{}={}",
                    address_controller_api::service::SERVICE_PROXY_NAME_LABEL,
                    address_controller_api::service::COZY_PROXY
                )),
                ..cfg.clone()
            };
            tasks.spawn_forever(
                "watch EndpointSlices (cozy-proxy)",
                e.cache.clone().run(Api::all(client.clone()), slices),
            );
            // Every VMI: they carry no label of cozy-proxy's.
            tasks.spawn_forever(
                "watch VirtualMachineInstances (where KubeVirt is installed)",
                watch_where_served(e.vmis.clone(), client.clone(), cfg.clone()),
            );
        }
        if let Some(l) = &self.driver_leases {
            let cfg = WatchConfig {
                labels: Some(format!(
                    "{}=driver",
                    address_controller_api::names::LEASE_COMPONENT_LABEL
                )),
                ..cfg
            };
            tasks.spawn_forever(
                "watch driver Leases",
                l.clone().run(Api::all(client.clone()), cfg),
            );
        }
        tasks.spawn_forever("cache watchdog", self.health.clone().watchdog());
    }

    /// Every class (classes are few).
    pub fn classes(&self) -> Vec<Arc<IPAddressClass>> {
        self.classes.store.all()
    }
}

/// How often a watch of a kind whose API may not be installed (KubeVirt's VMIs) asks the
/// discovery whether it is served now.
const DISCOVERY_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs the watch of `cache` once its API is served (asked of the discovery, every
/// [`DISCOVERY_RECHECK`] until it is): a cluster without KubeVirt is a cluster where no VM
/// moves, not a failing watch — its health is not part of the process's readiness.
async fn watch_where_served<K>(cache: Arc<Cache<K>>, client: Client, cfg: WatchConfig)
where
    K: crate::cache::Object + kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let api_version = K::api_version(&()).to_string();
    let plural = K::plural(&()).to_string();
    loop {
        match client.list_api_group_resources(&api_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == plural) => {
                tracing::info!("{api_version} {plural} served: watching them");
                cache.run(Api::all(client), cfg).await;
                return;
            }
            Ok(_) | Err(_) => tokio::time::sleep(DISCOVERY_RECHECK).await,
        }
    }
}
