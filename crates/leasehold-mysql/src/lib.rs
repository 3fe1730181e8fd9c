#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config; // the `mysql://` URL and settings
mod conn; // the pool, dedicated connections, bounds
mod doctor; // `Store::diagnose`: settings held against docs/guarantees.md
mod error; // sqlx and server errors as `StoreError`s
mod factory; // `StoreFactory`
mod getlock; // `MySqlGetLockStore`: the second store, on `GET_LOCK`
pub mod guard; // the fence guard users install in their own database
mod records; // `put_record` / `get_record` (both stores)
mod schema; // the tables' SQL
mod sql; // SQL text helpers both stores share
mod store; // `MySqlLeaseStore` (the lease table) and its `Store` impl
mod wait; // `WaitStore`: the waiting queue

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT, DEFAULT_TIMEOUT, MySqlConfig,
    SslMode,
};
pub use error::store_error;
pub use factory::MySqlFactory;
pub use getlock::{
    BACKEND_GETLOCK, GETLOCK_RESERVE_GRACE, HASHED_LOCK_NAME_PREFIX, LOCK_NAME_PREFIX,
    MAX_LOCK_NAME_LEN, MySqlGetLockStore, lock_name,
};
/// Why a TLS connection failed, by type: the source of a [`StoreError`](leasehold_core::StoreError)
/// of kind `Config` (see [`TlsFailure::of`]).
pub use leasehold_sql::tls::{TlsFailure, TlsProblem};
pub use schema::{GUARD_SCHEMA, LEASES_SCHEMA, LOCKS_SCHEMA, RECORDS_SCHEMA};
pub use store::MySqlLeaseStore;

/// The backend name of [`MySqlLeaseStore`].
pub const BACKEND_TABLE: &str = "mysql";
/// The backend name of configuration errors (the lease-table store's).
pub const BACKEND: &str = BACKEND_TABLE;

/// The `sqlx` this crate is built with, so that callers of the [`guard`] use the same one.
pub use sqlx;

#[cfg(test)]
leasehold_conformance::send_sync!(
    [MySqlLeaseStore, MySqlGetLockStore, MySqlConfig, MySqlFactory],
    fn(
        table: MySqlLeaseStore,
        getlock: MySqlGetLockStore,
        tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
        conn: &mut sqlx::MySqlConnection,
        name: &leasehold_core::ResourceName,
    ) {
        MySqlLeaseStore::open("mysql://db/app");
        MySqlGetLockStore::open("mysql+getlock://db/app");
        table.migrate();
        getlock.migrate();
        guard::migrate(table.pool());
        guard::check_and_advance(tx, name, leasehold_core::Fence(1));
        guard::record_once(tx, name);
        guard::current(conn, name)
    }
);
