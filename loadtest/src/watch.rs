//! `loadtest watch`: what watch lists cost one gateway or a cluster (issue 52). Many watchers, each
//! watching many uids, and a few of those uids changing their status at a steady rate:
//! the gateway's memory per watch entry, its CPU per delivered change, and the time from a
//! change to each watcher (p50, p99), then one uid every watcher watches (a celebrity):
//! the time from its change to the last watcher.
//!
//! A change here is a STATUS of an online uid: it takes the same path as a `user_online` or
//! a `user_offline` (the event log, the fan-out, each watcher's queue) without a connection
//! opened or closed per transition, so the driver stays cheap and the figures are the
//! fan-out's. Its time starts when the STATUS is written: the gateway's own handling of the
//! frame is in it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use clap::Parser;
use hdrhistogram::Histogram;
use idlegate_proto::{Frame, FrameCodec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::gateway::Gateway;
use crate::stats::Percentiles;

/// How long the harness waits for every watcher to have its snapshot, or every change to
/// arrive, before it calls the gateway stuck.
const PATIENCE: Duration = Duration::from_secs(120);

/// Watchers connecting at once: logins in flight, well under the gateway's pending bound.
const CONNECT_AT_ONCE: usize = 256;

/// `loadtest watch`'s command line.
#[derive(Debug, Parser)]
#[command(name = "loadtest watch", about = "Measures what watch lists cost one idlegate gateway")]
pub struct WatchArgs {
    /// The gateway's TCP door; several, comma-separated, for a cluster: watcher `w` and
    /// changing uid `i` log in on door `w` and `i` modulo their number.
    #[arg(long, value_delimiter = ',', required = true)]
    pub addr: Vec<SocketAddr>,
    /// The gateways' admin listeners (their /metrics: memory, CPU, PRESENCE entries, summed
    /// over them), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub admin: Vec<String>,
    /// Watchers: one connection and one uid each.
    #[arg(long, default_value_t = 19_000)]
    pub watchers: u64,
    /// uids each watcher watches, spread over --watched.
    #[arg(long, default_value_t = 200)]
    pub per_watcher: u64,
    /// uids watched in all (most of them offline); each is watched by watchers x
    /// per-watcher / watched watchers.
    #[arg(long, default_value_t = 10_000)]
    pub watched: u64,
    /// Of the watched uids, how many are online and change their status.
    #[arg(long, default_value_t = 200)]
    pub changing: u64,
    /// Changes a second, spread over the changing uids in turn.
    #[arg(long, default_value_t = 50)]
    pub rate: u64,
    /// How long the changes go on.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Changes of the celebrity (a uid every watcher watches), one at a time.
    #[arg(long, default_value_t = 10)]
    pub celebrity_changes: u64,
    /// Where to write the report (JSON); printed either way.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// Where the watched uids start: far from the watchers' own.
const WATCHED_BASE: u64 = 1_000_000_000;

/// The watchers' uids start here.
const WATCHER_BASE: u64 = 2_000_000_000;

/// The report.
#[derive(Debug, serde::Serialize)]
struct Report {
    watchers: u64,
    per_watcher: u64,
    watch_entries: u64,
    watched: u64,
    changing: u64,
    rate: u64,
    /// The gateway's resident memory with the watchers logged in, before and after their
    /// WATCHes, and the difference per watch entry.
    rss_before: f64,
    rss_after: f64,
    bytes_per_entry: f64,
    /// Changes sent, PRESENCE change entries the gateway counted, and the watchers' receipts.
    changes: u64,
    delivered: f64,
    received: u64,
    /// The gateway's CPU during the changes, per delivered change, in microseconds.
    cpu_seconds: f64,
    cpu_us_per_delivery: f64,
    /// From a STATUS written to its change read by a watcher, in milliseconds.
    latency_ms: Percentiles,
    /// The celebrity: from its STATUS written to the last of the watchers reading it, in
    /// milliseconds, each change.
    celebrity_last_ms: Vec<f64>,
}

/// One watcher's socket, read by its own task.
struct Watcher {
    stream: TcpStream,
    buf: BytesMut,
    codec: FrameCodec,
}

impl Watcher {
    async fn connect(addr: SocketAddr, uid: u64) -> Result<Watcher, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("{addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut w = Watcher { stream, buf: BytesMut::new(), codec: FrameCodec::new(u32::MAX) };
        w.send(&Frame::Login { uid, token: bytes::Bytes::new(), device: Default::default(), timeout_ms: None }).await?;
        match w.recv().await? {
            Frame::Welcome { .. } => Ok(w),
            other => Err(format!("uid {uid}: expected WELCOME, got {other:?}")),
        }
    }

    async fn send(&mut self, frame: &Frame) -> Result<(), String> {
        let mut out = BytesMut::new();
        self.codec.encode(frame, &mut out).map_err(|e| e.to_string())?;
        self.stream.write_all(&out).await.map_err(|e| e.to_string())
    }

    async fn recv(&mut self) -> Result<Frame, String> {
        loop {
            if let Some(frame) = self.codec.decode(&mut self.buf).map_err(|e| e.to_string())? {
                return Ok(frame);
            }
            if self.stream.read_buf(&mut self.buf).await.map_err(|e| e.to_string())? == 0 {
                return Err("the gateway closed the connection".into());
            }
        }
    }
}

/// What the driver says of each changing uid's latest change: its status's number and
/// when it was written (nanoseconds since the run's start), packed, and what the readers
/// gather.
struct Shared {
    start: Instant,
    /// Per watched uid (by index): the status number of the latest change << 40 | the
    /// nanoseconds (since start) it was written at, in 40 bits (18 minutes).
    sent: Vec<AtomicU64>,
    received: AtomicU64,
    latency: Mutex<Histogram<u64>>,
    /// The celebrity's latest change number, and when each watcher read each (by number).
    celebrity_seen: Mutex<HashMap<u64, (u64, u64)>>,
}

const NANOS_BITS: u32 = 40;

fn pack(number: u64, nanos: u64) -> u64 {
    (number << NANOS_BITS) | (nanos & ((1 << NANOS_BITS) - 1))
}

/// The uids watcher `w` watches: `per` of them, spread evenly over `watched`, and the
/// celebrity (the first watched uid).
fn list_of(w: u64, per: u64, watched: u64) -> Vec<u64> {
    let step = (watched / per).max(1);
    let mut uids: Vec<u64> = (0..per).map(|j| WATCHED_BASE + (w + j * step) % watched).collect();
    uids.push(WATCHED_BASE);
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// Runs the measurement; `Ok(())` once the report is written.
pub async fn run(args: &WatchArgs) -> Result<(), String> {
    // A socket a watcher: take every descriptor the hard limit allows.
    rlimit::increase_nofile_limit(u64::MAX).map_err(|e| format!("raising the open-file limit: {e}"))?;
    let gateway = Gateway::new(&args.admin);
    let door = |n: u64| args.addr[n as usize % args.addr.len()];
    let shared = Arc::new(Shared {
        start: Instant::now(),
        sent: (0..args.watched).map(|_| AtomicU64::new(0)).collect(),
        received: AtomicU64::new(0),
        latency: Mutex::new(crate::stats::histogram()),
        celebrity_seen: Mutex::new(HashMap::new()),
    });
    // The changing uids, online, and the celebrity among them (the first).
    let mut changing = Vec::new();
    for i in 0..args.changing.max(1) {
        changing.push(Watcher::connect(door(i), WATCHED_BASE + i).await?);
    }
    eprintln!("watch: {} changing uids online; logging {} watchers in", changing.len(), args.watchers);
    let mut watchers = Vec::with_capacity(args.watchers as usize);
    let ids: Vec<u64> = (0..args.watchers).collect();
    for chunk in ids.chunks(CONNECT_AT_ONCE) {
        let logins = chunk.iter().map(|&w| Watcher::connect(door(w), WATCHER_BASE + w));
        for w in futures_util::future::join_all(logins).await {
            watchers.push(w?);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = gateway.scrape().await?;
    eprintln!("watch: {} watchers in; each WATCHes {} uids", watchers.len(), args.per_watcher);
    let (snapshots_tx, mut snapshots_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut readers = Vec::new();
    let mut entries = 0;
    for (w, mut watcher) in watchers.into_iter().enumerate() {
        let list = list_of(w as u64, args.per_watcher, args.watched);
        entries += list.len() as u64;
        for chunk in list.chunks(1024) {
            watcher.send(&Frame::Watch(chunk.to_vec())).await?;
        }
        let (shared, snapshots) = (shared.clone(), snapshots_tx.clone());
        let mut owed = list.len();
        readers.push(tokio::spawn(async move {
            while let Ok(frame) = watcher.recv().await {
                let Frame::Presence { kind, entries } = frame else { continue };
                let now = shared.start.elapsed().as_nanos() as u64;
                if kind != idlegate_proto::PresenceKind::Change {
                    owed = owed.saturating_sub(entries.len());
                    if owed == 0 {
                        let _ = snapshots.send(());
                        owed = usize::MAX;
                    }
                    continue;
                }
                for e in entries {
                    let Some(slot) = e.uid.checked_sub(WATCHED_BASE).and_then(|i| shared.sent.get(i as usize)) else {
                        continue;
                    };
                    let sent = slot.load(Ordering::Acquire);
                    let number: u64 = e.status.parse().unwrap_or(u64::MAX);
                    if number != sent >> NANOS_BITS {
                        continue;
                    }
                    let took = now.saturating_sub(sent & ((1 << NANOS_BITS) - 1));
                    shared.received.fetch_add(1, Ordering::Relaxed);
                    if e.uid == WATCHED_BASE {
                        let mut seen = shared.celebrity_seen.lock().expect("not poisoned");
                        let entry = seen.entry(number).or_insert((0, 0));
                        entry.0 += 1;
                        entry.1 = entry.1.max(took);
                    } else {
                        let _ = shared.latency.lock().expect("not poisoned").record((took / 1_000).max(1));
                    }
                }
            }
        }));
    }
    drop(snapshots_tx);
    let deadline = Instant::now() + PATIENCE;
    for got in 0..args.watchers {
        match tokio::time::timeout_at(deadline, snapshots_rx.recv()).await {
            Ok(Some(())) => {}
            _ => return Err(format!("only {got} of {} watchers had their snapshots in time", args.watchers)),
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = gateway.scrape().await?;
    let rss = |s: &crate::gateway::Snapshot| s.rss_bytes.unwrap_or(0.0);
    eprintln!("watch: {entries} watch entries; the gateway grew {:.0} MB", (rss(&after) - rss(&before)) / 1e6);

    // Changes of the non-celebrity changing uids, in turn, at the rate.
    let delivered_before = presence_changes(&args.admin).await?;
    let cpu_before = after.cpu_seconds.unwrap_or(0.0);
    let every = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    let until = Instant::now() + args.duration;
    let mut next = Instant::now();
    let mut changes = 0u64;
    let others = changing.len().max(2) - 1;
    while Instant::now() < until {
        tokio::time::sleep_until(next).await;
        next += every;
        let i = 1 + (changes as usize % others);
        let Some(uid) = changing.get_mut(i) else { break };
        changes += 1;
        let at = shared.start.elapsed().as_nanos() as u64;
        shared.sent[i].store(pack(changes, at), Ordering::Release);
        uid.send(&Frame::Status(changes.to_string())).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = gateway.scrape().await?;
    let delivered = presence_changes(&args.admin).await? - delivered_before;
    let cpu_seconds = during.cpu_seconds.unwrap_or(0.0) - cpu_before;

    // The celebrity, one change at a time: each waits for every watcher.
    let mut celebrity_last_ms = Vec::new();
    for c in 0..args.celebrity_changes {
        // Numbers of their own, above any of the changes before (which fit in 23 bits).
        let number = (1 << 23) + c;
        let at = shared.start.elapsed().as_nanos() as u64;
        shared.sent[0].store(pack(number, at), Ordering::Release);
        changing[0].send(&Frame::Status(number.to_string())).await?;
        let deadline = Instant::now() + PATIENCE;
        loop {
            let seen = shared.celebrity_seen.lock().expect("not poisoned").get(&number).copied();
            if let Some((n, last)) = seen.filter(|(n, _)| *n >= args.watchers) {
                debug_assert_eq!(n, args.watchers);
                celebrity_last_ms.push(last as f64 / 1e6);
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("celebrity change {c}: not every watcher read it in time"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let latency = Percentiles::of(&shared.latency.lock().expect("not poisoned"));
    let report = Report {
        watchers: args.watchers,
        per_watcher: args.per_watcher,
        watch_entries: entries,
        watched: args.watched,
        changing: args.changing,
        rate: args.rate,
        rss_before: rss(&before),
        rss_after: rss(&after),
        bytes_per_entry: (rss(&after) - rss(&before)) / entries.max(1) as f64,
        changes,
        delivered,
        received: shared.received.load(Ordering::Relaxed),
        cpu_seconds,
        cpu_us_per_delivery: cpu_seconds * 1e6 / delivered.max(1.0),
        latency_ms: latency,
        celebrity_last_ms,
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    println!("{json}");
    if let Some(path) = &args.out {
        std::fs::write(path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    for reader in readers {
        reader.abort();
    }
    Ok(())
}

/// The gateways' count of PRESENCE change entries owed to watchers, summed.
async fn presence_changes(admins: &[String]) -> Result<f64, String> {
    let mut sum = 0.0;
    for admin in admins {
        sum += presence_changes_of(admin).await?;
    }
    Ok(sum)
}

/// One gateway's count of PRESENCE change entries owed to watchers.
async fn presence_changes_of(admin: &str) -> Result<f64, String> {
    let url = format!("http://{}/metrics", admin.trim_start_matches("http://"));
    let body = reqwest::get(&url).await.map_err(|e| e.to_string())?.text().await.map_err(|e| e.to_string())?;
    body.lines()
        .find_map(|l| l.strip_prefix(r#"idlegate_presence_entries_total{kind="change"} "#))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("{url}: no idlegate_presence_entries_total{{kind=\"change\"}}"))
}
