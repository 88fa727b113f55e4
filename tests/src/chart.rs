//! The Helm chart in tests: installing a release into the local control plane, and
//! running the binaries on the host as the chart's ServiceAccounts with the Deployments'
//! own arguments (there is no kubelet: the pods never start) — as the chart test, the
//! quickstart and the chaos suite do.

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::env::{APISERVICE, b64decode, tempdir};
use crate::{Cluster, ControllerProcess, TempDir, free_port, random_suffix, repo_root};

/// Installs of the chart own cluster-scoped objects with fixed names: one at a time.
pub static INSTALL: Mutex<()> = Mutex::const_new(());

pub fn chart_dir() -> PathBuf {
    repo_root().join("chart/address-controller")
}

pub fn helm() -> Command {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.env_var("HELM").unwrap());
    cmd.env("KUBECONFIG", &cluster.kubeconfig);
    cmd
}

/// `helm template` of the chart into namespace `ns` for Kubernetes 1.36 with `values` and
/// extra flags: the rendered objects, or helm's error.
pub fn render(ns: &str, values: &Value, extra: &[&str]) -> Result<Vec<Value>, String> {
    let (_dir, file) = values_file(values);
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "address-controller",
        chart.to_str().unwrap(),
        "--namespace",
        ns,
        "--kube-version",
        "1.36.0",
        "-f",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Ok(parse_docs(&run_helm(&args)?))
}

/// Runs helm; Ok(stdout) or Err(stderr).
pub fn run_helm(args: &[&str]) -> Result<String, String> {
    let out = helm().args(args).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A values file holding `values` (JSON is YAML), in a directory removed on drop.
pub fn values_file(values: &Value) -> (TempDir, PathBuf) {
    let dir = tempdir();
    let f = dir.join("values.yaml");
    std::fs::write(&f, serde_json::to_string(values).unwrap()).unwrap();
    (dir, f)
}

/// An object's `Kind/name`, as the chart tests name what a release renders.
pub fn kind_name(o: &Value) -> String {
    format!(
        "{}/{}",
        o["kind"].as_str().unwrap(),
        o["metadata"]["name"].as_str().unwrap()
    )
}

pub fn parse_docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Clears what a release of the chart owns cluster-wide and another test file (the views'
/// APIService) or an aborted run may have left: an install would fail on its ownership.
pub fn clear_leftovers() {
    let cluster = Cluster::get();
    // Cluster-scoped objects left by another test file (the views' APIService) or by an
    // aborted run would make the install fail on ownership.
    cluster
        .kubectl_ok(&["delete", "apiservice", APISERVICE, "--ignore-not-found"])
        .unwrap();
    // The generated ClusterRole carries no Helm labels.
    cluster
        .kubectl_ok(&[
            "delete",
            "clusterrole",
            "address-controller",
            "--ignore-not-found",
        ])
        .unwrap();
    cluster
            .kubectl_ok(&[
                "delete",
                "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,mutatingadmissionpolicies,mutatingadmissionpolicybindings",
                "-l",
                "app.kubernetes.io/name=address-controller,app.kubernetes.io/managed-by=Helm",
            ])
            .unwrap();
    cluster
        .kubectl_ok(&[
            "delete",
            "rolebindings",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=address-controller,app.kubernetes.io/managed-by=Helm",
        ])
        .unwrap();
}

/// An installed release of the chart, uninstalled (and its namespace deleted) on drop.
pub struct Release {
    pub ns: String,
    /// The release's name (`address-controller`, as the platform names the core's).
    pub name: String,
    /// The output of the first install, NOTES included.
    pub notes: String,
}

impl Release {
    /// `helm upgrade --install` with `values`; the API Service points at localhost:`port`.
    pub fn install(ns: &str, port: u16, values: &Value) -> Result<String, String> {
        Self::install_chart(&chart_dir(), ns, &Self::local_values(port, values))
    }

    /// `values` with the APIService's Service pointed at localhost:`port` (there is no
    /// kubelet: the tests run the binary on the host).
    pub fn local_values(port: u16, values: &Value) -> Value {
        let mut v = json!({"apiService": {"service": {"externalName": "localhost", "port": port}}});
        crate::env::merge(&mut v, values.clone());
        v
    }

    /// `helm upgrade --install address-controller CHART` into `ns` with `values`.
    pub fn install_chart(chart: &Path, ns: &str, values: &Value) -> Result<String, String> {
        Self::install_named(chart, "address-controller", ns, values)
    }

    /// `helm upgrade --install NAME CHART` into `ns` with `values`.
    pub fn install_named(
        chart: &Path,
        name: &str,
        ns: &str,
        values: &Value,
    ) -> Result<String, String> {
        let (_dir, file) = values_file(values);
        run_helm(&[
            "upgrade",
            "--install",
            name,
            chart.to_str().unwrap(),
            "--namespace",
            ns,
            "--create-namespace",
            "-f",
            file.to_str().unwrap(),
        ])
    }

    pub async fn new(port: u16, values: &Value) -> Release {
        Self::new_in(&format!("acs-{}", random_suffix()), port, values).await
    }

    /// [`Release::new`] into the namespace `ns` (made by helm unless it exists, e.g.
    /// labelled for Pod Security admission by the test).
    pub async fn new_in(ns: &str, port: u16, values: &Value) -> Release {
        clear_leftovers();
        Self::installed(ns, "address-controller", || Self::install(ns, port, values))
    }

    /// A wrapper package of the platform (`packaging/…`, holding this chart under `charts/`)
    /// installed as release `name` in `ns`, as [`Release::new_in`] installs the chart;
    /// `values` are the wrapper's. Leftovers are the caller's to clear ([`clear_leftovers`]).
    pub fn new_package(chart: &Path, name: &str, ns: &str, values: &Value) -> Release {
        Self::installed(ns, name, || Self::install_named(chart, name, ns, values))
    }

    fn installed(
        ns: &str,
        name: &str,
        install: impl FnOnce() -> Result<String, String>,
    ) -> Release {
        let mut release = Release {
            ns: ns.to_string(),
            name: name.to_string(),
            notes: String::new(),
        };
        // The guard exists before the install: a failed install is uninstalled too.
        release.notes = install().unwrap_or_else(|e| panic!("helm install: {e}"));
        assert!(
            release.notes.contains("STATUS: deployed"),
            "{}",
            release.notes
        );
        release
    }

    pub fn manifest(&self) -> Vec<Value> {
        parse_docs(&run_helm(&["get", "manifest", &self.name, "-n", &self.ns]).unwrap())
    }

    pub fn uninstall(&self) -> Result<String, String> {
        run_helm(&["uninstall", &self.name, "-n", &self.ns])
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.uninstall();
        let _ = Cluster::get()
            .kubectl()
            .args([
                "delete",
                "namespace",
                &self.ns,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

/// A kubeconfig for the admin cluster entry with a bearer token instead of the admin cert.
pub fn token_kubeconfig(token: &str, path: &Path) {
    let admin: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&Cluster::get().kubeconfig).unwrap())
            .unwrap();
    let mut cfg = admin.clone();
    cfg["users"][0]["user"] = serde_yaml::to_value(json!({"token": token})).unwrap();
    std::fs::write(path, serde_yaml::to_string(&cfg).unwrap()).unwrap();
}

pub fn create_token(sa: &str, ns: &str) -> String {
    Cluster::get()
        .kubectl_ok(&["create", "token", sa, "-n", ns, "--duration", "1h"])
        .unwrap()
        .trim()
        .to_string()
}

pub fn secret_data(ns: &str, name: &str, key: &str) -> String {
    Cluster::get()
        .kubectl_ok(&[
            "get",
            "secret",
            name,
            "-n",
            ns,
            "-o",
            &format!("go-template={{{{index .data \"{key}\"}}}}"),
        ])
        .unwrap()
}

/// The first container of an installed Deployment.
pub fn installed_container(ns: &str, deployment: &str) -> Value {
    let deploy: Value = serde_json::from_str(
        &Cluster::get()
            .kubectl_ok(&["get", "deployment", deployment, "-n", ns, "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    deploy["spec"]["template"]["spec"]["containers"][0].clone()
}

/// A container's args with `replace` applied: the pod's addresses and paths become the
/// host's.
pub fn host_args(container: &Value, replace: &[(&str, &str)]) -> Vec<String> {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            replace
                .iter()
                .fold(a.as_str().unwrap().to_string(), |a, (from, to)| {
                    a.replace(from, to)
                })
        })
        .collect()
}

/// A driver of the chart: its Deployment, binary and probe address in the pod.
#[derive(Debug, Clone, Copy)]
pub struct DriverKind {
    pub deployment: &'static str,
    pub binary: &'static str,
    pub probe: &'static str,
}

/// The reference range driver (`rangeDriver.enabled`).
pub const RANGE: DriverKind = DriverKind {
    deployment: "address-controller-range-driver",
    binary: "range-driver",
    probe: "0.0.0.0:8082",
};

/// The MetalLB driver (`metallbDriver.enabled`).
pub const METALLB: DriverKind = DriverKind {
    deployment: "address-controller-metallb-driver",
    binary: "metallb-driver",
    probe: "0.0.0.0:8083",
};

/// The Cilium LB-IPAM driver (`ciliumDriver.enabled`).
pub const CILIUM: DriverKind = DriverKind {
    deployment: "address-controller-cilium-driver",
    binary: "cilium-driver",
    probe: "0.0.0.0:8084",
};

/// The chart's binaries running on the host for a release: as its ServiceAccounts, with
/// the Deployments' arguments, the chart's serving certificate, their own loopback ports.
pub struct Runner {
    pub ns: String,
    /// Holds the certificate files and kubeconfigs; removed on drop.
    dir: TempDir,
    /// None for a release of the drivers alone (`core.enabled: false`).
    controller_kubeconfig: Option<PathBuf>,
    driver_kubeconfig: Option<PathBuf>,
    driver: DriverKind,
}

impl Runner {
    /// Token kubeconfigs for the release's ServiceAccounts and the serving certificate.
    pub fn new(release: &Release, with_driver: bool) -> Runner {
        Runner::with(release, with_driver.then_some(RANGE))
    }

    /// A runner for the release with `driver` (its Deployment enabled in the release).
    pub fn with(release: &Release, driver: Option<DriverKind>) -> Runner {
        let with_driver = driver.is_some();
        let driver = driver.unwrap_or(RANGE);
        let ns = release.ns.clone();
        let dir = tempdir();
        let controller_kubeconfig = dir.join("controller.kubeconfig");
        token_kubeconfig(
            &create_token("address-controller", &ns),
            &controller_kubeconfig,
        );
        let controller_kubeconfig = Some(controller_kubeconfig);
        let driver_kubeconfig = with_driver.then(|| {
            let p = dir.join("driver.kubeconfig");
            token_kubeconfig(&create_token(driver.deployment, &ns), &p);
            p
        });
        for key in ["tls.crt", "tls.key", "ca.crt"] {
            let pem = b64decode(&secret_data(&ns, "address-controller-api-tls", key));
            std::fs::write(dir.join(key), pem).unwrap();
        }
        Runner {
            ns,
            dir,
            controller_kubeconfig,
            driver_kubeconfig,
            driver,
        }
    }

    /// A runner for a release of `driver` alone (`core.enabled: false`, as the platform's
    /// driver package): its driver only.
    pub fn driver_only(release: &Release, driver: DriverKind) -> Runner {
        let dir = tempdir();
        let p = dir.join("driver.kubeconfig");
        token_kubeconfig(&create_token(driver.deployment, &release.ns), &p);
        Runner {
            ns: release.ns.clone(),
            dir,
            controller_kubeconfig: None,
            driver_kubeconfig: Some(p),
            driver,
        }
    }

    /// A controller replica named `identity`; `api_port` is where the views listen (the
    /// APIService points there) — `None` for a replica the aggregator does not reach.
    pub async fn controller(
        &self,
        identity: &str,
        api_port: Option<u16>,
        extra: &[&str],
    ) -> anyhow::Result<ControllerProcess> {
        let c = installed_container(&self.ns, "address-controller");
        let mount = c["volumeMounts"][0]["mountPath"]
            .as_str()
            .unwrap()
            .to_string();
        let api = format!("127.0.0.1:{}", api_port.unwrap_or_else(free_port));
        let metrics = format!("127.0.0.1:{}", free_port());
        let probe = format!("127.0.0.1:{}", free_port());
        let mut argv = host_args(
            &c,
            &[
                ("0.0.0.0:6443", &api),
                ("0.0.0.0:8443", &metrics),
                ("0.0.0.0:8081", &probe),
                (&mount, self.dir.to_str().unwrap()),
            ],
        );
        // What the pod gets from the downward API.
        argv.extend(["--lease-namespace", &self.ns, "--identity", identity].map(str::to_string));
        argv.extend(extra.iter().map(|s| s.to_string()));
        let kubeconfig = self
            .controller_kubeconfig
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the release has no core"))?;
        ControllerProcess::launch("address-controller", identity, kubeconfig, &argv, &probe).await
    }

    /// A replica of the release's driver named `identity`.
    pub async fn driver(
        &self,
        identity: &str,
        extra: &[&str],
    ) -> anyhow::Result<ControllerProcess> {
        let kubeconfig = self
            .driver_kubeconfig
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the release has no driver"))?;
        let probe = format!("127.0.0.1:{}", free_port());
        let mut argv = host_args(
            &installed_container(&self.ns, self.driver.deployment),
            &[(self.driver.probe, &probe)],
        );
        argv.extend(["--lease-namespace", &self.ns, "--identity", identity].map(str::to_string));
        argv.extend(extra.iter().map(|s| s.to_string()));
        ControllerProcess::launch(self.driver.binary, identity, kubeconfig, &argv, &probe).await
    }

    /// The directory with the serving certificate (`ca.crt`, `tls.crt`, `tls.key`).
    pub fn cert_dir(&self) -> &Path {
        &self.dir
    }
}
