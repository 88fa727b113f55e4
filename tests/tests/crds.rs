//! The CRDs on a real kube-apiserver: defaults, every CEL rule, the status subresource and
//! the printer columns.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_api::{IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_tests::{
    Cleanup, TestNamespace, api_error_message, delete_ignore_missing, random_suffix, setup,
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
    // Sharing (#42): namespaces only with policy Namespaces, each a namespace name, at most 32.
    for (name, sharing, message) in [
        (
            "share-list-none",
            json!({"policy": "SameNamespace", "namespaces": ["blog"]}),
            "namespaces is only used with policy Namespaces",
        ),
        (
            "share-bad-ns",
            json!({"policy": "Namespaces", "namespaces": ["Blog/../x"]}),
            "spec.sharing.namespaces[0]: Invalid value",
        ),
        (
            "share-dup",
            json!({"policy": "Namespaces", "namespaces": ["blog", "blog"]}),
            "Duplicate value",
        ),
        (
            "share-many",
            json!({"policy": "Namespaces", "namespaces": (0..33).map(|i| format!("n{i}")).collect::<Vec<_>>()}),
            "must have at most 32 items",
        ),
        (
            "share-policy",
            json!({"policy": "Everyone"}),
            "Unsupported value: \"Everyone\"",
        ),
    ] {
        expect_rejected(
            &api,
            object::<IPAddressClaim>(name, json!({"spec": {"sharing": sharing}})),
            message,
        )
        .await;
    }
    // The allowed shapes.
    for (name, spec) in [
        ("dual", json!({"family": "Dual", "className": "x"})),
        ("pinned", json!({"family": "IPv6", "addressName": "a-1"})),
        ("shared", json!({"sharing": {"policy": "SameNamespace"}})),
        (
            "granted",
            json!({"sharing": {"policy": "Namespaces", "namespaces": ["blog", "shop"]}}),
        ),
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

/// A table as kubectl prints it: one map per row, header → cell (empty cells are "").
/// Columns start where their header starts (headers may hold single spaces).
fn table(out: &str) -> (Vec<String>, Vec<std::collections::BTreeMap<String, String>>) {
    let mut lines = out.lines();
    let head = lines.next().unwrap_or_default();
    let mut cols: Vec<(usize, String)> = Vec::new();
    let bytes = head.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b' ' {
            i += 1;
            continue;
        }
        let from = i;
        // A header ends at two spaces (or the end of the line).
        while i < bytes.len() && !(bytes[i] == b' ' && bytes.get(i + 1).is_none_or(|b| *b == b' '))
        {
            i += 1;
        }
        cols.push((from, head[from..i].to_string()));
    }
    let headers = cols.iter().map(|(_, h)| h.clone()).collect();
    let rows = lines
        .map(|l| {
            cols.iter()
                .enumerate()
                .map(|(n, (from, h))| {
                    let to = cols.get(n + 1).map_or(l.len(), |(t, _)| *t).min(l.len());
                    let cell = l.get((*from).min(l.len())..to).unwrap_or_default();
                    (h.clone(), cell.trim().to_string())
                })
                .collect()
        })
        .collect();
    (headers, rows)
}

/// The names `kubectl get ... -o name` prints.
fn names(out: &str) -> Vec<String> {
    out.lines().map(str::to_string).collect()
}

/// `kubectl get` prints each kind's columns with their values (short names, narrow and
/// wide), kube-apiserver answers the selectable fields and refuses the others, the
/// `addresses` category lists the three kinds, and the full names never collide with
/// networking.k8s.io's.
#[tokio::test]
async fn kubectl_prints_the_printer_columns() {
    let (_, client) = setup().await;
    let ns = TestNamespace::create(&client, "crd-columns").await.unwrap();
    let sfx = random_suffix();
    let c = Columns {
        name: format!("columns-{sfx}"),
        other: format!("columns-{sfx}-x"),
        ns: ns.name.clone(),
    };
    // Removed however the test ends (a failed run must not leave 192.0.2.77 to the next).
    let mut cleanup = Cleanup::default();
    cleanup.add("ipaddressclasses.local.sdn.cozystack.io", &c.name);
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &c.name);
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &c.other);
    c.objects_with_every_column_filled(&client).await;
    c.a_class_prints_its_columns();
    c.an_address_prints_its_columns();
    c.a_claim_prints_its_columns();
    c.kube_apiserver_answers_the_selectable_fields();
    c.the_category_and_the_full_names();
    drop(cleanup);
    drop(ns);
}

/// The objects whose columns are read: a class `name`, its addresses `name` (Bound to the
/// claim `web` of `ns`) and `other` (Released), the claims `web` (Dual, Bound) and `db`.
struct Columns {
    name: String,
    other: String,
    ns: String,
}

impl Columns {
    async fn objects_with_every_column_filled(&self, client: &Client) {
        let (name, other) = (&self.name, &self.other);
        // Not the default class ("false"): the DEFAULT column reads the annotation as is.
        dynamic::<IPAddressClass>(client, None)
            .create(
                &PostParams::default(),
                &object::<IPAddressClass>(
                    name,
                    json!({"metadata": {"name": name, "annotations": {
                               "ipaddressclass.local.sdn.cozystack.io/is-default-class": "false"}},
                           "spec": {"provisioner": "cols.example.com", "releaseDelay": "15m"}}),
                ),
            )
            .await
            .unwrap();
        Api::<IPAddressClass>::all(client.clone())
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"capacity": {"ipv4": 16},
                    "conditions": [{"type": "ParametersValid", "status": "True", "reason": "Valid",
                                    "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                                   {"type": "DriverAvailable", "status": "False", "reason": "NoLiveDriver",
                                    "message": "none", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
            )
            .await
            .unwrap();
        for (obj, address, claim_ref) in [
            (
                &name,
                "192.0.2.77",
                json!({"namespace": self.ns, "name": "web"}),
            ),
            (&other, "192.0.2.78", Value::Null),
        ] {
            let mut spec =
                json!({"address": address, "className": name, "source": {"fromClass": {}}});
            if !claim_ref.is_null() {
                spec["claimRef"] = claim_ref;
            }
            dynamic::<IPAddress>(client, None)
                .create(
                    &PostParams::default(),
                    &object::<IPAddress>(obj, json!({ "spec": spec })),
                )
                .await
                .unwrap();
        }
        let released_at =
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_mins(5);
        Api::<IPAddress>::all(client.clone())
            .patch_status(
                other,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"phase": "Released", "releasedAt": released_at.to_string(),
                        "reason": "Surplus"}}),
                ),
            )
            .await
            .unwrap();
        let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), &self.ns);
        for (claim, family) in [("web", "Dual"), ("db", "IPv4")] {
            dynamic::<IPAddressClaim>(client, Some(&self.ns))
                .create(
                    &PostParams::default(),
                    &object::<IPAddressClaim>(
                        claim,
                        json!({"spec": {"className": name, "family": family}}),
                    ),
                )
                .await
                .unwrap();
        }
        claims
            .patch_status(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound", "className": name,
                    "addresses": [{"name": name, "address": "192.0.2.77"},
                                  {"name": format!("{name}-v6"), "address": "2001:db8::77"}],
                    "services": {"attached": 2, "refused": 1},
                    "conditions": [{"type": "Bound", "status": "True", "reason": "Bound",
                                    "message": "bound to both", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
            )
            .await
            .unwrap();
    }

    /// Short names, and the columns with their values (narrow, then -o wide).
    fn a_class_prints_its_columns(&self) {
        let (cluster, name) = (address_controller_tests::Cluster::get(), &self.name);
        let (header, rows) = table(&cluster.kubectl_ok(&["get", "ipac", name]).unwrap());
        assert_eq!(
            header,
            [
                "NAME",
                "PROVISIONER",
                "RECLAIMPOLICY",
                "RELEASEDELAY",
                "DEFAULT",
                "AGE"
            ]
        );
        assert_eq!(
            (
                rows[0]["PROVISIONER"].as_str(),
                rows[0]["RECLAIMPOLICY"].as_str(),
                rows[0]["RELEASEDELAY"].as_str(),
                rows[0]["DEFAULT"].as_str()
            ),
            ("cols.example.com", "Retain", "15m", "false")
        );
        let (header, rows) = table(
            &cluster
                .kubectl_ok(&["get", "ipac", name, "-o", "wide"])
                .unwrap(),
        );
        assert_eq!(
            header[6..],
            [
                "NAMESPACES",
                "IPV4 CAPACITY",
                "IPV6 CAPACITY",
                "PARAMETERSVALID",
                "DRIVERAVAILABLE"
            ]
        );
        assert_eq!(
            (
                rows[0]["IPV4 CAPACITY"].as_str(),
                rows[0]["IPV6 CAPACITY"].as_str(),
                rows[0]["PARAMETERSVALID"].as_str(),
                rows[0]["DRIVERAVAILABLE"].as_str()
            ),
            ("16", "", "True", "False")
        );
    }

    fn an_address_prints_its_columns(&self) {
        let (cluster, name, other) = (
            address_controller_tests::Cluster::get(),
            &self.name,
            &self.other,
        );
        let (header, rows) = table(
            &cluster
                .kubectl_ok(&["get", "ipa", name, other, "-o", "wide"])
                .unwrap(),
        );
        assert_eq!(
            header,
            [
                "NAME",
                "ADDRESS",
                "CLASS",
                "PHASE",
                "CLAIM NAMESPACE",
                "CLAIM",
                "ATTACHEDTO",
                "RECLAIMPOLICY",
                "AGE",
                "RELEASED",
                "HOLDERS",
                "METHOD",
                "REASON"
            ]
        );
        let row = |n: &str| rows.iter().find(|r| r["NAME"] == n).unwrap().clone();
        let (bound, released) = (row(name), row(other));
        assert_eq!(
            (
                bound["ADDRESS"].as_str(),
                bound["CLAIM NAMESPACE"].as_str(),
                bound["CLAIM"].as_str(),
                bound["RECLAIMPOLICY"].as_str(),
                bound["RELEASED"].as_str(),
                bound["REASON"].as_str(),
                bound["METHOD"].as_str()
            ),
            ("192.0.2.77", self.ns.as_str(), "web", "Retain", "", "", "")
        );
        assert_eq!(released["PHASE"], "Released");
        assert_eq!(released["REASON"], "Surplus");
        assert!(released["RELEASED"].starts_with("5m"), "{released:?}");
    }

    fn a_claim_prints_its_columns(&self) {
        let (cluster, name) = (address_controller_tests::Cluster::get(), &self.name);
        let (header, rows) = table(&cluster.kubectl_ok(&["get", "ipc", "-n", &self.ns]).unwrap());
        assert_eq!(
            header,
            [
                "NAME",
                "PHASE",
                "CLASS",
                "FAMILY",
                "ADDRESS",
                "SECOND ADDRESS",
                "AGE"
            ]
        );
        let web = rows.iter().find(|r| r["NAME"] == "web").unwrap();
        assert_eq!(
            (
                web["PHASE"].as_str(),
                web["CLASS"].as_str(),
                web["FAMILY"].as_str(),
                web["ADDRESS"].as_str(),
                web["SECOND ADDRESS"].as_str()
            ),
            ("Bound", name.as_str(), "Dual", "192.0.2.77", "2001:db8::77")
        );
        let (header, rows) = table(
            &cluster
                .kubectl_ok(&["get", "ipc", "web", "-n", &self.ns, "-o", "wide"])
                .unwrap(),
        );
        assert_eq!(header[7..], ["IPADDRESS", "ATTACHED", "MESSAGE"]);
        assert_eq!(
            (
                rows[0]["IPADDRESS"].as_str(),
                rows[0]["ATTACHED"].as_str(),
                rows[0]["MESSAGE"].as_str()
            ),
            (name.as_str(), "2", "bound to both")
        );
    }

    /// Field selectors, answered by kube-apiserver (selectableFields): who holds an
    /// address, what a namespace holds, what is Released, which claims are Dual; a field
    /// that is not selectable gets kube-apiserver's own refusal.
    fn kube_apiserver_answers_the_selectable_fields(&self) {
        let (cluster, name, other) = (
            address_controller_tests::Cluster::get(),
            &self.name,
            &self.other,
        );
        let get = |args: &[&str]| names(&cluster.kubectl_ok(args).unwrap());
        let ipa = |n: &str| format!("ipaddress.local.sdn.cozystack.io/{n}");
        assert_eq!(
            get(&[
                "get",
                "ipa",
                "-o",
                "name",
                "--field-selector",
                &format!("spec.address=192.0.2.77,spec.className={name}")
            ]),
            [ipa(name)]
        );
        assert_eq!(
            get(&[
                "get",
                "ipa",
                "-o",
                "name",
                "--field-selector",
                &format!("spec.claimRef.namespace={},spec.claimRef.name=web", self.ns)
            ]),
            [ipa(name)]
        );
        assert_eq!(
            get(&[
                "get",
                "ipa",
                "-o",
                "name",
                "--field-selector",
                &format!("spec.className={name},status.phase=Released")
            ]),
            [ipa(other)]
        );
        assert_eq!(
            get(&[
                "get",
                "ipc",
                "-n",
                &self.ns,
                "-o",
                "name",
                "--field-selector",
                "spec.family=Dual"
            ]),
            ["ipaddressclaim.local.sdn.cozystack.io/web"]
        );
        assert_eq!(
            get(&[
                "get",
                "ipc",
                "-n",
                &self.ns,
                "-o",
                "name",
                "--field-selector",
                &format!("status.phase!=Bound,spec.className={name}")
            ]),
            ["ipaddressclaim.local.sdn.cozystack.io/db"]
        );
        assert!(
            get(&[
                "get",
                "ipac",
                "-o",
                "name",
                "--field-selector",
                "spec.provisioner=cols.example.com"
            ])
            .contains(&format!("ipaddressclass.local.sdn.cozystack.io/{name}"))
        );
        // A field that is not selectable: kube-apiserver's own refusal.
        let out = cluster
            .kubectl()
            .args(["get", "ipa", "--field-selector", "spec.source=x"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("field label not supported: spec.source"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The category: `kubectl get addresses` lists the claims and the ledger (with the
    /// views, which declare it too). Asked of kube-apiserver's discovery for this group, so
    /// the answer does not depend on whether an aggregated server is up at the moment. The
    /// full resource names work too, and never collide with networking.k8s.io.
    fn the_category_and_the_full_names(&self) {
        let (cluster, name) = (address_controller_tests::Cluster::get(), &self.name);
        let discovery: Value = serde_json::from_str(
            &cluster
                .kubectl_ok(&["get", "--raw", "/apis/local.sdn.cozystack.io/v1alpha1"])
                .unwrap(),
        )
        .unwrap();
        for resource in ["ipaddressclaims", "ipaddresses", "ipaddressclasses"] {
            let r = discovery["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == resource)
                .unwrap();
            assert_eq!(r["categories"], json!(["addresses"]), "{resource}");
        }

        let out = cluster
            .kubectl_ok(&[
                "get",
                "ipaddresses.local.sdn.cozystack.io",
                name,
                "-o",
                "name",
            ])
            .unwrap();
        assert_eq!(
            out.trim(),
            format!("ipaddress.local.sdn.cozystack.io/{name}")
        );
    }
}
