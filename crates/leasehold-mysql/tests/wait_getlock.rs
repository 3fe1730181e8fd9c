//! Waiting without polling on the `GET_LOCK` store (issue 14 item 6), against a private
//! MariaDB: a waiter queues in the server's own lock queue; the lock the server hands it is
//! reserved for its owner's acquire ([`GETLOCK_RESERVE_GRACE`]), and passed on when left
//! unclaimed. The shared wait checks (`leasehold_conformance::waiting`), then what is
//! particular to this store; and the clean-up of `leasehold_locks` (issue 14.5).
//!
//! Every store here is its own instance with its own sessions, as separate processes
//! would be. Time bounds are generous: they tell a wake-up from a poll, never measure speed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::waiting::{slow_polling_client, spawn_wait_as};
use leasehold_core::{AcquireOutcome, Key, OwnerToken, Store};
use leasehold_mysql::{GETLOCK_RESERVE_GRACE, MySqlGetLockStore};
use tokio::time::{Instant, sleep, timeout};

const LONG_TTL: Duration = Duration::from_secs(30);
const SOON: Duration = Duration::from_secs(3);

async fn open_getlock(db: &common::Server) -> MySqlGetLockStore {
    let s = MySqlGetLockStore::open(&format!(
        "mysql+getlock://root@127.0.0.1:{}/test?timeout=5s&connect_timeout=5s",
        db.port()
    ))
    .await
    .unwrap();
    assert!(s.waiter().is_some() && s.capabilities().fifo_wait);
    s
}

async fn open(db: &common::Server) -> Arc<dyn Store> {
    Arc::new(open_getlock(db).await)
}

fn held(o: AcquireOutcome) -> bool {
    matches!(o, AcquireOutcome::Held { .. })
}

// The checks every SQL store shares (`leasehold_conformance::waiting`).
leasehold_conformance::waiting_suite!(setup = common::start_db(), open = open);

/// The lock the server hands to a waiter is kept for that waiter's owner: a newcomer is
/// told `Held` meanwhile; left unclaimed, it goes to the next waiter after the grace
/// (not at the holder's expiry, 30 s away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_lock_is_kept_for_its_waiter_then_passed_on_if_unclaimed() {
    let db = common::start_db();
    let holder = open(&db).await;
    let k = Key::new("wait:reserved").unwrap();
    let h = OwnerToken::random();
    assert!(!held(holder.acquire(&k, &h, LONG_TTL).await.unwrap()));
    let idle = open(&db).await;
    let o = OwnerToken::random();
    let first = spawn_wait_as(&idle, &k, &o, Duration::from_secs(60));
    sleep(Duration::from_millis(700)).await;
    let patient = slow_polling_client(open(&db).await);
    let patient_task = {
        let k = k.clone();
        tokio::spawn(async move { patient.acquire(k, Duration::from_secs(120)).await })
    };
    sleep(Duration::from_millis(700)).await;
    assert!(!first.is_finished() && !patient_task.is_finished());
    holder.release(&k, &h).await.unwrap();
    let released = Instant::now();
    timeout(SOON, first).await.unwrap().unwrap().unwrap();
    // Reserved for `o`: nobody else gets past it, not even the holder that just left.
    assert!(held(
        holder
            .acquire(&k, &OwnerToken::random(), LONG_TTL)
            .await
            .unwrap()
    ));
    assert!(held(
        idle.acquire(&k, &OwnerToken::random(), LONG_TTL)
            .await
            .unwrap()
    ));
    // `o` never claims it: the next waiter gets it after the grace.
    let lease = timeout(GETLOCK_RESERVE_GRACE + SOON, patient_task)
        .await
        .expect("the next waiter gets the lease once the reservation lapses")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() >= GETLOCK_RESERVE_GRACE - Duration::from_millis(100));
    assert!(lease.release().await.unwrap());
}

/// A claimed reservation is a grant with a new fence, and the waiter's owner holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_reservation_is_a_grant_with_a_higher_fence() {
    let db = common::start_db();
    let (holder, waiter) = (open(&db).await, open(&db).await);
    let k = Key::new("wait:claimed").unwrap();
    let (h, w) = (OwnerToken::random(), OwnerToken::random());
    let AcquireOutcome::Acquired { fence: f1, .. } =
        holder.acquire(&k, &h, LONG_TTL).await.unwrap()
    else {
        panic!("not granted")
    };
    assert!(held(waiter.acquire(&k, &w, LONG_TTL).await.unwrap()));
    let wait = spawn_wait_as(&waiter, &k, &w, Duration::from_secs(60));
    sleep(Duration::from_millis(500)).await;
    holder.release(&k, &h).await.unwrap();
    timeout(SOON, wait).await.unwrap().unwrap().unwrap();
    let AcquireOutcome::Acquired { fence: f2, .. } =
        waiter.acquire(&k, &w, LONG_TTL).await.unwrap()
    else {
        panic!("the waiter's reservation was not granted to it")
    };
    assert!(f2 > f1, "{f1:?} then {f2:?}");
    let info = holder.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.owner, info.fence), (w, f2));
    // It stays held past the grace: the claim made it a lease.
    sleep(GETLOCK_RESERVE_GRACE + Duration::from_millis(500)).await;
    assert!(held(holder.acquire(&k, &h, LONG_TTL).await.unwrap()));
}

/// Growth (issue 14.5): `prune` deletes the rows of locks nobody holds whose fence is old
/// enough, never a held lock's row, and fences keep rising on a pruned key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_only_ended_leases_and_fences_still_rise() {
    let db = common::start_db();
    let store = open_getlock(&db).await;
    let pool = store.pool().clone();
    leasehold_conformance::growth::prune_deletes_only_ended_leases_and_fences_still_rise(
        &store,
        async |d| store.prune(d).await.unwrap(),
        async || common::keys_in(&pool, "leasehold_locks").await,
    )
    .await;
}

/// No duration makes it panic: a wait "forever" on a free key returns at once (the lock
/// is granted, reserved for the waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_of_any_length_is_accepted() {
    let db = common::start_db();
    let store = open(&db).await;
    let (k, o) = (Key::new("wait:forever").unwrap(), OwnerToken::random());
    let waiter = store.waiter().expect("a waiter");
    timeout(SOON, waiter.wait_released(&k, &o, Duration::MAX))
        .await
        .expect("a free key's wait returns at once")
        .unwrap();
    assert!(!held(store.acquire(&k, &o, LONG_TTL).await.unwrap()));
}
