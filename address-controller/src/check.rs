//! `address-controller check`: is this installation working, as its operator would ask —
//! the CRDs Established at the schema this binary expects, the views' APIService
//! Available, the Leases of the core and the drivers held and renewed (and none of the Go
//! pair's), every class served
//! by a live driver, and the caller allowed what an operator needs. A table, one row per
//! check; exit 1 when a row fails.

use std::collections::BTreeMap;

use address_controller_api::IPAddressClass;
use address_controller_api::names::LEASE_COMPONENT_ANNOTATION;
use address_controller_runtime::client::ClientArgs;
use address_controller_runtime::leader::{go_pair_leases_held, lease_liveness, live_driver_lease};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};

use address_controller_api::names::VIEWS_APISERVICE as APISERVICE;

#[derive(clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    kube: ClientArgs,
    /// Checks to leave out (comma-separated): crds, apiservice, leases, classes, access.
    #[arg(long, env = "ADDRESS_CONTROLLER_CHECK_SKIP", value_delimiter = ',', value_parser = ["crds", "apiservice", "leases", "classes", "access"])]
    skip: Vec<String>,
    /// Before this project's binaries run (the migration guide's first step): the core
    /// controller's Lease is not expected yet — its absence is ok; a Go pair's live Lease
    /// still fails.
    #[arg(long, env = "ADDRESS_CONTROLLER_CHECK_BEFORE_INSTALL")]
    before_install: bool,
}

/// One row of the table: the check, ok or FAIL, what was found.
pub use address_controller_runtime::report::Row;

fn row(check: impl Into<String>, ok: bool, detail: impl Into<String>) -> Row {
    Row::new(check, ok, detail)
}

/// Runs the checks, prints the table; whether every row passed.
pub async fn run(args: &CheckArgs) -> anyhow::Result<bool> {
    let client = args.kube.client().await?;
    let on = |what: &str| !args.skip.iter().any(|s| s == what);
    let mut rows = Vec::new();
    if on("crds") {
        rows.extend(crds(&client).await);
    }
    if on("apiservice") {
        rows.push(apiservice(&client).await);
    }
    let leases = if on("leases") || on("classes") {
        Some(
            Api::<Lease>::all(client.clone())
                .list(&ListParams::default())
                .await,
        )
    } else {
        None
    };
    let now = Timestamp::now();
    if let Some(leases) = &leases {
        match leases {
            Ok(list) => {
                if on("leases") {
                    rows.extend(lease_rows(&list.items, now, args.before_install));
                }
                if on("classes") {
                    match Api::<IPAddressClass>::all(client.clone())
                        .list(&ListParams::default())
                        .await
                    {
                        Ok(classes) => rows.extend(class_rows(&classes.items, &list.items, now)),
                        Err(e) => rows.push(row("classes", false, format!("cannot list: {e}"))),
                    }
                }
            }
            Err(e) => rows.push(row("leases", false, format!("cannot list: {e}"))),
        }
    }
    if on("access") {
        rows.extend(access(&client).await);
    }
    print!("{}", table(&rows));
    Ok(rows.iter().all(|r| r.ok))
}

/// The rows as kubectl prints a table: aligned columns, CHECK STATUS DETAIL.
pub fn table(rows: &[Row]) -> String {
    address_controller_runtime::report::status_table("CHECK", "DETAIL", rows)
}

async fn crds(client: &Client) -> Vec<Row> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut rows = Vec::new();
    for want in address_controller_api::manifests::crds() {
        let name = want.name_any();
        let check = format!("crd/{name}");
        let have = match api.get_opt(&name).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                rows.push(row(
                    check,
                    false,
                    "not installed (helm show crds <chart> | kubectl apply --server-side -f -)",
                ));
                continue;
            }
            Err(e) => {
                rows.push(row(check, false, format!("cannot read: {e}")));
                continue;
            }
        };
        rows.push(judge_crd(&check, &want, &have));
    }
    rows
}

/// An installed CRD against the one this binary generates.
pub fn judge_crd(
    check: &str,
    want: &CustomResourceDefinition,
    have: &CustomResourceDefinition,
) -> Row {
    let established = have
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Established"));
    if established.is_none_or(|c| c.status != "True") {
        let why = established
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        return row(
            check,
            false,
            format!("not Established {why}").trim().to_string(),
        );
    }
    // Per version: served, the schema, and what kubectl shows and selects by (printer
    // columns, selectable fields) — CRDs of another chart version differ in any of them.
    type Shape = (bool, Option<serde_json::Value>, Option<serde_json::Value>);
    let schemas = |c: &CustomResourceDefinition| -> BTreeMap<String, Shape> {
        c.spec
            .versions
            .iter()
            .map(|v| {
                (
                    v.name.clone(),
                    (
                        v.served,
                        v.schema
                            .as_ref()
                            .and_then(|s| serde_json::to_value(&s.open_api_v3_schema).ok()),
                        serde_json::to_value((&v.additional_printer_columns, &v.selectable_fields))
                            .ok(),
                    ),
                )
            })
            .collect()
    };
    let (want_v, have_v) = (schemas(want), schemas(have));
    for (version, (_, schema, columns)) in &want_v {
        match have_v.get(version) {
            None | Some((false, _, _)) => {
                return row(
                    check,
                    false,
                    format!("{version} is not served: upgrade the CRDs"),
                );
            }
            Some((true, s, _)) if s != schema => {
                return row(
                    check,
                    false,
                    format!(
                        "{version}'s schema differs from this binary's (CRDs of another chart version): upgrade the CRDs"
                    ),
                );
            }
            Some((true, _, c)) if c != columns => {
                return row(
                    check,
                    false,
                    format!(
                        "{version}'s printer columns or selectable fields differ from this binary's (CRDs of another chart version): upgrade the CRDs"
                    ),
                );
            }
            Some(_) => {}
        }
    }
    let versions: Vec<&str> = want_v.keys().map(String::as_str).collect();
    row(
        check,
        true,
        format!(
            "Established, {} served as this binary expects",
            versions.join(", ")
        ),
    )
}

/// The APIServices (apiregistration.k8s.io/v1), read as dynamic objects.
pub fn apiservices(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "apiregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiregistration.k8s.io/v1".into(),
        kind: "APIService".into(),
        plural: "apiservices".into(),
    };
    Api::all_with(client.clone(), &ar)
}

async fn apiservice(client: &Client) -> Row {
    let api = apiservices(client);
    let check = format!("apiservice/{APISERVICE}");
    match api.get_opt(APISERVICE).await {
        Ok(None) => row(check, false, "not registered (the chart's apiservice.yaml)"),
        Err(e) => row(check, false, format!("cannot read: {e}")),
        Ok(Some(a)) => {
            let available = a.data["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
                .cloned()
                .unwrap_or_default();
            if available["status"] == "True" {
                row(check, true, "Available")
            } else {
                row(
                    check,
                    false,
                    format!(
                        "not Available: {} {}",
                        available["reason"].as_str().unwrap_or("no condition yet"),
                        available["message"].as_str().unwrap_or("")
                    )
                    .trim()
                    .to_string(),
                )
            }
        }
    }
}

fn lease_rows(leases: &[Lease], now: Timestamp, before_install: bool) -> Vec<Row> {
    let ours: Vec<&Lease> = leases
        .iter()
        .filter(|l| l.annotations().contains_key(LEASE_COMPONENT_ANNOTATION))
        .collect();
    let mut rows: Vec<Row> = ours
        .iter()
        .map(|l| {
            let what = &l.annotations()[LEASE_COMPONENT_ANNOTATION];
            let check = format!(
                "lease/{}/{} ({what})",
                l.namespace().unwrap_or_default(),
                l.name_any()
            );
            match lease_liveness(l, now) {
                Ok(d) => row(check, true, d),
                Err(d) => row(check, false, d),
            }
        })
        .collect();
    rows.extend(
        go_pair_leases_held(leases, now)
            .into_iter()
            .map(|(lease, who, how)| {
                row(
                    format!("lease/{lease} (Go pair)"),
                    false,
                    format!("{who} runs ({how}): stop it — this project's binaries refuse to start beside it (docs/operations.md, \"Migrating to address-controller\")"),
                )
            }),
    );
    if !ours
        .iter()
        .any(|l| l.annotations()[LEASE_COMPONENT_ANNOTATION] == "controller")
    {
        rows.push(if before_install {
            row(
                "lease (controller)",
                true,
                "no Lease of the core controller yet, as expected before this project's binaries run",
            )
        } else {
            row(
                "lease (controller)",
                false,
                "no Lease of the core controller: is address-controller running with --leader-elect?",
            )
        });
    }
    rows
}

/// Every class, served or not by a live driver Lease annotated with its provisioner.
pub fn class_rows(classes: &[IPAddressClass], leases: &[Lease], now: Timestamp) -> Vec<Row> {
    classes
        .iter()
        .map(|c| {
            let p = &c.spec.provisioner;
            let check = format!("class/{}", c.name_any());
            let live = live_driver_lease(leases, p, now).and_then(|l| {
                lease_liveness(l, now).ok().map(|held| {
                    format!(
                        "{p}: served by lease {}/{} ({held})",
                        l.namespace().unwrap_or_default(),
                        l.name_any()
                    )
                })
            });
            match live {
                Some(d) => row(check, true, d),
                None => row(
                    check,
                    false,
                    format!("no live driver serves {p}: its claims wait for it to provision"),
                ),
            }
        })
        .collect()
}

async fn access(client: &Client) -> Vec<Row> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let needs = [
        ("list", "local.sdn.cozystack.io", "ipaddressclaims"),
        ("list", "local.sdn.cozystack.io", "ipaddresses"),
        ("list", "local.sdn.cozystack.io", "ipaddressclasses"),
        ("list", "view.local.sdn.cozystack.io", "namespaceaddresses"),
        ("list", "view.local.sdn.cozystack.io", "poolavailabilities"),
        ("list", "coordination.k8s.io", "leases"),
        ("get", "apiextensions.k8s.io", "customresourcedefinitions"),
        ("get", "apiregistration.k8s.io", "apiservices"),
    ];
    let mut rows = Vec::new();
    for (verb, group, resource) in needs {
        let check = format!("access/{verb} {resource}.{group}");
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        rows.push(match api.create(&PostParams::default(), &review).await {
            Ok(r) => {
                let st = r.status.unwrap_or_default();
                if st.allowed {
                    row(check, true, "allowed")
                } else {
                    row(
                        check,
                        false,
                        format!("denied {}", st.reason.unwrap_or_default())
                            .trim()
                            .to_string(),
                    )
                }
            }
            Err(e) => row(check, false, format!("cannot ask: {e}")),
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use address_controller_api::names::LEASE_PROVISIONER_ANNOTATION;
    use address_controller_runtime::leader::SKEW_SECONDS;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed_ago: i64, duration: i32, provisioner: Option<&str>) -> Lease {
        let now = Timestamp::now().as_second();
        let mut annotations = BTreeMap::from([(
            LEASE_COMPONENT_ANNOTATION.to_string(),
            if provisioner.is_some() {
                "driver"
            } else {
                "controller"
            }
            .to_string(),
        )]);
        if let Some(p) = provisioner {
            annotations.insert(LEASE_PROVISIONER_ANNOTATION.into(), p.into());
        }
        Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("l-{holder}")),
                namespace: Some("ns".into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(
                    Timestamp::from_second(now - renewed_ago).unwrap_or(Timestamp::UNIX_EPOCH),
                )),
                ..Default::default()
            }),
        }
    }

    fn class(name: &str, provisioner: &str) -> IPAddressClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
            "metadata": {"name": name}, "spec": {"provisioner": provisioner}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_lease_is_live_while_held_and_renewed_within_its_duration() {
        let now = Timestamp::now();
        assert!(lease_liveness(&lease("a", 3, 15, None), now).is_ok());
        // Late by the skew allowance still counts; later does not.
        assert!(lease_liveness(&lease("a", 15 + SKEW_SECONDS, 15, None), now).is_ok());
        let late = lease_liveness(&lease("a", 60, 15, None), now).unwrap_err();
        assert!(late.contains("not renewed for 60s"), "{late}");
        let released = lease_liveness(&lease("", 1, 15, None), now).unwrap_err();
        assert!(released.starts_with("not held"), "{released}");
    }

    #[test]
    fn a_held_lease_of_the_go_pair_fails_the_leases_check_and_a_stale_one_does_not() {
        let now = Timestamp::now();
        let named = |holder: &str, ago: i64, name: &str| {
            let mut l = lease(holder, ago, 15, None);
            l.metadata.name = Some(name.into());
            l.metadata.annotations = None;
            l
        };
        let leases = [
            lease("core", 1, 15, None),
            named("go-core", 2, "a4cfeeab.sdn.cozystack.io"),
            named("go-driver", 120, "e1633266.iad.cozystack.io"),
            named("someone", 1, "unrelated.example"),
        ];
        let failed: Vec<(String, String)> = lease_rows(&leases, now, false)
            .into_iter()
            .filter(|r| !r.ok)
            .map(|r| (r.subject, r.detail))
            .collect();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].0, "lease/ns/a4cfeeab.sdn.cozystack.io (Go pair)");
        assert!(
            failed[0]
                .1
                .starts_with("the Go address-controller runs (held by go-core"),
            "{failed:?}"
        );
    }

    #[test]
    fn a_class_is_served_only_by_a_live_lease_of_its_provisioner() {
        let now = Timestamp::now();
        let leases = [
            lease("live", 1, 15, Some("p.example")),
            lease("dead", 100, 15, Some("q.example")),
            lease("core", 1, 15, None),
        ];
        let rows = class_rows(
            &[
                class("a", "p.example"),
                class("b", "q.example"),
                class("c", "r.example"),
            ],
            &leases,
            now,
        );
        let ok: Vec<(&str, bool)> = rows.iter().map(|r| (r.subject.as_str(), r.ok)).collect();
        assert_eq!(
            ok,
            [("class/a", true), ("class/b", false), ("class/c", false)]
        );
        assert!(rows[0].detail.contains("served by lease ns/l-live"));
        assert!(rows[2].detail.contains("no live driver serves r.example"));
        // Without a controller Lease, the leases check says so.
        let rows = lease_rows(&leases[..2], now, false);
        assert!(
            rows.iter()
                .any(|r| r.subject == "lease (controller)" && !r.ok)
        );
    }

    #[test]
    fn before_the_install_the_core_lease_is_not_expected_and_the_go_pair_still_fails() {
        let now = Timestamp::now();
        let mut go = lease("go-core", 2, 15, None);
        go.metadata.name = Some("a4cfeeab.sdn.cozystack.io".into());
        go.metadata.annotations = None;
        // Nothing of this project runs yet: the guide's first step passes...
        let rows = lease_rows(&[], now, true);
        assert!(rows.iter().all(|r| r.ok), "{rows:?}");
        assert!(rows[0].detail.contains("as expected before"), "{rows:?}");
        // ...unless the Go pair still runs.
        let rows = lease_rows(std::slice::from_ref(&go), now, true);
        assert!(
            rows.iter().any(|r| !r.ok && r.subject.contains("Go pair")),
            "{rows:?}"
        );
        // Without the flag, the missing core Lease is a FAIL (a crashed controller).
        assert!(lease_rows(&[], now, false).iter().any(|r| !r.ok));
    }

    #[test]
    fn the_table_aligns_its_columns() {
        let t = table(&[
            row("crd/x", true, "fine"),
            row("class/longer-name", false, "no"),
        ]);
        assert_eq!(
            t,
            "CHECK               STATUS   DETAIL\n\
             crd/x               ok       fine\n\
             class/longer-name   FAIL     no\n"
        );
    }
}
