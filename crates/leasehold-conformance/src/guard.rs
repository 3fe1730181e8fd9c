//! The embedded guard database of the stale-writer case: the SQLite fence guard
//! (`leasehold_sqlite::guard`) in a temporary database file of its own.
//!
//! The guard lives in the database that receives the writes, not in the lease store
//! (docs/design.md §6), so it protects the writes of every store's holders alike: the
//! stale-writer case writes through this one with the fences of whatever store is under
//! test, unless the fixture names a guard of its own ([`Fixture::guard`]).
//!
//! [`Fixture::guard`]: crate::Fixture::guard

use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Fence, ResourceName, StoreError};
use leasehold_sqlite::sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use leasehold_sqlite::sqlx::{self, Connection};
use leasehold_sqlite::{guard, store_error};

use crate::FencedWrites;

/// The SQLite guard in a temporary database file, with a data table `conformance_data`
/// whose writes it guards. The file is deleted when the value is dropped.
#[derive(Debug)]
pub struct EmbeddedGuard {
    pool: SqlitePool,
    /// The temporary directory of a database [`open`](Self::open) made; none on a pool
    /// the caller gave.
    _dir: Option<tempfile::TempDir>,
}

impl EmbeddedGuard {
    /// Creates the database file, the guard tables ([`guard::migrate`]) and the data table.
    ///
    /// # Panics
    /// When the temporary file cannot be created or written (a setup failure).
    pub async fn open() -> Self {
        let dir = tempfile::tempdir().expect("setup: guard database directory");
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("guard.db"))
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePool::connect_with(options)
            .await
            .expect("setup: open the guard database");
        guard::migrate(&pool)
            .await
            .expect("setup: create the guard tables");
        let mut guard = Self::on_pool(pool).await;
        guard._dir = Some(dir);
        guard
    }

    /// The guard on a database that already has the guard tables (the SQLite store's own
    /// file: the store creates them), with the data table created if missing.
    ///
    /// # Panics
    /// When the data table cannot be created (a setup failure).
    pub async fn on_pool(pool: SqlitePool) -> Self {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS conformance_data \
             (resource TEXT PRIMARY KEY, value TEXT NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("setup: create the data table");
        Self { pool, _dir: None }
    }
}

#[async_trait]
impl FencedWrites for EmbeddedGuard {
    async fn write(&self, resource: &str, fence: Fence, value: &str) -> Result<bool, StoreError> {
        let name = ResourceName::new(resource).expect("the suite's names are valid");
        let mut conn = self.pool.acquire().await.map_err(store_error)?;
        // BEGIN IMMEDIATE: the write lock first, so the guard row cannot change between
        // the check and the commit.
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(store_error)?;
        if !guard::check_and_advance(&mut tx, &name, fence)
            .await?
            .is_accepted()
        {
            tx.rollback().await.map_err(store_error)?;
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO conformance_data (resource, value) VALUES (?1, ?2) \
             ON CONFLICT (resource) DO UPDATE SET value = excluded.value",
        )
        .bind(resource)
        .bind(value)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(true)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar("SELECT value FROM conformance_data WHERE resource = ?1")
            .bind(resource)
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)
    }
}
