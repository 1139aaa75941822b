//! The relay: follows the event log and POSTs its events, in order and in batches, until
//! each batch is acknowledged (any 2xx), retrying the same batch (same `webhook-id`, same
//! body) with full-jitter exponential backoff otherwise. The log is the buffer: the relay
//! reads a batch ahead at most, so a receiver that is down never costs the gateway more
//! than the log's own bounds, and a relay that falls behind them sends a `gap`.
//!
//! In a cluster one node relays the shared stream at a time: it holds the turn in the
//! store ([`RelayTurn`]), checks it before every request, renews it while idle, and records
//! each acknowledged batch's position there. When it dies or pauses past the turn, another
//! node takes the turn and continues after the last acknowledged batch; the paused one,
//! finding its turn gone, sends nothing more. A request keeps the turn while it is open
//! (a receiver may take up to `--webhook-timeout`, longer than the turn): it is renewed
//! every quarter of the lease, and a renewal that fails or is not confirmed within half the
//! turn drops the request before the turn can run out, so one batch is never in flight
//! from two nodes at once. Between a renewal and the request's next byte a pause can still
//! slip in: the check refuses an answer that took longer than half the turn, which leaves
//! that window at microseconds. A renewal that reaches the store late (a slow link) is
//! refused there, so a relay that cannot confirm its turn never keeps it from the others.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};

use crate::config::outbound::{self, Failure, OutboundError};
use crate::config::WebhookConfig;
use crate::metrics::{Metrics, WebhookResult};
use crate::presence::{unix_ms_now, write_event_data, Batch, Directory, EventId, RelayTurn};
use crate::proto::jittered_ms;
use crate::webhook::sign::signature;

/// The first retry's wait; each next one doubles it, up to `--webhook-max-backoff`.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// While finishing (shutdown), how long the log may stay quiet before the relay takes it as
/// delivered: the last sessions' offline events are written before the relay is told.
const FINISH_QUIET: Duration = Duration::from_millis(50);

/// How long the relay waits for each read of an earlier relay's batch in flight before it
/// sends what it has: those events are in the stream already, so a read returns at once
/// unless the stream lost them.
const INFLIGHT_READ: Duration = Duration::from_secs(1);

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
    /// Its place in the stream, for the acknowledged position (`None` for `start`).
    at: Option<EventId>,
    at_ms: u64,
    json: String,
}

/// How a relay's delivering ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Finishing, and the log stayed quiet: everything read was delivered.
    Delivered,
    /// Finishing, and the drain deadline passed first.
    Deadline,
    /// This node no longer holds the turn (a cluster).
    LostTurn(Lost),
}

/// Why a relaying node stopped relaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// Another node holds the turn.
    Taken,
    /// Redis did not confirm the turn in time (unreachable, slow, or this process paused):
    /// not knowing, the relay stops before the turn may run out.
    Unconfirmed,
}

impl Lost {
    fn log(self) {
        match self {
            Lost::Taken => tracing::warn!("webhook: another node holds the relay's turn now; it relays"),
            Lost::Unconfirmed => tracing::warn!(
                "webhook: Redis did not confirm this node's relay turn in time; stopping until it is held again"
            ),
        }
    }
}

/// The cluster's turn, as the relaying node holds it.
struct Turn {
    store: Arc<dyn RelayTurn>,
    /// How long each renewal holds the turn: three quarters of the node lease, renewed
    /// every quarter, so a dead relay's turn is taken within the lease.
    ttl: Duration,
    every: Duration,
}

impl Turn {
    fn new(store: Arc<dyn RelayTurn>, lease: Duration) -> Turn {
        Turn { store, ttl: lease * 3 / 4, every: lease / 4 }
    }

    /// Takes or keeps the turn. `Err` if another node holds it, if the store does not
    /// answer within half the turn (nobody can tell), or if the answer took so long that
    /// the turn may have run out meanwhile (this process was paused): a relay that is not
    /// sure sends nothing.
    async fn keep(&self) -> Result<(), Lost> {
        let asked = Instant::now();
        match timeout(self.ttl / 2, self.store.hold(self.ttl)).await {
            Ok(Ok(true)) if asked.elapsed() < self.ttl / 2 => Ok(()),
            Ok(Ok(false)) => Err(Lost::Taken),
            _ => Err(Lost::Unconfirmed),
        }
    }

    /// Runs `work` (a request) while keeping the turn every quarter of the lease; drops it
    /// and answers `Err` as soon as a renewal fails. The last renewal confirmed was asked at
    /// most `every + ttl / 2` before the drop, inside the turn it set: the request ends
    /// before another node can take the turn.
    async fn holding<F: std::future::Future>(&self, work: F) -> Result<F::Output, Lost> {
        tokio::pin!(work);
        let mut renew = tokio::time::interval_at(Instant::now() + self.every, self.every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                out = &mut work => return Ok(out),
                _ = renew.tick() => self.keep().await?,
            }
        }
    }
}

/// The relay of one process; see the module documentation.
pub struct Relay {
    config: WebhookConfig,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    directory: Arc<dyn Directory>,
    /// Alone: the log from the relay's creation on.
    stream: Option<BoxStream<'static, Batch>>,
    /// In a cluster: the turn to relay the shared stream, and the node lease.
    shared: Option<(Arc<dyn RelayTurn>, Duration)>,
    /// This node's id, JSON-quoted, as events name it.
    node: String,
    /// The relay was failing at its last attempt: the log says so once, not per retry.
    failing: bool,
}

// === impl Relay ===

impl Relay {
    /// A relay of `directory`'s events: this process's log from now on when alone, or, with
    /// `shared` (a cluster's turn and its `--node-lease`), the shared stream whenever this
    /// node holds the turn.
    pub(crate) fn new(
        config: WebhookConfig,
        directory: Arc<dyn Directory>,
        shared: Option<(Arc<dyn RelayTurn>, Duration)>,
        metrics: Arc<Metrics>,
        node: &str,
    ) -> Result<Relay, WebhookError> {
        let user_agent = format!("idlegate/{} (node {node})", env!("CARGO_PKG_VERSION"));
        let redirect = reqwest::redirect::Policy::none();
        let client = outbound::client(config.timeout, user_agent, config.ca_file.as_deref(), redirect, true).map_err(
            |e| match e {
                OutboundError::CaFile(why) => WebhookError::CaFile(why),
                OutboundError::Client(why) => WebhookError::Client(why),
            },
        )?;
        let node = Value::String(node.to_string()).to_string();
        // Alone, followed from now, before any door opens: the first login's events are
        // the relay's too. A cluster's relay follows from the acknowledged position once it
        // holds the turn.
        let stream = shared.is_none().then(|| directory.follow(None));
        Ok(Relay { config, client, metrics, directory, stream, shared, node, failing: false })
    }

    /// Delivers events until `finish` holds a deadline; then delivers what the log holds
    /// and returns, or gives up at the deadline, logging what was not delivered.
    pub async fn run(mut self, mut finish: watch::Receiver<Option<Instant>>) {
        match self.shared.take() {
            None => {
                let Some(stream) = self.stream.take() else { return };
                let mut queue = VecDeque::from([self.start()]);
                self.relay(stream, &mut queue, &mut finish, None, None).await;
            }
            Some((store, lease)) => self.run_shared(Turn::new(store, lease), finish).await,
        }
    }

    /// A cluster's relay: waits for the turn, relays from the acknowledged position while
    /// it holds it, and waits again when it loses it. On finishing it delivers what it
    /// read (by the deadline) and gives the turn up, so another node continues at once.
    async fn run_shared(mut self, turn: Turn, mut finish: watch::Receiver<Option<Instant>>) {
        loop {
            loop {
                if finish.borrow().is_some() {
                    return;
                }
                if turn.keep().await.is_ok() {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(turn.every) => {}
                    _ = finish.changed() => {}
                }
            }
            let mut until = None;
            let (from, mut queue) = match turn.store.acknowledged().await {
                // No position was acknowledged (the cluster's first relay, or Redis lost it
                // with its writes, as when it restarts empty): what came before the
                // position recorded now may never have reached the receiver, so it hears
                // of a gap first (nemesis seed 4). Nothing is lost silently.
                Ok(ack) if ack.recorded_now => {
                    tracing::warn!(after = %ack.after, "webhook: no acknowledged position in Redis; sending a gap first");
                    (ack.after, VecDeque::from([self.lost_position()]))
                }
                // Redis went back to an earlier state of the stream: the events it kept past
                // the position may have reached the receiver already, under other batches.
                Ok(ack) if ack.rewound => {
                    tracing::warn!(after = %ack.after, "webhook: Redis lost writes of the stream; sending a gap first");
                    (ack.after, VecDeque::from([self.lost_position()]))
                }
                Ok(ack) => {
                    until = ack.sending;
                    (ack.after, VecDeque::new())
                }
                Err(e) => {
                    tracing::debug!(error = %e, "webhook: the relay's position is out of reach");
                    tokio::time::sleep(turn.every).await;
                    continue;
                }
            };
            tracing::info!(after = %from, "webhook: this node relays the cluster's events");
            let stream = self.directory.follow(Some(from));
            let ended = self.relay(stream, &mut queue, &mut finish, Some(&turn), until).await;
            self.observe(&VecDeque::new());
            if let Ended::LostTurn(lost) = ended {
                lost.log();
                continue;
            }
            if finish.borrow().is_none() {
                // The stream ended without a finish: follow it again from the position.
                continue;
            }
            turn.store.give_up().await;
            return;
        }
    }

    /// Delivers `stream`'s events in batches until finishing (or, holding `turn`, until it
    /// is lost); acknowledges each batch to the turn's store. `until` is the last event of
    /// the batch an earlier relay had in flight: the first batch ends exactly there, so a
    /// receiver that took it sees it again only as a retry of the same `webhook-id`.
    async fn relay(
        &mut self,
        mut stream: BoxStream<'static, Batch>,
        queue: &mut VecDeque<Pending>,
        finish: &mut watch::Receiver<Option<Instant>>,
        turn: Option<&Turn>,
        mut until: Option<EventId>,
    ) -> Ended {
        let mut renew = turn.map(|turn| tokio::time::interval_at(Instant::now() + turn.every, turn.every));
        loop {
            let deadline = *finish.borrow();
            if queue.is_empty() {
                let batch = match deadline {
                    // Finishing: done once the log stays quiet.
                    Some(_) => timeout(FINISH_QUIET, stream.next()).await.ok().flatten(),
                    None => tokio::select! {
                        batch = stream.next() => batch,
                        _ = finish.changed() => continue,
                        // Idle, the relay keeps its turn, so no other node takes it over.
                        _ = async { match &mut renew { Some(r) => r.tick().await, None => std::future::pending().await } } => {
                            if let Some(turn) = turn {
                                if let Err(lost) = turn.keep().await {
                                    return Ended::LostTurn(lost);
                                }
                            }
                            continue;
                        }
                    },
                };
                let Some(batch) = batch else { break };
                self.take(batch, queue);
                if queue.is_empty() {
                    continue;
                }
            }
            // A burst gathers into one request, for at most the linger.
            let linger = Instant::now() + self.config.linger;
            while queue.len() < self.config.batch {
                match timeout_at(linger, stream.next()).await {
                    Ok(Some(batch)) => self.take(batch, queue),
                    _ => break,
                }
            }
            let mut n = queue.len().min(self.config.batch);
            if let Some(last) = until.take() {
                // Its events are in the stream already: read until the queue holds its last
                // (or passed it, when the stream was trimmed meanwhile).
                let reached = |queue: &VecDeque<Pending>| queue.iter().any(|p| p.at.is_some_and(|at| at >= last));
                while !reached(queue) {
                    match timeout(INFLIGHT_READ, stream.next()).await {
                        Ok(Some(batch)) => self.take(batch, queue),
                        _ => break,
                    }
                }
                let upto = queue.iter().take_while(|p| p.at.is_none_or(|at| at <= last)).count();
                if upto > 0 {
                    n = upto;
                }
            }
            if let Some((turn, Some(last))) = turn.zip(queue.get(n - 1).map(|p| p.at)) {
                match turn.store.sending(last).await {
                    Ok(true) => {}
                    Ok(false) => return Ended::LostTurn(Lost::Taken),
                    Err(_) => return Ended::LostTurn(Lost::Unconfirmed),
                }
            }
            match self.deliver(queue, n, finish, turn).await {
                Ended::Delivered => {}
                Ended::Deadline => {
                    tracing::warn!(
                        undelivered = queue.len(),
                        "webhook: the drain deadline passed before the receiver took these events"
                    );
                    return Ended::Deadline;
                }
                Ended::LostTurn(lost) => return Ended::LostTurn(lost),
            }
            if let (Some(turn), Some(through)) = (turn, queue.iter().take(n).filter_map(|p| p.at).max()) {
                match turn.store.acknowledge(through, turn.ttl).await {
                    Ok(true) => {}
                    // Delivered, not recorded: the next relay sends this batch again, with
                    // the same ids, which is what at-least-once allows.
                    Ok(false) => return Ended::LostTurn(Lost::Taken),
                    Err(_) => return Ended::LostTurn(Lost::Unconfirmed),
                }
            }
            queue.drain(..n);
            self.metrics.webhook_events.inc_by(n as u64);
            self.observe(queue);
        }
        self.observe(queue);
        Ended::Delivered
    }

    /// The `start` event the first batch of this process begins with: every session an
    /// earlier process on this node had has ended.
    fn start(&self) -> Pending {
        let at_ms = unix_ms_now();
        let id = format!("start-{at_ms}");
        let json = format!(r#"{{"id":"{id}","type":"start","node":{},"at_ms":{at_ms}}}"#, self.node);
        Pending { id, at: None, at_ms, json }
    }

    /// The `gap` a cluster's relay sends when it finds no acknowledged position: how much
    /// the receiver missed is unknown (`missed` null, `earlier_stream` as on the stream).
    fn lost_position(&self) -> Pending {
        let at_ms = unix_ms_now();
        let id = format!("gap-{at_ms}");
        let json = format!(r#"{{"id":"{id}","type":"gap","missed":null,"earlier_stream":true}}"#);
        Pending { id, at: None, at_ms, json }
    }

    /// Renders `batch`'s wanted events (a `gap` first if the relay fell behind the log).
    fn take(&self, batch: Batch, queue: &mut VecDeque<Pending>) {
        if batch.has_gap() {
            let id = batch.gap_id.to_string();
            let json = format!(r#"{{"id":"{id}","type":"gap","missed":{}}}"#, batch.missed_json());
            queue.push_back(Pending { id, at: Some(batch.gap_id), at_ms: unix_ms_now(), json });
        }
        for event in batch.events.iter().filter(|e| self.config.wants(e.what.kind())) {
            let id = event.id.to_string();
            let mut json = format!(r#"{{"id":"{id}","type":"{}","#, event.what.name());
            let start = json.len();
            write_event_data(&mut json, event, &self.node);
            // The data object's own braces go: its fields join the id and the type.
            json.replace_range(start..start + 1, "");
            queue.push_back(Pending { id, at: Some(event.id), at_ms: event.at_ms, json });
        }
        self.observe(queue);
    }

    /// POSTs the first `n` of `queue` until a 2xx takes them. Ends early at the deadline of
    /// a finish, or, holding `turn`, as soon as it is lost: checked before every attempt.
    async fn deliver(
        &mut self,
        queue: &VecDeque<Pending>,
        n: usize,
        finish: &mut watch::Receiver<Option<Instant>>,
        turn: Option<&Turn>,
    ) -> Ended {
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
            if let Some(turn) = turn {
                if let Err(lost) = turn.keep().await {
                    return Ended::LostTurn(lost);
                }
            }
            let timestamp = unix_ms_now() / 1000;
            let signed = signature(&self.config.secrets.current(), &id, timestamp, body.as_bytes());
            let request = self
                .client
                .post(&self.config.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signed)
                .body(body.clone());
            let sent = match turn {
                None => request.send().await,
                Some(turn) => match turn.holding(request.send()).await {
                    Ok(sent) => sent,
                    Err(lost) => return Ended::LostTurn(lost),
                },
            };
            let result = match sent {
                Ok(answer) if answer.status().is_success() => WebhookResult::Ok,
                Ok(answer) => {
                    self.failed(&format!("the receiver answered {}", answer.status()));
                    WebhookResult::Status
                }
                Err(e) => {
                    let result = classify(&e);
                    self.failed(&outbound::describe(e));
                    result
                }
            };
            self.metrics.webhook_request(result);
            if result == WebhookResult::Ok {
                if self.failing {
                    self.failing = false;
                    tracing::info!(url = %self.config.url_for_logs(), "webhook: delivering again");
                }
                return Ended::Delivered;
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
                        return Ended::Deadline;
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
            tracing::warn!(url = %self.config.url_for_logs(), why, "webhook: delivery failing; retrying with backoff");
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
    match outbound::failure(e) {
        Failure::Timeout => WebhookResult::Timeout,
        Failure::Tls => WebhookResult::Tls,
        Failure::Connect => WebhookResult::Connect,
    }
}
