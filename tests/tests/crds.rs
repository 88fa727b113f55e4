//! The CRDs on a real kube-apiserver: defaults, every CEL rule, the status subresource and
//! the printer columns.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_tests::{
    TestNamespace, api_error_message, delete_ignore_missing, random_suffix, setup,
};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::{Value, json};

fn dynamic<K: Resource<DynamicType = ()>>(client: &Client, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<K>(&());
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn object<K: Resource<DynamicType = ()>>(name: &str, rest: Value) -> DynamicObject {
    let mut v = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name},
    });
    if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), rest) {
        obj.extend(extra);
    }
    serde_json::from_value(v).expect("a well-formed object")
}

/// Creates `obj` and expects a 422 whose message contains `want`.
async fn expect_rejected(api: &Api<DynamicObject>, obj: DynamicObject, want: &str) {
    let name = obj.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => panic!("{name}: accepted, wanted rejection containing {want:?}"),
        Err(e) => {
            let (code, message) = api_error_message(&e).unwrap_or_else(|| panic!("{name}: {e}"));
            assert_eq!(code, 422, "{name}: {message}");
            assert!(message.contains(want), "{name}: {message:?} lacks {want:?}");
        }
    }
}

fn address_spec(address: &str) -> Value {
    json!({"spec": {"address": address, "className": "c", "source": {"fromClass": {}}}})
}

#[tokio::test]
async fn valid_objects_get_their_defaults() {
    let (_, client) = setup().await;
    let ns = TestNamespace::create(&client, "crd-defaults")
        .await
        .unwrap();
    let sfx = random_suffix();

    let classes = dynamic::<IPAddressClass>(&client, None);
    let class_name = format!("defaults-{sfx}");
    classes
        .create(
            &PostParams::default(),
            &object::<IPAddressClass>(
                &class_name,
                json!({"spec": {"provisioner": "example.com/driver"}}),
            ),
        )
        .await
        .unwrap();
    let class: IPAddressClass = Api::all(client.clone()).get(&class_name).await.unwrap();
    assert_eq!(class.spec.reclaim_policy.as_str(), "Retain");
    assert_eq!(class.spec.release_delay, None);

    let addresses = dynamic::<IPAddress>(&client, None);
    let addr_name = format!("defaults-{sfx}");
    addresses
        .create(
            &PostParams::default(),
            &object::<IPAddress>(&addr_name, address_spec("192.0.2.10")),
        )
        .await
        .unwrap();
    let addr: IPAddress = Api::all(client.clone()).get(&addr_name).await.unwrap();
    assert_eq!(addr.spec.reclaim_policy.as_str(), "Retain");
    assert!(addr.spec.source.from_class.is_some());
    assert!(addr.status.is_none(), "a new address has no status");

    let claims = dynamic::<IPAddressClaim>(&client, Some(&ns.name));
    claims
        .create(
            &PostParams::default(),
            &object::<IPAddressClaim>("plain", json!({"spec": {}})),
        )
        .await
        .unwrap();
    let claim: IPAddressClaim = Api::namespaced(client.clone(), &ns.name)
        .get("plain")
        .await
        .unwrap();
    assert_eq!(claim.spec.family.as_str(), "IPv4");
    assert_eq!(claim.spec.class_name, None);

    // The typed client round-trips too: what the controller will write is accepted.
    let typed: Api<IPAddress> = Api::all(client.clone());
    let v6 = IPAddress::new(
        &format!("typed-{sfx}"),
        serde_json::from_value(json!({"address": "2001:db8::5", "className": "c",
            "reclaimPolicy": "Delete", "source": {"providerRef": {"id": "prov-1"}},
            "claimRef": {"namespace": ns.name, "name": "plain"}}))
        .unwrap(),
    );
    let created = typed.create(&PostParams::default(), &v6).await.unwrap();
    assert_eq!(created.spec.claim_ref.unwrap().name, "plain");

    for n in [&addr_name, &format!("typed-{sfx}")] {
        delete_ignore_missing(&typed, n).await.unwrap();
    }
    delete_ignore_missing(&Api::<IPAddressClass>::all(client.clone()), &class_name)
        .await
        .unwrap();
}

#[tokio::test]
async fn address_cel_rules_reject_bad_input() {
    let (_, client) = setup().await;
    let api = dynamic::<IPAddress>(&client, None);
    let sfx = random_suffix();
    let cases = [
        (
            "not-an-ip",
            address_spec("192.0.2.300"),
            "address must be a valid IPv4 or IPv6 address",
        ),
        (
            "hostname",
            address_spec("example.com"),
            "address must be a valid IPv4 or IPv6 address",
        ),
        (
            "cidr",
            address_spec("192.0.2.0/24"),
            "address must be a valid IPv4 or IPv6 address",
        ),
        (
            "zoned",
            address_spec("fe80::1%eth0"),
            "address must not carry a zone",
        ),
        // Kubernetes' isIP refuses IPv4-mapped IPv6; objects admitted before this rule
        // still count as IPv4 (api::family).
        (
            "mapped",
            address_spec("::ffff:192.0.2.1"),
            "address must be a valid IPv4 or IPv6 address",
        ),
        (
            "both-sources",
            json!({"spec": {"address": "192.0.2.1", "className": "c",
                "source": {"fromClass": {}, "providerRef": {"id": "x"}}}}),
            "exactly one of fromClass or providerRef must be set",
        ),
        (
            "no-source",
            json!({"spec": {"address": "192.0.2.1", "className": "c", "source": {}}}),
            "exactly one of fromClass or providerRef must be set",
        ),
        (
            "missing-source",
            json!({"spec": {"address": "192.0.2.1", "className": "c"}}),
            "spec.source: Required value",
        ),
        (
            "empty-class",
            json!({"spec": {"address": "192.0.2.1", "className": "", "source": {"fromClass": {}}}}),
            "spec.className",
        ),
        (
            "bad-policy",
            json!({"spec": {"address": "192.0.2.1", "className": "c", "reclaimPolicy": "Recycle",
                "source": {"fromClass": {}}}}),
            "Unsupported value: \"Recycle\"",
        ),
        ("no-spec", json!({}), "spec: Required value"),
        // A claimRef must name something that can exist: a name admitted unchecked could
        // never be read back ("invalid uri character") and would loop forever.
        (
            "claim-name-with-space",
            json!({"spec": {"address": "192.0.2.1", "className": "c", "source": {"fromClass": {}},
                "claimRef": {"namespace": "t", "name": "x y"}}}),
            "spec.claimRef.name: Invalid value: \"x y\"",
        ),
        (
            "claim-namespace-uppercase",
            json!({"spec": {"address": "192.0.2.1", "className": "c", "source": {"fromClass": {}},
                "claimRef": {"namespace": "Tenant", "name": "web"}}}),
            "spec.claimRef.namespace: Invalid value: \"Tenant\"",
        ),
        (
            "claim-namespace-too-long",
            json!({"spec": {"address": "192.0.2.1", "className": "c", "source": {"fromClass": {}},
                "claimRef": {"namespace": "n".repeat(64), "name": "web"}}}),
            "spec.claimRef.namespace: Too long",
        ),
    ];
    for (name, body, want) in cases {
        expect_rejected(
            &api,
            object::<IPAddress>(&format!("{name}-{sfx}"), body),
            want,
        )
        .await;
    }
}

#[tokio::test]
async fn address_and_provisioner_are_immutable() {
    let (_, client) = setup().await;
    let sfx = random_suffix();
    let addresses: Api<IPAddress> = Api::all(client.clone());
    let classes: Api<IPAddressClass> = Api::all(client.clone());
    let name = format!("immutable-{sfx}");
    dynamic::<IPAddress>(&client, None)
        .create(
            &PostParams::default(),
            &object::<IPAddress>(&name, address_spec("198.51.100.7")),
        )
        .await
        .unwrap();
    dynamic::<IPAddressClass>(&client, None)
        .create(
            &PostParams::default(),
            &object::<IPAddressClass>(&name, json!({"spec": {"provisioner": "one.example.com"}})),
        )
        .await
        .unwrap();

    let merge = |v: Value| Patch::Merge(v);
    let err = addresses
        .patch(
            &name,
            &PatchParams::default(),
            &merge(json!({"spec": {"address": "198.51.100.8"}})),
        )
        .await
        .unwrap_err();
    assert!(
        api_error_message(&err)
            .unwrap()
            .1
            .contains("address is immutable"),
        "{err}"
    );

    let err = classes
        .patch(
            &name,
            &PatchParams::default(),
            &merge(json!({"spec": {"provisioner": "two.example.com"}})),
        )
        .await
        .unwrap_err();
    assert!(
        api_error_message(&err)
            .unwrap()
            .1
            .contains("provisioner is immutable"),
        "{err}"
    );

    // Everything else stays editable.
    addresses
        .patch(
            &name,
            &PatchParams::default(),
            &merge(json!({"spec": {"reclaimPolicy": "Delete"}})),
        )
        .await
        .unwrap();
    classes
        .patch(
            &name,
            &PatchParams::default(),
            &merge(json!({"spec": {"releaseDelay": "1h30m"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        classes
            .get(&name)
            .await
            .unwrap()
            .spec
            .release_delay
            .as_deref(),
        Some("1h30m")
    );

    delete_ignore_missing(&addresses, &name).await.unwrap();
    delete_ignore_missing(&classes, &name).await.unwrap();
}

#[tokio::test]
async fn class_rules_validate_release_delay_and_provisioner() {
    let (_, client) = setup().await;
    let api = dynamic::<IPAddressClass>(&client, None);
    let typed: Api<IPAddressClass> = Api::all(client.clone());
    let sfx = random_suffix();
    for (i, good) in ["30s", "15m", "24h", "1h30m", "0s", "1.5h", "250ms"]
        .iter()
        .enumerate()
    {
        let name = format!("delay-ok-{i}-{sfx}");
        api.create(
            &PostParams::default(),
            &object::<IPAddressClass>(
                &name,
                json!({"spec": {"provisioner": "p", "releaseDelay": good,
                "parameters": {"cidrs": ["192.0.2.0/28"], "nested": {"anything": 1}}}}),
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{good}: {e}"));
        // Unknown driver parameters are preserved, not pruned.
        let got = typed.get(&name).await.unwrap();
        assert_eq!(got.spec.parameters.unwrap()["nested"]["anything"], json!(1));
        delete_ignore_missing(&typed, &name).await.unwrap();
    }
    for (i, bad) in ["1d", "30", "soon", "-5s", "1h 30m", "PT1H", ""]
        .iter()
        .enumerate()
    {
        expect_rejected(
            &api,
            object::<IPAddressClass>(
                &format!("delay-bad-{i}-{sfx}"),
                json!({"spec": {"provisioner": "p", "releaseDelay": bad}}),
            ),
            "releaseDelay must be a duration such as 30s, 15m, 24h or 1h30m",
        )
        .await;
    }
    expect_rejected(
        &api,
        object::<IPAddressClass>(&format!("no-provisioner-{sfx}"), json!({"spec": {}})),
        "spec.provisioner: Required value",
    )
    .await;
    expect_rejected(
        &api,
        object::<IPAddressClass>(
            &format!("empty-provisioner-{sfx}"),
            json!({"spec": {"provisioner": ""}}),
        ),
        "spec.provisioner",
    )
    .await;
    expect_rejected(
        &api,
        object::<IPAddressClass>(&format!("no-spec-{sfx}"), json!({})),
        "spec: Required value",
    )
    .await;
}

#[tokio::test]
async fn claim_rules_reject_bad_input() {
    let (_, client) = setup().await;
    let ns = TestNamespace::create(&client, "crd-claims").await.unwrap();
    let api = dynamic::<IPAddressClaim>(&client, Some(&ns.name));
    expect_rejected(
        &api,
        object::<IPAddressClaim>(
            "dual-pinned",
            json!({"spec": {"family": "Dual", "addressName": "a-1"}}),
        ),
        "addressName cannot be used with family Dual",
    )
    .await;
    expect_rejected(
        &api,
        object::<IPAddressClaim>("bad-family", json!({"spec": {"family": "IPv5"}})),
        "Unsupported value: \"IPv5\"",
    )
    .await;
    expect_rejected(
        &api,
        object::<IPAddressClaim>("no-spec", json!({})),
        "spec: Required value",
    )
    .await;
    // The allowed shapes.
    for (name, spec) in [
        ("dual", json!({"family": "Dual", "className": "x"})),
        ("pinned", json!({"family": "IPv6", "addressName": "a-1"})),
    ] {
        api.create(
            &PostParams::default(),
            &object::<IPAddressClaim>(name, json!({"spec": spec})),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // Turning a pinned claim into a Dual one is caught on update too.
    let err = api
        .patch(
            "pinned",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"family": "Dual"}})),
        )
        .await
        .unwrap_err();
    assert!(
        api_error_message(&err)
            .unwrap()
            .1
            .contains("addressName cannot be used with family Dual")
    );
}

#[tokio::test]
async fn family_is_immutable_once_a_claim_is_bound() {
    let (_, client) = setup().await;
    let ns = TestNamespace::create(&client, "crd-family").await.unwrap();
    let api: Api<IPAddressClaim> = Api::namespaced(client.clone(), &ns.name);
    let claim: IPAddressClaim =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {}})).unwrap();
    api.create(&PostParams::default(), &claim).await.unwrap();
    let to = |family: &str| Patch::Merge(json!({"spec": {"family": family}}));
    // Pending: the tenant may still change its mind.
    api.patch("web", &PatchParams::default(), &to("Dual"))
        .await
        .unwrap();
    for phase in ["Bound", "Lost"] {
        api.patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase}})),
        )
        .await
        .unwrap();
        let err = api
            .patch("web", &PatchParams::default(), &to("IPv6"))
            .await
            .unwrap_err();
        let (code, message) = api_error_message(&err).unwrap();
        assert_eq!(code, 422, "{phase}: {message}");
        assert!(
            message.contains("spec.family: Invalid value")
                && message.contains("spec.family cannot change once the claim is Bound"),
            "{phase}: {message}"
        );
        // Other edits still pass.
        api.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"edited": phase}}})),
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn status_is_a_separate_subresource() {
    let (_, client) = setup().await;
    let api: Api<IPAddress> = Api::all(client.clone());
    let name = format!("status-{}", random_suffix());
    dynamic::<IPAddress>(&client, None)
        .create(
            &PostParams::default(),
            &object::<IPAddress>(&name, address_spec("203.0.113.9")),
        )
        .await
        .unwrap();
    let generation = api.get(&name).await.unwrap().metadata.generation;

    // Status sent to the main resource is dropped.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
    )
    .await
    .unwrap();
    assert!(api.get(&name).await.unwrap().status.is_none());

    // Spec sent to /status is dropped; status lands; generation does not move.
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"className": "other"}, "status": {"phase": "Available"}})),
    )
    .await
    .unwrap();
    let got = api.get(&name).await.unwrap();
    assert_eq!(got.spec.class_name, "c");
    assert_eq!(got.status.unwrap().phase.unwrap().as_str(), "Available");
    assert_eq!(got.metadata.generation, generation);

    // A phase outside the enum is refused on /status as well.
    let err = api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Gone"}})),
        )
        .await
        .unwrap_err();
    assert!(
        api_error_message(&err)
            .unwrap()
            .1
            .contains("Unsupported value: \"Gone\"")
    );
    delete_ignore_missing(&api, &name).await.unwrap();
}

#[tokio::test]
async fn kubectl_prints_the_printer_columns() {
    let (cluster, client) = setup().await;
    let ns = TestNamespace::create(&client, "crd-columns").await.unwrap();
    let sfx = random_suffix();
    let name = format!("columns-{sfx}");
    dynamic::<IPAddressClass>(&client, None)
        .create(
            &PostParams::default(),
            &object::<IPAddressClass>(
                &name,
                json!({"spec": {"provisioner": "cols.example.com", "releaseDelay": "15m"}}),
            ),
        )
        .await
        .unwrap();
    dynamic::<IPAddress>(&client, None)
        .create(
            &PostParams::default(),
            &object::<IPAddress>(
                &name,
                json!({"spec": {"address": "192.0.2.77", "className": name,
                "source": {"fromClass": {}}, "claimRef": {"namespace": ns.name, "name": "web"}}}),
            ),
        )
        .await
        .unwrap();
    let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), &ns.name);
    dynamic::<IPAddressClaim>(&client, Some(&ns.name))
        .create(
            &PostParams::default(),
            &object::<IPAddressClaim>("web", json!({"spec": {"className": name}})),
        )
        .await
        .unwrap();
    claims
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound", "className": name,
                "addresses": [{"name": name, "address": "192.0.2.77"}]}})),
        )
        .await
        .unwrap();

    // Short names, and the columns with their values.
    let out = cluster.kubectl_ok(&["get", "ipac", &name]).unwrap();
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "RELEASEDELAY",
            "AGE"
        ],
        "{out}"
    );
    assert!(
        out.contains("cols.example.com") && out.contains("Retain") && out.contains("15m"),
        "{out}"
    );

    let out = cluster.kubectl_ok(&["get", "ipa", &name]).unwrap();
    assert!(
        out.starts_with("NAME")
            && out.contains("ADDRESS")
            && out.contains("CLASS")
            && out.contains("PHASE")
            && out.contains("CLAIM NAMESPACE")
            && out.contains("ATTACHEDTO")
            && out.contains("AGE"),
        "{out}"
    );
    assert!(
        out.contains("192.0.2.77") && out.contains(&ns.name) && out.contains("web"),
        "{out}"
    );

    let out = cluster.kubectl_ok(&["get", "ipc", "-n", &ns.name]).unwrap();
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "CLASS", "ADDRESSES", "AGE"],
        "{out}"
    );
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["web", "Bound", name.as_str(), "192.0.2.77"],
        "{out}"
    );

    // The full resource names work too, and never collide with networking.k8s.io.
    let out = cluster
        .kubectl_ok(&[
            "get",
            "ipaddresses.local.sdn.cozystack.io",
            &name,
            "-o",
            "name",
        ])
        .unwrap();
    assert_eq!(
        out.trim(),
        format!("ipaddress.local.sdn.cozystack.io/{name}")
    );

    delete_ignore_missing(&Api::<IPAddress>::all(client.clone()), &name)
        .await
        .unwrap();
    delete_ignore_missing(&Api::<IPAddressClass>::all(client.clone()), &name)
        .await
        .unwrap();
}
