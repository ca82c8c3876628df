//! websubd: the hub service. Loads its configuration in layers (the
//! defaults, then the TOML file of `--config` / `WEBSUB_CONFIG`, then the
//! `WEBSUB_*` environment, then the flags; later layers win, and outbox
//! feeds come from the file's `[[feed]]` tables), validates once, binds,
//! and runs the hub until Ctrl-C or SIGTERM, then drains. SIGHUP reloads
//! the feeds' webhooks files. The settings and their layering are
//! `websub_hub::config`'s; this binary only hands them its arguments and
//! environment.

/// Delivery allocates and frees many small buffers per request; mimalloc
/// serves them with less contention and less CPU than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use metrics_exporter_prometheus::PrometheusHandle;
use tracing_subscriber::EnvFilter;
use websub_hub::config::{CommandLine, LoadError, LogFormat};
use websub_hub::telemetry;

/// The bare command: its name, version and about; the settings are added by
/// [`CommandLine::load`].
fn command() -> clap::Command {
    clap::Command::new("websubd")
        .version(env!("CARGO_PKG_VERSION"))
        .about("A WebSub hub that is also the delivery end of a transactional outbox.")
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = match CommandLine::load(command(), std::env::args_os(), |name| {
        std::env::var_os(name)
    }) {
        Ok(config) => config,
        // Help and version go to stdout with status 0, usage errors to
        // stderr with status 2.
        Err(LoadError::Command(error)) => error.exit(),
        Err(error) => {
            eprintln!("websubd: {error}");
            return ExitCode::from(2);
        }
    };
    log_to_stderr(config.log_format);
    let (metrics, exports) = match start_exports(&config).await {
        Ok(started) => started,
        Err(error) => {
            eprintln!("websubd: {error}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("websubd: cannot listen on {}: {error}", config.listen);
            return ExitCode::from(1);
        }
    };
    let hub = match websub_hub::server::Hub::open(config).await {
        Ok(hub) => hub,
        Err(error) => {
            eprintln!("websubd: {error}");
            return ExitCode::from(1);
        }
    };
    let hub = hub.with_metrics(metrics);
    reload_on_hangup(hub.feed_reloader());
    let ran = hub.run(listener, shutdown_signal()).await;
    // The exporters block while they send what is left.
    let _ = tokio::task::spawn_blocking(move || exports.shutdown()).await;
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("websubd: {error}");
            ExitCode::from(1)
        }
    }
}

/// What websubd exports over OTLP when the environment names a collector.
struct Exports {
    traces: Option<telemetry::Exporting>,
    metrics: Option<telemetry::Exporting>,
}

impl Exports {
    fn shutdown(self) {
        if let Some(traces) = self.traces {
            traces.shutdown();
        }
        if let Some(metrics) = self.metrics {
            metrics.shutdown();
        }
    }
}

/// The metrics recorder, and the traces and metrics exported over OTLP
/// when the environment names a collector. The exporters' client is a
/// blocking one, made (and later dropped) off the runtime.
async fn start_exports(
    config: &websub_hub::HubConfig,
) -> Result<(PrometheusHandle, Exports), String> {
    let trust = config.trust().map_err(|error| error.to_string())?;
    tokio::task::spawn_blocking(move || {
        let var = |name: &str| std::env::var(name).ok();
        let traces =
            telemetry::traces::start_from_env(&var, &trust).map_err(|error| error.to_string())?;
        let (handle, metrics) =
            telemetry::meters::install(&var, &trust).map_err(|error| error.to_string())?;
        Ok((handle, Exports { traces, metrics }))
    })
    .await
    .map_err(|error| error.to_string())?
}

/// Log lines go to stderr, filtered by `RUST_LOG` (info by default), as
/// text or as one JSON object per line with the fields of their spans.
fn log_to_stderr(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => lines
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
}

/// On SIGHUP, the outbox feeds read their webhooks files again.
fn reload_on_hangup(reloader: websub_hub::server::FeedReloader) {
    #[cfg(unix)]
    tokio::spawn(async move {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(mut hangups) => {
                while hangups.recv().await.is_some() {
                    tracing::info!("SIGHUP: reloading the webhooks files");
                    reloader.reload();
                }
            }
            Err(error) => tracing::warn!(%error, "cannot listen for SIGHUP"),
        }
    });
    #[cfg(not(unix))]
    drop(reloader);
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested");
}
