//! Composite pagination cursors.
//!
//! The merged list is the concatenation of each upstream's items, in
//! configuration order. A cursor names the upstream a page starts in and the
//! offset within that upstream's items, so a cursor stays meaningful when
//! another upstream's list changes between pages. It is opaque to clients:
//! base64url of `v1 NUL upstream NUL offset`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// Where a page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The upstream's configured name.
    pub upstream: String,
    /// Items of that upstream to skip.
    pub offset: usize,
}

impl Cursor {
    /// The opaque string form.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("v1\0{}\0{}", self.upstream, self.offset))
    }

    /// Reads a cursor produced by [`Cursor::encode`].
    pub fn decode(text: &str) -> Result<Cursor, String> {
        let raw = URL_SAFE_NO_PAD.decode(text.as_bytes()).map_err(|_| "not a cursor this router issued".to_owned())?;
        let raw = String::from_utf8(raw).map_err(|_| "not a cursor this router issued".to_owned())?;
        let mut parts = raw.split('\0');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("v1"), Some(upstream), Some(offset), None) => Ok(Cursor {
                upstream: upstream.to_owned(),
                offset: offset.parse().map_err(|_| "corrupt cursor offset".to_owned())?,
            }),
            _ => Err("not a cursor this router issued".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = Cursor { upstream: "git-hub_2".into(), offset: 1234 };
        let text = c.encode();
        assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(Cursor::decode(&text).unwrap(), c);
    }

    #[test]
    fn garbage_is_refused() {
        assert!(Cursor::decode("!!!").is_err());
        assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode("v2\x00a\x001")).is_err());
        assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode("v1\x00a\x00x")).is_err());
        assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode("v1\x00a\x001\x00extra")).is_err());
    }
}
