//! The `switchboard` command: parse arguments, set up logging, run.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use switchboard::Config;

#[derive(Parser)]
#[command(name = "switchboard", version, about = "A multi-tenant router for the Model Context Protocol")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the router.
    Serve {
        /// The configuration file (TOML).
        #[arg(long, short, default_value = "switchboard.toml")]
        config: PathBuf,
        /// Listen here instead of server.listen.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Bridge a local MCP client that speaks stdio to a router (or any MCP
    /// server) over Streamable HTTP.
    Connect {
        /// The MCP endpoint, e.g. http://127.0.0.1:8080/mcp.
        url: http::Uri,
        /// An extra request header, "Name: value" (repeatable), e.g. an API key.
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Longest wait for one answer.
        #[arg(long, default_value = "300s")]
        timeout: String,
    },
    /// Validate a configuration file and print what it configures.
    CheckConfig {
        /// The configuration file (TOML).
        file: PathBuf,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => {
            let config = Config::load(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            println!("{}: ok", file.display());
            println!("listen: {}", config.server.listen);
            for u in &config.upstreams {
                let how = match &u.transport {
                    switchboard::config::TransportConfig::Http(h) => format!("http {}", h.url),
                    switchboard::config::TransportConfig::Stdio(s) => {
                        format!("stdio {} {}", s.command, s.args.join(" "))
                    }
                    switchboard::config::TransportConfig::Sse(h) => format!("sse {}", h.url),
                };
                let prefix =
                    if u.prefix.is_empty() { "(no prefix)".to_owned() } else { format!("prefix {:?}", u.prefix) };
                println!("upstream {}: {how}, {prefix}", u.name);
            }
            Ok(())
        }
        Command::Connect { url, headers, timeout } => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
            if url.scheme_str() != Some("http") {
                anyhow::bail!(
                    "{url}: only http:// URLs are supported (put a TLS-terminating proxy in front for https)"
                );
            }
            let headers = headers
                .iter()
                .map(|h| switchboard::bridge::parse_header(h))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!("--header: {e}"))?;
            let timeout =
                switchboard::config::parse_duration(&timeout).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(switchboard::bridge::run(switchboard::bridge::Options { url, headers, timeout }))
        }
        Command::Serve { config, listen } => {
            let mut config = Config::load(&config).map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
            if let Some(listen) = listen {
                config.server.listen = listen;
            }
            init_logging(&config);
            let runtime = runtime(&config).context("starting the async runtime")?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(config.server.listen)
                    .await
                    .with_context(|| format!("binding {}", config.server.listen))?;
                switchboard::serve(listener, config, shutdown_signal()).await?;
                Ok(())
            })
        }
    }
}

/// One worker thread per core the process may run on (its CPU affinity), or
/// `server.worker_threads`; a single worker runs on a current-thread runtime,
/// which skips the work-stealing machinery.
fn runtime(config: &Config) -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = if config.server.worker_threads == 0 { cores } else { config.server.worker_threads };
    if workers == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()
    }
}

fn init_logging(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log.level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match config.log.format {
        switchboard::config::LogFormat::Json => builder.json().init(),
        switchboard::config::LogFormat::Text => builder.init(),
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
    }
}
