//! Test harness for the integration tests: a real local control plane (started by
//! `deploy/local/cluster.sh`), the CRDs applied and Established, a throwaway namespace per
//! test, and waiting with a timeout and a useful failure message.
//!
//! The cluster comes from `ADDRESS_CONTROLLER_TEST_CLUSTER` (a cluster directory, as
//! `make test` sets it). Without it the harness starts — or reuses — the development
//! cluster (`make cluster-up`), so `cargo test -p address-controller-tests` works alone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Field manager of everything the harness writes.
pub const FIELD_MANAGER: &str = "address-controller-tests";

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// A running local control plane.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The cluster directory (`env`, `pki/`, `logs/`).
    pub dir: PathBuf,
    /// Admin kubeconfig (client certificate in group `system:masters`).
    pub kubeconfig: PathBuf,
}

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
            .args([
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                FIELD_MANAGER,
                "-f",
                "-",
            ])
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

/// A directory under the system's temporary directory, removed (with everything in it)
/// when dropped: tests leave nothing behind in /tmp — unless the test failed, when it stays
/// for its logs.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("{prefix}-{}", random_suffix()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
        TempDir(d)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed test keeps its logs (a driver's, MetalLB's) for whoever reads why.
            eprintln!("kept {} (the test failed)", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates the object `value` (JSON, as a manifest) through `api`; panics on failure.
pub async fn create_object<K>(api: &Api<K>, value: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(value).expect("a valid object");
    api.create(&kube::api::PostParams::default(), &obj)
        .await
        .expect("create")
}

/// Deletes a cluster-scoped object and ignores "not found".
pub async fn delete_ignore_missing<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The message of an API error, for asserting on admission failures.
pub fn api_error_message(err: &kube::Error) -> Option<(u16, String)> {
    match err {
        kube::Error::Api(s) => Some((s.code, s.message.clone())),
        _ => None,
    }
}

// ---- the address-controller binary under test -------------------------------------------

/// A loopback port free now, never handed out before by this process, and outside the
/// kernel's ephemeral range (`net.ipv4.ip_local_port_range`): a port from that range can be
/// taken as the source port of any outgoing connection between this call and the server's
/// bind (a MetalLB controller that never listened, seen in CI), and the kernel may give a
/// port it just released again (two flags of one controller once got the same one). Below
/// the range nothing is assigned but by an explicit bind.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // From 10000 up to the range: a start that differs between processes, then in order.
    const FLOOR: u16 = 10_000;
    if low > FLOOR + 1000 {
        let span = u32::from(low - FLOOR);
        let seed = std::process::id().wrapping_mul(2_654_435_761).wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()),
        );
        let start = seed % span;
        for k in 0..span {
            let port = FLOOR + ((start + k) % span) as u16;
            if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return port;
            }
        }
    }
    // No room below the range: the kernel's choice.
    for _ in 0..1000 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(0);
        if port != 0 && given.insert(port) {
            return port;
        }
    }
    0
}

/// `kubectl ARGS` as the test cluster's admin: (exit 0, stdout, stderr).
pub fn kubectl_admin(args: &[&str]) -> (bool, String, String) {
    match Cluster::get().kubectl().args(args).output() {
        Ok(out) => (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        Err(e) => (false, String::new(), format!("kubectl: {e}")),
    }
}

/// `address-controller ARGS` against the test cluster (its admin kubeconfig), printed:
/// (exit 0, stdout + stderr).
pub async fn address_controller_cli(args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(binary("address-controller"))
        .args(args)
        .arg("--kubeconfig")
        .arg(&Cluster::get().kubeconfig)
        .kill_on_drop(true)
        .output()
        .await;
    let (ok, text, code) = match out {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            o.status.code(),
        ),
        Err(e) => (false, format!("address-controller: {e}"), None),
    };
    println!("address-controller {args:?} → {code:?}\n{text}");
    (ok, text)
}

/// The path of a workspace binary; `make test` builds them before the tests run.
pub fn binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    // `ADDRESS_CONTROLLER_PROFILE=release` runs the release build (the benchmarks do).
    let profile = std::env::var("ADDRESS_CONTROLLER_PROFILE").unwrap_or_else(|_| "debug".into());
    let path = target.join(profile).join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` first (make test does)",
        path.display()
    );
    path
}

/// A running `address-controller run` process, impersonating its own user so the audit
/// log attributes every request it makes.
pub struct ControllerProcess {
    pub user: String,
    pub probe: String,
    /// `host:port` of the HTTPS /metrics endpoint, when the process serves one.
    pub metrics_address: Option<String>,
    pub log: PathBuf,
    child: std::process::Child,
    spawn: Spawn,
}

/// How a test process is started (kept for restarts).
struct Spawn {
    program: PathBuf,
    args: Vec<String>,
    /// `None`: the test's environment and a debug `RUST_LOG`; `Some`: exactly these.
    env: Option<Vec<(String, String)>>,
    stderr: PathBuf,
}

impl Spawn {
    fn start(&self, log: &Path) -> Result<std::process::Child> {
        let append = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
        };
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        match &self.env {
            None => {
                cmd.env(
                    "RUST_LOG",
                    "info,address_controller_controller=debug,address_controller_apiserver=debug,range_driver=debug",
                );
            }
            Some(env) => {
                cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
            }
        }
        cmd.stdout(append(log)?)
            .stderr(append(&self.stderr)?)
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))
    }
}

impl ControllerProcess {
    /// Starts the controller as user `user` (group `system:masters`), waits until ready.
    pub async fn start(user: &str, extra: &[&str]) -> Result<ControllerProcess> {
        Self::start_as(user, &["system:masters"], extra).await
    }

    /// Starts the controller as user `user` in `groups` only: with no `system:masters`,
    /// it has exactly the RBAC the test granted that user.
    pub async fn start_as(
        user: &str,
        groups: &[&str],
        extra: &[&str],
    ) -> Result<ControllerProcess> {
        Self::start_wrapped(&[], user, groups, extra).await
    }

    /// [`ControllerProcess::start`] with its open-file limit set to `soft:hard` (as a
    /// container runtime sets it), by `prlimit`.
    pub async fn start_with_open_files(
        user: &str,
        soft_hard: &str,
        extra: &[&str],
    ) -> Result<ControllerProcess> {
        let nofile = format!("--nofile={soft_hard}");
        Self::start_wrapped(
            &["prlimit", &nofile, "--"],
            user,
            &["system:masters"],
            extra,
        )
        .await
    }

    /// [`ControllerProcess::start_as`] run by `wrapper` (a program and its arguments, the
    /// controller's command line appended; empty: none).
    async fn start_wrapped(
        wrapper: &[&str],
        user: &str,
        groups: &[&str],
        extra: &[&str],
    ) -> Result<ControllerProcess> {
        // Every process gets its own loopback ports unless the test chose them.
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for flag in ["--apiserver-address", "--metrics-address"] {
            if !extra.contains(&flag) {
                args.push(flag.to_string());
                args.push(format!("127.0.0.1:{}", free_port()));
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::spawn_in(wrapper, "address-controller", &["run"], user, groups, &args).await
    }

    /// Starts the reference `range-driver` as user `user` (group `system:masters`).
    pub async fn driver(user: &str, extra: &[&str]) -> Result<ControllerProcess> {
        Self::spawn("range-driver", &[], user, &["system:masters"], extra).await
    }

    /// Starts the MetalLB driver (`metallb-driver`) as user `user` (group `system:masters`).
    pub async fn metallb_driver(user: &str, extra: &[&str]) -> Result<ControllerProcess> {
        Self::spawn("metallb-driver", &[], user, &["system:masters"], extra).await
    }

    /// The MetalLB driver against the test MetalLB (`metallb::NAMESPACE`), holding its pins
    /// in `holds`, one replica (no election), with `extra` flags.
    pub async fn metallb_driver_holding(
        user: &str,
        holds: &str,
        extra: &[&str],
    ) -> Result<ControllerProcess> {
        let mut args = vec![
            "--leader-elect=false",
            "--metallb-namespace",
            crate::metallb::NAMESPACE,
            "--hold-namespace",
            holds,
        ];
        args.extend_from_slice(extra);
        Self::metallb_driver(user, &args).await
    }

    /// The Cilium driver (`cilium-driver`) as user `user` (group `system:masters`), holding
    /// its addresses in `holds`, one replica unless `extra` says otherwise.
    pub async fn cilium_driver_holding(
        user: &str,
        holds: &str,
        extra: &[&str],
    ) -> Result<ControllerProcess> {
        let mut args = vec!["--hold-namespace", holds];
        if !extra.iter().any(|a| a.starts_with("--leader-elect")) {
            args.push("--leader-elect=false");
        }
        args.extend_from_slice(extra);
        Self::spawn("cilium-driver", &[], user, &["system:masters"], &args).await
    }

    async fn spawn(
        bin: &str,
        pre: &[&str],
        user: &str,
        groups: &[&str],
        extra: &[&str],
    ) -> Result<ControllerProcess> {
        Self::spawn_in(&[], bin, pre, user, groups, extra).await
    }

    async fn spawn_in(
        wrapper: &[&str],
        bin: &str,
        pre: &[&str],
        user: &str,
        groups: &[&str],
        extra: &[&str],
    ) -> Result<ControllerProcess> {
        let cluster = Cluster::get();
        let dir = log_dir()?;
        let kubeconfig = dir.join(format!("{user}.kubeconfig"));
        let admin = std::fs::read_to_string(&cluster.kubeconfig)?;
        // Impersonation keeps admin rights but records the controller's own name.
        let impersonating = admin.replace(
            "  user:\n",
            &format!(
                "  user:\n    as: {user}\n    as-groups: {}\n",
                serde_json::to_string(groups)?
            ),
        );
        std::fs::write(&kubeconfig, impersonating)?;
        let probe = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<String> = pre.iter().map(|s| s.to_string()).collect();
        args.extend(
            [
                "--probe-address",
                &probe,
                "--identity",
                user,
                "--lease-namespace",
                "default",
            ]
            .map(str::to_string),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        let Some((program, before)) = wrapper.split_first() else {
            return Self::launch(bin, user, &kubeconfig, &args, &probe).await;
        };
        let mut argv: Vec<String> = before.iter().map(|s| s.to_string()).collect();
        argv.push(binary(bin).display().to_string());
        argv.extend(args.iter().cloned());
        argv.extend(["--kubeconfig".to_string(), kubeconfig.display().to_string()]);
        Self::launch_program(Path::new(program), user, &argv, None, &args, &probe).await
    }

    /// Starts `bin ARGS --kubeconfig KUBECONFIG` exactly as given — for a process that
    /// must run with its own credentials (a ServiceAccount token) and its own flags.
    /// `probe` is the `--probe-address` among ARGS; returns once `/readyz` answers.
    pub async fn launch(
        bin: &str,
        name: &str,
        kubeconfig: &Path,
        args: &[String],
        probe: &str,
    ) -> Result<ControllerProcess> {
        let mut argv = args.to_vec();
        argv.push("--kubeconfig".into());
        argv.push(kubeconfig.display().to_string());
        Self::launch_program(&binary(bin), name, &argv, None, args, probe).await
    }

    /// Starts `program ARGV` with exactly `env` (none other) — a process started by
    /// something else than the test (a container in a root of its own). `flags` are the
    /// binary's own arguments (where its `--metrics-address` is found); `probe` is where
    /// its probes answer. Returns once `/readyz` answers.
    pub async fn launch_program(
        program: &Path,
        name: &str,
        argv: &[String],
        env: Option<Vec<(String, String)>>,
        flags: &[String],
        probe: &str,
    ) -> Result<ControllerProcess> {
        let dir = log_dir()?;
        let log = dir.join(format!("{name}.log"));
        // A fresh log per name (a restart of the same process appends).
        std::fs::write(&log, "")?;
        let metrics_address = flags.iter().enumerate().find_map(|(i, a)| {
            if a == "--metrics-address" {
                flags.get(i + 1).cloned()
            } else {
                a.strip_prefix("--metrics-address=").map(str::to_string)
            }
        });
        // A server on every interface is reached on loopback.
        let metrics_address = metrics_address
            .filter(|a| !a.is_empty())
            .map(|a| a.replace("0.0.0.0:", "127.0.0.1:"));
        let spawn = Spawn {
            program: program.to_path_buf(),
            args: argv.to_vec(),
            env,
            stderr: dir.join(format!("{name}.stderr.log")),
        };
        let child = spawn.start(&log)?;
        let proc = ControllerProcess {
            user: name.to_string(),
            probe: probe.replace("0.0.0.0:", "127.0.0.1:"),
            metrics_address,
            log,
            child,
            spawn,
        };
        proc.wait_ready().await?;
        Ok(proc)
    }

    /// Starts the process again (same binary, arguments and identity; the log continues)
    /// after it exited or was killed, and waits until it is ready — what a kubelet does.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.child = self.spawn.start(&self.log)?;
        self.wait_ready().await
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self) -> Result<()> {
        let url = format!("http://{}/readyz", self.probe);
        // Every 20 ms, not `wait_for`'s 200: bench-scale times a restart by this wait, and
        // a probe of a loopback port costs nothing.
        wait_for_every(
            &format!("{} ready", self.user),
            Duration::from_secs(30),
            Duration::from_millis(20),
            || {
                let url = url.clone();
                async move { Ok(http_get(&url).await?.0.eq(&200).then_some(())) }
            },
        )
        .await
    }

    /// The text of `/metrics`, read over HTTPS with a token allowed to (the plain probe
    /// port serves probes only).
    pub async fn metrics(&self) -> Result<String> {
        let addr = self
            .metrics_address
            .as_deref()
            .ok_or_else(|| anyhow!("{} serves no /metrics", self.user))?;
        let (code, body) = https_get(&format!("https://{addr}/metrics"), Some(&metrics_token()?))?;
        if code != 200 {
            bail!("GET /metrics of {}: {code}: {body}", self.user);
        }
        Ok(body)
    }

    /// This process as a replica whose gauges the invariant check compares.
    pub fn replica(&self) -> Option<crate::invariants::Replica> {
        let addr = self.metrics_address.as_deref()?;
        Some(crate::invariants::Replica {
            name: self.user.clone(),
            url: format!("https://{addr}/metrics"),
            token: metrics_token().ok()?,
            pid: Some(self.child.id()),
        })
    }

    /// SIGKILL: no cleanup, no lease release — a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait: a clean shutdown. Returns how long the process took to exit.
    pub fn stop(&mut self) -> Duration {
        let t = std::time::Instant::now();
        self.terminate();
        let _ = self.child.wait();
        t.elapsed()
    }

    /// SIGTERM, without waiting for the process to exit.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The exit code once the process has exited by itself (`None` while it runs, or when
    /// a signal ended it).
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child.try_wait().ok().flatten().and_then(|s| s.code())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `/readyz`: (status, body).
    pub async fn readyz(&self) -> Result<(u16, String)> {
        http_get(&format!("http://{}/readyz", self.probe)).await
    }

    /// The end of what the process wrote to stderr (why it exited, when it says).
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.spawn.stderr).unwrap_or_default();
        let start = text.char_indices().rev().nth(2000).map_or(0, |(i, _)| i);
        text[start..].trim().to_string()
    }

    /// Whether the log says `needle`.
    pub fn log_contains(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|l| l.contains(needle))
    }

    /// Lines of the log so far that contain every one of `needles`, colours removed.
    pub fn log_lines(&self, needles: &[&str]) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(without_colours)
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .collect()
    }
}

/// A log line without its ANSI colour sequences (`ESC [ … m`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where test processes write their logs and kubeconfigs.
fn log_dir() -> Result<PathBuf> {
    let dir = repo_root().join("target/test-logs");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The value of one series in a `/metrics` text: `series` is its name and labels exactly as
/// printed; `None` when the text has no such series.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sum of the series in a `/metrics` text whose lines start with `prefix` (a name, or a
/// name and its first labels) and pass `keep` — a counter or gauge over some of its labels.
pub fn sum_samples(metrics: &str, prefix: &str, keep: impl Fn(&str) -> bool) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A minimal HTTP/1.1 GET on loopback: (status, body).
pub async fn http_get(url: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("only http:// URLs"))?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad HTTP response"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A token allowed to `get /metrics` (a ServiceAccount of the harness, made once per test
/// process).
pub fn metrics_token() -> Result<String> {
    static TOKEN: OnceLock<String> = OnceLock::new();
    if let Some(t) = TOKEN.get() {
        return Ok(t.clone());
    }
    let cluster = Cluster::get();
    let objects = [
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "test-metrics-scraper", "namespace": "default"}}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "address-controller-test-metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "address-controller-test-metrics-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "address-controller-test-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "test-metrics-scraper", "namespace": "default"}]}),
    ];
    cluster
        .apply(&objects)
        .context("applying the metrics scraper's RBAC")?;
    let token = cluster
        .kubectl_ok(&[
            "create",
            "token",
            "test-metrics-scraper",
            "-n",
            "default",
            "--duration",
            "24h",
        ])?
        .trim()
        .to_string();
    Ok(TOKEN.get_or_init(|| token).clone())
}

// ---- counting requests ------------------------------------------------------------------

/// One request kube-apiserver finished (`ResponseComplete`), from the cluster's audit log
/// (`deploy/local/cluster.sh` records writes to `local.sdn.cozystack.io` and Service
/// deletes).
#[derive(Debug, Clone)]
pub struct AuditedWrite {
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub code: u16,
    /// The impersonated user (the test processes impersonate their identities), or `""`.
    pub impersonated: String,
    /// The authenticated caller and its user agent.
    pub user: String,
    pub user_agent: String,
    pub received: Option<k8s_openapi::jiff::Timestamp>,
    /// When kube-apiserver finished answering it (the audit's `stageTimestamp`).
    pub completed: Option<k8s_openapi::jiff::Timestamp>,
}

/// Every finished request of the audit log, in order — the one reader of it.
pub fn audit_log() -> Result<Vec<AuditedWrite>> {
    let text = std::fs::read_to_string(Cluster::get().dir.join("logs/audit.log"))?;
    let text_of = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let mut out = Vec::new();
    for line in text.lines() {
        // A line being written as the log is read is skipped, not an error.
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["stage"] != "ResponseComplete" {
            continue;
        }
        let o = &v["objectRef"];
        out.push(AuditedWrite {
            verb: text_of(&v["verb"]),
            resource: text_of(&o["resource"]),
            subresource: o["subresource"].as_str().map(str::to_string),
            namespace: o["namespace"].as_str().map(str::to_string),
            name: o["name"].as_str().map(str::to_string),
            code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            impersonated: text_of(&v["impersonatedUser"]["username"]),
            user: text_of(&v["user"]["username"]),
            user_agent: text_of(&v["userAgent"]),
            received: v["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok()),
            completed: v["stageTimestamp"].as_str().and_then(|t| t.parse().ok()),
        });
    }
    Ok(out)
}

/// Writes to `local.sdn.cozystack.io` made by `user` (impersonated), from the cluster's
/// audit log, kept when `keep` says so.
pub fn audited_writes(
    user: &str,
    keep: impl Fn(&AuditedWrite) -> bool,
) -> Result<Vec<AuditedWrite>> {
    Ok(audit_log()?
        .into_iter()
        .filter(|w| w.impersonated == user && w.resource != "services" && keep(w))
        .collect())
}

/// Runs `cmd` with `stdin` written to its standard input, capturing stdout and stderr.
pub fn output_with_stdin(cmd: &mut Command, stdin: &[u8]) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?
        .write_all(stdin)?;
    child.wait_with_output()
}

// ---- cluster-scoped cleanup ---------------------------------------------------------------

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
pub use address_controller_driver_conformance::suite as conformance;
pub use address_controller_driver_conformance::{
    condense_backtraces, https_get, invariants, process_state, random_suffix, wait_for,
    wait_for_every,
};

pub mod access;
pub mod bench;
pub mod chaos;
pub mod chart;
pub mod cilium;
pub mod env;
pub mod flood;
pub mod image;
pub mod lb;
pub mod metallb;
pub mod migration;
pub mod node;
pub mod packaging;
pub mod wire;
pub mod wire_churn;

/// Fields `line_fields` of `/proc/<pid>/stat` (numbered as in proc(5), from 1), as clock
/// ticks — USER_HZ, 100 on Linux, so 10 ms each.
fn stat_ticks<const N: usize>(pid: u32, line_fields: [usize; N]) -> Result<[u64; N]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (field 2, which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("unreadable /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut out = [0; N];
    for (o, f) in out.iter_mut().zip(line_fields) {
        *o = fields
            .get(f - 3)
            .ok_or_else(|| anyhow!("short stat"))?
            .parse()?;
    }
    Ok(out)
}

/// CPU time (user + system) a process has used, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    // utime and stime.
    let [user, system] = stat_ticks(pid, [14, 15])?;
    Ok(Duration::from_millis((user + system) * 10))
}

/// When a process started, by the wall clock: its start time in clock ticks since boot
/// (`/proc/<pid>/stat`) against the uptime now.
pub fn started_at(pid: u32) -> Result<k8s_openapi::jiff::Timestamp> {
    let [ticks] = stat_ticks(pid, [22])?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")?
        .split_whitespace()
        .next()
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| anyhow!("unreadable /proc/uptime"))?;
    Ok(k8s_openapi::jiff::Timestamp::now()
        - Duration::from_secs_f64((uptime - ticks as f64 / 100.0).max(0.0)))
}

/// Resident memory of a process, from `/proc/<pid>/status`.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow!("no VmRSS for {pid}"))?
        .parse()?;
    Ok(kb * 1024)
}

/// Peak resident memory of a process (`VmHWM`), from `/proc/<pid>/status`.
pub fn peak_rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow!("no VmHWM for {pid}"))?
        .parse()?;
    Ok(kb * 1024)
}

/// Every Go binary the tests use (helm, Prometheus, MetalLB, besides what `cluster.sh up`
/// builds for itself), built once per process — a cache hit takes a moment.
pub fn ensure_binaries() -> Result<()> {
    static BUILT: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = Command::new(repo_root().join("deploy/local/build-binaries.sh"))
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        })
        .clone()
        .map_err(|e| anyhow!("deploy/local/build-binaries.sh: {e}"))
}

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

#[cfg(test)]
mod proc_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn this_process_started_just_now_and_has_used_some_cpu() {
        let pid = std::process::id();
        let started = started_at(pid).unwrap();
        let ago = k8s_openapi::jiff::Timestamp::now().duration_since(started);
        // A wrong field (the boot time, a zero) would be hours off, or in the future.
        assert!(
            ago.as_secs_f64() > -0.05 && ago.as_secs() < 600,
            "started {ago:?} ago"
        );
        // Spin until 30 ms of CPU show, for at most 5 s of wall clock (a loaded machine
        // gives this thread less than its wall time): a wrong field (zero, another
        // process's) never shows them.
        let before = cpu_time(pid).unwrap();
        let spin = std::time::Instant::now();
        while cpu_time(pid).unwrap() < before + Duration::from_millis(30)
            && spin.elapsed() < Duration::from_secs(5)
        {}
        assert!(cpu_time(pid).unwrap() >= before + Duration::from_millis(30));
    }
}
