#![allow(clippy::unwrap_used)]
use super::claim::{plan, wanted};
use super::*;
use crate::decide::claim::{ClaimPlan, provisioned};
use crate::driver::{AllocateError, Allocation, Request};
use address_controller_api::names::PROVISIONER_ANNOTATION;
use address_controller_api::{Family, IPAddress, IPAddressClaim, IPAddressClass};
use address_controller_runtime::cache::key_of;
use address_controller_runtime::health::{Bounds, Health};
use address_controller_runtime::leader::Leadership;
use serde_json::json;

/// The tests' driver: allocates nothing; with a counter, it has a teardown finalizer, one
/// IPv4 address of capacity, and counts its releases.
#[derive(Default)]
struct Null(Option<Arc<std::sync::atomic::AtomicUsize>>);
impl Driver for Null {
    type Params = ();
    fn provisioner(&self) -> &str {
        "p.example"
    }
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<(), String>> {
        classes.iter().map(|_| Ok(())).collect()
    }
    fn capacity(&self, _: &()) -> crate::Capacity {
        let ipv4 = i64::from(self.0.is_some());
        crate::Capacity { ipv4, ipv6: 0 }
    }
    async fn allocate(&self, _: Request<'_, ()>) -> Result<Allocation, AllocateError> {
        Err(AllocateError::Exhausted)
    }
    fn finalizer(&self) -> Option<&'static str> {
        self.0.as_ref().map(|_| "p.example/teardown")
    }
    async fn release(&self, _: &Client, _: &IPAddress) -> Result<(), String> {
        if let Some(n) = &self.0 {
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A client that fails every request: these tests never reach an API server.
fn offline() -> Client {
    let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
        Err::<http::Response<String>, std::io::Error>(std::io::Error::other("offline"))
    });
    Client::new(svc, "default")
}

fn ctx() -> Ctx<Null> {
    ctx_with(Null::default(), &[])
}

/// A context for `driver`, with the classes `ours` (its), `theirs` and `more` (its too).
fn ctx_with<D: Driver>(driver: D, more: &[&str]) -> Ctx<D> {
    ctx_of(driver, more, false)
}

/// [`ctx_with`], with a Service cache when `services`.
fn ctx_of<D: Driver>(driver: D, more: &[&str], services: bool) -> Ctx<D> {
    ctx_on(driver, more, services, offline())
}

/// [`ctx_of`] talking to `client`.
fn ctx_on<D: Driver>(driver: D, more: &[&str], services: bool, client: Client) -> Ctx<D> {
    let health = Health::new(Bounds::default());
    let world = World::new(services, health.clone());
    let gate = Gate::new(Leadership::always(), health);
    let ctx = Ctx::new(driver, client, world, gate, "test", "t".into());
    let classes = [("ours", "p.example"), ("theirs", "q.example")]
        .into_iter()
        .chain(more.iter().map(|m| (*m, "p.example")));
    for (name, provisioner) in classes {
        let c: IPAddressClass = serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"provisioner": provisioner}}),
        )
        .unwrap();
        ctx.world.classes.apply(key_of(&c), Some(Arc::new(c)));
    }
    ctx
}

fn claim(extra: serde_json::Value) -> IPAddressClaim {
    let mut v = json!({"metadata": {"name": "c", "namespace": "t", "uid": "u1", "generation": 1,
            "annotations": {PROVISIONER_ANNOTATION: "p.example"}},
        "spec": {"family": "Dual"},
        "status": {"phase": "Pending", "className": "ours", "conditions": [{"type": "Bound", "status": "False",
            "reason": "WaitingForProvisioning", "message": "", "observedGeneration": 1,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

/// A JSON merge patch (null removes).
fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (b, p) => *b = p,
    }
}

fn families(ctx: &Ctx<Null>, c: &IPAddressClaim) -> Option<Vec<Family>> {
    wanted(ctx, c, "t/c").map(|(_, f)| f)
}

#[tokio::test]
async fn serves_only_stamped_pending_claims_waiting_for_it_and_only_missing_families() {
    let ctx = ctx();
    let both = Some(vec![Family::IPv4, Family::IPv6]);
    assert_eq!(families(&ctx, &claim(json!({}))), both);
    let rows: &[(&str, serde_json::Value)] = &[
        (
            "not stamped",
            json!({"metadata": {"annotations": {PROVISIONER_ANNOTATION: null}}}),
        ),
        (
            "stamped for another driver",
            json!({"metadata": {"annotations": {PROVISIONER_ANNOTATION: "q.example"}}}),
        ),
        ("before the core's first pass", json!({"status": null})),
        ("Bound", json!({"status": {"phase": "Bound"}})),
        ("Lost", json!({"status": {"phase": "Lost"}})),
        (
            "waiting for a pinned address",
            json!({"status": {"conditions": [{"type": "Bound", "status": "False",
            "reason": "WaitingForAddress", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        ),
        (
            "pinned",
            json!({"spec": {"family": "IPv4", "addressName": "x"}}),
        ),
        (
            "being deleted",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ),
        (
            "a class of another driver",
            json!({"status": {"className": "theirs"}}),
        ),
        (
            "a class that does not exist",
            json!({"status": {"className": "gone"}}),
        ),
    ];
    for (what, extra) in rows {
        assert_eq!(families(&ctx, &claim(extra.clone())), None, "{what}");
    }
    // A family the status lists is not provisioned again.
    let listed = claim(json!({"status": {"addresses": [{"name": "a", "address": "192.0.2.1"}]}}));
    assert_eq!(families(&ctx, &listed), Some(vec![Family::IPv6]));
    // Nor one an address in the cache already names (uid empty or equal)...
    let a: IPAddress = serde_json::from_value(json!({"metadata": {"name": "x6"}, "spec": {"address": "2001:db8::1",
        "className": "ours", "source": {"fromClass": {}}, "claimRef": {"namespace": "t", "name": "c", "uid": "u1"}}})).unwrap();
    ctx.world
        .addresses
        .apply(key_of(&a), Some(Arc::new(a.clone())));
    ctx.inventory.address_changed(None, Some(&a));
    assert_eq!(families(&ctx, &claim(json!({}))), Some(vec![Family::IPv4]));
    // ...nor one this process just created (not in the cache yet).
    fresh(&ctx.in_flight).insert(("u1".into(), Family::IPv4), Instant::now());
    assert_eq!(families(&ctx, &claim(json!({}))), None);
}

#[test]
fn a_provisioned_address_is_pre_bound_to_the_claim_with_its_uid_and_the_class_policy() {
    let class: IPAddressClass = serde_json::from_value(json!({"metadata": {"name": "pub"},
        "spec": {"provisioner": "p.example", "reclaimPolicy": "Delete"}}))
    .unwrap();
    let claim: IPAddressClaim = serde_json::from_value(json!({"metadata": {"name": "web",
        "namespace": "t", "uid": "u1"}, "spec": {}}))
    .unwrap();
    let a = Allocation {
        address: "192.0.2.7".parse().unwrap(),
        source: serde_json::from_value(json!({"fromClass": {}})).unwrap(),
        name: None,
    };
    let made = provisioned(
        "ipv4-192-0-2-7",
        &a,
        &class,
        &claim,
        "p.example",
        Some("p.example/hold"),
    );
    let v = serde_json::to_value(&made).unwrap();
    assert_eq!(
        v,
        json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
            "metadata": {"name": "ipv4-192-0-2-7", "finalizers": ["p.example/hold"],
                "annotations": {"ipaddress.local.sdn.cozystack.io/provisioned-by": "p.example"}},
            "spec": {"address": "192.0.2.7", "className": "pub", "reclaimPolicy": "Delete",
                "claimRef": {"namespace": "t", "name": "web", "uid": "u1"},
                "source": {"fromClass": {}}}})
    );
    assert!(made.belongs_to(&claim));
    let bare = provisioned("x", &a, &class, &claim, "p.example", None);
    assert_eq!(bare.metadata.finalizers, None);
}

/// Refuses the class `bad`; has one IPv4 address, and no IPv6 one.
struct OneIpv4;
impl Driver for OneIpv4 {
    type Params = ();
    fn provisioner(&self) -> &str {
        "p.example"
    }
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<(), String>> {
        classes
            .iter()
            .map(|c| match c.name_any().as_str() {
                "bad" => Err("cidrs: not a list".to_string()),
                _ => Ok(()),
            })
            .collect()
    }
    fn capacity(&self, _: &()) -> crate::Capacity {
        crate::Capacity::default()
    }
    async fn allocate(&self, r: Request<'_, ()>) -> Result<Allocation, AllocateError> {
        match r.family {
            Family::IPv4 => Ok(Allocation {
                address: "192.0.2.7".parse().unwrap(),
                source: serde_json::from_value(json!({"fromClass": {}})).unwrap(),
                name: None,
            }),
            Family::IPv6 => Err(AllocateError::Exhausted),
        }
    }
}

#[tokio::test]
async fn a_claims_plan_is_all_families_or_a_reason_and_writes_nothing() {
    let ctx = ctx_with(OneIpv4, &["bad"]);
    let plan_of = |extra: serde_json::Value| {
        let c = claim(extra);
        let ctx = &ctx;
        async move { plan(ctx, &c, "t/c").await }
    };
    // IPv4 alone: one address to create.
    match plan_of(json!({"spec": {"family": "IPv4"}})).await {
        ClaimPlan::Create { class, chosen } => {
            assert_eq!(class.name_any(), "ours");
            let got: Vec<_> = chosen
                .iter()
                .map(|(f, a)| (*f, a.address.to_string()))
                .collect();
            assert_eq!(got, vec![(Family::IPv4, "192.0.2.7".to_string())]);
        }
        other => panic!("{other:?}"),
    }
    // Dual with no IPv6 left: neither family (the IPv4 allocation is not created), the
    // claim told which family is missing, and the class recorded so a free address wakes it.
    match plan_of(json!({})).await {
        ClaimPlan::Refuse {
            event,
            exhausted_in,
        } => {
            assert_eq!(event.reason, events::EXHAUSTED_EVENT);
            assert!(
                event.note.contains("IPv6") && !event.note.contains("IPv4"),
                "{}",
                event.note
            );
            assert_eq!(exhausted_in.as_deref(), Some("ours"));
        }
        other => panic!("{other:?}"),
    }
    // Bad parameters: the claim is told, nothing is recorded as exhausted.
    match plan_of(json!({"status": {"className": "bad"}})).await {
        ClaimPlan::Refuse {
            event,
            exhausted_in,
        } => {
            assert_eq!(event.reason, events::INVALID_CLASS_PARAMETERS);
            assert!(event.note.contains("not a list"), "{}", event.note);
            assert_eq!(exhausted_in, None);
        }
        other => panic!("{other:?}"),
    }
    // Not invited: nothing.
    assert!(matches!(
        plan_of(json!({"metadata": {"annotations": {PROVISIONER_ANNOTATION: null}}})).await,
        ClaimPlan::Nothing
    ));
}

/// Allocates the first of 192.0.2.7 and 192.0.2.8 not in use.
struct TwoIpv4;

impl Driver for TwoIpv4 {
    type Params = ();
    fn provisioner(&self) -> &str {
        "p.example"
    }
    fn parameters(&self, classes: &[Arc<IPAddressClass>]) -> Vec<Result<(), String>> {
        classes.iter().map(|_| Ok(())).collect()
    }
    fn capacity(&self, _: &()) -> crate::Capacity {
        crate::Capacity::default()
    }
    async fn allocate(&self, r: Request<'_, ()>) -> Result<Allocation, AllocateError> {
        ["192.0.2.7", "192.0.2.8"]
            .into_iter()
            .map(|a| a.parse().unwrap())
            .find(|ip| !(r.in_use)(*ip))
            .map(|address| Allocation {
                address,
                source: serde_json::from_value(json!({"fromClass": {}})).unwrap(),
                name: None,
            })
            .ok_or(AllocateError::Exhausted)
    }
}

#[tokio::test]
async fn an_address_a_service_already_shows_is_never_allocated() {
    let ctx = ctx_of(TwoIpv4, &[], true);
    // A tenant's Service showing 192.0.2.7, which no claim holds (its own pin, honoured
    // by the backend outside the ledger).
    let squatter: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "squat", "namespace": "other"},
        "spec": {"type": "LoadBalancer"},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}}))
    .unwrap();
    let key = key_of(&squatter);
    let entry = crate::services::Entry::of(
        &squatter,
        address_controller_api::service::ingress_addresses(&squatter),
        &ctx.marker,
    );
    ctx.services.changed(&key, None, Some(&entry));
    if let Some(services) = ctx.world.services.as_ref() {
        services.apply(key, Some(Arc::new(squatter)));
    }
    let c = claim(json!({"spec": {"family": "IPv4"}}));
    match plan(&ctx, &c, "t/c").await {
        ClaimPlan::Create { chosen, .. } => {
            assert_eq!(chosen[0].1.address.to_string(), "192.0.2.8");
        }
        other => panic!("{other:?}"),
    }
}

const KEPT: &str = "/apis/local.sdn.cozystack.io/v1alpha1/ipaddresses/ipv4-192-0-2-9";

fn kept(deleting: bool) -> IPAddress {
    let mut v = json!({"metadata": {"name": "ipv4-192-0-2-9", "resourceVersion": "7",
            "finalizers": ["other.example/keep", "p.example/teardown"]},
        "spec": {"address": "192.0.2.9", "className": "ours", "source": {"fromClass": {}}}});
    if deleting {
        merge(
            &mut v,
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        );
    }
    serde_json::from_value(v).unwrap()
}

/// The mock-API tier: an address being deleted is released in the backend, then only the
/// driver's own finalizer leaves, guarded by the resourceVersion the pass read.
#[tokio::test]
async fn a_teardown_releases_then_removes_only_its_finalizer_guarded_and_retries_a_409() {
    use address_controller_runtime::mock_api::{Answer, MockApi};
    let refused = std::sync::atomic::AtomicBool::new(false);
    let (api, client) = MockApi::new(move |call| {
        if call.method == "PATCH" && call.path == KEPT {
            if !refused.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Answer::conflict();
            }
            return Answer::Object(serde_json::to_value(kept(true)).unwrap());
        }
        Answer::Status(404, "NotFound")
    });
    let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ctx = Arc::new(ctx_on(Null(Some(released.clone())), &[], false, client));
    let a = kept(true);
    ctx.world.addresses.apply(key_of(&a), Some(Arc::new(a)));
    let err = super::address_pass(ctx.clone(), "ipv4-192-0-2-9".into())
        .await
        .unwrap_err();
    // A 409 on the finalizer's removal is retried with backoff (the release is idempotent).
    assert_eq!(
        err.retry(),
        address_controller_runtime::workers::Retry::Backoff
    );
    super::address_pass(ctx, "ipv4-192-0-2-9".into())
        .await
        .unwrap();
    assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 2);
    let writes = api.writes();
    assert_eq!(writes.len(), 2);
    for w in &writes {
        assert_eq!(w.line(), format!("PATCH {KEPT}"));
        assert_eq!(
            w.body,
            json!({"metadata": {"resourceVersion": "7", "finalizers": ["other.example/keep"]}})
        );
    }
}

/// The mock-API tier: the class pass writes capacity and conditions once, guarded; the
/// status as written is not written again.
#[tokio::test]
async fn a_class_status_is_written_guarded_and_not_again_once_it_shows() {
    use address_controller_runtime::mock_api::{Answer, MockApi};
    let (api, client) = MockApi::new(|call| {
        if call.method == "PATCH" && call.path.ends_with("/ipaddressclasses/ours/status") {
            return Answer::Object(
                json!({"metadata": {"name": "ours"}, "spec": {"provisioner": "p.example"}}),
            );
        }
        Answer::Status(404, "NotFound")
    });
    let ctx = Arc::new(ctx_on(Null(Some(Arc::default())), &[], false, client));
    let class: IPAddressClass = serde_json::from_value(json!({"metadata": {"name": "ours",
        "resourceVersion": "3", "generation": 2}, "spec": {"provisioner": "p.example"}}))
    .unwrap();
    ctx.world
        .classes
        .apply(key_of(&class), Some(Arc::new(class.clone())));
    super::class::class_pass(ctx.clone(), "ours".into())
        .await
        .unwrap();
    let writes = api.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let body = &writes[0].body;
    assert_eq!(body["metadata"]["resourceVersion"], "3", "{body}");
    assert_eq!(
        body["status"]["capacity"],
        json!({"ipv4": 1, "ipv6": 0}),
        "{body}"
    );
    // The cache shows what was written: the next pass writes nothing.
    let mut shown = class;
    shown.status = serde_json::from_value(body["status"].clone()).unwrap();
    shown.metadata.resource_version = Some("4".into());
    ctx.world
        .classes
        .apply(key_of(&shown), Some(Arc::new(shown)));
    super::class::class_pass(ctx, "ours".into()).await.unwrap();
    assert_eq!(api.writes().len(), 1);
}
