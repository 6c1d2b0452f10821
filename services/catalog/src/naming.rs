//! How upstream names become the names clients see.
//!
//! Tools and prompts: `prefix + separator + name` (`github__search`), or the
//! bare name when the upstream is mounted with `prefix = ""`. The result keeps
//! to `[A-Za-z0-9_.-]` (other characters become `_`) and to 64 characters:
//! a longer name keeps its first 55 characters and gets `_` and 8 hex digits
//! of a stable hash of the full name, so it is the same on every replica and
//! every restart.
//!
//! Resource URIs: `scheme-prefix + "+" + uri` (`github+repo://x`), which keeps
//! the URI valid (a scheme may contain `+`) and is reversed by stripping the
//! prefix. The scheme prefix is the upstream prefix in lower case with `_`
//! turned into `-`, since URI schemes allow neither upper case nor `_`.

use switchboard_core::hash::fnv1a64;

/// Longest exposed tool or prompt name (several LLM providers cap at 64).
pub const MAX_NAME: usize = 64;
const HASH_HEX: usize = 8;

/// The exposed name of upstream item `name` under `prefix`.
pub fn expose_name(prefix: &str, separator: &str, name: &str) -> String {
    let mut full = String::with_capacity(prefix.len() + separator.len() + name.len());
    if !prefix.is_empty() {
        full.push_str(prefix);
        full.push_str(separator);
    }
    full.push_str(name);
    let sanitized: String =
        full.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' }).collect();
    if !sanitized.is_empty() && sanitized.len() <= MAX_NAME {
        return sanitized;
    }
    let hash = fnv1a64(full.as_bytes());
    let keep = MAX_NAME - HASH_HEX - 1;
    let mut short: String = sanitized.chars().take(keep).collect();
    short.push('_');
    short.push_str(&format!("{hash:016x}")[..HASH_HEX]);
    short
}

/// The URI scheme prefix for an upstream prefix (empty stays empty).
pub fn scheme_prefix(prefix: &str) -> String {
    let mut out: String = prefix
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' | '.' | '-' => c,
            _ => '-',
        })
        .collect();
    if out.chars().next().is_some_and(|c| !c.is_ascii_lowercase()) {
        out.insert(0, 'u');
    }
    out
}

/// The exposed form of `uri` under `scheme_prefix`.
pub fn expose_uri(scheme_prefix: &str, uri: &str) -> String {
    if scheme_prefix.is_empty() {
        uri.to_owned()
    } else {
        format!("{scheme_prefix}+{uri}")
    }
}

/// Splits an exposed URI into `(scheme prefix, original)` if it starts with
/// something that looks like one (letters, digits, `.`, `-` before a `+`).
pub fn split_uri(uri: &str) -> Option<(&str, &str)> {
    let plus = uri.find('+')?;
    let candidate = &uri[..plus];
    let valid = !candidate.is_empty()
        && candidate.starts_with(|c: char| c.is_ascii_lowercase())
        && candidate.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
    valid.then(|| (candidate, &uri[plus + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_separators() {
        assert_eq!(expose_name("github", "__", "search"), "github__search");
        assert_eq!(expose_name("", "__", "search"), "search");
        assert_eq!(expose_name("a", ".", "b"), "a.b");
    }

    #[test]
    fn invalid_characters_become_underscores() {
        assert_eq!(expose_name("fs", "__", "read file/v2"), "fs__read_file_v2");
        assert_eq!(expose_name("fs", "__", "naïve"), "fs__na_ve");
    }

    #[test]
    fn long_names_are_shortened_stably_and_distinctly() {
        let long_a = "x".repeat(80) + "a";
        let long_b = "x".repeat(80) + "b";
        let a = expose_name("upstream", "__", &long_a);
        let b = expose_name("upstream", "__", &long_b);
        assert_eq!(a.len(), MAX_NAME);
        assert_eq!(b.len(), MAX_NAME);
        assert_ne!(a, b, "different names must not collapse");
        assert_eq!(a, expose_name("upstream", "__", &long_a), "deterministic");
        assert!(a.starts_with("upstream__xxx"));
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c)));
        // Exactly 64 is kept as is.
        let exact = "y".repeat(64 - 4);
        assert_eq!(expose_name("ab", "__", &exact), format!("ab__{exact}"));
        assert_eq!(expose_name("ab", "__", &(exact + "z")).len(), 64);
    }

    #[test]
    fn uris_round_trip() {
        let sp = scheme_prefix("My_Files");
        assert_eq!(sp, "my-files");
        let exposed = expose_uri(&sp, "file:///etc/hosts");
        assert_eq!(exposed, "my-files+file:///etc/hosts");
        assert_eq!(split_uri(&exposed), Some(("my-files", "file:///etc/hosts")));
        assert_eq!(expose_uri("", "test://x"), "test://x");
        assert_eq!(scheme_prefix("9lives"), "u9lives");
        assert_eq!(split_uri("test://static"), None);
        assert_eq!(split_uri("git+ssh://host/repo"), Some(("git", "ssh://host/repo")));
    }
}
