//! `loadtest nemesis`: a churning idlegate cluster under a seeded random schedule of faults,
//! and an independent check of every promise the events make (docs/RELIABILITY.md).
//!
//! A run starts its own Redis (one server, reached by each gateway through a proxy of its
//! own so that one gateway can be cut off or slowed; or a Redis Cluster with
//! `--redis-cluster`, each gateway's connections to its servers redirected through a
//! transparent proxy of its own, netcut.rs) and
//! `--nodes` gateways, follows the event stream and samples presence as a backend would,
//! churns `--clients` clients, and injects the faults of `schedule.json`. Then it heals
//! everything, lets the clients go, waits for every session to end, and hands what the
//! backend saw to the checker (verdict.rs). Exit status 0 only when nothing is broken.
//!
//! ```text
//! 0        from_ms                     until_ms    clients stop        duration
//! |--------|=== faults (schedule) ======|-----------|---- quiesce -------|
//! | clients churn ..................................| every session ends |
//! ```

pub mod churn;
pub mod netcut;
pub mod observe;
pub mod procs;
pub mod schedule;
pub mod webhooks;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use self::churn::{Churn, DEVICES_PER_UID, FIRST_UID};
use self::procs::{Gateway, GatewaySettings, RedisCluster, RedisServer, Throttle};
use self::schedule::{Fault, Plan, Schedule, SplitMix64};
use crate::proxy::Proxy;

/// `loadtest nemesis`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct NemesisArgs {
    /// The idlegate binary to run (`cargo build --release`: target/release/idlegate).
    #[arg(long)]
    pub gateway: PathBuf,
    /// Gateways in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Client slots; every uid has three devices.
    #[arg(long, default_value_t = 300)]
    pub clients: u64,
    /// The schedule's seed: the same seed gives the same schedule.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The whole run, the quiet end included.
    #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Where schedule.json, events.jsonl, presence.jsonl, clients.jsonl, verdict.json and
    /// the gateways' logs go.
    #[arg(long)]
    pub out: PathBuf,
    /// A Redis Cluster (three primaries with a replica each) instead of one server: adds
    /// `redis_failover`. Its `partition` and `delay` need root: the run takes a network
    /// namespace of its own for its iptables rules (netcut.rs).
    #[arg(long)]
    pub redis_cluster: bool,
    /// Only these fault kinds (comma-separated), for replaying one kind's failures.
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<String>,
    /// The gateways' `--timeout`.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// The gateways' `--tick`.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub tick: Duration,
    /// The gateways' `--node-lease`.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub node_lease: Duration,
    /// The gateways' `--max-devices`: below three (each uid's devices), logins on a new
    /// device take the place of the uid's oldest, the decision that bounds its sessions
    /// across the cluster; the checker holds the stream to it.
    #[arg(long, default_value_t = DEVICES_PER_UID)]
    pub max_devices: u64,
}

/// When the faults may start: the cluster is up and the first logins are in.
const FAULTS_FROM: Duration = Duration::from_secs(5);

/// The quiet end's share of the run: faults healed, clients gone, every session ending.
const QUIESCE_SHARE: f64 = 0.25;

/// The quiet end is never shorter than this: the last expiries, leases and reaps need a few
/// timeouts.
const QUIESCE_AT_LEAST: Duration = Duration::from_secs(20);

/// The run's layout in time.
struct Timeline {
    from: Duration,
    until: Duration,
    clients_stop: Duration,
    end: Duration,
}

impl Timeline {
    fn of(args: &NemesisArgs) -> Result<Timeline, String> {
        let quiesce = args.duration.mul_f64(QUIESCE_SHARE).max(QUIESCE_AT_LEAST);
        let until = args.duration.checked_sub(quiesce).filter(|u| *u > FAULTS_FROM + Duration::from_secs(10));
        let Some(until) = until else {
            return Err(format!(
                "--duration {:?} is too short: at least {:?}",
                args.duration,
                FAULTS_FROM + QUIESCE_AT_LEAST + Duration::from_secs(11)
            ));
        };
        Ok(Timeline { from: FAULTS_FROM, until, clients_stop: until + Duration::from_secs(1), end: args.duration })
    }
}

/// Redis as the run has it.
enum Store {
    /// One server, and a proxy per gateway in front of it.
    Single { server: RedisServer, proxies: Vec<Proxy> },
    /// A Redis Cluster, and a transparent proxy per gateway that its connections to every
    /// server are redirected through.
    Cluster { cluster: RedisCluster, proxies: Vec<Proxy> },
}

impl Store {
    /// Each gateway's way to Redis, in the order of the nodes.
    fn proxies(&self) -> &[Proxy] {
        match self {
            Store::Single { proxies, .. } | Store::Cluster { proxies, .. } => proxies,
        }
    }
}

/// Runs the nemesis; Ok(true) when the checker found nothing.
pub async fn run(args: &NemesisArgs) -> Result<bool, String> {
    if args.nodes == 0 || args.clients < DEVICES_PER_UID || args.max_devices == 0 {
        return Err(format!("--nodes and --max-devices must be at least 1 and --clients at least {DEVICES_PER_UID}"));
    }
    let timeline = Timeline::of(args)?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("--out {}: {e}", args.out.display()))?;
    let out = args.out.canonicalize().map_err(|e| format!("--out {}: {e}", args.out.display()))?;
    let ids: Vec<String> = (1..=args.nodes).map(|i| format!("n{i}")).collect();
    let mut schedule = schedule::draw(Plan {
        seed: args.seed,
        from_ms: timeline.from.as_millis() as u64,
        until_ms: timeline.until.as_millis() as u64,
        nodes: &ids,
        lease_ms: args.node_lease.as_millis() as u64,
        redis_cluster: args.redis_cluster,
    });
    if !args.faults.is_empty() {
        for kind in &args.faults {
            if !schedule::KINDS.contains(&kind.as_str()) {
                return Err(format!("--faults: unknown kind {kind:?} (known: {})", schedule::KINDS.join(", ")));
            }
        }
        schedule.faults.retain(|f| args.faults.contains(&f.kind));
    }
    write_json(&out.join("schedule.json"), &schedule_json(&schedule, args))?;
    eprintln!(
        "nemesis: seed {} draws {} faults over {:?}; writing {}",
        args.seed,
        schedule.faults.len(),
        args.duration,
        out.display()
    );

    // Redis, then the gateways, each through its own way to Redis.
    let mut store = if args.redis_cluster {
        let cluster = RedisCluster::start(&out.join("redis")).await?;
        let mut proxies = Vec::new();
        for _ in &ids {
            proxies.push(Proxy::start_transparent().await.map_err(|e| format!("a proxy to Redis: {e}"))?);
        }
        Store::Cluster { cluster, proxies }
    } else {
        let server = RedisServer::start(out.join("redis"), &[]).await?;
        let mut proxies = Vec::new();
        for _ in &ids {
            proxies.push(Proxy::start(server.addr).await.map_err(|e| format!("a proxy to Redis: {e}"))?);
        }
        Store::Single { server, proxies }
    };
    let settings = GatewaySettings {
        binary: args.gateway.clone(),
        timeout: args.timeout,
        tick: args.tick,
        node_lease: args.node_lease,
        redis_cluster: args.redis_cluster,
        max_devices: args.max_devices,
        webhook: None,
        webhook_max_backoff: webhook_max_backoff(args.node_lease),
        offline_grace: Duration::from_millis(schedule::offline_grace_ms(args.seed, args.tick.as_millis() as u64)),
    };
    // The stalls' cgroups before the gateways: dropped after them, once they are empty.
    let run_name = format!("{}-{}", std::process::id(), args.seed);
    let throttles = if schedule.faults.iter().any(|f| f.kind == "stall") {
        ids.iter().map(|id| Throttle::new(&format!("{run_name}-{id}"))).collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    // Each gateway's redirection to its proxy, before the gateways (dropped after them).
    let redirects = match &store {
        Store::Cluster { cluster, proxies } => {
            let ports: Vec<u16> = cluster.servers.iter().map(|s| s.addr.port()).collect();
            ids.iter()
                .zip(proxies)
                .map(|(id, proxy)| netcut::Redirect::new(&format!("{run_name}-{id}"), &ports, proxy.addr.port()))
                .collect::<Result<Vec<_>, _>>()?
        }
        Store::Single { .. } => Vec::new(),
    };
    // The webhook receiver, before the gateways that post to it.
    let stop_observing = CancellationToken::new();
    let receiver_health = Arc::new(webhooks::Health::default());
    let (hook, hooked, receiver) = webhooks::receive(
        create(&out.join("webhooks.jsonl"))?,
        create(&out.join("webhook-requests.jsonl"))?,
        receiver_health.clone(),
        stop_observing.clone(),
    )
    .await?;
    let secret = out.join("webhook-secret");
    // Standard Webhooks' example secret: the receiver does not verify (tests/webhook.rs does).
    std::fs::write(&secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
        .map_err(|e| format!("{}: {e}", secret.display()))?;
    let settings = GatewaySettings { webhook: Some((format!("http://{hook}/hook"), secret)), ..settings };
    let mut gateways = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let url = match &store {
            Store::Single { proxies, .. } => proxies[i].url(),
            Store::Cluster { cluster, .. } => cluster.url(),
        };
        let mut gateway = Gateway::new(id, url, &settings, &out)?;
        if let Some(redirect) = redirects.get(i) {
            gateway.start_in(&redirect.procs())?;
        }
        gateway.start().await?;
        gateways.push(gateway);
    }
    let kinds: Vec<&str> = schedule.faults.iter().map(|f| f.kind.as_str()).collect();
    if kinds.contains(&"clock") && !gateways[0].has_clock() {
        return Err("a clock fault needs libfaketime: apt-get install faketime (or leave it out with --faults)".into());
    }

    // The backend's eyes first, so the stream holds every session from its start.
    let started = Instant::now();
    receiver_health.start(started);
    let apis: Vec<_> = gateways.iter().map(|g| g.api).collect();
    let seen = Arc::new(observe::Seen::default());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (consumer_slow, slow_rx) = tokio::sync::watch::channel(None);
    let consumer = tokio::spawn(observe::consume(
        apis.clone(),
        seen.clone(),
        create(&out.join("events.jsonl"))?,
        ready_tx,
        slow_rx,
        stop_observing.clone(),
    ));
    ready_rx.await.map_err(|_| "the event consumer never connected".to_string())?;
    let uids = args.clients.div_ceil(DEVICES_PER_UID);
    let sampler = tokio::spawn(observe::sample(
        apis.clone(),
        FIRST_UID..FIRST_UID + uids,
        seen.clone(),
        args.seed,
        create(&out.join("presence.jsonl"))?,
        stop_observing.clone(),
    ));

    // The clients and the backend's pushes and kicks.
    let churn = Arc::new(Churn {
        nodes: gateways.iter().map(|g| (g.id.clone(), g.listen, g.api)).collect(),
        timeout: args.timeout,
        started,
        records: std::sync::Mutex::new(std::io::BufWriter::new(create(&out.join("clients.jsonl"))?)),
        sessions: Default::default(),
        pushes: Default::default(),
        kicks: Default::default(),
    });
    let stop_clients = CancellationToken::new();
    let mut tasks = Vec::new();
    for slot in 0..args.clients {
        tasks.push(tokio::spawn(churn::client(churn.clone(), slot, args.seed, stop_clients.clone())));
    }
    tasks.push(tokio::spawn(churn::backend(churn.clone(), uids, args.seed, stop_clients.clone())));

    // The faults, in the schedule's order of events (a fault's start and its healing).
    let mut nemesis = Nemesis {
        gateways: &mut gateways,
        store: &mut store,
        throttles: &throttles,
        ids: &ids,
        rng: SplitMix64::new(args.seed ^ 0xfa17),
        receiver: &receiver_health,
        consumer: &consumer_slow,
        stalls: Vec::new(),
    };
    let mut steps: Vec<(u64, bool, &Fault)> = Vec::new();
    for f in &schedule.faults {
        steps.push((f.at_ms, true, f));
        steps.push((f.end_ms(), false, f));
    }
    // Heal before harm at the same moment.
    steps.sort_by_key(|(at, start, _)| (*at, *start));
    let mut injected: BTreeMap<String, u64> = BTreeMap::new();
    for (at, start, fault) in steps {
        sleep_until(started + Duration::from_millis(at)).await;
        let result = if start { nemesis.harm(fault).await } else { nemesis.heal(fault).await };
        match result {
            Ok(()) if start => {
                *injected.entry(fault.kind.clone()).or_default() += 1;
                eprintln!("nemesis: {:>7} ms {} {}", at, fault.kind, fault.target);
            }
            Ok(()) => {}
            Err(e) => {
                return Err(format!(
                    "{} of {} on {} at {} ms: {e}",
                    if start { "injecting" } else { "healing" },
                    fault.kind,
                    fault.target,
                    at
                ))
            }
        }
    }

    // The quiet end: clients log out, then every session must end.
    sleep_until(started + timeline.clients_stop).await;
    stop_clients.cancel();
    for task in tasks {
        let _ = task.await;
    }
    churn.flush();
    eprintln!(
        "nemesis: clients stopped after {} sessions, {} pushes and {} kicks; waiting for the last offlines",
        churn.sessions.load(Ordering::Relaxed),
        churn.pushes.load(Ordering::Relaxed),
        churn.kicks.load(Ordering::Relaxed)
    );
    let end = started + timeline.end;
    // Wait until the consumer and the webhooks hold no open session, or the run's end.
    while (seen.open_sessions() > 0 || hooked.open_sessions() > 0) && Instant::now() < end {
        sleep(Duration::from_millis(200)).await;
    }
    // A little longer: a late duplicate offline would show in it.
    sleep(args.timeout.min(end.saturating_duration_since(Instant::now()))).await;
    stop_observing.cancel();
    let _ = consumer.await;
    let _ = sampler.await;
    let _ = receiver.await;
    drop(gateways);
    drop(throttles);
    drop(store);

    let judged = crate::verdict::VerdictArgs {
        events: out.join("events.jsonl"),
        presence: Some(out.join("presence.jsonl")),
        webhooks: Some(out.join("webhooks.jsonl")),
        clients: Some(out.join("clients.jsonl")),
        schedule: Some(out.join("schedule.json")),
        max_devices: None,
        running: false,
        out: Some(out.join("verdict.json")),
    };
    let ok = crate::verdict::run(&judged)?;
    eprintln!(
        "nemesis: seed {}: {} ({} consumer resumes); faults injected: {injected:?}",
        args.seed,
        if ok { "no violation" } else { "VIOLATIONS, see verdict.json" },
        seen.resumes.load(Ordering::Relaxed)
    );
    Ok(ok)
}

/// The gateways' `--webhook-max-backoff`: the node lease, so that a relay's longest wait is
/// as long as a turn and promise 4's "two turns" is as tight as a cluster can keep (with
/// the default minute a healed receiver could wait a minute, and the check would hold
/// nothing over a four-minute run). The floor is the flag's own.
fn webhook_max_backoff(node_lease: Duration) -> Duration {
    node_lease.max(Duration::from_millis(100))
}

/// `schedule.json`: the faults, the seed, and the gateways' settings the checker allows for.
fn schedule_json(schedule: &Schedule, args: &NemesisArgs) -> serde_json::Value {
    serde_json::json!({
        "seed": schedule.seed,
        "faults": schedule.faults,
        "settings": {
            "nodes": args.nodes,
            "clients": args.clients,
            "duration_ms": args.duration.as_millis() as u64,
            "timeout_ms": args.timeout.as_millis() as u64,
            "tick_ms": args.tick.as_millis() as u64,
            "node_lease_ms": args.node_lease.as_millis() as u64,
            "offline_grace_ms": schedule::offline_grace_ms(args.seed, args.tick.as_millis() as u64),
            "redis_cluster": args.redis_cluster,
            "max_devices": args.max_devices,
            "webhook_max_backoff_ms": webhook_max_backoff(args.node_lease).as_millis() as u64,
        }
    })
}

fn write_json(path: &std::path::Path, value: &serde_json::Value) -> Result<(), String> {
    std::fs::write(path, format!("{value:#}\n")).map_err(|e| format!("{}: {e}", path.display()))
}

fn create(path: &std::path::Path) -> Result<std::fs::File, String> {
    std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The hand that injects and heals.
struct Nemesis<'a> {
    gateways: &'a mut [Gateway],
    store: &'a mut Store,
    throttles: &'a [Throttle],
    ids: &'a [String],
    rng: SplitMix64,
    receiver: &'a webhooks::Health,
    consumer: &'a tokio::sync::watch::Sender<Option<bool>>,
    /// The `slow_redis` faults' tasks, stopped when they heal.
    stalls: Vec<CancellationToken>,
}

impl Nemesis<'_> {
    fn node(&self, fault: &Fault) -> Result<usize, String> {
        self.ids.iter().position(|id| *id == fault.target).ok_or_else(|| format!("no node {}", fault.target))
    }

    async fn harm(&mut self, fault: &Fault) -> Result<(), String> {
        match fault.kind.as_str() {
            "kill" => self.gateways[self.node(fault)?].kill(),
            "stop" => self.gateways[self.node(fault)?].freeze(true),
            "partition" => self.store.proxies()[self.node(fault)?].pause(),
            "redis_restart" => match self.store {
                Store::Single { server, .. } => server.kill(),
                Store::Cluster { cluster, .. } => {
                    let pick = self.rng.next_u64() as usize % cluster.servers.len();
                    cluster.servers[pick].kill();
                }
            },
            "redis_failover" => match &*self.store {
                Store::Cluster { cluster, .. } => {
                    cluster.failover(self.rng.next_u64()).await?;
                }
                Store::Single { .. } => return Err("a failover needs --redis-cluster".into()),
            },
            "stall" => {
                let i = self.node(fault)?;
                if let Some(pid) = self.gateways[i].pid() {
                    self.throttles[i].set(pid, true)?;
                }
            }
            "clock" => self.gateways[self.node(fault)?].set_clock(fault.jump_s.unwrap_or(3_600))?,
            "delay" => self.store.proxies()[self.node(fault)?].delay(fault.delay_ms.unwrap_or(100)),
            "slow_redis" => {
                // A pause of `delay_ms` a second, on the one server or on a Redis Cluster's
                // servers in turn, until the fault heals.
                let servers: Vec<std::net::SocketAddr> = match &*self.store {
                    Store::Single { server, .. } => vec![server.addr],
                    Store::Cluster { cluster, .. } => cluster.servers.iter().map(|s| s.addr).collect(),
                };
                let pause = Duration::from_millis(fault.delay_ms.unwrap_or(500));
                let stop = CancellationToken::new();
                self.stalls.push(stop.clone());
                let first = self.rng.next_u64() as usize;
                tokio::spawn(async move {
                    for turn in first.. {
                        let addr = servers[turn % servers.len()];
                        tokio::select! {
                            r = procs::debug_sleep(addr, pause) => if let Err(e) = r { eprintln!("nemesis: slow_redis: {e}") },
                            _ = stop.cancelled() => return,
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = stop.cancelled() => return,
                        }
                    }
                });
            }
            "slow_receiver" => self.receiver.set(Some(self.rng.next_u64())),
            "slow_consumer" => {
                self.consumer.send_replace(Some(fault.reconnect.unwrap_or(false)));
            }
            other => return Err(format!("unknown fault kind {other:?}")),
        }
        Ok(())
    }

    async fn heal(&mut self, fault: &Fault) -> Result<(), String> {
        match fault.kind.as_str() {
            "kill" => self.gateways[self.node(fault)?].start().await?,
            "stop" => self.gateways[self.node(fault)?].freeze(false),
            "partition" => self.store.proxies()[self.node(fault)?].resume(),
            "redis_restart" => match self.store {
                Store::Single { server, .. } => server.restart().await?,
                Store::Cluster { cluster, .. } => {
                    for server in &mut cluster.servers {
                        if !server.running() {
                            server.restart().await?;
                        }
                    }
                    cluster.wait_ok().await?;
                }
            },
            "redis_failover" => {}
            "stall" => {
                let i = self.node(fault)?;
                self.throttles[i].set(0, false)?;
            }
            "clock" => self.gateways[self.node(fault)?].set_clock(0)?,
            "delay" => self.store.proxies()[self.node(fault)?].delay(0),
            "slow_redis" => {
                for stop in self.stalls.drain(..) {
                    stop.cancel();
                }
            }
            "slow_receiver" => self.receiver.set(None),
            "slow_consumer" => {
                self.consumer.send_replace(None);
            }
            _ => {}
        }
        Ok(())
    }
}
