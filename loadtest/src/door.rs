//! The door clients come in by (`--transport tcp|tls|ws|wss`): a TCP connection, TLS over it
//! trusting `--tls-ca`, and for WebSocket the upgrade on `/v1/ws`. What travels inside is
//! the wire's business (`wire.rs` frames messages for WebSocket itself).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use idlegate_proto::websocket::accept_key;
use idlegate_proto::{Transport, TLS_ALPN, WS_PATH};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use crate::fleet::connect;

/// Longest upgrade answer read: a 101 is a few hundred bytes.
const MAX_UPGRADE_ANSWER: usize = 4096;

/// The key every client's upgrade sends: the gateway checks its form, not its freshness
/// (RFC 6455 asks a client for a random one; this load makes no claim of being a browser).
const UPGRADE_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// A connected client's byte stream, whatever the door.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One stream, boxed: plain TCP or TLS.
pub type Conn = Box<dyn Io>;

/// How clients connect; see the module documentation.
#[derive(Clone)]
pub struct Door {
    pub transport: Transport,
    /// For `tls` and `wss`: one client configuration for all, so its session cache lets a
    /// reconnect storm resume instead of paying full handshakes.
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Door").field("transport", &self.transport).finish()
    }
}

impl Door {
    /// A door of `transport`, trusting the CA certificates in `ca` (PEM) for TLS.
    pub fn new(transport: Transport, ca: Option<&Path>) -> Result<Door, String> {
        let tls = match (transport.is_tls(), ca) {
            (false, _) => None,
            (true, None) => return Err(format!("--tls-ca: --transport {transport} needs the CA to trust")),
            (true, Some(ca)) => Some(connector(transport, ca)?),
        };
        Ok(Door { transport, tls })
    }

    /// Whether messages travel as WebSocket frames.
    pub fn websocket(&self) -> bool {
        matches!(self.transport, Transport::Ws | Transport::Wss)
    }

    /// Connects to `target` from `source`, through TLS and the upgrade as the door wants.
    pub async fn open(&self, target: SocketAddr, source: Option<IpAddr>) -> io::Result<Conn> {
        let tcp = connect(target, source).await?;
        let mut conn: Conn = match &self.tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(tls.connect(ServerName::IpAddress(target.ip().into()), tcp).await?),
        };
        if self.websocket() {
            upgrade(&mut conn, target).await?;
        }
        Ok(conn)
    }
}

/// A TLS connector trusting the certificates in `ca`, offering the door's ALPN.
fn connector(transport: Transport, ca: &Path) -> Result<TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
        roots.add(cert).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let alpn: &[u8] = if transport == Transport::Tls { TLS_ALPN } else { b"http/1.1" };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The WebSocket upgrade on `conn`: the request, then the 101 and its accept key.
async fn upgrade(conn: &mut Conn, target: SocketAddr) -> io::Result<()> {
    let request = format!(
        "GET {WS_PATH} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {UPGRADE_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await?;
    // Byte by byte up to the blank line, so nothing after the answer is read here: the
    // gateway sends nothing before the LOGIN, but the stream is the codec's after this.
    let mut answer = Vec::with_capacity(256);
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() >= MAX_UPGRADE_ANSWER {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "upgrade answer too long"));
        }
        let byte = conn.read_u8().await?;
        answer.push(byte);
    }
    let text = String::from_utf8_lossy(&answer);
    let accept = accept_key(UPGRADE_KEY.as_bytes());
    if !text.starts_with("HTTP/1.1 101") || !text.contains(&accept) {
        let status = text.lines().next().unwrap_or("").to_string();
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("upgrade refused: {status}")));
    }
    Ok(())
}
