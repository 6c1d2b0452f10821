//! The OAuth resource server's cost per request, once the authorization
//! server's keys are cached: a JWT access token seen for the first time
//! (decoded, its signature and claims checked: `first/ALG`, for ES256,
//! EdDSA and RS256 with a 2048-bit key), the same token again (remembered
//! as good: `again/ALG`, what a client's later requests cost), and a token
//! refused for its signature (never remembered: checked every time). Prints
//! heap allocations per verification next to criterion's times.
//!
//! The keys come from a loopback JWKS endpoint, fetched once before the
//! measurement; the RSA key is made with the openssl CLI (ring cannot make
//! one).

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use serde_json::{json, Value};
use switchboard_benches::{allocations_of, Counting};
use switchboard_oauth::{Alg, Metrics, ServerSettings, Settings, Verifier};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const AUDIENCE: &str = "https://router.test/mcp";

/// Signs a message with a private key.
type Sign = Box<dyn Fn(&[u8]) -> Vec<u8>>;

/// A key that signs tokens, and its public JWK.
struct Signer {
    alg: &'static str,
    jwk: Value,
    sign: Sign,
}

fn es256() -> Signer {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = key.public_key().as_ref().to_vec();
    Signer {
        alg: "ES256",
        jwk: json!({"kty": "EC", "crv": "P-256", "kid": "es", "alg": "ES256",
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])}),
        sign: Box::new(move |m| key.sign(&SystemRandom::new(), m).unwrap().as_ref().to_vec()),
    }
}

fn eddsa() -> Signer {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    Signer {
        alg: "EdDSA",
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "EdDSA",
                    "x": URL_SAFE_NO_PAD.encode(key.public_key().as_ref())}),
        sign: Box::new(move |m| key.sign(m).as_ref().to_vec()),
    }
}

fn rs256() -> Signer {
    let dir = std::env::temp_dir().join(format!("sb-bench-rsa-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let der = dir.join("rsa.der");
    let made = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-outform", "DER", "-out"])
        .arg(&der)
        .output()
        .expect("the openssl CLI");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // PKCS#8, or PKCS#1 as some openssl versions write DER.
    let der = std::fs::read(&der).unwrap();
    let key = RsaKeyPair::from_pkcs8(&der).or_else(|_| RsaKeyPair::from_der(&der)).unwrap();
    let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(key.public());
    let jwk = json!({"kty": "RSA", "kid": "rs", "alg": "RS256",
        "n": URL_SAFE_NO_PAD.encode(&public.n), "e": URL_SAFE_NO_PAD.encode(&public.e)});
    Signer {
        alg: "RS256",
        jwk,
        sign: Box::new(move |m| {
            let mut sig = vec![0; key.public().modulus_len()];
            key.sign(&signature::RSA_PKCS1_SHA256, &SystemRandom::new(), m, &mut sig).unwrap();
            sig
        }),
    }
}

impl Signer {
    /// A token; `n` makes it unique (its `jti`).
    fn token(&self, issuer: &str, n: u64) -> String {
        let now = switchboard_core::time::now_ms() / 1000;
        let header = json!({"alg": self.alg, "kid": self.jwk["kid"], "typ": "at+jwt"});
        let claims = json!({"iss": issuer, "aud": AUDIENCE, "sub": "alice", "client_id": "desktop-app",
                            "exp": now + 3600, "iat": now, "scope": "mcp:list mcp:call", "org": "acme",
                            "jti": format!("bench-{n}")});
        let signed =
            format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
        let sig = (self.sign)(signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig))
    }
}

/// Serves `jwks` to every request, on loopback; its URL.
fn jwks_endpoint(jwks: Value) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/jwks", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let body = jwks.to_string();
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = write!(
                &stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn verify(c: &mut Criterion) {
    let signers = [es256(), eddsa(), rs256()];
    let issuer = "https://auth.bench.test";
    let jwks_uri = jwks_endpoint(json!({"keys": signers.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()}));
    let settings = Settings {
        audience: AUDIENCE.into(),
        algorithms: Alg::ALL.to_vec(),
        leeway: Duration::from_secs(30),
        refetch_every: Duration::from_secs(30),
        keys_max_age: Duration::from_secs(3600),
        introspection_cache: Duration::from_secs(60),
        timeout: Duration::from_secs(5),
        egress: switchboard_core::egress::Egress::parse(&["loopback".into()]).unwrap(),
    };
    let server = ServerSettings {
        name: "bench".into(),
        issuer: issuer.into(),
        metadata_url: None,
        jwks_uri: Some(jwks_uri),
        introspection_endpoint: None,
        client: None,
        ca: None,
    };
    let verifier = Verifier::new(settings, vec![server], Metrics::new(&prometheus::Registry::new())).unwrap();
    // The keys fetched once, as the router's first token would.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let first = signers[0].token(issuer, 0);
    runtime.block_on(verifier.verify(&first)).expect("the keys are fetched and the token verifies");

    let mut group = c.benchmark_group("oauth");
    // Each token unique (its jti).
    let serial = std::sync::atomic::AtomicU64::new(1);
    let next = || serial.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for signer in &signers {
        let token = signer.token(issuer, next());
        let (outcome, first_allocs) = allocations_of(|| verifier.verify_cached(&token));
        assert!(matches!(outcome, Some(Ok(_))), "{} verifies with the cached keys", signer.alg);
        let (_, again_allocs) = allocations_of(|| verifier.verify_cached(&token));
        println!(
            "allocations: oauth/first/{alg}: {first_allocs}, oauth/again/{alg}: {again_allocs} ({} byte token)",
            token.len(),
            alg = signer.alg
        );
        // A new token each time (made outside the measurement).
        group.bench_function(format!("first/{}", signer.alg), |b| {
            b.iter_batched(
                || signer.token(issuer, next()),
                |fresh| black_box(verifier.verify_cached(&fresh)),
                BatchSize::SmallInput,
            )
        });
        group.bench_function(format!("again/{}", signer.alg), |b| {
            b.iter(|| black_box(verifier.verify_cached(black_box(&token))))
        });
    }
    // A forged signature: the same decoding and signature check, refused.
    let good = signers[0].token(issuer, 0);
    let forged = format!("{}{}", &good[..good.len() - 4], if good.ends_with("AAAA") { "BBBB" } else { "AAAA" });
    assert!(matches!(verifier.verify_cached(&forged), Some(Err(_))));
    group.bench_function("refused_signature/ES256", |b| {
        b.iter(|| black_box(verifier.verify_cached(black_box(&forged))))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = verify
}
criterion_main!(benches);
