//! A TCP proxy that a test or the nemesis controls, for network faults without root: `pause` stops carrying
//! bytes both ways (a partition: connections stay open, nothing arrives), `hold_replies`
//! only the server's answers (commands run, their replies are lost to the client's
//! timeout), `hold_stream_readers` only the connections that have sent a Redis `XREAD` (a
//! node's inbox and event-tail reader, while its commands go through), `throttle` carries
//! the client's bytes at a bounded rate (a slow Redis: a big request's answer comes late),
//! `delay` carries every byte late by a fixed time, each way (a slow link: what is sent
//! keeps coming, only late), `hold_replies_after` holds the server's answers from the
//! moment a client sends given bytes (a command that runs and whose reply is lost), `resume`
//! heals them all but the rate and the delay, and `switch` points new connections at another server and cuts the old ones (a
//! failover behind a stable address). `wedge_open` stops the connections open now for good
//! and carries new ones: a client library stuck on connections it never gives up, while the
//! server is healthy.
//!
//! A transparent proxy (`start_transparent`) carries each connection to where its client
//! dialled, as an iptables `REDIRECT` found it (`SO_ORIGINAL_DST`): one gateway's way to
//! every server of a Redis Cluster, whose redirections name the servers' own addresses.
//!
//! One file serves both users: the nemesis (`loadtest nemesis`) puts one between each gateway
//! and Redis, and the gateway's own tests (`tests/common`) include it by path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The proxy; stops when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    paused: watch::Sender<bool>,
    replies: Arc<watch::Sender<bool>>,
    trip: watch::Sender<Option<Vec<u8>>>,
    readers: watch::Sender<bool>,
    rate: watch::Sender<u64>,
    delay: watch::Sender<u64>,
    /// Where new connections go (none: where each was dialled), and the token that cuts
    /// the open ones.
    target: Arc<Mutex<(Option<SocketAddr>, CancellationToken)>>,
    /// The gate of the connections opened since the last `wedge_open`.
    generation: Arc<Mutex<Generation>>,
    stop: CancellationToken,
}

/// The gate each new connection takes, and the closed gates of the wedged ones, kept so
/// that those connections stay open (a dropped gate ends its connection).
struct Generation {
    current: watch::Sender<bool>,
    wedged: Vec<watch::Sender<bool>>,
}

impl Proxy {
    /// A proxy on a loopback port to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        Proxy::start_to(Some(target)).await
    }

    /// A proxy on a loopback port that carries each connection to the address its client
    /// dialled, for connections an iptables `REDIRECT` (nat table) sent to it.
    pub async fn start_transparent() -> std::io::Result<Proxy> {
        Proxy::start_to(None).await
    }

    async fn start_to(target: Option<SocketAddr>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (paused, _) = watch::channel(false);
        let replies = Arc::new(watch::channel(false).0);
        let (trip, _) = watch::channel(None);
        let (readers, _) = watch::channel(false);
        let (rate, _) = watch::channel(0u64);
        let (delay, _) = watch::channel(0u64);
        let target = Arc::new(Mutex::new((target, CancellationToken::new())));
        let generation = Arc::new(Mutex::new(Generation { current: watch::channel(false).0, wedged: Vec::new() }));
        let stop = CancellationToken::new();
        let (p, r, t, s) = (paused.clone(), replies.clone(), target.clone(), stop.clone());
        let g = generation.clone();
        let (rd, rt, dl, tr) = (readers.clone(), rate.clone(), delay.clone(), trip.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = s.cancelled() => return,
                };
                let Ok((client, _)) = accepted else { continue };
                let (to, cut) = t.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let (paused, replies) = (p.subscribe(), r.subscribe());
                let wedge = g.lock().unwrap_or_else(|e| e.into_inner()).current.subscribe();
                let reader = Reader { sent_xread: Arc::new(AtomicBool::new(false)), held: rd.subscribe() };
                let (rate, delay) = (rt.subscribe(), dl.subscribe());
                let trip = Trip { pattern: tr.subscribe(), replies: r.clone() };
                tokio::spawn(async move {
                    // A paused proxy does not connect either: the far side is out of reach.
                    let mut waiting = paused.clone();
                    let _ = waiting.wait_for(|p| !*p).await;
                    let to = match to {
                        Some(to) => to,
                        None => match original_destination(&client) {
                            Ok(to) => to,
                            Err(e) => {
                                eprintln!("proxy: a connection that was not redirected here: {e}");
                                return;
                            }
                        },
                    };
                    let Ok(server) = TcpStream::connect(to).await else { return };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        _ = pipe(cr, sw, vec![paused.clone(), wedge.clone()], reader.clone(), Some((rate, trip)), delay.clone()) => {}
                        _ = pipe(sr, cw, vec![paused, replies, wedge], reader, None, delay) => {}
                        _ = cut.cancelled() => {}
                    }
                });
            }
        });
        Ok(Proxy { addr, paused, replies, trip, readers, rate, delay, target, generation, stop })
    }

    /// `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Stops carrying bytes, both ways, on every connection.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Stops carrying the server's answers; commands still reach it.
    pub fn hold_replies(&self) {
        self.replies.send_replace(true);
    }

    /// Holds the server's answers, as [`Proxy::hold_replies`], from the moment a client
    /// sends bytes holding `pattern` (that command still reaches the server); `resume` ends
    /// both.
    pub fn hold_replies_after(&self, pattern: &[u8]) {
        self.trip.send_replace(Some(pattern.to_vec()));
    }

    /// Stops carrying bytes, both ways, on every connection that has sent an `XREAD`: a
    /// node's stream reader is cut off (what is in its inbox waits) while its commands run.
    pub fn hold_stream_readers(&self) {
        self.readers.send_replace(true);
    }

    /// Carries what clients send at most `bytes_per_second` (0: as fast as it comes), on
    /// every connection; `resume` leaves it as it is.
    pub fn throttle(&self, bytes_per_second: u64) {
        self.rate.send_replace(bytes_per_second);
    }

    /// Carries every byte `ms` late, each way, on every connection (0: at once); what is
    /// read meanwhile keeps flowing behind it. `resume` leaves it as it is.
    pub fn delay(&self, ms: u64) {
        self.delay.send_replace(ms);
    }

    /// Carries bytes again, both ways, on every connection.
    pub fn resume(&self) {
        self.paused.send_replace(false);
        self.trip.send_replace(None);
        self.replies.send_replace(false);
        self.readers.send_replace(false);
    }

    /// Stops carrying bytes, both ways and for good, on every connection open now, which
    /// stay open; connections opened later are carried. `resume` does not heal them.
    pub fn wedge_open(&self) {
        let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::replace(&mut g.current, watch::channel(false).0);
        old.send_replace(true);
        g.wedged.push(old);
    }

    /// Sends new connections to `target` and closes every open one.
    pub fn switch(&self, target: SocketAddr) {
        let mut t = self.target.lock().unwrap_or_else(|e| e.into_inner());
        t.1.cancel();
        *t = (Some(target), CancellationToken::new());
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.target.lock().unwrap_or_else(|e| e.into_inner()).1.cancel();
    }
}

/// `SO_ORIGINAL_DST` (linux/netfilter_ipv4.h): where a connection that the nat table
/// redirected was dialled; libc does not name it.
const SO_ORIGINAL_DST: libc::c_int = 80;

/// The IPv4 address a redirected connection was dialled to.
fn original_destination(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero sockaddr_in is a valid value.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `addr`, which lives across the call,
    // on a descriptor `stream` owns.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ip = std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::from((ip, u16::from_be(addr.sin_port))))
}

/// Whether a connection has sent a Redis `XREAD`, and the gate of such connections.
#[derive(Clone)]
struct Reader {
    sent_xread: Arc<AtomicBool>,
    held: watch::Receiver<bool>,
}

/// Waits until no gate is closed (the readers' gate counts once the connection has sent an
/// `XREAD`); false once the proxy is gone.
async fn open(gates: &mut [watch::Receiver<bool>], reader: &mut Reader) -> bool {
    for gate in gates {
        if gate.wait_for(|closed| !*closed).await.is_err() {
            return false;
        }
    }
    if reader.sent_xread.load(Ordering::Relaxed) && reader.held.wait_for(|held| !*held).await.is_err() {
        return false;
    }
    true
}

/// What closes the replies' gate when a client sends a pattern.
struct Trip {
    pattern: watch::Receiver<Option<Vec<u8>>>,
    replies: Arc<watch::Sender<bool>>,
}

/// How many chunks a delayed direction holds before it stops reading: 4 MiB at most, as a
/// slow link's window would.
const IN_FLIGHT: usize = 256;

async fn pipe(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    mut gates: Vec<watch::Receiver<bool>>,
    mut reader: Reader,
    // The bound on the rate and the trip, on the way to the server.
    to_server: Option<(watch::Receiver<u64>, Trip)>,
    delay: watch::Receiver<u64>,
) {
    let (rate, trip) = to_server.map_or((None, None), |(rate, trip)| (Some(rate), Some(trip)));
    let to_server = rate.is_some();
    // Reading and writing apart, so that a delay adds latency without cutting the rate:
    // each chunk is due its delay after it was read.
    let (chunks, mut due) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(IN_FLIGHT);
    let (mut read_gates, mut read_reader) = (gates.clone(), reader.clone());
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if !open(&mut read_gates, &mut read_reader).await {
                return;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if to_server && buf[..n].windows(5).any(|w| w.eq_ignore_ascii_case(b"XREAD")) {
                read_reader.sent_xread.store(true, Ordering::Relaxed);
            }
            if let Some(trip) = &trip {
                let hit =
                    trip.pattern.borrow().as_ref().is_some_and(|p| buf[..n].windows(p.len()).any(|w| w == &p[..]));
                if hit {
                    trip.replies.send_replace(true);
                }
            }
            let at = tokio::time::Instant::now() + std::time::Duration::from_millis(*delay.borrow());
            if chunks.send((at, buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            // Bytes read just as the pause began are held until it ends, like a cut link.
            if !open(&mut gates, &mut reader).await {
                return;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            let bytes_per_second = rate.as_ref().map_or(0, |r| *r.borrow());
            if bytes_per_second > 0 {
                tokio::time::sleep(std::time::Duration::from_secs_f64(chunk.len() as f64 / bytes_per_second as f64))
                    .await;
            }
        }
    };
    // The write side ends when the read side has ended and every chunk read is written.
    tokio::join!(read, write);
}
