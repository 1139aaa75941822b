//! `--proxy-protocol-from`: the balancers whose PROXY protocol headers are believed.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::error::ConfigError;

/// The balancers allowed to send a PROXY header (`--proxy-protocol-from`); with it set,
/// every client door reads one from them (`transport/proxy_header.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyProtocol {
    pub trusted: Vec<IpNet>,
}

impl ProxyProtocol {
    /// `--proxy-protocol-from`'s value: networks (`10.0.0.0/8`) or addresses (`127.0.0.1`),
    /// comma-separated.
    pub fn parse(value: &str) -> Result<ProxyProtocol, ConfigError> {
        let bad = |why: String| ConfigError::new("--proxy-protocol-from", why);
        let mut trusted = Vec::new();
        for item in value.split(',').map(str::trim).filter(|item| !item.is_empty()) {
            let net = match item.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => item
                    .parse::<IpAddr>()
                    .map(IpNet::from)
                    .map_err(|_| bad(format!("{item:?} is neither a network (10.0.0.0/8) nor an address")))?,
            };
            trusted.push(net.trunc());
        }
        if trusted.is_empty() {
            return Err(bad("names no balancer: give their networks, comma-separated".into()));
        }
        Ok(ProxyProtocol { trusted })
    }

    /// Whether `ip` is one of the balancers (an IPv4 address mapped into IPv6 as itself).
    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balancers_are_trusted_by_network() {
        let proxy = ProxyProtocol::parse("10.0.0.0/8, ::1").unwrap();
        assert!(proxy.trusts("10.1.2.3".parse().unwrap()));
        assert!(proxy.trusts("::ffff:10.1.2.3".parse().unwrap()));
        assert!(proxy.trusts("::1".parse().unwrap()));
        assert!(!proxy.trusts("11.0.0.1".parse().unwrap()));
        assert!(!proxy.trusts("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn a_bad_list_names_the_flag_and_the_item() {
        let err = ProxyProtocol::parse("10.0.0.0/8,balancer").unwrap_err().to_string();
        assert!(err.contains("--proxy-protocol-from") && err.contains("\"balancer\""), "{err}");
        assert!(ProxyProtocol::parse(" , ").unwrap_err().to_string().contains("names no balancer"));
    }
}
