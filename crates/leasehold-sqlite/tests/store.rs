//! SQLite store specifics: URLs and the registry, WAL, fences across reopening, corrupt rows,
//! records across reopening and on a file made before records existed.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{
    AcquireOutcome, Fence, FenceDurability, Key, MAX_RECORD_LEN, OwnerToken, Record, Registry,
    ReleaseOutcome, Store, StoreErrorKind,
};
use leasehold_sqlite::{
    HostClock, ManualHostClock, SqliteConfig, SqliteFactory, SqliteStore, Synchronous,
};

const TTL: Duration = Duration::from_secs(5);

fn fence_of(o: AcquireOutcome) -> u64 {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence.get(),
        held => panic!("expected Acquired, got {held:?}"),
    }
}

#[allow(clippy::disallowed_methods)] // fences are floored at the wall clock: that is what is checked
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test]
async fn registry_opens_url_in_wal_mode_and_never_creates_directories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a b/c/leases.db");
    let url = format!(
        "sqlite://{}?busy_timeout=750ms",
        path.to_str().unwrap().replace(' ', "%20")
    );
    let mut registry = Registry::new();
    registry.register(Arc::new(SqliteFactory));
    // A missing directory is the file's refusal, and is not made.
    let e = registry.open(&url).await.unwrap_err();
    assert_eq!(e.refusal(), Some(leasehold_core::Refusal::File), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(!dir.path().join("a b").exists(), "a directory was made");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let store = registry.open(&url).await.expect("open");
    assert_eq!(store.backend(), "sqlite");
    assert!(path.exists(), "the file was created");
    let caps = store.capabilities();
    assert!(caps.reports_remaining);
    assert!(!caps.session_bound && store.waiter().is_some());
    assert_eq!(caps.fence_durability, FenceDurability::Durable);

    let direct = SqliteStore::open(&url).await.unwrap();
    assert_eq!(
        direct.config().get_busy_timeout(),
        Duration::from_millis(750)
    );
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(direct.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(direct.pool())
        .await
        .unwrap();
    assert_eq!(sync, 2, "FULL");
    let normal = SqliteStore::connect(SqliteConfig::new(&path).synchronous(Synchronous::Normal))
        .await
        .unwrap();
    assert_eq!(
        normal.capabilities().fence_durability,
        FenceDurability::ClockFloored
    );
    assert!(format!("{direct:?}").contains("sqlite://"));
}

#[tokio::test]
async fn unusable_paths_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    // The parent "directory" is a file.
    let e = SqliteStore::open(&format!("sqlite://{}/x.db", file.display()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    // A file that is not a database.
    let e = SqliteStore::connect(SqliteConfig::new(&file))
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), StoreErrorKind::Corrupt | StoreErrorKind::Config),
        "{e}"
    );
    let mut registry = Registry::new();
    registry.register(Arc::new(SqliteFactory));
    let e = registry.open("sqlite:///x.db?nope=1").await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
}

#[tokio::test]
async fn fences_are_clock_floored_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.db");
    let k = Key::new("job:persist").unwrap();
    let a = OwnerToken::random();
    let before = now_us();
    let f1 = {
        let store = SqliteStore::connect(SqliteConfig::new(&path))
            .await
            .unwrap();
        let f = fence_of(store.acquire(&k, &a, TTL).await.unwrap());
        store.close().await;
        f
    };
    assert!(
        f1 >= before,
        "fence {f1} is floored at the host clock {before}"
    );
    // A new store (another process, a restart) sees the lease and its owner.
    let store = SqliteStore::connect(SqliteConfig::new(&path))
        .await
        .unwrap();
    let info = store.inspect(&k).await.unwrap().expect("lease persisted");
    assert_eq!((info.owner, info.fence.get()), (a, f1));
    assert!(info.remaining.unwrap() <= TTL);
    assert_eq!(fence_of(store.acquire(&k, &a, TTL).await.unwrap()), f1);
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    let f2 = fence_of(store.acquire(&k, &OwnerToken::random(), TTL).await.unwrap());
    assert!(f2 > f1);
    let f3 = store.break_lease(&k).await.unwrap().get();
    assert!(f3 > f2);
    // Breaking a key never used gives a floored fence too.
    let fresh = store
        .break_lease(&Key::new("job:never").unwrap())
        .await
        .unwrap();
    assert!(fresh.get() >= before);
    // list sees only live leases with the prefix, in key order.
    let b = OwnerToken::random();
    for name in ["job:l2", "job:l1", "jobx:l3"] {
        fence_of(
            store
                .acquire(&Key::new(name).unwrap(), &b, TTL)
                .await
                .unwrap(),
        );
    }
    let listed: Vec<String> = store
        .list("job:l")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key.to_string())
        .collect();
    assert_eq!(listed, ["job:l1", "job:l2"]);
    // Wildcards in the prefix are literal.
    assert!(store.list("job:_").await.unwrap().is_empty());
    assert!(store.list("job:%").await.unwrap().is_empty());
}

#[tokio::test]
async fn corrupt_rows_are_typed_errors_never_free() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualHostClock::new());
    let store =
        SqliteStore::connect(SqliteConfig::new(dir.path().join("c.db")).clock(clock.clone()))
            .await
            .unwrap();
    let now = clock.now().unwrap();
    let owner = OwnerToken::random();
    let valid = "00112233445566778899aabbccddeeff";
    let boot = Some(now.boot_id.as_str());
    let day_us = 24 * 3_600_000_000i64;
    for (name, row_owner, fence, boot_id, expires) in [
        (
            "bad:owner",
            Some("not-hex"),
            7i64,
            boot,
            Some(now.boottime_us + 1_000_000),
        ),
        ("bad:no-expiry", Some(valid), 7, boot, None),
        (
            "bad:no-boot",
            Some(valid),
            7,
            None,
            Some(now.boottime_us + 1_000_000),
        ),
        ("bad:fence", None, -3, None, None),
        // Further ahead than any TTL: not a lease this store wrote.
        (
            "bad:far",
            Some(valid),
            7,
            boot,
            Some(now.boottime_us + day_us + 1),
        ),
    ] {
        sqlx::query(
            "INSERT INTO leasehold_leases (lease_key, owner, fence, boot_id, expires_boot_us) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(name)
        .bind(row_owner)
        .bind(fence)
        .bind(boot_id)
        .bind(expires)
        .execute(store.pool())
        .await
        .unwrap();
        let k = Key::new(name).unwrap();
        let e = store.acquire(&k, &owner, TTL).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{name}: {e}");
        assert!(!e.is_retryable());
        let e = store.inspect(&k).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{name}: {e}");
        // The operator's way out: break the lease, which rewrites the row.
        let broken = store.break_lease(&k).await.unwrap();
        assert!(broken.get() > 7);
        assert!(fence_of(store.acquire(&k, &owner, TTL).await.unwrap()) > broken.get());
    }
    let e = store.list("bad:").await;
    assert!(e.is_ok(), "all repaired: {e:?}");
}

/// Growth (issue 14.5): `prune` deletes the rows of keys nobody holds whose fence is old
/// enough, never a held lease's row, and fences keep rising on a pruned key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_only_ended_leases_and_fences_still_rise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = SqliteStore::connect(SqliteConfig::new(&path))
        .await
        .unwrap();
    let pool = store.pool().clone();
    leasehold_conformance::growth::prune_deletes_only_ended_leases_and_fences_still_rise(
        &store,
        async |d| store.prune(d).await.unwrap(),
        async || {
            sqlx::query_scalar::<_, String>(
                "SELECT lease_key FROM leasehold_leases ORDER BY lease_key",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        },
    )
    .await;
}

/// Records survive closing and reopening the store (another process, a restart); a file
/// made before records existed (lease table of format 2, no records table) gets the table
/// when a store connects; input a column cannot hold is refused as `InvalidInput`.
#[tokio::test]
async fn records_survive_reopening_and_old_files_get_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.db");
    let k = Key::new("election:reopen").unwrap();
    let value: Vec<u8> = vec![0, 0xff, b'l', 0, 0x80];
    {
        let store = SqliteStore::connect(SqliteConfig::new(&path))
            .await
            .unwrap();
        let stored = store.put_record(&k, Fence(42), &value).await.unwrap();
        assert_eq!(stored.fence, Fence(42));
        // Bad input is refused before anything is written.
        let e = store
            .put_record(&k, Fence(u64::MAX), b"x")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
        let e = store
            .put_record(&k, Fence(43), &[0; MAX_RECORD_LEN + 1])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
        store.close().await;
    }
    let store = SqliteStore::connect(SqliteConfig::new(&path))
        .await
        .unwrap();
    let want = Record {
        fence: Fence(42),
        value: value.clone(),
    };
    assert_eq!(store.get_record(&k).await.unwrap(), Some(want.clone()));
    assert_eq!(store.put_record(&k, Fence(41), b"old").await.unwrap(), want);
    store.close().await;

    // A file of the version before records: the records table is missing until a store
    // connects; leases and their fences are untouched.
    let old = dir.path().join("old.db");
    let owner = OwnerToken::random();
    let lease_fence = {
        let store = SqliteStore::connect(SqliteConfig::new(&old)).await.unwrap();
        let f = fence_of(
            store
                .acquire(&Key::new("job:old").unwrap(), &owner, TTL)
                .await
                .unwrap(),
        );
        sqlx::raw_sql("DROP TABLE leasehold_records")
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
        f
    };
    let store = SqliteStore::connect(SqliteConfig::new(&old)).await.unwrap();
    assert_eq!(store.get_record(&k).await.unwrap(), None);
    assert_eq!(
        store.put_record(&k, Fence(0), b"3").await.unwrap(),
        Record {
            fence: Fence(0),
            value: b"3".to_vec()
        }
    );
    let info = store
        .inspect(&Key::new("job:old").unwrap())
        .await
        .unwrap()
        .expect("the lease is kept");
    assert_eq!((info.owner, info.fence.get()), (owner, lease_fence));
}

/// A table of leasehold's dropped under an open store: its calls fail with a missing
/// schema, known by type (`is_schema_missing`, kind `Config`), never by the message; the
/// store's `migrate` makes them work again.
#[tokio::test]
async fn a_missing_table_is_a_missing_schema_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(SqliteConfig::new(dir.path().join("m.db")))
        .await
        .unwrap();
    let k = Key::new("job:missing").unwrap();
    sqlx::raw_sql("DROP TABLE leasehold_records; DROP TABLE leasehold_leases")
        .execute(store.pool())
        .await
        .unwrap();
    let e = store.get_record(&k).await.unwrap_err();
    assert!(e.is_schema_missing(), "{e}");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let e = store
        .acquire(&k, &OwnerToken::random(), TTL)
        .await
        .unwrap_err();
    assert!(e.is_schema_missing(), "{e}");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    store.migrate().await.unwrap();
    assert_eq!(store.get_record(&k).await.unwrap(), None);
    fence_of(store.acquire(&k, &OwnerToken::random(), TTL).await.unwrap());
}

/// Processes that open one new file at once (the first `leasehold run`s on a machine)
/// all open it: they wait for each other's schema changes instead of one failing at once
/// with "database is locked" (a `CREATE … IF NOT EXISTS` outside a write transaction reads
/// the schema, then SQLite refuses its write without waiting once another commit made that
/// read stale). Each store here has its own pool, as a process would. The user's own
/// database migrated by several processes at once, likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_opening_one_new_file_at_once_all_open_it() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let path = dir.path().join(format!("fresh-{round}.db"));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(async move { SqliteStore::connect(SqliteConfig::new(&path)).await })
            })
            .collect();
        for open in opens {
            open.await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let app = dir.path().join(format!("app-{round}.db"));
        let url = format!("sqlite://{}?mode=rwc", app.display());
        let mut pools = Vec::new();
        for _ in 0..8 {
            pools.push(sqlx::SqlitePool::connect(&url).await.unwrap());
        }
        let migrations: Vec<_> = pools
            .into_iter()
            .map(|pool| tokio::spawn(async move { leasehold_sqlite::guard::migrate(&pool).await }))
            .collect();
        for m in migrations {
            m.await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}, guard: {e}"));
        }
    }
}
