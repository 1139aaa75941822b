//! Where a client connects: a URL naming the door (`tcp://`, `tls://`, `ws://`, `wss://`),
//! the host and the port.

use std::fmt;
use std::str::FromStr;

use idlegate_proto::{Transport, WS_PATH};

/// A parsed gateway URL.
///
/// ```
/// use idlegate_client::Endpoint;
///
/// let e: Endpoint = "wss://gw.example.com/v1/ws".parse().unwrap();
/// assert_eq!((e.host(), e.port(), e.path()), ("gw.example.com", 443, "/v1/ws"));
/// let e: Endpoint = "tcp://127.0.0.1:7000".parse().unwrap();
/// assert_eq!(e.transport(), idlegate_proto::Transport::Tcp);
/// assert!("http://x".parse::<Endpoint>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    transport: Transport,
    host: String,
    port: u16,
    /// The WebSocket path (`/v1/ws` unless the URL names one); empty for TCP and TLS.
    path: String,
}

/// A URL the client cannot connect to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("unknown scheme in {0:?}: use tcp://, tls://, ws:// or wss://")]
    Scheme(String),
    #[error("no host in {0:?}")]
    NoHost(String),
    #[error("bad port in {0:?}")]
    Port(String),
    #[error("{0:?}: tcp:// and tls:// have no path; the port is required")]
    Path(String),
}

// === impl Endpoint ===

impl Endpoint {
    /// The door: which transport the URL's scheme names.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The host name or IP address, without brackets for IPv6.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The WebSocket request path; empty for `tcp://` and `tls://`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `host:port` as a socket address string (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(url: &str) -> Result<Endpoint, EndpointError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| EndpointError::Scheme(url.into()))?;
        let (transport, default_port) = match scheme.to_ascii_lowercase().as_str() {
            "tcp" => (Transport::Tcp, None),
            "tls" => (Transport::Tls, None),
            "ws" => (Transport::Ws, Some(80)),
            "wss" => (Transport::Wss, Some(443)),
            _ => return Err(EndpointError::Scheme(url.into())),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(|| EndpointError::NoHost(url.into()))?;
                (host, after.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        if host.is_empty() {
            return Err(EndpointError::NoHost(url.into()));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| EndpointError::Port(url.into()))?,
            None => default_port.ok_or_else(|| EndpointError::Port(url.into()))?,
        };
        let path = match transport {
            Transport::Ws | Transport::Wss if path.is_empty() => WS_PATH.to_string(),
            Transport::Ws | Transport::Wss => path.to_string(),
            _ if path.is_empty() || path == "/" => String::new(),
            _ => return Err(EndpointError::Path(url.into())),
        };
        Ok(Endpoint { transport, host: host.to_string(), port, path })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.transport.label(), self.authority(), self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_every_door_parse_and_print_back() {
        for (url, transport, host, port, path) in [
            ("tcp://127.0.0.1:7000", Transport::Tcp, "127.0.0.1", 7000, ""),
            ("tls://gw.example.com:7443/", Transport::Tls, "gw.example.com", 7443, ""),
            ("ws://localhost:8080", Transport::Ws, "localhost", 8080, "/v1/ws"),
            ("WSS://[::1]/custom", Transport::Wss, "::1", 443, "/custom"),
        ] {
            let e: Endpoint = url.parse().unwrap();
            assert_eq!((e.transport(), e.host(), e.port(), e.path()), (transport, host, port, path), "{url}");
            assert_eq!(e.to_string().parse::<Endpoint>().unwrap(), e);
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, want) in [
            ("127.0.0.1:7000", EndpointError::Scheme("127.0.0.1:7000".into())),
            ("http://x:1", EndpointError::Scheme("http://x:1".into())),
            ("tcp://:7000", EndpointError::NoHost("tcp://:7000".into())),
            ("tcp://host", EndpointError::Port("tcp://host".into())),
            ("ws://host:99999", EndpointError::Port("ws://host:99999".into())),
            ("tcp://host:1/x", EndpointError::Path("tcp://host:1/x".into())),
        ] {
            assert_eq!(url.parse::<Endpoint>(), Err(want));
        }
    }
}
