//! The legacy HTTP+SSE transport (MCP 2024-11-05), for clients that still
//! speak it: `GET /sse` opens the connection and its first event, `endpoint`,
//! names where to POST (`/messages?sessionId=…`, keeping any path prefix the
//! router is reached under); every answer and server message then arrives on
//! that one SSE stream.
//!
//! This is framing only: `initialize` creates an ordinary session whose id
//! is the connection's, requests go through the same phases as on `/mcp`,
//! and their answers (JSON, or relayed SSE events) are moved onto the
//! session's stream 0, which the `/sse` response reads. Closing the `/sse`
//! connection ends the session.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind};
use switchboard_protocol::sse;
use tokio::sync::mpsc;

use super::transport::check_origin;
use super::{lists, notification, request, respond};
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use crate::exchange::{Exchange, Refusal};
use crate::headers::Headers;
use switchboard_core::ids::random_id;
use switchboard_session::Session;

/// `GET …/sse`: a new connection; `prefix` is the path before `/sse`.
pub async fn open(app: &Arc<App>, map: &HeaderMap, connection: &http::Extensions, prefix: &str) -> Response<Body> {
    let headers = Headers::Map(map);
    let mut x = Exchange::new(app, Instant::now(), connection);
    if let Err(e) = check_origin(app, headers) {
        return x.reject(None, e);
    }
    let who = match x.authenticate(headers).await {
        Ok(who) => who,
        Err(e) => return x.refuse(headers, None, 0, e, "GET /sse"),
    };
    if app.shutting_down() {
        return x.reject(None, Error::ShuttingDown);
    }
    x.discard();
    let id = random_id();
    let forwarded = map.get("x-forwarded-prefix").and_then(|v| v.to_str().ok()).unwrap_or("");
    let endpoint = format!("{}{prefix}/messages?sessionId={id}", forwarded.trim_end_matches('/'));
    let (tx, rx) = mpsc::channel(64);
    let _ = tx.try_send(sse::encode_event(None, Some("endpoint"), endpoint.as_bytes()));
    app.legacy_connect(id, tx, &who);
    respond::sse(rx, app.config.server.keep_alive)
}

/// `POST …/messages?sessionId=ID`: one message from the client; answers go
/// out on its `/sse` stream, the POST itself gets 202.
pub async fn message(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let mut x = Exchange::new(app, Instant::now(), &parts.extensions);
    let Some(id) = parts
        .uri
        .query()
        .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("sessionId=")).filter(|id| !id.is_empty()))
    else {
        return x.reject(None, Error::MissingSession);
    };
    let id: Arc<str> = Arc::from(id);
    message_phases(x, id, parts.headers, body).await.unwrap_or_else(|refusal| *refusal)
}

/// The phases of `/mcp`, but for the session: named in the query, and held
/// by this replica alone; `Err` is a refusal to send.
async fn message_phases(
    mut x: Exchange,
    id: Arc<str>,
    map: HeaderMap,
    body: Incoming,
) -> Result<Response<Body>, Refusal> {
    let app = x.app().clone();
    let headers = Headers::Map(&map);
    let body = crate::downstream::transport::PostBody::incoming(body, &map);
    let body = x.receive(headers, body).await?;
    let env = x.parse(headers, &body, None)?;
    let who = x.authenticate(headers).await.map_err(|e| x.refuse(headers, Some(&env), body.len(), e, "POST"))?;
    if env.kind == MessageKind::Request {
        x.admit(&env).await.map_err(|e| x.refuse(headers, Some(&env), body.len(), e, "POST"))?;
    }
    if env.kind == MessageKind::Request && env.method_str() == "initialize" {
        let stream = app.legacy_take(&id, &who).ok_or_else(|| x.reject(env.id, Error::UnknownSession))?;
        x.discard();
        return Ok(match lists::open_session(&app, &who, &env, Some(id.clone())).await {
            Ok((session, answer)) => {
                attach(&app, &session, stream);
                // A fresh stream: the answer fits.
                let _ = session.push_answer(answer);
                accepted()
            }
            Err(e) => {
                // The answer belongs on the SSE stream; keep the connection for a retry.
                let error = jsonrpc::error_response(env.id, e.code(), &e.to_string(), e.data().as_ref());
                let _ = stream.try_send(sse::encode_event(None, None, &error));
                app.legacy_connect(id, stream, &who);
                accepted()
            }
        });
    }
    // A tenant's shared session (stateless clients' calls) is no client's
    // to post to, though its id can be worked out from the tenant's name.
    let session = app
        .sessions
        .get(&id)
        .filter(|s| s.tenant == who.tenant.name && s.key == who.key_id && !s.for_tenant)
        .ok_or_else(|| x.reject(env.id, Error::UnknownSession))?;
    x.set_session(&session);
    session.touch();
    match env.kind {
        MessageKind::Request => {
            // Answer in the background; the answer goes out on the SSE stream.
            tokio::spawn(async move {
                let Ok(env) = Envelope::parse(&body) else { return };
                let response = request(x, Headers::Map(&map), &session, &env, &body, true).await;
                move_to_stream(&app, &session, response).await;
            });
        }
        MessageKind::Notification => {
            x.discard();
            notification(&app, &session, &env, &body).await;
        }
        MessageKind::Response | MessageKind::Error => {
            if let Err(e) = super::answer(&app, &who, &session, &env, &body).await {
                return Err(Box::new(x.reject(None, e)));
            }
            x.discard();
        }
    }
    Ok(accepted())
}

/// Feeds the session's stream 0 into the `/sse` response; when the client
/// closes that connection, the session ends.
fn attach(app: &Arc<App>, session: &Arc<Session>, stream: mpsc::Sender<Bytes>) {
    let mut events = match session.open_stream(None) {
        Ok(events) => events,
        Err(_) => return,
    };
    let app = app.clone();
    let session = session.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => if stream.send(event).await.is_err() { break },
                    None => break,
                },
                () = stream.closed() => break,
            }
        }
        app.sessions.end_here(&session.id).await;
    });
}

/// Moves one answer (a JSON body, or the messages of an SSE body) onto the
/// session's stream 0. A client that has read none of what waits there, up
/// to twice the usual bounds, has its session ended; a server request that
/// does not fit is refused back to its upstream.
async fn move_to_stream(app: &Arc<App>, session: &Arc<Session>, response: Response<Body>) {
    let is_sse = response.headers().get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut body = response.into_body();
    let not_reading = || async {
        tracing::warn!(session = %session.id, "a legacy SSE client reads none of its answers; its session is ended");
        app.sessions.end_here(&session.id).await;
    };
    if !is_sse {
        let Ok(collected) = body.collect().await;
        let bytes = collected.to_bytes();
        if !bytes.is_empty() && !session.push_answer(bytes) {
            not_reading().await;
        }
        return;
    }
    let mut decoder = sse::Decoder::new(usize::MAX);
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else { continue };
        decoder.push(&data);
        while let Ok(Some(event)) = decoder.next_event() {
            if event.data.is_empty() {
                continue;
            }
            // The answer always; what came before it, as room allows (the
            // request's own stream already bounded it).
            let is_answer = jsonrpc::Envelope::parse(&event.data)
                .is_ok_and(|e| matches!(e.kind, jsonrpc::MessageKind::Response | jsonrpc::MessageKind::Error));
            if is_answer {
                if !session.push_answer(event.data) {
                    not_reading().await;
                    return;
                }
            } else if !session.push(event.data.clone(), None) {
                refuse_relayed(app, session, &event.data);
            }
        }
    }
}

/// A relayed message a legacy client could not be given (`message`, as the
/// client would have seen it): a server request is refused back to its
/// upstream under the upstream's own id; anything else is dropped.
fn refuse_relayed(app: &App, session: &Session, message: &Bytes) {
    use switchboard_session::Relay as _;
    let Ok(env) = Envelope::parse(message) else { return };
    let routed = env.id.filter(|_| env.kind == MessageKind::Request).and_then(|id| session.answered(id));
    match routed {
        Some((u, theirs)) => {
            let original = jsonrpc::request(Some(theirs.as_bytes()), env.method_str(), None);
            app.not_delivered(session, u, &original, "client_backlog");
        }
        None => {
            tracing::debug!(session = %session.id, "a message for a legacy client that is not reading its stream was dropped")
        }
    }
}

fn accepted() -> Response<Body> {
    let mut response = Response::new(Body::full(Bytes::from_static(b"Accepted")));
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}
