//! The backend API's in-memory parts at the sizes the issue names:
//! - `event_log/append_data`: one DATA frame's event, as a connection appends it;
//! - `event_log/read_batch`: one consumer read of a full batch from a full log;
//! - `presence/query_10k`: `POST /v1/presence/query`'s work for 10,000 uids (half online)
//!   with 1,000,000 uids online.
//!
//! Throughput is reported per event and per uid, so criterion prints events/s and uids/s
//! directly. The SSE consumer over loopback is measured end to end by `benches/sse.rs`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::FutureExt;
use idlegate::bench::{Clock, Directory, EventId, EventLog, Local, Registry, READ_BATCH};
use idlegate::{Config, Metrics};
use idlegate_proto::Device;

/// Uids online for the presence query, as the issue asks.
const ONLINE: u64 = 1_000_000;

/// Uids per query: the API's limit.
const QUERY: usize = 10_000;

/// Events in the log when it is read: the default capacity.
const LOG_EVENTS: u64 = 1_000_000;

fn registry(window: u64, capacity: usize) -> Arc<Registry> {
    let metrics = Arc::new(Metrics::new(&Config::default()));
    let events = Arc::new(EventLog::new(capacity, usize::MAX, metrics.clone()));
    Arc::new(Registry::new(window, events, metrics))
}

fn event_log(c: &mut Criterion) {
    let mut group = c.benchmark_group("event_log");
    let reg = registry(30, LOG_EVENTS as usize);
    let session = reg.login(1, Device::DEFAULT, 0);
    let payload = Bytes::from_static(b"0123456789abcdef");
    group.throughput(Throughput::Elements(1));
    group.bench_function("append_data", |b| b.iter(|| reg.events().data(&session, payload.clone(), None)));

    // A full log; each read takes the batch after a random position.
    while reg.events().last_id().seq < LOG_EVENTS {
        reg.events().data(&session, payload.clone(), None);
    }
    let last = reg.events().last_id();
    let first = EventId { seq: last.seq - LOG_EVENTS + 2 * READ_BATCH as u64, ..last };
    let mut at = first;
    group.throughput(Throughput::Elements(READ_BATCH as u64));
    group.bench_function("read_batch", |b| {
        b.iter(|| {
            let batch = reg.events().read(at);
            let next = at.seq + batch.events.len() as u64;
            at = if next + READ_BATCH as u64 >= last.seq { first } else { EventId { seq: next, ..at } };
            black_box(batch.events.len())
        })
    });
    group.finish();
}

fn presence(c: &mut Criterion) {
    let mut group = c.benchmark_group("presence");
    group.sample_size(20).measurement_time(Duration::from_secs(10));
    let reg = registry(30, 1024);
    for uid in 0..ONLINE {
        reg.login(uid, Device::DEFAULT, 0);
    }
    let directory = Local::new(
        reg.clone(),
        Clock::new(tokio::time::Instant::now(), Duration::from_secs(1)),
        "bench".into(),
        64 * 1024,
        prometheus::IntGauge::new("bench_connections", "unused").unwrap(),
    );
    // Every other uid queried is online: spread over the million, and as many beyond it.
    let uids: Vec<u64> = (0..QUERY as u64).map(|i| if i % 2 == 0 { i * 97 } else { ONLINE + i }).collect();
    group.throughput(Throughput::Elements(QUERY as u64));
    group.bench_function("query_10k_of_1m_online", |b| {
        b.iter(|| {
            let answer = directory.query(&uids).now_or_never().expect("local answers at once").unwrap();
            black_box(answer)
        })
    });
    group.finish();
}

criterion_group!(benches, event_log, presence);
criterion_main!(benches);
