//! JWT logins with tokens minted by PyJWT and `cryptography` (`tests/data/jwt/mint.py`), a
//! library independent of the one the gateway verifies with: one token for every algorithm
//! (RS, PS, ES, EdDSA with a JWKS and with PEM keys, HS with a secret file), and every
//! refusal naming its check (`alg: none`, the HS256-with-an-RSA-public-key confusion, an
//! unknown kid, expired, `nbf` and `iat` ahead, wrong `iss` and `aud`, no `exp`, another
//! uid, no uid, past `--max-token-ttl`, a bad signature, a token over 4 KiB), on the TCP,
//! TLS, WebSocket and WSS doors and over MQTT 3.1.1 and 5 (paho, the JWT as password).
//! Then keys rotated on SIGHUP.
//!
//! Needs Python with `pyjwt`, `cryptography` and `paho-mqtt` (`.ci/run` installs them);
//! skips without them, except under CI.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::process::GatewayProcess;
use common::tls::{doors, server_with};
use common::ws::{DoorClient, Got};
use common::{skip_without, TestServer};
use idlegate::{Config, JwtAuth, JwtRules};
use idlegate_proto::{Frame, Transport};

const INSTALL: &str = "python3 -m pip install pyjwt cryptography paho-mqtt";
const UID: u64 = 42;

fn data() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jwt"))
}

/// Keys written into `dir` and every token, by name; `None` (skipped) without PyJWT.
fn mint(dir: &Path) -> Option<HashMap<String, String>> {
    let ok = Command::new("python3").args(["-c", "import jwt, cryptography"]).status().is_ok_and(|s| s.success());
    if !ok {
        skip_without("PyJWT and cryptography", INSTALL);
        return None;
    }
    let out = Command::new("python3").arg(data().join("mint.py")).arg(dir).arg(UID.to_string()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("the tokens as JSON"))
}

fn rules() -> JwtRules {
    JwtRules { issuer: Some("https://idp.example".into()), audience: Some("idlegate".into()), ..JwtRules::default() }
}

fn config(keys: &Path, secret: Option<&Path>) -> Config {
    Config { jwt: Some(JwtAuth::load(Some(keys), secret, rules()).unwrap()), ..Config::default() }
}

/// Logs in as [`UID`] with `token` on `transport`.
async fn login(
    transport: Transport,
    addr: std::net::SocketAddr,
    ca: Option<&common::tls::TestCa>,
    token: &str,
) -> Result<(), String> {
    common::ws::token_login(transport, addr, ca, UID, token).await
}

/// What each refused token's BYE must say.
const REFUSALS: &[(&str, &str)] = &[
    ("none", "algorithm refused"),
    ("confusion", "HS256 fits no configured key"),
    ("wrong-kid", "kid unknown"),
    ("expired", "expired"),
    ("not-yet", "not yet valid (nbf)"),
    ("iat-ahead", "not yet valid (iat)"),
    ("wrong-iss", "issuer"),
    ("wrong-aud", "audience"),
    ("no-exp", "no exp"),
    ("other-uid", "names another uid"),
    ("no-uid", "uid claim \"sub\" missing"),
    ("too-long-ttl", "--max-token-ttl"),
    ("bad-signature", "signature did not verify"),
    ("crit", "critical extensions (crit)"),
    ("nbf-string", "nbf is not a NumericDate"),
    ("iat-string", "iat is not a NumericDate"),
];

const ACCEPTED: &[&str] =
    &["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA", "uid-as-number"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_logs_in_on_every_door_and_every_bad_token_is_refused_naming_its_check() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let (server, ca, _tls_dir) = server_with(config(&dir.path().join("jwks.json"), None)).await;
    for (transport, addr) in doors(&server) {
        for name in ACCEPTED {
            assert_eq!(login(transport, addr, ca.as_ref(), &tokens[*name]).await, Ok(()), "{name} over {transport}");
        }
        for (name, says) in REFUSALS {
            let got = login(transport, addr, ca.as_ref(), &tokens[*name]).await;
            let text = got.expect_err(&format!("{name} over {transport} was accepted"));
            assert!(text.contains(says), "{name} over {transport}: {text:?} should say {says:?}");
            assert!(!text.contains(&tokens[*name][..20]), "the BYE never echoes the token");
        }
        // Over the 4 KiB bound: the first frame is refused before any check.
        let got = login(transport, addr, ca.as_ref(), &tokens["oversized"]).await;
        assert!(got.is_err(), "oversized over {transport}: {got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pem_keys_without_kid_and_hs_secrets_verify_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let server = TestServer::start(config(&dir.path().join("keys.pem"), Some(&dir.path().join("secret.txt")))).await;
    for name in ["RS256-nokid", "PS512-nokid", "ES256-nokid", "EdDSA-nokid", "HS256", "HS384", "HS512"] {
        assert_eq!(login(Transport::Tcp, server.addr, None, &tokens[name]).await, Ok(()), "{name}");
    }
    // The RSA key's PEM as an HMAC secret is still refused, with HS secrets configured.
    let got = login(Transport::Tcp, server.addr, None, &tokens["confusion"]).await;
    assert!(got.is_err_and(|t| t.contains("signature did not verify")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_3_and_5_take_the_jwt_as_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    if Command::new("python3").args(["-c", "import paho.mqtt"]).status().map_or(true, |s| !s.success()) {
        return skip_without("paho-mqtt", INSTALL);
    }
    let server = TestServer::start(config(&dir.path().join("jwks.json"), None)).await;
    let port = server.mqtt.port().to_string();
    let connect = |token: &str, version: &str| {
        let out = Command::new("python3")
            .arg(data().join("mqtt_login.py"))
            .args(["127.0.0.1", &port, &UID.to_string(), token, version])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // paho reports MQTT 3.1.1's "bad user name or password" (4) as MQTT 5's code for it, 134.
    for (version, bad_credentials) in [("3", "rc 134"), ("5", "rc 134")] {
        for name in ["RS256", "ES384", "EdDSA"] {
            assert_eq!(connect(&tokens[name], version), "rc 0", "{name} over MQTT {version}");
        }
        for name in ["expired", "other-uid", "none"] {
            assert_eq!(connect(&tokens[name], version), bad_credentials, "{name} over MQTT {version}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotated_on_sighup_take_new_logins_and_leave_live_sessions_alone() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let keys = dir.path().join("in-use.json");
    std::fs::copy(dir.path().join("jwks.json"), &keys).unwrap();
    let keys_arg = keys.to_string_lossy().to_string();
    let gw = GatewayProcess::start(&[
        "--jwt-key-file",
        &keys_arg,
        "--jwt-issuer",
        "https://idp.example",
        "--jwt-audience",
        "idlegate",
        "--max-devices",
        "4",
    ])
    .await;
    let mut live = DoorClient::connect(Transport::Tcp, gw.listen, None).await;
    let token = Bytes::copy_from_slice(tokens["RS256"].as_bytes());
    live.send(Frame::Login { uid: UID, token, device: "live".parse().unwrap(), timeout_ms: None }).await;
    assert!(matches!(live.recv().await, Got::Frame(Frame::Welcome { .. })));
    assert!(login(Transport::Tcp, gw.listen, None, &tokens["rotated"]).await.is_err(), "not yet rotated");

    // A broken file on SIGHUP keeps the keys in use.
    std::fs::write(&keys, "{ not json").unwrap();
    gw.signal("HUP");
    wait_metric(&gw, "idlegate_jwt_key_reloads_total{result=\"error\"}", 1.0).await;
    assert_eq!(login(Transport::Tcp, gw.listen, None, &tokens["RS384"]).await, Ok(()));

    std::fs::copy(dir.path().join("rotated.json"), &keys).unwrap();
    gw.signal("HUP");
    wait_metric(&gw, "idlegate_jwt_key_reloads_total{result=\"ok\"}", 1.0).await;
    assert_eq!(login(Transport::Tcp, gw.listen, None, &tokens["rotated"]).await, Ok(()));
    let old = login(Transport::Tcp, gw.listen, None, &tokens["RS256"]).await;
    assert!(old.is_err_and(|t| t.contains("kid unknown")), "a removed key's token is refused");
    // The session logged in under the removed key lives on.
    live.send(Frame::Ping(Bytes::from_static(b"still"))).await;
    assert_eq!(live.recv().await, Got::Frame(Frame::Pong(Bytes::from_static(b"still"))));
}

async fn wait_metric(gw: &GatewayProcess, series: &str, at_least: f64) {
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let (_, text) = common::http_get(gw.admin, "/metrics").await;
        if common::sample(&text, series).is_some_and(|v| v >= at_least) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{series} never reached {at_least}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// docs/CLIENTS.md's Node example, minting with npm's `jose` (`tests/data/jose/mint.mjs`),
/// gives a token the gateway takes: the claims it names ride in the online event.
#[tokio::test]
async fn the_documented_jose_example_mints_a_token_that_logs_in() {
    let data = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jose"));
    let installed = data.join("node_modules/jose/package.json").is_file();
    if common::find_on_path(&["node"]).is_none() || !installed {
        return skip_without("node and npm's jose", "cd tests/data/jose && npm ci");
    }
    let Some(openssl) = common::find_on_path(&["openssl"]) else {
        return skip_without("openssl", "apt-get install openssl");
    };
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("private.pem");
    let made = Command::new(openssl)
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
        .arg(&private)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let out = Command::new("node").arg(data.join("mint.mjs")).arg(&private).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let minted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, minted["jwks"].to_string()).unwrap();
    let rules = JwtRules { claims_to_events: vec!["name".into(), "org".into()], ..JwtRules::default() };
    let config = Config { jwt: Some(JwtAuth::load(Some(&jwks), None, rules).unwrap()), ..Config::default() };
    let mut server = TestServer::start(config).await;
    let (_, mut events) = common::Sse::open(server.api, "/v1/events", &[]).await;
    let token = minted["token"].as_str().unwrap();
    assert_eq!(login(Transport::Tcp, server.addr, None, token).await, Ok(()));
    let online = events.expect("online", UID).await;
    assert_eq!(online.data["claims"], serde_json::json!({"name": "Ada", "org": "acme"}));
    server.shutdown().await;
}

/// Issue 48: a provider's set is taken as providers publish it, its keys for anything but
/// verifying signatures skipped (Keycloak's `RSA-OAEP` key among them), and weak keys are
/// refused at load, each naming why: an HMAC secret under 32 bytes, an RSA key under 2,048
/// bits, an Ed25519 key of the wrong length (which used to load and panic every EdDSA login).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_set_loads_its_signing_keys_only_and_weak_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let jwt = JwtAuth::load(Some(&dir.path().join("keycloak.json")), None, rules()).expect("the set loads");
    assert_eq!(jwt.key_count(), 2, "the RSA signing key and the EC key");
    let server = TestServer::start(Config { jwt: Some(jwt), ..Config::default() }).await;
    for name in ["RS256", "ES256"] {
        assert_eq!(login(Transport::Tcp, server.addr, None, &tokens[name]).await, Ok(()), "{name}");
    }
    let refused = |keys: Option<&str>, secret: Option<&str>| {
        let (keys, secret) = (keys.map(|k| dir.path().join(k)), secret.map(|s| dir.path().join(s)));
        JwtAuth::load(keys.as_deref(), secret.as_deref(), rules()).expect_err("a weak key loads").to_string()
    };
    let said = refused(None, Some("short-secret.txt"));
    assert!(said.contains("16 bytes; an HMAC secret has at least 32"), "{said}");
    for file in ["rsa1024.json", "rsa1024.pem"] {
        let said = refused(Some(file), None);
        assert!(said.contains("RSA key of 1024 bits"), "{file}: {said}");
    }
    let said = refused(Some("ed-short.json"), None);
    assert!(said.contains("Ed25519 key of"), "{said}");
    let said = refused(Some("hs-short.json"), None);
    assert!(said.contains("HMAC secret of 5 bytes"), "{said}");
}
