//! The nemesis's clients and backend actions: each client slot logs in on a random node as
//! one device of its uid (several slots share a uid), pings for a while, then logs out, falls
//! silent until the gateway expires it, or drops its connection, and starts again. A backend
//! task pushes to random uids and kicks random devices through the API of random nodes.
//!
//! Every session a client had is written to `clients.jsonl`: its uid, device, node and
//! session id, when it began and ended (ms since the run's start), whether the client kept
//! pinging to its end, and how it ended. The checker holds a pinging client on a healthy
//! node to its session (`session_lost_on_healthy_node`).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use idlegate_proto::{CloseReason, Device, Frame, FrameCodec, DEFAULT_MAX_FRAME_BYTES};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::schedule::SplitMix64;

/// Longest a connect or a LOGIN's answer may take before the client tries another node: a
/// stopped or stalled node accepts (the kernel does) but never answers.
const ANSWER_PATIENCE: Duration = Duration::from_secs(3);

/// Devices per uid: one uid's sessions on several nodes at once is what makes its user
/// events interesting.
pub const DEVICES_PER_UID: u64 = 3;

/// The first uid; uids are `FIRST_UID..FIRST_UID + clients / DEVICES_PER_UID`.
pub const FIRST_UID: u64 = 1_000;

/// How a session ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// It logged out and got BYE(logout).
    Logout,
    /// It closed its connection.
    Dropped,
    /// It fell silent and got BYE(idle_timeout).
    Expired,
    /// BYE(kicked): the backend's kick.
    Kicked,
    /// Anything else: a BYE it did not ask for, or the connection gone without one.
    Lost,
}

/// One line of `clients.jsonl`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRecord {
    pub uid: u64,
    pub device: String,
    pub node: String,
    pub session: String,
    pub from_ms: u64,
    pub to_ms: u64,
    /// The client pinged on time until the session ended (it was not silent by choice).
    pub pinging: bool,
    pub end: End,
    /// The BYE's reason or what else happened, for a human reading the file.
    pub detail: String,
}

/// What clients and the backend task share.
pub struct Churn {
    pub nodes: Vec<(String, SocketAddr, SocketAddr)>,
    pub timeout: Duration,
    pub started: Instant,
    pub records: Mutex<std::io::BufWriter<std::fs::File>>,
    pub sessions: AtomicU64,
    pub pushes: AtomicU64,
    pub kicks: AtomicU64,
}

impl Churn {
    fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn record(&self, r: &SessionRecord) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        let mut out = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let _ = serde_json::to_writer(&mut *out, r);
        let _ = out.write_all(b"\n");
    }

    pub fn flush(&self) {
        let _ = self.records.lock().unwrap_or_else(|e| e.into_inner()).flush();
    }
}

type Conn = Framed<TcpStream, FrameCodec>;

/// One client slot until `stop`: sessions one after another.
pub async fn client(churn: Arc<Churn>, slot: u64, seed: u64, stop: CancellationToken) {
    let mut rng = SplitMix64::new(seed ^ slot.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let uid = FIRST_UID + slot / DEVICES_PER_UID;
    let device = format!("d{}", slot % DEVICES_PER_UID);
    let timeout_ms = churn.timeout.as_millis() as u64;
    // Spread the first logins over a second.
    sleep(Duration::from_millis(rng.between(0, 1_000))).await;
    while !stop.is_cancelled() {
        let (node, addr, _) = churn.nodes[rng.between(0, churn.nodes.len() as u64 - 1) as usize].clone();
        let Some((mut conn, session)) = login(addr, uid, &device).await else {
            sleep(Duration::from_millis(rng.between(100, 1_000))).await;
            continue;
        };
        let from_ms = churn.ms();
        let life = Duration::from_millis(rng.between(timeout_ms / 2, timeout_ms * 4));
        let ping_every = Duration::from_millis(timeout_ms / 4);
        let mut record = SessionRecord {
            uid,
            device: device.clone(),
            node,
            session,
            from_ms,
            to_ms: 0,
            pinging: true,
            end: End::Lost,
            detail: String::new(),
        };
        let until = Instant::now() + life;
        // Ping until its life is over (or the run's), unless the session ends first.
        let ended = loop {
            tokio::select! {
                _ = sleep(ping_every.min(until.saturating_duration_since(Instant::now()))) => {
                    if Instant::now() >= until || stop.is_cancelled() {
                        break None;
                    }
                    if conn.send(Frame::Ping(Bytes::new())).await.is_err() {
                        break Some((End::Lost, "the connection failed on a PING".to_string()));
                    }
                }
                frame = conn.next() => {
                    if let Some(end) = ended_by(frame) {
                        break Some(end);
                    }
                }
                _ = stop.cancelled() => break None,
            }
        };
        let (end, detail) = match ended {
            Some(end) => end,
            None => match if stop.is_cancelled() { 0 } else { rng.between(0, 99) } {
                // Silent: the gateway must expire it (after at most the timeout, plus what a
                // fault in between may add).
                0..=19 if !stop.is_cancelled() => {
                    record.pinging = false;
                    let patience = churn.timeout * 3;
                    match timeout(patience, ended_by_next(&mut conn)).await {
                        Ok((End::Lost, d)) if d == "BYE(idle_timeout)" => (End::Expired, d),
                        Ok(end) => end,
                        Err(_) => (End::Lost, format!("no BYE within {patience:?} of silence")),
                    }
                }
                20..=39 => {
                    record.pinging = false;
                    (End::Dropped, "the client closed its connection".to_string())
                }
                _ => {
                    let _ = conn.send(Frame::Logout).await;
                    match timeout(ANSWER_PATIENCE, ended_by_next(&mut conn)).await {
                        Ok((End::Lost, d)) if d == "BYE(logout)" => (End::Logout, d),
                        Ok(end) => end,
                        Err(_) => (End::Lost, "no BYE(logout) after a LOGOUT".to_string()),
                    }
                }
            },
        };
        drop(conn);
        record.to_ms = churn.ms();
        record.end = end;
        record.detail = detail;
        churn.record(&record);
        if !stop.is_cancelled() {
            sleep(Duration::from_millis(rng.between(0, 1_000))).await;
        }
    }
}

/// Connects to `addr` and logs in; the connection and the session's id, or None when the
/// node did not welcome it in time.
async fn login(addr: SocketAddr, uid: u64, device: &str) -> Option<(Conn, String)> {
    let stream = timeout(ANSWER_PATIENCE, TcpStream::connect(addr)).await.ok()?.ok()?;
    let mut conn = Framed::new(stream, FrameCodec::new(DEFAULT_MAX_FRAME_BYTES));
    let device: Device = device.parse().ok()?;
    timeout(ANSWER_PATIENCE, conn.send(Frame::Login { uid, token: Bytes::new(), device, timeout_ms: None }))
        .await
        .ok()?
        .ok()?;
    match timeout(ANSWER_PATIENCE, conn.next()).await.ok()?? {
        Ok(Frame::Welcome { session, .. }) => Some((conn, session)),
        _ => None,
    }
}

/// What ends a session among the frames a client reads: a BYE (kicked is the backend's) or
/// the connection's end; PONGs and PUSHes go on.
fn ended_by(frame: Option<Result<Frame, idlegate_proto::FrameError>>) -> Option<(End, String)> {
    match frame {
        Some(Ok(Frame::Bye { reason: CloseReason::Kicked, .. })) => Some((End::Kicked, "BYE(kicked)".into())),
        Some(Ok(Frame::Bye { reason, .. })) => Some((End::Lost, format!("BYE({})", reason.label()))),
        Some(Ok(_)) => None,
        Some(Err(e)) => Some((End::Lost, format!("read: {e}"))),
        None => Some((End::Lost, "the connection closed without a BYE".into())),
    }
}

async fn ended_by_next(conn: &mut Conn) -> (End, String) {
    loop {
        if let Some(end) = ended_by(conn.next().await) {
            return end;
        }
    }
}

/// The backend: pushes to a random uid every [`PUSH_EVERY`] and kicks a random device every
/// [`KICK_EVERY`], each through a random node's API, until `stop`. Refusals (a node down, a
/// uid offline) are expected under faults and only counted.
pub async fn backend(churn: Arc<Churn>, uids: u64, seed: u64, stop: CancellationToken) {
    let http = reqwest::Client::builder().timeout(ANSWER_PATIENCE).build().expect("a plain HTTP client builds");
    let mut rng = SplitMix64::new(seed ^ 0xbac4_e4d0);
    let mut turn = 0u64;
    while !stop.is_cancelled() {
        tokio::select! {
            _ = sleep(PUSH_EVERY) => {}
            _ = stop.cancelled() => return,
        }
        turn += 1;
        let api = churn.nodes[rng.between(0, churn.nodes.len() as u64 - 1) as usize].2;
        let uid = FIRST_UID + rng.between(0, uids - 1);
        let sent = if turn.is_multiple_of((KICK_EVERY.as_millis() / PUSH_EVERY.as_millis()) as u64) {
            let device = rng.between(0, DEVICES_PER_UID - 1);
            churn.kicks.fetch_add(1, Ordering::Relaxed);
            http.delete(format!("http://{api}/v1/sessions/{uid}?device=d{device}")).send().await
        } else {
            churn.pushes.fetch_add(1, Ordering::Relaxed);
            let body = serde_json::json!({"uids": [uid], "payload": "bmVtZXNpcw=="});
            http.post(format!("http://{api}/v1/push")).json(&body).send().await
        };
        let _ = sent;
    }
}

/// How often the backend acts.
const PUSH_EVERY: Duration = Duration::from_millis(200);
const KICK_EVERY: Duration = Duration::from_secs(2);
