//! `address-controller teardown`: what an operator runs after `helm uninstall` to remove
//! the product for good. Claims and addresses carry finalizers that only the controller
//! and the drivers remove; with them gone, deleting a tenant namespace or the CRDs would
//! wait forever. Teardown refuses while a component still runs — a Deployment of the chart
//! exists, or a live Lease (it would put the finalizers back) — writes a YAML backup of the
//! ledger before it changes anything, then removes this project's finalizers from every
//! claim and address (those already being deleted only with `--force`: a finalizer there
//! may still have work, a reclaim or a driver's backend teardown) and from the MetalLB
//! IPAddressPools the MetalLB driver keeps for gone classes, deletes the views'
//! APIService when nothing serves it (an unavailable APIService stalls namespace deletion
//! cluster-wide), and with `--delete-crds --objects N` deletes the CRDs — and so every
//! claim, address, class and quota, whose count N must be. Without `--yes` it only says
//! what it would do.

use std::path::PathBuf;

use address_controller_api::names::{
    LEASE_COMPONENT_ANNOTATION, VIEWS_APISERVICE, is_project_finalizer,
};
use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass, IPAddressQuota};
use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::leader::lease_liveness;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

/// The label selector of the MetalLB driver's own objects (its pools, advertisements, holds).
const METALLB_DRIVER_OBJECTS: &str =
    "app.kubernetes.io/managed-by=address-controller-metallb-driver";

#[derive(clap::Args)]
pub struct TeardownArgs {
    #[command(flatten)]
    kube: ClientArgs,
    /// Do it (without: print what would be done, change nothing).
    #[arg(long)]
    yes: bool,
    /// Also remove the finalizers of claims and addresses already being deleted (a
    /// reclaim or a driver's backend teardown may still be due there; a tenant namespace
    /// being deleted waits for its claims).
    #[arg(long)]
    force: bool,
    /// Also delete the CRDs, and with them every claim, address, class and quota (the
    /// ledger); needs --objects.
    #[arg(long)]
    delete_crds: bool,
    /// With --delete-crds: how many objects (claims, addresses, classes, quotas) you
    /// confirm destroying — the dry run says; a different count refuses.
    #[arg(long)]
    objects: Option<usize>,
    /// Where the YAML backup of the ledger is written before anything changes [default:
    /// ./address-controller-ledger-TIME.yaml, TIME the Unix time of the run in seconds].
    #[arg(long, env = "ADDRESS_CONTROLLER_TEARDOWN_BACKUP_FILE")]
    backup_file: Option<PathBuf>,
}

/// Why teardown stopped before changing anything.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{0} still runs (it would put the finalizers back): `helm uninstall` (or stop it) first"
    )]
    Running(String),
    #[error(
        "--delete-crds destroys {0} objects (claims, addresses, classes, quotas): pass --objects {0} to confirm"
    )]
    Count(usize),
}

/// What [`strip`] did (or would do): objects whose finalizers it removed, and those it
/// left because they are being deleted (without `--force`).
#[derive(Default)]
struct Stripped {
    done: usize,
    left: usize,
}

/// Removes this project's finalizers from every object of `api` (`at` gives the Api for
/// an object's namespace) — from one being deleted only with `force`.
async fn strip<K>(
    api: &Api<K>,
    at: impl Fn(Option<String>) -> Api<K>,
    only: Option<&ListParams>,
    yes: bool,
    force: bool,
) -> anyhow::Result<Stripped>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut n = Stripped::default();
    let every = ListParams::default();
    for obj in api.list(only.unwrap_or(&every)).await?.items {
        if !obj.finalizers().iter().any(|f| is_project_finalizer(f)) {
            continue;
        }
        if obj.meta().deletion_timestamp.is_some() && !force {
            n.left += 1;
            continue;
        }
        n.done += 1;
        if !yes {
            continue;
        }
        // Guarded by the resourceVersion read; re-read and retry when it moved.
        let mut cur = obj;
        loop {
            let keep: Vec<&String> = cur
                .finalizers()
                .iter()
                .filter(|f| !is_project_finalizer(f))
                .collect();
            let body = json!({"metadata": {"resourceVersion": cur.resource_version(), "finalizers": keep}});
            let ns_api = at(cur.namespace());
            match ns_api
                .patch(
                    &cur.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(body),
                )
                .await
            {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 404 => break,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    match ns_api.get_opt(&cur.name_any()).await? {
                        Some(fresh) => cur = fresh,
                        None => break,
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(n)
}

/// The components of this project that still run: the chart's Deployments (whatever their
/// pods do: a Deployment brings its pods back), and whoever holds a live Lease.
async fn running(client: &Client) -> anyhow::Result<Vec<String>> {
    let chart = ListParams::default().labels("app.kubernetes.io/name=address-controller");
    let mut running: Vec<String> = Api::<Deployment>::all(client.clone())
        .list(&chart)
        .await?
        .items
        .iter()
        .map(|d| {
            format!(
                "the Deployment {}/{}",
                d.namespace().unwrap_or_default(),
                d.name_any()
            )
        })
        .collect();
    running.extend(live_leases(client).await?);
    Ok(running)
}

/// The components of this project whose Lease is live.
async fn live_leases(client: &Client) -> anyhow::Result<Vec<String>> {
    let now = Timestamp::now();
    Ok(Api::<Lease>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|l| {
            let what = l.annotations().get(LEASE_COMPONENT_ANNOTATION)?;
            let held = lease_liveness(l, now).ok()?;
            Some(format!(
                "the {what} (Lease {}/{}, {held})",
                l.namespace().unwrap_or_default(),
                l.name_any()
            ))
        })
        .collect())
}

/// Every object of `api`, managed fields left out, with its `apiVersion` and `kind`: items
/// of a List that `kubectl apply` takes back.
async fn backup_items<K>(api: Api<K>) -> anyhow::Result<Vec<serde_json::Value>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let mut out = Vec::new();
    for mut obj in api.list(&ListParams::default()).await?.items {
        obj.meta_mut().managed_fields = None;
        let mut v = serde_json::to_value(&obj)?;
        v["apiVersion"] = json!(K::api_version(&()));
        v["kind"] = json!(K::kind(&()));
        out.push(v);
    }
    Ok(out)
}

/// The ledger — classes, quotas, claims, addresses — as one YAML `List`.
async fn ledger(client: &Client) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut items = backup_items(Api::<IPAddressClass>::all(client.clone())).await?;
    items.extend(backup_items(Api::<IPAddressQuota>::all(client.clone())).await?);
    items.extend(backup_items(Api::<IPAddressClaim>::all(client.clone())).await?);
    items.extend(backup_items(Api::<IPAddress>::all(client.clone())).await?);
    Ok(items)
}

/// Runs the teardown; Err(Refusal) when a component still runs or the count to destroy is
/// not confirmed.
pub async fn run(args: &TeardownArgs) -> anyhow::Result<()> {
    let client = args.kube.client().await?;
    let live = running(&client).await?;
    if !live.is_empty() {
        return Err(Refusal::Running(live.join(", ")).into());
    }
    let say = |done: &str, todo: &str| say(args, done, todo);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let installed = crds
        .get_opt("ipaddressclaims.local.sdn.cozystack.io")
        .await?
        .is_some();
    let items = if installed {
        ledger(&client).await?
    } else {
        Vec::new()
    };
    if args.delete_crds && installed && args.yes && args.objects != Some(items.len()) {
        return Err(Refusal::Count(items.len()).into());
    }
    if installed && args.yes {
        write_backup(args, &items)?;
    }
    if installed {
        strip_finalizers(args, &client).await?;
    } else {
        println!("no CRDs: nothing carries a finalizer of this project");
    }
    let apiservices = crate::check::apiservices(&client);
    if apiservices.get_opt(VIEWS_APISERVICE).await?.is_some() {
        if args.yes {
            apiservices
                .delete(VIEWS_APISERVICE, &DeleteParams::default())
                .await?;
        }
        println!(
            "{} the APIService {VIEWS_APISERVICE} (nothing serves it now; left in place it stalls namespace deletion)",
            say("deleted", "delete")
        );
    }
    if args.delete_crds && installed {
        delete_crds(args, &crds, items.len()).await?;
    }
    if !args.yes {
        println!("dry run: nothing changed; pass --yes to do it");
    }
    Ok(())
}

/// What was done, or in a dry run what would be.
fn say(args: &TeardownArgs, done: &str, todo: &str) -> String {
    if args.yes {
        done.to_string()
    } else {
        format!("would {todo}")
    }
}

/// Writes the ledger to `--backup-file` (or a timestamped file) as a `List`.
fn write_backup(args: &TeardownArgs, items: &[serde_json::Value]) -> anyhow::Result<()> {
    let path = args.backup_file.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "address-controller-ledger-{}.yaml",
            Timestamp::now().as_second()
        ))
    });
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    std::fs::write(&path, serde_yaml::to_string(&list)?)
        .map_err(|e| anyhow::anyhow!("writing the backup {}: {e}", path.display()))?;
    println!(
        "wrote the ledger ({} objects) to {} (kubectl apply -f restores it)",
        items.len(),
        path.display()
    );
    Ok(())
}

/// Removes this project's finalizers from the claims and the addresses (those being
/// deleted only with `--force`), and from the MetalLB IPAddressPools the MetalLB driver kept.
async fn strip_finalizers(args: &TeardownArgs, client: &Client) -> anyhow::Result<()> {
    let say = |done: &str, todo: &str| say(args, done, todo);
    let claims = strip(
        &Api::<IPAddressClaim>::all(client.clone()),
        |ns| Api::namespaced(client.clone(), ns.as_deref().unwrap_or_default()),
        None,
        args.yes,
        args.force,
    )
    .await?;
    let addresses = strip(
        &Api::<IPAddress>::all(client.clone()),
        |_| Api::all(client.clone()),
        None,
        args.yes,
        args.force,
    )
    .await?;
    println!(
        "{} from {} claim(s) and {} address(es)",
        say("removed the finalizers", "remove the finalizers"),
        claims.done,
        addresses.done
    );
    if claims.left + addresses.left > 0 {
        println!(
            "left {} claim(s) and {} address(es) already being deleted (a reclaim or a driver's teardown may still be due); --force removes theirs too",
            claims.left, addresses.left
        );
    }
    // The MetalLB driver keeps a class's IPAddressPool while addresses of the class are
    // left; with the driver gone nobody would let go of it (and MetalLB's namespace would
    // never finish deleting).
    let gvk = GroupVersionKind::gvk("metallb.io", "v1beta1", "IPAddressPool");
    let pools_of = |ns: Option<String>| -> Api<DynamicObject> {
        Api::namespaced_with(
            client.clone(),
            ns.as_deref().unwrap_or_default(),
            &ApiResource::from_gvk(&gvk),
        )
    };
    let ours = ListParams::default().labels(METALLB_DRIVER_OBJECTS);
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    match all.list(&ours).await {
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
        Ok(_) => {
            let pools = strip(&all, pools_of, Some(&ours), args.yes, true).await?;
            if pools.done > 0 {
                println!(
                    "{} from {} MetalLB IPAddressPool(s) the MetalLB driver kept",
                    say("removed the finalizers", "remove the finalizers"),
                    pools.done
                );
            }
        }
    }
    Ok(())
}

/// Deletes the CRDs (and every object of them with them).
async fn delete_crds(
    args: &TeardownArgs,
    crds: &Api<CustomResourceDefinition>,
    objects: usize,
) -> anyhow::Result<()> {
    let say = |done: &str, todo: &str| say(args, done, todo);
    println!(
        "{} {} objects with the CRDs (claims, addresses, classes, quotas)",
        say("destroyed", "destroy"),
        objects
    );
    for crd in address_controller_api::manifests::crds() {
        let name = crd.name_any();
        if args.yes {
            match crds.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
        }
        println!(
            "{} the CRD {name} (every object of it with it)",
            say("deleted", "delete")
        );
    }
    Ok(())
}
