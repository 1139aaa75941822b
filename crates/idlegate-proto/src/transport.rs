//! The doors a client can come in by, as operators and metrics name them.

/// One kind of client listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// The length-prefixed protocol over plain TCP (`--listen`).
    Tcp,
    /// The same protocol inside TLS 1.3 or 1.2 (`--tls-listen`).
    Tls,
    /// One protocol frame per binary WebSocket message (`--ws-listen`).
    Ws,
    /// WebSocket inside TLS (`--wss-listen`).
    Wss,
    /// MQTT 3.1.1 and 5 (`--mqtt-listen`).
    Mqtt,
    /// MQTT inside TLS (`--mqtts-listen`).
    Mqtts,
}

// === impl Transport ===

impl Transport {
    /// Every transport, in the order metrics list them.
    pub const ALL: [Transport; 6] =
        [Transport::Tcp, Transport::Tls, Transport::Ws, Transport::Wss, Transport::Mqtt, Transport::Mqtts];

    /// The `transport` label of metrics and the status page.
    pub fn label(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Ws => "ws",
            Transport::Wss => "wss",
            Transport::Mqtt => "mqtt",
            Transport::Mqtts => "mqtts",
        }
    }

    /// The transport whose [`Transport::label`] is `label`.
    pub fn from_label(label: &str) -> Option<Transport> {
        Transport::ALL.into_iter().find(|t| t.label() == label)
    }

    /// Its position in [`Transport::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether its bytes travel inside TLS.
    pub fn is_tls(self) -> bool {
        matches!(self, Transport::Tls | Transport::Wss | Transport::Mqtts)
    }

    /// Whether it opens with a handshake of its own before the first LOGIN can arrive.
    pub fn has_handshake(self) -> bool {
        self.is_tls() || self == Transport::Ws
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}
