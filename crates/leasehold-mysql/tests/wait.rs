//! Waiting without polling, in arrival order (issue 14 item 6), on the lease-table store
//! against a private MariaDB: what wakes a waiter (a release from another store instance,
//! a break, the holder's expiry), that a wait ends at its timeout, that nobody takes the
//! lease past the queue, that waiters take turns in the order they came (each on a store
//! of its own, as separate processes), and that a waiter who gives up does not hold up the
//! queue.
//!
//! Every store here is its own instance with its own connections, as separate processes
//! would be. Time bounds are generous: they tell a wake-up from a poll at the holder's
//! expiry (30 s away), never measure speed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::waiting::{slow_polling_client, spawn_wait_as};
use leasehold_core::{AcquireOutcome, Key, OwnerToken, Store};
use leasehold_mysql::{MySqlConfig, MySqlLeaseStore};
use tokio::time::{Instant, sleep, timeout};

/// A long holder TTL: a waiter that polled would wait for it.
const LONG_TTL: Duration = Duration::from_secs(30);
/// Generous bound on a wake-up that should take milliseconds.
const SOON: Duration = Duration::from_secs(3);

fn url(db: &common::Server) -> String {
    format!(
        "mysql://root@127.0.0.1:{}/test?timeout=5s&connect_timeout=5s&max_connections=4",
        db.port()
    )
}

async fn open(db: &common::Server) -> Arc<dyn Store> {
    let s = MySqlLeaseStore::connect(MySqlConfig::from_url(&url(db)).unwrap())
        .await
        .unwrap();
    assert!(s.waiter().is_some());
    Arc::new(s)
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

fn spawn_wait(
    store: &Arc<dyn Store>,
    k: &Key,
    t: Duration,
) -> tokio::task::JoinHandle<Result<(), leasehold_core::StoreError>> {
    spawn_wait_as(store, k, &OwnerToken::random(), t)
}

// The checks every SQL store shares (`leasehold_conformance::waiting`), each store
// instance another connection, as another process would have.
leasehold_conformance::waiting_suite!(
    fifo,
    contenders = 6,
    setup = common::start_db(),
    open = open,
    queue = common::queue
);

/// A bare `wait_released` (by an owner this store never told `Held`, so not a lease
/// client's) keeps its place in the queue but passes its turn on as soon as it comes: the
/// waiter behind it gets the lease soon after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_wait_passes_its_turn_on() {
    let db = common::start_db();
    let holder = open(&db).await;
    let k = key("unclaimed");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let idle = open(&db).await;
    let first = spawn_wait(&idle, &k, Duration::from_secs(60));
    sleep(Duration::from_millis(700)).await;
    let patient = slow_polling_client(open(&db).await);
    let patient_task = {
        let k = k.clone();
        tokio::spawn(async move { patient.acquire(k, Duration::from_secs(120)).await })
    };
    sleep(Duration::from_millis(700)).await;
    holder.release(&k, &h).await.unwrap();
    let released = Instant::now();
    timeout(SOON, first).await.unwrap().unwrap().unwrap();
    let lease = timeout(SOON, patient_task)
        .await
        .expect("the next waiter gets the lease once the unclaimed turn is given up")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < SOON);
    assert!(lease.release().await.unwrap());
}

/// An owner told `Held` that waits, gets its turn and then never acquires (its process
/// went on to something else) holds up the queue only for the grace period (500 ms; the
/// waiting session's 2 s `wait_timeout` is the backstop): the waiter behind it gets the
/// lease within seconds of the release, and meanwhile a newcomer is told to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_left_unclaimed_is_passed_on_after_the_grace_period() {
    let db = common::start_db();
    let holder = open(&db).await;
    let k = key("unclaimed");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let idle = open(&db).await;
    let o = OwnerToken::random();
    assert!(matches!(
        idle.acquire(&k, &o, LONG_TTL).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));
    let first = spawn_wait_as(&idle, &k, &o, Duration::from_secs(60));
    sleep(Duration::from_millis(700)).await;
    let patient = slow_polling_client(open(&db).await);
    let patient_task = {
        let k = k.clone();
        tokio::spawn(async move { patient.acquire(k, Duration::from_secs(120)).await })
    };
    sleep(Duration::from_millis(700)).await;
    holder.release(&k, &h).await.unwrap();
    let released = Instant::now();
    timeout(SOON, first).await.unwrap().unwrap().unwrap();
    // Its turn: a newcomer is told to wait while the turn is unclaimed.
    assert!(matches!(
        holder
            .acquire(&k, &OwnerToken::random(), LONG_TTL)
            .await
            .unwrap(),
        AcquireOutcome::Held { .. }
    ));
    let lease = timeout(SOON, patient_task)
        .await
        .expect("the next waiter gets the lease once the unclaimed turn is given up")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < SOON);
    assert!(lease.release().await.unwrap());
}
