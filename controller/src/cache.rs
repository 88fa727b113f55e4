//! One watch per kind, feeding reflector stores that the controllers and the aggregated
//! API server share (SPEC §9: views are served from the same caches). `managedFields`
//! are stripped before caching.

use std::future::Future;
use std::sync::Arc;

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

/// Read-only views of the three caches.
#[derive(Clone)]
pub struct Stores {
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
    pub addresses: mpsc::UnboundedReceiver<Arc<IPAddress>>,
    pub classes: mpsc::UnboundedReceiver<Arc<IPAddressClass>>,
}

/// Buffer of each shared subscription; the reflector waits when a subscriber lags this far.
const SUBSCRIBER_BUFFER: usize = 1024;

/// Starts the three watches. The returned future drives them and must be polled for as
/// long as the process runs (it ends only when a watch stream ends).
pub fn start(client: &Client) -> (Cache, impl Future<Output = ()> + Send + 'static) {
    let (claims_store, claims_writer) =
        reflector::store_shared::<IPAddressClaim>(SUBSCRIBER_BUFFER);
    let (addresses_store, addresses_writer) =
        reflector::store_shared::<IPAddress>(SUBSCRIBER_BUFFER);
    let (classes_store, classes_writer) =
        reflector::store_shared::<IPAddressClass>(SUBSCRIBER_BUFFER);
    let handles = (
        claims_writer.subscribe(),
        addresses_writer.subscribe(),
        classes_writer.subscribe(),
    );
    let (Some(claims), Some(addresses), Some(classes)) = handles else {
        unreachable!("shared writers always hand out subscriptions")
    };
    let (claims_deleted, claim_deletions) = mpsc::unbounded();
    let (addresses_deleted, address_deletions) = mpsc::unbounded();
    let (classes_deleted, class_deletions) = mpsc::unbounded();
    let claim_watch = watch(
        Api::<IPAddressClaim>::all(client.clone()),
        claims_writer,
        claims_deleted,
    );
    let address_watch = watch(
        Api::<IPAddress>::all(client.clone()),
        addresses_writer,
        addresses_deleted,
    );
    let class_watch = watch(
        Api::<IPAddressClass>::all(client.clone()),
        classes_writer,
        classes_deleted,
    );

    let drive = async move {
        futures::join!(
            drain("IPAddressClaim", claim_watch),
            drain("IPAddress", address_watch),
            drain("IPAddressClass", class_watch),
        );
    };
    let stores = Stores {
        claims: claims_store,
        addresses: addresses_store,
        classes: classes_store,
    };
    (
        Cache {
            stores,
            claims,
            addresses,
            classes,
            deletions: Deletions {
                claims: claim_deletions,
                addresses: address_deletions,
                classes: class_deletions,
            },
        },
        drive,
    )
}

/// Names (`namespace/name`) of a claim, for logs.
pub fn claim_key(c: &IPAddressClaim) -> String {
    format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any())
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
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    deleted: mpsc::UnboundedSender<Arc<K>>,
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
            if let watcher::Event::Delete(o) = ev {
                let _ = deleted.unbounded_send(Arc::new(o.clone()));
            }
        })
        .reflect_shared(writer)
}
