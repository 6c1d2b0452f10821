//! The ids of server-to-client requests relayed to a client.
//!
//! An upstream's request gets an id of the router's that says where the
//! answer goes: `"U.n42"` for upstream `U`'s integer id `42`, `"U.x<hex>"`
//! for any other id (its JSON text, in hex). Any replica routes the client's
//! answer from the id alone, with no shared state, and two upstreams using
//! the same id get different ones.

use serde_json::value::RawValue;
use switchboard_core::UpstreamId;

/// The id (a JSON string) a request of upstream `u` with id `their_id`
/// (JSON) gets towards the client.
pub fn id(u: UpstreamId, their_id: &str) -> String {
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

/// Where a client's answer goes, from the id it answered with (one of
/// `upstreams` upstreams): the upstream and its own id (JSON). `None` for an
/// id the router did not make, or one that would put anything but a JSON
/// string or number back into a message.
pub fn parse(id: &RawValue, upstreams: usize) -> Option<(UpstreamId, Box<str>)> {
    let text = switchboard_protocol::jsonrpc::as_str(id)?;
    let (u, rest) = text.split_once('.')?;
    let u = UpstreamId::new(u.parse::<u32>().ok()? as usize);
    if u.index() >= upstreams {
        return None;
    }
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
        assert_eq!(id(u, "42"), r#""1.n42""#);
        assert_eq!(parse(&raw(&id(u, "42")), 2), Some((u, "42".into())));
        assert_eq!(parse(&raw(&id(u, "-7")), 2), Some((u, "-7".into())));
        let text = r#""a\"b.c""#;
        assert_eq!(parse(&raw(&id(u, text)), 2), Some((u, text.into())));
        assert_eq!(parse(&raw(&id(u, "1.5")), 2), Some((u, "1.5".into())));
        for forged in [
            r#""9.n1""#,
            r#""0.n1,2""#,
            r#""0.x7b7d""#,
            r#""0.xzz""#,
            "5",
            r#""n1""#,
            r#""0.n""#,
            r#""0.n01""#,
            r#""0.n12345678901234567890""#,
        ] {
            assert_eq!(parse(&raw(forged), 2), None, "{forged}");
        }
    }
}
