//! # leasehold-postgres
//!
//! PostgreSQL for [`leasehold`]: two lease stores and the storage-side guard.
//!
//! - [`PgLeaseStore`] (backend `"postgres"`, URL `postgres://…`): a lease table, one SQL
//!   statement per operation, expiry on the database's clock, a per-key fence kept in the
//!   lease row that never goes back. Works through any pooler.
//! - [`PgAdvisoryStore`] (backend `"postgres-advisory"`, URL `postgres+advisory://…`): a
//!   session-level `pg_try_advisory_lock` on a connection dedicated to the holder; the
//!   lease ends with the session, and the server's `idle_session_timeout` enforces the
//!   TTL. Needs a direct connection (or a session-mode pooler).
//! - [`guard`]: [`check_and_advance`](guard::check_and_advance) and
//!   [`record_once`](guard::record_once), run inside the caller's own sqlx transaction
//!   (they take `&mut sqlx::Transaction` and a validated [`ResourceName`]), so that a
//!   holder that lost its lease cannot write (DESIGN §6).
//! - [`PgFactory`]: opens either store from a URL through [`leasehold_core::Registry`].
//!
//! Tables are created by explicit, idempotent `migrate()` calls
//! ([`PgLeaseStore::migrate`], [`PgAdvisoryStore::migrate`], [`guard::migrate`]); the same
//! SQL is in the crate's `sql/` directory for DBAs. Schema and table names are
//! configurable ([`PgConfig`], [`TableName`], [`PgGuard`]). PostgreSQL 14 or newer.
//!
//! [`ResourceName`]: leasehold_core::ResourceName
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use leasehold_core::{LeaseClient, LeaseConfig, ResourceName};
//! use leasehold_postgres::{PgConfig, PgLeaseStore, guard};
//!
//! let config = PgConfig::from_url("postgres://app@127.0.0.1/app")?;
//! let store = PgLeaseStore::connect(&config).await?;
//! store.migrate().await?;
//! guard::migrate(store.pool()).await?;
//!
//! let client = LeaseClient::new(Arc::new(store.clone()), LeaseConfig::new(Duration::from_secs(10))?);
//! let lease = client.acquire("job:invoices", Duration::from_secs(30)).await?;
//! let ledger = ResourceName::new("ledger:invoices")?;
//! let mut tx = store.pool().begin().await?;
//! guard::check_and_advance(&mut tx, &ledger, lease.fence())
//!     .await?
//!     .into_result(&ledger, lease.fence())?; // FenceRejected: ownership lost
//! // ... the protected writes, in `tx` ...
//! tx.commit().await?;
//! lease.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod advisory;
mod config;
mod error;
mod factory;
pub mod guard;
mod schema;
mod table;

pub use advisory::{PgAdvisoryStore, advisory_lock_id};
pub use config::{
    DEFAULT_ADVISORY_TABLE, DEFAULT_APPLICATION_NAME, DEFAULT_GUARD_TABLE,
    DEFAULT_IDEMPOTENCY_TABLE, DEFAULT_LEASE_TABLE, MAX_IDENTIFIER_LEN, PgConfig, Pooler,
    TableName,
};
pub use error::store_error;
pub use factory::PgFactory;
pub use guard::PgGuard;
pub use table::PgLeaseStore;

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
mod bounds {
    fn is_send_sync<T: Send + Sync>() {}
    #[test]
    fn bounds() {
        is_send_sync::<super::PgLeaseStore>();
        is_send_sync::<super::PgAdvisoryStore>();
        is_send_sync::<super::PgGuard>();
        is_send_sync::<super::PgConfig>();
    }
}
