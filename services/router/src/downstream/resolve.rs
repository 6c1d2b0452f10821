//! Phase 6: who serves a request, and the request rewritten for it. Only
//! the envelope and the routing members of `params` are read; the one
//! change (the exposed name or URI becoming the upstream's own) is spliced
//! into a single copy. Also what every era's answer goes through: the
//! outcome of an upstream's answer and the rewrites results need, and the
//! call of a tool its source answers itself.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;
use switchboard_core::policy::Tenant;
use switchboard_core::{Outcome, UpstreamId};
use switchboard_protocol::jsonrpc::{self, as_str, span, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::Method;

use crate::app::App;
use crate::error::Error;
use crate::exchange::Exchange;
use crate::tools::{LocalTool, Tool};

/// A request rewritten for its upstream.
pub(crate) struct Resolved {
    pub upstream: UpstreamId,
    pub body: Bytes,
    pub id: Range<usize>,
    pub progress_token: Option<Range<usize>>,
}

/// What a request resolved to.
pub(crate) enum Resolution {
    /// A configured upstream's tool, prompt or resource: the request rewritten for it.
    Upstream(Resolved),
    /// A tool its source calls itself.
    Local(Box<dyn LocalTool>),
}

/// Finds who serves the request and builds the rewritten body. Only what
/// `tenant` sees resolves; anything else is unknown, exactly as if it did
/// not exist.
pub(crate) async fn resolve(
    app: &Arc<App>,
    tenant: &Tenant,
    method: Method,
    env: &Envelope<'_>,
    body: &Bytes,
) -> Result<Resolution, Error> {
    let params = env.params.ok_or_else(|| Error::InvalidParams(format!("{} needs params", method.as_str())))?;
    let target = Target::parse(params).map_err(|e| Error::InvalidParams(e.to_string()))?;
    let (upstream, field, replacement): (UpstreamId, &RawValue, Vec<u8>) = match method {
        Method::ToolsCall => {
            let raw = target.name.ok_or_else(|| Error::InvalidParams("params.name is required".into()))?;
            let name = as_str(raw).ok_or_else(|| Error::InvalidParams("params.name must be a string".into()))?;
            match crate::tools::resolve(&app.tools, tenant, &name, params).await? {
                Tool::Local(tool) => return Ok(Resolution::Local(tool)),
                Tool::Upstream { upstream, original } => {
                    return Ok(Resolution::Upstream(rewrite(upstream, body, env, &target, raw, &original)))
                }
            }
        }
        Method::PromptsGet => {
            let raw = target.name.ok_or_else(|| Error::InvalidParams("params.name is required".into()))?;
            let name = as_str(raw).ok_or_else(|| Error::InvalidParams("params.name must be a string".into()))?;
            let (u, original) = app.catalog_tools.find(tenant, ListKind::Prompts, &name).await?;
            return Ok(Resolution::Upstream(rewrite(u, body, env, &target, raw, &original)));
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
                    return Ok(Resolution::Upstream(rewrite(u, body, env, &target, raw, &original)));
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
    Ok(Resolution::Upstream(rewrite(upstream, body, env, &target, field, &replacement)))
}

/// The request with `field` (a name or URI in it) replaced by `replacement`,
/// the upstream's own (JSON text), and where its id and progress token are.
fn rewrite(
    upstream: UpstreamId,
    body: &Bytes,
    env: &Envelope<'_>,
    target: &Target<'_>,
    field: &RawValue,
    replacement: &[u8],
) -> Resolved {
    let field_span = span(body, field.get());
    let id = span(body, env.id.expect("a request has an id").get());
    let token = target.progress_token.map(|t| span(body, t.get()));
    if *replacement == *field.get().as_bytes() {
        return Resolved { upstream, body: body.clone(), id, progress_token: token };
    }
    let delta = replacement.len() as isize - field_span.len() as isize;
    let shift = |r: Range<usize>| {
        if r.start >= field_span.end {
            (r.start as isize + delta) as usize..(r.end as isize + delta) as usize
        } else {
            r
        }
    };
    let rewritten = splice(body, &mut [Edit::new(field_span.clone(), replacement)]);
    Resolved { upstream, body: rewritten, id: shift(id), progress_token: token.map(shift) }
}

fn resolve_uri(app: &App, tenant: &Tenant, raw: &RawValue) -> Result<(UpstreamId, Vec<u8>), Error> {
    let uri = as_str(raw).ok_or_else(|| Error::InvalidParams("the uri must be a string".into()))?;
    let snapshot = app.catalog.current();
    let (u, original) = app
        .catalog
        .resolve_uri(&snapshot, &uri)
        .filter(|&(u, _)| tenant.sees_upstream(u))
        .ok_or_else(|| Error::UnknownResource(uri.to_string()))?;
    Ok((u, jsonrpc::json_string(original)))
}

/// Calls a tool its source answers itself, and returns the JSON-RPC answer;
/// the exchange is finished however the call ends, a client that hangs up
/// included.
pub(crate) async fn call_local(mut x: Exchange, tool: Box<dyn LocalTool>, id: &RawValue) -> Bytes {
    x.served_locally(tool.served_by());
    match tool.call().await {
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

/// Classifies an upstream's answer and applies the few rewrites results
/// need (resource URIs in `resources/read`).
pub(crate) fn classify(app: &App, u: UpstreamId, method: Method, message: Bytes) -> (Bytes, Outcome) {
    let outcome = match Envelope::parse(&message) {
        Ok(env) if env.kind == MessageKind::Response => Outcome::Ok,
        _ => Outcome::Error,
    };
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

/// The `error.code` of an error response, if it is one.
pub(crate) fn error_code(message: &[u8]) -> Option<i64> {
    let env = Envelope::parse(message).ok()?;
    #[derive(serde::Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_str::<Code>(env.error?.get()).ok().map(|c| c.code)
}
