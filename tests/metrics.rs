//! Gauges and counters stay exact while sessions come and go concurrently: logins, kicks,
//! logouts, disconnects and expiries racing each other leave the online gauge at zero and
//! every connection counted closed exactly once, with the right reason.

mod common;

use common::{sample, short_config, Client, TestServer};
use idlegate_proto::{kind, CloseReason, Frame};

/// Connections per wave; uids repeat across `UIDS`, so logins kick each other.
const CONNECTIONS: u64 = 120;
const UIDS: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_return_to_zero_under_concurrent_logins_kicks_and_expiries() {
    let mut server = TestServer::start(short_config()).await;
    let addr = server.addr;
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                let uid = i % UIDS;
                // WELCOME is queued before any kick's BYE, so every login reads it.
                assert!(matches!(c.login(uid).await, Frame::Welcome { .. }), "uid {uid}");
                match i % 3 {
                    // Logs out; may have been kicked first.
                    0 => c.send(Frame::Logout).await,
                    // Disconnects without a word; may have been kicked first.
                    1 => return None,
                    // Falls silent: expired, unless kicked first.
                    _ => {}
                }
                // Read until the gateway closes: the BYE's reason, or none for a disconnect.
                let mut reason = None;
                while let Some(frame) = c.recv().await {
                    if let Frame::Bye { reason: r, .. } = frame {
                        reason = Some(r);
                    }
                }
                reason
            })
        })
        .collect();
    let mut byes = [0u64; 10];
    for t in tasks {
        if let Some(reason) = t.await.unwrap() {
            byes[reason.index()] += 1;
        }
    }

    let m = &server.metrics;
    assert_eq!(m.online_users.get(), 0);
    assert_eq!(m.logins.get(), CONNECTIONS);
    assert_eq!(m.frame_count(kind::LOGIN), CONNECTIONS);
    let closed: u64 = CloseReason::ALL.iter().map(|&r| m.closed_count(r)).sum();
    assert_eq!(closed, CONNECTIONS, "every connection closed exactly once");
    assert_eq!(m.connections_accepted.get(), CONNECTIONS);
    // Every BYE a client read matches the counter of its reason (clients that hung up read
    // none, so only reasons they cannot end with are compared exactly).
    for reason in [CloseReason::Logout, CloseReason::IdleTimeout] {
        assert_eq!(byes[reason.index()], m.closed_count(reason), "{reason}");
    }
    assert!(byes[CloseReason::Kicked.index()] <= m.closed_count(CloseReason::Kicked));
    // At most one session per uid survives to be ended by anything but a kick.
    assert!(m.closed_count(CloseReason::Kicked) <= CONNECTIONS - UIDS);
    assert_eq!(m.ring_expired.get(), m.closed_count(CloseReason::IdleTimeout));
    // Every expiry's BYE is timed from the tick that swept it, not from the client's last
    // frame (which would put each near the timeout).
    let expired = m.closed_count(CloseReason::IdleTimeout);
    assert_eq!(m.expiry_bye_delay.get_sample_count(), expired);
    let mean = m.expiry_bye_delay.get_sample_sum() / expired.max(1) as f64;
    assert!(mean < short_config().timeout.as_secs_f64() / 2.0, "mean BYE delay {mean} s after the sweep");

    // After one more tick the ring's gauge agrees.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, body) = server.admin_get("/metrics").await;
    assert_eq!(sample(&body, "idlegate_ring_tracked_uids"), Some(0.0));
    assert_eq!(sample(&body, "idlegate_online_users"), Some(0.0));
    for transport in ["tcp", "tls", "ws", "wss"] {
        let series = format!("idlegate_connections_open{{transport=\"{transport}\"}}");
        assert_eq!(sample(&body, &series), Some(0.0), "{series}");
    }
    server.shutdown().await;
}
