//! Typed errors for tokens and the configuration (a frame's are in `proto`); `anyhow` only wraps them in `main`.

/// Why a LOGIN token was refused; the client only sees BYE(auth_failed).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// Not `<expiry>.<64 lowercase hex digits>`.
    #[error("token is not <expiry_unix_seconds>.<hex hmac>")]
    Malformed,
    /// The expiry has passed.
    #[error("token expired at {expiry}, now is {now}")]
    Expired { expiry: u64, now: u64 },
    /// The MAC does not match the uid and expiry under any secret.
    #[error("token signature does not match")]
    BadSignature,
    /// The expiry lies further ahead than the maximum lifetime.
    #[error("token expiry {expiry} lies more than --max-token-ttl ({max_ttl_secs} s) ahead")]
    TooLong { expiry: u64, max_ttl_secs: u64 },
}

/// A configuration the gateway refuses to start with; names the flag at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{flag}: {message}")]
pub struct ConfigError {
    /// The command-line flag, such as `--timeout`.
    pub flag: &'static str,
    /// What is wrong with its value.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(flag: &'static str, message: impl Into<String>) -> ConfigError {
        ConfigError { flag, message: message.into() }
    }
}
