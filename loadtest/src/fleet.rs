//! What the whole fleet of simulated clients shares, at the bottom of the harness: which
//! protocol they speak, how they come back, how they connect, and the records the clients,
//! the pusher and the event check all read (each client's [`Cell`], the [`Pushes`]).
//! Imports nothing of the harness but `payload`, so the files above it (args, wire, door,
//! backend, client) import each other one way.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use idlegate_proto::CloseReason;
use rand::rngs::SmallRng;
use rand::Rng;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// The fleet's shared records; see the module documentation.
#[derive(Debug)]
pub struct Fleet {
    /// Zero of the timestamps carried in PINGs and pushes.
    pub epoch: Instant,
    /// The uid of client 0; client i is `uid_base + i / devices`.
    pub uid_base: u64,
    /// Clients per uid (`--devices`), each on its own device.
    pub devices: u64,
    /// Each client's record, by index, for pushes and the event check.
    pub cells: Box<[Cell]>,
    pub pushes: Pushes,
    /// `--node-loss`: a connection cut without a BYE is expected.
    pub node_loss: bool,
}

// === impl Fleet ===

impl Fleet {
    /// `clients` clients from `uid_base`, `devices` to a uid, starting now.
    pub fn new(uid_base: u64, devices: u64, clients: u64, node_loss: bool) -> Fleet {
        Fleet {
            epoch: Instant::now(),
            uid_base,
            devices,
            cells: (0..clients).map(|_| Cell::default()).collect(),
            pushes: Pushes::default(),
            node_loss,
        }
    }

    /// The uid of client `index`.
    pub fn uid_of(&self, index: u64) -> u64 {
        self.uid_base + index / self.devices
    }
}

/// Which protocol the clients speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Idlegate,
    Mqtt,
}

/// How clients come back after being sent away or cut off (`--reconnect-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// The client library's policy: full-jitter exponential backoff, never sooner than the
    /// gateway's retry hint.
    Library(idlegate_client::Backoff),
    /// A fleet with no jitter, as MQTT.js (`reconnectPeriod` 1,000 ms) or Phoenix's client
    /// behave: the same fixed wait after every loss, hints ignored.
    Fixed(Duration),
}

// === impl Reconnect ===

impl Reconnect {
    /// The wait before attempt `attempt` since the last session, given the gateway's hint.
    pub fn delay(self, attempt: u32, hint: Option<u64>, rng: &mut SmallRng) -> Duration {
        match self {
            Reconnect::Library(backoff) => {
                backoff.delay_at(attempt, hint.map(Duration::from_millis), rng.gen_range(0.0..1.0))
            }
            Reconnect::Fixed(wait) => wait,
        }
    }
}

/// One client's record, shared with the pusher and the event check.
#[derive(Debug, Default)]
pub struct Cell {
    /// Logged in and not closed: a push target.
    pub online: AtomicBool,
    pub logged_in: AtomicBool,
    pub data_sent: AtomicU64,
    /// The reason its connection ended as the client saw it (`CloseReason` code), 0 before.
    pub(crate) close: AtomicU8,
    /// Logins of this client the gateway shed (BYE(server_full) in answer to LOGIN).
    pub shed: AtomicU8,
}

// === impl Cell ===

impl Cell {
    /// Remembers the first close reason.
    pub fn set_close(&self, reason: CloseReason) {
        let _ = self.close.compare_exchange(0, reason as u8, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn close_reason(&self) -> Option<CloseReason> {
        match self.close.load(Ordering::Relaxed) {
            0 => None,
            code => CloseReason::from_code(code),
        }
    }
}

/// Connects from `source` when given, so runs can use many local addresses.
pub async fn connect(target: SocketAddr, source: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let stream = match source {
        None => TcpStream::connect(target).await?,
        Some(ip) => {
            let socket = if target.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            socket.bind(SocketAddr::new(ip, 0))?;
            socket.connect(target).await?
        }
    };
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    uid: u64,
    received: u64,
    expected: Option<u64>,
}

/// What became of the pushes.
#[derive(Debug, Default)]
pub struct Pushes {
    /// Push id -> where it went, from the request until every session it reached reports it.
    outstanding: Mutex<HashMap<u64, Outstanding>>,
    next_id: AtomicU64,
    pub sent: AtomicU64,
    pub offline: AtomicU64,
    pub received: AtomicU64,
    /// Sessions the API said the sent pushes reached (one per push without devices).
    pub deliveries: AtomicU64,
    pub errors: AtomicU64,
    /// Pushes received that were never sent, by the wrong uid, or by more sessions than
    /// the API said it reached.
    pub unexpected: AtomicU64,
}

// === impl Pushes ===

impl Pushes {
    fn outstanding(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Outstanding>> {
        self.outstanding.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A push to `uid` about to be requested: its id, registered before the request (the
    /// client may receive it before the answer arrives).
    pub fn begin(&self, uid: u64) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.outstanding().insert(id, Outstanding { uid, received: 0, expected: None });
        id
    }

    /// Push `id` went nowhere (the uid was offline, or the request failed); returns whether
    /// it was still outstanding (false: a client received it anyway).
    pub fn withdraw(&self, id: u64) -> bool {
        self.outstanding().remove(&id).is_some()
    }

    /// A client of `uid` received push `id`; returns whether it was one we sent to `uid` and
    /// still expected.
    pub fn received(&self, id: u64, uid: u64) -> bool {
        let mut outstanding = self.outstanding();
        let expected = match outstanding.get_mut(&id) {
            Some(o) if o.uid == uid && o.expected.is_none_or(|n| o.received < n) => {
                o.received += 1;
                if o.expected == Some(o.received) {
                    outstanding.remove(&id);
                }
                true
            }
            _ => false,
        };
        drop(outstanding);
        let counter = if expected { &self.received } else { &self.unexpected };
        counter.fetch_add(1, Ordering::Relaxed);
        expected
    }

    /// The API answered that push `id` reached `sessions` sessions.
    pub fn answered(&self, id: u64, sessions: u64) {
        self.deliveries.fetch_add(sessions, Ordering::Relaxed);
        let mut outstanding = self.outstanding();
        if let Some(o) = outstanding.get_mut(&id) {
            if o.received >= sessions {
                let extra = o.received - sessions;
                outstanding.remove(&id);
                self.unexpected.fetch_add(extra, Ordering::Relaxed);
            } else {
                o.expected = Some(sessions);
            }
        }
    }

    /// Deliveries the API answered `sent` that no client has received.
    pub fn lost(&self) -> u64 {
        self.outstanding().values().map(|o| o.expected.map_or(0, |n| n - o.received)).sum()
    }
}
