//! Identifiers: random ones for sessions, connections and records, and the
//! index of a configured upstream.

use std::fmt;
use std::sync::Arc;

/// `bytes` random bytes as lowercase hex.
pub fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    getrandom::fill(&mut raw).expect("the operating system provides randomness");
    hex::encode(raw)
}

/// 128 random bits as 32 lowercase hex digits: session ids, tokens, keys
/// nobody can guess.
pub fn random_id() -> Arc<str> {
    Arc::from(random_hex(16))
}

/// An upstream, by the slot this process gave it: the configured ones in
/// configuration order, then each one added or changed while it runs (a
/// changed upstream gets a new slot; a removed one keeps its own, never
/// reused). Tables kept per upstream are indexed by it. It means nothing
/// to another replica: what crosses replicas names the upstream instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpstreamId(u32);

impl UpstreamId {
    /// The upstream in slot `index`.
    pub fn new(index: usize) -> UpstreamId {
        UpstreamId(u32::try_from(index).expect("fewer than 2^32 upstreams"))
    }

    /// Its slot.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// Every id of `count` upstreams, in order.
    pub fn all(count: usize) -> impl Iterator<Item = UpstreamId> {
        (0..count).map(UpstreamId::new)
    }
}

impl fmt::Display for UpstreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Whether `name` may name an upstream, a tenant or a device: 1 to 48
/// letters, digits, `_` or `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 48 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_hex() {
        let (a, b) = (random_id(), random_id());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
        assert_eq!(random_hex(3).len(), 6);
    }

    #[test]
    fn names() {
        assert!(valid_name("a-b_C9"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name(&"x".repeat(49)));
    }

    #[test]
    fn upstream_ids_are_positions() {
        assert_eq!(UpstreamId::new(7).index(), 7);
        assert_eq!(UpstreamId::new(7).to_string(), "7");
        assert_eq!(UpstreamId::all(3).map(UpstreamId::index).collect::<Vec<_>>(), [0, 1, 2]);
    }
}
