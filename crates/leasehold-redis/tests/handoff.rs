//! The hand-off without a confirming acquire (docs/design.md section 11) on a private
//! `redis-server`: a waiter that heartbeats is granted the released lease for its own TTL
//! and holds it from the notice, with no acquire after it; its deadline counts from its
//! last heartbeat answered "still waiting", so it is never after the store's expiry, even
//! when the notice reaches it late; a waiter that stopped heartbeating is passed over.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::Standalone;
use leasehold_core::wrap::Forward;
use leasehold_core::{
    AcquireOutcome, Fence, Key, LeaseClient, LeaseConfig, OwnerToken, Store, StoreError,
    WaitOutcome, WaitStore,
};
use leasehold_redis::RedisStore;
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(5);

/// A waiter's view of the real store: counts its acquires, and can hold back the notice
/// of a grant (the answer of `wait_turn`) for a while, as a slow link or a paused process
/// would.
#[derive(Debug)]
struct Waiter {
    inner: Arc<RedisStore>,
    notice: Duration,
    acquires: AtomicUsize,
    handed: Mutex<Vec<Fence>>,
}

impl Waiter {
    fn new(inner: Arc<RedisStore>, notice: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner,
            notice,
            acquires: AtomicUsize::new(0),
            handed: Mutex::default(),
        })
    }
}

#[async_trait]
impl Forward for Waiter {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn waiter(&self) -> Option<&dyn WaitStore> {
        Some(self)
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(key, owner, ttl).await
    }
}

#[async_trait]
impl WaitStore for Waiter {
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.inner.wait_released(key, owner, timeout).await
    }

    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        let out = self.inner.wait_turn(key, owner, ttl, timeout).await?;
        if let WaitOutcome::Granted(g) = out {
            self.handed.lock().unwrap().push(g.fence);
            sleep(self.notice).await;
        }
        Ok(out)
    }
}

fn config() -> LeaseConfig {
    LeaseConfig::builder(TTL).build().expect("config")
}

/// Waits (observing the server, not sleeping) until `n` owners heartbeat in `k`'s queue:
/// each has its entry's deadline and the TTL it asked for in the entries' hash.
async fn queued(s: &Standalone, k: &Key, n: usize) {
    let qd = format!("{}:qd", s.store.lease_key(k));
    timeout(Duration::from_secs(10), async {
        while s.cli(&["HLEN", &qd]).await.trim() != (2 * n).to_string() {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} heartbeating waiters never queued"));
}

/// The server's clock (`TIME`) in ms.
async fn server_ms(s: &Standalone) -> u64 {
    let t = s.cli(&["TIME"]).await;
    let mut it = t.lines();
    let secs: u64 = it.next().unwrap().trim().parse().unwrap();
    let us: u64 = it.next().unwrap().trim().parse().unwrap();
    secs * 1000 + us / 1000
}

/// A waiter (its notices held back `notice`) acquiring `k` with a wait of `wait`, seen
/// queued with its heartbeats.
async fn waiting(
    s: &Standalone,
    k: &Key,
    notice: Duration,
    wait: Duration,
) -> (
    Arc<Waiter>,
    tokio::task::JoinHandle<Result<leasehold_core::Lease, leasehold_core::Error>>,
) {
    let w = Waiter::new(s.store.clone(), notice);
    let b = LeaseClient::new(w.clone(), config());
    let task = tokio::spawn({
        let k = k.clone();
        async move { b.acquire(&k, wait).await }
    });
    queued(s, k, 1).await;
    (w, task)
}

/// The holder: the key held by a fresh owner for `ttl` (straight on the store).
async fn hold(s: &Standalone, k: &Key, ttl: Duration) -> (OwnerToken, Fence) {
    let owner = OwnerToken::random();
    match s.store.acquire(k, &owner, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => (owner, fence),
        other => panic!("the key is free: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_holds_the_released_lease_from_the_notice_without_an_acquire() {
    let s = Standalone::start().await;
    let k = Key::new("handoff:plain").unwrap();
    let (a, a_fence) = hold(&s, &k, TTL).await;
    let (w, wait) = waiting(&s, &k, Duration::ZERO, Duration::from_secs(30)).await;
    let released = Instant::now();
    s.store.release(&k, &a).await.unwrap();
    let lease = wait.await.unwrap().expect("the waiter gets the lease");
    assert!(lease.fence() > a_fence);
    assert_eq!(w.handed.lock().unwrap().clone(), vec![lease.fence()]);
    assert_eq!(
        w.acquires.load(Ordering::SeqCst),
        1,
        "one acquire (answered Held), none to confirm the grant"
    );
    // Counted from a heartbeat sent before the release was.
    assert!(lease.valid_until() < released + config().validity(TTL));
    // Granted for the waiter's TTL, not the reservation grace.
    let info = s.store.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
    assert!(
        info.remaining
            .is_some_and(|r| r > TTL - Duration::from_secs(1)),
        "{info:?}"
    );
    assert!(lease.is_valid());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_notice_never_puts_the_deadline_past_the_stores_expiry() {
    let s = Standalone::start().await;
    let k = Key::new("handoff:late").unwrap();
    let (a, _) = hold(&s, &k, TTL).await;
    let late = Duration::from_secs(2);
    let (w, wait) = waiting(&s, &k, late, Duration::from_secs(30)).await;
    let released = Instant::now();
    s.store.release(&k, &a).await.unwrap();
    let lease = wait.await.unwrap().expect("the waiter gets the lease");
    assert!(released.elapsed() >= late);
    assert_eq!(w.acquires.load(Ordering::SeqCst), 1, "held from the notice");
    // The holder's deadline is taken before the store is read: its first renewal, due one
    // renew interval after the heartbeat, may be on the wire during the read, and a
    // deadline moved by a renewal the read did not see is no later than the expiry that
    // renewal set, not the one read (CI once compared the two: 1.95 s "after").
    let deadline = lease.valid_until();
    // The store's expiry, which only moves later while the lease is held, is at least the
    // reading's send plus the remaining TTL it reports.
    let read = Instant::now();
    let info = s.store.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.owner, *lease.owner());
    let expiry_at_least = read + info.remaining.expect("remaining");
    assert!(
        deadline <= expiry_at_least,
        "the holder's deadline is {:?} after the store's expiry",
        deadline - expiry_at_least
    );
    assert!(lease.is_valid());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_later_than_the_grants_ttl_is_not_trusted() {
    // The holder's TTL is long, so that the waiter's wait outlasts the notice's delay.
    let s = Standalone::start().await;
    let k = Key::new("handoff:lapsed").unwrap();
    let (a, _) = hold(&s, &k, Duration::from_secs(60)).await;
    let (w, wait) = waiting(
        &s,
        &k,
        TTL + Duration::from_millis(500),
        Duration::from_secs(60),
    )
    .await;
    s.store.release(&k, &a).await.unwrap();
    let lease = wait.await.unwrap().expect("the waiter gets the lease");
    let handed = w.handed.lock().unwrap().clone();
    assert_eq!(handed.len(), 1);
    assert!(
        lease.fence() > handed[0],
        "a new grant: the handed one had lapsed"
    );
    assert_eq!(
        w.acquires.load(Ordering::SeqCst),
        2,
        "confirmed by an acquire"
    );
    assert!(lease.is_valid());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_stopped_heartbeating_is_passed_over() {
    let s = Standalone::start().await;
    let k = Key::new("handoff:gone").unwrap();
    let (a, _) = hold(&s, &k, TTL).await;
    let (_, wait) = waiting(&s, &k, Duration::ZERO, Duration::from_secs(30)).await;
    // The waiter stops (as a crashed process would): no more heartbeats.
    wait.abort();
    let _ = wait.await;
    let stopped = server_ms(&s).await;
    // Its entry lives two heartbeat periods (500 ms for a 5 s TTL) after its last one: it
    // holds the queue up that long at most, not a TTL. Wait, on the server's clock, until
    // that has passed.
    let lease_key = s.store.lease_key(&k);
    let (q, qd) = (format!("{lease_key}:q"), format!("{lease_key}:qd"));
    let gone = s.cli(&["ZRANGE", &q, "0", "0"]).await.trim().to_owned();
    let deadline: u64 = s.cli(&["HGET", &qd, &gone]).await.trim().parse().unwrap();
    // (A heartbeat already on its way when the task stopped may land a moment after the
    // clock was read: 100 ms of slack, against the 5 s a TTL-long entry would live.)
    assert!(
        deadline <= stopped + 500 + 100,
        "the entry outlives the waiter by {} ms",
        deadline - stopped
    );
    timeout(Duration::from_secs(5), async {
        while server_ms(&s).await <= deadline {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the entry's deadline passes");
    s.store.release(&k, &a).await.unwrap();
    assert_eq!(
        s.store.inspect(&k).await.unwrap(),
        None,
        "released, not reserved for a waiter that went away"
    );
    let c = LeaseClient::new(s.store.clone(), config());
    let lease = c.try_acquire(&k).await.expect("free for the next comer");
    assert!(lease.release().await.unwrap());
}
