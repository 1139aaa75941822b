//! One connection to a gateway, by any door: length-prefixed frames over TCP or TLS, or one
//! frame per binary message over WebSocket (tokio-tungstenite, over the same TLS stream for
//! `wss://`).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use idlegate_proto::{CloseReason, Frame, FrameCodec, Transport, TLS_ALPN};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::codec::Framed;

use crate::Endpoint;

/// Largest frame accepted from a gateway. Pushes are bounded by the gateway's
/// `--max-frame-bytes` (64 KiB by default, which an operator may raise); this is far above
/// any sane setting while bounding what a broken or hostile server can make a client hold.
pub const MAX_INCOMING_FRAME_BYTES: u32 = 16 << 20;

/// ALPN of the WebSocket door inside TLS: plain HTTP/1.1, as browsers offer.
const WSS_ALPN: &[u8] = b"http/1.1";

/// A byte stream, plain or inside TLS.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// An open connection.
pub(crate) enum Conn {
    Frames(Framed<Box<dyn Io>, FrameCodec>),
    WebSocket(Box<WebSocketStream<Box<dyn Io>>>),
}

/// A frame, or the end of the connection and why.
pub(crate) type Received = Result<Frame, String>;

/// Why a connection did not open.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The socket, TLS or the upgrade failed.
    Io(io::Error),
    /// The gateway refused the WebSocket upgrade for lack of room (HTTP 503): read as the
    /// BYE(server_full) the other doors send, its `Retry-After` as the retry hint.
    Refused(Frame),
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> OpenError {
        OpenError::Io(e)
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io(e) => e.fmt(f),
            OpenError::Refused(bye) => write!(f, "refused: {bye:?}"),
        }
    }
}

// === impl Conn ===

impl Conn {
    /// Opens a connection to `endpoint`, through TLS with `tls` for `tls://` and `wss://`.
    pub(crate) async fn open(endpoint: &Endpoint, tls: &Arc<ClientConfig>) -> Result<Conn, OpenError> {
        let tcp = TcpStream::connect(endpoint.authority()).await?;
        // Keepalives and small DATA frames are the traffic: send each at once.
        tcp.set_nodelay(true)?;
        let transport = endpoint.transport();
        let stream: Box<dyn Io> = if transport.is_tls() {
            let alpn = if transport == Transport::Tls { TLS_ALPN } else { WSS_ALPN };
            let mut config = ClientConfig::clone(tls);
            config.alpn_protocols = vec![alpn.to_vec()];
            let name = ServerName::try_from(endpoint.host().to_string())
                .map_err(|e| OpenError::Io(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            Box::new(tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?)
        } else {
            Box::new(tcp)
        };
        if matches!(transport, Transport::Tcp | Transport::Tls) {
            return Ok(Conn::Frames(Framed::new(stream, FrameCodec::new(MAX_INCOMING_FRAME_BYTES))));
        }
        let url = endpoint.to_string();
        match tokio_tungstenite::client_async(url, stream).await {
            Ok((ws, _)) => Ok(Conn::WebSocket(Box::new(ws))),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) if response.status().as_u16() == 503 => {
                let after = response.headers().get("retry-after").and_then(|v| v.to_str().ok());
                let ms = after.and_then(|v| v.trim().parse::<u64>().ok()).map(|s| s.saturating_mul(1000));
                let why = "the gateway answered the WebSocket upgrade with HTTP 503";
                let text = match ms {
                    Some(ms) => idlegate_proto::retry_text(ms, why),
                    None => why.to_string(),
                };
                Err(OpenError::Refused(Frame::Bye { reason: CloseReason::ServerFull, text }))
            }
            Err(e) => Err(OpenError::Io(io::Error::other(e))),
        }
    }

    pub(crate) async fn send(&mut self, frame: Frame) -> io::Result<()> {
        match self {
            Conn::Frames(framed) => framed.send(frame).await.map_err(io::Error::other),
            Conn::WebSocket(ws) => {
                let mut body = BytesMut::with_capacity(frame.body_len());
                frame.encode(&mut body);
                ws.send(Message::Binary(body.to_vec())).await.map_err(io::Error::other)
            }
        }
    }

    /// The next frame from the gateway, or why there is none: the connection closed or
    /// failed, or the gateway sent what it never sends. A WebSocket close with a BYE code
    /// the client did not see the BYE of becomes that BYE.
    pub(crate) async fn recv(&mut self) -> Received {
        match self {
            Conn::Frames(framed) => match framed.next().await {
                Some(Ok(frame)) => Ok(frame),
                Some(Err(e)) => Err(format!("connection failed: {e}")),
                None => Err("the gateway closed the connection".into()),
            },
            Conn::WebSocket(ws) => loop {
                match ws.next().await {
                    Some(Ok(Message::Binary(body))) => {
                        return Frame::parse(Bytes::from(body)).map_err(|e| format!("bad frame from the gateway: {e}"))
                    }
                    Some(Ok(Message::Close(Some(close)))) => {
                        let code = u16::from(close.code);
                        return match CloseReason::from_close_code(code) {
                            Some(reason) => Ok(Frame::Bye { reason, text: close.reason.into_owned() }),
                            None if close.code == CloseCode::Normal => Err("the gateway closed the connection".into()),
                            None => Err(format!("WebSocket closed with {code}: {}", close.reason)),
                        };
                    }
                    Some(Ok(Message::Close(None))) | None => return Err("the gateway closed the connection".into()),
                    // tungstenite answers pings itself.
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                    Some(Ok(Message::Text(_))) => return Err("the gateway sent a text message".into()),
                    Some(Err(e)) => return Err(format!("connection failed: {e}")),
                }
            },
        }
    }

    /// Closes the connection politely (a WebSocket close frame, TLS's close_notify, a FIN),
    /// waiting at most `patience`.
    pub(crate) async fn close(&mut self, patience: Duration) {
        let _ = match self {
            Conn::Frames(framed) => tokio::time::timeout(patience, framed.get_mut().shutdown()).await.map(drop),
            Conn::WebSocket(ws) => tokio::time::timeout(patience, WebSocketStream::close(ws, None)).await.map(drop),
        };
    }
}

/// The TLS settings of a client that trusts the Mozilla root store (webpki-roots).
pub(crate) fn default_tls() -> Arc<ClientConfig> {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    Arc::new(client_config(roots))
}

/// TLS settings trusting exactly `roots`.
pub(crate) fn client_config(roots: rustls::RootCertStore) -> ClientConfig {
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth()
}
