//! Short-lived JWTs for the tests of expiry and refresh, minted by PyJWT
//! (`tests/data/jwt/series.py`), and a gateway that enforces their expiry.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use idlegate::{Config, JwtAuth, JwtRules};
use serde_json::{json, Value};

use super::skip_without;

const INSTALL: &str = "python3 -m pip install pyjwt cryptography";

/// Each uid's tokens, minted into `dir` (with the secret the gateway checks them with);
/// `None` (skipped) without PyJWT.
pub fn mint(dir: &Path, count: usize, uids: &[u64]) -> Option<HashMap<u64, Vec<String>>> {
    let ok = Command::new("python3").args(["-c", "import jwt"]).status().is_ok_and(|s| s.success());
    if !ok {
        skip_without("PyJWT", INSTALL);
        return None;
    }
    let script = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jwt/series.py"));
    let mut command = Command::new("python3");
    command.arg(script).arg(dir).arg(count.to_string());
    command.args(uids.iter().map(u64::to_string));
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let by_uid: HashMap<String, Vec<String>> = serde_json::from_slice(&out.stdout).expect("tokens as JSON");
    Some(by_uid.into_iter().map(|(uid, tokens)| (uid.parse().unwrap(), tokens)).collect())
}

/// Expiry enforced with no leeway, the `name` and `org` claims carried into events.
pub fn config(dir: &Path) -> Config {
    let rules =
        JwtRules { leeway: Duration::ZERO, claims_to_events: vec!["name".into(), "org".into()], ..JwtRules::default() };
    let jwt = JwtAuth::load(None, Some(&dir.join("secret.txt")), rules).unwrap();
    Config { jwt: Some(jwt), enforce_token_expiry: true, ..Config::default() }
}

/// A token's `exp`, read from its payload.
pub fn exp(token: &str) -> u64 {
    use base64::Engine;
    let payload = token.split('.').nth(1).unwrap();
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
    serde_json::from_slice::<Value>(&json).unwrap()["exp"].as_u64().unwrap()
}

pub fn claims(uid: u64) -> Value {
    json!({"name": format!("user {uid}"), "org": "acme"})
}
