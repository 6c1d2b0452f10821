//! The mock's options (`switchboard-mock --help` sets them from the
//! command line; tests build them directly).

use std::time::Duration;

/// How the mock behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// `serverInfo.name`, and the authority of its resource URIs (`mock://NAME/...`).
    pub name: String,
    /// Issue no `Mcp-Session-Id` (a stateless server); GET answers 405.
    pub stateless: bool,
    /// Extra tools `tool_0` … `tool_{n-1}`, each behaving like `echo`.
    pub extra_tools: usize,
    /// Answer every request with an SSE stream, not `application/json`.
    pub always_sse: bool,
    /// The HTTP status for an unknown session id: 404 per the spec, 400 as
    /// some real servers answer.
    pub unknown_session_status: u16,
    /// Split `tools/list` into pages of this many tools (0: one page).
    pub page_size: usize,
    /// The description of each extra tool is this many bytes long (a
    /// hostile catalog); 0 for a short one.
    pub tool_padding: usize,
    /// `tools/list` names `echo` twice (a careless server).
    pub duplicate_tool: bool,
    /// Offer the `burst` tool: `count` server-to-client requests of
    /// `method` at once, on the call's stream (a hostile server).
    pub burst_tool: bool,
    /// Offer the `exit` tool, which ends the process (restart tests).
    pub allow_exit: bool,
    /// Offer the `whoami` tool: the session's id and every `Authorization`
    /// header its requests carried (credential tests).
    pub whoami: bool,
    /// Answer 401 (`WWW-Authenticate: Bearer`) to a request without an
    /// `Authorization` header (an upstream that needs a credential).
    pub require_auth: bool,
    /// With `require_auth`: the authorization server its protected resource
    /// metadata (RFC 9728, at `/.well-known/oauth-protected-resource/mcp`,
    /// named by the 401's challenge) names; the token itself is not checked.
    pub authorization_server: Option<String>,
    /// Wait this long before answering `tools/list` (a slow upstream).
    pub list_delay: Duration,
    /// Serve the conformance suite's fixtures instead of the usual tools,
    /// resources and prompts.
    pub conformance: bool,
    /// Also serve MCP 2026-07-28 (stateless requests), decided per request.
    /// Off by default: a router probing this mock then finds a 2025-only
    /// upstream, as its tests expect.
    pub modern: bool,
    /// With `modern`: speak only 2026-07-28 (discovery lists no other
    /// version, and `initialize` is refused), as a stateless-only server.
    pub modern_only: bool,
    /// With `modern`: serve both eras, but list only 2026-07-28 in
    /// `server/discover` (and put `serverInfo` in its `_meta`), as the
    /// official conformance server does.
    pub discover_modern_only: bool,
    /// Wait this long before answering `initialize` (so that two router
    /// replicas opening a session race).
    pub initialize_delay: Duration,
    /// The `retry:` of a polled stream's priming event (SSE polling).
    pub poll_retry: Duration,
    /// Every SSE answer is resumable: its events are numbered `STREAM-N`
    /// and kept, and a GET with `Last-Event-ID` replays what followed and
    /// goes on up to the answer, even after the client that asked went
    /// away (a disconnect is not a cancellation). Off: SSE answers carry
    /// no event ids (nothing to resume from).
    pub resumable_streams: bool,
    /// With `modern`: stream answers (and `subscriptions/listen`) as
    /// newline-delimited JSON in an `application/json` body instead of
    /// SSE, as the official conformance server does.
    pub ndjson_streams: bool,
    /// With `modern`: ask for input (`input_required`) whatever the
    /// client's capabilities, as the official conformance server does
    /// (by default the mock answers -32021 to a client that lacks them).
    pub ask_regardless: bool,
    /// Refuse requests whose `Host` or `Origin` is not localhost (DNS
    /// rebinding protection, HTTP 403).
    pub check_host: bool,
    /// The key that seals `requestState` (2026-07-28); mocks that share it
    /// accept each other's states.
    pub state_key: String,
    /// The `ttlMs` of lists and reads (2026-07-28).
    pub list_ttl_ms: u64,
    /// Under which id JSON answers come back (hostile or careless servers).
    pub answer_ids: AnswerIds,
}

/// Under which id the mock answers a request in a JSON body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AnswerIds {
    /// The request's id, byte for byte.
    #[default]
    Echo,
    /// A numeric id re-printed as a JavaScript server does (`1.0` → `1`,
    /// `1E2` → `100`, `-0` → `0`).
    AsJavaScript,
    /// A numeric id plus 1000 in answers to `tools/call`: an answer to a
    /// request never sent.
    Stray,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            name: "mock".into(),
            stateless: false,
            extra_tools: 0,
            always_sse: false,
            unknown_session_status: 404,
            page_size: 0,
            tool_padding: 0,
            duplicate_tool: false,
            burst_tool: false,
            allow_exit: false,
            whoami: false,
            require_auth: false,
            authorization_server: None,
            list_delay: Duration::ZERO,
            conformance: false,
            modern: false,
            modern_only: false,
            discover_modern_only: false,
            initialize_delay: Duration::ZERO,
            poll_retry: Duration::from_millis(100),
            resumable_streams: false,
            ndjson_streams: false,
            ask_regardless: false,
            check_host: false,
            state_key: "switchboard-mock".into(),
            list_ttl_ms: 0,
            answer_ids: AnswerIds::Echo,
        }
    }
}
