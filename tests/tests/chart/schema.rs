//! The values schema: bad values refused naming the field, every property documented, every valid form of a value accepted by the binaries.

use super::*;

#[test]
fn schema_refuses_bad_values_naming_the_field() {
    let cases = [
        (json!({"replicaCount": 0}), "/replicaCount"),
        (json!({"replicaCount": "two"}), "/replicaCount"),
        (json!({"replicas": 2}), "replicas"),
        (
            json!({"apiService": {"tls": {"mode": "selfSigned"}}}),
            "/apiService/tls/mode",
        ),
        (
            json!({"admissionPolicy": {"validationActions": ["Deny", "Warn"]}}),
            "/admissionPolicy/validationActions",
        ),
        (
            json!({"admissionPolicy": {"validationActions": ["Block"]}}),
            "/admissionPolicy/validationActions",
        ),
        (
            json!({"admissionPolicy": {"validationActions": []}}),
            "/admissionPolicy/validationActions",
        ),
        (json!({"logFormat": "xml"}), "/logFormat"),
        (json!({"image": {"digest": "latest"}}), "/image/digest"),
        (
            json!({"controller": {"leaderElection": {"leaseDuration": "15"}}}),
            "/controller/leaderElection/leaseDuration",
        ),
        (json!({"metrics": {"enabled": "yes"}}), "/metrics/enabled"),
        (
            json!({"apiService": {"service": {"port": 70000}}}),
            "/apiService/service/port",
        ),
    ];
    for (values, field) in cases {
        let err = render(&values, &[])
            .err()
            .unwrap_or_else(|| panic!("{values} was accepted"));
        assert!(err.contains("schema"), "{values}: {err}");
        assert!(
            err.contains(field),
            "{values}: error does not name {field}: {err}"
        );
    }
}

#[test]
fn every_schema_property_has_a_documented_default_and_vice_versa() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
            .unwrap();
    // Walks the schema's declared properties alongside values.yaml.
    fn walk(schema: &Value, values: &Value, path: &str, missing: &mut Vec<String>) {
        let Some(props) = schema["properties"].as_object() else {
            return;
        };
        for (key, sub) in props {
            let here = format!("{path}.{key}");
            match values.get(key) {
                None => missing.push(format!("{here}: in the schema, not in values.yaml")),
                Some(v) => walk(sub, v, &here, missing),
            }
        }
        if let Some(obj) = values.as_object() {
            for key in obj.keys().filter(|k| !props.contains_key(*k)) {
                missing.push(format!("{path}.{key}: in values.yaml, not in the schema"));
            }
        }
    }
    let mut missing = Vec::new();
    walk(&schema, &values, "", &mut missing);
    // issuerRef is an empty object by default: its fields are optional.
    missing.retain(|m| !m.starts_with(".apiService.tls.certManager.issuerRef."));
    assert!(missing.is_empty(), "{missing:#?}");
    assert_eq!(schema["additionalProperties"], false);
}

/// Schema-valid values in every form the schema allows start the binaries: the rendered
/// arguments and environment parse (the binaries then stop at the missing kubeconfig —
/// past argument parsing, which exits 2 with clap's `error:`).
#[test]
fn every_schema_valid_value_form_starts_the_binaries() {
    let forms = [
        json!({}),
        json!({"controller": {"leaderElection": {"leaseDuration": "1m30s", "renewDeadline": "45.5s", "retryPeriod": "500ms"},
            "kubeApi": {"qps": 0, "burst": 1}, "concurrency": 1, "autoClaims": false},
            "logLevel": "debug", "logFormat": "plain"}),
        json!({"controller": {"leaderElection": {"leaseDuration": "1h", "renewDeadline": "30m", "retryPeriod": "1500000us"},
            "kubeApi": {"qps": 0.5, "burst": 400}, "concurrency": 1024},
            "logLevel": "info,address_controller_controller=trace"}),
        json!({"controller": {"kubeApi": {"qps": 12345678}}, "metrics": {"enabled": false},
            "containerPorts": {"apiserver": 10443, "metrics": 10444, "probes": 10081}}),
        json!({"rangeDriver": {"enabled": true, "probePort": 9099},
            "metallbDriver": {"enabled": true, "lbClass": "metallb.example/lb", "metallbNamespace": "lb-system"}}),
        // The platform's driver package: the driver alone.
        json!({"core": {"enabled": false}, "metallbDriver": {"enabled": true, "metallbNamespace": "cozy-metallb",
            "admissionPolicy": {"namespacePrefixes": ["tenant-"]}}}),
    ];
    let kubeconfig = tempdir();
    let missing = kubeconfig.join("absent.kubeconfig");
    let parses = |bin: &str, args: &[String], env: &[(String, String)]| {
        let out = Command::new(address_controller_tests::binary(bin))
            .args(args)
            .arg("--kubeconfig")
            .arg(&missing)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            out.status.code() != Some(2) && !err.contains("error: "),
            err,
        )
    };
    // The control: a value the binary refuses is seen as such.
    let bad = render(&json!({"extraArgs": ["--concurrency=zero"]}), &[]).unwrap();
    let (bin, args, env) = containers(&bad).remove(0);
    assert!(!parses(&bin, &args, &env).0, "a bad flag went unnoticed");
    for values in forms {
        let objs = render(&values, &[]).unwrap_or_else(|e| panic!("{values}: {e}"));
        for (bin, args, env) in containers(&objs) {
            let (ok, err) = parses(&bin, &args, &env);
            assert!(ok, "{bin} {args:?} with {values}: {err}");
            assert!(
                err.contains("kubeconfig") || err.contains("absent.kubeconfig"),
                "{bin} {args:?}: stopped before reading the kubeconfig? {err}"
            );
        }
    }
}
