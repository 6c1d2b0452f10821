//! Requests the router answers from its own state: `initialize` and the four
//! lists, served from the catalog snapshot.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use switchboard_protocol::jsonrpc::{self, Envelope};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::{Method, ProtocolVersion};

use super::respond;
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use switchboard_catalog::cursor::Cursor;
use switchboard_core::policy::{Principal, Tenant};
use switchboard_core::Outcome;
use switchboard_session::{Client, Session};
use switchboard_upstream::empty_object;

/// The list a `*/list` method asks for.
pub fn kind_of(method: Method) -> ListKind {
    match method {
        Method::ToolsList => ListKind::Tools,
        Method::PromptsList => ListKind::Prompts,
        Method::ResourcesList => ListKind::Resources,
        _ => ListKind::ResourceTemplates,
    }
}

#[derive(Deserialize)]
struct InitializeParams<'a> {
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
    #[serde(borrow, default)]
    capabilities: Option<&'a RawValue>,
}

/// `initialize` over Streamable HTTP: negotiates the version, creates the
/// session and declares the merged capabilities of the upstreams.
pub async fn initialize(app: &Arc<App>, who: &Principal, env: &Envelope<'_>, started: Instant) -> Response<Body> {
    let id = env.id.expect("a request has an id");
    let result = open_session(app, who, env, None).await.map(|(session, body)| {
        let mut response = respond::json(body);
        response
            .headers_mut()
            .insert(respond::SESSION_ID.clone(), HeaderValue::from_str(&session.id).expect("hex is a valid header"));
        response
    });
    let outcome = if result.is_ok() { Outcome::Ok } else { Outcome::Rejected };
    app.metrics.request(Method::Initialize, None).record(outcome, started.elapsed());
    result.unwrap_or_else(|e| respond::error(Some(id), &e))
}

/// Creates the session an `initialize` asks for and returns it with the
/// response message. `legacy_id` is the id of a legacy HTTP+SSE connection,
/// which becomes the session's id and may negotiate 2024-11-05.
pub async fn open_session(
    app: &Arc<App>,
    who: &Principal,
    env: &Envelope<'_>,
    legacy_id: Option<Arc<str>>,
) -> Result<(Arc<Session>, bytes::Bytes), Error> {
    let id = env.id.expect("a request has an id");
    if app.shutting_down() {
        return Err(Error::ShuttingDown);
    }
    let params = env.params.ok_or_else(|| Error::InvalidParams("initialize needs params".into()))?;
    let params: InitializeParams<'_> =
        serde_json::from_str(params.get()).map_err(|e| Error::InvalidParams(format!("initialize: {e}")))?;
    let requested = params.protocol_version.as_deref().unwrap_or("");
    let version = match ProtocolVersion::parse(requested) {
        Some(v) if v.is_streamable_http() || legacy_id.is_some() => v,
        _ => ProtocolVersion::LATEST,
    };
    if app.sessions.len() >= app.config.server.max_sessions {
        return Err(Error::TooManySessions(app.config.server.max_sessions));
    }
    let capabilities: Arc<RawValue> = match params.capabilities {
        Some(c) if c.get().starts_with('{') => Arc::from(c.to_owned()),
        _ => Arc::from(empty_object()),
    };
    // The first client may arrive before the catalog warm-up finished;
    // wait for it once so the capabilities we declare are complete.
    let snapshot = match app.catalog.current() {
        s if s.generation > 0 => s,
        _ => app.catalog.ensure(&[ListKind::Tools]).await,
    };
    let merged = &snapshot.merged;
    let caps = server_capabilities(merged);
    let mut result = json!({
        "protocolVersion": version.as_str(),
        "capabilities": caps,
        "serverInfo": {"name": "switchboard", "title": "Switchboard MCP router", "version": env!("CARGO_PKG_VERSION")},
    });
    if let Some(instructions) = &merged.instructions {
        result["instructions"] = Value::String(instructions.clone());
    }
    let client = Client { tenant: who.tenant.name.clone(), version, capabilities };
    let session = match legacy_id {
        Some(legacy_id) => app.sessions.open_legacy(legacy_id, client),
        None => app.sessions.open(client).await,
    };
    let body = jsonrpc::result_response(id, &serde_json::to_vec(&result).expect("serializable"));
    Ok((session, body))
}

/// The capabilities the router declares: list changes always (it announces
/// its own), the rest as the upstreams have them.
pub fn server_capabilities(merged: &switchboard_catalog::Merged) -> Value {
    let mut caps = json!({
        "tools": {"listChanged": true},
        "prompts": {"listChanged": true},
        "resources": {"listChanged": true, "subscribe": merged.subscribe},
    });
    if merged.logging {
        caps["logging"] = json!({});
    }
    if merged.completions {
        caps["completions"] = json!({});
    }
    caps
}

#[derive(Deserialize, Default)]
struct ListParams {
    cursor: Option<String>,
}

/// Whether `tenant` sees an item of a list.
pub fn sees(tenant: &Tenant, kind: ListKind, item: &switchboard_catalog::Item) -> bool {
    match kind {
        ListKind::Tools => tenant.sees_tool(item.upstream, &item.name),
        _ => tenant.sees_upstream(item.upstream),
    }
}

/// One page of a merged list, of the items `tenant` sees. Cursors count
/// positions in the whole list, so a filtered page resumes where it ended.
/// `tail` goes at the end of the result (members a 2026-07-28 result has).
pub async fn list(
    app: &Arc<App>,
    tenant: &Tenant,
    kind: ListKind,
    id: &RawValue,
    params: Option<&RawValue>,
    tail: &[u8],
) -> Result<Response<Body>, Error> {
    let params: ListParams = match params {
        Some(p) => {
            serde_json::from_str(p.get()).map_err(|e| Error::InvalidParams(format!("{}: {e}", kind.method())))?
        }
        None => ListParams::default(),
    };
    let snapshot = app.catalog.ensure(&[kind]).await;
    let listing = snapshot.list(kind);
    let page_size = app.config.catalog.page_size;
    let head = head(id, kind);

    // The tenant's edge device tools come after the catalog's, on the last page.
    let edge = if kind == ListKind::Tools { app.edge.view(&tenant.name) } else { None };

    if page_size == 0 && params.cursor.is_none() && tenant.unrestricted() {
        // The whole list, prebuilt: sent without copying it.
        let mut parts = match &edge {
            None => VecDeque::from([head, listing.all.clone()]),
            Some(view) => {
                let open = listing.all.slice(..listing.all.len() - 1); // without its `]`
                let comma = if open.len() > 1 { &b","[..] } else { &b""[..] };
                VecDeque::from([head, open, Bytes::from_static(comma), view.json.clone(), Bytes::from_static(b"]")])
            }
        };
        if !tail.is_empty() {
            parts.push_back(Bytes::copy_from_slice(tail));
        }
        parts.push_back(Bytes::from_static(b"}}"));
        return Ok(respond::json_parts(parts));
    }

    let start = match &params.cursor {
        None => 0,
        Some(text) => {
            let cursor = Cursor::decode(text).map_err(Error::InvalidCursor)?;
            let u = app
                .upstreams
                .find(&cursor.upstream)
                .ok_or_else(|| Error::InvalidCursor("the list changed; start again without a cursor".into()))?;
            let &(_, first, count) = listing
                .spans
                .iter()
                .find(|(up, _, _)| *up == u)
                .ok_or_else(|| Error::InvalidCursor("the list changed; start again without a cursor".into()))?;
            first + cursor.offset.min(count)
        }
    };
    let mut body = BytesMut::with_capacity(head.len() + 4096);
    body.put_slice(&head);
    body.put_u8(b'[');
    let mut shown = 0;
    let mut end = start;
    while end < listing.items.len() && (page_size == 0 || shown < page_size) {
        let item = &listing.items[end];
        end += 1;
        if !sees(tenant, kind, item) {
            continue;
        }
        if shown > 0 {
            body.put_u8(b',');
        }
        body.put_slice(&item.json);
        shown += 1;
    }
    let more = listing.items[end..].iter().any(|i| sees(tenant, kind, i));
    if let (false, Some(view)) = (more, &edge) {
        if shown > 0 {
            body.put_u8(b',');
        }
        body.put_slice(&view.json);
    }
    body.put_u8(b']');
    // Only promise a next page if something the tenant sees is on it.
    if more {
        let next = &listing.items[end];
        let &(_, first, _) =
            listing.spans.iter().find(|(up, _, _)| *up == next.upstream).expect("every item has a span");
        let cursor = Cursor { upstream: app.upstreams[next.upstream].name.to_string(), offset: end - first };
        body.put_slice(b",\"nextCursor\":");
        body.put_slice(&jsonrpc::json_string(&cursor.encode()));
    }
    body.put_slice(tail);
    body.put_slice(b"}}");
    Ok(respond::json(body.freeze()))
}

/// `{"jsonrpc":"2.0","id":ID,"result":{"tools":` — the list follows.
fn head(id: &RawValue, kind: ListKind) -> Bytes {
    let mut head = BytesMut::with_capacity(48 + id.get().len());
    head.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    head.put_slice(id.get().as_bytes());
    head.put_slice(b",\"result\":{\"");
    head.put_slice(kind.field().as_bytes());
    head.put_slice(b"\":");
    head.freeze()
}
