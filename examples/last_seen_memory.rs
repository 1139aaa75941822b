//! What `--last-seen-capacity` costs: the heap bytes a lone gateway's last-seen times hold
//! (`presence/last_seen.rs`), counted by a counting allocator, not estimated, at the
//! default capacity of 1,000,000 uids, in three shapes of traffic:
//!
//! - `distinct`: every uid seen once, the store exactly full;
//! - `twice`: every uid seen twice (its first write left in the order until the order is
//!   compacted: the most the order holds);
//! - `churn`: three times the capacity of distinct uids, the least recently seen forgotten.
//!
//! `cargo run --release --example last_seen_memory > docs/results/last-seen-memory.txt`

use idlegate::bench::LastSeen;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The default `--last-seen-capacity`.
const CAPACITY: usize = 1_000_000;

fn measure(name: &str, uids: impl Iterator<Item = u64>) {
    let before = Counting::live_bytes();
    let mut seen = LastSeen::new(CAPACITY);
    let (mut writes, mut peak) = (0u64, 0isize);
    for uid in uids {
        writes += 1;
        seen.seen(uid, 1_795_000_000_000 + writes);
        peak = peak.max(Counting::live_bytes() - before);
    }
    let held = Counting::live_bytes() - before;
    let per_uid = |bytes: isize| bytes as f64 / CAPACITY as f64;
    println!(
        "{name:<9} writes {writes:>9}  held {held:>11} B ({:>5.1} B/uid)  peak {peak:>11} B ({:>5.1} B/uid)",
        per_uid(held),
        per_uid(peak)
    );
    drop(seen);
}

fn main() {
    println!("last-seen store at --last-seen-capacity {CAPACITY}: heap bytes over the capacity");
    let n = CAPACITY as u64;
    measure("distinct", 0..n);
    measure("twice", (0..n).chain(0..n));
    measure("churn", 0..3 * n);
}
