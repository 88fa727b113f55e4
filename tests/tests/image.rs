//! The container image (`make image`, deploy/image/): built without a container engine, the
//! same digest twice from one commit, minimal (no shell, only the C library, libgcc, CA
//! certificates and the binaries), labelled, with an SBOM — and running the real thing:
//! the controller and the range driver started from the unpacked root as the chart's
//! Deployments describe them (their args, env, user, read-only root and volumes), against
//! the local control plane behind the chart's APIService.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use address_controller_api::{ClaimPhase, IPAddressClaim};
use address_controller_tests::chart::{INSTALL, Release, render};
use address_controller_tests::env::{
    apiservice_available, assert_holdings_bound, lease_holder_in, phase, tempdir,
    wait_lease_holder_in,
};
use address_controller_tests::image::{
    Built, Container, Running, Unpacked, app_version, build, container_argv, container_pid,
    proc_status, proc_strings, unpack, walk,
};
use address_controller_tests::invariants::{Scope, assert_invariants};
use address_controller_tests::{
    Cleanup, TestNamespace, free_port, random_suffix, repo_root, setup, wait_for,
};
use kube::api::Api;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// The image of this checkout, built once per test process into target/image-test (the
/// release build is shared with `make image`; this assembles it again on its own).
fn image() -> &'static Built {
    static IMAGE: OnceLock<Built> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = repo_root().join("target/image-test");
        let _ = std::fs::remove_dir_all(&dir);
        let built = build(&dir, &[]).unwrap();
        println!("{}", built.output);
        built
    })
}

fn git(args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Programs that would give a shell in the container.
fn shells(root: &Path) -> Vec<String> {
    const SHELLS: &[&str] = &[
        "sh", "bash", "dash", "ash", "zsh", "ksh", "busybox", "toybox",
    ];
    walk(root)
        .into_iter()
        .filter(|(p, _)| {
            let name = p.rsplit('/').next().unwrap_or(p);
            SHELLS.contains(&name)
        })
        .map(|(p, _)| p)
        .collect()
}

#[test]
fn make_image_twice_from_one_commit_gives_one_digest() {
    let first = image();
    // Again, from scratch, with the binaries' file times changed: only content counts.
    for bin in [
        "address-controller",
        "range-driver",
        "metallb-driver",
        "cilium-driver",
    ] {
        let status = Command::new("touch")
            .arg(repo_root().join("target/image/release").join(bin))
            .status()
            .unwrap();
        assert!(status.success());
    }
    let dir = tempdir();
    let again = build(&dir, &[]).unwrap();
    assert_eq!(
        again.digest, first.digest,
        "a second build changed the digest"
    );
    assert_eq!(
        std::fs::read(&again.archive).unwrap(),
        std::fs::read(&first.archive).unwrap(),
        "the archives differ byte for byte"
    );
    assert_eq!(
        std::fs::read(&again.sbom).unwrap(),
        std::fs::read(&first.sbom).unwrap()
    );
    // The positive control: the digest does follow the inputs (another build time).
    let other = tempdir();
    let epoch = git(&["log", "-1", "--format=%ct"]).parse::<u64>().unwrap() + 1;
    let moved = build(&other, &[("SOURCE_DATE_EPOCH", &epoch.to_string())]).unwrap();
    assert_ne!(moved.digest, first.digest);
    println!(
        "digest {} (twice); {} with SOURCE_DATE_EPOCH+1",
        first.digest, moved.digest
    );
}

/// The image is tagged and labelled as the chart expects (its user, entrypoint, source and
/// revision), its root holds only what the binaries need (no shell, nothing setuid, every
/// library resolved), and its SBOM lists every package and the image by its digest.
#[test]
fn the_image_is_labelled_minimal_and_described_by_its_sbom() {
    let built = image();
    let img = unpack(&built.archive).unwrap();
    let version = app_version();

    // Tagged like the chart's appVersion (no leading v), addressed by its digest.
    assert_eq!(img.index["manifests"][0]["digest"], built.digest.as_str());
    assert_eq!(
        img.index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        version.as_str()
    );
    // Self-naming: a plain `ctr images import` names it as the chart's default image.
    assert_eq!(
        img.index["manifests"][0]["annotations"]["io.containerd.image.name"],
        format!("ghcr.io/cozystack/address-controller:{version}").as_str()
    );
    assert!(!version.starts_with('v'));

    // The user and entrypoint the chart's pods expect.
    let pod = render(
        "address-controller-system",
        &json!({"rangeDriver": {"enabled": true}}),
        &[],
    )
    .unwrap();
    let deployment = |name: &str| {
        pod.iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
            .unwrap()["spec"]["template"]["spec"]
            .clone()
    };
    let controller = deployment("address-controller");
    let cfg = &img.config["config"];
    assert_eq!(
        cfg["User"],
        format!(
            "{}:{}",
            controller["securityContext"]["runAsUser"], controller["securityContext"]["runAsGroup"]
        )
        .as_str()
    );
    assert_eq!(
        cfg["Entrypoint"],
        json!(["/usr/local/bin/address-controller"])
    );
    assert_eq!(controller["containers"][0]["args"][0], "run");
    let driver = deployment("address-controller-range-driver");
    let driver_cmd = driver["containers"][0]["command"][0].as_str().unwrap();
    let meta = std::fs::metadata(img.root.join(driver_cmd.trim_start_matches('/'))).unwrap();
    assert!(meta.mode() & 0o111 != 0, "{driver_cmd} is not executable");

    // Labels (config) and annotations (manifest) say where it comes from.
    let revision = git(&["rev-parse", "HEAD"]);
    for labels in [&cfg["Labels"], &img.manifest["annotations"]] {
        assert_eq!(
            labels["org.opencontainers.image.source"],
            "https://github.com/cozystack/address-controller"
        );
        assert_eq!(labels["org.opencontainers.image.version"], version.as_str());
        assert!(
            labels["org.opencontainers.image.revision"]
                .as_str()
                .unwrap()
                .starts_with(&revision),
            "{labels}"
        );
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    }

    let count = the_root_holds_only_what_the_binaries_need(&img);

    let (packages, debs) = the_sbom_lists_every_package_and_the_image(built);
    let size: u64 = img.manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    println!(
        "image {}: {} bytes compressed, {count} files in the root, SBOM {} packages ({debs} Debian, {} crates)",
        built.digest,
        size,
        packages - 1,
        packages - 1 - debs
    );
}

/// The root: the C library, libgcc, the CA bundle, the user, the binaries, copyright and
/// package records — nothing else, no shell, nothing setuid, all owned by root; every
/// library the binaries need resolved by the root's own loader. How many files it holds.
fn the_root_holds_only_what_the_binaries_need(img: &Unpacked) -> usize {
    let files = walk(&img.root);
    let allowed = |p: &str| {
        p.starts_with("lib/x86_64-linux-gnu/")
            || p == "lib64/ld-linux-x86-64.so.2"
            || p.starts_with("usr/local/bin/")
            || p.starts_with("var/lib/dpkg/status.d/")
            || (p.starts_with("usr/share/doc/")
                && (p.ends_with("/copyright") || p == "usr/share/doc/libgcc-s1"))
            || [
                "etc/passwd",
                "etc/group",
                "etc/ssl/certs/ca-certificates.crt",
            ]
            .contains(&p)
    };
    let mut count = 0;
    for (p, m) in &files {
        assert_eq!((m.uid(), m.gid()), (0, 0), "{p} is not owned by root");
        assert_eq!(m.mode() & 0o6000, 0, "{p} is setuid or setgid");
        if !m.is_dir() {
            count += 1;
            assert!(allowed(p), "{p} is in the image");
        }
    }
    assert!(
        shells(&img.root).is_empty(),
        "shells: {:?}",
        shells(&img.root)
    );
    // The check finds a shell where there is one.
    let copy = tempdir();
    std::fs::create_dir_all(copy.join("bin")).unwrap();
    std::fs::write(copy.join("bin/sh"), "").unwrap();
    assert_eq!(shells(&copy), vec!["bin/sh".to_string()]);
    let passwd = std::fs::read_to_string(img.root.join("etc/passwd")).unwrap();
    assert!(passwd.contains(":x:65532:65532:"), "{passwd}");
    let bundle =
        std::fs::read_to_string(img.root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    let certs = bundle.matches("BEGIN CERTIFICATE").count();
    assert!(certs > 100, "{certs} CA certificates");

    // Every library the binaries need is in the root: the root's own loader resolves them.
    for bin in [
        "address-controller",
        "range-driver",
        "metallb-driver",
        "cilium-driver",
    ] {
        let out = Command::new("chroot")
            .arg(&img.root)
            .args(["/lib64/ld-linux-x86-64.so.2", "--list"])
            .arg(format!("/usr/local/bin/{bin}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !text.contains("not found"),
            "{bin}:\n{text}"
        );
        assert!(text.contains("libc.so.6"), "{text}");
    }

    count
}

/// The SBOM: every pinned Debian package and every crate of Cargo.lock that the binaries
/// link, and the image by its digest. How many packages it lists, and how many are Debian's.
fn the_sbom_lists_every_package_and_the_image(built: &Built) -> (usize, usize) {
    let sbom: Value = serde_json::from_slice(&std::fs::read(&built.sbom).unwrap()).unwrap();
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    let packages = sbom["packages"].as_array().unwrap();
    let by_name: BTreeMap<&str, &Value> = packages
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p))
        .collect();
    let image_pkg = packages
        .iter()
        .find(|p| p["SPDXID"] == "SPDXRef-Image")
        .unwrap();
    assert_eq!(
        format!(
            "sha256:{}",
            image_pkg["checksums"][0]["checksumValue"].as_str().unwrap()
        ),
        built.digest
    );
    let lock = std::fs::read_to_string(repo_root().join("deploy/image/packages.lock")).unwrap();
    let mut debs = 0;
    for line in lock
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut f = line.split_whitespace();
        let (name, version) = (f.next().unwrap(), f.next().unwrap());
        assert_eq!(by_name[name]["versionInfo"], version, "{name}");
        debs += 1;
    }
    let cargo_lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).unwrap();
    for krate in ["tokio", "kube-client", "rustls", "axum"] {
        let version = cargo_lock
            .split("[[package]]")
            .find(|p| p.contains(&format!("name = \"{krate}\"\n")))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .unwrap()
            .trim_matches('"');
        assert_eq!(by_name[krate]["versionInfo"], version, "{krate}");
    }
    // A build-time or test-only crate is not in the binaries.
    assert!(!by_name.contains_key("address-controller-tests"));
    let ids: std::collections::BTreeSet<&str> = packages
        .iter()
        .map(|p| p["SPDXID"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), packages.len(), "SPDXIDs are unique");
    for r in sbom["relationships"].as_array().unwrap() {
        for end in ["spdxElementId", "relatedSpdxElement"] {
            let id = r[end].as_str().unwrap();
            assert!(id == "SPDXRef-DOCUMENT" || ids.contains(id), "{id}");
        }
    }
    (packages.len(), debs)
}

/// The controller and the range driver run from the image as the chart deploys them (the
/// pod's user, no privileges, a read-only root, the Deployment's command line and
/// environment): behind the chart's APIService, the Lease won by the pod, claims bound,
/// a driver-made address provisioned, the ledger sound.
#[tokio::test]
async fn the_image_runs_the_controller_and_the_driver_as_the_chart_deploys_them() {
    let built = image();
    let img = unpack(&built.archive).unwrap();
    let _one = INSTALL.lock().await;
    let (cluster, client) = setup().await;
    // The pods' own ports are free ports of this host (the containers share its network,
    // like hostNetwork pods), and the APIService's Service points at the controller's.
    let port = free_port();
    let release = Release::new(
        port,
        &json!({
            "containerPorts": {"apiserver": port, "metrics": free_port(), "probes": free_port()},
            "rangeDriver": {"enabled": true, "probePort": free_port()},
        }),
    )
    .await;
    let ns = release.ns.clone();
    let sfx = random_suffix();
    let pod = format!("address-controller-{sfx}");
    let controller = Container {
        image: &img,
        namespace: &ns,
        deployment: "address-controller",
        pod: &pod,
    }
    .start()
    .await
    .unwrap();

    the_binary_runs_as_the_pod_says(&controller, &ns, &pod);

    // Behind the chart's APIService: Available, the Lease won by the pod, a claim bound,
    // kubectl reading the holdings through the aggregator.
    wait_for("APIService Available", WAIT, apiservice_available)
        .await
        .unwrap();
    wait_lease_holder_in(&client, &ns, "address-controller", pod.as_str()).await;
    let tenant = TestNamespace::create(&client, "image-tenant")
        .await
        .unwrap();
    let mut cleanup = Cleanup::default();
    let class = format!("image-{sfx}");
    let range = format!("image-range-{sfx}");
    let address = format!("image-{sfx}");
    cleanup.add("ipaddressclasses.local.sdn.cozystack.io", &class);
    cleanup.add("ipaddressclasses.local.sdn.cozystack.io", &range);
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &address);
    let objects = json!([
        {"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
         "metadata": {"name": class}, "spec": {"provisioner": "image.drivers.test"}},
        {"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddress",
         "metadata": {"name": address},
         "spec": {"address": "198.51.100.88", "className": class, "source": {"fromClass": {}}}},
        {"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
         "metadata": {"name": "web", "namespace": tenant.name}, "spec": {"className": class}},
        {"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClass",
         "metadata": {"name": range}, "spec": {"provisioner": "range.drivers.local.sdn.cozystack.io",
             "parameters": {"cidrs": ["100.64.88.0/30"]}}},
        {"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "IPAddressClaim",
         "metadata": {"name": "dynamic", "namespace": tenant.name}, "spec": {"className": range}},
    ]);
    let file = tempdir();
    for (i, o) in objects.as_array().unwrap().iter().enumerate() {
        let f = file.join(format!("{i}.json"));
        std::fs::write(&f, o.to_string()).unwrap();
        cluster
            .kubectl_ok(&["create", "-f", f.to_str().unwrap()])
            .unwrap();
    }
    let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), &tenant.name);
    wait_for("claim web Bound by the container", WAIT, || async {
        let c = claims.get("web").await?;
        Ok((phase(&c) == Some(ClaimPhase::Bound)).then_some(()))
    })
    .await
    .unwrap();
    assert_holdings_bound(&tenant.name, 1);

    // The range driver from the same image, as its Deployment runs it, provisions.
    let driver_pod = format!("range-driver-{sfx}");
    let driver = Container {
        image: &img,
        namespace: &ns,
        deployment: "address-controller-range-driver",
        pod: &driver_pod,
    }
    .start()
    .await
    .unwrap();
    let dpid = container_pid(driver.process.pid()).unwrap();
    assert!(proc_status(dpid)["Uid"].starts_with("65532\t"));
    let bound = wait_for(
        "claim dynamic Bound to a driver-made address",
        WAIT,
        || async {
            let c = claims.get("dynamic").await?;
            Ok((phase(&c) == Some(ClaimPhase::Bound)).then_some(c))
        },
    )
    .await
    .unwrap();
    let provisioned = bound.status.unwrap().addresses[0].name.clone();
    cleanup.add("ipaddresses.local.sdn.cozystack.io", &provisioned);
    assert_eq!(provisioned, "ipv4-100-64-88-1");
    let driver_lease = lease_holder_in(&client, &ns, "address-controller-range-driver")
        .await
        .unwrap();
    assert_eq!(driver_lease.as_deref(), Some(driver_pod.as_str()));

    let scope = Scope::of(&[tenant.name.as_str()], &[class.as_str(), range.as_str()]);
    assert_invariants(&client, &scope, &[controller.process.replica().unwrap()]).await;
    drop(driver);
    drop(controller);
    drop(tenant);
    drop(cleanup);
    drop(release);
}

/// The binary runs as the pod says: the chart's user, no privileges, a read-only root,
/// exactly the Deployment's command line and environment; its files are the image's.
fn the_binary_runs_as_the_pod_says(controller: &Running, ns: &str, pod: &str) {
    let cluster = address_controller_tests::Cluster::get();
    let pid = container_pid(controller.process.pid()).expect("the container's process");
    let status = proc_status(pid);
    assert!(status["Uid"].starts_with("65532\t65532"), "{status:?}");
    assert!(status["Gid"].starts_with("65532\t65532"), "{status:?}");
    assert_eq!(status["Groups"], "65532");
    assert_eq!(status["NoNewPrivs"], "1");
    assert_eq!(status["CapEff"], "0000000000000000");
    let cmdline = proc_strings(pid, "cmdline");
    assert_eq!(cmdline, controller.argv);
    let deploy = cluster
        .kubectl_ok(&[
            "get",
            "deployment",
            "address-controller",
            "-n",
            ns,
            "-o",
            "json",
        ])
        .unwrap();
    let deploy: Value = serde_json::from_str(&deploy).unwrap();
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    let want = container_argv(c, "/usr/local/bin/address-controller");
    assert_eq!(cmdline, want, "the Deployment's args, unchanged");
    let mut environ = proc_strings(pid, "environ");
    environ.sort();
    let mut given: Vec<String> = controller
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    given.sort();
    assert_eq!(environ, given);
    assert!(environ.contains(&format!("ADDRESS_CONTROLLER_POD_NAME={pod}")));
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root_mount = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap();
    assert!(
        root_mount
            .split_whitespace()
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "the root is not read-only: {root_mount}"
    );
    // Not even root writes there (the mount, not permissions, refuses).
    let err = std::fs::write(format!("/proc/{pid}/root/etc/written"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(30), "EROFS: {err}");
    // Its files are the image's (the binary, and no shell).
    assert!(
        Path::new(&format!(
            "/proc/{pid}/root/usr/local/bin/address-controller"
        ))
        .exists()
    );
    assert!(!Path::new(&format!("/proc/{pid}/root/bin/sh")).exists());
}

#[test]
fn the_dockerfile_builds_what_make_image_builds() {
    let built = image();
    let img = unpack(&built.archive).unwrap();
    let cfg = &img.config["config"];
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
    let json_line = |prefix: &str| -> Value { serde_json::from_str(&line(prefix)).unwrap() };
    assert_eq!(cfg["User"], line("USER ").as_str());
    assert_eq!(cfg["Entrypoint"], json_line("ENTRYPOINT "));
    assert_eq!(cfg["Cmd"], json_line("CMD "));
    // The same binaries, in the same places.
    let mut copied: Vec<String> = dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY --from=build "))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .unwrap()
                .trim_start_matches('/')
                .to_string()
        })
        .collect();
    let in_image: Vec<String> = walk(&img.root)
        .into_iter()
        .filter(|(p, m)| p.starts_with("usr/local/bin/") && !m.is_dir())
        .map(|(p, _)| p)
        .collect();
    copied.sort();
    assert_eq!(
        copied, in_image,
        "the Dockerfile's COPY lines (sorted) and the image's binaries"
    );
    let cargo = line("RUN cargo build ");
    for flag in [
        "--release",
        "--locked",
        "--bin address-controller",
        "--bin range-driver",
        "--bin metallb-driver",
        "--bin cilium-driver",
    ] {
        assert!(
            cargo.contains(flag),
            "the Dockerfile's cargo build lacks {flag}"
        );
    }
    // The same base: distroless cc on Debian 12 is glibc, libgcc and CA certificates —
    // the packages make image pins, all of Debian 12.
    assert_eq!(line("FROM gcr.io/distroless/"), "cc-debian12:nonroot");
    let lock = std::fs::read_to_string(repo_root().join("deploy/image/packages.lock")).unwrap();
    let pinned: Vec<&str> = lock
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    for want in ["libc6 ", "libgcc-s1 ", "ca-certificates "] {
        assert!(
            pinned.iter().any(|l| l.starts_with(want)),
            "{want}not pinned"
        );
    }
    for l in &pinned {
        assert!(l.contains("deb12"), "not a Debian 12 package: {l}");
    }
    // The same toolchain as rust-toolchain.toml, on the same Debian.
    let toolchain = std::fs::read_to_string(repo_root().join("rust-toolchain.toml")).unwrap();
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|rest| rest.split('"').nth(1))
        .unwrap();
    let minor = channel.rsplit_once('.').map_or(channel, |(m, _)| m);
    assert_eq!(
        line("FROM rust:"),
        format!("{minor}-bookworm AS build"),
        "rust-toolchain.toml pins {channel}"
    );
    assert!(line("ENV RUSTFLAGS=").contains("--remap-path-prefix=/usr/local/cargo=/cargo"));
}
