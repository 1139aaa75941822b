//! `--webhook-*`: where presence events are delivered, signed, and how (issue 35). The
//! secrets follow the Standard Webhooks specification (standardwebhooks.com): a line each,
//! `whsec_` and the base64 of 24 to 64 random bytes, newest first.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine;

use crate::error::ConfigError;
use crate::proto::EventKind;

/// Default `--webhook-batch`: a hundred events make a request of about 15 KB, and a
/// 19,000-client reconnect storm 190 requests.
pub const DEFAULT_WEBHOOK_BATCH: usize = 100;

/// Most `--webhook-batch` may be: a request's body stays around a megabyte.
const MAX_WEBHOOK_BATCH: usize = 10_000;

/// Default `--webhook-linger`: long enough to gather a burst, short next to any timeout.
pub const DEFAULT_WEBHOOK_LINGER: Duration = Duration::from_millis(50);

/// Default `--webhook-timeout` for one request.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `--webhook-max-backoff` between retries.
pub const DEFAULT_WEBHOOK_MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Default `--webhook-events`.
pub const DEFAULT_WEBHOOK_EVENTS: &str = "online,offline,user_online,user_offline,status";

/// The prefix of a Standard Webhooks secret.
const SECRET_PREFIX: &str = "whsec_";

/// Bounds on a secret's random bytes (Standard Webhooks: 24 to 64).
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// Where and how the relay delivers events.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// `--webhook-url`: `http://` or `https://`.
    pub url: String,
    /// `--webhook-secret-file`'s secrets, newest first, decoded; read again on SIGHUP.
    pub secrets: Arc<WebhookSecrets>,
    /// `--webhook-ca-file`: a private CA the receiver's certificate may chain to, besides
    /// the system's roots (PEM).
    pub ca_file: Option<std::path::PathBuf>,
    /// `--webhook-events`, by [`EventKind::index`].
    pub events: [bool; EventKind::ALL.len()],
    /// `--webhook-batch`: the most events in one request.
    pub batch: usize,
    /// `--webhook-linger`: how long a batch waits to fill once it holds an event.
    pub linger: Duration,
    /// `--webhook-timeout`: one request's deadline.
    pub timeout: Duration,
    /// `--webhook-max-backoff`: the longest wait between retries.
    pub max_backoff: Duration,
}

// === impl WebhookConfig ===

impl WebhookConfig {
    /// A relay to `url`, signing with the secrets in `secret_file`, with the defaults.
    pub fn new(url: &str, secret_file: &Path) -> Result<WebhookConfig, ConfigError> {
        let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
        if !rest.is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/') && !rest.contains(char::is_whitespace)) {
            return Err(ConfigError::new("--webhook-url", format!("{url:?} is not an http:// or https:// URL")));
        }
        Ok(WebhookConfig {
            url: url.to_string(),
            secrets: Arc::new(WebhookSecrets::load(secret_file)?),
            ca_file: None,
            events: parse_events(DEFAULT_WEBHOOK_EVENTS)?,
            batch: DEFAULT_WEBHOOK_BATCH,
            linger: DEFAULT_WEBHOOK_LINGER,
            timeout: DEFAULT_WEBHOOK_TIMEOUT,
            max_backoff: DEFAULT_WEBHOOK_MAX_BACKOFF,
        })
    }

    /// The URL as logs show it: without credentials (`user:password@`) or query string,
    /// which often carry a receiver's token, and without a fragment.
    pub fn url_for_logs(&self) -> String {
        redact_url(&self.url)
    }

    /// Whether the relay delivers events of `kind`.
    pub fn wants(&self, kind: EventKind) -> bool {
        self.events[kind.index()]
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_WEBHOOK_BATCH).contains(&self.batch) {
            return Err(ConfigError::new("--webhook-batch", format!("must be 1 to {MAX_WEBHOOK_BATCH}")));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new("--webhook-timeout", "must be more than 0"));
        }
        if self.max_backoff < Duration::from_millis(100) {
            return Err(ConfigError::new("--webhook-max-backoff", "must be at least 100ms, the first retry's wait"));
        }
        if self.secrets.current().is_empty() {
            return Err(ConfigError::new("--webhook-secret-file", "no secret"));
        }
        Ok(())
    }
}

/// `--webhook-secret-file`'s secrets, as read last: a SIGHUP reads the file again, so a
/// new secret is added (and an old one retired) without a restart, and a bad file keeps
/// the secrets in use.
#[derive(Debug)]
pub struct WebhookSecrets {
    path: PathBuf,
    current: RwLock<Arc<Vec<Vec<u8>>>>,
}

// === impl WebhookSecrets ===

impl WebhookSecrets {
    /// The secrets in `path`, newest first.
    pub fn load(path: &Path) -> Result<WebhookSecrets, ConfigError> {
        let current = RwLock::new(Arc::new(read_secrets(path)?));
        Ok(WebhookSecrets { path: path.to_path_buf(), current })
    }

    /// The secrets deliveries are signed with now.
    pub fn current(&self) -> Arc<Vec<Vec<u8>>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the file again; on success the next delivery signs with what it holds, and the
    /// count is returned. On failure nothing changes.
    pub fn reload(&self) -> Result<usize, ConfigError> {
        let secrets = read_secrets(&self.path)?;
        let count = secrets.len();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(secrets);
        Ok(count)
    }
}

/// `url` without its credentials, query string and fragment (each replaced by a mark, so
/// a reader sees that something was there).
fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let host = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_string(),
    };
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let (path, extra) = tail.split_at(path_end);
    let query = if extra.starts_with('?') { "?***" } else { "" };
    format!("{scheme}://{host}{path}{query}")
}

/// `--webhook-events`: a comma-separated list of `/v1/events` types.
pub fn parse_events(list: &str) -> Result<[bool; EventKind::ALL.len()], ConfigError> {
    let mut wanted = [false; EventKind::ALL.len()];
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let kind: EventKind = word.parse().map_err(|e| ConfigError::new("--webhook-events", format!("{e}")))?;
        wanted[kind.index()] = true;
    }
    if !wanted.contains(&true) {
        return Err(ConfigError::new("--webhook-events", "no event type"));
    }
    Ok(wanted)
}

/// The secrets of `path`, a line each, newest first; blank lines are skipped.
fn read_secrets(path: &Path) -> Result<Vec<Vec<u8>>, ConfigError> {
    let flag = "--webhook-secret-file";
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(flag, format!("cannot read {}: {e}", path.display())))?;
    let mut secrets = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("{} line {}", path.display(), n + 1);
        let encoded = line
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or_else(|| ConfigError::new(flag, format!("{}: a secret starts with {SECRET_PREFIX}", at())))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| ConfigError::new(flag, format!("{}: not base64 after {SECRET_PREFIX}: {e}", at())))?;
        if !SECRET_BYTES.contains(&bytes.len()) {
            let why = format!("{}: {} bytes; a secret has 24 to 64 random bytes", at(), bytes.len());
            return Err(ConfigError::new(flag, why));
        }
        secrets.push(bytes);
    }
    if secrets.is_empty() {
        return Err(ConfigError::new(flag, format!("{} holds no secret", path.display())));
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn logs_show_the_url_without_credentials_or_query() {
        for (url, shown) in [
            ("https://hooks.example.com/in", "https://hooks.example.com/in"),
            ("https://user:s3cret@hooks.example.com:8443/in?token=abc#x", "https://***@hooks.example.com:8443/in?***"),
            ("http://127.0.0.1:9/?key=1", "http://127.0.0.1:9/?***"),
            ("http://a@b@host/p", "http://***@host/p"),
            ("https://host?t=1", "https://host?***"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn secrets_are_read_newest_first_and_bad_ones_name_their_line() {
        let good = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 32]));
        let older = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([9u8; 24]));
        let f = file(&format!("{good}\n\n{older}\n"));
        let config = WebhookConfig::new("https://example.com/hook", f.path()).unwrap();
        assert_eq!(*config.secrets.current(), vec![vec![7u8; 32], vec![9u8; 24]]);
        for (text, says) in [
            ("", "holds no secret"),
            ("secret", "line 1: a secret starts with whsec_"),
            ("whsec_!!!", "line 1: not base64"),
            (
                &format!("{good}\nwhsec_{}", base64::engine::general_purpose::STANDARD.encode([1u8; 8])),
                "line 2: 8 bytes",
            ),
        ] {
            let f = file(text);
            let e = WebhookConfig::new("https://example.com/hook", f.path()).unwrap_err();
            assert_eq!(e.flag, "--webhook-secret-file");
            assert!(e.message.contains(says), "{text:?}: {e}");
        }
        let e = WebhookConfig::new("ftp://x", f.path()).unwrap_err();
        assert_eq!(e.flag, "--webhook-url");
    }
}
