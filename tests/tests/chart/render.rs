//! `helm template` over the values: what each set of values renders (no cluster).

use super::*;

fn app_version() -> String {
    let chart: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    chart["appVersion"].as_str().unwrap().to_string()
}

fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn lint_passes_for_every_values_set_of_the_matrix() {
    let chart = chart_dir();
    let matrix: &[(Value, &[&str])] = &[
        (json!({}), &[]),
        (
            json!({"metrics": {"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}}}),
            &["--api-versions", "monitoring.coreos.com/v1"],
        ),
        (json!({"metrics": {"enabled": false}}), &[]),
        (
            json!({"admissionPolicy": {"enabled": true, "allowedGroups": ["ip-admins"]}}),
            &[],
        ),
        (
            json!({"apiService": {"tls": {"mode": "certManager"}}}),
            &["--api-versions", "cert-manager.io/v1"],
        ),
        (
            json!({"apiService": {"tls": {"mode": "secret", "existingSecret": "my-tls", "caBundle": "Zm9v"}}}),
            &[],
        ),
    ];
    for (values, extra) in matrix {
        render(values, extra).unwrap_or_else(|e| panic!("helm template {values}: {e}"));
        if !extra.is_empty() {
            // helm lint cannot be told about extra API versions.
            continue;
        }
        let (_dir, file) = values_file(values);
        let out = run_helm(&[
            "lint",
            chart.to_str().unwrap(),
            "--strict",
            "--kube-version",
            "1.36.0",
            "-f",
            file.to_str().unwrap(),
        ])
        .unwrap_or_else(|e| panic!("helm lint {values}: {e}"));
        assert!(out.contains("0 chart(s) failed"), "{values}: {out}");
    }
}

/// The defaults render exactly the expected objects: a `helm test` hook that only reads, a
/// hardened and probed Deployment sized for the documented scale, an APIService that
/// trusts exactly the CA of the serving certificate, and the bindings it needs.
#[test]
fn defaults_render_a_hardened_deployment_and_a_matching_certificate() {
    // The chart moves with the workspace: one version everywhere.
    assert_eq!(app_version(), env!("CARGO_PKG_VERSION"));
    let objs = render(&json!({}), &[]).unwrap();
    let expected: BTreeSet<String> = [
        "APIService/v1alpha1.view.local.sdn.cozystack.io",
        "ClusterRole/address-controller",
        "ClusterRole/address-controller-aggregate-edit",
        "ClusterRole/address-controller-aggregate-view",
        "ClusterRole/address-controller-metrics-reader",
        // Not aggregated: for the platform team that sets quotas.
        "ClusterRole/address-controller-quota-manager",
        // Not aggregated: for the abuse desk and billing (who held which address when).
        "ClusterRole/address-controller-history-reader",
        "ClusterRoleBinding/address-controller",
        "ClusterRoleBinding/address-controller:system:auth-delegator",
        "ConfigMap/address-controller-dashboard",
        "Deployment/address-controller",
        "PodDisruptionBudget/address-controller",
        "RoleBinding/address-controller:extension-apiserver-authentication-reader",
        // Its Lease, in the release namespace only (generated with the ClusterRole).
        "Role/address-controller",
        "RoleBinding/address-controller",
        "Secret/address-controller-api-tls",
        "Service/address-controller-api",
        "Service/address-controller-metrics",
        "ServiceAccount/address-controller",
        // The entitlement policy (SPEC §13), on by default.
        "ValidatingAdmissionPolicy/address-controller-class-namespaces",
        "ValidatingAdmissionPolicyBinding/address-controller-class-namespaces",
        // Each component's own keys on a tenant's Service (#45), on by default.
        "ValidatingAdmissionPolicy/address-controller-component-writes",
        "ValidatingAdmissionPolicyBinding/address-controller-component-writes",
        // `helm test`: `check` in a Pod, as a read-only ServiceAccount of its own.
        "ServiceAccount/address-controller-test",
        "ClusterRole/address-controller-test-address-controller-system",
        "ClusterRoleBinding/address-controller-test-address-controller-system",
        "Pod/address-controller-test",
    ]
    .map(str::to_string)
    .into();
    assert_eq!(kind_names(&objs), expected);
    the_helm_test_hook_only_reads(&objs);
    the_deployment_is_hardened_probed_and_sized(&objs);
    the_apiservice_trusts_the_serving_certificates_ca(&objs);
    the_api_service_and_the_bindings(&objs);
}

/// `helm test`: `check` in a Pod, as a ServiceAccount that only reads; off with
/// helmTest.enabled=false.
fn the_helm_test_hook_only_reads(objs: &[Value]) {
    let test = find(objs, "Pod", "address-controller-test");
    assert_eq!(test["metadata"]["annotations"]["helm.sh/hook"], "test");
    assert_eq!(
        test["spec"]["containers"][0]["args"],
        json!(["check", "--skip=classes"])
    );
    assert_eq!(test["spec"]["restartPolicy"], "Never");
    let role = find(
        objs,
        "ClusterRole",
        "address-controller-test-address-controller-system",
    );
    for rule in role["rules"].as_array().unwrap() {
        for verb in rule["verbs"].as_array().unwrap() {
            assert!(
                verb == "get" || verb == "list",
                "the test role writes: {rule}"
            );
        }
    }
    assert!(
        !kind_names(&render(&json!({"helmTest": {"enabled": false}}), &[]).unwrap())
            .iter()
            .any(|k| k.contains("-test")),
        "helmTest.enabled=false still renders the hook"
    );
}

/// The Deployment: two replicas, the appVersion image, hardened, probed.
fn the_deployment_is_hardened_probed_and_sized(objs: &[Value]) {
    let deploy = find(objs, "Deployment", "address-controller");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "address-controller");
    // Replicas prefer different nodes, matched by the Deployment's own selector.
    let spread = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        spread["labelSelector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = container(objs);
    assert_eq!(
        c["image"],
        format!("ghcr.io/cozystack/address-controller:{}", app_version())
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let probe_port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "probes")
        .unwrap();
    assert_eq!(probe_port["containerPort"], 8081);
    assert!(args(objs).contains(&"--probe-address=0.0.0.0:8081".to_string()));
    assert!(args(objs).contains(&"--metrics-address=0.0.0.0:8443".to_string()));
    assert!(args(objs).contains(&"--leader-elect=true".to_string()));
    // Defaults that survive the documented scale: the limit above the 275 MiB measured at
    // 20,000 claims + 20,000 addresses; critical, as the aggregated API is in
    // kube-apiserver's path.
    assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(c["resources"]["requests"]["memory"], "128Mi");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    let envs: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        envs.contains(&"ADDRESS_CONTROLLER_POD_NAMESPACE")
            && envs.contains(&"ADDRESS_CONTROLLER_POD_NAME")
    );
    assert!(
        !envs.contains(&"ADDRESS_CONTROLLER_LOG_LEVEL"),
        "the binary's own log default applies"
    );
}

/// The certificate files the binary reads are the chart's Secret; the APIService trusts
/// exactly the CA that signed the serving certificate, whose names are the Service's.
fn the_apiservice_trusts_the_serving_certificates_ca(objs: &[Value]) {
    let c = container(objs);
    let deploy = find(objs, "Deployment", "address-controller");
    let pod = &deploy["spec"]["template"]["spec"];
    // The certificate files the binary reads are the chart's Secret.
    let mount = c["volumeMounts"][0]["mountPath"].as_str().unwrap();
    assert!(args(objs).contains(&format!("--tls-cert-file={mount}/tls.crt")));
    assert!(args(objs).contains(&format!("--tls-private-key-file={mount}/tls.key")));
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        "address-controller-api-tls"
    );

    // The APIService trusts exactly the CA that signed the serving certificate, whose names
    // are the Service's.
    let secret = find(objs, "Secret", "address-controller-api-tls");
    let api = find(objs, "APIService", APISERVICE);
    assert_eq!(api["spec"]["caBundle"], secret["data"]["ca.crt"]);
    assert!(api["spec"].get("insecureSkipTLSVerify").is_none());
    assert_eq!(
        api["spec"]["service"],
        json!({"name": "address-controller-api", "namespace": "address-controller-system", "port": 443})
    );
    let dir = tempdir();
    for key in ["ca.crt", "tls.crt"] {
        std::fs::write(
            dir.join(key),
            b64decode(secret["data"][key].as_str().unwrap()),
        )
        .unwrap();
    }
    let ca = dir.join("ca.crt");
    let crt = dir.join("tls.crt");
    let verified = openssl(&[
        "verify",
        "-CAfile",
        ca.to_str().unwrap(),
        crt.to_str().unwrap(),
    ]);
    assert!(verified.contains(": OK"), "{verified}");
    let sans = openssl(&[
        "x509",
        "-noout",
        "-ext",
        "subjectAltName",
        "-in",
        crt.to_str().unwrap(),
    ]);
    for name in [
        "DNS:address-controller-api.address-controller-system.svc",
        "DNS:address-controller-metrics.address-controller-system.svc",
    ] {
        assert!(sans.contains(name), "{name} missing from {sans}");
    }
}

/// The API Service selects the Deployment's pods; the bindings (the generated role, auth
/// delegation, the authentication ConfigMap reader); the metrics Service and reader role.
fn the_api_service_and_the_bindings(objs: &[Value]) {
    let deploy = find(objs, "Deployment", "address-controller");
    // The API Service selects the Deployment's pods.
    let svc = find(objs, "Service", "address-controller-api");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "selector {k}");
    }

    // Bindings: the generated role, auth delegation, the authentication ConfigMap reader.
    let sa = json!([{"kind": "ServiceAccount", "name": "address-controller", "namespace": "address-controller-system"}]);
    let crb = find(objs, "ClusterRoleBinding", "address-controller");
    assert_eq!(crb["roleRef"]["name"], "address-controller");
    assert_eq!(crb["subjects"], sa);
    let delegator = find(
        objs,
        "ClusterRoleBinding",
        "address-controller:system:auth-delegator",
    );
    assert_eq!(delegator["roleRef"]["name"], "system:auth-delegator");
    assert_eq!(delegator["subjects"], sa);
    let reader = find(
        objs,
        "RoleBinding",
        "address-controller:extension-apiserver-authentication-reader",
    );
    assert_eq!(reader["metadata"]["namespace"], "kube-system");
    assert_eq!(
        reader["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "extension-apiserver-authentication-reader"})
    );
    assert_eq!(reader["subjects"], sa);

    // Metrics: the Service and the reader role.
    let metrics = find(objs, "Service", "address-controller-metrics");
    assert_eq!(metrics["spec"]["ports"][0]["port"], 8443);
    let role = find(objs, "ClusterRole", "address-controller-metrics-reader");
    assert_eq!(
        role["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
}

#[test]
fn image_pinned_by_tag_and_digest_and_knobs_reach_the_pod() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let objs = render(
        &json!({"image": {"tag": "v9", "digest": digest}, "replicaCount": 3,
            "priorityClassName": "system-cluster-critical", "nodeSelector": {"role": "infra"},
            "tolerations": [{"key": "infra", "operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "In", "values": ["infra"]}]}]}}},
            "imagePullSecrets": [{"name": "ghcr"}],
            "controller": {"autoClaims": false, "kubeApi": {"qps": 12345678, "burst": 7}},
            "podDisruptionBudget": {"enabled": false}, "logLevel": "debug",
            "extraArgs": ["--concurrency=4"]}),
        &[],
    )
    .unwrap();
    // Both: the tag for a reader, the digest for the runtime (the platform's pin).
    assert_eq!(
        container(&objs)["image"],
        format!("ghcr.io/cozystack/address-controller:v9@{digest}")
    );
    // The digest alone: repository@digest.
    let by_digest = render(&json!({"image": {"digest": digest}}), &[]).unwrap();
    assert_eq!(
        container(&by_digest)["image"],
        format!("ghcr.io/cozystack/address-controller@{digest}")
    );
    let deploy = find(&objs, "Deployment", "address-controller");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["nodeSelector"], json!({"role": "infra"}));
    assert_eq!(pod["tolerations"][0]["key"], "infra");
    // An explicit affinity replaces the default spreading.
    assert_eq!(
        pod["affinity"],
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "In", "values": ["infra"]}]}]}}})
    );
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "ghcr"}]));
    assert!(args(&objs).contains(&"--auto-claims=false".to_string()));
    assert_eq!(args(&objs).last().unwrap(), "--concurrency=4");
    // Helm prints a large number from a values file as 1.2345678e+07: the flag's parser
    // (Rust's f32) must read it back.
    let qps = args(&objs)
        .iter()
        .find_map(|a| a.strip_prefix("--kube-api-qps=").map(str::to_owned))
        .unwrap();
    assert_eq!(qps.parse::<f32>(), Ok(12_345_678.0), "{qps}");
    assert!(args(&objs).contains(&"--kube-api-burst=7".to_string()));
    assert!(!has(&objs, "PodDisruptionBudget"));
    let rust_log = container(&objs)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "ADDRESS_CONTROLLER_LOG_LEVEL")
        .unwrap();
    assert_eq!(rust_log["value"], "debug");

    // Host networking, with ports that do not collide with the node's own.
    let host = render(
        &json!({"hostNetwork": true, "containerPorts": {"apiserver": 10443, "metrics": 10444, "probes": 10081}}),
        &[],
    )
    .unwrap();
    let pod = &find(&host, "Deployment", "address-controller")["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    for arg in [
        "--apiserver-address=0.0.0.0:10443",
        "--metrics-address=0.0.0.0:10444",
        "--probe-address=0.0.0.0:10081",
    ] {
        assert!(args(&host).contains(&arg.to_string()), "{arg}");
    }
    let ports: Vec<(String, i64)> = container(&host)["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [("https", 10443), ("metrics", 10444), ("probes", 10081)].map(|(n, p)| (n.to_string(), p))
    );
    // The Services follow by port name.
    assert_eq!(
        find(&host, "Service", "address-controller-api")["spec"]["ports"][0]["targetPort"],
        "https"
    );

    let tagged = render(&json!({"image": {"tag": "v9"}}), &[]).unwrap();
    assert_eq!(
        container(&tagged)["image"],
        "ghcr.io/cozystack/address-controller:v9"
    );
}

/// Whether a label selector (`matchLabels` map) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

#[test]
fn the_range_driver_is_opt_in_with_its_generated_role_and_its_own_pods() {
    let off = render(&json!({}), &[]).unwrap();
    assert!(
        kind_names(&off).iter().all(|n| !n.contains("range-driver")),
        "{:?}",
        kind_names(&off)
    );

    let objs = render(
        &json!({"rangeDriver": {"enabled": true}, "nodeSelector": {"role": "infra"},
            "logLevel": "debug", "hostNetwork": true}),
        &[],
    )
    .unwrap();
    let name = "address-controller-range-driver";
    // The generated file: the ClusterRole, then the Role of the release namespace.
    let file = std::fs::read_to_string(chart_dir().join("files/range-driver-role.yaml")).unwrap();
    let docs: Vec<Value> = file
        .split("\n---\n")
        .map(|d| serde_yaml::from_str(d).unwrap())
        .collect();
    assert_eq!(find(&objs, "ClusterRole", name)["rules"], docs[0]["rules"]);
    assert_eq!(find(&objs, "Role", name)["rules"], docs[1]["rules"]);
    assert_eq!(
        find(&objs, "RoleBinding", name)["roleRef"]["name"],
        name,
        "the Role is bound"
    );
    let crb = find(&objs, "ClusterRoleBinding", name);
    assert_eq!(crb["roleRef"]["name"], name);
    assert_eq!(
        crb["subjects"],
        json!([{"kind": "ServiceAccount", "name": name, "namespace": "address-controller-system"}])
    );
    let driver = find(&objs, "Deployment", name);
    let pod = &driver["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], name);
    let c = &pod["containers"][0];
    assert_eq!(c["command"], json!(["/usr/local/bin/range-driver"]));
    assert_eq!(c["image"], container(&objs)["image"]);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    // Both pods share placement, pod security and environment.
    let controller = &find(&objs, "Deployment", "address-controller")["spec"]["template"]["spec"];
    for key in ["nodeSelector", "securityContext"] {
        assert_eq!(pod[key], controller[key], "{key}");
    }
    assert_eq!(c["env"], controller["containers"][0]["env"]);
    // Only the aggregated server needs the host's network; the driver only calls out.
    assert_eq!(controller["hostNetwork"], true);
    assert!(pod.get("hostNetwork").is_none());
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "ADDRESS_CONTROLLER_LOG_LEVEL")
    );

    // The controller's Services, PDB and Deployment select the controller's pods and never
    // the driver's (which have no API server behind 6443).
    let controller_pod =
        &find(&objs, "Deployment", "address-controller")["spec"]["template"]["metadata"]["labels"];
    let driver_pod = &driver["spec"]["template"]["metadata"]["labels"];
    let selectors = [
        &find(&objs, "Service", "address-controller-api")["spec"]["selector"],
        &find(&objs, "Service", "address-controller-metrics")["spec"]["selector"],
        &find(&objs, "PodDisruptionBudget", "address-controller")["spec"]["selector"]["matchLabels"],
        &find(&objs, "Deployment", "address-controller")["spec"]["selector"]["matchLabels"],
    ];
    for sel in selectors {
        assert!(selects(sel, controller_pod), "{sel} misses the controller");
        assert!(!selects(sel, driver_pod), "{sel} selects the driver");
    }
    assert!(selects(
        &driver["spec"]["selector"]["matchLabels"],
        driver_pod
    ));
    assert!(!selects(
        &driver["spec"]["selector"]["matchLabels"],
        controller_pod
    ));
}

/// The monitoring objects render only where monitoring.coreos.com is served, follow their
/// values (labels, alerts one by one, thresholds, the scrape's authorization, relabelings,
/// TLS), and go with metrics off.
#[test]
fn monitoring_objects_follow_values_and_capabilities() {
    let on = json!({"metrics": {
        "serviceMonitor": {"enabled": true, "labels": {"release": "prom"}},
        "prometheusRule": {"enabled": true, "labels": {"team": "net"}, "alertLabels": {"route": "netops"},
            "conflictOrLost": {"for": "10m", "severity": "page"}}}});
    // Without monitoring.coreos.com/v1 nothing is rendered (the install would fail).
    let absent = render(&on, &[]).unwrap();
    assert!(!has(&absent, "ServiceMonitor") && !has(&absent, "PrometheusRule"));

    let objs = render(&on, &["--api-versions", "monitoring.coreos.com/v1"]).unwrap();
    the_scrape_and_the_alerts_by_default(&objs);
    the_alerts_and_the_scrape_as_tuned();
    // Metrics off: no Service, no role, no scrape config, the binary's endpoint disabled.
    let mut off = on.clone();
    off["metrics"]["enabled"] = json!(false);
    let objs = render(&off, &["--api-versions", "monitoring.coreos.com/v1"]).unwrap();
    assert!(!has(&objs, "ServiceMonitor") && !has(&objs, "PrometheusRule"));
    assert!(!kind_names(&objs).contains("Service/address-controller-metrics"));
    assert!(!kind_names(&objs).contains("ClusterRole/address-controller-metrics-reader"));
    assert!(args(&objs).contains(&"--metrics-address=".to_string()));
}

/// The ServiceMonitor selects the metrics Service only, over TLS with the chart's CA and a
/// chart-made token bound to the reader role; every alert with its labels, duration and
/// runbook.
fn the_scrape_and_the_alerts_by_default(objs: &[Value]) {
    let sm = find(objs, "ServiceMonitor", "address-controller");
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"], "metrics");
    assert_eq!(ep["scheme"], "https");
    assert_eq!(
        ep["tlsConfig"]["serverName"],
        "address-controller-metrics.address-controller-system.svc"
    );
    assert_eq!(
        ep["tlsConfig"]["ca"]["secret"],
        json!({"name": "address-controller-api-tls", "key": "ca.crt"})
    );
    // The ServiceMonitor selects the metrics Service, and only it.
    let metrics = find(objs, "Service", "address-controller-metrics");
    let api = find(objs, "Service", "address-controller-api");
    let sm_selector = &sm["spec"]["selector"]["matchLabels"];
    assert!(selects(sm_selector, &metrics["metadata"]["labels"]));
    assert!(!selects(sm_selector, &api["metadata"]["labels"]));

    let rule = find(objs, "PrometheusRule", "address-controller");
    assert_eq!(rule["metadata"]["labels"]["team"], "net");
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    let alert = |name: &str| rules.iter().find(|r| r["alert"] == name).unwrap();
    let lost = alert("IPAddressConflictOrLost");
    assert_eq!(lost["for"], "10m");
    assert_eq!(
        lost["labels"],
        json!({"severity": "page", "route": "netops"})
    );
    assert!(
        lost["expr"]
            .as_str()
            .unwrap()
            .contains("address_controller_ipaddresses{phase=~\"Conflict|Lost\"}")
    );
    let pending = alert("IPAddressClaimPending");
    assert_eq!(pending["for"], "15m");
    assert_eq!(
        pending["labels"],
        json!({"severity": "warning", "route": "netops"})
    );
    assert!(
        pending["expr"]
            .as_str()
            .unwrap()
            .contains("address_controller_ipaddressclaims{phase=\"Pending\"}")
    );
    // Prometheus' own template syntax survives Helm's.
    assert!(
        lost["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("{{ $labels.class }}")
    );

    // Every alert links its runbook; the default scraper is a chart-made token bound to the
    // reader role (no deprecated bearerTokenFile).
    for r in rules {
        let url = r["annotations"]["runbook_url"].as_str().unwrap();
        assert!(
            url.ends_with(&format!(
                "/docs/runbooks/{}.md",
                r["alert"]
                    .as_str()
                    .unwrap()
                    .trim_end_matches(char::is_numeric)
            )) || url.ends_with("/docs/runbooks/IPAddressPoolUsage.md"),
            "{url}"
        );
        assert!(r["annotations"].get("runbook").is_none());
    }
    assert_eq!(
        ep["authorization"],
        json!({"type": "Bearer", "credentials": {"name": "address-controller-metrics-scraper-token", "key": "token"}})
    );
    assert!(ep.get("bearerTokenFile").is_none());
    let token = find(objs, "Secret", "address-controller-metrics-scraper-token");
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    let scraper = find(
        objs,
        "ClusterRoleBinding",
        "address-controller-metrics-scraper",
    );
    assert_eq!(
        scraper["roleRef"]["name"],
        "address-controller-metrics-reader"
    );
    // Pool usage: one alert per threshold, with its severity.
    for (name, severity) in [
        ("IPAddressPoolUsage75Percent", "info"),
        ("IPAddressPoolUsage85Percent", "warning"),
        ("IPAddressPoolUsage95Percent", "critical"),
    ] {
        assert_eq!(alert(name)["labels"]["severity"], severity, "{name}");
    }
}

/// Alerts one by one: off, or with their own severity and duration; thresholds of their
/// own; the legacy token mode binds the named Prometheus account; relabelings, a tlsConfig
/// of one's own, and the caBundle's CA as a ConfigMap.
fn the_alerts_and_the_scrape_as_tuned() {
    let tuned = json!({"apiService": {"tls": {"mode": "secret", "existingSecret": "mine",
            "caBundle": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K"}},
        "metrics": {
        "serviceMonitor": {"enabled": true, "authorization": "bearerTokenFile",
            "prometheusServiceAccount": {"name": "prometheus-k8s", "namespace": "monitoring"},
            "relabelings": [{"action": "replace", "targetLabel": "team", "replacement": "net"}],
            "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "process_.*"}]},
        "prometheusRule": {"enabled": true,
            "conflictOrLost": {"enabled": false},
            "severalLeaders": {"for": "7m", "severity": "page"},
            "poolUsage": {"thresholds": [{"percent": 90, "severity": "warning"}]},
            "bindLatencySLO": {"enabled": false},
            "job": "ipam"}}});
    let objs = render(&tuned, &["--api-versions", "monitoring.coreos.com/v1"]).unwrap();
    let rules = find(&objs, "PrometheusRule", "address-controller")["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .clone();
    let names: Vec<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    assert!(!names.contains(&"IPAddressConflictOrLost"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("BindLatency")),
        "{names:?}"
    );
    assert!(names.contains(&"IPAddressPoolUsage90Percent"), "{names:?}");
    assert!(!names.contains(&"IPAddressPoolUsage75Percent"), "{names:?}");
    let several = rules
        .iter()
        .find(|r| r["alert"] == "AddressControllerSeveralLeaders")
        .unwrap();
    assert_eq!(
        (
            several["for"].as_str(),
            several["labels"]["severity"].as_str()
        ),
        (Some("7m"), Some("page"))
    );
    let down = rules
        .iter()
        .find(|r| r["alert"] == "AddressControllerDown")
        .unwrap();
    assert!(
        down["expr"].as_str().unwrap().contains("job=\"ipam\""),
        "{down}"
    );
    let ep = &find(&objs, "ServiceMonitor", "address-controller")["spec"]["endpoints"][0];
    assert_eq!(
        ep["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    assert!(ep.get("authorization").is_none());
    assert_eq!(ep["relabelings"][0]["targetLabel"], "team");
    assert_eq!(ep["metricRelabelings"][0]["action"], "drop");
    assert_eq!(
        ep["tlsConfig"]["ca"]["configMap"],
        json!({"name": "address-controller-metrics-ca", "key": "ca.crt"})
    );
    let ca = find(&objs, "ConfigMap", "address-controller-metrics-ca");
    assert!(
        ca["data"]["ca.crt"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    let prom = find(
        &objs,
        "ClusterRoleBinding",
        "address-controller-metrics-prometheus",
    );
    assert_eq!(
        prom["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"})
    );
    assert!(!kind_names(&objs).contains("Secret/address-controller-metrics-scraper-token"));
    let own = json!({"metrics": {"serviceMonitor": {"enabled": true,
        "tlsConfig": {"insecureSkipVerify": false, "serverName": "metrics.example"}}}});
    let objs = render(&own, &["--api-versions", "monitoring.coreos.com/v1"]).unwrap();
    assert_eq!(
        find(&objs, "ServiceMonitor", "address-controller")["spec"]["endpoints"][0]["tlsConfig"],
        json!({"insecureSkipVerify": false, "serverName": "metrics.example"})
    );
}

#[test]
fn admission_policy_renders_only_when_enabled() {
    // By default the entitlement and the component policies; the pinning policies are
    // opt-in (the MetalLB fence comes with the MetalLB driver).
    let objs = render(&json!({}), &[]).unwrap();
    let policies: BTreeSet<String> = kind_names(&objs)
        .into_iter()
        .filter(|k| k.starts_with("ValidatingAdmissionPolicy/"))
        .collect();
    assert_eq!(
        policies,
        BTreeSet::from([
            "ValidatingAdmissionPolicy/address-controller-class-namespaces".to_string(),
            "ValidatingAdmissionPolicy/address-controller-component-writes".to_string(),
        ])
    );
    let objs = render(
        &json!({"entitlementPolicy": {"enabled": false}, "componentPolicy": {"enabled": false}}),
        &[],
    )
    .unwrap();
    assert!(!has(&objs, "ValidatingAdmissionPolicy"));
    let objs = render(&json!({"metallbDriver": {"enabled": true}}), &[]).unwrap();
    assert!(
        kind_names(&objs).contains("ValidatingAdmissionPolicy/address-controller-metallb-pins"),
        "the MetalLB fence is on with the MetalLB driver"
    );
    let objs = render(
        &json!({"admissionPolicy": {"enabled": true, "allowedUsernames": ["ip-admin"],
            "allowedGroups": ["ip-admins"], "validationActions": ["Warn", "Audit"],
            "namespaceSelector": {"matchLabels": {"tenant": "true"}}}}),
        &[],
    )
    .unwrap();
    let policy = find(
        &objs,
        "ValidatingAdmissionPolicy",
        "address-controller-reserve-address-name",
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let allowed = policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "allowed")
        .unwrap()["expression"]
        .as_str()
        .unwrap();
    assert!(
        allowed.contains(r#"["ip-admin"]"#) && allowed.contains(r#"["ip-admins"]"#),
        "{allowed}"
    );
    // Moving addresses is reserved to the same allowlist; the chart's own controller's
    // ServiceAccount passes.
    let moves = find(
        &objs,
        "ValidatingAdmissionPolicy",
        "address-controller-reserve-address-moves",
    );
    let vars = moves["spec"]["variables"].to_string();
    assert!(vars.contains(r#"[\"ip-admins\"]"#), "{vars}");
    assert!(vars.contains("system:serviceaccount:"), "{vars}");
    let binding = find(
        &objs,
        "ValidatingAdmissionPolicyBinding",
        "address-controller-reserve-address-name",
    );
    assert_eq!(
        binding["spec"]["validationActions"],
        json!(["Warn", "Audit"])
    );
    assert_eq!(
        binding["spec"]["matchResources"]["namespaceSelector"],
        json!({"matchLabels": {"tenant": "true"}})
    );
}

/// The Cilium driver: off by default; on, its Deployment, ClusterRole and both fences; its
/// provisioner set for the move from MetalLB, never beside the MetalLB driver.
#[test]
fn the_cilium_driver_renders_with_its_fence_and_answers_a_named_provisioner() {
    let off = render(&json!({}), &[]).unwrap();
    assert!(!kind_names(&off).iter().any(|k| k.contains("cilium")));
    let on = render(&json!({"ciliumDriver": {"enabled": true}}), &[]).unwrap();
    let names = kind_names(&on);
    for want in [
        "Deployment/address-controller-cilium-driver",
        "ClusterRole/address-controller-cilium-driver",
        "ValidatingAdmissionPolicy/address-controller-cilium-pins",
        "ValidatingAdmissionPolicy/address-controller-cilium-pools",
    ] {
        assert!(names.contains(want), "{want} missing: {names:?}");
    }
    let args = |objs: &[Value]| {
        find(objs, "Deployment", "address-controller-cilium-driver")["spec"]["template"]["spec"]
            ["containers"][0]["args"]
            .to_string()
    };
    assert!(!args(&on).contains("--provisioner"), "{}", args(&on));
    let moved = render(
        &json!({"ciliumDriver": {"enabled": true,
            "provisioner": "metallb.drivers.local.sdn.cozystack.io"}}),
        &[],
    )
    .unwrap();
    assert!(
        args(&moved).contains("--provisioner=metallb.drivers.local.sdn.cozystack.io"),
        "{}",
        args(&moved)
    );
    let both = render(
        &json!({"metallbDriver": {"enabled": true}, "ciliumDriver": {"enabled": true,
            "provisioner": "metallb.drivers.local.sdn.cozystack.io"}}),
        &[],
    )
    .unwrap_err();
    assert!(both.contains("disable metallbDriver first"), "{both}");
}

/// The protection policy: off by default (#56: it makes kube-apiserver refuse creates for a
/// second after each start); enabled, rendered where the cluster serves
/// MutatingAdmissionPolicy (helm asks the cluster; `helm template` is told), never where not.
#[test]
fn protection_policy_renders_where_mutating_admission_policies_are_served() {
    let served = [
        "--api-versions",
        "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
    ];
    assert!(!has(
        &render(&json!({}), &served).unwrap(),
        "MutatingAdmissionPolicy"
    ));
    let on = json!({"protectionPolicy": {"enabled": true}});
    let objs = render(&on, &served).unwrap();
    let policy = find(
        &objs,
        "MutatingAdmissionPolicy",
        "address-controller-protection",
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
        json!(["CREATE"])
    );
    let binding = find(
        &objs,
        "MutatingAdmissionPolicyBinding",
        "address-controller-protection",
    );
    assert_eq!(
        binding["spec"]["policyName"],
        "address-controller-protection"
    );
    assert!(!has(&render(&on, &[]).unwrap(), "MutatingAdmissionPolicy"));
}

#[test]
fn tls_modes_cert_manager_and_existing_secret() {
    // cert-manager: refused with a clear message where it is not installed.
    let cm = json!({"apiService": {"tls": {"mode": "certManager"}}});
    let err = render(&cm, &[]).unwrap_err();
    assert!(err.contains("cert-manager.io/v1 is not served"), "{err}");

    let objs = render(&cm, &["--api-versions", "cert-manager.io/v1"]).unwrap();
    assert!(!kind_names(&objs).contains("Secret/address-controller-api-tls"));
    let cert = find(&objs, "Certificate", "address-controller-api");
    assert_eq!(cert["spec"]["secretName"], "address-controller-api-tls");
    assert!(
        cert["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!(
                "address-controller-api.address-controller-system.svc"
            ))
    );
    assert_eq!(cert["spec"]["issuerRef"]["name"], "address-controller-ca");
    find(&objs, "Issuer", "address-controller-ca");
    find(&objs, "Issuer", "address-controller-selfsigned");
    let api = find(&objs, "APIService", APISERVICE);
    assert_eq!(
        api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "address-controller-system/address-controller-api"
    );
    assert!(api["spec"].get("caBundle").is_none());

    let own_issuer = json!({"apiService": {"tls": {"mode": "certManager",
        "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}}});
    let objs = render(&own_issuer, &["--api-versions", "cert-manager.io/v1"]).unwrap();
    assert!(!has(&objs, "Issuer"));
    assert_eq!(
        find(&objs, "Certificate", "address-controller-api")["spec"]["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );

    // An existing Secret: nothing generated, the pod mounts it, the APIService trusts the
    // given CA.
    let objs = render(
        &json!({"apiService": {"tls": {"mode": "secret", "existingSecret": "corp-tls", "caBundle": "Q0E="}}}),
        &[],
    )
    .unwrap();
    assert!(!has(&objs, "Secret"));
    assert_eq!(
        find(&objs, "Deployment", "address-controller")["spec"]["template"]["spec"]["volumes"][0]["secret"]
            ["secretName"],
        "corp-tls"
    );
    assert_eq!(
        find(&objs, "APIService", APISERVICE)["spec"]["caBundle"],
        "Q0E="
    );
    let err = render(
        &json!({"apiService": {"tls": {"mode": "secret", "existingSecret": "corp-tls"}}}),
        &[],
    )
    .unwrap_err();
    assert!(err.contains("set apiService.tls.caBundle"), "{err}");
    let err = render(&json!({"apiService": {"tls": {"mode": "secret"}}}), &[]).unwrap_err();
    assert!(
        err.contains("apiService.tls.existingSecret is required"),
        "{err}"
    );
}

#[test]
fn the_image_and_the_chart_agree() {
    let dockerfile = std::fs::read_to_string(repo_root().join("deploy/image/Dockerfile")).unwrap();
    let line = |prefix: &str| {
        dockerfile
            .lines()
            .rfind(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in the Dockerfile"))
            .trim_start_matches(prefix)
            .trim()
            .to_string()
    };
    let objs = render(&json!({}), &[]).unwrap();
    let pod = &find(&objs, "Deployment", "address-controller")["spec"]["template"]["spec"];
    // The image's user is the one the pod runs as.
    let user = format!(
        "{}:{}",
        pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    );
    assert_eq!(line("USER "), user);
    // The pod's args are the subcommand of the image's entrypoint.
    assert_eq!(
        line("ENTRYPOINT "),
        r#"["/usr/local/bin/address-controller"]"#
    );
    assert_eq!(args(&objs)[0], "run");
    // The range driver's command is where the image puts it.
    assert!(
        dockerfile
            .lines()
            .any(|l| l.starts_with("COPY ") && l.ends_with(" /usr/local/bin/range-driver")),
        "the image has no /usr/local/bin/range-driver"
    );
    // And the MetalLB driver's.
    let mlb = render(&json!({"metallbDriver": {"enabled": true}}), &[]).unwrap();
    let c = &find(&mlb, "Deployment", "address-controller-metallb-driver")["spec"]["template"]["spec"]
        ["containers"][0];
    assert_eq!(c["command"], json!(["/usr/local/bin/metallb-driver"]));
    assert!(
        dockerfile
            .lines()
            .any(|l| l.starts_with("COPY ") && l.ends_with(" /usr/local/bin/metallb-driver")),
        "the image has no /usr/local/bin/metallb-driver"
    );
    // The image is built with the pinned toolchain (rust-toolchain.toml `channel = "1.95.0"`).
    let toolchain = std::fs::read_to_string(repo_root().join("rust-toolchain.toml")).unwrap();
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|rest| rest.split('"').nth(1))
        .unwrap();
    let minor = channel.rsplit_once('.').map_or(channel, |(m, _)| m);
    assert!(
        line("FROM rust:").starts_with(&format!("{minor}-")),
        "the Dockerfile builds with rust:{}, rust-toolchain.toml pins {channel}",
        line("FROM rust:")
    );
}

#[test]
fn three_replicas_spread_and_keep_a_disruption_budget_as_documented() {
    let spread = json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "controller"}}}]);
    let objs = render(
        &json!({"replicaCount": 3, "topologySpreadConstraints": spread}),
        &[],
    )
    .unwrap();
    let deploy = find(&objs, "Deployment", "address-controller");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["topologySpreadConstraints"], spread);
    // The soft anti-affinity stays next to the spread, matched by the pods' own labels.
    let term = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in term["labelSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "{k}");
    }
    // One replica at a time may be taken down, whatever the count; the PDB selects the
    // controller's pods only.
    let pdb = find(&objs, "PodDisruptionBudget", "address-controller");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    for (k, v) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "{k}");
    }
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        "controller"
    );
}
