//! The Kubernetes client, with every call bounded in time.
//!
//! kube's default client has no read timeout: a call to an API server that stops answering
//! hangs forever. Here every request must get its response headers within `--api-timeout`
//! (a tower timeout around the whole stack; a watch gets its headers at once and then
//! streams), and no read on a connection may stall longer than `--api-read-timeout`
//! (watches hear a bookmark about every minute, so this must stay above that).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kube::client::ClientBuilder;
use kube::{Client, Config};

/// How to reach the API server.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Kubernetes API")]
pub struct ClientArgs {
    /// Kubeconfig to use. Without it, $KUBECONFIG as kubectl reads it (a list of files, the
    /// first to set a value wins, missing files are skipped), else ~/.kube/config, else the
    /// in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Longest wait for the response to one API request (a watch: for its first byte).
    #[arg(long, env = "ADDRESS_CONTROLLER_API_TIMEOUT", default_value = "30s", value_parser = address_controller_api::duration::parse)]
    pub api_timeout: Duration,
    /// Longest pause between two reads on an API connection (must exceed the ~1 min between
    /// watch bookmarks).
    #[arg(long, env = "ADDRESS_CONTROLLER_API_READ_TIMEOUT", default_value = "150s", value_parser = address_controller_api::duration::parse)]
    pub api_read_timeout: Duration,
}

impl Default for ClientArgs {
    fn default() -> Self {
        ClientArgs {
            kubeconfig: None,
            api_timeout: Duration::from_secs(30),
            api_read_timeout: Duration::from_secs(150),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("inferring the client configuration: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("building the client: {0}")]
    Build(#[from] kube::Error),
}

/// $KUBECONFIG merged as kubectl merges it: a path list, empty entries and files that do
/// not exist skipped, the first file to set a value wins. `None` when it names no existing
/// file (then kube's inference: ~/.kube/config, in-cluster).
fn kubeconfig_from_env() -> Result<Option<(Vec<PathBuf>, kube::config::Kubeconfig)>, ClientError> {
    let Some(value) = std::env::var_os("KUBECONFIG") else {
        return Ok(None);
    };
    let paths: Vec<PathBuf> = std::env::split_paths(&value)
        .filter(|p| !p.as_os_str().is_empty() && p.exists())
        .collect();
    if paths.is_empty() {
        return Ok(None);
    }
    let mut merged = kube::config::Kubeconfig::default();
    for p in &paths {
        let kc =
            kube::config::Kubeconfig::read_from(p).map_err(|source| ClientError::Kubeconfig {
                path: p.clone(),
                source,
            })?;
        merged = merged.merge(kc).map_err(|source| ClientError::Kubeconfig {
            path: p.clone(),
            source,
        })?;
    }
    Ok(Some((paths, merged)))
}

impl ClientArgs {
    /// The client configuration, timeouts applied.
    pub async fn config(&self) -> Result<Config, ClientError> {
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                    ClientError::Kubeconfig {
                        path: path.clone(),
                        source,
                    }
                })?;
                Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|source| ClientError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            None => match kubeconfig_from_env()? {
                Some((paths, kc)) => {
                    Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                        .await
                        .map_err(|source| ClientError::Kubeconfig {
                            path: std::env::join_paths(&paths)
                                .map_or_else(|_| PathBuf::new(), PathBuf::from),
                            source,
                        })?
                }
                None => Config::infer().await?,
            },
        };
        config.connect_timeout = Some(self.api_timeout.min(Duration::from_secs(10)));
        config.read_timeout = Some(self.api_read_timeout);
        // The read timeout counts from the request, not from when a pooled connection
        // went idle.
        config.reset_reader_on_write = true;
        config.write_timeout = Some(self.api_timeout);
        Ok(config)
    }

    /// A client whose every request is bounded (see the module documentation).
    pub async fn client(&self) -> Result<Client, ClientError> {
        let config = self.config().await?;
        Ok(ClientBuilder::try_from(config)?
            .with_layer(&tower::timeout::TimeoutLayer::new(self.api_timeout))
            .build())
    }
}
