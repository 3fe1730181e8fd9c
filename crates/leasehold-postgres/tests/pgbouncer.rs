//! A transaction-mode pooler (a private PgBouncer 1.18) between the stores and
//! PostgreSQL. With `leasehold_pooler=transaction` the lease-table store, its migration
//! and the guard work and exclude; the advisory-lock store (session-bound) refuses to open
//! that way, and without the parameter it fails closed, never going on as if it held a
//! lease it cannot prove. Watching is unsupported there, but writes made through the
//! pooler notify watchers connected straight to the server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::WatchStore;
use leasehold_core::{GuardDecision, LeaseClient, LeaseConfig, StoreErrorKind};
use leasehold_postgres::sqlx::{self, Connection};
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore, guard};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{PgBouncer, PoolMode, Postgres};

fn name(s: &str) -> leasehold_core::ResourceName {
    leasehold_core::ResourceName::new(s).unwrap()
}

async fn servers() -> (Postgres, PgBouncer) {
    tokio::task::spawn_blocking(|| {
        let pg = Postgres::start();
        // Two server connections for every client: consecutive transactions of one
        // client land on different backends.
        let bouncer = PgBouncer::start(&pg, PoolMode::Transaction, 2);
        (pg, bouncer)
    })
    .await
    .unwrap()
}

fn pooled(bouncer: &PgBouncer) -> String {
    format!(
        "{}?leasehold_pooler=transaction",
        bouncer.url_for_db("postgres")
    )
}

/// The lease table behind a transaction pooler: migrated through it, 6 clients contend
/// for one key on 2 server connections; at most one holds it at a time, fences are never
/// issued twice, renewals work, and the guard (in the caller's transaction, through the
/// pooler) rejects a stale fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_table_store_and_guard_work_behind_a_transaction_pooler() {
    let _proof = proves(Backend::Postgres, Fault::TransactionPooler);
    let (_pg, bouncer) = servers().await;
    let url = pooled(&bouncer);
    let first = PgLeaseStore::connect(&PgConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    first.migrate().await.unwrap();
    let holders = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let url = url.clone();
        let holders = holders.clone();
        tasks.push(tokio::spawn(async move {
            let store = PgLeaseStore::connect(&PgConfig::from_url(&url).unwrap())
                .await
                .unwrap();
            let client = LeaseClient::new(
                Arc::new(store),
                LeaseConfig::new(Duration::from_secs(3)).unwrap(),
            );
            let mut fences = Vec::new();
            for _ in 0..5 {
                let lease = client
                    .acquire("job:pooled", Duration::from_secs(60))
                    .await
                    .unwrap();
                assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                fences.push(lease.fence());
                tokio::time::sleep(Duration::from_millis(20)).await;
                assert!(lease.is_valid());
                holders.fetch_sub(1, Ordering::SeqCst);
                assert!(lease.release().await.unwrap());
            }
            fences
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 30, "a fence was issued twice");

    // Renewed across several intervals, inspected and listed through the pooler.
    let first = Arc::new(first);
    let client = LeaseClient::new(
        first.clone(),
        LeaseConfig::new(Duration::from_secs(1)).unwrap(),
    );
    let lease = client.try_acquire("job:renewed'\\x").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());
    use leasehold_core::Store;
    let info = first.inspect(lease.key()).await.unwrap().unwrap();
    assert_eq!(info.owner, *lease.owner());
    assert_eq!(first.list("job:renewed'").await.unwrap().len(), 1);

    // The guard, in the caller's own transactions through the pooler.
    let pool = sqlx::PgPool::connect(&bouncer.url_for_db("postgres"))
        .await
        .unwrap();
    guard::migrate(&pool).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&bouncer.url_for_db("postgres"))
        .await
        .unwrap();
    for (fence, accepted) in [(lease.fence().get(), true), (1, false)] {
        let mut tx = conn.begin().await.unwrap();
        let d = guard::check_and_advance(&mut tx, &name("pooled"), leasehold_core::Fence(fence))
            .await
            .unwrap();
        assert_eq!(
            matches!(d, GuardDecision::Accepted { .. }),
            accepted,
            "{d:?}"
        );
        tx.commit().await.unwrap();
    }
    assert!(lease.release().await.unwrap());

    // Records: the upsert and the read in one simple-protocol query, values inlined
    // (quotes, backslashes, NUL and non-UTF-8 bytes), a higher fence only.
    let k = leasehold_core::Key::new("election:pooled'\\x").unwrap();
    let value = [0u8, b'\'', b'\\', 0xff, 0];
    let put = |fence: u64, v: &'static [u8]| {
        let first = first.clone();
        let k = k.clone();
        async move {
            first
                .put_record(&k, leasehold_core::Fence(fence), v)
                .await
                .unwrap()
        }
    };
    let want = leasehold_core::Record {
        fence: leasehold_core::Fence(5),
        value: value.to_vec(),
    };
    assert_eq!(first.get_record(&k).await.unwrap(), None);
    let stored = first
        .put_record(&k, leasehold_core::Fence(5), &value)
        .await
        .unwrap();
    assert_eq!(stored, want);
    assert_eq!(put(5, b"same").await, want);
    assert_eq!(put(4, b"lower").await, want);
    assert_eq!(put(6, b"").await.value, b"");
    assert_eq!(
        first.get_record(&k).await.unwrap().map(|r| r.fence),
        Some(leasehold_core::Fence(6))
    );
}

/// The advisory store cannot work behind a transaction pooler: told so, it refuses to
/// open with a configuration error that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_store_refuses_a_transaction_pooler() {
    let _proof = proves(Backend::PostgresAdvisory, Fault::TransactionPooler);
    let (_pg, bouncer) = servers().await;
    let err = PgAdvisoryStore::connect(&PgConfig::from_url(&pooled(&bouncer)).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Config);
    assert!(err.to_string().contains("session"), "{err}");
}

/// Not told, the advisory store behind a transaction pooler fails closed: either an
/// operation fails with a configuration error, or the lease is lost at a renewal (the
/// backend pid changed). It never holds on as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_store_behind_a_transaction_pooler_fails_closed() {
    let _proof = proves(Backend::PostgresAdvisory, Fault::TransactionPooler);
    let (_pg, bouncer) = servers().await;
    let url = bouncer.url_for_db("postgres");
    let store = match PgAdvisoryStore::connect(&PgConfig::from_url(&url).unwrap()).await {
        Ok(s) => Arc::new(s),
        Err(e) => {
            assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
            return;
        }
    };
    // Other clients keep the pool's server connections busy, so the holder's next
    // transaction lands on another backend.
    let noise = tokio::spawn(async move {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        loop {
            let _ = sqlx::raw_sql("SELECT pg_sleep(0.05)").execute(&pool).await;
        }
    });
    let outcome = async {
        store.migrate().await?;
        let client = LeaseClient::new(
            store.clone(),
            LeaseConfig::new(Duration::from_secs(3)).unwrap(),
        );
        let lease = client.try_acquire("job:advisory-pooled").await?;
        let reason = tokio::time::timeout(Duration::from_secs(30), lease.lost())
            .await
            .expect("the backend change is noticed");
        Ok::<_, leasehold_core::Error>(reason)
    }
    .await;
    noise.abort();
    match outcome {
        Ok(reason) => eprintln!("lost: {reason:?}"),
        Err(e) => assert_eq!(
            e.store_error().map(|e| e.kind()),
            Some(StoreErrorKind::Config),
            "{e}"
        ),
    }
}

/// Watching needs a session (`LISTEN`, and the watch lock held on it): behind a
/// transaction pooler the lease-table store says `watch: false` and answers
/// `Unsupported`. Its writes still notify: a watcher connected straight to the server
/// hears of a grant, a release, a record write and a break made through the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_is_unsupported_behind_a_transaction_pooler_but_its_writes_notify() {
    use futures::StreamExt;
    use leasehold_core::{AcquireOutcome, Fence, Key, OwnerToken, Store};
    let (pg, bouncer) = servers().await;
    let pooled = PgLeaseStore::connect(&PgConfig::from_url(&pooled(&bouncer)).unwrap())
        .await
        .unwrap();
    pooled.migrate().await.unwrap();
    let k = Key::new("watch:pooled'\\x").unwrap();
    assert!(pooled.watcher().is_none());
    let err = pooled.watch(&k).await.map(drop).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unsupported, "{err}");

    let direct = PgLeaseStore::connect(&PgConfig::from_url(&pg.url()).unwrap())
        .await
        .unwrap();
    assert!(direct.watcher().is_some());
    let mut changes = direct.watch(&k).await.unwrap();
    let mut noticed = async |what: &str| {
        tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .unwrap_or_else(|_| panic!("no notice of {what}"))
            .unwrap_or_else(|| panic!("the watch ended instead of noticing {what}"))
            .unwrap_or_else(|e| panic!("the watch failed instead of noticing {what}: {e}"));
        while let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(200), changes.next()).await
        {}
    };
    let owner = OwnerToken::random();
    assert!(matches!(
        pooled
            .acquire(&k, &owner, Duration::from_secs(60))
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    noticed("a grant through the pooler").await;
    pooled.release(&k, &owner).await.unwrap();
    noticed("a release through the pooler").await;
    pooled.put_record(&k, Fence(3), b"v").await.unwrap();
    noticed("a record write through the pooler").await;
    pooled.break_lease(&k).await.unwrap();
    noticed("a break through the pooler").await;
}
