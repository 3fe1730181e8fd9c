//! Waiting without polling, in arrival order (issue 14.3), on both stores against a
//! private PostgreSQL: what wakes a waiter (a release from another connection, a break,
//! the holder's expiry), that nobody takes the lease past the queue, that the turn is kept
//! for the owner a wait names, that waiters take turns in the order they came, that a waiter who gives up does not hold up the queue,
//! and that a release is not flushed to disk while an acquire is.
//!
//! Every store here is its own instance with its own connections, as separate processes
//! would be. Time bounds are generous: they tell a wake-up from a poll at the holder's
//! expiry (30 s away), never measure speed.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::waiting::slow_polling_client;
use leasehold_core::{
    AcquireOutcome, Backoff, Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome, Store,
};
use leasehold_postgres::sqlx::{self, PgPool};
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
use leasehold_testkit::{Postgres, PostgresOptions};
use tokio::time::{sleep, timeout};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Table,
    Advisory,
}

/// A long holder TTL: a waiter that polled would wait for it.
const LONG_TTL: Duration = Duration::from_secs(30);
/// Generous bound on a wake-up that should take milliseconds.
const SOON: Duration = Duration::from_secs(3);

async fn open(kind: Kind, url: &str) -> Arc<dyn Store> {
    let config = PgConfig::from_url(url).unwrap().pool_size(2);
    match kind {
        Kind::Table => {
            let s = PgLeaseStore::connect(&config).await.unwrap();
            s.migrate().await.unwrap();
            Arc::new(s)
        }
        Kind::Advisory => {
            let s = PgAdvisoryStore::connect(&config).await.unwrap();
            s.migrate().await.unwrap();
            Arc::new(s)
        }
    }
}

async fn server() -> Postgres {
    common::start_pg(PostgresOptions::new()).await
}

fn key(s: &str) -> Key {
    Key::new(format!("wait:{s}")).unwrap()
}

fn fence(o: AcquireOutcome) -> leasehold_core::Fence {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

async fn open_table(pg: &Postgres) -> Arc<dyn Store> {
    open(Kind::Table, &pg.url()).await
}

async fn open_advisory(pg: &Postgres) -> Arc<dyn Store> {
    open(Kind::Advisory, &pg.url()).await
}

// The checks every SQL store shares (`leasehold_conformance::waiting`), each store
// another connection pool, as another process would have; both stores keep a queue.
mod table {
    use super::*;
    leasehold_conformance::waiting_suite!(
        fifo,
        contenders = 8,
        setup = server().await,
        open = open_table,
        queue = common::table_queue
    );
}

mod advisory {
    use super::*;
    leasehold_conformance::waiting_suite!(
        fifo,
        contenders = 8,
        setup = server().await,
        open = open_advisory,
        queue = common::advisory_queue
    );
}

/// The turn is kept for the owner that `wait_released` names, whichever task calls: an
/// owner told `Held` waits in one task and acquires in another, and a newcomer right after
/// the release is told `Held` in between.
async fn turn_kept_for_the_named_owner(kind: Kind) {
    let pg = server().await;
    let holder = open(kind, &pg.url()).await;
    let newcomer = open(kind, &pg.url()).await;
    let waiter = open(kind, &pg.url()).await;
    let k = key("named");
    let (h, w) = (OwnerToken::random(), OwnerToken::random());
    let first = fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let told = waiter.acquire(&k, &w, LONG_TTL).await.unwrap();
    assert!(matches!(told, AcquireOutcome::Held { .. }), "{told:?}");
    // Each call in a task of its own. A contender's wait may return early (on the lease
    // table, when the store's listening connection comes up): its acquire then answers
    // `Held` and it waits again, as the holder side does.
    let mut early = 0;
    let wait = loop {
        let mut wait = {
            let (waiter, k) = (waiter.clone(), k.clone());
            tokio::spawn(async move {
                let waiter = waiter.waiter().expect("a waiter");
                waiter.wait_released(&k, &w, Duration::from_secs(60)).await
            })
        };
        let Ok(done) = timeout(Duration::from_secs(1), &mut wait).await else {
            break wait;
        };
        done.unwrap().expect("wait_released is supported");
        early += 1;
        assert!(early < 3, "wait_released keeps returning while held");
        let again = {
            let (waiter, k) = (waiter.clone(), k.clone());
            tokio::spawn(async move { waiter.acquire(&k, &w, LONG_TTL).await })
        };
        let told = again.await.unwrap().unwrap();
        assert!(matches!(told, AcquireOutcome::Held { .. }), "{told:?}");
    };
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    timeout(SOON, wait)
        .await
        .expect("woken soon after the release")
        .unwrap()
        .expect("wait_released is supported");
    match newcomer
        .acquire(&k, &OwnerToken::random(), LONG_TTL)
        .await
        .unwrap()
    {
        AcquireOutcome::Held { .. } => {}
        other => panic!("a newcomer took the turn kept for the waiter: {other:?}"),
    }
    let granted = {
        let k = k.clone();
        tokio::spawn(async move { waiter.acquire(&k, &w, LONG_TTL).await })
    };
    let next = fence(granted.await.unwrap().unwrap());
    assert!(next > first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_the_turn_is_kept_for_the_owner_named_by_the_wait() {
    turn_kept_for_the_named_owner(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_the_turn_is_kept_for_the_owner_named_by_the_wait() {
    turn_kept_for_the_named_owner(Kind::Advisory).await;
}

/// Whether everything written to the WAL so far is flushed to disk.
async fn wal_flushed(admin: &PgPool) -> bool {
    sqlx::query_scalar("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()")
        .fetch_one(admin)
        .await
        .unwrap()
}

/// With fsync on, a grant (one at a time) is flushed to disk before it answers: right
/// after it, the WAL is flushed up to its end. A release is not: right after it, the WAL
/// holds more than is flushed (until the WAL writer flushes it, a few times a second).
async fn releases_are_not_flushed(kind: Kind) {
    const N: usize = 40;
    let pg = common::start_pg(PostgresOptions::new().fsync(true)).await;
    let admin = common::admin_pool(&pg).await;
    let store = open(kind, &pg.url()).await;
    let keys: Vec<Key> = (0..N).map(|i| key(&format!("wal:{i}"))).collect();
    let owners: Vec<OwnerToken> = (0..N).map(|_| OwnerToken::random()).collect();
    // Warm up (first rows, prepared statements), then look.
    for (k, o) in keys.iter().zip(&owners) {
        fence(store.acquire(k, o, LONG_TTL).await.unwrap());
        store.release(k, o).await.unwrap();
    }
    let (mut acquires_flushed, mut releases_unflushed) = (0, 0);
    for (k, o) in keys.iter().zip(&owners) {
        fence(store.acquire(k, o, LONG_TTL).await.unwrap());
        acquires_flushed += usize::from(wal_flushed(&admin).await);
        assert_eq!(store.release(k, o).await.unwrap(), ReleaseOutcome::Released);
        releases_unflushed += usize::from(!wal_flushed(&admin).await);
    }
    assert!(
        acquires_flushed >= N - 2,
        "only {acquires_flushed} of {N} grants were on disk when they answered"
    );
    assert!(
        releases_unflushed >= N / 2,
        "{} of {N} releases were on disk when they answered: a release must not wait for \
         the disk",
        N - releases_unflushed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_release_is_not_flushed_but_acquire_is() {
    releases_are_not_flushed(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_release_is_not_flushed_but_acquire_is() {
    releases_are_not_flushed(Kind::Advisory).await;
}

/// A waiter outside any spawned task (the body of `#[tokio::main]`, polled by `block_on`)
/// keeps its place too: while 3 other contenders keep releasing and queueing again, it
/// gets the lease after at most a couple of turns of each.
fn waiter_in_block_on(kind: Kind) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pg = server().await;
        let holder = open(kind, &pg.url()).await;
        let k = key("main");
        let h = OwnerToken::random();
        fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
        let turns = Arc::new(Mutex::new(0usize));
        let mut busy = Vec::new();
        for _ in 0..3 {
            let client = LeaseClient::new(
                open(kind, &pg.url()).await,
                LeaseConfig::new(LONG_TTL).unwrap(),
            );
            let (turns, k) = (turns.clone(), k.clone());
            busy.push(tokio::spawn(async move {
                loop {
                    let lease = client.acquire(k.clone(), LONG_TTL).await.unwrap();
                    *turns.lock().unwrap() += 1;
                    sleep(Duration::from_millis(20)).await;
                    assert!(lease.release().await.unwrap());
                }
            }));
        }
        let me = slow_polling_client(open(kind, &pg.url()).await);
        {
            let (holder, k) = (holder.clone(), k.clone());
            tokio::spawn(async move {
                sleep(Duration::from_secs(1)).await;
                holder.release(&k, &h).await.unwrap();
            });
        }
        // Not spawned: polled by block_on on this thread.
        let lease = timeout(Duration::from_secs(20), me.acquire(k.clone(), LONG_TTL))
            .await
            .expect("the block_on waiter gets a turn")
            .unwrap();
        let others = *turns.lock().unwrap();
        assert!(others <= 6, "the other contenders had {others} turns first");
        for t in busy {
            t.abort();
        }
        assert!(lease.release().await.unwrap());
    });
}

#[test]
fn table_a_waiter_outside_any_task_keeps_its_place() {
    waiter_in_block_on(Kind::Table);
}

#[test]
fn advisory_a_waiter_outside_any_task_keeps_its_place() {
    waiter_in_block_on(Kind::Advisory);
}

/// `leasehold_wait_sessions` bounds the waiting sessions: with 1, three waiters on one store
/// still all get the lease in turn (those beyond the bound back off and retry); with 0,
/// the store says it cannot wait, and waiters back off and retry.
async fn wait_sessions_bound(kind: Kind) {
    let pg = server().await;
    let holder = open(kind, &pg.url()).await;
    let url = format!("{}?leasehold_wait_sessions=1", pg.url());
    let store = open(kind, &url).await;
    assert!(store.waiter().is_some());
    let k = key("bound");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let client = LeaseClient::new(
        store,
        LeaseConfig::builder(Duration::from_secs(5))
            .backoff(Backoff::new(Duration::from_millis(10), Duration::from_millis(200)).unwrap())
            .build()
            .unwrap(),
    );
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let (client, k) = (client.clone(), k.clone());
        waiters.push(tokio::spawn(async move {
            let lease = client.acquire(k, Duration::from_secs(60)).await.unwrap();
            sleep(Duration::from_millis(20)).await;
            assert!(lease.release().await.unwrap());
        }));
    }
    sleep(Duration::from_millis(500)).await;
    holder.release(&k, &h).await.unwrap();
    for w in waiters {
        timeout(Duration::from_secs(30), w)
            .await
            .expect("every waiter gets the lease")
            .unwrap();
    }

    let url = format!("{}?leasehold_wait_sessions=0", pg.url());
    let store = open(kind, &url).await;
    // No waiting sessions: the store offers no waiter (there is no wait to call).
    assert!(store.waiter().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_wait_sessions_bound_the_queue() {
    wait_sessions_bound(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_wait_sessions_bound_the_queue() {
    wait_sessions_bound(Kind::Advisory).await;
}
