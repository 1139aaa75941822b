//! Reads the gateway's `/metrics`: its own count of online users, its memory and its CPU, so
//! the report can set the gateway's view beside the harness's.

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

/// Scrapes one gateway's admin endpoint.
#[derive(Debug, Clone)]
pub struct Gateway {
    http: reqwest::Client,
    url: String,
}

impl Gateway {
    /// `admin` is `host:port` or a full `http://host:port` URL.
    pub fn new(admin: &str) -> Gateway {
        let base = if admin.starts_with("http://") { admin.to_string() } else { format!("http://{admin}") };
        let http = reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build().expect("a plain HTTP client builds");
        Gateway { http, url: format!("{}/metrics", base.trim_end_matches('/')) }
    }

    /// The current figures; an error says why the endpoint could not be read.
    pub async fn scrape(&self) -> Result<Snapshot, String> {
        let body = async { self.http.get(&self.url).send().await?.error_for_status()?.text().await }
            .await
            .map_err(|e| format!("{}: {e}", self.url))?;
        Ok(Snapshot {
            online_users: sample(&body, "idlegate_online_users"),
            connections_open: sample(&body, "idlegate_connections_open"),
            rss_bytes: sample(&body, "process_resident_memory_bytes"),
            cpu_seconds: sample(&body, "process_cpu_seconds_total"),
            open_fds: sample(&body, "process_open_fds"),
        })
    }
}

/// The value of the unlabelled sample `name` in a Prometheus text body.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_unlabelled_samples_only() {
        let body = "# HELP x\nidlegate_online_users 42\nidlegate_online_users_total 7\nprocess_cpu_seconds_total 1.5\n";
        assert_eq!(sample(body, "idlegate_online_users"), Some(42.0));
        assert_eq!(sample(body, "process_cpu_seconds_total"), Some(1.5));
        assert_eq!(sample(body, "nope"), None);
    }
}
