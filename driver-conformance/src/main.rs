//! `driver-conformance`: the driver conformance suite against any cluster where the core
//! controller and the driver run. See `docs/drivers.md`.
//!
//! ```text
//! driver-conformance --class NAME [--kubeconfig FILE] [--timeout 60s]
//!                    [--invalid-parameters JSON] [--race-address IP]
//!                    [--restart-command 'kubectl -n X rollout restart deploy/Y']
//!                    [--lose-parameters JSON] [--associate [--service-class LB]]
//! ```
//!
//! Prints a line per case and `N passed, N failed, N skipped`; exits 1 when a case fails.

use std::time::Duration;

use address_controller_driver_conformance::suite::{Options, Restart, run};
use anyhow::{Context, Result, bail};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut kubeconfig, mut class, mut invalid, mut race, mut restart) =
        (None, None, None, None, None);
    let (mut lose, mut associate, mut service_class) = (None, false, None);
    let mut timeout = Duration::from_secs(60);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--kubeconfig" => kubeconfig = Some(value()?),
            "--class" => class = Some(value()?),
            "--invalid-parameters" => {
                invalid =
                    Some(serde_json::from_str(&value()?).context("--invalid-parameters is JSON")?)
            }
            "--race-address" => race = Some(value()?),
            "--lose-parameters" => {
                lose = Some(serde_json::from_str(&value()?).context("--lose-parameters is JSON")?)
            }
            "--associate" => associate = true,
            "--service-class" => service_class = Some(value()?),
            "--restart-command" => restart = Some(value()?),
            "--timeout" => {
                let v = value()?;
                timeout = address_controller_api::duration::parse(&v)
                    .map_err(|e| anyhow::anyhow!("{v}: {e}"))?;
            }
            "-h" | "--help" => {
                let help: String = include_str!("main.rs")
                    .lines()
                    .take(11)
                    .map(|l| format!("{}\n", l.trim_start_matches("//!").trim_start_matches(' ')))
                    .collect();
                // A closed pipe (`| head`) is not an error.
                let _ = std::io::Write::write_all(&mut std::io::stdout(), help.as_bytes());
                return Ok(());
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let class =
        class.context("--class NAME is required: a class of the driver set aside for the suite")?;
    let config = match kubeconfig {
        Some(path) => {
            kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::read_from(path)?,
                &Default::default(),
            )
            .await?
        }
        None => kube::Config::infer().await?,
    };
    let client = kube::Client::try_from(config)?;
    let restart: Option<Restart> = restart.map(|cmd: String| -> Restart {
        Box::new(move || {
            let cmd = cmd.clone();
            Box::pin(async move {
                let status = tokio::process::Command::new("sh")
                    .args(["-c", &cmd])
                    .status()
                    .await?;
                if !status.success() {
                    bail!("{cmd}: {status}");
                }
                Ok(())
            })
        })
    });
    let report = run(
        &client,
        &Options {
            class,
            invalid_parameters: invalid,
            restart,
            race_address: race,
            timeout,
            lose_parameters: lose,
            associate,
            service_class,
        },
    )
    .await?;
    print!("{}", report.table());
    if !report.ok() {
        std::process::exit(1);
    }
    Ok(())
}
