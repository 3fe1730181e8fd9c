//! How the renewal scheduler groups renewals into requests, on tokio's paused clock (the
//! figures are exact): a batch with room left takes the renewals due within an eighth of
//! the renew interval, fills up to [`RENEW_BATCH`] and no further, never pulls a renewal
//! forward from further away, never renews a lease past its `max_renewals`, and never
//! sends a renewal for a lease whose deadline passed before the request went out.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::clock::ManualClock;
use leasehold_core::memory::MemoryStore;
use leasehold_core::{
    BatchStore, Key, LeaseClient, LeaseConfig, LostReason, OwnerToken, RENEW_BATCH, RenewOutcome,
    Store, StoreError,
};
use tokio::time::{Instant, sleep};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// Runs inside the first renewal request, before it reaches the store.
type Hook = Box<dyn FnOnce() + Send>;

/// The memory store, recording every renewal request: when it came (since the test's
/// start) and the keys it renewed.
struct Recording {
    inner: MemoryStore,
    start: Instant,
    requests: Mutex<Vec<(Duration, Vec<Key>)>>,
    on_first_request: Mutex<Option<Hook>>,
    /// How long the first batch request takes to answer (none: at once).
    first_reply_after: Mutex<Option<Duration>>,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recording")
            .field("requests", &self.requests)
            .finish_non_exhaustive()
    }
}

impl Recording {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            start: Instant::now(),
            requests: Mutex::default(),
            on_first_request: Mutex::default(),
            first_reply_after: Mutex::default(),
        })
    }

    fn record(&self, keys: Vec<Key>) {
        if let Some(hook) = self.on_first_request.lock().unwrap().take() {
            hook();
        }
        let at = Instant::now() - self.start;
        self.requests.lock().unwrap().push((at, keys));
    }

    /// Every request so far: when, and how many leases it renewed.
    fn sizes(&self) -> Vec<(Duration, usize)> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(at, k)| (*at, k.len())).collect()
    }

    /// When each renewal of `key` was sent.
    fn renewals_of(&self, key: &str) -> Vec<Duration> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|(_, keys)| keys.iter().any(|k| k.as_str() == key))
            .map(|(at, _)| *at)
            .collect()
    }
}

#[async_trait]
impl leasehold_core::wrap::Forward for Recording {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        "recording"
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.record(vec![key.clone()]);
        self.inner.renew(key, owner, ttl).await
    }
    fn batch(&self) -> Option<&dyn BatchStore> {
        Some(self)
    }
}

#[async_trait]
impl BatchStore for Recording {
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        self.record(leases.iter().map(|(k, _)| k.clone()).collect());
        let after = self.first_reply_after.lock().unwrap().take();
        if let Some(after) = after {
            sleep(after).await;
        }
        leasehold_core::renew_many(&self.inner, leases, ttl).await
    }
}

fn client(store: &Arc<Recording>, cfg: LeaseConfig) -> LeaseClient {
    LeaseClient::new(store.clone(), cfg)
}

/// A TTL of 3 s: renewals every second, a coalescing window of 125 ms. The watchdog
/// thread runs on the real clock, these tests on the paused one.
fn config() -> leasehold_core::LeaseConfigBuilder {
    LeaseConfig::builder(3 * S).watchdog_thread(false)
}

/// The same freeze with the first request still waiting for its reply when the second
/// batch is about to go, so nothing has ended the second batch's leases yet: the look at
/// the send finds them past their deadline (or exactly at it) and sends nothing.
#[tokio::test(start_paused = true)]
async fn a_batch_about_to_go_after_a_freeze_sends_nothing_at_or_past_the_deadline() {
    let cfg = config().build().unwrap();
    // Acquired at 0, due at 1 s: a suspend of `validity − 1 s` in the first request puts
    // the second batch's send at exactly its leases' deadline.
    for by in [5 * S, cfg.validity(3 * S) - S] {
        let store = Recording::new();
        let clock = Arc::new(ManualClock::new());
        let c = LeaseClient::builder(store.clone(), cfg.clone())
            .clock(clock.clone())
            .build();
        let mut leases = Vec::new();
        for i in 0..=RENEW_BATCH {
            leases.push(c.try_acquire(format!("slow:{i}")).await.unwrap());
        }
        *store.on_first_request.lock().unwrap() = Some(Box::new(move || clock.suspend(by)));
        *store.first_reply_after.lock().unwrap() = Some(10 * MS);
        sleep(S + 20 * MS).await;
        let sizes = store.sizes();
        assert_eq!(sizes.len(), 1, "suspended {by:?}: {sizes:?}");
        for l in &leases {
            assert!(!l.is_valid(), "{}", l.key());
        }
    }
}

/// Two leases acquired 50 ms apart are renewed together, in one request, at the first
/// one's renewal; a third, due 500 ms later (outside the window), is renewed at its own
/// time and not pulled forward.
#[tokio::test(start_paused = true)]
async fn renewals_due_within_the_window_share_a_request() {
    let store = Recording::new();
    let c = client(&store, config().build().unwrap());
    let a = c.try_acquire("batch:a").await.unwrap();
    sleep(50 * MS).await;
    let b = c.try_acquire("batch:b").await.unwrap();
    sleep(450 * MS).await;
    let far = c.try_acquire("batch:far").await.unwrap();
    sleep(1200 * MS).await;
    assert_eq!(
        store.sizes(),
        vec![(S, 2), (1500 * MS, 1)],
        "a and b renewed together at 1 s, far on its own at 1.5 s"
    );
    assert_eq!(store.renewals_of("batch:a"), vec![S]);
    assert_eq!(store.renewals_of("batch:b"), vec![S]);
    assert_eq!(store.renewals_of("batch:far"), vec![1500 * MS]);
    for l in [a, b, far] {
        assert!(l.is_valid());
        assert!(l.release().await.unwrap());
    }
}

/// One lease due, and `RENEW_BATCH` more due 10 ms later: the batch fills up to exactly
/// `RENEW_BATCH` leases, and the one left over goes at its own time. Coalescing never
/// adds a request (a batch overfilled by one would send a request of one lease at once).
#[tokio::test(start_paused = true)]
async fn coalescing_fills_a_batch_and_adds_no_request() {
    let store = Recording::new();
    let c = client(&store, config().build().unwrap());
    let mut leases = vec![c.try_acquire("fill:first").await.unwrap()];
    sleep(10 * MS).await;
    for i in 0..RENEW_BATCH {
        leases.push(c.try_acquire(format!("fill:{i}")).await.unwrap());
    }
    sleep(S + 50 * MS).await;
    assert_eq!(
        store.sizes(),
        vec![(S, RENEW_BATCH), (S + 10 * MS, 1)],
        "one full batch at 1 s, the one left over at its own time"
    );
    assert!(leases.iter().all(|l| l.is_valid()));
}

/// A lease that has used up its `max_renewals` is not renewed again by another lease's
/// batch: it is lost at its own renewal time (its maximum hold), after exactly
/// `max_renewals` renewals, while the lease whose batch it could have joined is renewed.
#[tokio::test(start_paused = true)]
async fn a_batch_never_takes_a_lease_past_its_max_renewals() {
    let store = Recording::new();
    let c = client(&store, config().max_renewals(2).build().unwrap());
    let t0 = Instant::now();
    let old = c.try_acquire("max:old").await.unwrap();
    // `old` renews at 1 s and 2 s, and is due again at 3 s with no renewal left. `young`
    // renews at 2.95 s: `old` is within its window then.
    sleep(1950 * MS).await;
    let young = c.try_acquire("max:young").await.unwrap();
    assert_eq!(old.lost().await, LostReason::MaxHoldExceeded);
    assert_eq!(Instant::now() - t0, 3 * S);
    assert_eq!(store.renewals_of("max:old"), vec![S, 2 * S]);
    assert_eq!(store.renewals_of("max:young"), vec![2950 * MS]);
    assert!(young.is_valid());
}

/// The process freezes while the first of two batches due at one instant goes out
/// (modelled by a suspend of the lease clock, from inside that request) until past every
/// lease's deadline: the second batch, looked at again when it is about to go, is not
/// sent — a renewal is never sent for a lease past its deadline — and every lease is lost.
#[tokio::test(start_paused = true)]
async fn a_freeze_while_sending_sends_no_renewal_past_its_deadline() {
    let store = Recording::new();
    let clock = Arc::new(ManualClock::new());
    let c = LeaseClient::builder(store.clone(), config().build().unwrap())
        .clock(clock.clone())
        .build();
    // One more lease than a batch holds, all due at 1 s: two batches.
    let mut leases = Vec::new();
    for i in 0..=RENEW_BATCH {
        leases.push(c.try_acquire(format!("freeze:{i}")).await.unwrap());
    }
    *store.on_first_request.lock().unwrap() = Some(Box::new(move || clock.suspend(5 * S)));
    sleep(S + 10 * MS).await;
    let sizes = store.sizes();
    assert_eq!(
        sizes.len(),
        1,
        "one request, sent before the freeze: {sizes:?}"
    );
    assert_eq!(sizes[0].0, S);
    for l in &leases {
        assert_eq!(l.lost_reason(), Some(LostReason::Expired), "{}", l.key());
    }
}
