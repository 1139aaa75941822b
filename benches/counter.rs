//! The per-frame counter, shared or per worker: is one atomic that every worker thread
//! increments for every frame worth replacing with per-thread counters?
//!
//! Two threads (the machine's two cores; pin nothing else meanwhile) each count `iters`
//! frames, as two workers would, and the time is reported per frame:
//! - `shared`: one `IntCounter`, as idlegate counts frames;
//! - `per_thread`: one `IntCounter` per thread, summed when read (no shared cache line);
//! - `local`: prometheus's `LocalIntCounter`, flushed every 1,024 frames.
//!
//! `cargo bench --bench counter`. The answer is a ratio against the cost of a whole frame
//! (15 us of CPU per PING and PONG, docs/BENCHMARKS.md section 2).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use prometheus::IntCounter;

/// Worker threads counting at once.
const THREADS: usize = 2;

/// Frames between flushes of a thread-local counter.
const FLUSH_EVERY: u64 = 1024;

/// Runs `count` on `THREADS` threads at once, `iters` times each; the time until all finish.
fn together(iters: u64, count: impl Fn(usize, u64) + Sync) -> Duration {
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (barrier, count) = (&barrier, &count);
                scope.spawn(move || {
                    barrier.wait();
                    let started = tokio::time::Instant::now();
                    count(t, iters);
                    started.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("counting thread")).max().unwrap_or_default()
    })
}

fn counters(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame_counter");
    let shared = IntCounter::new("frames", "frames").expect("counter");
    group.bench_function("shared", |b| {
        b.iter_custom(|iters| {
            together(iters, |_, n| {
                for _ in 0..n {
                    black_box(&shared).inc();
                }
            })
        })
    });
    let per_thread: Vec<IntCounter> =
        (0..THREADS).map(|t| IntCounter::new(format!("frames_{t}"), "frames").expect("counter")).collect();
    group.bench_function("per_thread", |b| {
        b.iter_custom(|iters| {
            together(iters, |t, n| {
                for _ in 0..n {
                    black_box(&per_thread[t]).inc();
                }
            })
        })
    });
    group.bench_function("local", |b| {
        b.iter_custom(|iters| {
            together(iters, |_, n| {
                let local = shared.local();
                for i in 0..n {
                    black_box(&local).inc();
                    if i % FLUSH_EVERY == 0 {
                        local.flush();
                    }
                }
                local.flush();
            })
        })
    });
    group.finish();
}

criterion_group!(benches, counters);
criterion_main!(benches);
