//! The relay: follows the event log and POSTs its events, in order and in batches, until
//! each batch is acknowledged (any 2xx), retrying the same batch (same `webhook-id`, same
//! body) with full-jitter exponential backoff otherwise. The log is the buffer: the relay
//! reads a batch ahead at most, so a receiver that is down never costs the gateway more
//! than the log's own bounds, and a relay that falls behind them sends a `gap`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};

use crate::config::WebhookConfig;
use crate::metrics::{Metrics, WebhookResult};
use crate::presence::{unix_ms_now, write_event_data, Batch, Directory};
use crate::proto::jittered_ms;
use crate::webhook::sign::signature;

/// The first retry's wait; each next one doubles it, up to `--webhook-max-backoff`.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// While finishing (shutdown), how long the log may stay quiet before the relay takes it as
/// delivered: the last sessions' offline events are written before the relay is told.
const FINISH_QUIET: Duration = Duration::from_millis(50);

/// Why the relay could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("--webhook-ca-file: {0}")]
    CaFile(String),
    #[error("--webhook-url: {0}")]
    Client(String),
}

/// One event ready to send: its id and its JSON object.
struct Pending {
    id: String,
    at_ms: u64,
    json: String,
}

/// The relay of one process; see the module documentation.
pub struct Relay {
    config: WebhookConfig,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    /// The log from the relay's creation on.
    stream: Option<BoxStream<'static, Batch>>,
    /// This node's id, JSON-quoted, as events name it.
    node: String,
    /// The relay was failing at its last attempt: the log says so once, not per retry.
    failing: bool,
}

// === impl Relay ===

impl Relay {
    pub fn new(
        config: WebhookConfig,
        directory: Arc<dyn Directory>,
        metrics: Arc<Metrics>,
        node: &str,
    ) -> Result<Relay, WebhookError> {
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .user_agent(concat!("idlegate/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = &config.ca_file {
            let pem = std::fs::read(path).map_err(|e| WebhookError::CaFile(format!("{}: {e}", path.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| WebhookError::CaFile(format!("{}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(WebhookError::CaFile(format!("{}: no certificate", path.display())));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(|e| WebhookError::Client(e.to_string()))?;
        let node = Value::String(node.to_string()).to_string();
        // Followed from now, before any door opens: the first login's events are the
        // relay's too.
        let stream = Some(directory.follow(None));
        Ok(Relay { config, client, stream, metrics, node, failing: false })
    }

    /// Delivers events until `finish` holds a deadline; then delivers what the log holds
    /// and returns, or gives up at the deadline, logging what was not delivered.
    pub async fn run(mut self, mut finish: watch::Receiver<Option<Instant>>) {
        let Some(mut stream) = self.stream.take() else { return };
        let mut queue = VecDeque::new();
        queue.push_back(self.start());
        loop {
            let deadline = *finish.borrow();
            if queue.is_empty() {
                let batch = match deadline {
                    // Finishing: done once the log stays quiet.
                    Some(_) => timeout(FINISH_QUIET, stream.next()).await.ok().flatten(),
                    None => tokio::select! {
                        batch = stream.next() => batch,
                        _ = finish.changed() => continue,
                    },
                };
                let Some(batch) = batch else { break };
                self.take(batch, &mut queue);
                if queue.is_empty() {
                    continue;
                }
            }
            // A burst gathers into one request, for at most the linger.
            let linger = Instant::now() + self.config.linger;
            while queue.len() < self.config.batch {
                match timeout_at(linger, stream.next()).await {
                    Ok(Some(batch)) => self.take(batch, &mut queue),
                    _ => break,
                }
            }
            let n = queue.len().min(self.config.batch);
            if !self.deliver(&queue, n, &mut finish).await {
                tracing::warn!(
                    undelivered = queue.len(),
                    "webhook: the drain deadline passed before the receiver took these events"
                );
                return;
            }
            queue.drain(..n);
            self.metrics.webhook_events.inc_by(n as u64);
            self.observe(&queue);
        }
        self.observe(&queue);
    }

    /// The `start` event the first batch of this process begins with: every session an
    /// earlier process on this node had has ended.
    fn start(&self) -> Pending {
        let at_ms = unix_ms_now();
        let id = format!("start-{at_ms}");
        let json = format!(r#"{{"id":"{id}","type":"start","node":{},"at_ms":{at_ms}}}"#, self.node);
        Pending { id, at_ms, json }
    }

    /// Renders `batch`'s wanted events (a `gap` first if the relay fell behind the log).
    fn take(&self, batch: Batch, queue: &mut VecDeque<Pending>) {
        if batch.has_gap() {
            let id = batch.gap_id.to_string();
            let json = format!(r#"{{"id":"{id}","type":"gap","missed":{}}}"#, batch.missed);
            queue.push_back(Pending { id, at_ms: unix_ms_now(), json });
        }
        for event in batch.events.iter().filter(|e| self.config.wants(e.what.kind())) {
            let id = event.id.to_string();
            let mut json = format!(r#"{{"id":"{id}","type":"{}","#, event.what.name());
            let start = json.len();
            write_event_data(&mut json, event, &self.node);
            // The data object's own braces go: its fields join the id and the type.
            json.replace_range(start..start + 1, "");
            queue.push_back(Pending { id, at_ms: event.at_ms, json });
        }
        self.observe(queue);
    }

    /// POSTs the first `n` of `queue` until a 2xx takes them; `false` if the deadline of a
    /// finish passed first.
    async fn deliver(
        &mut self,
        queue: &VecDeque<Pending>,
        n: usize,
        finish: &mut watch::Receiver<Option<Instant>>,
    ) -> bool {
        debug_assert!(n > 0 && n <= queue.len());
        let id = queue[n - 1].id.clone();
        let mut body = String::with_capacity(16 + queue.iter().take(n).map(|p| p.json.len() + 1).sum::<usize>());
        body.push_str(r#"{"events":["#);
        for (i, pending) in queue.iter().take(n).enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&pending.json);
        }
        body.push_str("]}");
        let mut backoff = FIRST_BACKOFF;
        loop {
            let timestamp = unix_ms_now() / 1000;
            let signed = signature(&self.config.secrets, &id, timestamp, body.as_bytes());
            let request = self
                .client
                .post(&self.config.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signed)
                .body(body.clone());
            let result = match request.send().await {
                Ok(answer) if answer.status().is_success() => WebhookResult::Ok,
                Ok(answer) => {
                    self.failed(&format!("the receiver answered {}", answer.status()));
                    WebhookResult::Status
                }
                Err(e) => {
                    let result = classify(&e);
                    self.failed(&format!("{e:#}"));
                    result
                }
            };
            self.metrics.webhook_request(result);
            if result == WebhookResult::Ok {
                if self.failing {
                    self.failing = false;
                    tracing::info!(url = %self.config.url, "webhook: delivering again");
                }
                return true;
            }
            self.observe(queue);
            // Full jitter: anywhere from nothing to the backoff.
            let wait = Duration::from_millis(jittered_ms(Duration::ZERO, backoff));
            backoff = (backoff * 2).min(self.config.max_backoff);
            let until = Instant::now() + wait;
            loop {
                let deadline = *finish.borrow();
                if let Some(deadline) = deadline {
                    if until >= deadline {
                        return false;
                    }
                    sleep_until(until).await;
                    break;
                }
                tokio::select! {
                    _ = sleep_until(until) => break,
                    _ = finish.changed() => {}
                }
            }
        }
    }

    /// Logs the change from delivering to failing, once.
    fn failed(&mut self, why: &str) {
        if !self.failing {
            self.failing = true;
            tracing::warn!(url = %self.config.url, why, "webhook: delivery failing; retrying with backoff");
        }
    }

    /// The lag (age of the oldest event read and not acknowledged) and the backlog.
    fn observe(&self, queue: &VecDeque<Pending>) {
        let lag_ms = queue.front().map_or(0, |p| unix_ms_now().saturating_sub(p.at_ms));
        self.metrics.webhook_lag_seconds.set(lag_ms as f64 / 1000.0);
        self.metrics.webhook_backlog.set(queue.len() as i64);
    }
}

/// Which result a failed request counts as.
fn classify(e: &reqwest::Error) -> WebhookResult {
    if e.is_timeout() {
        return WebhookResult::Timeout;
    }
    // rustls's errors (a certificate not trusted, a handshake refused) are somewhere in the
    // chain of a connect error.
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(error) = source {
        if error.is::<rustls::Error>() {
            return WebhookResult::Tls;
        }
        // An io::Error's `source` skips the error it wraps (hyper-rustls wraps rustls's
        // error in two of them): the walk goes into the wrapped one instead.
        source = match error.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(wrapped) => Some(wrapped as &dyn std::error::Error),
            None => error.source(),
        };
    }
    WebhookResult::Connect
}
