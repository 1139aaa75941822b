//! Where connections come in: one accept loop per listening door, each admitting a
//! connection (a slot under `--max-connections`, a place among those waiting to log in)
//! and starting its task, or refusing it in its door's words. Never spins on a failing
//! accept, and never goes silent when descriptors run out.
//!
//! With `--proxy-protocol`, a connection takes its slot and a place among the waiting at
//! accept, then a task of its own reads its PROXY header (`proxy_header.rs`): a trusted
//! balancer's connection counts against the client's address the header names (the
//! per-address bound counts clients, not the balancer), anyone else's against its own.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout_at, Instant};

use crate::config::{Config, ProxyProtocol};
use crate::descriptors::{is_out_of_descriptors, Reserve};
use crate::proto::{jittered_ms, CloseReason, Transport, REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD};
use crate::protocol::{Context, SHED};
use crate::transport::admission::{Admission, Refused, Ticket};
use crate::transport::door::{Door, Speaks, DOORS};
use crate::transport::drive::Arrival;
use crate::transport::guard::{Guard, Slots};
use crate::transport::proxy_header::{self, Refusal};
use crate::transport::refusal::{Bound, Refusals};
use crate::transport::refusal_log::RefusalLog;
use crate::transport::{drive, mqtt, tcp, tls, ws};

/// First pause after a failed accept (EMFILE and the like); doubled on each failure in a
/// row, so a full file table costs a few wakeups a second instead of a spinning core.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// Longest pause between accept attempts while accepts keep failing.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What opening a connection on any door needs, built once at start: the protocol's
/// context, the bounds, and each door's settings.
#[derive(Debug)]
pub(crate) struct Doors {
    context: Arc<Context>,
    slots: Arc<Slots>,
    admission: Arc<Admission>,
    /// The log of connections refused before their login.
    refusal_log: Arc<RefusalLog>,
    /// Refusals under way, on every door.
    refusals: Refusals,
    /// The balancers whose PROXY headers are read (`--proxy-protocol-from`).
    proxy: Option<ProxyProtocol>,
    /// How long a connection has to send its PROXY header: its login's time, which the
    /// header's wait is part of.
    header_timeout: Duration,
    /// Each TLS door's configuration (`--tls-cert`, `--tls-key`, the door's ALPN), by
    /// [`Transport::index`].
    tls: [Option<Arc<ServerConfig>>; DOORS.len()],
    /// Records a TLS key protects before it changes, when not its suite's limit.
    tls_record_limit: Option<u64>,
    /// Who may upgrade to WebSocket.
    ws: Arc<ws::WsPolicy>,
    /// What every MQTT connection shares.
    mqtt: Arc<mqtt::MqttPolicy>,
    max_frame_bytes: u32,
}

// === impl Doors ===

impl Doors {
    pub(crate) fn new(config: &Config, context: Arc<Context>) -> Doors {
        let identity = config.tls.as_ref();
        let mqtt = Arc::new(mqtt::MqttPolicy::new(config));
        let tls = DOORS.map(|door| {
            let (identity, alpn) = (identity?, door.alpn?);
            Some(handing_over_keys(identity.server_config(&[alpn])))
        });
        let slots = Arc::new(Slots::new(config.max_connections, context.metrics.clone()));
        Doors {
            slots,
            admission: Arc::new(Admission::new(config.max_pending_logins, config.max_pending_logins_per_ip)),
            refusal_log: Arc::default(),
            refusals: Refusals::default(),
            proxy: config.proxy_protocol.clone(),
            header_timeout: config.login_timeout,
            tls,
            tls_record_limit: config.tls_record_limit,
            ws: Arc::new(ws::WsPolicy {
                allowed_origins: context.rules.live.origins().clone(),
                mqtt: Some(mqtt.clone()),
            }),
            mqtt,
            max_frame_bytes: config.max_frame_bytes,
            context,
        }
    }

    /// The connections' slots: how many are open, and the end of the drain.
    pub(crate) fn slots(&self) -> &Slots {
        &self.slots
    }

    /// Whether `transport`'s door can open: a TLS door needs the TLS identity.
    pub(crate) fn can_open(&self, transport: Transport) -> bool {
        !Door::of(transport).is_tls() || self.tls[transport.index()].is_some()
    }

    /// Accepts on `listener`, `transport`'s door, until the listener fails for good.
    pub(crate) async fn accept(self: &Arc<Self>, listener: &TcpListener, transport: Transport) -> io::Result<()> {
        let metrics = &self.context.metrics;
        let mut backoff = ACCEPT_BACKOFF_MIN;
        let mut reserve = Reserve::open();
        let refusals = &self.refusals;
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    accepted
                }
                Err(e) if is_out_of_descriptors(&e) && reserve.release() => {
                    // The reserve descriptor, given up, takes one waiting client: it is told
                    // BYE(server_full) instead of hanging in the backlog with no answer.
                    if let Ok((stream, _)) = listener.accept().await {
                        metrics.shed_max_connections.inc();
                        metrics.closed(CloseReason::ServerFull, transport);
                        refusals.refuse(stream, transport, Bound::Server, hint(), "out of file descriptors");
                    }
                    reserve = Reserve::open();
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, ?backoff, "accept failed; backing off");
                    sleep(backoff).await;
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    reserve.reopen();
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            metrics.connections_accepted.inc();
            if let Some(proxy) = &self.proxy {
                // Waiting for the header is part of the login phase: it holds a place among
                // the waiting from accept. A trusted balancer's connection counts against
                // its client's address once the header names it; anyone else's against
                // its own, now, as without the PROXY protocol.
                let ticket = if proxy.trusts(peer.ip()) {
                    self.admission.admit_unattributed()
                } else {
                    match self.admit(peer, transport) {
                        Ok(ticket) => ticket,
                        Err(why) => {
                            refusals.refuse(stream, transport, Bound::Address, hint(), &why);
                            continue;
                        }
                    }
                };
                match self.slots.take(transport) {
                    Some(guard) => {
                        let accepted = Instant::now();
                        tokio::spawn(self.clone().behind_balancer(transport, stream, peer, guard, ticket, accepted));
                    }
                    None => {
                        drop(ticket);
                        self.refuse_server_full(stream, transport);
                    }
                }
                continue;
            }
            // Too many from this source waiting to log in: refused now, with a time to come
            // back. When all places are taken, the oldest waiting connection makes room.
            let ticket = match self.admit(peer, transport) {
                Ok(ticket) => ticket,
                Err(why) => {
                    refusals.refuse(stream, transport, Bound::Address, hint(), &why);
                    continue;
                }
            };
            match self.slots.take(transport) {
                Some(guard) => self.spawn(transport, stream, guard, ticket, peer, Instant::now()),
                None => {
                    // Not served: its place among the waiting logins goes back at once.
                    drop(ticket);
                    self.refuse_server_full(stream, transport);
                }
            }
        }
    }

    /// A place among the connections waiting to log in for a client at `client`; refused
    /// (counted, with the words to tell it) when its address has too many waiting already.
    fn admit(&self, client: SocketAddr, transport: Transport) -> Result<Ticket, String> {
        self.admission.admit(client.ip()).map_err(|refused| self.over_source_bound(refused, transport))
    }

    /// Counts a connection refused for its address's bound; the words to tell it.
    fn over_source_bound(&self, Refused::Source(n): Refused, transport: Transport) -> String {
        let metrics = &self.context.metrics;
        metrics.shed_pending_logins.inc();
        metrics.closed(CloseReason::ServerFull, transport);
        format!("{n} connections from this address waiting to log in")
    }

    /// Refuses `stream` for want of a slot (`--max-connections`), counted.
    fn refuse_server_full(&self, stream: TcpStream, transport: Transport) {
        let metrics = &self.context.metrics;
        metrics.shed_max_connections.inc();
        metrics.closed(CloseReason::ServerFull, transport);
        let why = format!("{} connections open", self.slots.max());
        self.refusals.refuse(stream, transport, Bound::Server, hint(), &why);
    }

    /// Reads the PROXY header of a connection accepted from `peer` (holding its slot and
    /// its place among the waiting), then counts it under the client's address and serves
    /// it. Closes it, counted and logged, when the header is refused or late; closes it
    /// when shutdown begins first, or when it is the oldest waiting and shed for a newer.
    async fn behind_balancer(
        self: Arc<Self>,
        transport: Transport,
        mut stream: TcpStream,
        peer: SocketAddr,
        guard: Guard,
        ticket: Ticket,
        accepted: Instant,
    ) {
        let Some(proxy) = &self.proxy else { return };
        let trusted = proxy.trusts(peer.ip());
        let read = async {
            match timeout_at(accepted + self.header_timeout, proxy_header::read(&mut stream, trusted)).await {
                Ok(read) => read,
                Err(_) => Err(Refusal::Timeout),
            }
        };
        let read = tokio::select! {
            read = read => read,
            _ = self.context.shutdown.cancelled() => return,
            _ = ticket.shed() => {
                let metrics = &self.context.metrics;
                metrics.shed_pending_logins.inc();
                metrics.closed(CloseReason::ServerFull, transport);
                drop(guard);
                drop(ticket);
                self.refusals.refuse(stream, transport, Bound::Server, hint(), SHED);
                return;
            }
        };
        let client = match read {
            Ok(source) => source.unwrap_or(peer),
            Err(refusal) => {
                self.context.metrics.proxy_refused(transport, refusal.label());
                if refusal != Refusal::Closed {
                    self.refusal_log.refused(Some(peer), transport, CloseReason::ProtocolError, &refusal.to_string());
                }
                return;
            }
        };
        if !trusted {
            // Counted under its own address since its accept.
            return self.spawn(transport, stream, guard, ticket, client, accepted);
        }
        match ticket.attribute(client.ip()) {
            Ok(()) => self.spawn(transport, stream, guard, ticket, client, accepted),
            Err(refused) => {
                let why = self.over_source_bound(refused, transport);
                drop(guard);
                drop(ticket);
                self.refusals.refuse(stream, transport, Bound::Address, hint(), &why);
            }
        }
    }

    /// Serves `stream`, accepted on `transport`'s door, in a task of its own. A TLS session
    /// that cannot be made closes the stream (the guard and ticket give everything back).
    fn spawn(
        &self,
        transport: Transport,
        stream: TcpStream,
        guard: Guard,
        ticket: Ticket,
        peer: SocketAddr,
        accepted: Instant,
    ) {
        let door = Door::of(transport);
        let log = self.refusal_log.clone();
        let arrival = Arrival { accepted, ticket: Some(ticket), peer: Some(peer), log };
        match &self.tls[transport.index()] {
            None if !door.is_tls() => self.spawn_over(tcp::Plain, door.speaks, stream, guard, arrival),
            Some(config) => match tls::Tls::new(config.clone(), self.tls_record_limit) {
                Ok(layer) => self.spawn_over(layer, door.speaks, stream, guard, arrival),
                Err(e) => tracing::warn!(error = %e, "cannot open a TLS session"),
            },
            None => debug_assert!(false, "the {transport} door opened without a TLS identity"),
        }
    }

    /// Serves `stream` over `layer` with the framing of what the door speaks.
    fn spawn_over<L>(&self, layer: L, speaks: Speaks, stream: TcpStream, guard: Guard, arrival: Arrival)
    where
        L: connection_layer::Bounds,
    {
        let (context, max) = (self.context.clone(), self.max_frame_bytes);
        match speaks {
            Speaks::Frames => {
                tokio::spawn(drive::serve(stream, layer, tcp::frames(max), context, guard, arrival));
            }
            Speaks::WebSocket => {
                let framing = ws::WebSocket::new(max, self.ws.clone());
                tokio::spawn(drive::serve(stream, layer, framing, context, guard, arrival));
            }
            Speaks::Mqtt => {
                let framing = mqtt::Mqtt::new(max, self.mqtt.clone());
                tokio::spawn(drive::serve(stream, layer, framing, context, guard, arrival));
            }
        }
    }
}

/// When a refused client should come back: each one told a different moment.
fn hint() -> u64 {
    jittered_ms(REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD)
}

/// What a layer must be for its connections to run as tasks of their own.
mod connection_layer {
    use crate::transport::connection::Layer;

    pub(crate) trait Bounds: Layer + Send + Sync + Unpin + 'static {}

    impl<L: Layer + Send + Sync + Unpin + 'static> Bounds for L {}
}

/// `config`, letting rustls hand a finished handshake's traffic keys to the door's record
/// layer (`records.rs`), which keeps them in far less than rustls's connection.
fn handing_over_keys(config: Arc<ServerConfig>) -> Arc<ServerConfig> {
    let mut config = Arc::unwrap_or_clone(config);
    config.enable_secret_extraction = true;
    Arc::new(config)
}
