//! Monitoring proven against a real Prometheus (built from Go modules, cached like the
//! control plane): the chart's PrometheusRule under `promtool test rules`, Prometheus
//! scraping the controller exactly as the chart's ServiceMonitor describes, the ledger
//! gauges against the objects, the rules loading without errors, and every panel query of
//! the chart's Grafana dashboard returning data.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use address_controller_api::{ClaimPhase, IPAddress, IPAddressClaim};
use address_controller_tests::chart::{INSTALL, Release, Runner, chart_dir, render};
use address_controller_tests::env::{RANGE_PROVISIONER, phase, tempdir};
use address_controller_tests::invariants::{Scope, assert_invariants};
use address_controller_tests::{
    Cleanup, Cluster, TestNamespace, free_port, repo_root, setup, wait_for,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

/// The chart's values for these tests: monitoring on, a fast scrape.
fn values() -> Value {
    json!({"metrics": {"serviceMonitor": {"enabled": true, "interval": "2s", "scrapeTimeout": "2s"},
        "prometheusRule": {"enabled": true}}, "rangeDriver": {"enabled": true}})
}

fn prometheus_bin(name: &str) -> PathBuf {
    PathBuf::from(Cluster::get().env_var("PROMETHEUS_BIN").unwrap()).join(name)
}

/// The rendered objects of the chart with monitoring.coreos.com served.
fn rendered(ns: &str) -> Vec<Value> {
    render(
        ns,
        &values(),
        &["--api-versions", "monitoring.coreos.com/v1"],
    )
    .unwrap()
}

fn find<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// The rule groups of the rendered PrometheusRule as a Prometheus rule file.
fn write_rules(objs: &[Value], dir: &Path) -> PathBuf {
    let groups = &find(objs, "PrometheusRule")["spec"]["groups"];
    let file = dir.join("rules.yaml");
    std::fs::write(
        &file,
        serde_yaml::to_string(&json!({"groups": groups})).unwrap(),
    )
    .unwrap();
    file
}

#[test]
fn alerts_fire_when_they_should_and_only_then() {
    let _ = Cluster::get();
    let dir = tempdir();
    write_rules(&rendered("address-controller-system"), &dir);
    std::fs::copy(
        repo_root().join("tests/monitoring/alerts.test.yaml"),
        dir.join("alerts.test.yaml"),
    )
    .unwrap();
    let promtool = prometheus_bin("promtool");
    let check = Command::new(&promtool)
        .args(["check", "rules", "rules.yaml"])
        .current_dir(dir.join("."))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let out = Command::new(&promtool)
        .args(["test", "rules", "alerts.test.yaml"])
        .current_dir(dir.join("."))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool test rules:\n{text}");
    // Every alert of the rule file has cases.
    let cases = std::fs::read_to_string(dir.join("alerts.test.yaml")).unwrap();
    let rules = std::fs::read_to_string(dir.join("rules.yaml")).unwrap();
    for alert in rules.lines().filter_map(|l| {
        l.trim()
            .strip_prefix("- alert: ")
            .or_else(|| l.trim().strip_prefix("alert: "))
    }) {
        assert!(
            cases.contains(&format!("alertname: {alert}")),
            "no promtool case for {alert}"
        );
    }
    // Every runbook_url names a runbook of docs/runbooks/ (the default base is this
    // repository's docs/runbooks/).
    let base = "https://github.com/cozystack/address-controller/blob/main/docs/runbooks/";
    let mut linked = 0;
    for url in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
    {
        let file = url
            .trim_matches(|c| c == '"' || c == '\'')
            .strip_prefix(base)
            .unwrap_or_else(|| panic!("runbook_url {url} is not under {base}"));
        assert!(
            repo_root().join("docs/runbooks").join(file).is_file(),
            "no runbook docs/runbooks/{file}"
        );
        linked += 1;
    }
    let alerts = rules.matches("alert: ").count();
    assert_eq!(linked, alerts, "an alert without runbook_url");
    println!("{text}");
}

#[test]
fn the_dashboard_is_a_valid_dashboard_shipped_for_the_sidecar() {
    let text =
        std::fs::read_to_string(chart_dir().join("dashboards/address-controller.json")).unwrap();
    let d: Value = serde_json::from_str(&text).unwrap();
    // What Grafana needs to import it, and what the dashboard promises.
    for key in [
        "title",
        "uid",
        "schemaVersion",
        "panels",
        "templating",
        "time",
    ] {
        assert!(!d[key].is_null(), "dashboard without {key}");
    }
    assert!(d["schemaVersion"].as_i64().unwrap() >= 36);
    let vars: Vec<&Value> = d["templating"]["list"].as_array().unwrap().iter().collect();
    let var = |n: &str| vars.iter().find(|v| v["name"] == n).copied();
    assert_eq!(var("datasource").unwrap()["type"], "datasource");
    assert_eq!(var("datasource").unwrap()["query"], "prometheus");
    for v in ["job", "class", "namespace"] {
        let v = var(v).unwrap_or_else(|| panic!("no variable {v}"));
        assert_eq!(v["type"], "query");
        assert_eq!(v["datasource"]["uid"], "${datasource}");
        assert_eq!(
            (v["includeAll"].as_bool(), v["allValue"].as_str()),
            (Some(true), Some(".*"))
        );
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut titles = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "duplicate panel id {}",
            p["id"]
        );
        let g = &p["gridPos"];
        assert!(
            g["w"].as_i64().unwrap() > 0
                && g["x"].as_i64().unwrap() + g["w"].as_i64().unwrap() <= 24,
            "{}",
            p["title"]
        );
        if p["type"] == "row" {
            continue;
        }
        titles.push(p["title"].as_str().unwrap().to_string());
        // Data source by variable, never a hard-coded one.
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()) && t["refId"].is_string());
        }
    }
    // The panels the issue asks for.
    for want in [
        "Holdings per namespace",
        "Top namespaces",
        "Pool usage",
        "Claims by phase",
        "Pending and Lost",
        "Bind latency",
        "Release-delay backlog",
        "Reconcile",
        "Leader and replicas",
        "Pool fill %",
        "Views latency and errors",
        "Process CPU and memory",
        "Work queues and calls",
        "Address-hours over the time range",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(want)),
            "no panel {want}: {titles:?}"
        );
    }
    // Shipped in a ConfigMap the Grafana sidecar picks up, word for word; opt-out.
    let objs = render("address-controller-system", &json!({}), &[]).unwrap();
    let cm = objs
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap" && o["metadata"]["name"] == "address-controller-dashboard"
        })
        .expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value =
        serde_json::from_str(cm["data"]["address-controller.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, d);
    let off = render(
        "address-controller-system",
        &json!({"dashboard": {"enabled": false}}),
        &[],
    )
    .unwrap();
    assert!(!off.iter().any(|o| o["kind"] == "ConfigMap"));
}

/// A Prometheus of the test's own, stopped on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: address_controller_tests::TempDir,
    /// Its configuration and the token file it reads at each scrape.
    _config: address_controller_tests::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    async fn query(&self, expr: &str) -> anyhow::Result<Value> {
        let out = Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "10",
                "-G",
                &format!("{}/api/v1/query", self.url),
            ])
            .args(["--data-urlencode", &format!("query={expr}")])
            .output()?;
        let v: Value = serde_json::from_slice(&out.stdout)?;
        if v["status"] != "success" {
            anyhow::bail!("{expr}: {v}");
        }
        Ok(v["data"]["result"].clone())
    }

    fn get(&self, path: &str) -> Value {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", &format!("{}{path}", self.url)])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }
}

/// The scrape configuration the ServiceMonitor describes, for a target on the host.
fn scrape_config(monitor: &Value, target: &str, ca: &Path, token: &Path, rules: &Path) -> Value {
    let ep = &monitor["spec"]["endpoints"][0];
    // prometheus-operator names the job after the Service the ServiceMonitor selects.
    let job = "address-controller-metrics";
    assert_eq!(ep["port"], "metrics");
    assert_eq!(
        (
            &ep["authorization"]["type"],
            &ep["authorization"]["credentials"]["key"]
        ),
        (&json!("Bearer"), &json!("token")),
        "the scraper presents the chart-made token"
    );
    assert!(
        ep.get("bearerTokenFile").is_none(),
        "the deprecated field is not used"
    );
    assert_eq!(ep["tlsConfig"]["ca"]["secret"]["key"], "ca.crt");
    json!({
        "global": {"scrape_interval": ep["interval"], "evaluation_interval": ep["interval"]},
        "rule_files": [rules],
        "scrape_configs": [{
            "job_name": job,
            "scheme": ep["scheme"],
            "metrics_path": ep["path"],
            "scrape_interval": ep["interval"],
            "scrape_timeout": ep["scrapeTimeout"],
            "authorization": {"type": "Bearer", "credentials_file": token},
            "tls_config": {"ca_file": ca, "server_name": ep["tlsConfig"]["serverName"]},
            "static_configs": [{"targets": [target], "labels": {"pod": "replica-0"}}],
        }],
    })
}

/// Prometheus scrapes the controller exactly as the chart's ServiceMonitor says, and with a
/// workload for every panel: the ledger it holds equals the objects, the chart's alert sees
/// a real Conflict, the rules evaluate, every panel of the dashboard has data, and its
/// usage agrees with the addresses' history.
#[tokio::test]
async fn prometheus_scrapes_as_the_chart_says_and_the_dashboard_has_data() {
    let _install = INSTALL.lock().await;
    let (_, client) = setup().await;
    let api_port = free_port();
    let release = Release::new(api_port, &values()).await;
    let runner = Runner::new(&release, true);
    let mut ctl = runner
        .controller("ctl-monitoring", Some(api_port), &[])
        .await
        .unwrap();
    let mut drv = runner.driver("drv-monitoring", &[]).await.unwrap();
    let metrics = ctl.metrics_address.clone().unwrap();
    let prometheus = prometheus_as_the_chart_says(&client, &release, &runner, &metrics).await;
    the_target_is_up(&prometheus).await;
    let started = k8s_openapi::jiff::Timestamp::now();
    let w = Workload::for_every_panel(&client, &release.ns).await;
    the_ledger_in_prometheus_equals_the_objects(&prometheus, &w).await;
    the_conflict_alert_sees_the_real_conflict(&prometheus, &w).await;
    the_rules_load_and_evaluate(&prometheus);
    every_panel_has_data(&prometheus).await;
    the_two_sources_of_usage_agree(&prometheus, &w, started).await;
    the_conflict_clears(&w).await;
    let scope = Scope::of(
        &[w.ns.name.as_str()],
        &[w.static_class.as_str(), w.driver_class.as_str()],
    );
    let replicas: Vec<_> = ctl.replica().into_iter().collect();
    assert_invariants(&client, &scope, &replicas).await;
    drop(prometheus);
    ctl.kill();
    drv.kill();
    drop(w);
    drop(release);
}

/// Prometheus started as the chart's ServiceMonitor describes the scrape. The scraper
/// token is the chart's: a ServiceAccount token Secret (kube-controller-manager fills it
/// in) bound to metrics-reader by the chart — nothing bound by hand; Prometheus gets it as
/// the ServiceMonitor says (authorization.credentials).
async fn prometheus_as_the_chart_says(
    client: &kube::Client,
    release: &Release,
    runner: &Runner,
    metrics_address: &str,
) -> Prometheus {
    let objs = rendered(&release.ns);
    let monitor = find(&objs, "ServiceMonitor");
    let secret = monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &release.ns);
    let token_bytes = wait_for(
        "the scraper token filled in",
        Duration::from_secs(60),
        || async {
            let s = secrets.get(&secret).await?;
            Ok(s.data.and_then(|d| d.get("token").cloned()).map(|t| t.0))
        },
    )
    .await
    .unwrap();
    let dir = tempdir();
    let token = dir.join("token");
    std::fs::write(&token, token_bytes).unwrap();
    let rules = write_rules(&objs, &dir);
    let config = scrape_config(
        find(&objs, "ServiceMonitor"),
        metrics_address,
        &runner.cert_dir().join("ca.crt"),
        &token,
        &rules,
    );
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, serde_yaml::to_string(&config).unwrap()).unwrap();
    let data = tempdir();
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    Prometheus {
        child: Command::new(prometheus_bin("prometheus"))
            .args([
                &format!("--config.file={}", config_file.display()),
                &format!("--storage.tsdb.path={}", data.display()),
                &format!("--web.listen-address=127.0.0.1:{port}"),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
        url: format!("http://127.0.0.1:{port}"),
        _dir: data,
        _config: dir,
    }
}

/// The target is up: TLS verified against the chart's CA for the ServiceMonitor's server
/// name, the token authorized by the chart's role.
async fn the_target_is_up(prometheus: &Prometheus) {
    let target = wait_for("the scrape target up", Duration::from_secs(60), || async {
        let t = prometheus.get("/api/v1/targets");
        let active = t["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        match active.first() {
            Some(a) if a["health"] == "up" => Ok(Some(a.clone())),
            Some(a) => Err(anyhow::anyhow!(
                "target {}: {}",
                a["health"],
                a["lastError"]
            )),
            None => Err(anyhow::anyhow!("no target yet")),
        }
    })
    .await
    .unwrap();
    println!(
        "target {} up (scrape {}s)",
        target["scrapeUrl"], target["lastScrapeDuration"]
    );
}

/// A workload for every panel: a static pool (with a Released address and a claim that
/// waits), a driver's class at its namespace's quota (a claim waits for room), a claim
/// shared by two Services, and a thief — another load balancer's Service showing a
/// claim's address: a real Conflict.
struct Workload {
    ns: TestNamespace,
    static_class: String,
    driver_class: String,
    client: kube::Client,
    _cleanup: Cleanup,
}

impl Workload {
    async fn for_every_panel(client: &kube::Client, sfx: &str) -> Workload {
        let mut cleanup = Cleanup::default();
        let ns = TestNamespace::create(client, "monitoring").await.unwrap();
        let static_class = format!("mon-static-{sfx}");
        let driver_class = format!("mon-range-{sfx}");
        for (name, spec) in [
            (
                &static_class,
                json!({"provisioner": "none.monitoring.test"}),
            ),
            (
                &driver_class,
                json!({"provisioner": RANGE_PROVISIONER, "parameters": {"cidrs": ["198.18.240.0/28"]}}),
            ),
        ] {
            let classes: Api<address_controller_api::IPAddressClass> = Api::all(client.clone());
            classes
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
                        .unwrap(),
                )
                .await
                .unwrap();
            cleanup.add("ipaddressclasses.local.sdn.cozystack.io", name);
        }
        let addresses: Api<IPAddress> = Api::all(client.clone());
        for i in 1..=2 {
            let name = format!("mon-{sfx}-{i}");
            let a = json!({"metadata": {"name": name}, "spec": {"address": format!("198.18.250.{i}"), "className": static_class, "source": {"fromClass": {}}}});
            addresses
                .create(&PostParams::default(), &serde_json::from_value(a).unwrap())
                .await
                .unwrap();
            cleanup.add("ipaddresses.local.sdn.cozystack.io", &name);
        }
        let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), &ns.name);
        let create = |name: &'static str, class: String| {
            let claims = claims.clone();
            async move {
                let c = json!({"metadata": {"name": name}, "spec": {"className": class}});
                claims
                    .create(&PostParams::default(), &serde_json::from_value(c).unwrap())
                    .await
                    .unwrap();
            }
        };
        for (name, class) in [
            ("s1", &static_class),
            ("s2", &static_class),
            ("d1", &driver_class),
            ("d2", &driver_class),
        ] {
            create(name, class.clone()).await;
        }
        for name in ["s1", "s2", "d1", "d2"] {
            wait_for(
                &format!("claim {name} Bound"),
                Duration::from_secs(60),
                || async {
                    Ok((phase(&claims.get(name).await?) == Some(ClaimPhase::Bound)).then_some(()))
                },
            )
            .await
            .unwrap();
        }
        // The driver's class is at the namespace's quota: d3 waits for room (the near-quota
        // panel and the quota gauges).
        let quotas: Api<address_controller_api::IPAddressQuota> =
            Api::namespaced(client.clone(), &ns.name);
        quotas
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "q"},
                    "spec": {"limits": [{"className": driver_class, "addresses": 2}]}}))
                .unwrap(),
            )
            .await
            .unwrap();
        create("d3", driver_class.clone()).await;
        // The static pool is used up: s3 waits.
        create("s3", static_class.clone()).await;
        // s1's address is kept for it (Retain, no release delay on the class): Released.
        claims.delete("s1", &DeleteParams::default()).await.unwrap();
        wait_for("s1 gone", Duration::from_secs(60), || async {
            Ok(claims.get_opt("s1").await?.is_none().then_some(()))
        })
        .await
        .unwrap();

        // Two Services naming d1, which shares (the range driver puts its address on both:
        // associated and shared), and a thief: another load balancer's Service showing d2's
        // address — a real Conflict.
        claims
            .patch(
                "d1",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"sharing": {"policy": "SameNamespace"}}})),
            )
            .await
            .unwrap();
        let services: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(client.clone(), &ns.name);
        let d2 = claims.get("d2").await.unwrap();
        let d2_ip = d2.status.unwrap().addresses[0].address.clone();
        for (name, spec) in [
            (
                "web",
                json!({"metadata": {"name": "web", "annotations": {"local.sdn.cozystack.io/ip-address-claim": "d1"}},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
            ),
            (
                "tls",
                json!({"metadata": {"name": "tls", "annotations": {"local.sdn.cozystack.io/ip-address-claim": "d1"}},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}}),
            ),
            (
                "thief",
                json!({"metadata": {"name": "thief"},
                    "spec": {"type": "LoadBalancer", "loadBalancerClass": "monitoring.test/other", "ports": [{"port": 80}]}}),
            ),
        ] {
            services
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(spec).unwrap(),
                )
                .await
                .unwrap();
            let _ = name;
        }
        services
            .patch_status(
                "thief",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"status": {"loadBalancer": {"ingress": [{"ip": d2_ip}]}}}),
                ),
            )
            .await
            .unwrap();
        Workload {
            ns,
            static_class,
            driver_class,
            client: client.clone(),
            _cleanup: cleanup,
        }
    }

    fn addresses(&self) -> Api<IPAddress> {
        Api::all(self.client.clone())
    }
}

/// The ledger in Prometheus agrees with the objects: each class's addresses by phase, and
/// the namespace's waiting claims.
async fn the_ledger_in_prometheus_equals_the_objects(prometheus: &Prometheus, w: &Workload) {
    let (addresses, ns) = (w.addresses(), &w.ns);
    let (static_class, driver_class) = (&w.static_class, &w.driver_class);
    wait_for(
        "Prometheus's ledger equal to the objects",
        Duration::from_secs(60),
        || async {
            let objects = addresses.list(&ListParams::default()).await?.items;
            let count = |class: &str, p: &str| {
                objects
                    .iter()
                    .filter(|a| a.spec.class_name == class)
                    .filter(|a| {
                        a.status.as_ref().and_then(|s| s.phase).map(|x| x.as_str()) == Some(p)
                    })
                    .count() as f64
            };
            for (class, p) in [
                (&static_class, "Released"),
                (&static_class, "Bound"),
                (&driver_class, "Bound"),
                (&driver_class, "Conflict"),
            ] {
                let r = prometheus
                    .query(&format!(
                        "max(address_controller_ipaddresses{{class=\"{class}\",phase=\"{p}\"}})"
                    ))
                    .await?;
                let v: f64 = r[0]["value"][1].as_str().unwrap_or("-1").parse()?;
                if v != count(class, p) {
                    return Err(anyhow::anyhow!(
                        "{class} {p}: Prometheus {v}, objects {}",
                        count(class, p)
                    ));
                }
            }
            let pending = prometheus
                .query(&format!(
                    "sum(address_controller_ipaddressclaims{{namespace=\"{}\",phase=\"Pending\"}})",
                    ns.name
                ))
                .await?;
            // s3 (the static pool is used up) and d3 (the quota is).
            let v: f64 = pending[0]["value"][1].as_str().unwrap_or("-1").parse()?;
            Ok((v == 2.0).then_some(()))
        },
    )
    .await
    .unwrap();
}

/// The chart's Conflict/Lost alert sees the real Conflict (pending: its `for` is minutes).
async fn the_conflict_alert_sees_the_real_conflict(prometheus: &Prometheus, w: &Workload) {
    let driver_class = &w.driver_class;
    let alert = wait_for(
        "IPAddressConflictOrLost active for the driver's class",
        Duration::from_secs(90),
        || async {
            let a = prometheus.get("/api/v1/alerts");
            let found = a["data"]["alerts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .find(|x| {
                    x["labels"]["alertname"] == "IPAddressConflictOrLost"
                        && x["labels"]["class"] == driver_class.as_str()
                        && x["labels"]["phase"] == "Conflict"
                });
            Ok(found)
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(alert["state"].as_str(), Some("pending" | "firing")),
        "{alert}"
    );
}

/// The chart's rules load and evaluate without errors.
fn the_rules_load_and_evaluate(prometheus: &Prometheus) {
    let groups = prometheus.get("/api/v1/rules");
    let loaded: Vec<&Value> = groups["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert!(loaded.len() >= 10, "{groups}");
    for r in &loaded {
        assert_eq!(r["health"], "ok", "{r}");
    }
}

/// Every panel query of the dashboard returns data (variables at "All", the rate interval
/// at a minute).
async fn every_panel_has_data(prometheus: &Prometheus) {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("dashboards/address-controller.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<(String, String)> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("").to_string();
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_string()))
        })
        .collect();
    let concrete = |e: &str| {
        e.replace("$class", ".*")
            .replace("$namespace", ".*")
            .replace("$job", ".*")
            .replace("$__rate_interval", "1m")
            // The dashboard's time range (the address-hours panel): the test's 10 minutes.
            .replace("$__range_s", "600")
            .replace("$__range", "10m")
    };
    let mut report = Vec::new();
    for (title, expr) in &exprs {
        // kube-state-metrics (the memory limit line) does not run here: the only query
        // allowed to be empty, and it must be that one.
        if expr.contains("kube_pod_container_resource_limits") {
            report.push(format!(
                "{title}: not queried (needs kube-state-metrics) ← {expr}"
            ));
            continue;
        }
        let got = wait_for(
            &format!("data for panel {title}: {expr}"),
            Duration::from_secs(90),
            || async {
                let r = prometheus.query(&concrete(expr)).await?;
                let series = r.as_array().map_or(0, Vec::len);
                Ok((series > 0).then_some(series))
            },
        )
        .await
        .unwrap();
        report.push(format!("{title}: {got} series ← {expr}"));
    }
    println!("{}", report.join("\n"));
}

/// The two sources of usage agree (docs/operations.md, "Billing for addresses"): the
/// address-seconds the namespace held since the test began, from the recording rule (the
/// samples × the evaluation interval) and from the addresses' history (`address-controller
/// usage`, to the second). They differ by at most an interval per bind or release, and an
/// interval at each end of the period.
async fn the_two_sources_of_usage_agree(
    prometheus: &Prometheus,
    w: &Workload,
    started: k8s_openapi::jiff::Timestamp,
) {
    let ns = &w.ns;
    let interval = 2.0;
    // A period of 40 s at least, so that the comparison says something (20 evaluations).
    wait_for("40 s of holdings", Duration::from_secs(60), || async {
        Ok(
            (k8s_openapi::jiff::Timestamp::now().as_second() >= started.as_second() + 40)
                .then_some(()),
        )
    })
    .await
    .unwrap();
    let to = k8s_openapi::jiff::Timestamp::now();
    let prom = prometheus
        .query(&format!(
            "sum(sum_over_time(namespace_class_state:address_controller_ipaddresses_held:max{{namespace=\"{}\",state=\"bound\"}}[1h] @ {})) * {interval}",
            ns.name,
            to.as_second()
        ))
        .await
        .unwrap();
    let prom: f64 = prom[0]["value"][1].as_str().unwrap().parse().unwrap();
    let out = Command::new(address_controller_tests::binary("address-controller"))
        .args([
            "usage",
            "--from",
            &started.to_string(),
            "--to",
            &to.to_string(),
        ])
        .args(["-n", &ns.name, "-o", "csv", "--kubeconfig"])
        .arg(&Cluster::get().kubeconfig)
        .output()
        .unwrap();
    let csv = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{csv}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exact: f64 = csv
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(5).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    // s1, s2, d1, d2 bound; s1 released.
    let transitions = 5.0;
    println!(
        "usage of {} over {}s: history {exact} address-seconds, recording rule {prom} (differ by {})",
        ns.name,
        to.as_second() - started.as_second(),
        (prom - exact).abs()
    );
    assert!(exact > 0.0, "{csv}");
    assert!(
        (prom - exact).abs() <= (transitions + 2.0) * interval * 2.0,
        "history {exact} vs recording rule {prom}\n{csv}"
    );
}

/// The thief gone, the address is Bound again; the Service is let go.
async fn the_conflict_clears(w: &Workload) {
    let (addresses, driver_class) = (w.addresses(), &w.driver_class);
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(w.client.clone(), &w.ns.name);
    // The thief gone, the address is Bound again; the Service is let go.
    services
        .delete("thief", &DeleteParams::default())
        .await
        .unwrap();
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("no Conflict left", Duration::from_secs(60), || async {
        let left = addresses
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|a| {
                a.spec.class_name == *driver_class
                    && a.phase() == Some(address_controller_api::AddressPhase::Conflict)
            });
        Ok((!left).then_some(()))
    })
    .await
    .unwrap();
}
