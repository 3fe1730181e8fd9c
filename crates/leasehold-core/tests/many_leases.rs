//! Issue 10.10: one client holding many leases on a healthy store loses none. The renewal
//! scheduler's work per event grows with the logarithm of the number of leases, not with
//! the number itself (an earlier scheduler walked every lease at each wake-up and, with
//! 10,000 leases on Redis, lost 43 % of them in 30 s).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::{
    BatchStore, Key, LeaseClient, LeaseConfig, OwnerToken, RENEW_BATCH, RenewOutcome, Store,
    StoreError,
};

const N: usize = 10_000;

/// The memory store, counting the requests the scheduler sends to renew.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStore,
    /// `renew` calls (one lease each) and `renew_many` calls (a batch each).
    requests: AtomicUsize,
    /// Leases renewed, in whichever way.
    renewals: AtomicUsize,
    largest_batch: AtomicUsize,
}

#[async_trait]
impl leasehold_core::wrap::Forward for Counting {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        "counting"
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(key, owner, ttl).await
    }
    fn batch(&self) -> Option<&dyn BatchStore> {
        Some(self)
    }
}

/// A batch: the memory store's renewals (it has no batch of its own: each on its own, at
/// once), counted as one request.
#[async_trait]
impl BatchStore for Counting {
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.renewals.fetch_add(leases.len(), Ordering::Relaxed);
        self.largest_batch
            .fetch_max(leases.len(), Ordering::Relaxed);
        leasehold_core::renew_many(&self.inner, leases, ttl).await
    }
}

async fn hold_many(watchdog: bool, ttl: Duration, spread: Duration, hold: Duration) {
    let cfg = LeaseConfig::builder(ttl)
        .watchdog_thread(watchdog)
        .build()
        .unwrap();
    let store = Arc::new(Counting::default());
    let client = LeaseClient::new(store.clone(), cfg.clone());
    let mut leases = Vec::with_capacity(N);
    // Each lease is held at least `hold` (from the last grant to the count) and at most
    // the whole run: granting 10,000 leases takes longer than `spread` on a loaded
    // machine, and the first ones are renewed meanwhile.
    let started = tokio::time::Instant::now();
    for i in 0..N {
        leases.push(client.try_acquire(format!("many:{i}")).await.unwrap());
        // Spread the grants over the renew interval, so renewals are spread out too (each
        // is its own scheduler event).
        if i % 100 == 0 {
            tokio::time::sleep(spread / (N as u32 / 100)).await;
        }
    }
    tokio::time::sleep(hold).await;
    // Renewals go in batches: about N / RENEW_BATCH requests per renew interval, plus
    // the few that the coalescing window lets through (a scheduler sending each renewal
    // on its own makes N requests per interval).
    let interval = cfg.renew_interval().as_secs_f64();
    let intervals = started.elapsed().as_secs_f64() / interval + 1.0;
    let held_intervals = hold.as_secs_f64() / interval + 1.0;
    let requests = store.requests.load(Ordering::Relaxed) as f64;
    let per_interval = requests / intervals;
    assert!(
        per_interval <= (N / RENEW_BATCH) as f64 + 12.0,
        "{per_interval:.1} renewal requests per renew interval for {N} leases"
    );
    assert!(store.largest_batch.load(Ordering::Relaxed) <= RENEW_BATCH);
    // Renewing a little early to fill a batch costs at most one renewal in eight.
    let renewals = store.renewals.load(Ordering::Relaxed) as f64;
    assert!(
        renewals >= (N as f64) * (held_intervals - 2.0) && renewals <= (N as f64) * intervals * 1.2,
        "{renewals} renewals of {N} leases held {held_intervals:.1} to {intervals:.1} renew \
         intervals"
    );
    let lost: Vec<_> = leases
        .iter()
        .filter_map(|l| l.lost_reason().map(|r| (l.key().to_string(), r)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {N} leases lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    for lease in leases {
        assert!(lease.release().await.unwrap());
    }
}

/// Paused time: several renew intervals pass; every lease is renewed on time.
#[tokio::test(start_paused = true)]
async fn ten_thousand_leases_on_paused_time_lose_none() {
    hold_many(
        false,
        Duration::from_secs(3),
        Duration::from_secs(1),
        Duration::from_secs(20),
    )
    .await;
}

/// The real clock, with the watchdog thread: the scheduler must keep up with about 6,000
/// renewals a second. Asserts no loss, never a speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_on_the_real_clock_lose_none() {
    hold_many(
        true,
        Duration::from_secs(5),
        Duration::from_millis(1600),
        Duration::from_secs(12),
    )
    .await;
}
