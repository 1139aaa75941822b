//! JWT logins (`--jwt-key-file`, `--jwt-secret-file` and the `--jwt-*` checks): the keys a
//! backend's identity provider signs with, and the check of a LOGIN's token against them.
//!
//! Verification is `jsonwebtoken`'s, its signatures checked by `ring` (`jwt_ring.rs`: the
//! crate's own `ring` backend is gone from its current versions, its pure-Rust one is
//! several times slower, and `aws-lc-rs` would add a C build to every fresh machine). This file decides which keys a token may be checked with: only keys
//! whose type fits the token's `alg` (an HS256 token is never checked against an RSA
//! public key's bytes: the RS/HS confusion), the one named by `kid` when the token names
//! one, and never `alg: none` (no such algorithm exists for the crate). Then the claims:
//! `exp` required, `nbf` and `iat` with the leeway, `iss` and `aud` when configured, and
//! the uid claim, which must name the LOGIN's uid.
//!
//! Keys are read at start (a bad file is a configuration error naming its flag) and again
//! on SIGHUP ([`JwtAuth::reload`]): on any error the keys in use stay. Keys fetched from
//! the identity provider's URL (`jwks/`, `--jwt-jwks-url`) sit beside the files' and are
//! judged by the same rules ([`JwtAuth::take_jwks`]); a failed fetch keeps the last good
//! set. A token naming a `kid` no key has tells the fetcher ([`JwtAuth::on_unknown_kid`]),
//! which decides whether to fetch again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, KeyOperations, PublicKeyUse};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::error::ConfigError;

/// Default `--jwt-leeway`: the clock skew between an identity provider and a gateway that
/// `nbf`, `iat` and `exp` forgive.
pub const DEFAULT_JWT_LEEWAY: Duration = Duration::from_secs(30);

/// Default `--jwt-uid-claim`.
pub const DEFAULT_JWT_UID_CLAIM: &str = "sub";

/// Most bytes of JSON the claims named by `--jwt-claims-to-events` may take in a session's
/// events: every `online` and `offline` event of the session (and a cluster's copy of them in
/// Redis) carries them, so an identity provider's large claims must not multiply there. A
/// session whose claims are larger logs in, its events without them (counted).
pub const MAX_EVENT_CLAIMS_BYTES: usize = 1024;

/// The DER of the P-256 curve's OID (1.2.840.10045.3.1.7), as an EC public key names it.
const P256_OID: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];

/// The DER of the P-384 curve's OID (1.3.132.0.34).
const P384_OID: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];

/// The DER of Ed25519's OID (1.3.101.112).
const ED25519_OID: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];

/// Shortest HMAC secret taken: RFC 7518 3.2 requires a key at least as long as the hash's
/// output, 32 bytes for HS256; a shorter one is guessable offline from any one token.
const MIN_HMAC_SECRET_BYTES: usize = 32;

/// Smallest RSA modulus taken (NIST SP 800-131A: 2048 bits since 2014).
const MIN_RSA_BITS: usize = 2048;

/// Length of an Ed25519 public key (RFC 8037): any other makes no key, and the signature
/// library must never be handed one.
const ED25519_KEY_BYTES: usize = 32;

/// An Ed25519 SubjectPublicKeyInfo in DER: 12 bytes of structure and the key.
const ED25519_SPKI_BYTES: usize = 12 + ED25519_KEY_BYTES;

/// Most keys a token that names no `kid` is checked against: each check of a refused token
/// costs a signature verification before anyone is authenticated. Providers with more keys
/// of one type name them by `kid`, as every JWKS-publishing provider does.
pub const MAX_KEYS_WITHOUT_KID: usize = 4;

const RSA_ALGS: &[Algorithm] =
    &[Algorithm::RS256, Algorithm::RS384, Algorithm::RS512, Algorithm::PS256, Algorithm::PS384, Algorithm::PS512];
const HMAC_ALGS: &[Algorithm] = &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];

/// What the checks are (all but the keys).
#[derive(Debug, Clone)]
pub struct JwtRules {
    pub leeway: Duration,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub uid_claim: String,
    /// `--max-token-ttl`: a token whose `exp` lies further ahead is refused.
    pub max_ttl: Duration,
    /// `--jwt-claims-to-events`: the claims a session's events carry, as the token had them.
    pub claims_to_events: Vec<String>,
    /// `--jwt-timeout-cap-claim`: the claim (whole seconds) that caps the timeout its
    /// session may get, if any.
    pub timeout_cap_claim: Option<String>,
    /// `--jwt-watch-claim`: the claim (an array of uids) that lists whom its session may
    /// watch under `--watch-policy listed`, if any.
    pub watch_claim: Option<String>,
}

impl Default for JwtRules {
    fn default() -> JwtRules {
        JwtRules {
            leeway: DEFAULT_JWT_LEEWAY,
            issuer: None,
            audience: None,
            uid_claim: DEFAULT_JWT_UID_CLAIM.into(),
            max_ttl: Duration::from_secs(crate::proto::DEFAULT_MAX_TOKEN_TTL_SECS),
            claims_to_events: Vec::new(),
            timeout_cap_claim: None,
            watch_claim: None,
        }
    }
}

/// One verification key: its `kid` if it has one, and the algorithms it may check.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

/// Why a JWT was refused: each says which check failed, never what the token held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("JWT malformed")]
    Malformed,
    #[error("JWT algorithm refused: {0}")]
    Algorithm(String),
    #[error("JWT kid unknown")]
    UnknownKid,
    #[error("JWT signature did not verify")]
    BadSignature,
    #[error("JWT expired (exp)")]
    Expired,
    #[error("JWT has no exp")]
    NoExpiry,
    #[error("JWT not yet valid ({0})")]
    NotYetValid(&'static str),
    #[error("JWT issuer (iss) is not --jwt-issuer")]
    Issuer,
    #[error("JWT audience (aud) is not --jwt-audience")]
    Audience,
    #[error("JWT uid claim {0:?} missing or not a decimal u64")]
    NoUid(String),
    #[error("JWT uid claim {0:?} names another uid")]
    UidMismatch(String),
    #[error("JWT exp too far ahead (--max-token-ttl)")]
    TooLong,
    #[error("JWT header names critical extensions (crit) this gateway does not understand")]
    Critical,
    #[error("JWT claim {0} is not a NumericDate")]
    NotADate(&'static str),
    #[error("JWT timeout cap claim {0:?} is not a whole number of seconds")]
    BadTimeoutCap(String),
    /// The `--jwt-watch-claim` claim is not an array of uids (numbers, or strings of
    /// digits).
    #[error("JWT watch claim {0:?} is not an array of uids")]
    BadWatchClaim(String),
    #[error("JWT keys not fetched yet (--jwt-jwks-optional)")]
    NoKeys,
}

/// A token that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedJwt {
    /// Its `exp`, unix seconds.
    pub exp: u64,
    /// The claims `--jwt-claims-to-events` names that it has, as a JSON object: `None` when
    /// it has none of them, or when they take more than [`MAX_EVENT_CLAIMS_BYTES`].
    pub claims: Option<String>,
    /// Its claims were left out for taking more than [`MAX_EVENT_CLAIMS_BYTES`].
    pub claims_too_large: bool,
    /// The timeout cap its `--jwt-timeout-cap-claim` says, in seconds, if it has one.
    pub timeout_cap_s: Option<u64>,
    /// The uids its `--jwt-watch-claim` lists, sorted, if it has the claim.
    pub watch: Option<Vec<u64>>,
}

/// Where the keys in use came from and how the last fetch of the URL's went, for the
/// status page and `/status.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeysStatus {
    /// Keys and secrets in use, from every source.
    pub keys: usize,
    /// Of them, read from `--jwt-key-file` and `--jwt-secret-file`.
    pub file_keys: usize,
    /// The JWKS document's URL, when keys are fetched (after discovery, the one the issuer
    /// named).
    pub url: Option<String>,
    /// When the keys of the URL in use were fetched, unix ms (`None`: not yet).
    pub fetched_unix_ms: Option<u64>,
    /// When a fetch was last tried, unix ms.
    pub tried_unix_ms: Option<u64>,
    /// Why the last fetch failed, if it did (cleared by a good one).
    pub last_error: Option<String>,
}

/// The keys and the checks; see the module documentation.
pub struct JwtAuth {
    key_file: Option<PathBuf>,
    secret_file: Option<PathBuf>,
    rules: JwtRules,
    /// Every key in use: the files', then the URL's; rebuilt whenever either changes.
    keys: RwLock<Arc<Vec<Key>>>,
    files: RwLock<Arc<Vec<Key>>>,
    /// Keys by URL, when `--jwt-jwks-url` or `--jwt-issuer-url` is set.
    remote: Option<Remote>,
}

/// The URL's keys, how their fetching goes, and who to tell of an unknown `kid`.
struct Remote {
    keys: RwLock<Arc<Vec<Key>>>,
    status: Mutex<KeysStatus>,
    unknown_kid: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for JwtAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuth")
            .field("key_file", &self.key_file)
            .field("secret_file", &self.secret_file)
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

// === impl JwtAuth ===

impl JwtAuth {
    /// Reads the keys of `key_file` (a JWKS document or PEM public keys) and the secrets of
    /// `secret_file` (one a line); at least one of the two.
    pub fn load(
        key_file: Option<&Path>,
        secret_file: Option<&Path>,
        rules: JwtRules,
    ) -> Result<Arc<JwtAuth>, ConfigError> {
        JwtAuth::load_with(key_file, secret_file, false, rules)
    }

    /// As [`JwtAuth::load`], and with `by_url` keys fetched from the identity provider too
    /// (given by [`JwtAuth::take_jwks`]): then the files are optional, and until the first
    /// fetch the files' keys (perhaps none) are all there is.
    pub fn load_with(
        key_file: Option<&Path>,
        secret_file: Option<&Path>,
        by_url: bool,
        rules: JwtRules,
    ) -> Result<Arc<JwtAuth>, ConfigError> {
        crate::config::jwt_ring::install();
        let files = if by_url && key_file.is_none() && secret_file.is_none() {
            Vec::new()
        } else {
            read_keys(key_file, secret_file)?
        };
        let files = Arc::new(files);
        let remote = by_url.then(|| Remote {
            keys: RwLock::new(Arc::new(Vec::new())),
            status: Mutex::new(KeysStatus::default()),
            unknown_kid: OnceLock::new(),
        });
        Ok(Arc::new(JwtAuth {
            key_file: key_file.map(Path::to_path_buf),
            secret_file: secret_file.map(Path::to_path_buf),
            rules,
            keys: RwLock::new(files.clone()),
            files: RwLock::new(files),
            remote,
        }))
    }

    /// Reads the files again; on any error the keys in use stay. Returns how many keys are
    /// in use now. Without files (keys by URL alone) there is nothing to read.
    pub fn reload(&self) -> Result<usize, ConfigError> {
        if self.key_file.is_some() || self.secret_file.is_some() {
            let fresh = read_keys(self.key_file.as_deref(), self.secret_file.as_deref())?;
            *self.files.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
            self.combine();
        }
        Ok(self.key_count())
    }

    /// The keys in use, rebuilt from the files' and the URL's. Read under the lock it
    /// writes, so a SIGHUP reload and a fetch landing together both end up in the set: the
    /// later rebuild reads what the earlier one wrote.
    fn combine(&self) {
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<Key> = self.files.read().unwrap_or_else(PoisonError::into_inner).as_ref().clone();
        if let Some(remote) = &self.remote {
            all.extend(remote.keys.read().unwrap_or_else(PoisonError::into_inner).iter().cloned());
        }
        *keys = Arc::new(all);
    }

    /// Takes the keys of a JWKS document fetched from `url` at `now_ms` (unix), judged as a
    /// key file's are: the set in use is replaced only by a valid one. Returns how many
    /// keys it holds, or why it was refused (the keys in use stay).
    pub fn take_jwks(&self, url: &str, text: &str, now_ms: u64) -> Result<usize, String> {
        let Some(remote) = &self.remote else { return Err("no keys by URL are configured".into()) };
        let keys = jwks(text)?;
        let n = keys.len();
        *remote.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(keys);
        self.combine();
        let mut status = remote.status.lock().unwrap_or_else(PoisonError::into_inner);
        status.url = Some(url.to_string());
        status.fetched_unix_ms = Some(now_ms);
        status.tried_unix_ms = Some(now_ms);
        status.last_error = None;
        Ok(n)
    }

    /// Records a fetch that failed at `now_ms` (unix) for `why`; the keys in use stay.
    pub fn fetch_failed(&self, url: Option<&str>, why: &str, now_ms: u64) {
        if let Some(remote) = &self.remote {
            let mut status = remote.status.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(url) = url {
                status.url = Some(url.to_string());
            }
            status.tried_unix_ms = Some(now_ms);
            status.last_error = Some(why.to_string());
        }
    }

    /// When the URL's keys in use were fetched, unix ms; `None` before the first fetch (or
    /// without keys by URL).
    pub fn fetched_unix_ms(&self) -> Option<u64> {
        let remote = self.remote.as_ref()?;
        remote.status.lock().unwrap_or_else(PoisonError::into_inner).fetched_unix_ms
    }

    /// Calls `hook` whenever a token names a `kid` no key has (keys by URL only): the
    /// fetcher's cue, which it rate-limits. Set once.
    pub fn on_unknown_kid(&self, hook: Box<dyn Fn() + Send + Sync>) {
        if let Some(remote) = &self.remote {
            let _ = remote.unknown_kid.set(hook);
        }
    }

    /// Where the keys came from and how fetching them goes.
    pub fn status(&self) -> KeysStatus {
        let keys = self.key_count();
        let file_keys = self.files.read().unwrap_or_else(PoisonError::into_inner).len();
        let mut status = match &self.remote {
            Some(remote) => remote.status.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            None => KeysStatus::default(),
        };
        status.keys = keys;
        status.file_keys = file_keys;
        status
    }

    /// Keys and secrets in use.
    pub fn key_count(&self) -> usize {
        self.keys.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether `token` has a JWT's compact form (three base64url parts): such a token is
    /// checked here, any other as an HMAC token.
    pub fn looks_like_jwt(token: &[u8]) -> bool {
        let b64url = |b: &u8| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_';
        token.iter().filter(|&&b| b == b'.').count() == 2 && token.iter().all(|b| *b == b'.' || b64url(b))
    }

    /// `--jwt-leeway`: a token is taken until this long after its `exp`.
    pub fn leeway(&self) -> Duration {
        self.rules.leeway
    }

    /// Checks `token` for `uid` at `now_unix`.
    pub fn verify(&self, uid: u64, token: &[u8], now_unix: u64) -> Result<VerifiedJwt, JwtError> {
        let token = std::str::from_utf8(token).map_err(|_| JwtError::Malformed)?;
        let header = decode_header(token).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidAlgorithmName | jsonwebtoken::errors::ErrorKind::Json(_) => {
                JwtError::Algorithm("not one of RS, PS, ES, EdDSA or HS (never none)".into())
            }
            _ => JwtError::Malformed,
        })?;
        // RFC 7515 4.1.11: a recipient that does not understand an extension `crit` lists
        // must refuse the token; this gateway understands none.
        if names_critical(token) {
            return Err(JwtError::Critical);
        }
        let alg = header.alg;
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner).clone();
        if keys.is_empty() {
            // Keys by URL, none fetched yet (`--jwt-jwks-optional`): the fetcher is trying.
            self.unknown_kid();
            return Err(JwtError::NoKeys);
        }
        let fitting: Vec<&Key> = keys.iter().filter(|k| k.algorithms.contains(&alg)).collect();
        if fitting.is_empty() {
            // A provider that rotated to a key of another type: its `kid` is new too.
            if header.kid.as_ref().is_some_and(|kid| !keys.iter().any(|k| k.kid.as_ref() == Some(kid))) {
                self.unknown_kid();
            }
            return Err(JwtError::Algorithm(format!("{alg:?} fits no configured key")));
        }
        let candidates: Vec<&Key> = match &header.kid {
            Some(kid) => {
                let named: Vec<&Key> = keys.iter().filter(|k| k.kid.as_deref() == Some(kid)).collect();
                if named.is_empty() {
                    // Perhaps a key the provider has published since the last fetch.
                    self.unknown_kid();
                    return Err(JwtError::UnknownKid);
                }
                named.into_iter().filter(|k| k.algorithms.contains(&alg)).collect()
            }
            None => fitting.into_iter().take(MAX_KEYS_WITHOUT_KID).collect(),
        };
        if candidates.is_empty() {
            return Err(JwtError::Algorithm(format!("{alg:?} does not fit the key its kid names")));
        }
        let mut validation = Validation::new(alg);
        // `exp` and `nbf` are judged below against `now_unix`, the time the caller gives (the
        // crate would read the system clock itself): one clock for every check.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.set_required_spec_claims(&["exp"]);
        match &self.rules.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                validation.required_spec_claims.insert("aud".into());
            }
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &self.rules.issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        let mut last = JwtError::BadSignature;
        let mut claims = None;
        for key in candidates {
            match decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) => {
                    use jsonwebtoken::errors::ErrorKind as K;
                    last = match e.kind() {
                        K::ExpiredSignature => JwtError::Expired,
                        K::ImmatureSignature => JwtError::NotYetValid("nbf"),
                        K::InvalidIssuer => JwtError::Issuer,
                        K::InvalidAudience => JwtError::Audience,
                        K::MissingRequiredClaim(c) if c == "exp" => JwtError::NoExpiry,
                        K::MissingRequiredClaim(c) if c == "iss" => JwtError::Issuer,
                        K::MissingRequiredClaim(c) if c == "aud" => JwtError::Audience,
                        K::InvalidSignature | K::InvalidEcdsaKey | K::InvalidEddsaKey | K::InvalidRsaKey(_) => {
                            JwtError::BadSignature
                        }
                        K::InvalidAlgorithm => JwtError::Algorithm(format!("{alg:?} does not fit the key")),
                        _ => JwtError::Malformed,
                    };
                    // A claim failed on a genuine signature: no other key would change that.
                    if !matches!(last, JwtError::BadSignature) {
                        return Err(last);
                    }
                }
            }
        }
        let claims = claims.ok_or(last)?;
        // NumericDate may carry a fraction (RFC 7519 §2); whole seconds are what count.
        let number = |name: &'static str| match claims.get(name) {
            None => Ok(None),
            Some(v) => v.as_u64().or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)).map(Some).ok_or(
                // Of another JSON type: refused, never taken as absent.
                JwtError::NotADate(name),
            ),
        };
        let exp = number("exp")?.ok_or(JwtError::NoExpiry)?;
        let leeway = self.rules.leeway.as_secs();
        // RFC 7519 4.1.4: valid only before `exp`; the leeway forgives a skewed clock.
        if now_unix >= exp.saturating_add(leeway) {
            return Err(JwtError::Expired);
        }
        if number("nbf")?.is_some_and(|nbf| nbf > now_unix.saturating_add(leeway)) {
            return Err(JwtError::NotYetValid("nbf"));
        }
        if number("iat")?.is_some_and(|iat| iat > now_unix.saturating_add(leeway)) {
            return Err(JwtError::NotYetValid("iat"));
        }
        if exp > now_unix + self.rules.max_ttl.as_secs() {
            return Err(JwtError::TooLong);
        }
        let claim = &self.rules.uid_claim;
        let named = match claims.get(claim) {
            Some(Value::String(text)) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse::<u64>().ok()
            }
            Some(Value::Number(n)) => n.as_u64(),
            _ => None,
        };
        match named {
            None => Err(JwtError::NoUid(claim.clone())),
            Some(named) if named != uid => Err(JwtError::UidMismatch(claim.clone())),
            Some(_) => {
                let timeout_cap_s = match &self.rules.timeout_cap_claim {
                    None => None,
                    Some(name) => match claims.get(name) {
                        None => None,
                        // Refused, never taken as absent: a cap the identity provider meant
                        // would otherwise be lifted.
                        Some(v) => Some(v.as_u64().ok_or_else(|| JwtError::BadTimeoutCap(name.clone()))?),
                    },
                };
                let watch = match &self.rules.watch_claim {
                    None => None,
                    Some(name) => match claims.get(name) {
                        None => None,
                        // Refused, never taken as absent or in part: a list the identity
                        // provider meant would otherwise differ from what is enforced.
                        Some(v) => Some(uid_list(v).ok_or_else(|| JwtError::BadWatchClaim(name.clone()))?),
                    },
                };
                let (claims, claims_too_large) = self.event_claims(&claims);
                Ok(VerifiedJwt { exp, claims, claims_too_large, timeout_cap_s, watch })
            }
        }
    }

    /// Tells the fetcher of a `kid` (or a first key) it does not have.
    fn unknown_kid(&self) {
        if let Some(hook) = self.remote.as_ref().and_then(|r| r.unknown_kid.get()) {
            hook();
        }
    }

    /// The claims `--jwt-claims-to-events` names, as a JSON object (in the order named), and
    /// whether they were left out for their size.
    fn event_claims(&self, claims: &Map<String, Value>) -> (Option<String>, bool) {
        let picked: Map<String, Value> = self
            .rules
            .claims_to_events
            .iter()
            .filter_map(|name| claims.get(name).map(|value| (name.clone(), value.clone())))
            .collect();
        if picked.is_empty() {
            return (None, false);
        }
        let json = Value::Object(picked).to_string();
        if json.len() > MAX_EVENT_CLAIMS_BYTES {
            return (None, true);
        }
        (Some(json), false)
    }
}

/// Every key of the two files.
/// A JSON array of uids (numbers, or strings of digits, as the uid claim may be), sorted and
/// without repeats; `None` if it is anything else.
fn uid_list(value: &Value) -> Option<Vec<u64>> {
    let mut uids = value
        .as_array()?
        .iter()
        .map(|v| match v {
            Value::Number(n) => n.as_u64(),
            Value::String(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
            _ => None,
        })
        .collect::<Option<Vec<u64>>>()?;
    uids.sort_unstable();
    uids.dedup();
    Some(uids)
}

fn read_keys(key_file: Option<&Path>, secret_file: Option<&Path>) -> Result<Vec<Key>, ConfigError> {
    let mut keys = Vec::new();
    if let Some(path) = key_file {
        let fail = |why: String| ConfigError::new("--jwt-key-file", format!("{}: {why}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let found = if text.trim_start().starts_with('{') { jwks(&text) } else { pem_keys(&text) }.map_err(fail)?;
        keys.extend(found);
    }
    if let Some(path) = secret_file {
        let fail = |why: &str| ConfigError::new("--jwt-secret-file", format!("{}: {why}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| fail(&e.to_string()))?;
        let before = keys.len();
        for (n, line) in text.lines().map(str::trim_end).enumerate().filter(|(_, l)| !l.is_empty()) {
            if line.len() < MIN_HMAC_SECRET_BYTES {
                let why = format!(
                    "line {}: {} bytes; an HMAC secret has at least {MIN_HMAC_SECRET_BYTES}",
                    n + 1,
                    line.len()
                );
                return Err(fail(&why));
            }
            keys.push(Key {
                kid: None,
                algorithms: HMAC_ALGS.to_vec(),
                key: DecodingKey::from_secret(line.as_bytes()),
            });
        }
        if keys.len() == before {
            return Err(fail("no secret in it"));
        }
    }
    if keys.is_empty() {
        return Err(ConfigError::new("--jwt-key-file", "no key in it"));
    }
    Ok(keys)
}

/// The keys of a JWKS document (`{"keys":[...]}`).
fn jwks(text: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        // Keys for encryption sit beside signing keys in many providers' sets (Keycloak's
        // RSA-OAEP key among them): skipped, never trusted, never a reason to refuse the set.
        let signs = match &jwk.common.public_key_use {
            None | Some(PublicKeyUse::Signature) => true,
            Some(_) => false,
        };
        let verifies = jwk.common.key_operations.as_ref().is_none_or(|ops| ops.contains(&KeyOperations::Verify));
        let non_signing = jwk.common.key_algorithm.is_some_and(|alg| algorithm_of(alg).is_none());
        if !signs || !verifies || non_signing {
            tracing::warn!(
                key = i,
                kid = jwk.common.key_id.as_deref().unwrap_or(""),
                "JWT keys: a key not for verifying signatures (its use, key_ops or alg) is skipped"
            );
            continue;
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {i}: {e}"))?;
        let by_type = match &jwk.algorithm {
            AlgorithmParameters::RSA(rsa) => {
                let bits = bits(&base64url(&rsa.n).map_err(|e| format!("key {i}: n: {e}"))?);
                if bits < MIN_RSA_BITS {
                    return Err(format!("key {i}: an RSA key of {bits} bits; at least {MIN_RSA_BITS}"));
                }
                RSA_ALGS.to_vec()
            }
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => vec![Algorithm::ES256],
                EllipticCurve::P384 => vec![Algorithm::ES384],
                _ => return Err(format!("key {i}: curve {:?} is not P-256 or P-384", ec.curve)),
            },
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                let len = base64url_len(&okp.x).map_err(|e| format!("key {i}: x: {e}"))?;
                if len != ED25519_KEY_BYTES {
                    return Err(format!("key {i}: an Ed25519 key of {len} bytes; it has {ED25519_KEY_BYTES}"));
                }
                vec![Algorithm::EdDSA]
            }
            AlgorithmParameters::OctetKeyPair(_) => return Err(format!("key {i}: only Ed25519 key pairs")),
            AlgorithmParameters::OctetKey(oct) => {
                let len = base64url_len(&oct.value).map_err(|e| format!("key {i}: k: {e}"))?;
                if len < MIN_HMAC_SECRET_BYTES {
                    return Err(format!("key {i}: an HMAC secret of {len} bytes; at least {MIN_HMAC_SECRET_BYTES}"));
                }
                HMAC_ALGS.to_vec()
            }
            _ => return Err(format!("key {i}: an unsupported key type")),
        };
        // A key that names its algorithm may check that one only.
        let algorithms = match jwk.common.key_algorithm.and_then(algorithm_of) {
            Some(alg) if by_type.contains(&alg) => vec![alg],
            Some(alg) => return Err(format!("key {i}: alg {alg:?} does not fit its key type")),
            None if jwk.common.key_algorithm.is_some() => return Err(format!("key {i}: not a signing algorithm")),
            None => by_type,
        };
        keys.push(Key { kid: jwk.common.key_id.clone(), algorithms, key });
    }
    if keys.is_empty() {
        return Err("no key in the set".into());
    }
    Ok(keys)
}

/// The public keys of PEM text: `PUBLIC KEY` (RSA, EC P-256/P-384, Ed25519) and
/// `RSA PUBLIC KEY` blocks, any number.
fn pem_keys(text: &str) -> Result<Vec<Key>, String> {
    let blocks = pem::parse_many(text).map_err(|e| format!("not PEM: {e}"))?;
    let mut keys = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let one = pem::encode(block);
        let (algorithms, key) = match block.tag() {
            "RSA PUBLIC KEY" => {
                let bits = rsa_bits(block.contents(), true).map_err(|e| format!("block {i}: {e}"))?;
                if bits < MIN_RSA_BITS {
                    return Err(format!("block {i}: an RSA key of {bits} bits; at least {MIN_RSA_BITS}"));
                }
                (RSA_ALGS.to_vec(), DecodingKey::from_rsa_pem(one.as_bytes()))
            }
            "PUBLIC KEY" => {
                let der = block.contents();
                if contains(der, ED25519_OID) {
                    if der.len() != ED25519_SPKI_BYTES {
                        return Err(format!("block {i}: an Ed25519 key of the wrong length"));
                    }
                    (vec![Algorithm::EdDSA], DecodingKey::from_ed_pem(one.as_bytes()))
                } else if contains(der, P256_OID) {
                    (vec![Algorithm::ES256], DecodingKey::from_ec_pem(one.as_bytes()))
                } else if contains(der, P384_OID) {
                    (vec![Algorithm::ES384], DecodingKey::from_ec_pem(one.as_bytes()))
                } else {
                    let bits = rsa_bits(der, false).map_err(|e| format!("block {i}: {e}"))?;
                    if bits < MIN_RSA_BITS {
                        return Err(format!("block {i}: an RSA key of {bits} bits; at least {MIN_RSA_BITS}"));
                    }
                    (RSA_ALGS.to_vec(), DecodingKey::from_rsa_pem(one.as_bytes()))
                }
            }
            other => return Err(format!("block {i} is a {other}, not a public key")),
        };
        let key = key.map_err(|e| format!("block {i}: {e}"))?;
        keys.push(Key { kid: None, algorithms, key });
    }
    if keys.is_empty() {
        return Err("no PEM block in it".into());
    }
    Ok(keys)
}

/// The modulus size in bits of an RSA public key's DER: PKCS#1 (`RSA PUBLIC KEY`) when
/// `pkcs1`, else a SubjectPublicKeyInfo (`PUBLIC KEY`).
///
/// Read as ASN.1 only (no size limits of the `rsa` crate's own key type, which stops at
/// 4,096 bits; the keys are verified by ring, which takes up to 8,192).
fn rsa_bits(der: &[u8], pkcs1: bool) -> Result<usize, String> {
    use rsa::pkcs1::der::Decode;
    let bad = |e: rsa::pkcs1::der::Error| format!("not an RSA public key: {e}");
    let pkcs1_der = if pkcs1 {
        der
    } else {
        rsa::pkcs8::SubjectPublicKeyInfoRef::from_der(der)
            .map_err(bad)?
            .subject_public_key
            .as_bytes()
            .ok_or("not an RSA public key: its bit string is not whole bytes")?
    };
    let key = rsa::pkcs1::RsaPublicKey::from_der(pkcs1_der).map_err(bad)?;
    Ok(bits(key.modulus.as_bytes()))
}

/// The size in bits of the big-endian unsigned integer `n`.
fn bits(n: &[u8]) -> usize {
    let leading = n.iter().take_while(|b| **b == 0).count();
    n.get(leading).map_or(0, |top| (n.len() - leading - 1) * 8 + (8 - top.leading_zeros() as usize))
}

/// Whether the JWS header of `token` (its first part) has a `crit` member.
fn names_critical(token: &str) -> bool {
    use base64::Engine;
    let first = token.split('.').next().unwrap_or("");
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(first.trim_end_matches('=')) else {
        return false;
    };
    serde_json::from_slice::<Map<String, Value>>(&json).is_ok_and(|header| header.contains_key("crit"))
}

/// A JWK's base64url member, decoded.
fn base64url(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|e| format!("not base64url: {e}"))
}

/// The decoded length of a JWK's base64url member.
fn base64url_len(text: &str) -> Result<usize, String> {
    base64url(text).map(|bytes| bytes.len())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The signing algorithm a JWK names, if it is one.
fn algorithm_of(alg: KeyAlgorithm) -> Option<Algorithm> {
    Some(match alg {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}
