//! The documentation against the files it quotes: the README's cold build figures are
//! the ones `deploy/local/build-times.sh` holds (and the scripts print).

use std::collections::BTreeMap;

use address_controller_tests::repo_root;

fn build_times() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo_root().join("deploy/local/build-times.sh"))
        .expect("deploy/local/build-times.sh");
    text.lines()
        .filter_map(|l| {
            let (k, rest) = l.split_once('=')?;
            let v = rest.split_whitespace().next()?;
            k.starts_with("COLD_")
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

#[test]
fn readme_build_figures_are_the_measured_ones() {
    let t = build_times();
    assert!(t.len() >= 6, "{t:?}");
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let row = |start: &str| {
        readme
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("README row {start:?} missing"))
            .to_string()
    };
    let binaries = row("| control-plane binaries");
    for want in [
        format!("~{} min |", t["COLD_GO_BINARIES_MIN"]),
        format!("Prometheus ~{} min of it", t["COLD_PROMETHEUS_MIN"]),
    ] {
        assert!(binaries.contains(&want), "{want:?} not in {binaries:?}");
    }
    let test = row("| `make test`");
    for want in [
        format!(
            "add ~{} min on a machine without the Go binaries",
            t["COLD_GO_BINARIES_MIN"]
        ),
        format!(
            "≤ {} min more for kubelet and kube-scheduler",
            t["COLD_NODE_MIN"]
        ),
        format!(
            "~{} min for kube-proxy and MetalLB's speaker",
            t["COLD_WIRE_MIN"]
        ),
    ] {
        assert!(test.contains(&want), "{want:?} not in {test:?}");
    }
    // The scripts print the figures from the file, not numbers of their own.
    for script in [
        "deploy/local/demo.sh",
        "deploy/local/test.sh",
        "deploy/local/build-binaries.sh",
    ] {
        let text = std::fs::read_to_string(repo_root().join(script)).unwrap();
        assert!(
            text.contains(". \"$here/build-times.sh\""),
            "{script} does not read build-times.sh"
        );
        for line in text
            .lines()
            .filter(|l| l.contains("cold") && l.contains(" min"))
        {
            assert!(
                line.contains("$COLD_"),
                "{script}: a figure of its own: {line}"
            );
        }
    }
}
