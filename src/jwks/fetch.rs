//! One fetch of a JWKS document, or of the OIDC discovery document that names it, within
//! bounds a provider (or whoever answers in its place) cannot stretch: at most
//! [`MAX_DOCUMENT_BYTES`], within `--jwt-jwks-timeout`, `https` only (unless
//! `--jwt-jwks-allow-http`), and a redirect followed only within the URL's own origin. What
//! the answer's `Cache-Control: max-age` (or `Expires`) says is kept for the refresh.

use std::time::{Duration, SystemTime};

use reqwest::header::{CACHE_CONTROL, DATE, EXPIRES};
use reqwest::redirect::{Attempt, Policy};
use reqwest::Url;
use serde_json::Value;

use crate::config::outbound::{self, Failure, OutboundError};
use crate::config::JwksConfig;

/// The largest document taken: a provider's key set is a few KiB; a larger answer is a
/// mistake or an attack, and would be held in memory whole.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// Redirects followed within the URL's origin before giving up (a loop).
const MAX_REDIRECTS: usize = 5;

/// The path OIDC discovery appends to the issuer (OpenID Connect Discovery 1.0, 4).
const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

/// Why a fetch failed; each names the URL and says what went wrong, never the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("{0}: answered {1}")]
    Status(String, u16),
    #[error("{0}: the answer exceeds {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge(String),
    #[error("{0}: no answer within the timeout")]
    Timeout(String),
    #[error("{0}: TLS: {1}")]
    Tls(String, String),
    #[error("{0}: {1}")]
    Connect(String, String),
    #[error("{0}: a redirect out of its origin, or too many: {1}")]
    Redirect(String, String),
    #[error("{0}: {1}")]
    Invalid(String, String),
    #[error("{0}: discovery: {1}")]
    Discovery(String, String),
}

impl FetchError {
    /// The `result` label of `idlegate_jwt_jwks_fetches_total`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            FetchError::Status(..) => "status",
            FetchError::TooLarge(_) => "too_large",
            FetchError::Timeout(_) => "timeout",
            FetchError::Tls(..) => "tls",
            FetchError::Connect(..) => "connect",
            FetchError::Redirect(..) => "redirect",
            FetchError::Invalid(..) => "invalid",
            FetchError::Discovery(..) => "discovery",
        }
    }
}

/// A document as fetched, and how long its answer said it stays fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fetched {
    pub text: String,
    pub fresh_for: Option<Duration>,
}

/// The client every fetch goes through.
#[derive(Debug, Clone)]
pub(crate) struct Fetcher {
    client: reqwest::Client,
}

impl Fetcher {
    pub(crate) fn new(config: &JwksConfig, node: &str) -> Result<Fetcher, OutboundError> {
        let user_agent = format!("idlegate/{} (node {node})", env!("CARGO_PKG_VERSION"));
        let policy = Policy::custom(same_origin);
        let client =
            outbound::client(config.timeout, user_agent, config.ca_file.as_deref(), policy, config.allow_http)?;
        Ok(Fetcher { client })
    }

    /// The document at `url`, within the bounds (see the module documentation).
    pub(crate) async fn get(&self, url: &str) -> Result<Fetched, FetchError> {
        let fail = |e: reqwest::Error| {
            if e.is_redirect() {
                return FetchError::Redirect(url.to_string(), outbound::describe(e));
            }
            match outbound::failure(&e) {
                Failure::Timeout => FetchError::Timeout(url.to_string()),
                Failure::Tls => FetchError::Tls(url.to_string(), outbound::describe(e)),
                Failure::Connect => FetchError::Connect(url.to_string(), outbound::describe(e)),
            }
        };
        let mut answer = self.client.get(url).header("accept", "application/json").send().await.map_err(fail)?;
        if !answer.status().is_success() {
            return Err(FetchError::Status(url.to_string(), answer.status().as_u16()));
        }
        if answer.content_length().is_some_and(|n| n > MAX_DOCUMENT_BYTES as u64) {
            return Err(FetchError::TooLarge(url.to_string()));
        }
        let fresh_for = fresh_for(answer.headers(), SystemTime::now());
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(fail)? {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(FetchError::TooLarge(url.to_string()));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(body).map_err(|_| FetchError::Invalid(url.to_string(), "not UTF-8".into()))?;
        Ok(Fetched { text, fresh_for })
    }

    /// OIDC discovery: the `jwks_uri` and `issuer` the issuer's discovery document names.
    /// The document's `issuer` must be the one asked (OpenID Connect Discovery 1.0, 4.3), a
    /// trailing `/` aside, or anyone able to serve it could speak for another issuer.
    pub(crate) async fn discover(&self, issuer: &str, allow_http: bool) -> Result<Discovered, FetchError> {
        let url = format!("{}{DISCOVERY_PATH}", issuer.trim_end_matches('/'));
        let fetched = self.get(&url).await?;
        let fail = |why: &str| FetchError::Discovery(url.clone(), why.to_string());
        let doc: Value = serde_json::from_str(&fetched.text).map_err(|_| fail("not a JSON document"))?;
        let named = doc["issuer"].as_str().ok_or_else(|| fail("no issuer"))?;
        if named.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return Err(fail(&format!("it names issuer {named:?}, not the one asked")));
        }
        let jwks_uri = doc["jwks_uri"].as_str().ok_or_else(|| fail("no jwks_uri"))?;
        let parsed = Url::parse(jwks_uri).map_err(|e| fail(&format!("jwks_uri: {e}")))?;
        if parsed.scheme() != "https" && !(allow_http && parsed.scheme() == "http") {
            return Err(fail("jwks_uri is not https"));
        }
        Ok(Discovered { jwks_uri: jwks_uri.to_string(), issuer: named.to_string() })
    }
}

/// What discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Discovered {
    pub jwks_uri: String,
    pub issuer: String,
}

/// Follows a redirect only to the origin (scheme, host, port) the request began at.
fn same_origin(attempt: Attempt<'_>) -> reqwest::redirect::Action {
    let first = attempt.previous().first().cloned();
    if attempt.previous().len() > MAX_REDIRECTS {
        return attempt.error("too many redirects");
    }
    match first {
        Some(first) if first.origin() == attempt.url().origin() => attempt.follow(),
        _ => attempt.error("out of the URL's origin"),
    }
}

/// How long an answer stays fresh by its headers: `Cache-Control: max-age` first (RFC 9111
/// 5.2.2.1), else `Expires` against the answer's `Date` (or `now`); `no-store` and
/// `no-cache` say not at all. `None` when the answer says nothing.
fn fresh_for(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let directives = headers.get_all(CACHE_CONTROL).iter().filter_map(|v| v.to_str().ok());
    let mut max_age = None;
    for directive in directives.flat_map(|v| v.split(',')).map(str::trim) {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(secs) = lower.strip_prefix("max-age=") {
            max_age = secs.trim_matches('"').parse::<u64>().ok().map(Duration::from_secs);
        }
    }
    if max_age.is_some() {
        return max_age;
    }
    let date = |name| headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| httpdate::parse_http_date(v).ok());
    let expires = date(EXPIRES)?;
    let base = date(DATE).unwrap_or(now);
    Some(expires.duration_since(base).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};

    fn headers(pairs: &[(reqwest::header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn freshness_comes_from_max_age_then_expires() {
        let now = httpdate::parse_http_date("Sat, 28 Nov 2026 10:00:00 GMT").unwrap();
        let max_age = headers(&[(CACHE_CONTROL, "public, max-age=3600, must-revalidate")]);
        assert_eq!(fresh_for(&max_age, now), Some(Duration::from_secs(3600)));
        let no_store = headers(&[(CACHE_CONTROL, "no-store")]);
        assert_eq!(fresh_for(&no_store, now), Some(Duration::ZERO));
        let expires = headers(&[(EXPIRES, "Sat, 28 Nov 2026 10:30:00 GMT"), (DATE, "Sat, 28 Nov 2026 10:10:00 GMT")]);
        assert_eq!(fresh_for(&expires, now), Some(Duration::from_secs(1200)));
        let no_date = headers(&[(EXPIRES, "Sat, 28 Nov 2026 10:30:00 GMT")]);
        assert_eq!(fresh_for(&no_date, now), Some(Duration::from_secs(1800)));
        let past = headers(&[(EXPIRES, "Sat, 28 Nov 2026 09:00:00 GMT")]);
        assert_eq!(fresh_for(&past, now), Some(Duration::ZERO));
        let both = headers(&[(CACHE_CONTROL, "max-age=60"), (EXPIRES, "Sat, 28 Nov 2026 10:30:00 GMT")]);
        assert_eq!(fresh_for(&both, now), Some(Duration::from_secs(60)));
        assert_eq!(fresh_for(&HeaderMap::new(), now), None);
        let garbage = headers(&[(EXPIRES, "soon")]);
        assert_eq!(fresh_for(&garbage, now), None);
    }
}
