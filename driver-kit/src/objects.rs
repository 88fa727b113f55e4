//! The backend objects a driver keeps for its classes (a pool, an advertisement), as
//! dynamic objects: one way to create or bring them up to date, one owner reference, and
//! one way to let go of a pool kept by a finalizer once no address of its class is left.

use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::ClassesInUse;

/// The owner reference to `o` (a class, an address) that makes the garbage collector delete
/// what the driver made for it with it.
pub fn owner<K: Resource<DynamicType = ()>>(o: &K) -> Value {
    json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()),
        "name": o.meta().name, "uid": o.meta().uid})
}

/// Creates `body` or, when it exists and differs in what we own (`spec`, labels, owner),
/// patches it — nothing when it already is so.
pub async fn ensure(api: &Api<DynamicObject>, name: &str, body: Value) -> Result<(), String> {
    match api.get_opt(name).await.map_err(|e| e.to_string())? {
        None => {
            let obj: DynamicObject = serde_json::from_value(body).map_err(|e| e.to_string())?;
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(format!("creating {name}: {e}")),
            }
        }
        // Being deleted (its class went): left alone until it is gone (see release_pools);
        // the class, if it is back, is synced anew then.
        Some(have) if have.metadata.deletion_timestamp.is_some() => Ok(()),
        Some(have) => {
            let have = serde_json::to_value(&have).map_err(|e| e.to_string())?;
            let same = have.get("spec") == body.get("spec")
                && have["metadata"]["ownerReferences"] == body["metadata"]["ownerReferences"]
                && have["metadata"]["finalizers"] == body["metadata"]["finalizers"];
            if same {
                return Ok(());
            }
            let patch = json!({"metadata": {"resourceVersion": have["metadata"]["resourceVersion"],
                "ownerReferences": body["metadata"]["ownerReferences"],
                "finalizers": body["metadata"]["finalizers"],
                "labels": body["metadata"]["labels"]}, "spec": body["spec"]});
            api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map(|_| ())
                .map_err(|e| format!("updating {name}: {e}"))
        }
    }
}

fn kind(api: &Api<DynamicObject>) -> String {
    api.resource_url()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Removes `finalizer` from the pools (listed by `managed`, a label selector) whose class
/// — named by `class_label`, owned by uid — [`ClassesInUse::keeps`] does not keep: the
/// garbage collector deletes them then. Returns the classes let go of.
pub async fn release_pools(
    api: &Api<DynamicObject>,
    managed: &str,
    class_label: &str,
    finalizer: &str,
    in_use: &ClassesInUse,
) -> Result<Vec<String>, String> {
    let ours = ListParams::default().labels(managed);
    let pools = match api.list(&ours).await {
        Ok(l) => l.items,
        Err(e) => return Err(format!("listing {}: {e}", kind(api))),
    };
    let mut released = Vec::new();
    for pool in pools {
        let class = pool.labels().get(class_label).cloned().unwrap_or_default();
        let owner = pool
            .owner_references()
            .iter()
            .find(|o| o.kind == "IPAddressClass")
            .map(|o| o.uid.as_str());
        if in_use.keeps(&class, owner) || !pool.finalizers().iter().any(|f| f == finalizer) {
            continue;
        }
        let keep: Vec<&String> = pool
            .finalizers()
            .iter()
            .filter(|f| *f != finalizer)
            .collect();
        let body =
            json!({"metadata": {"resourceVersion": pool.resource_version(), "finalizers": keep}});
        let done = api
            .patch(
                &pool.name_any(),
                &PatchParams::default(),
                &Patch::Merge(body),
            )
            .await;
        match done {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(format!("releasing {} {}: {e}", kind(api), pool.name_any())),
        }
        tracing::info!(pool = %pool.name_any(), %class, "no address of the class is left: its pool goes");
        released.push(class);
    }
    Ok(released)
}
