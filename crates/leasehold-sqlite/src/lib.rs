//! # leasehold-sqlite
//!
//! A [`leasehold::Store`] in one SQLite database file — [`SqliteStore`], configured by
//! [`SqliteConfig`] (from a URL or a path) and opened by [`SqliteFactory`] for a
//! [`leasehold::Registry`] — and the SQLite [`guard`] (fence check and idempotency record)
//! for protected writes to a SQLite database.
//!
//! It is the embedded default: no server, leases shared by every process **of one host**
//! that opens the same file.
//!
//! ```no_run
//! # use std::{sync::Arc, time::Duration};
//! # use leasehold::{LeaseClient, LeaseConfig};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = leasehold_sqlite::SqliteStore::open("sqlite:///var/lib/myapp/leases.db").await?;
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
//! sqlite:///absolute/path/leases.db[?param=value&...]
//! sqlite://relative/path/leases.db[?...]          relative to the working directory
//! ```
//!
//! The file and its parent directory are created if missing; the path is percent-decoded.
//!
//! | parameter | default | meaning |
//! | --- | --- | --- |
//! | `busy_timeout` | `5s` | bound on waiting for the write lock (`500ms`, `5s`, `1m` or ms) |
//! | `synchronous` | `full` | `full` or `normal` (see [`Synchronous`]) |
//! | `max_connections` | `4` | pooled connections per store |
//!
//! Unknown parameters are rejected. `:memory:` is refused (use `memory://` for one process).
//!
//! ## Schema
//!
//! [`SqliteStore::connect`] creates the tables if missing ([`SqliteStore::migrate`]):
//! [`LEASES_SCHEMA`] (one row per lease key ever used: owner, fence, expiry) and
//! [`GUARD_SCHEMA`] (the guard and idempotency tables). Rows of the lease table are never
//! deleted: the fence of a key must survive its leases. The database runs in WAL mode.
//!
//! ## Operations
//!
//! Every write is one transaction begun with `BEGIN IMMEDIATE`, which takes the database's
//! single write lock (waiting at most the busy timeout), reads the lease row, decides and
//! writes, then commits. An acquire reads the row first without the lock and answers
//! `Held` at once when another owner's lease is live, so contenders do not queue for the
//! lock; the writers of one store take turns on an async mutex (first come, first served)
//! instead of in SQLite's busy handler, which sleeps in steps of up to 100 ms.
//!
//! - acquire: free, expired or missing → fence = `max(last + 1, now in µs)`, owner, expiry
//!   = now + TTL; held by the same owner → new expiry, same fence; held by another →
//!   `Held` with the remaining TTL.
//! - renew / release: compare owner and expiry, then extend / clear owner and expiry
//!   (the row and its fence stay).
//! - break: clear owner and expiry, fence = `max(last + 1, now in µs)` — also how an
//!   operator clears a row whose owner is corrupt.
//! - inspect / list: a plain read (WAL readers are never blocked by the writer).
//!
//! A row holding something else than a leasehold lease (an owner that is not 32 hex
//! digits, an owner without expiry, a fence ≤ 0) is [`leasehold::StoreErrorKind::Corrupt`],
//! never treated as free.
//!
//! ## Failure model
//!
//! - **Host clock.** Expiry is measured on the host's wall clock (`CLOCK_REALTIME`, as
//!   SQLite's own `'now'`), read while the write lock is held. A wall-clock jump on the host
//!   shifts every expiry: forward by an hour and every lease expires at once; back by an
//!   hour and they last an hour longer. Holders never depend on it (their deadlines use the
//!   monotonic clock), so a jump forward can only let a second holder in early — which the
//!   guard catches — and a jump back only delays takeovers. Run NTP in slewing mode.
//! - **One host only.** SQLite's locking works between processes of one host on a local
//!   file system. Do **not** put the file on a network file system (NFS, SMB, CIFS):
//!   their locks are unreliable, and WAL needs shared memory. For several hosts use a
//!   server-backed store.
//! - **Busy, never hanging.** A process that holds the write lock — a writer paused by
//!   `SIGSTOP`, a long transaction — makes every other writer wait at most the busy
//!   timeout, then fail with [`leasehold::StoreErrorKind::Busy`] (retryable). A writer
//!   killed in the middle of a transaction leaves nothing: SQLite rolls the transaction
//!   back and releases the lock when the process dies. Each operation is also bounded by
//!   twice the busy timeout plus 5 s, after which it fails with `Timeout` and its
//!   connection is closed.
//! - **Durability.** With `synchronous=full` (the default) a commit is on disk before it
//!   returns: fences never go back ([`leasehold::FenceDurability::Durable`]). With
//!   `synchronous=normal` an OS crash or power loss may roll back the last commits; fences
//!   are still floored at the host clock in microseconds, so they stay above every earlier
//!   fence unless the clock moved back by more than the outage
//!   ([`leasehold::FenceDurability::ClockFloored`]).
//! - **No release notification**: waiters sleep with backoff, capped by the holder's
//!   remaining TTL.
//!
//! ## Cancel safety
//!
//! Every operation can be dropped at any await. A transaction that was not committed is
//! rolled back; its connection is closed rather than returned to the pool. A commit that
//! was already under way may still land, which the lease client handles as an ambiguous
//! reply (a retry with the same owner returns the same fence).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config;
mod error;
mod factory;
pub mod guard;
mod schema;
mod store;

pub use config::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, MAX_BUSY_TIMEOUT, MAX_CONNECTIONS, SqliteConfig,
    Synchronous,
};
pub use error::store_error;
pub use factory::SqliteFactory;
pub use schema::{GUARD_SCHEMA, LEASES_SCHEMA};
pub use store::SqliteStore;

/// The `sqlx` this crate is built with, so that callers of the [`guard`] use the same one.
pub use sqlx;

/// The backend name reported by [`SqliteStore`].
pub const BACKEND: &str = "sqlite";

#[cfg(test)]
mod bounds {
    fn is_send_sync<T: Send + Sync>() {}
    #[test]
    fn bounds() {
        is_send_sync::<super::SqliteStore>();
        is_send_sync::<super::SqliteConfig>();
        is_send_sync::<super::SqliteFactory>();
    }
}
