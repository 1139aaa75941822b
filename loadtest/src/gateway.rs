//! Reads the gateways' `/metrics`: their own counts of online users, their memory and their
//! CPU, so the report can set the gateways' view beside the harness's. With several
//! gateways (the nodes of a cluster) every figure is their sum: each is a process of its own
//! holding its own clients.

use std::time::Duration;

/// Longest a scrape may take before the progress line goes on without it.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// The few gateway figures the harness reports.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Snapshot {
    pub online_users: Option<f64>,
    pub connections_open: Option<f64>,
    pub rss_bytes: Option<f64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<f64>,
}

/// Scrapes the admin endpoints of one or more gateways.
#[derive(Debug, Clone)]
pub struct Gateway {
    http: reqwest::Client,
    urls: Vec<String>,
}

impl Gateway {
    /// Each of `admin` is `host:port` or a full `http://host:port` URL.
    pub fn new(admin: &[String]) -> Gateway {
        let urls = admin
            .iter()
            .map(|a| {
                let base = if a.starts_with("http://") { a.to_string() } else { format!("http://{a}") };
                format!("{}/metrics", base.trim_end_matches('/'))
            })
            .collect();
        let http = reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build().expect("a plain HTTP client builds");
        Gateway { http, urls }
    }

    /// The current figures, summed over the gateways (read concurrently, so the sum is of
    /// one moment); an error says which endpoint could not be read and why.
    pub async fn scrape(&self) -> Result<Snapshot, String> {
        let reads = self.urls.iter().map(|url| async move {
            async { self.http.get(url).send().await?.error_for_status()?.text().await }
                .await
                .map_err(|e| format!("{url}: {e}"))
        });
        let mut total: Option<Snapshot> = None;
        for body in futures_util::future::join_all(reads).await {
            let one = Snapshot::of(&body?);
            total = Some(match total {
                None => one,
                Some(sum) => sum.plus(&one),
            });
        }
        Ok(total.unwrap_or_default())
    }
}

// === impl Snapshot ===

impl Snapshot {
    fn of(body: &str) -> Snapshot {
        Snapshot {
            // Sessions, as the harness counts clients (one per device); a gateway from
            // before devices has one session per online user.
            online_users: sample(body, "idlegate_online_sessions").or_else(|| sample(body, "idlegate_online_users")),
            connections_open: total(body, "idlegate_connections_open"),
            rss_bytes: sample(body, "process_resident_memory_bytes"),
            cpu_seconds: sample(body, "process_cpu_seconds_total"),
            open_fds: sample(body, "process_open_fds"),
        }
    }

    /// The sum with another gateway's figures; a figure either one lacks is unknown.
    fn plus(&self, other: &Snapshot) -> Snapshot {
        let sum = |a: Option<f64>, b: Option<f64>| Some(a? + b?);
        Snapshot {
            online_users: sum(self.online_users, other.online_users),
            connections_open: sum(self.connections_open, other.connections_open),
            rss_bytes: sum(self.rss_bytes, other.rss_bytes),
            cpu_seconds: sum(self.cpu_seconds, other.cpu_seconds),
            open_fds: sum(self.open_fds, other.open_fds),
        }
    }
}

/// The sum of every series of `name` (labelled or not) in a Prometheus text body: the
/// gateway counts open connections by door.
fn total(body: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = body
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = if rest.starts_with('{') { &rest[rest.find('}')? + 1..] } else { rest };
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The value of the unlabelled sample `name` in a Prometheus text body.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_every_label() {
        let body = "idlegate_connections_open{transport=\"tcp\"} 3\nidlegate_connections_open{transport=\"ws\"} 4\n\
                    idlegate_connections_open_total 9\n";
        assert_eq!(total(body, "idlegate_connections_open"), Some(7.0));
        assert_eq!(total(body, "idlegate_online_users"), None);
    }

    #[test]
    fn reads_unlabelled_samples_only() {
        let body = "# HELP x\nidlegate_online_users 42\nidlegate_online_users_total 7\nprocess_cpu_seconds_total 1.5\n";
        assert_eq!(sample(body, "idlegate_online_users"), Some(42.0));
        assert_eq!(sample(body, "process_cpu_seconds_total"), Some(1.5));
        assert_eq!(sample(body, "nope"), None);
    }

    #[test]
    fn several_gateways_add_up() {
        let a = Snapshot::of("idlegate_online_users 3\nprocess_cpu_seconds_total 1.5\n");
        let b = Snapshot::of("idlegate_online_users 4\nprocess_cpu_seconds_total 0.5\nprocess_open_fds 9\n");
        let sum = a.plus(&b);
        assert_eq!(sum.online_users, Some(7.0));
        assert_eq!(sum.cpu_seconds, Some(2.0));
        assert_eq!(sum.open_fds, None, "one gateway did not say");
    }
}
