//! One request's context, carried through its phases, and its one ending.
//!
//! An [`Exchange`] is made when a request arrives and learns, phase by
//! phase, who is calling (authenticate), on which session, whether the
//! limits admit it, and who serves it. However the request ends — answered,
//! failed, timed out, refused, or abandoned by a client that hung up — it is
//! finished exactly once: the request metric, the audit record (for requests
//! that reach an upstream or a device, or are refused), the tenant's
//! in-flight slot, and the session's note of the request in flight. A
//! streamed answer takes the exchange with it into the task that relays it.
//! An exchange dropped unfinished finishes as `abandoned`, and a request in
//! flight upstream is then cancelled there.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::Response;
use serde_json::value::RawValue;
use switchboard_core::policy::Principal;
use switchboard_core::{Outcome, UpstreamId};
use switchboard_db::AuditRecord;
use switchboard_limits::{Decision, InflightPermit};
use switchboard_protocol::jsonrpc::{self, Envelope};
use switchboard_protocol::Method;
use switchboard_session::Session;
use switchboard_telemetry::mcp::Operation;
use switchboard_telemetry::{Finished, KeyValue, SpanId, Trace};

use crate::app::App;
use crate::auth::{ClientCert, LastCaller};
use crate::body::Body;
use crate::downstream::respond;
use crate::error::Error;
use crate::headers::{Header, Headers};

/// A request refused before it got far: the response to send (boxed: the
/// refusal is the rare path, and keeps `Result`s of phases small).
pub type Refusal = Box<Response<Body>>;

/// Who answered a request, for its metric and its audit record.
#[derive(Debug, Clone)]
enum Served {
    /// The router itself (a list, `ping`), or nobody yet.
    Router,
    /// A configured upstream.
    Upstream(UpstreamId),
    /// Something else that serves tools, named as its audit records name it
    /// (an edge device: `edge:<device>`).
    Local(Arc<str>),
}

/// A request sent upstream on a session's channel: noted in the session
/// (so that its cancellation finds it), and cancelled upstream if the
/// exchange is abandoned.
struct InFlight {
    session: Arc<Session>,
    upstream: UpstreamId,
    /// A message that carries the request's id, and where.
    message: Bytes,
    id: Range<usize>,
}

/// The response for `err`, with the authenticator's `WWW-Authenticate`
/// challenge when it is a 401 or 403.
fn error_response(app: &App, id: Option<&RawValue>, err: &Error) -> Response<Body> {
    let mut response = respond::error(id, err);
    if let Some(challenge) = app.auth.challenge(err) {
        response.headers_mut().insert(http::header::WWW_AUTHENTICATE, challenge);
    }
    response
}

/// One request, from its arrival to its finish.
pub struct Exchange {
    app: Arc<App>,
    started: Instant,
    method: Method,
    principal: Option<Principal>,
    session: Option<Arc<Session>>,
    served: Served,
    /// The audit record, for a request that goes to an upstream or a device
    /// (when auditing is on).
    /// Boxed: the exchange moves through every phase's future.
    record: Option<Box<AuditRecord>>,
    /// A slot of the tenant's limit on requests in flight.
    permit: Option<InflightPermit>,
    inflight: Option<InFlight>,
    /// Bytes of answer sent to the client, for the audit record.
    sent: usize,
    finished: bool,
    /// The connection's client certificate (mTLS), a credential.
    cert: Option<ClientCert>,
    /// What the connection's earlier requests were let in with.
    last_caller: Option<LastCaller>,
    /// The tool or prompt name (or resource URI) the request names.
    target: Option<Named>,
    /// Came as a call of progressive discovery's call meta-tool.
    unwrapped: bool,
    /// `1.1` or `2`.
    http_version: &'static str,
    /// When the request went upstream.
    upstream_sent: Option<Instant>,
    /// Its trace, when traced.
    trace: Option<Box<Traced>>,
}

/// The tool or prompt name (or resource URI) a request names, as the client
/// knows it (where it is in the request's body) and as the upstream does
/// (JSON text): kept without copying, read when the request finishes.
pub struct Named {
    pub body: Bytes,
    pub exposed: Range<usize>,
    pub original: Arc<[u8]>,
}

/// The client's address, put in a request's extensions when traces are on.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// What a traced request's spans need, gathered as it goes.
struct Traced {
    trace: Trace,
    /// When the request arrived, by the clock spans carry.
    start: SystemTime,
    request_id: Option<Box<str>>,
    peer: Option<std::net::SocketAddr>,
    /// The router's span for its request upstream.
    client_span: Option<SpanId>,
    /// The error the client got, in words.
    error: Option<String>,
}

impl Exchange {
    /// A request that arrived at `started`, over a connection with these
    /// extensions (its client certificate).
    pub fn new(app: &Arc<App>, started: Instant, connection: &http::Extensions) -> Exchange {
        Exchange {
            app: app.clone(),
            started,
            method: Method::Other,
            principal: None,
            session: None,
            served: Served::Router,
            record: None,
            permit: None,
            inflight: None,
            sent: 0,
            finished: false,
            cert: connection.get::<ClientCert>().cloned(),
            last_caller: connection.get::<LastCaller>().cloned(),
            target: None,
            unwrapped: false,
            http_version: "1.1",
            upstream_sent: None,
            trace: None,
        }
    }

    /// The HTTP version the request came over.
    pub fn set_http_version(&mut self, version: http::Version) {
        self.http_version = if version == http::Version::HTTP_2 { "2" } else { "1.1" };
    }

    /// The request's trace begins (when traces are on): its parent from
    /// `params._meta.traceparent`, else the `traceparent` header.
    fn begin_trace(&mut self, headers: Headers<'_>, env: &Envelope<'_>, connection: Option<&http::Extensions>) {
        let header = headers.text(Header::Traceparent).and_then(Result::ok);
        // `params` read only when it can hold a trace context at all.
        let mentioned = env.params.is_some_and(|p| mentions_traceparent(p.get().as_bytes()));
        let meta = env.target().filter(|_| mentioned).and_then(Result::ok).and_then(|t| t.traceparent);
        let meta = meta.and_then(jsonrpc::as_str);
        let Some(trace) = self.app.telemetry.begin(meta.as_deref(), header) else { return };
        let request_id = env.id.map(|id| jsonrpc::as_str(id).map_or_else(|| id.get().into(), |s| s.into()));
        self.trace = Some(Box::new(Traced {
            trace,
            start: SystemTime::now() - self.started.elapsed(),
            request_id,
            peer: connection.and_then(|c| c.get::<Peer>()).map(|p| p.0),
            client_span: None,
            error: None,
        }));
    }

    /// A `tracing` span carrying the request's trace and span ids, for the
    /// log lines written while it is served (none when it is not traced).
    pub fn log_span(&self) -> tracing::Span {
        match &self.trace {
            Some(t) => tracing::info_span!(
                "request",
                trace_id = %t.trace.trace_id_hex(),
                span_id = %switchboard_telemetry::context::hex(&t.trace.span)
            ),
            None => tracing::Span::none(),
        }
    }

    /// The `traceparent` of the router's request upstream, when the request
    /// is traced: a new span, child of the request's.
    pub fn upstream_traceparent(&mut self) -> Option<String> {
        let traced = self.trace.as_mut()?;
        if !traced.trace.sampled {
            // Passed on as it came.
            return Some(traced.trace.traceparent(&traced.trace.span));
        }
        let span = switchboard_telemetry::context::new_span_id();
        traced.client_span = Some(span);
        Some(traced.trace.traceparent(&span))
    }

    /// The `traceparent` naming the span [`upstream_traceparent`]
    /// (Self::upstream_traceparent) made for the request's way on (or the
    /// caller's, passed on when not sampled); `None` when not traced.
    pub fn client_traceparent(&mut self) -> Option<String> {
        let traced = self.trace.as_mut()?;
        if !traced.trace.sampled {
            return Some(traced.trace.traceparent(&traced.trace.span));
        }
        let span = *traced.client_span.get_or_insert_with(switchboard_telemetry::context::new_span_id);
        Some(traced.trace.traceparent(&span))
    }

    /// The request's trace and the router's span towards the upstream,
    /// when traced and sampled: what requests the upstream sends within
    /// the call hang from.
    pub fn call_context(&self) -> Option<(&Trace, SpanId)> {
        let traced = self.trace.as_ref().filter(|t| t.trace.sampled)?;
        Some((&traced.trace, traced.client_span?))
    }

    /// The request came as a call of progressive discovery's call
    /// meta-tool, and is now the call it names.
    pub fn set_unwrapped(&mut self) {
        self.unwrapped = true;
    }

    /// See [`set_unwrapped`](Self::set_unwrapped).
    pub fn unwrapped(&self) -> bool {
        self.unwrapped
    }

    /// The tool or prompt name (or resource URI) the request names.
    pub fn set_target(&mut self, named: Named) {
        self.target = Some(named);
    }

    /// See [`set_target`](Self::set_target).
    pub fn target(&self) -> Option<&Named> {
        self.target.as_ref()
    }

    /// The request goes upstream now (`now`: the caller's clock read,
    /// not another).
    pub fn upstream_sent(&mut self, now: Instant) {
        self.upstream_sent = Some(now);
    }

    /// When the request arrived.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// The JSON-RPC method, for the request metric.
    pub fn set_method(&mut self, method: Method) {
        self.method = method;
    }

    /// Phase: authenticate. The caller, from its credentials; a refusal is
    /// counted by the authenticator. (It waits only for an access token
    /// whose authorization server's keys are not cached yet, or that must
    /// be introspected.)
    pub async fn authenticate(&mut self, headers: Headers<'_>) -> Result<Principal, Error> {
        let principal = self
            .app
            .auth
            .authenticate(headers, self.cert.as_ref(), self.last_caller.as_ref())
            .outcome()
            .await
            .map_err(Error::Unauthenticated)?;
        self.principal = Some(principal.clone());
        let exchange = &self.app.exchange;
        if exchange.any() {
            // An OAuth caller's token, exchanged for the upstreams that take it.
            if let Some(subject) = crate::auth::bearer(headers).filter(|_| principal.key_id.starts_with("u:")) {
                if exchange.prepare(&principal, subject, &self.app.upstreams).await {
                    self.app.user_catalogs.forget(&principal.tenant.name, principal.user.as_deref());
                }
            }
        }
        Ok(principal)
    }

    /// The caller, once authenticated.
    pub fn principal(&self) -> Option<&Principal> {
        self.principal.as_ref()
    }

    /// Phase: session. The session a request names, if the caller opened
    /// it (the same tenant, and the same key or user); anyone else's session
    /// is reported exactly like one that does not exist.
    pub async fn find_session(&mut self, headers: Headers<'_>) -> Result<Arc<Session>, Error> {
        let id = headers.text(Header::McpSessionId).ok_or(Error::MissingSession)?;
        let id = id.map_err(|_| Error::UnknownSession)?;
        // `t.…` names a tenant's shared session (stateless clients'): never a client's.
        if id.is_empty() || id.len() > 128 || id.starts_with(switchboard_session::TENANT_PREFIX) {
            return Err(Error::UnknownSession);
        }
        let session = self.app.sessions.find(id).await?.ok_or(Error::UnknownSession)?;
        let who = self.principal.as_ref().expect("authenticated before the session phase");
        if session.tenant != who.tenant.name {
            self.app.directory.metrics().auth_failed("wrong_tenant");
            return Err(Error::UnknownSession);
        }
        if session.key != who.key_id {
            self.app.directory.metrics().auth_failed("wrong_principal");
            return Err(Error::UnknownSession);
        }
        self.session = Some(session.clone());
        Ok(session)
    }

    /// The session the request runs on (found, created, or a tenant's shared one).
    pub fn set_session(&mut self, session: &Arc<Session>) {
        self.session = Some(session.clone());
    }

    /// Phase: admit. The rate limits of a request (key, tenant, and the tool
    /// for `tools/call`).
    pub async fn admit(&mut self, env: &Envelope<'_>) -> Result<(), Error> {
        let who = self.principal.as_ref().expect("authenticated before admission");
        let limits = &who.tenant.limits;
        let tool_limited = limits.tool.is_some() && env.method_str() == "tools/call";
        // What the request names, read once for both uses.
        let params = match who.scopes.is_some() || tool_limited {
            true => env.target().and_then(Result::ok),
            false => None,
        };
        // A tool's or prompt's name, as text: made once for both uses.
        let name = params.as_ref().and_then(|t| t.name).and_then(jsonrpc::as_str);
        if who.scopes.is_some() {
            let target = match &params {
                Some(t) if t.name.is_some() => name.clone(),
                Some(t) => {
                    t.uri.or_else(|| t.reference.as_ref().and_then(|r| r.name.or(r.uri))).and_then(jsonrpc::as_str)
                }
                None => None,
            };
            self.app.auth.authorize(who, env.method_str(), target.as_deref())?;
        }
        if limits.key.is_none() && limits.tenant.is_none() && limits.tool.is_none() {
            return Ok(());
        }
        let tool = if tool_limited { name } else { None };
        let checks = switchboard_limits::checks(who, tool.as_deref());
        match self.app.limiter.check(&checks, self.started).await {
            Decision::Allow => Ok(()),
            Decision::Deny { limit, retry_after } => {
                self.app.metrics.limits.rate_limited(&who.tenant.name, limit);
                Err(Error::RateLimited { limit, retry_after })
            }
        }
    }

    /// Opens the books of a request about to go to an upstream or a device:
    /// its audit record, and a slot of the tenant's limit on requests in
    /// flight (when none is free, [`Exchange::refuse`] the request with the
    /// error: a limit's refusal, audited as `refused` like the others).
    pub fn open_books(&mut self, headers: Headers<'_>, env: &Envelope<'_>, request_bytes: usize) -> Result<(), Error> {
        if self.app.audit.is_some() {
            self.record = Some(Box::new(self.draft(headers, Some(env), request_bytes)));
        }
        let who = self.principal.as_ref().expect("authenticated before the books open");
        if let Some(max) = who.tenant.limits.concurrent {
            match self.app.limiter.enter(&who.tenant.name, max) {
                Some(permit) => self.permit = Some(permit),
                None => {
                    self.app.metrics.limits.rate_limited(&who.tenant.name, "concurrent");
                    self.record = None;
                    return Err(Error::TooManyInFlight(max));
                }
            }
        }
        Ok(())
    }

    /// Leaves the request out of the audit log (a later round of a call
    /// whose first round's record covers it) and frees its in-flight slot.
    pub fn close_books(&mut self) {
        self.record = None;
        self.permit = None;
    }

    /// The upstream that serves the request.
    pub fn served_by(&mut self, upstream: UpstreamId) {
        self.served = Served::Upstream(upstream);
    }

    /// A tool source other than an upstream serves the request, named as
    /// audit records name it.
    pub fn served_locally(&mut self, name: Arc<str>) {
        self.served = Served::Local(name);
    }

    /// Notes the request in flight on `session`'s channel to `upstream`:
    /// its id is at `id` in `message` (the request as sent, or as the client
    /// sent it: the id is the same).
    pub fn in_flight(&mut self, session: &Arc<Session>, upstream: UpstreamId, message: &Bytes, id: Range<usize>) {
        session.begin(&message[id.clone()], upstream);
        if self.inflight.is_none() {
            self.app.metrics.in_flight(1);
        }
        self.inflight = Some(InFlight { session: session.clone(), upstream, message: message.clone(), id });
    }

    /// Counts bytes of answer sent to the client.
    pub fn add_sent(&mut self, bytes: usize) {
        self.sent += bytes;
    }

    /// Phase: finish. Records how the request ended, once.
    pub fn finish(mut self, outcome: Outcome, error_code: Option<i64>) {
        self.close(outcome, error_code);
    }

    /// Finishes with `err` as the answer, as `outcome`.
    pub fn fail_as(self, id: Option<&RawValue>, err: &Error, outcome: Outcome) -> Response<Body> {
        let translated =
            crate::downstream::authorize::translate(&self.app, self.principal.as_ref(), self.session.as_deref(), err);
        let err = translated.as_ref().unwrap_or(err);
        let response = error_response(&self.app, id, err);
        let mut this = self;
        if let Some(traced) = &mut this.trace {
            traced.error = Some(err.to_string());
        }
        this.finish(outcome, Some(err.code()));
        response
    }

    /// Finishes a request the router answered itself: `ok` or `rejected`.
    pub fn answer(self, id: &RawValue, result: Result<Response<Body>, Error>) -> Response<Body> {
        match result {
            Ok(response) => {
                self.finish(Outcome::Ok, None);
                response
            }
            Err(e) => self.fail_as(Some(id), &e, Outcome::Rejected),
        }
    }

    /// Ends the exchange with nothing to record: a notification or an
    /// answer taken (202), a GET stream opened, a session ended.
    pub fn discard(mut self) {
        self.finished = true;
    }

    /// Phase 1: the transport checks of a POST (`Origin`, `Content-Type`,
    /// size), then its body. A refusal is the response to send.
    pub async fn receive(
        &mut self,
        headers: Headers<'_>,
        body: crate::downstream::transport::PostBody,
    ) -> Result<Bytes, Refusal> {
        crate::downstream::transport::receive(&self.app, headers, body).await.map_err(|refusal| {
            self.finished = true;
            Box::new(refusal)
        })
    }

    /// Phase 2: the JSON-RPC envelope, nothing deeper (400 with -32700 or
    /// -32600 if it is not one); and its trace begins, when traces are on.
    pub fn parse<'b>(
        &mut self,
        headers: Headers<'_>,
        body: &'b [u8],
        connection: Option<&http::Extensions>,
    ) -> Result<Envelope<'b>, Refusal> {
        // The members of `params` are read (each once: a repeated one is
        // refused) where they are used, by `resolve` for what is forwarded.
        let env = Envelope::parse(body).map_err(|e| Box::new(self.reject(None, Error::Parse(e))))?;
        if self.app.telemetry.tracing() && env.kind == switchboard_protocol::jsonrpc::MessageKind::Request {
            self.begin_trace(headers, &env, connection);
        }
        Ok(env)
    }

    /// Rejects the request before the MCP layer takes it (a missing
    /// session, a bad header): counted as a rejection, not audited.
    pub fn reject(&mut self, id: Option<&RawValue>, err: Error) -> Response<Body> {
        self.finished = true;
        crate::downstream::transport::reject(&self.app, id, err)
    }

    /// Refuses the request (its key, a rate limit): counted as a rejection
    /// and audited as `refused`; `http` names a request that is not JSON-RPC
    /// (`GET /mcp`) in its record.
    pub fn refuse(
        &mut self,
        headers: Headers<'_>,
        env: Option<&Envelope<'_>>,
        request_bytes: usize,
        err: Error,
        http: &'static str,
    ) -> Response<Body> {
        self.finished = true;
        self.app.metrics.rejected(err.label());
        let response = error_response(&self.app, env.and_then(|e| e.id), &err);
        if let Some(audit) = &self.app.audit {
            let mut record = self.draft(headers, env, request_bytes);
            if env.is_none() {
                record.method = http.into();
            }
            record.outcome = "refused".into();
            record.error_code = Some(err.code());
            record.latency_us = self.started.elapsed().as_micros() as i64;
            self.app.feed.publish(&record);
            audit.record(record);
        }
        response
    }

    fn close(&mut self, outcome: Outcome, error_code: Option<i64>) {
        self.finished = true;
        if let Some(inflight) = self.inflight.take() {
            self.app.metrics.in_flight(-1);
            let id = &inflight.message[inflight.id.clone()];
            inflight.session.end(id);
            if outcome == Outcome::Abandoned {
                let id = String::from_utf8_lossy(id);
                cancel_upstream(&self.app, &inflight.session, inflight.upstream, &id, "the client disconnected");
            }
        }
        let elapsed = self.started.elapsed();
        match &self.served {
            Served::Router => self.app.metrics.request(self.method, None).record(outcome, elapsed),
            Served::Upstream(u) => self.app.metrics.request(self.method, Some(*u)).record(outcome, elapsed),
            Served::Local(_) => self.app.metrics.edge.call(outcome, elapsed),
        }
        if let Some(who) = &self.principal {
            self.app.metrics.tenant(&who.tenant).record(outcome, elapsed);
        }
        tracing::debug!(
            method = self.method.as_str(),
            outcome = outcome.label(),
            error_code,
            elapsed_us = elapsed.as_micros() as u64,
            "request finished"
        );
        self.observe(outcome, error_code, elapsed);
        self.permit = None;
        if let (Some(mut record), Some(audit)) = (self.record.take(), self.app.audit.as_ref()) {
            record.upstream = match &self.served {
                Served::Router => None,
                Served::Upstream(u) => Some(self.app.upstreams[*u].name.clone()),
                Served::Local(name) => Some(name.clone()),
            };
            record.outcome = outcome.label().into();
            record.error_code = error_code;
            record.latency_us = elapsed.as_micros() as i64;
            record.response_bytes = self.sent as i64;
            self.app.feed.publish(&record);
            audit.record(record);
        }
    }

    /// The MCP metrics of the request, and its spans when traced.
    fn observe(&mut self, outcome: Outcome, error_code: Option<i64>, elapsed: std::time::Duration) {
        let error_type: Option<std::borrow::Cow<'static, str>> = match (error_code, outcome) {
            (Some(code), _) => Some(code.to_string().into()),
            (None, Outcome::Ok) => None,
            (None, Outcome::Abandoned) => Some("cancelled".into()),
            (None, Outcome::Timeout) => Some("timeout".into()),
            (None, _) => Some("_OTHER".into()),
        };
        let method = match self.method {
            Method::Other => "_OTHER",
            m => m.as_str(),
        };
        let (exposed, original) = match &self.target {
            Some(n) => (jsonrpc::json_text(&n.body[n.exposed.clone()]), jsonrpc::json_text(&n.original)),
            None => (None, None),
        };
        let (exposed, original) = (exposed.as_deref(), original.as_deref());
        let named = |m: Method| (self.method == m).then_some(()).and(exposed);
        let version = self.session.as_ref().map(|s| s.version.as_str());
        let op = Operation {
            method,
            error_type: error_type.as_deref(),
            tool: named(Method::ToolsCall),
            prompt: named(Method::PromptsGet),
            protocol_version: version,
            network_protocol_version: Some(self.http_version),
        };
        let telemetry = &self.app.telemetry;
        telemetry.mcp.served(&op, elapsed);
        let upstream = match &self.served {
            Served::Upstream(u) => Some(*u),
            _ => None,
        };
        let app = self.app.clone();
        let address = upstream.and_then(|u| app.upstream_address(u));
        // Measured against the same end as the request's.
        let upstream_took =
            self.upstream_sent.map(|at| (at, elapsed.saturating_sub(at.saturating_duration_since(self.started))));
        if let (Some(_), Some((_, took))) = (upstream, upstream_took) {
            let sent = Operation {
                tool: (self.method == Method::ToolsCall).then_some(()).and(original),
                prompt: (self.method == Method::PromptsGet).then_some(()).and(original),
                network_protocol_version: None,
                ..op
            };
            telemetry.mcp.sent(&sent, address.map(|a| (&*a.host, &*a.port_text)), took);
        }
        let Some(traced) = self.trace.take() else { return };
        if !traced.trace.sampled {
            return;
        }
        let end = traced.start + elapsed;
        let resource =
            matches!(self.method, Method::ResourcesRead | Method::ResourcesSubscribe | Method::ResourcesUnsubscribe);
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", method),
            KeyValue::new("network.transport", "tcp"),
            KeyValue::new("network.protocol.name", "http"),
            KeyValue::new("network.protocol.version", self.http_version),
        ];
        let mut common = Vec::new();
        if let Some(e) = &error_type {
            common.push(KeyValue::new("error.type", e.to_string()));
        }
        if let Some(code) = error_code {
            common.push(KeyValue::new("rpc.response.status_code", code.to_string()));
        }
        if self.method == Method::ToolsCall {
            common.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        }
        if let Some(v) = version {
            common.push(KeyValue::new("mcp.protocol.version", v));
        }
        let name_key = match self.method {
            Method::ToolsCall => Some("gen_ai.tool.name"),
            Method::PromptsGet => Some("gen_ai.prompt.name"),
            _ if resource => Some("mcp.resource.uri"),
            _ => None,
        };
        if let (Some(key), Some(exposed)) = (name_key, exposed) {
            attributes.push(KeyValue::new(key, exposed.to_owned()));
        }
        if let Some(id) = &traced.request_id {
            attributes.push(KeyValue::new("jsonrpc.request.id", id.to_string()));
        }
        if let Some(session) = &self.session {
            attributes.push(KeyValue::new("mcp.session.id", session.id.to_string()));
        }
        if let Some(peer) = traced.peer {
            attributes.push(KeyValue::new("client.address", peer.ip().to_string()));
            attributes.push(KeyValue::new("client.port", i64::from(peer.port())));
        }
        if let Some(who) = &self.principal {
            attributes.push(KeyValue::new("switchboard.tenant", who.tenant.name.to_string()));
            if let Some(user) = &who.user {
                attributes.push(KeyValue::new("enduser.id", user.to_string()));
            }
        }
        attributes.push(KeyValue::new("switchboard.outcome", outcome.label()));
        attributes.extend(common.iter().cloned());
        // Resource URIs stay out of span names (unbounded); tool and prompt names go in.
        let span_name = match (name_key, exposed) {
            (Some(key), Some(target)) if key != "mcp.resource.uri" => format!("{method} {target}"),
            _ => method.to_owned(),
        };
        // The router's CLIENT span towards whoever served the call (an
        // upstream, or a device): its name, its own attributes, whether it failed.
        let towards: Option<(String, Vec<KeyValue>, bool)> = match &self.served {
            Served::Upstream(u) => {
                let upstream = &self.app.upstreams[*u];
                let mut client = vec![
                    KeyValue::new("switchboard.upstream", upstream.name.to_string()),
                    KeyValue::new("network.transport", if address.is_some() { "tcp" } else { "pipe" }),
                ];
                if let Some(a) = address {
                    client.push(KeyValue::new("server.address", a.host.to_string()));
                    client.push(KeyValue::new("server.port", i64::from(a.port)));
                }
                if let (Some(key), Some(original)) = (name_key, original) {
                    client.push(KeyValue::new(key, original.to_owned()));
                }
                let name = match (name_key, original) {
                    (Some(key), Some(target)) if key != "mcp.resource.uri" => format!("{method} {target}"),
                    _ => method.to_owned(),
                };
                Some((name, client, upstream_failed(outcome)))
            }
            Served::Local(device) => {
                let mut client = vec![
                    KeyValue::new("switchboard.device", device.to_string()),
                    KeyValue::new("network.transport", "tcp"),
                ];
                if let (Some(key), Some(exposed)) = (name_key, exposed) {
                    client.push(KeyValue::new(key, exposed.to_owned()));
                }
                Some((span_name.clone(), client, outcome != Outcome::Ok))
            }
            Served::Router => None,
        };
        if let (Some((name, own, failed)), Some(span), Some((sent_at, took))) =
            (towards, traced.client_span, upstream_took)
        {
            let mut client = vec![KeyValue::new("mcp.method.name", method)];
            client.extend(own);
            if let Some(id) = &traced.request_id {
                client.push(KeyValue::new("jsonrpc.request.id", id.to_string()));
            }
            client.extend(common.iter().cloned());
            let start = traced.start + sent_at.saturating_duration_since(self.started);
            telemetry.emit(Finished {
                name: name.into(),
                server: false,
                trace: &traced.trace,
                span,
                parent: Some(traced.trace.span),
                start,
                end: start + took,
                attributes: client,
                error: failed.then(|| traced.error.clone().unwrap_or_default()),
            });
        }
        telemetry.emit(Finished {
            name: span_name.into(),
            server: true,
            trace: &traced.trace,
            span: traced.trace.span,
            parent: traced.trace.parent,
            start: traced.start,
            end,
            attributes,
            error: error_type.is_some().then(|| traced.error.clone().unwrap_or_default()),
        });
    }

    /// The audit record of the request, before its outcome is known.
    fn draft(&self, headers: Headers<'_>, env: Option<&Envelope<'_>>, request_bytes: usize) -> AuditRecord {
        let who = self.principal.as_ref();
        let parsed = env.and_then(Envelope::target).and_then(Result::ok);
        let target = parsed
            .as_ref()
            .and_then(|t| t.name.or(t.uri).or_else(|| t.reference.as_ref().and_then(|r| r.name.or(r.uri))));
        let arguments = match (who, &parsed) {
            (Some(who), Some(t)) if who.tenant.audit_arguments => t.arguments.map(|a| a.get().to_owned()),
            _ => None,
        };
        let key_prefix = match who {
            Some(who) if !who.key_prefix.is_empty() => Some(who.key_prefix.clone()),
            Some(_) => None,
            // An unknown key: keep its prefix only if it has our format (never
            // part of some other secret).
            None => headers
                .presented_key()
                .filter(|k| k.len() == 43 && k.starts_with("sb_"))
                .map(|k| Arc::from(&k[..switchboard_tenancy::PREFIX_LEN])),
        };
        AuditRecord {
            // Given as it leaves the audit queue (not made here).
            id: String::new(),
            at_ms: switchboard_core::time::now_ms(),
            tenant: who.map(|w| w.tenant.name.clone()),
            key_prefix,
            session: self.session.as_ref().map(|s| s.id.clone()),
            method: env.map_or(Cow::Borrowed(""), |e| method_name(e.method_str())),
            target: target.and_then(jsonrpc::as_str).map(|t| t.into_owned()),
            upstream: None,
            outcome: Cow::Borrowed(""),
            error_code: None,
            latency_us: 0,
            request_bytes: request_bytes as i64,
            response_bytes: 0,
            trace_id: trace_id(headers),
            arguments,
            user: who.and_then(|w| w.user.clone()),
        }
    }
}

impl Drop for Exchange {
    /// An exchange dropped unfinished: the client hung up (hyper dropped the
    /// handler), or the task relaying its answer ended early.
    fn drop(&mut self) {
        if !self.finished {
            self.close(Outcome::Abandoned, None);
        }
    }
}

/// Tells the upstream to stop working on a request (best effort, in the
/// background): `id` is the request's id as sent (JSON).
pub fn cancel_upstream(app: &Arc<App>, session: &Arc<Session>, u: UpstreamId, id: &str, reason: &str) {
    let Some(channel) = session.open_channel(u) else { return };
    // The id the upstream knows (the client's, or the router's in its place).
    let id = jsonrpc::upstream_id(id);
    let params = format!(r#"{{"requestId":{id},"reason":{}}}"#, String::from_utf8_lossy(&jsonrpc::json_string(reason)));
    let note = jsonrpc::request(None, "notifications/cancelled", Some(params.as_bytes()));
    let name = app.upstreams[u].name.clone();
    tokio::spawn(async move {
        if let Err(e) = channel.send(note).await {
            tracing::debug!(upstream = %name, error = %e, "cancellation not delivered");
        }
    });
}

/// The trace id of a W3C `traceparent` header (`00-<trace id>-<span id>-<flags>`).
fn trace_id(headers: Headers<'_>) -> Option<String> {
    let value = headers.text(Header::Traceparent)?.ok()?;
    let mut parts = value.split('-');
    let (_version, trace) = (parts.next()?, parts.next()?);
    (trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit()) && trace != "0".repeat(32))
        .then(|| trace.to_ascii_lowercase())
}

/// Whether `params` has the text `traceparent` anywhere (then its
/// `_meta.traceparent` is looked for). The searcher is made once: making
/// one per request (`memmem::find`), or comparing at every offset, was
/// most of what an unsampled request's trace cost.
fn mentions_traceparent(params: &[u8]) -> bool {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"traceparent"));
    FINDER.find(params).is_some()
}

/// An audit record's method: the router's own name for a method it knows
/// (nothing copied), the client's text for one it does not.
fn method_name(wire: &str) -> Cow<'static, str> {
    match Method::from_name(wire) {
        Method::Other => Cow::Owned(wire.to_owned()),
        known => Cow::Borrowed(known.as_str()),
    }
}

/// Whether the upstream leg of a request failed (its span's status).
fn upstream_failed(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::UpstreamFailed | Outcome::Timeout | Outcome::Error)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_audited_method_is_the_routers_own_name_when_known_and_the_clients_text_otherwise() {
        use std::borrow::Cow;
        assert!(matches!(super::method_name("tools/call"), Cow::Borrowed("tools/call")));
        assert!(matches!(super::method_name("resources/read"), Cow::Borrowed("resources/read")));
        assert!(matches!(super::method_name("vendor/thing"), Cow::Owned(m) if m == "vendor/thing"));
        assert!(matches!(super::method_name(""), Cow::Owned(m) if m.is_empty()));
    }
}
