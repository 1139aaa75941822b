//! How presence spreads uids over locks: the ring shards of the registry and the shards of
//! the offline grace both place a uid by one hash and lock a shard the same way.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The shard of `uid` among `shards` (a power of two): Fibonacci hashing, so sequential
/// uids spread evenly.
pub(crate) fn shard_of(uid: u64, shards: usize) -> usize {
    debug_assert!(shards.is_power_of_two(), "{shards} shards");
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    (uid.wrapping_mul(GOLDEN) >> (64 - shards.trailing_zeros())) as usize
}

/// Locks a shard. A panic elsewhere while holding it cannot leave the shard half-updated in
/// a way later calls trip over (each call restores its invariants before returning), so a
/// poisoned lock is used as is rather than taking the gateway down.
pub(crate) fn lock<T>(shard: &Mutex<T>) -> MutexGuard<'_, T> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}
