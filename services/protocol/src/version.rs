//! MCP protocol versions.

use std::fmt;

/// A protocol revision, ordered by date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolVersion {
    /// HTTP+SSE era.
    V2024_11_05,
    /// Streamable HTTP, batching.
    V2025_03_26,
    /// Elicitation, structured content, `MCP-Protocol-Version` header.
    V2025_06_18,
    /// SSE polling, URL elicitation, tasks.
    V2025_11_25,
    /// The stateless era: no `initialize`, no session; each request carries
    /// its version and the client's capabilities in `_meta`
    /// (`server/discover`, `subscriptions/listen`, multi-round-trip requests).
    V2026_07_28,
}

impl ProtocolVersion {
    /// Every version, oldest first.
    pub const ALL: [ProtocolVersion; 5] = [
        ProtocolVersion::V2024_11_05,
        ProtocolVersion::V2025_03_26,
        ProtocolVersion::V2025_06_18,
        ProtocolVersion::V2025_11_25,
        ProtocolVersion::V2026_07_28,
    ];

    /// The versions the router speaks, newest first: what `server/discover`
    /// lists and what an unsupported-version error names.
    pub const SUPPORTED: [ProtocolVersion; 4] = [
        ProtocolVersion::V2026_07_28,
        ProtocolVersion::V2025_11_25,
        ProtocolVersion::V2025_06_18,
        ProtocolVersion::V2025_03_26,
    ];

    /// The newest version the router offers to sessions (`initialize`).
    pub const LATEST: ProtocolVersion = ProtocolVersion::V2025_11_25;

    /// The newest stateless (per-request) version.
    pub const MODERN: ProtocolVersion = ProtocolVersion::V2026_07_28;

    /// The version a Streamable HTTP server assumes when a request carries no
    /// `MCP-Protocol-Version` header (as the 2025-06-18 transport spec says).
    pub const ASSUMED_WITHOUT_HEADER: ProtocolVersion = ProtocolVersion::V2025_03_26;

    /// Parses the date form, `"2025-06-18"`.
    pub fn parse(s: &str) -> Option<ProtocolVersion> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The date form.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolVersion::V2024_11_05 => "2024-11-05",
            ProtocolVersion::V2025_03_26 => "2025-03-26",
            ProtocolVersion::V2025_06_18 => "2025-06-18",
            ProtocolVersion::V2025_11_25 => "2025-11-25",
            ProtocolVersion::V2026_07_28 => "2026-07-28",
        }
    }

    /// Whether this version runs sessions over Streamable HTTP (2025-03-26
    /// to 2025-11-25): what `initialize` may negotiate.
    pub fn is_streamable_http(self) -> bool {
        (ProtocolVersion::V2025_03_26..=ProtocolVersion::V2025_11_25).contains(&self)
    }

    /// Whether this is a stateless-era version (2026-07-28 onward): no
    /// session, per-request `_meta`.
    pub fn is_modern(self) -> bool {
        self >= ProtocolVersion::V2026_07_28
    }
}

/// The date forms of [`ProtocolVersion::SUPPORTED`], newest first.
pub fn supported() -> [&'static str; 4] {
    ProtocolVersion::SUPPORTED.map(ProtocolVersion::as_str)
}

/// The date forms of the session versions (what `MCP-Protocol-Version` may
/// say on a session's requests), oldest first, joined with ", ".
pub fn session_versions() -> String {
    let versions: Vec<&str> =
        ProtocolVersion::ALL.into_iter().filter(|v| v.is_streamable_http()).map(ProtocolVersion::as_str).collect();
    versions.join(", ")
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_order() {
        for v in ProtocolVersion::ALL {
            assert_eq!(ProtocolVersion::parse(v.as_str()), Some(v));
        }
        assert_eq!(ProtocolVersion::parse("2025-13-01"), None);
        assert!(ProtocolVersion::V2025_03_26 < ProtocolVersion::LATEST);
        assert!(!ProtocolVersion::V2024_11_05.is_streamable_http());
        assert!(!ProtocolVersion::MODERN.is_streamable_http() && ProtocolVersion::MODERN.is_modern());
        assert!(!ProtocolVersion::LATEST.is_modern());
        assert_eq!(supported(), ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"]);
        assert_eq!(session_versions(), "2025-03-26, 2025-06-18, 2025-11-25");
    }
}
