//! MariaDB store specifics: secrets, least privilege, URLs and the registry, corrupt rows,
//! server clock floors, and a crash restart of the server under a held lease (docs/faults.md
//! row 9 for the lease table).

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, Registry, ReleaseOutcome, RenewOutcome, ResourceName,
    Store, StoreErrorKind,
};
use leasehold_mysql::{
    MySqlConfig, MySqlFactory, MySqlGetLockStore, MySqlLeaseStore, guard, store_error,
};
use leasehold_testkit::proof::{Backend, Fault, proves};

const TTL: Duration = Duration::from_secs(5);
const SENTINEL: &str = "Sentinel-pw-7f3a9c";

fn fence_of(o: AcquireOutcome) -> u64 {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence.get(),
        held => panic!("expected Acquired, got {held:?}"),
    }
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(SENTINEL),
        "{what} shows the password: {text}"
    );
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(MySqlFactory));
    r
}

/// A sentinel password never shows; wrong passwords and missing tables are configuration
/// errors; an account limited to `SELECT, INSERT, UPDATE` on the existing tables works
/// (connecting with `migrate` on sends no DDL when the tables exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_and_least_privilege() {
    let db = common::start_db();
    let port = db.port();
    db.sql(&format!(
        "CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY '{SENTINEL}'; \
         GRANT SELECT, INSERT, UPDATE ON test.* TO 'app'@'127.0.0.1'"
    ));
    let url = |scheme: &str, password: &str| {
        format!("{scheme}://app:{password}@127.0.0.1:{port}/test?connect_timeout=5s")
    };

    // No tables yet and no CREATE privilege: a configuration error naming migrate.
    for scheme in ["mysql", "mysql+getlock"] {
        let e = registry().open(&url(scheme, SENTINEL)).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
        assert_no_secret("error", &e.to_string());
        assert_no_secret("error", &format!("{e:?}"));
    }
    // Wrong password.
    let e = registry()
        .open(&url("mysql", &format!("{SENTINEL}-wrong")))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_no_secret("error", &e.to_string());
    assert_no_secret("error", &format!("{e:?}"));

    // The owner of the schema creates the tables; the limited account then works.
    let root = db.url();
    MySqlLeaseStore::open(&root).await.unwrap();
    MySqlGetLockStore::open(&root).await.unwrap();
    let k = Key::new("job:lp").unwrap();
    for scheme in ["mysql", "mysql+getlock"] {
        let store = registry().open(&url(scheme, SENTINEL)).await.expect(scheme);
        assert_no_secret("Debug", &format!("{store:?}"));
        let a = OwnerToken::random();
        let f = fence_of(store.acquire(&k, &a, TTL).await.unwrap());
        assert!(matches!(
            store.renew(&k, &a, TTL).await.unwrap(),
            RenewOutcome::Renewed { .. }
        ));
        assert_eq!(store.inspect(&k).await.unwrap().unwrap().fence.get(), f);
        assert_eq!(store.list("job:").await.unwrap().len(), 1);
        assert_eq!(
            store.release(&k, &a).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert!(store.break_lease(&k).await.unwrap().get() > f);
        let stored = store
            .put_record(&k, leasehold_core::Fence(f), b"lp")
            .await
            .expect("records need SELECT, INSERT, UPDATE only");
        assert!(stored.fence.get() >= f);
        assert_eq!(store.get_record(&k).await.unwrap(), Some(stored));
    }
    let config = MySqlConfig::from_url(&url("mysql", SENTINEL)).unwrap();
    assert_no_secret("Display", &config.to_string());
    assert_no_secret("Debug", &format!("{config:?}"));
    let store = MySqlLeaseStore::connect(config).await.unwrap();
    assert_no_secret("Debug", &format!("{store:?}"));

    // With the server gone, errors still carry no password.
    db.stop();
    let e = store
        .acquire(&k, &OwnerToken::random(), TTL)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert_no_secret("error", &e.to_string());
    assert_no_secret("error", &format!("{e:?}"));
}

/// Corrupt rows are typed errors, never free and never overwritten; break repairs them.
/// Fences are floored at the server clock; prefixes are literal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_rows_and_the_clock_floor() {
    let db = common::start_db();
    let store = MySqlLeaseStore::open(&format!("{}?timeout=2s&connect_timeout=2s", db.url()))
        .await
        .unwrap();
    let owner = OwnerToken::random();

    for (name, row) in [
        ("bad:owner", "'not-hex', 7, 9000000000000000"),
        (
            "bad:no-expiry",
            "'00112233445566778899aabbccddeeff', 7, NULL",
        ),
    ] {
        db.sql(&format!(
            "INSERT INTO leasehold_leases (lease_key, owner, fence, expires_at_us) VALUES ('{name}', {row})"
        ));
        let k = Key::new(name).unwrap();
        let e = store.acquire(&k, &owner, TTL).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{name}: {e}");
        let e = store.inspect(&k).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{name}: {e}");
        let fence = db.sql(&format!(
            "SELECT fence FROM leasehold_leases WHERE lease_key = '{name}'"
        ));
        assert_eq!(fence, "7", "{name}: a corrupt row was overwritten");
        let broken = store.break_lease(&k).await.unwrap();
        assert!(broken.get() > 7);
        assert!(fence_of(store.acquire(&k, &owner, TTL).await.unwrap()) > broken.get());
    }

    // Fences are floored at the server's clock in µs.
    let server_us: u64 = db
        .sql("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)")
        .parse()
        .unwrap();
    let k = Key::new("job:floor").unwrap();
    let f1 = fence_of(
        store
            .acquire(&k, &owner, Duration::from_secs(60))
            .await
            .unwrap(),
    );
    assert!(
        f1 >= server_us,
        "fence {f1} below the server clock {server_us}"
    );
    // Prefixes are literal: `_` and `%` match themselves only.
    let b = OwnerToken::random();
    for name in ["lst:a_b", "lst:axb", "lst:a%"] {
        fence_of(
            store
                .acquire(&Key::new(name).unwrap(), &b, TTL)
                .await
                .unwrap(),
        );
    }
    let names = |v: Vec<leasehold_core::LeaseInfo>| -> Vec<String> {
        v.into_iter().map(|i| i.key.to_string()).collect()
    };
    assert_eq!(names(store.list("lst:a_").await.unwrap()), ["lst:a_b"]);
    assert_eq!(names(store.list("lst:a%").await.unwrap()), ["lst:a%"]);
    assert_eq!(
        names(store.list("lst:").await.unwrap()),
        ["lst:a%", "lst:a_b", "lst:axb"]
    );

    assert_eq!(
        store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
    let f2 = fence_of(store.acquire(&k, &OwnerToken::random(), TTL).await.unwrap());
    assert!(f2 > f1);
}

/// docs/faults.md row 9 (lease table): a crash restart of the server (`kill -9`, then a
/// start on the same data: InnoDB's crash recovery) under a held lease keeps it: the
/// holder's lease stays valid throughout and is renewed after the restart (the pool
/// reconnects), the store shows the same owner and fence, a contender asking every 5 ms
/// from before the restart until after that renewal is never granted it (and is refused
/// by the restarted server), the holder still holds it at its release, and the next fence
/// is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_restart_keeps_the_lease_and_no_contender_gets_it() {
    let _proof = proves(Backend::Mysql, Fault::RestartWithPersistence);
    let db = Arc::new(common::start_db());
    let url = format!("{}?timeout=2s&connect_timeout=2s", db.url());
    let a = Arc::new(MySqlLeaseStore::open(&url).await.unwrap());
    let b = Arc::new(MySqlLeaseStore::open(&url).await.unwrap());
    let server = db.clone();
    leasehold_conformance::restart::restart_under_a_held_lease(
        a,
        b,
        "job:restart",
        TTL,
        move || server.restart(),
    )
    .await;
}

/// Growth (issue 14.5): `prune` deletes the rows of keys nobody holds whose fence is old
/// enough, never a held lease's row, and fences keep rising on a pruned key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_only_ended_leases_and_fences_still_rise() {
    let db = common::start_db();
    let store = MySqlLeaseStore::open(&common::url_direct(&db, "mysql"))
        .await
        .unwrap();
    let pool = store.pool().clone();
    leasehold_conformance::growth::prune_deletes_only_ended_leases_and_fences_still_rise(
        &store,
        async |d| store.prune(d).await.unwrap(),
        async || common::keys_in(&pool, "leasehold_leases").await,
    )
    .await;
}

/// A database leasehold's tables were never created in: opening either store with
/// `migrate=false` fails with a missing schema known by type (`is_schema_missing`, kind
/// `Config`), as do a call needing a dropped records table, a guard check without the
/// guard table and a `CALL` of the guard procedure before it exists. An unknown database
/// is a `Config` error that is not a missing schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_is_known_by_type() {
    let db = common::start_db();
    db.sql("CREATE DATABASE fresh");
    let url = |scheme: &str, database: &str, extra: &str| {
        format!(
            "{scheme}://root@127.0.0.1:{}/{database}?connect_timeout=5s&timeout=10s{extra}",
            db.port()
        )
    };
    for scheme in ["mysql", "mysql+getlock"] {
        let e = registry()
            .open(&url(scheme, "fresh", "&migrate=false"))
            .await
            .unwrap_err();
        assert!(e.is_schema_missing(), "{scheme}: {e}");
        assert_eq!(e.kind(), StoreErrorKind::Config, "{scheme}: {e}");
    }

    let store = MySqlLeaseStore::open(&url("mysql", "fresh", ""))
        .await
        .unwrap();
    db.sql("DROP TABLE fresh.leasehold_records");
    let e = store
        .get_record(&Key::new("election:x").unwrap())
        .await
        .unwrap_err();
    assert!(e.is_schema_missing(), "{e}");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");

    let mut tx = store.pool().begin().await.unwrap();
    let e = guard::check_and_advance(&mut tx, &ResourceName::new("ledger:x").unwrap(), Fence(1))
        .await
        .unwrap_err();
    assert!(e.is_schema_missing(), "{e}");
    drop(tx);
    let e = store_error(
        sqlx::query("CALL leasehold_guard('ledger:x', 1)")
            .execute(store.pool())
            .await
            .unwrap_err(),
    );
    assert!(e.is_schema_missing(), "{e}");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");

    let e = registry()
        .open(&url("mysql", "no_such_database", ""))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(!e.is_schema_missing(), "{e}");
}
