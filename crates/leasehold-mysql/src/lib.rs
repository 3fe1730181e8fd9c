//! # leasehold-mysql
//!
//! Two [`leasehold_core::Store`]s on MariaDB / MySQL, and the MySQL [`guard`] (fence check and
//! idempotency record) for protected writes to a MariaDB/MySQL database:
//!
//! - [`MySqlLeaseStore`] (`mysql://`, backend `mysql`): leases as rows of a table, expiry on
//!   the **server's** clock. Survives client crashes and reconnects; a frozen holder loses
//!   its lease at the TTL like with every TTL store.
//! - [`MySqlGetLockStore`] (`mysql+getlock://`, backend `mysql-getlock`): leases as
//!   `GET_LOCK` user locks, each held by its own server session. The server ends the lock
//!   with the session (killed connection, crashed process). Lock names longer than MySQL's
//!   64 characters are hashed ([`lock_name`]).
//!
//! [`MySqlFactory`] opens either from a URL for a [`leasehold_core::Registry`].
//!
//! ```no_run
//! # use std::{sync::Arc, time::Duration};
//! # use leasehold_core::{LeaseClient, LeaseConfig};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = leasehold_mysql::MySqlLeaseStore::open("mysql://app:secret@db:3306/app").await?;
//! let client = LeaseClient::new(Arc::new(store), LeaseConfig::new(Duration::from_secs(10))?);
//! let lease = client.acquire("job:nightly-invoices", Duration::from_secs(30)).await?;
//! // ... pass lease.fence() with every protected write ...
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## URLs
//!
//! ```text
//! mysql://[user[:password]@]host[:port]/database[?param=value&...]     lease table
//! mariadb://...                                                        the same
//! mysql+getlock://[user[:password]@]host[:port]/database[?...]         GET_LOCK sessions
//! mariadb+getlock://...                                                the same
//! ```
//!
//! | parameter | default | meaning |
//! | --- | --- | --- |
//! | `timeout` | `5s` | bound on each operation (and the server's row-lock wait, in whole seconds) |
//! | `connect_timeout` | `5s` | bound on opening a connection |
//! | `max_connections` | `8` | pool size (GET_LOCK: plus one session per held lease) |
//! | `migrate` | `true` | create missing tables when connecting; `false`: never send DDL |
//! | `socket` | none | a Unix socket path instead of host and port |
//!
//! The password never appears in `Debug`, `Display` (`<redacted>`) or errors. There is no
//! TLS in this build: connect over a Unix socket or a trusted network. Authentication
//! uses what the driver supports without TLS (MariaDB's default `mysql_native_password`;
//! MySQL 8's `caching_sha2_password` needs the account's password cached on the server).
//!
//! ## Schema
//!
//! [`LEASES_SCHEMA`], [`LOCKS_SCHEMA`] and [`GUARD_SCHEMA`] are plain `CREATE TABLE IF NOT
//! EXISTS` statements. Connecting with `migrate` on creates the store's table only when it
//! is missing, so an account limited to `SELECT, INSERT, UPDATE` on existing tables works.
//! Keys are stored as bytes (`VARBINARY(512)`), so no collation merges two keys. Lease and
//! lock rows are never deleted: the fence of a key must outlive its leases.
//!
//! ## Lease table: operations and failure model
//!
//! - acquire: one `INSERT … ON DUPLICATE KEY UPDATE` whose assignments take the row only if
//!   it is free or expired (fence = `max(last + 1, server clock in µs)`), or extend it if
//!   the same owner holds it (same fence); then a read of the row tells which happened.
//! - renew / release: one conditional `UPDATE` (owner and expiry compared on the server).
//! - break: one short transaction, fence = `max(last + 1, now in µs)`.
//! - Autocommitted single statements leave no row lock behind when a client vanishes
//!   mid-operation; a deadlock between concurrent first acquires of a new key is retried.
//! - **Server clock**: `UNIX_TIMESTAMP(NOW(6))` with the session in UTC. A jump of the
//!   server's clock shifts expiries (forward: leases expire early — the guard catches the
//!   overlap; back: takeovers are delayed). Clients' clocks do not matter.
//! - Fences are durable with InnoDB and floored at the server clock.
//! - A row holding something else than a leasehold lease is
//!   [`leasehold_core::StoreErrorKind::Corrupt`] and left untouched; `break` rewrites it.
//!
//! ## GET_LOCK: failure model
//!
//! See [`MySqlGetLockStore`]. In short: the lease lives exactly as long as the holder's
//! session *and* its TTL enforced in the holder's process. `KILL` of the session (or the
//! holder's death) frees the lock at once and the holder's next renewal answers
//! `NotOwner`; a frozen holder keeps the lock until it wakes (then loses the lease at
//! once) or its connection dies — other processes cannot take it over by time alone.
//! Leases are renewed and released only by the store instance that acquired them.
//!
//! ## Errors
//!
//! | cause | kind |
//! | --- | --- |
//! | deadlock (1213), lock wait timeout (1205), too many connections, read-only server | `Busy` |
//! | access denied, unknown database, missing table, no privilege | `Config` |
//! | connection refused / pool timeout before sending | `Unavailable` |
//! | connection broken after sending, session killed | `Ambiguous` |
//! | no reply within `timeout` | `Timeout` |
//! | an unreadable row, an exhausted fence | `Corrupt` |
//!
//! ## Cancel safety
//!
//! Every operation can be dropped at any await: its connection is then closed rather than
//! returned to the pool (the server rolls back what was not committed). A statement that
//! reached the server may still apply, which the lease client handles as an ambiguous
//! reply. A GET_LOCK acquire dropped after the lock was granted closes the session, which
//! frees the lock.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config;
mod conn;
mod error;
mod factory;
mod getlock;
pub mod guard;
mod lease_store;
mod schema;

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT, DEFAULT_TIMEOUT, MySqlConfig,
};
pub use error::store_error;
pub use factory::MySqlFactory;
pub use getlock::{
    BACKEND_GETLOCK, HASHED_LOCK_NAME_PREFIX, LOCK_NAME_PREFIX, MAX_LOCK_NAME_LEN,
    MySqlGetLockStore, lock_name,
};
pub use lease_store::{BACKEND_TABLE, MySqlLeaseStore};
pub use schema::{GUARD_SCHEMA, LEASES_SCHEMA, LOCKS_SCHEMA};

/// The backend name of configuration errors (the lease-table store's).
pub const BACKEND: &str = BACKEND_TABLE;

/// The `sqlx` this crate is built with, so that callers of the [`guard`] use the same one.
pub use sqlx;

#[cfg(test)]
mod bounds {
    fn is_send_sync<T: Send + Sync>() {}
    #[test]
    fn bounds() {
        is_send_sync::<super::MySqlLeaseStore>();
        is_send_sync::<super::MySqlGetLockStore>();
        is_send_sync::<super::MySqlConfig>();
        is_send_sync::<super::MySqlFactory>();
    }
}
