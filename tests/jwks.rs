//! JWT keys by URL (`--jwt-jwks-url`): fetched at start, refreshed within
//! `--jwt-jwks-refresh` and on an unknown `kid` (at most once per
//! `--jwt-jwks-min-interval`), a failed fetch keeping the keys in use. Tokens and keys are
//! PyJWT's and `cryptography`'s (`tests/data/jwt/mint.py`, `random_kids.py`); the
//! provider is a small HTTP server in the test that serves whatever key set the test says,
//! counts its fetches, and can be made slow or oversized: the abuse cases are measured
//! against it (OIDC discovery against a certified provider is `tests/oidc.rs`'s).
//!
//! Needs Python with `pyjwt` and `cryptography` (`.ci/run` installs them); skips without
//! them, except under CI.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use common::cluster::eventually;
use common::process::GatewayProcess;
use common::{skip_without, TestServer};
use idlegate::{Config, JwksConfig, JwksSource, JwtAuth, JwtRules};
use idlegate_proto::Frame;

const INSTALL: &str = "python3 -m pip install pyjwt cryptography";
const UID: u64 = 42;

fn data() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jwt"))
}

/// Runs `script` with `args`; its JSON output. `None` (skipped) without PyJWT.
fn python(script: &str, args: &[&str]) -> Option<serde_json::Value> {
    let ok = Command::new("python3").args(["-c", "import jwt, cryptography"]).status().is_ok_and(|s| s.success());
    if !ok {
        skip_without("PyJWT and cryptography", INSTALL);
        return None;
    }
    let out = Command::new("python3").arg(data().join(script)).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("JSON"))
}

/// Key sets written into `dir` (jwks.json, rotated.json, keycloak.json) and the tokens of
/// `mint.py`, by name.
fn mint(dir: &Path) -> Option<HashMap<String, String>> {
    let tokens = python("mint.py", &[dir.to_str().unwrap(), &UID.to_string()])?;
    Some(serde_json::from_value(tokens).unwrap())
}

/// The identity provider's JWKS endpoint as the test scripts it.
#[derive(Default)]
struct Provider {
    document: Mutex<String>,
    /// `Cache-Control` of its answers, if any.
    cache_control: Mutex<Option<String>>,
    /// How long it takes to answer.
    delay: Mutex<Duration>,
    /// Where `/moved` redirects to.
    moved_to: Mutex<String>,
    fetches: AtomicU64,
    answering: AtomicU64,
}

impl Provider {
    /// Serves on a loopback port; returns it and the JWKS URL.
    async fn start(document: String) -> (Arc<Provider>, String) {
        let provider = Arc::new(Provider { document: Mutex::new(document), ..Provider::default() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/jwks", axum::routing::get(serve))
            .route("/moved", axum::routing::get(moved))
            .with_state(provider.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (provider, url)
    }

    fn set(&self, document: String) {
        *self.document.lock().unwrap() = document;
    }

    fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::SeqCst)
    }
}

async fn serve(State(provider): State<Arc<Provider>>) -> impl IntoResponse {
    provider.fetches.fetch_add(1, Ordering::SeqCst);
    provider.answering.fetch_add(1, Ordering::SeqCst);
    let delay = *provider.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    provider.answering.fetch_sub(1, Ordering::SeqCst);
    let document = provider.document.lock().unwrap().clone();
    let cache = provider.cache_control.lock().unwrap().clone().unwrap_or_else(|| "no-cache".into());
    ([(header::CONTENT_TYPE, "application/json".to_string()), (header::CACHE_CONTROL, cache)], document)
}

async fn moved(State(provider): State<Arc<Provider>>) -> impl IntoResponse {
    let to = provider.moved_to.lock().unwrap().clone();
    (axum::http::StatusCode::FOUND, [(header::LOCATION, to)])
}

fn rules() -> JwtRules {
    JwtRules { issuer: Some("https://idp.example".into()), audience: Some("idlegate".into()), ..JwtRules::default() }
}

/// A gateway whose JWT keys come from `url` alone, refreshed within `refresh`, an unknown
/// kid's refetch at most once per `interval`.
fn by_url(url: &str, refresh: Duration, interval: Duration) -> Config {
    let jwt = JwtAuth::load_with(None, None, true, rules()).unwrap();
    let mut jwks = JwksConfig::new(JwksSource::Url(url.into()));
    jwks.allow_http = true;
    (jwks.refresh_min, jwks.refresh_max) = (refresh, refresh);
    jwks.min_interval = interval;
    jwks.timeout = Duration::from_secs(2);
    Config { jwt: Some(jwt), jwks: Some(jwks), ..Config::default() }
}

/// Logs in with `token` on a connection of its own: `Ok` for a WELCOME, else the BYE's text.
async fn login(gw: &TestServer, token: &str) -> Result<(), String> {
    login_at(gw.addr, token).await
}

async fn login_at(addr: std::net::SocketAddr, token: &str) -> Result<(), String> {
    let mut client = common::Client::connect(addr).await;
    match client.login_with(UID, token.as_bytes()).await {
        Frame::Welcome { .. } => Ok(()),
        Frame::Bye { text, .. } => Err(text),
        other => Err(format!("{other:?}")),
    }
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap()
}

/// The fetches counted by the gateway with `trigger` and `result`.
async fn fetched(gw: &TestServer, trigger: &str, result: &str) -> u64 {
    let (_, text) = gw.admin_get("/metrics").await;
    let series = format!("idlegate_jwt_jwks_fetches_total{{result=\"{result}\",trigger=\"{trigger}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&series)).map_or(0, |v| v.trim().parse().unwrap())
}

/// Keys fetched at start log in; the provider rotates (its set now holds only a new key):
/// a token of the new key logs in once the gateway refetches (on its unknown kid, at once),
/// and a token of the old key is refused from then on; the status page says where the keys
/// came from and how old they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_by_url_log_in_and_follow_the_providers_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let (provider, url) = Provider::start(read(dir.path(), "jwks.json")).await;
    let gw = TestServer::start(by_url(&url, Duration::from_secs(3600), Duration::from_millis(200))).await;
    eventually("the keys are fetched", || async { gw.metrics.jwks_keys.get() == 4 }).await;
    assert_eq!(login(&gw, &tokens["RS256"]).await, Ok(()));
    assert_eq!(login(&gw, &tokens["ES256"]).await, Ok(()));
    provider.set(read(dir.path(), "rotated.json"));
    // The first token of the new key may come before the refetch it asks for has landed.
    eventually("the new key logs in", || async { login(&gw, &tokens["rotated"]).await.is_ok() }).await;
    let refused = login(&gw, &tokens["RS256"]).await.unwrap_err();
    assert!(refused.contains("kid unknown"), "{refused}");
    assert!(fetched(&gw, "unknown_kid", "ok").await >= 1);
    let (_, status) = gw.admin_get("/status.json").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["jwt"]["source"], "url");
    assert_eq!(status["jwt"]["keys"], 1);
    assert_eq!(status["jwt"]["url"], url.as_str());
    assert!(status["jwt"]["fetched_age_ms"].as_u64().is_some_and(|age| age < 60_000), "{status}");
    assert!(status["jwt"]["last_error"].is_null());
}

/// The provider's `Cache-Control: max-age` sets the refresh, within `--jwt-jwks-refresh`:
/// a rotation is picked up by the scheduled refresh alone, with no token asking for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_refresh_picks_up_a_rotation_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let (provider, url) = Provider::start(read(dir.path(), "jwks.json")).await;
    *provider.cache_control.lock().unwrap() = Some("public, max-age=1".into());
    // max-age=1 is below the shortest refresh (1.5 s): the shortest holds.
    let mut config = by_url(&url, Duration::from_millis(1500), Duration::from_secs(3600));
    config.jwks.as_mut().unwrap().refresh_max = Duration::from_secs(3600);
    let gw = TestServer::start(config).await;
    eventually("the keys are fetched", || async { gw.metrics.jwks_keys.get() == 4 }).await;
    provider.set(read(dir.path(), "rotated.json"));
    eventually("the scheduled refresh takes the new set", || async { gw.metrics.jwks_keys.get() == 1 }).await;
    assert!(fetched(&gw, "scheduled", "ok").await >= 1);
    assert_eq!(fetched(&gw, "unknown_kid", "ok").await, 0, "no token asked");
    assert_eq!(login(&gw, &tokens["rotated"]).await, Ok(()));
}

/// The abuse case: 10,000 LOGINs naming random kids (minted by PyJWT) cause at most one
/// fetch per `--jwt-jwks-min-interval` (plus the start's), and every one is refused; logins
/// with the known keys go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_unknown_kids_cause_at_most_one_fetch_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let Some(random) = python("random_kids.py", &[&UID.to_string(), "10000"]) else { return };
    let random: Vec<String> = serde_json::from_value(random).unwrap();
    let (provider, url) = Provider::start(read(dir.path(), "jwks.json")).await;
    // Short, so that the logins span several intervals.
    let interval = Duration::from_millis(250);
    let gw = TestServer::start(by_url(&url, Duration::from_secs(3600), interval)).await;
    eventually("the keys are fetched", || async { gw.metrics.jwks_keys.get() == 4 }).await;
    let before = provider.fetches();
    let started = tokio::time::Instant::now();
    let addr = gw.addr;
    let mut senders = Vec::new();
    for chunk in random.chunks(random.len() / 20) {
        let chunk = chunk.to_vec();
        senders.push(tokio::spawn(async move {
            let mut refused = 0;
            for token in chunk {
                if login_at(addr, &token).await.is_err() {
                    refused += 1;
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for sender in senders {
        refused += sender.await.unwrap();
    }
    let took = started.elapsed();
    assert_eq!(refused, random.len(), "every unknown kid is refused");
    assert_eq!(login(&gw, &tokens["RS256"]).await, Ok(()), "the known keys still log in");
    let fetches = provider.fetches() - before;
    // One at most at each interval's end since the start's fetch.
    let allowed = (took.as_millis() / interval.as_millis()) as u64 + 1;
    println!("10,000 unknown kids in {took:?}: {fetches} fetches (at most {allowed} allowed)");
    assert!(fetches <= allowed, "{fetches} fetches in {took:?} at one per {interval:?}");
    assert!(gw.metrics.jwks_refetches_limited.get() > 0);
}

/// A set over 1 MiB is refused, counted as `too_large`, and the keys in use stay; so does a
/// set that is no JWKS document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_or_broken_set_is_refused_and_the_keys_stay() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let (provider, url) = Provider::start(read(dir.path(), "jwks.json")).await;
    let gw = TestServer::start(by_url(&url, Duration::from_secs(3600), Duration::from_millis(100))).await;
    eventually("the keys are fetched", || async { gw.metrics.jwks_keys.get() == 4 }).await;
    // 2 MiB: the old set with a padding member.
    let rotated: serde_json::Value = serde_json::from_str(&read(dir.path(), "rotated.json")).unwrap();
    let huge = serde_json::json!({"keys": rotated["keys"], "padding": "x".repeat(2 << 20)});
    provider.set(huge.to_string());
    eventually("the oversized set is refused", || async {
        let _ = login(&gw, &tokens["rotated"]).await;
        fetched(&gw, "unknown_kid", "too_large").await >= 1
    })
    .await;
    assert_eq!(login(&gw, &tokens["RS256"]).await, Ok(()), "the keys in use stay");
    provider.set("{\"keys\": 7}".into());
    eventually("the broken set is refused", || async {
        let _ = login(&gw, &tokens["rotated"]).await;
        fetched(&gw, "unknown_kid", "invalid").await >= 1
    })
    .await;
    assert_eq!(login(&gw, &tokens["ES256"]).await, Ok(()), "the keys in use stay");
    let (_, status) = gw.admin_get("/status.json").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(status["jwt"]["last_error"].as_str().is_some_and(|e| e.contains("not a JWKS document")), "{status}");
    assert_eq!(gw.metrics.jwks_last_fetch_ok.get(), 0);
    assert_eq!(status["jwt"]["keys"], 4);
}

/// A provider that takes 30 s to answer a refetch stalls no login with a known key: the
/// fetch runs on its own task, its deadline (`--jwt-jwks-timeout`) ends it, and the keys in
/// use stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_answering_in_30_s_stalls_no_login() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let (provider, url) = Provider::start(read(dir.path(), "jwks.json")).await;
    let gw = TestServer::start(by_url(&url, Duration::from_secs(3600), Duration::from_millis(100))).await;
    eventually("the keys are fetched", || async { gw.metrics.jwks_keys.get() == 4 }).await;
    *provider.delay.lock().unwrap() = Duration::from_secs(30);
    eventually("the refetch is waiting on the provider", || async {
        let _ = login(&gw, &tokens["wrong-kid"]).await;
        provider.answering.load(Ordering::SeqCst) == 1
    })
    .await;
    // While it waits: a hundred logins with known keys.
    let started = tokio::time::Instant::now();
    for _ in 0..100 {
        assert_eq!(login(&gw, &tokens["ES256"]).await, Ok(()));
    }
    println!("100 logins while the provider took 30 s: {:?}", started.elapsed());
    assert_eq!(provider.answering.load(Ordering::SeqCst), 1, "the provider was still answering");
    eventually("the refetch timed out", || async { fetched(&gw, "unknown_kid", "timeout").await >= 1 }).await;
    assert_eq!(login(&gw, &tokens["RS256"]).await, Ok(()));
}

/// A Keycloak-shaped set (an RSA signing key, an `RSA-OAEP` encryption key, an EC key
/// whose `key_ops` verify, an RSA key whose `key_ops` only encrypt): the signing keys are
/// used, the others skipped, and nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keycloak_shaped_set_is_taken_for_its_signing_keys() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let (_provider, url) = Provider::start(read(dir.path(), "keycloak.json")).await;
    let gw = TestServer::start(by_url(&url, Duration::from_secs(3600), Duration::from_secs(30))).await;
    eventually("the keys are fetched", || async { gw.metrics.jwks_keys.get() == 2 }).await;
    assert_eq!(login(&gw, &tokens["RS256"]).await, Ok(()));
    assert_eq!(login(&gw, &tokens["ES256"]).await, Ok(()));
    assert_eq!(fetched(&gw, "start", "ok").await + fetched(&gw, "scheduled", "ok").await, 1);
}

/// `idlegate serve` with keys by URL it cannot fetch exits 2 naming the flag; with
/// `--jwt-jwks-optional` it starts, refuses JWT logins saying why, and takes them once the
/// provider answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_cannot_be_fetched_at_start_stop_the_gateway_unless_optional() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    // A port nobody listens on (taken, then let go).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/jwks");
    let out = Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"])
        .args(["--jwt-jwks-url", &url, "--jwt-jwks-allow-http", "--jwt-jwks-timeout", "2s"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("--jwt-jwks-url") && said.contains(&url), "{said}");

    let gw = GatewayProcess::start_as(
        "a",
        &[
            "--jwt-jwks-url",
            &url,
            "--jwt-jwks-allow-http",
            "--jwt-jwks-optional",
            "--jwt-jwks-min-interval",
            "200ms",
            "--jwt-issuer",
            "https://idp.example",
            "--jwt-audience",
            "idlegate",
        ],
    )
    .await;
    let refused = login_at(gw.listen, &tokens["RS256"]).await.unwrap_err();
    assert!(refused.contains("not fetched yet"), "{refused}");
    // The provider comes up on that port.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let provider = Arc::new(Provider { document: Mutex::new(read(dir.path(), "jwks.json")), ..Provider::default() });
    let app = axum::Router::new().route("/jwks", axum::routing::get(serve)).with_state(provider.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    eventually("JWT logins are taken once the keys arrive", || async {
        login_at(gw.listen, &tokens["RS256"]).await.is_ok()
    })
    .await;
}

/// In a cluster, unknown kids sent to every node cause at most one fetch per interval for
/// the whole cluster: the node that takes the refetch publishes the set through Redis, and
/// the others take it from there (`trigger="shared"`) instead of asking the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_unknown_kids_cause_one_fetch_per_interval_for_all_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let Some(random) = python("random_kids.py", &[&UID.to_string(), "2000"]) else { return };
    let random: Vec<String> = serde_json::from_value(random).unwrap();
    let Some(redis) = common::redis::RedisServer::start().await else { return };
    let (provider, url) = Provider::start(read(dir.path(), "jwks.json")).await;
    let interval = Duration::from_secs(1);
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        let config = by_url(&url, Duration::from_secs(3600), interval);
        let config =
            Config { jwt: config.jwt, jwks: config.jwks, ..common::cluster::cluster_config(&redis.url(), name) };
        let gw = TestServer::start(config).await;
        common::cluster::wait_ready(&gw).await;
        eventually("the keys are fetched", || async { gw.metrics.jwks_keys.get() == 4 }).await;
        nodes.push(gw);
    }
    // The provider rotates; then unknown kids (and the new key's token) on every node.
    provider.set(read(dir.path(), "rotated.json"));
    tokio::time::sleep(interval).await;
    let before = provider.fetches();
    let started = tokio::time::Instant::now();
    let doors: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let mut senders = Vec::new();
    for (i, chunk) in random.chunks(random.len() / 12).enumerate() {
        let (chunk, door) = (chunk.to_vec(), doors[i % doors.len()]);
        senders.push(tokio::spawn(async move {
            for token in chunk {
                let _ = login_at(door, &token).await;
            }
        }));
    }
    for sender in senders {
        sender.await.unwrap();
    }
    let took = started.elapsed();
    let fetches = provider.fetches() - before;
    let allowed = (took.as_millis() / interval.as_millis()) as u64 + 1;
    println!("2,000 unknown kids over three nodes in {took:?}: {fetches} fetches (at most {allowed} allowed)");
    assert!(fetches <= allowed, "{fetches} fetches in {took:?} at one per {interval:?}, cluster-wide");
    // Every node logs the new key in, most of them without fetching it themselves.
    for gw in &nodes {
        eventually("the new key logs in on every node", || async { login(gw, &tokens["rotated"]).await.is_ok() }).await;
    }
    let mut shared = 0;
    for gw in &nodes {
        shared += fetched(gw, "shared", "ok").await;
    }
    assert!(shared >= 1, "a node took the set another fetched");
}

/// A redirect is followed within the URL's origin only: one to the same host and port is
/// taken, one to another port (another origin, here another provider serving the same
/// keys) is refused and counted as `redirect`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_followed_only_within_the_origin() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path()) else { return };
    let (provider, url) = Provider::start(read(dir.path(), "jwks.json")).await;
    let (_elsewhere, elsewhere) = Provider::start(read(dir.path(), "jwks.json")).await;
    let moved = url.replace("/jwks", "/moved");
    *provider.moved_to.lock().unwrap() = "/jwks".into();
    let within = TestServer::start(by_url(&moved, Duration::from_secs(3600), Duration::from_secs(30))).await;
    eventually("the keys are fetched through the redirect", || async { within.metrics.jwks_keys.get() == 4 }).await;
    assert_eq!(login(&within, &tokens["RS256"]).await, Ok(()));
    *provider.moved_to.lock().unwrap() = elsewhere;
    let away = TestServer::start(by_url(&moved, Duration::from_secs(3600), Duration::from_secs(30))).await;
    eventually("the redirect away is refused", || async { fetched(&away, "start", "redirect").await == 1 }).await;
    assert_eq!(away.metrics.jwks_keys.get(), 0);
    let refused = login(&away, &tokens["RS256"]).await.unwrap_err();
    assert!(refused.contains("not fetched yet"), "{refused}");
}
