//! `Lease::release_after` (ShedLock's `lockAtLeastFor`, docs/design.md §4.9): a hold that
//! ends early still keeps the key for the minimum period from the grant, and never less.
//! On tokio's paused clock with the memory store, which sets the expiry a renewal asks
//! for, and behind wrappers that delay a renewal or say the store cannot set the expiry.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::{
    Capabilities, Error, HoldEnd, Key, Lease, LeaseClient, LeaseConfig, LostReason, OwnerToken,
    RenewOutcome, Store, StoreError,
};
use tokio::time::{Instant, sleep, sleep_until};

const TTL: Duration = Duration::from_secs(3);

/// Renewed every second.
fn config() -> LeaseConfig {
    LeaseConfig::builder(TTL)
        .renew_interval(Duration::from_secs(1))
        .watchdog_thread(false)
        .build()
        .unwrap()
}

/// A client of `store` holding `job:nightly`, and the instant it was acquired.
async fn held(store: Arc<dyn Store>) -> (LeaseClient, Instant, Lease) {
    let client = LeaseClient::new(store, config());
    let start = Instant::now();
    let lease = client.try_acquire("job:nightly").await.unwrap();
    (client, start, lease)
}

/// Whether another owner can take `key` now.
async fn free(store: &dyn Store, key: &str) -> bool {
    let key = Key::new(key).unwrap();
    let other = OwnerToken::random();
    match store.acquire(&key, &other, TTL).await.unwrap() {
        leasehold_core::AcquireOutcome::Acquired { .. } => {
            store.release(&key, &other).await.unwrap();
            true
        }
        _ => false,
    }
}

#[tokio::test(start_paused = true)]
async fn a_hold_that_ends_early_leaves_the_lease_in_the_store_until_the_minimum_has_passed() {
    let store = Arc::new(MemoryStore::new());
    let (_client, start, lease) = held(store.clone()).await;
    sleep(Duration::from_millis(1500)).await;
    // Longer than the TTL: a renewal after this would cut it short.
    let min = Duration::from_secs(10);
    let end = lease.release_after(min).await.unwrap();
    assert_eq!(
        Instant::now(),
        start + Duration::from_millis(1500),
        "returns at once"
    );
    assert_eq!(end, HoldEnd::LeftToExpire { until: start + min });
    sleep_until(start + min - Duration::from_millis(1)).await;
    assert!(
        !free(&*store, "job:nightly").await,
        "taken before the minimum hold passed"
    );
    sleep_until(start + min).await;
    assert!(
        free(&*store, "job:nightly").await,
        "still held after the minimum hold"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hold_longer_than_the_minimum_is_released_at_once() {
    let store = Arc::new(MemoryStore::new());
    let (_client, _, lease) = held(store.clone()).await;
    sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lease.release_after(Duration::from_secs(2)).await.unwrap(),
        HoldEnd::Released
    );
    assert!(free(&*store, "job:nightly").await);
}

/// The memory store, whose first renewal reaches it only after 500 ms (a renewal in
/// flight when the hold ends).
#[derive(Debug, Default)]
struct SlowFirstRenewal {
    inner: MemoryStore,
    delayed: AtomicBool,
}

#[async_trait]
impl leasehold_core::wrap::Forward for SlowFirstRenewal {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        if !self.delayed.swap(true, Ordering::SeqCst) {
            sleep(Duration::from_millis(500)).await;
        }
        self.inner.renew(key, owner, ttl).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_renewal_in_flight_cannot_cut_the_minimum_hold_short() {
    let store = Arc::new(SlowFirstRenewal::default());
    let (_client, start, lease) = held(store.clone()).await;
    // The first renewal leaves at 1 s and reaches the store at 1.5 s (TTL 3 s: it would
    // set the expiry to 4.5 s).
    sleep(Duration::from_millis(1100)).await;
    let min = Duration::from_secs(10);
    let end = lease.release_after(min).await.unwrap();
    assert_eq!(end, HoldEnd::LeftToExpire { until: start + min });
    sleep_until(start + Duration::from_secs(5)).await;
    assert!(
        !free(&*store, "job:nightly").await,
        "cut short by the renewal in flight"
    );
    sleep_until(start + min).await;
    assert!(free(&*store, "job:nightly").await);
}

/// The memory store, saying it cannot set the expiry a renewal asks for (as etcd,
/// ZooKeeper, advisory locks).
#[derive(Debug, Default)]
struct FixedExpiry(MemoryStore);

impl leasehold_core::wrap::Forward for FixedExpiry {
    fn inner(&self) -> &dyn Store {
        &self.0
    }
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.0.capabilities();
        caps.sets_expiry = false;
        caps
    }
}

#[tokio::test(start_paused = true)]
async fn where_the_store_cannot_keep_it_the_holder_keeps_it_renewed_until_the_minimum_has_passed() {
    let store = Arc::new(FixedExpiry::default());
    let (_client, start, lease) = held(store.clone()).await;
    let min = Duration::from_secs(10);
    let releasing = tokio::spawn(lease.release_after(min));
    // Past several TTLs: renewed all along.
    sleep_until(start + min - Duration::from_millis(1)).await;
    assert!(!releasing.is_finished());
    assert!(!free(&*store, "job:nightly").await);
    assert_eq!(releasing.await.unwrap().unwrap(), HoldEnd::Released);
    assert_eq!(
        Instant::now(),
        start + min,
        "released the moment the minimum passed"
    );
    assert!(free(&*store, "job:nightly").await);
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_while_held_for_the_minimum_says_so() {
    let store = Arc::new(FixedExpiry::default());
    let (_client, _, lease) = held(store.clone()).await;
    let key = lease.key().clone();
    let releasing = tokio::spawn(lease.release_after(Duration::from_secs(10)));
    sleep(Duration::from_millis(100)).await;
    store.break_lease(&key).await.unwrap();
    match releasing.await.unwrap() {
        Err(Error::LeaseLost(LostReason::NotOwner)) => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_already_lost_is_not_left_in_the_store() {
    let store = Arc::new(MemoryStore::new());
    let (_client, _, lease) = held(store.clone()).await;
    store.break_lease(lease.key()).await.unwrap();
    sleep(Duration::from_millis(1100)).await; // the renewal finds it broken
    assert!(matches!(
        lease.release_after(Duration::from_secs(60)).await,
        Err(Error::LeaseLost(LostReason::NotOwner))
    ));
    assert!(free(&*store, "job:nightly").await);
}

#[tokio::test(start_paused = true)]
async fn held_for_counts_from_the_acquire() {
    let (_client, _, lease) = held(Arc::new(MemoryStore::new())).await;
    sleep(Duration::from_millis(1234)).await;
    assert_eq!(lease.held_for(), Duration::from_millis(1234));
}

/// The memory store, claiming to set the expiry asked but granting half of it.
#[derive(Debug, Default)]
struct GrantsHalf(MemoryStore);

#[async_trait]
impl leasehold_core::wrap::Forward for GrantsHalf {
    fn inner(&self) -> &dyn Store {
        &self.0
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.0.renew(key, owner, ttl / 2).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_grants_less_than_it_claims_is_an_error_and_nothing_is_released() {
    let store = Arc::new(GrantsHalf::default());
    let (_client, start, lease) = held(store.clone()).await;
    let err = lease
        .release_after(Duration::from_secs(10))
        .await
        .expect_err("granted half of what was asked");
    assert!(err.to_string().contains("granted"), "{err}");
    // Left to expire at what the store did grant (5 s), not released at once.
    sleep_until(start + Duration::from_millis(4900)).await;
    assert!(!free(&*store, "job:nightly").await);
    sleep_until(start + Duration::from_secs(5)).await;
    assert!(free(&*store, "job:nightly").await);
}
