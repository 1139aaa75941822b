//! The HTTP client of the gateway's own requests (webhook deliveries, JWKS and OIDC
//! discovery fetches): rustls with the system's roots, plus a private CA file when one is
//! given, and how a failed request is told apart (a timeout, TLS, anything else on the way).
//! One place, so both outbound uses trust the same way and report failures in the same words.

use std::path::Path;
use std::time::Duration;

/// What kind of failure a request that got no HTTP answer met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer within the client's timeout.
    Timeout,
    /// The TLS handshake failed (a certificate not trusted, a handshake refused).
    Tls,
    /// The connection was refused, reset or never made, or the answer broke off.
    Connect,
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// The CA file could not be read, or holds no certificate.
    #[error("{0}")]
    CaFile(String),
    /// The client itself (its TLS setup).
    #[error("{0}")]
    Client(String),
}

/// A client for requests of at most `timeout` each, following redirects as `redirect`
/// says, trusting the system's roots and the certificates of `ca_file` (PEM) if given, and
/// refusing plain `http` unless `allow_http`.
pub fn client(
    timeout: Duration,
    user_agent: String,
    ca_file: Option<&Path>,
    redirect: reqwest::redirect::Policy,
    allow_http: bool,
) -> Result<reqwest::Client, OutboundError> {
    let mut builder =
        reqwest::Client::builder().timeout(timeout).user_agent(user_agent).redirect(redirect).https_only(!allow_http);
    if let Some(path) = ca_file {
        let fail = |why: String| OutboundError::CaFile(format!("{}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| fail(e.to_string()))?;
        if certs.is_empty() {
            return Err(fail("no certificate".into()));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| OutboundError::Client(e.to_string()))
}

/// A failed request in words: the error and each cause it wraps, without the URL (which may
/// carry a secret in its query).
pub fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut why = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(error) = source {
        let text = error.to_string();
        if !why.ends_with(&text) {
            why.push_str(": ");
            why.push_str(&text);
        }
        source = error.source();
    }
    why
}

/// Which kind of failure `e` is.
pub fn failure(e: &reqwest::Error) -> Failure {
    if e.is_timeout() {
        return Failure::Timeout;
    }
    // rustls's errors (a certificate not trusted, a handshake refused) are somewhere in the
    // chain of a connect error.
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(error) = source {
        if error.is::<rustls::Error>() {
            return Failure::Tls;
        }
        // An io::Error's `source` skips the error it wraps (hyper-rustls wraps rustls's
        // error in two of them): the walk goes into the wrapped one instead.
        source = match error.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(wrapped) => Some(wrapped as &dyn std::error::Error),
            None => error.source(),
        };
    }
    Failure::Connect
}
