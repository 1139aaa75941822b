//! The doors, declared once: each door's name, whether TLS lies under its bytes (and the
//! ALPN it offers), and what it speaks. Everything else that differs between doors (the
//! connection's type, the refusal's words, the metrics' label) is read from this table, so
//! a new door is a folder with its [`Framing`](crate::transport::connection::Framing) and
//! one line here.

use crate::proto::{Transport, TLS_ALPN};

/// What a door's bytes are, above the TLS layer if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Speaks {
    /// The idlegate protocol's length-prefixed frames (`tcp.rs`).
    Frames,
    /// An HTTP upgrade, then WebSocket messages (`ws.rs`): one frame each, or (the `mqtt`
    /// subprotocol) an MQTT stream.
    WebSocket,
    /// MQTT 3.1.1 and 5 packets (`mqtt.rs`).
    Mqtt,
}

/// One door: see the module documentation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Door {
    pub(crate) transport: Transport,
    pub(crate) speaks: Speaks,
    /// The protocols its TLS handshake offers by ALPN; `None` for a door without TLS.
    pub(crate) alpn: Option<&'static [u8]>,
}

/// Every door the gateway has, in [`Transport::ALL`]'s order (a door's place is its
/// transport's index, which `Doors` indexes its TLS configurations by).
pub(crate) const DOORS: [Door; 6] = [
    Door { transport: Transport::Tcp, speaks: Speaks::Frames, alpn: None },
    Door { transport: Transport::Tls, speaks: Speaks::Frames, alpn: Some(TLS_ALPN) },
    Door { transport: Transport::Ws, speaks: Speaks::WebSocket, alpn: None },
    Door { transport: Transport::Wss, speaks: Speaks::WebSocket, alpn: Some(b"http/1.1") },
    Door { transport: Transport::Mqtt, speaks: Speaks::Mqtt, alpn: None },
    // MQTT clients rarely offer ALPN; those that do say "mqtt" (a client offering none is
    // served whatever the server lists).
    Door { transport: Transport::Mqtts, speaks: Speaks::Mqtt, alpn: Some(b"mqtt") },
];

// === impl Door ===

impl Door {
    /// The door named `transport`: `DOORS` lists them in [`Transport::ALL`]'s order.
    pub(crate) const fn of(transport: Transport) -> Door {
        DOORS[transport as usize]
    }

    /// The door whose layer is clear or not (`clear`) and that speaks `speaks`: what a
    /// connection's types say it came in by, so no connection stores it.
    pub(crate) const fn by(clear: bool, speaks: Speaks) -> Transport {
        let mut i = 0;
        while i < DOORS.len() {
            if DOORS[i].alpn.is_none() == clear && DOORS[i].speaks as usize == speaks as usize {
                return DOORS[i].transport;
            }
            i += 1;
        }
        panic!("every layer and framing has its door")
    }

    pub(crate) fn is_tls(&self) -> bool {
        self.alpn.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_has_one_door_and_back() {
        assert_eq!(DOORS.len(), Transport::ALL.len());
        for (i, transport) in Transport::ALL.into_iter().enumerate() {
            assert_eq!(DOORS[i].transport, transport, "DOORS is in Transport::ALL's order");
            let door = Door::of(transport);
            assert_eq!(door.transport, transport);
            assert_eq!(door.is_tls(), transport.is_tls(), "{transport}");
            assert_eq!(Door::by(!door.is_tls(), door.speaks), transport);
        }
    }
}
