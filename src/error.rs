//! Typed errors for the configuration (a frame's and a token's are in `proto`); `anyhow`
//! only wraps them in `main`.

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
