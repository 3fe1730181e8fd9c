//! docs/faults.md rows 16 (PostgreSQL session killed), 18 (immediate shutdown under load, fsync
//! on) and 9 (clean restart: the lease table keeps its leases; the advisory store loses
//! them with their sessions, and its holder loses the lease at the shutdown, before the
//! restarted server can grant the lock to a contender probing every 2 ms: issue 24.3)
//! against a private PostgreSQL.

mod common;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::takeover::{
    Takeover, assert_lost_before_the_takeover, restart_takeover,
};
use leasehold_core::{
    AcquireOutcome, Fence, Key, LeaseClient, LeaseConfig, LostReason, OwnerToken, Store,
};
use leasehold_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use leasehold_postgres::sqlx::{self, Connection, PgConnection, PgPool};
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgGuard, guard, store_error};
use leasehold_testkit::PostgresOptions;
use leasehold_testkit::proof::{Backend, Fault, proves};
use tokio::time::{Instant, timeout};

fn name(s: &str) -> leasehold_core::ResourceName {
    leasehold_core::ResourceName::new(s).unwrap()
}

const TTL: Duration = Duration::from_secs(2);
/// A generous bound on waiting for something observable.
const LONG: Duration = Duration::from_secs(60);

/// Terminates every session named `app` and waits until they are gone. Returns how many.
async fn terminate(admin: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// docs/faults.md row 16, advisory lock: `pg_terminate_backend` on the holder's session (found by its
/// application_name) loses the lease within one renew interval; another owner then
/// acquires with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f16_advisory_holder_terminated_loses_within_one_renew_interval() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let admin = common::admin_pool(&pg).await;
    let store = PgAdvisoryStore::connect(&PgConfig::from_url(&pg.url()).unwrap())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let config = LeaseConfig::new(TTL).unwrap();
    let client = LeaseClient::new(Arc::new(store.clone()), config.clone());
    let lease = client.try_acquire("job:f16").await.unwrap();
    let app = store.application_name_for(lease.owner());
    let sessions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(sessions, 1, "the holder's session is named {app}");

    tokio::time::sleep(config.renew_interval() / 2).await;
    let killed_at = Instant::now();
    assert_eq!(terminate(&admin, &app).await, 1);
    let bound = config.renew_interval() + config.op_timeout() + Duration::from_millis(500);
    let reason = timeout(bound, lease.lost())
        .await
        .expect("lost within one renew interval of the session's end");
    assert_eq!(reason, LostReason::NotOwner);
    eprintln!("lost {:?} after the kill", killed_at.elapsed());
    assert!(!lease.is_valid());

    let next = client
        .try_acquire("job:f16")
        .await
        .expect("the lock is free");
    assert!(next.fence() > lease.fence());
    assert!(!lease.release().await.unwrap());
    assert!(next.release().await.unwrap());
}

/// docs/faults.md row 16, guard: a guarded write whose session is terminated before COMMIT rolls back
/// entirely (guard and data), and the commit error says the outcome is ambiguous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f16_guarded_write_in_killed_transaction_rolls_back() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let admin = common::admin_pool(&pg).await;
    guard::migrate(&admin).await.unwrap();
    sqlx::raw_sql("CREATE TABLE f16_data (v text NOT NULL)")
        .execute(&admin)
        .await
        .unwrap();
    let resource = "ledger:f16";
    let mut tx = admin.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &name(resource), Fence(10))
            .await
            .unwrap()
            .is_accepted()
    );
    sqlx::query("INSERT INTO f16_data VALUES ('committed')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let opts = PgConnectOptions::from_str(&pg.url())
        .unwrap()
        .application_name("f16-writer");
    let mut conn = PgConnection::connect_with(&opts).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &name(resource), Fence(20))
            .await
            .unwrap()
            .is_accepted()
    );
    sqlx::query("INSERT INTO f16_data VALUES ('killed')")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(terminate(&admin, "f16-writer").await, 1);
    let err = store_error(tx.commit().await.expect_err("commit on a killed session"));
    assert!(err.is_retryable(), "{err}");
    drop(conn);

    let mut c = admin.acquire().await.unwrap();
    assert_eq!(
        PgGuard::new()
            .current(&mut c, &name(resource))
            .await
            .unwrap(),
        Some(Fence(10)),
        "the guard advance rolled back"
    );
    let rows: Vec<String> = sqlx::query_scalar("SELECT v FROM f16_data")
        .fetch_all(&admin)
        .await
        .unwrap();
    assert_eq!(rows, vec!["committed".to_owned()]);
}

/// docs/faults.md row 16, lease table: killing the pool's sessions does not lose the lease: the next
/// renewal reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f16_table_lease_survives_killed_sessions() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let admin = common::admin_pool(&pg).await;
    let store = common::table_store(&format!("{}?application_name=f16-table", pg.url())).await;
    let config = LeaseConfig::new(TTL).unwrap();
    let client = LeaseClient::new(Arc::new(store.clone()), config.clone());
    let lease = client.try_acquire("job:f16-table").await.unwrap();
    tokio::time::sleep(config.renew_interval() + config.renew_interval() / 2).await;
    assert!(terminate(&admin, "f16-table").await >= 1);
    tokio::time::sleep(config.renew_interval() * 3).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.lost_reason());
    let info = store
        .inspect(&Key::new("job:f16-table").unwrap())
        .await
        .unwrap()
        .expect("still held");
    assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
    assert!(lease.release().await.unwrap());
}

/// docs/faults.md row 9 (PostgreSQL): a clean restart (fast shutdown, then a start on the
/// same data) under a held lease keeps it: the holder's lease stays valid throughout and
/// is renewed after the restart (the pool reconnects), the store shows the same owner and
/// fence, a contender asking every 5 ms from before the restart until after that renewal
/// is never granted it (and is refused by the restarted server), the holder still holds
/// it at its release, and the next fence is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f9_clean_restart_keeps_leases() {
    let _proof = proves(Backend::Postgres, Fault::RestartWithPersistence);
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let a = Arc::new(common::table_store(&pg.url()).await);
    let b = Arc::new(common::table_store(&pg.url()).await);
    let server = pg.clone();
    leasehold_conformance::restart::restart_under_a_held_lease(a, b, "job:f9", TTL, move || {
        server.restart()
    })
    .await;
}

/// docs/faults.md row 18: `pg_ctl stop -m immediate` (SIGQUIT) under load with fsync on. Every
/// acknowledged (committed) guarded write and guard value survives crash recovery, and the
/// next lease fence is above every acknowledged one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f18_immediate_shutdown_loses_no_acknowledged_write() {
    let _proof = proves(Backend::Postgres, Fault::RestartWithPersistence);
    let pg = Arc::new(common::start_pg(PostgresOptions::new().fsync(true)).await);
    assert_eq!(common::psql(&pg, "SHOW fsync").await, "on");
    let url = pg.url();
    let pool = PgPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&url)
        .await
        .unwrap();
    guard::migrate(&pool).await.unwrap();
    sqlx::raw_sql("CREATE TABLE f18_data (fence bigint PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let store = common::table_store(&url).await;

    let stop = Arc::new(AtomicBool::new(false));
    let next_fence = Arc::new(AtomicU64::new(1));
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let lease_fences = Arc::new(Mutex::new(Vec::<u64>::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (pool, stop, next_fence, acked, errors) = (
            pool.clone(),
            stop.clone(),
            next_fence.clone(),
            acked.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let fence = next_fence.fetch_add(1, Ordering::SeqCst);
                let attempt = async {
                    let mut tx = pool.begin().await?;
                    let d = guard::check_and_advance(&mut tx, &name("ledger:f18"), Fence(fence))
                        .await
                        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                    if d.is_accepted() {
                        sqlx::query("INSERT INTO f18_data (fence) VALUES ($1)")
                            .bind(fence as i64)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok::<bool, sqlx::Error>(true)
                    } else {
                        tx.rollback().await?;
                        Ok(false)
                    }
                };
                match timeout(Duration::from_secs(5), attempt).await {
                    Ok(Ok(true)) => acked.lock().unwrap().push(fence),
                    Ok(Ok(false)) => {}
                    _ => {
                        errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }));
    }
    {
        let (store, stop, lease_fences) = (store.clone(), stop.clone(), lease_fences.clone());
        tasks.push(tokio::spawn(async move {
            let key = Key::new("job:f18").unwrap();
            while !stop.load(Ordering::SeqCst) {
                let owner = OwnerToken::random();
                match timeout(Duration::from_secs(5), store.acquire(&key, &owner, TTL)).await {
                    Ok(Ok(AcquireOutcome::Acquired { fence, .. })) => {
                        lease_fences.lock().unwrap().push(fence.get());
                        let _ = timeout(Duration::from_secs(5), store.release(&key, &owner)).await;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }));
    }
    // Under load: guarded writes and lease grants acknowledged (however slowly they come).
    let loaded = Instant::now();
    while acked.lock().unwrap().len() < 20 || lease_fences.lock().unwrap().len() < 3 {
        assert!(loaded.elapsed() < LONG, "the load never got going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = acked.lock().unwrap().len();
    let p = pg.clone();
    tokio::task::spawn_blocking(move || p.stop_immediate())
        .await
        .unwrap();
    // Keep the load on the stopped server until writes are seen failing.
    let stopped = Instant::now();
    while errors.load(Ordering::SeqCst) == 0 {
        assert!(
            stopped.elapsed() < LONG,
            "no write failed while the server was down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let p = pg.clone();
    tokio::task::spawn_blocking(move || p.start_again())
        .await
        .unwrap();

    let admin = common::admin_pool(&pg).await;
    let acked = acked.lock().unwrap().clone();
    let stored: Vec<i64> = sqlx::query_scalar("SELECT fence FROM f18_data ORDER BY fence")
        .fetch_all(&admin)
        .await
        .unwrap();
    let stored: std::collections::BTreeSet<u64> = stored.into_iter().map(|f| f as u64).collect();
    for f in &acked {
        assert!(
            stored.contains(f),
            "acknowledged write {f} lost in the crash"
        );
    }
    let max_acked = acked.iter().copied().max().unwrap();
    let mut c = admin.acquire().await.unwrap();
    let current = PgGuard::new()
        .current(&mut c, &name("ledger:f18"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        current.get() >= max_acked,
        "guard {current} below acknowledged {max_acked}"
    );
    assert_eq!(
        Some(current.get()),
        stored.iter().copied().max(),
        "guard and data agree"
    );

    let max_lease = lease_fences.lock().unwrap().iter().copied().max().unwrap();
    let store = common::table_store(&pg.url()).await;
    // The last grant may still be held: the stop can cut off its release, and the server
    // may be back before its TTL has run out. Wait for the store to say the key is free,
    // as a waiter does; it never stays held longer than one TTL.
    let key = Key::new("job:f18").unwrap();
    let owner = OwnerToken::random();
    let waiting = Instant::now();
    let fence = loop {
        match store.acquire(&key, &owner, TTL).await.unwrap() {
            AcquireOutcome::Acquired { fence, .. } => break fence,
            AcquireOutcome::Held { remaining } => {
                let remaining = remaining.expect("the table store reports it");
                assert!(remaining <= TTL, "held for {remaining:?} after the crash");
                assert!(waiting.elapsed() < LONG, "the key never became free");
                tokio::time::sleep(remaining + Duration::from_millis(10)).await;
            }
        }
    };
    assert!(
        fence.get() > max_lease,
        "fence {fence} not above acknowledged {max_lease}"
    );
    eprintln!(
        "f18: {} guarded writes acknowledged ({before} before the stop), {} lease grants, all present",
        acked.len(),
        lease_fences.lock().unwrap().len()
    );
}

/// The contender probe of issue 24.3 on the advisory store
/// ([`leasehold_conformance::takeover`]): B is another store on the same server.
async fn advisory_restart_probe(key: &str, restart: fn(&leasehold_testkit::Postgres)) -> Takeover {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let config = PgConfig::from_str(&pg.url()).unwrap();
    let a = Arc::new(PgAdvisoryStore::connect(&config).await.unwrap());
    a.migrate().await.unwrap();
    let b = Arc::new(PgAdvisoryStore::connect(&config).await.unwrap());
    let server = pg.clone();
    let t = restart_takeover(a, b, key, TTL, move || restart(&server)).await;
    drop(pg); // The server lives until the probe has seen the takeover.
    t
}

/// Issue 24.3, docs/faults.md row 9 for advisory locks: a fast shutdown and restart of the server
/// (SIGINT: every session is ended, then a checkpoint, then a new postmaster) loses A's
/// lease at the shutdown, before the restarted server can grant the lock to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f9_advisory_restart_loses_the_lease_before_the_restarted_server_grants_it() {
    let _proof = proves(Backend::PostgresAdvisory, Fault::RestartWithPersistence);
    let t = advisory_restart_probe("job:f9-probe", |pg| pg.restart()).await;
    assert_lost_before_the_takeover(&t);
}

/// The same with the server killed (`kill -9` of the postmaster and its backends: the
/// kernel closes every session's socket) and started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f9_advisory_crash_restart_loses_the_lease_before_the_restarted_server_grants_it() {
    let _proof = proves(Backend::PostgresAdvisory, Fault::RestartWithPersistence);
    let t = advisory_restart_probe("job:f9-crash-probe", |pg| {
        pg.kill();
        pg.start_again();
    })
    .await;
    assert_lost_before_the_takeover(&t);
}

/// The server watch must end only when the server ends its sessions: a server-wide
/// `idle_session_timeout` (here 1 s) does not end it, so a lease held for longer is not
/// reported lost (the holder's own session sets its idle timeout to the TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_server_watch_outlives_a_server_idle_session_timeout() {
    let pg = common::start_pg(PostgresOptions::new().setting("idle_session_timeout", "1s")).await;
    let store = Arc::new(
        PgAdvisoryStore::connect(&PgConfig::from_str(&pg.url()).unwrap())
            .await
            .unwrap(),
    );
    store.migrate().await.unwrap();
    let client = LeaseClient::new(store.clone(), LeaseConfig::new(TTL).unwrap());
    let lease = client.try_acquire("job:idle-watch").await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.lost_reason());
    assert!(lease.release().await.unwrap());
}
