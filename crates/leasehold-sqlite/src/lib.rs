//! # leasehold-sqlite
//!
//! A [`leasehold_core::Store`] in one SQLite database file — [`SqliteStore`], configured by
//! [`SqliteConfig`] (from a URL or a path) and opened by [`SqliteFactory`] for a
//! [`leasehold_core::Registry`] — and the SQLite [`guard`] (fence check and idempotency record)
//! for protected writes to a SQLite database.
//!
//! It is the embedded default: no server, leases shared by every process **of one host**
//! that opens the same file.
//!
//! ```no_run
//! # use std::{sync::Arc, time::Duration};
//! # use leasehold_core::{LeaseClient, LeaseConfig};
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
//! [`LEASES_SCHEMA`] (one row per lease key ever used: owner, fence, boot id, expiry on
//! that boot's `CLOCK_BOOTTIME`) and
//! [`GUARD_SCHEMA`] (the guard and idempotency tables). Rows of the lease table are never
//! deleted: the fence of a key must survive its leases. The database runs in WAL mode.
//!
//! That is file format 2. A lease table of format 1 (earlier versions: `expires_at_us` on
//! the wall clock) is converted once by `connect`, in one write transaction: a held lease
//! keeps the time it had left (at most 24 h) on the boot clock. An older leasehold still
//! running on a converted file fails every operation (the column it reads is gone), so
//! neither version ever misreads the other's expiry. Upgrade the processes of a file
//! together.
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
//! - acquire: free, expired (run out, or set under another boot id) or missing → fence =
//!   `max(last + 1, wall clock in µs)`, owner, boot id, expiry = boot clock + TTL; held by
//!   the same owner → new expiry, same fence; held by another → `Held` with the remaining
//!   TTL.
//! - renew / release: compare owner, boot id and expiry, then extend / clear owner and
//!   expiry (the row and its fence stay).
//! - break: clear owner and expiry, fence = `max(last + 1, wall clock in µs)` — also how an
//!   operator clears a row whose owner is corrupt.
//! - inspect / list: a plain read (WAL readers are never blocked by the writer).
//!
//! A row holding something else than a leasehold lease (an owner that is not 32 hex
//! digits, an owner without boot id or expiry, an expiry more than 24 h ahead, a fence ≤ 0)
//! is [`leasehold_core::StoreErrorKind::Corrupt`], never treated as free.
//!
//! ## Failure model
//!
//! - **Boot clock, not wall clock** ([`HostClock`]). Expiry is measured on the host's
//!   `CLOCK_BOOTTIME` (suspended time included, the clock of the holder's own deadline),
//!   tagged with the kernel's boot id, read while the write lock is held. Neither can be
//!   stepped: a wall-clock jump changes no expiry. A lease set under another boot id has
//!   expired (its holder died with the host). Elsewhere than Linux/Android the store falls
//!   back to the wall clock, where a step forward expires leases early (the guard catches
//!   the first holder's writes) and a step back delays takeovers.
//! - **Fences floored at the wall clock**: `max(last + 1, wall clock in µs)`. The counter
//!   keeps fences growing while commits are durable; the floor keeps them growing after an
//!   OS crash rolled back the last commits (`synchronous=normal`), since the boot clock
//!   restarts at zero on each boot and the wall clock is the only host clock that keeps
//!   growing across reboots. A wall-clock step back cannot lower a fence (`last + 1`).
//! - **One time namespace.** Every process sharing the file must read the same
//!   `CLOCK_BOOTTIME`: processes of one host in one time namespace. A process in a time
//!   namespace of its own with a boot-time offset (`unshare --time`, some container
//!   runtimes) sees the same boot id but another clock: **not supported**.
//! - **One host only.** SQLite's locking works between processes of one host on a local
//!   file system. Do **not** put the file on a network file system (NFS, SMB, CIFS):
//!   their locks are unreliable, and WAL needs shared memory. For several hosts use a
//!   server-backed store.
//! - **Busy, never hanging.** A process that holds the write lock — a writer paused by
//!   `SIGSTOP`, a long transaction — makes every other writer wait at most the busy
//!   timeout, then fail with [`leasehold_core::StoreErrorKind::Busy`] (retryable). A writer
//!   killed in the middle of a transaction leaves nothing: SQLite rolls the transaction
//!   back and releases the lock when the process dies. Each operation is also bounded by
//!   twice the busy timeout plus 5 s, after which it fails with `Timeout` and its
//!   connection is closed.
//! - **Durability.** With `synchronous=full` (the default) a commit is on disk before it
//!   returns: fences never go back ([`leasehold_core::FenceDurability::Durable`]). With
//!   `synchronous=normal` an OS crash or power loss may roll back the last commits; fences
//!   are still floored at the wall clock in microseconds, so they stay above every earlier
//!   fence unless the wall clock moved back by more than the outage
//!   ([`leasehold_core::FenceDurability::ClockFloored`]).
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

mod clock;
mod config;
mod error;
mod factory;
pub mod guard;
mod schema;
mod store;

pub use clock::{HostClock, HostTime, ManualHostClock, SystemHostClock};
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
