//! Who is calling, and what they may do: the authenticate phase's
//! extension point.
//!
//! An [`Authenticator`] turns a request's credentials into a [`Principal`]
//! (its tenant, and the key or user that names the caller in records,
//! limits and sessions), or says why not; it also says what a refusal's
//! `WWW-Authenticate` challenge is, and whether a caller's scopes cover a
//! request. [`Front`] is the router's: API keys, OAuth access tokens when
//! authorization servers are configured (`[oauth]`), and client
//! certificates when their subjects name tenants (`[mtls]`), side by side.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use switchboard_core::policy::{glob, AuthFailure, Principal, Scopes};
use switchboard_oauth::{Failure, Rejection, Verified, Verifier};
use switchboard_tenancy::Directory;

use crate::config::{OAuthConfig, Permission, TenantFrom};
use crate::error::Error;
use crate::headers::{Header, Headers};
use crate::subject::Subject;

/// The verified client certificate of a request's connection (mTLS),
/// with what names its caller, worked out once per connection.
#[derive(Clone, Debug)]
pub struct ClientCert(Arc<CertCaller>);

#[derive(Debug)]
struct CertCaller {
    subject: Subject,
    /// `c:` and a hash of the subject.
    key_id: Arc<str>,
    /// The subject as RFC 4514 text: the user in records.
    user: Arc<str>,
}

impl ClientCert {
    pub fn new(subject: Subject) -> ClientCert {
        let user: Arc<str> = Arc::from(subject.to_string());
        let key_id = format!("c:{}", &hex_of(&Sha256::digest(user.as_bytes()))[..32]);
        ClientCert(Arc::new(CertCaller { subject, key_id: Arc::from(key_id), user }))
    }
}

/// The credential a connection's last request was let in with, and its
/// caller: the connection's next request presenting the very same
/// credential is that caller again, without hashing the credential and
/// looking it up (most clients send every request of a connection with the
/// same key or token). It holds only while the tenant directory is the one
/// it was checked against (a key revoked, a tenant changed: checked
/// afresh), and the key's expiry or the token's time in the verifier's
/// cache of good tokens has not come. Only a credential that was let in is
/// kept (an API key of ours, or a token its authorization server signed and
/// the verifier keeps as good): one per connection (in its extensions), for
/// the connection's life, never logged.
#[derive(Clone, Default)]
pub struct LastCaller(Arc<std::sync::Mutex<Option<Remembered>>>);

struct Remembered {
    /// The credential as presented (its buffer reused by the next one).
    credential: String,
    principal: Principal,
    /// The directory's [`Directory::generation`] it was checked under.
    generation: u64,
    until: Until,
}

/// Until when a remembered check holds (besides the directory's generation).
#[derive(Clone, Copy)]
enum Until {
    /// An API key's expiry (wall clock, ms), if it has one.
    Key(Option<i64>),
    /// A token's time in the verifier's cache.
    Token(std::time::Instant),
}

impl LastCaller {
    /// The caller `credential` named when last presented here, if that
    /// still holds. Compared as bytes, as sent: a credential remembered was
    /// text, so the same bytes are (a long token need not be checked as
    /// text again on every request to be found here).
    fn recall(&self, credential: &[u8], generation: u64) -> Option<Principal> {
        let last = self.0.lock().expect("not poisoned");
        let last = last.as_ref()?;
        if last.generation != generation || !same_bytes(last.credential.as_bytes(), credential) {
            return None;
        }
        let holds = match last.until {
            Until::Key(None) => true,
            Until::Key(Some(at)) => switchboard_core::time::now_ms() < at,
            Until::Token(until) => std::time::Instant::now() < until,
        };
        holds.then(|| last.principal.clone())
    }

    fn keep(&self, credential: &str, principal: &Principal, generation: u64, until: Until) {
        let mut last = self.0.lock().expect("not poisoned");
        match &mut *last {
            Some(last) => {
                last.credential.clear();
                last.credential.push_str(credential);
                last.principal = principal.clone();
                last.generation = generation;
                last.until = until;
            }
            None => {
                *last = Some(Remembered {
                    credential: credential.to_owned(),
                    principal: principal.clone(),
                    generation,
                    until,
                })
            }
        }
    }
}

/// Whether `a` and `b` are the same bytes, in a time that depends on their
/// length only (a connection a proxy shares between clients must not tell
/// one how much of its credential matches another's).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// An authentication that finished at once, or one that must wait (for an
/// authorization server's keys, or an introspection).
pub enum Checked<'a> {
    Done(Result<Principal, AuthFailure>),
    Pending(Pin<Box<dyn Future<Output = Result<Principal, AuthFailure>> + Send + 'a>>),
}

impl Checked<'_> {
    pub async fn outcome(self) -> Result<Principal, AuthFailure> {
        match self {
            Checked::Done(done) => done,
            Checked::Pending(pending) => pending.await,
        }
    }
}

/// Authenticates requests and authorizes what they ask.
pub trait Authenticator: Send + Sync {
    /// The caller of a request, from its headers or its connection's
    /// client certificate (`last`: what the connection's earlier requests
    /// were let in with). A refusal is counted
    /// (`switchboard_auth_failures_total`).
    fn authenticate<'a>(
        &'a self,
        headers: Headers<'a>,
        cert: Option<&ClientCert>,
        last: Option<&LastCaller>,
    ) -> Checked<'a>;

    /// Whether a connection's [`LastCaller`] is of use to it (not when
    /// every request is let in as the open tenant).
    fn remembers_callers(&self) -> bool;

    /// The `WWW-Authenticate` header a refusal carries, if any.
    fn challenge(&self, err: &Error) -> Option<HeaderValue>;

    /// Whether the caller may make a `method` request on `target` (a
    /// tool's or prompt's name, a resource's URI): `Err` is a 403 naming
    /// the scope that would allow it.
    fn authorize(&self, who: &Principal, method: &str, target: Option<&str>) -> Result<(), Error>;

    /// The protected resource metadata (RFC 9728) and the paths it is
    /// served at, when the router is an OAuth resource server.
    fn resource_metadata(&self, path: &str) -> Option<Bytes>;
}

/// The router's authenticator: API keys (`Authorization: Bearer sb_…` or
/// `X-API-Key`), checked against the tenant directory's in-memory snapshot;
/// any other bearer token is an OAuth access token, checked by the
/// [`Verifier`]; a request with neither, over a connection with a client
/// certificate, is the caller the certificate's subject names. With
/// `auth.mode = "none"`, every request is the open tenant's.
pub struct Front {
    directory: Arc<Directory>,
    oauth: Option<OAuth>,
    /// `[mtls.subjects]`: certificate subject → tenant.
    subjects: HashMap<Subject, String>,
}

/// The resource server's part.
struct OAuth {
    config: OAuthConfig,
    verifier: Verifier,
    /// Served at [`OAuthConfig::metadata_path`] and at the root form.
    metadata: Bytes,
    metadata_path: String,
    /// `Bearer resource_metadata="…"[, scope="…"]`
    missing: HeaderValue,
    /// The same with `error="invalid_token"`.
    invalid: HeaderValue,
}

impl Front {
    /// Keys only.
    pub fn keys(directory: Arc<Directory>) -> Front {
        Front { directory, oauth: None, subjects: HashMap::new() }
    }

    /// Client certificates with these subjects are callers of these tenants.
    pub fn with_client_certs(mut self, subjects: HashMap<Subject, String>) -> Front {
        self.subjects = subjects;
        self
    }

    /// Keys, and the tokens of `config`'s authorization servers.
    pub fn with_oauth(
        directory: Arc<Directory>,
        config: OAuthConfig,
        metrics: switchboard_oauth::Metrics,
    ) -> Result<Front, String> {
        let servers = config.servers.iter().map(|s| s.settings.clone()).collect();
        let verifier = Verifier::new(config.settings.clone(), servers, metrics)?;
        let mut metadata = json!({
            "resource": config.resource,
            "authorization_servers": config.servers.iter().map(|s| s.settings.issuer.as_str()).collect::<Vec<_>>(),
            "bearer_methods_supported": ["header"],
        });
        if !config.scopes.is_empty() {
            metadata["scopes_supported"] = json!(config.scopes.keys().collect::<Vec<_>>());
        }
        if let Some(name) = &config.resource_name {
            metadata["resource_name"] = json!(name);
        }
        let mut params = format!("resource_metadata=\"{}\"", config.metadata_url());
        if let Some(scope) = &config.scope {
            params.push_str(&format!(", scope=\"{scope}\""));
        }
        let header =
            |text: String| HeaderValue::from_str(&text).map_err(|_| "the challenge is not a valid header".to_owned());
        Ok(Front {
            directory,
            oauth: Some(OAuth {
                metadata: Bytes::from(metadata.to_string()),
                metadata_path: config.metadata_path(),
                missing: header(format!("Bearer {params}"))?,
                invalid: header(format!("Bearer error=\"invalid_token\", {params}"))?,
                config,
                verifier,
            }),
            subjects: HashMap::new(),
        })
    }

    /// The caller of the API key a request presents (remembered by the
    /// connection, when it has `last`).
    fn keys_only(&self, headers: Headers<'_>, last: Option<&LastCaller>) -> Result<Principal, AuthFailure> {
        let key = headers.presented_key();
        let (Some(last), Some(key), true) = (last, key, self.directory.required()) else {
            return self.directory.authenticate_key(key, switchboard_core::time::now_ms);
        };
        let generation = self.directory.generation();
        if let Some(known) = last.recall(key.as_bytes(), generation) {
            return Ok(known);
        }
        let (principal, expires) =
            self.directory.authenticate_key_expiring(Some(key), switchboard_core::time::now_ms)?;
        last.keep(key, &principal, generation, Until::Key(expires));
        Ok(principal)
    }

    /// The caller a client certificate names: the tenant its subject maps
    /// to (which must take client certificates), the subject as the user.
    fn certificate(&self, cert: &ClientCert) -> Result<Principal, AuthFailure> {
        let caller = &cert.0;
        let outcome = match self.subjects.get(&caller.subject) {
            None => Err(AuthFailure::UnknownCertificate),
            Some(name) => match self.directory.tenant(name) {
                Some(tenant) if tenant.accepts_client_cert() => Ok(Principal {
                    tenant,
                    key_prefix: Arc::from(""),
                    key_id: caller.key_id.clone(),
                    user: Some(caller.user.clone()),
                    scopes: None,
                }),
                _ => Err(AuthFailure::NotAccepted),
            },
        };
        outcome.inspect_err(|failure| self.directory.metrics().auth_failed(failure.label()))
    }
}

/// The bearer token of `Authorization`, if that is how the caller
/// presented its credential.
pub(crate) fn bearer<'a>(headers: Headers<'a>) -> Option<&'a str> {
    headers.text(Header::Authorization)?.ok().and_then(crate::headers::bearer)
}

impl Authenticator for Front {
    fn authenticate<'a>(
        &'a self,
        headers: Headers<'a>,
        cert: Option<&ClientCert>,
        last: Option<&LastCaller>,
    ) -> Checked<'a> {
        // A key or token sent with the request is the caller; else the
        // connection's certificate.
        if let Some(cert) = cert {
            if !self.subjects.is_empty()
                && !headers.contains(Header::Authorization)
                && !headers.contains(Header::XApiKey)
            {
                return Checked::Done(self.certificate(cert));
            }
        }
        let Some(oauth) = &self.oauth else {
            return Checked::Done(self.keys_only(headers, last));
        };
        // An API key (ours have the `sb_` form; X-API-Key is only for keys).
        let sent = match headers.get(Header::Authorization).and_then(crate::headers::bearer_bytes) {
            Some(token) if !token.starts_with(b"sb_") && !headers.contains(Header::XApiKey) => token,
            _ => return Checked::Done(self.keys_only(headers, last)),
        };
        let generation = self.directory.generation();
        // The connection's last token, found by its bytes: checked as text
        // only when it is new here.
        if let Some(known) = last.and_then(|last| last.recall(sent, generation)) {
            oauth.verifier.count_remembered();
            return Checked::Done(Ok(known));
        }
        let Some(token) = bearer(headers) else {
            return Checked::Done(self.keys_only(headers, last));
        };
        match oauth.verifier.verify_cached(token) {
            Some(done) => {
                let until = done.as_ref().ok().and_then(|verified| verified.good_until);
                let outcome = self.principal(oauth, done);
                if let (Some(last), Some(until), Ok(principal)) = (last, until, &outcome) {
                    last.keep(token, principal, generation, Until::Token(until));
                }
                Checked::Done(outcome)
            }
            None => Checked::Pending(Box::pin(async move {
                let done = oauth.verifier.verify(token).await;
                self.principal(oauth, done)
            })),
        }
    }

    fn remembers_callers(&self) -> bool {
        self.directory.required() || self.oauth.is_some()
    }

    fn challenge(&self, err: &Error) -> Option<HeaderValue> {
        let Some(oauth) = &self.oauth else {
            return match err {
                Error::Unauthenticated(AuthFailure::Missing | AuthFailure::UnknownCertificate) => {
                    Some(HeaderValue::from_static(r#"Bearer realm="switchboard""#))
                }
                Error::Unauthenticated(AuthFailure::NotLoaded | AuthFailure::Unverifiable) => None,
                Error::Unauthenticated(_) => {
                    Some(HeaderValue::from_static(r#"Bearer realm="switchboard", error="invalid_token""#))
                }
                _ => None,
            };
        };
        match err {
            Error::Unauthenticated(AuthFailure::Missing | AuthFailure::UnknownCertificate) => {
                Some(oauth.missing.clone())
            }
            Error::Unauthenticated(AuthFailure::NotLoaded | AuthFailure::Unverifiable) => None,
            Error::Unauthenticated(_) => Some(oauth.invalid.clone()),
            Error::InsufficientScope(scope) => HeaderValue::from_str(&format!(
                "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{}\"",
                oauth.config.metadata_url()
            ))
            .ok(),
            _ => None,
        }
    }

    fn authorize(&self, who: &Principal, method: &str, target: Option<&str>) -> Result<(), Error> {
        match (&who.scopes, &self.oauth) {
            (Some(scopes), Some(oauth)) => permitted(&oauth.config, scopes, method, target),
            _ => Ok(()),
        }
    }

    fn resource_metadata(&self, path: &str) -> Option<Bytes> {
        let oauth = self.oauth.as_ref()?;
        (path == oauth.metadata_path || path == "/.well-known/oauth-protected-resource").then(|| oauth.metadata.clone())
    }
}

/// Whether a token's `scopes` cover a `method` request on `target`
/// ([`Authenticator::authorize`]); `Err`: 403, naming the token's scopes
/// and the narrowest one of `config` that would allow it.
fn permitted(config: &OAuthConfig, scopes: &Scopes, method: &str, target: Option<&str>) -> Result<(), Error> {
    let covers = |permission: &Permission| match (permission, method) {
        (Permission::List, "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list") => true,
        (Permission::Call(pattern), "tools/call") => matches(pattern, target),
        (
            Permission::Read(pattern),
            "prompts/get" | "resources/read" | "resources/subscribe" | "resources/unsubscribe" | "completion/complete",
        ) => matches(pattern, target),
        _ => false,
    };
    let guarded = matches!(
        method,
        "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "tools/call"
            | "prompts/get"
            | "resources/read"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "completion/complete"
    );
    if !guarded || scopes.allows.iter().any(covers) {
        return Ok(());
    }
    // The most specific scope that would allow it, with those the
    // token has (so that the new token keeps what the old one allowed).
    let wanted = config
        .scopes
        .iter()
        .filter(|(_, ps)| ps.iter().any(covers))
        .min_by_key(|(name, ps)| (ps.len(), name.len()))
        .map(|(name, _)| name.as_str());
    let mut scope: Vec<&str> = scopes.names.iter().map(|s| &**s).collect();
    scope.extend(wanted);
    Err(Error::InsufficientScope(scope.join(" ")))
}

/// A permission's pattern against the request's target (none: any target).
fn matches(pattern: &Option<String>, target: Option<&str>) -> bool {
    match pattern {
        None => true,
        Some(p) => target.is_some_and(|t| glob(p, t)),
    }
}

impl Front {
    /// A checked token as the caller: its tenant (which must accept the
    /// token's authorization server), its user, and its scopes.
    fn principal(&self, oauth: &OAuth, verified: Result<Verified, Failure>) -> Result<Principal, AuthFailure> {
        let outcome = match verified {
            Ok(v) => self.caller(oauth, &v),
            Err(Failure::Rejected(Rejection::Expired)) => Err(AuthFailure::TokenExpired),
            Err(Failure::Rejected(_)) => Err(AuthFailure::TokenInvalid),
            Err(Failure::Unavailable(_)) => Err(AuthFailure::Unverifiable),
        };
        outcome.inspect_err(|failure| self.directory.metrics().auth_failed(failure.label()))
    }

    fn caller(&self, oauth: &OAuth, verified: &Verified) -> Result<Principal, AuthFailure> {
        let server = &oauth.config.servers[verified.server];
        // Worked out once per token (a remembered token shares the slot).
        let derived = verified.derived.get_or_init(|| Box::new(TokenCaller::of(&oauth.config, verified)));
        let caller = derived.downcast_ref::<Result<TokenCaller, AuthFailure>>().expect("set here only").as_ref();
        let caller = caller.map_err(|failure| *failure)?;
        let tenant =
            caller.tenant.as_deref().and_then(|name| self.directory.tenant(name)).ok_or(AuthFailure::NotAccepted)?;
        if !tenant.accepts_oauth(&server.settings.name) {
            return Err(AuthFailure::NotAccepted);
        }
        Ok(Principal {
            tenant,
            key_prefix: Arc::from(""),
            key_id: caller.key_id.clone(),
            user: Some(caller.user.clone()),
            scopes: caller.scopes.clone(),
        })
    }
}

/// What a token's claims say of its caller: the tenant's name (looked up
/// at each request: tenants change), the user, the caller id, the scopes.
struct TokenCaller {
    tenant: Option<String>,
    user: Arc<str>,
    key_id: Arc<str>,
    scopes: Option<Arc<Scopes>>,
}

impl TokenCaller {
    fn of(config: &OAuthConfig, verified: &Verified) -> Result<TokenCaller, AuthFailure> {
        let server = &config.servers[verified.server];
        let claims: &Map<String, Value> = &verified.claims;
        let tenant = match &server.tenant {
            TenantFrom::Fixed(name) => Some(name.clone()),
            TenantFrom::Claim(claim) => switchboard_oauth::token::claim_text(claims, claim),
        };
        // A token of a client acting for itself (client credentials) may have
        // no `sub` (an introspection answer): the client is the user then.
        let user = switchboard_oauth::token::claim_text(claims, &server.user_claim)
            .or_else(|| {
                (server.user_claim == "sub")
                    .then(|| switchboard_oauth::token::claim_text(claims, "client_id"))
                    .flatten()
            })
            .ok_or(AuthFailure::TokenInvalid)?;
        let id =
            Sha256::new().chain_update(server.settings.name.as_bytes()).chain_update([0]).chain_update(user.as_bytes());
        let key_id = format!("u:{}", &hex_of(&id.finalize())[..32]);
        // What the scopes allow, worked out here, once per token: each
        // request then checks a short list, not the scopes' table.
        let scopes = (!config.scopes.is_empty()).then(|| {
            let names: Box<[Box<str>]> =
                switchboard_oauth::token::scopes(claims).into_iter().map(String::into_boxed_str).collect();
            let allows = names.iter().filter_map(|name| config.scopes.get(&**name)).flatten().cloned().collect();
            Arc::new(Scopes { names, allows })
        });
        Ok(TokenCaller { tenant, user: Arc::from(user), key_id: Arc::from(key_id), scopes })
    }
}

fn hex_of(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_core::policy::{Policy, Tenant};

    fn caller(name: &str) -> Principal {
        let tenant = Arc::new(Tenant::new(name, &Policy::default(), &[]));
        Principal::of_key(tenant, Arc::from("sb_abcdefgh"), Arc::from(format!("{name}-id")))
    }

    #[test]
    fn a_remembered_caller_is_the_same_credential_under_the_same_directory_only() {
        let last = LastCaller::default();
        assert!(last.recall(b"sb_one", 1).is_none(), "nothing remembered yet");
        last.keep("sb_one", &caller("a"), 1, Until::Key(None));
        assert_eq!(last.recall(b"sb_one", 1).map(|p| p.tenant.name.to_string()), Some("a".into()));
        assert!(last.recall(b"sb_one", 2).is_none(), "the directory changed: checked afresh");
        assert!(last.recall(b"sb_onf", 1).is_none(), "another credential of the same length");
        assert!(last.recall(b"sb_one_", 1).is_none() && last.recall(b"sb_on", 1).is_none(), "a longer or shorter one");
        // The next credential takes the place of the last.
        last.keep("sb_two", &caller("b"), 1, Until::Key(None));
        assert!(last.recall(b"sb_one", 1).is_none());
        assert_eq!(last.recall(b"sb_two", 1).map(|p| p.tenant.name.to_string()), Some("b".into()));
    }

    #[test]
    fn a_tokens_scopes_are_mapped_to_permissions_once_and_checked_by_them() {
        let config = crate::config::Config::from_toml(
            "[oauth]\nresource = \"https://mcp.example.com/mcp\"\n[oauth.scopes]\n\"mcp:list\" = [\"list\"]\n\
             \"mcp:alpha\" = [\"call:alpha__*\"]\n\"mcp:call\" = [\"call\"]\n\"mcp:files\" = [\"read:file://*\"]\n\
             [oauth.servers.corp]\nissuer = \"https://auth.example.com\"\ntenant = \"acme\"\n",
        )
        .unwrap()
        .oauth
        .unwrap();
        let claims = serde_json::json!({"sub": "u", "scope": "mcp:list mcp:alpha not-mapped"});
        let verified = Verified {
            server: 0,
            claims: Arc::new(claims.as_object().unwrap().clone()),
            derived: Default::default(),
            good_until: None,
        };
        let caller = TokenCaller::of(&config, &verified).unwrap();
        let scopes = caller.scopes.expect("scopes are mapped");
        assert_eq!(scopes.names.len(), 3);
        assert_eq!(&*scopes.allows, [Permission::List, Permission::Call(Some("alpha__*".into()))]);

        let check = |method, target| permitted(&config, &scopes, method, target);
        assert!(check("initialize", None).is_ok(), "not guarded");
        assert!(check("tools/list", None).is_ok());
        assert!(check("tools/call", Some("alpha__echo")).is_ok());
        // Refused: the token's scopes, and the narrowest that would allow it.
        let refused = |method, target| match check(method, target) {
            Err(Error::InsufficientScope(scope)) => scope,
            other => panic!("{method} {target:?}: {other:?}"),
        };
        assert_eq!(refused("tools/call", Some("beta__echo")), "mcp:list mcp:alpha not-mapped mcp:call");
        assert_eq!(refused("resources/read", Some("file:///a")), "mcp:list mcp:alpha not-mapped mcp:files");
        assert_eq!(refused("prompts/get", Some("p")), "mcp:list mcp:alpha not-mapped");
    }

    #[test]
    fn credentials_compare_as_bytes_do() {
        // Lengths around the compiler's vector steps, equal, different in
        // any one byte, or in length.
        for len in 0..40 {
            let a: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "{len}");
            for at in 0..len {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert!(!same_bytes(&a, &b) && !same_bytes(&b, &a), "{at} of {len}");
            }
            let longer = [&a[..], b"a"].concat();
            assert!(!same_bytes(&a, &longer) && !same_bytes(&longer, &a), "{len}");
        }
    }

    #[test]
    fn a_remembered_caller_ends_with_its_key_or_its_token() {
        let last = LastCaller::default();
        let now_ms = switchboard_core::time::now_ms();
        last.keep("sb_key", &caller("a"), 1, Until::Key(Some(now_ms + 60_000)));
        assert!(last.recall(b"sb_key", 1).is_some(), "a key that expires in a minute");
        last.keep("sb_key", &caller("a"), 1, Until::Key(Some(now_ms - 1)));
        assert!(last.recall(b"sb_key", 1).is_none(), "an expired key");
        let now = std::time::Instant::now();
        last.keep("ey.a.b", &caller("a"), 1, Until::Token(now + std::time::Duration::from_secs(60)));
        assert!(last.recall(b"ey.a.b", 1).is_some(), "a token good for a minute more");
        last.keep("ey.a.b", &caller("a"), 1, Until::Token(now));
        assert!(last.recall(b"ey.a.b", 1).is_none(), "a token whose time in the cache is up");
    }

    #[test]
    fn same_bytes_is_equality() {
        assert!(same_bytes(b"", b""));
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd") && !same_bytes(b"abc", b"ab") && !same_bytes(b"", b"a"));
    }
}
