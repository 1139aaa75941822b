//! `--tls-cert` and `--tls-key`: the certificate chain and private key every TLS listener
//! presents. Loaded at start (a missing, unreadable or mismatched pair is a configuration
//! error naming the flag) and again on SIGHUP ([`TlsIdentity::reload`]), so a renewed
//! certificate is served to new handshakes without a restart or a dropped connection.
//!
//! TLS 1.3 and 1.2 only (rustls offers nothing older), with session tickets, so a client
//! reconnecting to this process resumes instead of paying a full handshake. The tickets'
//! keys live in this process only: a ticket does not survive a restart and is no good on
//! another node, so the reconnect storm after a restart pays full handshakes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::ring::{default_provider, sign, Ticketer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::error::ConfigError;

/// The pair TLS listeners present; see the module documentation.
pub struct TlsIdentity {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

// === impl TlsIdentity ===

impl TlsIdentity {
    /// Loads the chain in `cert` and the key in `key` (PEM), checking they belong together.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<TlsIdentity>, ConfigError> {
        let current = certified(cert, key)?;
        Ok(Arc::new(TlsIdentity { cert: cert.to_path_buf(), key: key.to_path_buf(), current: RwLock::new(current) }))
    }

    /// Reads the pair again from the same files; on any error the pair served stays as it was.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let fresh = certified(&self.cert, &self.key)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// When the certificate served now expires, in Unix seconds (0 if it cannot be read,
    /// which loading already refused).
    pub fn not_after(&self) -> i64 {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner).clone();
        current
            .end_entity_cert()
            .ok()
            .and_then(|der| x509_parser::parse_x509_certificate(der).ok())
            .map_or(0, |(_, cert)| cert.validity().not_after.timestamp())
    }

    /// A rustls server configuration presenting this identity (as it is at each handshake),
    /// offering `alpn` protocols.
    pub(crate) fn server_config(self: &Arc<Self>, alpn: &[&[u8]]) -> Arc<ServerConfig> {
        let provider = Arc::new(default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("the ring provider supports TLS 1.3 and 1.2")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Current(self.clone())));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        // Stateless resumption: a reconnecting client skips the key exchange's signature.
        match Ticketer::new() {
            Ok(ticketer) => config.ticketer = ticketer,
            Err(e) => tracing::warn!(error = %e, "no TLS session tickets: every reconnect pays a full handshake"),
        }
        Arc::new(config)
    }
}

/// Hands each handshake the identity's pair as it is now.
#[derive(Debug)]
struct Current(Arc<TlsIdentity>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.read().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

/// The pair in `cert` and `key`, checked to belong together.
fn certified(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, ConfigError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| ConfigError::new("--tls-cert", format!("{}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(ConfigError::new("--tls-cert", format!("{}: no certificate in it", cert.display())));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ConfigError::new("--tls-key", format!("{}: {e}", key.display())))?;
    let signing = sign::any_supported_type(&private)
        .map_err(|e| ConfigError::new("--tls-key", format!("{}: {e}", key.display())))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        ConfigError::new(
            "--tls-key",
            format!("{} does not belong to the certificate in {}: {e}", key.display(), cert.display()),
        )
    })?;
    Ok(Arc::new(certified))
}
