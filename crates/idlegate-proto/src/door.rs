//! What a client must know to open each door: the WebSocket path, the TLS ALPN name, and
//! the close codes a WebSocket BYE maps to.

use crate::CloseReason;

/// The path of the WebSocket door (`--ws-listen`, `--wss-listen`).
pub const WS_PATH: &str = "/v1/ws";

/// ALPN protocol of the TLS door: the same length-prefixed protocol as plain TCP.
pub const TLS_ALPN: &[u8] = b"idlegate";

/// Close code of the gateway's BYE over WebSocket: this plus the reason's wire byte (4001
/// idle_timeout). The private-use range of RFC 6455, 7.4.2, so no proxy gives it a meaning
/// of its own.
pub const BYE_CLOSE_BASE: u16 = 4000;

// === impl CloseReason ===

impl CloseReason {
    /// The WebSocket close code its BYE goes out with, or `None` for the reasons that send no
    /// BYE.
    pub fn close_code(self) -> Option<u16> {
        self.wire_code().map(|code| BYE_CLOSE_BASE + u16::from(code))
    }

    /// The reason a WebSocket close code carries, for a client that saw the close but not
    /// the BYE before it (a browser's `CloseEvent` gives only the code).
    pub fn from_close_code(code: u16) -> Option<CloseReason> {
        let byte = code.checked_sub(BYE_CLOSE_BASE)?;
        CloseReason::from_wire(u8::try_from(byte).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes_map_back_to_their_reasons() {
        for reason in CloseReason::ALL {
            match reason.close_code() {
                Some(code) => assert_eq!(CloseReason::from_close_code(code), Some(reason)),
                None => assert_eq!(reason, CloseReason::Disconnect),
            }
        }
        assert_eq!(CloseReason::IdleTimeout.close_code(), Some(4001));
        assert_eq!(CloseReason::from_close_code(1000), None);
        assert_eq!(CloseReason::from_close_code(4000), None);
        assert_eq!(CloseReason::TokenExpired.close_code(), Some(4010));
        assert_eq!(CloseReason::from_close_code(4011), None);
    }
}
