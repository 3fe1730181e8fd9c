//! The hand-off without a confirming acquire (docs/design.md, "Hand-off without a
//! confirming acquire"), on tokio's paused clock: a lease a store hands to a waiting owner
//! ([`WaitOutcome::Granted`]) is valid from the send of the waiter's last request the
//! store answered "still waiting" — never from anything later — and a notice that comes
//! too late to leave any validity is confirmed by an acquire instead of trusted.
//!
//! The store here is the memory store with a waiter that hands the lease over the way a
//! queueing store does: when the key is released it grants it to the waiting owner at
//! once, then tells it, `notice` later, with the send instant of a "still waiting"
//! request made `before` ahead of the grant.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::wrap::Forward;
use leasehold_core::{
    AcquireOutcome, HandedGrant, Key, LeaseClient, LeaseConfig, OwnerToken, RenewOutcome, Store,
    StoreError, WaitOutcome, WaitStore,
};
use tokio::time::{Instant, sleep};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Handing {
    mem: MemoryStore,
    /// How long before the grant the waiter's last "still waiting" request was sent.
    before: Duration,
    /// How long the notice of the grant takes to reach the waiter.
    notice: Duration,
    /// Every acquire and renewal the clients sent: operation, owner, when.
    calls: Mutex<Vec<(&'static str, OwnerToken, Instant)>>,
    /// The grants handed over: owner, fence.
    handed: Mutex<Vec<(OwnerToken, leasehold_core::Fence)>>,
}

impl Handing {
    fn new(before: Duration, notice: Duration) -> Arc<Self> {
        Arc::new(Self {
            mem: MemoryStore::new(),
            before,
            notice,
            calls: Mutex::default(),
            handed: Mutex::default(),
        })
    }

    fn times(&self, op: &str, owner: &OwnerToken) -> Vec<Instant> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(o, w, _)| *o == op && w == owner)
            .map(|(_, _, t)| *t)
            .collect()
    }

    fn log(&self, op: &'static str, owner: &OwnerToken) {
        let mut calls = self.calls.lock().unwrap();
        calls.push((op, *owner, Instant::now()));
    }
}

#[async_trait]
impl Forward for Handing {
    fn inner(&self) -> &dyn Store {
        &self.mem
    }

    fn waiter(&self) -> Option<&dyn WaitStore> {
        Some(self)
    }

    fn capabilities(&self) -> leasehold_core::Capabilities {
        let mut c = self.mem.capabilities();
        c.hands_off = true;
        c
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.log("acquire", owner);
        self.mem.acquire(key, owner, ttl).await
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.log("renew", owner);
        self.mem.renew(key, owner, ttl).await
    }
}

#[async_trait]
impl WaitStore for Handing {
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.mem.wait_released(key, owner, timeout).await
    }

    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        self.mem.wait_released(key, owner, timeout).await?;
        // The store's grant, at the release.
        let granted_at = Instant::now();
        let AcquireOutcome::Acquired { fence, ttl } = self.mem.acquire(key, owner, ttl).await?
        else {
            return Ok(WaitOutcome::Retry);
        };
        self.handed.lock().unwrap().push((*owner, fence));
        sleep(self.notice).await;
        Ok(WaitOutcome::Granted(HandedGrant {
            fence,
            ttl,
            waiting_sent_at: granted_at - self.before,
        }))
    }
}

fn config() -> LeaseConfig {
    LeaseConfig::builder(TTL)
        .op_timeout(S)
        .build()
        .expect("config")
}

fn key() -> Key {
    Key::new("handoff").unwrap()
}

/// Holder `a` holds the key (with a TTL of 30 s, so that `b`'s wait is bounded well past
/// every notice here); `b` waits for it; `a` releases `hold` later. Returns `b`'s lease,
/// the instant of the release, and `a`'s fence.
async fn hand_off(
    store: &Arc<Handing>,
    hold: Duration,
) -> (leasehold_core::Lease, Instant, leasehold_core::Fence) {
    let b = LeaseClient::new(store.clone(), config());
    hand_off_to(store, b, hold, || {}).await
}

/// As [`hand_off`], to waiter `b`, calling `meanwhile` half-way through the hold.
async fn hand_off_to(
    store: &Arc<Handing>,
    b: LeaseClient,
    hold: Duration,
    meanwhile: impl FnOnce(),
) -> (leasehold_core::Lease, Instant, leasehold_core::Fence) {
    let long = LeaseConfig::builder(30 * S).build().expect("config");
    let a = LeaseClient::new(store.clone(), long);
    let first = a.try_acquire(key()).await.expect("a acquires");
    let waiter = tokio::spawn(async move { b.acquire(key(), 60 * S).await });
    sleep(hold / 2).await;
    meanwhile();
    sleep(hold - hold / 2).await;
    let released_at = Instant::now();
    let fence = first.fence();
    assert!(first.release().await.unwrap());
    let lease = waiter.await.unwrap().expect("b gets the lease");
    (lease, released_at, fence)
}

#[tokio::test(start_paused = true)]
async fn a_handed_lease_is_valid_from_the_last_still_waiting_send_and_needs_no_acquire() {
    let store = Handing::new(300 * MS, 2 * MS);
    let (lease, released_at, before) = hand_off(&store, 4 * S).await;
    let owner = *lease.owner();
    assert_eq!(
        store.handed.lock().unwrap().clone(),
        vec![(owner, lease.fence())]
    );
    assert!(lease.fence() > before);
    // From the "still waiting" send, 300 ms before the grant: not from the grant, nor
    // from the notice's arrival.
    let cfg = config();
    assert_eq!(
        lease.valid_until(),
        released_at - 300 * MS + cfg.validity(TTL),
        "validity counted from the still-waiting send"
    );
    // One acquire (the one answered Held), none to confirm the grant.
    assert_eq!(store.times("acquire", &owner).len(), 1);
    assert!(lease.is_valid());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn the_first_renewal_of_a_handed_lease_counts_from_the_still_waiting_send() {
    let store = Handing::new(2 * S, Duration::ZERO);
    let (lease, released_at, _) = hand_off(&store, 4 * S).await;
    sleep(5 * S).await;
    let renews = store.times("renew", lease.owner());
    let interval = config().renew_interval_for(TTL);
    // (The scheduler works in whole milliseconds.)
    let first = renews.first().map(|t| *t - released_at);
    assert!(
        first.is_some_and(|f| f >= interval - 2 * S && f <= interval - 2 * S + MS),
        "first renewal one interval after the still-waiting send: {first:?}"
    );
    assert!(lease.is_valid(), "lost: {:?}", lease.lost_reason());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_notice_that_leaves_no_validity_is_confirmed_by_an_acquire() {
    // The notice arrives after the validity counted from the still-waiting send, but
    // while the store still holds the grant: the waiter does not trust it and confirms
    // with an acquire as its owner, which extends the grant with the same fence.
    let cfg = config();
    let notice = cfg.validity(TTL) - 5 * S;
    let store = Handing::new(5 * S, notice);
    let (lease, released_at, _) = hand_off(&store, S).await;
    let owner = *lease.owner();
    let handed = store.handed.lock().unwrap().clone();
    assert_eq!(handed, vec![(owner, lease.fence())], "the same grant");
    let acquires = store.times("acquire", &owner);
    assert_eq!(acquires.len(), 2, "the Held one and the confirming one");
    let confirmed = acquires[1];
    assert_eq!(confirmed - released_at, notice);
    assert_eq!(lease.valid_until(), confirmed + cfg.validity(TTL));
    assert!(lease.is_valid());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_notice_after_the_grant_expired_is_not_trusted() {
    // A waiter paused past the whole TTL of the grant made for it: the notice it reads
    // on resume names a grant the store no longer holds; its acquire is a new grant,
    // with a new fence, valid from that acquire's send.
    let store = Handing::new(Duration::ZERO, TTL + S);
    let (lease, released_at, _) = hand_off(&store, S).await;
    let owner = *lease.owner();
    let handed = store.handed.lock().unwrap().clone();
    assert_eq!(handed.len(), 1);
    assert!(
        lease.fence() > handed[0].1,
        "a new grant, not the expired one"
    );
    let acquires = store.times("acquire", &owner);
    assert_eq!(acquires.len(), 2);
    assert_eq!(acquires[1] - released_at, TTL + S);
    assert_eq!(lease.valid_until(), acquires[1] + config().validity(TTL));
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_host_suspend_during_the_wait_shortens_a_handed_lease() {
    // The host had been suspended 5 s before the waiter started, and is suspended 2 s
    // more while it waits (after the still-waiting send, for all the client knows): the
    // store's expiry ran through that suspend, so the deadline, in tokio's time, comes
    // 2 s sooner. (Counting the earlier 5 s too, or none of it, misplaces it by 5 s.)
    let clock = Arc::new(leasehold_core::clock::ManualClock::new());
    clock.suspend(5 * S);
    let store = Handing::new(300 * MS, 2 * MS);
    let b = LeaseClient::builder(store.clone(), config())
        .clock(clock.clone())
        .build();
    let (lease, released_at, _) = hand_off_to(&store, b, 4 * S, || clock.suspend(2 * S)).await;
    assert_eq!(
        lease.valid_until(),
        released_at - 300 * MS + config().validity(TTL) - 2 * S
    );
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_after_the_grant_releases_it() {
    // The store grants the lease to the waiter at the release, but its notice is slow;
    // the caller gives up meanwhile. The grant is the waiter's, so its guard releases it:
    // the key does not stay idle for the grant's TTL.
    let store = Handing::new(Duration::ZERO, 5 * S);
    let long = LeaseConfig::builder(30 * S).build().expect("config");
    let a = LeaseClient::new(store.clone(), long);
    let first = a.try_acquire(key()).await.expect("a acquires");
    let b = LeaseClient::new(store.clone(), config());
    let waiter = tokio::spawn(async move { b.acquire(key(), 60 * S).await });
    sleep(S).await;
    assert!(first.release().await.unwrap());
    sleep(S).await;
    let handed = store.handed.lock().unwrap().clone();
    assert_eq!(handed.len(), 1, "granted at the release");
    let info = store
        .mem
        .inspect(&key())
        .await
        .unwrap()
        .expect("held for the waiter");
    assert_eq!(info.owner, handed[0].0);
    waiter.abort();
    let _ = waiter.await;
    sleep(100 * MS).await;
    assert_eq!(
        store.mem.inspect(&key()).await.unwrap(),
        None,
        "released by the guard"
    );
}
