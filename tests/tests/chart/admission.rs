//! The chart's admission policies on the real API server: `addressName` reserved to the allowlist, MetalLB's pins to its driver, the classes' entitlements, the core's finalizer writes.

use super::*;

/// `kubectl patch` arguments: a JSON merge patch of claim `name` in `ns`.
fn merge_patch<'a>(ns: &'a str, name: &'a str, patch: &'a str) -> [&'a str; 8] {
    ["patch", "ipc", name, "-n", ns, "--type=merge", "-p", patch]
}

/// A claim manifest for `kubectl create -f -`.
fn claim_json(ns: &str, name: &str, address_name: Option<&str>) -> String {
    let mut spec = json!({"family": "IPv4"});
    if let Some(a) = address_name {
        spec["addressName"] = json!(a);
    }
    json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
    .to_string()
}

/// Waits until kube-apiserver has type-checked the ValidatingAdmissionPolicy `policy`'s CEL
/// (its status at its generation), and asserts it found nothing to warn of.
async fn type_checked_without_warnings(policy: &str) {
    let checked = wait_for(&format!("{policy} type-checked"), WAIT, || async {
        let p: Value = serde_json::from_str(&Cluster::get().kubectl_ok(&[
            "get",
            "validatingadmissionpolicy",
            policy,
            "-o",
            "json",
        ])?)?;
        Ok((p["status"]["observedGeneration"] == p["metadata"]["generation"]).then_some(p))
    })
    .await
    .unwrap();
    assert!(
        checked["status"]["typeChecking"]
            .get("expressionWarnings")
            .is_none(),
        "{policy}: {:#}",
        checked["status"]
    );
}

#[tokio::test]
async fn the_admission_policy_reserves_address_name_to_the_allowlist() {
    let _one = INSTALL.lock().await;
    let (cluster, client) = setup().await;
    // No controller runs here: claims with the core's finalizer would wait for one.
    let release = Release::new(
        free_port(),
        &json!({"protectionPolicy": {"enabled": false},
            "admissionPolicy": {"enabled": true, "allowedUsernames": ["ip-admin"],
            "allowedGroups": ["ip-admins"],
            "namespaceSelector": {"matchLabels": {"address-controller.test/pinning": "reserved"}}}}),
    )
    .await;
    let policy = "address-controller-reserve-address-name";
    // The API server type-checks the policy's CEL: no warnings.
    type_checked_without_warnings(policy).await;

    let guarded = TestNamespace::create(&client, "chart-pin").await.unwrap();
    cluster
        .kubectl_ok(&[
            "label",
            "namespace",
            &guarded.name,
            "address-controller.test/pinning=reserved",
        ])
        .unwrap();
    let open = TestNamespace::create(&client, "chart-open").await.unwrap();
    let g = guarded.name.as_str();
    let tenant =
        |args: &[&str], stdin: &str| kubectl_as("tenant", &["system:masters"], args, stdin);
    let create = ["create", "-f", "-"];

    // A tenant may not set it. The policy becomes active within moments of its creation;
    // until then each attempt uses a fresh name.
    let attempt = std::sync::atomic::AtomicU32::new(0);
    let denied = wait_for(
        "the policy denies a tenant's pinned claim",
        WAIT,
        || async {
            let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match tenant(
                &create,
                &claim_json(g, &format!("pinned-by-tenant-{n}"), Some("a")),
            ) {
                Ok(_) => Ok(None),
                Err(e) if e.contains("ValidatingAdmissionPolicy") => Ok(Some(e)),
                Err(e) => Err(anyhow::anyhow!(e)),
            }
        },
    )
    .await
    .unwrap();
    assert!(
        denied.contains("spec.addressName is reserved: tenant may not set, change or remove it"),
        "{denied}"
    );
    // ... but may create unpinned claims and may not pin them later.
    tenant(&create, &claim_json(g, "free", None)).unwrap();
    let set = merge_patch(g, "free", r#"{"spec":{"addressName":"a"}}"#);
    let err = tenant(&set, "").unwrap_err();
    assert!(err.contains("spec.addressName is reserved"), "{err}");

    // An allowlisted user and a member of an allowlisted group may.
    kubectl_as(
        "ip-admin",
        &["system:masters"],
        &create,
        &claim_json(g, "pinned", Some("a")),
    )
    .unwrap();
    let change = merge_patch(g, "pinned", r#"{"spec":{"addressName":"b"}}"#);
    kubectl_as("bob", &["system:masters", "ip-admins"], &change, "").unwrap();

    // Edits that leave the field alone pass; changing or removing it does not.
    let label = merge_patch(g, "pinned", r#"{"metadata":{"labels":{"tier":"web"}}}"#);
    tenant(&label, "").unwrap();
    for patch in [
        r#"{"spec":{"addressName":"c"}}"#,
        r#"{"spec":{"addressName":null}}"#,
    ] {
        let args = merge_patch(g, "pinned", patch);
        let err = tenant(&args, "").unwrap_err();
        assert!(
            err.contains("spec.addressName is reserved"),
            "{patch}: {err}"
        );
    }
    let pinned = cluster
        .kubectl_ok(&[
            "get",
            "ipc",
            "pinned",
            "-n",
            g,
            "-o",
            "jsonpath={.spec.addressName}",
        ])
        .unwrap();
    assert_eq!(pinned, "b");

    // Outside the namespace selector the policy does not apply.
    tenant(&create, &claim_json(&open.name, "pinned", Some("a"))).unwrap();

    moving_an_address_is_reserved_too(g, &open.name, &release.ns).await;
    drop(release);
}

/// Moving an address (changing the claim its claimRef names) is reserved too, in every
/// namespace: a tenant can neither reserve, move nor clear; the platform team reserves and
/// moves; the core's own writes and writes that keep the claim pass.
async fn moving_an_address_is_reserved_too(g: &str, open: &str, release_ns: &str) {
    let create = ["create", "-f", "-"];
    let moves = "address-controller-reserve-address-moves";
    type_checked_without_warnings(moves).await;
    let address = format!("chart-move-{}", random_suffix());
    let mut cleanup = Cleanup::default();
    kubectl_as(
        "ip-admin",
        &["system:masters"],
        &create,
        &json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
            "metadata": {"name": address},
            "spec": {"address": "198.18.77.1", "className": "chart-move", "source": {"fromClass": {}}}})
        .to_string(),
    )
    .unwrap();
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &address);
    let point = |to: &str| {
        let patch = if to.is_empty() {
            r#"{"spec":{"claimRef":null}}"#.to_string()
        } else {
            let (ns, name) = to.split_once('/').unwrap();
            json!({"spec": {"claimRef": {"namespace": ns, "name": name}}}).to_string()
        };
        ["patch", "ipa", address.as_str(), "--type=merge", "-p"]
            .into_iter()
            .map(str::to_string)
            .chain([patch])
            .collect::<Vec<String>>()
    };
    let run = |user: &str, groups: &[&str], args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl_as(user, groups, &args, "")
    };
    // The policy becomes active within moments: a tenant's reservation is refused.
    let refused = wait_for("the move policy refuses a tenant", WAIT, || async {
        match run("tenant", &["system:masters"], point(&format!("{g}/mine"))) {
            Ok(_) => {
                run("ip-admin", &["system:masters"], point("")).unwrap();
                Ok(None)
            }
            Err(e) if e.contains("ValidatingAdmissionPolicy") => Ok(Some(e)),
            Err(e) => Err(anyhow::anyhow!(e)),
        }
    })
    .await
    .unwrap();
    assert!(
        refused.contains("spec.claimRef is reserved: tenant may not change the claim this address names (from none to"),
        "{refused}"
    );
    // The platform team reserves and moves; the tenant can neither move nor clear it.
    run("ip-admin", &["system:masters"], point(&format!("{g}/web"))).unwrap();
    run(
        "bob",
        &["system:masters", "ip-admins"],
        point(&format!("{open}/web")),
    )
    .unwrap();
    for to in [format!("{g}/web"), String::new()] {
        let err = run("tenant", &["system:masters"], point(&to)).unwrap_err();
        assert!(err.contains("spec.claimRef is reserved"), "{to:?}: {err}");
    }
    // A write that keeps the claim named passes (the core completing the uid, a label).
    let complete = json!({"spec": {"claimRef": {"uid": "some-uid"}}}).to_string();
    run(
        "tenant",
        &["system:masters"],
        [
            "patch",
            "ipa",
            address.as_str(),
            "--type=merge",
            "-p",
            complete.as_str(),
        ]
        .map(str::to_string)
        .to_vec(),
    )
    .unwrap();
    // The core's ServiceAccount clears a claimRef (the release delay elapsed).
    let core = format!("system:serviceaccount:{release_ns}:address-controller");
    run(&core, &["system:masters"], point("")).unwrap();
    drop(cleanup);
}

/// The MetalLB driver's policy, on by default with the driver: only the drivers'
/// ServiceAccounts introduce, change or remove MetalLB's pin annotations,
/// spec.loadBalancerIP and the drivers' own keys (a forged record of the kit's) on Services
/// of the selected namespaces; unchanged values always pass.
#[tokio::test]
async fn the_metallb_policy_reserves_metallb_pins_to_the_driver() {
    let _one = INSTALL.lock().await;
    let (cluster, client) = setup().await;
    let release = Release::new(
        free_port(),
        &json!({"metallbDriver": {"enabled": true, "admissionPolicy": {
            "namespaceSelector": {"matchLabels": {"address-controller.test/metallb": "guarded"}}}}}),
    )
    .await;
    let policy = "address-controller-metallb-pins";
    type_checked_without_warnings(policy).await;
    let guarded = TestNamespace::create(&client, "chart-mlb").await.unwrap();
    cluster
        .kubectl_ok(&[
            "label",
            "namespace",
            &guarded.name,
            "address-controller.test/metallb=guarded",
        ])
        .unwrap();
    let open = TestNamespace::create(&client, "chart-mlb-open")
        .await
        .unwrap();
    let g = guarded.name.as_str();
    let svc = |ns: &str, name: &str, ann: Value, spec: Value| {
        let mut v = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "annotations": ann},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        for (k, x) in spec.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        v.to_string()
    };
    let create = ["create", "-f", "-"];
    let tenant =
        |args: &[&str], stdin: &str| kubectl_as("tenant", &["system:masters"], args, stdin);
    let driver_sa = format!(
        "system:serviceaccount:{}:address-controller-metallb-driver",
        release.ns
    );
    let pin = json!({"metallb.io/loadBalancerIPs": "198.18.90.1"});
    // Becomes active within moments: each attempt a fresh name.
    let attempt = std::sync::atomic::AtomicU32::new(0);
    let denied = wait_for("the policy denies a tenant's pin", WAIT, || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match tenant(
            &create,
            &svc(g, &format!("pinned-{n}"), pin.clone(), json!({})),
        ) {
            Ok(_) => Ok(None),
            Err(e) if e.contains("ValidatingAdmissionPolicy") => Ok(Some(e)),
            Err(e) => Err(anyhow::anyhow!(e)),
        }
    })
    .await
    .unwrap();
    assert!(
        denied.contains("may not set, change or remove MetalLB pin annotations"),
        "{denied}"
    );
    // spec.loadBalancerIP and a sharing key are refused too; a plain Service is fine.
    for (name, ann, spec) in [
        ("byip", json!({}), json!({"loadBalancerIP": "198.18.90.2"})),
        (
            "share",
            json!({"metallb.io/allow-shared-ip": "k"}),
            json!({}),
        ),
    ] {
        let err = tenant(&create, &svc(g, name, ann, spec)).unwrap_err();
        assert!(err.contains("MetalLB pin annotations"), "{name}: {err}");
    }
    // A forged record of the kit's (the driver's marker, or any key of a driver's).
    for key in [
        "metallb.drivers.local.sdn.cozystack.io/pinned",
        "someone.drivers.local.sdn.cozystack.io/anything",
    ] {
        let err = tenant(
            &create,
            &svc(g, "forged", json!({key: "198.18.90.1"}), json!({})),
        )
        .unwrap_err();
        assert!(
            err.contains("drivers.local.sdn.cozystack.io"),
            "{key}: {err}"
        );
    }
    tenant(&create, &svc(g, "plain", json!({}), json!({}))).unwrap();
    // The driver's ServiceAccount pins (on a Service the tenant made: the driver creates
    // Services in its hold namespace only); the tenant then edits the rest but not the pin.
    tenant(&create, &svc(g, "web", json!({}), json!({}))).unwrap();
    kubectl_as(
        &driver_sa,
        &["system:serviceaccounts"],
        &[
            "patch",
            "svc",
            "web",
            "-n",
            g,
            "--type=merge",
            "-p",
            &json!({"metadata": {"annotations": pin.clone()}}).to_string(),
        ],
        "",
    )
    .unwrap();
    tenant(
        &[
            "patch",
            "svc",
            "web",
            "-n",
            g,
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"tier":"web"}}}"#,
        ],
        "",
    )
    .unwrap();
    let err = tenant(
        &[
            "patch",
            "svc",
            "web",
            "-n",
            g,
            "--type=merge",
            "-p",
            r#"{"metadata":{"annotations":{"metallb.io/loadBalancerIPs":"198.18.90.9"}}}"#,
        ],
        "",
    )
    .unwrap_err();
    assert!(err.contains("MetalLB pin annotations"), "{err}");
    // Outside the selector the policy does not apply.
    tenant(&create, &svc(&open.name, "pinned", pin, json!({}))).unwrap();
    drop(release);
}

/// A claim manifest naming `class` (empty: the default class).
fn class_claim_json(ns: &str, name: &str, class: &str) -> String {
    let mut spec = json!({});
    if !class.is_empty() {
        spec["className"] = json!(class);
    }
    json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
    .to_string()
}

#[tokio::test]
async fn the_entitlement_policy_refuses_claims_of_a_class_that_does_not_admit_the_namespace() {
    let _one = INSTALL.lock().await;
    let (cluster, client) = setup().await;
    // On by default.
    // No controller runs here: claims with the core's finalizer would wait for one.
    let _release = Release::new(
        free_port(),
        &json!({"protectionPolicy": {"enabled": false}}),
    )
    .await;
    let policy = "address-controller-class-namespaces";
    type_checked_without_warnings(policy).await;
    let sfx = random_suffix();
    let gold = format!("chart-gold-{sfx}");
    let open_class = format!("chart-open-{sfx}");
    let mut cleanup = Cleanup::default();
    for (name, extra) in [
        (
            &gold,
            json!({"metadata": {"annotations": {"ipaddressclass.local.sdn.cozystack.io/is-default-class": "true"}},
                "spec": {"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "platinum"]}]}}}),
        ),
        (&open_class, json!({})),
    ] {
        let mut v = json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
            "metadata": {"name": name}, "spec": {"provisioner": "none.chart.test"}});
        address_controller_tests::env::merge(&mut v, extra);
        kubectl_as(
            "admin",
            &["system:masters"],
            &["create", "-f", "-"],
            &v.to_string(),
        )
        .unwrap();
        cleanup.add("ipaddressclasses.local.sdn.cozystack.io", name);
    }
    let silver = TestNamespace::create(&client, "chart-silver")
        .await
        .unwrap();
    let golden = TestNamespace::create(&client, "chart-golden")
        .await
        .unwrap();
    cluster
        .kubectl_ok(&["label", "namespace", &golden.name, "tier=gold"])
        .unwrap();
    let create = ["create", "-f", "-"];
    let tenant =
        |args: &[&str], stdin: &str| kubectl_as("tenant", &["system:masters"], args, stdin);
    // Refused at admission, naming the class and the namespace (the policy becomes active
    // within moments: each attempt uses a fresh name).
    let attempt = std::sync::atomic::AtomicU32::new(0);
    let denied = wait_for(
        "the policy refuses a claim of a class not admitting the namespace",
        WAIT,
        || async {
            let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match tenant(
                &create,
                &class_claim_json(&silver.name, &format!("c{n}"), &gold),
            ) {
                Ok(_) => Ok(None),
                Err(e) if e.contains("ValidatingAdmissionPolicy") => Ok(Some(e)),
                Err(e) => Err(anyhow::anyhow!(e)),
            }
        },
    )
    .await
    .unwrap();
    assert!(
        denied.contains(&format!(
            "IPAddressClass \"{gold}\" does not admit namespace \"{}\"",
            silver.name
        )),
        "{denied}"
    );
    // The default class, when the claim names none.
    let err = tenant(&create, &class_claim_json(&silver.name, "default", "")).unwrap_err();
    assert!(err.contains(&format!("IPAddressClass \"{gold}\"")), "{err}");
    // Another class admits every namespace; the labelled namespace is admitted by both.
    tenant(
        &create,
        &class_claim_json(&silver.name, "other", &open_class),
    )
    .unwrap();
    tenant(&create, &class_claim_json(&golden.name, "gold", &gold)).unwrap();
    tenant(&create, &class_claim_json(&golden.name, "default", "")).unwrap();
    // Changing spec.className to the class is a change it checks; other writes pass.
    let retarget = json!({"spec": {"className": gold}}).to_string();
    let err = tenant(
        &[
            "patch",
            "ipc",
            "other",
            "-n",
            &silver.name,
            "--type=merge",
            "-p",
            &retarget,
        ],
        "",
    )
    .unwrap_err();
    assert!(err.contains("does not admit"), "{err}");
    tenant(
        &["label", "ipc", "other", "-n", &silver.name, "touched=yes"],
        "",
    )
    .unwrap();
    // Relabelled, the namespace is admitted.
    cluster
        .kubectl_ok(&["label", "namespace", &silver.name, "tier=platinum"])
        .unwrap();
    wait_for("admitted after relabelling", WAIT, || async {
        Ok(
            tenant(&create, &class_claim_json(&silver.name, "late", &gold))
                .ok()
                .map(|_| ()),
        )
    })
    .await
    .unwrap();
    drop(cleanup);
}

/// The chart's protection policy (a MutatingAdmissionPolicy, off by default since #56) puts the core's
/// finalizers on claims and addresses as kube-apiserver admits them — its answer to the
/// create shows them — so the core binds without writing them: one claim write and one
/// address write fewer than for a pair bound by the same controller before the policy
/// existed (the positive control: there the core writes both finalizers). Deleting still
/// works: the core releases what admission put on.
#[tokio::test]
async fn the_protection_policy_saves_the_cores_finalizer_writes() {
    use address_controller_api::names::{ADDRESS_FINALIZER, CLAIM_FINALIZER};
    use address_controller_api::{AddressPhase, IPAddress};
    use kube::api::{DeleteParams, PostParams};
    let _one = INSTALL.lock().await;
    let (_, client) = setup().await;
    let sfx = random_suffix();
    let user = format!("ctl-protect-{sfx}");
    let mut ctl = address_controller_tests::ControllerProcess::start(
        &user,
        &["--leader-elect=false", "--auto-claims=false"],
    )
    .await
    .unwrap();
    let tenant = TestNamespace::create(&client, "chart-protect")
        .await
        .unwrap();
    let mut cleanup = Cleanup::default();
    let class = format!("chart-protect-{sfx}");
    cleanup.add("ipaddressclasses.local.sdn.cozystack.io", &class);
    kubectl_as(
        "admin",
        &["system:masters"],
        &["create", "-f", "-"],
        &json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
            "metadata": {"name": class}, "spec": {"provisioner": "none.chart.test"}})
        .to_string(),
    )
    .unwrap();
    let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), &tenant.name);
    let addresses: Api<IPAddress> = Api::all(client.clone());
    let address_body = |name: &str, ip: &str| -> IPAddress {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"address": ip, "className": class, "source": {"fromClass": {}}}}))
        .unwrap()
    };
    // An address taken in (Available), then a claim bound to it: the finalizers each came
    // with from kube-apiserver's admission.
    let bind = |name: String, ip: &'static str| {
        let (claims, addresses, class) = (claims.clone(), addresses.clone(), class.clone());
        let address = address_body(&name, ip);
        async move {
            let a = addresses
                .create(&PostParams::default(), &address)
                .await
                .unwrap();
            wait_for("the address Available", WAIT, || async {
                let a = addresses.get(&name).await?;
                Ok((a.status.and_then(|s| s.phase) == Some(AddressPhase::Available)).then_some(()))
            })
            .await
            .unwrap();
            let claim: IPAddressClaim = serde_json::from_value(
                json!({"metadata": {"name": name}, "spec": {"className": class}}),
            )
            .unwrap();
            let c = claims.create(&PostParams::default(), &claim).await.unwrap();
            wait_for("the claim Bound", WAIT, || async {
                let c = claims.get(&name).await?;
                Ok((phase(&c) == Some(ClaimPhase::Bound)).then_some(()))
            })
            .await
            .unwrap();
            (c.metadata.finalizers, a.metadata.finalizers)
        }
    };
    let before = format!("before-{sfx}");
    let after = format!("after-{sfx}");
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &before);
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &after);
    // A policy of an earlier test's release, uninstalled, may still act for a moment
    // (kube-apiserver's admission follows policies through an informer): the control waits
    // until a server-side dry run of each kind comes back unchanged.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe_claim: IPAddressClaim = serde_json::from_value(
        json!({"metadata": {"name": format!("dry-{sfx}")}, "spec": {"className": class}}),
    )
    .unwrap();
    wait_for("no protection policy acting", WAIT, || async {
        let a = addresses
            .create(&dry, &address_body(&format!("dry-{sfx}"), "198.51.100.93"))
            .await?;
        let c = claims.create(&dry, &probe_claim).await?;
        Ok((a.metadata.finalizers.is_none() && c.metadata.finalizers.is_none()).then_some(()))
    })
    .await
    .unwrap();
    let control = bind(before.clone(), "198.51.100.91").await;
    assert_eq!(
        control,
        (None, None),
        "no policy yet: nothing added at creation"
    );

    let _release = Release::new(free_port(), &json!({"protectionPolicy": {"enabled": true}})).await;
    // Active within moments: a server-side dry run shows the mutation without creating.
    wait_for("the protection policy mutates creates", WAIT, || async {
        let a = addresses
            .create(&dry, &address_body(&format!("dry-{sfx}"), "198.51.100.93"))
            .await?;
        Ok(a.metadata
            .finalizers
            .is_some_and(|f| f.contains(&ADDRESS_FINALIZER.to_string()))
            .then_some(()))
    })
    .await
    .unwrap();
    let (claim_f, address_f) = bind(after.clone(), "198.51.100.92").await;
    assert_eq!(claim_f, Some(vec![CLAIM_FINALIZER.to_string()]));
    assert_eq!(address_f, Some(vec![ADDRESS_FINALIZER.to_string()]));

    // The core's writes for each pair, by kind: the same but for the finalizers.
    let (mut b, a) = (
        writes_by_kind(&user, &before),
        writes_by_kind(&user, &after),
    );
    assert_eq!(
        b.get("ipaddressclaims patch"),
        Some(&1),
        "control: the claim's finalizer: {b:?}"
    );
    assert!(!a.contains_key("ipaddressclaims patch"), "{a:?}");
    *b.get_mut("ipaddressclaims patch").unwrap() -= 1;
    *b.get_mut("ipaddresses patch").unwrap() -= 1;
    b.retain(|_, n| *n > 0);
    assert_eq!(a, b, "one claim and one address write fewer");

    // The core releases what admission put on.
    for name in [&before, &after] {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
        wait_for("the claim gone", WAIT, || async {
            Ok(claims.get_opt(name).await?.is_none().then_some(()))
        })
        .await
        .unwrap();
    }
    address_controller_tests::invariants::assert_invariants(
        &client,
        &address_controller_tests::invariants::Scope::of(
            &[tenant.name.as_str()],
            &[class.as_str()],
        ),
        &ctl.replica().into_iter().collect::<Vec<_>>(),
    )
    .await;
    ctl.stop();
}

/// The successful writes `user` made to objects named `name`, counted by resource,
/// subresource and verb (kube-apiserver's audit log).
fn writes_by_kind(user: &str, name: &str) -> std::collections::BTreeMap<String, usize> {
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for w in address_controller_tests::audited_writes(user, |w| {
        w.name.as_deref() == Some(name) && w.code < 300
    })
    .unwrap()
    {
        let sub = w.subresource.map(|s| format!("/{s}")).unwrap_or_default();
        *by.entry(format!("{}{sub} {}", w.resource, w.verb))
            .or_default() += 1;
    }
    by
}
