//! Token expiry inside a live session (`--enforce-token-expiry`), REFRESH and the claims
//! events carry, as the machine and the ticker run them under paused time. The wall clock
//! is the test's (`Paused`), so the tokens, minted once by PyJWT with fixed times
//! (`tests/data/jwt/fixed.py`), expire exactly when the test says.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, JwtAuth, JwtRules};
use crate::presence::{write_event_data, EventId, Ticker, What};
use crate::proto::{CloseReason, Device, Frame, FrameCodec};
use crate::protocol::command::{Asked, Command};
use crate::protocol::context::Context;
use crate::protocol::machine::{Inputs, Machine, Wake};

const FIXED: &str = include_str!("../../tests/data/jwt/fixed.json");

/// The tokens of `fixed.json` and the wall clock they were minted for.
struct Fixed {
    t0: u64,
    secret: String,
    tokens: serde_json::Map<String, serde_json::Value>,
}

fn fixed() -> Fixed {
    let v: serde_json::Value = serde_json::from_str(FIXED).expect("fixed.json parses");
    Fixed {
        t0: v["t0"].as_u64().expect("t0"),
        secret: v["secret"].as_str().expect("secret").to_string(),
        tokens: v["tokens"].as_object().expect("tokens").clone(),
    }
}

impl Fixed {
    fn token(&self, name: &str) -> Bytes {
        Bytes::from(self.tokens[name].as_str().expect("a token").to_string())
    }
}

/// Paused tokio time, and a wall clock that reads `t0` at the start and moves with it.
struct Paused {
    start: Instant,
    t0_ms: u64,
}

impl Inputs for Paused {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        self.t0_ms + Instant::now().duration_since(self.start).as_millis() as u64
    }

    fn jitter_ms(&self, base: Duration, _spread: Duration) -> u64 {
        base.as_millis() as u64
    }
}

struct Harness {
    context: Arc<Context>,
    inputs: Paused,
    fixed: Fixed,
    from: EventId,
    stop: CancellationToken,
    _secret: tempfile::NamedTempFile,
}

/// A gateway's protocol side with its ticker, enforcing expiry with `leeway`, the `name`
/// and `org` claims carried into events.
fn start(leeway: Duration) -> Harness {
    start_with(leeway, true)
}

/// The same, enforcing expiry or not.
fn start_with(leeway: Duration, enforce: bool) -> Harness {
    let fixed = fixed();
    let mut secret = tempfile::NamedTempFile::new().expect("a temporary file");
    writeln!(secret, "{}", fixed.secret).expect("written");
    let rules = JwtRules { leeway, claims_to_events: vec!["name".into(), "org".into()], ..JwtRules::default() };
    let jwt = JwtAuth::load(None, Some(secret.path()), rules).expect("the secret loads");
    let config = Config { jwt: Some(jwt), enforce_token_expiry: enforce, ..Config::default() };
    let context = Context::for_test(&config);
    let from = context.registry.events().last_id();
    let inputs = Paused { start: context.clock.instant_of(0), t0_ms: fixed.t0 * 1000 };
    let ticker = Ticker::new(context.registry.clone(), context.metrics.clone(), context.clock, config.window());
    let stop = CancellationToken::new();
    tokio::spawn(ticker.run(stop.clone()));
    Harness { context, inputs, fixed, from, stop, _secret: secret }
}

impl Harness {
    fn machine(&self) -> Machine {
        Machine::new(self.context.clone(), Instant::now())
    }

    fn login(&self, machine: &mut Machine, uid: u64, token: &str) -> Result<(), (CloseReason, String)> {
        let token = self.fixed.token(token);
        let login = Command::Login {
            uid,
            token,
            device: Device::DEFAULT,
            timeout: Asked::Default,
            subscriber: false,
            will: None,
        };
        machine.handle(&self.inputs, login, &mut BytesMut::new())
    }

    /// Sends REFRESH with `token`; the frames it was answered with.
    fn refresh(&self, machine: &mut Machine, token: &str) -> Result<Vec<Frame>, (CloseReason, String)> {
        let mut out = BytesMut::new();
        machine.handle(&self.inputs, Command::Refresh(self.fixed.token(token)), &mut out)?;
        let mut frames = Vec::new();
        while let Some(frame) = FrameCodec::default().decode(&mut out).expect("frames") {
            frames.push(frame);
        }
        Ok(frames)
    }

    fn ping(&self, machine: &mut Machine) {
        machine.handle(&self.inputs, Command::Ping(Bytes::new()), &mut BytesMut::new()).expect("a ping is taken");
    }

    /// Sleeps until `ms` after the start, pinging `machine` every 5 s on the way, so only
    /// the token can end it.
    async fn until(&self, machine: &mut Machine, ms: u64) {
        let end = self.inputs.start + Duration::from_millis(ms);
        while Instant::now() + Duration::from_secs(5) < end {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if machine.session().is_some_and(|s| s.is_live()) {
                self.ping(machine);
            }
        }
        tokio::time::sleep_until(end).await;
        // The ticker's work for a tick that began just now.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    fn events(&self) -> Vec<String> {
        let events = self.context.registry.events().read(self.from).events;
        events
            .iter()
            .map(|e| {
                let mut data = String::new();
                write_event_data(&mut data, e, "\"n\"");
                format!("{} {data}", e.what.name())
            })
            .collect()
    }
}

fn ended(machine: &Machine) -> Option<CloseReason> {
    match machine.on_wake() {
        Some(Wake::End(reason)) => Some(reason),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_session_ends_as_token_expired_within_one_tick_of_its_expiry() {
    let h = start(Duration::ZERO);
    let mut machine = h.machine();
    h.login(&mut machine, 7, "uid7_exp20").expect("logged in");
    h.until(&mut machine, 19_999).await;
    assert_eq!(ended(&machine), None, "live until its token's exp");
    h.until(&mut machine, 20_000 + 1).await;
    assert_eq!(ended(&machine), Some(CloseReason::TokenExpired), "ended on the tick of its exp");
    let (reason, _, bye) = machine.goodbye(&h.inputs, CloseReason::Disconnect, String::new());
    assert_eq!(reason, CloseReason::TokenExpired);
    assert!(matches!(bye, Some(Frame::Bye { reason: CloseReason::TokenExpired, .. })));
    let events = h.events();
    assert!(events[1].starts_with("user_online"), "{events:?}");
    assert!(events[2].starts_with("offline") && events[2].contains(r#""reason":"token_expired""#), "{events:?}");
    assert_eq!(h.context.registry.token_expiries(), 0, "nothing held for an ended session");
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_leeway_that_admits_a_token_also_keeps_its_session() {
    let h = start(Duration::from_secs(3));
    let mut machine = h.machine();
    h.login(&mut machine, 7, "uid7_exp20").expect("logged in");
    h.until(&mut machine, 22_999).await;
    assert_eq!(ended(&machine), None, "a login at this moment would be taken");
    h.until(&mut machine, 23_001).await;
    assert_eq!(ended(&machine), Some(CloseReason::TokenExpired));
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn refreshes_keep_the_session_and_its_id_and_another_uid_s_token_ends_it() {
    let h = start(Duration::ZERO);
    let mut machine = h.machine();
    h.login(&mut machine, 7, "uid7_exp20").expect("logged in");
    let id = machine.session().expect("a session").id();
    h.until(&mut machine, 15_000).await;
    let answer = h.refresh(&mut machine, "uid7_exp40").expect("the refresh is taken");
    assert_eq!(answer, [Frame::Refreshed { expires: h.fixed.t0 + 40 }]);
    h.until(&mut machine, 35_000).await;
    assert_eq!(ended(&machine), None, "past the first token's exp, on the refreshed one");
    let answer = h.refresh(&mut machine, "uid7_exp60").expect("the second refresh is taken");
    assert_eq!(answer, [Frame::Refreshed { expires: h.fixed.t0 + 60 }]);
    h.until(&mut machine, 59_999).await;
    assert_eq!(ended(&machine), None);
    assert_eq!(machine.session().map(|s| s.id()), Some(id), "one session throughout");
    assert_eq!(h.context.metrics.refreshes_ok.get(), 2);
    let refused = h.refresh(&mut machine, "uid8_exp100").expect_err("another uid's token");
    assert_eq!(refused.0, CloseReason::AuthFailed);
    assert_eq!(refused.1, r#"REFRESH refused: JWT uid claim "sub" names another uid"#);
    assert_eq!(h.context.metrics.refreshes_refused.get(), 1);
    // One online and one offline for the whole session, its login's claims on both.
    machine.goodbye(&h.inputs, refused.0, refused.1);
    let events = h.events();
    assert_eq!(events.len(), 4, "{events:?}");
    let (online, offline) = (&events[0], &events[2]);
    assert!(online.starts_with("online"), "{events:?}");
    assert!(online.contains(r#""claims":{"name":"Ada","org":"acme"}"#), "{online}");
    assert!(offline.starts_with("offline"), "{events:?}");
    assert!(offline.contains(r#""reason":"auth_failed""#), "{offline}");
    assert!(offline.contains(r#""claims":{"name":"Ada","org":"acme"}"#), "{offline}");
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_refresh_is_activity_and_nothing_before_login() {
    let h = start(Duration::ZERO);
    let mut machine = h.machine();
    let early = machine.handle(&h.inputs, Command::Refresh(h.fixed.token("uid7_exp40")), &mut BytesMut::new());
    assert_eq!(early, Err((CloseReason::ProtocolError, "LOGIN must be the first frame".into())));
    let mut machine = h.machine();
    h.login(&mut machine, 7, "uid7_exp60").expect("logged in");
    // Refreshes alone, every 20 s, keep it online past the idle timeout.
    for at in [20_000, 40_000] {
        tokio::time::sleep_until(h.inputs.start + Duration::from_millis(at)).await;
        h.refresh(&mut machine, "uid7_exp60").expect("taken");
    }
    tokio::time::sleep_until(h.inputs.start + Duration::from_millis(55_000)).await;
    assert_eq!(ended(&machine), None, "refreshes count as activity");
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn claims_over_the_bound_are_left_out_and_counted() {
    let h = start(Duration::ZERO);
    let mut machine = h.machine();
    h.login(&mut machine, 9, "uid9_big_claims").expect("logged in all the same");
    assert_eq!(h.context.metrics.claims_too_large.get(), 1);
    let events = h.events();
    assert!(events[0].starts_with("online") && !events[0].contains("claims"), "{events:?}");
    match &h.context.registry.events().read(h.from).events[0].what {
        What::Online { claims, .. } => assert_eq!(claims, &None),
        other => panic!("{other:?}"),
    }
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn without_enforcement_a_session_outlives_its_token() {
    let h = start_with(Duration::ZERO, false);
    let mut machine = h.machine();
    h.login(&mut machine, 7, "uid7_exp20").expect("logged in");
    h.until(&mut machine, 30_000).await;
    assert_eq!(ended(&machine), None, "checked at login only");
    assert_eq!(h.context.registry.token_expiries(), 0);
    h.stop.cancel();
}
