//! Where LOGIN tokens come from: asked before every login, so a token that expired while
//! the client was away is replaced rather than refused again.

use std::future::Future;
use std::pin::Pin;

/// An error from a token provider; the client reports it and tries again after its backoff.
pub type TokenError = Box<dyn std::error::Error + Send + Sync>;

/// A future yielding a token.
pub type TokenFuture = Pin<Box<dyn Future<Output = Result<String, TokenError>> + Send>>;

/// Gives the token of each LOGIN.
///
/// `refresh` is true when the gateway refused the previous one (BYE(auth_failed): expired,
/// or signed with a retired secret): a provider that caches should fetch a new one. Any
/// `Fn(u64, bool) -> impl Future<Output = Result<String, TokenError>>` is one:
///
/// ```
/// # use idlegate_client::TokenError;
/// let provider = |uid: u64, refresh: bool| async move {
///     // Ask the backend for a token of `uid`, bypassing any cache when `refresh`.
///     Ok::<_, TokenError>(format!("token-for-{uid}"))
/// };
/// # let _ = idlegate_client::Options::new(7).token_provider(provider);
/// ```
pub trait TokenProvider: Send + Sync + 'static {
    /// The token of the next LOGIN of `uid`.
    fn token(&self, uid: u64, refresh: bool) -> TokenFuture;
}

impl<F, Fut> TokenProvider for F
where
    F: Fn(u64, bool) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<String, TokenError>> + Send + 'static,
{
    fn token(&self, uid: u64, refresh: bool) -> TokenFuture {
        Box::pin(self(uid, refresh))
    }
}

/// The same token every time (or none, for a gateway without `--auth-secret`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Fixed(pub String);

impl TokenProvider for Fixed {
    fn token(&self, _uid: u64, _refresh: bool) -> TokenFuture {
        let token = self.0.clone();
        Box::pin(async move { Ok(token) })
    }
}
