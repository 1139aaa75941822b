//! A stalled gateway must not cost clients their sessions. The gateway runs on its own
//! single-threaded runtime, which the test blocks for longer than the timeout while clients
//! (on another runtime) keep sending: everyone who sent during the stall stays online, and
//! silent clients are still expired.
//!
//! ```text
//! t(s)    0    0.3                 1.8            3.3
//!         |login|==== gateway blocked ====|               |
//! active  P  P  P  P  P  P  P  P  P  P  P  P  P  P  P  P  LOGOUT  -> BYE(logout)
//! silent  (nothing)                 ^ swept after the stall  -> BYE(idle_timeout)
//! ```
//!
//! Wall-clock sleeps are unavoidable here (the stall is real); the margins are wide and
//! nothing asserts how fast anything happened.

mod common;

use std::time::Duration;

use common::Client;
use idlegate::{Config, Listeners, Server};
use idlegate_proto::{CloseReason, Frame};
use tokio::net::TcpListener;

const ACTIVE: u64 = 8;
const SILENT: u64 = 8;
const PING_EVERY: Duration = Duration::from_millis(200);
const STALL_AFTER: Duration = Duration::from_millis(300);
const STALL: Duration = Duration::from_millis(1500);
const RUN_FOR: Duration = Duration::from_millis(3300);

/// A gateway on a single-threaded runtime of its own, which the test can freeze.
struct Stallable {
    addr: std::net::SocketAddr,
    metrics: std::sync::Arc<idlegate::Metrics>,
    /// Spawning a blocking sleep on it freezes the whole gateway.
    stall_handle: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

impl Stallable {
    fn start(config: Config) -> Stallable {
        let gateway = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let listener = gateway.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = gateway.block_on(async { Server::new(config) });
        let metrics = server.metrics();
        let stall_handle = gateway.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            gateway.block_on(server.run(Listeners::clients(listener), async move {
                let _ = stopped.await;
            }))
        });
        Stallable { addr, metrics, stall_handle, stop, thread }
    }
}

#[test]
fn clients_that_sent_during_a_stall_keep_their_sessions() {
    let config = Config {
        timeout: Duration::from_secs(1),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let Stallable { addr, metrics, stall_handle, stop, thread: gateway_thread } = Stallable::start(config);

    let clients = tokio::runtime::Runtime::new().unwrap();
    clients.block_on(async move {
        let mut active = Vec::new();
        for uid in 0..ACTIVE {
            let mut c = Client::connect(addr).await;
            assert!(matches!(c.login(uid).await, Frame::Welcome { .. }));
            active.push(c);
        }
        let mut silent = Vec::new();
        for uid in 100..100 + SILENT {
            let mut c = Client::connect(addr).await;
            c.login(uid).await;
            silent.push(c);
        }

        let started = tokio::time::Instant::now();
        let active: Vec<_> = active
            .into_iter()
            .map(|mut c| {
                tokio::spawn(async move {
                    // Ping on schedule whether or not the gateway answers; read at the end.
                    let mut sent = 0;
                    while started.elapsed() < RUN_FOR {
                        c.send(Frame::Ping(bytes::Bytes::from_static(b"p"))).await;
                        sent += 1;
                        tokio::time::sleep(PING_EVERY).await;
                    }
                    c.send(Frame::Logout).await;
                    let mut pongs = 0;
                    loop {
                        match c.recv().await {
                            Some(Frame::Pong(_)) => pongs += 1,
                            Some(Frame::Bye { reason, .. }) => return (reason, pongs, sent),
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                })
            })
            .collect();

        tokio::time::sleep(STALL_AFTER).await;
        stall_handle.spawn(async { std::thread::sleep(STALL) });

        for mut c in silent {
            c.expect_bye(CloseReason::IdleTimeout).await;
        }
        for task in active {
            let (reason, pongs, sent) = task.await.unwrap();
            assert_eq!(reason, CloseReason::Logout, "an active client lost its session in the stall");
            assert_eq!(pongs, sent, "every ping answered");
        }
    });

    assert_eq!(metrics.closed_count(CloseReason::IdleTimeout), SILENT);
    assert_eq!(metrics.closed_count(CloseReason::Logout), ACTIVE);
    assert!(metrics.tick_lag.get_sample_sum() >= 1.0, "the stall showed up as tick lag");
    stop.send(()).unwrap();
    gateway_thread.join().unwrap().unwrap();
}

/// The login deadline judges what the client sent: a LOGIN that arrived while the gateway
/// was stalled past the deadline is read before the deadline closes the connection.
#[test]
fn a_login_sent_during_a_stall_is_read_before_the_login_deadline_fires() {
    const LOGIN_TIMEOUT: Duration = Duration::from_millis(300);
    let config = Config { login_timeout: LOGIN_TIMEOUT, ..Config::default() };
    let Stallable { addr, metrics, stall_handle, stop, thread: gateway_thread } = Stallable::start(config);

    let clients = tokio::runtime::Runtime::new().unwrap();
    clients.block_on(async move {
        let mut c = Client::connect(addr).await;
        // Accepted and waiting for its LOGIN, with the deadline running.
        while metrics.connections_open.get() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The gateway freezes for three login deadlines; the LOGIN arrives in the middle.
        stall_handle.spawn(async { std::thread::sleep(3 * LOGIN_TIMEOUT) });
        tokio::time::sleep(LOGIN_TIMEOUT).await;
        c.send(Frame::Login { uid: 7, token: bytes::Bytes::new(), device: Default::default(), timeout_ms: None }).await;
        assert!(matches!(c.recv().await, Some(Frame::Welcome { .. })), "the LOGIN was judged late");
        c.ping(b"in").await;
        assert_eq!(metrics.closed_count(CloseReason::LoginTimeout), 0);
    });
    stop.send(()).unwrap();
    gateway_thread.join().unwrap().unwrap();
}
