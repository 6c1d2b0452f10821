//! The mock's `subscriptions/listen` streams (MCP 2026-07-28): what each
//! asked for, and the changes they hear of.

use std::sync::Mutex;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use switchboard_protocol::sse;
use tokio::sync::mpsc;

pub(crate) const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub(crate) const META_SUBSCRIPTION: &str = "io.modelcontextprotocol/subscriptionId";

/// One message as an SSE event.
pub(crate) fn frame(message: &Value) -> Bytes {
    sse::encode_event(None, None, message.to_string().as_bytes())
}

/// What a `subscriptions/listen` stream asked for, as honoured.
#[derive(Default, Clone)]
pub(crate) struct Filter {
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: Vec<String>,
}

impl Filter {
    pub(crate) fn from_request(requested: &Value) -> Filter {
        let flag = |k: &str| requested[k].as_bool().unwrap_or(false);
        Filter {
            tools: flag("toolsListChanged"),
            prompts: flag("promptsListChanged"),
            resources: flag("resourcesListChanged"),
            uris: requested["resourceSubscriptions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect(),
        }
    }

    pub(crate) fn to_value(&self) -> Value {
        let mut honoured = Map::new();
        for (key, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                honoured.insert(key.into(), json!(true));
            }
        }
        if !self.uris.is_empty() {
            honoured.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        Value::Object(honoured)
    }
}

/// A change that open listen streams may want to hear about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change<'a> {
    Tools,
    Prompts,
    Updated(&'a str),
}

pub(crate) struct Listener {
    pub(crate) id: Value,
    pub(crate) filter: Filter,
    pub(crate) out: mpsc::UnboundedSender<Bytes>,
}

/// The open `subscriptions/listen` streams.
#[derive(Default)]
pub(crate) struct Listeners {
    open: Mutex<Vec<Listener>>,
}

impl Listeners {
    /// Tells every listener that asked for it; forgets closed streams.
    pub(crate) fn notify(&self, change: Change<'_>) {
        let (method, params) = match change {
            Change::Tools => ("notifications/tools/list_changed", json!({})),
            Change::Prompts => ("notifications/prompts/list_changed", json!({})),
            Change::Updated(uri) => ("notifications/resources/updated", json!({"uri": uri})),
        };
        self.open.lock().expect("lock").retain(|l| {
            let wanted = match change {
                Change::Tools => l.filter.tools,
                Change::Prompts => l.filter.prompts,
                Change::Updated(uri) => l.filter.uris.iter().any(|u| u == uri),
            };
            if !wanted {
                return !l.out.is_closed();
            }
            let mut params = params.clone();
            params["_meta"] = json!({META_SUBSCRIPTION: l.id});
            l.out.send(frame(&json!({"jsonrpc": "2.0", "method": method, "params": params}))).is_ok()
        });
    }

    /// Ends every stream with its result (a graceful close).
    pub(crate) fn close_all(&self, server_info: &Value) {
        for l in self.open.lock().expect("lock").drain(..) {
            let result = json!({"resultType": "complete",
                "_meta": {META_SUBSCRIPTION: l.id, META_SERVER_INFO: server_info}});
            let _ = l.out.send(frame(&json!({"jsonrpc": "2.0", "id": l.id, "result": result})));
        }
    }

    /// A new stream.
    pub(crate) fn add(&self, listener: Listener) {
        self.open.lock().expect("lock").push(listener);
    }

    /// How many streams are open.
    pub(crate) fn len(&self) -> usize {
        let mut open = self.open.lock().expect("lock");
        open.retain(|l| !l.out.is_closed());
        open.len()
    }
}
