//! The ids of server-to-client requests relayed to a client.
//!
//! An upstream's request gets an id of the router's that says where the
//! answer goes: `"K.n42"` for the upstream whose key is `K` (eight hex
//! digits: [`Upstreams::key`], a hash of its name, the same at every
//! replica whatever upstreams each added since it started) and its integer
//! id `42`, `"K.x<hex>"` for any other id (its JSON text, in hex). Any
//! replica routes the client's answer from the id alone, with no shared
//! state, and two upstreams using the same id get different ones.

use serde_json::value::RawValue;
use switchboard_core::UpstreamId;
use switchboard_upstream::Upstreams;

/// The id (a JSON string) a request with id `their_id` (JSON) of the
/// upstream whose key is `key` gets towards the client.
pub fn id(key: u32, their_id: &str) -> String {
    let u = format_args!("{key:08x}");
    let is_integer = {
        let digits = their_id.strip_prefix('-').unwrap_or(their_id);
        !digits.is_empty() && digits.len() <= 19 && digits.bytes().all(|b| b.is_ascii_digit())
    };
    if is_integer {
        format!("\"{u}.n{their_id}\"")
    } else {
        format!("\"{u}.x{}\"", hex::encode(their_id))
    }
}

/// Where a client's answer goes, from the id it answered with: the
/// upstream of `upstreams` and its own id (JSON). `None` for an id the
/// router did not make, one of an upstream no longer served, or one that
/// would put anything but a JSON string or number back into a message.
pub fn parse(id: &RawValue, upstreams: &Upstreams) -> Option<(UpstreamId, Box<str>)> {
    parse_with(id, |key| upstreams.by_key(key))
}

/// [`parse`], with the upstream found by `find` from its key.
fn parse_with(id: &RawValue, find: impl Fn(u32) -> Option<UpstreamId>) -> Option<(UpstreamId, Box<str>)> {
    let text = switchboard_protocol::jsonrpc::as_str(id)?;
    let (key, rest) = text.split_once('.')?;
    if key.len() != 8 || !key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let u = find(u32::from_str_radix(key, 16).ok()?)?;
    let theirs = if let Some(digits) = rest.strip_prefix('n') {
        // Exactly as `id` writes them: no leading zeros, at most 19 digits.
        let number = digits.strip_prefix('-').unwrap_or(digits);
        let canonical = !number.is_empty()
            && number.len() <= 19
            && number.bytes().all(|b| b.is_ascii_digit())
            && (number == "0" || !number.starts_with('0'));
        if !canonical {
            return None;
        }
        digits.to_owned()
    } else {
        let hex = rest.strip_prefix('x')?;
        if hex.len() > 2048 {
            return None;
        }
        let raw = hex::decode(hex).ok()?;
        // Only a JSON string or number may go back into a message.
        match serde_json::from_slice::<serde_json::Value>(&raw).ok()? {
            serde_json::Value::String(_) | serde_json::Value::Number(_) => String::from_utf8(raw).ok()?,
            _ => return None,
        }
    };
    Some((u, theirs.into_boxed_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn ids_round_trip_and_forgeries_are_refused() {
        let u = UpstreamId::new(1);
        let find =
            |key: u32| [(0x0000_00ab, UpstreamId::new(0)), (0x1234_abcd, u)].iter().find(|k| k.0 == key).map(|k| k.1);
        let parse = |id: &RawValue| parse_with(id, find);
        assert_eq!(id(0x1234_abcd, "42"), r#""1234abcd.n42""#);
        assert_eq!(id(0xab, "1"), r#""000000ab.n1""#);
        assert_eq!(parse(&raw(&id(0x1234_abcd, "42"))), Some((u, "42".into())));
        assert_eq!(parse(&raw(&id(0x1234_abcd, "-7"))), Some((u, "-7".into())));
        let text = r#""a\"b.c""#;
        assert_eq!(parse(&raw(&id(0x1234_abcd, text))), Some((u, text.into())));
        assert_eq!(parse(&raw(&id(0x1234_abcd, "1.5"))), Some((u, "1.5".into())));
        for forged in [
            r#""99999999.n1""#,
            r#""1234ABCD.n1""#,
            r#""ab.n1""#,
            r#""000000ab.n1,2""#,
            r#""000000ab.x7b7d""#,
            r#""000000ab.xzz""#,
            "5",
            r#""n1""#,
            r#""000000ab.n""#,
            r#""000000ab.n01""#,
            r#""000000ab.n12345678901234567890""#,
        ] {
            assert_eq!(parse(&raw(forged)), None, "{forged}");
        }
    }
}
