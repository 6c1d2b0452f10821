//! `switchboard-mock`: the mock MCP server as a program.
//!
//! ```text
//! switchboard-mock --stdio [--name N] [--allow-exit] [--conformance]
//! switchboard-mock --http 127.0.0.1:3001 [--name N] [--stateless] [--tools N] [--sse] [--page-size N]
//!                  [--list-delay-ms MS] [--unknown-session-status 400] [--threads N]
//!                  [--modern | --modern-only | --discover-2026-only] [--check-host | --any-host] [--state-key KEY]
//!                  [--list-ttl-ms MS] [--initialize-delay-ms MS] [--resumable-streams]
//!                  [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
//! ```
//!
//! With `--modern`, each HTTP POST is answered in its era: MCP 2026-07-28
//! (stateless, `_meta` per request) or a 2025 session; without it the mock is
//! a 2025 server only. `--conformance` also turns on the Host/Origin check
//! (`--any-host` turns it off again).

use anyhow::{bail, Context, Result};
use switchboard_mock::{Mock, Options};

fn main() -> Result<()> {
    let mut options = Options::default();
    let mut http: Option<String> = None;
    let mut stdio = false;
    let mut threads = 0usize;
    let mut any_host = false;
    let (mut tls_cert, mut tls_key, mut client_ca) = (None, None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--stdio" => stdio = true,
            "--allow-exit" => options.allow_exit = true,
            "--whoami" => options.whoami = true,
            "--require-auth" => options.require_auth = true,
            "--conformance" => {
                options.conformance = true;
                options.check_host = true;
            }
            "--modern" => options.modern = true,
            "--modern-only" => {
                options.modern = true;
                options.modern_only = true;
            }
            "--discover-2026-only" => {
                options.modern = true;
                options.discover_modern_only = true;
            }
            "--initialize-delay-ms" => {
                let ms: u64 =
                    value("--initialize-delay-ms")?.parse().context("--initialize-delay-ms takes a number")?;
                options.initialize_delay = std::time::Duration::from_millis(ms);
            }
            "--resumable-streams" => options.resumable_streams = true,
            "--check-host" => options.check_host = true,
            "--any-host" => any_host = true,
            "--state-key" => options.state_key = value("--state-key")?,
            "--list-ttl-ms" => {
                options.list_ttl_ms = value("--list-ttl-ms")?.parse().context("--list-ttl-ms takes a number")?
            }
            "--http" => http = Some(value("--http")?),
            "--tls-cert" => tls_cert = Some(std::path::PathBuf::from(value("--tls-cert")?)),
            "--tls-key" => tls_key = Some(std::path::PathBuf::from(value("--tls-key")?)),
            "--tls-client-ca" => client_ca = Some(std::path::PathBuf::from(value("--tls-client-ca")?)),
            "--name" => options.name = value("--name")?,
            "--stateless" => options.stateless = true,
            "--sse" => options.always_sse = true,
            "--tools" => options.extra_tools = value("--tools")?.parse().context("--tools takes a number")?,
            "--page-size" => options.page_size = value("--page-size")?.parse().context("--page-size takes a number")?,
            "--unknown-session-status" => {
                options.unknown_session_status = value("--unknown-session-status")?.parse().context("a status code")?
            }
            "--list-delay-ms" => {
                let ms: u64 = value("--list-delay-ms")?.parse().context("--list-delay-ms takes a number")?;
                options.list_delay = std::time::Duration::from_millis(ms);
            }
            "--threads" => threads = value("--threads")?.parse().context("--threads takes a number")?,
            "-h" | "--help" => {
                println!(
                    "switchboard-mock (--stdio [--allow-exit] | --http ADDR) [--conformance] [--name NAME] [--stateless] [--sse] [--tools N] \
                     [--page-size N] [--list-delay-ms MS] [--unknown-session-status CODE] [--threads N] \
                     [--modern | --modern-only | --discover-2026-only] [--check-host | --any-host] [--state-key KEY] \
                     [--list-ttl-ms MS] [--initialize-delay-ms MS] [--resumable-streams] \
                     [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]"
                );
                return Ok(());
            }
            other => bail!("unknown argument {other:?}; try --help"),
        }
    }
    if any_host {
        options.check_host = false;
    }
    let mut runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if threads > 1 {
        runtime.worker_threads(threads);
    }
    let runtime = runtime.enable_all().build()?;
    runtime.block_on(async move {
        match (stdio, http) {
            (true, None) => Mock::new(options).serve_stdio().await?,
            (false, Some(addr)) => {
                let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
                let shutdown = async {
                    let _ = tokio::signal::ctrl_c().await;
                };
                match (tls_cert, tls_key) {
                    (None, None) => {
                        eprintln!("switchboard-mock listening on http://{}/mcp", listener.local_addr()?);
                        Mock::new(options).serve_http(listener, shutdown).await?;
                    }
                    (Some(cert), Some(key)) => {
                        let tls = switchboard_mock::tls_acceptor(&cert, &key, client_ca.as_deref())?;
                        eprintln!("switchboard-mock listening on https://{}/mcp", listener.local_addr()?);
                        Mock::new(options).serve_https(listener, tls, shutdown).await?;
                    }
                    _ => bail!("--tls-cert and --tls-key go together"),
                }
            }
            _ => bail!("give exactly one of --stdio or --http ADDR"),
        }
        Ok(())
    })
}
