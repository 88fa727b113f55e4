//! `address-controller`: one binary for the core controller and the aggregated API server.
//! Until those land (issues #3 and #4) it carries the generator of the committed manifests.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "address-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the generated manifests (CRDs) into the chart. `make manifests` runs this.
    Manifests {
        /// Directory the CRD YAML files are written to.
        #[arg(long, default_value = "chart/address-controller/crds")]
        crds_dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Manifests { crds_dir } => write_manifests(&crds_dir),
    }
}

fn write_manifests(crds_dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(crds_dir)
        .with_context(|| format!("creating {}", crds_dir.display()))?;
    for (name, yaml) in address_controller_api::manifests::crd_files()? {
        let path = crds_dir.join(name);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
