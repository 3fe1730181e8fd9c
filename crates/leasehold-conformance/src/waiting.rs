//! Waiting for a lease across store instances (as other processes would), one check for
//! every store whose `wait_released` is woken by a release made elsewhere (the SQL
//! stores). Not cases of the suite: the suite's fixture has one store instance, these need
//! several on the same database. Each takes `open`, which opens another store instance on
//! the same database or file each time it is called.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Backoff, Fence, Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome,
    Store, StoreError,
};
use rand::SeedableRng;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// A long holder TTL: a waiter that polled would wait for it.
pub const LONG_TTL: Duration = Duration::from_secs(30);
/// A generous bound on a wake-up that should take milliseconds.
pub const SOON: Duration = Duration::from_secs(3);

fn key(s: &str) -> Key {
    Key::new(format!("wait:{s}")).unwrap()
}

fn fence(o: AcquireOutcome) -> Fence {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// A client that, if it had to poll, would sleep for most of the holder's TTL: full jitter
/// over 20..30 s with a seeded generator whose first draws are long.
pub fn slow_polling_client(store: Arc<dyn Store>) -> LeaseClient {
    let config = LeaseConfig::builder(LONG_TTL)
        .backoff(Backoff::new(Duration::from_secs(30), Duration::from_secs(30)).unwrap())
        .build()
        .unwrap();
    LeaseClient::with_rng(store, config, rand::rngs::StdRng::seed_from_u64(7))
}

/// `store`'s [`WaitStore::wait_released`](leasehold_core::WaitStore::wait_released)`(k,
/// owner, t)` in a task of its own; panics when the store has no waiter.
pub fn spawn_wait_as(
    store: &Arc<dyn Store>,
    k: &Key,
    owner: &OwnerToken,
    t: Duration,
) -> JoinHandle<Result<(), StoreError>> {
    let (w, k, o) = (store.clone(), k.clone(), *owner);
    tokio::spawn(async move { wait(&*w).wait_released(&k, &o, t).await })
}

/// The store's waiter; panics when it has none (the waiting suite is for stores with one).
fn wait(store: &dyn Store) -> &dyn leasehold_core::WaitStore {
    store
        .waiter()
        .expect("the store has a waiter (Store::waiter)")
}

/// `wait_released` does not return while the lease is held, and returns soon after a
/// release made through another store instance; the woken waiter then gets the lease.
pub async fn woken_by_a_release_from_another_store(open: impl AsyncFn() -> Arc<dyn Store>) {
    let holder = open().await;
    let waiter = open().await;
    let k = key("release");
    let (h, w) = (OwnerToken::random(), OwnerToken::random());
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let wait = spawn_wait_as(&waiter, &k, &w, Duration::from_secs(60));
    sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished(), "wait_released returned while held");
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    let released = Instant::now();
    timeout(SOON, wait)
        .await
        .expect("woken soon after the release, not at the holder's expiry")
        .unwrap()
        .expect("wait_released ok");
    assert!(released.elapsed() < SOON);
    fence(waiter.acquire(&k, &w, LONG_TTL).await.unwrap());
}

/// A `LeaseClient` waiting with a backoff that would poll every 20..30 s gets the lease
/// within seconds of its release by another client on another store instance.
pub async fn waiting_client_gets_the_lease_at_its_release(open: impl AsyncFn() -> Arc<dyn Store>) {
    let holder = LeaseClient::new(open().await, LeaseConfig::new(LONG_TTL).unwrap());
    let waiter = slow_polling_client(open().await);
    let lease = holder.try_acquire("wait:handoff").await.unwrap();
    let first = lease.fence();
    let waiting = tokio::spawn(async move {
        waiter
            .acquire("wait:handoff", Duration::from_secs(120))
            .await
    });
    sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished());
    assert!(lease.release().await.unwrap());
    let released = Instant::now();
    let next = timeout(SOON, waiting)
        .await
        .expect("handed over soon after the release")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < SOON);
    assert!(next.fence() > first);
    assert!(next.release().await.unwrap());
}

/// `wait_released` returns when the lease is broken (by a third store instance), and when
/// it expires (at the holder's expiry, not before); the waiter whose turn came gets it.
pub async fn woken_by_break_and_expiry(open: impl AsyncFn() -> Arc<dyn Store>) {
    let holder = open().await;
    let waiter = open().await;
    let admin = open().await;

    let k = key("break");
    fence(
        holder
            .acquire(&k, &OwnerToken::random(), LONG_TTL)
            .await
            .unwrap(),
    );
    let wait = spawn_wait_as(&waiter, &k, &OwnerToken::random(), Duration::from_secs(60));
    sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished(), "wait_released returned while held");
    admin.break_lease(&k).await.unwrap();
    let broken = Instant::now();
    timeout(SOON, wait)
        .await
        .expect("woken soon after the break")
        .unwrap()
        .expect("wait_released ok");
    assert!(broken.elapsed() < SOON);

    // Expired: the holder (a bare store call, nothing renews it) holds for 2 s.
    let k = key("expiry");
    let ttl = Duration::from_secs(2);
    fence(
        holder
            .acquire(&k, &OwnerToken::random(), ttl)
            .await
            .unwrap(),
    );
    let acquired = Instant::now();
    let w = OwnerToken::random();
    let wait = spawn_wait_as(&waiter, &k, &w, Duration::from_secs(60));
    timeout(ttl + SOON, wait)
        .await
        .expect("woken soon after the holder's expiry")
        .unwrap()
        .expect("wait_released ok");
    assert!(
        acquired.elapsed() >= ttl - Duration::from_millis(100),
        "returned before the expiry: {:?}",
        acquired.elapsed()
    );
    fence(waiter.acquire(&k, &w, LONG_TTL).await.unwrap());
}

/// A wait ends at its timeout while the lease stays held: not before, and not long after.
pub async fn ends_at_its_timeout(open: impl AsyncFn() -> Arc<dyn Store>) {
    let holder = open().await;
    let waiter = open().await;
    let k = key("timeout");
    fence(
        holder
            .acquire(&k, &OwnerToken::random(), LONG_TTL)
            .await
            .unwrap(),
    );
    let t = Duration::from_millis(1500);
    let started = Instant::now();
    timeout(
        t + SOON,
        wait(&*waiter).wait_released(&k, &OwnerToken::random(), t),
    )
    .await
    .expect("the wait ends at its timeout")
    .unwrap();
    let took = started.elapsed();
    assert!(
        took >= t - Duration::from_millis(50),
        "ended early: {took:?}"
    );
    // Still held: the timeout, not a release, ended it.
    assert!(matches!(
        waiter
            .acquire(&k, &OwnerToken::random(), LONG_TTL)
            .await
            .unwrap(),
        AcquireOutcome::Held { .. }
    ));
}

/// One `#[tokio::test]` per shared wait check of this module, for a store's test file:
/// `setup` is evaluated at the start of each test and kept for its length (a private
/// server, a temporary directory); `open` is an async function taking `&` that value and
/// returning a new store instance (`Arc<dyn Store>`) on it, as another process would open.
///
/// ```ignore
/// leasehold_conformance::waiting_suite!(setup = common::start_db(), open = open);
/// ```
#[macro_export]
macro_rules! waiting_suite {
    (setup = $setup:expr, open = $open:expr) => {
        $crate::waiting_suite!(@one wait_released_is_woken_by_a_release_from_another_store,
            woken_by_a_release_from_another_store, $setup, $open);
        $crate::waiting_suite!(@one waiting_client_gets_the_lease_at_its_release,
            waiting_client_gets_the_lease_at_its_release, $setup, $open);
        $crate::waiting_suite!(@one wait_released_is_woken_by_break_and_expiry,
            woken_by_break_and_expiry, $setup, $open);
        $crate::waiting_suite!(@one wait_released_ends_at_its_timeout,
            ends_at_its_timeout, $setup, $open);
    };
    (@one $name:ident, $check:ident, $setup:expr, $open:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let env = $setup;
            $crate::waiting::$check(async || ($open)(&env).await).await;
        }
    };
}
