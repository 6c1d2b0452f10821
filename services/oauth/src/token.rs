//! JWT access tokens (RFC 7519, RFC 9068): decoding the compact form, and
//! the checks on their claims once the signature is known to be good.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{Map, Value};

use crate::keys::Alg;

/// The longest token the router reads (a header's worth); anything longer
/// is refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a token was refused. The messages are for logs; a client is told
/// only that its token is invalid or expired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    #[error("algorithm {0:?} is not allowed")]
    Algorithm(String),
    #[error("the token names a critical extension the router does not implement")]
    Critical,
    #[error("no key of the issuer matches the token (kid {0:?})")]
    UnknownKey(Option<String>),
    #[error("bad signature")]
    Signature,
    #[error("issuer {0:?} is not a configured authorization server")]
    Issuer(String),
    #[error("the token is not for this resource (aud {0})")]
    Audience(String),
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token has no \"{0}\" claim")]
    MissingClaim(&'static str),
    #[error("the authorization server says the token is not active")]
    Inactive,
}

impl Rejection {
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::Malformed(_) => "malformed",
            Rejection::Algorithm(_) => "algorithm",
            Rejection::Critical => "critical",
            Rejection::UnknownKey(_) => "unknown_key",
            Rejection::Signature => "signature",
            Rejection::Issuer(_) => "issuer",
            Rejection::Audience(_) => "audience",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::MissingClaim(_) => "missing_claim",
            Rejection::Inactive => "inactive",
        }
    }
}

/// A JWT whose signature is not checked yet.
#[derive(Debug)]
pub struct Unverified<'a> {
    pub alg: Alg,
    pub kid: Option<String>,
    pub claims: Map<String, Value>,
    /// `header.payload`, what the signature signs.
    pub signed: &'a [u8],
    pub signature: Vec<u8>,
}

/// Whether `token` has the shape of a JWS compact serialization (three
/// base64url parts), i.e. is not an opaque token.
pub fn looks_like_jwt(token: &str) -> bool {
    // Counted and checked in chunks whose sums fit a byte, without an early
    // exit or a branch per byte, so that it runs 16 bytes at a time: every
    // request with a token passes here, and a byte-by-byte check of a
    // JWT's 800 or so bytes was most of the cost of one already verified.
    let (mut dots, mut fit) = (0usize, true);
    for chunk in token.as_bytes().chunks(255) {
        let (n, ok) = chunk.iter().fold((0u8, true), |(n, ok), &b| {
            let alphanumeric = b.is_ascii_digit() | b.is_ascii_uppercase() | b.is_ascii_lowercase();
            (n + u8::from(b == b'.'), ok & (alphanumeric | (b == b'-') | (b == b'_') | (b == b'.')))
        });
        dots += usize::from(n);
        fit &= ok;
    }
    fit && dots == 2
}

/// Splits and decodes a compact JWS, checking its header against
/// `allowed` (never `none`, never HMAC: those do not even parse).
pub fn decode<'a>(token: &'a str, allowed: &[Alg]) -> Result<Unverified<'a>, Rejection> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Rejection::Malformed("too long"));
    }
    let mut parts = token.splitn(3, '.');
    let (header, payload, signature) = match (parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(p), Some(s)) if !s.contains('.') => (h, p, s),
        _ => return Err(Rejection::Malformed("not three parts")),
    };
    let part = |text: &str| URL_SAFE_NO_PAD.decode(text).map_err(|_| Rejection::Malformed("not base64url"));
    let header: Map<String, Value> =
        serde_json::from_slice(&part(header)?).map_err(|_| Rejection::Malformed("header is not a JSON object"))?;
    let alg_name = header.get("alg").and_then(Value::as_str).ok_or(Rejection::Malformed("no alg"))?;
    let alg = Alg::parse(alg_name)
        .filter(|a| allowed.contains(a))
        .ok_or_else(|| Rejection::Algorithm(alg_name.chars().take(16).collect()))?;
    if header.contains_key("crit") {
        return Err(Rejection::Critical);
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) if kid.len() <= 256 => Some(kid.clone()),
        Some(_) => return Err(Rejection::Malformed("kid")),
    };
    let claims: Map<String, Value> =
        serde_json::from_slice(&part(payload)?).map_err(|_| Rejection::Malformed("claims are not a JSON object"))?;
    let signed = &token.as_bytes()[..token.len() - signature.len() - 1];
    Ok(Unverified { alg, kid, claims, signed, signature: part(signature)? })
}

/// The claims' checks that do not depend on the key: `iss`, `aud` (RFC
/// 8707: the token must be meant for this resource), `exp` (required) and
/// `nbf`, each time with `leeway` seconds of clock skew.
pub fn check_claims(
    claims: &Map<String, Value>,
    issuer: &str,
    audience: &str,
    now_s: i64,
    leeway_s: i64,
) -> Result<(), Rejection> {
    match claims.get("iss").and_then(Value::as_str) {
        Some(iss) if same_resource(iss, issuer) => {}
        Some(iss) => return Err(Rejection::Issuer(iss.chars().take(200).collect())),
        None => return Err(Rejection::MissingClaim("iss")),
    }
    check_audience(claims, audience)?;
    let exp = claims.get("exp").and_then(Value::as_f64).ok_or(Rejection::MissingClaim("exp"))?;
    if (exp as i64).saturating_add(leeway_s) <= now_s {
        return Err(Rejection::Expired);
    }
    if let Some(nbf) = claims.get("nbf").and_then(Value::as_f64) {
        if (nbf as i64).saturating_sub(leeway_s) > now_s {
            return Err(Rejection::NotYetValid);
        }
    }
    Ok(())
}

/// `aud` must name `audience` (a string, or an array holding it).
pub fn check_audience(claims: &Map<String, Value>, audience: &str) -> Result<(), Rejection> {
    let ok = match claims.get("aud") {
        Some(Value::String(aud)) => same_resource(aud, audience),
        Some(Value::Array(auds)) => auds.iter().filter_map(Value::as_str).any(|a| same_resource(a, audience)),
        Some(_) | None => return Err(Rejection::MissingClaim("aud")),
    };
    if ok {
        Ok(())
    } else {
        let aud = claims.get("aud").map(Value::to_string).unwrap_or_default();
        Err(Rejection::Audience(aud.chars().take(200).collect()))
    }
}

/// Identifiers (resources, issuers) compare exactly, but for a trailing slash.
fn same_resource(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The scopes a token grants: `scope` (space-separated, RFC 9068) or
/// `scp` (an array, as some servers write it).
pub fn scopes(claims: &Map<String, Value>) -> Vec<String> {
    match (claims.get("scope"), claims.get("scp")) {
        (Some(Value::String(s)), _) => s.split_ascii_whitespace().map(str::to_owned).collect(),
        (_, Some(Value::Array(a))) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        (_, Some(Value::String(s))) => s.split_ascii_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

/// A claim as text: a string as is, a number written out; a dotted name
/// (`org.id`) looks into nested objects.
pub fn claim_text(claims: &Map<String, Value>, name: &str) -> Option<String> {
    let mut parts = name.split('.');
    let mut value = claims.get(parts.next()?)?;
    for part in parts {
        value = value.get(part)?;
    }
    match value {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(v.to_string())
    }

    #[test]
    fn refuses_none_hmac_and_algorithms_not_allowed() {
        let claims = b64(&json!({"sub": "x"}));
        for alg in ["none", "HS256", "RS999"] {
            let t = format!("{}.{claims}.", b64(&json!({"alg": alg})));
            assert!(matches!(decode(&t, &Alg::ALL), Err(Rejection::Algorithm(_))), "{alg}");
        }
        let t = format!("{}.{claims}.AAAA", b64(&json!({"alg": "ES256"})));
        assert!(decode(&t, &Alg::ALL).is_ok());
        assert!(matches!(decode(&t, &[Alg::Rs256]), Err(Rejection::Algorithm(_))));
        let crit = format!("{}.{claims}.AAAA", b64(&json!({"alg": "ES256", "crit": ["exp"]})));
        assert_eq!(decode(&crit, &Alg::ALL).unwrap_err(), Rejection::Critical);
    }

    #[test]
    fn refuses_malformed_tokens() {
        for t in ["", "a", "a.b", "a.b.c.d", "!!.e30.AA", "e30.e30", &"A".repeat(MAX_TOKEN_BYTES + 1)] {
            assert!(matches!(decode(t, &Alg::ALL), Err(Rejection::Malformed(_))), "{t:.20}");
        }
        assert!(looks_like_jwt("a.b.c") && !looks_like_jwt("opaque-token") && !looks_like_jwt("a.b c.d"));
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_Zz09"));
        for bad in [
            "a.b",
            "a.b.c.d",
            "a.b.c=",
            "a.b.c/",
            "a.b.c+",
            "a.b.\u{e9}",
            "a.b.c\n",
            "a.b.c ",
            "@.b.c",
            "[.b.c",
            "`.b.c",
            "{.b.c",
        ] {
            assert!(!looks_like_jwt(bad), "{bad:?}");
        }
    }

    #[test]
    fn checks_issuer_audience_and_times_with_leeway() {
        let c = |v: Value| v.as_object().unwrap().clone();
        let good = c(json!({"iss": "https://as", "aud": ["x", "https://rs/mcp"], "exp": 1000, "nbf": 900}));
        assert_eq!(check_claims(&good, "https://as", "https://rs/mcp/", 950, 0), Ok(()));
        assert_eq!(check_claims(&good, "https://as", "https://rs/mcp", 1000, 0), Err(Rejection::Expired));
        assert_eq!(check_claims(&good, "https://as", "https://rs/mcp", 1030, 60), Ok(()));
        assert_eq!(check_claims(&good, "https://as", "https://rs/mcp", 850, 0), Err(Rejection::NotYetValid));
        assert_eq!(check_claims(&good, "https://as", "https://rs/mcp", 850, 60), Ok(()));
        assert!(matches!(check_claims(&good, "https://other", "https://rs/mcp", 950, 0), Err(Rejection::Issuer(_))));
        assert!(matches!(check_claims(&good, "https://as", "https://rs/other", 950, 0), Err(Rejection::Audience(_))));
        let no_exp = c(json!({"iss": "https://as", "aud": "https://rs/mcp"}));
        assert_eq!(check_claims(&no_exp, "https://as", "https://rs/mcp", 0, 0), Err(Rejection::MissingClaim("exp")));
        let no_aud = c(json!({"iss": "https://as", "exp": 10}));
        assert_eq!(check_claims(&no_aud, "https://as", "https://rs/mcp", 0, 0), Err(Rejection::MissingClaim("aud")));
    }

    #[test]
    fn reads_scopes_and_nested_claims() {
        let c = json!({"scope": "a  b", "org": {"id": 42, "name": "acme"}});
        let c = c.as_object().unwrap();
        assert_eq!(scopes(c), ["a", "b"]);
        assert_eq!(scopes(json!({"scp": ["x"]}).as_object().unwrap()), ["x"]);
        assert_eq!(claim_text(c, "org.name").as_deref(), Some("acme"));
        assert_eq!(claim_text(c, "org.id").as_deref(), Some("42"));
        assert_eq!(claim_text(c, "org"), None);
    }
}
