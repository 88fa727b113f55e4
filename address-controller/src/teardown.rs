//! `address-controller teardown`: what an operator runs after `helm uninstall` to remove
//! the product for good. Claims and addresses carry finalizers that only the controller
//! and the drivers remove; with them gone, deleting a tenant namespace or the CRDs would
//! wait forever. Teardown refuses while a component still holds a live Lease (it would
//! put the finalizers back), then removes this project's finalizers from every claim and
//! address, deletes the views' APIService when nothing serves it (an unavailable
//! APIService stalls namespace deletion cluster-wide), and with `--delete-crds` deletes
//! the CRDs — and so every claim, address and class. Without `--yes` it only says what it
//! would do.

use address_controller_api::names::{
    LEASE_COMPONENT_ANNOTATION, VIEWS_APISERVICE, is_project_finalizer,
};
use address_controller_api::{IPAddress, IPAddressClaim};
use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::leader::lease_liveness;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

#[derive(clap::Args)]
pub struct TeardownArgs {
    #[command(flatten)]
    kube: ClientArgs,
    /// Do it (without: print what would be done, change nothing).
    #[arg(long)]
    yes: bool,
    /// Also delete the CRDs, and with them every claim, address and class (the ledger).
    #[arg(long)]
    delete_crds: bool,
}

/// Why teardown stopped before changing anything.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{0} still runs (it would put the finalizers back): `helm uninstall` (or stop it) first"
    )]
    Running(String),
}

/// Removes this project's finalizers from every object of `api` (`at` gives the Api for
/// an object's namespace); how many objects had some.
async fn strip<K>(
    api: &Api<K>,
    at: impl Fn(Option<String>) -> Api<K>,
    yes: bool,
) -> anyhow::Result<usize>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut n = 0;
    for obj in api.list(&ListParams::default()).await?.items {
        if !obj.finalizers().iter().any(|f| is_project_finalizer(f)) {
            continue;
        }
        n += 1;
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

/// The components of this project whose Lease is live.
async fn running(client: &Client) -> anyhow::Result<Vec<String>> {
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

/// Runs the teardown; Err(Refusal) when a component still runs.
pub async fn run(args: &TeardownArgs) -> anyhow::Result<()> {
    let client = args.kube.client().await?;
    let live = running(&client).await?;
    if !live.is_empty() {
        return Err(Refusal::Running(live.join(", ")).into());
    }
    let say = |done: &str, todo: &str| {
        if args.yes {
            done.to_string()
        } else {
            format!("would {todo}")
        }
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let installed = crds
        .get_opt("ipaddressclaims.local.sdn.cozystack.io")
        .await?
        .is_some();
    if installed {
        let claims = strip(
            &Api::<IPAddressClaim>::all(client.clone()),
            |ns| Api::namespaced(client.clone(), ns.as_deref().unwrap_or_default()),
            args.yes,
        )
        .await?;
        let addresses = strip(
            &Api::<IPAddress>::all(client.clone()),
            |_| Api::all(client.clone()),
            args.yes,
        )
        .await?;
        println!(
            "{} from {claims} claim(s) and {addresses} address(es)",
            say("removed the finalizers", "remove the finalizers")
        );
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
    }
    if !args.yes {
        println!("dry run: nothing changed; pass --yes to do it");
    }
    Ok(())
}
