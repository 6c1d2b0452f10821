//! Phase 6: who serves a request, and the request rewritten for it. Only
//! the envelope and the routing members of `params` are read; the one
//! change (the exposed name or URI becoming the upstream's own) is spliced
//! into a single copy. Also what every era's answer goes through: the
//! outcome of an upstream's answer and the rewrites results need, and the
//! call of a tool its source answers itself.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;
use switchboard_core::policy::{Principal, Tenant};
use switchboard_core::{Outcome, UpstreamId};
use switchboard_protocol::jsonrpc::{self, as_str, span, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::rewrite::{moved, splice, Edit};
use switchboard_protocol::Method;

use crate::app::App;
use crate::error::Error;
use crate::exchange::{Exchange, Named};
use crate::tools::{LocalTool, Tool};

/// A request rewritten for its upstream.
pub(crate) struct Resolved {
    pub upstream: UpstreamId,
    pub body: Bytes,
    pub id: Range<usize>,
    pub progress_token: Option<Range<usize>>,
    /// The name (or URI) the request names, as the client and as the
    /// upstream know it.
    pub target: Option<Named>,
    /// The `traceparent` header to send with it, when traced.
    pub traceparent: Option<http::HeaderValue>,
}

/// What a request resolved to.
pub(crate) enum Resolution {
    /// A configured upstream's tool, prompt or resource: the request rewritten for it.
    Upstream(Resolved),
    /// A tool its source calls itself, and its name in the request.
    Local(Box<dyn LocalTool>, Named),
}

/// Finds who serves the request and builds the rewritten body. Only what
/// `tenant` sees resolves; anything else is unknown, exactly as if it did
/// not exist. With `traceparent` (the router's span for the upstream
/// request, when traced), that is put in `params._meta.traceparent`.
pub(crate) async fn resolve(
    app: &Arc<App>,
    who: &Principal,
    method: Method,
    env: &Envelope<'_>,
    body: &Bytes,
    traceparent: Option<&str>,
) -> Result<Resolution, Error> {
    let tenant = &*who.tenant;
    let params = env.params.ok_or_else(|| Error::InvalidParams(format!("{} needs params", method.as_str())))?;
    let target = env.target().expect("params are there").map_err(|e| Error::InvalidParams(e.to_string()))?;
    let (upstream, field, replacement): (UpstreamId, &RawValue, Arc<[u8]>) = match method {
        Method::ToolsCall => {
            let raw = target.name.ok_or_else(|| Error::InvalidParams("params.name is required".into()))?;
            let name = as_str(raw).ok_or_else(|| Error::InvalidParams("params.name must be a string".into()))?;
            if let Some((upstream, original)) = super::authorize::resolve_own(app, who, &name).await? {
                return Ok(Resolution::Upstream(rewrite(upstream, body, env, target, raw, original, traceparent)));
            }
            match crate::tools::resolve(&app.tools, tenant, &name, params).await? {
                Tool::Local(tool) => {
                    let exposed = span(body, raw.get());
                    let named = Named { body: body.clone(), exposed, original: Arc::from(raw.get().as_bytes()) };
                    return Ok(Resolution::Local(tool, named));
                }
                Tool::Upstream { upstream, original } => {
                    return Ok(Resolution::Upstream(rewrite(upstream, body, env, target, raw, original, traceparent)))
                }
            }
        }
        Method::PromptsGet => {
            let raw = target.name.ok_or_else(|| Error::InvalidParams("params.name is required".into()))?;
            let name = as_str(raw).ok_or_else(|| Error::InvalidParams("params.name must be a string".into()))?;
            let (u, original) = app.catalog_tools.find(tenant, ListKind::Prompts, &name).await?;
            return Ok(Resolution::Upstream(rewrite(u, body, env, target, raw, original, traceparent)));
        }
        Method::ResourcesRead | Method::ResourcesSubscribe | Method::ResourcesUnsubscribe => {
            let raw = target.uri.ok_or_else(|| Error::InvalidParams("params.uri is required".into()))?;
            let (u, original) = resolve_uri(app, tenant, raw)?;
            (u, raw, original)
        }
        Method::CompletionComplete => {
            let reference =
                target.reference.as_ref().ok_or_else(|| Error::InvalidParams("params.ref is required".into()))?;
            match reference.kind.as_deref() {
                Some("ref/prompt") => {
                    let raw =
                        reference.name.ok_or_else(|| Error::InvalidParams("params.ref.name is required".into()))?;
                    let name =
                        as_str(raw).ok_or_else(|| Error::InvalidParams("params.ref.name must be a string".into()))?;
                    let (u, original) = app.catalog_tools.find(tenant, ListKind::Prompts, &name).await?;
                    return Ok(Resolution::Upstream(rewrite(u, body, env, target, raw, original, traceparent)));
                }
                Some("ref/resource") => {
                    let raw = reference.uri.ok_or_else(|| Error::InvalidParams("params.ref.uri is required".into()))?;
                    let (u, original) = resolve_uri(app, tenant, raw)?;
                    (u, raw, original)
                }
                other => return Err(Error::InvalidParams(format!("unknown ref type {other:?}"))),
            }
        }
        _ => unreachable!("only forwarded methods reach resolve"),
    };
    Ok(Resolution::Upstream(rewrite(upstream, body, env, target, field, replacement, traceparent)))
}

/// The request with `field` (a name or URI in it) replaced by `replacement`,
/// the upstream's own (JSON text), its id by the one the upstream is sent
/// ([`jsonrpc::upstream_id`]), `traceparent` (if any) in `params._meta`,
/// and where its id and progress token are.
fn rewrite(
    upstream: UpstreamId,
    body: &Bytes,
    env: &Envelope<'_>,
    target: &Target<'_>,
    field: &RawValue,
    original: Arc<[u8]>,
    traceparent: Option<&str>,
) -> Resolved {
    let replacement = &*original;
    let id_raw = env.id.expect("a request has an id").get();
    let id = span(body, id_raw);
    let token = target.progress_token.map(|t| span(body, t.get()));
    let sent_id = jsonrpc::upstream_id(id_raw);
    let name = (*replacement != *field.get().as_bytes()).then(|| Edit::new(span(body, field.get()), replacement));
    let mapped = matches!(sent_id, Cow::Owned(_)).then(|| Edit::new(id.clone(), sent_id.as_bytes()));
    let traced = traceparent.and_then(|t| jsonrpc::traceparent_edit(body, env, target, t));
    let traced = traced.as_ref().map(|(range, text)| Edit::new(range.clone(), text));
    let names = Some(Named { body: body.clone(), exposed: span(body, field.get()), original: original.clone() });
    let header = traceparent.and_then(|t| http::HeaderValue::from_str(t).ok());
    // At most three, on the stack.
    let mut store = [Edit::new(0..0, b""), Edit::new(0..0, b""), Edit::new(0..0, b"")];
    let mut count = 0;
    for edit in [name, mapped, traced].into_iter().flatten() {
        store[count] = edit;
        count += 1;
    }
    let edits = &mut store[..count];
    if edits.is_empty() {
        return Resolved {
            upstream,
            body: body.clone(),
            id,
            progress_token: token,
            target: names,
            traceparent: header,
        };
    }
    let (id, token) = (moved(id.clone(), edits), token.map(|t| moved(t, edits)));
    Resolved { upstream, body: splice(body, edits), id, progress_token: token, target: names, traceparent: header }
}

fn resolve_uri(app: &App, tenant: &Tenant, raw: &RawValue) -> Result<(UpstreamId, Arc<[u8]>), Error> {
    let uri = as_str(raw).ok_or_else(|| Error::InvalidParams("the uri must be a string".into()))?;
    let snapshot = app.catalog.current();
    let (u, original) = app
        .catalog
        .resolve_uri(&snapshot, &uri)
        .filter(|&(u, _)| tenant.sees_upstream(u))
        .ok_or_else(|| Error::UnknownResource(uri.to_string()))?;
    Ok((u, Arc::from(jsonrpc::json_string(original))))
}

/// Calls a tool its source answers itself, and returns the JSON-RPC answer;
/// the exchange is finished however the call ends, a client that hangs up
/// included.
pub(crate) async fn call_local(mut x: Exchange, tool: Box<dyn LocalTool>, id: &RawValue) -> Bytes {
    x.served_locally(tool.served_by());
    // The device's call is the router's CLIENT span, as an upstream's is.
    let traceparent = x.client_traceparent();
    x.upstream_sent(std::time::Instant::now());
    match tool.call(traceparent).await {
        Ok(result) => {
            let body = jsonrpc::result_response(id, &result);
            x.add_sent(body.len());
            x.finish(Outcome::Ok, None);
            body
        }
        Err(e) => {
            let outcome = match &e {
                Error::InvalidArguments { .. } => Outcome::Rejected,
                Error::UpstreamTimeout { .. } => Outcome::Timeout,
                _ => Outcome::UpstreamFailed,
            };
            let body = jsonrpc::error_response(Some(id), e.code(), &e.to_string(), e.data().as_ref());
            x.add_sent(body.len());
            x.finish(outcome, Some(e.code()));
            body
        }
    }
}

/// The upstream's answer to a forwarded request, for the client: `None`
/// if `message` (parsed as `env`) is not it (a response under another id
/// than `sent`, the one the request was sent with); otherwise under the
/// client's id (`client`) again, and classified.
pub(crate) fn answer(
    app: &App,
    u: UpstreamId,
    method: Method,
    message: &Bytes,
    env: &Envelope<'_>,
    sent: &RawValue,
    client: &RawValue,
) -> Option<(Bytes, Outcome)> {
    answer_at(app, u, method, message, env.kind, span(message, env.id?.get()), sent, client)
}

/// [`answer`] of a message of `kind` whose id is at `id`.
#[allow(clippy::too_many_arguments)]
fn answer_at(
    app: &App,
    u: UpstreamId,
    method: Method,
    message: &Bytes,
    kind: MessageKind,
    id: std::ops::Range<usize>,
    sent: &RawValue,
    client: &RawValue,
) -> Option<(Bytes, Outcome)> {
    let outcome = match kind {
        MessageKind::Response => Outcome::Ok,
        MessageKind::Error => Outcome::Error,
        MessageKind::Request | MessageKind::Notification => return None,
    };
    let raw = &message[id.clone()];
    if !same_id(raw, sent) {
        return None;
    }
    let message = if raw == client.get().as_bytes() {
        message.clone()
    } else {
        splice(message, &mut [Edit::new(id, client.get().as_bytes())])
    };
    Some(rewrite_result(app, u, method, message, outcome))
}

/// The error for a request whose upstream answered it with something else
/// than its response (another request's id): dropped, counted and logged.
pub(crate) fn not_the_answer(app: &App, u: UpstreamId) -> Error {
    let name = &app.upstreams[u].name;
    app.metrics.upstreams.relay_dropped(name, "stray_response");
    tracing::warn!(upstream = %name, "the upstream answered a request with a message that is not its response; dropped");
    Error::upstream(
        name,
        switchboard_upstream::UpstreamError::Protocol(
            "it answered with a message that is not the request's response".into(),
        ),
    )
}

/// [`answer`] for a message not parsed yet; `None` also if it is not JSON-RPC.
pub(crate) fn parse_answer(
    app: &App,
    u: UpstreamId,
    method: Method,
    message: &Bytes,
    sent: &RawValue,
    client: &RawValue,
) -> Option<(Bytes, Outcome)> {
    // Most answers in one quick pass; what it is unsure of, by the parser.
    let scanned = switchboard_protocol::scan::answer(message);
    parse_scanned_answer(app, u, method, message, scanned, sent, client)
}

/// [`parse_answer`] of an answer already read by the quick pass
/// (`scanned`: what [`scan::answer`](switchboard_protocol::scan::answer)
/// gave for these bytes), as a stateless upstream's is where its end is found.
pub(crate) fn parse_scanned_answer(
    app: &App,
    u: UpstreamId,
    method: Method,
    message: &Bytes,
    scanned: Option<(MessageKind, std::ops::Range<usize>)>,
    sent: &RawValue,
    client: &RawValue,
) -> Option<(Bytes, Outcome)> {
    match scanned {
        Some((kind, id)) => answer_at(app, u, method, message, kind, id, sent, client),
        None => answer(app, u, method, message, &Envelope::parse(message).ok()?, sent, client),
    }
}

/// Whether a response's id is the request's: byte-equal as a rule, equal as
/// JSON values when an upstream reformats it (escapes in a string).
fn same_id(a: &[u8], b: &RawValue) -> bool {
    a == b.get().as_bytes()
        || matches!(
            (serde_json::from_slice::<Value>(a), serde_json::from_str::<Value>(b.get())),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Classifies an upstream's answer and applies the few rewrites results
/// need (resource URIs in `resources/read`).
pub(crate) fn classify(app: &App, u: UpstreamId, method: Method, message: Bytes) -> (Bytes, Outcome) {
    let outcome = match Envelope::parse(&message) {
        Ok(env) if env.kind == MessageKind::Response => Outcome::Ok,
        _ => Outcome::Error,
    };
    rewrite_result(app, u, method, message, outcome)
}

/// The rewrites a result needs (resource URIs in `resources/read`).
fn rewrite_result(app: &App, u: UpstreamId, method: Method, message: Bytes, outcome: Outcome) -> (Bytes, Outcome) {
    if method != Method::ResourcesRead || outcome != Outcome::Ok || app.upstreams[u].config.prefix.is_empty() {
        return (message, outcome);
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&message) else { return (message, outcome) };
    if let Some(Value::Array(contents)) = value.pointer_mut("/result/contents") {
        for content in contents {
            if let Some(uri) = content.get("uri").and_then(Value::as_str) {
                let exposed = app.catalog.expose_uri(u, uri);
                content["uri"] = Value::String(exposed);
            }
        }
    }
    (Bytes::from(serde_json::to_vec(&value).expect("serializable")), outcome)
}

/// The `error.code` of an answer classified as an error (`outcome`), if it
/// is an error response. Any other outcome has none, unread: a result is
/// not parsed again for it (on a stateless call's path that parse was 6,500
/// instructions, a seventh of the call).
pub(crate) fn error_code(outcome: Outcome, message: &[u8]) -> Option<i64> {
    if outcome != Outcome::Error {
        return None;
    }
    let env = Envelope::parse(message).ok()?;
    #[derive(serde::Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_str::<Code>(env.error?.get()).ok().map(|c| c.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request rewritten with `traceparent` in `params._meta`, as JSON.
    fn traced(request: &str) -> Value {
        let body = Bytes::from(request.to_owned());
        let env = Envelope::parse(&body).unwrap();
        let target = Target::parse(env.params.unwrap()).unwrap();
        let name = target.name.unwrap();
        let original: Arc<[u8]> = Arc::from(&br#""echo""#[..]);
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let resolved = rewrite(UpstreamId::new(0), &body, &env, &target, name, original, Some(tp));
        let v: Value = serde_json::from_slice(&resolved.body).unwrap();
        assert_eq!(v["params"]["_meta"]["traceparent"], tp, "{v}");
        assert_eq!(v["params"]["name"], "echo", "{v}");
        // The id and progress token are found where they moved to.
        assert_eq!(&resolved.body[resolved.id.clone()], b"1");
        if let Some(token) = &resolved.progress_token {
            assert_eq!(&resolved.body[token.clone()], br#""p""#);
        }
        v
    }

    #[test]
    fn the_upstream_request_carries_the_routers_span_in_meta() {
        // No `_meta`: added.
        traced(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__echo","arguments":{}}}"#);
        // An empty one: filled.
        traced(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__echo","_meta":{ }}}"#);
        // One with other members: kept.
        let v = traced(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"progressToken":"p"},"name":"a__echo"}}"#,
        );
        assert_eq!(v["params"]["_meta"]["progressToken"], "p");
        // The caller's: replaced.
        let v = traced(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__echo","_meta":{"traceparent":"00-11111111111111111111111111111111-2222222222222222-01","progressToken":"p"}}}"#,
        );
        assert_eq!(v["params"]["_meta"].as_object().unwrap().len(), 2);
    }
}
