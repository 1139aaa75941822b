//! The `idlegate` binary: command line, logging, signals. Everything else is the library.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use idlegate::{
    default_max_connections, Auth, Config, ConfigFile, FlagSpec, JwksConfig, JwksSource, JwtAuth, JwtRules, Listeners,
    ProxyProtocol, RedisTarget, Server, TlsIdentity, WatchConfig, WebhookConfig,
};
use idlegate_proto::unix_now;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpSocket};

/// Pending-connection queue of the client listener. The kernel caps it at
/// net.core.somaxconn (4096 on current Linux); the 1024 of a plain bind overflows when
/// thousands of clients reconnect at once, and every dropped SYN costs its client a 1 s, then
/// 3 s retransmit.
const LISTEN_BACKLOG: u32 = 4096;

/// Idle-connection timeout gateway: clients log in with a uid and keep a TCP connection
/// alive; a uid silent for the timeout goes offline and its connection is closed.
#[derive(Debug, Parser)]
#[command(name = "idlegate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway.
    Serve(Box<ServeArgs>),
    /// Print a LOGIN token for a uid, signed with the gateway's secret.
    Token(TokenArgs),
    /// Print a configuration file for `serve --config` with every key, its default and
    /// what it does (deploy/idlegate.toml is this).
    ConfigTemplate,
    /// Ask a running gateway's admin listener whether it is ready (`GET /readyz`): exit 0
    /// when it answers 200, 1 otherwise, with what it said. A container's HEALTHCHECK,
    /// where there is no curl.
    Healthcheck(HealthcheckArgs),
}

#[derive(Debug, Args)]
struct HealthcheckArgs {
    /// The gateway's admin address (its --admin-listen).
    #[arg(long, env = "IDLEGATE_ADMIN_LISTEN", default_value = "127.0.0.1:7071")]
    admin_listen: String,
    /// The admin listener speaks HTTPS (the gateway's --admin-tls). Its certificate is not
    /// checked: the probe asks the local gateway whether it is ready, not who it is.
    #[arg(long, env = "IDLEGATE_ADMIN_TLS")]
    admin_tls: bool,
    /// The path asked: /readyz (ready to serve), or /healthz (alive).
    #[arg(long, default_value = "/readyz")]
    path: String,
    /// How long to wait for the answer.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// A TOML file of settings: every flag of this command is a key, named as the flag
    /// without its dashes (`max-connections = 19000`). A flag or its environment variable
    /// wins over the file.
    #[arg(long, env = "IDLEGATE_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Address clients connect to.
    #[arg(long, env = "IDLEGATE_LISTEN", default_value = "127.0.0.1:7070", value_parser = resolve)]
    listen: SocketAddr,
    /// Address clients connect to over TLS (the same protocol inside TLS 1.3 or 1.2); needs
    /// --tls-cert and --tls-key.
    #[arg(long, env = "IDLEGATE_TLS_LISTEN", value_parser = resolve, requires = "tls_cert")]
    tls_listen: Option<SocketAddr>,
    /// Address browsers and WebSocket clients connect to (upgrade on /v1/ws; one protocol
    /// frame per binary message).
    #[arg(long, env = "IDLEGATE_WS_LISTEN", value_parser = resolve)]
    ws_listen: Option<SocketAddr>,
    /// Address for WebSocket inside TLS (wss://); needs --tls-cert and --tls-key.
    #[arg(long, env = "IDLEGATE_WSS_LISTEN", value_parser = resolve, requires = "tls_cert")]
    wss_listen: Option<SocketAddr>,
    /// Address MQTT 3.1.1 and 5 clients connect to: username the uid, password the token,
    /// client identifier the device (see docs/CLIENTS.md, MQTT).
    #[arg(long, env = "IDLEGATE_MQTT_LISTEN", value_parser = resolve)]
    mqtt_listen: Option<SocketAddr>,
    /// Address for MQTT inside TLS; needs --tls-cert and --tls-key.
    #[arg(long, env = "IDLEGATE_MQTTS_LISTEN", value_parser = resolve, requires = "tls_cert")]
    mqtts_listen: Option<SocketAddr>,
    /// The topic MQTT sessions receive pushes on (when a subscription matches it).
    #[arg(long, env = "IDLEGATE_MQTT_PUSH_TOPIC", default_value = idlegate::DEFAULT_MQTT_PUSH_TOPIC)]
    mqtt_push_topic: String,
    /// Topic filters one MQTT session may hold; a SUBSCRIBE past it is refused filter by
    /// filter (SUBACK 0x80 in 3.1.1, 0x97 Quota exceeded in 5).
    #[arg(long, env = "IDLEGATE_MQTT_MAX_SUBSCRIPTIONS", default_value_t = idlegate::DEFAULT_MQTT_MAX_SUBSCRIPTIONS)]
    mqtt_max_subscriptions: usize,
    /// The topic prefix of presence over MQTT: SUBSCRIBE to <prefix>/<uid> watches the uid
    /// (its current state, then one PUBLISH per change, JSON).
    #[arg(long, env = "IDLEGATE_MQTT_PRESENCE_TOPIC", default_value = idlegate::DEFAULT_MQTT_PRESENCE_TOPIC)]
    mqtt_presence_topic: String,
    /// The topic a PUBLISH to sets its user's status (the payload, UTF-8).
    #[arg(long, env = "IDLEGATE_MQTT_STATUS_TOPIC", default_value = idlegate::DEFAULT_MQTT_STATUS_TOPIC)]
    mqtt_status_topic: String,
    /// Ping a WebSocket session silent for more than a third of the timeout; its client's
    /// WebSocket stack answers (a browser with no page code running), which keeps a
    /// background tab online. `false`: only what the client sends keeps it alive.
    #[arg(long, env = "IDLEGATE_WS_KEEPALIVE_PINGS", default_value_t = true, action = clap::ArgAction::Set)]
    ws_keepalive_pings: bool,
    /// Records one TLS key protects before it changes (TLS 1.3) or the session closes (TLS
    /// 1.2), for interoperability tests; the suite's own limit otherwise.
    #[arg(long, hide = true)]
    tls_record_limit: Option<u64>,
    /// Comma-separated origins a WebSocket upgrade may come from (default: any). An upgrade
    /// with another Origin gets 403; one with no Origin (not a browser) is allowed.
    #[arg(long, env = "IDLEGATE_WS_ALLOWED_ORIGINS", value_delimiter = ',')]
    ws_allowed_origins: Option<Vec<String>>,
    /// Read a PROXY protocol header (v1 or v2) on every client door from the balancers in
    /// --proxy-protocol-from: its source address is the client's for the per-address
    /// bounds, the logs and the events. A missing, malformed or untrusted header closes
    /// the connection. Others connect as themselves.
    #[arg(long, env = "IDLEGATE_PROXY_PROTOCOL", requires = "proxy_protocol_from")]
    proxy_protocol: bool,
    /// The balancers allowed to send a PROXY header: networks or addresses,
    /// comma-separated (10.0.0.0/8,192.0.2.7).
    #[arg(long, env = "IDLEGATE_PROXY_PROTOCOL_FROM", requires = "proxy_protocol")]
    proxy_protocol_from: Option<String>,
    /// Address of the admin HTTP endpoint (the status page at /, /healthz, /readyz, /metrics).
    #[arg(long, env = "IDLEGATE_ADMIN_LISTEN", default_value = "127.0.0.1:7071", value_parser = resolve)]
    admin_listen: SocketAddr,
    /// Silence after which a session goes offline, unless it asks for another timeout (LOGIN
    /// version 5, an MQTT keepalive): the default timeout class; a whole multiple of --tick.
    #[arg(long, env = "IDLEGATE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The shortest timeout a session may get [default: 5s rounded up to whole ticks, or
    /// --timeout when shorter].
    #[arg(long, env = "IDLEGATE_MIN_TIMEOUT", value_parser = humantime::parse_duration)]
    min_timeout: Option<Duration>,
    /// The longest timeout a session may get [default: 30m rounded down to whole ticks, or
    /// --timeout when longer; at most 100,000 ticks].
    #[arg(long, env = "IDLEGATE_MAX_TIMEOUT", value_parser = humantime::parse_duration)]
    max_timeout: Option<Duration>,
    /// The timeouts sessions may get, comma-separated (each a whole multiple of --tick);
    /// --timeout, --min-timeout and --max-timeout are always among them. A session gets the
    /// shortest at or above what it asks for [default: from --min-timeout to --max-timeout,
    /// each at most 25 % above the one before].
    #[arg(long, env = "IDLEGATE_TIMEOUT_CLASSES", value_delimiter = ',', value_parser = humantime::parse_duration)]
    timeout_classes: Vec<Duration>,
    /// Resolution of idle detection: offline comes after more than timeout - tick of silence.
    #[arg(long, env = "IDLEGATE_TICK", default_value = "1s", value_parser = humantime::parse_duration)]
    tick: Duration,
    /// Time a new connection has to log in.
    #[arg(long, env = "IDLEGATE_LOGIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    login_timeout: Duration,
    /// Open connections beyond which new ones get BYE(server_full) [default: the open-file
    /// limit, raised to its hard limit, minus headroom].
    #[arg(long, env = "IDLEGATE_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Connections waiting to log in beyond which the oldest of them is shed with
    /// BYE(server_full) and a retry hint to make room, so an overloaded gateway sheds load
    /// early and sockets that never log in cannot keep the door shut.
    #[arg(long, env = "IDLEGATE_MAX_PENDING_LOGINS", default_value_t = idlegate::DEFAULT_MAX_PENDING_LOGINS)]
    max_pending_logins: usize,
    /// Connections from one source address waiting to log in beyond which that address's
    /// next ones are refused with BYE(server_full), so one source cannot lock others out.
    /// The default leaves room for a carrier NAT's users reconnecting together.
    #[arg(
        long,
        env = "IDLEGATE_MAX_PENDING_LOGINS_PER_IP",
        default_value_t = idlegate::DEFAULT_MAX_PENDING_LOGINS_PER_IP
    )]
    max_pending_logins_per_ip: usize,
    /// Sessions one uid may hold at once, one per device name its LOGINs carry. A LOGIN of
    /// a device that has a session ends that session (kicked); a LOGIN of a new device when
    /// the uid holds this many ends its least recently active one (kicked).
    #[arg(long, env = "IDLEGATE_MAX_DEVICES", default_value_t = idlegate::DEFAULT_MAX_DEVICES)]
    max_devices: usize,
    /// DATA frames a second one session may send; over it (past the burst) the session ends
    /// with BYE(protocol_error) saying so. 0: no limit.
    #[arg(long, env = "IDLEGATE_MAX_DATA_RATE", default_value_t = idlegate::DEFAULT_MAX_DATA_RATE)]
    max_data_rate: u32,
    /// DATA frames a session may send at once above --max-data-rate.
    #[arg(long, env = "IDLEGATE_MAX_DATA_BURST", default_value_t = idlegate::DEFAULT_MAX_DATA_BURST)]
    max_data_burst: u32,
    /// Largest frame length accepted, kind byte included.
    #[arg(long, env = "IDLEGATE_MAX_FRAME_BYTES", default_value_t = idlegate_proto::DEFAULT_MAX_FRAME_BYTES)]
    max_frame_bytes: u32,
    /// Secrets for LOGIN tokens, comma-separated, newest first: tokens signed with any are
    /// accepted, so a secret can be rotated without logging anyone out. Without one any
    /// token is accepted.
    #[arg(long, env = "IDLEGATE_AUTH_SECRET", hide_env_values = true, conflicts_with = "auth_secret_file")]
    auth_secret: Option<String>,
    /// A file of secrets for LOGIN tokens, one a line, newest first (instead of
    /// --auth-secret, so no secret shows in `ps`).
    #[arg(long, env = "IDLEGATE_AUTH_SECRET_FILE")]
    auth_secret_file: Option<std::path::PathBuf>,
    /// Longest a token may still be valid for: a token whose expiry lies further ahead is
    /// refused (BYE(auth_failed) saying so).
    #[arg(long, env = "IDLEGATE_MAX_TOKEN_TTL", default_value = "1d", value_parser = humantime::parse_duration)]
    max_token_ttl: Duration,
    /// JWT verification keys: a JWKS document ({"keys":[...]}) or PEM public keys (RSA, EC
    /// P-256/P-384, Ed25519), several allowed; matched by kid when a token names one. Read
    /// again on SIGHUP.
    #[arg(long, env = "IDLEGATE_JWT_KEY_FILE")]
    jwt_key_file: Option<std::path::PathBuf>,
    /// HS256/HS384/HS512 secrets for JWTs, one a line. Read again on SIGHUP.
    #[arg(long, env = "IDLEGATE_JWT_SECRET_FILE")]
    jwt_secret_file: Option<std::path::PathBuf>,
    /// The identity provider's JWKS document (https), fetched at start and kept fresh: its
    /// Cache-Control max-age (or Expires) within --jwt-jwks-refresh, and again when a token
    /// names an unknown kid (at most once per --jwt-jwks-min-interval). A failed fetch keeps
    /// the keys in use. May sit beside --jwt-key-file and --jwt-secret-file.
    #[arg(long, env = "IDLEGATE_JWT_JWKS_URL")]
    jwt_jwks_url: Option<String>,
    /// The OpenID Connect issuer (https): its /.well-known/openid-configuration names the
    /// JWKS document (fetched as --jwt-jwks-url's) and the iss its tokens must carry.
    #[arg(long, env = "IDLEGATE_JWT_ISSUER_URL")]
    jwt_issuer_url: Option<String>,
    /// Start even when the keys by URL cannot be fetched at start (exit 2 otherwise); JWT
    /// logins are refused until they arrive.
    #[arg(long, env = "IDLEGATE_JWT_JWKS_OPTIONAL")]
    jwt_jwks_optional: bool,
    /// How long keys by URL are kept, `<shortest>,<longest>`: the provider's max-age (or
    /// Expires), kept within these.
    #[arg(long, env = "IDLEGATE_JWT_JWKS_REFRESH", default_value = "5m,1h", value_parser = idlegate::parse_jwks_refresh)]
    jwt_jwks_refresh: (Duration, Duration),
    /// The most often tokens naming unknown kids make the keys by URL be fetched again
    /// (cluster-wide in a cluster): clients cannot make the gateway hammer the provider.
    #[arg(long, env = "IDLEGATE_JWT_JWKS_MIN_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    jwt_jwks_min_interval: Duration,
    /// One fetch's deadline (discovery and keys each); the keys are at most 1 MiB.
    #[arg(long, env = "IDLEGATE_JWT_JWKS_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    jwt_jwks_timeout: Duration,
    /// Allow http:// for --jwt-jwks-url and --jwt-issuer-url: for tests on loopback only,
    /// as anyone on the path could hand the gateway their keys.
    #[arg(long, env = "IDLEGATE_JWT_JWKS_ALLOW_HTTP")]
    jwt_jwks_allow_http: bool,
    /// A private CA (PEM) the identity provider's certificate may chain to, besides the
    /// system's roots.
    #[arg(long, env = "IDLEGATE_JWT_JWKS_CA_FILE")]
    jwt_jwks_ca_file: Option<std::path::PathBuf>,
    /// Clock skew forgiven when checking a JWT's exp, nbf and iat.
    #[arg(long, env = "IDLEGATE_JWT_LEEWAY", default_value = "30s", value_parser = humantime::parse_duration)]
    jwt_leeway: Duration,
    /// The iss a JWT must carry, if set.
    #[arg(long, env = "IDLEGATE_JWT_ISSUER")]
    jwt_issuer: Option<String>,
    /// An aud a JWT must carry, if set.
    #[arg(long, env = "IDLEGATE_JWT_AUDIENCE")]
    jwt_audience: Option<String>,
    /// The JWT claim holding the uid (a decimal u64, as a string or a number); it must equal
    /// the LOGIN's uid (the MQTT username).
    #[arg(long, env = "IDLEGATE_JWT_UID_CLAIM", default_value = idlegate::DEFAULT_JWT_UID_CLAIM)]
    jwt_uid_claim: String,
    /// JWT claims carried in each session's online and offline events, webhooks and presence
    /// entries as "claims": {...} (comma-separated, e.g. name,org,app_version): those present,
    /// when they take at most 1 KiB of JSON.
    #[arg(long, env = "IDLEGATE_JWT_CLAIMS_TO_EVENTS", value_delimiter = ',')]
    jwt_claims_to_events: Option<Vec<String>>,
    /// A JWT claim (whole seconds, e.g. idle_max) that caps the timeout its session may get:
    /// the longest timeout class at or below it. A token whose claim is not a whole number
    /// is refused.
    #[arg(long, env = "IDLEGATE_JWT_TIMEOUT_CAP_CLAIM")]
    jwt_timeout_cap_claim: Option<String>,
    /// A JWT claim (an array of uids, e.g. contacts) listing whom its session may watch
    /// under --watch-policy listed, beside the backend's lists (PUT /v1/watchlists/{uid}).
    /// A token whose claim is not such an array is refused.
    #[arg(long, env = "IDLEGATE_JWT_WATCH_CLAIM")]
    jwt_watch_claim: Option<String>,
    /// Who may watch whom (WATCH frames, MQTT presence topics): listed (only the uids the
    /// backend listed for the user, or its token's --jwt-watch-claim lists; any other reads
    /// as a uid that never logged in), open (anyone), or none (WATCH, UNWATCH and STATUS
    /// refused) [default: listed].
    #[arg(long, env = "IDLEGATE_WATCH_POLICY")]
    watch_policy: Option<idlegate::WatchPolicy>,
    /// uids one session may watch at once, and one backend list may hold.
    #[arg(long, env = "IDLEGATE_MAX_WATCH", default_value_t = idlegate::DEFAULT_MAX_WATCH)]
    max_watch: usize,
    /// Watch entries (uids on sessions' watch lists, summed) this node holds at most; the
    /// backend's lists count against the same number again. A WATCH past it is refused
    /// with BYE(server_full).
    #[arg(long, env = "IDLEGATE_MAX_WATCH_ENTRIES", default_value_t = idlegate::DEFAULT_MAX_WATCH_ENTRIES)]
    max_watch_entries: usize,
    /// Longest status a STATUS frame (or MQTT PUBLISH to --mqtt-status-topic) may set, in
    /// UTF-8 bytes; at most 255.
    #[arg(long, env = "IDLEGATE_MAX_STATUS_BYTES", default_value_t = idlegate::DEFAULT_MAX_STATUS_BYTES)]
    max_status_bytes: usize,
    /// End a session when the token it logged in (or last refreshed) with expires:
    /// BYE(token_expired) within one tick, offline reason token_expired. Clients refresh
    /// with a REFRESH frame (MQTT 5: AUTH re-authentication).
    #[arg(long, env = "IDLEGATE_ENFORCE_TOKEN_EXPIRY")]
    enforce_token_expiry: bool,
    /// Allow running without --auth-secret on a non-loopback --listen address.
    #[arg(long, env = "IDLEGATE_ALLOW_ANONYMOUS")]
    allow_anonymous: bool,
    /// Time shutdown waits for connections to take their BYE.
    #[arg(long, env = "IDLEGATE_DRAIN_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Address of the backend API (presence, push, kicks, events).
    #[arg(long, env = "IDLEGATE_API_LISTEN", default_value = "127.0.0.1:7072", value_parser = resolve)]
    api_listen: SocketAddr,
    /// Bearer token the backend API requires; without it the API only listens on loopback.
    #[arg(long, env = "IDLEGATE_API_TOKEN", hide_env_values = true, conflicts_with = "api_token_file")]
    api_token: Option<String>,
    /// A file holding the API's bearer token (instead of --api-token, so the token shows
    /// neither in `ps` nor in the environment); a trailing newline is not part of it.
    #[arg(long, env = "IDLEGATE_API_TOKEN_FILE")]
    api_token_file: Option<std::path::PathBuf>,
    /// Deliver presence events to this URL (http:// or https://), signed as Standard
    /// Webhooks does, in order, at least once; needs --webhook-secret-file.
    #[arg(long, env = "IDLEGATE_WEBHOOK_URL")]
    webhook_url: Option<String>,
    /// The webhook signing secrets, one a line, newest first: `whsec_` and the base64 of 24
    /// to 64 random bytes.
    #[arg(long, env = "IDLEGATE_WEBHOOK_SECRET_FILE")]
    webhook_secret_file: Option<std::path::PathBuf>,
    /// A private CA (PEM) the webhook receiver's certificate may chain to, besides the
    /// system's roots.
    #[arg(long, env = "IDLEGATE_WEBHOOK_CA_FILE")]
    webhook_ca_file: Option<std::path::PathBuf>,
    /// The event types delivered (those of /v1/events); `gap` and `start` always are.
    #[arg(long, env = "IDLEGATE_WEBHOOK_EVENTS", default_value = idlegate::DEFAULT_WEBHOOK_EVENTS)]
    webhook_events: String,
    /// The most events in one webhook request (1 to 10,000).
    #[arg(long, env = "IDLEGATE_WEBHOOK_BATCH", default_value_t = idlegate::DEFAULT_WEBHOOK_BATCH)]
    webhook_batch: usize,
    /// How long a webhook batch waits to fill once it holds an event.
    #[arg(long, env = "IDLEGATE_WEBHOOK_LINGER", default_value = "50ms", value_parser = humantime::parse_duration)]
    webhook_linger: Duration,
    /// One webhook request's deadline.
    #[arg(long, env = "IDLEGATE_WEBHOOK_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    webhook_timeout: Duration,
    /// The longest wait between webhook retries (they back off from 100ms, with jitter).
    #[arg(long, env = "IDLEGATE_WEBHOOK_MAX_BACKOFF", default_value = "1m", value_parser = humantime::parse_duration)]
    webhook_max_backoff: Duration,
    /// How long a uid's user_offline waits after its last session ended: a login within it
    /// hides both that user_offline and the next user_online (a quick reconnect). A whole
    /// number of ticks, at most 5m; 0s: none.
    #[arg(long, env = "IDLEGATE_OFFLINE_GRACE", default_value = "0s", value_parser = humantime::parse_duration)]
    offline_grace: Duration,
    /// Offline uids whose last-seen time (the end of their last session) presence answers
    /// give as last_seen_ms; the least recently seen are forgotten first; 0 keeps none.
    #[arg(long, env = "IDLEGATE_LAST_SEEN_CAPACITY", default_value_t = idlegate::DEFAULT_LAST_SEEN_CAPACITY)]
    last_seen_capacity: usize,
    /// How long a cluster's Redis keeps a uid's last-seen time.
    #[arg(long, env = "IDLEGATE_LAST_SEEN_TTL", default_value = "30d", value_parser = humantime::parse_duration)]
    last_seen_ttl: Duration,
    /// This gateway's name in presence answers and online events [default: the host name].
    #[arg(long, env = "IDLEGATE_NODE_ID")]
    node_id: Option<String>,
    /// Most events the in-memory event log keeps for consumers to resume from.
    #[arg(long, env = "IDLEGATE_EVENT_LOG_CAPACITY", default_value_t = idlegate::DEFAULT_EVENT_LOG_CAPACITY)]
    event_log_capacity: usize,
    /// Most bytes the event log's events may carry (DATA payloads and topics, MQTT wills,
    /// JWT claims); the oldest events go first. In a cluster, most bytes of the shared event
    /// stream in Redis (every field counted).
    #[arg(long, env = "IDLEGATE_EVENT_LOG_BYTES", default_value_t = idlegate::DEFAULT_EVENT_LOG_BYTES)]
    event_log_bytes: usize,
    /// Join a cluster through Redis: redis://[:password@]host:port[/db], rediss:// for TLS,
    /// or several comma-separated redis:// seeds of a Redis Cluster. Without it the gateway
    /// runs alone.
    #[arg(long, env = "IDLEGATE_REDIS", hide_env_values = true)]
    redis: Option<String>,
    /// Treat a single --redis URL as a seed of a Redis Cluster.
    #[arg(long, env = "IDLEGATE_REDIS_CLUSTER", requires = "redis")]
    redis_cluster: bool,
    /// How long this node's lease in Redis lasts: if the node dies without a goodbye, its
    /// uids look offline after at most this, and go offline as node_lost within it plus a tick
    /// [default: 10s; only with --redis].
    #[arg(long, env = "IDLEGATE_NODE_LEASE", value_parser = humantime::parse_duration, requires = "redis")]
    node_lease: Option<Duration>,
    /// Most bytes of DATA, MQTT wills and JWT claims this node holds for Redis while Redis
    /// is away; past it the oldest data events are dropped (never a login or an end),
    /// counted in idlegate_redis_compacted_total and shown to event consumers as a gap.
    #[arg(long, env = "IDLEGATE_REDIS_QUEUE_BYTES", default_value_t = idlegate::DEFAULT_REDIS_QUEUE_BYTES)]
    redis_queue_bytes: usize,
    /// Replicas that must hold a batch (Redis WAIT) before it counts as written, so a
    /// failover loses no acknowledged session change; 0 does not wait. Costs a replica
    /// round trip per batch, and while replicas lag this node's Redis calls wait up to
    /// 100 ms per try.
    #[arg(long, env = "IDLEGATE_REDIS_MIN_REPLICAS", default_value_t = 0, requires = "redis")]
    redis_min_replicas: u32,
    /// PEM certificate chain TLS listeners present (with --tls-key). Re-read on SIGHUP, so a
    /// renewed certificate is served to new handshakes without a restart.
    #[arg(long, env = "IDLEGATE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "IDLEGATE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Serve the backend API over HTTPS with --tls-cert and --tls-key.
    #[arg(long, env = "IDLEGATE_API_TLS")]
    api_tls: bool,
    /// Serve the admin listener (status page, /healthz, /readyz, /metrics) over HTTPS with
    /// --tls-cert and --tls-key.
    #[arg(long, env = "IDLEGATE_ADMIN_TLS")]
    admin_tls: bool,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "IDLEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct TokenArgs {
    /// The gateway's --auth-secret (of a comma-separated list, the first, the newest, signs).
    #[arg(long, env = "IDLEGATE_AUTH_SECRET", hide_env_values = true)]
    secret: String,
    /// The uid the token logs in.
    #[arg(long)]
    uid: u64,
    /// How long the token stays valid.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    ttl: Duration,
}

/// The token checker `serve` runs with, from --auth-secret or --auth-secret-file.
/// The API's bearer token: `--api-token`, or the file `--api-token-file` names.
fn api_token(args: &ServeArgs) -> Option<String> {
    let Some(path) = &args.api_token_file else { return args.api_token.clone() };
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim_end_matches(['\r', '\n']).is_empty() => {
            Some(text.trim_end_matches(['\r', '\n']).to_string())
        }
        Ok(_) => usage_error(format!("--api-token-file {}: the file is empty", path.display())),
        Err(e) => usage_error(format!("--api-token-file {}: {e}", path.display())),
    }
}

/// The webhook relay's configuration, from `--webhook-*`.
fn webhook(args: &ServeArgs) -> Option<WebhookConfig> {
    let Some(url) = &args.webhook_url else {
        if args.webhook_secret_file.is_some() {
            usage_error("--webhook-secret-file: needs --webhook-url");
        }
        return None;
    };
    let Some(secret_file) = &args.webhook_secret_file else {
        usage_error("--webhook-url: needs --webhook-secret-file, the secrets deliveries are signed with");
    };
    let mut config = WebhookConfig::new(url, secret_file).unwrap_or_else(|e| usage_error(e));
    config.ca_file = args.webhook_ca_file.clone();
    config.events = idlegate::parse_webhook_events(&args.webhook_events).unwrap_or_else(|e| usage_error(e));
    config.batch = args.webhook_batch;
    config.linger = args.webhook_linger;
    config.timeout = args.webhook_timeout;
    config.max_backoff = args.webhook_max_backoff;
    Some(config)
}

fn auth(args: &ServeArgs) -> Option<Auth> {
    try_auth(args).unwrap_or_else(|e| usage_error(e))
}

/// The token secrets of --auth-secret or --auth-secret-file (read now), if any.
fn try_auth(args: &ServeArgs) -> Result<Option<Auth>, String> {
    if args.max_token_ttl.as_secs() == 0 {
        return Err("--max-token-ttl: must be at least a second".into());
    }
    let list = match (&args.auth_secret, &args.auth_secret_file) {
        (Some(list), _) => list.clone(),
        (None, Some(path)) => {
            std::fs::read_to_string(path).map_err(|e| format!("--auth-secret-file {}: {e}", path.display()))?
        }
        (None, None) => return Ok(None),
    };
    match secrets(&list) {
        Some(auth) => Ok(Some(auth.with_max_ttl(args.max_token_ttl.as_secs()))),
        None => Err("--auth-secret: no secret given".into()),
    }
}

/// `--ws-allowed-origins`, each trimmed, empty ones left out.
fn allowed_origins(args: &ServeArgs) -> Option<Vec<String>> {
    let list = args.ws_allowed_origins.clone()?;
    Some(list.into_iter().map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect())
}

/// The JWT keys and checks, from --jwt-key-file, --jwt-secret-file and the keys by URL.
fn jwt(args: &ServeArgs) -> Option<Arc<JwtAuth>> {
    let by_url = args.jwt_jwks_url.is_some() || args.jwt_issuer_url.is_some();
    if args.jwt_key_file.is_none() && args.jwt_secret_file.is_none() && !by_url {
        const SET: &str = "set --jwt-key-file, --jwt-secret-file, --jwt-jwks-url or --jwt-issuer-url";
        if args.jwt_claims_to_events.is_some() {
            usage_error(format!("--jwt-claims-to-events: no JWT is checked ({SET})"));
        }
        if args.jwt_timeout_cap_claim.is_some() {
            usage_error(format!("--jwt-timeout-cap-claim: no JWT is checked ({SET})"));
        }
        if args.jwt_watch_claim.is_some() {
            usage_error(format!("--jwt-watch-claim: no JWT is checked ({SET})"));
        }
        return None;
    }
    // An issuer found by discovery is the `iss` its tokens must carry (the discovery
    // document must name that same issuer, checked at the fetch).
    let issuer = match (&args.jwt_issuer, &args.jwt_issuer_url) {
        (Some(iss), Some(url)) if iss != url => {
            usage_error(format!("--jwt-issuer: {iss:?} is not --jwt-issuer-url {url:?}, whose tokens carry that iss"))
        }
        (Some(iss), _) => Some(iss.clone()),
        (None, url) => url.clone(),
    };
    let rules = JwtRules {
        leeway: args.jwt_leeway,
        issuer,
        audience: args.jwt_audience.clone(),
        uid_claim: args.jwt_uid_claim.clone(),
        max_ttl: args.max_token_ttl,
        claims_to_events: args
            .jwt_claims_to_events
            .iter()
            .flatten()
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect(),
        timeout_cap_claim: args.jwt_timeout_cap_claim.clone(),
        watch_claim: args.jwt_watch_claim.clone(),
    };
    match JwtAuth::load_with(args.jwt_key_file.as_deref(), args.jwt_secret_file.as_deref(), by_url, rules) {
        Ok(jwt) => Some(jwt),
        Err(e) => usage_error(e),
    }
}

/// The JWT keys by URL, from --jwt-jwks-url or --jwt-issuer-url and the --jwt-jwks-* bounds.
fn jwks(args: &ServeArgs) -> Option<JwksConfig> {
    let source = match (&args.jwt_jwks_url, &args.jwt_issuer_url) {
        (Some(url), None) => JwksSource::Url(url.clone()),
        (None, Some(issuer)) => JwksSource::Issuer(issuer.clone()),
        (Some(_), Some(_)) => usage_error("--jwt-jwks-url: not beside --jwt-issuer-url, whose discovery names the URL"),
        (None, None) => return None,
    };
    let mut config = JwksConfig::new(source);
    config.optional = args.jwt_jwks_optional;
    (config.refresh_min, config.refresh_max) = args.jwt_jwks_refresh;
    config.min_interval = args.jwt_jwks_min_interval;
    config.timeout = args.jwt_jwks_timeout;
    config.allow_http = args.jwt_jwks_allow_http;
    config.ca_file = args.jwt_jwks_ca_file.clone();
    Some(config)
}

fn main() -> ExitCode {
    let cli = parse_cli();
    match cli.command {
        Command::ConfigTemplate => {
            print!("{}", config_template());
            ExitCode::SUCCESS
        }
        Command::Token(args) => {
            if args.ttl.as_secs() == 0 {
                usage_error("--ttl: a token must live at least a second");
            }
            let Some(auth) = secrets(&args.secret) else { usage_error("--secret: no secret given") };
            let expiry = unix_now().saturating_add(args.ttl.as_secs());
            println!("{}", auth.mint(args.uid, expiry));
            ExitCode::SUCCESS
        }
        Command::Healthcheck(args) => match healthcheck(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("idlegate healthcheck: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => match tune_malloc().and_then(|()| serve(*args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("idlegate: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `idlegate healthcheck`: one GET on the admin listener; an error unless it answers 200.
fn healthcheck(args: &HealthcheckArgs) -> anyhow::Result<()> {
    let scheme = if args.admin_tls { "https" } else { "http" };
    let url = format!("{scheme}://{}{}", args.admin_listen, args.path);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(args.timeout)
            .danger_accept_invalid_certs(args.admin_tls)
            .build()
            .context("cannot make an HTTP client")?;
        let response = client.get(&url).send().await.with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        anyhow::ensure!(status.is_success(), "GET {url}: {status}: {}", body.trim());
        Ok(())
    })
}

/// The secrets of a comma-separated list (or lines of a file), newest first.
fn secrets(list: &str) -> Option<Auth> {
    Auth::rotating(list.split([',', '\n']).map(str::trim).filter(|s| !s.is_empty()).map(|s| s.as_bytes().to_vec()))
}

/// Exits with status 2 and a usage error naming `flag`, as clap does for its own errors,
/// with the usage of the subcommand at fault.
/// The command line, with `serve --config <file>`'s settings put before the flags given (a
/// flag given, or its environment variable set, leaves the file's value out); an error
/// about a value that came from the file names its key and line.
fn parse_cli() -> Cli {
    let (args, file) = with_config_file(std::env::args().collect()).unwrap_or_else(|e| usage_error(e));
    let Some((file, keys)) = file else { return Cli::parse_from(args) };
    let _ = CONFIG_FILE.set((file.clone(), keys.clone()));
    match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => match file_error(&e, &file, &keys) {
            Some(message) => usage_error(message),
            None => e.exit(),
        },
    }
}

/// The configuration file and the keys of it in force.
type FileInForce = (ConfigFile, Vec<String>);

/// `args` with `serve --config <file>`'s settings put before the flags given (a flag
/// given, or its environment variable set, leaves the file's value out), and the file with
/// the keys it set; `args` as they are without a file.
fn with_config_file(mut args: Vec<String>) -> Result<(Vec<String>, Option<FileInForce>), idlegate::ConfigError> {
    let Some(at) = args.iter().position(|a| a == "serve").filter(|&i| i == 1) else { return Ok((args, None)) };
    let given =
        |long: &str| args[at + 1..].iter().any(|a| a == &format!("--{long}") || a.starts_with(&format!("--{long}=")));
    let path = args[at + 1..]
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(at + 2 + i).cloned())
        .or_else(|| args[at + 1..].iter().find_map(|a| a.strip_prefix("--config=").map(str::to_string)))
        .or_else(|| std::env::var("IDLEGATE_CONFIG").ok());
    let Some(path) = path else { return Ok((args, None)) };
    let command = Cli::command();
    let serve = command.find_subcommand("serve").expect("the serve subcommand");
    let flags: Vec<FlagSpec> = serve
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?.to_string();
            (long != "config" && long != "help").then(|| FlagSpec {
                long,
                env: arg.get_env().map(|e| e.to_string_lossy().into_owned()),
                takes_value: arg.get_action().takes_values(),
                list: arg.get_value_delimiter().is_some(),
                default: Some(
                    arg.get_default_values().iter().map(|v| v.to_string_lossy()).collect::<Vec<_>>().join(","),
                )
                .filter(|d| !d.is_empty()),
                // The flags whose values `--help` and the environment keep hidden.
                secret: arg.is_hide_env_values_set(),
            })
        })
        .collect();
    let file = ConfigFile::read(std::path::Path::new(&path), &flags)?;
    if let Some(warning) = file.exposed_secrets(&flags) {
        let _ = EXPOSED_SECRETS.set(warning);
    }
    let from_file = file.args(&flags, given, |env| std::env::var_os(env).is_some());
    let keys: Vec<String> =
        from_file.iter().map(|a| a.trim_start_matches("--").split('=').next().unwrap_or("").to_string()).collect();
    args.splice(at + 1..at + 1, from_file);
    Ok((args, Some((file, keys))))
}

/// A parse error about a value the file set, said with the key and its line; `None` for
/// any other error.
fn file_error(e: &clap::Error, file: &ConfigFile, keys: &[String]) -> Option<String> {
    let named = e.get(clap::error::ContextKind::InvalidArg).map(|a| a.to_string()).unwrap_or_default();
    let key = keys.iter().find(|k| named.starts_with(&format!("--{k} ")) || named == format!("--{k}"))?;
    let at = file.line_of(key)?;
    let detail = e.to_string();
    let reason = detail.lines().next().unwrap_or("").trim_start_matches("error: ").to_string();
    Some(format!("--config {at}: key `{key}`: {reason}"))
}

/// Flags a SIGHUP applies (through [`idlegate::Live`]); a change of any other is logged as
/// taking effect only after a restart. The TLS certificate and key, and the JWT keys, are
/// read again from the same files too (server.rs).
const RELOADABLE: [&str; 6] =
    ["auth-secret", "auth-secret-file", "max-token-ttl", "ws-allowed-origins", "max-data-rate", "max-data-burst"];

/// What `serve`'s flags say, flag by flag, as given (a file's, a flag's, a variable's or a
/// default): what a reload compares.
type Settings = std::collections::BTreeMap<String, Vec<String>>;

/// The command line and the configuration file read again, as a SIGHUP does: what the
/// flags now say, and the configuration of what may change while running.
fn reread() -> Result<(Settings, Config), String> {
    let (args, _) = with_config_file(std::env::args().collect()).map_err(|e| e.to_string())?;
    let first_line =
        |e: clap::Error| e.to_string().lines().next().unwrap_or("").trim_start_matches("error: ").to_string();
    let matches = Cli::command().try_get_matches_from(&args).map_err(first_line)?;
    let cli = Cli::from_arg_matches(&matches).map_err(first_line)?;
    let Command::Serve(serve) = cli.command else { return Err("not serving".into()) };
    let config = Config {
        auth: try_auth(&serve)?,
        ws_allowed_origins: allowed_origins(&serve),
        max_data_rate: serve.max_data_rate,
        max_data_burst: serve.max_data_burst,
        ..Config::default()
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok((settings(&matches), config))
}

fn settings(matches: &clap::ArgMatches) -> Settings {
    let Some(("serve", serve)) = matches.subcommand() else { return Settings::new() };
    // Only flags: clap's derive also records the argument group it names after the struct
    // (`ServeArgs`), which is no flag an operator could have changed.
    let command = Cli::command();
    let flags: std::collections::HashSet<String> = command
        .find_subcommand("serve")
        .map(|serve| serve.get_arguments().map(|a| a.get_id().to_string()).collect())
        .unwrap_or_default();
    serve
        .ids()
        .filter(|id| flags.contains(id.as_str()))
        .filter_map(|id| {
            let values = serve.get_raw(id.as_str())?;
            Some((id.to_string(), values.map(|v| v.to_string_lossy().into_owned()).collect()))
        })
        .collect()
}

/// On each SIGHUP: reads the configuration again and hands what may change to `live`; logs
/// what was applied and what changed that needs a restart (compared with what the gateway
/// started with, so the warning stands until it restarts), counted by result. A file that
/// does not parse changes nothing.
#[cfg(unix)]
async fn reload_config_on_sighup(live: Arc<idlegate::Live>, metrics: Arc<idlegate::Metrics>) {
    let started = match reread() {
        Ok((settings, _)) => settings,
        Err(_) => Settings::new(),
    };
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; the configuration is read only at start");
        return;
    };
    while hup.recv().await.is_some() {
        let (now, config) = match reread() {
            Ok(read) => read,
            Err(e) => {
                metrics.config_reload("error");
                tracing::error!("SIGHUP: configuration not taken, nothing changed: {e}");
                continue;
            }
        };
        let applied = live.apply(&config);
        let mut restart: Vec<String> = now
            .keys()
            .chain(started.keys())
            .filter(|key| started.get(*key) != now.get(*key) && !RELOADABLE.contains(&key.replace('_', "-").as_str()))
            .map(|key| format!("--{}", key.replace('_', "-")))
            .collect();
        restart.extend(live.needs_restart(&config).map(str::to_string));
        restart.sort_unstable();
        restart.dedup();
        metrics.config_reload("ok");
        if applied.is_empty() {
            tracing::info!("SIGHUP: configuration read again; no flag that applies while running changed");
        } else {
            tracing::info!(applied = %applied.join(","), "SIGHUP: configuration read again");
        }
        if !restart.is_empty() {
            tracing::warn!(flags = %restart.join(","), "SIGHUP: changed, but takes effect only after a restart");
        }
    }
}

/// `idlegate serve`'s flags as a configuration file: each key with its help as a comment,
/// set to its default where it has one, commented out where it has none.
fn config_template() -> String {
    use std::fmt::Write;
    let command = Cli::command();
    let serve = command.find_subcommand("serve").expect("the serve subcommand");
    let mut out = String::from(
        "# idlegate serve --config idlegate.toml: every flag of `idlegate serve` is a key, named as the\n\
         # flag without its dashes. A flag on the command line, or its environment variable, wins\n\
         # over this file. Made by `idlegate config-template`; the values are the defaults.\n",
    );
    for arg in serve.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long().filter(|l| *l != "config" && *l != "help") else { continue };
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        out.push('\n');
        for line in textwrap(&help, 88) {
            let _ = writeln!(out, "# {line}");
        }
        if let Some(env) = arg.get_env() {
            let _ = writeln!(out, "# (env {})", env.to_string_lossy());
        }
        let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        let takes_value = arg.get_action().takes_values();
        let _ = match (takes_value, defaults.first()) {
            (false, _) => writeln!(out, "{long} = false"),
            (true, Some(_)) if arg.get_value_delimiter().is_some() => {
                let items: Vec<String> = defaults.iter().map(|d| format!("{d:?}")).collect();
                writeln!(out, "{long} = [{}]", items.join(", "))
            }
            (true, Some(default)) if default.parse::<i64>().is_ok() || default == "true" || default == "false" => {
                writeln!(out, "{long} = {default}")
            }
            (true, Some(default)) => writeln!(out, "{long} = {default:?}"),
            (true, None) if arg.get_value_delimiter().is_some() => writeln!(out, "# {long} = []"),
            (true, None) => writeln!(out, "# {long} = \"\""),
        };
    }
    out
}

/// `text` in lines of at most `width` characters, broken at spaces.
fn textwrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Every client door: its flag, its name, and its address when it is open.
fn client_doors(args: &ServeArgs) -> [(&'static str, &'static str, Option<SocketAddr>); 6] {
    [
        ("--listen", "tcp", Some(args.listen)),
        ("--tls-listen", "tls", args.tls_listen),
        ("--ws-listen", "ws", args.ws_listen),
        ("--wss-listen", "wss", args.wss_listen),
        ("--mqtt-listen", "mqtt", args.mqtt_listen),
        ("--mqtts-listen", "mqtts", args.mqtts_listen),
    ]
}

/// The warning about a configuration file others may read that holds secrets, logged once
/// logging starts.
static EXPOSED_SECRETS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The configuration file read, and the keys it set: a later error about one of those flags
/// names the file's line too.
static CONFIG_FILE: std::sync::OnceLock<(ConfigFile, Vec<String>)> = std::sync::OnceLock::new();

fn usage_error(message: impl std::fmt::Display) -> ! {
    let mut message = message.to_string();
    if let Some((file, keys)) = CONFIG_FILE.get() {
        let set =
            keys.iter().find(|k| message.starts_with(&format!("--{k}:")) || message.starts_with(&format!("--{k} ")));
        if let Some(at) = set.and_then(|k| file.line_of(k)) {
            message = format!("{message} (set in --config {at})");
        }
    }
    let mut cli = Cli::command();
    let serving = std::env::args().nth(1).is_none_or(|a| a != "token");
    let name = if serving { "serve" } else { "token" };
    let command = cli.find_subcommand_mut(name).expect("both subcommands exist");
    let mut command = command.clone().bin_name(format!("idlegate {name}"));
    command.error(ErrorKind::ValueValidation, message).exit()
}

/// An address to listen on: `ip:port`, or `host:port` resolved (its first address), so
/// `localhost:7070` works.
fn resolve(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    use std::net::ToSocketAddrs;
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or_else(|| format!("{text} resolves to no address")),
        Err(e) => Err(format!("{text} is not ip:port or host:port ({e})")),
    }
}

/// Sets glibc's allocator for a process that holds thousands of long-lived connections,
/// before any thread starts; leaves it alone when the operator set `GLIBC_TUNABLES`.
///
/// tokio allocates each connection's task and socket registration 128-byte aligned; glibc
/// carves an aligned block out of a larger one and frees the leftovers, which fast bins keep
/// for requests of exactly their size, so they pile up unused. Without fast bins they merge
/// and serve other requests: 128 bytes less per connection at 19,000 clients. One arena for
/// all threads instead of one per thread: 90 bytes less. The frame path allocates nothing,
/// and each thread's cache still serves logins' small allocations without the arena lock
/// (docs/BENCHMARKS.md, memory).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() -> anyhow::Result<()> {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return Ok(());
    }
    // SAFETY: mallopt only sets allocator parameters, and no other thread runs yet.
    let set = unsafe { libc::mallopt(libc::M_MXFAST, 0) == 1 && libc::mallopt(libc::M_ARENA_MAX, 1) == 1 };
    anyhow::ensure!(set, "glibc refused the allocator settings (mallopt)");
    Ok(())
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() -> anyhow::Result<()> {
    Ok(())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    if let Some(warning) = EXPOSED_SECRETS.get() {
        tracing::warn!("{warning}");
    }
    // rediss:// needs a TLS provider; one is chosen here, once, for the whole process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // More connections need more descriptors: take everything the hard limit allows.
    let nofile = rlimit::increase_nofile_limit(u64::MAX).context("raising the open-file limit")?;
    let mut config = Config {
        timeout: args.timeout,
        min_timeout: args.min_timeout,
        max_timeout: args.max_timeout,
        timeout_classes: args.timeout_classes.clone(),
        tick: args.tick,
        login_timeout: args.login_timeout,
        max_connections: args.max_connections.unwrap_or_else(|| default_max_connections(nofile)),
        max_pending_logins: args.max_pending_logins,
        max_pending_logins_per_ip: args.max_pending_logins_per_ip,
        max_devices: args.max_devices,
        max_frame_bytes: args.max_frame_bytes,
        max_data_rate: args.max_data_rate,
        max_data_burst: args.max_data_burst,
        auth: auth(&args),
        jwt: jwt(&args),
        jwks: jwks(&args),
        enforce_token_expiry: args.enforce_token_expiry,
        drain_timeout: args.drain_timeout,
        offline_grace: args.offline_grace,
        last_seen_capacity: args.last_seen_capacity,
        last_seen_ttl: args.last_seen_ttl,
        node_id: args.node_id.clone().unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned()),
        api_token: api_token(&args),
        event_log_capacity: args.event_log_capacity,
        event_log_bytes: args.event_log_bytes,
        redis: match args.redis.as_deref().map(|url| RedisTarget::parse(url, args.redis_cluster)) {
            Some(Err(e)) => usage_error(format!("--redis: {e}")),
            Some(Ok(target)) => Some(target),
            None => None,
        },
        node_lease: args.node_lease.unwrap_or(idlegate::DEFAULT_NODE_LEASE),
        redis_queue_bytes: args.redis_queue_bytes,
        redis_min_replicas: args.redis_min_replicas,
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => match TlsIdentity::load(cert, key) {
                Ok(identity) => Some(identity),
                Err(e) => usage_error(e),
            },
            _ => None,
        },
        api_tls: args.api_tls,
        admin_tls: args.admin_tls,
        ws_allowed_origins: allowed_origins(&args),
        proxy_protocol: match args.proxy_protocol_from.as_deref().map(ProxyProtocol::parse) {
            Some(Err(e)) => usage_error(e),
            Some(Ok(proxy)) => Some(proxy),
            None => None,
        },
        mqtt_push_topic: args.mqtt_push_topic.clone(),
        mqtt_max_subscriptions: args.mqtt_max_subscriptions,
        ws_keepalive_pings: args.ws_keepalive_pings,
        tls_record_limit: args.tls_record_limit,
        webhook: webhook(&args),
        watch: WatchConfig {
            policy: args.watch_policy,
            max_watch: args.max_watch,
            max_entries: args.max_watch_entries,
            max_status_bytes: args.max_status_bytes,
            mqtt_presence_topic: args.mqtt_presence_topic.clone(),
            mqtt_status_topic: args.mqtt_status_topic.clone(),
        },
    };
    if let Err(e) = config.validate() {
        usage_error(e);
    }
    if config.enforce_token_expiry && config.auth.is_none() && config.jwt.is_none() {
        usage_error(
            "--enforce-token-expiry: no token is checked (set --auth-secret, --jwt-key-file or --jwt-secret-file)",
        );
    }
    if config.auth.is_none() && config.jwt.is_none() {
        for (flag, _, addr) in client_doors(&args) {
            if let Some(addr) = addr.filter(|a| !a.ip().is_loopback() && !args.allow_anonymous) {
                usage_error(format!(
                    "{flag} {addr} is not a loopback address and no --auth-secret is set: anyone could log in as \
                     any uid; set --auth-secret, or pass --allow-anonymous if that is what you want",
                ));
            }
        }
        tracing::warn!("no --auth-secret: any LOGIN token is accepted");
    }
    if config.api_token.is_none() {
        if !args.api_listen.ip().is_loopback() {
            usage_error(format!(
                "--api-listen {} is not a loopback address and no --api-token is set: anyone could read events \
                 and push to clients; set --api-token",
                args.api_listen
            ));
        }
        // The admin listener serves the event stream and the status page too: every uid,
        // session and DATA payload. The same rule as for the API.
        if !args.admin_listen.ip().is_loopback() {
            usage_error(format!(
                "--admin-listen {} is not a loopback address and no --api-token is set: anyone could read every \
                 uid and DATA payload from its /v1/events and status page; set --api-token, or keep \
                 --admin-listen on loopback",
                args.admin_listen
            ));
        }
        tracing::warn!("no --api-token: the backend API and the admin listener on loopback need no token");
    } else {
        // A bearer token over plain HTTP is readable by anyone on the path.
        for (flag, addr, tls) in
            [("--api-listen", args.api_listen, args.api_tls), ("--admin-listen", args.admin_listen, args.admin_tls)]
        {
            if !addr.ip().is_loopback() && !tls {
                tracing::warn!(
                    "{flag} {addr} is not a loopback address and serves plain HTTP: the API token travels in the \
                     clear; give it --tls-cert and --tls-key with {}",
                    if flag == "--api-listen" { "--api-tls" } else { "--admin-tls" }
                );
            }
        }
    }
    let room = default_max_connections(nofile);
    if config.max_connections > room {
        // More clients than descriptors would starve the admin and API listeners (a health
        // probe that cannot connect gets a working gateway killed) and leave the clients
        // beyond it waiting in the backlog with no answer. Clients beyond the room get
        // BYE(server_full) instead.
        tracing::warn!(
            max_connections = config.max_connections,
            nofile,
            serving = room,
            "--max-connections exceeds what the open-file limit leaves for clients; serving at most {room}"
        );
        config.max_connections = room;
    }

    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async {
        let listener = listen(args.listen).with_context(|| format!("binding --listen {}", args.listen))?;
        let admin = TcpListener::bind(args.admin_listen)
            .await
            .with_context(|| format!("binding --admin-listen {}", args.admin_listen))?;
        let api = TcpListener::bind(args.api_listen)
            .await
            .with_context(|| format!("binding --api-listen {}", args.api_listen))?;
        // The doors that are open, each as `<door> <address>`: nothing said of those that
        // are not.
        let doors: Vec<String> = client_doors(&args)
            .into_iter()
            .filter_map(|(_, door, addr)| addr.map(|addr| format!("{door} {addr}")))
            .collect();
        tracing::info!(
            doors = %doors.join(", "),
            admin = %args.admin_listen,
            api = %args.api_listen,
            node = %config.node_id,
            timeout = %humantime::format_duration(config.timeout),
            tick = %humantime::format_duration(config.tick),
            max_connections = config.max_connections,
            "idlegate serving"
        );
        let door = |flag: &'static str, addr: Option<SocketAddr>| {
            addr.map(|addr| listen(addr).with_context(|| format!("binding {flag} {addr}"))).transpose()
        };
        let listeners = Listeners {
            clients: listener,
            tls: door("--tls-listen", args.tls_listen)?,
            ws: door("--ws-listen", args.ws_listen)?,
            wss: door("--wss-listen", args.wss_listen)?,
            mqtt: door("--mqtt-listen", args.mqtt_listen)?,
            mqtts: door("--mqtts-listen", args.mqtts_listen)?,
            admin: Some(admin),
            api: Some(api),
        };
        let jwks_optional = config.jwks.as_ref().is_some_and(|jwks| jwks.optional);
        let server = Server::new(config);
        // The keys by URL before any client is served: without them every JWT login would
        // be refused, so a gateway that cannot get them says so and stops (exit 2), unless
        // told to start anyway.
        match server.fetch_jwt_keys().await {
            Ok(Some(keys)) => tracing::info!(keys, "JWT keys fetched"),
            Ok(None) => {}
            Err(e) if jwks_optional => {
                tracing::warn!(error = %e, "no JWT keys yet (--jwt-jwks-optional): JWT logins are refused until they arrive")
            }
            Err(e) => usage_error(format!("{e} (--jwt-jwks-optional starts without them)")),
        }
        #[cfg(unix)]
        tokio::spawn(reload_config_on_sighup(server.live(), server.metrics()));
        server.run(listeners, shutdown_signal()).await.context("serving")
    })
}

/// Binds the client listener with [`LISTEN_BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The log filter without `RUST_LOG`: the gateway's own info, and of rustls only errors: its
/// warnings are about single clients (a handshake a scanner broke off), which the
/// handshake counters already count, and at a fleet's scale they would drown the log.
const DEFAULT_LOG_FILTER: &str = "info,rustls=error";

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the gateway");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown signal received");
}
