//! Maps ZooKeeper client errors to [`StoreError`]s.

use leasehold_core::{StoreError, StoreErrorKind};
use zookeeper_client as zk;

use crate::BACKEND;

pub(crate) fn err(kind: StoreErrorKind, msg: impl Into<String>) -> StoreError {
    StoreError::new(kind, BACKEND, msg)
}

/// Maps a client error to a typed store error.
pub(crate) fn map_err(op: &str, e: zk::Error) -> StoreError {
    use zk::Error as E;
    let kind = match &e {
        // The request may have reached the server: a write may have been applied.
        // The connection broke (reset, no answer within the connection timeout) with the
        // request sent: it may have been applied.
        E::ConnectionLoss | E::Custom(_) | E::UnexpectedError(_) => StoreErrorKind::Ambiguous,
        E::Timeout => StoreErrorKind::Timeout,
        E::NoHosts | E::ClientClosed | E::SessionExpired | E::SessionMoved => {
            StoreErrorKind::Unavailable
        }
        E::NoAuth | E::AuthFailed | E::InvalidAcl => StoreErrorKind::Config,
        E::Throttled => StoreErrorKind::Busy,
        E::BadArguments(_) => StoreErrorKind::InvalidInput,
        _ => StoreErrorKind::Other,
    };
    err(kind, format!("zookeeper {op} failed")).with_source(e)
}
