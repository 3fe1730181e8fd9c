//! Maps ZooKeeper client errors to [`StoreError`]s.

use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use zookeeper_client as zk;

use crate::BACKEND;

pub(crate) fn err(kind: StoreErrorKind, msg: impl Into<String>) -> StoreError {
    StoreError::new(kind, BACKEND, msg)
}

/// Maps a client error to a typed store error.
///
/// `NoAuth` (the node's ACL, or its parent's, denies this identity the permission) is a
/// [`Refusal::Permission`]; `AuthFailed` (the server refused the credentials and closed the
/// session) a [`Refusal::Credentials`]. Neither message holds a credential.
pub(crate) fn map_err(op: &str, e: zk::Error) -> StoreError {
    use zk::Error as E;
    match &e {
        E::NoAuth => {
            return err(
                StoreErrorKind::Config,
                format!(
                    "zookeeper {op} failed: permission denied: the node's ACL (or its \
                     parent's) does not give this identity the permission; the node was made \
                     by another identity (another user, or the same user with another \
                     password): use that identity, or another root path"
                ),
            )
            .refused(Refusal::Permission)
            .with_source(e);
        }
        E::AuthFailed => {
            return err(
                StoreErrorKind::Config,
                format!(
                    "zookeeper {op} failed: the server refused the credentials and closed the \
                     session: check the user name and password"
                ),
            )
            .refused(Refusal::Credentials)
            .with_source(e);
        }
        _ => {}
    }
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
