//! The admin routes only the console needed: a tenant's catalog as it
//! gets it (searched with the ranking of progressive discovery), and the
//! live call feed as Server-Sent Events.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use serde_json::{json, Value};
use switchboard_protocol::methods::ListKind;

use crate::admin::{Admin, AdminError};
use crate::body::Body;
use crate::pins::Verdict;

/// Tools a catalog page lists at most.
pub const MAX_SHOWN: usize = 500;

impl Admin {
    /// `tenant`'s tools as it gets them now (each with what its pinning
    /// says), best first for `query` (all, in catalog order, without one);
    /// at most [`MAX_SHOWN`]. `None` without a running router.
    pub fn catalog(&self, tenant: &str, query: Option<&str>) -> Result<Option<Value>, AdminError> {
        let Some(app) = self.running.as_ref().and_then(|r| r.upgrade()) else { return Ok(None) };
        let Some(who) = app.directory.tenant(tenant) else {
            return Err(AdminError::Store(switchboard_db::DbError::NotFound(format!("tenant {tenant:?}"))));
        };
        let snapshot = app.catalog.current();
        let tools = snapshot.list(ListKind::Tools);
        let sees = |i: usize| crate::tools::sees(&who, ListKind::Tools, &tools.items[i]);
        let picked: Vec<(usize, Option<f32>)> = match query.map(str::trim).filter(|q| !q.is_empty()) {
            Some(q) => {
                snapshot.tool_index().search(q, MAX_SHOWN, sees).into_iter().map(|(i, s)| (i, Some(s))).collect()
            }
            None => (0..tools.items.len()).filter(|&i| sees(i)).take(MAX_SHOWN).map(|i| (i, None)).collect(),
        };
        let shown: Vec<Value> = picked
            .into_iter()
            .map(|(i, score)| {
                let item = &tools.items[i];
                let tool: Value = serde_json::from_slice(&item.json).unwrap_or_default();
                let state = match app.pins.verdict(&who, item) {
                    Verdict::Admit => "offered",
                    Verdict::Warn => "changed (warned)",
                    Verdict::Withhold => "withheld",
                };
                json!({
                    "name": &*item.exposed,
                    "upstream": &*app.upstreams[item.upstream].name,
                    "description": tool.get("description").cloned().unwrap_or(Value::Null),
                    "input_schema": tool.get("inputSchema").cloned().unwrap_or(Value::Null),
                    "state": state,
                    "score": score.map(|s| (s * 1000.0).round() / 1000.0),
                })
            })
            .collect();
        Ok(Some(json!({ "tenant": tenant, "query": query, "tools": shown })))
    }

    /// `GET /v1/calls/stream`: the live call feed, as Server-Sent Events.
    pub fn call_feed(&self, tenant: Option<String>) -> Response<Body> {
        let Some(app) = self.running.as_ref().and_then(|r| r.upgrade()) else {
            return unavailable(StatusCode::NOT_FOUND, "the call feed is served by a running router's admin listener");
        };
        let Some(events) = app.feed.watch(tenant) else {
            return unavailable(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("{} watchers already follow the call feed on this replica", crate::feed::MAX_WATCHERS),
            );
        };
        let mut response = Response::new(Body::sse(events, Duration::from_secs(15)));
        let headers = response.headers_mut();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

fn unavailable(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::full(Bytes::from(json!({ "error": message }).to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, crate::downstream::respond::JSON);
    response
}
