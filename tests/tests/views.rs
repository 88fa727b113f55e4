//! The aggregated API server through a real kube-apiserver and real kubectl: registration
//! by APIService + ExternalName Service to localhost, the views, and their security.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use address_controller_tests::kubectl_admin as kubectl;
use std::collections::BTreeMap;
use std::time::Duration;

use address_controller_api::{ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::env::{APISERVICE, Env, env, phase, register_views, tempdir};
use address_controller_tests::{
    Cluster, ControllerProcess, TestNamespace, free_port, sample, wait_for,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

async fn serving(e: &mut Env) -> ControllerProcess {
    e.serve_views().await.0
}

/// The views through the aggregator, read with kubectl: a namespace's holdings (a
/// server-side Table, -n, -o wide, -o yaml, an empty namespace), its addresses
/// subresource, a pool's availability, discovery, and kube-apiserver's errors.
#[tokio::test]
async fn views_through_the_aggregator_with_kubectl() {
    let mut e = env("views").await;
    let _ctl = serving(&mut e).await;
    let class = e.class("pub", json!({"status": {}})).await;
    e.classes()
        .patch_status(
            &class,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"ipv4": 10, "ipv6": 4}}})),
        )
        .await
        .unwrap();
    e.address("a", "192.0.2.120", &class, json!({})).await;
    e.address("b", "2001:db8::120", &class, json!({})).await;
    e.address("c", "192.0.2.121", &class, json!({})).await;
    e.claim("web", json!({"className": class})).await;
    e.claim("mail", json!({"className": class, "family": "IPv6"}))
        .await;
    e.claim("gone", json!({"className": class})).await;
    for c in ["web", "mail", "gone"] {
        e.wait_claim(c, "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
            .await;
    }
    e.claims()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    e.wait_claim_gone("gone").await;
    e.claim("waiting", json!({"className": class})).await;
    let ns = e.ns.name.clone();

    // kubectl get namespaceaddresses -A: server-side Table with the holdings columns.
    let expect = format!("{ns}   {ns}   3 ");
    let out = wait_for("holdings to show", Duration::from_secs(30), || async {
        let (ok, out, err) = kubectl(&["get", "namespaceaddresses", "-A"]);
        if !ok {
            return Err(anyhow::anyhow!("{err}"));
        }
        let squeezed = out
            .split('\n')
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join("   "))
            .collect::<Vec<_>>()
            .join("\n");
        Ok(squeezed.contains(&expect).then_some(out))
    })
    .await
    .unwrap();
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "CLAIMS",
            "BOUND",
            "PENDING",
            "LOST",
            "IPV4",
            "IPV6",
            "RELEASED"
        ],
        "{out}"
    );
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with(&ns))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[2..],
        ["3", "2", "1", "0", "1", "1", "1"],
        "claims, bound, pending, lost, v4, v6, released: {out}"
    );

    // -n, -o wide, -o yaml, get of one, and of an empty namespace (zeros).
    let (ok, out, err) = kubectl(&["get", "namespaceaddresses", "-n", &ns, "-o", "wide"]);
    assert!(ok, "{err}");
    assert!(out.contains("ASSOCIATED") && out.contains(&class), "{out}");
    let (ok, out, _) = kubectl(&["get", "namespaceaddresses", &ns, "-n", &ns, "-o", "yaml"]);
    assert!(ok);
    let v: Value = serde_yaml::from_str(&out).unwrap();
    assert_eq!(v["kind"], "NamespaceAddresses");
    assert_eq!(v["summary"]["releasedRetained"], 1);
    assert_eq!(v["claims"].as_array().unwrap().len(), 3);
    let other = TestNamespace::create(&e.client, "views-empty")
        .await
        .unwrap();
    let (ok, out, err) = kubectl(&[
        "get",
        "--raw",
        &format!(
            "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{0}/namespaceaddresses/{0}",
            other.name
        ),
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["summary"]["claims"]["total"], 0);

    the_addresses_subresource_whole_and_by_claim(&ns);
    the_pools_availability(&class);
    discovery_and_errors_as_kubectl_expects(&ns, &class);

    drop(other);
    e.check_with(&[&_ctl]).await;
}

/// The addresses subresource, whole and filtered by claim.
fn the_addresses_subresource_whole_and_by_claim(ns: &str) {
    let raw = format!(
        "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{ns}/namespaceaddresses/{ns}/addresses"
    );
    let (ok, out, err) = kubectl(&["get", "--raw", &raw]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let records: BTreeMap<String, String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["claim"].as_str().unwrap().to_string(),
                i["phase"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(records.get("gone").map(String::as_str), Some("Released"));
    assert_eq!(records.get("web").map(String::as_str), Some("Bound"));
    let (_, out, _) = kubectl(&["get", "--raw", &format!("{raw}?claim=mail")]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(v["items"][0]["family"], "IPv6");
}

/// poolavailabilities: capacity, allocated, free, pending claims; per family as kubectl
/// prints it (allocated/capacity, free, used share).
fn the_pools_availability(class: &str) {
    let (ok, out, err) = kubectl(&["get", "poolavailabilities", class, "-o", "json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            v["capacity"]["ipv4"].as_i64(),
            v["allocated"]["ipv4"].as_i64(),
            v["free"]["ipv4"].as_i64()
        ),
        (Some(10), Some(2), Some(8))
    );
    assert_eq!(v["pendingClaims"], 1);
    // Per family, as kubectl prints it: allocated/capacity, free, used share.
    let (ok, out, err) = kubectl(&["get", "pool", class]);
    assert!(ok, "{err}");
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..9],
        [
            class,
            "pub.drivers.test",
            "2/10",
            "8",
            "20%",
            "1/4",
            "3",
            "25%",
            "1"
        ],
        "{out}"
    );
}

/// Discovery: kubectl api-resources lists the views without errors. Errors: unknown names,
/// writes, bad field selectors; a good one.
fn discovery_and_errors_as_kubectl_expects(ns: &str, class: &str) {
    let (ok, out, err) = kubectl(&["api-resources", "--api-group=view.local.sdn.cozystack.io"]);
    assert!(
        ok && !err.contains("unable to retrieve"),
        "{ok} {out} {err}"
    );
    assert!(
        out.contains("namespaceaddresses") && out.contains("poolavailabilities"),
        "{out}"
    );

    // Errors: unknown names, writes, bad field selectors.
    let (ok, _, err) = kubectl(&["get", "poolavailabilities", "nope"]);
    assert!(!ok && err.contains("not found"), "{err}");
    let (ok, _, err) = kubectl(&["delete", "poolavailabilities", class]);
    assert!(
        !ok && (err.contains("not supported") || err.contains("MethodNotAllowed")),
        "{err}"
    );
    let (ok, _, err) = kubectl(&[
        "get",
        "namespaceaddresses",
        "-A",
        "--field-selector",
        "spec.x=1",
    ]);
    assert!(
        !ok && err.contains("field label not supported: spec.x"),
        "{err}"
    );
    let (ok, out, _) = kubectl(&[
        "get",
        "namespaceaddresses",
        "-A",
        "--field-selector",
        &format!("metadata.namespace={ns}"),
        "-o",
        "name",
    ]);
    assert!(ok);
    assert_eq!(
        out.trim(),
        format!("namespaceaddresses.view.local.sdn.cozystack.io/{ns}")
    );
}

/// Who may read what: a tenant its own namespace's views only; around the aggregator, only
/// the real front proxy may say who is calling (forged headers, another CA's or another
/// name's certificate, a bad token: refused); `/metrics` only for a token allowed the path;
/// a flood of bad tokens never past the auth cache's bound; the view store's size on
/// `/metrics`; nothing anonymous anywhere.
#[tokio::test]
async fn security_front_proxy_tokens_and_rbac() {
    let mut e = env("views-sec").await;
    // A review budget the flood below fits in (the gate that refuses past it is
    // hostile.rs's): this test is about the caches' bound.
    let (ctl, _, metrics_port) = e
        .serve_views_with(&[
            "--auth-cache-size",
            &CACHE.to_string(),
            "--auth-review-burst",
            "1000",
        ])
        .await;
    let ns_b = TestNamespace::create(&e.client, "views-sec-b")
        .await
        .unwrap();
    a_tenant_reads_its_own_namespaces_views_only(&e, &ns_b.name);
    let port = views_port();
    only_the_front_proxy_may_say_who_is_calling(&port).await;
    let scraper = Scraper::allowed_metrics(&mut e, metrics_port);
    only_a_token_allowed_the_path_reads_metrics(&scraper);
    a_flood_of_bad_tokens_stays_within_the_caches_bound(&port, &scraper).await;
    the_view_stores_size_is_on_metrics(&e, &scraper).await;
    // Anonymous /metrics on the views' port: refused like any path the user may not get.
    assert_eq!(
        status_code(&format!("https://127.0.0.1:{port}/metrics"), &[]),
        "403"
    );
    // The plain probe port serves probes, nothing else: no anonymous /metrics anywhere.
    let (code, _) = address_controller_tests::http_get(&format!("http://{}/metrics", ctl.probe))
        .await
        .unwrap();
    assert_eq!(code, 404);
    let (code, _) = ctl.readyz().await.unwrap();
    assert_eq!(code, 200, "the probe port answers probes");
    drop(ns_b);
    e.check_with(&[&ctl]).await;
}

/// Small auth caches, so that a flood fills them.
const CACHE: usize = 50;

/// The tenant may read the views in its namespace only: not in `other`, not across the
/// cluster.
fn a_tenant_reads_its_own_namespaces_views_only(e: &Env, other: &str) {
    let cluster = Cluster::get();
    let ns_a = &e.ns.name;
    let user = format!("tenant-{}", e.sfx);
    // The tenant may read the views in namespace A only.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "views", "namespace": ns_a},
        "rules": [{"apiGroups": ["view.local.sdn.cozystack.io"], "resources": ["namespaceaddresses", "namespaceaddresses/addresses"], "verbs": ["get", "list"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "views", "namespace": ns_a},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "views"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    let dir = tempdir();
    let file = dir.join("rbac.yaml");
    std::fs::write(
        &file,
        format!(
            "{}---\n{}",
            serde_yaml::to_string(&role).unwrap(),
            serde_yaml::to_string(&binding).unwrap()
        ),
    )
    .unwrap();
    cluster
        .kubectl_ok(&["apply", "-f", file.to_str().unwrap()])
        .unwrap();

    let as_tenant = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--as", user.as_str()]);
        kubectl(&a)
    };
    let (ok, _, err) = as_tenant(&["get", "namespaceaddresses", "-n", ns_a]);
    assert!(ok, "{err}");
    let (ok, _, err) = as_tenant(&[
        "get",
        "--raw",
        &format!(
            "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{ns_a}/namespaceaddresses/{ns_a}/addresses"
        ),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = as_tenant(&["get", "namespaceaddresses", "-n", other]);
    assert!(
        !ok && err.contains("forbidden")
            && err.contains(&format!(
                "User \"{user}\" cannot list resource \"namespaceaddresses\""
            )),
        "{err}"
    );
    let (ok, _, err) = as_tenant(&["get", "namespaceaddresses", "-A"]);
    assert!(!ok && err.contains("at the cluster scope"), "{err}");
}

/// The status code of a `curl -k` GET of `url` with `extra` arguments.
fn status_code(url: &str, extra: &[&str]) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The views server's own port (the APIService's), to be reached around the aggregator.
fn views_port() -> String {
    Cluster::get()
        .kubectl_ok(&[
            "get",
            "apiservice",
            APISERVICE,
            "-o",
            "jsonpath={.spec.service.port}",
        ])
        .unwrap()
        .trim()
        .to_string()
}

/// Straight to the server, around the aggregator: forged identity headers without a
/// client certificate, the cluster CA's certificate, a front-proxy CA's certificate for a
/// name not allowed, a bad bearer token — refused; the real front proxy — trusted. Probes
/// need nothing.
async fn only_the_front_proxy_may_say_who_is_calling(port: &str) {
    let cluster = Cluster::get();
    let url = format!(
        "https://127.0.0.1:{port}/apis/view.local.sdn.cozystack.io/v1alpha1/namespaceaddresses"
    );
    let pki = cluster.dir.join("pki");
    let curl = |extra: &[&str]| {
        let forged = [
            "-H",
            "X-Remote-User: admin",
            "-H",
            "X-Remote-Group: system:masters",
        ];
        status_code(&url, &[&forged[..], extra].concat())
    };
    // Forged identity headers without a client certificate: ignored, anonymous, refused.
    assert_eq!(curl(&[]), "403");
    // A client certificate from the cluster CA is not the front proxy: 401.
    let admin = [pki.join("admin.crt"), pki.join("admin.key")];
    assert_eq!(
        curl(&[
            "--cert",
            admin[0].to_str().unwrap(),
            "--key",
            admin[1].to_str().unwrap()
        ]),
        "401"
    );
    // The real front-proxy certificate is trusted.
    let fp = [
        pki.join("front-proxy-client.crt"),
        pki.join("front-proxy-client.key"),
    ];
    assert_eq!(
        curl(&[
            "--cert",
            fp[0].to_str().unwrap(),
            "--key",
            fp[1].to_str().unwrap()
        ]),
        "200"
    );
    // Signed by the front-proxy CA, but for a name requestheader-allowed-names does not
    // list: not the front proxy either, 401 (positive control above: the real one is 200).
    let intruder = tempdir();
    let (key, csr, crt) = (
        intruder.join("intruder.key"),
        intruder.join("intruder.csr"),
        intruder.join("intruder.crt"),
    );
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=intruder",
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        csr.to_str().unwrap(),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        csr.to_str().unwrap(),
        "-CA",
        pki.join("front-proxy-ca.crt").to_str().unwrap(),
        "-CAkey",
        pki.join("front-proxy-ca.key").to_str().unwrap(),
        "-set_serial",
        "4242",
        "-days",
        "1",
        "-out",
        crt.to_str().unwrap(),
        // Made as the real one is (a v1 certificate would be refused at the handshake,
        // which says nothing about the allowed names).
        "-extfile",
        pki.join("front-proxy-client.ext").to_str().unwrap(),
    ]);
    assert_eq!(
        curl(&[
            "--cert",
            crt.to_str().unwrap(),
            "--key",
            key.to_str().unwrap()
        ]),
        "401"
    );
    // A bad bearer token: 401. Probes need nothing.
    assert_eq!(curl(&["-H", "Authorization: Bearer not-a-token"]), "401");
    let out = std::process::Command::new("curl")
        .args(["-sk", &format!("https://127.0.0.1:{port}/readyz")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok");
}

/// A ServiceAccount allowed `GET /metrics` (the chart's metrics-reader, made here), one
/// that is not, and the metrics port.
struct Scraper {
    ns: String,
    metrics_port: u16,
}

impl Scraper {
    fn allowed_metrics(e: &mut Env, metrics_port: u16) -> Scraper {
        let cluster = Cluster::get();
        let ns_a = e.ns.name.clone();
        let reader_role = format!("metrics-reader-{}", e.sfx);
        let rbac = json!([
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "scraper", "namespace": ns_a}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody", "namespace": ns_a}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": reader_role},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": reader_role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader_role},
                "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns_a}]},
        ]);
        let dir = tempdir();
        let file = dir.join("metrics-rbac.yaml");
        std::fs::write(
            &file,
            rbac.as_array()
                .unwrap()
                .iter()
                .map(|o| serde_yaml::to_string(o).unwrap())
                .collect::<Vec<_>>()
                .join("---\n"),
        )
        .unwrap();
        cluster
            .kubectl_ok(&["apply", "-f", file.to_str().unwrap()])
            .unwrap();
        e.cleanup
            .add("clusterroles.rbac.authorization.k8s.io", &reader_role);
        e.cleanup.add(
            "clusterrolebindings.rbac.authorization.k8s.io",
            &reader_role,
        );
        Scraper {
            ns: ns_a,
            metrics_port,
        }
    }

    /// A fresh token of the ServiceAccount `sa`.
    fn token(&self, sa: &str) -> String {
        Cluster::get()
            .kubectl_ok(&["create", "token", sa, "-n", &self.ns])
            .unwrap()
            .trim()
            .to_string()
    }

    /// `GET /metrics` over HTTPS with `auth` as the bearer token: the status and the body.
    fn metrics(&self, auth: Option<String>) -> (String, String) {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sk", "-w", "\n%{http_code}"]);
        if let Some(t) = auth {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        let out = cmd
            .arg(format!("https://127.0.0.1:{}/metrics", self.metrics_port))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.to_string(), body.to_string())
    }
}

/// `/metrics` over HTTPS: only for a token whose principal may get the path.
fn only_a_token_allowed_the_path_reads_metrics(s: &Scraper) {
    let (metrics, token) = (|a| s.metrics(a), |sa: &str| s.token(sa));
    let (code, body) = metrics(Some(token("scraper")));
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("address_controller_ipaddresses"), "{body}");
    assert_eq!(metrics(Some(token("nobody"))).0, "403");
    assert_eq!(metrics(None).0, "403", "anonymous");
    assert_eq!(metrics(Some("garbage".into())).0, "401");
}

/// A flood of distinct bad tokens: every one refused, the token cache never past its
/// bound (and filled: the refusals are cached).
async fn a_flood_of_bad_tokens_stays_within_the_caches_bound(port: &str, s: &Scraper) {
    let dir = tempdir();
    let config = dir.join("flood.curlrc");
    let flood = 6 * CACHE;
    let block = |i: usize| {
        format!(
            "url = \"https://127.0.0.1:{port}/apis/view.local.sdn.cozystack.io/v1alpha1/namespaceaddresses\"\nheader = \"Authorization: Bearer flood-{i}\"\ninsecure\noutput = \"/dev/null\"\nwrite-out = \"%{{http_code}}\\n\"\n"
        )
    };
    // One curl for all of them: blocks of per-request options, `next` between them.
    let rc = (0..flood).map(block).collect::<Vec<_>>().join("next\n");
    std::fs::write(&config, rc).unwrap();
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "-Z",
            "--parallel-max",
            "16",
            "-K",
            config.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let codes = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut tally = std::collections::BTreeMap::<&str, usize>::new();
    codes
        .lines()
        .for_each(|c| *tally.entry(c).or_default() += 1);
    assert_eq!(tally.get("401"), Some(&flood), "{tally:?}");
    let scraper = s.token("scraper");
    let held = wait_for(
        "the token cache within its bound",
        Duration::from_secs(30),
        || {
            let scraper = scraper.clone();
            async move {
                let (_, body) = s.metrics(Some(scraper));
                let held = sample(
                    &body,
                    "address_controller_apiserver_auth_cache_entries{cache=\"tokens\"}",
                )
                .map(|v| v as usize)
                .ok_or_else(|| anyhow::anyhow!("no token cache gauge"))?;
                Ok((held <= CACHE).then_some(held))
            }
        },
    )
    .await
    .unwrap();
    assert!(held > 0, "refusals are cached");
    println!("{flood} distinct bad tokens: all 401, {held} held (bound {CACHE})");
}

/// The view store's size, beside the auth caches: what it holds now, and its watch history
/// — which a claim in the namespace adds to (its holdings change).
async fn the_view_stores_size_is_on_metrics(e: &Env, s: &Scraper) {
    let scraper = s.token("scraper");
    e.claim("counted", json!({"className": "views-sec-none"}))
        .await;
    let gauge = |body: &str, name: &str, part: &str| -> f64 {
        let series = format!("address_controller_apiserver_{name}{{part=\"{part}\"}}");
        sample(body, &series).unwrap_or_else(|| panic!("no {series} in /metrics"))
    };
    let body = wait_for(
        "the claim in the view history",
        Duration::from_secs(30),
        || {
            let scraper = scraper.clone();
            async move {
                let (_, body) = s.metrics(Some(scraper));
                Ok((gauge(&body, "view_entries", "history") >= 1.0).then_some(body))
            }
        },
    )
    .await
    .unwrap();
    let (objects, object_bytes) = (
        gauge(&body, "view_entries", "objects"),
        gauge(&body, "view_bytes", "objects"),
    );
    // At least namespace A's holdings, each serialized object more than its metadata's bytes.
    assert!(
        objects >= 1.0 && object_bytes >= 64.0 * objects,
        "{objects} objects, {object_bytes} bytes"
    );
    assert!(gauge(&body, "view_bytes", "history") >= 64.0, "{body}");
}

#[tokio::test]
async fn view_numbers_match_the_crds_after_a_random_mix() {
    let mut e = env("views-mix").await;
    let _ctl = serving(&mut e).await;
    let class = e.class("pub", json!({})).await;
    // A deterministic pseudo-random mix: addresses of both families, claims of all
    // families, some deleted again.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from_str_radix(&e.sfx, 16).unwrap_or(1);
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for i in 0..24 {
        let ip = if next(3) == 0 {
            format!("2001:db8:77::{i:x}")
        } else {
            format!("198.18.77.{}", i + 1)
        };
        e.address(&format!("m{i}"), &ip, &class, json!({})).await;
    }
    let families = ["IPv4", "IPv6", "Dual"];
    for i in 0..16 {
        e.claim(
            &format!("c{i}"),
            json!({"className": class, "family": families[next(3) as usize]}),
        )
        .await;
    }
    // Some claims bind, some wait (the pool may lack a family): delete a few once the
    // controller has looked at every one.
    for i in 0..16 {
        e.wait_claim(&format!("c{i}"), "a phase", |c| phase(c).is_some())
            .await;
    }
    for i in 0..16 {
        if next(3) == 0 {
            e.claims()
                .delete(&format!("c{i}"), &DeleteParams::default())
                .await
                .unwrap();
        }
    }
    let ns = e.ns.name.clone();
    let claims_api = e.claims();
    let addresses_api: Api<IPAddress> = e.addresses();
    // Compare once everything settled: the view must equal what the CRDs say.
    wait_for("views equal to the CRDs", Duration::from_secs(60), || async {
        let claims: Vec<IPAddressClaim> = claims_api.list(&ListParams::default()).await?.items;
        if claims.iter().any(|c| c.metadata.deletion_timestamp.is_some()) {
            return Ok(None);
        }
        let addresses: Vec<IPAddress> = addresses_api.list(&ListParams::default()).await?.items.into_iter()
            .filter(|a| a.spec.class_name == class).collect();
        let count = |p: ClaimPhase| claims.iter().filter(|c| phase(c) == Some(p)).count() as i64;
        let aphase = |a: &IPAddress, p: &str| a.status.as_ref().and_then(|s| s.phase).map(|x| x.as_str()) == Some(p);
        let mine = |a: &&IPAddress| a.spec.claim_ref.as_ref().is_some_and(|r| r.namespace == ns);
        let bound = addresses.iter().filter(mine).filter(|a| aphase(a, "Bound")).count() as i64;
        let released = addresses.iter().filter(mine).filter(|a| aphase(a, "Released")).count() as i64;
        let (_, out, _) = kubectl(&["get", "--raw", &format!("/apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/{ns}/namespaceaddresses/{ns}")]);
        let v: Value = serde_json::from_str(&out)?;
        let s = &v["summary"];
        let want = json!({"total": claims.len(), "bound": count(ClaimPhase::Bound), "pending": count(ClaimPhase::Pending),
            "lost": count(ClaimPhase::Lost), "addressesBound": bound, "releasedRetained": released});
        let got = json!({"total": s["claims"]["total"], "bound": s["claims"]["bound"], "pending": s["claims"]["pending"],
            "lost": s["claims"]["lost"], "addressesBound": s["addressesBound"], "releasedRetained": s["releasedRetained"]});
        let (_, out, _) = kubectl(&["get", "--raw", &format!("/apis/view.local.sdn.cozystack.io/v1alpha1/poolavailabilities/{class}")]);
        let p: Value = serde_json::from_str(&out)?;
        let v4 = addresses.iter().filter(|a| !a.spec.address.contains(':')).count() as i64;
        let pool_ok = p["allocated"]["ipv4"] == json!(v4) && p["allocated"]["ipv6"] == json!(addresses.len() as i64 - v4);
        if got == want && pool_ok { Ok(Some(())) } else { Err(anyhow::anyhow!("view {got} vs CRDs {want}; pool {}", p["allocated"])) }
    })
    .await
    .unwrap();
    e.check_with(&[&_ctl]).await;
}

#[tokio::test]
async fn explain_watch_and_certificate_rotation() {
    let mut e = env("views-more").await;
    e.ctl.kill();
    let cluster = Cluster::get();
    // Serve from copies of the certificate files, so the test can rotate them.
    let dir = tempdir();
    let pki = cluster.dir.join("pki");
    for f in ["aggr.crt", "aggr.key"] {
        std::fs::copy(pki.join(f), dir.join(f)).unwrap();
    }
    let port = free_port();
    let _ctl = ControllerProcess::start(
        &format!("ctl-views-more-{}", e.sfx),
        &[
            "--leader-elect=false",
            "--apiserver-address",
            &format!("127.0.0.1:{port}"),
            "--tls-cert-file",
            dir.join("aggr.crt").to_str().unwrap(),
            "--tls-private-key-file",
            dir.join("aggr.key").to_str().unwrap(),
        ],
    )
    .await
    .unwrap();
    register_views(&mut e, port).await;

    // kubectl explain through the aggregated OpenAPI v3.
    let out = wait_for(
        "kubectl explain namespaceaddresses.summary",
        Duration::from_secs(90),
        || async {
            let (ok, out, err) = kubectl(&["explain", "namespaceaddresses.summary"]);
            if ok && out.contains("FIELDS") {
                Ok(Some(out))
            } else {
                Err(anyhow::anyhow!("{err}"))
            }
        },
    )
    .await
    .unwrap();
    assert!(
        out.contains("KIND:       NamespaceAddresses") && out.contains("releasedRetained"),
        "{out}"
    );

    // kubectl get -w: the namespace's row first, then its change when a claim binds.
    let ns = e.ns.name.clone();
    let class = e.class("pub", json!({})).await;
    e.address("a", "192.0.2.130", &class, json!({})).await;
    e.claim("first", json!({"className": "no-such-class"}))
        .await;
    let mut watch = Cluster::get()
        .kubectl()
        .args([
            "get",
            "namespaceaddresses",
            "-n",
            &ns,
            "-w",
            "--output-watch-events",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let lines = std::sync::Mutex::new(Vec::<String>::new());
    let seen = |prefix: &'static str| {
        let (rx, lines, ns) = (&rx, &lines, &ns);
        async move {
            let mut l = lines.lock().unwrap();
            l.extend(rx.try_iter());
            Ok(l.iter()
                .any(|l| l.starts_with(prefix) && l.contains(ns.as_str()))
                .then_some(()))
        }
    };
    wait_for("the watch's initial row", Duration::from_secs(30), || {
        seen("ADDED")
    })
    .await
    .unwrap();
    e.claim("web", json!({"className": class})).await;
    e.wait_claim("web", "Bound", |c| phase(c) == Some(ClaimPhase::Bound))
        .await;
    wait_for("the watch's MODIFIED row", Duration::from_secs(30), || {
        seen("MODIFIED")
    })
    .await
    .unwrap();
    let _ = watch.kill();
    let _ = watch.wait();

    // Rotation: new files are served without a restart.
    let serial = || {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("openssl s_client -connect 127.0.0.1:{port} -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -serial"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let before = serial();
    assert!(before.starts_with("serial="), "{before}");
    let ext = dir.join("ext");
    std::fs::write(&ext, "subjectAltName=DNS:address-controller-api.address-controller-system.svc,DNS:localhost\nextendedKeyUsage=serverAuth\n").unwrap();
    let sh = format!(
        "cd {d} && openssl ecparam -name prime256v1 -genkey -noout -out new.key && openssl req -new -key new.key -subj /CN=rotated -out new.csr \
         && openssl x509 -req -in new.csr -CA {p}/aggr-ca.crt -CAkey {p}/aggr-ca.key -CAcreateserial -days 1 -extfile ext -out new.crt \
         && mv new.key aggr.key.tmp && mv new.crt aggr.crt && mv aggr.key.tmp aggr.key",
        d = dir.display(),
        p = pki.display()
    );
    assert!(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(&sh)
            .status()
            .unwrap()
            .success()
    );
    let after = wait_for(
        "the rotated certificate",
        Duration::from_secs(10),
        || async {
            let s = serial();
            Ok((s != before && s.starts_with("serial=")).then_some(s))
        },
    )
    .await
    .unwrap();
    assert_ne!(after, before);
    // The aggregator keeps working across the rotation.
    let (ok, _, err) = kubectl(&["get", "namespaceaddresses", "-n", &ns]);
    assert!(ok, "{err}");
    e.check_with(&[&_ctl]).await;
}
