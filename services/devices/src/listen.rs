//! The edge listener: accepts device connections (TCP, or TLS when
//! `edge.tls_cert`/`edge.tls_key` are set) and runs each one.
//!
//! A connection is two tasks: this one reads and decodes frames and acts on
//! them; a writer drains the link's queue of encoded frames to the socket.
//! The first MCP message must be a `register` with a valid API key, within
//! `edge.register_timeout`; anything else gets an `error` message and the
//! connection is closed. After that:
//! - `register` again replaces the device's services;
//! - `result` completes the call with that `call_id` (an unknown one is
//!   counted and dropped);
//! - text frames (`0x04`) of one task id are joined until its `0x03`, then
//!   handed to the task handler tool; its answer goes back as text frames of
//!   the same task id and a `0x03`;
//! - frames of an unknown type, or JSON that is not a known message, get an
//!   `error` message and are counted; the connection stays up.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use switchboard_protocol::edge::{self as frames, Decoder, Frame, TaskId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

use async_trait::async_trait;
use switchboard_core::policy::{AuthFailure, Principal, Tenant};

use super::{Answer, Device, Devices, Link};

/// What the router provides to edge devices: authentication, the tools
/// their tenant already sees, news of their comings and goings, and the
/// handling of text tasks.
pub trait Host: Send + Sync + 'static {
    /// The owner of the API key a device registered with (`None`: it gave
    /// none). With authentication off, the open tenant.
    fn authenticate(&self, key: Option<&str>) -> Result<Principal, AuthFailure>;

    /// Whether `tenant` already sees a tool named `tool` from an upstream
    /// (a device's service must not shadow it).
    fn sees_tool(&self, tenant: &Tenant, tool: &str) -> bool;

    /// `tenant`'s tools changed: a device registered, changed its services,
    /// or is gone.
    fn tools_changed(&self, tenant: &str);

    /// What runs the text tasks of a registered device's connection: made
    /// at its first task, closed when the connection ends.
    fn task_runner(&self, principal: &Principal, device: &Arc<Device>) -> Arc<dyn TaskRunner>;
}

/// Runs the text tasks of one device connection.
#[async_trait]
pub trait TaskRunner: Send + Sync {
    /// Runs one text task and returns the text to send back.
    async fn run(&self, task: TaskId, text: String) -> String;

    /// The connection ended.
    async fn close(&self) {}
}

/// What every connection's task shares.
struct Ctx {
    devices: Arc<Devices>,
    host: Arc<dyn Host>,
}

/// The text tasks being gathered on one connection may hold, together, at
/// most this many frames' worth of bytes.
const TASK_FRAMES: usize = 16;
/// At most this many text tasks open at once on one connection.
const MAX_OPEN_TASKS: usize = 64;
/// At most this many text tasks at their handler at once, per connection.
const MAX_RUNNING_TASKS: usize = 4;
/// A write to a device that takes longer than this ends the connection.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// TCP keepalive, so that a device that vanished behind NAT is noticed
/// (its calls then fail at once, and its grace period starts).
fn keepalive(stream: &tokio::net::TcpStream) {
    let params = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(30))
        .with_interval(std::time::Duration::from_secs(10));
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&params);
}

pub use switchboard_core::tls::read_pem;

/// Builds the TLS acceptor from PEM files.
pub fn tls_acceptor(cert: &Path, key: &Path) -> std::io::Result<TlsAcceptor> {
    let invalid = |what: &str, e: &dyn std::fmt::Display| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("edge TLS {what}: {e}"))
    };
    let (certs, key) = read_pem(cert, key, "edge TLS")?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("protocol versions", &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| invalid("certificate and key", &e))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts device connections until `shutdown`, then closes them all.
pub async fn serve(
    devices: Arc<Devices>,
    host: Arc<dyn Host>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let ctx = Arc::new(Ctx { devices, host });
    if let Ok(addr) = listener.local_addr() {
        let scheme = if tls.is_some() { "tls" } else { "tcp" };
        tracing::info!(%addr, "edge devices connect to {scheme}://{addr}");
    }
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "edge accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                keepalive(&stream);
                let ctx = ctx.clone();
                match tls.clone() {
                    None => {
                        tokio::spawn(connection(ctx, stream, remote, false));
                    }
                    Some(acceptor) => {
                        tokio::spawn(async move {
                            let handshake = tokio::time::timeout(ctx.devices.config.register_timeout, acceptor.accept(stream)).await;
                            match handshake {
                                Ok(Ok(stream)) => connection(ctx, stream, remote, true).await,
                                Ok(Err(e)) => {
                                    ctx.devices.metrics.connection("tls_failed");
                                    tracing::debug!(%remote, error = %e, "edge TLS handshake failed");
                                }
                                Err(_) => ctx.devices.metrics.connection("timeout"),
                            }
                        });
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    ctx.devices.close_all();
}

/// What one connection knows about itself.
struct Conn {
    ctx: Arc<Ctx>,
    link: Arc<Link>,
    principal: Option<Principal>,
    device: Option<Arc<Device>>,
    /// Text tasks being gathered; `None` once one was refused (the rest
    /// of it is dropped until its end frame).
    tasks: HashMap<TaskId, Option<BytesMut>>,
    /// Bytes held by `tasks`, all together.
    task_bytes: usize,
    /// Slots for text tasks at their handler.
    running: Arc<tokio::sync::Semaphore>,
    /// The device's own session, for its text tasks' handler calls.
    runner: Option<Arc<dyn TaskRunner>>,
}

/// What to do after a frame.
enum Next {
    Go,
    Close,
}

/// Runs one device connection to its end.
async fn connection<S>(ctx: Arc<Ctx>, stream: S, remote: SocketAddr, tls: bool)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (link, mut outgoing) = ctx.devices.link(remote, tls);
    let (mut reader, mut writer) = tokio::io::split(stream);
    let writer_link = link.clone();
    let writer_task = tokio::spawn(async move {
        loop {
            tokio::select! {
                next = outgoing.recv() => match next {
                    Some(bytes) => {
                        // A device that stops reading ends its connection.
                        if !matches!(tokio::time::timeout(WRITE_TIMEOUT, writer.write_all(&bytes)).await, Ok(Ok(()))) {
                            break;
                        }
                    }
                    None => break,
                },
                () = writer_link.closed() => {
                    // Whatever was queued before the close (an error message) still goes out, briefly.
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
                        while let Ok(bytes) = outgoing.try_recv() {
                            if writer.write_all(&bytes).await.is_err() {
                                break;
                            }
                        }
                    })
                    .await;
                    break;
                }
            }
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), writer.shutdown()).await;
        writer_link.close();
    });

    let mut conn = Conn {
        ctx: ctx.clone(),
        link: link.clone(),
        principal: None,
        device: None,
        tasks: HashMap::new(),
        task_bytes: 0,
        running: Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING_TASKS)),
        runner: None,
    };
    let mut decoder = Decoder::new(ctx.devices.config.max_frame_bytes);
    let register_by = tokio::time::Instant::now() + ctx.devices.config.register_timeout;
    'read: loop {
        while let Some(decoded) = decoder.next_frame() {
            if link.is_closed() {
                break 'read;
            }
            let next = match decoded {
                Ok(frame) => conn.frame(frame).await,
                Err(e) => {
                    ctx.devices.metrics.frame_error(e.label());
                    tracing::debug!(%remote, error = %e, "edge input skipped");
                    Next::Go
                }
            };
            if let Next::Close = next {
                break 'read;
            }
        }
        let registered = conn.device.is_some();
        let buf = decoder.buffer_mut(16 * 1024);
        tokio::select! {
            read = reader.read_buf(buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            () = link.closed() => break,
            () = tokio::time::sleep_until(register_by), if !registered => {
                conn.error("register_timeout", &format!("no register message within {:?}", ctx.devices.config.register_timeout)).await;
                ctx.devices.metrics.connection("timeout");
                break;
            }
        }
    }
    if conn.device.is_none() && conn.principal.is_none() && !link.is_closed() {
        ctx.devices.metrics.connection("closed");
    }
    link.close();
    let _ = writer_task.await; // bounded: its writes time out
    if let Some(runner) = conn.runner.take() {
        runner.close().await;
    }
    if let Some(device) = conn.device.take() {
        tracing::info!(tenant = %device.tenant, device = %device.name, %remote, "edge device disconnected");
        ctx.devices.refresh_gauges();
        let grace = ctx.devices.config.grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if ctx.devices.remove_if_held(&device.tenant, &device.name, &link) {
                tracing::info!(tenant = %device.tenant, device = %device.name, "edge device removed after its grace period");
                ctx.host.tools_changed(&device.tenant);
            }
        });
    }
}

impl Conn {
    /// Sends an `error` message. A device that does not read its errors
    /// (the queue is full) is disconnected rather than waited for.
    async fn error(&self, code: &str, message: &str) {
        if self.link.try_send_json(&json!({"type": "error", "data": {"code": code, "message": message}})) {
            self.ctx.devices.metrics.frame_out(frames::MCP);
        } else {
            self.link.close();
        }
    }

    /// Refuses anything but `register` before registration: error, close.
    async fn not_registered(&self, message: &str) -> Next {
        self.error("not_registered", message).await;
        self.ctx.devices.metrics.connection("invalid");
        Next::Close
    }

    async fn frame(&mut self, frame: Frame) -> Next {
        let metrics = &self.ctx.devices.metrics;
        metrics.frame_in(frame.kind);
        match frame.kind {
            frames::MCP => self.message(&frame.payload).await,
            frames::TEXT | frames::END if self.device.is_none() => {
                self.not_registered("send a register message first").await
            }
            frames::TEXT => {
                self.text(frame).await;
                Next::Go
            }
            frames::END => {
                self.end(frame.task).await;
                Next::Go
            }
            other if self.device.is_none() => {
                metrics.frame_error("unknown_type");
                self.not_registered(&format!("frame type 0x{other:02x} before register")).await
            }
            other => {
                metrics.frame_error("unknown_type");
                let message = format!(
                    "frame type 0x{other:02x} (task {}) is not one of 0x06 (MCP), 0x04 (text), 0x03 (end); ignored",
                    frame.task_str()
                );
                self.error("unknown_frame_type", &message).await;
                Next::Go
            }
        }
    }

    async fn message(&mut self, payload: &Bytes) -> Next {
        let metrics = &self.ctx.devices.metrics;
        let message: Value = match serde_json::from_slice(payload) {
            Ok(Value::Object(m)) => Value::Object(m),
            _ => {
                metrics.frame_error("bad_json");
                if self.device.is_none() {
                    return self.not_registered("the first message must be a JSON register message").await;
                }
                self.error("bad_json", "an MCP frame must hold one JSON object").await;
                return Next::Go;
            }
        };
        let kind = message.get("type").and_then(Value::as_str).unwrap_or("");
        let data = message.get("data").cloned().unwrap_or(Value::Null);
        match kind {
            "register" => self.register(&data).await,
            _ if self.device.is_none() => {
                self.not_registered("the first message must be {\"type\":\"register\",…}").await
            }
            "result" => {
                let call_id = match data.get("call_id") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => {
                        metrics.frame_error("bad_json");
                        self.error("bad_result", "a result needs data.call_id").await;
                        return Next::Go;
                    }
                };
                let result = data.get("result").cloned().unwrap_or(Value::Null);
                let answer = Answer {
                    success: result.get("success").and_then(Value::as_bool).unwrap_or(false),
                    data: result.get("data").cloned(),
                    error: result.get("error").cloned(),
                };
                if !self.link.answer(&call_id, answer) {
                    metrics.frame_error("unknown_call_id");
                    tracing::debug!(call_id, "edge result for no call in flight (late or unknown); dropped");
                }
                Next::Go
            }
            other => {
                metrics.frame_error("unknown_message");
                self.error("unknown_message", &format!("unknown message type {other:?}; expected register or result"))
                    .await;
                Next::Go
            }
        }
    }

    async fn register(&mut self, data: &Value) -> Next {
        let ctx = self.ctx.clone();
        let metrics = &ctx.devices.metrics;
        let first = self.device.is_none();
        let refuse = |code: &'static str, message: String| (code, message);
        let result: Result<Arc<Device>, (&str, String)> = async {
            let key = data.pointer("/auth/api_key").and_then(Value::as_str);
            let principal = ctx.host.authenticate(key).map_err(|f| {
                refuse(
                    "unauthenticated",
                    f.message().replace(
                        "send it as \"Authorization: Bearer <key>\" or \"X-API-Key: <key>\"",
                        "send it as data.auth.api_key",
                    ),
                )
            })?;
            if let Some(before) = &self.principal {
                if before.tenant.name != principal.tenant.name {
                    return Err(refuse("invalid", "a connection cannot change tenant".into()));
                }
            }
            let name: Arc<str> = match (data.get("device"), &self.device) {
                (Some(Value::String(n)), Some(d)) if *d.name != **n => {
                    return Err(refuse(
                        "invalid",
                        format!("this connection is device {:?}; it cannot be renamed", d.name),
                    ))
                }
                (_, Some(d)) => d.name.clone(),
                (Some(Value::String(n)), None) => Arc::from(n.as_str()),
                (None | Some(Value::Null), None) => Arc::from(generated_name()),
                (Some(_), None) => return Err(refuse("invalid", "data.device must be a string".into())),
            };
            ctx.devices.check_device_name(&name).map_err(|e| refuse("invalid", e.to_string()))?;
            let empty = serde_json::Map::new();
            let registered = match data.get("services") {
                None | Some(Value::Null) => &empty,
                Some(Value::Object(s)) => s,
                Some(_) => {
                    return Err(refuse(
                        "invalid",
                        "data.services must be an object of name → {description, parameters}".into(),
                    ))
                }
            };
            let (mut services, mut refused) = ctx.devices.services(&name, registered);
            // A device tool must not shadow a tool the tenant already sees.
            services.retain(|s| {
                let shadows = ctx.host.sees_tool(&principal.tenant, &s.tool);
                if shadows {
                    refused.push((s.name.clone(), format!("its tool name {:?} is an upstream's tool", s.tool)));
                }
                !shadows
            });
            let device = Device {
                tenant: principal.tenant.name.clone(),
                name,
                services,
                link: self.link.clone(),
                registered_at_ms: switchboard_core::time::now_ms(),
            };
            let (device, taken) = ctx.devices.register(device).map_err(|e| match e {
                super::RegisterError::Full(_) => refuse("full", e.to_string()),
                super::RegisterError::Invalid(m) => refuse("invalid", m),
            })?;
            refused.extend(taken);
            *self.link.key_prefix.lock().expect("lock") = principal.key_prefix.clone();
            self.principal = Some(principal);
            let refused: serde_json::Map<String, Value> =
                refused.into_iter().map(|(n, why)| (n, Value::String(why))).collect();
            let reply = json!({
                "type": "registered",
                "data": {
                    "device": &*device.name,
                    "tools": device.services.iter().map(|s| s.tool.as_str()).collect::<Vec<_>>(),
                    "refused": refused,
                },
            });
            let _ = self.link.send_json(&reply).await;
            metrics.frame_out(frames::MCP);
            Ok(device)
        }
        .await;
        match result {
            Ok(device) => {
                tracing::info!(tenant = %device.tenant, device = %device.name, remote = %self.link.remote, services = device.services.len(), "edge device registered");
                if first {
                    metrics.connection("registered");
                }
                ctx.host.tools_changed(&device.tenant);
                self.device = Some(device);
                Next::Go
            }
            Err((code, message)) => {
                if first {
                    metrics.connection(code);
                }
                self.error(code, &message).await;
                Next::Close
            }
        }
    }

    async fn text(&mut self, frame: Frame) {
        let limit = self.ctx.devices.config.max_frame_bytes * TASK_FRAMES;
        if !self.tasks.contains_key(&frame.task) && self.tasks.len() >= MAX_OPEN_TASKS {
            self.ctx.devices.metrics.task("too_many");
            self.tasks.insert(frame.task, None);
            let message = format!("error: at most {MAX_OPEN_TASKS} text tasks may be open at once");
            self.reply_text(frame.task, &message).await;
            return;
        }
        let slot = self.tasks.entry(frame.task).or_insert_with(|| Some(BytesMut::new()));
        let Some(text) = slot else { return };
        if self.task_bytes + frame.payload.len() > limit {
            self.task_bytes -= text.len();
            *slot = None;
            self.ctx.devices.metrics.task("too_large");
            let message = format!("error: the text tasks of one connection may hold at most {limit} bytes together");
            self.reply_text(frame.task, &message).await;
            return;
        }
        self.task_bytes += frame.payload.len();
        text.extend_from_slice(&frame.payload);
    }

    async fn end(&mut self, task: TaskId) {
        let Some(gathered) = self.tasks.remove(&task) else {
            self.ctx.devices.metrics.frame_error("unknown_task");
            return;
        };
        let Some(bytes) = gathered else { return }; // refused: already answered
        self.task_bytes -= bytes.len();
        let Ok(permit) = self.running.clone().try_acquire_owned() else {
            self.ctx.devices.metrics.task("too_many");
            let message = format!("error: at most {MAX_RUNNING_TASKS} text tasks may be at the handler at once");
            self.reply_text(task, &message).await;
            return;
        };
        let Ok(text) = String::from_utf8(Vec::from(bytes)) else {
            self.ctx.devices.metrics.task("bad_text");
            self.reply_text(task, "error: the text of a task must be UTF-8").await;
            return;
        };
        let principal = self.principal.clone().expect("registered");
        let device = self.device.clone().expect("registered");
        let runner = self.runner.get_or_insert_with(|| self.ctx.host.task_runner(&principal, &device)).clone();
        let ctx = self.ctx.clone();
        let link = self.link.clone();
        tokio::spawn(async move {
            let answer = runner.run(task, text).await;
            send_text(&ctx, &link, task, &answer).await;
            drop(permit);
        });
    }

    async fn reply_text(&self, task: TaskId, text: &str) {
        send_text(&self.ctx, &self.link, task, text).await;
    }
}

/// Sends `text` as text frames of `task`, then its end frame.
async fn send_text(ctx: &Ctx, link: &Link, task: TaskId, text: &str) {
    let mut out = BytesMut::new();
    let max_payload = ctx.devices.config.max_frame_bytes.saturating_sub(32).max(16);
    let n = frames::encode_text(&task, 0, text, max_payload, &mut out);
    frames::encode_end(&task, n as u16, &mut out);
    for _ in 0..n {
        ctx.devices.metrics.frame_out(frames::TEXT);
    }
    ctx.devices.metrics.frame_out(frames::END);
    let _ = link.send_raw(out.freeze()).await;
}

/// A device name for a device that gave none.
fn generated_name() -> String {
    let mut bytes = [0u8; 4];
    let _ = getrandom::fill(&mut bytes);
    format!("device-{}", hex::encode(bytes))
}
