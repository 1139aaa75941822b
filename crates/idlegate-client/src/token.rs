//! Where LOGIN tokens come from: asked before every login, so a token that expired while
//! the client was away is replaced rather than refused again, and before a session's token
//! expires, for a REFRESH over the live connection (a gateway with `--enforce-token-expiry`
//! ends a session whose token expired).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// Share of a token's lifetime before its expiry at which the client refreshes it: a tenth
/// leaves a 20-minute token two minutes to be replaced, time for a provider that must ask
/// a backend, or retry one that failed.
const REFRESH_SHARE: u32 = 10;

/// Shortest lead before expiry at which a token is refreshed: a round trip to the provider
/// and one to the gateway, on a slow mobile network, with room to spare.
pub const MIN_REFRESH_LEAD: Duration = Duration::from_secs(5);

/// Shortest time between two refreshes, whatever the tokens say: a provider that hands out
/// tokens about to expire does not make the client refresh in a loop.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// An error from a token provider; the client reports it and tries again after its backoff.
pub type TokenError = Box<dyn std::error::Error + Send + Sync>;

/// A future yielding a token.
pub type TokenFuture = Pin<Box<dyn Future<Output = Result<String, TokenError>> + Send>>;

/// Gives the token of each LOGIN.
///
/// `refresh` is true when the gateway refused the previous one (BYE(auth_failed): expired,
/// or signed with a retired secret): a provider that caches should fetch a new one. Any
/// `Fn(u64, bool) -> impl Future<Output = Result<String, TokenError>>` is one:
///
/// ```
/// # use idlegate_client::TokenError;
/// let provider = |uid: u64, refresh: bool| async move {
///     // Ask the backend for a token of `uid`, bypassing any cache when `refresh`.
///     Ok::<_, TokenError>(format!("token-for-{uid}"))
/// };
/// # let _ = idlegate_client::Options::new(7).token_provider(provider);
/// ```
pub trait TokenProvider: Send + Sync + 'static {
    /// The token of the next LOGIN (or REFRESH) of `uid`.
    fn token(&self, uid: u64, refresh: bool) -> TokenFuture;

    /// When `token` expires, unix seconds: the client sends a REFRESH about a tenth of its
    /// lifetime before then (at least [`MIN_REFRESH_LEAD`]). By default read from the token
    /// itself, without verifying it: a JWT's `exp`, or an idlegate HMAC token's expiry. A
    /// provider of tokens that carry no expiry the client can read says it here; `None`
    /// never refreshes, and the gateway's `REFRESHED` answers then keep it going.
    fn expiry(&self, token: &str) -> Option<u64> {
        read_expiry(token)
    }
}

/// The expiry a token carries, unix seconds, read without verifying it: a JWT's `exp` (a
/// number, its fraction dropped), or the `<expiry>` of an idlegate `<expiry>.<mac>` token.
pub fn read_expiry(token: &str) -> Option<u64> {
    let parts: Vec<&str> = token.split('.').collect();
    match parts.as_slice() {
        [_, payload, _] => {
            let json = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
            let claims: serde_json::Value = serde_json::from_slice(&json).ok()?;
            let exp = &claims["exp"];
            exp.as_u64().or_else(|| exp.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        }
        [expiry, mac] if !mac.is_empty() && mac.bytes().all(|b| b.is_ascii_hexdigit()) => expiry.parse().ok(),
        _ => None,
    }
}

/// How long after `now_ms` (unix milliseconds) to refresh a token expiring at `expires`
/// (unix seconds), learnt at `now_ms`: a tenth of what is left, at least
/// [`MIN_REFRESH_LEAD`] before the expiry, never sooner than [`MIN_REFRESH_INTERVAL`].
pub(crate) fn refresh_delay(expires: u64, now_ms: u64) -> Duration {
    let left = Duration::from_millis(expires.saturating_mul(1000).saturating_sub(now_ms));
    let lead = (left / REFRESH_SHARE).max(MIN_REFRESH_LEAD);
    left.saturating_sub(lead).max(MIN_REFRESH_INTERVAL)
}

impl<F, Fut> TokenProvider for F
where
    F: Fn(u64, bool) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<String, TokenError>> + Send + 'static,
{
    fn token(&self, uid: u64, refresh: bool) -> TokenFuture {
        Box::pin(self(uid, refresh))
    }
}

/// The same token every time (or none, for a gateway without `--auth-secret`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Fixed(pub String);

impl TokenProvider for Fixed {
    fn token(&self, _uid: u64, _refresh: bool) -> TokenFuture {
        let token = self.0.clone();
        Box::pin(async move { Ok(token) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_are_read_from_jwts_and_hmac_tokens() {
        // {"alg":"HS256"} . {"sub":"7","exp":1700000020} . a signature it does not check.
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI3IiwiZXhwIjoxNzAwMDAwMDIwfQ.c2ln";
        assert_eq!(read_expiry(jwt), Some(1_700_000_020));
        let hmac = format!("1700000020.{}", "ab".repeat(32));
        assert_eq!(read_expiry(&hmac), Some(1_700_000_020));
        assert_eq!(read_expiry("opaque"), None);
        assert_eq!(read_expiry("a.b.c"), None);
    }

    #[test]
    fn a_token_is_refreshed_a_tenth_of_its_life_before_expiry_and_at_least_five_seconds() {
        let now = 1_000_000_000_000;
        // 20 s left: 5 s ahead (a tenth would be 2 s).
        assert_eq!(refresh_delay(1_000_000_020, now), Duration::from_secs(15));
        // An hour left: six minutes ahead.
        assert_eq!(refresh_delay(1_000_003_600, now), Duration::from_secs(3240));
        // About to expire, or expired: soon, but not in a loop.
        assert_eq!(refresh_delay(1_000_000_003, now), MIN_REFRESH_INTERVAL);
        assert_eq!(refresh_delay(999_999_000, now), MIN_REFRESH_INTERVAL);
    }
}
