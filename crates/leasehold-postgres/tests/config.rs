//! Configuration, security and schema behaviour against a private PostgreSQL: URLs and the
//! factory, secrets never echoed, authentication and permission errors as configuration
//! errors, a least-privilege role, custom schema and table names, corrupt rows, the
//! advisory lock id in SQL, and the advisory session's name and reuse.

mod common;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Key, LeaseClient, LeaseConfig, OwnerToken, Registry, ReleaseOutcome,
    RenewOutcome, Store, StoreErrorKind,
};
use leasehold_postgres::sqlx;
use leasehold_postgres::{
    PgAdvisoryStore, PgConfig, PgFactory, PgGuard, PgLeaseStore, advisory_lock_id, guard,
};
use leasehold_testkit::PostgresOptions;

fn name(s: &str) -> leasehold_core::ResourceName {
    leasehold_core::ResourceName::new(s).unwrap()
}

const SENTINEL: &str = "S3ntinel-pw-4711";

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(PgFactory));
    r
}

/// Requires SCRAM passwords for role `lh_pw` over TCP (the test server trusts everyone
/// else), and creates that role with the sentinel password.
async fn with_password_role(pg: &Arc<leasehold_testkit::Postgres>) {
    common::psql(
        pg,
        &format!("CREATE ROLE lh_pw LOGIN PASSWORD '{SENTINEL}'"),
    )
    .await;
    let hba = pg.data_dir().join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).unwrap();
    let mut f = std::fs::File::create(&hba).unwrap();
    writeln!(f, "host all lh_pw 127.0.0.1/32 scram-sha-256").unwrap();
    f.write_all(old.as_bytes()).unwrap();
    drop(f);
    common::psql(pg, "SELECT pg_reload_conf()").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

fn assert_no_secret(what: &str, s: &str) {
    assert!(!s.contains(SENTINEL), "{what} leaks the password: {s}");
    assert!(!s.contains("wrong-"), "{what} leaks the password: {s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_echoed_and_auth_errors_are_config() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    with_password_role(&pg).await;
    let port = pg.port();
    let wrong = format!("postgres://lh_pw:wrong-{SENTINEL}@127.0.0.1:{port}/postgres");
    for url in [
        wrong.clone(),
        wrong.replace("postgres://", "postgres+advisory://"),
    ] {
        let e = registry().open(&url).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
        assert!(!e.is_retryable());
        assert_no_secret("error Display", &e.to_string());
        assert_no_secret("error Debug", &format!("{e:?}"));
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            assert_no_secret("error source", &s.to_string());
            src = s.source();
        }
    }
    // The right password works; nothing that can be printed shows it.
    let url = format!("postgres://lh_pw:{SENTINEL}@127.0.0.1:{port}/postgres");
    common::psql(&pg, "GRANT CREATE ON SCHEMA public TO lh_pw").await;
    let config = PgConfig::from_url(&url).unwrap();
    assert_no_secret("PgConfig Display", &config.to_string());
    assert_no_secret("PgConfig Debug", &format!("{config:?}"));
    let table = PgLeaseStore::connect(&config).await.unwrap();
    table.migrate().await.unwrap();
    assert_no_secret("PgLeaseStore Debug", &format!("{table:?}"));
    let adv = PgAdvisoryStore::connect(&config).await.unwrap();
    assert_no_secret("PgAdvisoryStore Debug", &format!("{adv:?}"));
    let store = registry().open(&url).await.unwrap();
    assert_no_secret("store from factory", &format!("{store:?}"));
    let client = LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(10)).unwrap());
    let lease = client.try_acquire("job:secret").await.unwrap();
    assert_no_secret("lease Debug", &format!("{lease:?}"));
    assert_no_secret("client Debug", &format!("{client:?}"));
    lease.release().await.unwrap();

    // Unreachable: nothing listens there.
    let closed = leasehold_testkit::free_port();
    let e = registry()
        .open(&format!(
            "postgres://lh_pw:{SENTINEL}@127.0.0.1:{closed}/postgres"
        ))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    assert_no_secret("unreachable error", &format!("{e} {e:?}"));
    // A missing database is a configuration error.
    let e = registry()
        .open(&format!("postgres://postgres@127.0.0.1:{port}/no_such_db"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_role_and_missing_table() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let owner_url = pg.url();
    let table = common::table_store(&owner_url).await;
    let adv = PgAdvisoryStore::connect(&PgConfig::from_url(&owner_url).unwrap())
        .await
        .unwrap();
    adv.migrate().await.unwrap();
    guard::migrate(table.pool()).await.unwrap();
    common::psql(
        &pg,
        "CREATE ROLE lh_app LOGIN; \
         GRANT SELECT, INSERT, UPDATE ON leasehold_leases, leasehold_advisory, leasehold_records, leasehold_guard, leasehold_idempotency TO lh_app",
    )
    .await;
    let app_url = format!("postgres://lh_app@127.0.0.1:{}/postgres", pg.port());
    let config = PgConfig::from_url(&app_url).unwrap();
    let app_table = PgLeaseStore::connect(&config).await.unwrap();
    app_table
        .migrate()
        .await
        .expect("migrate needs no CREATE once done");
    let app_adv = PgAdvisoryStore::connect(&config).await.unwrap();
    app_adv.migrate().await.unwrap();
    let k = Key::new("job:least").unwrap();
    for store in [
        Arc::new(app_table.clone()) as Arc<dyn Store>,
        Arc::new(app_adv.clone()) as Arc<dyn Store>,
    ] {
        let o = OwnerToken::random();
        let ttl = Duration::from_secs(5);
        let AcquireOutcome::Acquired { fence, .. } = store.acquire(&k, &o, ttl).await.unwrap()
        else {
            panic!("{}: free key", store.backend())
        };
        assert!(matches!(
            store.renew(&k, &o, ttl).await.unwrap(),
            RenewOutcome::Renewed { .. }
        ));
        assert_eq!(store.inspect(&k).await.unwrap().unwrap().fence, fence);
        assert_eq!(store.list("job:").await.unwrap().len(), 1);
        assert_eq!(
            store.release(&k, &o).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert!(store.break_lease(&k).await.unwrap() > fence);
        let stored = store
            .put_record(&k, fence, b"least")
            .await
            .expect("records need SELECT, INSERT, UPDATE only");
        assert!(stored.fence >= fence);
        assert_eq!(store.get_record(&k).await.unwrap(), Some(stored));
    }
    let mut tx = app_table.pool().begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &name("ledger:least"), leasehold_core::Fence(1))
            .await
            .unwrap()
            .is_accepted()
    );
    guard::record_once(&mut tx, &name("job-least"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Without privileges on the table: a configuration error, not "busy".
    common::psql(&pg, "REVOKE ALL ON leasehold_leases FROM lh_app").await;
    let e = app_table
        .acquire(&k, &OwnerToken::random(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("permission"), "{e}");
    // A table that was never created: a configuration error that says what to do.
    let missing = PgLeaseStore::connect(
        &PgConfig::from_url(&format!("{owner_url}?leasehold_table=not_migrated")).unwrap(),
    )
    .await
    .unwrap();
    let e = missing
        .acquire(&k, &OwnerToken::random(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("migrate()"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_schema_and_table_names_and_corrupt_rows() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let url = format!(
        "{}?leasehold_schema=Lease%20Schema&leasehold_table=my%22leases&leasehold_migrate=true",
        pg.url()
    );
    let store = registry().open(&url).await.unwrap();
    let again = registry()
        .open(&url)
        .await
        .expect("migrating twice is fine");
    let k = Key::new("job:custom").unwrap();
    let o = OwnerToken::random();
    assert!(matches!(
        store.acquire(&k, &o, Duration::from_secs(5)).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert_eq!(again.inspect(&k).await.unwrap().unwrap().owner, o);
    let n = common::psql(
        &pg,
        "SELECT count(*) FROM \"Lease Schema\".\"my\"\"leases\"",
    )
    .await;
    assert_eq!(n, "1");
    let plain = PgLeaseStore::connect(&PgConfig::from_url(&pg.url()).unwrap())
        .await
        .unwrap();
    assert!(plain.schema_sql().contains("\"leasehold_leases\""));

    // A corrupted row is a typed error, never treated as free or overwritten.
    common::psql(
        &pg,
        "ALTER TABLE \"Lease Schema\".\"my\"\"leases\" DROP CONSTRAINT \"my\"\"leases_owner_check\"; \
         UPDATE \"Lease Schema\".\"my\"\"leases\" SET owner = '\\x0102'",
    )
    .await;
    let e = store.inspect(&k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    let r = store
        .acquire(&k, &OwnerToken::random(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(matches!(r, AcquireOutcome::Held { .. }), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_lock_id_sessions_and_names() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let admin = common::admin_pool(&pg).await;
    for key in ["", "job:a", "ünïcødé ✓", "{tag}x", &"k".repeat(512)] {
        let in_sql: i64 = sqlx::query_scalar(
            "SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint",
        )
        .bind(key)
        .fetch_one(&admin)
        .await
        .unwrap();
        assert_eq!(in_sql, advisory_lock_id(key), "{key:?}");
    }
    let store = PgAdvisoryStore::connect(
        &PgConfig::from_url(&pg.url())
            .unwrap()
            .application_name("billing"),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let k = Key::new("job:names").unwrap();
    let o = OwnerToken::random();
    store.acquire(&k, &o, Duration::from_secs(5)).await.unwrap();
    let app = store.application_name_for(&o);
    assert_eq!(app, format!("billing/{o}"));
    let (pid, lock_pid): (i32, i32) = sqlx::query_as(
        "SELECT a.pid, l.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid \
         WHERE a.application_name = $1 AND l.locktype = 'advisory' AND l.granted",
    )
    .bind(&app)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(pid, lock_pid);
    assert_eq!(store.lock_holders(), vec![(k.clone(), pid)]);
    let idle: String =
        sqlx::query_scalar("SELECT setting FROM pg_settings WHERE name = 'idle_session_timeout'")
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(idle, "0", "the server default is untouched");
    assert_eq!(
        store.release(&k, &o).await.unwrap(),
        ReleaseOutcome::Released
    );
    // The session is kept for reuse, renamed, and holds no lock.
    let (name, locks): (String, i64) = sqlx::query_as(
        "SELECT a.application_name, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory') \
         FROM pg_stat_activity a WHERE a.pid = $1",
    )
    .bind(pid)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!((name.as_str(), locks), ("billing", 0));
    // The next acquisition reuses it.
    let o2 = OwnerToken::random();
    store
        .acquire(&k, &o2, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(store.lock_holders(), vec![(k.clone(), pid)]);
    // A kept session that dies while idle is replaced transparently.
    assert_eq!(
        store.release(&k, &o2).await.unwrap(),
        ReleaseOutcome::Released
    );
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(killed);
    let o4 = OwnerToken::random();
    assert!(matches!(
        store
            .acquire(&k, &o4, Duration::from_secs(5))
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert_ne!(store.lock_holders()[0].1, pid);

    // A holder that does not renew loses its session on the server's clock.
    let k3 = Key::new("job:idle").unwrap();
    let o3 = OwnerToken::random();
    store
        .acquire(&k3, &o3, Duration::from_millis(300))
        .await
        .unwrap();
    let gone = common::eventually(Duration::from_secs(5), || async {
        store.inspect(&k3).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "idle_session_timeout ended the holder's session"
    );
    assert_eq!(
        store.renew(&k3, &o3, Duration::from_secs(1)).await.unwrap(),
        RenewOutcome::NotOwner
    );
    let _ = PgGuard::new();
}

/// A database leasehold's tables were never created in: every store call, a record call
/// and a guard check fail with a missing schema known by type (`is_schema_missing`, kind
/// `Config`), on both stores and in a schema that does not exist; a missing database is a
/// `Config` error that is not a missing schema. Migrating makes the calls work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_is_known_by_type() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    common::psql(&pg, "CREATE DATABASE fresh").await;
    let port = pg.port();
    let fresh = format!("postgres://postgres@127.0.0.1:{port}/fresh");
    let k = Key::new("job:fresh").unwrap();
    let ttl = Duration::from_secs(5);
    for url in [
        fresh.clone(),
        fresh.replace("postgres://", "postgres+advisory://"),
        format!("{fresh}?leasehold_schema=never_created"),
    ] {
        let store = registry().open(&url).await.expect(&url);
        let e = store
            .acquire(&k, &OwnerToken::random(), ttl)
            .await
            .unwrap_err();
        assert!(e.is_schema_missing(), "{url}: {e}");
        assert_eq!(e.kind(), StoreErrorKind::Config, "{url}: {e}");
        let e = store.get_record(&k).await.unwrap_err();
        assert!(e.is_schema_missing(), "{url}: {e}");
    }
    let table = PgLeaseStore::connect(&PgConfig::from_url(&fresh).unwrap())
        .await
        .unwrap();
    let mut tx = table.pool().begin().await.unwrap();
    let e = guard::check_and_advance(&mut tx, &name("ledger:fresh"), leasehold_core::Fence(1))
        .await
        .unwrap_err();
    assert!(e.is_schema_missing(), "{e}");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    drop(tx);
    table.migrate().await.unwrap();
    assert!(matches!(
        table.acquire(&k, &OwnerToken::random(), ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));

    let e = registry()
        .open(&format!("postgres://postgres@127.0.0.1:{port}/no_such_db"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(!e.is_schema_missing(), "{e}");
}
