//! The conformance suite on the SQLite store, one temporary database file per case.
//!
//! Fault hooks: `forget` clears the lease row's owner from a second connection (the fence
//! stays); `make_unreachable` holds the database's write lock from a second connection
//! (`BEGIN EXCLUSIVE`), exactly what a writer stuck in a transaction in another process
//! does: every write of the store then waits out its busy timeout and fails with `Busy`.
//! Reads keep working (WAL), which the suite does not need to block.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::Key;
use leasehold_conformance::{Faults, Fixture};
use leasehold_sqlite::{SqliteConfig, SqliteStore};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::Mutex;

struct SqliteFaults {
    options: SqliteConnectOptions,
    locker: Mutex<Option<SqliteConnection>>,
}

#[async_trait]
impl Faults for SqliteFaults {
    async fn forget(&self, key: &Key) {
        let mut conn = self.options.connect().await.expect("fault connection");
        sqlx::query(
            "UPDATE leasehold_leases SET owner = NULL, boot_id = NULL, expires_boot_us = NULL \
             WHERE lease_key = ?1",
        )
        .bind(key.as_str())
        .execute(&mut conn)
        .await
        .expect("forget");
        conn.close().await.ok();
    }

    async fn make_unreachable(&self) {
        let mut conn = self.options.connect().await.expect("fault connection");
        sqlx::raw_sql("BEGIN EXCLUSIVE")
            .execute(&mut conn)
            .await
            .expect("BEGIN EXCLUSIVE");
        *self.locker.lock().await = Some(conn);
    }

    async fn restore(&self) {
        if let Some(mut conn) = self.locker.lock().await.take() {
            sqlx::raw_sql("ROLLBACK")
                .execute(&mut conn)
                .await
                .expect("ROLLBACK");
            conn.close().await.ok();
        }
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("nested/dir/leases.db");
    let config = SqliteConfig::new(&path).busy_timeout(Duration::from_secs(2));
    let store = SqliteStore::connect(config).await.expect("open the store");
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .busy_timeout(Duration::from_secs(10));
    Fixture {
        store: Arc::new(store),
        faults: Arc::new(SqliteFaults {
            options,
            locker: Mutex::new(None),
        }),
        ttl: Duration::from_millis(1500),
        guard: Box::new(dir),
    }
}

leasehold_conformance::conformance_suite!(fixture);
