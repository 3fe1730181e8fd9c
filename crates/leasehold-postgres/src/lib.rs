#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod advisory; // `PgAdvisoryStore`: the second store, on advisory locks
mod config; // the `postgres://` URL and settings
mod doctor; // `Store::diagnose`: settings held against docs/guarantees.md
mod error; // sqlx errors as `StoreError`s
mod factory; // `StoreFactory`
pub mod guard; // the fence guard users install in their own database
mod listen; // the LISTEN session waiters share
mod records; // `put_record` / `get_record` (both stores)
mod schema; // migrations
mod sql; // SQL text and row helpers both stores share
mod store; // `PgLeaseStore` (the lease table) and its `Store` impl
mod tables; // the pool and tables both stores have, and what they run on them alike
mod wait; // `WaitStore`: the waiting queue
mod watch; // `WatchStore`: change notices

pub use advisory::PgAdvisoryStore;
pub use config::{
    DEFAULT_ADVISORY_TABLE, DEFAULT_APPLICATION_NAME, DEFAULT_GUARD_TABLE,
    DEFAULT_IDEMPOTENCY_TABLE, DEFAULT_LEASE_TABLE, DEFAULT_RECORD_TABLE, DEFAULT_WAIT_SESSIONS,
    MAX_IDENTIFIER_LEN, PgConfig, Pooler, SQLX_PARAMETERS, TableName,
};
pub use error::store_error;
pub use factory::PgFactory;
pub use guard::PgGuard;
/// Why a TLS connection failed, by type: the source of a [`StoreError`](leasehold_core::StoreError)
/// of kind `Config` (see [`TlsFailure::of`]).
pub use leasehold_sql::tls::{TlsFailure, TlsProblem};
pub use sql::advisory_lock_id;
pub use store::PgLeaseStore;

/// Re-export of the sqlx version this crate is built with, so callers use matching types
/// for [`guard`]'s transactions.
pub use sqlx;

/// The backend name of [`PgLeaseStore`].
pub const BACKEND_TABLE: &str = "postgres";
/// The backend name of [`PgAdvisoryStore`].
pub const BACKEND_ADVISORY: &str = "postgres-advisory";
/// The backend name in errors of the [`guard`] functions.
pub(crate) const GUARD_BACKEND: &str = "postgres";

#[cfg(test)]
leasehold_conformance::send_sync!(
    [PgLeaseStore, PgAdvisoryStore, PgGuard, PgConfig],
    fn(
        config: &PgConfig,
        table: PgLeaseStore,
        advisory: PgAdvisoryStore,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        conn: &mut sqlx::PgConnection,
        name: &leasehold_core::ResourceName,
    ) {
        PgLeaseStore::connect(config);
        PgAdvisoryStore::connect(config);
        table.migrate();
        advisory.migrate();
        guard::migrate(table.pool());
        guard::check_and_advance(tx, name, leasehold_core::Fence(1));
        guard::record_once(tx, name);
        PgGuard::new().current(conn, name)
    }
);
