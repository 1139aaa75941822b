//! The doors clients come in by, each driving the one protocol machine (`drive`) over a
//! [`connection::Connection`] with its own layer and framing: plain TCP (`tcp`), TLS
//! (`tls` under the length-prefixed frames), WebSocket (`ws`), WebSocket under TLS, and MQTT
//! (`mqtt`) alone, under TLS, or inside WebSocket (the `mqtt` subprotocol).

mod connection;
mod drive;
mod mqtt;
mod records;
mod refusal;
mod tcp;
mod tls;
mod ws;

use std::sync::Arc;

use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::gateway::Gateway;
use crate::proto::{FrameCodec, Transport, MAX_LOGIN_FRAME_BYTES, TLS_ALPN};
pub(crate) use refusal::{Bound, Refusals};
pub use ws::{accept_key, WsPolicy};

/// What every door but plain TCP needs to open a connection, built once at start.
#[derive(Debug)]
pub(crate) struct Doors {
    /// The TLS door's configuration (`--tls-cert`, `--tls-key`).
    tls: Option<Arc<ServerConfig>>,
    /// The WSS door's: the same identity, offering HTTP/1.1 for the upgrade.
    wss: Option<Arc<ServerConfig>>,
    /// The MQTTS door's: the same identity, offering `mqtt`.
    mqtts: Option<Arc<ServerConfig>>,
    /// Who may upgrade to WebSocket.
    ws: Arc<WsPolicy>,
    /// What every MQTT connection shares.
    mqtt: Arc<mqtt::MqttPolicy>,
}

impl Doors {
    pub(crate) fn new(gateway: &Gateway) -> Doors {
        let config = &gateway.config;
        let identity = config.tls.as_ref();
        let mqtt = Arc::new(mqtt::MqttPolicy::new(config));
        Doors {
            tls: identity.map(|id| handing_over_keys(id.server_config(&[TLS_ALPN]))),
            wss: identity.map(|id| handing_over_keys(id.server_config(&[b"http/1.1"]))),
            // MQTT clients rarely offer ALPN; those that do say "mqtt" (a client offering
            // none is served whatever the server lists).
            mqtts: identity.map(|id| handing_over_keys(id.server_config(&[b"mqtt"]))),
            ws: Arc::new(WsPolicy { allowed_origins: config.ws_allowed_origins.clone(), mqtt: Some(mqtt.clone()) }),
            mqtt,
        }
    }

    /// Serves `stream`, accepted on `transport`'s listener, in a task of its own; false (and
    /// the stream dropped) when the door cannot open, which only a TLS listener without an
    /// identity can cause (configuration refuses it).
    pub(crate) fn spawn(
        &self,
        transport: Transport,
        stream: TcpStream,
        gateway: &Arc<Gateway>,
        permit: OwnedSemaphorePermit,
    ) -> bool {
        let max = gateway.config.max_frame_bytes;
        let frames = || FrameCodec::new(max).first_frame_at_most(MAX_LOGIN_FRAME_BYTES);
        let websocket = || ws::WebSocket::new(max, self.ws.clone());
        let secure = |config: &Option<Arc<ServerConfig>>| {
            config.clone().and_then(|c| {
                tls::Tls::new(c).map_err(|e| tracing::warn!(error = %e, "cannot open a TLS session")).ok()
            })
        };
        let gateway = gateway.clone();
        match transport {
            Transport::Tcp => {
                tokio::spawn(drive::serve(stream, tcp::Plain, frames(), gateway, permit));
            }
            Transport::Ws => {
                tokio::spawn(drive::serve(stream, tcp::Plain, websocket(), gateway, permit));
            }
            Transport::Tls => {
                let Some(layer) = secure(&self.tls) else { return false };
                tokio::spawn(drive::serve(stream, layer, frames(), gateway, permit));
            }
            Transport::Wss => {
                let Some(layer) = secure(&self.wss) else { return false };
                tokio::spawn(drive::serve(stream, layer, websocket(), gateway, permit));
            }
            Transport::Mqtt => {
                tokio::spawn(drive::serve(
                    stream,
                    tcp::Plain,
                    mqtt::Mqtt::new(max, self.mqtt.clone()),
                    gateway,
                    permit,
                ));
            }
            Transport::Mqtts => {
                let Some(layer) = secure(&self.mqtts) else { return false };
                tokio::spawn(drive::serve(stream, layer, mqtt::Mqtt::new(max, self.mqtt.clone()), gateway, permit));
            }
        }
        true
    }
}

/// `config`, letting rustls hand a finished handshake's traffic keys to the door's record
/// layer (`records.rs`), which keeps them in far less than rustls's connection.
fn handing_over_keys(config: Arc<ServerConfig>) -> Arc<ServerConfig> {
    let mut config = Arc::unwrap_or_clone(config);
    config.enable_secret_extraction = true;
    Arc::new(config)
}
