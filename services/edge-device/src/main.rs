//! `switchboard-edge`: the reference edge device.
//!
//! It connects out to a Switchboard router's edge listener (TCP, or TLS with
//! `--tls --ca FILE`), registers two services, answers the router's `call`
//! frames, and reconnects with exponential backoff (0.25 s doubling to
//! `--max-backoff`, with jitter) whenever the connection drops:
//!
//! - `get_current_time` (`format`: `simple` | `detailed`): the time in UTC,
//!   as text, or as a JSON object;
//! - `create_file` (`filename`, `content`): writes a file inside the sandbox
//!   directory given with `--sandbox`, refusing absolute paths, `..` and
//!   symbolic links that would lead out of it.
//!
//! With `--ask TEXT` it also sends TEXT as a text task once registered and
//! prints the router's answer (the handler tool's) on stdout, then exits.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use clap::Parser;
use serde_json::{json, Value};
use switchboard_protocol::edge::{self as frames, Decoder, TaskId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

#[derive(Parser, Debug)]
#[command(name = "switchboard-edge", version, about = "The reference Switchboard edge device")]
struct Args {
    /// The router's edge listener, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:7000")]
    router: String,
    /// The tenant's API key (default: SWITCHBOARD_KEY from the environment,
    /// which keeps it out of `ps`).
    #[arg(long, default_value = "")]
    key: String,
    /// The device's name; its tools are `<device>__<service>`.
    #[arg(long, default_value = "desktop")]
    device: String,
    /// The directory `create_file` writes in (created if missing).
    #[arg(long)]
    sandbox: PathBuf,
    /// Connect with TLS.
    #[arg(long)]
    tls: bool,
    /// The CA certificate (PEM) that signed the router's certificate.
    #[arg(long, requires = "tls")]
    ca: Option<PathBuf>,
    /// The name in the router's certificate (default: the host of --router).
    #[arg(long)]
    server_name: Option<String>,
    /// Send this text as a task once registered, print the answer, exit.
    #[arg(long)]
    ask: Option<String>,
    /// Longest wait between reconnection attempts, in seconds.
    #[arg(long, default_value_t = 10.0)]
    max_backoff: f64,
}

/// How a session with the router ended.
enum End {
    /// The connection dropped or failed: reconnect.
    Lost(String),
    /// The router refused us (bad key, bad name): retrying will not help soon.
    Refused(String),
    /// `--ask` got its answer.
    Done,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = Args::parse();
    if args.key.is_empty() {
        args.key = std::env::var("SWITCHBOARD_KEY").unwrap_or_default();
    }
    if let Err(e) = std::fs::create_dir_all(&args.sandbox) {
        eprintln!("switchboard-edge: cannot create the sandbox {}: {e}", args.sandbox.display());
        std::process::exit(2);
    }
    let sandbox = match args.sandbox.canonicalize() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("switchboard-edge: sandbox {}: {e}", args.sandbox.display());
            std::process::exit(2);
        }
    };
    let tls = if args.tls {
        match tls_connector(args.ca.as_deref()) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("switchboard-edge: {e}");
                std::process::exit(2);
            }
        }
    } else {
        None
    };
    let initial = Duration::from_millis(250);
    let max = Duration::from_secs_f64(args.max_backoff.max(0.25));
    let mut backoff = initial;
    loop {
        let started = std::time::Instant::now();
        let end = match TcpStream::connect(&args.router).await {
            Err(e) => End::Lost(format!("cannot connect to {}: {e}", args.router)),
            Ok(tcp) => {
                let _ = tcp.set_nodelay(true);
                // Notice a router that vanished without closing (NAT, power loss).
                let keepalive = socket2::TcpKeepalive::new()
                    .with_time(Duration::from_secs(30))
                    .with_interval(Duration::from_secs(10));
                let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive);
                match &tls {
                    None => session(tcp, &args, &sandbox).await,
                    Some(connector) => {
                        let host = args.server_name.clone().unwrap_or_else(|| {
                            args.router.rsplit_once(':').map_or(args.router.clone(), |(h, _)| h.to_owned())
                        });
                        match rustls::pki_types::ServerName::try_from(host.clone()) {
                            Err(e) => End::Refused(format!("server name {host:?}: {e}")),
                            Ok(name) => match connector.connect(name, tcp).await {
                                Ok(stream) => session(stream, &args, &sandbox).await,
                                Err(e) => End::Lost(format!("TLS handshake: {e}")),
                            },
                        }
                    }
                }
            }
        };
        match end {
            End::Done => return,
            End::Lost(why) => eprintln!("switchboard-edge: {why}"),
            End::Refused(why) => {
                eprintln!("switchboard-edge: the router refused the device: {why}");
                backoff = max;
            }
        }
        // A session that lasted a while starts the backoff over.
        if started.elapsed() > Duration::from_secs(30) {
            backoff = initial;
        }
        let jitter = 0.8
            + 0.4 * f64::from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos() % 1000)
                / 1000.0;
        let wait = backoff.mul_f64(jitter);
        eprintln!("switchboard-edge: reconnecting in {:.2}s", wait.as_secs_f64());
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(max);
    }
}

fn tls_connector(ca: Option<&Path>) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let ca = ca.ok_or("--tls needs --ca FILE: the CA certificate that signed the router's certificate")?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))? {
        let cert = cert.map_err(|e| format!("{}: {e}", ca.display()))?;
        roots.add(cert).map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The services this device registers.
fn services() -> Value {
    json!({
        "get_current_time": {
            "description": "The current date and time on this device (UTC).",
            "parameters": {
                "type": "object",
                "properties": {
                    "format": {
                        "type": "string",
                        "enum": ["simple", "detailed"],
                        "description": "simple: one line of text; detailed: date, time, weekday and Unix time as JSON"
                    }
                },
                "required": ["format"]
            }
        },
        "create_file": {
            "description": "Creates (or replaces) a text file in this device's sandbox directory.",
            "parameters": {
                "type": "object",
                "properties": {
                    "filename": {"type": "string", "minLength": 1, "maxLength": 255, "description": "a path relative to the sandbox"},
                    "content": {"type": "string", "maxLength": 1048576}
                },
                "required": ["filename", "content"]
            }
        }
    })
}

/// One connection: register, then answer calls until it ends.
async fn session<S: AsyncRead + AsyncWrite + Unpin>(stream: S, args: &Args, sandbox: &Path) -> End {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut seq: u16 = 0;
    let mut out = BytesMut::new();
    let mut send = |message: &Value, out: &mut BytesMut| {
        frames::encode_json(seq, &serde_json::to_vec(message).expect("serializable"), out);
        seq = (seq + 1) % 10_000;
    };
    let register = json!({
        "type": "register",
        "data": {"device": args.device, "auth": {"api_key": args.key}, "services": services()},
    });
    send(&register, &mut out);
    if let Err(e) = writer.write_all(&out.split()).await {
        return End::Lost(format!("sending register: {e}"));
    }
    let ask_task: TaskId = *b"task0001";
    let mut answer = String::new();
    let mut decoder = Decoder::new(4 << 20);
    loop {
        while let Some(decoded) = decoder.next_frame() {
            let frame = match decoded {
                Ok(frame) => frame,
                Err(e) => {
                    eprintln!("switchboard-edge: skipped input from the router: {e}");
                    continue;
                }
            };
            match frame.kind {
                frames::MCP => {
                    let Ok(message) = serde_json::from_slice::<Value>(&frame.payload) else {
                        eprintln!("switchboard-edge: the router sent JSON we cannot read");
                        continue;
                    };
                    match message["type"].as_str().unwrap_or("") {
                        "registered" => {
                            eprintln!(
                                "switchboard-edge: registered as {}: tools {}",
                                message["data"]["device"], message["data"]["tools"]
                            );
                            if let Some(text) = &args.ask {
                                frames::encode_text(&ask_task, 0, text, 4096, &mut out);
                                frames::encode_end(&ask_task, 1, &mut out);
                            }
                        }
                        "call" => {
                            let data = &message["data"];
                            let result = run(data["method"].as_str().unwrap_or(""), &data["params"], sandbox);
                            let reply =
                                json!({"type": "result", "data": {"call_id": data["call_id"], "result": result}});
                            send(&reply, &mut out);
                        }
                        "error" => {
                            let data = &message["data"];
                            let code = data["code"].as_str().unwrap_or("");
                            let text = data["message"].as_str().unwrap_or("").to_owned();
                            if matches!(code, "unauthenticated" | "invalid" | "full" | "not_registered") {
                                return End::Refused(text);
                            }
                            eprintln!("switchboard-edge: the router says: {text}");
                        }
                        other => eprintln!("switchboard-edge: ignoring a {other:?} message"),
                    }
                }
                frames::TEXT if frame.task == ask_task => answer.push_str(&String::from_utf8_lossy(&frame.payload)),
                frames::END if frame.task == ask_task && args.ask.is_some() => {
                    println!("{answer}");
                    return End::Done;
                }
                _ => {}
            }
        }
        if !out.is_empty() {
            if let Err(e) = writer.write_all(&out.split()).await {
                return End::Lost(format!("writing: {e}"));
            }
        }
        match reader.read_buf(decoder.buffer_mut(16 * 1024)).await {
            Ok(0) => return End::Lost("the router closed the connection".into()),
            Err(e) => return End::Lost(format!("reading: {e}")),
            Ok(_) => {}
        }
    }
}

/// Runs one service; returns the `result` object of the answer.
fn run(method: &str, params: &Value, sandbox: &Path) -> Value {
    let outcome = match method {
        "get_current_time" => current_time(params["format"].as_str().unwrap_or("simple")),
        "create_file" => {
            create_file(sandbox, params["filename"].as_str().unwrap_or(""), params["content"].as_str().unwrap_or(""))
        }
        other => Err(format!("unknown service {other:?}")),
    };
    match outcome {
        Ok(data) => json!({"success": true, "data": data}),
        Err(error) => json!({"success": false, "error": error}),
    }
}

fn current_time(format: &str) -> Result<Value, String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?;
    let secs = now.as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (rest / 3600, rest / 60 % 60, rest % 60);
    const WEEKDAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let weekday = WEEKDAYS[days.rem_euclid(7) as usize];
    match format {
        "simple" => Ok(json!(format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02} UTC"))),
        "detailed" => Ok(json!({
            "iso8601": format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z"),
            "date": format!("{year:04}-{month:02}-{day:02}"),
            "time": format!("{h:02}:{m:02}:{s:02}"),
            "weekday": weekday,
            "timezone": "UTC",
            "unix_seconds": secs,
        })),
        other => Err(format!("unknown format {other:?}: use simple or detailed")),
    }
}

/// Year, month, day of a count of days since 1970-01-01 (proleptic
/// Gregorian calendar; eras of 400 years).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Writes `content` to `filename` inside `sandbox` (canonical), refusing
/// any path that could lead out of it: absolute paths, `..` and `.`, and
/// symbolic links anywhere on the way (directories are created one level
/// at a time, each checked first). The file is written under a temporary
/// name and renamed over the target, so a hard link or a link swapped in
/// meanwhile is replaced, never written through.
fn create_file(sandbox: &Path, filename: &str, content: &str) -> Result<Value, String> {
    let relative = Path::new(filename);
    if filename.is_empty() || relative.is_absolute() {
        return Err(format!("{filename:?} escapes the sandbox: give a path relative to it"));
    }
    if !relative.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!("{filename:?} escapes the sandbox: \"..\" and \".\" are not allowed"));
    }
    let components: Vec<&std::ffi::OsStr> = relative.iter().collect();
    let (file, dirs) = components.split_last().ok_or_else(|| format!("{filename:?} has no file name"))?;
    let mut dir = sandbox.to_path_buf();
    for part in dirs {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(format!("{filename:?} escapes the sandbox through a symbolic link"))
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(format!("{filename:?}: {} is not a directory", dir.display())),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::fs::create_dir(&dir).map_err(|e| format!("creating the directory for {filename:?}: {e}"))?
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let target = dir.join(file);
    match std::fs::symlink_metadata(&target) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(format!("{filename:?} is a symbolic link; refusing to write through it"))
        }
        Ok(meta) if !meta.is_file() => return Err(format!("{filename:?} exists and is not a regular file")),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e.to_string()),
    }
    let temporary = dir.join(format!(".{}.switchboard-edge-{}", file.to_string_lossy(), std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut f| std::io::Write::write_all(&mut f, content.as_bytes()))
        .and_then(|()| std::fs::rename(&temporary, &target));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(format!("writing {filename:?}: {e}"));
    }
    Ok(json!({"path": filename, "bytes": content.len()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(20_414), (2025, 11, 22));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn create_file_stays_in_the_sandbox() {
        let dir = std::env::temp_dir().join(format!("sb-edge-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("box")).unwrap();
        let sandbox = dir.join("box").canonicalize().unwrap();
        assert!(create_file(&sandbox, "notes/a.txt", "hi").is_ok());
        assert_eq!(std::fs::read_to_string(sandbox.join("notes/a.txt")).unwrap(), "hi");
        for bad in ["../escape.txt", "/etc/passwd", "notes/../../x", "./a", ""] {
            assert!(create_file(&sandbox, bad, "x").is_err(), "{bad}");
        }
        let outside = dir.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, sandbox.join("link")).unwrap();
        assert!(create_file(&sandbox, "link/x.txt", "x").unwrap_err().contains("symbolic link"));
        assert!(create_file(&sandbox, "link/a/b/x.txt", "x").unwrap_err().contains("symbolic link"));
        assert!(!outside.join("a").exists(), "no directory created through the link");
        // A hard link to a file outside is replaced, not written through.
        std::fs::write(outside.join("secret"), "keep").unwrap();
        std::fs::hard_link(outside.join("secret"), sandbox.join("hard")).unwrap();
        create_file(&sandbox, "hard", "new").unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(sandbox.join("hard")).unwrap(), "new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
