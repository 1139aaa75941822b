//! What one idle TLS session's state costs, the door's record layer beside rustls's own
//! connection, measured side by side in one run: N sessions of each are handshaken in
//! memory with rustls's client and kept, idle, while the process's resident memory is read
//! before and after. Sockets and tasks are left out; they cost the same either way (see
//! docs/BENCHMARKS.md section 5 for a whole idle connection).
//!
//! ```sh
//! cargo run --release --example tls_session_memory -- door|rustls 1.3|1.2 [sessions]
//! ```
//!
//! Prints `state version sessions bytes_per_session`; one kind of state per process, so
//! neither reuses memory the other freed. `loadtest/tls-session-memory.sh` alternates them.

use std::sync::Arc;

use bytes::BytesMut;
use idlegate::conformance::ServerLayer;
use rustls::crypto::ring::cipher_suite;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection, SupportedCipherSuite};

#[path = "../tests/common/tls_configs.rs"]
mod tls_configs;

/// Resident memory of this process, from /proc/self/statm (pages of 4 KiB).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn configs(suite: SupportedCipherSuite) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let (mut server, client) = tls_configs::configs(suite);
    // Tickets would be sent, not kept: the same either way.
    server.send_tls13_tickets = 0;
    (Arc::new(server), Arc::new(client))
}

fn client(config: &Arc<ClientConfig>) -> ClientConnection {
    ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).unwrap()
}

fn pending(client: &mut ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut out).unwrap();
    }
    out
}

/// A session of the door's layer, its handshake done and a byte each way.
fn door_session(server: &Arc<ServerConfig>, client_config: &Arc<ClientConfig>) -> ServerLayer {
    let mut layer = ServerLayer::new(server.clone()).unwrap();
    let mut client = client(client_config);
    for _ in 0..8 {
        let mut raw = BytesMut::from(&pending(&mut client)[..]);
        let (mut plain, mut wire) = (BytesMut::new(), BytesMut::new());
        layer.open(&mut raw, &mut plain, &mut wire).unwrap();
        if layer.handed_over() {
            break;
        }
        client.read_tls(&mut &wire[..]).unwrap();
        client.process_new_packets().unwrap();
    }
    assert!(layer.handed_over());
    layer
}

/// A session of rustls's own connection, its handshake done and a byte each way.
fn rustls_session(server: &Arc<ServerConfig>, client_config: &Arc<ClientConfig>) -> ServerConnection {
    let mut conn = ServerConnection::new(server.clone()).unwrap();
    let mut client = client(client_config);
    while conn.is_handshaking() || client.is_handshaking() {
        let out = pending(&mut client);
        conn.read_tls(&mut &out[..]).unwrap();
        conn.process_new_packets().unwrap();
        let mut back = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut back).unwrap();
        }
        client.read_tls(&mut &back[..]).unwrap();
        client.process_new_packets().unwrap();
    }
    std::io::Write::write_all(&mut client.writer(), b"x").unwrap();
    let out = pending(&mut client);
    conn.read_tls(&mut &out[..]).unwrap();
    conn.process_new_packets().unwrap();
    let mut byte = [0];
    std::io::Read::read_exact(&mut conn.reader(), &mut byte).unwrap();
    conn
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(state), Some(version)) = (args.first(), args.get(1)) else {
        eprintln!("usage: tls_session_memory door|rustls 1.3|1.2 [sessions]");
        std::process::exit(2);
    };
    let sessions: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let suite = match version.as_str() {
        "1.3" => cipher_suite::TLS13_AES_128_GCM_SHA256,
        _ => cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    };
    let (server, client_config) = configs(suite);
    // One session first, so what every session shares (the configurations, the provider's
    // tables) is in place before the count starts.
    let warm = (door_session(&server, &client_config), rustls_session(&server, &client_config));
    let before = rss();
    let held: Vec<Box<dyn std::any::Any>> = match state.as_str() {
        "door" => {
            (0..sessions).map(|_| Box::new(door_session(&server, &client_config)) as Box<dyn std::any::Any>).collect()
        }
        _ => {
            (0..sessions).map(|_| Box::new(rustls_session(&server, &client_config)) as Box<dyn std::any::Any>).collect()
        }
    };
    let per = rss().saturating_sub(before) as f64 / sessions as f64;
    println!("{state} {version} {sessions} {per:.0}");
    drop((held, warm));
}
