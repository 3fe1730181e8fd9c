//! Fenced records (`Store::put_record` / `get_record`) on MariaDB beyond the shared
//! conformance case: one table shared by both stores, records kept across a server
//! restart, concurrent writers, and a database set up before records existed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, Key, MAX_RECORD_LEN, Record, Store, StoreErrorKind};
use leasehold_mysql::{MySqlGetLockStore, MySqlLeaseStore};

/// A URL straight to `db` with a bound that DDL on a loaded machine keeps within.
fn url(db: &leasehold_testkit::MariaDb, scheme: &str, extra: &str) -> String {
    format!(
        "{scheme}://root@127.0.0.1:{}/test?timeout=10s&connect_timeout=5s{extra}",
        db.port()
    )
}

fn rec(fence: u64, value: &[u8]) -> Record {
    Record {
        fence: Fence(fence),
        value: value.to_vec(),
    }
}

/// Retries `f` while it fails with a retryable error (the server is coming back), for at
/// most 30 s.
async fn retrying<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, leasehold_core::StoreError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(tokio::time::Instant::now() < deadline, "no recovery: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Both stores read and write the same records table; a record written before a restart
/// of the server (killed, then started again) is there after it, and still refuses a
/// lower fence. The largest fence an unsigned column holds is stored as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_a_restart_and_both_stores_share_them() {
    let db = common::start_db();
    let table = MySqlLeaseStore::open(&url(&db, "mysql", "")).await.unwrap();
    let getlock = MySqlGetLockStore::open(&url(&db, "mysql+getlock", ""))
        .await
        .unwrap();
    let k = Key::new("election:restart").unwrap();
    let value = [0u8, 0xff, b'\'', b'\\', 0x80, 0];
    assert_eq!(
        table.put_record(&k, Fence(7), &value).await.unwrap(),
        rec(7, &value)
    );
    assert_eq!(
        getlock.get_record(&k).await.unwrap(),
        Some(rec(7, &value)),
        "one table for both stores"
    );
    assert_eq!(
        getlock.put_record(&k, Fence(9), b"nine").await.unwrap(),
        rec(9, b"nine")
    );
    let top = Key::new("election:top").unwrap();
    assert_eq!(
        table.put_record(&top, Fence(u64::MAX), b"").await.unwrap(),
        rec(u64::MAX, b"")
    );
    tokio::task::block_in_place(|| db.restart());
    for store in [
        Arc::new(table) as Arc<dyn Store>,
        Arc::new(getlock) as Arc<dyn Store>,
    ] {
        let got = retrying(|| store.get_record(&k)).await;
        assert_eq!(got, Some(rec(9, b"nine")), "{}", store.backend());
        let kept = retrying(|| store.put_record(&k, Fence(8), b"eight")).await;
        assert_eq!(kept, rec(9, b"nine"), "{}", store.backend());
        let got = retrying(|| store.get_record(&top)).await;
        assert_eq!(got, Some(rec(u64::MAX, b"")), "{}", store.backend());
    }
}

/// A database set up before records existed: a store opened with `migrate=false` works for
/// leases, a record call is a configuration error that says to migrate, and `migrate`
/// adds the table. A value longer than the limit is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_the_records_table_to_an_older_database() {
    let db = common::start_db();
    MySqlLeaseStore::open(&url(&db, "mysql", "")).await.unwrap();
    db.sql("DROP TABLE leasehold_records");
    let url = url(&db, "mysql", "&migrate=false");
    let store = MySqlLeaseStore::open(&url).await.unwrap();
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
    let e = store
        .put_record(&k, Fence(1), &[0; MAX_RECORD_LEN + 1])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
}
