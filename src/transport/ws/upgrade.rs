//! The WebSocket door's HTTP side: the upgrade request (RFC 6455, 4.2) and its answer,
//! and the HTTP refusal a connection gets when it cannot upgrade (a bad request, or no
//! room).

use std::sync::Arc;

use base64::Engine;
use bytes::{Buf, BufMut, BytesMut};

use crate::config::AllowedOrigins;
use crate::proto::websocket::accept_key;
use crate::proto::{CloseReason, WS_PATH};
use crate::transport::mqtt::{Mqtt, MqttPolicy};
use crate::transport::ws::Payload;

/// Longest upgrade request read: browsers send well under 2 KiB, cookies included.
const MAX_UPGRADE_BYTES: usize = 8 * 1024;

/// Most header lines an upgrade request may have.
const MAX_UPGRADE_HEADERS: usize = 64;

/// The subprotocols that carry MQTT: MQTT's own name (MQTT 3.1.1 section 6, MQTT 5 section
/// 6), and the one MQTT 3.1 clients still offer.
const MQTT_SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// Who may upgrade: `--ws-allowed-origins` (none: any origin); and how MQTT inside is
/// served.
#[derive(Debug, Default)]
pub struct WsPolicy {
    /// Origins allowed, compared without regard to ASCII case (a SIGHUP may change them).
    pub allowed_origins: Arc<AllowedOrigins>,
    /// What MQTT connections share; `None` refuses the `mqtt` subprotocol.
    pub(crate) mqtt: Option<Arc<MqttPolicy>>,
}

/// A refusal's status and why.
fn refused(status: u16, why: impl Into<String>) -> (u16, String) {
    (status, why.into())
}

/// Reads the upgrade request at the front of `src`: `None` until it has all arrived; once
/// it is good, answers 101 into `out` and says what the messages carry (MQTT when the
/// client offered its subprotocol and `policy` serves it). A bad request is refused with
/// an HTTP status and why.
pub(super) fn upgrade(
    policy: &WsPolicy,
    max_frame_bytes: u32,
    src: &mut BytesMut,
    out: &mut BytesMut,
) -> Result<Option<Payload>, (u16, String)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_UPGRADE_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let consumed = match request.parse(src) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if src.len() >= MAX_UPGRADE_BYTES => {
            return Err(refused(431, format!("upgrade request over {MAX_UPGRADE_BYTES} bytes")));
        }
        Ok(httparse::Status::Partial) => {
            src.reserve(1024);
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(refused(431, format!("more than {MAX_UPGRADE_HEADERS} header lines")));
        }
        Err(e) => return Err(refused(400, format!("not an HTTP request: {e}"))),
    };
    let header = |name: &str| {
        request.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| String::from_utf8_lossy(h.value))
    };
    let has_token = |name: &str, token: &str| {
        header(name).is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    if request.method != Some("GET") {
        return Err(refused(405, "only GET upgrades"));
    }
    let path = request.path.unwrap_or("").split('?').next().unwrap_or("");
    if path != WS_PATH {
        return Err(refused(404, format!("no WebSocket at {path}: connect to {WS_PATH}")));
    }
    if !has_token("upgrade", "websocket") || !has_token("connection", "upgrade") {
        return Err(refused(426, format!("{WS_PATH} speaks WebSocket only: send an upgrade")));
    }
    if header("sec-websocket-version").as_deref() != Some("13") {
        return Err(refused(426, "WebSocket version 13 only"));
    }
    let key = header("sec-websocket-key").unwrap_or_default();
    let key = key.trim();
    let decoded = base64::engine::general_purpose::STANDARD.decode(key).unwrap_or_default();
    if decoded.len() != 16 {
        return Err(refused(400, "Sec-WebSocket-Key is not 16 bytes in base64"));
    }
    if let (Some(allowed), Some(origin)) = (policy.allowed_origins.load(), header("origin")) {
        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(origin.trim())) {
            return Err(refused(403, format!("origin {origin} is not in --ws-allowed-origins")));
        }
    }
    let accept = accept_key(key.as_bytes());
    let offered = header("sec-websocket-protocol").unwrap_or_default();
    let mut payload = Payload::Frames;
    let subprotocol = match &policy.mqtt {
        // Subprotocol names are tokens, compared exactly (RFC 6455 section 4.1).
        Some(mqtt) => offered.split(',').map(str::trim).find(|p| MQTT_SUBPROTOCOLS.contains(p)).map(|p| {
            payload = Payload::Mqtt(Box::new(Mqtt::new(max_frame_bytes, mqtt.clone())));
            p.to_string()
        }),
        None => None,
    };
    src.advance(consumed);
    out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n");
    out.extend_from_slice(b"Sec-WebSocket-Accept: ");
    out.extend_from_slice(accept.as_bytes());
    if let Some(subprotocol) = subprotocol {
        out.extend_from_slice(b"\r\nSec-WebSocket-Protocol: ");
        out.extend_from_slice(subprotocol.as_bytes());
    }
    out.extend_from_slice(b"\r\n\r\n");
    Ok(Some(payload))
}

/// The HTTP answer to an upgrade that did not happen; a 503 whose text carries a retry hint
/// says it as `Retry-After`, in whole seconds rounded up.
pub(crate) fn put_http_refusal(out: &mut BytesMut, status: u16, reason: CloseReason, text: &str) {
    let status = match (status, reason) {
        (0, CloseReason::LoginTimeout) => 408,
        (0, CloseReason::ServerFull | CloseReason::Shutdown) => 503,
        (0, _) => 400,
        (status, _) => status,
    };
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        426 => "Upgrade Required",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let body = if text.is_empty() { reason.label() } else { text };
    let extra = match (status, crate::proto::retry_hint(text)) {
        (426, _) => "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n".to_string(),
        (405, _) => "Allow: GET\r\n".to_string(),
        (503, Some(ms)) => format!("Retry-After: {}\r\n", ms.div_ceil(1000)),
        _ => String::new(),
    };
    let head = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n{extra}\r\n",
        body.len() + 1
    );
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(body.as_bytes());
    out.put_u8(b'\n');
}
