//! The `switchboard` command: parse arguments, set up logging, run.

/// mimalloc rather than glibc's allocator: a forwarded call allocates a few
/// small buffers and frees them soon after, often on another thread (an
/// audit record, freed by the writer), which glibc's arenas serve slower.
/// Pinned to one core (loadtest/run's placement), router CPU per call fell
/// 6 to 10% with it (bare and with audit to PostgreSQL, 32 connections);
/// unpinned, it measured the same as glibc's. Idle sessions: about 925
/// bytes each against 915.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use switchboard_router::Config;

mod bridge;

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
    /// Call one tool through a router (or any MCP server) and print the
    /// result as JSON: initialize, tools/call, end the session.
    Call {
        /// The MCP endpoint, e.g. http://127.0.0.1:8080/mcp.
        url: http::Uri,
        /// The tool's name, e.g. desk__get_current_time.
        tool: String,
        /// Its arguments, a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
        /// An extra request header, "Name: value" (repeatable), e.g. an API key.
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Longest wait for the answer.
        #[arg(long, default_value = "60s")]
        timeout: String,
    },
    /// Validate a configuration file and print what it configures.
    CheckConfig {
        /// The configuration file (TOML).
        file: PathBuf,
    },
    /// Apply database migrations (idempotent).
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Manage tenants.
    Tenants {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Manage API keys.
    Keys {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Manage upstream credentials in the vault: what the router sends an
    /// upstream for a tenant, or for one user of a tenant.
    Credentials {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: CredentialCommand,
    },
    /// The upstream registry: MCP servers added, changed and removed while
    /// the routers run (every replica applies a change within seconds).
    Upstreams {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: UpstreamCommand,
    },
    /// Tool-definition pinning: definitions waiting for a decision, with
    /// what changed; approve or reject one.
    Pins {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: PinsCommand,
    },
    /// The vault's key: make one, or reseal every credential with the current one.
    Vault {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: VaultCommand,
    },
    /// Read the audit log.
    Audit {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: AuditCommand,
    },
}

/// Where the database is: `--database-url`, else the config file's
/// `database.url`, else `sqlite:switchboard.db`.
#[derive(clap::Args)]
struct DbArgs {
    /// The configuration file (TOML); optional.
    #[arg(long, short, default_value = "switchboard.toml", global = true)]
    config: PathBuf,
    /// postgres://… or sqlite:… (overrides database.url).
    #[arg(long, global = true)]
    database_url: Option<String>,
}

#[derive(Subcommand)]
// Parsed once per run: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum TenantCommand {
    /// Create a tenant.
    Create {
        name: String,
        /// An upstream it subscribes to (repeatable); "*" for all.
        #[arg(long = "upstream", short = 'u')]
        upstreams: Vec<String>,
        /// Only tools of UPSTREAM matching PATTERN ("UPSTREAM:PATTERN", repeatable; * and ? wildcards).
        #[arg(long)]
        allow: Vec<String>,
        /// Hide tools of UPSTREAM matching PATTERN ("UPSTREAM:PATTERN", repeatable).
        #[arg(long)]
        deny: Vec<String>,
        /// Requests per second per key ("RATE" or "RATE/BURST").
        #[arg(long)]
        key_rate: Option<String>,
        /// Requests per second for the whole tenant ("RATE" or "RATE/BURST").
        #[arg(long)]
        tenant_rate: Option<String>,
        /// Calls per second per tool ("RATE" or "RATE/BURST").
        #[arg(long)]
        tool_rate: Option<String>,
        /// Forwarded requests in flight at once, per replica.
        #[arg(long)]
        concurrent: Option<u32>,
        /// Sessions of the tenant held at once, per replica.
        #[arg(long)]
        sessions: Option<u32>,
        /// Sessions of each of its keys held at once, per replica.
        #[arg(long)]
        key_sessions: Option<u32>,
        /// Store tools/call arguments in audit records.
        #[arg(long)]
        audit_arguments: bool,
        /// Offer its tools as search, describe and call meta-tools instead
        /// of the whole list (for catalogs too large for a model's context).
        #[arg(long)]
        progressive: bool,
        /// The tool that answers its edge devices' text tasks (in place of
        /// edge.task_handler).
        #[arg(long)]
        task_handler: Option<String>,
        /// Pin its tool definitions: approved as first seen (first_sight)
        /// or by an operator (operator); a changed one waits for approval.
        #[arg(long)]
        pin: Option<String>,
        /// What its clients get of a pinned tool whose definition changed:
        /// nothing until approved (withhold, the default) or the tool,
        /// marked (warn). Implies --pin first_sight if --pin is not given.
        #[arg(long)]
        pin_changes: Option<String>,
    },
    /// List tenants (database and config file).
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a tenant and its keys.
    Delete { name: String },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create a key; prints the key (shown only this once) and nothing else.
    Create {
        #[arg(long)]
        tenant: String,
        /// A duration from now ("30d", "12h") or a date/time ("2026-12-31", "2026-12-31T12:00:00Z").
        #[arg(long)]
        expires: Option<String>,
    },
    /// List keys (prefixes only), with revoked and expired ones marked.
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by its prefix (routers stop accepting it within seconds).
    Revoke { prefix: String },
}

#[derive(Subcommand)]
enum CredentialCommand {
    /// Store (or replace) a credential. Its values are never shown again.
    Set {
        #[arg(long)]
        tenant: String,
        /// The user (as audit records name them: a token's subject, a
        /// certificate's subject); omit for the tenant's own credential.
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        upstream: String,
        /// A header to send, "Name: value" (repeatable). A value on the
        /// command line shows in `ps` and shell history: prefer --stdin.
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Read the headers from standard input, one "Name: value" per line.
        #[arg(long)]
        stdin: bool,
    },
    /// List credentials: whose, for which upstream, the header names and
    /// the key id (never a value).
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete a credential.
    Delete {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        upstream: String,
    },
}

#[derive(Subcommand)]
enum UpstreamCommand {
    /// Register an upstream (or replace its entry). Its header values are
    /// sealed with the vault key and never shown again.
    Set {
        name: String,
        /// Its URL (Streamable HTTP, or legacy HTTP+SSE with --transport sse).
        #[arg(long)]
        url: Option<String>,
        /// "http" (default) or "sse".
        #[arg(long, default_value = "http")]
        transport: String,
        /// The namespace of its tools and prompts (default: its name; "" for none).
        #[arg(long)]
        prefix: Option<String>,
        /// The whole entry as JSON, with the keys of an [[upstreams]] entry
        /// (in place of --url, --transport and --prefix).
        #[arg(long, conflicts_with_all = ["url", "prefix"])]
        json: Option<String>,
        /// A header to send, "Name: value" (repeatable); prefer --stdin.
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Read the headers from standard input, one "Name: value" per line.
        #[arg(long)]
        stdin: bool,
    },
    /// List the registered upstreams (never a header value).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove an upstream from the registry.
    Remove { name: String },
}

#[derive(Subcommand)]
enum VaultCommand {
    /// Print a new random vault key (for vault.key or vault.key_file).
    NewKey,
    /// Reseal every credential with the current key (vault.key), opening
    /// each with the key that sealed it (vault.previous_keys).
    Rotate,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Print matching records as JSON lines, oldest first.
    Query {
        #[arg(long)]
        tenant: Option<String>,
        /// A duration ago ("15m", "7d"), a time ("2026-11-22T08:00:00Z") or a date.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 1000)]
        limit: i64,
    },
    /// Usage from the audit log, per tenant, key, user, upstream or tool:
    /// calls, errors, bytes each way, time taken.
    Usage {
        /// From (a duration ago, a time or a date; default 30 days ago).
        #[arg(long)]
        from: Option<String>,
        /// To (the same forms; default now).
        #[arg(long)]
        to: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        /// The method metered ("*": all).
        #[arg(long, default_value = "tools/call")]
        method: String,
        /// Of tenant, key, user, upstream, tool, comma-separated.
        #[arg(long, default_value = "tenant,upstream,tool")]
        group_by: String,
        /// As CSV (default: JSON).
        #[arg(long)]
        csv: bool,
    },
    /// Print records as JSON lines as they arrive (Ctrl-C stops).
    Tail {
        #[arg(long)]
        tenant: Option<String>,
        /// Start this far back (default: only new records).
        #[arg(long)]
        since: Option<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => {
            let config = Config::load(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            for (cert, key) in config.server.tls.iter().chain(&config.admin.tls) {
                switchboard_router::tls::Certificates::load(cert, key)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            }
            println!("{}: ok", file.display());
            for note in config.notes() {
                println!("note: {note}");
            }
            println!("listen: {}", config.server.listen);
            if let Some((cert, key)) = &config.server.tls {
                println!("tls: {} (key {})", cert.display(), key.display());
            }
            for u in &config.upstreams {
                let how = match &u.transport {
                    switchboard_router::config::TransportConfig::Http(h) => format!("http {}", h.url),
                    switchboard_router::config::TransportConfig::Stdio(s) => {
                        format!("stdio {} {}", s.command, s.args.join(" "))
                    }
                    switchboard_router::config::TransportConfig::Sse(h) => format!("sse {}", h.url),
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
            let (headers, timeout) = client_options(&headers, &timeout)?;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(bridge::run(bridge::Options { url, headers, timeout }))
        }
        Command::Call { url, tool, arguments, headers, timeout } => {
            if url.scheme_str() != Some("http") {
                anyhow::bail!("{url}: only http:// URLs are supported");
            }
            let arguments: serde_json::Value =
                serde_json::from_str(&arguments).map_err(|e| anyhow::anyhow!("arguments: not JSON: {e}"))?;
            if !arguments.is_object() {
                anyhow::bail!("arguments: must be a JSON object, e.g. '{{\"format\":\"simple\"}}'");
            }
            let (headers, timeout) = client_options(&headers, &timeout)?;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let answer = runtime.block_on(bridge::call_tool(url, headers, timeout, &tool, &arguments))?;
            match answer.get("result") {
                Some(result) => {
                    println!("{}", serde_json::to_string_pretty(result)?);
                    if result.get("isError").and_then(serde_json::Value::as_bool) == Some(true) {
                        std::process::exit(1);
                    }
                    Ok(())
                }
                None => anyhow::bail!("the call failed: {}", answer.get("error").unwrap_or(&answer)),
            }
        }
        Command::Migrate { db } => admin_runtime()?.block_on(async {
            let (admin, _) = open_admin(&db, false).await?;
            admin.db.migrate().await.context("applying migrations")?;
            eprintln!("migrations applied ({:?})", admin.db.backend());
            Ok(())
        }),
        Command::Tenants { db, command } => admin_runtime()?.block_on(tenants(db, command)),
        Command::Keys { db, command } => admin_runtime()?.block_on(keys(db, command)),
        Command::Audit { db, command } => admin_runtime()?.block_on(audit(db, command)),
        Command::Credentials { db, command } => admin_runtime()?.block_on(credentials(db, command)),
        Command::Upstreams { db, command } => admin_runtime()?.block_on(upstreams(db, command)),
        Command::Pins { db, command } => admin_runtime()?.block_on(pins(db, command)),
        Command::Vault { command: VaultCommand::NewKey, .. } => {
            println!("{}", switchboard_vault::Key::generate());
            Ok(())
        }
        Command::Vault { db, command: VaultCommand::Rotate } => admin_runtime()?.block_on(async {
            let (admin, _) = open_admin(&db, true).await?;
            let done = admin.rotate_vault().await?;
            eprintln!(
                "{} credentials resealed with the current vault key; {} already were",
                done.resealed, done.current
            );
            Ok(())
        }),
        Command::Serve { config: config_path, listen } => {
            let mut config =
                Config::load(&config_path).map_err(|e| anyhow::anyhow!("{}: {e}", config_path.display()))?;
            if let Some(listen) = listen {
                config.server.listen = listen;
            }
            let log_level = init_logging(&config);
            let path = config_path_for_reload(&config_path);
            for note in config.notes() {
                tracing::warn!("{note}");
            }
            let threads = connection_threads(&config);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(config.server.listen)
                    .await
                    .with_context(|| format!("binding {}", config.server.listen))?;
                let admin = match (config.admin.listen, &config.admin.token, &config.database.url) {
                    (Some(addr), Some(token), Some(url)) => {
                        let db = switchboard_db::Database::connect(url, config.database.connect_timeout)?;
                        let listener = tokio::net::TcpListener::bind(addr)
                            .await
                            .with_context(|| format!("binding the admin API to {addr}"))?;
                        let addr = listener.local_addr().unwrap_or(addr);
                        tracing::info!(%addr, "admin API listening on http://{addr}/v1/");
                        Some((listener, switchboard_router::admin::Admin::new(db, &config), token.clone()))
                    }
                    (Some(_), _, None) => anyhow::bail!("admin.listen needs a database (database.url)"),
                    _ => None,
                };
                let reload = Some(switchboard_router::reload::Source { path, log_level: Some(log_level) });
                let extra = switchboard_router::Listeners { edge: None, admin, reload, threads: threads - 1 };
                switchboard_router::serve_with(listener, extra, config, shutdown_signal()).await?;
                Ok(())
            })
        }
    }
}

/// How many threads serve connections: one per core the process may run on
/// (its CPU affinity), or `server.worker_threads`. The main thread's
/// current-thread runtime is the first (it also runs the background loops,
/// the admin API and edge devices); the others have runtimes of their own.
fn connection_threads(config: &Config) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if config.server.worker_threads == 0 {
        cores
    } else {
        config.server.worker_threads
    }
}

/// Sets up logging; returns what changes the level while running (a
/// reloaded `log.level`; `RUST_LOG`, when set, wins over it as at start).
fn init_logging(config: &Config) -> switchboard_router::reload::LogLevel {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::EnvFilter;
    let from_env = std::env::var_os("RUST_LOG").is_some();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log.level));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(filter);
    match config.log.format {
        switchboard_router::config::LogFormat::Json => registry.with(fmt.json()).init(),
        switchboard_router::config::LogFormat::Text => registry.with(fmt).init(),
    }
    Box::new(move |level: &str| {
        if from_env {
            return Err("RUST_LOG is set, and wins over log.level".into());
        }
        let filter = EnvFilter::try_new(level).map_err(|e| format!("log.level {level:?}: {e}"))?;
        handle.reload(filter).map_err(|e| e.to_string())
    })
}

/// The configuration file to reload: `path` made absolute (the working
/// directory may change under a service manager).
fn config_path_for_reload(path: &std::path::Path) -> std::path::PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
    }
}

/// `--header` and `--timeout` of the commands that call a router (`connect`, `call`).
type ClientOptions = (Vec<(http::HeaderName, http::HeaderValue)>, std::time::Duration);

fn client_options(headers: &[String], timeout: &str) -> Result<ClientOptions> {
    let headers = headers
        .iter()
        .map(|h| bridge::parse_header(h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--header: {e}"))?;
    let timeout = switchboard_router::config::parse_duration(timeout).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
    Ok((headers, timeout))
}

fn admin_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

/// The admin operations over the database `db` names; migrated first
/// (idempotent) unless `migrate` is false.
async fn open_admin(db: &DbArgs, migrate: bool) -> Result<(switchboard_router::admin::Admin, Config)> {
    let mut config = if db.config.exists() {
        Config::load(&db.config).map_err(|e| anyhow::anyhow!("{}: {e}", db.config.display()))?
    } else {
        Config::from_env().map_err(|e| anyhow::anyhow!("{e}"))?
    };
    if let Some(url) = &db.database_url {
        config.database.url = Some(url.clone());
    }
    let Some(url) = config.database.url.clone() else {
        anyhow::bail!("no database: database.url is \"\" in {}; pass --database-url", db.config.display());
    };
    let database = switchboard_db::Database::connect(&url, config.database.connect_timeout)?;
    if migrate && config.database.migrate_on_start {
        database.migrate().await.context("applying migrations (see `switchboard migrate`)")?;
    }
    Ok((switchboard_router::admin::Admin::new(database, &config), config))
}

/// "RATE" or "RATE/BURST" (burst defaults to the rate, at least 1).
fn rate(text: &str) -> Result<switchboard_core::policy::Rate> {
    let (r, b) = text.split_once('/').unwrap_or((text, ""));
    let per_second: f64 = r.trim().parse().with_context(|| format!("{text:?}: the rate is not a number"))?;
    let burst: u32 = if b.is_empty() {
        (per_second.ceil() as u32).max(1)
    } else {
        b.trim().parse().with_context(|| format!("{text:?}: the burst is not a whole number"))?
    };
    Ok(switchboard_core::policy::Rate { per_second, burst })
}

async fn tenants(db: DbArgs, command: TenantCommand) -> Result<()> {
    let (admin, _) = open_admin(&db, true).await?;
    match command {
        TenantCommand::Create {
            name,
            upstreams,
            allow,
            deny,
            key_rate,
            tenant_rate,
            tool_rate,
            concurrent,
            sessions,
            key_sessions,
            audit_arguments,
            progressive,
            task_handler,
            pin,
            pin_changes,
        } => {
            let choice = |flag: &str, value: Option<String>| -> anyhow::Result<Option<serde_json::Value>> {
                value
                    .map(|v| {
                        let known = match flag {
                            "--pin" => ["first_sight", "operator"],
                            _ => ["withhold", "warn"],
                        };
                        anyhow::ensure!(known.contains(&v.as_str()), "{flag} {v:?}: one of {}", known.join(", "));
                        Ok(serde_json::Value::String(v))
                    })
                    .transpose()
            };
            let pinning = match (choice("--pin", pin)?, choice("--pin-changes", pin_changes)?) {
                (None, None) => None,
                (approve, on_change) => {
                    let mut spec = serde_json::Map::new();
                    spec.extend(approve.map(|a| ("approve".to_owned(), a)));
                    spec.extend(on_change.map(|c| ("on_change".to_owned(), c)));
                    Some(serde_json::from_value(serde_json::Value::Object(spec))?)
                }
            };
            let discovery = if progressive {
                switchboard_core::policy::Discovery::Progressive
            } else {
                switchboard_core::policy::Discovery::Full
            };
            let mut policy = switchboard_core::policy::Policy {
                upstreams,
                audit_arguments,
                discovery,
                task_handler,
                pinning,
                ..Default::default()
            };
            for (list, is_allow) in [(allow, true), (deny, false)] {
                for item in list {
                    let (upstream, pattern) = item
                        .split_once(':')
                        .with_context(|| format!("{item:?}: write UPSTREAM:PATTERN, e.g. files:read_*"))?;
                    let filter = policy.tools.entry(upstream.to_owned()).or_default();
                    if is_allow { &mut filter.allow } else { &mut filter.deny }.push(pattern.to_owned());
                }
            }
            policy.limits.key = key_rate.as_deref().map(rate).transpose()?;
            policy.limits.tenant = tenant_rate.as_deref().map(rate).transpose()?;
            policy.limits.tool = tool_rate.as_deref().map(rate).transpose()?;
            policy.limits.concurrent = concurrent;
            policy.limits.sessions = sessions;
            policy.limits.key_sessions = key_sessions;
            admin.create_tenant(&name, policy).await?;
            eprintln!("tenant {name} created");
        }
        TenantCommand::List { json } => {
            let tenants = admin.tenants().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&tenants)?);
            } else {
                println!("{:<24} {:<9} UPSTREAMS", "NAME", "SOURCE");
                for t in tenants {
                    println!("{:<24} {:<9} {}", t.name, t.source, t.policy.upstreams.join(","));
                }
            }
        }
        TenantCommand::Delete { name } => {
            admin.delete_tenant(&name).await?;
            eprintln!("tenant {name} deleted, with its keys");
        }
    }
    Ok(())
}

async fn keys(db: DbArgs, command: KeyCommand) -> Result<()> {
    let (admin, _) = open_admin(&db, true).await?;
    match command {
        KeyCommand::Create { tenant, expires } => {
            let at = match expires.as_deref() {
                None => None,
                Some(text) => match switchboard_router::config::parse_duration(text) {
                    Ok(d) => Some(switchboard_core::time::now_ms() + d.as_millis() as i64),
                    Err(_) => Some(switchboard_core::time::parse_time(text).with_context(|| {
                        format!("--expires {text:?}: use a duration (\"30d\") or a date (\"2026-12-31\")")
                    })?),
                },
            };
            let created = admin.create_key(&tenant, at).await?;
            println!("{}", created.key);
        }
        KeyCommand::List { tenant, json } => {
            let keys = admin.keys(tenant.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&keys)?);
            } else {
                let now = switchboard_core::time::now_ms();
                println!("{:<12} {:<24} {:<25} {:<25} STATUS", "PREFIX", "TENANT", "CREATED", "EXPIRES");
                for k in keys {
                    let status = if k.revoked_at_ms.is_some() {
                        "revoked"
                    } else if k.expires_at_ms.is_some_and(|at| at <= now) {
                        "expired"
                    } else {
                        "active"
                    };
                    let expires =
                        k.expires_at_ms.map_or_else(|| "never".to_owned(), switchboard_core::time::format_time);
                    println!(
                        "{:<12} {:<24} {:<25} {:<25} {status}",
                        k.prefix,
                        k.tenant,
                        switchboard_core::time::format_time(k.created_at_ms),
                        expires
                    );
                }
            }
        }
        KeyCommand::Revoke { prefix } => {
            admin.revoke_key(&prefix).await?;
            eprintln!("key {prefix} revoked");
        }
    }
    Ok(())
}

/// Headers given as "Name: value" lines, on the command line and (with
/// `stdin`) on standard input.
fn header_lines(headers: Vec<String>, stdin: bool) -> Result<Vec<(String, String)>> {
    let mut lines = headers;
    if stdin {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).context("reading standard input")?;
        lines.extend(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned));
    }
    let mut parsed = Vec::with_capacity(lines.len());
    for line in &lines {
        let (name, value) = line.split_once(':').with_context(|| {
            format!(
                "a header is \"Name: value\" (got one without ':', beginning {:?})",
                line.chars().take(12).collect::<String>()
            )
        })?;
        parsed.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(parsed)
}

#[derive(Subcommand)]
enum PinsCommand {
    /// Pinned tools (by default only definitions waiting for a decision).
    List {
        #[arg(long)]
        tenant: Option<String>,
        /// Every pin, approved ones too.
        #[arg(long)]
        all: bool,
        /// As JSON (with both definitions).
        #[arg(long)]
        json: bool,
    },
    /// Approve the definition of TOOL waiting with DIGEST (as listed): the
    /// tenant's clients get the tool as now defined.
    Approve { tenant: String, tool: String, digest: String },
    /// Reject it: the tool stays withheld.
    Reject { tenant: String, tool: String, digest: String },
}

async fn pins(db: DbArgs, command: PinsCommand) -> Result<()> {
    use switchboard_router::admin::MAX_PINS_PAGE;
    let (admin, _) = open_admin(&db, true).await?;
    match command {
        PinsCommand::List { tenant, all, json } => {
            let mut pins = Vec::new();
            loop {
                let page = admin.pins(tenant.as_deref(), !all, MAX_PINS_PAGE, pins.len() as u64).await?;
                let full = page.len() == MAX_PINS_PAGE as usize;
                pins.extend(page);
                if !full {
                    break;
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&pins)?);
                return Ok(());
            }
            println!("{:<16} {:<40} {:<16} {:<9} {:<64} CHANGED", "TENANT", "TOOL", "UPSTREAM", "STATE", "DIGEST");
            for p in pins {
                let digest = p.row.pending_digest.as_deref().or(p.row.approved_digest.as_deref()).unwrap_or("");
                let fields: Vec<&str> = p.changes.iter().map(|c| c.field.as_str()).collect();
                println!(
                    "{:<16} {:<40} {:<16} {:<9} {:<64} {}",
                    p.row.tenant,
                    p.row.tool,
                    p.row.upstream,
                    p.state,
                    digest,
                    fields.join(",")
                );
            }
        }
        PinsCommand::Approve { tenant, tool, digest } => {
            admin.approve_pin(&tenant, &tool, &digest, "cli").await?;
            eprintln!(
                "approved: {tenant}'s clients get {tool} as now defined, at every router within database.refresh"
            );
        }
        PinsCommand::Reject { tenant, tool, digest } => {
            admin.reject_pin(&tenant, &tool, &digest, "cli").await?;
            eprintln!("rejected: {tool} stays withheld from {tenant}");
        }
    }
    Ok(())
}

async fn upstreams(db: DbArgs, command: UpstreamCommand) -> Result<()> {
    let (admin, _) = open_admin(&db, true).await?;
    let admin = if db.config.exists() { admin.with_config_path(db.config.clone()) } else { admin };
    match command {
        UpstreamCommand::Set { name, url, transport, prefix, json, headers, stdin } => {
            let mut spec = match json {
                Some(text) => serde_json::from_str::<serde_json::Value>(&text).context("--json: not JSON")?,
                None => {
                    let Some(url) = url else { anyhow::bail!("give --url (or the whole entry with --json)") };
                    let mut spec = serde_json::json!({"transport": transport, "url": url});
                    if let Some(prefix) = prefix {
                        spec["prefix"] = serde_json::Value::String(prefix);
                    }
                    spec
                }
            };
            let headers = header_lines(headers, stdin)?;
            if !headers.is_empty() {
                let map: serde_json::Map<String, serde_json::Value> =
                    headers.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
                spec["headers"] = serde_json::Value::Object(map);
            }
            let (registered, replaced) = admin.put_upstream(&name, spec, switchboard_core::time::now_ms()).await?;
            let what = if replaced { "replaced" } else { "registered" };
            eprintln!("upstream {name} {what}; every router serves it within database.refresh");
            if !registered.headers.is_empty() {
                eprintln!("its headers ({}) are sealed with the vault key", registered.headers.join(", "));
            }
        }
        UpstreamCommand::List { json } => {
            let list = admin.registered_upstreams().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<24} {:<6} {:<48} {:<25} HEADERS", "NAME", "VIA", "URL", "UPDATED");
                for r in list {
                    let text = |key: &str| r.spec.get(key).and_then(|v| v.as_str()).unwrap_or("").to_owned();
                    let updated = switchboard_core::time::format_time(r.updated_at_ms);
                    println!(
                        "{:<24} {:<6} {:<48} {:<25} {}",
                        r.name,
                        text("transport"),
                        text("url"),
                        updated,
                        r.headers.join(",")
                    );
                }
            }
        }
        UpstreamCommand::Remove { name } => {
            admin.remove_upstream(&name).await?;
            eprintln!("upstream {name} removed from the registry");
        }
    }
    Ok(())
}

async fn credentials(db: DbArgs, command: CredentialCommand) -> Result<()> {
    let (admin, _) = open_admin(&db, true).await?;
    match command {
        CredentialCommand::Set { tenant, user, upstream, headers, stdin } => {
            let parsed = header_lines(headers, stdin)?;
            if parsed.is_empty() {
                anyhow::bail!("no header: give --header \"Name: value\" or --stdin");
            }
            let row = admin.set_credential(&tenant, user.as_deref(), &upstream, parsed).await?;
            let whose = user.map_or_else(|| format!("tenant {tenant}"), |u| format!("user {u:?} of tenant {tenant}"));
            eprintln!("credential of {whose} for upstream {upstream} stored ({}; key id {})", row.names, row.key_id);
        }
        CredentialCommand::List { tenant, json } => {
            let rows = admin.credentials(tenant.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<20} {:<24} {:<16} {:<17} {:<25} HEADERS",
                    "TENANT", "USER", "UPSTREAM", "KEY ID", "UPDATED"
                );
                for r in rows {
                    let user = if r.user_id.is_empty() { "(tenant)" } else { &r.user_id };
                    let updated = switchboard_core::time::format_time(r.updated_at_ms);
                    println!(
                        "{:<20} {:<24} {:<16} {:<17} {:<25} {}",
                        r.tenant, user, r.upstream, r.key_id, updated, r.names
                    );
                }
            }
        }
        CredentialCommand::Delete { tenant, user, upstream } => {
            admin.delete_credential(&tenant, user.as_deref(), &upstream).await?;
            eprintln!("credential deleted");
        }
    }
    Ok(())
}

async fn audit(db: DbArgs, command: AuditCommand) -> Result<()> {
    let (admin, _) = open_admin(&db, true).await?;
    // Records go to stdout as JSON lines; a closed pipe (`| head`) ends the command quietly.
    let print = |seq: i64, record: &switchboard_db::AuditRecord| -> Result<bool> {
        use std::io::Write;
        let mut value = serde_json::to_value(record)?;
        value["seq"] = seq.into();
        value["at"] = switchboard_core::time::format_time(record.at_ms).into();
        match writeln!(std::io::stdout().lock(), "{value}") {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(e.into()),
        }
    };
    let since = |text: Option<String>| -> Result<Option<i64>> {
        text.map(|t| switchboard_router::admin::parse_since(&t).map_err(anyhow::Error::msg)).transpose()
    };
    match command {
        AuditCommand::Usage { from, to, tenant, method, group_by, csv } => {
            let mut query = format!("method={}&group_by={}", encode(&method), encode(&group_by));
            for (key, value) in [("from", &from), ("to", &to), ("tenant", &tenant)] {
                if let Some(value) = value {
                    query.push_str(&format!("&{key}={}", encode(value)));
                }
            }
            let (q, _) = switchboard_router::admin::usage_query(&query)?;
            let rows = admin.usage(&q).await?;
            if csv {
                print!("{}", switchboard_db::usage::to_csv(&q.group_by, &rows));
            } else {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"group_by": q.group_by, "usage": rows}))?
                );
            }
        }
        AuditCommand::Query { tenant, since: from, limit } => {
            let query = switchboard_db::AuditQuery { tenant, since_ms: since(from)?, after_seq: None, limit };
            for (seq, record) in admin.audit(&query).await? {
                if !print(seq, &record)? {
                    break;
                }
            }
        }
        AuditCommand::Tail { tenant, since: from } => {
            let from = since(from)?;
            // Without --since, start after the newest record.
            let mut after = match from {
                Some(_) => 0,
                None => {
                    let latest = admin.db.latest_audit_seq().await?;
                    latest.unwrap_or(0)
                }
            };
            loop {
                let query = switchboard_db::AuditQuery {
                    tenant: tenant.clone(),
                    since_ms: from,
                    after_seq: Some(after),
                    limit: 1000,
                };
                let records = admin.audit(&query).await?;
                for (seq, record) in &records {
                    if !print(*seq, record)? {
                        return Ok(());
                    }
                    after = *seq;
                }
                if records.len() < 1000 {
                    tokio::select! {
                        () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = tokio::signal::ctrl_c() => return Ok(()),
                    }
                }
            }
        }
    }
    Ok(())
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b',' | b'/' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
