//! Logs: `tracing`, plain or JSON, filtered by `RUST_LOG`.

use clap::{Args, ValueEnum};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Logs")]
pub struct LogArgs {
    /// Log format (filter with RUST_LOG).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

impl LogArgs {
    pub fn init(&self) {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let builder = tracing_subscriber::fmt().with_env_filter(filter);
        match self.log_format {
            LogFormat::Plain => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
    }
}
