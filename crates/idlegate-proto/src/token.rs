//! LOGIN tokens: `<expiry_unix_seconds>.<lowercase hex of HMAC-SHA256(secret, "<uid>.<expiry>")>`.
//!
//! Stateless, so any number of gateways sharing a secret accept the same tokens and an
//! application backend can mint them without talking to the gateway.
//!
//! Several secrets may be active at once, newest first, for rotation: tokens are minted
//! with the newest and accepted under any. A token's expiry may lie at most the maximum
//! lifetime ahead (`--max-token-ttl`), so a leaked secret's tokens cannot outlive a
//! rotation by years. Each token has one spelling: the expiry in decimal without leading
//! zeros, the MAC in lowercase hex.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::AuthError;

type HmacSha256 = Hmac<Sha256>;

/// Hex digits of a SHA-256 MAC.
const MAC_HEX_LEN: usize = 64;

/// Default `--max-token-ttl`: a day, the longest a session token of a mobile app usually
/// lives before it is refreshed.
pub const DEFAULT_MAX_TOKEN_TTL_SECS: u64 = 24 * 3600;

/// The shared secrets; mints and checks tokens. Equal when they hold the same secrets in
/// the same order and the same TTL bound (a reload compares them).
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    /// Newest first; never empty.
    secrets: Vec<Vec<u8>>,
    max_ttl_secs: u64,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth(<secret>)")
    }
}

// === impl Auth ===

impl Auth {
    /// Tokens signed with `secret`, living at most [`DEFAULT_MAX_TOKEN_TTL_SECS`].
    pub fn new(secret: impl Into<Vec<u8>>) -> Auth {
        Auth { secrets: vec![secret.into()], max_ttl_secs: DEFAULT_MAX_TOKEN_TTL_SECS }
    }

    /// Tokens minted with the first of `secrets` and accepted under any (newest first, for
    /// rotation); `None` if there is none.
    pub fn rotating(secrets: impl IntoIterator<Item = Vec<u8>>) -> Option<Auth> {
        let secrets: Vec<Vec<u8>> = secrets.into_iter().collect();
        (!secrets.is_empty()).then_some(Auth { secrets, max_ttl_secs: DEFAULT_MAX_TOKEN_TTL_SECS })
    }

    /// Refuses tokens whose expiry lies more than `secs` ahead.
    pub fn with_max_ttl(mut self, secs: u64) -> Auth {
        self.max_ttl_secs = secs;
        self
    }

    /// A token for `uid` valid until `expiry_unix` (seconds since the Unix epoch), signed
    /// with the newest secret.
    pub fn mint(&self, uid: u64, expiry_unix: u64) -> String {
        let mac = mac(&self.secrets[0], uid, expiry_unix).finalize().into_bytes();
        format!("{expiry_unix}.{}", hex::encode(mac))
    }

    /// Checks `token` for `uid` at `now_unix` and returns its expiry (unix seconds); the MAC
    /// comparison runs in constant time.
    pub fn verify(&self, uid: u64, token: &[u8], now_unix: u64) -> Result<u64, AuthError> {
        let token = std::str::from_utf8(token).map_err(|_| AuthError::Malformed)?;
        let (expiry, mac_hex) = token.split_once('.').ok_or(AuthError::Malformed)?;
        let is_lower_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if mac_hex.len() != MAC_HEX_LEN || !is_lower_hex(mac_hex) {
            return Err(AuthError::Malformed);
        }
        // One spelling per token: no sign, no leading zeros.
        if expiry.is_empty() || !expiry.bytes().all(|b| b.is_ascii_digit()) || expiry.starts_with('0') {
            return Err(AuthError::Malformed);
        }
        let expiry: u64 = expiry.parse().map_err(|_| AuthError::Malformed)?;
        let claimed = hex::decode(mac_hex).map_err(|_| AuthError::Malformed)?;
        // Signature first: an expiry is only worth reading once it is known to be genuine.
        // Every secret is tried, so the time taken says nothing about which one matched.
        let genuine = self
            .secrets
            .iter()
            .fold(false, |found, secret| mac(secret, uid, expiry).verify_slice(&claimed).is_ok() | found);
        if !genuine {
            return Err(AuthError::BadSignature);
        }
        if expiry <= now_unix {
            return Err(AuthError::Expired { expiry, now: now_unix });
        }
        if expiry - now_unix > self.max_ttl_secs {
            return Err(AuthError::TooLong { expiry, max_ttl_secs: self.max_ttl_secs });
        }
        Ok(expiry)
    }
}

/// Seconds since the Unix epoch now: what token expiries are compared with (wall-clock
/// time, unlike the gateway's ticks).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn mac(secret: &[u8], uid: u64, expiry_unix: u64) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(format!("{uid}.{expiry_unix}").as_bytes());
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_token_verifies_until_it_expires() {
        let auth = Auth::new("s3cret");
        let token = auth.mint(42, 1_000);
        assert!(token.starts_with("1000."));
        assert_eq!(auth.verify(42, token.as_bytes(), 999), Ok(1_000));
        // Another spelling of the same expiry is not the same token.
        let padded = format!("0{token}");
        assert_eq!(auth.verify(42, padded.as_bytes(), 999), Err(AuthError::Malformed));
        assert_eq!(auth.verify(42, token.as_bytes(), 1_000), Err(AuthError::Expired { expiry: 1_000, now: 1_000 }));
    }

    #[test]
    fn known_vector_matches_an_independent_hmac() {
        // printf '7.1700000000' | openssl dgst -sha256 -hmac key
        let token = Auth::new("key").mint(7, 1_700_000_000);
        assert_eq!(token, "1700000000.eb01991d73343211a11b0f2da0b5aeb411a6f45b24569de6be8cb465e3cfa52c");
    }

    #[test]
    fn wrong_uid_secret_or_shape_fails() {
        let auth = Auth::new("s3cret");
        let token = auth.mint(42, 1_000);
        assert_eq!(auth.verify(43, token.as_bytes(), 0), Err(AuthError::BadSignature));
        assert_eq!(Auth::new("other").verify(42, token.as_bytes(), 0), Err(AuthError::BadSignature));
        let upper = token.to_uppercase();
        for bad in ["", "1000", "1000.", "x.00", &upper, "-1.aa", "\u{ff}"] {
            assert_eq!(auth.verify(42, bad.as_bytes(), 0), Err(AuthError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn a_token_may_live_at_most_the_maximum_lifetime() {
        let auth = Auth::new("s3cret").with_max_ttl(3600);
        assert_eq!(auth.verify(1, auth.mint(1, 1_000 + 3600).as_bytes(), 1_000), Ok(1_000 + 3600));
        let far = auth.mint(1, u64::MAX);
        assert_eq!(
            auth.verify(1, far.as_bytes(), 1_000),
            Err(AuthError::TooLong { expiry: u64::MAX, max_ttl_secs: 3600 })
        );
    }

    #[test]
    fn rotation_mints_with_the_newest_and_accepts_any() {
        let old = Auth::new("old");
        let both = Auth::rotating([b"new".to_vec(), b"old".to_vec()]).unwrap();
        assert_eq!(both.verify(5, old.mint(5, 2_000).as_bytes(), 1_000), Ok(2_000), "tokens of the older secret");
        let minted = both.mint(5, 2_000);
        assert_eq!(minted, Auth::new("new").mint(5, 2_000), "minted with the newest");
        assert_eq!(old.verify(5, minted.as_bytes(), 1_000), Err(AuthError::BadSignature));
        assert!(Auth::rotating(Vec::<Vec<u8>>::new()).is_none());
    }
}
