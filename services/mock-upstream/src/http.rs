//! Streamable HTTP for the mock: POST, GET and DELETE on `/mcp`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use switchboard_protocol::jsonrpc::{self, code};
use switchboard_protocol::sse;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::body::Body;
use std::sync::atomic::Ordering;

use crate::mcp::{GetMode, Reply, Server, Session};

const SESSION_HEADER: &str = "mcp-session-id";
const MAX_BODY: usize = 64 << 20;

pub(crate) async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let server = server.clone();
                let service = hyper::service::service_fn(move |req| {
                    let server = server.clone();
                    async move { Ok::<_, Infallible>(route(server, req).await) }
                });
                match &tls {
                    None => {
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                        let conn = graceful.watch(conn.into_owned());
                        tokio::spawn(async move {
                            let _ = conn.await;
                        });
                    }
                    Some(acceptor) => {
                        // The handshake on the connection's own task; a failed one just ends it.
                        let (acceptor, builder, watcher) = (acceptor.clone(), builder.clone(), graceful.watcher());
                        tokio::spawn(async move {
                            let Ok(stream) = acceptor.accept(stream).await else { return };
                            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                            let _ = watcher.watch(conn.into_owned()).await;
                        });
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    crate::modern::close_listeners(&server);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
    }
    Ok(())
}

async fn route(server: Arc<Server>, req: Request<Incoming>) -> Response<Body> {
    let version = if req.version() == http::Version::HTTP_2 { &server.stats.http2 } else { &server.stats.http1 };
    version.fetch_add(1, Ordering::Relaxed);
    let host = req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("").to_owned();
    if let Some(issuer) = &server.opts.authorization_server {
        if req.uri().path().starts_with("/.well-known/oauth-protected-resource") {
            let metadata = serde_json::json!({
                "resource": format!("http://{host}/mcp"),
                "authorization_servers": [issuer],
                "scopes_supported": ["mcp:list", "mcp:call"],
            });
            return json(StatusCode::OK, Bytes::from(metadata.to_string()));
        }
    }
    if req.uri().path() != "/mcp" {
        return plain(StatusCode::NOT_FOUND, "not found");
    }
    if server.opts.check_host && !local_host_and_origin(req.headers()) {
        let body =
            jsonrpc::error_response(None, code::INVALID_REQUEST, "Forbidden: Host or Origin is not localhost", None);
        return json(StatusCode::FORBIDDEN, body);
    }
    if server.opts.require_auth && !req.headers().contains_key(http::header::AUTHORIZATION) {
        let body = jsonrpc::error_response(
            None,
            code::INVALID_REQUEST,
            "Unauthorized: this server needs a bearer token",
            None,
        );
        let mut response = json(StatusCode::UNAUTHORIZED, body);
        let challenge = match &server.opts.authorization_server {
            Some(_) => HeaderValue::from_str(&format!(
                "Bearer resource_metadata=\"http://{host}/.well-known/oauth-protected-resource/mcp\""
            ))
            .unwrap_or_else(|_| HeaderValue::from_static("Bearer")),
            None => HeaderValue::from_static("Bearer realm=\"mock\""),
        };
        response.headers_mut().insert(http::header::WWW_AUTHENTICATE, challenge);
        return response;
    }
    let session_id = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    if server.opts.modern
        && matches!(*req.method(), Method::GET | Method::DELETE)
        && crate::modern::is_modern_get(req.headers())
    {
        return crate::modern::method_not_allowed();
    }
    match *req.method() {
        Method::POST => post(server, session_id, req).await,
        Method::GET => {
            let last = req.headers().get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
            if last.is_none() && server.get_mode() == GetMode::Hold {
                server.held_gets.fetch_add(1, Ordering::Relaxed);
                return std::future::pending().await;
            }
            get(server, session_id, last)
        }
        Method::DELETE => match session_id {
            Some(id) if server.close_session(&id) => plain(StatusCode::OK, ""),
            _ => unknown_session(&server),
        },
        _ => plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
    }
}

/// Whether the `Host` (and the `Origin`, if any) name this machine.
fn local_host_and_origin(headers: &http::HeaderMap) -> bool {
    fn local(authority: &str) -> bool {
        let host = match authority.strip_prefix('[') {
            Some(rest) => rest.split(']').next().unwrap_or_default(),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        matches!(host.to_ascii_lowercase().as_str(), "localhost" | "127.0.0.1" | "::1")
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    host.is_none_or(local)
        && origin.is_none_or(|o| o == "null" || o.split_once("://").is_some_and(|(_, authority)| local(authority)))
}

async fn post(server: Arc<Server>, session_id: Option<String>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return plain(StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
    };
    if server.opts.modern && session_id.is_none() && crate::modern::wants(&parts.headers, &body) {
        return crate::modern::post(server, &parts.headers, body).await;
    }
    let (session, new_session) = if server.opts.stateless {
        (server.shared().clone(), false)
    } else if looks_like_initialize(&body) {
        (server.open_session(), true)
    } else {
        match session_id.as_deref().and_then(|id| server.session(id)) {
            Some(s) => (s, false),
            None if session_id.is_none() => {
                let body = jsonrpc::error_response(
                    None,
                    code::INVALID_REQUEST,
                    "Bad Request: Mcp-Session-Id header is required",
                    None,
                );
                return json(StatusCode::BAD_REQUEST, body);
            }
            None => return unknown_session(&server),
        }
    };
    let authorization = parts.headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    session.saw_authorization(authorization);
    let traceparent = parts.headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_owned);
    *session.traceparent.lock().expect("lock") = traceparent;
    let reply = server.handle(&session, body).await;
    let mut response = match reply {
        Reply::Accepted => plain(StatusCode::ACCEPTED, ""),
        Reply::Json(bytes) => json(StatusCode::OK, bytes),
        Reply::Invalid(bytes) => json(StatusCode::BAD_REQUEST, bytes),
        Reply::Stream(rx) if server.opts.resumable_streams && !server.opts.stateless => {
            resumable_response(&session, rx)
        }
        Reply::Stream(rx) => sse_response(rx),
        Reply::Polled(rx) => polled_response(&session, server.opts.poll_retry, rx),
    };
    if new_session {
        response
            .headers_mut()
            .insert(SESSION_HEADER, HeaderValue::from_str(&session.id).expect("hex is a valid header"));
    }
    response
}

fn looks_like_initialize(body: &[u8]) -> bool {
    body.windows(12).any(|w| w == b"\"initialize\"")
        && jsonrpc::Envelope::parse(body).is_ok_and(|env| env.method_str() == "initialize")
}

fn get(server: Arc<Server>, session_id: Option<String>, last_event_id: Option<String>) -> Response<Body> {
    if server.opts.stateless || server.get_mode() == GetMode::Refuse {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "this server has no GET stream");
    }
    let Some(session) = session_id.as_deref().and_then(|id| server.session(id)) else {
        return unknown_session(&server);
    };
    if let Some((stream, seq)) = last_event_id.as_deref().and_then(|id| id.split_once('-')) {
        let (Ok(stream), Ok(seq)) = (stream.parse::<u64>(), seq.parse::<usize>()) else {
            return plain(StatusCode::BAD_REQUEST, "bad Last-Event-ID");
        };
        return resume(session, stream, seq);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    session.set_unsolicited(tx);
    sse_response(rx)
}

/// An SSE answer that ends right after its priming event; the messages are
/// kept for a GET with `Last-Event-ID`.
fn polled_response(
    session: &Arc<Session>,
    retry: std::time::Duration,
    mut messages: mpsc::UnboundedReceiver<Bytes>,
) -> Response<Body> {
    let stream = session.next_stream.fetch_add(1, Ordering::Relaxed);
    session.polled.lock().expect("lock").insert(stream, Vec::new());
    let session = session.clone();
    tokio::spawn(async move {
        while let Some(message) = messages.recv().await {
            session.polled.lock().expect("lock").entry(stream).or_default().push(message);
        }
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(Bytes::from(format!("id: {stream}-0\nretry: {}\ndata: \n\n", retry.as_millis())));
    drop(tx);
    let mut response = Response::new(Body::Stream(rx));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

/// An SSE answer whose events are kept (numbered `STREAM-N`, N from 1)
/// for a GET with `Last-Event-ID`; the messages are kept even once the
/// client has gone.
fn resumable_response(session: &Arc<Session>, mut messages: mpsc::UnboundedReceiver<Bytes>) -> Response<Body> {
    let stream = session.next_stream.fetch_add(1, Ordering::Relaxed);
    session.polled.lock().expect("lock").insert(stream, Vec::new());
    let (tx, rx) = mpsc::unbounded_channel();
    let session = session.clone();
    tokio::spawn(async move {
        while let Some(message) = messages.recv().await {
            let n = {
                let mut polled = session.polled.lock().expect("lock");
                let kept = polled.entry(stream).or_default();
                kept.push(message.clone());
                kept.len()
            };
            let _ = tx.send(sse::encode_event(Some(&format!("{stream}-{n}")), None, &message));
        }
    });
    let mut response = Response::new(Body::Stream(rx));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

/// Sends a kept stream's events after `seq`, as they come, up to the
/// answer (at most a minute).
fn resume(session: Arc<crate::mcp::Session>, stream: u64, seq: usize) -> Response<Body> {
    if !session.polled.lock().expect("lock").contains_key(&stream) {
        return plain(StatusCode::NOT_FOUND, "unknown stream");
    }
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut sent = seq;
        for _ in 0..6000 {
            let ready: Vec<Bytes> = session
                .polled
                .lock()
                .expect("lock")
                .get(&stream)
                .map(|e| e.iter().skip(sent).cloned().collect())
                .unwrap_or_default();
            for message in ready {
                sent += 1;
                if tx.send(sse::encode_event(Some(&format!("{stream}-{sent}")), None, &message)).is_err() {
                    return;
                }
                let answered = jsonrpc::Envelope::parse(&message)
                    .is_ok_and(|env| matches!(env.kind, jsonrpc::MessageKind::Response | jsonrpc::MessageKind::Error));
                if answered {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    });
    let mut response = Response::new(Body::Stream(rx));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

fn unknown_session(server: &Server) -> Response<Body> {
    let status = StatusCode::from_u16(server.opts.unknown_session_status).unwrap_or(StatusCode::NOT_FOUND);
    json(status, jsonrpc::error_response(None, code::REQUEST_TIMEOUT, "Session not found", None))
}

/// Turns a channel of JSON messages into an SSE body.
fn sse_response(mut messages: mpsc::UnboundedReceiver<Bytes>) -> Response<Body> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = messages.recv().await {
            if tx.send(sse::encode_event(None, None, &message)).is_err() {
                break;
            }
        }
    });
    let mut response = Response::new(Body::Stream(rx));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn json(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::Full(Some(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(if text.is_empty() {
        Body::Empty
    } else {
        Body::Full(Some(Bytes::from_static(text.as_bytes())))
    });
    *response.status_mut() = status;
    response
}
