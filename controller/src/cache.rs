//! One watch per kind, feeding reflector stores that the controllers and the aggregated
//! API server share (SPEC §9: views are served from the same caches). `managedFields`
//! are stripped before caching.

use std::future::Future;
use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};

/// Read-only views of the three caches.
#[derive(Clone)]
pub struct Stores {
    /// Empty unless Services are watched (only auto-claims need them).
    pub services: Store<Service>,
    pub services_watched: bool,
    /// The highest resourceVersion seen on any watch event (etcd revisions only grow, so
    /// this never goes backwards, across restarts and replicas alike): the views derive
    /// their resourceVersions from it.
    pub revision: Arc<std::sync::atomic::AtomicU64>,
    pub claims: Store<IPAddressClaim>,
    pub addresses: Store<IPAddress>,
    pub classes: Store<IPAddressClass>,
}

impl Stores {
    /// Resolves once every cache has completed its initial list.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        ready(&self.claims).await?;
        ready(&self.addresses).await?;
        ready(&self.classes).await?;
        if self.services_watched {
            ready(&self.services).await?;
        }
        Ok(())
    }
}

/// `Store::wait_until_ready` keeps only the most recent waiter's waker, and the
/// controllers wait on the same stores; polling again every so often cannot miss it.
async fn ready<K: kube::runtime::reflector::Lookup + Clone + 'static>(
    store: &Store<K>,
) -> Result<(), reflector::store::WriterDropped>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(r) = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            store.wait_until_ready(),
        )
        .await
        {
            return r;
        }
    }
}

/// The caches plus the subscriptions the controllers trigger on.
pub struct Cache {
    pub stores: Stores,
    pub services: ReflectHandle<Service>,
    pub claims: ReflectHandle<IPAddressClaim>,
    pub addresses: ReflectHandle<IPAddress>,
    pub classes: ReflectHandle<IPAddressClass>,
    pub deletions: Deletions,
}

/// Objects that disappeared (watch `Delete` events). The shared handles only carry objects
/// still in the store, yet a deletion matters to others: a claim's addresses must learn it
/// is gone, claims must re-resolve when a default class goes away.
pub struct Deletions {
    pub claims: mpsc::UnboundedReceiver<Arc<IPAddressClaim>>,
    /// The same claim deletions, for the auto-claim controller.
    pub claims_for_services: mpsc::UnboundedReceiver<Arc<IPAddressClaim>>,
    pub addresses: mpsc::UnboundedReceiver<Arc<IPAddress>>,
    pub classes: mpsc::UnboundedReceiver<Arc<IPAddressClass>>,
}

/// Buffer of each shared subscription; the reflector waits when a subscriber lags this far.
const SUBSCRIBER_BUFFER: usize = 1024;

/// Starts the watches (claims, addresses, classes, Services). The returned future drives
/// them and must be polled for as long as the process runs.
pub fn start(
    client: &Client,
    watch_services: bool,
) -> (Cache, impl Future<Output = ()> + Send + 'static) {
    let (claims_store, claims_writer) =
        reflector::store_shared::<IPAddressClaim>(SUBSCRIBER_BUFFER);
    let (addresses_store, addresses_writer) =
        reflector::store_shared::<IPAddress>(SUBSCRIBER_BUFFER);
    let (classes_store, classes_writer) =
        reflector::store_shared::<IPAddressClass>(SUBSCRIBER_BUFFER);
    let (services_store, services_writer) = reflector::store_shared::<Service>(SUBSCRIBER_BUFFER);
    let handles = (
        claims_writer.subscribe(),
        addresses_writer.subscribe(),
        classes_writer.subscribe(),
        services_writer.subscribe(),
    );
    let (Some(claims), Some(addresses), Some(classes), Some(services)) = handles else {
        unreachable!("shared writers always hand out subscriptions")
    };
    let (claims_deleted, claim_deletions) = mpsc::unbounded();
    let (claims_deleted_for_services, claims_for_services) = mpsc::unbounded();
    let (addresses_deleted, address_deletions) = mpsc::unbounded();
    let (classes_deleted, class_deletions) = mpsc::unbounded();
    let revision = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let claim_watch = watch(
        revision.clone(),
        Api::<IPAddressClaim>::all(client.clone()),
        claims_writer,
        vec![claims_deleted, claims_deleted_for_services],
    );
    let address_watch = watch(
        revision.clone(),
        Api::<IPAddress>::all(client.clone()),
        addresses_writer,
        vec![addresses_deleted],
    );
    let class_watch = watch(
        revision.clone(),
        Api::<IPAddressClass>::all(client.clone()),
        classes_writer,
        vec![classes_deleted],
    );
    let service_watch = watch(
        revision.clone(),
        Api::<Service>::all(client.clone()),
        services_writer,
        vec![],
    );
    let service_watch = async move {
        if watch_services {
            drain("Service", service_watch).await;
        }
    };

    let drive = async move {
        futures::join!(
            drain("IPAddressClaim", claim_watch),
            drain("IPAddress", address_watch),
            drain("IPAddressClass", class_watch),
            service_watch,
        );
    };
    let stores = Stores {
        services: services_store,
        services_watched: watch_services,
        revision,
        claims: claims_store,
        addresses: addresses_store,
        classes: classes_store,
    };
    let deletions = Deletions {
        claims: claim_deletions,
        claims_for_services,
        addresses: address_deletions,
        classes: class_deletions,
    };
    (
        Cache {
            stores,
            services,
            claims,
            addresses,
            classes,
            deletions,
        },
        drive,
    )
}

/// Polls a watch stream for as long as it runs, logging its errors (the watcher retries
/// with backoff by itself).
async fn drain<T>(
    kind: &'static str,
    stream: impl futures::Stream<Item = Result<T, watcher::Error>>,
) {
    stream
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!(kind, error = %e, "watch error; retrying with backoff");
            }
        })
        .await;
}

/// One kind's watch: managedFields stripped, deletions reported, the store kept.
fn watch<K>(
    revision: Arc<std::sync::atomic::AtomicU64>,
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    deleted: Vec<mpsc::UnboundedSender<Arc<K>>>,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .map_ok(|ev| ev.modify(|o| o.meta_mut().managed_fields = None))
        .inspect_ok(move |ev| {
            if let watcher::Event::Apply(o)
            | watcher::Event::InitApply(o)
            | watcher::Event::Delete(o) = ev
                && let Some(rv) = o
                    .meta()
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse::<u64>().ok())
            {
                revision.fetch_max(rv, std::sync::atomic::Ordering::AcqRel);
            }
            if let watcher::Event::Delete(o) = ev {
                let o = Arc::new(o.clone());
                for tx in &deleted {
                    let _ = tx.unbounded_send(o.clone());
                }
            }
        })
        .reflect_shared(writer)
}
