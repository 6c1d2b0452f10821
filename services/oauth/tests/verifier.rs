//! The verifier against a small authorization server of the test's own
//! (metadata and JWKS over HTTP on loopback, keys made with ring): the
//! bad-token matrix, key rotation, the bounded refetch on an unknown `kid`,
//! and an authorization server that goes down. (The router's integration
//! tests use a real one, oidc-provider.)

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use switchboard_oauth::{Alg, Failure, Metrics, Rejection, ServerSettings, Settings, Verifier};

const AUDIENCE: &str = "https://router.test/mcp";

struct Signer {
    kid: String,
    key: EcdsaKeyPair,
}

impl Signer {
    fn new(kid: &str) -> Signer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        Signer { kid: kid.into(), key }
    }

    fn jwk(&self) -> Value {
        let point = self.key.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
               "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])})
    }

    fn sign(&self, header: Value, claims: Value) -> String {
        let signed = format!("{}.{}", b64(&header), b64(&claims));
        let sig = self.key.sign(&SystemRandom::new(), signed.as_bytes()).unwrap();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    fn token(&self, issuer: &str, claims: Value) -> String {
        let mut all = json!({"iss": issuer, "aud": AUDIENCE, "sub": "alice", "exp": now() + 300, "scope": "mcp:tools"});
        for (k, v) in claims.as_object().unwrap() {
            if v.is_null() {
                all.as_object_mut().unwrap().remove(k);
            } else {
                all[k] = v.clone();
            }
        }
        self.sign(json!({"alg": "ES256", "kid": self.kid, "typ": "at+jwt"}), all)
    }
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

fn now() -> i64 {
    switchboard_core::time::now_ms() / 1000
}

/// A fake authorization server: metadata, a JWKS that can change, and a
/// switch that makes it answer 503.
struct FakeAs {
    issuer: String,
    jwks: Mutex<Value>,
    jwks_fetches: AtomicUsize,
    down: AtomicBool,
}

async fn start_as() -> Arc<FakeAs> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let fake = Arc::new(FakeAs {
        issuer,
        jwks: Mutex::new(json!({"keys": []})),
        jwks_fetches: AtomicUsize::new(0),
        down: AtomicBool::new(false),
    });
    let state = fake.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(answer(&state, req.uri().path())) }
                });
                let io = hyper_util::rt::TokioIo::new(tcp);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    fake
}

fn answer(state: &FakeAs, path: &str) -> Response<Full<Bytes>> {
    let json = |v: Value| Response::new(Full::new(Bytes::from(v.to_string())));
    if state.down.load(Ordering::SeqCst) {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return r;
    }
    match path {
        "/.well-known/oauth-authorization-server" => {
            json(json!({"issuer": state.issuer, "jwks_uri": format!("{}/jwks", state.issuer)}))
        }
        "/jwks" => {
            state.jwks_fetches.fetch_add(1, Ordering::SeqCst);
            json(state.jwks.lock().unwrap().clone())
        }
        _ => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    }
}

fn verifier(issuer: &str, refetch_every: Duration) -> Verifier {
    verifier_in(issuer, refetch_every, Duration::from_secs(30), &prometheus::Registry::new())
}

/// A verifier trusting `issuer`, its metrics in `registry`.
fn verifier_in(issuer: &str, refetch_every: Duration, leeway: Duration, registry: &prometheus::Registry) -> Verifier {
    let settings = Settings {
        audience: AUDIENCE.into(),
        algorithms: Alg::ALL.to_vec(),
        leeway,
        refetch_every,
        keys_max_age: Duration::from_secs(3600),
        introspection_cache: Duration::from_secs(60),
        timeout: Duration::from_secs(2),
        egress: switchboard_core::egress::Egress::parse(&["loopback".into()]).unwrap(),
    };
    let server = ServerSettings {
        name: "test".into(),
        issuer: issuer.into(),
        metadata_url: None,
        jwks_uri: None,
        introspection_endpoint: None,
        client: None,
        ca: None,
    };
    Verifier::new(settings, vec![server], Metrics::new(registry)).unwrap()
}

/// `switchboard_oauth_verified_cache_hits_total` in `registry`.
fn verified_cache_hits(registry: &prometheus::Registry) -> f64 {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == "switchboard_oauth_verified_cache_hits_total")
        .map_or(0.0, |f| f.get_metric()[0].get_counter().get_value())
}

fn rejected(r: Result<switchboard_oauth::Verified, Failure>) -> Rejection {
    match r {
        Err(Failure::Rejected(why)) => why,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn verifies_good_tokens_and_refuses_the_bad_token_matrix() {
    let fake = start_as().await;
    let signer = Signer::new("k1");
    *fake.jwks.lock().unwrap() = json!({"keys": [signer.jwk()]});
    let v = verifier(&fake.issuer, Duration::from_secs(60));

    // Nothing cached yet: the cached path cannot say; the long way fetches.
    let good = signer.token(&fake.issuer, json!({}));
    assert!(v.verify_cached(&good).is_none());
    let ok = v.verify(&good).await.unwrap();
    assert_eq!(ok.claims["sub"], "alice");
    // Now the cached path answers, without fetching again.
    assert!(v.verify_cached(&good).unwrap().is_ok());
    assert_eq!(fake.jwks_fetches.load(Ordering::SeqCst), 1);

    let iss = fake.issuer.as_str();
    let cases = [
        (signer.token(iss, json!({"exp": now() - 120})), "expired"),
        (signer.token(iss, json!({"exp": null})), "missing_claim"),
        (signer.token(iss, json!({"nbf": now() + 120})), "not_yet_valid"),
        (signer.token(iss, json!({"aud": "https://other.test/mcp"})), "audience"),
        (signer.token(iss, json!({"aud": null})), "missing_claim"),
        (signer.token("https://evil.test", json!({})), "issuer"),
        // Signed by a key the server never published, under its kid.
        (Signer::new("k1").token(iss, json!({})), "signature"),
        // Claims changed after signing.
        (tamper(&good), "signature"),
        // alg none, and an HMAC made with the public key as its secret.
        (unsigned(&good, "none"), "algorithm"),
        (unsigned(&good, "HS256"), "algorithm"),
        ("bm90.anNvbg.c2ln".to_owned(), "malformed"),
        // Not a JWT, and no server introspects: not active anywhere.
        ("opaque-token".to_owned(), "inactive"),
    ];
    for (token, reason) in cases {
        assert_eq!(rejected(v.verify(&token).await).label(), reason, "{token:.60}");
    }
    // Leeway: expired 10 s ago is still good with 30 s of leeway.
    assert!(v.verify(&signer.token(iss, json!({"exp": now() - 10}))).await.is_ok());
}

fn tamper(token: &str) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["sub"] = json!("mallory");
    format!("{}.{}.{}", parts[0], b64(&claims), parts[2])
}

fn unsigned(token: &str, alg: &str) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    format!("{}.{}.{}", b64(&json!({"alg": alg, "kid": "k1"})), parts[1], URL_SAFE_NO_PAD.encode(b"x"))
}

#[tokio::test]
async fn rotated_keys_are_fetched_on_an_unknown_kid_at_a_bounded_rate() {
    let fake = start_as().await;
    let (old, new) = (Signer::new("old"), Signer::new("new"));
    *fake.jwks.lock().unwrap() = json!({"keys": [old.jwk()]});
    let v = verifier(&fake.issuer, Duration::from_millis(300));
    assert!(v.verify(&old.token(&fake.issuer, json!({}))).await.is_ok());

    // The server rotates: a token under the new kid fetches the keys again.
    *fake.jwks.lock().unwrap() = json!({"keys": [new.jwk()]});
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(v.verify(&new.token(&fake.issuer, json!({}))).await.is_ok());
    assert_eq!(fake.jwks_fetches.load(Ordering::SeqCst), 2);

    // Tokens under kids nobody published: at most one fetch per interval.
    for i in 0..50 {
        let stranger = Signer::new(&format!("stranger-{i}"));
        assert_eq!(rejected(v.verify(&stranger.token(&fake.issuer, json!({}))).await).label(), "unknown_key");
    }
    assert!(fake.jwks_fetches.load(Ordering::SeqCst) <= 3, "{}", fake.jwks_fetches.load(Ordering::SeqCst));
}

#[tokio::test]
async fn cached_keys_keep_working_when_the_server_is_down_and_none_cached_is_unavailable() {
    let fake = start_as().await;
    let signer = Signer::new("k1");
    *fake.jwks.lock().unwrap() = json!({"keys": [signer.jwk()]});
    let warm = verifier(&fake.issuer, Duration::from_millis(100));
    let cold = verifier(&fake.issuer, Duration::from_millis(100));
    let token = signer.token(&fake.issuer, json!({}));
    assert!(warm.verify(&token).await.is_ok());

    fake.down.store(true, Ordering::SeqCst);
    assert!(warm.verify(&token).await.is_ok());
    assert!(matches!(cold.verify(&token).await, Err(Failure::Unavailable(_))));
    // Asked again at once: still unavailable, without asking the server again.
    let before = fake.jwks_fetches.load(Ordering::SeqCst);
    assert!(matches!(cold.verify(&token).await, Err(Failure::Unavailable(_))));
    assert_eq!(fake.jwks_fetches.load(Ordering::SeqCst), before);

    // Back up: the cold verifier recovers after the refetch interval.
    fake.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(cold.verify(&token).await.is_ok());
}

#[tokio::test]
async fn eddsa_tokens_verify_too() {
    let fake = start_as().await;
    let rng = SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": URL_SAFE_NO_PAD.encode(key.public_key())});
    *fake.jwks.lock().unwrap() = json!({"keys": [jwk]});
    let claims = json!({"iss": fake.issuer, "aud": [AUDIENCE], "sub": "bob", "exp": now() + 60});
    let signed = format!("{}.{}", b64(&json!({"alg": "EdDSA", "kid": "ed"})), b64(&claims));
    let token = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(key.sign(signed.as_bytes()).as_ref()));
    let v = verifier(&fake.issuer, Duration::from_secs(60));
    assert_eq!(v.verify(&token).await.unwrap().claims["sub"], "bob");
}

#[tokio::test]
async fn a_good_token_is_remembered_until_its_expiry_and_only_a_good_one() {
    let fake = start_as().await;
    let signer = Signer::new("k1");
    *fake.jwks.lock().unwrap() = json!({"keys": [signer.jwk()]});
    let registry = prometheus::Registry::new();
    let v = verifier_in(&fake.issuer, Duration::from_secs(60), Duration::ZERO, &registry);
    let hits = || verified_cache_hits(&registry);
    // Expires in 2 s: remembered after its first check, until then.
    let short = signer.token(&fake.issuer, json!({"exp": now() + 2}));
    assert!(v.verify(&short).await.is_ok());
    assert_eq!(hits(), 0.0);
    assert!(v.verify_cached(&short).unwrap().is_ok());
    assert!(v.verify_cached(&short).unwrap().is_ok());
    assert_eq!(hits(), 2.0, "answered without checking the signature again");
    // A refused token is never remembered: refused every time.
    let forged = tamper(&short);
    for _ in 0..2 {
        assert_eq!(rejected(v.verify_cached(&forged).unwrap()).label(), "signature");
    }
    assert_eq!(hits(), 2.0);
    // Past its expiry, the full check runs again and refuses it.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(rejected(v.verify_cached(&short).unwrap()).label(), "expired");
    assert_eq!(hits(), 2.0);
}

/// Good tokens are remembered each with its own claims, and by the verifier
/// that found them good only: one verifier's good token is no good to
/// another (trusting another issuer) in the same process.
#[tokio::test]
async fn a_token_is_remembered_with_its_claims_by_the_verifier_that_found_it_good() {
    let fake = start_as().await;
    let other = start_as().await;
    let signer = Signer::new("k1");
    *fake.jwks.lock().unwrap() = json!({"keys": [signer.jwk()]});
    *other.jwks.lock().unwrap() = json!({"keys": [signer.jwk()]});
    let registry = prometheus::Registry::new();
    let v = verifier_in(&fake.issuer, Duration::from_secs(60), Duration::ZERO, &registry);
    let w = verifier(&other.issuer, Duration::from_secs(60));
    let hits = || verified_cache_hits(&registry);
    let tokens: Vec<String> =
        (0..10).map(|i| signer.token(&fake.issuer, json!({"exp": now() + 600, "sub": format!("u{i}")}))).collect();
    for token in &tokens {
        assert!(v.verify(token).await.is_ok());
    }
    assert_eq!(hits(), 0.0);
    for (i, token) in tokens.iter().enumerate().rev() {
        let verified = v.verify_cached(token).expect("remembered").expect("good");
        assert_eq!(verified.claims["sub"], format!("u{i}"), "each token answers with its own claims");
    }
    assert_eq!(hits(), 10.0, "every one answered from memory");
    for token in &tokens {
        assert!(w.verify(token).await.is_err(), "another verifier does not take its issuer");
    }
}
