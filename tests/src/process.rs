//! The project's binaries under test: built once ([`ensure_binaries`], [`binary`]), run
//! as a controller of the test's own ([`ControllerProcess`]) on free loopback ports, the
//! CLI and kubectl as the cluster's admin.

use super::*;

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
        Self::spawn_in(&[], "range-driver", &[], user, &["system:masters"], extra).await
    }

    /// Starts the MetalLB driver (`metallb-driver`) as user `user` (group `system:masters`).
    pub async fn metallb_driver(user: &str, extra: &[&str]) -> Result<ControllerProcess> {
        Self::spawn_in(&[], "metallb-driver", &[], user, &["system:masters"], extra).await
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
        Self::spawn_in(&[], "cilium-driver", &[], user, &["system:masters"], &args).await
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
