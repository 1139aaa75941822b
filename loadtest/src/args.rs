//! The command line: what load to offer, what to check, where to write the results.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Many real idlegate clients in one process: they log in, ping, fall silent, and check
/// every expiry against the gateway's guarantee.
#[derive(Debug, Clone, Parser)]
#[command(name = "loadtest", version, about)]
pub struct Args {
    /// The gateways' client addresses, comma-separated: client i connects to the
    /// (i mod n)-th, so the clients spread evenly over the nodes of a cluster.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "127.0.0.1:7070")]
    pub target: Vec<SocketAddr>,
    /// Client connections to open, one uid each.
    #[arg(long, default_value_t = 1000)]
    pub connections: u64,
    /// New connections per second while opening.
    #[arg(long, default_value_t = 5000.0)]
    pub connect_rate: f64,
    /// First uid; client i logs in as uid-base + i (with --devices N, as uid-base + i / N).
    #[arg(long, default_value_t = 1)]
    pub uid_base: u64,
    /// Each uid logs in from N connections with distinct device names: client i is device
    /// `d<i mod N>` of uid uid-base + i / N. The gateway needs --max-devices N or more. A
    /// push goes to a uid and must reach every device of it that is online; the event check
    /// also checks `user_online` and `user_offline`: exactly one per transition, in order.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub devices: u64,
    /// Mean time between an active client's PINGs (each drawn with +-10 % jitter); with
    /// --timeouts, at most a third of the timeout each client was granted.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ping_interval: Duration,
    /// Timeouts the clients ask for at login (LOGIN's timeout, protocol version 5),
    /// comma-separated: client i asks for the (i mod n)-th, so the gateway's timeout classes
    /// run side by side. Each client is held to the window of the timeout its WELCOME
    /// grants, and the report has a row per granted timeout. None: every client takes the
    /// gateway's --timeout.
    #[arg(long, value_delimiter = ',', value_parser = humantime::parse_duration)]
    pub timeouts: Vec<Duration>,
    /// DATA frames per active client per second, on top of the PINGs (0 = none).
    #[arg(long, default_value_t = 0.0)]
    pub data_rate: f64,
    /// Fraction of clients that stop sending at a random moment in the first half of the run
    /// and must then be expired inside the guarantee's window.
    #[arg(long, default_value_t = 0.25)]
    pub silent_fraction: f64,
    /// Silent clients all fall silent at once, when the first half of the run ends,
    /// each with one last PING, so a single sweep expires them all: the gateway's worst tick.
    #[arg(long)]
    pub silent_together: bool,
    /// How long active clients keep sending; silent clients get their full window on top.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// How long past `timeout + tick` a silent client waits for its expiry before it counts
    /// as missed.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub missed_grace: Duration,
    /// The gateways' admin addresses, comma-separated, to read their online gauges, memory
    /// and CPU (summed over the gateways).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub admin: Vec<String>,
    /// How often the run reads --admin's gateways. Each read fetches every gateway's
    /// /metrics, so many processes sharing a run over many gateways read less often.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub scrape_interval: Duration,
    /// The gateways' backend APIs, comma-separated, for --push-rate and --follow-events.
    /// Given in the order of --target, a push to a client goes through the next node's API,
    /// so every push crosses nodes; the events are followed through the first.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub api: Vec<String>,
    /// The gateway's --api-token.
    #[arg(long, env = "IDLEGATE_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Pushes per second through the API, each to a random client of the run that is online;
    /// every client checks what arrives, and the report gives API-call-to-receipt latency.
    #[arg(long, default_value_t = 0.0)]
    pub push_rate: f64,
    /// Follow the API's event stream and check every event against what the clients did:
    /// one online per login, one offline per session with the reason the client saw, one
    /// data event per DATA frame with the same bytes, in order.
    #[arg(long)]
    pub follow_events: bool,
    /// Follow the API's event stream and write every event to this file, one JSON object
    /// a line (its `id`, `type` and fields), for `loadtest verdict --events`; with any
    /// client behaviour, --churn and --reconnect included. The run waits for every
    /// session's offline before it ends.
    #[arg(long)]
    pub events_out: Option<std::path::PathBuf>,
    /// A gateway dies during the run (loadtest/cluster.sh KILL_AT): a client whose
    /// connection is cut without a BYE is expected, and with --follow-events its session's
    /// offline must say node_lost (the report counts them).
    #[arg(long)]
    pub node_loss: bool,
    /// Clients sent away (BYE(shutdown), BYE(server_full)) or cut off come back, after the
    /// wait --reconnect-policy says, and log in again. For reconnect storms and restarts:
    /// the report gives re-login latency, the time until everyone is back and the
    /// reconnect attempts per 100 ms.
    #[arg(long)]
    pub reconnect: bool,
    /// How clients come back with --reconnect: `library`, the Rust client library's policy
    /// (full-jitter exponential backoff from --backoff-base to --backoff-cap, never sooner
    /// than the gateway's retry hint); or `fixed`, a fleet without jitter that waits
    /// --fixed-retry after every loss and ignores hints, as MQTT.js or Phoenix clients do.
    #[arg(long, value_enum, default_value_t = ReconnectPolicy::Library)]
    pub reconnect_policy: ReconnectPolicy,
    /// First backoff window of the `library` policy (the library's default).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,
    /// Largest backoff window of the `library` policy (the library's default).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub backoff_cap: Duration,
    /// The `fixed` policy's wait after every loss (MQTT.js's default `reconnectPeriod`).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub fixed_retry: Duration,
    /// Soak with churn: every session lives about --churn-life, then logs out, falls silent
    /// (and must expire in window), is kicked by a second login of its uid, or drops its
    /// connection, a quarter each; the client comes back 0.5-2 s later, until the run ends.
    /// Implies --reconnect.
    #[arg(long)]
    pub churn: bool,
    /// Also fail --check if the gateway holds more descriptors after the run than before it
    /// (read from --admin; meaningful when the gateway is a process of its own).
    #[arg(long)]
    pub check_fds: bool,
    /// Mean life of a session under --churn (each drawn uniformly in half to 1.5 times it).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub churn_life: Duration,
    /// The gateway's --auth-secret, to mint LOGIN tokens.
    #[arg(long, env = "IDLEGATE_AUTH_SECRET", hide_env_values = true)]
    pub auth_secret: Option<String>,
    /// LOGIN tokens minted elsewhere (JWTs from an identity provider's library): one
    /// `<uid> <token>` a line; a client uses its uid's at every login. Wins over
    /// --auth-secret.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Local addresses to connect from, as one address or a range like 127.0.0.1-127.0.0.8;
    /// spreads connections past one address's ephemeral ports.
    #[arg(long, value_parser = parse_source_ips)]
    pub source_ips: Option<SourceIps>,
    /// Several loadtest processes share one run (one process holds at most about 19,000
    /// sockets): a folder all of them can write. At the end each waits for the others, so
    /// the gateways' online count is read while every process's clients are still online and
    /// compared with their sum. Give each process its own --uid-base range.
    #[arg(long, requires = "processes")]
    pub shared_dir: Option<PathBuf>,
    /// How many processes share the run of --shared-dir.
    #[arg(long, requires = "shared_dir")]
    pub processes: Option<u32>,
    /// Instead of running, merge the JSON reports of processes that shared one run into one
    /// report (latency histograms merged exactly), then --report, --plot and --check it.
    #[arg(long, num_args = 1.., value_name = "REPORT")]
    pub merge: Vec<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write an SVG plot here: online users over time, and the silence histogram.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Exit 1 unless the run was clean: no false, missed, early or late offline, no
    /// unexpected close, and the gateway's online gauge agreeing with ours at the end.
    #[arg(long)]
    pub check: bool,
    /// Seed for jitter and for choosing silent clients, so runs can be repeated.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The wire protocol: idlegate's own, or MQTT 3.1.1 (CONNECT with a keepalive, PINGREQ).
    #[arg(long, value_enum, default_value_t = Protocol::Idlegate)]
    pub protocol: Protocol,
    /// The door clients come in by: plain TCP, TLS (with --tls-ca), WebSocket on /v1/ws, or
    /// WebSocket in TLS. Every check works over each.
    #[arg(long, value_enum, default_value_t = TransportArg::Tcp)]
    pub transport: TransportArg,
    /// PEM certificates to trust for --transport tls and wss (a test CA, say).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// MQTT only: the keepalive sent in CONNECT; the broker's timeout is 1.5 times it.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub mqtt_keepalive: Duration,
    /// MQTT only: the server's own idle timeout when it is not 1.5 keepalives (idlegate's
    /// MQTT door: its --timeout), which the expiry check holds it to.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub mqtt_timeout: Option<Duration>,
    /// MQTT only, with --mqtt-timeout: the server's tick (idlegate's --tick); an expiry
    /// counts as in the window after more than timeout - tick of silence.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub mqtt_tick: Duration,
}

pub use crate::fleet::Protocol;

/// `--transport`: the gateway's door names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    Tcp,
    Tls,
    Ws,
    Wss,
}

impl TransportArg {
    pub fn transport(self) -> idlegate_proto::Transport {
        match self {
            TransportArg::Tcp => idlegate_proto::Transport::Tcp,
            TransportArg::Tls => idlegate_proto::Transport::Tls,
            TransportArg::Ws => idlegate_proto::Transport::Ws,
            TransportArg::Wss => idlegate_proto::Transport::Wss,
        }
    }
}

/// A contiguous range of IPv4 source addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceIps {
    first: u32,
    count: u32,
}

impl SourceIps {
    /// The address client `i` connects from: round robin over the range.
    pub fn for_client(&self, i: u64) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(self.first + (i % u64::from(self.count)) as u32))
    }
}

fn parse_source_ips(s: &str) -> Result<SourceIps, String> {
    let parse = |a: &str| a.trim().parse::<Ipv4Addr>().map_err(|e| format!("{a:?}: {e}"));
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (parse(a)?, parse(b)?),
        None => (parse(s)?, parse(s)?),
    };
    let (first, last) = (u32::from(first), u32::from(last));
    if last < first {
        return Err("the range ends before it starts".into());
    }
    Ok(SourceIps { first, count: last - first + 1 })
}

// === impl Args ===

impl Args {
    /// Checks values clap cannot; the error names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.connections == 0 {
            return Err("--connections: must be at least 1".into());
        }
        if !(self.connect_rate.is_finite() && self.connect_rate > 0.0) {
            return Err("--connect-rate: must be a positive number".into());
        }
        if !(0.0..=1.0).contains(&self.silent_fraction) {
            return Err("--silent-fraction: must be between 0 and 1".into());
        }
        if !(self.data_rate.is_finite() && self.data_rate >= 0.0) {
            return Err("--data-rate: must be zero or a positive number".into());
        }
        if self.ping_interval.is_zero() {
            return Err("--ping-interval: must be longer than zero".into());
        }
        if self.duration.is_zero() {
            return Err("--duration: must be longer than zero".into());
        }
        if self.scrape_interval.is_zero() {
            return Err("--scrape-interval: must be longer than zero".into());
        }
        if !(self.push_rate.is_finite() && self.push_rate >= 0.0) {
            return Err("--push-rate: must be zero or a positive number".into());
        }
        if (self.push_rate > 0.0 || self.follow_events || self.events_out.is_some()) && self.api.is_empty() {
            return Err("--api: --push-rate, --follow-events and --events-out need the gateway's API address".into());
        }
        if (self.push_rate > 0.0 || self.follow_events) && self.protocol == Protocol::Mqtt {
            return Err("--protocol: --push-rate and --follow-events need the idlegate protocol".into());
        }
        if self.churn && self.silent_fraction > 0.0 {
            return Err("--silent-fraction: under --churn sessions fall silent by their own fate; set it to 0".into());
        }
        if self.check_fds && self.admin.is_empty() {
            return Err("--admin: --check-fds reads the gateway's descriptors from its /metrics".into());
        }
        if self.check_fds && self.shared_dir.is_some() {
            return Err("--check-fds: the other processes of a shared run hold descriptors of their own".into());
        }
        if self.processes == Some(0) {
            return Err("--processes: must be at least 1".into());
        }
        if self.churn && self.churn_life.is_zero() {
            return Err("--churn-life: must be longer than zero".into());
        }
        if (self.reconnect || self.churn) && self.follow_events {
            return Err("--follow-events: checks one session per client, so it cannot go with --reconnect".into());
        }
        if self.protocol == Protocol::Mqtt && matches!(self.transport, TransportArg::Ws | TransportArg::Wss) {
            return Err("--transport: MQTT over WebSocket is not part of this load; use tcp or tls".into());
        }
        if self.transport.transport().is_tls() && self.tls_ca.is_none() {
            return Err("--tls-ca: --transport tls and wss need the CA certificate to trust".into());
        }
        if self.mqtt_timeout.is_some_and(|t| t <= self.mqtt_tick) {
            return Err("--mqtt-timeout: must be longer than --mqtt-tick".into());
        }
        if !self.timeouts.is_empty() && self.protocol != Protocol::Idlegate {
            return Err("--timeouts: asked in idlegate's LOGIN; an MQTT client's is --mqtt-keepalive".into());
        }
        if self.timeouts.iter().any(|t| t.is_zero() || t.as_millis() > u128::from(u32::MAX)) {
            return Err("--timeouts: each must be longer than zero and at most 49 days".into());
        }
        if self.protocol == Protocol::Mqtt && self.mqtt_keepalive.as_secs() == 0 {
            return Err("--mqtt-keepalive: MQTT keepalives are whole seconds, at least 1s".into());
        }
        Ok(())
    }

    /// The address client `i` connects to.
    pub fn target_for(&self, i: u64) -> SocketAddr {
        self.target[(i % self.target.len() as u64) as usize]
    }

    /// The timeout client `i` asks for at login, if the run asks for any.
    pub fn timeout_for(&self, i: u64) -> Option<Duration> {
        (!self.timeouts.is_empty()).then(|| self.timeouts[(i % self.timeouts.len() as u64) as usize])
    }

    /// How many clients fall silent.
    pub fn silent_count(&self) -> u64 {
        (self.connections as f64 * self.silent_fraction).round() as u64
    }
}

/// `--reconnect-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReconnectPolicy {
    Library,
    Fixed,
}

impl Args {
    /// The reconnect policy the clients follow.
    pub fn reconnect_policy(&self) -> crate::fleet::Reconnect {
        match self.reconnect_policy {
            ReconnectPolicy::Library => crate::fleet::Reconnect::Library(idlegate_client::Backoff {
                base: self.backoff_base,
                cap: self.backoff_cap,
            }),
            ReconnectPolicy::Fixed => crate::fleet::Reconnect::Fixed(self.fixed_retry),
        }
    }

    /// The policy as the report names it.
    pub fn reconnect_policy_label(&self) -> String {
        match self.reconnect_policy {
            ReconnectPolicy::Library => {
                format!("library (backoff {:?} to {:?})", self.backoff_base, self.backoff_cap)
            }
            ReconnectPolicy::Fixed => format!("fixed ({:?}, hints ignored)", self.fixed_retry),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ip_ranges_round_robin() {
        let ips = parse_source_ips("127.0.0.1-127.0.0.3").unwrap();
        let got: Vec<_> = (0..4).map(|i| ips.for_client(i).to_string()).collect();
        assert_eq!(got, ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.1"]);
        assert_eq!(parse_source_ips("127.0.0.9").unwrap().for_client(5).to_string(), "127.0.0.9");
        assert!(parse_source_ips("127.0.0.3-127.0.0.1").is_err());
        assert!(parse_source_ips("localhost").is_err());
    }

    #[test]
    fn the_default_reconnect_policy_is_the_library_s() {
        let args = Args::try_parse_from(["loadtest", "--reconnect"]).unwrap();
        let want = crate::fleet::Reconnect::Library(idlegate_client::Backoff::default());
        assert_eq!(args.reconnect_policy(), want);
        let fixed = Args::try_parse_from(["loadtest", "--reconnect-policy", "fixed"]).unwrap();
        assert_eq!(fixed.reconnect_policy(), crate::fleet::Reconnect::Fixed(Duration::from_secs(1)));
    }
}
