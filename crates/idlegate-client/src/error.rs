//! What can go wrong for the application.

use bytes::Bytes;

use crate::EndpointError;

/// A client that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("TLS settings: {0}")]
    Tls(String),
}

/// A DATA message the client could not take; it carries the payload back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The offline queue holds [`crate::Options::max_queued`] messages already.
    #[error("the client's queue is full")]
    Full(Bytes),
    /// The client was closed.
    #[error("the client is closed")]
    Closed(Bytes),
}
