//! A client for every door: the length-prefixed protocol over TCP or TLS, one frame per
//! binary message over WebSocket (tokio-tungstenite, a client written by others) or
//! WebSocket in TLS.

use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use idlegate_proto::{Frame, FrameCodec, Transport, TLS_ALPN, WS_PATH};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::codec::Framed;

use super::tls::TestCa;
use super::PATIENCE;

/// A byte stream a door client speaks over: a socket, or TLS over one.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What a door client saw next.
#[derive(Debug, PartialEq)]
pub enum Got {
    Frame(Frame),
    /// A WebSocket close frame: its code and reason.
    Close(u16, String),
    /// The connection ended with nothing more.
    End,
}

enum Inner {
    Frames(Framed<Box<dyn Io>, FrameCodec>),
    Ws(Box<WebSocketStream<Box<dyn Io>>>),
}

/// A protocol client on any door.
pub struct DoorClient {
    inner: Inner,
}

/// The byte stream to `addr`: TLS trusting `ca` for the TLS doors, plain otherwise.
pub async fn open(transport: Transport, addr: SocketAddr, ca: Option<&TestCa>) -> std::io::Result<Box<dyn Io>> {
    if transport.is_tls() {
        let ca = ca.expect("a TLS door needs the test CA");
        let alpn: &[&[u8]] = if transport == Transport::Tls { &[TLS_ALPN] } else { &[b"http/1.1"] };
        Ok(Box::new(ca.connect(addr, alpn).await?))
    } else {
        Ok(Box::new(TcpStream::connect(addr).await?))
    }
}

impl DoorClient {
    /// Connects to `addr`, a listener of `transport`, and upgrades a WebSocket door.
    pub async fn connect(transport: Transport, addr: SocketAddr, ca: Option<&TestCa>) -> DoorClient {
        let io = open(transport, addr, ca).await.expect("connects");
        DoorClient::over(transport, io, addr).await
    }

    /// A client over `io`, a byte stream already open to `addr` (through a balancer, say).
    pub async fn over(transport: Transport, io: Box<dyn Io>, addr: SocketAddr) -> DoorClient {
        match transport {
            Transport::Tcp | Transport::Tls => {
                DoorClient { inner: Inner::Frames(Framed::new(io, FrameCodec::default())) }
            }
            Transport::Ws | Transport::Wss => {
                let scheme = if transport == Transport::Wss { "wss" } else { "ws" };
                let url = format!("{scheme}://{addr}{WS_PATH}");
                let (ws, response) = tokio_tungstenite::client_async(url, io).await.expect("upgrades");
                assert_eq!(response.status(), 101);
                DoorClient { inner: Inner::Ws(Box::new(ws)) }
            }
            Transport::Mqtt | Transport::Mqtts => panic!("an MQTT door speaks MQTT: use an MQTT client"),
        }
    }

    pub async fn send(&mut self, frame: Frame) {
        assert!(self.try_send(frame).await, "sends");
    }

    /// Sends `frame`; false once the connection is gone.
    pub async fn try_send(&mut self, frame: Frame) -> bool {
        match &mut self.inner {
            Inner::Frames(framed) => framed.send(frame).await.is_ok(),
            Inner::Ws(ws) => {
                let mut body = bytes::BytesMut::new();
                frame.encode(&mut body);
                ws.send(Message::Binary(body.to_vec())).await.is_ok()
            }
        }
    }

    /// Sends a raw WebSocket message (a ping, a text message).
    pub async fn send_ws(&mut self, message: Message) {
        let Inner::Ws(ws) = &mut self.inner else { panic!("not a WebSocket client") };
        ws.send(message).await.expect("sends");
    }

    /// The next frame or close, skipping WebSocket pongs; fails the test after PATIENCE.
    pub async fn recv(&mut self) -> Got {
        tokio::time::timeout(PATIENCE, self.next()).await.expect("the gateway answers in time")
    }

    async fn next(&mut self) -> Got {
        match &mut self.inner {
            Inner::Frames(framed) => match framed.next().await {
                Some(Ok(frame)) => Got::Frame(frame),
                _ => Got::End,
            },
            Inner::Ws(ws) => loop {
                match ws.next().await {
                    Some(Ok(Message::Binary(b))) => return Got::Frame(Frame::parse(Bytes::from(b)).expect("a frame")),
                    Some(Ok(Message::Close(Some(close)))) => {
                        return Got::Close(u16::from(close.code), close.reason.into_owned())
                    }
                    Some(Ok(Message::Pong(_) | Message::Ping(_))) => continue,
                    Some(Ok(other)) => panic!("unexpected message {other:?}"),
                    _ => return Got::End,
                }
            },
        }
    }

    /// LOGIN as `uid` (any token) and its WELCOME.
    pub async fn login(&mut self, uid: u64) {
        self.send(Frame::Login { uid, token: Bytes::from_static(b"t"), device: Default::default(), timeout_ms: None })
            .await;
        match self.recv().await {
            Got::Frame(Frame::Welcome { .. }) => {}
            other => panic!("expected WELCOME, got {other:?}"),
        }
    }
}

/// Logs `uid` in with `token` on `transport`: `Ok` for a WELCOME, else what the refusal said
/// (a BYE(auth_failed)'s text, or a WebSocket close's).
pub async fn token_login(
    transport: Transport,
    addr: SocketAddr,
    ca: Option<&TestCa>,
    uid: u64,
    token: &str,
) -> Result<(), String> {
    let mut client = DoorClient::connect(transport, addr, ca).await;
    let token = Bytes::copy_from_slice(token.as_bytes());
    client.send(Frame::Login { uid, token, device: Default::default(), timeout_ms: None }).await;
    match client.recv().await {
        Got::Frame(Frame::Welcome { .. }) => Ok(()),
        Got::Frame(Frame::Bye { reason: idlegate_proto::CloseReason::AuthFailed, text, .. }) => Err(text),
        Got::Close(4000..=4999, text) => Err(format!("close: {text}")),
        other => Err(format!("{other:?}")),
    }
}
