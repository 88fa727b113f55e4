//! The platform's packages (`packaging/cozystack/`), as the platform installs and tests them:
//! each vendors `chart/` verbatim, passes its `helm unittest` suite (and fails it when a
//! reviewer's point is broken), and — on the real control plane, with the platform's own
//! tenant roles applied as they are and a tenant's RoleBindings rendered from the platform's
//! own template — gives a tenant exactly its claims, its quota and its namespace's views,
//! fences MetalLB's annotations in the tenants' namespaces, and withdraws the grant when
//! uninstalled while the ledger stays. The last needs the platform's files beside this
//! repository (`../shared/third_party/cozystack`): without them it is reported ignored, with
//! the reason, never passed.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::path::{Path, PathBuf};
use std::time::Duration;

use address_controller_tests::access::{allowed, kubectl_as};
use address_controller_tests::chart::{
    METALLB, Release, Runner, chart_dir, clear_leftovers, kind_name,
};
use address_controller_tests::env::apiservice_available;
use address_controller_tests::metallb::{MetalLb, NAMESPACE as METALLB_NS};
use address_controller_tests::packaging::{
    PACKAGES, ROLES, helm_unittest, package_copy, package_dir, platform_dir, tenant_bindings,
};
use address_controller_tests::{
    Cleanup, Cluster, free_port, output_with_stdin, random_suffix, setup, wait_for,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let platform = platform_dir();
    if let Err(why) = &platform {
        println!("the platform tenant's test is skipped (reported ignored): {why}");
    }
    let trial = |name: &'static str, test: fn()| {
        libtest_mimic::Trial::test(name, move || {
            test();
            Ok(())
        })
    };
    let schema = grafana_schema();
    if let Err(why) = &schema {
        println!("the GrafanaDashboard schema test is skipped (reported ignored): {why}");
    }
    let trials = vec![
        trial(
            "the_charts_options_for_a_platform_default_off_and_do_what_they_say",
            the_charts_options_for_a_platform_default_off_and_do_what_they_say,
        ),
        trial(
            "every_package_vendors_the_chart_verbatim",
            every_package_vendors_the_chart_verbatim,
        ),
        trial(
            "helm_unittest_passes_for_every_package_and_fails_when_a_point_is_broken",
            helm_unittest_passes_for_every_package_and_fails_when_a_point_is_broken,
        ),
        trial(
            "a_tenant_of_the_platform_uses_its_addresses_through_the_platforms_own_roles",
            a_tenant_of_the_platform_uses_its_addresses_through_the_platforms_own_roles,
        )
        .with_ignored_flag(platform.is_err()),
        trial(
            "the_grafana_dashboard_is_valid_for_grafana_operator_and_is_the_charts_dashboard",
            the_grafana_dashboard_is_valid_for_grafana_operator_and_is_the_charts_dashboard,
        )
        .with_ignored_flag(schema.is_err()),
    ];
    libtest_mimic::run(&args, trials).exit();
}

/// `helm template` of chart/ with `values` and extra flags: "Kind/name" of every object.
fn rendered(values: &Value, extra: &[&str]) -> Vec<(String, Value)> {
    address_controller_tests::chart::render("platform-system", values, extra)
        .unwrap()
        .into_iter()
        .map(|o| (kind_name(&o), o))
        .collect()
}

/// The upstream chart stays platform-agnostic: what a platform's package sets is an option
/// whose default changes nothing — a release of the drivers alone (`core.enabled: false`),
/// the driver only where MetalLB is served, the fence scoped by namespace prefixes, extra
/// aggregation labels, the dashboard as a GrafanaDashboard instead of the sidecar's ConfigMap.
fn the_charts_options_for_a_platform_default_off_and_do_what_they_say() {
    let has = |objs: &[(String, Value)], name: &str| objs.iter().any(|(n, _)| n == name);
    let find = |objs: &[(String, Value)], name: &str| -> Value {
        objs.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name}"))
            .1
            .clone()
    };
    let grafana = ["--api-versions", "grafana.integreatly.org/v1beta1"];
    let defaults = rendered(&json!({}), &grafana);
    assert!(has(&defaults, "ConfigMap/address-controller-dashboard"));
    assert!(!has(&defaults, "GrafanaDashboard/address-controller"));
    let view = find(&defaults, "ClusterRole/address-controller-aggregate-view");
    assert_eq!(
        view["metadata"]["labels"].as_object().unwrap().len(),
        8,
        "{view}"
    );

    // The dashboard for grafana-operator, only where its API is served.
    let both = json!({"dashboard": {"grafanaDashboard": {"enabled": true}}});
    assert!(has(
        &rendered(&both, &grafana),
        "GrafanaDashboard/address-controller"
    ));
    assert!(!has(
        &rendered(&both, &[]),
        "GrafanaDashboard/address-controller"
    ));
    let operator_only = json!({"dashboard": {"configMap": {"enabled": false},
        "grafanaDashboard": {"enabled": true, "folder": "Networking"}}});
    let objs = rendered(&operator_only, &grafana);
    assert!(!has(&objs, "ConfigMap/address-controller-dashboard"));
    assert_eq!(
        find(&objs, "GrafanaDashboard/address-controller")["spec"]["folder"],
        "Networking"
    );

    // Extra labels on the aggregated roles (a platform aggregates them without a wrapper).
    let labelled = rendered(
        &json!({"aggregateRoles": {"extraLabels": {
            "view": {"rbac.cozystack.io/aggregate-to-tenant-view": "true"},
            "edit": {"rbac.cozystack.io/aggregate-to-tenant-admin": "true"}}}}),
        &[],
    );
    assert_eq!(
        find(&labelled, "ClusterRole/address-controller-aggregate-view")["metadata"]["labels"]["rbac.cozystack.io/aggregate-to-tenant-view"],
        "true"
    );
    assert_eq!(
        find(&labelled, "ClusterRole/address-controller-aggregate-edit")["metadata"]["labels"]["rbac.cozystack.io/aggregate-to-tenant-admin"],
        "true"
    );

    // The drivers alone: nothing of the core, a component policy of their own namespace.
    let drivers = json!({"core": {"enabled": false}, "metallbDriver": {"enabled": true,
        "onlyWhereMetalLBIsServed": true, "admissionPolicy": {"namespacePrefixes": ["tenant-"]}}});
    let without_metallb = rendered(&drivers, &[]);
    let names: Vec<&str> = without_metallb.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "ValidatingAdmissionPolicy/address-controller-component-writes-platform-system",
            "ValidatingAdmissionPolicyBinding/address-controller-component-writes-platform-system"
        ],
        "where MetalLB is not served, only the component policy"
    );
    let with_metallb = rendered(
        &drivers,
        &["--api-versions", "metallb.io/v1beta1/IPAddressPool"],
    );
    for want in [
        "Deployment/address-controller-metallb-driver",
        "ValidatingAdmissionPolicy/address-controller-metallb-pins",
    ] {
        assert!(has(&with_metallb, want), "{want}");
    }
    assert!(
        !with_metallb
            .iter()
            .any(|(n, _)| n == "Deployment/address-controller"
                || n.starts_with("APIService/")
                || n.starts_with("ClusterRole/address-controller-aggregate")
                || n == "ConfigMap/address-controller-dashboard")
    );
    let fence = find(
        &with_metallb,
        "ValidatingAdmissionPolicy/address-controller-metallb-pins",
    );
    assert_eq!(
        fence["spec"]["matchConditions"],
        json!([{"name": "namespace-prefixes",
            "expression": "[\"tenant-\"].exists(p, request.namespace.startsWith(p))"}])
    );
    // Without prefixes the fence matches every namespace (the default).
    let everywhere = rendered(&json!({"metallbDriver": {"enabled": true}}), &[]);
    assert!(
        find(
            &everywhere,
            "ValidatingAdmissionPolicy/address-controller-metallb-pins"
        )["spec"]
            .get("matchConditions")
            .is_none()
    );
}

/// The validator of grafana-operator's CRD schemas (build-binaries.sh grafana), or why not.
fn grafana_schema() -> Result<PathBuf, String> {
    let dir = PathBuf::from(
        Cluster::get()
            .env_var("GRAFANA_SCHEMA")
            .map_err(|e| e.to_string())?,
    );
    if dir.join(".complete").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "{} was not built (node and npm are needed)",
            dir.display()
        ))
    }
}

/// Validates `doc` against grafana-operator's GrafanaDashboard schema: Ok, or what is wrong.
fn validate_grafana_dashboard(schema: &Path, doc: &Value) -> Result<(), String> {
    let out = output_with_stdin(
        std::process::Command::new("node")
            .arg(schema.join("validate.mjs"))
            .current_dir(schema),
        doc.to_string().as_bytes(),
    )
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && said == "valid" {
        Ok(())
    } else {
        Err(said)
    }
}

/// The option the platform's Grafana needs (grafana-operator, instances labelled
/// `dashboards: grafana`): the core package renders a GrafanaDashboard that grafana-operator's
/// own schema accepts, carrying the same dashboard as the ConfigMap does (one source), and no
/// ConfigMap; a document the schema refuses is refused (the control).
fn the_grafana_dashboard_is_valid_for_grafana_operator_and_is_the_charts_dashboard() {
    let schema = grafana_schema().unwrap();
    let docs = address_controller_tests::chart::parse_docs(
        &address_controller_tests::chart::run_helm(&[
            "template",
            "address-controller",
            package_dir("address-controller").to_str().unwrap(),
            "--namespace",
            "cozy-address-controller",
            "--kube-version",
            "1.36.0",
            "--api-versions",
            "grafana.integreatly.org/v1beta1",
        ])
        .unwrap(),
    );
    let dashboards: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "GrafanaDashboard")
        .collect();
    assert_eq!(dashboards.len(), 1, "one GrafanaDashboard");
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "ConfigMap"
                && d["metadata"]["name"] == "address-controller-dashboard"),
        "the platform runs no sidecar: no ConfigMap"
    );
    let dashboard = dashboards[0];
    validate_grafana_dashboard(&schema, dashboard)
        .unwrap_or_else(|e| panic!("grafana-operator's schema refuses the GrafanaDashboard: {e}"));
    assert_eq!(
        dashboard["spec"]["instanceSelector"],
        json!({"matchLabels": {"dashboards": "grafana"}})
    );
    let file =
        std::fs::read_to_string(chart_dir().join("dashboards/address-controller.json")).unwrap();
    assert_eq!(
        dashboard["spec"]["json"].as_str().unwrap().trim(),
        file.trim(),
        "the GrafanaDashboard carries the chart's dashboard file"
    );
    // The control: the schema is consulted (a dashboard without instanceSelector is refused).
    let mut broken = dashboard.clone();
    broken["spec"]
        .as_object_mut()
        .unwrap()
        .remove("instanceSelector");
    let err = validate_grafana_dashboard(&schema, &broken)
        .expect_err("a GrafanaDashboard without instanceSelector was valid");
    assert!(err.contains("instanceSelector"), "{err}");
}

/// Every file below `dir`, relative to it, sorted (the image test's walk, without the
/// directories).
fn files(dir: &Path) -> Vec<PathBuf> {
    address_controller_tests::image::walk(dir)
        .into_iter()
        .filter(|(_, meta)| !meta.is_dir())
        .map(|(rel, _)| PathBuf::from(rel))
        .collect()
}

/// One source of truth: `charts/address-controller` of each package is `chart/` byte for
/// byte (`make packages` or `make manifests` copies it).
fn every_package_vendors_the_chart_verbatim() {
    let chart = chart_dir();
    let want = files(&chart);
    assert!(want.iter().any(|f| f.ends_with("Chart.yaml")));
    for pkg in PACKAGES {
        let vendored = package_dir(pkg).join("charts/address-controller");
        let got = files(&vendored);
        assert_eq!(
            got, want,
            "packaging/cozystack/{pkg}/charts/address-controller has other files than chart/: run make packages"
        );
        for f in &want {
            assert!(
                std::fs::read(chart.join(f)).unwrap() == std::fs::read(vendored.join(f)).unwrap(),
                "packaging/cozystack/{pkg}/charts/address-controller/{} differs from chart/: run make packages",
                f.display()
            );
        }
    }
}

/// The platform runs `helm unittest .` in each package: both pass, and each suite fails when
/// one of the points the platform's reviewers asked for is broken (a positive control per
/// package: a cluster-scoped kind in the tenants' roles; the fence no longer scoped to the
/// tenants' namespaces).
fn helm_unittest_passes_for_every_package_and_fails_when_a_point_is_broken() {
    for pkg in PACKAGES {
        let out = helm_unittest(&package_dir(pkg)).unwrap_or_else(|e| panic!("{pkg}:\n{e}"));
        assert!(out.contains("Tests:"), "{pkg}: no test ran:\n{out}");
        let passed = out
            .lines()
            .find_map(|l| l.strip_prefix("Tests:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse::<u32>().ok());
        assert!(
            passed.is_some_and(|n| n > 0),
            "{pkg}: no test passed:\n{out}"
        );
    }
    let mutations: [(&str, &str, &str, &str); 2] = [
        (
            "address-controller",
            "templates/tenant-roles.yaml",
            "resources: [\"ipaddressclaims\", \"ipaddressquotas\"]",
            "resources: [\"ipaddressclaims\", \"ipaddressquotas\", \"ipaddresses\"]",
        ),
        (
            "address-controller-metallb",
            "values.yaml",
            "namespacePrefixes: [\"tenant-\"]",
            "namespacePrefixes: []",
        ),
    ];
    for (pkg, file, from, to) in mutations {
        let (_dir, copy) = package_copy(pkg);
        let path = copy.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{pkg}/{file} no longer holds {from:?}");
        std::fs::write(&path, text.replace(from, to)).unwrap();
        let out = helm_unittest(&copy).expect_err(&format!(
            "{pkg}: the suite passed with {file} mutated ({from} -> {to})"
        ));
        assert!(out.contains("FAIL"), "{pkg}:\n{out}");
    }
}

/// The platform's users: a tenant's admin and viewer (groups `<tenant>-admin`,
/// `<tenant>-view`, as its identity provider names them) and the tenant's ServiceAccount.
struct Who {
    label: &'static str,
    user: String,
    groups: Vec<String>,
}

impl Who {
    fn in_tenant(tenant: &str) -> [Who; 3] {
        [
            Who {
                label: "cozy:tenant:admin",
                user: format!("{tenant}-alice"),
                groups: vec![format!("{tenant}-admin"), "system:authenticated".into()],
            },
            Who {
                label: "cozy:tenant:view",
                user: format!("{tenant}-victor"),
                groups: vec![format!("{tenant}-view"), "system:authenticated".into()],
            },
            Who {
                // The platform binds a tenant's ServiceAccount at every level of its
                // tenant roles (cozy-lib's subjectsForTenantAndAccessLevel): an admin.
                label: "the tenant's ServiceAccount",
                user: format!("system:serviceaccount:{tenant}:{tenant}"),
                groups: vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{tenant}"),
                    "system:authenticated".into(),
                ],
            },
        ]
    }

    fn can(&self, verb: &str, resource: &str, ns: &str) -> bool {
        allowed(&self.user, &self.groups, verb, resource, ns)
    }

    fn kubectl(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        let groups: Vec<&str> = self.groups.iter().map(String::as_str).collect();
        kubectl_as(&self.user, &groups, args, stdin)
    }
}

const CLAIMS: &str = "ipaddressclaims.local.sdn.cozystack.io";
const QUOTAS: &str = "ipaddressquotas.local.sdn.cozystack.io";
const HOLDINGS: &str = "namespaceaddresses.view.local.sdn.cozystack.io";
const RECORDS: &str = "namespaceaddresses.view.local.sdn.cozystack.io/addresses";
const HISTORY: &str = "addressholdings.view.local.sdn.cozystack.io";
const DRIVER_NS: &str = "cozy-address-controller-metallb";
const DRIVER_SA: &str =
    "system:serviceaccount:cozy-address-controller-metallb:address-controller-metallb-driver";

/// As the platform's admin (system:masters): Ok(stdout) or Err(stderr).
fn platform(args: &[&str], stdin: &str) -> Result<String, String> {
    kubectl_as("platform-admin", &["system:masters"], args, stdin)
}

fn a_tenant_of_the_platform_uses_its_addresses_through_the_platforms_own_roles() {
    let platform_files = platform_dir().unwrap();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(tenant_journey(&platform_files));
}

async fn tenant_journey(platform_files: &Path) {
    let _ = setup().await;
    let sfx = random_suffix();
    let (acme, other) = (format!("tenant-acme{sfx}"), format!("tenant-other{sfx}"));
    let mut cleanup = Cleanup::default();

    the_platform_has_its_roles_and_tenants(platform_files, &[&acme, &other], &mut cleanup);

    // The packages, as the platform installs them: the core, then the driver (after MetalLB).
    clear_leftovers();
    let _ = platform(
        &[
            "delete",
            "clusterrole",
            "cozy:addresses",
            "cozy:addresses:view",
            "cozy:addresses:admin",
            "--ignore-not-found",
        ],
        "",
    );
    let port = free_port();
    let core = Release::new_package(
        &package_dir("address-controller"),
        "address-controller",
        "cozy-address-controller",
        &json!({"address-controller": Release::local_values(port, &json!({}))}),
    );
    // The platform's MetalLB (the real controller; its namespace here is the tests').
    let _metallb = MetalLb::start(None).await.unwrap();
    wait_for("MetalLB's API is served", WAIT, || async {
        Ok(platform(&["get", "ipaddresspools.metallb.io", "-A"], "")
            .is_ok()
            .then_some(()))
    })
    .await
    .unwrap();
    let driver = Release::new_package(
        &package_dir("address-controller-metallb"),
        "address-controller-metallb",
        DRIVER_NS,
        &json!({"address-controller": {"metallbDriver": {"metallbNamespace": METALLB_NS}}}),
    );
    the_driver_package_renders_the_driver_and_the_fence_and_none_of_the_core(&driver);

    // The core and the driver run as the packages' ServiceAccounts (no kubelet), the views
    // behind the package's APIService.
    let runner = Runner::with(&core, None);
    let ctl = runner
        .controller("packaged", Some(port), &[])
        .await
        .unwrap();
    let driver_proc = Runner::driver_only(&driver, METALLB)
        .driver("packaged-driver", &[])
        .await
        .unwrap();
    wait_for("APIService Available", WAIT, apiservice_available)
        .await
        .unwrap();

    let [admin, viewer, sa] = Who::in_tenant(&acme);
    wait_for(
        "cozy:tenant:admin and cozy:tenant:view aggregate the package's roles",
        WAIT,
        || async {
            Ok(
                (admin.can("create", CLAIMS, &acme) && viewer.can("list", HISTORY, &acme))
                    .then_some(()),
            )
        },
    )
    .await
    .unwrap();
    the_access_table_holds(&[&admin, &viewer, &sa], &acme, &other);

    let (address, address_name) =
        the_admin_claims_its_service_shows_it_and_both_read_only_their_own(
            &admin,
            &viewer,
            &acme,
            &other,
            &sfx,
            &mut cleanup,
        )
        .await;
    the_fence_refuses_a_metallb_pin_in_a_tenant_namespace_and_lets_the_driver_pin(
        &acme,
        &address,
        &sfx,
        &mut cleanup,
    );

    // Uninstalling the package withdraws the grant; the ledger stays.
    drop(driver_proc);
    drop(ctl);
    drop(driver);
    core.uninstall().unwrap();
    wait_for("the grant is withdrawn", WAIT, || async {
        Ok((!admin.can("create", CLAIMS, &acme)).then_some(()))
    })
    .await
    .unwrap();
    let refused = admin
        .kubectl(&["create", "-f", "-"], &claim_json(&acme, "late", &sfx))
        .expect_err("a claim created after the package is gone");
    assert!(refused.contains("forbidden"), "{refused}");
    let kept = platform(
        &[
            "get",
            CLAIMS,
            "web",
            "-n",
            &acme,
            "-o",
            "jsonpath={.status.phase}",
        ],
        "",
    )
    .unwrap();
    assert_eq!(
        kept, "Bound",
        "the claim stays, Bound, when the package goes"
    );
    let bound_to = platform(
        &[
            "get",
            "ipaddresses.local.sdn.cozystack.io",
            &address_name,
            "-o",
            "jsonpath={.spec.claimRef.namespace}/{.spec.claimRef.name}",
        ],
        "",
    )
    .unwrap();
    assert_eq!(bound_to, format!("{acme}/web"), "the address stays bound");
    // Nobody is left to release the finalizers: the test does, so its namespaces go.
    for (kind, ns, name) in [
        (CLAIMS, acme.as_str(), "web"),
        ("ipaddresses.local.sdn.cozystack.io", "", &*address_name),
    ] {
        let mut args = vec![
            "patch",
            kind,
            name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        let _ = platform(&args, "");
    }
    drop(core);
}

/// The platform's tenant roles, applied as they are, and tenants (children of tenant-root)
/// with their RoleBindings rendered from the platform's own template.
fn the_platform_has_its_roles_and_tenants(
    platform_files: &Path,
    tenants: &[&str],
    cleanup: &mut Cleanup,
) {
    let cluster = Cluster::get();
    let roles = platform_files.join(ROLES);
    let applied = cluster
        .kubectl_ok(&["apply", "-f", roles.to_str().unwrap(), "-o", "name"])
        .unwrap();
    for role in applied.lines() {
        let name = role.trim_start_matches("clusterrole.rbac.authorization.k8s.io/");
        cleanup.add("clusterroles.rbac.authorization.k8s.io", name);
    }
    // The platform's own namespaces stay (a namespace being deleted would refuse the next
    // run's bindings); the tenants' go with the test.
    for ns in ["tenant-root", "cozy-public"] {
        let _ = platform(&["create", "namespace", ns], "");
    }
    for ns in tenants {
        platform(&["create", "namespace", ns], "").unwrap();
        cleanup.add("namespaces", ns);
    }
    for ns in tenants {
        let docs = tenant_bindings(platform_files, ns.trim_start_matches("tenant-"));
        cluster
            .apply(&docs)
            .unwrap_or_else(|e| panic!("applying {ns}'s bindings: {e:#}"));
    }
}

/// Where MetalLB's API is served the driver's package renders the driver and its fence, and
/// nothing of the core (no APIService, no controller, no tenant roles of its own).
fn the_driver_package_renders_the_driver_and_the_fence_and_none_of_the_core(driver: &Release) {
    let objs = driver.manifest();
    let names: Vec<String> = objs.iter().map(kind_name).collect();
    for want in [
        "Deployment/address-controller-metallb-driver",
        "ValidatingAdmissionPolicy/address-controller-metallb-pins",
        "ValidatingAdmissionPolicyBinding/address-controller-metallb-pins",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    let core = |n: &String| {
        n.starts_with("APIService/")
            || n == "Deployment/address-controller"
            || n.starts_with("ClusterRole/address-controller-aggregate")
            || n.starts_with("ClusterRole/cozy:")
    };
    assert!(
        !names.iter().any(core),
        "the driver's package renders the core: {names:?}"
    );
    let deploy = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let args = deploy["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    // The platform's cozy-metallb is the package's value (its helm unittest suite); here
    // the test's MetalLB namespace overrides it.
    assert!(
        args.contains(&format!("--metallb-namespace={METALLB_NS}")),
        "{args}"
    );
    assert!(
        args.contains(&format!("--hold-namespace={DRIVER_NS}")),
        "{args}"
    );
}

/// The SubjectAccessReview table: rows × the platform's tenant roles, allowed or denied,
/// printed (the closing note's table) and asserted.
fn the_access_table_holds(who: &[&Who; 3], own: &str, other: &str) {
    let none = "";
    // (what, verb, resource, namespace, [admin, view, tenant SA])
    let rows: Vec<(&str, &str, &str, &str, [bool; 3])> = vec![
        ("create a claim", "create", CLAIMS, own, [true, false, true]),
        ("read claims", "list", CLAIMS, own, [true, true, true]),
        ("watch claims", "watch", CLAIMS, own, [true, true, true]),
        (
            "update a claim (sharing grants)",
            "update",
            CLAIMS,
            own,
            [true, false, true],
        ),
        ("patch a claim", "patch", CLAIMS, own, [true, false, true]),
        ("delete a claim", "delete", CLAIMS, own, [true, false, true]),
        (
            "write a claim's status",
            "update",
            "ipaddressclaims.local.sdn.cozystack.io/status",
            own,
            [false, false, false],
        ),
        ("read its quota", "get", QUOTAS, own, [true, true, true]),
        (
            "write its quota",
            "patch",
            QUOTAS,
            own,
            [false, false, false],
        ),
        (
            "create a quota",
            "create",
            QUOTAS,
            own,
            [false, false, false],
        ),
        (
            "read namespaceaddresses",
            "get",
            HOLDINGS,
            own,
            [true, true, true],
        ),
        (
            "read namespaceaddresses/addresses",
            "get",
            RECORDS,
            own,
            [true, true, true],
        ),
        (
            "read addressholdings",
            "list",
            HISTORY,
            own,
            [true, true, true],
        ),
        (
            "read another tenant's claims",
            "list",
            CLAIMS,
            other,
            [false, false, false],
        ),
        (
            "read another tenant's namespaceaddresses",
            "get",
            HOLDINGS,
            other,
            [false, false, false],
        ),
        (
            "read another tenant's addressholdings",
            "list",
            HISTORY,
            other,
            [false, false, false],
        ),
        (
            "read another tenant's quota",
            "get",
            QUOTAS,
            other,
            [false, false, false],
        ),
        (
            "read claims of every namespace",
            "list",
            CLAIMS,
            none,
            [false, false, false],
        ),
        (
            "read IPAddresses",
            "list",
            "ipaddresses.local.sdn.cozystack.io",
            none,
            [false, false, false],
        ),
        (
            "read IPAddressClasses",
            "list",
            "ipaddressclasses.local.sdn.cozystack.io",
            none,
            [false, false, false],
        ),
        (
            "read IPAddressRecords",
            "list",
            "ipaddressrecords.local.sdn.cozystack.io",
            none,
            [false, false, false],
        ),
        (
            "read poolavailabilities",
            "list",
            "poolavailabilities.view.local.sdn.cozystack.io",
            none,
            [false, false, false],
        ),
        ("read Secrets", "get", "secrets", own, [false, false, false]),
        (
            "create a Service",
            "create",
            "services",
            own,
            [false, false, false],
        ),
        (
            "patch a Service (a MetalLB pin)",
            "patch",
            "services",
            own,
            [false, false, false],
        ),
        (
            "create a MetalLB pool",
            "create",
            "ipaddresspools.metallb.io",
            "cozy-metallb",
            [false, false, false],
        ),
    ];
    let mut table = format!(
        "| request | {} | {} | {} |\n|---|---|---|---|\n",
        who[0].label, who[1].label, who[2].label
    );
    let mut wrong = Vec::new();
    for (what, verb, resource, ns, want) in &rows {
        let got: Vec<bool> = who.iter().map(|w| w.can(verb, resource, ns)).collect();
        let cell = |b: bool| if b { "allowed" } else { "denied" };
        table.push_str(&format!(
            "| {what} (`{verb} {resource}`{}) | {} | {} | {} |\n",
            if ns.is_empty() {
                String::new()
            } else if *ns == own {
                " own".into()
            } else {
                format!(" in {ns}")
            },
            cell(got[0]),
            cell(got[1]),
            cell(got[2])
        ));
        for (i, w) in who.iter().enumerate() {
            if got[i] != want[i] {
                wrong.push(format!(
                    "{}: {what}: {} (want {})",
                    w.label,
                    cell(got[i]),
                    cell(want[i])
                ));
            }
        }
    }
    println!("SubjectAccessReviews, the platform's roles with the packages installed:\n{table}");
    assert!(wrong.is_empty(), "{wrong:#?}\n{table}");
}

fn claim_json(ns: &str, name: &str, sfx: &str) -> String {
    json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": ns}, "spec": {"className": format!("pkg-{sfx}")}})
    .to_string()
}

/// The real requests, through kubectl as the tenant's users: the admin claims an address of
/// the platform's MetalLB class, the platform writes the Service that names the claim (as its
/// charts write a tenant's Services), and the tenant sees the address on it — from MetalLB;
/// the admin reads the views and its quota and shares its address; the viewer reads and
/// cannot write; neither reads another tenant's or anything cluster-scoped. Returns the
/// address and its IPAddress's name.
async fn the_admin_claims_its_service_shows_it_and_both_read_only_their_own(
    admin: &Who,
    viewer: &Who,
    acme: &str,
    other: &str,
    sfx: &str,
    cleanup: &mut Cleanup,
) -> (String, String) {
    let class = format!("pkg-{sfx}");
    cleanup.add("ipaddressclasses.local.sdn.cozystack.io", &class);
    for o in [
        json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
            "metadata": {"name": class},
            "spec": {"provisioner": "metallb.drivers.local.sdn.cozystack.io",
                "parameters": {"addresses": ["198.18.61.0/29"]}}}),
        json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressQuota",
            "metadata": {"name": "addresses", "namespace": acme},
            "spec": {"limits": [{"className": class, "addresses": 2}]}}),
    ] {
        platform(&["create", "-f", "-"], &o.to_string()).unwrap();
    }
    admin
        .kubectl(&["create", "-f", "-"], &claim_json(acme, "web", sfx))
        .unwrap();
    let claim: Value = wait_for("the tenant's claim is Bound", WAIT, || async {
        let c: Value = serde_json::from_str(
            &admin
                .kubectl(&["get", CLAIMS, "web", "-n", acme, "-o", "json"], "")
                .unwrap(),
        )
        .unwrap();
        Ok((c["status"]["phase"] == "Bound").then_some(c))
    })
    .await
    .unwrap();
    let address = claim["status"]["addresses"][0]["address"]
        .as_str()
        .unwrap()
        .to_string();
    let address_name = claim["status"]["addresses"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &address_name);
    // The platform writes the tenant's Service (tenants create none), naming the claim.
    platform(
        &["create", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": acme,
                "annotations": {"local.sdn.cozystack.io/ip-address-claim": "web"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}})
        .to_string(),
    )
    .unwrap();
    // The last step: the tenant sees its address on its Service (the platform's view role
    // reads Services), put there by MetalLB.
    wait_for(
        "the tenant's Service shows its claim's address",
        WAIT,
        || async {
            let ip = viewer
                .kubectl(
                    &[
                        "get",
                        "service",
                        "web",
                        "-n",
                        acme,
                        "-o",
                        "jsonpath={.status.loadBalancer.ingress[*].ip}",
                    ],
                    "",
                )
                .unwrap();
            Ok((ip == address).then_some(()))
        },
    )
    .await
    .unwrap();
    // The owner lets its other Services share the address: a write of the claim's spec.
    admin
        .kubectl(
            &[
                "patch",
                CLAIMS,
                "web",
                "-n",
                acme,
                "--type=merge",
                "-p",
                r#"{"spec":{"sharing":{"policy":"SameNamespace"}}}"#,
            ],
            "",
        )
        .unwrap();

    let holdings: Value = serde_json::from_str(
        &admin
            .kubectl(
                &["get", "namespaceaddresses", acme, "-n", acme, "-o", "json"],
                "",
            )
            .unwrap(),
    )
    .unwrap();
    assert!(holdings.to_string().contains(&address), "{holdings}");
    let records = admin
        .kubectl(
            &["get", "--raw", &format!(
                "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{acme}/namespaceaddresses/{acme}/addresses"
            )],
            "",
        )
        .unwrap();
    assert!(records.contains(&address), "{records}");
    wait_for("the holding is in addressholdings", WAIT, || async {
        let h = admin
            .kubectl(&["get", "addressholdings", "-n", acme, "-o", "json"], "")
            .unwrap();
        Ok(h.contains(&address).then_some(()))
    })
    .await
    .unwrap();
    let quota = admin
        .kubectl(&["get", QUOTAS, "-n", acme, "-o", "name"], "")
        .unwrap();
    assert!(quota.contains("addresses"), "{quota}");

    let claims = viewer
        .kubectl(&["get", CLAIMS, "-n", acme, "-o", "name"], "")
        .unwrap();
    assert!(claims.contains("/web"), "{claims}");
    viewer
        .kubectl(&["get", "namespaceaddresses", acme, "-n", acme], "")
        .unwrap();
    let refused = viewer
        .kubectl(&["create", "-f", "-"], &claim_json(acme, "mine", sfx))
        .expect_err("the viewer created a claim");
    assert!(refused.contains("forbidden"), "{refused}");

    for who in [admin, viewer] {
        for args in [
            vec!["get", CLAIMS, "-n", other],
            vec!["get", "namespaceaddresses", other, "-n", other],
            vec!["get", "addressholdings", "-n", other],
            vec!["get", "ipaddresses.local.sdn.cozystack.io"],
            vec!["get", "ipaddressclasses.local.sdn.cozystack.io"],
            vec!["get", "ipaddressrecords.local.sdn.cozystack.io"],
            vec!["get", "poolavailabilities"],
            vec!["get", "secrets", "-n", acme],
        ] {
            let err = who
                .kubectl(&args, "")
                .expect_err(&format!("{} may {args:?}", who.label));
            assert!(err.to_lowercase().contains("forbidden"), "{args:?}: {err}");
        }
    }
    (address, address_name)
}

/// The fence, scoped to `tenant-*`: nobody but the driver's ServiceAccount sets, changes or
/// removes a MetalLB pin on a tenant's Service — not even the platform's admin, whose charts
/// write tenants' Services — while an unchanged pin lets the rest of the Service be edited;
/// outside the tenants' namespaces the fence does not apply.
fn the_fence_refuses_a_metallb_pin_in_a_tenant_namespace_and_lets_the_driver_pin(
    acme: &str,
    address: &str,
    sfx: &str,
    cleanup: &mut Cleanup,
) {
    // The driver pinned the claim's Service itself (MetalLB's annotation, its address).
    let pinned = platform(
        &[
            "get",
            "service",
            "web",
            "-n",
            acme,
            "-o",
            r"jsonpath={.metadata.annotations.metallb\.io/loadBalancerIPs}",
        ],
        "",
    )
    .unwrap();
    assert_eq!(pinned, address, "the driver's pin on the claim's Service");
    // And may pin another of the tenant's Services (a server-side dry run as its
    // ServiceAccount, which may patch Services and create none).
    let pinned_service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "pinned", "namespace": acme,
            "annotations": {"metallb.io/loadBalancerIPs": address}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    let mut second = pinned_service.clone();
    second["metadata"]["name"] = json!("second");
    second["metadata"]["annotations"] = json!({});
    platform(&["create", "-f", "-"], &second.to_string()).unwrap();
    let pin = format!("metallb.io/loadBalancerIPs={address}");
    kubectl_as(
        DRIVER_SA,
        &[],
        &[
            "annotate",
            "--dry-run=server",
            "service",
            "second",
            "-n",
            acme,
            &pin,
        ],
        "",
    )
    .unwrap_or_else(|e| panic!("the driver's pin was refused: {e}"));

    // Anyone else: refused, on create and on update, the platform's admin included.
    let err = platform(&["create", "-f", "-"], &pinned_service.to_string())
        .expect_err("a tenant's Service created with a MetalLB pin");
    assert!(err.contains("address-controller-metallb-pins"), "{err}");
    for args in [
        vec![
            "annotate",
            "--overwrite",
            "service",
            "web",
            "-n",
            acme,
            "metallb.io/loadBalancerIPs=198.18.61.7",
        ],
        vec![
            "annotate",
            "service",
            "web",
            "-n",
            acme,
            "metallb.io/loadBalancerIPs-",
        ],
        vec![
            "annotate",
            "--overwrite",
            "service",
            "web",
            "-n",
            acme,
            "metallb.io/allow-shared-ip=mine",
        ],
    ] {
        let err = platform(&args, "").expect_err(&format!("{args:?} passed the fence"));
        assert!(
            err.contains("address-controller-metallb-pins"),
            "{args:?}: {err}"
        );
    }
    // The pin unchanged, the rest of the Service stays editable.
    platform(&["label", "service", "web", "-n", acme, "tier=web"], "").unwrap();

    // Outside the tenants' namespaces the fence does not apply.
    let elsewhere = format!("platform-{sfx}");
    platform(&["create", "namespace", &elsewhere], "").unwrap();
    cleanup.add("namespaces", &elsewhere);
    let mut outside = pinned_service;
    outside["metadata"]["namespace"] = json!(elsewhere);
    platform(
        &["create", "--dry-run=server", "-f", "-"],
        &outside.to_string(),
    )
    .unwrap_or_else(|e| panic!("the fence applied outside tenant-*: {e}"));
}
