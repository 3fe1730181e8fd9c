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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::waiting::{slow_polling_client, spawn_wait_as};
use leasehold_core::{
    AcquireOutcome, Backoff, Error, Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome,
    Store,
};
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
leasehold_conformance::waiting_suite!(setup = common::start_db(), open = open);

/// A waiter is queued when the holder releases: a newcomer's acquire right after the
/// release is told the lease is held, and the waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_take_the_lease_past_a_waiter() {
    let db = common::start_db();
    let holder = open(&db).await;
    let newcomer = open(&db).await;
    let waiter = slow_polling_client(open(&db).await);
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

/// 6 contenders, each on a store of its own (as 6 processes), loop on one key: acquire
/// with a wait, hold 3 ms, release, acquire again at once. Each gets its turns: over 120
/// grants, every contender has between half and one and a half times its share, and
/// never waits for more than 3 turns of any other contender in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_take_turns_in_arrival_order() {
    const CONTENDERS: usize = 6;
    const GRANTS: usize = 120;
    let db = common::start_db();
    let order = Arc::new(Mutex::new(Vec::<usize>::new()));
    let start = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
    let mut tasks = Vec::new();
    for i in 0..CONTENDERS {
        let client = LeaseClient::new(
            open(&db).await,
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

/// Two waiters on two store instances queue one after the other: released, the first
/// gets the lease, and the second only after the first released it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_waiters_are_served_in_arrival_order() {
    let db = common::start_db();
    let holder = open(&db).await;
    let k = key("fifo");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..2 {
        let client = slow_polling_client(open(&db).await);
        let (got, k) = (got.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.acquire(k, Duration::from_secs(120)).await.unwrap();
            got.lock().unwrap().push(i);
            sleep(Duration::from_millis(300)).await;
            assert!(lease.release().await.unwrap());
        }));
        // The first is in the queue before the second asks.
        sleep(Duration::from_millis(700)).await;
    }
    holder.release(&k, &h).await.unwrap();
    for t in tasks {
        timeout(SOON * 2, t).await.expect("both served").unwrap();
    }
    assert_eq!(*got.lock().unwrap(), vec![0, 1]);
}

/// A waiter that gives up (its wait runs out, or its acquire is cancelled) leaves the
/// queue: the next waiter gets the lease within seconds of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_the_queue() {
    let db = common::start_db();
    let holder = open(&db).await;
    let k = key("quitters");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let impatient = slow_polling_client(open(&db).await);
    let gave_up = impatient
        .acquire(k.as_str(), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(gave_up, Error::WaitTimeout { .. }), "{gave_up:?}");
    let cancelled = slow_polling_client(open(&db).await);
    let cancelled_task = {
        let k = k.clone();
        tokio::spawn(async move { cancelled.acquire(k, Duration::from_secs(120)).await })
    };
    let patient = slow_polling_client(open(&db).await);
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
