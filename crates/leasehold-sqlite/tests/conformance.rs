//! The conformance suite on the SQLite store, one temporary database file per case.
//!
//! Fault hooks: `forget` clears the lease row's owner from a second connection (the fence
//! stays); `make_unreachable` holds the database's write lock from a second connection
//! (`BEGIN EXCLUSIVE`), exactly what a writer stuck in a transaction in another process
//! does: every write of the store then waits out its busy timeout and fails with `Busy`.
//! Reads keep working (WAL), which the suite does not need to block.
//!
//! The guard case writes through the SQLite guard (in the same file); the holder process
//! of the `kill -9` case opens the store from its `sqlite://` URL. SQLite is not
//! networked: the shared fault cases (`fault_suite!`) do not apply; docs/faults.md rows 1, 3 and
//! 20 on SQLite are in `processes.rs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::guard::EmbeddedGuard;
use leasehold_conformance::{Faults, Fixture};
use leasehold_core::{Key, Store};
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

/// Opens the store in the holder process.
async fn open(url: String) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(&url).await.expect("open the store"))
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("nested/dir/leases.db");
    // The store never creates a directory: a mistyped path fails (below), so make it.
    let config = SqliteConfig::new(&path).busy_timeout(Duration::from_secs(2));
    let e = SqliteStore::connect(config.clone()).await.unwrap_err();
    assert_eq!(e.refusal(), Some(leasehold_core::Refusal::File), "{e}");
    assert!(!dir.path().join("nested").exists(), "no directory was made");
    std::fs::create_dir_all(path.parent().unwrap()).expect("make the directory");
    let store = SqliteStore::connect(config).await.expect("open the store");
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .busy_timeout(Duration::from_secs(10));
    // The store's own connections hold the guard tables (it creates them).
    let guard = EmbeddedGuard::on_pool(store.pool().clone()).await;
    let path = path.to_str().expect("a UTF-8 path");
    assert!(
        !path.contains(['?', '#', '%']),
        "{path}: needs escaping in a URL"
    );
    let url = format!("sqlite://{path}?busy_timeout=2s");
    Fixture::new(
        Arc::new(store),
        Arc::new(SqliteFaults {
            options,
            locker: Mutex::new(None),
        }),
        Duration::from_millis(1500),
    )
    .guard(Arc::new(guard))
    .other_processes(url)
    .expects_waiter()
    .keep_alive(dir)
}

leasehold_conformance::conformance_suite!(fixture, backend = Sqlite, holder = open);
