//! JWT keys from the identity provider itself: `--jwt-jwks-url`, or OpenID Connect
//! discovery from `--jwt-issuer-url`. `fetch` is one bounded request (size, time, scheme,
//! redirects, CA); `refresh` is the task that keeps the keys fresh (the provider's cache
//! headers within `--jwt-jwks-refresh`, unknown `kid`s at most once per
//! `--jwt-jwks-min-interval`, cluster-wide through the store). The keys land in the same
//! [`crate::config::JwtAuth`] a key file's do, judged by the same rules.

mod fetch;
mod refresh;

pub(crate) use refresh::Refresher;
