//! The settings a SIGHUP may change while the gateway runs: the login token secrets
//! (`--auth-secret`, `--auth-secret-file`), `--ws-allowed-origins`, and the DATA rate limit
//! (`--max-data-rate`, `--max-data-burst`). `idlegate serve` reads its configuration file
//! and secret file again and hands the result to [`Live::apply`]; everything else it finds
//! changed is logged as needing a restart.
//!
//! Each is read where it applies: the secrets at a login or a refresh, the origins at a
//! WebSocket upgrade, the rate at a DATA frame. None of them takes a lock: the secrets and
//! the origins are swapped pointers (`arc-swap`), the rate one atomic word. A session
//! already logged in keeps its session; a change applies from its next check on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::config::Config;
use crate::proto::Auth;

/// What may change at a SIGHUP; see the module documentation.
#[derive(Debug, Default)]
pub struct Live {
    auth: ArcSwapOption<Auth>,
    origins: Arc<AllowedOrigins>,
    /// `--max-data-rate` in the high half, `--max-data-burst` in the low; 0 rate: no limit.
    data_rate: AtomicU64,
}

/// `--ws-allowed-origins`: the origins a WebSocket upgrade may come from, `None` for any.
#[derive(Debug, Default)]
pub struct AllowedOrigins(ArcSwapOption<Vec<String>>);

impl AllowedOrigins {
    pub fn new(origins: Option<Vec<String>>) -> AllowedOrigins {
        AllowedOrigins(ArcSwapOption::from(origins.map(Arc::new)))
    }

    /// The origins now, `None` when any is allowed.
    pub fn load(&self) -> Option<Arc<Vec<String>>> {
        self.0.load_full()
    }
}

impl Live {
    pub fn new(config: &Config) -> Live {
        let live = Live {
            auth: ArcSwapOption::from(config.auth.clone().map(Arc::new)),
            origins: Arc::new(AllowedOrigins::new(config.ws_allowed_origins.clone())),
            data_rate: AtomicU64::new(0),
        };
        live.data_rate.store(pack(config.max_data_rate, config.max_data_burst), Ordering::Relaxed);
        live
    }

    /// The HMAC token secrets now, if any.
    pub fn auth(&self) -> Option<Arc<Auth>> {
        self.auth.load_full()
    }

    /// The allowed origins, shared with the WebSocket doors.
    pub fn origins(&self) -> &Arc<AllowedOrigins> {
        &self.origins
    }

    /// `(--max-data-rate, --max-data-burst)` now; a rate of 0 is no limit.
    pub fn data_rate(&self) -> (u32, u32) {
        let packed = self.data_rate.load(Ordering::Relaxed);
        ((packed >> 32) as u32, packed as u32)
    }

    /// Takes `new`'s values of what may change at run time; returns the flags that changed.
    /// A change from no secret to some, or back, is not taken: it would open or close the
    /// gateway to anonymous logins, which the start-up checks decide (see
    /// [`Live::needs_restart`]).
    pub fn apply(&self, new: &Config) -> Vec<&'static str> {
        let mut applied = Vec::new();
        let old = self.auth();
        if old.is_some() && new.auth.is_some() && old.as_deref() != new.auth.as_ref() {
            self.auth.store(new.auth.clone().map(Arc::new));
            applied.push("--auth-secret");
        }
        if self.origins.load().as_deref() != new.ws_allowed_origins.as_ref() {
            self.origins.0.store(new.ws_allowed_origins.clone().map(Arc::new));
            applied.push("--ws-allowed-origins");
        }
        let rate = pack(new.max_data_rate, new.max_data_burst);
        if self.data_rate.swap(rate, Ordering::Relaxed) != rate {
            applied.push("--max-data-rate");
        }
        applied
    }

    /// Whether taking `new` asks for a restart this cannot do: secrets added where there
    /// were none, or all taken away.
    pub fn needs_restart(&self, new: &Config) -> Option<&'static str> {
        (self.auth().is_some() != new.auth.is_some()).then_some("--auth-secret")
    }
}

fn pack(rate: u32, burst: u32) -> u64 {
    (u64::from(rate) << 32) | u64::from(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_takes_what_changed_and_says_so() {
        let secret = |s: &str| Auth::rotating([s.as_bytes().to_vec()]);
        let config = Config { auth: secret("one"), max_data_rate: 10, max_data_burst: 20, ..Config::default() };
        let live = Live::new(&config);
        assert!(live.apply(&config).is_empty(), "nothing changed");
        let new = Config {
            auth: secret("two"),
            ws_allowed_origins: Some(vec!["https://app.example".into()]),
            max_data_rate: 5,
            ..config.clone()
        };
        assert_eq!(live.apply(&new), ["--auth-secret", "--ws-allowed-origins", "--max-data-rate"]);
        assert_eq!(live.auth().as_deref(), new.auth.as_ref());
        assert_eq!(live.origins().load().as_deref(), Some(&vec!["https://app.example".to_string()]));
        assert_eq!(live.data_rate(), (5, 20));
        // Secrets taken away are not: that is a restart's decision.
        let open = Config { auth: None, ..new.clone() };
        assert_eq!(live.needs_restart(&open), Some("--auth-secret"));
        assert!(live.apply(&open).is_empty());
        assert!(live.auth().is_some());
    }
}
