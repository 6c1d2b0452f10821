//! Progressive discovery's meta-tools (see `crate::discovery`): their names,
//! their `tools/list` items, the call meta-tool unwrapped into the call it
//! names, and the metrics of searches and calls.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};
use serde_json::json;
use switchboard_core::policy::Principal;
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind, Target};

use crate::error::Error;

/// The meta-tools' namespace (`switchboard` + the catalog's separator).
pub const NAMESPACE: &str = "switchboard";
/// Results of one search, at most (and by default).
pub const MAX_RESULTS: usize = 50;
pub const DEFAULT_RESULTS: usize = 10;
/// Callers whose last search results are remembered for the rank metric.
pub const MAX_CALLERS: usize = 10_000;
/// A description in search results is cut to this many characters.
pub const SHOWN_DESCRIPTION: usize = 300;

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
    // Every call passes here: its params are read only if the body could
    // name the call meta-tool at all (a scan, no parse, no allocation; the
    // searcher made once, as making one was most of the scan's cost).
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(Meta::Call.suffix()));
    if FINDER.find(body).is_none() {
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
    pub(crate) searches: IntCounterVec,
    pub(crate) duration: Histogram,
    calls: IntCounterVec,
    /// Per caller (tenant, and key, user or session): its last results.
    pub(crate) recent: Mutex<HashMap<Caller, Vec<Box<str>>>>,
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

    pub(crate) fn caller(who: &Principal, session: Option<&str>) -> Caller {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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
