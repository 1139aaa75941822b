//! How a client behaves: who it logs in as, where its tokens come from, how it backs off,
//! how much it holds while offline, whom it trusts.

use std::sync::Arc;
use std::time::Duration;

use idlegate_proto::Device;
use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::token::{Fixed, TokenProvider};
use crate::{Backoff, ClientError};

/// Default bound of the DATA queue: about a minute of one message a second held while
/// offline, at a few KiB for small messages.
pub const DEFAULT_MAX_QUEUED: usize = 64;

/// Default limit on opening a connection and logging in: a gateway that has not answered
/// in this long is treated as a failed attempt, and the client backs off.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client's settings; every one but the uid has a default.
///
/// ```
/// use std::time::Duration;
/// use idlegate_client::{Backoff, Options};
///
/// let options = Options::new(42)
///     .device("phone".parse().unwrap())
///     .token("eyJ...")
///     .backoff(Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(60) })
///     .max_queued(256);
/// # let _ = options;
/// ```
#[derive(Clone)]
pub struct Options {
    pub(crate) uid: u64,
    pub(crate) device: Device,
    /// The timeout asked for at LOGIN (protocol version 5); none: the gateway's default.
    pub(crate) timeout: Option<Duration>,
    pub(crate) token: Arc<dyn TokenProvider>,
    pub(crate) backoff: Backoff,
    pub(crate) max_queued: usize,
    pub(crate) reconnect_after_kick: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) tls: Option<Arc<ClientConfig>>,
}

// === impl Options ===

impl Options {
    /// Logs in as `uid` on the default device, with no token.
    pub fn new(uid: u64) -> Options {
        Options {
            uid,
            device: Device::DEFAULT,
            timeout: None,
            token: Arc::new(Fixed::default()),
            backoff: Backoff::default(),
            max_queued: DEFAULT_MAX_QUEUED,
            reconnect_after_kick: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
        }
    }

    /// Which of the uid's devices this is (`"phone".parse()?`). A gateway with
    /// `--max-devices 1` (its default) keeps one session per uid whatever the device.
    pub fn device(self, device: Device) -> Options {
        Options { device, ..self }
    }

    /// The timeout to ask the gateway for (protocol version 5): it grants the shortest of its
    /// timeout classes at or above it, within its `--min-timeout` and `--max-timeout`, and
    /// the client pings after a third of what WELCOME granted. A long one saves a phone's
    /// battery (every ping wakes its radio); the session then goes offline that much later
    /// after the client is gone. Default: none, the gateway's `--timeout`. A gateway older
    /// than version 5 refuses a LOGIN that asks (BYE protocol_error).
    pub fn timeout(self, timeout: Duration) -> Options {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX).max(1);
        Options { timeout: Some(Duration::from_millis(u64::from(ms))), ..self }
    }

    /// The same token for every login.
    pub fn token(self, token: impl Into<String>) -> Options {
        Options { token: Arc::new(Fixed(token.into())), ..self }
    }

    /// Asks `provider` for the token of every login; see [`TokenProvider`].
    pub fn token_provider(self, provider: impl TokenProvider) -> Options {
        Options { token: Arc::new(provider), ..self }
    }

    /// The reconnect policy (default: [`Backoff::default`]).
    pub fn backoff(self, backoff: Backoff) -> Options {
        Options { backoff, ..self }
    }

    /// How many DATA messages the client holds while it cannot send them (offline, or the
    /// socket busy); past that, [`crate::Client::try_send`] hands the message back and
    /// [`crate::Client::send`] waits for room. Default [`DEFAULT_MAX_QUEUED`]; at least 1.
    pub fn max_queued(self, max_queued: usize) -> Options {
        Options { max_queued: max_queued.max(1), ..self }
    }

    /// Whether to reconnect after BYE(kicked) (a newer login of the same device, or a
    /// backend's kick). Default false: two clients of one device would otherwise take the
    /// session from each other for ever.
    pub fn reconnect_after_kick(self, yes: bool) -> Options {
        Options { reconnect_after_kick: yes, ..self }
    }

    /// Limit on opening a connection and logging in (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(self, timeout: Duration) -> Options {
        Options { connect_timeout: timeout, ..self }
    }

    /// Trusts the certificate authorities in `pem` instead of the Mozilla root store, for
    /// `tls://` and `wss://` (a private CA, or a test's).
    pub fn ca_pem(self, pem: &[u8]) -> Result<Options, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| ClientError::Tls(e.to_string()))?;
            roots.add(cert).map_err(|e| ClientError::Tls(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ClientError::Tls("no certificate in the PEM".into()));
        }
        Ok(self.tls_config(Arc::new(crate::conn::client_config(roots))))
    }

    /// Uses `config` for `tls://` and `wss://` (its ALPN is set per door).
    pub fn tls_config(self, config: Arc<ClientConfig>) -> Options {
        Options { tls: Some(config), ..self }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("uid", &self.uid)
            .field("device", &self.device)
            .field("backoff", &self.backoff)
            .field("max_queued", &self.max_queued)
            .field("reconnect_after_kick", &self.reconnect_after_kick)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}
