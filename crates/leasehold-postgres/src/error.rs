//! Mapping of sqlx and PostgreSQL errors into [`StoreError`], without credentials.

use std::fmt;
use std::io;

use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use leasehold_sql::tls::{TlsFailure, TlsProblem};
use sqlx::postgres::PgConnectOptions;

/// The SQLSTATE the SQL guard function raises when it rejects a stale fence.
pub(crate) const FENCE_REJECTED_SQLSTATE: &str = "LH001";

/// A sqlx error reduced to text that never contains credentials: the SQLSTATE and the
/// server's message for database errors, the I/O error kind and message otherwise. Kept
/// as the source of a [`StoreError`].
#[derive(Debug)]
pub(crate) struct PgCause {
    text: String,
}

impl fmt::Display for PgCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for PgCause {}

/// The SQLSTATE of a database error, if it is one.
pub(crate) fn sqlstate(err: &sqlx::Error) -> Option<&str> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| match c {
            std::borrow::Cow::Borrowed(s) => s,
            // PgDatabaseError always borrows; other drivers are not linked here.
            std::borrow::Cow::Owned(_) => "",
        }),
        _ => None,
    }
}

fn io_kind(e: &io::Error) -> StoreErrorKind {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused | K::NotConnected | K::AddrNotAvailable | K::AddrInUse => {
            StoreErrorKind::Unavailable
        }
        K::TimedOut | K::WouldBlock => StoreErrorKind::Timeout,
        // Reset, broken pipe, unexpected end of stream: the request may have been sent.
        _ => StoreErrorKind::Ambiguous,
    }
}

/// The hint of a missing schema (SQLSTATE 3F000): how to create it from a shell, from a
/// URL and from Rust.
const MISSING_SCHEMA: &str = "the schema does not exist: create leasehold's schema and tables with \
     `leasehold migrate --store URL`, the URL parameter leasehold_migrate=true, or migrate()";

/// The hint of a missing table (SQLSTATE 42P01).
const MISSING_TABLE: &str = "a leasehold table does not exist: create leasehold's tables with \
     `leasehold migrate --store URL` (--print for the SQL), the URL parameter \
     leasehold_migrate=true, or migrate()";

/// Whether a SQLSTATE says leasehold's schema is missing: an undefined schema (3F000) or
/// table (42P01). Such errors are [`StoreError::schema_missing`].
fn is_missing_schema(code: &str) -> bool {
    matches!(code, "3F000" | "42P01")
}

/// Classifies a SQLSTATE. `None` for codes that do not say anything specific.
fn sqlstate_kind(code: &str) -> (StoreErrorKind, Option<&'static str>) {
    use StoreErrorKind as K;
    match code {
        // serialization_failure, deadlock_detected: retry the whole transaction.
        "40001" | "40P01" => (K::Busy, Some("serialization failure or deadlock: retry")),
        // lock_not_available, too_many_connections, cannot_connect_now (starting up).
        "55P03" => (K::Busy, Some("lock not available")),
        "53300" => (K::Busy, Some("too many connections")),
        "57P03" => (
            K::Unavailable,
            Some("the server is starting up or shutting down"),
        ),
        // query_canceled (statement_timeout, pg_cancel_backend).
        "57014" => (
            K::Timeout,
            Some("the statement was cancelled (statement_timeout?)"),
        ),
        // admin_shutdown (pg_terminate_backend, fast shutdown), crash_shutdown.
        "57P01" | "57P02" => (K::Ambiguous, Some("the server ended the session")),
        // idle_session_timeout, idle_in_transaction_session_timeout.
        "57P05" | "25P03" => (K::Ambiguous, Some("the server ended an idle session")),
        "25006" => (
            K::Unavailable,
            Some("the server is read-only (connected to a standby?)"),
        ),
        "3D000" => (
            K::Config,
            Some("the database does not exist: create it, or fix the database name in the URL"),
        ),
        "3F000" => (K::Config, Some(MISSING_SCHEMA)),
        "42P01" => (K::Config, Some(MISSING_TABLE)),
        // The SQL guard function refused a stale fence in the caller's statement.
        FENCE_REJECTED_SQLSTATE => (
            K::Other,
            Some(
                "leasehold_guard rejected a stale fence: the lease was lost; roll back and \
                 do not retry with this fence",
            ),
        ),
        "42883" => (
            K::Config,
            Some("a function does not exist (PostgreSQL 14 or newer is required)"),
        ),
        "42501" => (K::Config, Some("permission denied: grant the role access")),
        // duplicate_prepared_statement, invalid_sql_statement_name: a named prepared
        // statement met a server connection it was not made on.
        "42P05" | "26000" => (
            K::Config,
            Some(
                "a prepared statement is missing or duplicated on the server connection: \
                 behind a transaction-pooling proxy (PgBouncer in transaction mode), add \
                 leasehold_pooler=transaction to the URL",
            ),
        ),
        "22021" | "22001" | "22003" | "22P02" => (K::InvalidInput, None),
        c if c.starts_with("28") => (
            K::Config,
            Some("authentication failed: check the user name and password"),
        ),
        c if c.starts_with("08") => {
            // 08001/08004: could not connect / rejected: nothing was sent.
            if c == "08001" || c == "08004" {
                (K::Unavailable, Some("could not connect"))
            } else {
                (K::Ambiguous, Some("the connection failed"))
            }
        }
        c if c.starts_with("53") => (K::Busy, Some("the server is out of resources")),
        c if c.starts_with("42") => (K::Config, Some("the SQL was refused by the server")),
        c if c.starts_with("23") => (
            K::Corrupt,
            Some("a leasehold table holds rows that break its constraints"),
        ),
        _ => (K::Other, None),
    }
}

/// The store's own refusal a SQLSTATE says, if any: invalid authorization (28xxx), no such
/// database (3D000), insufficient privilege (42501).
fn refusal_of(code: &str) -> Option<Refusal> {
    match code {
        "3D000" => Some(Refusal::NoDatabase),
        "42501" => Some(Refusal::Permission),
        c if c.starts_with("28") => Some(Refusal::Credentials),
        _ => None,
    }
}

/// The kind a sqlx error maps to.
pub(crate) fn kind_of(err: &sqlx::Error) -> StoreErrorKind {
    match err {
        sqlx::Error::Database(_) => sqlstate_kind(sqlstate(err).unwrap_or("")).0,
        sqlx::Error::Io(e) => io_kind(e),
        sqlx::Error::PoolTimedOut => StoreErrorKind::Unavailable,
        sqlx::Error::PoolClosed => StoreErrorKind::Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => StoreErrorKind::Config,
        sqlx::Error::InvalidArgument(_) => StoreErrorKind::InvalidInput,
        sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => StoreErrorKind::Ambiguous,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::TypeNotFound { .. } => StoreErrorKind::Config,
        _ => StoreErrorKind::Other,
    }
}

/// Whether the error means the connection itself is gone (so a session-bound lock held on
/// it is gone too).
pub(crate) fn is_connection_loss(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => {
            let code = sqlstate(err).unwrap_or("");
            matches!(code, "57P01" | "57P02" | "57P05" | "25P03") || code.starts_with("08")
        }
        _ => false,
    }
}

/// Text describing `err`, with no credentials: sqlx never puts the password into these
/// variants' messages, and the connect options (which hold it) are never formatted.
fn describe(err: &sqlx::Error) -> String {
    match err {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            format!("{} (SQLSTATE {code})", db.message())
        }
        sqlx::Error::Io(e) => format!("I/O error ({:?}): {e}", e.kind()),
        sqlx::Error::Configuration(e) => format!("configuration error: {e}"),
        other => other.to_string(),
    }
}

/// Whether the server refused a connection because it was not encrypted: SQLSTATE 28000
/// with `pg_hba.conf`'s "no encryption" (a `hostnossl … reject` line, or no line for a
/// plaintext connection while `hostssl` ones exist). The SQLSTATE alone is shared with
/// other refusals (a role that may not log in, a missing client certificate), so the
/// server's message is read too: a server whose `lc_messages` is not English reports
/// such a refusal as [`Refusal::Credentials`] instead.
fn is_plaintext_refused(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            sqlstate(err) == Some("28000") && db.message().contains("no encryption")
        }
        _ => false,
    }
}

/// The TLS failure `err` is, if it is one (`client_key`: the connection offers a client
/// key, so a driver configuration error may quote it).
fn tls_failure(err: &sqlx::Error, client_key: bool) -> Option<TlsFailure> {
    if is_plaintext_refused(err) {
        return Some(leasehold_sql::tls::failure(
            TlsProblem::PlaintextRefused,
            None,
            "pg_hba.conf rejects connections without encryption",
        ));
    }
    leasehold_sql::tls::from_sqlx(err, client_key)
}

/// Whether `opts` hold a client key (`sslkey`, `PGSSLKEY`).
pub(crate) fn has_client_key(opts: &PgConnectOptions) -> bool {
    sqlx::ConnectOptions::to_url_lossy(opts)
        .query_pairs()
        .any(|(k, _)| k == "sslkey" || k == "ssl-key")
}

/// [`map`] for an error of connecting with `opts`: a TLS failure names the host.
pub(crate) fn map_connect(
    backend: &'static str,
    op: &str,
    err: sqlx::Error,
    opts: &PgConnectOptions,
) -> StoreError {
    match tls_failure(&err, has_client_key(opts)) {
        Some(tls) => tls_error(backend, op, tls.or_host(opts.get_host())),
        None => map(backend, op, err),
    }
}

/// A TLS failure as a [`StoreError`]: [`StoreErrorKind::Config`] (reconfigure: the URL,
/// the certificates or the server), with the failure as its source ([`TlsFailure::of`]).
fn tls_error(backend: &'static str, op: &str, tls: TlsFailure) -> StoreError {
    StoreError::new(StoreErrorKind::Config, backend, format!("{op} failed")).with_source(tls)
}

/// Maps `err`, raised by operation `op`, into a [`StoreError`] of `backend`.
pub(crate) fn map(backend: &'static str, op: &str, err: sqlx::Error) -> StoreError {
    // Without the options at hand, any driver configuration error may be about a key.
    if let Some(tls) = tls_failure(&err, true) {
        return tls_error(backend, op, tls);
    }
    let kind = kind_of(&err);
    let hint = match &err {
        sqlx::Error::Database(_) => sqlstate_kind(sqlstate(&err).unwrap_or("")).1,
        sqlx::Error::PoolTimedOut => Some("no connection could be had from the pool in time"),
        sqlx::Error::PoolClosed => Some("the connection pool is closed"),
        _ => None,
    };
    let message = match hint {
        Some(h) => format!("{op} failed: {h}"),
        None => format!("{op} failed"),
    };
    let code = sqlstate(&err).unwrap_or("");
    let error = if is_missing_schema(code) {
        StoreError::schema_missing(backend, message)
    } else if let Some(why) = refusal_of(code) {
        StoreError::new(kind, backend, message).refused(why)
    } else {
        StoreError::new(kind, backend, message)
    };
    error.with_source(PgCause {
        text: describe(&err),
    })
}

/// Maps a sqlx error (for example the error of the caller's own `COMMIT` after a guarded
/// write) into a [`StoreError`] with the same classification leasehold's PostgreSQL stores
/// and guard use:
///
/// | condition | kind |
/// | --- | --- |
/// | SQLSTATE 40001 (serialization failure), 40P01 (deadlock), 55P03, 53xxx | [`Busy`](StoreErrorKind::Busy): retry the transaction |
/// | connection refused, pool timed out, 08001/08004, 57P03, 25006 (read-only) | [`Unavailable`](StoreErrorKind::Unavailable) |
/// | reset or closed after sending, 57P01/57P02 (session terminated), other 08xxx | [`Ambiguous`](StoreErrorKind::Ambiguous): it may have committed |
/// | 57014 (statement cancelled), I/O timeout | [`Timeout`](StoreErrorKind::Timeout) |
/// | a TLS failure (untrusted certificate, certificate for another host, plaintext refused by `pg_hba.conf`, TLS required but not offered: its source is a [`TlsFailure`]) | [`Config`](StoreErrorKind::Config) |
/// | 28xxx (authentication), 42501 (permission), 3D000, 3F000, 42P01 (missing database, schema or table: run `leasehold migrate` or `migrate()`; the last two are [`is_schema_missing`](StoreError::is_schema_missing)), other 42xxx, TLS, bad URL | [`Config`](StoreErrorKind::Config); 28xxx, 3D000 and 42501 carry their [`refusal`](StoreError::refusal) ([`Credentials`](Refusal::Credentials), [`NoDatabase`](Refusal::NoDatabase), [`Permission`](Refusal::Permission)) |
/// | `LH001` (the SQL function `leasehold_guard` rejected a stale fence: ownership lost, roll back) | [`Other`](StoreErrorKind::Other) |
/// | 22xxx data errors | [`InvalidInput`](StoreErrorKind::InvalidInput) |
/// | 23xxx constraint violations in leasehold tables, undecodable rows | [`Corrupt`](StoreErrorKind::Corrupt) |
///
/// The message never contains the connection password.
pub fn store_error(err: sqlx::Error) -> StoreError {
    map(crate::GUARD_BACKEND, "statement", err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates() {
        assert_eq!(sqlstate_kind("40001").0, StoreErrorKind::Busy);
        assert_eq!(sqlstate_kind("40P01").0, StoreErrorKind::Busy);
        assert_eq!(sqlstate_kind("28P01").0, StoreErrorKind::Config);
        assert_eq!(sqlstate_kind("28000").0, StoreErrorKind::Config);
        assert_eq!(sqlstate_kind("42501").0, StoreErrorKind::Config);
        assert_eq!(sqlstate_kind("42P01").0, StoreErrorKind::Config);
        assert_eq!(sqlstate_kind("3D000").0, StoreErrorKind::Config);
        assert_eq!(sqlstate_kind("57P01").0, StoreErrorKind::Ambiguous);
        assert_eq!(sqlstate_kind("08006").0, StoreErrorKind::Ambiguous);
        assert_eq!(sqlstate_kind("08001").0, StoreErrorKind::Unavailable);
        assert_eq!(sqlstate_kind("57014").0, StoreErrorKind::Timeout);
        assert_eq!(sqlstate_kind("23514").0, StoreErrorKind::Corrupt);
        assert_eq!(sqlstate_kind("XX000").0, StoreErrorKind::Other);
        assert_eq!(sqlstate_kind("LH001").0, StoreErrorKind::Other);
        assert_eq!(refusal_of("28P01"), Some(Refusal::Credentials));
        assert_eq!(refusal_of("28000"), Some(Refusal::Credentials));
        assert_eq!(refusal_of("3D000"), Some(Refusal::NoDatabase));
        assert_eq!(refusal_of("42501"), Some(Refusal::Permission));
        assert_eq!(refusal_of("42P01"), None);
        for missing in ["42P01", "3F000"] {
            let hint = sqlstate_kind(missing).1.unwrap();
            assert!(hint.contains("leasehold migrate --store"), "{hint}");
            assert!(hint.contains("leasehold_migrate=true"), "{hint}");
            assert!(is_missing_schema(missing));
        }
        // Other configuration errors are not a missing schema, whatever they say.
        for other in ["3D000", "42501", "42883", "42703", "28P01", "42P05"] {
            assert_eq!(sqlstate_kind(other).0, StoreErrorKind::Config, "{other}");
            assert!(!is_missing_schema(other), "{other}");
        }
    }

    #[test]
    fn io_errors() {
        let e = sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(kind_of(&e), StoreErrorKind::Unavailable);
        let e = sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(kind_of(&e), StoreErrorKind::Ambiguous);
        assert!(is_connection_loss(&e));
        assert_eq!(
            kind_of(&sqlx::Error::PoolTimedOut),
            StoreErrorKind::Unavailable
        );
    }
}
