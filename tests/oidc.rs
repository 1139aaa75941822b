//! JWT keys by OIDC discovery from an OpenID provider nobody on this project wrote: npm's
//! `oidc-provider` (OpenID Certified), started here over HTTPS on loopback with a
//! certificate of the test's own CA (the gateway trusts it through `--jwt-jwks-ca-file`).
//! The tokens are the provider's, taken as a backend takes them (the client credentials
//! grant: JWT access tokens with a numeric `uid` claim, `tests/data/oidc/token.mjs`). They
//! log in on every door (TCP, TLS, WebSocket, WSS, MQTT 3.1.1 and 5); the provider rotates
//! its keys (restarted with a new key first, then with the new key alone) and the gateway,
//! never restarted, follows: new tokens log in, and old ones are refused once their key is
//! gone; then the provider stops, and logins with the keys known go on.
//!
//! Needs Node with `tests/data/oidc`'s packages (`cd tests/data/oidc && npm ci`), openssl,
//! and Python's paho-mqtt (`.ci/run` installs them); skips without them, except under CI.

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::cluster::eventually;
use common::tls::{doors, server_with, TestCa};
use common::{find_on_path, skip_without, TestServer};
use idlegate::{Config, JwksConfig, JwksSource, JwtAuth, JwtRules};
use idlegate_proto::Transport;

const INSTALL: &str =
    "apt-get install nodejs npm openssl && (cd tests/data/oidc && npm ci) && python3 -m pip install paho-mqtt";
const UID: u64 = 42;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/oidc")
}

fn ready() -> bool {
    let paho = Command::new("python3").args(["-c", "import paho.mqtt"]).status().is_ok_and(|s| s.success());
    let ok = paho
        && find_on_path(&["node"]).is_some()
        && find_on_path(&["openssl"]).is_some()
        && data().join("node_modules/oidc-provider/package.json").exists();
    if !ok {
        skip_without("node, openssl, npm's oidc-provider and paho-mqtt", INSTALL);
    }
    ok
}

/// The provider on `port`, publishing the keys `names` (the first signs); stopped when
/// dropped.
struct OidcProvider {
    child: Child,
}

impl OidcProvider {
    async fn start(port: u16, (cert, key): &(String, String), state: &Path, names: &str) -> OidcProvider {
        let mut child = Command::new("node")
            .arg(data().join("provider.mjs"))
            .args([&port.to_string(), cert, key, state.to_str().unwrap(), names])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs");
        let stdout = child.stdout.take().unwrap();
        let first = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        let line = tokio::time::timeout(common::PATIENCE, first).await.expect("the provider starts").unwrap().unwrap();
        assert_eq!(line.trim(), format!("LISTENING {port}"), "the provider's first line");
        OidcProvider { child }
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An access token from the provider at `issuer`, as a backend takes one.
fn token(issuer: &str, ca: &str) -> String {
    let out = Command::new("node")
        .arg(data().join("token.mjs"))
        .arg(issuer)
        .env("NODE_EXTRA_CA_CERTS", ca)
        .output()
        .expect("node runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The `kid` of a token's header.
fn kid(token: &str) -> String {
    use base64::Engine;
    let head = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap();
    serde_json::from_slice::<serde_json::Value>(&head).unwrap()["kid"].as_str().unwrap().to_string()
}

/// Logs in as [`UID`] with `token` on `transport`.
async fn login(
    transport: Transport,
    addr: std::net::SocketAddr,
    ca: Option<&TestCa>,
    token: &str,
) -> Result<(), String> {
    common::ws::token_login(transport, addr, ca, UID, token).await
}

/// CONNECT over MQTT `version` (3 or 5) with `token` as the password, by paho: `rc <code>`.
fn mqtt(server: &TestServer, token: &str, version: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jwt/mqtt_login.py");
    let port = server.mqtt.port().to_string();
    let out = Command::new("python3")
        .arg(script)
        .args(["127.0.0.1", &port, &UID.to_string(), token, version])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A free loopback port (taken, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certified_providers_tokens_log_in_on_every_door_through_a_key_rotation() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("keys");
    std::fs::create_dir(&state).unwrap();
    let ca = TestCa::new(dir.path());
    let leaf = ca.leaf("provider");
    let port = free_port();
    let issuer = format!("https://localhost:{port}");
    let provider = OidcProvider::start(port, &leaf, &state, "k1").await;

    // The gateway knows the issuer's URL alone: discovery names the keys and the iss.
    let rules = JwtRules {
        issuer: Some(issuer.clone()),
        audience: Some("idlegate".into()),
        uid_claim: "uid".into(),
        ..JwtRules::default()
    };
    let mut jwks = JwksConfig::new(JwksSource::Issuer(issuer.clone()));
    jwks.ca_file = Some(ca.cert.clone().into());
    (jwks.refresh_min, jwks.refresh_max) = (Duration::from_secs(1), Duration::from_secs(2));
    jwks.min_interval = Duration::from_millis(500);
    let jwt = JwtAuth::load_with(None, None, true, rules).unwrap();
    let (server, gateway_ca, _tls) =
        server_with(Config { jwt: Some(jwt), jwks: Some(jwks), ..Config::default() }).await;
    eventually("the provider's keys are fetched", || async { server.metrics.jwks_keys.get() == 1 }).await;

    let first = token(&issuer, &ca.cert);
    assert_eq!(kid(&first), "k1");
    for (transport, addr) in doors(&server) {
        assert_eq!(login(transport, addr, gateway_ca.as_ref(), &first).await, Ok(()), "{transport:?}");
    }
    for version in ["3", "5"] {
        assert_eq!(mqtt(&server, &first, version), "rc 0", "MQTT {version}");
    }

    // The rotation, as the provider does it: a new key published first, signing; the
    // gateway, untouched, takes its tokens (their unknown kid asks for a refetch).
    drop(provider);
    let provider = OidcProvider::start(port, &leaf, &state, "k2,k1").await;
    let second = token(&issuer, &ca.cert);
    assert_eq!(kid(&second), "k2");
    eventually("the new key's token logs in", || async {
        login(Transport::Tcp, server.addr, None, &second).await.is_ok()
    })
    .await;
    assert_eq!(login(Transport::Tcp, server.addr, None, &first).await, Ok(()), "the old key is still published");

    // The old key leaves the set: within the refresh bound, its tokens are refused.
    drop(provider);
    let provider = OidcProvider::start(port, &leaf, &state, "k2").await;
    eventually("the old key's token is refused", || async {
        login(Transport::Tcp, server.addr, None, &first).await.is_err_and(|said| said.contains("kid unknown"))
    })
    .await;
    for (transport, addr) in doors(&server) {
        assert_eq!(login(transport, addr, gateway_ca.as_ref(), &second).await, Ok(()), "{transport:?}");
    }

    // The provider stops: the refreshes fail, and the keys known go on logging in.
    let failures = || async {
        let (_, text) = server.admin_get("/metrics").await;
        let failed = |l: &&str| l.starts_with("idlegate_jwt_jwks_fetches_total{result=\"connect\"");
        text.lines().filter(failed).filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).sum::<u64>()
    };
    let before = failures().await;
    drop(provider);
    eventually("a refresh failed", || async { failures().await > before }).await;
    assert_eq!(login(Transport::Tcp, server.addr, None, &second).await, Ok(()));
    assert_eq!(mqtt(&server, &second, "5"), "rc 0");
    let (_, status) = server.admin_get("/status.json").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["jwt"]["source"], "url");
    assert_eq!(status["jwt"]["url"], format!("{issuer}/jwks"));
    assert!(status["jwt"]["last_error"].as_str().is_some(), "{status}");
}
