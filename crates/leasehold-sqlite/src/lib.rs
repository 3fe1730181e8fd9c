#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod clock; // the host clock leases expire on
mod config; // the `sqlite://` URL and settings
mod doctor; // `Store::diagnose`: settings held against docs/guarantees.md
mod error; // sqlx and SQLite errors as `StoreError`s
mod factory; // `StoreFactory`
pub mod guard; // the fence guard users install in their own database
mod schema; // the tables' SQL
mod store; // `SqliteStore` and its `Store` impl (records included)
mod wait; // waking waiters: the in-process bells and queue

pub use clock::{HostClock, HostTime, ManualHostClock, SystemHostClock};
pub use config::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, MAX_BUSY_TIMEOUT, MAX_CONNECTIONS, SqliteConfig,
    Synchronous,
};
pub use error::store_error;
pub use factory::SqliteFactory;
pub use schema::{GUARD_SCHEMA, LEASES_SCHEMA, RECORDS_SCHEMA};
pub use store::SqliteStore;
pub use wait::CROSS_PROCESS_POLL;

/// The `sqlx` this crate is built with, so that callers of the [`guard`] use the same one.
pub use sqlx;

/// The backend name reported by [`SqliteStore`].
pub const BACKEND: &str = "sqlite";

#[cfg(test)]
leasehold_conformance::send_sync!(
    [SqliteStore, SqliteConfig, SqliteFactory],
    fn(
        store: std::sync::Arc<SqliteStore>,
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        conn: &mut sqlx::SqliteConnection,
        name: &leasehold_core::ResourceName,
    ) {
        SqliteStore::open("sqlite://x.db");
        SqliteStore::connect(SqliteConfig::new("x.db"));
        store.migrate();
        guard::migrate(store.pool());
        guard::check_and_advance(tx, name, leasehold_core::Fence(1));
        guard::record_once(tx, name);
        guard::current(conn, name)
    }
);
