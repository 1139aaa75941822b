//! LOGIN tokens: `<expiry_unix_seconds>.<lowercase hex of HMAC-SHA256(secret, "<uid>.<expiry>")>`.
//!
//! Stateless, so any number of gateways sharing a secret accept the same tokens and an
//! application backend can mint them without talking to the gateway.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::AuthError;

type HmacSha256 = Hmac<Sha256>;

/// Hex digits of a SHA-256 MAC.
const MAC_HEX_LEN: usize = 64;

/// The shared secret; mints and checks tokens.
#[derive(Clone)]
pub struct Auth {
    secret: Vec<u8>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth(<secret>)")
    }
}

// === impl Auth ===

impl Auth {
    /// Tokens signed with `secret`.
    pub fn new(secret: impl Into<Vec<u8>>) -> Auth {
        Auth { secret: secret.into() }
    }

    /// A token for `uid` valid until `expiry_unix` (seconds since the Unix epoch).
    pub fn mint(&self, uid: u64, expiry_unix: u64) -> String {
        let mac = self.mac(uid, expiry_unix).finalize().into_bytes();
        format!("{expiry_unix}.{}", hex::encode(mac))
    }

    /// Checks `token` for `uid` at `now_unix`; the MAC comparison runs in constant time.
    pub fn verify(&self, uid: u64, token: &[u8], now_unix: u64) -> Result<(), AuthError> {
        let token = std::str::from_utf8(token).map_err(|_| AuthError::Malformed)?;
        let (expiry, mac_hex) = token.split_once('.').ok_or(AuthError::Malformed)?;
        let is_lower_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if mac_hex.len() != MAC_HEX_LEN || !is_lower_hex(mac_hex) {
            return Err(AuthError::Malformed);
        }
        if expiry.is_empty() || !expiry.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AuthError::Malformed);
        }
        let expiry: u64 = expiry.parse().map_err(|_| AuthError::Malformed)?;
        let claimed = hex::decode(mac_hex).map_err(|_| AuthError::Malformed)?;
        // Signature first: an expiry is only worth reading once it is known to be genuine.
        self.mac(uid, expiry).verify_slice(&claimed).map_err(|_| AuthError::BadSignature)?;
        if expiry <= now_unix {
            return Err(AuthError::Expired { expiry, now: now_unix });
        }
        Ok(())
    }

    fn mac(&self, uid: u64, expiry_unix: u64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
        mac.update(format!("{uid}.{expiry_unix}").as_bytes());
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_token_verifies_until_it_expires() {
        let auth = Auth::new("s3cret");
        let token = auth.mint(42, 1_000);
        assert!(token.starts_with("1000."));
        assert_eq!(auth.verify(42, token.as_bytes(), 999), Ok(()));
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
}
