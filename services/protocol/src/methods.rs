//! MCP method names, and what a router does with each.
//!
//! [`Method::from_name`] is the one place a method string is matched; the rest
//! of Switchboard works with the enum. [`Method::label`] gives a bounded set of
//! names for metrics, so an unknown method cannot blow up label cardinality.

/// A method Switchboard knows by name. Unknown names are [`Method::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    // Client to server requests.
    Initialize,
    Ping,
    ToolsList,
    ToolsCall,
    ResourcesList,
    ResourcesTemplatesList,
    ResourcesRead,
    ResourcesSubscribe,
    ResourcesUnsubscribe,
    PromptsList,
    PromptsGet,
    CompletionComplete,
    LoggingSetLevel,
    /// 2026-07-28: what the server speaks, without a session.
    ServerDiscover,
    /// 2026-07-28: a stream of list-change and resource notifications.
    SubscriptionsListen,
    // Server to client requests.
    SamplingCreateMessage,
    ElicitationCreate,
    RootsList,
    // Notifications, both directions.
    Initialized,
    Cancelled,
    Progress,
    LogMessage,
    ResourcesUpdated,
    ResourcesListChanged,
    ToolsListChanged,
    PromptsListChanged,
    RootsListChanged,
    ElicitationComplete,
    SubscriptionsAcknowledged,
    /// Anything else.
    Other,
}

use Method::*;

const NAMES: &[(Method, &str)] = &[
    (Initialize, "initialize"),
    (Ping, "ping"),
    (ToolsList, "tools/list"),
    (ToolsCall, "tools/call"),
    (ResourcesList, "resources/list"),
    (ResourcesTemplatesList, "resources/templates/list"),
    (ResourcesRead, "resources/read"),
    (ResourcesSubscribe, "resources/subscribe"),
    (ResourcesUnsubscribe, "resources/unsubscribe"),
    (PromptsList, "prompts/list"),
    (PromptsGet, "prompts/get"),
    (CompletionComplete, "completion/complete"),
    (LoggingSetLevel, "logging/setLevel"),
    (ServerDiscover, "server/discover"),
    (SubscriptionsListen, "subscriptions/listen"),
    (SamplingCreateMessage, "sampling/createMessage"),
    (ElicitationCreate, "elicitation/create"),
    (RootsList, "roots/list"),
    (Initialized, "notifications/initialized"),
    (Cancelled, "notifications/cancelled"),
    (Progress, "notifications/progress"),
    (LogMessage, "notifications/message"),
    (ResourcesUpdated, "notifications/resources/updated"),
    (ResourcesListChanged, "notifications/resources/list_changed"),
    (ToolsListChanged, "notifications/tools/list_changed"),
    (PromptsListChanged, "notifications/prompts/list_changed"),
    (RootsListChanged, "notifications/roots/list_changed"),
    (ElicitationComplete, "notifications/elicitation/complete"),
    (SubscriptionsAcknowledged, "notifications/subscriptions/acknowledged"),
];

impl Method {
    /// The method for a wire name; [`Method::Other`] if unknown.
    pub fn from_name(name: &str) -> Method {
        // The hot methods first; the table is short enough for a scan.
        match name {
            "tools/call" => ToolsCall,
            "tools/list" => ToolsList,
            _ => NAMES.iter().find(|(_, n)| *n == name).map_or(Other, |(m, _)| *m),
        }
    }

    /// The wire name (`"other"` for [`Method::Other`]).
    pub fn as_str(self) -> &'static str {
        NAMES.iter().find(|(m, _)| *m == self).map_or("other", |(_, n)| n)
    }

    /// A name for metric labels, from a fixed set.
    pub fn label(self) -> &'static str {
        self.as_str()
    }

    /// Every named method, for building per-method metric handles.
    pub fn all() -> impl Iterator<Item = Method> {
        NAMES.iter().map(|(m, _)| *m).chain(std::iter::once(Other))
    }

    /// Whether a server may send requests or notifications while answering
    /// this request (a tool call may ask for sampling; a list may not).
    pub fn may_cause_messages(self) -> bool {
        !matches!(
            self,
            Initialize
                | Ping
                | ToolsList
                | PromptsList
                | ResourcesList
                | ResourcesTemplatesList
                | LoggingSetLevel
                | ServerDiscover
        )
    }

    /// The client capability a server-to-client request needs (`sampling`,
    /// `elicitation`, `roots`), for the requests that need one.
    pub fn client_capability(self) -> Option<&'static str> {
        match self {
            SamplingCreateMessage => Some("sampling"),
            ElicitationCreate => Some("elicitation"),
            RootsList => Some("roots"),
            _ => None,
        }
    }

    /// A `notifications/*/list_changed` notification, and for which list.
    pub fn list_changed(self) -> Option<ListKind> {
        match self {
            ToolsListChanged => Some(ListKind::Tools),
            PromptsListChanged => Some(ListKind::Prompts),
            ResourcesListChanged => Some(ListKind::Resources),
            _ => None,
        }
    }
}

/// The lists a router aggregates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
    ResourceTemplates,
}

impl ListKind {
    /// All four, in a fixed order.
    pub const ALL: [ListKind; 4] =
        [ListKind::Tools, ListKind::Prompts, ListKind::Resources, ListKind::ResourceTemplates];

    /// The `*/list` method.
    pub fn method(self) -> &'static str {
        match self {
            ListKind::Tools => "tools/list",
            ListKind::Prompts => "prompts/list",
            ListKind::Resources => "resources/list",
            ListKind::ResourceTemplates => "resources/templates/list",
        }
    }

    /// The member of the list result that holds the items.
    pub fn field(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources => "resources",
            ListKind::ResourceTemplates => "resourceTemplates",
        }
    }

    /// The capability an upstream declares when it serves this list.
    pub fn capability(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources | ListKind::ResourceTemplates => "resources",
        }
    }

    /// The `list_changed` notification for this list.
    pub fn changed_notification(self) -> &'static str {
        match self {
            ListKind::Tools => "notifications/tools/list_changed",
            ListKind::Prompts => "notifications/prompts/list_changed",
            ListKind::Resources | ListKind::ResourceTemplates => "notifications/resources/list_changed",
        }
    }

    /// A short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources => "resources",
            ListKind::ResourceTemplates => "resource_templates",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in Method::all() {
            if m != Other {
                assert_eq!(Method::from_name(m.as_str()), m);
            }
        }
        assert_eq!(Method::from_name("tools/explode"), Other);
        assert_eq!(Other.label(), "other");
    }

    #[test]
    fn list_changed_maps_to_its_list() {
        assert_eq!(ToolsListChanged.list_changed(), Some(ListKind::Tools));
        assert_eq!(ToolsCall.list_changed(), None);
    }
}
