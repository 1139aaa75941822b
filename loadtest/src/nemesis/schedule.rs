//! The nemesis's fault schedule, drawn from a seed: which fault, on which target, when and
//! for how long. The same seed, duration and node count give the same `schedule.json`, so a
//! schedule found failing replays.
//!
//! The draw uses SplitMix64, written out here rather than taken from `rand`: `rand` does not
//! promise that a seeded generator gives the same numbers across its releases, and a
//! published seed must replay after a dependency upgrade.

use serde::{Deserialize, Serialize};

/// The fault kinds, as `schedule.json` names them: crashes and cuts, then gray faults
/// (issue 49), where something answers, only late.
pub const KINDS: [&str; 11] = [
    "kill",
    "stop",
    "partition",
    "redis_restart",
    "redis_failover",
    "stall",
    "clock",
    "delay",
    "slow_redis",
    "slow_receiver",
    "slow_consumer",
];

/// The target of the faults that hit Redis, not a gateway.
pub const REDIS: &str = "redis";

/// The target of `slow_receiver`: the webhook receiver.
pub const RECEIVER: &str = "webhook";

/// The target of `slow_consumer`: the SSE consumer.
pub const CONSUMER: &str = "consumer";

/// One fault: `kind` on `target` (a node id, `redis`, `webhook` or `consumer`) from `at_ms`
/// after the run's start for `for_ms`, with the parameters of its kind; the others are left
/// out of `schedule.json`:
/// - `clock`: how far the wall clock jumps (`jump_s`, either way);
/// - `delay`: how late the node's link to Redis carries every byte, each way (`delay_ms`);
/// - `slow_redis`: how long each of Redis's stalls lasts (`delay_ms`), one a second;
/// - `slow_consumer`: whether the consumer reconnects with `Last-Event-ID` after its
///   pause, or reads on (`reconnect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub kind: String,
    pub target: String,
    pub at_ms: u64,
    pub for_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jump_s: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect: Option<bool>,
}

impl Fault {
    /// When its effects are over: the fault's end. What follows a fault (a fenced node
    /// logging back in, a lease running out) is the checker's to allow for.
    pub fn end_ms(&self) -> u64 {
        self.at_ms + self.for_ms
    }
}

/// `schedule.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub seed: u64,
    pub faults: Vec<Fault>,
}

/// The shape of a run the schedule is drawn for.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    pub seed: u64,
    /// Faults start after this...
    pub from_ms: u64,
    /// ...and are all healed by this.
    pub until_ms: u64,
    pub nodes: &'a [String],
    /// The gateways' `--node-lease`: stops are drawn both shorter and longer.
    pub lease_ms: u64,
    /// A Redis Cluster runs (failover is possible), not one server.
    pub redis_cluster: bool,
}

/// The mean time between two faults' starts. Faults on different targets overlap, which is
/// where the interleavings a fixed script misses come from.
const MEAN_SPACING_MS: u64 = 6_000;

/// SplitMix64 (Steele, Lea and Flood, 2014): 64 bits of state, every seed a full-period
/// sequence.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (the modulo bias is below 2^-40 for the ranges used here).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next_u64() as usize % items.len()]
    }
}

/// The kinds a run can inject: every kind, but a failover only on a Redis Cluster.
pub fn kinds(redis_cluster: bool) -> Vec<&'static str> {
    KINDS.iter().copied().filter(|k| redis_cluster || *k != "redis_failover").collect()
}

/// The offline grace a seed runs with (`--offline-grace`, every node the same): none for
/// half the seeds, 0.5 to 3 s for the others, in whole ticks (as the gateway requires),
/// drawn apart from the faults so that adding a kind does not change it.
pub fn offline_grace_ms(seed: u64, tick_ms: u64) -> u64 {
    let mut rng = SplitMix64::new(seed ^ 0x6772_6163_6500_0000);
    if rng.next_u64().is_multiple_of(2) {
        0
    } else {
        rng.between(500, 3_000).div_ceil(tick_ms.max(1)) * tick_ms.max(1)
    }
}

/// Draws the schedule: every kind the run can inject at least once (in a seeded order),
/// then random kinds, starts spaced about [`MEAN_SPACING_MS`] apart, no two faults on one
/// target at once, and a Redis fault alone with its target.
pub fn draw(plan: Plan<'_>) -> Schedule {
    let mut rng = SplitMix64::new(plan.seed);
    let mut kinds = kinds(plan.redis_cluster);
    // A seeded shuffle (Fisher-Yates), so the first faults cover every kind.
    for i in (1..kinds.len()).rev() {
        let j = rng.between(0, i as u64) as usize;
        kinds.swap(i, j);
    }
    let mut faults: Vec<Fault> = Vec::new();
    let mut at = plan.from_ms;
    let mut n = 0usize;
    loop {
        let kind = if n < kinds.len() { kinds[n] } else { *rng.pick(&kinds) };
        let for_ms = match kind {
            "kill" => rng.between(500, 4_000),
            // Half shorter than the lease (the node must keep its sessions), half longer
            // (it is taken for dead, reaped, and must fence itself when it wakes).
            "stop" if rng.next_u64().is_multiple_of(2) => rng.between(plan.lease_ms / 5, plan.lease_ms * 7 / 10),
            "stop" => rng.between(plan.lease_ms * 3 / 2, plan.lease_ms * 4),
            "partition" => rng.between(500, 5_000),
            "redis_restart" => rng.between(200, 2_000),
            // The failover itself takes what it takes; for_ms is the time allowed for it.
            "redis_failover" => 3_000,
            "stall" => rng.between(500, 3_000),
            // Seconds to a minute, kept within a short run's window.
            "delay" => rng.between(2_000, 20_000),
            "slow_redis" => rng.between(2_000, 8_000),
            // Long enough for a receiver slower than the relay's turn to hold several.
            "slow_receiver" => rng.between(5_000, 30_000),
            "slow_consumer" => rng.between(1_000, 10_000),
            _ => rng.between(2_000, 8_000),
        };
        let target = match kind {
            "slow_receiver" => RECEIVER.to_string(),
            "slow_consumer" => CONSUMER.to_string(),
            k if k.starts_with("redis") || k == "slow_redis" => REDIS.to_string(),
            _ => rng.pick(plan.nodes).clone(),
        };
        let jump_s = (kind == "clock").then(|| if rng.next_u64().is_multiple_of(2) { 3_600 } else { -3_600 });
        let delay_ms = match kind {
            // 20 ms to 5 s, log-uniform in effect: half the delays under 300 ms.
            "delay" if rng.next_u64().is_multiple_of(2) => Some(rng.between(20, 300)),
            "delay" => Some(rng.between(300, 5_000)),
            "slow_redis" => Some(rng.between(100, 1_500)),
            _ => None,
        };
        let reconnect = (kind == "slow_consumer").then(|| rng.next_u64().is_multiple_of(2));
        let mut fault = Fault { kind: kind.to_string(), target, at_ms: at, for_ms, jump_s, delay_ms, reconnect };
        // Not on a target already under a fault (nor on anything while Redis is, nor on
        // Redis while anything is): wait for it to heal.
        let busy = |f: &Fault, g: &Fault| {
            (f.target == g.target || f.target == REDIS || g.target == REDIS)
                && f.at_ms < g.end_ms()
                && g.at_ms < f.end_ms()
        };
        while let Some(clash) = faults.iter().filter(|g| busy(&fault, g)).map(Fault::end_ms).max() {
            fault.at_ms = clash + rng.between(100, 1_000);
        }
        if fault.end_ms() > plan.until_ms {
            break;
        }
        at = fault.at_ms.max(at) + rng.between(MEAN_SPACING_MS / 4, MEAN_SPACING_MS * 7 / 4);
        faults.push(fault);
        n += 1;
    }
    faults.sort_by_key(|f| f.at_ms);
    Schedule { seed: plan.seed, faults }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seed: u64, nodes: &[String], until_ms: u64, redis_cluster: bool) -> Plan<'_> {
        Plan { seed, from_ms: 5_000, until_ms, nodes, lease_ms: 1_000, redis_cluster }
    }

    #[test]
    fn a_seed_gives_one_schedule() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        assert_eq!(draw(plan(7, &nodes, 120_000, false)), draw(plan(7, &nodes, 120_000, false)));
        assert_ne!(draw(plan(7, &nodes, 120_000, false)), draw(plan(8, &nodes, 120_000, false)));
        // SplitMix64's published first output for seed 0 (the reference implementation's).
        assert_eq!(SplitMix64::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn every_kind_comes_and_no_target_takes_two_faults_at_once() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        for redis_cluster in [false, true] {
            for seed in 0..50 {
                let s = draw(plan(seed, &nodes, 110_000, redis_cluster));
                for kind in kinds(redis_cluster) {
                    assert!(s.faults.iter().any(|f| f.kind == kind), "seed {seed}: no {kind}");
                }
                for (i, f) in s.faults.iter().enumerate() {
                    assert!(f.at_ms >= 5_000 && f.end_ms() <= 110_000, "seed {seed}: {f:?}");
                    for g in &s.faults[i + 1..] {
                        let shared = f.target == g.target || f.target == REDIS || g.target == REDIS;
                        assert!(!shared || f.end_ms() <= g.at_ms, "seed {seed}: {f:?} and {g:?} overlap");
                    }
                }
                // A stop is either shorter than the lease or longer, never about equal.
                for f in s.faults.iter().filter(|f| f.kind == "stop") {
                    assert!(f.for_ms <= 700 || f.for_ms >= 1_500, "seed {seed}: {f:?}");
                }
            }
        }
    }
}
