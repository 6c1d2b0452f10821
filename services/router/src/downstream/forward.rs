//! Phase 7 of a session's request to a session-era upstream: send the
//! request (resolved and rewritten by `resolve.rs`) on the session's channel,
//! and relay the answer — as one JSON body, or as an SSE stream when the
//! upstream streams (progress, logging, server-to-client requests).
//!
//! The hot path: the body is never decoded beyond the envelope and the routing
//! members of `params`; arguments and results travel as the bytes received.

use std::sync::Arc;
use switchboard_session::Relay as _;

use bytes::Bytes;
use http::Response;
use serde_json::value::RawValue;
use switchboard_core::{Outcome, UpstreamId};
use switchboard_protocol::jsonrpc::{self, span, Envelope, MessageKind};
use switchboard_protocol::{Method, ProtocolVersion};
use switchboard_session::events::Log;
use switchboard_session::Session;
use switchboard_upstream::{Channel, Item, MessageStream, Outgoing, Reply, UpstreamError};
use tokio::sync::mpsc;

use super::origin::record_origin;
use super::resolve::{answer, call_local, error_code, not_the_answer, parse_answer, resolve, Resolution};
use super::respond;
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use crate::exchange::{cancel_upstream, Exchange};

/// The `retry:` hint sent with priming events.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait passed on from an upstream's `retry:` (the upstream
/// stream is resumed after at most this long too).
const MAX_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// Phase 6, resolve, then phase 7: forwards and answers one request of a
/// session. The exchange is finished however it ends.
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
pub fn forward<'a, 'e>(
    mut x: Exchange,
    session: &'a Arc<Session>,
    method: Method,
    env: &'a Envelope<'e>,
    body: &'a Bytes,
    accepts_sse: bool,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'e> {
    async move {
        let id = env.id.expect("a request has an id");
        let who = x.principal().expect("authenticated").clone();
        let traceparent = x.upstream_traceparent();
        let resolved = match resolve(x.app(), &who, method, env, body, traceparent.as_deref()).await {
            Ok(Resolution::Upstream(resolved)) => resolved,
            Ok(Resolution::Local(tool, named)) => {
                x.set_target(named);
                return respond::json(Box::pin(call_local(x, tool, id)).await);
            }
            Err(e) => {
                let outcome = match e {
                    _ if e.side() == crate::error::Side::Upstream => Outcome::UpstreamFailed,
                    Error::InvalidParams(_) => Outcome::Rejected,
                    _ => Outcome::Error,
                };
                return x.fail_as(Some(id), &e, outcome);
            }
        };
        let mut resolved = resolved;
        let u = resolved.upstream;
        x.served_by(u);
        if let Some(named) = resolved.target.take() {
            x.set_target(named);
        }
        let app = x.app().clone();
        if super::authorize::era_catalog(&app, &who, u).is_stateless_only(u) {
            if matches!(method, Method::ResourcesSubscribe | Method::ResourcesUnsubscribe) {
                return Box::pin(super::stateless_upstream::subscribe(x, session, method, id, resolved)).await;
            }
            return Box::pin(super::stateless_upstream::forward(x, session, method, id, resolved, accepts_sse)).await;
        }
        let upstream = &app.upstreams[u];
        let channel = match channel(session, u).await {
            Ok(channel) => channel,
            Err((e, outcome)) => return x.fail_as(Some(id), &e, outcome),
        };
        // One clock read for the deadline and the time it went upstream.
        let now = tokio::time::Instant::now();
        let deadline = now + upstream.config.timeout;
        // Noted by its id in the client's body (shared, not copied): the same
        // id the rewritten body carries.
        x.in_flight(session, u, body, span(body, id.get()));
        let sent_body = resolved.body.clone();
        let sent: &RawValue = serde_json::from_slice(&sent_body[resolved.id.clone()]).expect("the id is JSON");
        let out = Outgoing {
            body: resolved.body,
            method,
            id: resolved.id,
            progress_token: resolved.progress_token,
            traceparent: resolved.traceparent,
        };
        x.upstream_sent(now.into_std());
        let request = std::pin::pin!(switchboard_upstream::request(channel.as_ref(), out));
        match crate::deadline::until(deadline, request).await {
            Err(_) => {
                cancel_upstream(&app, session, u, id.get(), "timeout");
                let e = Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout };
                x.fail_as(Some(id), &e, Outcome::Timeout)
            }
            Ok(Err(e)) => x.fail_as(Some(id), &Error::upstream(&upstream.name, e), Outcome::UpstreamFailed),
            Ok(Ok(Reply::Done(message))) => match parse_answer(&app, u, method, &message, sent, id) {
                Some((message, outcome)) => {
                    let code = error_code(outcome, &message);
                    x.add_sent(message.len());
                    x.finish(outcome, code);
                    respond::json(message)
                }
                None => {
                    let e = not_the_answer(&app, u);
                    x.fail_as(Some(id), &e, Outcome::UpstreamFailed)
                }
            },
            Ok(Ok(Reply::Stream(stream))) => {
                let call = Call {
                    x,
                    session: session.clone(),
                    upstream: u,
                    method,
                    id: sent.to_owned(),
                    client_id: id.to_owned(),
                    deadline,
                };
                if !accepts_sse {
                    return Box::pin(call.drain(stream)).await;
                }
                // The relay finishes the exchange from here, client or no client.
                let log = session.new_stream();
                call.record_origin(&log, channel.as_ref());
                if session.version >= ProtocolVersion::V2025_11_25 && !session.legacy {
                    // Something to resume from before the first real event.
                    log.prime(RETRY);
                }
                let (tx, rx) = mpsc::channel(64);
                tokio::spawn(log.clone().reader(None, tx));
                tokio::spawn(call.relay(stream, log));
                respond::sse(rx, app.config.server.keep_alive)
            }
        }
    }
}

/// The session's channel to upstream `u`, opened on first use; a failure
/// with the outcome it gives the request (a timeout, or the upstream failed).
pub(crate) async fn channel(session: &Session, u: UpstreamId) -> Result<Arc<dyn Channel>, (Error, Outcome)> {
    session.channel(u).await.map_err(|e| {
        let e = Error::from(e);
        let outcome =
            if matches!(e, Error::UpstreamTimeout { .. }) { Outcome::Timeout } else { Outcome::UpstreamFailed };
        (e, outcome)
    })
}

/// A forwarded request whose answer streams. It owns the exchange, and
/// finishes it when the answer (or a failure in its place) is relayed.
pub(crate) struct Call {
    pub x: Exchange,
    pub session: Arc<Session>,
    pub upstream: UpstreamId,
    pub method: Method,
    /// The id the upstream knows the request by.
    pub id: Box<RawValue>,
    /// The client's id of the request (the same unless the router mapped it).
    pub client_id: Box<RawValue>,
    pub deadline: tokio::time::Instant,
}

/// What one upstream message means for the call.
pub(crate) enum Step {
    /// The response: the call is over.
    Done(Bytes, Outcome),
    /// A related message for the client: as the client gets it, as the
    /// upstream sent it (to refuse it back with, should the client not take
    /// it), and whether it is a request (which the client must answer).
    Relay(Bytes, Bytes, bool),
    /// Nothing to send.
    Skip,
}

/// What one message of a request's upstream stream means for the call
/// (`id`: the request's, as the upstream knows it; `client_id`: as the
/// client does).
pub(crate) fn step(
    app: &App,
    session: &Session,
    upstream: UpstreamId,
    method: Method,
    (id, client_id): (&RawValue, &RawValue),
    message: Bytes,
    within: Option<(&switchboard_telemetry::Trace, switchboard_telemetry::SpanId)>,
) -> Step {
    let env = match Envelope::parse(&message) {
        Ok(env) => env,
        Err(_) => {
            app.metrics.upstreams.protocol_error(&app.upstreams[upstream].name);
            return Step::Skip;
        }
    };
    if let Some((message, outcome)) = answer(app, upstream, method, &message, &env, id, client_id) {
        return Step::Done(message, outcome);
    }
    let is_request = env.kind == MessageKind::Request;
    match app.relay_within(session, upstream, &env, &message, within) {
        Some(out) => Step::Relay(out, message, is_request),
        None => Step::Skip,
    }
}

impl Call {
    fn step(&self, message: Bytes) -> Step {
        let within = self.x.call_context();
        step(self.x.app(), &self.session, self.upstream, self.method, (&self.id, &self.client_id), message, within)
    }

    /// Records where the call's stream comes from with its shared copy.
    fn record_origin(&self, log: &Log, channel: &dyn Channel) {
        record_origin(self.x.app(), log, self.upstream, channel.upstream_session(), &self.id, self.method);
    }

    fn error_message(&self, err: &Error) -> Bytes {
        jsonrpc::error_response(Some(&self.client_id), err.code(), &err.to_string(), err.data().as_ref())
    }

    fn timeout(&self) -> Error {
        let upstream = &self.x.app().upstreams[self.upstream];
        Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout }
    }

    fn failed(&self, e: UpstreamError) -> Error {
        Error::upstream(&self.x.app().upstreams[self.upstream].name, e)
    }

    /// Relays the stream into the request's event log until the response,
    /// in the background. The relay goes on if the client disconnects: a
    /// disconnect is not a cancellation, and the client may resume with
    /// `Last-Event-ID`.
    pub fn spawn_relay(self, stream: Box<dyn MessageStream>, log: Arc<Log>) {
        tokio::spawn(self.relay(stream, log));
    }

    async fn relay(mut self, mut stream: Box<dyn MessageStream>, log: Arc<Log>) {
        // With a shared copy, each relayed event carries where the upstream
        // could go on from: another replica continues there if this one dies.
        let spilled = log.is_spilled();
        let (outcome, code) = loop {
            let next = tokio::select! {
                next = stream.next_item() => next,
                () = tokio::time::sleep_until(self.deadline) => {
                    log.push(&self.error_message(&self.timeout()));
                    cancel_upstream(self.x.app(), &self.session, self.upstream, self.id.get(), "timeout");
                    break (Outcome::Timeout, Some(switchboard_protocol::jsonrpc::code::REQUEST_TIMEOUT));
                }
            };
            match next {
                Some(Ok(Item::Message(message))) => match self.step(message) {
                    Step::Done(message, outcome) => {
                        log.push(&message);
                        self.x.add_sent(message.len());
                        let code = error_code(outcome, &message);
                        break (outcome, code);
                    }
                    Step::Relay(out, original, _) => {
                        let resume = if spilled { stream.resume_point() } else { None };
                        if log.offer(&out, resume) {
                            self.x.add_sent(out.len());
                        } else {
                            self.x.app().not_delivered(&self.session, self.upstream, &original, "client_backlog");
                        }
                    }
                    Step::Skip => {}
                },
                Some(Ok(Item::Paused { retry })) => {
                    // The upstream ended its stream early and will be resumed
                    // after the wait it asked for; end ours likewise when the
                    // client can resume it, asking it to wait as long (it
                    // would come back before the answer could be there).
                    if self.session.version >= ProtocolVersion::V2025_11_25
                        && !self.session.legacy
                        && !self.session.for_tenant
                    {
                        if let Some(retry) = retry.filter(|r| *r > RETRY) {
                            log.prime(retry.min(MAX_RETRY));
                        }
                        log.cut();
                    }
                }
                Some(Err(e)) => {
                    let e = self.failed(e);
                    log.push(&self.error_message(&e));
                    break (Outcome::UpstreamFailed, Some(e.code()));
                }
                None => {
                    let e = self.failed(UpstreamError::Closed);
                    log.push(&self.error_message(&e));
                    break (Outcome::UpstreamFailed, Some(e.code()));
                }
            }
        };
        log.close();
        self.x.finish(outcome, code);
    }

    /// For a client that takes only JSON: waits for the response; server
    /// requests go to the session's GET stream, notifications are dropped.
    async fn drain(self, mut stream: Box<dyn MessageStream>) -> Response<Body> {
        let result = loop {
            let next = match tokio::time::timeout_at(self.deadline, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    cancel_upstream(self.x.app(), &self.session, self.upstream, self.id.get(), "timeout");
                    break Err((self.timeout(), Outcome::Timeout));
                }
            };
            match next {
                Some(Ok(message)) => match self.step(message) {
                    Step::Done(message, outcome) => break Ok((message, outcome)),
                    Step::Relay(out, original, is_request) => {
                        let app = self.x.app();
                        if is_request {
                            self.session.push(out, Some((self.upstream, &original)));
                        } else {
                            app.metrics
                                .upstreams
                                .relay_dropped(&app.upstreams[self.upstream].name, "client_accepts_json_only");
                        }
                    }
                    Step::Skip => {}
                },
                Some(Err(e)) => break Err((self.failed(e), Outcome::UpstreamFailed)),
                None => break Err((self.failed(UpstreamError::Closed), Outcome::UpstreamFailed)),
            }
        };
        let Call { mut x, client_id: id, .. } = self;
        match result {
            Ok((message, outcome)) => {
                x.add_sent(message.len());
                let code = error_code(outcome, &message);
                x.finish(outcome, code);
                respond::json(message)
            }
            Err((e, outcome)) => x.fail_as(Some(&id), &e, outcome),
        }
    }
}
