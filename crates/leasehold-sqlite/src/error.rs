//! Mapping `sqlx` / SQLite errors into [`StoreError`].

use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use leasehold_sql::{ErrorModel, Phase};

use crate::BACKEND;

/// SQLite's reading of driver errors for the shared SQL layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqliteErrors;

impl ErrorModel for SqliteErrors {
    /// An I/O or protocol error, or a dead worker thread: the connection may be broken and
    /// must not go back to the pool.
    fn breaks_connection(&self, err: &sqlx::Error) -> bool {
        matches!(
            err,
            sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed | sqlx::Error::Protocol(_)
        )
    }

    /// [`map_sqlx`]: nothing is sent over a network, so the phase does not matter.
    fn store_error(&self, err: sqlx::Error, op: &str, _phase: Phase) -> StoreError {
        map_sqlx(err, op)
    }
}

/// SQLite's primary result code of a database error (the low byte of the extended code).
pub(crate) fn primary_code(e: &sqlx::Error) -> Option<i32> {
    let code = e.as_database_error()?.code()?;
    code.parse::<i32>().ok().map(|c| c & 0xff)
}

/// Maps an `sqlx` error to the store's error kinds:
///
/// | SQLite | kind |
/// | --- | --- |
/// | `SQLITE_BUSY`, `SQLITE_LOCKED` (the busy timeout ran out), pool exhausted | `Busy` |
/// | `SQLITE_CANTOPEN`, `SQLITE_READONLY`, `SQLITE_PERM`, `SQLITE_AUTH` (these four [`Refusal::File`]: see [`StoreError::refusal`]), no such table ([`is_schema_missing`](StoreError::is_schema_missing)) | `Config` |
/// | `SQLITE_CORRUPT`, `SQLITE_NOTADB`, a value that does not decode | `Corrupt` |
/// | `SQLITE_FULL`, `SQLITE_IOERR`, `SQLITE_NOMEM`, file I/O, pool closed | `Unavailable` |
/// | the connection's worker thread died | `Ambiguous` |
/// | the SQL guard (`leasehold_guard_check`) rejected a stale fence | `Other` |
pub(crate) fn map_sqlx(e: sqlx::Error, op: &str) -> StoreError {
    let kind = match &e {
        sqlx::Error::Database(db) => {
            let primary = primary_code(&e);
            match primary {
                Some(5 | 6) => StoreErrorKind::Busy,
                Some(3 | 8 | 14 | 23) => StoreErrorKind::Config,
                Some(11 | 26) => StoreErrorKind::Corrupt,
                Some(7 | 10 | 13) => StoreErrorKind::Unavailable,
                Some(1) if is_missing_table(db.message()) => StoreErrorKind::Config,
                _ => StoreErrorKind::Other,
            }
        }
        sqlx::Error::PoolTimedOut => StoreErrorKind::Busy,
        sqlx::Error::PoolClosed | sqlx::Error::Io(_) => StoreErrorKind::Unavailable,
        sqlx::Error::WorkerCrashed => StoreErrorKind::Ambiguous,
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => StoreErrorKind::Config,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Other,
    };
    if let sqlx::Error::Database(db) = &e
        && db
            .message()
            .starts_with(crate::schema::FENCE_REJECTED_MESSAGE)
    {
        return StoreError::new(
            StoreErrorKind::Other,
            BACKEND,
            format!(
                "{op}: leasehold_guard rejected a stale fence: the lease was lost; roll \
                 the transaction back and do not retry with this fence"
            ),
        )
        .with_source(e);
    }
    let file_refused =
        matches!(&e, sqlx::Error::Database(_)) && matches!(primary_code(&e), Some(3 | 8 | 14 | 23));
    let what = match kind {
        StoreErrorKind::Config if file_refused => match primary_code(&e) {
            Some(8) => {
                "the database file is read-only: make the file and its directory writable \
                 by this user"
            }
            Some(14) => {
                "the database file cannot be opened: check that its directory exists and \
                 that the file and the directory are writable by this user"
            }
            _ => "access to the database file is denied: check its permissions",
        },
        StoreErrorKind::Busy => {
            "the database is locked by another connection (the busy timeout ran out)"
        }
        StoreErrorKind::Config if is_schema_missing(&e) => {
            "leasehold's tables are missing from the database"
        }
        StoreErrorKind::Config => "the database refused the settings",
        StoreErrorKind::Corrupt => "the database holds a value leasehold cannot read",
        StoreErrorKind::Unavailable => "the database file cannot be used",
        StoreErrorKind::Ambiguous => "the SQLite worker died while the request was in flight",
        _ => "SQLite failed",
    };
    let message = format!("{op}: {what}");
    let error = if is_schema_missing(&e) {
        StoreError::schema_missing(BACKEND, message)
    } else if file_refused {
        StoreError::new(kind, BACKEND, message).refused(Refusal::File)
    } else {
        StoreError::new(kind, BACKEND, message)
    };
    error.with_source(e)
}

/// Whether `e` is SQLite's "no such table" ([`is_missing_table`]).
fn is_schema_missing(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => primary_code(e) == Some(1) && is_missing_table(db.message()),
        _ => false,
    }
}

/// Whether SQLite's message for a generic error (`SQLITE_ERROR`, which has no code of its
/// own for this) says a table is missing. Such errors are [`StoreError::schema_missing`].
fn is_missing_table(message: &str) -> bool {
    message.contains("no such table")
}

/// Maps an error of your own statements on a SQLite database (e.g. the protected write or
/// the `COMMIT` next to the [`guard`](crate::guard)) into a [`StoreError`] with the
/// classification the store and the guard use: `SQLITE_BUSY`/`SQLITE_LOCKED` (including a
/// stale snapshot, `SQLITE_BUSY_SNAPSHOT`) are [`Busy`](StoreErrorKind::Busy) — roll back
/// and retry the transaction; a missing table or an unwritable file is
/// [`Config`](StoreErrorKind::Config); a corrupt file is [`Corrupt`](StoreErrorKind::Corrupt).
pub fn store_error(err: sqlx::Error) -> StoreError {
    map_sqlx(err, "statement")
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    /// SQLite's own errors on an empty database: a missing table is a missing schema, by
    /// type; other `Config` or generic errors are not.
    #[tokio::test]
    async fn a_missing_table_is_a_missing_schema() {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let err = sqlx::query("SELECT * FROM leasehold_leases")
            .execute(&pool)
            .await
            .unwrap_err();
        let e = map_sqlx(err, "acquire");
        assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
        assert!(e.is_schema_missing(), "{e}");
        assert_eq!(
            e.message(),
            "acquire: leasehold's tables are missing from the database"
        );
        let err = sqlx::query("SELECT no_such_function()")
            .execute(&pool)
            .await
            .unwrap_err();
        let e = map_sqlx(err, "acquire");
        assert_eq!(e.kind(), StoreErrorKind::Other, "{e}");
        assert!(!e.is_schema_missing(), "{e}");
        let e = map_sqlx(sqlx::Error::Configuration("bad".into()), "connect");
        assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
        assert!(!e.is_schema_missing(), "{e}");
    }
}
