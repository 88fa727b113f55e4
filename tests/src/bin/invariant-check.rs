//! `invariant-check`: checks the ledger's invariants on any cluster and prints the table.
//! Exits 1 when something is violated.
//!
//! ```text
//! invariant-check [--kubeconfig FILE] [--settle 30s] [--namespace NS]... [--class C]...
//!                 [--metrics https://HOST:PORT/metrics]... [--token-file FILE]
//! ```

use std::time::Duration;

use address_controller_tests::invariants::{Replica, Scope, check};
use anyhow::{Context, Result, bail};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut kubeconfig = None;
    let mut settle = Duration::from_secs(30);
    let (mut namespaces, mut classes, mut metrics) = (Vec::new(), Vec::new(), Vec::new());
    let mut token = String::new();
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--kubeconfig" => kubeconfig = Some(value()?),
            "--settle" => settle = parse_duration(&value()?)?,
            "--namespace" => namespaces.push(value()?),
            "--class" => classes.push(value()?),
            "--metrics" => metrics.push(value()?),
            "--token-file" => token = std::fs::read_to_string(value()?)?.trim().to_string(),
            "-h" | "--help" => {
                println!(
                    "{}",
                    include_str!("invariant-check.rs")
                        .lines()
                        .skip(3)
                        .take(2)
                        .map(|l| l.trim_start_matches("//!"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                return Ok(());
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let client = kube::Client::try_from(config)?;
    let scope = Scope {
        namespaces: (!namespaces.is_empty()).then(|| namespaces.into_iter().collect()),
        classes: (!classes.is_empty()).then(|| classes.into_iter().collect()),
    };
    let replicas: Vec<Replica> = metrics
        .into_iter()
        .map(|url| Replica {
            name: url.clone(),
            url,
            token: token.clone(),
            pid: None,
        })
        .collect();
    let report = check(&client, &scope, settle, &replicas).await?;
    print!("{}", report.table());
    if !report.ok() {
        std::process::exit(1);
    }
    Ok(())
}

fn parse_duration(s: &str) -> Result<Duration> {
    address_controller_api::duration::parse(s).map_err(|e| anyhow::anyhow!("{s}: {e}"))
}
