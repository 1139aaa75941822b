//! Keeps the JWT keys by URL fresh: fetched at start (after OIDC discovery when the issuer
//! is given), again when the provider's answer says they go stale (`Cache-Control:
//! max-age`, `Expires`), within `--jwt-jwks-refresh`, and when a token names a `kid` no
//! key has, at most once per `--jwt-jwks-min-interval`. A failed fetch keeps the keys in
//! use, logged and counted with its reason.
//!
//! In a cluster the nodes share what they fetch through the store ([`SharedKeys`]): a node
//! whose keys are due, or that sees an unknown `kid`, first takes a document another node
//! fetched since; and an unknown `kid`'s fetch is taken by one node per interval for the
//! whole cluster, so tokens sent to every node never multiply the provider's load.
//!
//! Nothing here is on a login's path: a login checks the keys in memory and, for an unknown
//! `kid`, only wakes this task. A provider that is slow or down delays nobody's login.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::config::outbound::OutboundError;
use crate::config::{JwksConfig, JwksSource, JwtAuth};
use crate::jwks::fetch::{FetchError, Fetcher};
use crate::metrics::Metrics;
use crate::presence::{unix_ms_now, SharedKeys};

/// The most often a node reads the cluster's shared document for unknown `kid`s: tokens
/// naming them can come by the thousand, and each would otherwise be a Redis round trip.
const SHARED_CHECK_EVERY: Duration = Duration::from_secs(1);

/// What asked for a fetch (`idlegate_jwt_jwks_fetches_total{trigger}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Start,
    Scheduled,
    UnknownKid,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Scheduled => "scheduled",
            Trigger::UnknownKid => "unknown_kid",
        }
    }
}

/// The keys' fetcher; see the module documentation.
#[derive(Debug)]
pub(crate) struct Refresher {
    config: JwksConfig,
    fetcher: Fetcher,
    auth: Arc<JwtAuth>,
    metrics: Arc<Metrics>,
    shared: Option<Arc<dyn SharedKeys>>,
    /// Woken by a token naming a `kid` no key has.
    wake: Arc<Notify>,
    /// The JWKS document's URL: the flag's, or the one discovery found.
    url: Mutex<Option<String>>,
    /// When the keys of the first fetch ([`Refresher::first`]) are due again.
    due: Mutex<Option<Instant>>,
}

impl Refresher {
    /// The fetcher of `config`'s keys into `auth`; `shared` is the cluster's store.
    pub(crate) fn new(
        config: JwksConfig,
        auth: Arc<JwtAuth>,
        metrics: Arc<Metrics>,
        shared: Option<Arc<dyn SharedKeys>>,
        node: &str,
    ) -> Result<Arc<Refresher>, OutboundError> {
        let fetcher = Fetcher::new(&config, node)?;
        let wake = Arc::new(Notify::new());
        let woken = wake.clone();
        auth.on_unknown_kid(Box::new(move || woken.notify_one()));
        let url = match &config.source {
            JwksSource::Url(url) => Some(url.clone()),
            JwksSource::Issuer(_) => None,
        };
        let (url, due) = (Mutex::new(url), Mutex::new(None));
        Ok(Arc::new(Refresher { config, fetcher, auth, metrics, shared, wake, url, due }))
    }

    /// The first fetch, before the doors open: the keys, or why there are none (the flag
    /// named). A cluster's node takes a document another node fetched within the shortest
    /// refresh instead of fetching it again.
    pub(crate) async fn first(&self) -> Result<usize, String> {
        let flag = self.config.source.flag();
        match self.refresh(Trigger::Start).await {
            Ok(fresh_for) => {
                *self.due.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + fresh_for);
                Ok(self.auth.status().keys)
            }
            Err(e) => Err(format!("{flag}: {e}")),
        }
    }

    /// Refreshes when due and when woken, until `stop`; fetches first if [`Refresher::first`]
    /// did not get the keys.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let due = self.due.lock().unwrap_or_else(PoisonError::into_inner).take();
        let mut next = match due {
            Some(due) => due,
            None => {
                Instant::now()
                    + match self.refresh(Trigger::Start).await {
                        Ok(fresh_for) => fresh_for,
                        Err(_) => self.config.min_interval,
                    }
            }
        };
        // When the provider was last asked (the start's fetch counts), for the unknown-`kid`
        // limit, and when the cluster's document was last read for one.
        let mut asked = Instant::now();
        let mut checked: Option<Instant> = None;
        loop {
            let trigger = tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep_until(next) => Trigger::Scheduled,
                _ = self.wake.notified() => Trigger::UnknownKid,
            };
            if trigger == Trigger::UnknownKid {
                if asked.elapsed() < self.config.min_interval {
                    self.metrics.jwks_refetches_limited.inc();
                    continue;
                }
                if let Some(shared) = &self.shared {
                    if checked.is_some_and(|at| at.elapsed() < SHARED_CHECK_EVERY) {
                        self.metrics.jwks_refetches_limited.inc();
                        continue;
                    }
                    checked = Some(Instant::now());
                    if self.take_shared(shared.as_ref(), Duration::MAX).await {
                        continue;
                    }
                    match shared.claim_refetch(self.config.min_interval).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // Another node fetches (or fetched) within the interval: its
                            // document reaches this one through the store.
                            self.metrics.jwks_refetches_limited.inc();
                            continue;
                        }
                        Err(e) => tracing::debug!(error = %e, "jwks: the cluster's refetch claim is out of reach"),
                    }
                }
            }
            asked = Instant::now();
            next = Instant::now()
                + match self.refresh(trigger).await {
                    Ok(fresh_for) => fresh_for,
                    // No keys yet: try again soon; keys in use: at the shortest refresh.
                    Err(_) if self.auth.fetched_unix_ms().is_none() => self.config.min_interval,
                    Err(_) => self.config.refresh_min,
                };
        }
    }

    /// Takes the cluster's document if one was fetched later than the keys in use and less
    /// than `within` ago; true if it did.
    async fn take_shared(&self, shared: &dyn SharedKeys, within: Duration) -> bool {
        let Some(url) = self.url() else { return false };
        let ours = self.auth.fetched_unix_ms().unwrap_or(0);
        let (document, at) = match shared.latest(&url).await {
            Ok(Some(found)) => found,
            Ok(None) => return false,
            Err(e) => {
                tracing::debug!(error = %e, "jwks: the cluster's shared keys are out of reach");
                return false;
            }
        };
        let age = Duration::from_millis(unix_ms_now().saturating_sub(at));
        if at <= ours || age > within {
            return false;
        }
        match self.auth.take_jwks(&url, &document, at) {
            Ok(n) => {
                self.metrics.jwks_fetch("shared", "ok");
                self.took(n, at);
                tracing::info!(keys = n, url = %url, "jwks: took the keys another node fetched");
                true
            }
            Err(why) => {
                tracing::warn!(url = %url, why = %why, "jwks: the keys another node published are refused");
                false
            }
        }
    }

    /// One refresh: the cluster's document if it is fresh, else a fetch (after discovery if
    /// needed). Answers how long until the next, or why it failed (the keys in use stay).
    async fn refresh(&self, trigger: Trigger) -> Result<Duration, FetchError> {
        if trigger != Trigger::UnknownKid {
            if let Some(shared) = &self.shared {
                if self.take_shared(shared.as_ref(), self.config.refresh_min).await {
                    return Ok(self.config.refresh_min);
                }
            }
        }
        let fetched = self.fetch().await;
        let now = unix_ms_now();
        match fetched {
            Ok((url, fetched)) => match self.auth.take_jwks(&url, &fetched.text, now) {
                Ok(n) => {
                    self.metrics.jwks_fetch(trigger.label(), "ok");
                    self.took(n, now);
                    tracing::info!(keys = n, url = %url, trigger = trigger.label(), "jwks: keys fetched");
                    if let Some(shared) = &self.shared {
                        if let Err(e) = shared.publish(&url, &fetched.text, now).await {
                            tracing::debug!(error = %e, "jwks: could not share the keys with the cluster");
                        }
                    }
                    let wanted = fetched.fresh_for.unwrap_or(self.config.refresh_max);
                    Ok(wanted.clamp(self.config.refresh_min, self.config.refresh_max))
                }
                Err(why) => Err(self.failed(trigger, Some(&url), FetchError::Invalid(url.clone(), why), now)),
            },
            Err(e) => {
                let url = self.url();
                Err(self.failed(trigger, url.as_deref(), e, now))
            }
        }
    }

    /// The document of the keys' URL, discovered first if it is not known yet.
    async fn fetch(&self) -> Result<(String, crate::jwks::fetch::Fetched), FetchError> {
        let url = match (self.url(), &self.config.source) {
            (Some(url), _) => url,
            (None, JwksSource::Issuer(issuer)) => {
                let found = self.fetcher.discover(issuer, self.config.allow_http).await?;
                tracing::info!(issuer = %found.issuer, jwks_uri = %found.jwks_uri, "jwks: discovered");
                *self.url.lock().unwrap_or_else(PoisonError::into_inner) = Some(found.jwks_uri.clone());
                found.jwks_uri
            }
            (None, JwksSource::Url(url)) => url.clone(),
        };
        let fetched = self.fetcher.get(&url).await?;
        Ok((url, fetched))
    }

    fn url(&self) -> Option<String> {
        self.url.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The metrics of keys just taken: `n` of them, fetched at `at` (unix ms).
    fn took(&self, n: usize, at: u64) {
        self.metrics.jwks_keys.set(n as i64);
        self.metrics.jwks_fetched_seconds.set((at / 1000) as i64);
        self.metrics.jwks_last_fetch_ok.set(1);
        self.metrics.jwt_keys.set(self.auth.key_count() as i64);
    }

    /// Logs, counts and records a failed fetch; returns it.
    fn failed(&self, trigger: Trigger, url: Option<&str>, e: FetchError, now: u64) -> FetchError {
        self.metrics.jwks_fetch(trigger.label(), e.reason());
        self.metrics.jwks_last_fetch_ok.set(0);
        self.auth.fetch_failed(url, &e.to_string(), now);
        tracing::warn!(error = %e, trigger = trigger.label(), "jwks: fetching the keys failed; the keys in use stay");
        e
    }
}
