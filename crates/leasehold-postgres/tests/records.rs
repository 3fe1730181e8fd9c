//! Fenced records (`Store::put_record` / `get_record`) on PostgreSQL beyond the shared
//! conformance case: one table shared by both stores, records kept across a server
//! restart, concurrent writers, and a database migrated before records existed.

mod common;

use std::sync::Arc;

use leasehold_core::{Fence, Key, Record, Store, StoreErrorKind};
use leasehold_postgres::sqlx;
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
use leasehold_testkit::PostgresOptions;

fn rec(fence: u64, value: &[u8]) -> Record {
    Record {
        fence: Fence(fence),
        value: value.to_vec(),
    }
}

async fn advisory_store(url: &str) -> PgAdvisoryStore {
    let store = PgAdvisoryStore::connect(&PgConfig::from_url(url).unwrap())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// Retries `f` while it fails with a retryable error (the first use of a pooled
/// connection after a restart may fail), at most 5 times.
async fn retrying<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, leasehold_core::StoreError>>,
{
    let mut last = None;
    for _ in 0..5 {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                last = Some(e);
            }
        }
    }
    panic!("still failing: {last:?}")
}

/// Both stores read and write the same records table; a record written before a clean
/// restart of the server is there after it, and still refuses a lower fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_a_restart_and_both_stores_share_them() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let table = common::table_store(&pg.url()).await;
    let advisory = advisory_store(&pg.url()).await;
    assert_eq!(table.records_table(), advisory.records_table());
    let k = Key::new("election:restart").unwrap();
    let value = [0u8, 0xff, b'\'', b'\\', 0x80, 0];
    assert_eq!(
        table.put_record(&k, Fence(7), &value).await.unwrap(),
        rec(7, &value)
    );
    assert_eq!(
        advisory.get_record(&k).await.unwrap(),
        Some(rec(7, &value)),
        "one table for both stores"
    );
    assert_eq!(
        advisory.put_record(&k, Fence(9), b"nine").await.unwrap(),
        rec(9, b"nine")
    );
    let p = pg.clone();
    tokio::task::spawn_blocking(move || p.restart())
        .await
        .unwrap();
    for store in [
        Arc::new(table.clone()) as Arc<dyn Store>,
        Arc::new(advisory.clone()) as Arc<dyn Store>,
    ] {
        let got = retrying(|| store.get_record(&k)).await;
        assert_eq!(got, Some(rec(9, b"nine")), "{}", store.backend());
        let kept = retrying(|| store.put_record(&k, Fence(8), b"eight")).await;
        assert_eq!(kept, rec(9, b"nine"), "{}", store.backend());
    }
}

/// A database migrated by a version without records: the stores work, a record call is
/// a configuration error that says to migrate, and `migrate` adds the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_records_table_to_an_older_database() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let store = common::table_store(&pg.url()).await;
    common::psql(&pg, "DROP TABLE leasehold_records").await;
    let store = PgLeaseStore::with_pool(store.pool().clone(), store.table().clone());
    let k = Key::new("semaphore:old").unwrap();
    let e = store.put_record(&k, Fence(0), b"3").await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("migrate"), "{e}");
    let e = store.get_record(&k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    store.migrate().await.unwrap();
    assert_eq!(
        store.put_record(&k, Fence(0), b"3").await.unwrap(),
        rec(0, b"3")
    );
    // Input a column cannot hold is refused before anything is sent.
    let e = store
        .put_record(&k, Fence(u64::MAX), b"x")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
    let e = store
        .put_record(&k, Fence(1), &[0; leasehold_core::MAX_RECORD_LEN + 1])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
    // A row written by hand with a negative fence is refused by the table itself.
    let pool = common::admin_pool(&pg).await;
    let r = sqlx::query("INSERT INTO leasehold_records (key, fence, value) VALUES ('x', -1, '')")
        .execute(&pool)
        .await;
    assert!(r.is_err());
}
