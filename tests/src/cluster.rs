//! The control plane the tests run against: the shared one ([`Cluster`], from
//! `ADDRESS_CONTROLLER_TEST_CLUSTER` or the development cluster), a test's own
//! ([`PrivateCluster`]), the CRDs, a throwaway namespace per test ([`TestNamespace`]) and
//! the cluster-scoped objects a test leaves ([`Cleanup`]).

use super::*;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// A running local control plane.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The cluster directory (`env`, `pki/`, `logs/`).
    pub dir: PathBuf,
    /// Admin kubeconfig (client certificate in group `system:masters`).
    pub kubeconfig: PathBuf,
}

/// `kubectl apply` as the harness applies: server-side, taking over any field, as
/// [`FIELD_MANAGER`].
const SERVER_SIDE_APPLY: [&str; 5] = [
    "apply",
    "--server-side",
    "--force-conflicts",
    "--field-manager",
    FIELD_MANAGER,
];

impl Cluster {
    /// The shared cluster of this test process: from `ADDRESS_CONTROLLER_TEST_CLUSTER`,
    /// else the development cluster, started if it is not up.
    pub fn get() -> &'static Cluster {
        CLUSTER.get_or_init(|| {
            Self::discover().unwrap_or_else(|e| panic!("no local control plane: {e:#}"))
        })
    }

    /// Makes the cluster in `dir` (started by `cluster.sh up DIR`) the one of this process;
    /// fails when another one is in use already.
    pub fn use_dir(dir: &Path) -> Result<&'static Cluster> {
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            kubeconfig: dir.join("admin.kubeconfig"),
        };
        CLUSTER
            .set(cluster)
            .map_err(|_| anyhow!("a cluster is already in use by this process"))?;
        Ok(Cluster::get())
    }

    fn discover() -> Result<Cluster> {
        ensure_binaries()?;
        let script = repo_root().join("deploy/local/cluster.sh");
        let mut cmd = Command::new(&script);
        cmd.arg("up");
        if let Ok(dir) = std::env::var("ADDRESS_CONTROLLER_TEST_CLUSTER") {
            cmd.arg(dir);
        }
        // `up` reuses a running cluster and prints the kubeconfig path last.
        let out = cmd
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!(
                "{} up failed:\n{}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let kubeconfig = PathBuf::from(
            String::from_utf8(out.stdout)?
                .lines()
                .last()
                .ok_or_else(|| anyhow!("cluster.sh printed no kubeconfig"))?
                .trim(),
        );
        let dir = kubeconfig
            .parent()
            .ok_or_else(|| anyhow!("kubeconfig has no parent"))?
            .to_path_buf();
        Ok(Cluster { dir, kubeconfig })
    }

    /// A client with admin rights.
    pub async fn client(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// An admin client that returns every answer as it comes: no retries of 429, 503 and
    /// 504 (kube's default), for tests that look at those answers.
    pub async fn raw_client(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.default_retry = false;
        Ok(Client::try_from(config)?)
    }

    /// `kubectl` against this cluster.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// Runs `kubectl ARGS` and returns stdout; fails with stderr on a non-zero exit.
    /// `kubectl apply --server-side --force-conflicts` of OBJECTS as the harness
    /// ([`FIELD_MANAGER`]); the error carries kubectl's stderr.
    pub fn apply(&self, objects: &[serde_json::Value]) -> Result<()> {
        let mut child = self
            .kubectl()
            .args(SERVER_SIDE_APPLY)
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("kubectl apply")?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
            for o in objects {
                writeln!(stdin, "---\n{}", serde_yaml::to_string(o)?)?;
            }
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// `kubectl apply --server-side --force-conflicts` of the manifests at `path` (a file
    /// or a directory) as the harness ([`FIELD_MANAGER`]).
    pub fn apply_path(&self, path: &Path) -> Result<String> {
        let path = path
            .to_str()
            .ok_or_else(|| anyhow!("a path that is not UTF-8"))?;
        let args: Vec<&str> = SERVER_SIDE_APPLY
            .iter()
            .copied()
            .chain(["-f", path])
            .collect();
        self.kubectl_ok(&args)
    }

    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self
            .kubectl()
            .args(args)
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Path of a binary or file named in the cluster's `env` (e.g. `HELM`).
    pub fn env_var(&self, key: &str) -> Result<String> {
        let env = std::fs::read_to_string(self.dir.join("env"))?;
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{key} not in {}/env", self.dir.display()))
    }

    /// Compacts etcd's history up to its current revision (as kube-apiserver's periodic
    /// compaction would, minutes later): every older resourceVersion and continue token is
    /// then expired. Returns the revision compacted to.
    pub fn compact_etcd(&self) -> Result<i64> {
        let base = format!("http://127.0.0.1:{}/v3/kv", self.env_var("ETCD_PORT")?);
        let post = |path: &str, body: &str| -> Result<serde_json::Value> {
            let out = Command::new("curl")
                .args(["-sf", "--max-time", "10", "-X", "POST", "-d", body])
                .arg(format!("{base}/{path}"))
                .output()
                .context("running curl")?;
            if !out.status.success() {
                bail!("etcd {path}: curl exited with {}", out.status);
            }
            Ok(serde_json::from_slice(&out.stdout)?)
        };
        // Any range answers with the current revision in its header ("AA==" is key "\0").
        let head = post("range", r#"{"key":"AA=="}"#)?;
        let revision: i64 = head["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| anyhow!("etcd range: no revision in {head}"))?;
        post(
            "compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )?;
        Ok(revision)
    }
}

/// The cluster, a fresh admin client, and the CRDs applied and Established.
pub async fn setup() -> (&'static Cluster, Client) {
    let cluster = Cluster::get();
    let client = cluster.client().await.expect("admin client");
    install_crds(&client).await.expect("installing CRDs");
    (cluster, client)
}

/// Applies the generated CRDs (server-side apply, so re-running is a no-op) and waits until
/// each is Established.
pub async fn install_crds(client: &Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in address_controller_api::manifests::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
        wait_for(
            &format!("CRD {name} Established"),
            Duration::from_secs(60),
            || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let crd = api.get(&name).await?;
                    let established = crd
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True");
                    Ok(established.then_some(()))
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// A namespace that exists for one test and is deleted when dropped.
pub struct TestNamespace {
    pub name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// Creates `<prefix>-<random>`.
    pub async fn create(client: &Client, prefix: &str) -> Result<TestNamespace> {
        let name = format!("{prefix}-{}", random_suffix());
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"address-controller.test/throwaway": "true"}}
        }))?;
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(TestNamespace {
            name,
            kubeconfig: Cluster::get().kubeconfig.clone(),
        })
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop cannot be async; kubectl returns at once with --wait=false and the
        // namespace controller does the rest.
        let _ = Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args([
                "delete",
                "namespace",
                &self.name,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

/// Deletes the cluster-scoped objects a test created when dropped, so a failing test does
/// not leave default classes or addresses behind for the next one.
#[derive(Default)]
pub struct Cleanup {
    objects: Vec<(String, String)>,
}

impl Cleanup {
    pub fn add(&mut self, resource: &str, name: &str) {
        self.objects.push((resource.to_string(), name.to_string()));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (resource, name) in self.objects.iter().rev() {
            let _ = Cluster::get()
                .kubectl()
                .args([
                    "delete",
                    resource,
                    name,
                    "--wait=false",
                    "--ignore-not-found",
                ])
                .output();
        }
    }
}
// The conformance suite and the invariant checker live in their own crate (a driver's
// repository depends on it); the harness uses them under their old names.

/// A control plane of a test's own (for what the shared one's other users must not see,
/// such as CRDs taken away), stopped and removed when dropped. [`Cluster::use_dir`] makes
/// it the one the process's helpers talk to.
pub struct PrivateCluster {
    pub dir: PathBuf,
}

impl PrivateCluster {
    pub fn start(prefix: &str) -> PrivateCluster {
        ensure_binaries().expect("build-binaries.sh");
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", random_suffix()));
        let out = Command::new(repo_root().join("deploy/local/cluster.sh"))
            .arg("up")
            .arg(&dir)
            .args(["--watch-pid", &std::process::id().to_string()])
            .output()
            .expect("cluster.sh up");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PrivateCluster { dir }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("deploy/local/cluster.sh"))
            .arg("down")
            .arg(&self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
