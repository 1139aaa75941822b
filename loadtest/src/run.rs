//! One load-test run: checks the machine can hold the load, opens the clients on schedule,
//! prints a line a second, decides when the run is over, and gathers the report.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idlegate_proto::Auth;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::args::Args;
use crate::backend::{self, Api, Ledger};
use crate::client::{self, Ctx, Plan, LATE_TOLERANCE};
use crate::door::Door;
use crate::fleet::Fleet;
use crate::gateway::{Gateway, Snapshot};
use crate::report::{Report, Sample};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::tokens::Tokens;
use crate::wire::Wire;

/// How long a churning run holds still before the end's counts: a logout's BYE or a kick's
/// second login under way when it began lands in a few milliseconds on loopback.
const CHURN_SETTLE: Duration = Duration::from_millis(1500);

/// How often, and how far apart, a churning run reads the end's counts again before it
/// calls them different: an expiry's BYE takes a tick or two to reach its client.
const END_COUNT_RETRIES: u32 = 10;
const END_COUNT_PAUSE: Duration = Duration::from_millis(100);

/// File descriptors kept for the harness itself beyond one per connection (runtime, stdio,
/// the admin scrapes).
const FD_RESERVE: u64 = 64;

/// Longest the harness waits to reach the target before calling it unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Extra time past every client's last possible deadline before the run stops waiting.
const END_SLACK: Duration = Duration::from_secs(5);

/// Time pushes answered at the end of the run get to reach their clients.
const PUSH_ARRIVAL_GRACE: Duration = Duration::from_millis(500);

/// Longest the event consumer waits at the end for the offline events of the last sessions.
const EVENTS_SETTLE: Duration = Duration::from_secs(10);

/// Time the gateway gets to close the connections the harness closed, before its open
/// descriptors are read at the end.
const FDS_SETTLE: Duration = Duration::from_secs(2);

/// Longest the harness waits for its clients to close at the end.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a run could not start.
#[derive(Debug)]
pub enum SetupError {
    /// The request cannot be met as asked (exit status 2).
    Usage(String),
    /// The target or the admin endpoint cannot be reached (exit status 1).
    Unreachable(String),
}

/// Runs the load described by `args` to its end (or to Ctrl-C, when `interrupt` resolves).
pub async fn run(args: &Args, interrupt: impl std::future::Future<Output = ()>) -> Result<Report, SetupError> {
    check_file_limit(args.connections)?;
    for (i, &target) in args.target.iter().enumerate() {
        let source = args.source_ips.map(|s| s.for_client(i as u64));
        let probe = timeout(PROBE_TIMEOUT, client::connect(target, source))
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer")));
        match probe {
            // Closed at once: a probe kept open would sit at the gateway without a LOGIN until
            // its login deadline, and be counted as a login_timeout.
            Ok(stream) => drop(stream),
            Err(e) => {
                return Err(SetupError::Unreachable(format!(
                    "cannot connect to --target {target}: {e}; is the server running?"
                )))
            }
        }
    }
    let apis: Vec<Api> = args.api.iter().map(|a| Api::new(a, args.api_token.clone())).collect();
    for api in &apis {
        api.probe().await.map_err(|e| SetupError::Unreachable(format!("--api: {e}")))?;
    }
    let shared = match (&args.shared_dir, args.processes) {
        (Some(dir), Some(n)) => Some(Shared::join(dir, n, args.uid_base).map_err(SetupError::Usage)?),
        _ => None,
    };
    let gateway = (!args.admin.is_empty()).then(|| Gateway::new(&args.admin));
    let at_start = match &gateway {
        Some(g) => Some(scrape_at_start(g).await.map_err(|e| SetupError::Unreachable(format!("--admin: {e}")))?),
        None => None,
    };

    let door = Door::new(args.transport.transport(), args.tls_ca.as_deref()).map_err(SetupError::Usage)?;
    let tokens = match (&args.token_file, &args.auth_secret) {
        (Some(path), _) => Tokens::read(path).map_err(SetupError::Usage)?,
        (None, Some(secret)) => Tokens::Hmac(Auth::new(secret.as_bytes().to_vec())),
        (None, None) => Tokens::None,
    };
    let silent = args.silent_count();
    let stats = Arc::new(Stats::new(silent));
    let fleet = Arc::new(Fleet::new(args.uid_base, args.devices, args.connections, args.node_loss));
    let epoch = fleet.epoch;
    let ctx = Arc::new(Ctx {
        wire: Wire::new(args.protocol, args.mqtt_keepalive)
            .with_mqtt_window(args.mqtt_timeout.map(|t| (t, args.mqtt_tick)))
            .over_websocket(door.websocket()),
        door,
        tokens,
        ping_interval: args.ping_interval,
        data_interval: (args.data_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.data_rate)),
        stats: stats.clone(),
        stop: CancellationToken::new(),
        settle: CancellationToken::new(),
        fleet: fleet.clone(),
        missed_grace: args.missed_grace,
        learned: OnceLock::new(),
        reconnect: args.reconnect || args.churn,
        reconnect_policy: args.reconnect_policy(),
        churn_life: args.churn.then_some(args.churn_life),
    });

    // The event consumer starts before the first client, so it sees every login.
    let ledger = Arc::new(Ledger::default());
    let follower_stop = CancellationToken::new();
    let follower = match (apis.first(), args.follow_events || args.events_out.is_some()) {
        (Some(api), true) => {
            let (ready, opened) = tokio::sync::oneshot::channel();
            let clients = backend::Clients { uid_base: args.uid_base, devices: args.devices, count: args.connections };
            let record = match &args.events_out {
                Some(path) => Some(
                    std::fs::File::create(path)
                        .map_err(|e| SetupError::Unreachable(format!("--events-out {}: {e}", path.display())))?,
                ),
                None => None,
            };
            let stop = follower_stop.clone();
            let task = tokio::spawn(backend::follow(api.clone(), ledger.clone(), clients, record, ready, stop));
            match opened.await {
                Ok(Ok(())) => Some(task),
                Ok(Err(e)) => return Err(SetupError::Unreachable(format!("--follow-events: {e}"))),
                Err(_) => return Err(SetupError::Unreachable("--follow-events: the consumer ended".into())),
            }
        }
        _ => None,
    };
    let push_stop = CancellationToken::new();
    let pusher = match apis.is_empty() {
        false if args.push_rate > 0.0 => Some(tokio::spawn(backend::push_loop(
            apis.clone(),
            args.target.len(),
            args.push_rate,
            fleet.clone(),
            args.seed,
            push_stop.clone(),
        ))),
        _ => None,
    };

    let mut clients = JoinSet::new();
    for plan in plans(args, epoch) {
        clients.spawn(client::run(plan, ctx.clone()));
    }
    let connect_span = Duration::from_secs_f64(args.connections as f64 / args.connect_rate);

    let mut report = Report::new(args.protocol, args.connections, silent);
    report.devices = args.devices;
    report.gateway_rss_bytes_at_start = at_start.and_then(|s| s.rss_bytes);
    report.gateway_fds_at_start = at_start.and_then(|s| s.open_fds);
    report.check_fds = args.check_fds;
    report.churn = args.churn;
    report.shared_processes = shared.as_ref().map(Shared::processes);

    let mut every_second = tokio::time::interval(Duration::from_secs(1));
    every_second.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut last_pings = 0;
    let mut all_logged_in_at: Option<Instant> = None;
    let mut next_scrape = Instant::now();
    tokio::pin!(interrupt);
    loop {
        tokio::select! {
            _ = every_second.tick() => {}
            _ = &mut interrupt => {
                report.interrupted = true;
                break;
            }
        }
        let now = Instant::now();
        let snapshot = match &gateway {
            Some(g) if now >= next_scrape => {
                next_scrape = now + args.scrape_interval;
                g.scrape().await.ok()
            }
            _ => None,
        };
        let pings = Stats::get(&stats.pings_sent);
        let rtt_p99_ms = progress(&stats, snapshot, now - epoch, pings - last_pings, args.connections);
        last_pings = pings;
        report.timeline.push(Sample {
            t: (now - epoch).as_secs_f64(),
            unix_ms: unix_ms(),
            harness_online: stats.online.load(Ordering::Relaxed),
            gateway_online: snapshot.and_then(|s| s.online_users),
            rtt_p99_ms,
            gateway_rss_bytes: snapshot.and_then(|s| s.rss_bytes),
            gateway_open_fds: snapshot.and_then(|s| s.open_fds),
        });

        let opened = Stats::get(&stats.logged_in) + Stats::get(&stats.connect_errors);
        if all_logged_in_at.is_none() && (opened >= args.connections || now > epoch + connect_span + END_SLACK) {
            all_logged_in_at = Some(now);
        } else if let (Some(at), None) = (all_logged_in_at, report.gateway_rss_bytes) {
            // One second after the last login: the steady state whose memory we report.
            if now >= at + Duration::from_secs(1) {
                report.gateway_rss_bytes = snapshot.and_then(|s| s.rss_bytes);
            }
        }

        if stats.fatal().is_some() {
            break;
        }
        // A silent client of the longest timeout granted is the last to be due.
        let (timeout_d, tick) = stats.longest_granted().or_else(|| ctx.learned.get().copied()).unwrap_or_default();
        let active_done = now >= epoch + connect_span.max(args.duration);
        if active_done {
            push_stop.cancel();
        }
        let silent_done = stats.silent_pending.load(Ordering::Relaxed) <= 0;
        let hard_end = epoch + connect_span + args.duration + timeout_d + tick + args.missed_grace + END_SLACK;
        if (active_done && silent_done) || now >= hard_end {
            break;
        }
    }

    // Pushes in flight are answered, then given a moment to arrive, before clients close.
    push_stop.cancel();
    if let Some(pusher) = pusher {
        let _ = pusher.await;
        tokio::time::sleep(PUSH_ARRIVAL_GRACE).await;
    }
    // Under --churn sessions come and go until told to hold still; what was under way then
    // (a logout's BYE, a kick's second login) lands within this, and both counts see it.
    if ctx.churn_life.is_some() {
        ctx.settle.cancel();
        tokio::time::sleep(CHURN_SETTLE).await;
    }
    // The end, while the active clients are still connected: compare counts. In a shared
    // run, once every process has reached its end, and before any closes its clients.
    report.harness_online_at_end = stats.online.load(Ordering::Relaxed);
    if let Some(shared) = &shared {
        match shared.meet("ready", report.harness_online_at_end).await {
            Ok(counts) => report.run_online_at_end = Some(counts.iter().sum()),
            Err(e) => stats.set_fatal(e),
        }
    }
    if let Some(g) = &gateway {
        report.gateway_online_at_end = g.scrape().await.ok().and_then(|s| s.online_users);
        // Alone, under --churn, a session a sweep ended a moment ago is already off the
        // gateway's count while its BYE is still on the way to the harness: the two are
        // read again, a few ticks apart, until they agree. A session the gateway lost
        // stays apart however long they are read.
        let mut again = END_COUNT_RETRIES;
        while shared.is_none()
            && ctx.churn_life.is_some()
            && again > 0
            && report.gateway_online_at_end != Some(report.harness_online_at_end as f64)
        {
            again -= 1;
            tokio::time::sleep(END_COUNT_PAUSE).await;
            report.harness_online_at_end = stats.online.load(Ordering::Relaxed);
            report.gateway_online_at_end = g.scrape().await.ok().and_then(|s| s.online_users);
        }
    }
    if let Some(shared) = &shared {
        if let Err(e) = shared.meet("read", 0).await {
            stats.set_fatal(e);
        }
    }
    ctx.stop.cancel();
    let _ = timeout(CLOSE_TIMEOUT, async { while clients.join_next().await.is_some() {} }).await;
    clients.abort_all();
    if let Some(follower) = follower {
        // Every session's offline event, the last ones for the clients just closed.
        let logins = Stats::get(&stats.logged_in);
        let deadline = Instant::now() + EVENTS_SETTLE;
        while ledger.offlines.load(Ordering::Relaxed) < logins && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        follower_stop.cancel();
        let _ = follower.await;
    }
    if args.follow_events {
        let (mismatches, examples) = ledger.judge(&fleet);
        report.events_seen = Some(ledger.events.load(Ordering::Relaxed));
        report.events_missed = ledger.missed.load(Ordering::Relaxed) + ledger.malformed.load(Ordering::Relaxed);
        report.event_mismatches = mismatches;
        report.events_node_lost = ledger.node_lost.load(Ordering::Relaxed);
        report.user_events = ledger.user_events.load(Ordering::Relaxed);
        report.event_mismatch_examples = examples;
    }
    report.reconnects = Stats::get(&stats.reconnects);
    report.connect_retries = Stats::get(&stats.connect_retries);
    report.relogin_ms = stats.relogin();
    report.shutdown_byes = Stats::get(&stats.shutdown_byes);
    let (first_bye, last_bye) = (Stats::get(&stats.first_shutdown_nanos), Stats::get(&stats.last_shutdown_nanos));
    if report.shutdown_byes > 0 {
        report.shutdown_spread_ms = Some((last_bye - first_bye) as f64 / 1e6);
    }
    let (cut, back) = (Stats::get(&stats.first_cutoff_nanos), Stats::get(&stats.last_relogin_nanos));
    report.all_back_after_ms = (cut != u64::MAX && back > cut).then(|| (back - cut) as f64 / 1e6);
    if cut != u64::MAX {
        report.reconnect_attempts_per_100ms = stats.reconnect_histogram(cut, Duration::from_millis(100));
    }
    report.reconnect_policy = if ctx.reconnect { args.reconnect_policy_label() } else { String::new() };
    report.clients_shed_twice = fleet.cells.iter().filter(|c| c.shed.load(Ordering::Relaxed) > 1).count() as u64;
    let pushes = &fleet.pushes;
    report.push_ms = stats.push();
    report.pushes_sent = Stats::get(&pushes.sent);
    report.pushes_offline = Stats::get(&pushes.offline);
    report.push_errors = Stats::get(&pushes.errors);
    report.pushes_received = Stats::get(&pushes.received);
    report.push_deliveries = Stats::get(&pushes.deliveries);
    report.pushes_lost = pushes.lost();
    report.pushes_unexpected = Stats::get(&pushes.unexpected);
    // A moment for the gateway to finish closing what the clients just closed.
    if gateway.is_some() {
        tokio::time::sleep(FDS_SETTLE).await;
    }
    let at_end: Option<Snapshot> = match &gateway {
        Some(g) => g.scrape().await.ok(),
        None => None,
    };
    report.gateway_fds_at_end = at_end.and_then(|s| s.open_fds);

    let elapsed = epoch.elapsed();
    report.duration_s = elapsed.as_secs_f64();
    report.logins_ok = Stats::get(&stats.logged_in);
    report.connect_errors = Stats::get(&stats.connect_errors);
    let login_span = Duration::from_nanos(Stats::get(&stats.last_login_nanos));
    report.connect_rate_per_s = report.logins_ok as f64 / login_span.as_secs_f64().max(1e-3);
    if let Some(&(t, k)) = ctx.learned.get() {
        report.timeout_ms = Some(t.as_secs_f64() * 1e3);
        report.tick_ms = Some(k.as_secs_f64() * 1e3);
        report.window_ms = Some(((t.saturating_sub(k)).as_secs_f64() * 1e3, (t + LATE_TOLERANCE).as_secs_f64() * 1e3));
    }
    report.classes = stats.classes();
    report.login_ms = stats.login();
    report.rtt_ms = stats.rtt();
    report.silence_ms = stats.silence();
    report.silence_bucket_ms = Report::bucket_width_ms(report.window_ms);
    report.silence_histogram = stats.silence_buckets(report.silence_bucket_ms);
    report.pings_sent = Stats::get(&stats.pings_sent);
    report.pongs_received = Stats::get(&stats.pongs_received);
    report.data_sent = Stats::get(&stats.data_sent);
    report.false_offline = Stats::get(&stats.false_offline);
    report.missed_offline = Stats::get(&stats.missed_offline);
    report.early_offline = Stats::get(&stats.early_offline);
    report.late_offline = Stats::get(&stats.late_offline);
    report.expired_in_window = Stats::get(&stats.expired_in_window);
    report.unexpected_closes = stats.unexpected_by_reason();
    report.closes = stats.closes_by_reason();
    report.fatal = stats.fatal();
    if let (Some(start), Some(steady)) = (report.gateway_rss_bytes_at_start, report.gateway_rss_bytes) {
        report.gateway_rss_bytes_per_connection = Some((steady - start) / report.logins_ok.max(1) as f64);
    }
    if let (Some(start), Some(end)) = (at_start.and_then(|s| s.cpu_seconds), at_end.and_then(|s| s.cpu_seconds)) {
        report.gateway_cpu_seconds = Some(end - start);
    }
    report.histograms = stats.histograms();
    report.summarize_timeline(shared.is_none());
    report.judge();
    Ok(report)
}

/// Raises this process's open-file limit and checks it holds the run.
fn check_file_limit(connections: u64) -> Result<(), SetupError> {
    let limit = rlimit::increase_nofile_limit(u64::MAX)
        .map_err(|e| SetupError::Usage(format!("cannot read the open-file limit: {e}")))?;
    let need = connections + FD_RESERVE;
    if need > limit {
        return Err(SetupError::Usage(format!(
            "--connections {connections} needs about {need} open files, but this process may open {limit} \
             (its hard limit, `ulimit -Hn`). Raise the hard limit (as root: `ulimit -Hn {need}`, or \
             LimitNOFILE= in a systemd unit, or /etc/security/limits.conf), or lower --connections to {}",
            limit.saturating_sub(FD_RESERVE)
        )));
    }
    Ok(())
}

/// Every client's plan: connect times at the connect rate, a seeded choice of silent clients,
/// each going silent at a random moment in the first half of the run (or all at its end,
/// with `--silent-together`).
fn plans(args: &Args, epoch: Instant) -> Vec<Plan> {
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut silent = vec![false; args.connections as usize];
    silent[..args.silent_count() as usize].fill(true);
    silent.shuffle(&mut rng);
    let half = args.duration / 2;
    (0..args.connections)
        .map(|i| Plan {
            index: i,
            uid: args.uid_base + i / args.devices,
            device: (args.devices > 1).then(|| device_name(i % args.devices)),
            connect_at: epoch + Duration::from_secs_f64(i as f64 / args.connect_rate),
            silent_at: silent[i as usize]
                .then(|| epoch + if args.silent_together { half } else { half.mul_f64(rng.gen_range(0.0..=1.0)) }),
            final_ping: args.silent_together,
            timeout: args.timeout_for(i),
            target: args.target_for(i),
            source: args.source_ips.map(|s| s.for_client(i)),
            seed: rng.gen(),
        })
        .collect()
}

/// The name of a uid's `n`-th device under `--devices`; the event check reads it back.
pub fn device_name(n: u64) -> idlegate_proto::Device {
    idlegate_proto::Device::parse(format!("d{n}").as_bytes()).expect("a short ASCII name is a device name")
}

/// Wall-clock milliseconds since the Unix epoch, which line up the timelines of the
/// processes of a shared run.
fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The line printed every second; returns the round-trip p99 of that second.
fn progress(stats: &Stats, gateway: Option<Snapshot>, since: Duration, pings: u64, connections: u64) -> f64 {
    let gateway_online = gateway.and_then(|s| s.online_users).map_or("-".to_string(), |v| format!("{v:.0}"));
    let rtt = stats.take_rtt_window();
    eprintln!(
        "[{:>6.1}s] connected {}/{} logged_in {} online {} (gateway {}) pings/s {} rtt_p99 {:.2}ms silent_left {} closes {:?}",
        since.as_secs_f64(),
        Stats::get(&stats.connected),
        connections,
        Stats::get(&stats.logged_in),
        stats.online.load(Ordering::Relaxed),
        gateway_online,
        pings,
        rtt.p99,
        stats.silent_pending.load(Ordering::Relaxed).max(0),
        stats.closes_by_reason(),
    );
    rtt.p99
}

/// Reads of the gateways' `/metrics` tried at the start before the run gives up: dozens of
/// gateways and load generators starting together on two cores can leave one `/metrics`
/// unanswered for a moment (the million-session run lost 17 of 64 load generators to one
/// failed read each).
const START_SCRAPE_ATTEMPTS: u32 = 5;

/// The gateways' figures before the first client, tried [`START_SCRAPE_ATTEMPTS`] times a
/// second apart.
async fn scrape_at_start(gateway: &Gateway) -> Result<crate::gateway::Snapshot, String> {
    let mut attempt = 1;
    loop {
        match gateway.scrape().await {
            Ok(snapshot) => return Ok(snapshot),
            Err(e) if attempt >= START_SCRAPE_ATTEMPTS => return Err(e),
            Err(e) => eprintln!("loadtest: --admin: {e}; trying again ({attempt} of {START_SCRAPE_ATTEMPTS})"),
        }
        attempt += 1;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
