//! Requests the router answers from its own state: `initialize` and the four
//! lists, served from the catalog snapshot.

use std::sync::Arc;

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
use crate::exchange::Exchange;
use crate::tools::{list_catalog, Page};
use switchboard_core::policy::Principal;
use switchboard_session::{Client, Full, Quota, Session};
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
pub async fn initialize(mut x: Exchange, env: &Envelope<'_>) -> Response<Body> {
    x.set_method(Method::Initialize);
    let id = env.id.expect("a request has an id");
    let who = x.principal().expect("authenticated").clone();
    let result = open_session(x.app(), &who, env, None).await.map(|(session, body)| {
        let mut response = respond::json(body);
        response
            .headers_mut()
            .insert(respond::SESSION_ID.clone(), HeaderValue::from_str(&session.id).expect("hex is a valid header"));
        response
    });
    x.answer(id, result)
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
    let capabilities: Arc<RawValue> = match params.capabilities {
        Some(c) if c.get().starts_with('{') => Arc::from(c.to_owned()),
        _ => Arc::from(empty_object()),
    };
    // The first clients may arrive before the catalog warm-up fetched
    // their upstreams' lists; wait for those once so the capabilities we
    // declare are complete (never for other tenants' upstreams).
    let snapshot = app.catalog.ensure_once_for(&[ListKind::Tools], |u| who.tenant.sees_upstream(u)).await;
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
    let client = Client {
        tenant: who.tenant.name.clone(),
        key: who.key_id.clone(),
        user: who.user.clone(),
        version,
        capabilities,
    };
    let limits = &who.tenant.limits;
    let quota = Quota { router: app.config.server.max_sessions, tenant: limits.sessions, key: limits.key_sessions };
    let opened = match legacy_id {
        Some(legacy_id) => app.sessions.open_legacy(legacy_id, client, quota),
        None => app.sessions.open(client, quota).await,
    };
    let session = opened.map_err(|full| {
        let err = match full {
            Full::Router(max) => Error::TooManySessions(max),
            Full::Tenant(max) => Error::SessionCap { limit: "sessions", max },
            Full::Key(max) => Error::SessionCap { limit: "key_sessions", max },
        };
        if let Error::SessionCap { limit, .. } = &err {
            app.metrics.limits.rate_limited(&who.tenant.name, limit);
        }
        app.metrics.rejected(err.label());
        err
    })?;
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

/// One page of a merged list, of the items `tenant` sees: the catalog's,
/// then (for tools) those of the other tool sources, on the last page.
/// `tail` goes at the end of the result (members a 2026-07-28 result has).
pub async fn list(
    app: &Arc<App>,
    who: &Principal,
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
    let tenant = &*who.tenant;
    app.catalog.ensure_for(&[kind], |u| tenant.sees_upstream(u)).await;
    let mut page = Page::new(params.cursor.as_deref(), app.config.catalog.page_size)?;
    if kind == ListKind::Tools {
        for source in app.tools.iter() {
            source.list(tenant, &mut page)?;
        }
    } else {
        let snapshot = app.catalog.current();
        list_catalog(&app.upstreams, &app.pins, snapshot.list(kind), tenant, kind, &mut page)?;
    }
    super::authorize::list_own(app, who, kind, &mut page).await;
    Ok(respond::json_parts(page.into_parts(head(id, kind), tail)))
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
