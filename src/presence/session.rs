//! One logged-in session: the handle shared by its connection task, the registry, the ticker
//! and the backend API.
//!
//! A session ends once, with the first reason given: an expiry from the ticker, a kick from
//! a newer login or the API, or the connection's own close. Its connection task learns of
//! an ending it did not cause, and of pushes queued for it (`outbox.rs`), through one
//! wake-up. Every open connection holds one, so it stays small: five words (the ring handle,
//! the ending and the wake-up flag share one; the claims, when a token gave any, are behind
//! one pointer) and an `AtomicWaker`.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

use crate::config::Class;
use crate::presence::{Handle, Will};
use crate::proto::{CloseReason, Device, Transport};

/// Value of `end` while the session is live.
const LIVE: u8 = 0;

/// Bit of `end` set once the session's offline event is in the event log; the low bits hold
/// the close reason.
const REPORTED: u8 = 0x80;

/// Bit of `end` set when this session's end left its uid with no live session: its offline
/// event is followed by the uid's `user_offline`. Set with the ending, under the uid's
/// registry entry, where the uid's other sessions are known.
const LAST: u8 = 0x40;

/// Bit of `end` set when a login of another device ended it as the least recently active of
/// `--max-devices`: its BYE(kicked) says so.
const EVICTED: u8 = 0x20;

/// The bits of `end` that hold the close reason.
const REASON: u8 = 0x1f;

/// Bit of `woken`: the connection task has a wake-up to see.
const WOKEN: u8 = 0x01;

/// Bit of `woken`: the connection should ping its client (a WebSocket ping).
const PING_DUE: u8 = 0x02;

/// Bit of `traits`: an MQTT session, which takes a push only on a topic one of its
/// subscriptions matches (`subscriptions.rs`).
const FILTERS_PUSHES: u8 = 0x01;

/// Bit of `traits`: its door can make the client's own network stack answer (a WebSocket
/// ping, which a browser answers with no page code running), so the ticker asks for one
/// when the session has been silent for more than a third of the timeout.
const PINGABLE: u8 = 0x02;

/// Value of `door` for a session no door opened (made by a test or a tool).
const NO_DOOR: u8 = u8::MAX;

/// A uid's session on one connection; see the module documentation.
#[derive(Debug)]
pub struct Session {
    uid: u64,
    /// Opaque id that pairs this session's online and offline events.
    id: u64,
    /// Unix milliseconds of the LOGIN.
    since_ms: u64,
    /// Where its uid is filed in its ring shard: the ring needs no index of its own.
    handle: Handle,
    /// The device it logged in as: a pointer, shared with its events, and none at all for a
    /// client that names no device.
    device: Device,
    /// `LIVE`, or the [`CloseReason`] code (its discriminant) of the first ending, with
    /// [`LAST`] and [`EVICTED`] said with it and [`REPORTED`] set once its offline event is
    /// logged.
    end: AtomicU8,
    /// [`WOKEN`]: a wake-up the connection task has not seen yet; [`PING_DUE`]: the ticker
    /// found the session silent for more than a third of the timeout.
    woken: AtomicU8,
    /// [`FILTERS_PUSHES`], [`PINGABLE`]: what kind of session it is, set at its login. In
    /// padding the allocation had anyway.
    traits: u8,
    /// The door it came in by, as [`Transport::index`], or [`NO_DOOR`]. In padding too.
    door: u8,
    /// Its timeout class: which of its shard's rings holds it. In padding too.
    class: Class,
    /// Its class's timeout in milliseconds, as its online event and WELCOME tell it (0 for
    /// a session made without a class: tests').
    timeout_ms: u32,
    /// The connection task, woken for an ending or a push. An `AtomicWaker` and a flag
    /// rather than a `Notify`: waiting on a `Notify` takes a waiter node in the waiting
    /// future (80 bytes in every open connection's task), this takes a reference.
    waker: AtomicWaker,
    /// The DATA token bucket (`--max-data-rate`): the tick of the last refill in the high
    /// half, tokens in [`TOKEN`]ths of a frame in the low half; [`FRESH`] before the first
    /// DATA frame. Only the connection's task touches it. It fits the padding the session's
    /// allocation had anyway.
    data_bucket: AtomicU64,
    /// The claims of its token that its events carry (`--jwt-claims-to-events`), if any.
    claims: Option<Arc<Claims>>,
    /// The client's address: the peer's, or the one a trusted balancer's PROXY header gave.
    remote: PackedAddr,
}

/// An [`Origin`] in 19 bytes: its door's index (or [`NO_DOOR`]) and the packed address.
/// The event log keeps one in every online event it holds (boxed: in a 32-byte allocation,
/// where an `Origin`'s 36 bytes take 48), so an idle connection pays for it once more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PackedOrigin {
    door: u8,
    remote: PackedAddr,
}

impl PackedOrigin {
    pub(crate) fn pack(origin: Origin) -> PackedOrigin {
        PackedOrigin { door: door_index(origin.door), remote: PackedAddr::pack(origin.remote) }
    }

    pub(crate) fn unpack(self) -> Origin {
        unpack_origin(self.door, self.remote)
    }
}

/// A door as the session keeps it: its index, or [`NO_DOOR`].
fn door_index(door: Option<Transport>) -> u8 {
    door.map_or(NO_DOOR, |door| door.index() as u8)
}

fn unpack_origin(door: u8, remote: PackedAddr) -> Origin {
    Origin { door: Transport::ALL.get(usize::from(door)).copied(), remote: remote.unpack() }
}

/// A client's address in 18 bytes, not `SocketAddr`'s 32 (which took the session's
/// allocation up two malloc steps instead of one): the IP as IPv6 (IPv4 mapped into it)
/// and the port; all zeros for none (no client comes from port 0 of `::`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PackedAddr([u8; 18]);

impl PackedAddr {
    const NONE: PackedAddr = PackedAddr([0; 18]);

    fn pack(addr: Option<SocketAddr>) -> PackedAddr {
        let Some(addr) = addr else { return PackedAddr::NONE };
        let ip = match addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let mut packed = [0; 18];
        packed[..16].copy_from_slice(&ip.octets());
        packed[16..].copy_from_slice(&addr.port().to_be_bytes());
        PackedAddr(packed)
    }

    fn unpack(self) -> Option<SocketAddr> {
        if self == PackedAddr::NONE {
            return None;
        }
        let mut ip = [0; 16];
        ip.copy_from_slice(&self.0[..16]);
        let ip = IpAddr::V6(Ipv6Addr::from(ip)).to_canonical();
        Some(SocketAddr::new(ip, u16::from_be_bytes([self.0[16], self.0[17]])))
    }
}

/// Where a session's client came from: its door and its address (the peer's, or what a
/// trusted balancer's PROXY header said), for its online event and its presence entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Origin {
    pub door: Option<Transport>,
    pub remote: Option<SocketAddr>,
}

impl Origin {
    /// Reads what [`Origin`]'s `Display` wrote (another node's answer); an unknown part
    /// reads as unknown.
    pub fn parse(text: &str) -> Origin {
        let (door, remote) = text.split_once(' ').unwrap_or((text, ""));
        Origin { door: Transport::from_label(door), remote: remote.parse().ok() }
    }
}

/// `<door> <ip:port>`, `-` for a part not known: how nodes tell each other a session's
/// origin.
impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.door {
            Some(door) => write!(f, "{door} ")?,
            None => f.write_str("- ")?,
        }
        match self.remote {
            Some(remote) => write!(f, "{remote}"),
            None => f.write_str("-"),
        }
    }
}

/// Claims of a session's JWT as its `online` and `offline` events carry them: a JSON object
/// of at most 1 KiB, written once at login.
#[derive(Debug, PartialEq, Eq)]
pub struct Claims(Box<str>);

impl Claims {
    /// `json` must be a JSON object: it goes into events as it is.
    pub fn from_json(json: impl Into<Box<str>>) -> Claims {
        let json = json.into();
        debug_assert!(json.starts_with('{') && json.ends_with('}'), "claims are a JSON object");
        Claims(json)
    }

    /// Claims another node wrote (into the cluster's stream, or an answer), if they are a
    /// JSON object: anything else is left out rather than written into events as it is.
    pub fn parse(bytes: &[u8]) -> Option<Claims> {
        let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        value.is_object().then(|| Claims(value.to_string().into()))
    }

    pub fn as_json(&self) -> &str {
        &self.0
    }
}

/// What a login says of its session beyond its uid and device.
#[derive(Debug, Default)]
pub(crate) struct Traits {
    /// An MQTT session, taking only the pushes its subscriptions match.
    pub filters_pushes: bool,
    /// Its door can ping the client (WebSocket).
    pub pingable: bool,
    /// An MQTT will, told in its offline event.
    pub will: Option<Box<Will>>,
    /// Its token's claims for its events.
    pub claims: Option<Arc<Claims>>,
    /// Its door and address.
    pub origin: Origin,
    /// Its timeout class; none: the default (`--timeout`'s).
    pub class: Option<Class>,
}

/// A session id as the events, WELCOME and the presence answers spell it: 16 lowercase hex
/// digits.
pub fn session_hex(id: u64) -> String {
    format!("{id:016x}")
}

/// What an ending means beyond its reason, decided under the uid's registry entry.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ending {
    /// No live session of the uid is left: its `user_offline` follows.
    pub last: bool,
    /// Kicked as the least recently active of `--max-devices`.
    pub evicted: bool,
}

/// One DATA frame's worth of tokens: fractions let a rate below one frame per tick refill
/// a little every tick.
pub const TOKEN: u64 = 1024;

/// `--max-data-rate` and `--max-data-burst` as `(tokens a tick, burst)` in [`TOKEN`]ths for
/// [`Session::take_data_token`] at ticks of `tick`; `None` without a limit (rate 0).
pub(crate) fn data_bucket(rate: u32, burst: u32, tick: std::time::Duration) -> Option<(u64, u64)> {
    if rate == 0 {
        return None;
    }
    let per_tick = (u128::from(rate) * u128::from(TOKEN) * tick.as_micros() / 1_000_000) as u64;
    Some((per_tick.max(1), u64::from(burst) * TOKEN))
}

/// The bucket before the first DATA frame: full.
const FRESH: u64 = u64::MAX;

// === impl Session ===

impl Session {
    #[cfg(test)]
    pub(crate) fn new(uid: u64, id: u64, since_ms: u64, handle: Handle) -> Session {
        Session::on_device(uid, Device::DEFAULT, id, since_ms, handle)
    }

    pub(crate) fn on_device(uid: u64, device: Device, id: u64, since_ms: u64, handle: Handle) -> Session {
        Session {
            uid,
            id,
            since_ms,
            handle,
            device,
            end: AtomicU8::new(LIVE),
            woken: AtomicU8::new(0),
            traits: 0,
            door: NO_DOOR,
            class: Class::FIRST,
            timeout_ms: 0,
            waker: AtomicWaker::new(),
            data_bucket: AtomicU64::new(FRESH),
            claims: None,
            remote: PackedAddr::NONE,
        }
    }

    /// The same session, come in from `origin`.
    pub(crate) fn with_origin(mut self, origin: Origin) -> Session {
        self.door = door_index(origin.door);
        self.remote = PackedAddr::pack(origin.remote);
        self
    }

    /// Its door and its client's address, where known.
    pub fn origin(&self) -> Origin {
        unpack_origin(self.door, self.remote)
    }

    /// The same session, its events carrying `claims`.
    pub(crate) fn with_claims(mut self, claims: Option<Arc<Claims>>) -> Session {
        self.claims = claims;
        self
    }

    /// The claims its events carry, if any.
    pub fn claims(&self) -> Option<&Arc<Claims>> {
        self.claims.as_ref()
    }

    /// Takes one DATA frame's token at tick `now`, refilling `per_tick` tokens a tick up to
    /// `burst` (both in [`TOKEN`]ths); false if the bucket is empty (the client is over
    /// `--max-data-rate`).
    pub(crate) fn take_data_token(&self, now: u64, per_tick: u64, burst: u64) -> bool {
        debug_assert!(burst >= TOKEN && burst <= u64::from(u32::MAX), "burst={burst}");
        let packed = self.data_bucket.load(Ordering::Relaxed);
        let mut tokens = if packed == FRESH {
            burst
        } else {
            // Ticks since the last refill, wrapping with the 32 bits the tick is kept in.
            let elapsed = u64::from((now as u32).wrapping_sub((packed >> 32) as u32));
            ((packed & 0xffff_ffff) + elapsed.saturating_mul(per_tick)).min(burst)
        };
        let allowed = tokens >= TOKEN;
        if allowed {
            tokens -= TOKEN;
        }
        self.data_bucket.store((u64::from(now as u32) << 32) | tokens, Ordering::Relaxed);
        allowed
    }

    /// The same session, taking only pushes its subscriptions match (an MQTT session).
    pub(crate) fn filtering_pushes(mut self) -> Session {
        self.traits |= FILTERS_PUSHES;
        self
    }

    /// Whether it takes only the pushes its subscriptions match, not every push.
    pub fn filters_pushes(&self) -> bool {
        self.traits & FILTERS_PUSHES != 0
    }

    /// The same session, on a door that can ping its client (WebSocket).
    pub(crate) fn pingable(mut self) -> Session {
        self.traits |= PINGABLE;
        self
    }

    /// Asks its connection to ping the client, if its door can: the ticker found it silent
    /// for more than a third of the timeout. Returns whether it asked.
    pub(crate) fn request_ping(&self) -> bool {
        if self.traits & PINGABLE == 0 || !self.is_live() {
            return false;
        }
        self.woken.fetch_or(PING_DUE | WOKEN, Ordering::AcqRel);
        self.waker.wake();
        true
    }

    /// Whether a ping was asked for since the last call; the connection task asks this when
    /// woken.
    pub(crate) fn take_ping(&self) -> bool {
        self.woken.fetch_and(!PING_DUE, Ordering::AcqRel) & PING_DUE != 0
    }

    /// Its uid's place in the ring of its class.
    pub(crate) fn handle(&self) -> Handle {
        self.handle
    }

    /// Its timeout class.
    pub fn class(&self) -> Class {
        self.class
    }

    /// Its timeout in milliseconds (its class's).
    pub fn timeout_ms(&self) -> u32 {
        self.timeout_ms
    }

    /// The same session, in timeout class `class` of `timeout_ms`.
    pub(crate) fn in_class(mut self, class: Class, timeout_ms: u32) -> Session {
        self.class = class;
        self.timeout_ms = timeout_ms;
        self
    }

    /// The uid this session logged in as.
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// The device it logged in as.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The id its online and offline events carry.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Unix milliseconds of its LOGIN.
    pub fn since_ms(&self) -> u64 {
        self.since_ms
    }

    /// True until the session ends.
    pub fn is_live(&self) -> bool {
        self.end.load(Ordering::Acquire) & REASON == LIVE
    }

    /// Ends the session with `reason` unless it already ended; returns whether this call
    /// ended it. Wakes the connection task either way it matters.
    pub(crate) fn end(&self, reason: CloseReason) -> bool {
        let won = self.end_unwoken(reason);
        if won {
            self.wake();
        }
        won
    }

    /// Ends the session as [`Session::end`] does, but leaves its connection task asleep; the
    /// caller wakes it later with [`Session::wake`]. A sweep that ends thousands of sessions
    /// at once wakes their connections in paced batches (`ticker.rs`), so their closes do not
    /// all queue ahead of the live clients' frames.
    pub(crate) fn end_unwoken(&self, reason: CloseReason) -> bool {
        self.end_as(reason, Ending::default())
    }

    /// Ends the session, unwoken, with what its uid's other sessions make of the ending.
    pub(crate) fn end_as(&self, reason: CloseReason, ending: Ending) -> bool {
        debug_assert!(reason as u8 & !REASON == 0, "reason code {} overlaps the flags", reason as u8);
        let code = reason as u8 | if ending.last { LAST } else { 0 } | if ending.evicted { EVICTED } else { 0 };
        self.end.compare_exchange(LIVE, code, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Why the session ended, or `None` while it is live.
    pub fn end_reason(&self) -> Option<CloseReason> {
        match self.end.load(Ordering::Acquire) & REASON {
            LIVE => None,
            code => CloseReason::from_code(code),
        }
    }

    /// Whether its end left the uid with no live session (`user_offline` follows its
    /// `offline`).
    pub fn was_last(&self) -> bool {
        self.end.load(Ordering::Acquire) & LAST != 0
    }

    /// Whether a login of another device ended it as the least recently active.
    pub fn was_evicted(&self) -> bool {
        self.end.load(Ordering::Acquire) & EVICTED != 0
    }

    /// Whether its offline event is in the log.
    pub(crate) fn is_reported(&self) -> bool {
        self.end.load(Ordering::Acquire) & REPORTED != 0
    }

    /// Resolves once the session has ended, whoever ended it.
    #[cfg(test)]
    pub async fn ended(&self) -> CloseReason {
        loop {
            if let Some(reason) = self.end_reason() {
                return reason;
            }
            // The flag keeps a wake-up that comes between the check and this await.
            self.woken().await;
        }
    }

    /// Resolves when the session ended or a push arrived since the last call; the
    /// connection task checks which.
    #[cfg(test)]
    pub(crate) fn woken(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_woken(cx))
    }

    /// Ready when the session ended or a push arrived since the last ready poll; the
    /// connection task checks which. A poll rather than a future of its own: the future
    /// waiting on it lives in every open connection's task.
    pub(crate) fn poll_woken(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.woken.fetch_and(!WOKEN, Ordering::AcqRel) & WOKEN != 0 {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // Checked again after registering: a wake-up in between found no waker, or the one
        // before this, but always set the flag first.
        if self.woken.fetch_and(!WOKEN, Ordering::AcqRel) & WOKEN != 0 {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// Wakes the connection task: a push is waiting for it, or it ended unwoken.
    pub(crate) fn wake(&self) {
        self.woken.fetch_or(WOKEN, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Marks the offline event as logged; returns false if it already was. Called only under
    /// the event log's lock, which is what makes the offline event exactly-once.
    pub(crate) fn mark_reported(&self) -> bool {
        debug_assert!(!self.is_live(), "session {} of uid {} reported before it ended", self.id, self.uid);
        self.end.fetch_or(REPORTED, Ordering::AcqRel) & REPORTED == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_ending_wins_and_is_reported_once() {
        let s = Session::new(1, 2, 3, Handle::NONE);
        assert!(s.is_live());
        assert!(s.end(CloseReason::Kicked));
        assert!(!s.end(CloseReason::Logout));
        assert!(s.mark_reported());
        assert!(!s.mark_reported());
        assert_eq!(s.end_reason(), Some(CloseReason::Kicked));
        assert!(!s.is_live());
    }

    #[test]
    fn the_data_bucket_allows_a_burst_then_the_rate() {
        let s = Session::new(1, 1, 0, Handle::NONE);
        // 2 frames a tick, a burst of 4.
        let (per_tick, burst) = (2 * TOKEN, 4 * TOKEN);
        let taken = (0..10).filter(|_| s.take_data_token(7, per_tick, burst)).count();
        assert_eq!(taken, 4, "the burst, then nothing more in the same tick");
        assert_eq!((0..10).filter(|_| s.take_data_token(8, per_tick, burst)).count(), 2, "a tick refills the rate");
        assert_eq!((0..10).filter(|_| s.take_data_token(100, per_tick, burst)).count(), 4, "never past the burst");
        // A rate under one frame a tick refills in fractions.
        let slow = Session::new(2, 2, 0, Handle::NONE);
        assert!(slow.take_data_token(0, TOKEN / 2, TOKEN));
        assert!(!slow.take_data_token(1, TOKEN / 2, TOKEN));
        assert!(slow.take_data_token(2, TOKEN / 2, TOKEN));
    }

    #[test]
    fn a_session_stays_small() {
        // Every open connection holds one (in an Arc): guard what it costs. 104 bytes and
        // the Arc's two counts take glibc's 128-byte malloc chunk (the client's address
        // moved it up from 112).
        assert!(std::mem::size_of::<Session>() <= 104, "Session grew to {}", std::mem::size_of::<Session>());
    }

    #[test]
    fn a_client_address_packs_and_unpacks() {
        for addr in ["192.0.2.7:4242", "[2001:db8::1]:443", "127.0.0.1:1"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let session = Session::new(1, 1, 0, Handle::NONE).with_origin(Origin { door: None, remote: Some(addr) });
            assert_eq!(session.origin().remote, Some(addr));
        }
        let none = Session::new(1, 1, 0, Handle::NONE);
        assert_eq!(none.origin(), Origin::default());
        let tls = none.with_origin(Origin { door: Some(Transport::Tls), remote: None });
        assert_eq!(tls.origin().door, Some(Transport::Tls));
    }
}

#[cfg(test)]
mod packed_origin {
    use super::*;

    /// The event log's packed copy of an origin reads back as the origin, on every door,
    /// for an IPv4 client, an IPv6 one, and none.
    #[test]
    fn a_packed_origin_reads_back_whole() {
        let remotes = [None, Some("10.9.8.7:4242".parse().unwrap()), Some("[2001:db8::7]:65535".parse().unwrap())];
        for door in Transport::ALL.iter().copied().map(Some).chain([None]) {
            for remote in remotes {
                let origin = Origin { door, remote };
                assert_eq!(PackedOrigin::pack(origin).unpack(), origin);
            }
        }
    }
}
