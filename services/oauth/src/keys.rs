//! An authorization server's signing keys, as its JWKS publishes them
//! (RFC 7517), and the signature algorithms the router accepts (RFC 7518).
//!
//! Only public keys of the asymmetric kinds are ever used: a key of kind
//! `oct` (a shared secret) is skipped, and an HMAC algorithm can never be
//! allowed, so a public key can never be turned into an HMAC secret. A key
//! verifies only the algorithms of its own kind (and only its own `alg`
//! when the JWKS names one).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// A JWS signature algorithm the router can verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alg {
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
    Es256,
    Es384,
    EdDsa,
}

impl Alg {
    /// Every algorithm the router can verify (the default allowlist).
    pub const ALL: [Alg; 9] =
        [Alg::Rs256, Alg::Rs384, Alg::Rs512, Alg::Ps256, Alg::Ps384, Alg::Ps512, Alg::Es256, Alg::Es384, Alg::EdDsa];

    /// The algorithm of a JWS `alg` value; `None` for `none`, the HMAC
    /// family and anything unknown.
    pub fn parse(name: &str) -> Option<Alg> {
        Some(match name {
            "RS256" => Alg::Rs256,
            "RS384" => Alg::Rs384,
            "RS512" => Alg::Rs512,
            "PS256" => Alg::Ps256,
            "PS384" => Alg::Ps384,
            "PS512" => Alg::Ps512,
            "ES256" => Alg::Es256,
            "ES384" => Alg::Es384,
            "EdDSA" => Alg::EdDsa,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Rs384 => "RS384",
            Alg::Rs512 => "RS512",
            Alg::Ps256 => "PS256",
            Alg::Ps384 => "PS384",
            Alg::Ps512 => "PS512",
            Alg::Es256 => "ES256",
            Alg::Es384 => "ES384",
            Alg::EdDsa => "EdDSA",
        }
    }
}

/// The public part of a key.
#[derive(Debug, Clone)]
enum Public {
    /// Modulus and exponent, big-endian.
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed point (`04 || x || y`) on P-256 or P-384.
    Ec {
        p384: bool,
        point: Vec<u8>,
    },
    Ed25519(Vec<u8>),
}

/// One signing key.
#[derive(Debug, Clone)]
pub struct Key {
    pub kid: Option<String>,
    /// The one algorithm the JWKS says the key is for, if it says.
    pub alg: Option<Alg>,
    public: Public,
}

impl Key {
    /// A key from its JWK; `Err` says why it is not usable for verifying
    /// signatures (wrong kind, wrong use, malformed).
    pub fn from_jwk(jwk: &Value) -> Result<Key, String> {
        let field = |name: &str| jwk.get(name).and_then(Value::as_str);
        let bytes = |name: &str| -> Result<Vec<u8>, String> {
            let text = field(name).ok_or_else(|| format!("no \"{name}\""))?;
            URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')).map_err(|_| format!("\"{name}\" is not base64url"))
        };
        if field("use").is_some_and(|u| u != "sig") {
            return Err("not a signing key (\"use\" is not \"sig\")".into());
        }
        let alg = match field("alg") {
            None => None,
            Some(name) => Some(Alg::parse(name).ok_or_else(|| format!("algorithm {name:?} is not supported"))?),
        };
        let public = match field("kty") {
            Some("RSA") => {
                let (n, e) = (bytes("n")?, bytes("e")?);
                if n.iter().skip_while(|b| **b == 0).count() < 256 {
                    return Err("RSA keys shorter than 2048 bits are refused".into());
                }
                Public::Rsa { n, e }
            }
            Some("EC") => {
                let p384 = match field("crv") {
                    Some("P-256") => false,
                    Some("P-384") => true,
                    other => return Err(format!("curve {other:?} is not supported")),
                };
                let (x, y) = (bytes("x")?, bytes("y")?);
                let size = if p384 { 48 } else { 32 };
                if x.len() != size || y.len() != size {
                    return Err("the point's coordinates have the wrong length".into());
                }
                let mut point = Vec::with_capacity(1 + 2 * size);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                Public::Ec { p384, point }
            }
            Some("OKP") => match field("crv") {
                Some("Ed25519") => Public::Ed25519(bytes("x")?),
                other => return Err(format!("curve {other:?} is not supported")),
            },
            Some("oct") => return Err("symmetric keys are never used".into()),
            other => return Err(format!("key type {other:?} is not supported")),
        };
        Ok(Key { kid: field("kid").map(str::to_owned), alg, public })
    }

    /// Whether this key can verify `alg` signatures.
    pub fn fits(&self, alg: Alg) -> bool {
        if self.alg.is_some_and(|a| a != alg) {
            return false;
        }
        matches!(
            (&self.public, alg),
            (Public::Rsa { .. }, Alg::Rs256 | Alg::Rs384 | Alg::Rs512 | Alg::Ps256 | Alg::Ps384 | Alg::Ps512)
                | (Public::Ec { p384: false, .. }, Alg::Es256)
                | (Public::Ec { p384: true, .. }, Alg::Es384)
                | (Public::Ed25519(_), Alg::EdDsa)
        )
    }

    /// Whether `signature` is this key's `alg` signature of `message`.
    pub fn verify(&self, alg: Alg, message: &[u8], sig: &[u8]) -> bool {
        if !self.fits(alg) {
            return false;
        }
        match &self.public {
            Public::Rsa { n, e } => {
                let params: &signature::RsaParameters = match alg {
                    Alg::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Alg::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    Alg::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    Alg::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
                    Alg::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
                    Alg::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
                    _ => return false,
                };
                RsaPublicKeyComponents { n, e }.verify(params, message, sig).is_ok()
            }
            Public::Ec { p384, point } => {
                let algorithm =
                    if *p384 { &signature::ECDSA_P384_SHA384_FIXED } else { &signature::ECDSA_P256_SHA256_FIXED };
                UnparsedPublicKey::new(algorithm, point).verify(message, sig).is_ok()
            }
            Public::Ed25519(x) => UnparsedPublicKey::new(&signature::ED25519, x).verify(message, sig).is_ok(),
        }
    }
}

/// The keys of one JWKS document.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    pub keys: Vec<Key>,
    /// Keys the document lists but the router cannot use, and why (for the
    /// log: a JWKS may well list keys for other purposes).
    pub skipped: Vec<String>,
}

/// At most this many keys are kept from one JWKS document.
pub const MAX_KEYS: usize = 64;

impl KeySet {
    /// Parses a JWKS document (`{"keys": […]}`).
    pub fn parse(document: &[u8]) -> Result<KeySet, String> {
        let value: Value = serde_json::from_slice(document).map_err(|e| format!("not JSON: {e}"))?;
        let keys = value.get("keys").and_then(Value::as_array).ok_or("no \"keys\" array")?;
        let mut set = KeySet::default();
        for (i, jwk) in keys.iter().enumerate() {
            match Key::from_jwk(jwk) {
                Ok(key) if set.keys.len() < MAX_KEYS => set.keys.push(key),
                Ok(_) => set.skipped.push(format!("key {i}: more than {MAX_KEYS} keys")),
                Err(why) => set.skipped.push(format!("key {i}: {why}")),
            }
        }
        Ok(set)
    }

    /// The keys that may have made a signature with `alg` and `kid`: the
    /// one with that `kid`, or, for a token without one, every key of the
    /// right kind.
    pub fn candidates<'a>(&'a self, kid: Option<&'a str>, alg: Alg) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys.iter().filter(move |k| k.fits(alg) && (kid.is_none() || k.kid.as_deref() == kid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refuses_symmetric_and_unknown_keys() {
        assert!(Key::from_jwk(&json!({"kty": "oct", "k": "c2VjcmV0"})).is_err());
        assert!(Key::from_jwk(&json!({"kty": "EC", "crv": "secp256k1", "x": "AA", "y": "AA"})).is_err());
        assert!(Key::from_jwk(&json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"})).unwrap_err().contains("2048"));
        assert!(Key::from_jwk(&json!({"kty": "OKP", "crv": "Ed25519", "x": "AA", "use": "enc"})).is_err());
        assert!(Key::from_jwk(&json!({"kty": "OKP", "crv": "Ed25519", "x": "AA", "alg": "HS256"})).is_err());
        for hmac in ["HS256", "HS384", "HS512", "none", "None", ""] {
            assert_eq!(Alg::parse(hmac), None, "{hmac}");
        }
    }

    #[test]
    fn a_key_verifies_only_its_own_kind() {
        let ed =
            Key::from_jwk(&json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode([1u8; 32])})).unwrap();
        assert!(ed.fits(Alg::EdDsa));
        assert!(!ed.fits(Alg::Rs256) && !ed.fits(Alg::Es256));
        let pinned = Key { alg: Some(Alg::Ps256), ..rsa_key() };
        assert!(pinned.fits(Alg::Ps256) && !pinned.fits(Alg::Rs256));
    }

    fn rsa_key() -> Key {
        let n = URL_SAFE_NO_PAD.encode([0xc5u8; 256]);
        Key::from_jwk(&json!({"kty": "RSA", "n": n, "e": "AQAB", "kid": "r"})).unwrap()
    }

    #[test]
    fn a_jwks_keeps_the_usable_keys_and_says_why_it_skipped_others() {
        let n = URL_SAFE_NO_PAD.encode([0xc5u8; 256]);
        let doc = json!({"keys": [
            {"kty": "RSA", "n": n, "e": "AQAB", "kid": "a", "use": "sig"},
            {"kty": "RSA", "n": n, "e": "AQAB", "kid": "b", "use": "enc"},
            {"kty": "oct", "k": "AA"},
        ]});
        let set = KeySet::parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!(set.keys.len(), 1);
        assert_eq!(set.skipped.len(), 2);
        assert_eq!(set.candidates(Some("a"), Alg::Rs256).count(), 1);
        assert_eq!(set.candidates(Some("b"), Alg::Rs256).count(), 0);
        assert_eq!(set.candidates(None, Alg::Es256).count(), 0);
        assert!(KeySet::parse(b"{}").is_err());
    }
}
