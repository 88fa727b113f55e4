//! The documentation against the files it quotes: the README's cold build figures are
//! the ones `deploy/local/build-times.sh` holds (and the scripts print); every repository
//! path and make target README.md and docs/ name exists.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

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

/// Top-level directories and files of this repository: a token in backticks or a link target
/// starting with one of them is a path the documents promise exists.
const ROOTS: [&str; 17] = [
    "api/",
    "runtime/",
    "serving/",
    "controller/",
    "apiserver/",
    "driver-kit/",
    "drivers/",
    "driver-conformance/",
    "address-controller/",
    "deploy/",
    "chart/",
    "packaging/",
    "tests/",
    "docs/",
    "openapi/",
    ".ci/",
    "Makefile",
];

/// The repository paths a Markdown text names: `code spans` and link targets that start at
/// a top-level directory, without placeholders (`<version>`, `*`, `…`, `{a,b}`) or a line
/// number; `#anchors` dropped.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut candidates: Vec<&str> = text.split('`').skip(1).step_by(2).collect();
    for part in text.split("](").skip(1) {
        if let Some(end) = part.find(')') {
            candidates.push(&part[..end]);
        }
    }
    for c in candidates {
        let c = c.trim().trim_start_matches("../").trim_start_matches("./");
        let c = c.split('#').next().unwrap_or_default();
        let c = c.split_whitespace().next().unwrap_or_default();
        if c.is_empty()
            || !ROOTS.iter().any(|r| c.starts_with(r))
            || c.contains(['<', '*', '…', '{', '$', '|'])
            || c.contains("::")
        {
            continue;
        }
        let c = c.trim_end_matches([',', '.', ';', ':']);
        // `file.rs:12` names a line of a file.
        let c = c.split(':').next().unwrap_or_default();
        out.push(c.to_string());
    }
    out
}

/// README.md (and the chart's, with `chart`) and every Markdown file of docs/.
fn documents(chart: bool) -> Vec<std::path::PathBuf> {
    let root = repo_root();
    let mut docs = vec![root.join("README.md")];
    if chart {
        docs.push(root.join("chart/address-controller/README.md"));
    }
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    docs
}

/// Fails naming every entry of `missing` (sorted, once each).
fn assert_none_missing(what: &str, mut missing: Vec<String>) {
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "{what}:\n{}", missing.join("\n"));
}

/// The maps cannot go stale: every repository path README.md and docs/ name exists (a path
/// under docs/ may also be relative to docs/).
#[test]
fn every_path_the_documents_name_exists() {
    let root = repo_root();
    let mut missing = Vec::new();
    for doc in documents(true) {
        let text = std::fs::read_to_string(&doc).unwrap();
        for path in named_paths(&text) {
            let here = doc.parent().unwrap().join(&path);
            if !root.join(&path).exists() && !here.exists() {
                missing.push(format!(
                    "{}: {path}",
                    doc.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert_none_missing("paths named that do not exist", missing);
}

/// The make targets a Markdown text names as commands: `make TARGET…` in a code span, or a
/// line of a code block that starts with `make TARGET`.
fn make_targets_named(text: &str) -> Vec<String> {
    let first = |rest: &str| -> String {
        rest.chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '-')
            .collect()
    };
    let mut out: Vec<String> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| span.strip_prefix("make ").map(first))
        .collect();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if in_block && let Some(rest) = line.trim_start().strip_prefix("make ") {
            out.push(first(rest));
        }
    }
    out.retain(|t| !t.is_empty());
    out
}

/// Every `make TARGET` the documents name is a target of the Makefile.
#[test]
fn every_make_target_the_documents_name_exists() {
    let root = repo_root();
    let makefile = std::fs::read_to_string(root.join("Makefile")).unwrap();
    let targets: Vec<&str> = makefile
        .lines()
        .filter_map(|l| l.split_once(':').map(|(t, _)| t))
        .collect();
    let mut missing = Vec::new();
    for doc in documents(false) {
        let text = std::fs::read_to_string(&doc).unwrap();
        for target in make_targets_named(&text) {
            if !targets.contains(&target.as_str()) {
                missing.push(format!(
                    "{}: make {target}",
                    doc.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert_none_missing("make targets named that do not exist", missing);
}
