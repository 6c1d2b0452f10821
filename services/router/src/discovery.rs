//! Progressive tool discovery, for a tenant whose catalog is too large for a
//! model's context (`discovery = "progressive"`): its `tools/list` offers
//! three meta-tools in place of the catalog's tools (its edge devices'
//! stay listed):
//!
//! - `switchboard__search_tools` `{query, limit?}`: the tenant's tools that
//!   best fit the query (BM25 over names, descriptions and input property
//!   names; `switchboard_catalog::search`), best first, only those the
//!   caller may use;
//! - `switchboard__describe_tool` `{name}`: one tool as `tools/list` would
//!   show it (its whole input and output schemas);
//! - `switchboard__call_tool` `{name, arguments}`: calls it. The request is
//!   rewritten into the `tools/call` of that tool before anything else
//!   looks at it, so limits, audit, traces and the upstream see the tool
//!   itself, and everything a call can do (progress, sampling, streaming)
//!   works as for a direct call.
//!
//! Tools found may also be called directly by name. Searches are counted
//! (`switchboard_discovery_searches_total`, `_search_duration_seconds`),
//! and calls by where the tool ranked in the caller's last search
//! (`switchboard_discovery_calls_total{rank}`), remembered for at most
//! [`MAX_CALLERS`] callers.

use std::time::Instant;

use serde_json::{json, Value};
use switchboard_core::policy::{Discovery, Principal};
use switchboard_protocol::jsonrpc::{self, Envelope, Target};
use switchboard_protocol::methods::ListKind;

use crate::app::App;
use crate::error::Error;
use crate::tools::meta::{Discoveries, Meta, DEFAULT_RESULTS, MAX_CALLERS, MAX_RESULTS, SHOWN_DESCRIPTION};

/// Answers a `tools/call` of the search or describe meta-tool: `None` when
/// `env` is not one (the call meta-tool was unwrapped before). The answer
/// is the JSON-RPC result object.
pub async fn answer(
    app: &App,
    who: &Principal,
    session: Option<&str>,
    env: &Envelope<'_>,
) -> Option<Result<Vec<u8>, Error>> {
    // Other tenants have no meta-tools: their names are unknown tools, as
    // resolving them finds (and their params are not read again here).
    if who.tenant.discovery != Discovery::Progressive {
        return None;
    }
    let params = env.params?;
    let target = Target::parse(params).ok()?;
    let name = target.name.and_then(jsonrpc::as_str)?;
    let separator = &app.config.catalog.separator;
    let meta = Meta::of(&name, separator)?;
    let arguments: Value = target.arguments.and_then(|a| serde_json::from_str(a.get()).ok()).unwrap_or(Value::Null);
    let tenant = &*who.tenant;
    let snapshot = app.catalog.ensure_for(&[ListKind::Tools], |u| tenant.sees_upstream(u)).await;
    let tools = snapshot.list(ListKind::Tools);
    let result = match meta {
        Meta::Search => {
            let Some(query) = arguments.get("query").and_then(Value::as_str) else {
                return Some(Ok(tool_error(&format!("{name}: give a query (a few words of what you want to do)"))));
            };
            let limit = arguments
                .get("limit")
                .and_then(Value::as_u64)
                .map_or(DEFAULT_RESULTS, |l| (l as usize).clamp(1, MAX_RESULTS));
            let started = Instant::now();
            let ranked = snapshot.tool_index().search(query, limit, |d| admitted(app, tenant, &tools.items[d]));
            app.discoveries.duration.observe(started.elapsed().as_secs_f64());
            app.discoveries.searches.with_label_values(&[if ranked.is_empty() { "none" } else { "found" }]).inc();
            let found: Vec<Value> = ranked
                .iter()
                .map(|&(d, score)| {
                    let item = &tools.items[d];
                    let tool: Value = serde_json::from_slice(&item.json).unwrap_or_default();
                    let description: String = tool.get("description").and_then(Value::as_str).unwrap_or("").chars().take(SHOWN_DESCRIPTION).collect();
                    let mut found = json!({"name": &*item.exposed, "description": description, "score": (score * 1000.0).round() / 1000.0});
                    if app.pins.verdict(tenant, item) == crate::pins::Verdict::Warn {
                        // As describe_tool and tools/list mark it.
                        found["definitionChanged"] = Value::Bool(true);
                    }
                    found
                })
                .collect();
            {
                let mut recent = app.discoveries.recent.lock().expect("lock");
                if recent.len() >= MAX_CALLERS {
                    recent.clear();
                }
                let names = ranked.iter().map(|&(d, _)| tools.items[d].exposed.clone()).collect();
                recent.insert(Discoveries::caller(who, session), names);
            }
            let text = if found.is_empty() {
                format!("No tool fits {query:?}; try other words.")
            } else {
                serde_json::to_string(&found).expect("serializable")
            };
            json!({"content": [{"type": "text", "text": text}], "structuredContent": {"tools": found}})
        }
        Meta::Describe => {
            let Some(wanted) = arguments.get("name").and_then(Value::as_str) else {
                return Some(Ok(tool_error(&format!("{name}: give the name of a tool (as search gave it)"))));
            };
            match tools.get(wanted).filter(|item| admitted(app, tenant, item)) {
                Some(item) => {
                    // As tools/list would show it: marked if its definition changed.
                    let shown = match app.pins.verdict(tenant, item) {
                        crate::pins::Verdict::Warn => crate::pins::marked(&item.json),
                        _ => item.json.to_vec(),
                    };
                    let tool: Value = serde_json::from_slice(&shown).unwrap_or_default();
                    json!({"content": [{"type": "text", "text": String::from_utf8_lossy(&shown)}], "structuredContent": {"tool": tool}})
                }
                None => return Some(Ok(tool_error(&format!("no tool {wanted:?}; search for one first")))),
            }
        }
        Meta::Call => return Some(Err(Error::InvalidParams(format!("{name}: its arguments must name a tool")))),
    };
    Some(Ok(serde_json::to_vec(&result).expect("serializable")))
}

/// A tool result saying what went wrong (the model can read it and retry).
fn tool_error(text: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"content": [{"type": "text", "text": text}], "isError": true})).expect("serializable")
}

/// Whether `tenant` is offered tool `item` (it sees it, and its pinning
/// does not withhold it).
fn admitted(app: &App, tenant: &switchboard_core::policy::Tenant, item: &switchboard_catalog::Item) -> bool {
    crate::tools::offers(&app.pins, tenant, ListKind::Tools, item).is_some_and(|v| v != crate::pins::Verdict::Withhold)
}
