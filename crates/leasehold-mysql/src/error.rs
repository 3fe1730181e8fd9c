//! Mapping `sqlx` / MariaDB errors into [`StoreError`], without credentials.

use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use leasehold_sql::tls::{TlsFailure, TlsProblem};
use sqlx::mysql::MySqlDatabaseError;

pub(crate) use leasehold_sql::Phase;

/// Whether a driver error leaves the connection unusable: a server error that ends the
/// session, or any driver error but "no row" (I/O, protocol, decoding: the connection may
/// be out of step).
pub(crate) fn breaks_connection(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(_) => matches!(error_number(e), Some(1053 | 1927 | 2006 | 2013)),
        _ => !matches!(e, sqlx::Error::RowNotFound),
    }
}

/// The server's error number, for a database error.
pub(crate) fn error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(MySqlDatabaseError::number)
}

/// Deadlock (1213): the server rolled the statement's transaction back.
pub(crate) fn is_deadlock(e: &sqlx::Error) -> bool {
    error_number(e) == Some(1213)
}

/// Duplicate key (1062).
pub(crate) fn is_duplicate(e: &sqlx::Error) -> bool {
    error_number(e) == Some(1062)
}

/// Error numbers and what they mean here:
///
/// | server error | kind |
/// | --- | --- |
/// | 1205 lock wait timeout, 1213 deadlock, 1040/1203 too many connections, 1290/1792 read-only, 1637 too many transactions, 1020 record changed | `Busy` |
/// | 1044/1045/1698 access denied, 1142/1143/1227/1095 no privilege, 1049 unknown database, 1146 no table / 1305 no procedure (run `leasehold migrate`: these two are [`is_schema_missing`](StoreError::is_schema_missing)), 1054 unknown column, 1251/2059 authentication plugin | `Config` (1045/1698/1251/2059 [`Refusal::Credentials`], 1049 [`Refusal::NoDatabase`], 1044/1142/1143/1227/1095 [`Refusal::Permission`]: see [`StoreError::refusal`]) |
/// | 1644 with SQLSTATE `LH001` (the procedure `leasehold_guard` rejected a stale fence) | `Other` |
/// | 1690 value out of range (an exhausted fence) | `Corrupt` |
/// | 1366/1406 bad value, data too long | `InvalidInput` |
/// | 1053 shutdown, 1317 interrupted, 1927 connection killed, 2006/2013 connection lost | `Ambiguous` |
///
/// A TLS failure (an untrusted certificate, one for another host, TLS required but not
/// offered, a plaintext connection refused by `require_secure_transport`) is `Config`,
/// with a [`TlsFailure`] as its source.
///
/// Driver errors: I/O and protocol errors are `Unavailable` while connecting (nothing was
/// sent) and `Ambiguous` after; a pool that cannot hand out a connection is `Unavailable`;
/// TLS and configuration errors are `Config`; values that do not decode are `Corrupt`.
pub(crate) fn map_sqlx(
    e: sqlx::Error,
    backend: &'static str,
    op: &str,
    phase: Phase,
    secret: Option<&str>,
) -> StoreError {
    // Without the configuration at hand, any driver configuration error may be about a key.
    if let Some(tls) = tls_failure(&e, true) {
        return scrub(tls_error(backend, op, tls), secret);
    }
    let lost = if phase == Phase::Connect {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Ambiguous
    };
    let kind = match &e {
        sqlx::Error::Database(_) => match error_number(&e) {
            Some(1205 | 1213 | 1040 | 1203 | 1290 | 1792 | 1637 | 1020) => StoreErrorKind::Busy,
            Some(
                1044 | 1045 | 1698 | 1142 | 1143 | 1227 | 1095 | 1049 | 1146 | 1305 | 1054 | 1251
                | 2059,
            ) => StoreErrorKind::Config,
            Some(1690) => StoreErrorKind::Corrupt,
            Some(1366 | 1406) => StoreErrorKind::InvalidInput,
            Some(1053 | 1317 | 1927 | 2006 | 2013) => StoreErrorKind::Ambiguous,
            _ => StoreErrorKind::Other,
        },
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => lost,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => StoreErrorKind::Unavailable,
        sqlx::Error::Tls(_) | sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => {
            StoreErrorKind::Config
        }
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Other,
    };
    let refusal = refusal_of(&e);
    let what = match error_number(&e) {
        Some(1146) => MISSING_TABLE,
        Some(1305) => MISSING_PROCEDURE,
        Some(1644)
            if e.as_database_error().and_then(|d| d.code()).as_deref()
                == Some(crate::schema::FENCE_REJECTED_SQLSTATE) =>
        {
            "leasehold_guard rejected a stale fence: the lease was lost; roll back and do not retry with this fence"
        }
        _ => match refusal {
            Some(Refusal::Credentials) => {
                "access denied: check the user name and password (and the host the account \
                 may connect from)"
            }
            Some(Refusal::NoDatabase) => {
                "unknown database: create it, or fix the database name in the URL"
            }
            Some(Refusal::Permission) => {
                "permission denied: grant the account the privileges leasehold needs (see \
                 the README)"
            }
            _ => what(kind),
        },
    };
    let message = format!("{op}: {what}");
    let error = if is_missing_schema(&e) {
        StoreError::schema_missing(backend, message)
    } else if let Some(why) = refusal {
        StoreError::new(kind, backend, message).refused(why)
    } else {
        StoreError::new(kind, backend, message)
    };
    scrub(error.with_source(e), secret)
}

/// The server's error number for a connection refused because it is not encrypted
/// (`require_secure_transport=ON`): MySQL 5.7+'s `ER_SECURE_TRANSPORT_REQUIRED` (not tested here: this
/// machine has MariaDB only, which answers 1045 instead; see `Db::diagnose_plaintext`).
const SECURE_TRANSPORT_REQUIRED: &[u16] = &[3159];

/// The TLS failure `e` is, if it is one (`client_key`: the connection offers a client
/// key, so a driver configuration error may quote it).
pub(crate) fn tls_failure(e: &sqlx::Error, client_key: bool) -> Option<TlsFailure> {
    if let Some(n) = error_number(e)
        && SECURE_TRANSPORT_REQUIRED.contains(&n)
    {
        return Some(leasehold_sql::tls::failure(
            TlsProblem::PlaintextRefused,
            None,
            format!("server error {n}: the server requires secure transport"),
        ));
    }
    leasehold_sql::tls::from_sqlx(e, client_key)
}

/// A TLS failure as a [`StoreError`]: [`StoreErrorKind::Config`] (reconfigure: the URL,
/// the certificates or the server), with the failure as its source ([`TlsFailure::of`]).
pub(crate) fn tls_error(backend: &'static str, op: &str, tls: TlsFailure) -> StoreError {
    StoreError::new(StoreErrorKind::Config, backend, format!("{op}: failed")).with_source(tls)
}

/// The server's own refusal an error number says, if any: access denied with the given
/// credentials (1045, 1698) or authentication plugin (1251, 2059), no such database
/// (1049), no privilege (1044 on the database, 1142/1143 on a table or column, 1227,
/// 1095).
fn refusal_of(e: &sqlx::Error) -> Option<Refusal> {
    match error_number(e)? {
        1045 | 1698 | 1251 | 2059 => Some(Refusal::Credentials),
        1049 => Some(Refusal::NoDatabase),
        1044 | 1142 | 1143 | 1227 | 1095 => Some(Refusal::Permission),
        _ => None,
    }
}

/// Whether the server says leasehold's schema is missing: no such table (1146) or
/// procedure (1305). Such errors are [`StoreError::schema_missing`].
fn is_missing_schema(e: &sqlx::Error) -> bool {
    matches!(error_number(e), Some(1146 | 1305))
}

/// The hint of a missing table (1146): how to create it from a shell, a URL and Rust.
const MISSING_TABLE: &str = "a leasehold table does not exist: create leasehold's tables with \
     `leasehold migrate --store URL` (--print for the SQL), the URL parameter migrate=true \
     (the default), or migrate()";

/// The hint of a missing procedure (1305), e.g. `CALL leasehold_guard` before migrating.
const MISSING_PROCEDURE: &str = "a procedure does not exist (leasehold_guard?): create it with \
     `leasehold migrate --store URL` or guard::migrate()";

fn what(kind: StoreErrorKind) -> &'static str {
    match kind {
        StoreErrorKind::Busy => {
            "the server refused for now (lock wait, deadlock, too many connections, read-only)"
        }
        StoreErrorKind::Config => "the server refused the settings (see the error)",
        StoreErrorKind::Corrupt => "a stored value leasehold cannot read",
        StoreErrorKind::InvalidInput => "the server refused a value",
        StoreErrorKind::Unavailable => "cannot reach the server",
        StoreErrorKind::Ambiguous => "the connection broke; the request may have been applied",
        _ => "the server failed",
    }
}

/// Makes sure `secret` appears nowhere in the error: if its text would show it, the source
/// is replaced by a scrubbed copy of its message.
pub(crate) fn scrub(e: StoreError, secret: Option<&str>) -> StoreError {
    let Some(secret) = secret else { return e };
    let shown = e.to_string();
    if !shown.contains(secret) && !format!("{e:?}").contains(secret) {
        return e;
    }
    let source = std::error::Error::source(&e)
        .map(|s| s.to_string().replace(secret, "<redacted>"))
        .unwrap_or_default();
    let message = e.message().replace(secret, "<redacted>");
    e.reworded(format!("{message}: {source}"))
}

/// Maps an error of your own statements on a MariaDB/MySQL database (e.g. the protected
/// write or the `COMMIT` next to the [`guard`](crate::guard)) into a [`StoreError`] with the
/// classification the stores and the guard use: deadlock (1213) and lock wait timeout
/// (1205) are [`Busy`](StoreErrorKind::Busy) — roll back and retry the transaction; access
/// and schema errors are [`Config`](StoreErrorKind::Config); a broken connection after
/// sending is [`Ambiguous`](StoreErrorKind::Ambiguous) (it may have committed).
pub fn store_error(err: sqlx::Error) -> StoreError {
    map_sqlx(
        err,
        crate::BACKEND_TABLE,
        "statement",
        Phase::Statement,
        None,
    )
}
