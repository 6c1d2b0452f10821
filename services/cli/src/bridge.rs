//! `switchboard connect URL`: a stdio-to-Streamable-HTTP bridge, for MCP
//! clients that can only launch a command.
//!
//! The local client speaks newline-delimited JSON on our stdin and stdout;
//! the bridge speaks Streamable HTTP to a router (or any MCP server) with the
//! same client machinery the router uses for its upstreams (`upstream::http`):
//! the session id, the protocol version header, SSE answers, the GET stream,
//! re-initialisation if the session is lost. Every message is relayed both
//! ways; ids are left as the client wrote them.
//!
//! A client of the stateless era (2026-07-28: no `initialize`; each request
//! names its version in `params._meta`) is relayed too: each request is one
//! POST with the era's headers (`MCP-Protocol-Version`, `Mcp-Method`,
//! `Mcp-Name`, and the `Mcp-Param-*` headers of arguments the tool's schema
//! marks `x-mcp-header`, learnt from the `tools/list` results relayed), its
//! answer (JSON or a stream) relayed back; a `notifications/cancelled`
//! closes the request's stream, which is how the era cancels.
//!
//! Nothing but MCP messages is written to stdout; diagnostics go to stderr.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use serde_json::Value;
use switchboard_protocol::jsonrpc::{self, code, span, Envelope, MessageKind, Target};
use switchboard_protocol::{modern, ndjson, Method, ProtocolVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use switchboard_router::config::HttpConfig;
use switchboard_upstream::{self as upstream, Channel, Hello, Inbox, Outgoing, Reply, Transport as _};

/// Where the bridge connects, and how.
pub struct Options {
    /// The router's MCP endpoint.
    pub url: Uri,
    /// Headers on every request (for example the router's API key).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Longest wait for one answer.
    pub timeout: Duration,
}

/// Parses a `--header "Name: value"` argument.
pub fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = text.split_once(':').ok_or_else(|| format!("{text:?} is not \"Name: value\""))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| format!("{name:?} is not a header name"))?;
    let mut value = HeaderValue::from_str(value.trim()).map_err(|_| format!("the value of {name} is not valid"))?;
    value.set_sensitive(true);
    Ok((name, value))
}

struct Stdout(mpsc::UnboundedSender<Bytes>);

impl Inbox for Stdout {
    fn deliver(&self, message: Bytes) {
        let _ = self.0.send(message);
    }
}

#[derive(Deserialize)]
struct InitializeParams<'a> {
    #[serde(rename = "protocolVersion", default)]
    protocol_version: Option<String>,
    #[serde(borrow, default)]
    capabilities: Option<&'a RawValue>,
}

/// Runs the bridge until stdin closes; then ends the session.
pub async fn run(options: Options) -> anyhow::Result<()> {
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Bytes>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(message) = out_rx.recv().await {
            if stdout.write_all(&ndjson::encode(&message)).await.is_err() {
                return;
            }
            if out_rx.is_empty() && stdout.flush().await.is_err() {
                return;
            }
        }
    });

    let config = HttpConfig {
        url: options.url.clone(),
        replicas: vec![options.url.clone()],
        health_interval: Duration::from_secs(2),
        headers: options.headers,
        http2: false,
        tls: None,
        // The URL the user typed: wherever it is.
        egress: switchboard_core::egress::Egress::anywhere(),
        connect_timeout: Duration::from_secs(5),
        own: None,
        pool_max_idle: 16,
    };
    let transport = upstream::http::Transport::new(
        Arc::from("router"),
        &config,
        options.timeout,
        Arc::new(switchboard_upstream::Metrics::new(&Default::default(), &[])),
    );
    let transport = Arc::new(transport);
    let mut channel: Option<Arc<dyn Channel>> = None;
    let stateless = Arc::new(Stateless::default());

    let mut stdin = tokio::io::stdin();
    let mut decoder = ndjson::Decoder::new(64 << 20);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = stdin.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        decoder.push(&chunk[..n]);
        loop {
            let line = match decoder.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) => {
                    eprintln!("switchboard connect: {e}");
                    continue;
                }
            };
            let env = match Envelope::parse(&line) {
                Ok(env) => env,
                Err(e) => {
                    let _ = out_tx.send(jsonrpc::error_response(None, e.code(), &e.to_string(), None));
                    continue;
                }
            };
            if channel.is_none() && is_stateless(&env) {
                stateless.relay(&transport, &env, &line, &out_tx, options.timeout);
                continue;
            }
            match (env.kind, &channel) {
                (MessageKind::Request, None) if env.method_str() == "initialize" => {
                    let id = env.id.expect("a request has an id");
                    match initialize(&transport, &env, &out_tx, options.timeout).await {
                        Ok((opened, result)) => {
                            opened.listen();
                            channel = Some(opened);
                            let _ = out_tx.send(jsonrpc::result_response(id, &result));
                        }
                        Err(message) => {
                            let _ =
                                out_tx.send(jsonrpc::error_response(Some(id), code::INTERNAL_ERROR, &message, None));
                        }
                    }
                }
                (MessageKind::Request, None) => {
                    let message = "send initialize first";
                    let _ = out_tx.send(jsonrpc::error_response(env.id, code::INVALID_REQUEST, message, None));
                }
                // The bridge already sent `initialized` during its handshake.
                (MessageKind::Notification, _) if env.method_str() == "notifications/initialized" => {}
                (MessageKind::Notification, None) if env.method_str() == "notifications/cancelled" => {
                    stateless.cancel(&env);
                }
                (MessageKind::Notification | MessageKind::Response | MessageKind::Error, None) => {}
                (MessageKind::Request, Some(channel)) => {
                    let out = outgoing(&env, &line);
                    let id = env.id.expect("a request has an id").to_owned();
                    let channel = channel.clone();
                    let out_tx = out_tx.clone();
                    let timeout = options.timeout;
                    tokio::spawn(async move {
                        match tokio::time::timeout(timeout, forward(&*channel, out, &out_tx)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => {
                                let _ = out_tx.send(jsonrpc::error_response(Some(&id), code::INTERNAL_ERROR, &e, None));
                            }
                            Err(_) => {
                                let message = format!("no answer within {timeout:?}");
                                let _ = out_tx.send(jsonrpc::error_response(
                                    Some(&id),
                                    code::REQUEST_TIMEOUT,
                                    &message,
                                    None,
                                ));
                            }
                        }
                    });
                }
                (_, Some(channel)) => {
                    if let Err(e) = channel.send(line.clone()).await {
                        eprintln!("switchboard connect: could not deliver a {}: {e}", env.method_str());
                    }
                }
            }
        }
    }
    if let Some(channel) = channel {
        channel.close().await;
    }
    stateless.cancel_all();
    drop(out_tx);
    drop(transport);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    Ok(())
}

/// Opens the session with the client's own version and capabilities and
/// returns the server's `initialize` result for the client.
async fn initialize(
    transport: &upstream::http::Transport,
    env: &Envelope<'_>,
    out_tx: &mpsc::UnboundedSender<Bytes>,
    timeout: Duration,
) -> Result<(Arc<dyn Channel>, Vec<u8>), String> {
    let params = env.params.map_or("{}", RawValue::get);
    let params: InitializeParams<'_> = serde_json::from_str(params).map_err(|e| format!("initialize: {e}"))?;
    let version =
        params.protocol_version.as_deref().and_then(ProtocolVersion::parse).unwrap_or(ProtocolVersion::LATEST);
    let capabilities: Arc<RawValue> = match params.capabilities {
        Some(c) => Arc::from(c.to_owned()),
        None => Arc::from(upstream::empty_object()),
    };
    let hello = Hello { protocol_version: version, capabilities, affinity: Arc::from(""), credentials: None };
    let inbox: Arc<dyn Inbox> = Arc::new(Stdout(out_tx.clone()));
    let channel = tokio::time::timeout(timeout, transport.open(&hello, inbox))
        .await
        .map_err(|_| format!("the server did not answer initialize within {timeout:?}"))?
        .map_err(|e| format!("cannot reach the server: {e}"))?;
    let h = channel.handshake();
    let mut result = json!({
        "protocolVersion": h.protocol_version,
        "capabilities": h.capabilities,
        "serverInfo": h.server_info,
    });
    if let Some(instructions) = &h.instructions {
        result["instructions"] = json!(instructions);
    }
    Ok((channel, serde_json::to_vec(&result).expect("serializable")))
}

/// Whether a message is a stateless-era request (its `_meta` names a
/// 2026-07-28 or later version).
fn is_stateless(env: &Envelope<'_>) -> bool {
    env.kind == MessageKind::Request
        && modern::request_meta(env.params)
            .ok()
            .flatten()
            .and_then(|m| m.protocol_version)
            .and_then(|v| ProtocolVersion::parse(&v))
            .is_some_and(ProtocolVersion::is_modern)
}

/// The stateless era's requests in flight, and what `tools/list` taught
/// about the headers tools mirror.
#[derive(Default)]
struct Stateless {
    /// Requests in flight by id (JSON text): cancelled by aborting them.
    inflight: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    /// Tools whose arguments go into `Mcp-Param-*` headers: their definitions.
    mirrored: Mutex<HashMap<String, Value>>,
}

impl Stateless {
    /// Relays one request as one POST, its answer back to stdout.
    fn relay(
        self: &Arc<Self>,
        transport: &Arc<upstream::http::Transport>,
        env: &Envelope<'_>,
        line: &Bytes,
        out_tx: &mpsc::UnboundedSender<Bytes>,
        timeout: Duration,
    ) {
        let method = Method::from_name(env.method_str());
        let id = env.id.expect("a request has an id").to_owned();
        let headers = self.headers(method, env);
        let learn = method == Method::ToolsList;
        let (me, transport, out_tx, line) = (self.clone(), transport.clone(), out_tx.clone(), line.clone());
        let key = id.get().to_owned();
        let task = tokio::spawn({
            let key = key.clone();
            async move {
                let result = tokio::time::timeout(timeout, async {
                    let answer = transport.modern(line, method, headers, "", None).await.map_err(|e| e.to_string())?;
                    match answer.reply {
                        Reply::Done(message) => {
                            if learn {
                                me.learn(&message);
                            }
                            let _ = out_tx.send(message);
                        }
                        Reply::Stream(mut stream) => {
                            while let Some(message) = stream.next().await {
                                let message = message.map_err(|e| e.to_string())?;
                                let last = Envelope::parse(&message).is_ok_and(|e| {
                                    matches!(e.kind, MessageKind::Response | MessageKind::Error)
                                        && e.id.is_some_and(|i| i.get() == key)
                                });
                                if last && learn {
                                    me.learn(&message);
                                }
                                let _ = out_tx.send(message);
                                if last {
                                    break;
                                }
                            }
                        }
                    }
                    Ok::<(), String>(())
                })
                .await;
                let error = match result {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some((code::INTERNAL_ERROR, e)),
                    Err(_) => Some((code::REQUEST_TIMEOUT, format!("no answer within {timeout:?}"))),
                };
                if let Some((code, message)) = error {
                    let _ = out_tx.send(jsonrpc::error_response(Some(&id), code, &message, None));
                }
                me.inflight.lock().expect("lock").remove(&key);
            }
        });
        let mut inflight = self.inflight.lock().expect("lock");
        if !task.is_finished() {
            inflight.insert(key, task.abort_handle());
        }
    }

    /// The era's headers besides the version and method: `Mcp-Name`, and
    /// the `Mcp-Param-*` headers of a tool that mirrors arguments.
    fn headers(&self, method: Method, env: &Envelope<'_>) -> Vec<(HeaderName, HeaderValue)> {
        let mut headers = Vec::new();
        let Some(target) = env.params.and_then(|p| Target::parse(p).ok()) else { return headers };
        let named = match method {
            Method::ToolsCall | Method::PromptsGet => target.name,
            Method::ResourcesRead => target.uri,
            _ => None,
        };
        let Some(name) = named.and_then(jsonrpc::as_str) else { return headers };
        if let Ok(value) = HeaderValue::from_str(&modern::header_value_text(&name)) {
            headers.push((HeaderName::from_static("mcp-name"), value));
        }
        if method == Method::ToolsCall {
            if let Some(tool) = self.mirrored.lock().expect("lock").get(&*name) {
                let params: Value = env.params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_default();
                for (header, value) in modern::mirrored_params(tool, params.get("arguments")) {
                    if let (Ok(h), Ok(v)) = (HeaderName::from_bytes(header.as_bytes()), HeaderValue::from_str(&value)) {
                        headers.push((h, v));
                    }
                }
            }
        }
        headers
    }

    /// Keeps the definitions of the tools in a `tools/list` result that
    /// mirror arguments into headers.
    fn learn(&self, message: &[u8]) {
        if !message.windows(14).any(|w| w == b"\"x-mcp-header\"") {
            return;
        }
        let Ok(value) = serde_json::from_slice::<Value>(message) else { return };
        let Some(tools) = value.pointer("/result/tools").and_then(Value::as_array) else { return };
        let mut mirrored = self.mirrored.lock().expect("lock");
        for tool in tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                if tool.to_string().contains("\"x-mcp-header\"") {
                    mirrored.insert(name.to_owned(), tool.clone());
                }
            }
        }
    }

    /// A `notifications/cancelled`: the request's stream is closed, which
    /// the router takes as the cancellation.
    fn cancel(&self, env: &Envelope<'_>) {
        let Some(id) = env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.request_id) else { return };
        if let Some(task) = self.inflight.lock().expect("lock").remove(id.get()) {
            task.abort();
        }
    }

    fn cancel_all(&self) {
        for (_, task) in self.inflight.lock().expect("lock").drain() {
            task.abort();
        }
    }
}

fn outgoing(env: &Envelope<'_>, line: &Bytes) -> Outgoing {
    let id = span(line, env.id.expect("a request has an id").get());
    let progress_token =
        env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.progress_token).map(|t| span(line, t.get()));
    Outgoing { body: line.clone(), method: Method::from_name(env.method_str()), id, progress_token, traceparent: None }
}

async fn forward(channel: &dyn Channel, out: Outgoing, out_tx: &mpsc::UnboundedSender<Bytes>) -> Result<(), String> {
    match channel.request(out).await.map_err(|e| e.to_string())? {
        Reply::Done(message) => {
            let _ = out_tx.send(message);
        }
        Reply::Stream(mut stream) => {
            while let Some(message) = stream.next().await {
                let message = message.map_err(|e| e.to_string())?;
                let last = Envelope::parse(&message)
                    .is_ok_and(|e| matches!(e.kind, MessageKind::Response | MessageKind::Error));
                let _ = out_tx.send(message);
                if last {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Messages not tied to the call are not shown by `switchboard call`.
struct Ignore;

impl Inbox for Ignore {
    fn deliver(&self, _message: Bytes) {}
}

/// `switchboard call`: one `tools/call` through a fresh session (initialize,
/// call, end the session). Returns the JSON-RPC response.
pub async fn call_tool(
    url: http::Uri,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    timeout: Duration,
    name: &str,
    arguments: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let config = HttpConfig {
        replicas: vec![url.clone()],
        url,
        health_interval: Duration::from_secs(2),
        headers,
        http2: false,
        tls: None,
        // The URL the user typed: wherever it is.
        egress: switchboard_core::egress::Egress::anywhere(),
        connect_timeout: Duration::from_secs(5),
        own: None,
        pool_max_idle: 1,
    };
    let transport = upstream::http::Transport::new(
        Arc::from("router"),
        &config,
        timeout,
        Arc::new(switchboard_upstream::Metrics::new(&Default::default(), &[])),
    );
    let hello = Hello {
        protocol_version: switchboard_protocol::ProtocolVersion::LATEST,
        capabilities: Arc::from(upstream::empty_object()),
        affinity: Arc::from(""),
        credentials: None,
    };
    let channel = tokio::time::timeout(timeout, transport.open(&hello, Arc::new(Ignore)))
        .await
        .map_err(|_| anyhow::anyhow!("no answer to initialize within {timeout:?}"))??;
    let params = serde_json::json!({"name": name, "arguments": arguments}).to_string();
    let (out, id) = Outgoing::own("tools/call", params.as_bytes(), "call");
    let answer = tokio::time::timeout(timeout, async {
        let reply = channel.request(out).await?;
        upstream::collect_response(reply, &id).await
    })
    .await;
    channel.close().await;
    let answer = answer.map_err(|_| anyhow::anyhow!("no answer within {timeout:?}"))??;
    Ok(serde_json::from_slice(&answer)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_arguments() {
        let (name, value) = parse_header("Authorization: Bearer abc:def").unwrap();
        assert_eq!(name, "authorization");
        assert_eq!(value, "Bearer abc:def");
        assert!(value.is_sensitive());
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("bad name: x").is_err());
    }
}
