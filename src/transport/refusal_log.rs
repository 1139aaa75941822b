//! What an operator is told of connections refused before their login: one info line each,
//! with the peer, the door and why, at most [`LINES_PER_SECOND`] a second across the
//! process, the rest counted and said with the next line. A new user whose client the
//! gateway refuses (an MQTT 3.1.1 keepalive the window cannot honour, a token minted with
//! the wrong secret) finds the reason in the log; a scanner or a storm cannot flood it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::time::Instant;

use crate::proto::{CloseReason, Transport};

/// Refusal lines a second at most: enough to see every refusal of a misconfigured client
/// or two, far below what a storm of thousands would write.
const LINES_PER_SECOND: u64 = 10;

/// The rate limit's state: the second being counted, the lines said in it, and the
/// refusals left unsaid since the last line.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    window: Mutex<(Instant, u64)>,
    unsaid: AtomicU64,
}

impl Default for RefusalLog {
    fn default() -> RefusalLog {
        RefusalLog { window: Mutex::new((Instant::now(), 0)), unsaid: AtomicU64::new(0) }
    }
}

/// Why a refusal is counted: its close reason's label, or a word of its own where the
/// reason alone would hide what to do (an MQTT 3.1.1 keepalive is a protocol error the
/// client's defaults cause, and is fixed by its `-k`).
pub(crate) fn why(reason: CloseReason, text: &str) -> &'static str {
    if reason == CloseReason::ProtocolError && text.starts_with(crate::transport::mqtt::KEEPALIVE_REFUSAL) {
        "mqtt_keepalive"
    } else {
        reason.label()
    }
}

impl RefusalLog {
    /// Logs the refusal of `peer`'s connection on `door`, unless the second's lines are
    /// spent; returns whether it logged.
    pub(crate) fn refused(&self, peer: Option<SocketAddr>, door: Transport, reason: CloseReason, text: &str) -> bool {
        {
            let mut window = self.window.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            if now.duration_since(window.0).as_secs() >= 1 {
                *window = (now, 0);
            }
            if window.1 >= LINES_PER_SECOND {
                self.unsaid.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            window.1 += 1;
        }
        let unsaid = self.unsaid.swap(0, Ordering::Relaxed);
        let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
        tracing::info!(%peer, %door, %reason, why = %text, unsaid, "connection refused before login");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_most_ten_lines_a_second_the_rest_counted() {
        let log = RefusalLog::default();
        let said = (0..25).filter(|_| log.refused(None, Transport::Mqtt, CloseReason::AuthFailed, "x")).count();
        assert_eq!(said, 10);
        assert_eq!(log.unsaid.load(Ordering::Relaxed), 15);
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        assert!(log.refused(None, Transport::Mqtt, CloseReason::AuthFailed, "x"));
        assert_eq!(log.unsaid.load(Ordering::Relaxed), 0, "said with the next line");
    }

    #[test]
    fn an_mqtt_keepalive_refusal_is_counted_apart() {
        let text = format!("{} 60 s outside 1..=26 s", crate::transport::mqtt::KEEPALIVE_REFUSAL);
        assert_eq!(why(CloseReason::ProtocolError, &text), "mqtt_keepalive");
        assert_eq!(why(CloseReason::ProtocolError, "second LOGIN"), "protocol_error");
        assert_eq!(why(CloseReason::AuthFailed, "token expired"), "auth_failed");
    }
}
