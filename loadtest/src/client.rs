//! One simulated client, from connect to close: logs in, sends on its schedule, falls silent
//! if its role says so, and judges every close it gets against the expiry guarantee.
//!
//! Each client is one task that owns its socket and its own two deadlines (next send, and for
//! a silent client the latest acceptable expiry); there is no task per timer.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use idlegate_proto::CloseReason;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::door::{Conn, Door};
pub use crate::fleet::connect;
use crate::fleet::{Cell, Fleet, Reconnect};
use crate::payload::parse_push;
use crate::stats::{ClassReport, Stats};
use crate::tokens::Tokens;
use crate::wire::{Incoming, Wire};

/// Expiries later than `timeout` by more than this count as late: room for the sweep itself
/// and two loopback hops, far below a tick.
pub const LATE_TOLERANCE: Duration = Duration::from_millis(50);

/// Longest a client waits for the answer to its login.
const LOGIN_PATIENCE: Duration = Duration::from_secs(10);

/// Read buffer per client: replies are a few bytes; the codec grows it if ever needed.
const READ_BUFFER: usize = 128;

/// Jitter of every send interval: uniform within +-10 %.
const JITTER: f64 = 0.10;

/// What every client shares.
#[derive(Debug)]
pub struct Ctx {
    pub wire: Wire,
    /// How clients connect: TCP, TLS, WebSocket, or WebSocket in TLS.
    pub door: Door,
    pub tokens: Tokens,
    pub ping_interval: Duration,
    pub data_interval: Option<Duration>,
    pub stats: Arc<Stats>,
    /// Cancelled when the run ends (or is interrupted): every client closes.
    pub stop: CancellationToken,
    /// Cancelled just before the end's counts are taken under `--churn`: no session meets a
    /// new fate and no churned client comes back, so the harness and the gateway count the
    /// same still picture instead of two moments of a moving one.
    pub settle: CancellationToken,
    /// The records every client, the pusher and the event check share.
    pub fleet: Arc<Fleet>,
    /// How long past `timeout + tick` a silent client waits before it counts as missed.
    pub missed_grace: Duration,
    /// Timeout and tick, as the first WELCOME announced them.
    pub learned: OnceLock<(Duration, Duration)>,
    /// Reconnect after BYE(shutdown), BYE(server_full), a refused connect or a dropped
    /// connection, after the wait `reconnect_policy` says, and log in again.
    pub reconnect: bool,
    pub reconnect_policy: Reconnect,
    /// With `--churn`: the mean life of a session, after which it meets its fate.
    pub churn_life: Option<Duration>,
}

/// What ends a session under `--churn`, drawn at each login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Sends LOGOUT; expects BYE(logout).
    Logout,
    /// Falls silent; expects BYE(idle_timeout) inside the guarantee's window.
    Silent,
    /// A second connection logs in with the same uid; expects BYE(kicked) on this one and
    /// carries on over the new one.
    Kicked,
    /// Closes its socket without a word.
    Drop,
}

/// Pause before a churned client comes back: 0.5 s plus up to 1.5 s.
const CHURN_PAUSE: (Duration, Duration) = (Duration::from_millis(500), Duration::from_millis(1500));

fn churn_pause(rng: &mut SmallRng) -> Duration {
    CHURN_PAUSE.0 + CHURN_PAUSE.1.mul_f64(rng.gen_range(0.0..1.0))
}

/// How a session ended, for the reconnect loop.
enum Next {
    /// Planned or final: the client is done.
    Done,
    /// Sent away or cut off: reconnect after this long (with `--reconnect`).
    Retry(Duration),
}

/// One client's part in the run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The client's place among the run's clients, and the key its DATA payloads carry
    /// (plus the uid base), so a data event names the client whatever its device.
    pub index: u64,
    pub uid: u64,
    /// Its device name with `--devices` above 1.
    pub device: Option<idlegate_proto::Device>,
    pub connect_at: Instant,
    /// When a silent client sends its last frame; `None` for an active client.
    pub silent_at: Option<Instant>,
    /// Send one last PING at `silent_at`, so clients silent together expire in one sweep.
    pub final_ping: bool,
    /// The timeout it asks for at login (`--timeouts`), if any.
    pub timeout: Option<Duration>,
    /// The gateway this client connects to (and reconnects to).
    pub target: SocketAddr,
    pub source: Option<IpAddr>,
    pub seed: u64,
}

/// Runs one client to its end.
pub async fn run(plan: Plan, ctx: Arc<Ctx>) {
    let stats = ctx.stats.clone();
    let silent = plan.silent_at.is_some();
    let mut rng = SmallRng::seed_from_u64(plan.seed ^ 0x5eed);
    let mut client = Client { plan, ctx: ctx.clone(), logged_in: false, closed_at: None, attempt: 0 };
    loop {
        let next = client.session(&mut rng).await;
        client.cell().online.store(false, Ordering::Relaxed);
        if client.logged_in {
            client.logged_in = false;
            stats.online.fetch_sub(1, Ordering::Relaxed);
            // Ended without a word from the server: the client closed its own socket.
            client.cell().set_close(CloseReason::Disconnect);
        }
        match next {
            Next::Retry(after) if ctx.reconnect => {
                client.closed_at.get_or_insert_with(Instant::now);
                stats.reconnects.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    _ = tokio::time::sleep(after) => {}
                    _ = ctx.stop.cancelled() => break,
                }
                if ctx.churn_life.is_some() && ctx.settle.is_cancelled() {
                    // Counting: a churned client stays away until the run ends.
                    ctx.stop.cancelled().await;
                    break;
                }
                client.plan.connect_at = Instant::now();
            }
            _ => break,
        }
    }
    // Expired, missed, refused or failed: either way this silent client is settled.
    if silent {
        stats.silent_pending.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Client {
    plan: Plan,
    ctx: Arc<Ctx>,
    logged_in: bool,
    /// When the last session was cut off, while the client works its way back in.
    closed_at: Option<Instant>,
    /// Attempts since the last login, for the reconnect policy's backoff.
    attempt: u32,
}

impl Client {
    fn cell(&self) -> &Cell {
        &self.ctx.fleet.cells[self.plan.index as usize]
    }

    /// Remembers when a logged-in session was cut off, for the re-login latency and the
    /// time until everyone is back.
    fn cut_off(&mut self, ctx: &Ctx) {
        self.closed_at = Some(Instant::now());
        ctx.stats.first_cutoff_nanos.fetch_min(ctx.fleet.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The wait before the next attempt, by the run's reconnect policy.
    fn retry_after(&mut self, hint: Option<u64>, rng: &mut SmallRng) -> Duration {
        let wait = self.ctx.reconnect_policy.delay(self.attempt, hint, rng);
        self.attempt = self.attempt.saturating_add(1);
        wait
    }

    /// Counts a close, and remembers it as this client's.
    fn record_close(&self, reason: CloseReason, expected: bool) {
        self.ctx.stats.record_close(reason, expected);
        self.cell().set_close(reason);
    }

    async fn session(&mut self, retry_rng: &mut SmallRng) -> Next {
        let ctx = self.ctx.clone();
        let stats = &ctx.stats;
        tokio::select! {
            _ = sleep_until(self.plan.connect_at) => {}
            _ = ctx.stop.cancelled() => return Next::Done,
        }
        let started = Instant::now();
        if self.closed_at.is_some() {
            stats.record_reconnect_attempt(ctx.fleet.epoch.elapsed());
        }
        let stream = match ctx.door.open(self.plan.target, self.plan.source).await {
            Ok(stream) => stream,
            Err(_) if ctx.reconnect && self.closed_at.is_some() => {
                // The gateway is restarting: its port refuses until it listens again.
                stats.connect_retries.fetch_add(1, Ordering::Relaxed);
                return Next::Retry(self.retry_after(None, retry_rng));
            }
            Err(e) => {
                stats.connect_errors.fetch_add(1, Ordering::Relaxed);
                stats.set_fatal(format!("connecting to {} failed: {e}", self.plan.target));
                return Next::Done;
            }
        };
        stats.connected.fetch_add(1, Ordering::Relaxed);
        let (read_half, mut write_half) = tokio::io::split(stream);
        let mut wire = ctx.wire;
        let mut frames = FramedRead::with_capacity(read_half, wire, READ_BUFFER);
        let mut out = BytesMut::with_capacity(64);

        let token = ctx.tokens.for_uid(self.plan.uid);
        wire.login(self.plan.uid, self.plan.device.clone(), token.as_deref(), self.plan.timeout, &mut out);
        let mut last_sent = Instant::now();
        if write_half.write_all_buf(&mut out).await.is_err() {
            self.record_close(CloseReason::Disconnect, false);
            return Next::Done;
        }
        let answer = tokio::select! {
            a = timeout(LOGIN_PATIENCE, frames.next()) => a,
            _ = ctx.stop.cancelled() => return Next::Done,
        };
        let (timeout_d, tick) = match answer {
            Ok(Some(Ok(Incoming::Welcome { timeout, tick }))) => (timeout, tick),
            Ok(Some(Ok(Incoming::Bye(reason, hint)))) if ctx.reconnect && sent_away(reason) => {
                if reason == CloseReason::ServerFull {
                    self.cell().shed.fetch_add(1, Ordering::Relaxed);
                }
                self.record_close(reason, true);
                return Next::Retry(self.retry_after(hint, retry_rng));
            }
            Ok(Some(Ok(Incoming::Bye(reason, _)))) => {
                if reason == CloseReason::AuthFailed {
                    stats.set_fatal(format!(
                        "the gateway answered LOGIN with BYE(auth_failed): {}",
                        match ctx.tokens {
                            Tokens::Hmac(_) => "--auth-secret does not match the gateway's".to_string(),
                            Tokens::File(_) =>
                                "a --token-file token was refused (the gateway log says why)".to_string(),
                            Tokens::None => "it wants a token: pass --auth-secret or --token-file".to_string(),
                        }
                    ));
                }
                self.record_close(reason, false);
                return Next::Done;
            }
            // A reset before the answer, while a restarted gateway is flooded with connects
            // (its accept queue full, the kernel resets what it cannot take): the
            // connection dropping, not bad bytes; retried by the policy.
            Ok(Some(Err(e))) if ctx.reconnect && e.kind() != std::io::ErrorKind::InvalidData => {
                stats.connect_retries.fetch_add(1, Ordering::Relaxed);
                return Next::Retry(self.retry_after(None, retry_rng));
            }
            Ok(Some(Err(e))) => {
                stats.set_fatal(format!("the server's answer to the login is not the protocol: {e}"));
                self.record_close(CloseReason::ProtocolError, false);
                return Next::Done;
            }
            Ok(Some(Ok(other))) => {
                stats.set_fatal(format!("the server answered the login with {other:?}"));
                self.record_close(CloseReason::ProtocolError, false);
                return Next::Done;
            }
            Ok(None) => {
                self.record_close(CloseReason::Disconnect, ctx.reconnect || ctx.fleet.node_loss);
                return Next::Retry(self.retry_after(None, retry_rng));
            }
            Err(_) => {
                stats.set_fatal(format!("no answer to a login within {LOGIN_PATIENCE:?}"));
                return Next::Done;
            }
        };
        stats.record_login(started.elapsed());
        self.attempt = 0;
        if let Some(cut_off) = self.closed_at.take() {
            stats.record_relogin(cut_off.elapsed());
            stats.last_relogin_nanos.fetch_max(ctx.fleet.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        stats.logged_in.fetch_add(1, Ordering::Relaxed);
        stats.last_login_nanos.fetch_max(ctx.fleet.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.online.fetch_add(1, Ordering::Relaxed);
        self.logged_in = true;
        self.cell().logged_in.store(true, Ordering::Relaxed);
        self.cell().online.store(true, Ordering::Relaxed);
        let _ = ctx.learned.set((timeout_d, tick));
        stats.record_granted(timeout_d, tick, LATE_TOLERANCE);

        let mut rng = SmallRng::seed_from_u64(self.plan.seed);
        let now = Instant::now();
        // A client that asked for its own timeout keeps it as a device would: a PING at
        // least every third of what it was granted.
        let ping_interval = match self.plan.timeout {
            Some(_) => ctx.ping_interval.min(timeout_d / 3),
            None => ctx.ping_interval,
        };
        let mut next_ping = now + jittered(&mut rng, ping_interval);
        let mut next_data = ctx.data_interval.map(|d| now + jittered(&mut rng, d));
        let mut silent_at = self.plan.silent_at;
        // Under --churn each session draws how and when it ends.
        let mut fate = ctx.churn_life.map(|life| draw_fate(retry_rng, life));
        if let Some((Fate::Silent, at)) = fate {
            silent_at = Some(at);
        }
        let mut pings_in_flight: VecDeque<Instant> = VecDeque::new();
        // Set once LOGOUT is sent: nothing more goes out, BYE(logout) is awaited.
        let mut logging_out = false;
        // Set once a silent client has sent its last frame: the latest acceptable expiry.
        let mut missed_at: Option<Instant> = None;
        if silent_at.is_some_and(|at| at <= now) {
            silent_at = None;
            missed_at = Some(last_sent + timeout_d + tick + ctx.missed_grace);
        }

        loop {
            let next_send = next_data.map_or(next_ping, |d| d.min(next_ping));
            tokio::select! {
                biased;
                _ = ctx.stop.cancelled() => return Next::Done,
                frame = frames.next() => match frame {
                    Some(Ok(Incoming::Pong(sent))) => {
                        stats.pongs_received.fetch_add(1, Ordering::Relaxed);
                        let sent_at = match sent {
                            Some(nanos) => Some(ctx.fleet.epoch + Duration::from_nanos(nanos)),
                            None => pings_in_flight.pop_front(),
                        };
                        if let Some(at) = sent_at {
                            stats.record_rtt(at.elapsed());
                        }
                    }
                    Some(Ok(Incoming::Push(payload))) => match parse_push(&payload) {
                        Some((id, nanos)) if ctx.fleet.pushes.received(id, self.plan.uid) => {
                            stats.record_push(ctx.fleet.epoch.elapsed().saturating_sub(Duration::from_nanos(nanos)));
                        }
                        _ => {}
                    },
                    Some(Ok(Incoming::Bye(reason, hint))) if ctx.reconnect && sent_away(reason) => {
                        self.cut_off(&ctx);
                        if reason == CloseReason::Shutdown {
                            stats.record_shutdown_bye(ctx.fleet.epoch.elapsed());
                        }
                        self.record_close(reason, true);
                        return Next::Retry(self.retry_after(hint, retry_rng));
                    }
                    Some(Ok(Incoming::Bye(CloseReason::Logout, _))) if matches!(fate, Some((Fate::Logout, _))) => {
                        self.record_close(CloseReason::Logout, true);
                        self.cut_off(&ctx);
                        return Next::Retry(churn_pause(retry_rng));
                    }
                    Some(Ok(Incoming::Bye(reason, _))) => {
                        self.closed(reason, missed_at.is_some(), last_sent, timeout_d, tick);
                        if ctx.churn_life.is_some() {
                            self.cut_off(&ctx);
                            return Next::Retry(churn_pause(retry_rng));
                        }
                        return Next::Done;
                    }
                    // A reset is the connection dropping (the server died), not bad bytes.
                    Some(Err(e)) if e.kind() != std::io::ErrorKind::InvalidData => {
                        self.record_close(CloseReason::Disconnect, ctx.reconnect || ctx.fleet.node_loss);
                        self.cut_off(&ctx);
                        return Next::Retry(self.retry_after(None, retry_rng));
                    }
                    Some(Ok(Incoming::Welcome { .. })) | Some(Err(_)) => {
                        self.record_close(CloseReason::ProtocolError, false);
                        return Next::Done;
                    }
                    // MQTT brokers expire a client by closing the socket without a word.
                    None if ctx.wire.is_mqtt() => {
                        self.closed(CloseReason::IdleTimeout, missed_at.is_some(), last_sent, timeout_d, tick);
                        return Next::Done;
                    }
                    None => {
                        self.record_close(CloseReason::Disconnect, ctx.reconnect || ctx.fleet.node_loss);
                        self.cut_off(&ctx);
                        return Next::Retry(self.retry_after(None, retry_rng));
                    }
                },
                _ = sleep_until(silent_at.unwrap_or(next_send)), if missed_at.is_none() && silent_at.is_some_and(|at| at <= next_send) => {
                    silent_at = None;
                    if self.plan.final_ping {
                        last_sent = Instant::now();
                        ping(&ctx, &mut wire, &mut out, &mut pings_in_flight, last_sent);
                        if write_half.write_all_buf(&mut out).await.is_err() {
                            self.record_close(CloseReason::Disconnect, false);
                            return Next::Done;
                        }
                    }
                    missed_at = Some(last_sent + timeout_d + tick + ctx.missed_grace);
                }
                _ = sleep_until(next_send), if missed_at.is_none() && !logging_out => {
                    let now = Instant::now();
                    if next_data.is_some_and(|d| d <= next_ping) {
                        let seq = self.cell().data_sent.fetch_add(1, Ordering::Relaxed);
                        wire.data(self.ctx.fleet.uid_base + self.plan.index, seq, &mut out);
                        stats.data_sent.fetch_add(1, Ordering::Relaxed);
                        next_data = ctx.data_interval.map(|d| now + jittered(&mut rng, d));
                    } else {
                        ping(&ctx, &mut wire, &mut out, &mut pings_in_flight, now);
                        next_ping = now + jittered(&mut rng, ping_interval);
                    }
                    // Taken before the write, so our silence is never shorter than the
                    // gateway's: it reads the frame only after this instant.
                    last_sent = now;
                    if write_half.write_all_buf(&mut out).await.is_err() {
                        self.record_close(CloseReason::Disconnect, false);
                        return Next::Done;
                    }
                }
                _ = sleep_until(missed_at.unwrap_or(next_send)), if missed_at.is_some() => {
                    stats.missed_offline.fetch_add(1, Ordering::Relaxed);
                    stats.record_class(timeout_d, |c| c.missed += 1);
                    return Next::Done;
                }
                _ = ctx.settle.cancelled(), if fate.is_some() && !logging_out => {
                    // Counting: this session keeps what it is doing now. A silent one whose
                    // silence has not begun keeps pinging.
                    if matches!(fate, Some((Fate::Silent, _))) && missed_at.is_none() {
                        silent_at = None;
                    }
                    fate = None;
                }
                _ = sleep_until(fate.map_or(next_send, |(_, at)| at)), if !logging_out && matches!(fate, Some((Fate::Logout | Fate::Drop | Fate::Kicked, at)) if at <= next_send) => {
                    let Some((what, _)) = fate else { unreachable!("guarded") };
                    match what {
                        Fate::Logout => {
                            // BYE(logout) comes back on the read side; no more sends meanwhile.
                            wire.logout(&mut out);
                            logging_out = true;
                            if write_half.write_all_buf(&mut out).await.is_err() {
                                self.record_close(CloseReason::Disconnect, false);
                                return Next::Done;
                            }
                        }
                        Fate::Drop => {
                            stats.record_close(CloseReason::Disconnect, true);
                            self.cut_off(&ctx);
                            return Next::Retry(churn_pause(retry_rng));
                        }
                        Fate::Kicked => {
                            // A second connection of this uid logs in: this one must be kicked,
                            // and the client carries on over the new one.
                            let Some((new_frames, new_write)) = self.second_login(&ctx, &mut wire).await else {
                                return Next::Done;
                            };
                            let kicked = timeout(LOGIN_PATIENCE, async {
                                loop {
                                    match frames.next().await {
                                        Some(Ok(Incoming::Bye(reason, _))) => return Some(reason),
                                        Some(Ok(_)) => continue,
                                        _ => return None,
                                    }
                                }
                            })
                            .await;
                            match kicked {
                                Ok(Some(CloseReason::Kicked)) => self.ctx.stats.record_close(CloseReason::Kicked, true),
                                Ok(Some(other)) => self.ctx.stats.record_close(other, false),
                                _ => self.ctx.stats.record_close(CloseReason::Disconnect, false),
                            }
                            stats.kicks.fetch_add(1, Ordering::Relaxed);
                            frames = new_frames;
                            write_half = new_write;
                            pings_in_flight.clear();
                            let now = Instant::now();
                            last_sent = now;
                            fate = ctx.churn_life.map(|life| draw_fate(retry_rng, life));
                            silent_at = match fate {
                                Some((Fate::Silent, at)) => Some(at),
                                _ => None,
                            };
                        }
                        Fate::Silent => unreachable!("silence runs through silent_at"),
                    }
                }
            }
        }
    }

    /// Opens a second connection and logs in with this client's uid; returns its halves once
    /// WELCOME arrived.
    async fn second_login(&mut self, ctx: &Ctx, wire: &mut Wire) -> Option<(Frames, WriteHalf<Conn>)> {
        let stream = match ctx.door.open(self.plan.target, self.plan.source).await {
            Ok(stream) => stream,
            Err(e) => {
                ctx.stats.set_fatal(format!("the second login's connect failed: {e}"));
                return None;
            }
        };
        let (read_half, mut write_half) = tokio::io::split(stream);
        let mut frames = FramedRead::with_capacity(read_half, *wire, READ_BUFFER);
        let mut out = BytesMut::with_capacity(64);
        let token = ctx.tokens.for_uid(self.plan.uid);
        wire.login(self.plan.uid, self.plan.device.clone(), token.as_deref(), self.plan.timeout, &mut out);
        write_half.write_all_buf(&mut out).await.ok()?;
        match timeout(LOGIN_PATIENCE, frames.next()).await {
            Ok(Some(Ok(Incoming::Welcome { .. }))) => {
                ctx.stats.logged_in.fetch_add(1, Ordering::Relaxed);
                Some((frames, write_half))
            }
            other => {
                ctx.stats.set_fatal(format!("the second login of uid {} got {other:?}", self.plan.uid));
                None
            }
        }
    }

    /// Judges an expiry or any other close the server sent.
    fn closed(&self, reason: CloseReason, went_silent: bool, last_sent: Instant, timeout: Duration, tick: Duration) {
        let stats = &self.ctx.stats;
        let expected = reason == CloseReason::IdleTimeout && went_silent;
        self.record_close(reason, expected);
        if reason == CloseReason::IdleTimeout && !went_silent {
            stats.false_offline.fetch_add(1, Ordering::Relaxed);
        }
        if !expected {
            return;
        }
        let silence = last_sent.elapsed();
        stats.record_silence(silence);
        // The run's counter and the class's, judged once: early, late or in the window.
        let (total, class): (&AtomicU64, fn(&mut ClassReport) -> &mut u64) = if silence <= timeout.saturating_sub(tick)
        {
            (&stats.early_offline, |c| &mut c.early)
        } else if silence > timeout + LATE_TOLERANCE {
            (&stats.late_offline, |c| &mut c.late)
        } else {
            (&stats.expired_in_window, |c| &mut c.expired_in_window)
        };
        total.fetch_add(1, Ordering::Relaxed);
        stats.record_class(timeout, |c| {
            let ms = silence.as_secs_f64() * 1e3;
            *class(c) += 1;
            c.silence_min_ms = Some(c.silence_min_ms.map_or(ms, |m| m.min(ms)));
            c.silence_max_ms = Some(c.silence_max_ms.map_or(ms, |m| m.max(ms)));
        });
    }
}

/// The frames of one connection, as the client reads them.
type Frames = FramedRead<ReadHalf<Conn>, Wire>;

/// A session's fate and when it comes: a life uniform in half to one and a half times `life`.
fn draw_fate(rng: &mut SmallRng, life: Duration) -> (Fate, Instant) {
    let fate = match rng.gen_range(0..4) {
        0 => Fate::Logout,
        1 => Fate::Silent,
        2 => Fate::Kicked,
        _ => Fate::Drop,
    };
    (fate, Instant::now() + life.mul_f64(rng.gen_range(0.5..1.5)))
}

/// Reasons a server sends a client away with, to come back later.
fn sent_away(reason: CloseReason) -> bool {
    matches!(reason, CloseReason::Shutdown | CloseReason::ServerFull)
}

/// Encodes a PING stamped `now` into `out` and counts it.
fn ping(ctx: &Ctx, wire: &mut Wire, out: &mut BytesMut, in_flight: &mut VecDeque<Instant>, now: Instant) {
    let nanos = now.saturating_duration_since(ctx.fleet.epoch).as_nanos() as u64;
    wire.ping(nanos, out);
    in_flight.push_back(now);
    ctx.stats.pings_sent.fetch_add(1, Ordering::Relaxed);
}

/// `base` with uniform jitter of +-10 %.
fn jittered(rng: &mut SmallRng, base: Duration) -> Duration {
    base.mul_f64(rng.gen_range(1.0 - JITTER..=1.0 + JITTER))
}
