//! `--redis` and `--redis-cluster`: where a cluster's Redis is, parsed and checked at start,
//! and never printed with its password.

/// Characters a node id may not contain in a cluster: the separators of the cluster's
/// member names and route values (`<node>#<incarnation>`, `<member>|<session>|...`).
pub(crate) const FORBIDDEN_IN_NODE_ID: [char; 2] = ['|', '#'];

/// Where the cluster's Redis is: `--redis` and `--redis-cluster`.
#[derive(Clone)]
pub struct RedisTarget {
    urls: Vec<String>,
    cluster: bool,
}

// === impl RedisTarget ===

impl RedisTarget {
    /// Parses `--redis`: one `redis://` or `rediss://` URL, or several comma-separated seeds
    /// of a Redis Cluster. `cluster` forces cluster mode for a single seed.
    pub fn parse(text: &str, cluster: bool) -> Result<RedisTarget, String> {
        let urls: Vec<String> = text.split(',').map(str::trim).filter(|u| !u.is_empty()).map(String::from).collect();
        if urls.is_empty() {
            return Err("no URL given; expected redis://host:port[/db]".into());
        }
        for url in &urls {
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                return Err(format!("{} is not a redis:// or rediss:// URL", redact(url)));
            }
            redis::Client::open(url.as_str()).map_err(|e| format!("{}: {e}", redact(url)))?;
        }
        let cluster = cluster || urls.len() > 1;
        Ok(RedisTarget { urls, cluster })
    }

    /// The URLs: one server's, or a cluster's seeds.
    pub(crate) fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Whether the target is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The seeds with any password left out, for logs.
    pub fn redacted(&self) -> String {
        self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",")
    }
}

/// Never prints a password: the URLs may carry one.
impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget").field("urls", &self.redacted()).field("cluster", &self.cluster).finish()
    }
}

/// A URL with its user information (and so any password) replaced by `***`.
fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://***@{}", &url[at + 1..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_never_show_passwords() {
        let one = RedisTarget::parse("redis://:s3cret@127.0.0.1:6379/2", false).unwrap();
        assert!(!one.is_cluster());
        assert_eq!(one.redacted(), "redis://***@127.0.0.1:6379/2");
        assert!(!format!("{one:?}").contains("s3cret"));
        let seeds = RedisTarget::parse("redis://a:7000, redis://b:7001", false).unwrap();
        assert!(seeds.is_cluster());
        assert!(RedisTarget::parse("redis://a:7000", true).unwrap().is_cluster());
        assert!(RedisTarget::parse("http://x", false).is_err());
        assert!(RedisTarget::parse(" , ", false).is_err());
    }
}
