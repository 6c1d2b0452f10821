//! Stateless (2026-07-28) clients' calls to session-era upstreams, bridged.
//!
//! The tenant's calls share one router session per tenant (its upstream
//! sessions are recorded in the session store like any other, so every
//! replica reuses them: one `initialize` per tenant and upstream, not per
//! request); each call gets an id unique on that session, and so does its
//! progress token. The upstream's progress and log notifications are
//! relayed on the POST's SSE stream; a server request (sampling,
//! elicitation, roots) ends the round with `resultType: "input_required"`,
//! its key being the relayed request's id, and a `requestState` the router
//! seals ([`RoundState`]) naming the tenant, the API key that made the call
//! (only it may continue the call), the tenant session, the request's event
//! stream and the position in it. The retry (any replica) sends the
//! client's `inputResponses` to the upstream as the answers, and goes on
//! reading the request's stream from that position: locally, or from Redis
//! where the stream is copied.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use http::Response;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::Sha256;
use switchboard_core::policy::Principal;
use switchboard_core::{Outcome, UpstreamId};
use switchboard_protocol::jsonrpc::{self, span, Envelope, MessageKind};
use switchboard_protocol::modern;
use switchboard_protocol::rewrite::{moved, splice, Edit};
use switchboard_protocol::sse::EventId;
use switchboard_protocol::Method;
use switchboard_session::{Session, SessionError};
use switchboard_upstream::{Outgoing, Reply};
use tokio::sync::mpsc;

use super::{stamp, Validated};
use crate::app::App;
use crate::body::Body;
use crate::downstream::forward::{self, Call};
use crate::downstream::resolve::{self, Resolved};
use crate::downstream::respond;
use crate::error::Error;
use crate::exchange::{cancel_upstream, Exchange};

/// How long a bridged `requestState` stays valid (the upstream's timeout
/// bounds the call anyway).
const STATE_LIFETIME: Duration = Duration::from_secs(600);

/// A retry's `requestState` and `inputResponses`.
pub(super) type Retry = (String, HashMap<String, Box<RawValue>>);

/// The round a retry continues, if the request carries a `requestState`
/// (checked: one this router signed, for this tenant, not expired).
pub(super) fn retry_state(env: &Envelope<'_>) -> Option<Result<Retry, Error>> {
    #[derive(Deserialize)]
    struct Wire {
        #[serde(rename = "requestState")]
        request_state: Option<String>,
        #[serde(rename = "inputResponses", default)]
        input_responses: HashMap<String, Box<RawValue>>,
    }
    let params = env.params?;
    let retry: Wire = match serde_json::from_str(params.get()) {
        Ok(retry) => retry,
        Err(e) => return Some(Err(Error::InvalidParams(format!("requestState/inputResponses: {e}")))),
    };
    let state = retry.request_state?;
    Some(Ok((state, retry.input_responses)))
}

/// Where a bridged call waits for the client's input: sealed into the
/// `requestState` of an `input_required` result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundState {
    /// The tenant whose call it is.
    pub tenant: String,
    /// The visible prefix of the API key that made the call ("" without
    /// keys): only that key may continue it.
    pub caller: String,
    /// The tenant session the call runs on.
    pub session: String,
    /// The call's event stream, and the position of the server request in it.
    pub stream: u64,
    pub seq: u64,
    /// The id the upstream knows the call by (JSON).
    pub call_id: String,
    /// The server request awaiting an answer: its relayed id (JSON).
    pub key: String,
    /// Milliseconds since the Unix epoch after which it is refused.
    pub expires_ms: u64,
}

impl RoundState {
    /// `payload.mac`, both base64url: the payload is the fields joined by
    /// newlines, the mac HMAC-SHA256 over it (truncated to 128 bits).
    pub fn seal(&self, key: &[u8; 32]) -> String {
        let payload = [
            self.tenant.as_str(),
            &self.caller,
            &self.session,
            &self.stream.to_string(),
            &self.seq.to_string(),
            &self.call_id,
            &self.key,
            &self.expires_ms.to_string(),
        ]
        .join("\n");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mac = mac(key, payload.as_bytes()).finalize().into_bytes();
        format!("{}.{}", b64.encode(payload), b64.encode(&mac[..16]))
    }

    /// Checks and reads a sealed state.
    pub fn open(sealed: &str, key: &[u8; 32], now_ms: u64) -> Result<RoundState, Error> {
        let bad = |why: &str| Error::InvalidRequestState(why.to_owned());
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (payload, mac) = sealed.split_once('.').ok_or_else(|| bad("not one this router issued"))?;
        let payload = b64.decode(payload).map_err(|_| bad("not one this router issued"))?;
        let tag = b64.decode(mac).map_err(|_| bad("not one this router issued"))?;
        // Checked in constant time, truncated to the 128 bits a state carries.
        if tag.len() != 16 || self::mac(key, &payload).verify_truncated_left(&tag).is_err() {
            return Err(bad("it was altered, or is not one this router issued"));
        }
        let text = String::from_utf8(payload).map_err(|_| bad("malformed"))?;
        let parts: Vec<&str> = text.split('\n').collect();
        let [tenant, caller, session, stream, seq, call_id, key, expires] = parts[..] else {
            return Err(bad("malformed"));
        };
        let state = RoundState {
            tenant: tenant.to_owned(),
            caller: caller.to_owned(),
            session: session.to_owned(),
            stream: stream.parse().map_err(|_| bad("malformed"))?,
            seq: seq.parse().map_err(|_| bad("malformed"))?,
            call_id: call_id.to_owned(),
            key: key.to_owned(),
            expires_ms: expires.parse().map_err(|_| bad("malformed"))?,
        };
        if state.expires_ms < now_ms {
            return Err(bad("it expired; send the request again without it"));
        }
        Ok(state)
    }
}

/// HMAC-SHA256 of `message` under `key`, ready to finish or verify.
fn mac(key: &[u8; 32], message: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac
}

/// A progress token's JSON text, from its place in a body.
pub(super) fn token_text(body: &[u8], at: &Range<usize>) -> Box<str> {
    String::from_utf8_lossy(&body[at.clone()]).into()
}

/// Who a round answers, and what its client declared.
struct Client {
    who: Principal,
    id: Box<RawValue>,
    /// The client's progress token (JSON), in place of the call's own.
    token: Option<Box<str>>,
    sampling: bool,
    elicitation: bool,
    roots: bool,
    log_rank: Option<usize>,
}

impl Client {
    fn new(who: &Principal, id: &RawValue, token: Option<Box<str>>, valid: &Validated<'_>) -> Client {
        Client {
            who: who.clone(),
            id: id.to_owned(),
            token,
            sampling: valid.declares("sampling"),
            elicitation: valid.declares("elicitation"),
            roots: valid.declares("roots"),
            log_rank: valid.log_rank(),
        }
    }
}

/// The first round of a bridged call.
pub(super) async fn bridged(
    mut x: Exchange,
    valid: &Validated<'_>,
    method: Method,
    id: &RawValue,
    resolved: Resolved,
) -> Response<Body> {
    let app = x.app().clone();
    let who = x.principal().expect("authenticated").clone();
    let resolved = without_era_meta(resolved);
    let u = resolved.upstream;
    let upstream = &app.upstreams[u];
    let session = match app.sessions.tenant_session(&who.tenant.name, who.user.as_ref(), &who.key_id).await {
        Ok(session) => session,
        Err(e) => return x.fail_as(Some(id), &e.into(), Outcome::Error),
    };
    session.touch();
    let channel = match forward::channel(&session, u).await {
        Ok(channel) => channel,
        Err((e, outcome)) => return x.fail_as(Some(id), &e, outcome),
    };
    // Many clients share the tenant session: the call gets an id of its own,
    // and so does its progress token (two clients' token 1 must not meet on
    // an upstream that routes progress by token); the client's come back in
    // the answer and the notifications.
    let call_id = format!("\"sb.{}\"", switchboard_core::ids::random_hex(8));
    let client_token = resolved.progress_token.as_ref().map(|r| token_text(&resolved.body, r));
    let mut edits = vec![Edit::new(resolved.id.clone(), call_id.as_bytes())];
    if let Some(r) = &resolved.progress_token {
        edits.push(Edit::new(r.clone(), call_id.as_bytes()));
    }
    let body = splice(&resolved.body, &mut edits);
    let id_range = moved(resolved.id.clone(), &edits);
    let progress_token = resolved.progress_token.clone().map(|r| moved(r, &edits));
    let call_raw: Box<RawValue> = RawValue::from_string(call_id.clone()).expect("a JSON string");
    let deadline = tokio::time::Instant::now() + upstream.config.timeout;
    x.in_flight(&session, u, &body, id_range.clone());
    let out = Outgoing { body, method, id: id_range, progress_token, traceparent: resolved.traceparent.clone() };
    x.upstream_sent(std::time::Instant::now());
    let request = std::pin::pin!(switchboard_upstream::request(channel.as_ref(), out));
    match crate::deadline::until(deadline, request).await {
        Err(_) => {
            cancel_upstream(&app, &session, u, &call_id, "timeout");
            let e = Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout };
            x.fail_as(Some(id), &e, Outcome::Timeout)
        }
        Ok(Err(e)) => x.fail_as(Some(id), &Error::upstream(&upstream.name, e), Outcome::UpstreamFailed),
        Ok(Ok(Reply::Done(message))) => {
            let Some((message, outcome)) = resolve::parse_answer(&app, u, method, &message, &call_raw, &call_raw)
            else {
                let e = resolve::not_the_answer(&app, u);
                return x.fail_as(Some(id), &e, Outcome::UpstreamFailed);
            };
            x.add_sent(message.len());
            x.finish(outcome, resolve::error_code(outcome, &message));
            respond::json(for_client(&message, id, method))
        }
        Ok(Ok(Reply::Stream(stream))) => {
            let log = session.new_stream();
            let client_id = call_raw.clone();
            Call { x, session: session.clone(), upstream: u, method, id: call_raw, client_id, deadline }
                .spawn_relay(stream, log.clone());
            let (tx, rx) = mpsc::channel(64);
            tokio::spawn(log.clone().reader(None, tx));
            let client = Client::new(&who, id, client_token, valid);
            let round = Round { app, method, session, client, upstream: u, stream: log.stream, call_id };
            round.respond(rx).await
        }
    }
}

/// The request as a session-era upstream takes it: without the stateless
/// era's `io.modelcontextprotocol/*` keys in `params._meta` (a session
/// carries what they say; a strict server refuses them), with its id and
/// progress token found again in the new body.
fn without_era_meta(resolved: Resolved) -> Resolved {
    let Some(body) = modern::without_era_meta(&resolved.body) else { return resolved };
    let (id, progress_token) = {
        let env = Envelope::parse(&body).expect("the request parsed before and still does");
        let id = span(&body, env.id.expect("a request has an id").get());
        let token = env.params.and_then(|p| jsonrpc::Target::parse(p).ok()).and_then(|t| t.progress_token);
        (id, token.map(|t| span(&body, t.get())))
    };
    Resolved { body, id, progress_token, ..resolved }
}

/// A later round of a bridged call: the client's answers go to the upstream,
/// and the call's stream is read on from where the last round ended.
pub(super) async fn resume(
    mut x: Exchange,
    valid: &Validated<'_>,
    method: Method,
    id: &RawValue,
    (sealed, responses): Retry,
    client_token: Option<Box<str>>,
) -> Response<Body> {
    let app = x.app().clone();
    let who = x.principal().expect("authenticated").clone();
    let result = async {
        let key = app.state_key().await;
        let state = RoundState::open(&sealed, &key, switchboard_core::time::now_ms() as u64)?;
        if state.tenant != *who.tenant.name || state.caller != *who.key_id {
            return Err(Error::InvalidRequestState("not one this router issued".into()));
        }
        let session =
            app.sessions.find(&state.session).await?.filter(|s| s.tenant == who.tenant.name).ok_or_else(|| {
                Error::InvalidRequestState("the call it continues is over; send the request again".into())
            })?;
        let key = RawValue::from_string(state.key.clone()).map_err(|_| Error::Internal("key".into()))?;
        let wanted = jsonrpc::as_str(&key).map(Cow::into_owned).unwrap_or_default();
        // Only the request this round asked about is answered: other keys
        // are ignored (they could name another call's requests).
        let Some(response) = responses.get(&wanted) else {
            return Err(Error::InvalidParams(format!("inputResponses must answer {wanted:?}")));
        };
        let Some((u, their_id)) = session.answered(&key) else {
            return Err(Error::InvalidRequestState("not one this router issued".into()));
        };
        let channel = session
            .existing_channel(u)
            .await
            .ok_or_else(|| Error::InvalidRequestState("the upstream session of the call is gone".into()))?;
        let message = jsonrpc::result_response(
            &RawValue::from_string(their_id.to_string()).expect("JSON"),
            response.get().as_bytes(),
        );
        channel.send(message).await.map_err(|e| Error::upstream(&app.upstreams[u].name, e))?;
        session.touch();
        let rx =
            session.open_get(Some(EventId { stream: state.stream, seq: state.seq })).await.map_err(|e| match e {
                SessionError::UnknownStream => {
                    Error::InvalidRequestState("the call it continues is over; send the request again".into())
                }
                e => e.into(),
            })?;
        Ok((session, state, rx, u))
    }
    .await;
    match result {
        Err(e) => x.fail_as(Some(id), &e, Outcome::Rejected),
        Ok((session, state, rx, u)) => {
            // The round is counted as it starts; the call's first round has its record.
            x.served_by(u);
            x.finish(Outcome::Ok, None);
            let client = Client::new(&who, id, client_token, valid);
            let round =
                Round { app, method, session, client, upstream: u, stream: state.stream, call_id: state.call_id };
            round.respond(rx).await
        }
    }
}

/// One round of a bridged call: reads the call's event stream and answers
/// the client.
struct Round {
    app: Arc<App>,
    method: Method,
    /// The tenant session the call runs on.
    session: Arc<Session>,
    client: Client,
    upstream: UpstreamId,
    /// The call's event stream.
    stream: u64,
    /// The id the upstream knows the call by (JSON).
    call_id: String,
}

/// What a round makes of one event.
enum Frame {
    /// A notification for the client (progress, a log message).
    Note(Bytes),
    /// The round's answer: the call's result, or `input_required`.
    Last(Bytes),
    /// The round's answer is an error with its own HTTP status.
    Refused(Error),
}

impl Round {
    /// A progress notification with the client's own token in place of the
    /// call's.
    fn with_client_token(&self, data: &Bytes) -> Bytes {
        let Some(token) = &self.client.token else { return data.clone() };
        let Ok(mut value) = serde_json::from_slice::<Value>(data) else { return data.clone() };
        let Ok(token) = serde_json::from_str::<Value>(token) else { return data.clone() };
        match value.pointer_mut("/params/progressToken") {
            Some(at) => *at = token,
            None => return data.clone(),
        }
        Bytes::from(serde_json::to_vec(&value).expect("serializable"))
    }

    /// Answers the client: as JSON if the round ends before any
    /// notification, else as an SSE stream.
    async fn respond(self, mut rx: mpsc::Receiver<Bytes>) -> Response<Body> {
        let keep_alive = self.app.config.server.keep_alive;
        let this = Arc::new(self);
        // A client that hangs up before the first event (this future is
        // dropped) cancels the call too.
        struct CancelOnDrop(Option<Arc<Round>>);
        impl Drop for CancelOnDrop {
            fn drop(&mut self) {
                if let Some(round) = self.0.take() {
                    round.hung_up();
                }
            }
        }
        let mut waiting = CancelOnDrop(Some(this.clone()));
        let first = loop {
            match rx.recv().await {
                None => break None,
                Some(event) => {
                    if let Some(frame) = this.frame(&event).await {
                        break Some(frame);
                    }
                }
            }
        };
        waiting.0 = None;
        let first = match first {
            None => return respond::error(Some(&this.client.id), &this.closed()),
            Some(Frame::Last(message)) => return respond::json(message),
            Some(Frame::Refused(e)) => return respond::error(Some(&this.client.id), &e),
            Some(Frame::Note(note)) => note,
        };
        let (tx, out) = mpsc::channel(64);
        let sse = |m: &[u8]| switchboard_protocol::sse::encode_event(None, None, m);
        let _ = tx.send(sse(&first)).await;
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = rx.recv() => event,
                    () = tx.closed() => {
                        this.hung_up();
                        return;
                    }
                };
                let Some(event) = event else {
                    let e = this.closed();
                    let _ = tx
                        .send(sse(&jsonrpc::error_response(Some(&this.client.id), e.code(), &e.to_string(), None)))
                        .await;
                    return;
                };
                let (message, last) = match this.frame(&event).await {
                    None => continue,
                    Some(Frame::Note(note)) => (note, false),
                    Some(Frame::Last(message)) => (message, true),
                    Some(Frame::Refused(e)) => (
                        jsonrpc::error_response(Some(&this.client.id), e.code(), &e.to_string(), e.data().as_ref()),
                        true,
                    ),
                };
                if tx.send(sse(&message)).await.is_err() {
                    if !last {
                        this.hung_up();
                    }
                    return;
                }
                if last {
                    return;
                }
            }
        });
        respond::sse(out, keep_alive)
    }

    /// The call's stream ended without an answer (its replica died, or it
    /// was taken over by a newer round).
    fn closed(&self) -> Error {
        Error::upstream(&self.app.upstreams[self.upstream].name, switchboard_upstream::UpstreamError::Closed)
    }

    /// A modern client hanging up cancels its call.
    fn hung_up(&self) {
        cancel_upstream(&self.app, &self.session, self.upstream, &self.call_id, "the client disconnected");
    }

    /// One event of the call's stream (`id: S-N` and `data:` lines).
    async fn frame(&self, event: &[u8]) -> Option<Frame> {
        let mut seq = None;
        let mut data = BytesMut::new();
        for line in event.split(|&b| b == b'\n') {
            if let Some(id) = line.strip_prefix(b"id: ") {
                seq = std::str::from_utf8(id).ok().and_then(EventId::parse).map(|id| id.seq);
            } else if let Some(d) = line.strip_prefix(b"data: ").or_else(|| line.strip_prefix(b"data:")) {
                if !data.is_empty() {
                    data.put_u8(b'\n');
                }
                data.put_slice(d);
            }
        }
        if data.is_empty() {
            return None; // a priming event
        }
        let data = data.freeze();
        let env = Envelope::parse(&data).ok()?;
        match env.kind {
            MessageKind::Response | MessageKind::Error => {
                if env.id.is_some_and(|i| i.get() == self.call_id) {
                    Some(Frame::Last(for_client(&data, &self.client.id, self.method)))
                } else {
                    None
                }
            }
            MessageKind::Notification => match Method::from_name(env.method_str()) {
                // Only for a client that asked (with a token of its own).
                Method::Progress => self.client.token.is_some().then(|| Frame::Note(self.with_client_token(&data))),
                Method::LogMessage => {
                    let wanted = self.client.log_rank?;
                    #[derive(Deserialize)]
                    struct Level<'a> {
                        #[serde(borrow)]
                        level: Cow<'a, str>,
                    }
                    let level = env.params.and_then(|p| serde_json::from_str::<Level<'_>>(p.get()).ok())?;
                    (modern::log_rank(&level.level)? >= wanted).then(|| Frame::Note(data.clone()))
                }
                _ => None,
            },
            MessageKind::Request => {
                let key = env.id?.get().to_owned();
                let method = Method::from_name(env.method_str());
                let (needed, declared) = match method {
                    Method::SamplingCreateMessage => ("sampling", self.client.sampling),
                    Method::ElicitationCreate => ("elicitation", self.client.elicitation),
                    Method::RootsList => ("roots", self.client.roots),
                    // Anything else (ping) is answered here.
                    _ => {
                        self.answer_upstream(&key, Ok(b"{}")).await;
                        return None;
                    }
                };
                if !declared {
                    self.answer_upstream(&key, Err(needed)).await;
                    cancel_upstream(&self.app, &self.session, self.upstream, &self.call_id, "missing capability");
                    return Some(Frame::Refused(Error::MissingCapability(needed)));
                }
                let state = RoundState {
                    tenant: self.client.who.tenant.name.to_string(),
                    caller: self.client.who.key_id.to_string(),
                    session: self.session.id.to_string(),
                    stream: self.stream,
                    seq: seq?,
                    call_id: self.call_id.clone(),
                    key: key.clone(),
                    expires_ms: switchboard_core::time::now_ms() as u64 + STATE_LIFETIME.as_millis() as u64,
                };
                let sealed = state.seal(&self.app.state_key().await);
                let params = env.params.map_or("{}", RawValue::get);
                let result = format!(
                    r#"{{"resultType":"input_required","inputRequests":{{{key}:{{"method":{},"params":{params}}}}},"requestState":{}}}"#,
                    String::from_utf8_lossy(&jsonrpc::json_string(env.method_str())),
                    String::from_utf8_lossy(&jsonrpc::json_string(&sealed)),
                );
                Some(Frame::Last(jsonrpc::result_response(&self.client.id, result.as_bytes())))
            }
        }
    }

    /// Answers a server request of the upstream here: a result, or an error
    /// naming the capability the client lacks.
    async fn answer_upstream(&self, key: &str, answer: Result<&[u8], &str>) {
        let Ok(raw) = RawValue::from_string(key.to_owned()) else { return };
        let Some((u, their_id)) = self.session.answered(&raw) else { return };
        let their: Box<RawValue> = match RawValue::from_string(their_id.to_string()) {
            Ok(raw) => raw,
            Err(_) => return,
        };
        let message = match answer {
            Ok(result) => jsonrpc::result_response(&their, result),
            Err(capability) => jsonrpc::error_response(
                Some(&their),
                jsonrpc::code::METHOD_NOT_FOUND,
                &format!("the client does not support {capability}"),
                None,
            ),
        };
        if let Some(channel) = self.session.existing_channel(u).await {
            let _ = channel.send(message).await;
        }
    }
}

/// A response from a session-based upstream as a modern client gets it:
/// the client's id, and `resultType: "complete"` in the result (with cache
/// hints that promise nothing for `resources/read`, which the era says
/// carries them: the upstream gave none).
pub(super) fn for_client(message: &Bytes, client_id: &RawValue, method: Method) -> Bytes {
    let Ok(env) = Envelope::parse(message) else { return message.clone() };
    let Some(theirs) = env.id else { return message.clone() };
    let restored = splice(message, &mut [Edit::new(span(message, theirs.get()), client_id.get().as_bytes())]);
    stamp(restored, method == Method::ResourcesRead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_get_the_clients_id_and_are_stamped() {
        let restored = for_client(
            &Bytes::from_static(br#"{"jsonrpc":"2.0","id":"sb.1","result":{}}"#),
            &RawValue::from_string("7".into()).unwrap(),
            Method::ToolsCall,
        );
        assert_eq!(&restored[..], br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete"}}"#);
        let read = for_client(
            &Bytes::from_static(br#"{"jsonrpc":"2.0","id":"sb.1","result":{"contents":[]}}"#),
            &RawValue::from_string("7".into()).unwrap(),
            Method::ResourcesRead,
        );
        assert_eq!(
            &read[..],
            br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","ttlMs":0,"cacheScope":"private","contents":[]}}"#
        );
    }

    #[test]
    fn the_mac_is_hmac_sha256() {
        // Python's hmac module for the same key and message.
        let expected = "441111a27d31f927141edd9bc26a387d38ee68193b7ee5c4706f31bacb7f6078";
        assert_eq!(hex::encode(mac(&[7u8; 32], b"acme\nsb_abcdefgh").finalize().into_bytes()), expected);
    }

    #[test]
    fn request_state_is_sealed() {
        let key = [7u8; 32];
        let state = RoundState {
            tenant: "acme".into(),
            caller: "sb_abcdefgh".into(),
            session: "t.abc".into(),
            stream: 5,
            seq: 2,
            call_id: "\"sb.1\"".into(),
            key: "\"0.n1\"".into(),
            expires_ms: 2_000,
        };
        let sealed = state.seal(&key);
        assert_eq!(RoundState::open(&sealed, &key, 1_000).unwrap(), state);
        assert!(matches!(RoundState::open(&sealed, &key, 3_000), Err(Error::InvalidRequestState(_))), "expired");
        assert!(RoundState::open(&sealed, &[8u8; 32], 1_000).is_err(), "another key");
        let (payload, mac) = sealed.split_once('.').unwrap();
        let mut forged = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
        forged[0] = b'b';
        let forged = format!("{}.{mac}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(forged));
        assert!(RoundState::open(&forged, &key, 1_000).is_err(), "tampered");
        assert!(RoundState::open("garbage", &key, 1_000).is_err());
    }
}
