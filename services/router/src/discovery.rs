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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};
use serde_json::{json, Value};
use switchboard_core::policy::{Discovery, Principal};
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;

use crate::app::App;
use crate::error::Error;

/// The meta-tools' namespace (`switchboard` + the catalog's separator).
pub const NAMESPACE: &str = "switchboard";
/// Results of one search, at most (and by default).
pub const MAX_RESULTS: usize = 50;
pub const DEFAULT_RESULTS: usize = 10;
/// Callers whose last search results are remembered for the rank metric.
pub const MAX_CALLERS: usize = 10_000;
/// A description in search results is cut to this many characters.
const SHOWN_DESCRIPTION: usize = 300;

/// Which meta-tool a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meta {
    Search,
    Describe,
    Call,
}

impl Meta {
    fn suffix(self) -> &'static str {
        match self {
            Meta::Search => "search_tools",
            Meta::Describe => "describe_tool",
            Meta::Call => "call_tool",
        }
    }

    /// Its name with the catalog's `separator`.
    pub fn name(self, separator: &str) -> String {
        format!("{NAMESPACE}{separator}{}", self.suffix())
    }

    /// The meta-tool named `name`, if it is one.
    pub fn of(name: &str, separator: &str) -> Option<Meta> {
        let suffix = name.strip_prefix(NAMESPACE)?.strip_prefix(separator)?;
        [Meta::Search, Meta::Describe, Meta::Call].into_iter().find(|m| m.suffix() == suffix)
    }
}

/// The meta-tools as `tools/list` items (JSON), with the catalog's separator.
pub fn tools_json(separator: &str) -> Vec<Bytes> {
    let tools = [
        json!({
            "name": Meta::Search.name(separator),
            "title": "Search tools",
            "description": "Finds the tools that fit a task among the many available: give a few words of what you want to do; answers the best matches (name and description), best first. Then describe one to see its input, and call it.",
            "inputSchema": {"type": "object", "properties": {
                "query": {"type": "string", "description": "What you want to do, in a few words."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "description": "How many tools, at most (default 10)."}
            }, "required": ["query"]},
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        }),
        json!({
            "name": Meta::Describe.name(separator),
            "title": "Describe a tool",
            "description": "Tells everything about one tool found by search: its description, the input it takes (JSON Schema) and the output it gives.",
            "inputSchema": {"type": "object", "properties": {
                "name": {"type": "string", "description": "The tool's name, as search gave it."}
            }, "required": ["name"]},
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        }),
        json!({
            "name": Meta::Call.name(separator),
            "title": "Call a tool",
            "description": "Calls one tool found by search with its arguments (as its input schema says), and answers what it answers.",
            "inputSchema": {"type": "object", "properties": {
                "name": {"type": "string", "description": "The tool's name, as search gave it."},
                "arguments": {"type": "object", "description": "The tool's arguments."}
            }, "required": ["name"]}
        }),
    ];
    tools.iter().map(|t| Bytes::from(serde_json::to_vec(t).expect("serializable"))).collect()
}

/// If `env` is a `tools/call` of the call meta-tool, the `tools/call` of
/// the tool it names: the same id and `_meta`, its name and arguments.
/// Whether the caller may use the meta-tools is checked once it is known
/// ([`check_unwrapped`]).
pub fn unwrap_call(env: &Envelope<'_>, body: &Bytes, separator: &str) -> Result<Option<Bytes>, Error> {
    if env.kind != MessageKind::Request || env.method_str() != "tools/call" {
        return Ok(None);
    }
    let Some(params) = env.params else { return Ok(None) };
    let Ok(target) = Target::parse(params) else { return Ok(None) };
    let Some(name) = target.name.and_then(jsonrpc::as_str) else { return Ok(None) };
    if Meta::of(&name, separator) != Some(Meta::Call) {
        return Ok(None);
    }
    #[derive(serde::Deserialize)]
    struct Inner<'a> {
        #[serde(borrow)]
        name: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        arguments: Option<&'a serde_json::value::RawValue>,
    }
    let inner: Inner<'_> = match target.arguments.map(|a| serde_json::from_str(a.get())) {
        Some(Ok(inner)) => inner,
        _ => return Err(Error::InvalidParams(format!("{name}: arguments {{\"name\": …, \"arguments\": {{…}}}}"))),
    };
    let inner_name = inner.name.filter(|n| jsonrpc::as_str(n).is_some()).ok_or_else(|| {
        Error::InvalidParams(format!("{name}: arguments.name, the tool to call, is required (a string)"))
    })?;
    if jsonrpc::as_str(inner_name).is_some_and(|n| Meta::of(&n, separator).is_some()) {
        return Err(Error::InvalidParams(format!("{name}: call the meta-tools directly")));
    }
    let id = env.id.expect("a request has an id");
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"method\":\"tools/call\",\"params\":{\"name\":");
    out.extend_from_slice(inner_name.get().as_bytes());
    out.extend_from_slice(b",\"arguments\":");
    out.extend_from_slice(inner.arguments.map_or("{}", |a| a.get()).as_bytes());
    if let Some(meta) = target.meta {
        out.extend_from_slice(b",\"_meta\":");
        out.extend_from_slice(meta.get().as_bytes());
    }
    out.extend_from_slice(b"}}");
    Ok(Some(Bytes::from(out)))
}

/// The metrics and the callers' last results.
pub struct Discoveries {
    searches: IntCounterVec,
    duration: Histogram,
    calls: IntCounterVec,
    /// Per caller (tenant, and key, user or session): its last results.
    recent: Mutex<HashMap<Caller, Vec<Box<str>>>>,
}

/// A caller, for remembering its last search: (tenant, key, user or session).
type Caller = (String, String);

impl Discoveries {
    pub fn new(registry: &prometheus::Registry) -> Discoveries {
        let searches = IntCounterVec::new(
            Opts::new(
                "switchboard_discovery_searches_total",
                "Searches of progressive discovery, by whether they found anything (found, none).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "switchboard_discovery_search_duration_seconds",
                "Time to rank a tenant's tools for one search.",
            )
            .buckets(vec![0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1]),
        )
        .expect("valid metric");
        let calls = IntCounterVec::new(
            Opts::new(
                "switchboard_discovery_calls_total",
                "Calls through the call meta-tool, by where the tool ranked in the caller's last search (1, 2-3, 4-10, 11+, unsearched).",
            ),
            &["rank"],
        )
        .expect("valid metric");
        for m in [
            Box::new(searches.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(calls.clone()),
        ] {
            let _ = registry.register(m);
        }
        for r in ["found", "none"] {
            searches.with_label_values(&[r]);
        }
        for r in ["1", "2-3", "4-10", "11+", "unsearched"] {
            calls.with_label_values(&[r]);
        }
        Discoveries { searches, duration, calls, recent: Mutex::default() }
    }

    fn caller(who: &Principal, session: Option<&str>) -> Caller {
        let whom = who
            .user
            .as_deref()
            .map(str::to_owned)
            .or_else(|| session.map(str::to_owned))
            .unwrap_or_else(|| who.key_id.to_string());
        (who.tenant.name.to_string(), whom)
    }

    /// A call through the call meta-tool of `name`: counted by its rank in
    /// the caller's last search.
    pub fn called(&self, who: &Principal, session: Option<&str>, name: &str) {
        let recent = self.recent.lock().expect("lock");
        let rank = recent.get(&Self::caller(who, session)).and_then(|names| names.iter().position(|n| &**n == name));
        let label = match rank {
            Some(0) => "1",
            Some(1..=2) => "2-3",
            Some(3..=9) => "4-10",
            Some(_) => "11+",
            None => "unsearched",
        };
        self.calls.with_label_values(&[label]).inc();
    }
}

/// Answers a `tools/call` of the search or describe meta-tool: `None` when
/// `env` is not one (the call meta-tool was unwrapped before). The answer
/// is the JSON-RPC result object.
pub async fn answer(
    app: &App,
    who: &Principal,
    session: Option<&str>,
    env: &Envelope<'_>,
) -> Option<Result<Vec<u8>, Error>> {
    let params = env.params?;
    let target = Target::parse(params).ok()?;
    let name = target.name.and_then(jsonrpc::as_str)?;
    let separator = &app.config.catalog.separator;
    let meta = Meta::of(&name, separator)?;
    if who.tenant.discovery != Discovery::Progressive {
        return Some(Err(Error::UnknownTool(name.into_owned())));
    }
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
            let ranked = snapshot
                .tool_index()
                .search(query, limit, |d| crate::tools::sees(tenant, ListKind::Tools, &tools.items[d]));
            app.discoveries.duration.observe(started.elapsed().as_secs_f64());
            app.discoveries.searches.with_label_values(&[if ranked.is_empty() { "none" } else { "found" }]).inc();
            let found: Vec<Value> = ranked
                .iter()
                .map(|&(d, score)| {
                    let item = &tools.items[d];
                    let tool: Value = serde_json::from_slice(&item.json).unwrap_or_default();
                    let description: String = tool.get("description").and_then(Value::as_str).unwrap_or("").chars().take(SHOWN_DESCRIPTION).collect();
                    json!({"name": &*item.exposed, "description": description, "score": (score * 1000.0).round() / 1000.0})
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
            match tools.get(wanted).filter(|item| crate::tools::sees(tenant, ListKind::Tools, item)) {
                Some(item) => {
                    let tool: Value = serde_json::from_slice(&item.json).unwrap_or_default();
                    json!({"content": [{"type": "text", "text": String::from_utf8_lossy(&item.json)}], "structuredContent": {"tool": tool}})
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_meta_tool_is_unwrapped_into_the_call_it_names() {
        let body = Bytes::from_static(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"switchboard__call_tool","arguments":{"name":"web__add","arguments":{"a":2,"b":3}},"_meta":{"progressToken":"p"}}}"#);
        let env = Envelope::parse(&body).unwrap();
        let inner = unwrap_call(&env, &body, "__").unwrap().unwrap();
        let v: Value = serde_json::from_slice(&inner).unwrap();
        assert_eq!(
            v,
            json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"web__add","arguments":{"a":2,"b":3},"_meta":{"progressToken":"p"}}})
        );
        // Other calls are left alone; bad ones are refused.
        let other = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"web__add","arguments":{}}}"#,
        );
        assert!(unwrap_call(&Envelope::parse(&other).unwrap(), &other, "__").unwrap().is_none());
        for bad in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"switchboard__call_tool","arguments":{}}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"switchboard__call_tool","arguments":{"name":5}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"switchboard__call_tool","arguments":{"name":"switchboard__call_tool"}}}"#,
        ] {
            let body = Bytes::from_static(bad);
            assert!(unwrap_call(&Envelope::parse(&body).unwrap(), &body, "__").is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(Meta::of("switchboard.search_tools", "."), Some(Meta::Search));
        assert_eq!(Meta::of("switchboard__nope", "__"), None);
    }
}
