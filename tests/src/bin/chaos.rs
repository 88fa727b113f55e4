//! `make chaos`: the chaos suite on a fresh local control plane of its own.
//!
//!     chaos [--duration 10m] [--driver range|metallb|cilium]
//!
//! Prints what it did, the failover figures and the invariants table; exits 1 on any
//! violation.

use std::time::Duration;

use address_controller_tests::chaos::{Config, run};
use address_controller_tests::{TempDir, repo_root};
use anyhow::{Context, Result, bail};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut duration = Duration::from_secs(600);
    let mut driver = address_controller_tests::chaos::Driver::Range;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--duration" => {
                let v = args.next().context("--duration needs a value")?;
                duration = address_controller_api::duration::parse(&v)
                    .map_err(|e| anyhow::anyhow!("{v}: {e}"))?;
            }
            "--driver" => {
                driver = match args.next().as_deref() {
                    Some("range") => address_controller_tests::chaos::Driver::Range,
                    Some("metallb") => address_controller_tests::chaos::Driver::MetalLb,
                    Some("cilium") => address_controller_tests::chaos::Driver::Cilium,
                    other => bail!("--driver range|metallb|cilium, not {other:?}"),
                }
            }
            other => {
                bail!(
                    "unknown argument {other} (expected --duration D, --driver range|metallb|cilium)"
                )
            }
        }
    }
    // A cluster of its own, stopped when this process ends (even when it is killed).
    let dir = TempDir::new("ac-chaos");
    let script = repo_root().join("deploy/local/cluster.sh");
    let pid = std::process::id().to_string();
    let status = std::process::Command::new(&script)
        .args(["up", dir.to_str().unwrap_or_default(), "--watch-pid", &pid])
        .stdout(std::process::Stdio::null())
        .status()?;
    if !status.success() {
        bail!("starting the local control plane failed");
    }
    address_controller_tests::Cluster::use_dir(&dir)?;
    let mut cfg = Config::full(duration);
    cfg.driver = driver;
    let outcome = run(&cfg).await;
    let _ = std::process::Command::new(&script)
        .args(["down", dir.to_str().unwrap_or_default()])
        .status();
    let outcome = outcome?;
    println!("{}", outcome.summary());
    if !outcome.ok() {
        std::process::exit(1);
    }
    Ok(())
}
