//! What each component and each tenant role may do: each component changes only its own keys, each ServiceAccount has exactly its written rights, the aggregated roles.

use super::*;

/// The component policy (on by default): each component's own ServiceAccount changes on a
/// tenant's Service only what is its own — the core the claim annotation, a driver its
/// record (the MetalLB driver also MetalLB's pins), the range driver the status — and no
/// component changes its spec or labels.
#[tokio::test]
async fn each_component_changes_only_its_own_keys_on_a_tenants_service() {
    let _one = INSTALL.lock().await;
    let (cluster, client) = setup().await;
    let release = Release::new(
        free_port(),
        &json!({"rangeDriver": {"enabled": true}, "metallbDriver": {"enabled": true,
            "admissionPolicy": {"enabled": false}}}),
    )
    .await;
    let tenant = TestNamespace::create(&client, "chart-writes")
        .await
        .unwrap();
    let t = tenant.name.as_str();
    cluster
        .kubectl_ok(&[
            "create",
            "service",
            "loadbalancer",
            "web",
            "--tcp=80:80",
            "-n",
            t,
        ])
        .unwrap();
    let groups = [
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{}", release.ns),
    ];
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    let as_sa = |name: &str, args: &[&str]| {
        kubectl_as(
            &format!("system:serviceaccount:{}:{name}", release.ns),
            &groups,
            args,
            "",
        )
    };
    let annotate =
        |key: &str, value: &str| json!({"metadata": {"annotations": {key: value}}}).to_string();
    let patch = |sa: &str, body: &str| {
        as_sa(
            sa,
            &["patch", "svc", "web", "-n", t, "--type=merge", "-p", body],
        )
    };
    let core = "address-controller";
    let range = "address-controller-range-driver";
    let metallb = "address-controller-metallb-driver";
    // The policy is active within moments: the core writing a key not its own is refused.
    let refused = wait_for(
        "the policy refuses the core a foreign key",
        WAIT,
        || async {
            match patch(core, &annotate("metallb.io/loadBalancerIPs", "198.18.93.1")) {
                Ok(_) => {
                    // Undo as the admin and try again.
                    cluster
                        .kubectl_ok(&[
                            "annotate",
                            "svc",
                            "web",
                            "-n",
                            t,
                            "metallb.io/loadBalancerIPs-",
                        ])
                        .map_err(|e| anyhow::anyhow!(e))?;
                    Ok(None)
                }
                Err(e) if e.contains("ValidatingAdmissionPolicy") => Ok(Some(e)),
                Err(e) => Err(anyhow::anyhow!(e)),
            }
        },
    )
    .await
    .unwrap();
    assert!(refused.contains("the core may change only"), "{refused}");
    const CLAIM: &str = "local.sdn.cozystack.io/ip-address-claim";
    const PIN: &str = "metallb.io/loadBalancerIPs";
    const RANGE_MARK: &str = "range-driver.drivers.local.sdn.cozystack.io/pinned";
    const METALLB_MARK: &str = "metallb-driver.drivers.local.sdn.cozystack.io/pinned";
    let mut cases: Vec<(&str, String, bool)> = [
        (core, CLAIM, "web", true),
        (core, RANGE_MARK, "198.18.93.1", false),
        (range, RANGE_MARK, "198.18.93.1", true),
        (range, PIN, "198.18.93.1", false),
        (range, CLAIM, "other", false),
        (metallb, PIN, "198.18.93.1", true),
        (metallb, METALLB_MARK, "198.18.93.1", true),
        (metallb, RANGE_MARK, "198.18.93.2", false),
    ]
    .into_iter()
    .map(|(sa, key, value, allowed)| (sa, annotate(key, value), allowed))
    .collect();
    cases.push((
        core,
        json!({"spec": {"externalTrafficPolicy": "Local"}}).to_string(),
        false,
    ));
    cases.push((
        metallb,
        json!({"metadata": {"labels": {"tier": "x"}}}).to_string(),
        false,
    ));
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|(sa, body, allowed)| {
            let got = patch(sa, body);
            (got.is_ok() != *allowed).then(|| format!("{sa} {body}: {got:?}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    the_status_is_each_drivers_own(&release.ns, t, range, metallb).await;
    // A tenant's own edits are not the policy's business.
    cluster
        .kubectl_ok(&["label", "svc", "web", "-n", t, "tier=web"])
        .unwrap();
    drop(tenant);
    drop(release);
}

/// The status: status.loadBalancer is the range driver's (the load balancer) alone; each
/// driver writes its AddressAttached condition and no other. (kubectl reads the status
/// before it patches, which no driver may: a client impersonating the ServiceAccount
/// patches it as the driver does.)
async fn the_status_is_each_drivers_own(
    release_ns: &str,
    t: &str,
    range: &'static str,
    metallb: &'static str,
) {
    let cluster = Cluster::get();
    let on_status = |sa: &'static str, status: Value| {
        let ns = release_ns.to_string();
        async move {
            let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
            let mut config = kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .unwrap();
            config.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:{sa}"));
            config.auth_info.impersonate_groups = Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
            ]);
            let services: Api<k8s_openapi::api::core::v1::Service> =
                Api::namespaced(kube::Client::try_from(config).unwrap(), t);
            services
                .patch_status("web", &PatchParams::default(), &Patch::Strategic(&status))
                .await
        }
    };
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.18.93.1"}]}}});
    let condition = |ty: &str, reason: &str| {
        json!({"status": {"conditions": [{"type": ty, "status": "False", "reason": reason,
            "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    };
    let ours = address_controller_api::sharing::CONDITION;
    on_status(range, ingress.clone()).await.unwrap();
    on_status(range, condition(ours, "NotShared"))
        .await
        .unwrap();
    on_status(metallb, condition(ours, "PortConflict"))
        .await
        .unwrap();
    let other_ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.18.93.2"}]}}});
    for (sa, body) in [
        (metallb, other_ingress),
        (metallb, condition("Ready", "Other")),
        (range, condition("Ready", "Other")),
    ] {
        let err = on_status(sa, body.clone()).await.unwrap_err();
        assert!(err.to_string().contains("forbidden"), "{sa} {body}: {err}");
    }
}

/// Least privilege (#45): each component's ServiceAccount, read by SubjectAccessReviews
/// against the installed chart, has exactly the rights of this written table — its Lease in
/// the release namespace only (a Role), the MetalLB driver's holds there only, no Service
/// created or deleted by anyone else, no event ever patched.
#[tokio::test]
async fn each_components_service_account_has_exactly_its_written_rights() {
    let _one = INSTALL.lock().await;
    let (_, client) = setup().await;
    let release = Release::new(
        free_port(),
        &json!({"rangeDriver": {"enabled": true}, "metallbDriver": {"enabled": true}}),
    )
    .await;
    let tenant = TestNamespace::create(&client, "chart-least").await.unwrap();
    let (rel, t) = (release.ns.as_str(), tenant.name.as_str());
    let sa = |name: &str| format!("system:serviceaccount:{rel}:{name}");
    let groups = [
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{rel}"),
        "system:authenticated".to_string(),
    ];
    let can = |user: &str, verb: &str, resource: &str, ns: &str| {
        allowed(user, &groups, verb, resource, ns)
    };
    let (core, range, metallb) = (
        sa("address-controller"),
        sa("address-controller-range-driver"),
        sa("address-controller-metallb-driver"),
    );
    let table = written_rights([&core, &range, &metallb], rel, t);
    let wrong: Vec<String> = table
        .iter()
        .filter(|(user, verb, resource, ns, want)| can(user, verb, resource, ns) != *want)
        .map(|(user, verb, resource, ns, want)| {
            format!("{user} {verb} {resource} in {ns:?}: want {want}")
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    drop(tenant);
    drop(release);
}

/// The written table of rights: (user, verb, resource, namespace, allowed) for the core's,
/// the range driver's and the MetalLB driver's ServiceAccounts, in the release namespace
/// `rel` and a tenant's `t`.
fn written_rights<'a>(
    [core, range, metallb]: [&'a str; 3],
    rel: &'a str,
    t: &'a str,
) -> Vec<(&'a str, &'a str, &'a str, &'a str, bool)> {
    const LEASES: &str = "leases.coordination.k8s.io";
    const EVENTS: &str = "events.events.k8s.io";
    vec![
        // Every component: its Lease in the release namespace, no other.
        (core, "create", LEASES, rel, true),
        (core, "update", LEASES, rel, true),
        (core, "create", LEASES, "default", false),
        (core, "update", LEASES, t, false),
        (range, "update", LEASES, rel, true),
        (range, "create", LEASES, "kube-system", false),
        (metallb, "update", LEASES, rel, true),
        (metallb, "update", LEASES, t, false),
        // The core reads the drivers' Leases anywhere (DriverAvailable), writes none.
        (core, "list", LEASES, "", true),
        (core, "delete", LEASES, rel, false),
        // Events are created, never patched.
        (core, "create", EVENTS, t, true),
        (core, "patch", EVENTS, t, false),
        (range, "patch", EVENTS, t, false),
        // The MetalLB driver reads MetalLB's core events (why it refused a Service); the
        // range driver, the load balancer itself, has no need.
        (metallb, "list", "events", t, true),
        (metallb, "patch", "events", t, false),
        (range, "list", "events", t, false),
        // The drivers read the EndpointSlices of the Services cozy-proxy serves, and write none.
        (range, "list", "endpointslices.discovery.k8s.io", t, true),
        (metallb, "watch", "endpointslices.discovery.k8s.io", t, true),
        (range, "update", "endpointslices.discovery.k8s.io", t, false),
        // ... and KubeVirt's VMIs (which pods run one VM), and write none; the core neither.
        (
            metallb,
            "watch",
            "virtualmachineinstances.kubevirt.io",
            t,
            true,
        ),
        (
            range,
            "list",
            "virtualmachineinstances.kubevirt.io",
            t,
            true,
        ),
        (
            range,
            "patch",
            "virtualmachineinstances.kubevirt.io",
            t,
            false,
        ),
        (
            core,
            "list",
            "virtualmachineinstances.kubevirt.io",
            t,
            false,
        ),
        // Services: the MetalLB driver's holds in the release namespace only; nobody else
        // creates or deletes any.
        (metallb, "create", "services", rel, true),
        (metallb, "delete", "services", rel, true),
        (metallb, "create", "services", t, false),
        (metallb, "delete", "services", t, false),
        (core, "create", "services", t, false),
        (core, "delete", "services", t, false),
        (range, "create", "services", t, false),
        (range, "delete", "services", t, false),
        // Who writes what on a tenant's Service: the drivers its status (the range driver
        // the load balancer's part, both their AddressAttached condition — the component
        // policy narrows it); the core and the drivers patch (each its own keys,
        // docs/operations.md "Threat model").
        (range, "patch", "services/status", t, true),
        (metallb, "patch", "services/status", t, true),
        (core, "patch", "services/status", t, false),
        (core, "patch", "services", t, true),
        // The ledger: the core deletes addresses, the drivers create them, nobody else.
        (
            core,
            "delete",
            "ipaddresses.local.sdn.cozystack.io",
            "",
            true,
        ),
        (
            range,
            "create",
            "ipaddresses.local.sdn.cozystack.io",
            "",
            true,
        ),
        (
            range,
            "delete",
            "ipaddresses.local.sdn.cozystack.io",
            "",
            false,
        ),
        (
            metallb,
            "delete",
            "ipaddresses.local.sdn.cozystack.io",
            "",
            false,
        ),
        (
            core,
            "create",
            "ipaddresses.local.sdn.cozystack.io",
            "",
            false,
        ),
        // Quotas are the admin's: read by the core, written by no component.
        (
            core,
            "list",
            "ipaddressquotas.local.sdn.cozystack.io",
            "",
            true,
        ),
        (
            core,
            "update",
            "ipaddressquotas.local.sdn.cozystack.io",
            t,
            false,
        ),
        (
            range,
            "list",
            "ipaddressquotas.local.sdn.cozystack.io",
            "",
            false,
        ),
        // The history's records: the core creates and prunes them, a driver only creates.
        (
            core,
            "delete",
            "ipaddressrecords.local.sdn.cozystack.io",
            "",
            true,
        ),
        (
            range,
            "create",
            "ipaddressrecords.local.sdn.cozystack.io",
            "",
            true,
        ),
        (
            metallb,
            "delete",
            "ipaddressrecords.local.sdn.cozystack.io",
            "",
            false,
        ),
        // MetalLB's objects: only the MetalLB driver.
        (
            metallb,
            "create",
            "ipaddresspools.metallb.io",
            "metallb-system",
            true,
        ),
        (
            range,
            "create",
            "ipaddresspools.metallb.io",
            "metallb-system",
            false,
        ),
        (
            core,
            "create",
            "ipaddresspools.metallb.io",
            "metallb-system",
            false,
        ),
    ]
}

#[tokio::test]
async fn aggregated_roles_give_a_namespace_editor_exactly_claims_and_views() {
    let _one = INSTALL.lock().await;
    let (_, client) = setup().await;
    let release = Release::new(free_port(), &json!({})).await;
    let a = TestNamespace::create(&client, "chart-rbac-a")
        .await
        .unwrap();
    let b = TestNamespace::create(&client, "chart-rbac-b")
        .await
        .unwrap();
    let cleanup = each_role_bound_to_its_user(&a.name);
    // SubjectAccessReviews with explicit attributes: no discovery involved, so the answer
    // does not depend on the (here unavailable) aggregated API.
    let can =
        |user: &str, verb: &str, resource: &str, ns: &str| allowed(user, &[], verb, resource, ns);
    const CLAIMS: &str = "ipaddressclaims.local.sdn.cozystack.io";
    const QUOTAS: &str = "ipaddressquotas.local.sdn.cozystack.io";
    const HOLDINGS: &str = "namespaceaddresses.view.local.sdn.cozystack.io";
    const RECORDS: &str = "namespaceaddresses.view.local.sdn.cozystack.io/addresses";
    const ADDRESSES: &str = "ipaddresses.local.sdn.cozystack.io";
    const RECORDS_KIND: &str = "ipaddressrecords.local.sdn.cozystack.io";
    const VIEW_HOLDINGS: &str = "addressholdings.view.local.sdn.cozystack.io";
    // The ClusterRole aggregation controller folds the chart's roles in.
    let (na, nb) = (a.name.as_str(), b.name.as_str());
    wait_for(
        "edit and view aggregate the chart's roles",
        WAIT,
        || async {
            Ok((can("editor", "create", CLAIMS, na)
                && can("viewer", "list", HOLDINGS, na)
                && can("abuse-desk", "list", ADDRESSES, ""))
            .then_some(()))
        },
    )
    .await
    .unwrap();
    let table: &[(&str, &str, &str, &str, bool)] = &[
        ("editor", "create", CLAIMS, na, true),
        ("editor", "delete", CLAIMS, na, true),
        ("editor", "patch", CLAIMS, na, true),
        ("editor", "list", CLAIMS, na, true),
        ("editor", "get", HOLDINGS, na, true),
        ("editor", "watch", HOLDINGS, na, true),
        ("editor", "get", RECORDS, na, true),
        (
            "editor",
            "update",
            "ipaddressclaims.local.sdn.cozystack.io/status",
            na,
            false,
        ),
        ("editor", "list", CLAIMS, nb, false),
        ("editor", "get", HOLDINGS, nb, false),
        (
            "editor",
            "list",
            "ipaddresses.local.sdn.cozystack.io",
            "",
            false,
        ),
        (
            "editor",
            "list",
            "ipaddressclasses.local.sdn.cozystack.io",
            "",
            false,
        ),
        (
            "editor",
            "list",
            "poolavailabilities.view.local.sdn.cozystack.io",
            "",
            false,
        ),
        ("viewer", "list", CLAIMS, na, true),
        ("viewer", "get", RECORDS, na, true),
        // Quotas: every tenant role reads them, none writes them — not even admin.
        ("viewer", "list", QUOTAS, na, true),
        ("editor", "get", QUOTAS, na, true),
        ("editor", "create", QUOTAS, na, false),
        ("tenant-admin", "create", CLAIMS, na, true),
        ("tenant-admin", "get", QUOTAS, na, true),
        ("tenant-admin", "create", QUOTAS, na, false),
        ("tenant-admin", "patch", QUOTAS, na, false),
        ("tenant-admin", "delete", QUOTAS, na, false),
        ("quota-manager", "create", QUOTAS, na, true),
        ("quota-manager", "patch", QUOTAS, na, true),
        ("quota-manager", "create", QUOTAS, nb, false),
        ("viewer", "create", CLAIMS, na, false),
        ("viewer", "delete", CLAIMS, na, false),
        // The abuse desk, bound cluster-wide: every address's history, read only.
        ("abuse-desk", "list", ADDRESSES, "", true),
        ("abuse-desk", "watch", RECORDS_KIND, "", true),
        ("abuse-desk", "get", RECORDS_KIND, "", true),
        ("abuse-desk", "list", VIEW_HOLDINGS, na, true),
        ("abuse-desk", "list", VIEW_HOLDINGS, nb, true),
        ("abuse-desk", "delete", RECORDS_KIND, "", false),
        ("abuse-desk", "create", RECORDS_KIND, "", false),
        ("abuse-desk", "patch", ADDRESSES, "", false),
        ("abuse-desk", "list", CLAIMS, na, false),
        ("abuse-desk", "list", "secrets", na, false),
        // A tenant's roles read no records: the history of other namespaces' addresses.
        ("tenant-admin", "list", RECORDS_KIND, "", false),
        ("editor", "get", RECORDS_KIND, "", false),
    ];
    for (user, verb, resource, ns, want) in table {
        assert_eq!(
            can(user, verb, resource, ns),
            *want,
            "{user} {verb} {resource} in {ns:?}"
        );
    }

    // The aggregation is togglable: off, the editor loses claims again.
    Release::install(
        &release.ns,
        free_port(),
        &json!({"aggregateRoles": {"enabled": false}}),
    )
    .unwrap();
    wait_for("edit no longer covers claims", WAIT, || async {
        Ok((!can("editor", "create", CLAIMS, na)).then_some(()))
    })
    .await
    .unwrap();
    assert!(!can("viewer", "list", HOLDINGS, na));
    drop(cleanup);
    drop(release);
}

/// The tenant roles bound in namespace `ns` to users named after them (edit, view, a
/// namespace's admin, the platform team's quota role — SPEC §13), and the abuse desk's
/// history reader bound cluster-wide (it reads every namespace's history); the
/// cluster-wide binding's cleanup.
fn each_role_bound_to_its_user(ns: &str) -> Cleanup {
    let cluster = Cluster::get();
    for (user, role) in [
        ("editor", "edit"),
        ("viewer", "view"),
        // A namespace's admin (a tenant) and the platform team's quota role (SPEC §13).
        ("tenant-admin", "admin"),
        ("quota-manager", "address-controller-quota-manager"),
    ] {
        cluster
            .kubectl_ok(&[
                "create",
                "rolebinding",
                user,
                "-n",
                ns,
                "--clusterrole",
                role,
                "--user",
                user,
            ])
            .unwrap();
    }
    let mut cleanup = Cleanup::default();
    let desk = format!("{ns}-abuse-desk");
    cluster
        .kubectl_ok(&[
            "create",
            "clusterrolebinding",
            &desk,
            "--clusterrole",
            "address-controller-history-reader",
            "--user",
            "abuse-desk",
        ])
        .unwrap();
    cleanup.add("clusterrolebindings.rbac.authorization.k8s.io", &desk);
    cleanup
}
