//! One Server-Sent Events consumer reading the event log over loopback, end to end: a gateway
//! in this process, its log filled with 1,000,000 DATA events by real clients, then one
//! consumer that asks for all of them (`?after=0-0`, an id before this run) and parses every event out of the
//! chunked HTTP body. Prints events per second; the bar is 200,000.
//!
//! `cargo bench --bench sse`. The consumer and the gateway share this machine's two cores,
//! so the figure is what one consumer gets from a gateway that also does its own work.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use idlegate::{Config, Listeners, Server};
use idlegate_proto::kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Events the log holds when the consumer starts.
const EVENTS: u64 = 1_000_000;

/// Clients filling the log, each sending its share of DATA frames.
const CLIENTS: u64 = 20;

/// Runs of the read, to show the spread.
const RUNS: usize = 3;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let clients = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, api_addr) = (clients.local_addr().unwrap(), api.local_addr().unwrap());
        let config = Config { event_log_capacity: EVENTS as usize + 1_000, ..Config::default() };
        let server = Server::new(config);
        let metrics = server.metrics();
        let listeners = Listeners { api: Some(api), ..Listeners::clients(clients) };
        tokio::spawn(server.run(listeners, std::future::pending::<()>()));

        let fill = Instant::now();
        let mut writers = Vec::new();
        for uid in 0..CLIENTS {
            writers.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let mut out = BytesMut::new();
                frame(&mut out, kind::LOGIN, &uid.to_be_bytes());
                for i in 0..EVENTS / CLIENTS {
                    frame(&mut out, kind::DATA, &i.to_be_bytes());
                    if out.len() > 64 * 1024 {
                        s.write_all_buf(&mut out).await.unwrap();
                    }
                }
                s.write_all_buf(&mut out).await.unwrap();
                s
            }));
        }
        let mut held = Vec::new();
        for w in writers {
            held.push(w.await.unwrap());
        }
        while metrics.event_count(idlegate_proto::EventKind::Data) < EVENTS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!("filled the log with {EVENTS} data events in {:.2} s", fill.elapsed().as_secs_f64());

        for run in 1..=RUNS {
            let started = Instant::now();
            let data = consume(api_addr, EVENTS).await;
            let took = started.elapsed().as_secs_f64();
            println!(
                "run {run}: one consumer read {data} data events in {took:.3} s: {:.0} events/s",
                data as f64 / took
            );
        }
        drop(held);
    });
}

fn frame(out: &mut BytesMut, kind: u8, payload: &[u8]) {
    out.put_u32(1 + payload.len() as u32);
    out.put_u8(kind);
    out.put_slice(payload);
}

/// Reads `/v1/events?after=0-0` until `want` data events have been parsed; returns the count.
async fn consume(api: std::net::SocketAddr, want: u64) -> u64 {
    let mut s = TcpStream::connect(api).await.unwrap();
    s.write_all(b"GET /v1/events?after=0-0 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut raw = Vec::with_capacity(1 << 20);
    let mut body = Vec::with_capacity(1 << 20);
    let mut chunk = vec![0u8; 1 << 16];
    let mut head_done = false;
    let mut data_events = 0u64;
    while data_events < want {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the stream ended early");
        raw.extend_from_slice(&chunk[..n]);
        if !head_done {
            let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            assert!(raw.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&raw[..end]));
            raw.drain(..end + 4);
            head_done = true;
        }
        // Chunked transfer: size line, data, CRLF.
        let mut at = 0;
        while let Some(eol) = raw[at..].windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(std::str::from_utf8(&raw[at..at + eol]).unwrap().trim(), 16).unwrap();
            if raw.len() < at + eol + 2 + size + 2 {
                break;
            }
            body.extend_from_slice(&raw[at + eol + 2..at + eol + 2 + size]);
            at += eol + 2 + size + 2;
        }
        raw.drain(..at);
        // Whole events: blocks ending in a blank line.
        let mut start = 0;
        while let Some(end) = body[start..].windows(2).position(|w| w == b"\n\n") {
            if body[start..start + end].windows(11).any(|w| w == b"event: data") {
                data_events += 1;
            }
            start += end + 2;
        }
        body.drain(..start);
    }
    data_events
}
