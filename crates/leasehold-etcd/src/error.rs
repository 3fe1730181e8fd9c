//! Maps etcd client errors to [`StoreError`]s.

use leasehold_core::{Refusal, StoreError, StoreErrorKind};

use crate::BACKEND;

pub(crate) fn err(kind: StoreErrorKind, msg: impl Into<String>) -> StoreError {
    StoreError::new(kind, BACKEND, msg)
}

/// Maps a client error to a typed store error. The client's errors never contain the
/// password (it is sent only in the authentication request).
pub(crate) fn map_err(op: &str, e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    // A failed TLS handshake: a configuration error (the URL, the certificates or the
    // member must change), typed by its `TlsFailure` source.
    let tls = match &e {
        E::GRpcStatus(status) => crate::tls::find(status),
        E::TransportError(t) => crate::tls::find(t),
        E::IoError(io) => crate::tls::find(io),
        _ => None,
    };
    if let Some(tls) = tls {
        return err(StoreErrorKind::Config, format!("etcd {op} failed: {tls}")).with_source(tls);
    }
    let kind = match &e {
        E::GRpcStatus(status) => match i32::from(status.code()) {
            tonic_code::UNAVAILABLE => StoreErrorKind::Unavailable,
            tonic_code::DEADLINE_EXCEEDED | tonic_code::CANCELLED => StoreErrorKind::Timeout,
            tonic_code::UNAUTHENTICATED | tonic_code::PERMISSION_DENIED => StoreErrorKind::Config,
            tonic_code::RESOURCE_EXHAUSTED => StoreErrorKind::Busy,
            // etcd answers a missing or refused authentication with InvalidArgument
            // ("user name is empty", "authentication failed", "invalid auth token").
            tonic_code::INVALID_ARGUMENT
                if ["user", "auth", "token", "password"]
                    .iter()
                    .any(|w| status.message().contains(w)) =>
            {
                StoreErrorKind::Config
            }
            tonic_code::INVALID_ARGUMENT => StoreErrorKind::InvalidInput,
            tonic_code::UNKNOWN | tonic_code::INTERNAL => StoreErrorKind::Ambiguous,
            _ => StoreErrorKind::Other,
        },
        E::TransportError(_) | E::IoError(_) => StoreErrorKind::Unavailable,
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => StoreErrorKind::Config,
        E::LeaseKeepAliveError(_) | E::WatchError(_) => StoreErrorKind::Ambiguous,
        _ => StoreErrorKind::Other,
    };
    let refusal = match &e {
        E::GRpcStatus(status) => match i32::from(status.code()) {
            tonic_code::PERMISSION_DENIED => Some(Refusal::Permission),
            _ if kind == StoreErrorKind::Config => Some(Refusal::Credentials),
            _ => None,
        },
        _ => None,
    };
    let error = err(kind, format!("etcd {op} failed"));
    match refusal {
        Some(why) => error.refused(why),
        None => error,
    }
    .with_source(e)
}

/// gRPC status codes by number (the standard numbering), so the crate does not depend
/// on `tonic` itself.
pub(crate) mod tonic_code {
    pub(crate) const CANCELLED: i32 = 1;
    pub(crate) const UNKNOWN: i32 = 2;
    pub(crate) const INVALID_ARGUMENT: i32 = 3;
    pub(crate) const DEADLINE_EXCEEDED: i32 = 4;
    pub(crate) const NOT_FOUND: i32 = 5;
    pub(crate) const PERMISSION_DENIED: i32 = 7;
    pub(crate) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(crate) const INTERNAL: i32 = 13;
    pub(crate) const UNAVAILABLE: i32 = 14;
    pub(crate) const UNAUTHENTICATED: i32 = 16;
}
