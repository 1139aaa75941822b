//! JWT keys fetched from the identity provider itself (`--jwt-jwks-url`, or OIDC discovery
//! from `--jwt-issuer-url`), and the bounds of every fetch: how often, how large, how slow,
//! where a redirect may lead, which scheme, which CA. The fetching is `jwks/`'s; what a
//! fetched set is worth (which keys sign) is `jwt.rs`'s, as for a key file.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ConfigError;

/// Default `--jwt-jwks-refresh`, shortest: a provider's `max-age` of seconds (or none) must
/// not turn every gateway into a poller of its JWKS.
pub const DEFAULT_JWKS_REFRESH_MIN: Duration = Duration::from_secs(5 * 60);

/// Default `--jwt-jwks-refresh`, longest: a provider that says "cache for a week" still has
/// its rotations picked up within the hour, unknown `kid`s aside.
pub const DEFAULT_JWKS_REFRESH_MAX: Duration = Duration::from_secs(60 * 60);

/// Default `--jwt-jwks-min-interval`: the most often a token naming an unknown `kid` makes
/// the keys be fetched again (cluster-wide in a cluster). A client can send such tokens at
/// will; the provider must not see them as load.
pub const DEFAULT_JWKS_MIN_INTERVAL: Duration = Duration::from_secs(30);

/// Default `--jwt-jwks-timeout`: one fetch's deadline, discovery and keys each.
pub const DEFAULT_JWKS_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the keys are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// The JWKS document's URL (`--jwt-jwks-url`).
    Url(String),
    /// The issuer, whose `/.well-known/openid-configuration` names the JWKS document's URL
    /// and the `iss` its tokens carry (`--jwt-issuer-url`).
    Issuer(String),
}

impl JwksSource {
    /// The flag that set it, for errors.
    pub fn flag(&self) -> &'static str {
        match self {
            JwksSource::Url(_) => "--jwt-jwks-url",
            JwksSource::Issuer(_) => "--jwt-issuer-url",
        }
    }

    /// The URL the flag gave.
    pub fn url(&self) -> &str {
        match self {
            JwksSource::Url(url) | JwksSource::Issuer(url) => url,
        }
    }
}

/// Keys by URL: where, and the bounds of fetching them.
#[derive(Debug, Clone)]
pub struct JwksConfig {
    pub source: JwksSource,
    /// `--jwt-jwks-optional`: start without the keys (JWT logins are refused until they
    /// arrive) instead of exiting.
    pub optional: bool,
    /// `--jwt-jwks-refresh`: the provider's `Cache-Control: max-age` (or `Expires`), kept
    /// within these.
    pub refresh_min: Duration,
    pub refresh_max: Duration,
    /// `--jwt-jwks-min-interval`: the shortest time between two fetches an unknown `kid`
    /// asks for.
    pub min_interval: Duration,
    /// `--jwt-jwks-timeout`: one request's deadline.
    pub timeout: Duration,
    /// `--jwt-jwks-allow-http`: plain `http` URLs (tests on loopback; never in production:
    /// anyone on the path could hand the gateway their own keys).
    pub allow_http: bool,
    /// `--jwt-jwks-ca-file`: a private CA (PEM) the provider's certificate may chain to,
    /// besides the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl JwksConfig {
    /// Keys from `source`, with the default bounds.
    pub fn new(source: JwksSource) -> JwksConfig {
        JwksConfig {
            source,
            optional: false,
            refresh_min: DEFAULT_JWKS_REFRESH_MIN,
            refresh_max: DEFAULT_JWKS_REFRESH_MAX,
            min_interval: DEFAULT_JWKS_MIN_INTERVAL,
            timeout: DEFAULT_JWKS_TIMEOUT,
            allow_http: false,
            ca_file: None,
        }
    }

    /// Checks the URL's scheme and the bounds, naming the flag that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let flag = self.source.flag();
        let url = reqwest::Url::parse(self.source.url()).map_err(|e| ConfigError::new(flag, e.to_string()))?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => {
                return Err(ConfigError::new(
                    flag,
                    "an http URL: anyone on the path could hand the gateway their keys; use https \
                     (--jwt-jwks-allow-http is for tests)",
                ))
            }
            other => return Err(ConfigError::new(flag, format!("a {other} URL; only https"))),
        }
        if url.host_str().is_none() {
            return Err(ConfigError::new(flag, "a URL without a host"));
        }
        if self.refresh_min.is_zero() || self.refresh_min > self.refresh_max {
            return Err(ConfigError::new(
                "--jwt-jwks-refresh",
                "the shortest must be above zero and at most the longest",
            ));
        }
        if self.min_interval.is_zero() {
            return Err(ConfigError::new("--jwt-jwks-min-interval", "must be above zero"));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new("--jwt-jwks-timeout", "must be above zero"));
        }
        Ok(())
    }
}

/// `--jwt-jwks-refresh`'s value: `<shortest>,<longest>` (`5m,1h`), or one duration for both.
pub fn parse_refresh(text: &str) -> Result<(Duration, Duration), String> {
    let parse = |part: &str| humantime::parse_duration(part.trim()).map_err(|e| format!("{part:?}: {e}"));
    match text.split_once(',') {
        Some((min, max)) => Ok((parse(min)?, parse(max)?)),
        None => parse(text).map(|d| (d, d)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_unless_allowed_and_bounds_in_order() {
        let config = |url: &str| JwksConfig::new(JwksSource::Url(url.into()));
        assert!(config("https://idp.example/jwks").validate().is_ok());
        let plain = config("http://127.0.0.1:9/jwks");
        assert_eq!(plain.validate().unwrap_err().flag, "--jwt-jwks-url");
        assert!(JwksConfig { allow_http: true, ..plain }.validate().is_ok());
        assert!(config("ftp://idp.example/jwks").validate().is_err());
        let issuer = JwksConfig::new(JwksSource::Issuer("not a url".into()));
        assert_eq!(issuer.validate().unwrap_err().flag, "--jwt-issuer-url");
        let (min, max) = parse_refresh("5m,1h").unwrap();
        assert_eq!((min, max), (Duration::from_secs(300), Duration::from_secs(3600)));
        let backwards = JwksConfig { refresh_min: max, refresh_max: min, ..config("https://idp.example/jwks") };
        assert_eq!(backwards.validate().unwrap_err().flag, "--jwt-jwks-refresh");
        assert_eq!(parse_refresh("10m").unwrap(), (Duration::from_secs(600), Duration::from_secs(600)));
        assert!(parse_refresh("5m,soon").is_err());
    }
}
