//! Criterion benchmarks of the hot paths: token signing and verification
//! (EdDSA and ES256, uncached and cached), a rate-limit check on each
//! backend, one argon2id verification at the default parameters, and the
//! gateway's request rules (path normal form, reserved headers).
//!
//! `cargo bench --bench hot_paths` (set LATCHKEY_BENCH_REDIS_URL, or run
//! under scripts/with-services, to include the Redis limiter).

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use latchkey::cache::{RedisConfig, RedisHandle, Revocations};
use latchkey::crypto::Sealer;
use latchkey::domain::hashing::Argon2Config;
use latchkey::domain::hashing::Passwords;
use latchkey::domain::tokens::SigningAlgorithm;
use latchkey::domain::tokens::{Issuer, TokenSettings};
use latchkey::limits::{Limiter, Policies, PolicyName};
use latchkey::settings::{Secret, Sources};
use latchkey::store::Store;
use latchkey::store::{DatabaseConfig, DatabaseUrl};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

async fn tokens(alg: SigningAlgorithm) -> Issuer {
    let store = Store::connect(&DatabaseConfig {
        url: DatabaseUrl::Sqlite("sqlite::memory:".into()),
        own_dir: std::env::temp_dir(),
        max_connections: 1,
        min_connections: 1,
        acquire_timeout: Duration::from_secs(5),
    })
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let revocations = Arc::new(Revocations::new(None, Duration::from_secs(960)));
    let settings = TokenSettings {
        issuer: "http://bench".into(),
        audience: "latchkey".into(),
        algorithm: alg,
        id_token_algorithms: Vec::new(),
        access_ttl: Duration::from_secs(900),
        cache_capacity: 100_000,
        key_refresh_interval: Duration::from_secs(10),
    };
    Issuer::load(settings, store, Sealer::new(&[7; 32]), revocations)
        .await
        .unwrap()
}

fn token_benches(c: &mut Criterion) {
    let rt = runtime();
    for (name, alg) in [
        ("EdDSA", SigningAlgorithm::EdDsa),
        ("ES256", SigningAlgorithm::Es256),
    ] {
        let t = rt.block_on(tokens(alg));
        let authn = latchkey::domain::tokens::Authn::new("pwd", 1_700_000_000_000);
        let subject = latchkey::domain::tokens::Subject {
            user_id: "user-1",
            email: "user@example.com",
            session_id: "session-1",
            client_id: "latchkey",
            authn: &authn,
            scope: None,
            access_ttl: None,
        };
        let token = t.issue(&subject).unwrap();
        c.bench_function(&format!("sign {name}"), |b| b.iter(|| t.issue(&subject).unwrap()));
        c.bench_function(&format!("verify uncached {name}"), |b| {
            b.iter(|| t.verifier().verify(&token).unwrap())
        });
        rt.block_on(t.verifier().validate(&token)).unwrap();
        c.bench_function(&format!("validate cached {name}"), |b| {
            b.iter(|| rt.block_on(t.verifier().validate(&token)).unwrap())
        });
    }
}

fn limiter_benches(c: &mut Criterion) {
    let rt = runtime();
    let src = Sources::from_pairs([("rate_limit_login_ip", "1000000000/60")]);
    let local = Limiter::new(true, None).with_policies(&Policies::read(&src).unwrap());
    let mut i = 0u64;
    c.bench_function("rate limit check, in process", |b| {
        b.iter(|| {
            i += 1;
            rt.block_on(local.check(
                PolicyName::LoginIp,
                if i % 2 == 0 { "10.0.0.1" } else { "10.0.0.2" },
            ))
        })
    });
    let url = std::env::var("LATCHKEY_BENCH_REDIS_URL").or_else(|_| std::env::var("LATCHKEY_TEST_REDIS_URL"));
    match url {
        Ok(url) => {
            let redis = rt
                .block_on(RedisHandle::connect(&RedisConfig {
                    urls: vec![Secret(url)],
                    cluster: false,
                    required_for_readiness: true,
                    key_prefix: "bench:".into(),
                }))
                .unwrap();
            let shared = Limiter::new(true, Some(redis)).with_policies(&Policies::read(&src).unwrap());
            // A new key each time: never hot, so every check is one round trip.
            let mut n = 0u64;
            c.bench_function(
                "rate limit check, Redis, cold key (one EVALSHA round trip)",
                |b| {
                    b.iter(|| {
                        n += 1;
                        rt.block_on(
                            shared.check(PolicyName::LoginIp, &format!("10.1.{}.{}", n >> 8, n & 255)),
                        )
                        .unwrap()
                    })
                },
            );
            // One key checked back to back: hot, served from leases of up to 64 tokens.
            c.bench_function("rate limit check, Redis, hot key (leases)", |b| {
                b.iter(|| {
                    rt.block_on(shared.check(PolicyName::LoginIp, "10.0.0.1"))
                        .unwrap()
                })
            });
        }
        Err(_) => eprintln!("LATCHKEY_BENCH_REDIS_URL not set: skipping the Redis limiter"),
    }
}

fn argon2_bench(c: &mut Criterion) {
    let p = Passwords::new(&Argon2Config {
        memory_kib: 19_456,
        iterations: 2,
        parallelism: 1,
    })
    .unwrap();
    let hash = p.hash("correct horse battery");
    let mut g = c.benchmark_group("argon2id m=19456 t=2 p=1");
    g.sample_size(20);
    g.bench_function("verify", |b| {
        b.iter(|| assert!(p.verify("correct horse battery", &hash)))
    });
    g.finish();
}

/// What the gateway's trust rules cost a request: the checks on `Host` and
/// `Authorization`, the path's normal form, and the removal of reserved
/// headers, on a typical request and on a hostile one.
fn gateway_rules_bench(c: &mut Criterion) {
    use axum::http::{HeaderMap, HeaderName, HeaderValue};
    use latchkey::gateway::headers::{ambiguous, request_host, strip_reserved};
    use latchkey::gateway::path::normalise;
    let identity = [
        HeaderName::from_static("x-auth-subject"),
        HeaderName::from_static("x-auth-email"),
        HeaderName::from_static("x-auth-session"),
        HeaderName::from_static("x-auth-client-id"),
    ];
    let identity: Vec<&HeaderName> = identity.iter().collect();
    let typical = {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("host", "api.example.com"),
            ("authorization", "Bearer eyJhbGciOiJFUzI1NiJ9.e30.sig"),
            ("accept", "application/json"),
            ("user-agent", "bench/1.0"),
            ("content-type", "application/json"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    };
    let hostile = {
        let mut h = typical.clone();
        for k in ["x_auth_subject", "x-forwarded-for", "x-original-url", "x_real_ip"] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static("spoofed"));
        }
        h
    };
    let mut g = c.benchmark_group("gateway rules");
    for (name, headers, path) in [
        ("typical request", &typical, "/api/v1/orders/42"),
        ("hostile request", &hostile, "/x/../api/%61dmin;p=1//users"),
    ] {
        g.bench_function(name, |b| {
            let uri: axum::http::Uri = "/".parse().unwrap();
            b.iter(|| {
                let mut h = headers.clone();
                assert!(ambiguous(&h).is_none());
                let host = request_host(&uri, &h, axum::http::Version::HTTP_11).unwrap();
                let n = normalise(std::hint::black_box(path)).unwrap();
                strip_reserved(&mut h, &identity, &[]);
                let forwarded = host.map(|h| h.to_string());
                std::hint::black_box((n.key().len(), h.len(), forwarded))
            })
        });
    }
    // The clone every iteration needs, to subtract.
    g.bench_function("header map clone alone", |b| {
        b.iter(|| std::hint::black_box(typical.clone().len()))
    });
    g.finish();
}

criterion_group!(
    benches,
    token_benches,
    limiter_benches,
    argon2_bench,
    gateway_rules_bench
);
criterion_main!(benches);
