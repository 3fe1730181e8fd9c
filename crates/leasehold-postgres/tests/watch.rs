//! `Store::watch` on both PostgreSQL stores, against a private PostgreSQL: notices of
//! changes made by another store instance (another client, its own connections), no
//! `NOTIFY` at all for a key nobody watches, a lost connection or a server restart
//! reported (never a silent hang), and a dropped stream letting go of its lock and its
//! session.

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use leasehold_conformance::watching::{NOTICE_WITHIN, granted, noticed, quiet};
use leasehold_core::WatchStore;
use leasehold_core::{
    AcquireOutcome, Changes, Fence, Key, LeaseClient, LeaseConfig, OwnerToken, Store,
    StoreErrorKind,
};
use leasehold_postgres::sqlx::postgres::PgListener;
use leasehold_postgres::sqlx::{self, PgPool};
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
use leasehold_testkit::{FaultProxy, PostgresOptions, ProxyMode};
use tokio::time::timeout;

/// A lease's TTL in these tests: longer than any of them.
const TTL: Duration = Duration::from_secs(60);
/// How long "nothing comes" is watched for.
const QUIET: Duration = Duration::from_millis(800);

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

async fn advisory_store(url: &str) -> PgAdvisoryStore {
    let store = PgAdvisoryStore::connect(&PgConfig::from_url(url).unwrap())
        .await
        .expect("connect advisory store");
    store.migrate().await.expect("migrate");
    store
}

/// The watch sessions of the server (by `application_name`) and the shared advisory locks
/// they hold in the two-int4 form (the watch locks).
async fn watch_sessions_and_locks(admin: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%/watch'), \
           (SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
            WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ShareLock' \
              AND l.granted AND a.application_name LIKE '%/watch')",
    )
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Every change to the watched key made by *another* store instance (its own pool and
/// connections: another client) is noticed by the watching one: a grant, a release, the
/// next grant, a record write, a break, on the lease-table store; the same on the
/// advisory-lock store; and a record written through the advisory store is noticed by a
/// lease-table watcher of the same schema (they share the records table). A change to
/// another key is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_by_another_store_instance_are_noticed() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let watcher = common::table_store(&pg.url()).await;
    let other = common::table_store(&pg.url()).await;
    let k = key("watch:other-client");
    let mut changes = watcher.watch(&k).await.unwrap();
    let (a, b) = (OwnerToken::random(), OwnerToken::random());

    granted(&other, &key("watch:another-key"), &a, TTL).await;
    quiet(&mut changes, QUIET, "a grant of another key").await;
    granted(&other, &k, &a, TTL).await;
    noticed(&mut changes, "a grant").await;
    other.release(&k, &a).await.unwrap();
    noticed(&mut changes, "a release").await;
    granted(&other, &k, &b, TTL).await;
    noticed(&mut changes, "the next grant").await;
    other.put_record(&k, Fence(5), b"v").await.unwrap();
    noticed(&mut changes, "a record write").await;
    other.break_lease(&k).await.unwrap();
    noticed(&mut changes, "a break").await;

    // The advisory store, and the records table both stores share.
    let adv_watcher = advisory_store(&pg.url()).await;
    let adv_other = advisory_store(&pg.url()).await;
    let mut adv_changes = adv_watcher.watch(&k).await.unwrap();
    granted(&adv_other, &k, &a, TTL).await;
    noticed(&mut adv_changes, "an advisory grant").await;
    adv_other.release(&k, &a).await.unwrap();
    noticed(&mut adv_changes, "an advisory release").await;
    granted(&adv_other, &k, &b, TTL).await;
    noticed(&mut adv_changes, "the next advisory grant").await;
    adv_other.break_lease(&k).await.unwrap();
    noticed(&mut adv_changes, "an advisory break").await;
    // Both watchers hear of a record written through the advisory store.
    while let Ok(Some(_)) = timeout(Duration::from_millis(200), changes.next()).await {}
    adv_other.put_record(&k, Fence(6), b"w").await.unwrap();
    noticed(&mut changes, "a record written through the advisory store").await;
    noticed(
        &mut adv_changes,
        "a record written by another advisory store",
    )
    .await;
    // A record write that loses to a higher fence changes nothing.
    other.put_record(&k, Fence(1), b"old").await.unwrap();
    quiet(&mut changes, QUIET, "a record write refused by its fence").await;
}

/// An acquire of `k` by `b` refused (held by `a`), then `a`'s renewal: two calls that
/// change no holder, so they must notify nothing.
async fn refused_then_renewed(store: &dyn Store, k: &Key, a: &OwnerToken, b: &OwnerToken) {
    let refused = store.acquire(k, b, Duration::from_secs(60)).await.unwrap();
    assert!(
        matches!(refused, AcquireOutcome::Held { .. }),
        "{refused:?}"
    );
    store.renew(k, a, Duration::from_secs(60)).await.unwrap();
}

/// The hot path with nobody watching sends no `NOTIFY` at all: a test session listening
/// on the store's watch channel hears nothing while the store grants, releases, breaks
/// and writes records of unwatched keys (and nothing for a refused acquire or a renewal
/// of a watched key); once a key is watched, each change of it is one notice on that
/// channel whose payload is the documented 16 hex digits of SHA-256 of
/// `leasehold-watch`, the records table and the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_notified_for_keys_nobody_watches() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let admin = common::admin_pool(&pg).await;
    let table = common::table_store(&pg.url()).await;
    let advisory = advisory_store(&pg.url()).await;
    assert_eq!(table.watch_channel(), advisory.watch_channel());
    let mut ear = PgListener::connect(&pg.url()).await.unwrap();
    ear.listen(table.watch_channel()).await.unwrap();
    let heard = async |ear: &mut PgListener| {
        timeout(QUIET, ear.recv())
            .await
            .ok()
            .map(|n| n.unwrap().payload().to_owned())
    };

    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    let stores: [&dyn Store; 2] = [&table, &advisory];
    for store in stores {
        let k = key("unwatched");
        granted(store, &k, &a, TTL).await;
        refused_then_renewed(store, &k, &a, &b).await;
        store.release(&k, &a).await.unwrap();
        granted(store, &k, &b, TTL).await;
        store.break_lease(&k).await.unwrap();
        store.put_record(&k, Fence(1), b"v").await.unwrap();
        assert_eq!(heard(&mut ear).await, None, "{}", store.backend());
    }

    let k = key("watched");
    let _changes = table.watch(&k).await.unwrap();
    let expected: String = sqlx::query_scalar(
        "SELECT encode(substring(sha256(convert_to('leasehold-watch', 'UTF8') || '\\x00'::bytea \
           || convert_to($1, 'UTF8') || '\\x00'::bytea || convert_to($2, 'UTF8')) FROM 1 FOR 8), 'hex')",
    )
    .bind(table.records_table().sql())
    .bind(k.as_str())
    .fetch_one(&admin)
    .await
    .unwrap();
    for (store, fence) in stores.into_iter().zip([Fence(2), Fence(3)]) {
        granted(store, &k, &a, TTL).await;
        assert_eq!(heard(&mut ear).await.as_deref(), Some(&*expected), "grant");
        refused_then_renewed(store, &k, &a, &b).await;
        assert_eq!(
            heard(&mut ear).await,
            None,
            "a refused acquire and a renewal"
        );
        store.release(&k, &a).await.unwrap();
        assert_eq!(
            heard(&mut ear).await.as_deref(),
            Some(&*expected),
            "release"
        );
        store.put_record(&k, fence, b"v").await.unwrap();
        assert_eq!(heard(&mut ear).await.as_deref(), Some(&*expected), "record");
        store.break_lease(&k).await.unwrap();
        assert_eq!(heard(&mut ear).await.as_deref(), Some(&*expected), "break");
        granted(store, &key("unwatched"), &a, TTL).await;
        assert_eq!(heard(&mut ear).await, None, "another key");
    }
}

/// A watch whose connection is lost reports it, never hangs: through a fault proxy, a
/// blackholed connection (found by the session's ping), a reset connection and a server
/// restart each end the stream (an `Err` item, or its end) within a bound; after each,
/// watching again works and notices come. The server ends a watch session it no longer
/// hears from (behind the blackhole) by itself, releasing its watch lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_or_a_restart_ends_the_stream() {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let proxy = FaultProxy::start(pg.addr());
    let proxied = common::url_for(proxy.addr());
    let table = common::table_store(&proxied).await;
    let advisory = advisory_store(&proxied).await;
    let direct = common::table_store(&pg.url()).await;
    let admin = common::admin_pool(&pg).await;
    let k = key("watch:faults");
    let owner = OwnerToken::random();
    // The ping comes every 2 s and must answer within 10 s.
    let reported_within = Duration::from_secs(30);

    let ends = async |changes: &mut Changes, what: &str| {
        let found = timeout(reported_within, async {
            loop {
                match changes.next().await {
                    Some(Ok(())) => continue,
                    Some(Err(e)) => return Some(e),
                    None => return None,
                }
            }
        })
        .await;
        match found {
            Ok(Some(e)) => assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Unavailable
                        | StoreErrorKind::Timeout
                        | StoreErrorKind::Ambiguous
                ),
                "{what}: {e}"
            ),
            Ok(None) => {}
            Err(_) => {
                panic!("{what}: the watch neither failed nor ended within {reported_within:?}")
            }
        }
    };
    let works = async |store: &dyn WatchStore, what: &str| {
        let mut changes = store
            .watch(&k)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        granted(&direct, &k, &owner, TTL).await;
        noticed(&mut changes, what).await;
        direct.release(&k, &owner).await.unwrap();
        noticed(&mut changes, what).await;
    };
    let stores: [&dyn WatchStore; 2] = [&table, &advisory];

    for store in stores {
        let mut changes = store.watch(&k).await.unwrap();
        proxy.set_mode(ProxyMode::Blackhole);
        ends(&mut changes, "blackholed").await;
        // The client's goodbye cannot pass the blackhole: the server ends the silent
        // session itself (`idle_session_timeout`, 15 s after its last ping), and with it
        // the watch lock, so writers stop notifying.
        let ended = common::eventually(Duration::from_secs(25), || async {
            (watch_sessions_and_locks(&admin).await == (0, 0)).then_some(())
        })
        .await;
        assert!(ended.is_some(), "the server kept a silent watch session");
        proxy.set_mode(ProxyMode::Pass);
        works(store, "watching again after a blackhole").await;

        let mut changes = store.watch(&k).await.unwrap();
        proxy.set_mode(ProxyMode::Reset);
        ends(&mut changes, "reset").await;
        proxy.set_mode(ProxyMode::Pass);
        works(store, "watching again after a reset").await;
    }

    let mut table_changes = table.watch(&k).await.unwrap();
    let mut advisory_changes = advisory.watch(&k).await.unwrap();
    let p = pg.clone();
    tokio::task::spawn_blocking(move || p.restart())
        .await
        .unwrap();
    ends(&mut table_changes, "server restart (table)").await;
    ends(&mut advisory_changes, "server restart (advisory)").await;
    for store in stores {
        // The pools' first use after a restart may fail (a connection the server closed).
        let mut watched = None;
        for _ in 0..3 {
            match store.watch(&k).await {
                Ok(c) => {
                    watched = Some(c);
                    break;
                }
                Err(e) => assert!(e.is_retryable(), "{e}"),
            }
        }
        drop(watched.expect("watching after the restart"));
        works(store, "watching again after a restart").await;
    }
}

/// Dropping a stream lets go of what it held: its store's watch session holds one shared
/// lock per watched key while a stream watches it (two streams of one key, one lock), and
/// when the last stream is dropped the lock is released and the session closed (its task
/// ends). A `watch` call dropped before it returned (here: stuck behind a writer that
/// holds the key's watch lock) leaves nothing behind either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_streams_releases_the_lock_and_the_session() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let admin = common::admin_pool(&pg).await;
    let table = common::table_store(&pg.url()).await;
    let advisory = advisory_store(&pg.url()).await;
    let gone = async |what: &str| {
        common::eventually(Duration::from_secs(10), || async {
            (watch_sessions_and_locks(&admin).await == (0, 0)).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{what}: the watch session or its lock is still there"));
    };
    assert_eq!(watch_sessions_and_locks(&admin).await, (0, 0));
    let stores: [&dyn WatchStore; 2] = [&table, &advisory];
    for store in stores {
        let one = store.watch(&key("a")).await.unwrap();
        let two = store.watch(&key("a")).await.unwrap();
        let three = store.watch(&key("b")).await.unwrap();
        assert_eq!(
            watch_sessions_and_locks(&admin).await,
            (1, 2),
            "{}",
            store.backend()
        );
        drop(one);
        drop(three);
        let left = common::eventually(Duration::from_secs(10), || async {
            let now = watch_sessions_and_locks(&admin).await;
            (now == (1, 1)).then_some(now)
        })
        .await;
        assert_eq!(
            left,
            Some((1, 1)),
            "the lock of `a` is kept for its other stream"
        );
        drop(two);
        gone(store.backend()).await;
    }

    // A writer holds `stuck`'s watch lock (as a statement does until its commit), so a
    // watch of it waits; the caller gives up.
    let k = key("stuck");
    let tx = hold_watch_lock(&admin, &table, &k).await;
    assert!(
        timeout(Duration::from_millis(500), table.watch(&k))
            .await
            .is_err(),
        "a watch must wait for a writer's commit"
    );
    tx.commit().await.unwrap();
    gone("a watch call dropped while it waited").await;
}

/// Holds `k`'s watch lock exclusively in a transaction of the admin pool (as a writer's
/// statement does until it commits), computed from the documented formula.
async fn hold_watch_lock(
    admin: &PgPool,
    store: &PgLeaseStore,
    k: &Key,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = admin.begin().await.unwrap();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(('x' || encode(substring(d FROM 1 FOR 4), 'hex'))::bit(32)::int4, \
           ('x' || encode(substring(d FROM 5 FOR 4), 'hex'))::bit(32)::int4) \
         FROM (SELECT sha256(convert_to('leasehold-watch', 'UTF8') || '\\x00'::bytea \
           || convert_to($1, 'UTF8') || '\\x00'::bytea || convert_to($2, 'UTF8')) AS d) s",
    )
    .bind(store.records_table().sql())
    .bind(k.as_str())
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// Setting a watch up is bounded: a watch lock that another transaction keeps from it
/// for longer than the watch session's lock timeout (8 s) fails that one watch with
/// `Busy`, well within 10 s, and the other watches of the same session go on noticing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_kept_from_its_lock_fails_alone_and_in_time() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let admin = common::admin_pool(&pg).await;
    let table = common::table_store(&pg.url()).await;
    let other = common::table_store(&pg.url()).await;
    let fine = key("fine");
    let mut changes = table.watch(&fine).await.unwrap();
    let stuck = key("stuck");
    let tx = hold_watch_lock(&admin, &table, &stuck).await;
    let started = tokio::time::Instant::now();
    let err = timeout(Duration::from_secs(30), table.watch(&stuck))
        .await
        .expect("setting a watch up is bounded")
        .map(drop)
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Busy, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    tx.rollback().await.unwrap();
    let owner = OwnerToken::random();
    granted(&other, &fine, &owner, TTL).await;
    noticed(
        &mut changes,
        "a grant on the same session after another watch failed",
    )
    .await;
    assert_eq!(
        watch_sessions_and_locks(&admin).await,
        (1, 1),
        "the failed watch holds nothing"
    );
}

/// `Election::observe` on PostgreSQL follows the notices: with an interval of an hour, a
/// campaign and a resignation made through another store instance are each seen within
/// seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_follows_notices_from_another_client() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let config = LeaseConfig::new(Duration::from_secs(3)).unwrap();
    let observer = LeaseClient::new(
        Arc::new(common::table_store(&pg.url()).await) as Arc<dyn Store>,
        config.clone(),
    );
    let campaigner = LeaseClient::new(
        Arc::new(common::table_store(&pg.url()).await) as Arc<dyn Store>,
        config,
    );
    let mut seen = Box::pin(
        observer
            .election("leader:watched")
            .unwrap()
            .observe(Duration::from_secs(3600)),
    );
    let mut next = async || {
        timeout(NOTICE_WITHIN, seen.next())
            .await
            .expect("a change is seen at once, not at the next poll")
            .unwrap()
            .unwrap()
    };
    assert_eq!(next().await, None);
    let election = campaigner.election("leader:watched").unwrap();
    let leadership = election.campaign("a", Duration::ZERO).await.unwrap();
    let mut leader = next().await.expect("a leader");
    if leader.value.is_none() {
        // The grant, then the value published a moment later.
        leader = next().await.expect("a leader");
    }
    assert_eq!(
        (leader.term, leader.value),
        (leadership.term(), Some(b"a".to_vec()))
    );
    leadership.resign().await.unwrap();
    assert_eq!(next().await, None);
}

/// Top-level statements that name `table`, as `pg_stat_statements` counts them since its
/// last reset.
async fn statements_on(admin: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
         WHERE query LIKE '%' || $1 || '%' AND query NOT LIKE '%pg_stat_statements%'",
    )
    .bind(table)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Watching adds no statement (so no round trip) to the hot path, watched or not: as
/// `pg_stat_statements` counts them, 10 grants and releases of the lease table are 20
/// statements whether the key is watched or not, and the advisory store's are as many
/// watched as unwatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_path_sends_no_statement_more_watched_or_not() {
    let pg = common::start_pg(
        PostgresOptions::new().setting("shared_preload_libraries", "pg_stat_statements"),
    )
    .await;
    let admin = common::admin_pool(&pg).await;
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&admin)
        .await
        .unwrap();
    let table = common::table_store(&pg.url()).await;
    let advisory = advisory_store(&pg.url()).await;
    let watcher = common::table_store(&pg.url()).await;
    let owner = OwnerToken::random();
    let stores: [(&dyn Store, &str); 2] = [
        (&table, "leasehold_leases"),
        (&advisory, "leasehold_advisory"),
    ];
    for (store, name) in stores {
        let mut counts = Vec::new();
        for watched in [false, true] {
            let k = key(if watched {
                "hot:watched"
            } else {
                "hot:unwatched"
            });
            let changes = if watched {
                Some(watcher.watch(&k).await.unwrap())
            } else {
                None
            };
            // Warm up (the advisory store's first acquire opens its session).
            granted(store, &k, &owner, TTL).await;
            store.release(&k, &owner).await.unwrap();
            sqlx::raw_sql("SELECT pg_stat_statements_reset()")
                .execute(&admin)
                .await
                .unwrap();
            for _ in 0..10 {
                granted(store, &k, &owner, TTL).await;
                store.release(&k, &owner).await.unwrap();
            }
            counts.push(statements_on(&admin, name).await);
            drop(changes);
        }
        assert_eq!(counts[0], counts[1], "{name}: unwatched, watched");
        if name == "leasehold_leases" {
            assert_eq!(counts[0], 20, "one statement per acquire and per release");
        }
    }
}
