//! What a LOGIN's token check costs, per algorithm: one JWT verification (signature and
//! claims) for each algorithm the gateway takes, beside the HMAC token it had before.
//!
//! The keys and tokens come from `tests/data/jwt/mint.py` (PyJWT and `cryptography`), run
//! into a temporary folder at the start, so the bench verifies what a real identity
//! provider's library signs.
//!
//! Two groups: `login_token`, the whole check as a LOGIN makes it (signature by `ring`,
//! which the gateway installs as `jsonwebtoken`'s verifier, then the claims); and
//! `signature`, the signature alone by each of two providers side by side: the crate's
//! pure-Rust one (`rust_crypto`) and the one the gateway installs (`gateway`: `ring` for
//! RSA and ECDSA, the pure-Rust one for EdDSA and HS, where it is as fast or faster). A
//! third, `keys_by_url`, sets a login checked with a key of `--jwt-key-file` beside one
//! checked with the same key fetched by URL (`--jwt-jwks-url`), and what taking a fetched
//! set costs (parsing it and swapping it in). `cargo bench --bench jwt` (needs python3 with
//! pyjwt and cryptography: `python3 -m pip install pyjwt cryptography`).

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use idlegate::{Auth, JwtAuth, JwtRules};

const UID: u64 = 42;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mint = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jwt/mint.py");
    let out = std::process::Command::new("python3").arg(mint).arg(dir.path()).arg(UID.to_string()).output();
    let tokens: HashMap<String, String> = match out {
        Ok(out) if out.status.success() => serde_json::from_slice(&out.stdout).expect("tokens as JSON"),
        _ => {
            eprintln!(
                "skipping: needs python3 with pyjwt and cryptography (python3 -m pip install pyjwt cryptography)"
            );
            return;
        }
    };
    let rules = JwtRules {
        issuer: Some("https://idp.example".into()),
        audience: Some("idlegate".into()),
        ..JwtRules::default()
    };
    let jwt = JwtAuth::load(Some(&dir.path().join("jwks.json")), Some(&dir.path().join("secret.txt")), rules)
        .expect("the minted keys load");
    let now = idlegate_proto::unix_now();
    let mut group = c.benchmark_group("login_token");
    let hmac = Auth::new("s3cret");
    let hmac_token = hmac.mint(UID, now + 3600);
    group.bench_function("hmac (idlegate's own)", |b| {
        b.iter(|| hmac.verify(black_box(UID), black_box(hmac_token.as_bytes()), now).unwrap())
    });
    for alg in
        ["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"]
    {
        let token = tokens[alg].as_bytes();
        assert!(jwt.verify(UID, token, now).is_ok(), "{alg} verifies");
        group.bench_function(alg, |b| b.iter(|| jwt.verify(black_box(UID), black_box(token), now).unwrap()));
    }
    group.finish();

    // The signature alone, by each provider, on the same key and token.
    let jwks: jsonwebtoken::jwk::JwkSet =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("jwks.json")).unwrap()).unwrap();
    let secret = std::fs::read_to_string(dir.path().join("secret.txt")).unwrap();
    let ring_provider = idlegate::bench::jwt_ring_provider();
    let rust_crypto = &jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER;
    let mut group = c.benchmark_group("signature");
    for (alg, kid) in
        [("HS256", ""), ("RS256", "rsa-1"), ("PS256", "rsa-1"), ("ES256", "p256"), ("ES384", "p384"), ("EdDSA", "ed")]
    {
        let algorithm: jsonwebtoken::Algorithm = alg.parse().unwrap();
        let key = match kid {
            "" => jsonwebtoken::DecodingKey::from_secret(secret.trim_end().as_bytes()),
            kid => jsonwebtoken::DecodingKey::from_jwk(jwks.find(kid).unwrap()).unwrap(),
        };
        let token = &tokens[alg];
        let (message, signature) = token.rsplit_once('.').unwrap();
        let signature = base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, signature).unwrap();
        for (name, provider) in [("rust_crypto", rust_crypto), ("gateway", ring_provider)] {
            let check =
                || (provider.verifier_factory)(&algorithm, &key).unwrap().verify(message.as_bytes(), &signature);
            assert!(check().is_ok(), "{alg} by {name}");
            group.bench_function(format!("{alg}/{name}"), |b| b.iter(|| black_box(check()).unwrap()));
        }
    }
    group.finish();

    // A key by URL against the same key from a file: the same check on the same token.
    let document = std::fs::read_to_string(dir.path().join("jwks.json")).unwrap();
    let rules = JwtRules {
        issuer: Some("https://idp.example".into()),
        audience: Some("idlegate".into()),
        ..JwtRules::default()
    };
    let by_file = JwtAuth::load(Some(&dir.path().join("jwks.json")), None, rules.clone()).unwrap();
    let by_url = JwtAuth::load_with(None, None, true, rules).unwrap();
    let url = "https://idp.example/jwks";
    assert_eq!(by_url.take_jwks(url, &document, now * 1000), Ok(4));
    let mut group = c.benchmark_group("keys_by_url");
    for alg in ["RS256", "ES256"] {
        let token = tokens[alg].as_bytes();
        for (name, jwt) in [("file key", &by_file), ("URL key", &by_url)] {
            assert!(jwt.verify(UID, token, now).is_ok(), "{alg} with a {name}");
            group.bench_function(format!("{alg}/{name}"), |b| {
                b.iter(|| jwt.verify(black_box(UID), black_box(token), now).unwrap())
            });
        }
    }
    // A refresh once fetched: the four keys parsed, checked and swapped in.
    group.bench_function("take a fetched set of 4 keys", |b| {
        b.iter(|| by_url.take_jwks(url, black_box(&document), now * 1000).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
