//! The container image in tests: building it (`deploy/image/build.sh`, what `make image`
//! runs), unpacking its OCI archive (checking every blob against its digest), and running a
//! container from the unpacked root the way a kubelet and a container runtime would: the
//! pod's user, its environment (downward API resolved, the kubelet's service variables),
//! a read-only root, and no files but the pod's volumes and the ServiceAccount token —
//! with `unshare` and `chroot`, as root (there is no container engine here).

#![allow(clippy::unwrap_used)] // test support: a failed step fails the test loudly

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::chart::{create_token, installed_container};
use crate::env::{b64decode, tempdir};
use crate::{Cluster, ControllerProcess, TempDir, repo_root};

/// The chart's appVersion: the image's tag.
pub fn app_version() -> String {
    let chart =
        std::fs::read_to_string(repo_root().join("chart/address-controller/Chart.yaml")).unwrap();
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .unwrap()
        .trim()
        .trim_matches('"')
        .to_string()
}

/// What the kernel says about a process (`/proc/PID/status`), field by field.
pub fn proc_status(pid: u32) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// A process's NUL-separated `/proc/PID/<file>` (`cmdline`, `environ`) as strings.
pub fn proc_strings(pid: u32, file: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/{file}"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The command line a container of `pod_spec` runs: its `command` (else the image's
/// entrypoint, `entrypoint`) followed by its `args`.
pub fn container_argv(container: &Value, entrypoint: &str) -> Vec<String> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut argv = match container.get("command") {
        Some(c) if c.is_array() => strings(c),
        _ => vec![entrypoint.to_string()],
    };
    argv.extend(strings(&container["args"]));
    argv
}

/// What `deploy/image/build.sh --out DIR` made.
pub struct Built {
    pub archive: PathBuf,
    pub sbom: PathBuf,
    /// The manifest digest, `sha256:…`.
    pub digest: String,
    /// What the build printed (image reference, sizes, counts).
    pub output: String,
}

/// Runs the image build into `out` with extra environment variables.
pub fn build(out: &Path, envs: &[(&str, &str)]) -> Result<Built> {
    let result = Command::new(repo_root().join("deploy/image/build.sh"))
        .arg("--out")
        .arg(out)
        .envs(envs.iter().copied())
        .output()
        .context("running deploy/image/build.sh")?;
    if !result.status.success() {
        bail!(
            "deploy/image/build.sh: {}\n{}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        );
    }
    let find = |suffix: &str| -> Result<PathBuf> {
        std::fs::read_dir(out)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(suffix))
            .ok_or_else(|| anyhow!("no *{suffix} in {}", out.display()))
    };
    Ok(Built {
        archive: find(".oci.tar")?,
        sbom: find(".spdx.json")?,
        digest: std::fs::read_to_string(find(".digest")?)?
            .trim()
            .to_string(),
        output: String::from_utf8_lossy(&result.stdout).into_owned(),
    })
}

/// An unpacked image: its index, manifest and config, and its root (every layer applied).
pub struct Unpacked {
    pub dir: TempDir,
    pub root: PathBuf,
    pub index: Value,
    pub manifest: Value,
    pub config: Value,
}

fn sha256_file(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(path).output()?;
    let text = String::from_utf8(out.stdout)?;
    Ok(format!(
        "sha256:{}",
        text.split_whitespace().next().unwrap_or_default()
    ))
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Unpacks an OCI archive: every blob read is checked against its digest, every layer
/// against its diff_id.
pub fn unpack(archive: &Path) -> Result<Unpacked> {
    let dir = tempdir();
    let layout = dir.join("layout");
    let root = dir.join("root");
    std::fs::create_dir_all(&layout)?;
    std::fs::create_dir_all(&root)?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout))?;
    let blob = |digest: &str| -> Result<PathBuf> {
        let path = layout.join("blobs/sha256").join(
            digest
                .strip_prefix("sha256:")
                .ok_or_else(|| anyhow!("digest {digest}"))?,
        );
        let got = sha256_file(&path)?;
        if got != digest {
            bail!("blob {digest} has digest {got}");
        }
        Ok(path)
    };
    let json = |p: &Path| -> Result<Value> { Ok(serde_json::from_slice(&std::fs::read(p)?)?) };
    let index = json(&layout.join("index.json"))?;
    let manifest = json(&blob(
        index["manifests"][0]["digest"].as_str().unwrap_or(""),
    )?)?;
    let config = json(&blob(manifest["config"]["digest"].as_str().unwrap_or(""))?)?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    for (i, layer) in layers.iter().enumerate() {
        if layer["mediaType"] != "application/vnd.oci.image.layer.v1.tar+gzip" {
            bail!("layer {i}: media type {}", layer["mediaType"]);
        }
        let path = blob(layer["digest"].as_str().unwrap_or(""))?;
        let raw = dir.join(format!("layer-{i}.tar"));
        let status = Command::new("sh")
            .arg("-c")
            .arg(r#"gzip -dc "$1" > "$2""#)
            .arg("sh")
            .arg(&path)
            .arg(&raw)
            .status()?;
        if !status.success() {
            bail!("gunzip layer {i}");
        }
        let diff_id = sha256_file(&raw)?;
        if Some(diff_id.as_str()) != config["rootfs"]["diff_ids"][i].as_str() {
            bail!(
                "layer {i}: diff_id {diff_id}, config says {}",
                config["rootfs"]["diff_ids"][i]
            );
        }
        run(Command::new("tar")
            .args(["-xf"])
            .arg(&raw)
            .args([
                "--numeric-owner",
                "--same-owner",
                "--same-permissions",
                "-C",
            ])
            .arg(&root))?;
        std::fs::remove_file(&raw)?;
    }
    Ok(Unpacked {
        dir,
        root,
        index,
        manifest,
        config,
    })
}

/// Every path in `root` (relative, sorted), directories included.
pub fn walk(root: &Path) -> Vec<(String, std::fs::Metadata)> {
    fn go(base: &Path, dir: &Path, out: &mut Vec<(String, std::fs::Metadata)>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            out.push((rel, meta.clone()));
            if meta.is_dir() {
                go(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    go(root, root, &mut out);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A program of the host, by absolute path (the container's environment has no PATH to
/// find it by once `env -i` cleared it).
fn host_tool(name: &str) -> Result<String> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .map(|p| p.display().to_string())
        .ok_or_else(|| anyhow!("{name} is not installed"))
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A pod of a Deployment the chart installed in `namespace`, run from `image` as a
/// container runtime would.
pub struct Container<'a> {
    pub image: &'a Unpacked,
    pub namespace: &'a str,
    pub deployment: &'a str,
    /// The pod's name (what `metadata.name` resolves to).
    pub pod: &'a str,
}

/// A running container: the process (its `unshare`), and what it was given.
pub struct Running {
    pub process: ControllerProcess,
    /// The command line and environment handed to the binary.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The container's own copy of the image root and its volumes (removed on drop).
    pub dir: TempDir,
}

impl Container<'_> {
    pub async fn start(&self) -> Result<Running> {
        // Mounts and chroot need root; without it this cannot run (and must not pass).
        let status = std::fs::read_to_string("/proc/self/status")?;
        if !status.lines().any(|l| l.starts_with("Uid:\t0\t")) {
            bail!("running a container from the image needs root (unshare, mount, chroot)");
        }
        let cluster = Cluster::get();
        let deploy: Value = serde_json::from_str(&cluster.kubectl_ok(&[
            "get",
            "deployment",
            self.deployment,
            "-n",
            self.namespace,
            "-o",
            "json",
        ])?)?;
        let pod = &deploy["spec"]["template"]["spec"];
        let c = installed_container(self.namespace, self.deployment);
        let image = &self.image.config["config"];
        let dir = tempdir();
        // Each container gets its own copy of the root, as an overlay would give it.
        let root = dir.join("root");
        run(Command::new("cp")
            .arg("-a")
            .arg(&self.image.root)
            .arg(&root))?;

        // Kubernetes' rules: `command` replaces the entrypoint (and drops the image's
        // Cmd), `args` replaces Cmd.
        let strings = |v: &Value| -> Option<Vec<String>> {
            v.as_array().map(|a| {
                a.iter()
                    .map(|s| s.as_str().unwrap_or_default().to_string())
                    .collect()
            })
        };
        let (command, args) = match (strings(&c["command"]), strings(&c["args"])) {
            (Some(cmd), args) => (cmd, args.unwrap_or_default()),
            (None, args) => (
                strings(&image["Entrypoint"]).unwrap_or_default(),
                args.or_else(|| strings(&image["Cmd"])).unwrap_or_default(),
            ),
        };
        let argv: Vec<String> = command.iter().chain(&args).cloned().collect();

        // The environment: the image's, the container's (downward API resolved), the
        // kubelet's service variables for the API server, HOSTNAME.
        let port = cluster.env_var("KUBE_APISERVER_PORT")?;
        let mut env: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| {
            env.retain(|(x, _)| x != k);
            env.push((k.to_string(), v));
        };
        for kv in strings(&image["Env"]).unwrap_or_default() {
            let (k, v) = kv.split_once('=').unwrap_or((&kv, ""));
            set(k, v.to_string());
        }
        set("HOSTNAME", self.pod.to_string());
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", port.clone()),
            ("KUBERNETES_SERVICE_PORT_HTTPS", port.clone()),
            ("KUBERNETES_PORT", format!("tcp://127.0.0.1:{port}")),
        ] {
            set(k, v);
        }
        for e in c["env"].as_array().cloned().unwrap_or_default() {
            let name = e["name"].as_str().unwrap_or_default();
            let value = if let Some(v) = e["value"].as_str() {
                v.to_string()
            } else {
                match (
                    e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
                    e["valueFrom"]["resourceFieldRef"]["resource"].as_str(),
                ) {
                    (Some("metadata.name"), _) => self.pod.to_string(),
                    (Some("metadata.namespace"), _) => self.namespace.to_string(),
                    // The downward API gives the container's limit in bytes (divisor 1).
                    (_, Some("limits.memory")) => {
                        let limit = c["resources"]["limits"]["memory"]
                            .as_str()
                            .unwrap_or_default();
                        quantity_bytes(limit)
                            .ok_or_else(|| anyhow!("env {name}: the container's memory limit {limit:?} is not a quantity emulated here"))?
                            .to_string()
                    }
                    _ => bail!("env {name}: {} is not emulated here", e["valueFrom"]),
                }
            };
            set(name, value);
        }

        // The user: the container's securityContext, else the pod's, else the image's.
        let sc = &c["securityContext"];
        let psc = &pod["securityContext"];
        let image_user = image["User"].as_str().unwrap_or("0:0").to_string();
        let (image_uid, image_gid) = image_user.split_once(':').unwrap_or((&image_user, "0"));
        let uid = sc["runAsUser"]
            .as_u64()
            .or(psc["runAsUser"].as_u64())
            .map_or(image_uid.to_string(), |u| u.to_string());
        let gid = sc["runAsGroup"]
            .as_u64()
            .or(psc["runAsGroup"].as_u64())
            .map_or(image_gid.to_string(), |g| g.to_string());
        if psc["runAsNonRoot"] == true && uid == "0" {
            bail!("runAsNonRoot, and the image runs as root");
        }

        // Volumes: the container's mounts of Secret volumes, and the ServiceAccount token
        // the kubelet projects into every pod that does not opt out.
        let volumes = dir.join("volumes");
        let mut mounts: Vec<(PathBuf, String, bool)> = Vec::new();
        for m in c["volumeMounts"].as_array().cloned().unwrap_or_default() {
            let name = m["name"].as_str().unwrap_or_default();
            let volume = pod["volumes"]
                .as_array()
                .and_then(|vs| vs.iter().find(|v| v["name"] == name))
                .ok_or_else(|| anyhow!("volume {name} not in the pod"))?;
            let secret = volume["secret"]["secretName"]
                .as_str()
                .ok_or_else(|| anyhow!("volume {name}: only Secret volumes are emulated"))?;
            let host = volumes.join(name);
            std::fs::create_dir_all(&host)?;
            let s: Value = serde_json::from_str(&cluster.kubectl_ok(&[
                "get",
                "secret",
                secret,
                "-n",
                self.namespace,
                "-o",
                "json",
            ])?)?;
            for (key, value) in s["data"].as_object().cloned().unwrap_or_default() {
                std::fs::write(
                    host.join(&key),
                    b64decode(value.as_str().unwrap_or_default()),
                )?;
            }
            mounts.push((
                host,
                m["mountPath"].as_str().unwrap_or_default().to_string(),
                true,
            ));
        }
        if pod["automountServiceAccountToken"] != false {
            let sa = pod["serviceAccountName"].as_str().unwrap_or("default");
            let host = volumes.join("kube-api-access");
            std::fs::create_dir_all(&host)?;
            std::fs::write(host.join("token"), create_token(sa, self.namespace))?;
            std::fs::copy(cluster.dir.join("pki/ca.crt"), host.join("ca.crt"))?;
            std::fs::write(host.join("namespace"), self.namespace)?;
            mounts.push((
                host,
                "/var/run/secrets/kubernetes.io/serviceaccount".to_string(),
                true,
            ));
        }
        // Files every runtime gives a container.
        let etc = dir.join("etc");
        std::fs::create_dir_all(&etc)?;
        for (f, text) in [
            (
                "hosts",
                "127.0.0.1\tlocalhost\n::1\tlocalhost\n".to_string(),
            ),
            ("hostname", format!("{}\n", self.pod)),
            ("resolv.conf", "nameserver 127.0.0.1\n".to_string()),
        ] {
            std::fs::write(etc.join(f), text)?;
            mounts.push((etc.join(f), format!("/etc/{f}"), true));
        }

        // Mount points are made in the container's root before it becomes read-only, as
        // runc does.
        let mut script = String::from("set -e\n");
        let r = root.to_str().unwrap();
        script += &format!("mount --bind {0} {0}\n", quote(r));
        std::fs::create_dir_all(root.join("proc"))?;
        script += &format!("mount -t proc proc {}\n", quote(&format!("{r}/proc")));
        std::fs::create_dir_all(root.join("dev"))?;
        for d in ["null", "zero", "full", "random", "urandom"] {
            std::fs::write(root.join("dev").join(d), "")?;
            script += &format!("mount --bind /dev/{d} {}\n", quote(&format!("{r}/dev/{d}")));
        }
        for (host, target, ro) in &mounts {
            let at = root.join(target.trim_start_matches('/'));
            if host.is_dir() {
                std::fs::create_dir_all(&at)?;
            } else {
                std::fs::create_dir_all(at.parent().unwrap())?;
                std::fs::write(&at, "")?;
            }
            let at = at.to_str().unwrap();
            script += &format!(
                "mount --bind {} {}\n",
                quote(host.to_str().unwrap()),
                quote(at)
            );
            if *ro {
                script += &format!("mount -o remount,bind,ro {}\n", quote(at));
            }
        }
        if sc["readOnlyRootFilesystem"] == true {
            script += &format!("mount -o remount,bind,ro {}\n", quote(r));
        }
        script += &format!("exec {} -i", host_tool("env")?);
        for (k, v) in &env {
            script += &format!(" {}", quote(&format!("{k}={v}")));
        }
        if sc["allowPrivilegeEscalation"] == false {
            script += &format!(" {} --no-new-privs", host_tool("setpriv")?);
        }
        script += &format!(
            " {} --userspec={uid}:{gid} --groups={gid} {}",
            host_tool("chroot")?,
            quote(r)
        );
        for a in &argv {
            script += &format!(" {}", quote(a));
        }
        script += "\n";

        let probe = args
            .iter()
            .find_map(|a| a.strip_prefix("--probe-address="))
            .ok_or_else(|| anyhow!("the container has no --probe-address"))?
            .to_string();
        let unshare_args: Vec<String> = [
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            &script,
        ]
        .map(str::to_string)
        .to_vec();
        let process = ControllerProcess::launch_program(
            Path::new("/usr/bin/unshare"),
            self.pod,
            &unshare_args,
            Some(vec![(
                "PATH".to_string(),
                "/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            )]),
            &args,
            &probe,
        )
        .await?;
        Ok(Running {
            process,
            argv,
            env,
            dir,
        })
    }
}

/// The process of the binary in a container: the child of `unshare`'s child (the shell
/// execs env, setpriv, chroot and the binary in turn), found by its parent.
pub fn container_pid(unshare: u32) -> Option<u32> {
    let children = |pid: u32| -> Vec<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    children(unshare).into_iter().next()
}

/// A memory quantity as the downward API turns it into bytes (`512Mi`, `1Gi`, `100M`, bytes).
fn quantity_bytes(q: &str) -> Option<u64> {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let n: u64 = n.parse().ok()?;
    let f: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(f)
}
