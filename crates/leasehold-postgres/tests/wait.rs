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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::waiting::{self, slow_polling_client};
use leasehold_core::{
    AcquireOutcome, Backoff, Error, Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome,
    Store,
};
use leasehold_postgres::sqlx::{self, PgPool};
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
use leasehold_testkit::{Postgres, PostgresOptions};
use tokio::time::{Instant, sleep, timeout};

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

/// The checks every SQL store shares (`leasehold_conformance::waiting`), each store
/// another connection pool, as another process would have.
async fn woken_by_release(kind: Kind) {
    let pg = server().await;
    waiting::woken_by_a_release_from_another_store(async || open(kind, &pg.url()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_wait_released_is_woken_by_a_release_from_another_connection() {
    woken_by_release(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_wait_released_is_woken_by_a_release_from_another_connection() {
    woken_by_release(Kind::Advisory).await;
}

async fn client_hand_off(kind: Kind) {
    let pg = server().await;
    waiting::waiting_client_gets_the_lease_at_its_release(async || open(kind, &pg.url()).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_waiting_client_gets_the_lease_at_its_release() {
    client_hand_off(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_waiting_client_gets_the_lease_at_its_release() {
    client_hand_off(Kind::Advisory).await;
}

async fn woken_by_break_and_expiry(kind: Kind) {
    let pg = server().await;
    waiting::woken_by_break_and_expiry(async || open(kind, &pg.url()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_wait_released_is_woken_by_break_and_expiry() {
    woken_by_break_and_expiry(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_wait_released_is_woken_by_break_and_expiry() {
    woken_by_break_and_expiry(Kind::Advisory).await;
}

/// A waiter is queued when the holder releases: a newcomer's acquire right after the
/// release is told the lease is held, and the waiter gets it.
async fn no_barging(kind: Kind) {
    let pg = server().await;
    let holder = open(kind, &pg.url()).await;
    let newcomer = open(kind, &pg.url()).await;
    let waiter = slow_polling_client(open(kind, &pg.url()).await);
    let k = key("barging");
    let h = OwnerToken::random();
    let first = fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let waiting = {
        let k = k.clone();
        tokio::spawn(async move { waiter.acquire(k, Duration::from_secs(120)).await })
    };
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    match newcomer
        .acquire(&k, &OwnerToken::random(), LONG_TTL)
        .await
        .unwrap()
    {
        AcquireOutcome::Held { remaining } => assert!(remaining.is_some()),
        other => panic!("a newcomer took the lease past the waiter: {other:?}"),
    }
    let lease = timeout(SOON, waiting).await.unwrap().unwrap().unwrap();
    assert!(lease.fence() > first);
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_a_newcomer_does_not_take_the_lease_past_a_waiter() {
    no_barging(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_newcomer_does_not_take_the_lease_past_a_waiter() {
    no_barging(Kind::Advisory).await;
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

/// 8 contenders, each on a store of its own (as 8 processes), loop on one key: acquire
/// with a wait, hold 3 ms, release, acquire again at once. Each gets its turns: over 160
/// grants, every contender has between half and one and a half times its share, and
/// never waits for more than 3 turns of any other contender in a row.
async fn fair_turns(kind: Kind) {
    const CONTENDERS: usize = 8;
    const GRANTS: usize = 160;
    let pg = server().await;
    let order = Arc::new(Mutex::new(Vec::<usize>::new()));
    let start = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
    let mut tasks = Vec::new();
    for i in 0..CONTENDERS {
        let client = LeaseClient::new(
            open(kind, &pg.url()).await,
            LeaseConfig::builder(Duration::from_secs(10))
                .backoff(
                    Backoff::new(Duration::from_millis(1), Duration::from_millis(100)).unwrap(),
                )
                .build()
                .unwrap(),
        );
        let (order, start) = (order.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            loop {
                if order.lock().unwrap().len() >= GRANTS {
                    return;
                }
                let lease = client
                    .acquire("wait:fair", Duration::from_secs(60))
                    .await
                    .expect("a turn within a minute");
                order.lock().unwrap().push(i);
                sleep(Duration::from_millis(3)).await;
                assert!(lease.release().await.unwrap());
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("the contenders finish")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    let mut turns: HashMap<usize, usize> = HashMap::new();
    for &i in &order[..GRANTS] {
        *turns.entry(i).or_default() += 1;
    }
    let share = GRANTS / CONTENDERS;
    let counts: Vec<usize> = (0..CONTENDERS)
        .map(|i| turns.get(&i).copied().unwrap_or(0))
        .collect();
    assert!(
        counts.iter().all(|&c| c >= share / 2 && c <= share * 3 / 2),
        "turns per contender {counts:?}, share {share}"
    );
    // Between two turns of one contender, no other contender has more than 3 turns.
    for i in 0..CONTENDERS {
        let mut since: HashMap<usize, usize> = HashMap::new();
        for &j in &order[..GRANTS] {
            if j == i {
                since.clear();
            } else {
                let n = since.entry(j).or_default();
                *n += 1;
                assert!(
                    *n <= 3,
                    "contender {i} waited while {j} had {n} turns: {order:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_contenders_take_turns_in_arrival_order() {
    fair_turns(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_contenders_take_turns_in_arrival_order() {
    fair_turns(Kind::Advisory).await;
}

/// A waiter that gives up (its wait runs out, or its acquire is cancelled) leaves the
/// queue: the next waiter gets the lease within seconds of the release.
async fn quitters_leave_the_queue(kind: Kind) {
    let pg = server().await;
    let holder = open(kind, &pg.url()).await;
    let k = key("quitters");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    // One waiter's wait runs out, another's acquire is cancelled, both queued first.
    let impatient = slow_polling_client(open(kind, &pg.url()).await);
    let gave_up = impatient
        .acquire(k.as_str(), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(gave_up, Error::WaitTimeout { .. }), "{gave_up:?}");
    let cancelled = slow_polling_client(open(kind, &pg.url()).await);
    let cancelled_task = {
        let k = k.clone();
        tokio::spawn(async move { cancelled.acquire(k, Duration::from_secs(120)).await })
    };
    let patient = slow_polling_client(open(kind, &pg.url()).await);
    let patient_task = {
        let k = k.clone();
        tokio::spawn(async move { patient.acquire(k, Duration::from_secs(120)).await })
    };
    sleep(Duration::from_millis(500)).await;
    cancelled_task.abort();
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    let released = Instant::now();
    let lease = timeout(SOON, patient_task)
        .await
        .expect("the patient waiter is not held up by those who left")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < SOON);
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_waiters_that_give_up_leave_the_queue() {
    quitters_leave_the_queue(Kind::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_waiters_that_give_up_leave_the_queue() {
    quitters_leave_the_queue(Kind::Advisory).await;
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
