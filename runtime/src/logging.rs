//! Logs: `tracing`, plain or JSON, filtered by `--log-level` or `RUST_LOG`.

use clap::{Args, ValueEnum};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Logs")]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "ADDRESS_CONTROLLER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// What to log: a level (error, warn, info, debug, trace) or RUST_LOG's directives
    /// (`info,address_controller_controller=debug`). Given, it wins over RUST_LOG
    /// [default: RUST_LOG, else info].
    #[arg(long, env = "ADDRESS_CONTROLLER_LOG_LEVEL", value_parser = parse_filter)]
    pub log_level: Option<String>,
}

fn parse_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{s:?} is not a log level or filter: {e}"))
}

impl LogArgs {
    pub fn init(&self) {
        let filter = match &self.log_level {
            Some(level) => tracing_subscriber::EnvFilter::new(level),
            None => tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        };
        let builder = tracing_subscriber::fmt().with_env_filter(filter);
        match self.log_format {
            LogFormat::Plain => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
    }
}
