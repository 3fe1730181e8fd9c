//! Deterministic tests of heartbeat, deadline, backoff and acquire logic on tokio's paused
//! clock: time only moves when every task is idle (or when the test advances it), so the
//! figures below are exact, not wall-clock measurements.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::wrap::{FaultStore, Injection, Op, Unreachable};
use leasehold_core::{
    AcquireOutcome, Backoff, Error, Fence, Key, LeaseClient, LeaseConfig, LostReason, OwnerToken,
    ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind, WaitStore,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::{Instant, advance, sleep};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// What a [`Scripted`] store does on top of the memory store.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
enum Fault {
    #[default]
    None,
    /// Renewals are applied at once but their reply takes this long.
    SlowRenew(Duration),
    /// Renewals fail with an error of this kind.
    RenewError(StoreErrorKind),
    /// Acquires are applied at once but their reply takes this long.
    SlowAcquire(Duration),
    /// Acquires fail at once with an error of this kind (nothing applied).
    AcquireError(StoreErrorKind),
    /// Renewals and releases are applied at once; renewals answer after the first
    /// duration, releases after the second.
    SlowRenewSlowRelease(Duration, Duration),
    /// Acquires are applied at once but their reply takes the first duration, and every
    /// renewal (applied at once) answers after the second.
    SlowAcquireThenSlowRenew(Duration, Duration),
    /// Renewals reach the store after the first duration (then are applied); releases are
    /// applied at once and answer after the second.
    LateRenewSlowRelease(Duration, Duration),
}

/// A recorded call: operation, when, by which owner.
type Call = (&'static str, Instant, OwnerToken);

/// A memory store that records every call (operation, time) and can misbehave.
#[derive(Debug, Clone)]
struct Scripted {
    inner: MemoryStore,
    /// `inner` behind a fault-injecting wrapper: every call of the store goes through it.
    faults: Arc<FaultStore>,
    calls: Arc<Mutex<Vec<Call>>>,
    fault: Arc<Mutex<Fault>>,
    hide_wait_for_release: bool,
}

impl Default for Scripted {
    fn default() -> Self {
        let inner = MemoryStore::new();
        Self {
            faults: Arc::new(FaultStore::new(Arc::new(inner.clone()))),
            inner,
            calls: Arc::default(),
            fault: Arc::default(),
            hide_wait_for_release: false,
        }
    }
}

impl Scripted {
    fn set(&self, f: Fault) {
        *self.fault.lock().unwrap() = f;
    }
    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }
    fn log(&self, op: &'static str, owner: &OwnerToken) {
        self.calls
            .lock()
            .unwrap()
            .push((op, Instant::now(), *owner));
    }
    fn count(&self, op: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == op)
            .count()
    }
    fn times(&self, op: &str) -> Vec<Instant> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == op)
            .map(|c| c.1)
            .collect()
    }
    fn owners(&self, op: &str) -> Vec<OwnerToken> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == op)
            .map(|c| c.2)
            .collect()
    }
}

#[async_trait]
impl leasehold_core::wrap::Forward for Scripted {
    fn inner(&self) -> &dyn Store {
        &*self.faults
    }
    fn backend(&self) -> &'static str {
        "scripted"
    }
    fn waiter(&self) -> Option<&dyn WaitStore> {
        if self.hide_wait_for_release {
            return None;
        }
        self.faults.waiter()
    }
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.log("acquire", owner);
        if let Fault::AcquireError(kind) = self.fault() {
            return Err(StoreError::new(kind, "scripted", "injected"));
        }
        let out = self.faults.acquire(key, owner, ttl).await?;
        match self.fault() {
            Fault::SlowAcquire(d) | Fault::SlowAcquireThenSlowRenew(d, _) => {
                sleep(d).await;
                Ok(out)
            }
            _ => Ok(out),
        }
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.log("renew", owner);
        match self.fault() {
            Fault::SlowRenew(d)
            | Fault::SlowAcquireThenSlowRenew(_, d)
            | Fault::SlowRenewSlowRelease(d, _) => {
                // Applied at once; the reply takes `d`.
                let out = self.faults.renew(key, owner, ttl).await;
                sleep(d).await;
                out
            }
            Fault::LateRenewSlowRelease(d, _) => {
                sleep(d).await;
                self.faults.renew(key, owner, ttl).await
            }
            Fault::RenewError(kind) => Err(StoreError::new(kind, "scripted", "injected")),
            _ => self.faults.renew(key, owner, ttl).await,
        }
    }
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        self.log("release", owner);
        let out = self.faults.release(key, owner).await;
        if let Fault::LateRenewSlowRelease(_, d) | Fault::SlowRenewSlowRelease(_, d) = self.fault()
        {
            sleep(d).await;
        }
        out
    }
}

fn config(ttl: Duration) -> leasehold_core::LeaseConfigBuilder {
    // The watchdog thread runs on the real clock; these tests run on the paused one.
    LeaseConfig::builder(ttl).watchdog_thread(false)
}

fn client(store: &Scripted, cfg: LeaseConfig) -> LeaseClient {
    LeaseClient::with_rng(Arc::new(store.clone()), cfg, StdRng::seed_from_u64(7))
}

fn key() -> Key {
    Key::new("job:timing").unwrap()
}

#[tokio::test(start_paused = true)]
async fn heartbeat_renews_every_third_of_the_ttl() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    sleep(10 * S + 500 * MS).await;
    let times: Vec<_> = store.times("renew").iter().map(|t| *t - t0).collect();
    assert_eq!(times, (1..=10).map(|i| i * S).collect::<Vec<_>>());
    assert!(lease.is_valid());
    // valid_until counts from the last renewal's send time: 10 s + 3 s × 0.99 − 5 ms.
    assert_eq!(lease.valid_until() - t0, 10 * S + 2965 * MS);
    assert!(lease.release().await.unwrap());
}

/// A lease acquired while the scheduler sleeps with nothing to do (it looks again a second
/// later) is renewed on time: a lease whose first renewal comes before the scheduler's
/// planned wake-up wakes it.
#[tokio::test(start_paused = true)]
async fn a_short_lease_wakes_an_idle_scheduler() {
    let store = Scripted::default();
    let c = client(&store, config(600 * MS).build().unwrap());
    // The client's first lease starts its scheduler; once it is released, the scheduler
    // holds nothing and, after its look at 200 ms, plans to look again a second later.
    let first = c.try_acquire("job:first").await.unwrap();
    assert!(first.release().await.unwrap());
    sleep(300 * MS).await;
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    sleep(1100 * MS).await;
    let times: Vec<_> = store.times("renew").iter().map(|t| *t - t0).collect();
    assert_eq!(times, (1..=5).map(|i| i * 200 * MS).collect::<Vec<_>>());
    assert!(lease.is_valid());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn frozen_process_is_lost_on_resume_without_renewing() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    // The whole process freezes for 10 s: the clock jumps, every timer is due at once.
    advance(10 * S).await;
    // The first code to run after the freeze sees the lease lost, before any task ran.
    assert!(!lease.is_valid());
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    assert!(matches!(
        lease.ensure_valid(),
        Err(Error::LeaseLost(LostReason::Expired))
    ));
    sleep(5 * S).await;
    assert_eq!(
        store.count("renew"),
        0,
        "a lease past its deadline must not be renewed"
    );
}

#[tokio::test(start_paused = true)]
async fn frozen_scheduler_reports_lost_even_if_nobody_checks() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    let lost = lease.lost();
    advance(10 * S).await;
    // Only the scheduler runs here (the test does not call is_valid).
    assert_eq!(lost.wait().await, LostReason::Expired);
    assert_eq!(store.count("renew"), 0);
}

#[tokio::test(start_paused = true)]
async fn freeze_while_a_renewal_is_in_flight_is_lost_not_extended() {
    let store = Scripted::default();
    store.set(Fault::SlowRenew(100 * MS));
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    sleep(S + 10 * MS).await; // the first renewal is in flight
    assert_eq!(store.count("renew"), 1);
    let before = lease.valid_until();
    advance(10 * S).await; // frozen; the reply is processed after the deadline
    sleep(MS).await;
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    assert_eq!(
        lease.valid_until(),
        before,
        "a late reply must not move the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn consecutive_unreachable_renewals_lose_the_lease_before_the_deadline() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    store.faults.set_unreachable(Some(Unreachable::Hang));
    let reason = lease.lost().await;
    let lost_after = Instant::now() - t0;
    assert_eq!(reason, LostReason::StoreUnavailable);
    // renew at 1 s, times out at 1.5 s (op timeout = ttl/6); retry at 1.75 s, times out at
    // 2.25 s: two consecutive failures. The deadline would have been 2.965 s.
    assert_eq!(lost_after, 2250 * MS);
    assert!(lost_after < c.config().validity(3 * S));
    assert_eq!(store.count("renew"), 2);
}

#[tokio::test(start_paused = true)]
async fn renew_errors_count_towards_renew_failed() {
    let store = Scripted::default();
    store.set(Fault::RenewError(StoreErrorKind::Other));
    let c = client(
        &store,
        config(3 * S).renew_failures_before_lost(3).build().unwrap(),
    );
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    let reason = lease.lost().await;
    assert_eq!(reason, LostReason::RenewFailed { attempts: 3 });
    // 1 s, then retries every 250 ms.
    let times: Vec<_> = store.times("renew").iter().map(|t| *t - t0).collect();
    assert_eq!(times, vec![1000 * MS, 1250 * MS, 1500 * MS]);
}

#[tokio::test(start_paused = true)]
async fn one_failed_renewal_then_success_keeps_the_lease() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    store.set(Fault::RenewError(StoreErrorKind::Unavailable));
    sleep(1100 * MS).await;
    store.set(Fault::None);
    sleep(5 * S).await;
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());
}

#[tokio::test(start_paused = true)]
async fn store_forgetting_the_lease_fires_not_owner_within_one_interval() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    sleep(1500 * MS).await;
    let forgotten_at = Instant::now();
    store.inner.forget(&key());
    assert_eq!(lease.lost().await, LostReason::NotOwner);
    assert_eq!(Instant::now() - forgotten_at, 500 * MS); // the renewal at 2 s
}

#[tokio::test(start_paused = true)]
async fn max_hold_stops_the_heartbeat_and_the_holder_frees_the_key() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).max_hold(4500 * MS).build().unwrap());
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    let lost = lease.lost();
    assert_eq!(lost.lost_at(), None);
    assert_eq!(lease.lost().await, LostReason::MaxHoldExceeded);
    assert_eq!(Instant::now() - t0, 4500 * MS);
    assert_eq!(lost.lost_at(), Some(t0 + 4500 * MS), "when it fired");
    assert_eq!(store.count("renew"), 4);
    // The holder's work may still run: the lease stays in the store until the holder lets
    // go of it (or it expires), never freed behind its back.
    sleep(MS).await;
    let info = store.inner.inspect(&key()).await.unwrap();
    assert_eq!(info.map(|i| i.owner), Some(*lease.owner()));
    assert_eq!(store.count("release"), 0);
    // Releasing is the holder's act: it frees the key at once.
    assert!(lease.release().await.unwrap());
    assert_eq!(store.inner.inspect(&key()).await.unwrap(), None);
}

/// Issue 10.1: a lease lost for any reason stays in the store while its handle is alive;
/// the holder's drop frees it.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_stays_in_the_store_until_its_holder_drops_it() {
    for fault in [
        Fault::RenewError(StoreErrorKind::Other), // RenewFailed
        Fault::RenewError(StoreErrorKind::Unavailable), // StoreUnavailable
    ] {
        let store = Scripted::default();
        let c = client(&store, config(3 * S).build().unwrap());
        let lease = c.try_acquire(key()).await.unwrap();
        store.set(fault);
        let reason = lease.lost().await;
        assert!(
            matches!(
                reason,
                LostReason::RenewFailed { .. } | LostReason::StoreUnavailable
            ),
            "{reason:?}"
        );
        sleep(100 * MS).await;
        assert_eq!(
            store.count("release"),
            0,
            "{fault:?}: released behind the holder's back"
        );
        let info = store.inner.inspect(&key()).await.unwrap();
        assert_eq!(info.map(|i| i.owner), Some(*lease.owner()), "{fault:?}");
        store.set(Fault::None);
        drop(lease);
        sleep(MS).await;
        assert_eq!(store.count("release"), 1, "{fault:?}");
        assert_eq!(
            store.inner.inspect(&key()).await.unwrap(),
            None,
            "{fault:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn max_renewals_bounds_the_hold() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).max_renewals(2).build().unwrap());
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(lease.lost().await, LostReason::MaxHoldExceeded);
    assert_eq!(Instant::now() - t0, 3 * S);
    assert_eq!(store.count("renew"), 2);
}

#[tokio::test(start_paused = true)]
async fn ambiguous_acquire_is_retried_with_the_same_owner_and_fence() {
    let store = Scripted::default();
    // The first acquire is applied, then reported as an ambiguous failure.
    store
        .faults
        .inject(Op::Acquire, Injection::AmbiguousAfterApply);
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    let owners = store.owners("acquire");
    assert_eq!(owners.len(), 2);
    assert_eq!(owners[0], owners[1], "the retry must reuse the owner token");
    assert_eq!(
        lease.fence(),
        Fence(1),
        "the retry returns the grant it made, not a new one"
    );
    let info = store.inner.inspect(&key()).await.unwrap().unwrap();
    assert_eq!(info.owner, *lease.owner());
}

#[tokio::test(start_paused = true)]
async fn acquire_that_never_answers_times_out_and_leaves_no_orphan() {
    let store = Scripted::default();
    // Both acquires (the first and its one retry) are applied, then never answered.
    for _ in 0..2 {
        store.faults.inject(Op::Acquire, Injection::HangAfterApply);
    }
    let c = client(&store, config(3 * S).ambiguous_retries(1).build().unwrap());
    let err = c.try_acquire(key()).await.unwrap_err();
    assert_eq!(err.store_error().unwrap().kind(), StoreErrorKind::Timeout);
    assert_eq!(store.count("acquire"), 2);
    sleep(MS).await;
    assert_eq!(
        store.count("release"),
        1,
        "the possibly granted owner is released"
    );
    assert_eq!(store.inner.inspect(&key()).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn cancelled_acquire_releases_what_it_may_have_been_granted() {
    let store = Scripted::default();
    store.faults.inject(Op::Acquire, Injection::HangAfterApply);
    let c = client(&store, config(3 * S).build().unwrap());
    let res = tokio::time::timeout(100 * MS, c.try_acquire(key())).await;
    assert!(res.is_err(), "cancelled");
    sleep(MS).await;
    assert_eq!(store.owners("release"), store.owners("acquire"));
    assert_eq!(store.inner.inspect(&key()).await.unwrap(), None);
}

/// Acquire timestamps of one waiter against a holder that never releases.
async fn waiter_attempts(seed: u64) -> Vec<Duration> {
    let store = Scripted {
        hide_wait_for_release: true,
        ..Default::default()
    };
    let holder = OwnerToken::random();
    // Held for 10 s and never renewed.
    store.inner.acquire(&key(), &holder, 10 * S).await.unwrap();
    let cfg = config(3 * S)
        .backoff(Backoff::new(100 * MS, 2 * S).unwrap())
        .build()
        .unwrap();
    let c = LeaseClient::with_rng(Arc::new(store.clone()), cfg, StdRng::seed_from_u64(seed));
    let t0 = Instant::now();
    let err = c.acquire(key(), 5 * S).await.unwrap_err();
    assert!(matches!(err, Error::WaitTimeout { .. }), "{err}");
    assert_eq!(
        Instant::now() - t0,
        5 * S,
        "gives up exactly at the deadline"
    );
    store.times("acquire").iter().map(|t| *t - t0).collect()
}

#[tokio::test(start_paused = true)]
async fn waiting_uses_full_jitter_backoff_with_an_injected_rng() {
    let a = waiter_attempts(1).await;
    assert_eq!(a, waiter_attempts(1).await, "same seed, same schedule");
    assert_ne!(a, waiter_attempts(2).await, "other seed, other schedule");
    let b = Backoff::new(100 * MS, 2 * S).unwrap();
    for (i, w) in a.windows(2).enumerate() {
        let gap = w[1] - w[0];
        assert!(
            gap <= b.ceiling(i as u32),
            "gap {gap:?} above ceiling of attempt {i}"
        );
    }
    assert!(a.len() >= 4, "{a:?}");
}

#[tokio::test(start_paused = true)]
async fn waiting_sleeps_no_longer_than_the_holders_remaining_ttl() {
    let store = Scripted {
        hide_wait_for_release: true,
        ..Default::default()
    };
    let holder = OwnerToken::random();
    store
        .inner
        .acquire(&key(), &holder, 300 * MS)
        .await
        .unwrap();
    // A huge backoff: without the bound the waiter would sleep up to 20 s.
    let cfg = config(3 * S)
        .backoff(Backoff::new(20 * S, 20 * S).unwrap())
        .build()
        .unwrap();
    let c = LeaseClient::with_rng(Arc::new(store.clone()), cfg, StdRng::seed_from_u64(3));
    let t0 = Instant::now();
    let lease = c.acquire(key(), 60 * S).await.unwrap();
    assert!(Instant::now() - t0 <= 300 * MS, "{:?}", Instant::now() - t0);
    assert_eq!(lease.fence(), Fence(2));
}

#[tokio::test(start_paused = true)]
async fn waiting_wakes_on_release_notification() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let holder = c.try_acquire(key()).await.unwrap();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.acquire(key(), 60 * S).await })
    };
    sleep(7 * S).await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let lease = waiter.await.unwrap().unwrap();
    assert_eq!(
        Instant::now(),
        released_at,
        "hand-off without polling delay"
    );
    assert_eq!(lease.fence(), Fence(2));
    // While the holder was alive, the waiter woke only when its lease could have expired.
    assert!(store.count("acquire") <= 5, "{}", store.count("acquire"));
}

#[tokio::test(start_paused = true)]
async fn run_cancels_work_when_the_lease_is_lost() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    let token = lease.lost_token();
    let forget = {
        let store = store.clone();
        async move {
            sleep(1500 * MS).await;
            store.inner.forget(&key());
        }
    };
    tokio::spawn(forget);
    let res = lease.run(sleep(60 * S)).await;
    assert!(
        matches!(res, Err(Error::LeaseLost(LostReason::NotOwner))),
        "{res:?}"
    );
    assert!(token.is_cancelled());
    // Work on a lost lease does not even start, and the error keeps the reason.
    assert!(matches!(
        lease.run(async { unreachable!() }).await,
        Err(Error::LeaseLost(LostReason::NotOwner))
    ));
    assert!(matches!(
        lease.ensure_valid(),
        Err(Error::LeaseLost(LostReason::NotOwner))
    ));
    for debug in [
        format!("{lease:?}"),
        format!("{:?}", lease.lost()),
        format!("{:?}", lease.lost().wait()),
    ] {
        assert!(debug.contains("job:timing"), "{debug}");
    }
    assert!(format!("{:?}", lease.lost()).contains("NotOwner"));
    // The lease's own Debug shows its state (the lost signal's token, made only when
    // asked for, is an implementation detail it leaves out).
    let debug = format!("{lease:?}");
    for shown in ["valid_until", "lost: Some(NotOwner)", "releasing: false"] {
        assert!(debug.contains(shown), "{shown} not in {debug}");
    }
    assert!(!debug.contains("CancellationToken"), "{debug}");
    assert_eq!(lease.ttl(), 3 * S);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_lease_releases_it_in_the_background() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    drop(lease);
    sleep(MS).await;
    assert_eq!(store.inner.inspect(&key()).await.unwrap(), None);
    sleep(5 * S).await;
    assert_eq!(store.count("renew"), 0, "no renewals after drop");
}

#[tokio::test(start_paused = true)]
async fn release_after_takeover_reports_false_and_leaves_the_new_holder() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let a = c.try_acquire(key()).await.unwrap();
    store.inner.forget(&key());
    let b = c.try_acquire(key()).await.unwrap();
    assert!(!a.release().await.unwrap());
    assert!(b.is_valid());
    assert_eq!(
        store.inner.inspect(&key()).await.unwrap().unwrap().owner,
        *b.owner()
    );
}

#[tokio::test(start_paused = true)]
async fn client_clock_jump_changes_nothing() {
    // Deadlines live on the monotonic clock only: there is no wall clock to jump. Here the
    // monotonic clock moves normally while renewals continue: the lease stays valid.
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    for _ in 0..100 {
        sleep(500 * MS).await;
        assert!(lease.is_valid());
    }
}

#[tokio::test(start_paused = true)]
async fn near_miss_freeze_keeps_the_lease() {
    // docs/faults.md row 2: frozen for just under the validity window (2.965 s of a 3 s TTL).
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    advance(2900 * MS).await;
    assert!(lease.is_valid(), "still inside the window");
    sleep(10 * S).await;
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());
    assert!(store.count("renew") >= 5);
}

#[tokio::test(start_paused = true)]
async fn slow_acquire_reply_shortens_the_validity_window() {
    // docs/faults.md row 6: the reply takes 0.4 × TTL; the window still counts from the send.
    let store = Scripted::default();
    store.set(Fault::SlowAcquire(1200 * MS));
    let cfg = config(3 * S).op_timeout(1900 * MS).build().unwrap();
    let c = client(&store, cfg);
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(Instant::now() - sent, 1200 * MS);
    assert_eq!(lease.valid_until() - sent, 2965 * MS);
    assert_eq!(lease.remaining(), 1765 * MS);
}

/// Issue 10.6: the first renewal and `max_hold` count from the acquire's send, not from
/// its reply. TTL 1 s, renew interval 600 ms, op timeout 350 ms, a 300 ms acquire reply:
/// timed from the reply, the first renewal would be sent at 900 ms with 85 ms left before
/// the 985 ms deadline, and a store answering in 100 ms would lose the lease.
#[tokio::test(start_paused = true)]
async fn the_first_renewal_counts_from_the_acquire_send() {
    let store = Scripted::default();
    store.set(Fault::SlowAcquireThenSlowRenew(300 * MS, 100 * MS));
    let cfg = config(S)
        .renew_interval(600 * MS)
        .op_timeout(350 * MS)
        .build()
        .unwrap();
    let c = client(&store, cfg);
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(Instant::now() - sent, 300 * MS);
    sleep(5 * S).await;
    assert!(lease.is_valid(), "lost: {:?}", lease.lost_reason());
    let renews: Vec<_> = store.times("renew").iter().map(|t| *t - sent).collect();
    assert_eq!(
        renews[0],
        600 * MS,
        "first renewal timed from the send: {renews:?}"
    );
    assert!(renews.len() >= 8, "{renews:?}");
}

#[tokio::test(start_paused = true)]
async fn max_hold_counts_from_the_acquire_send() {
    let store = Scripted::default();
    store.set(Fault::SlowAcquire(300 * MS));
    let cfg = config(3 * S)
        .op_timeout(400 * MS)
        .max_hold(2 * S)
        .build()
        .unwrap();
    let c = client(&store, cfg);
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    store.set(Fault::None);
    assert_eq!(lease.lost().await, LostReason::MaxHoldExceeded);
    assert_eq!(Instant::now() - sent, 2 * S);
}

/// Issue 10.7: a release racing an in-flight renewal. The renewal reaches the store after
/// the release deleted the key, so the store answers `NotOwner`; the holder released the
/// lease, so it must not be reported lost (nor counted as lost).
#[tokio::test(start_paused = true)]
async fn a_release_racing_a_renewal_never_reports_lost() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    let lost = lease.lost();
    // The renewal is sent at 1 s and lands at 1.15 s; the release is applied at 1.1 s and
    // answers at 1.4 s.
    store.set(Fault::LateRenewSlowRelease(150 * MS, 300 * MS));
    sleep(1100 * MS).await;
    assert_eq!(store.count("renew"), 1, "a renewal is in flight");
    assert!(lease.release().await.unwrap());
    sleep(S).await;
    assert_eq!(lost.reason(), None, "a released lease reported lost");
    assert!(!lost.is_lost());
}

/// Issue 10.4: `Duration::MAX` is the usual way to say "wait forever": accepted, never an
/// overflow.
#[tokio::test(start_paused = true)]
async fn waiting_duration_max_waits_as_long_as_it_takes() {
    let store = Scripted::default();
    let holder = OwnerToken::random();
    store.inner.acquire(&key(), &holder, 10 * S).await.unwrap();
    let c = client(&store, config(3 * S).build().unwrap());
    let t0 = Instant::now();
    let lease = c.acquire(key(), Duration::MAX).await.unwrap();
    assert!(Instant::now() - t0 >= 10 * S);
    assert!(lease.release().await.unwrap());
    assert!(
        store
            .inner
            .wait_released(&key(), &OwnerToken::random(), Duration::MAX)
            .await
            .is_ok()
    );
}

/// Issue 10.4: `max_hold(Duration::MAX)` means unbounded; it used to panic after the store
/// had granted the lease, leaving the key blocked until its TTL.
#[tokio::test(start_paused = true)]
async fn max_hold_duration_max_is_unbounded() {
    let store = Scripted::default();
    let c = client(
        &store,
        config(3 * S).max_hold(Duration::MAX).build().unwrap(),
    );
    let lease = c.try_acquire(key()).await.unwrap();
    sleep(60 * S).await;
    assert!(lease.is_valid());
    assert!(lease.release().await.unwrap());
}

/// `abandon` stops renewing without releasing: the lease stays in the store until it
/// expires there, and never reports lost.
#[tokio::test(start_paused = true)]
async fn abandon_stops_renewing_and_leaves_the_lease_to_expire() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    let lost = lease.lost();
    let owner = *lease.owner();
    sleep(1500 * MS).await; // renewed once, at 1 s
    lease.abandon();
    sleep(MS).await;
    assert_eq!(store.count("release"), 0);
    let info = store.inner.inspect(&key()).await.unwrap().unwrap();
    assert_eq!(info.owner, owner);
    sleep(3 * S).await;
    assert_eq!(store.count("renew"), 1, "renewed after it was abandoned");
    assert_eq!(store.inner.inspect(&key()).await.unwrap(), None, "expired");
    assert_eq!(lost.reason(), None);
}

/// The observer hook sees each renewal's send and answer, and whether the client accepted
/// it: a reply that comes after the deadline is `Refused`, never `Accepted`.
#[tokio::test(start_paused = true)]
async fn the_observer_sees_every_renewal_and_whether_it_was_accepted() {
    use leasehold_core::{LeaseObserver, RenewalEvent, RenewalPhase};
    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<(RenewalPhase, Duration, bool, Instant)>>);
    impl LeaseObserver for Log {
        fn renewal(&self, e: &RenewalEvent<'_>) {
            self.0
                .lock()
                .unwrap()
                .push((e.phase, e.remaining, e.lost, Instant::now()));
        }
    }
    let store = Scripted::default();
    let log = Arc::new(Log::default());
    let c = LeaseClient::builder(Arc::new(store.clone()), config(3 * S).build().unwrap())
        .observer(log.clone())
        .build();
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    sleep(2500 * MS).await;
    {
        let events = log.0.lock().unwrap();
        let phases: Vec<_> = events.iter().map(|e| e.0).collect();
        use RenewalPhase::*;
        assert_eq!(phases, [Sent, Accepted, Sent, Accepted]);
        assert_eq!(events[0].3 - t0, S);
        assert_eq!(
            events[1].1,
            2965 * MS,
            "remaining after the accepted renewal"
        );
    }
    // A freeze while a renewal is in flight: its late reply is refused.
    store.set(Fault::SlowRenew(100 * MS));
    sleep(600 * MS).await; // the renewal at 3 s is in flight
    advance(10 * S).await;
    sleep(MS).await;
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    let events = log.0.lock().unwrap();
    let last = events.last().unwrap();
    assert_eq!((last.0, last.1), (RenewalPhase::Refused, Duration::ZERO));
    assert!(
        !events.iter().any(|e| e.0 == RenewalPhase::Accepted && e.2),
        "accepted after lost"
    );
}

/// A waiting acquire retries retryable store errors (with backoff) until its deadline,
/// then returns the last error, exactly at the deadline; a non-retryable error is
/// returned at once.
#[tokio::test(start_paused = true)]
async fn a_waiting_acquire_retries_retryable_errors_until_its_deadline_only() {
    let store = Scripted::default();
    store.set(Fault::AcquireError(StoreErrorKind::Unavailable));
    let c = client(&store, config(3 * S).build().unwrap());
    let t0 = Instant::now();
    let err = c.acquire(key(), 5 * S).await.unwrap_err();
    assert_eq!(
        Instant::now() - t0,
        5 * S,
        "gives up exactly at the deadline"
    );
    assert_eq!(
        err.store_error().map(|e| e.kind()),
        Some(StoreErrorKind::Unavailable)
    );
    assert!(store.count("acquire") >= 3, "{}", store.count("acquire"));

    let store = Scripted::default();
    store.set(Fault::AcquireError(StoreErrorKind::Config));
    let c = client(&store, config(3 * S).build().unwrap());
    let t0 = Instant::now();
    let err = c.acquire(key(), 5 * S).await.unwrap_err();
    assert_eq!(Instant::now(), t0, "a configuration error is not retried");
    assert_eq!(store.count("acquire"), 1);
    assert_eq!(
        err.store_error().map(|e| e.kind()),
        Some(StoreErrorKind::Config)
    );
}

#[tokio::test(start_paused = true)]
async fn debug_output_names_the_client_and_its_store() {
    let store = Scripted::default();
    let cfg = config(3 * S).build().unwrap();
    let b = LeaseClient::builder(Arc::new(store.clone()), cfg.clone());
    assert!(format!("{b:?}").contains("LeaseClientBuilder"));
    let c = client(&store, cfg);
    let s = format!("{c:?}");
    assert!(s.contains("LeaseClient") && s.contains("Scripted"), "{s}");
}

#[test]
fn lost_reasons_say_what_happened() {
    let cases = [
        (
            LostReason::NotOwner,
            "not_owner",
            "no longer lists this owner",
        ),
        (
            LostReason::RenewFailed { attempts: 3 },
            "renew_failed",
            "3 consecutive renewals failed",
        ),
        (LostReason::Expired, "expired", "deadline passed"),
        (
            LostReason::MaxHoldExceeded,
            "max_hold_exceeded",
            "maximum hold",
        ),
        (
            LostReason::StoreUnavailable,
            "store_unavailable",
            "unreachable",
        ),
        (LostReason::Shutdown, "shutdown", "shutting down"),
        (
            LostReason::SessionEnded,
            "session_ended",
            "session holding the lease ended",
        ),
    ];
    for (reason, label, text) in cases {
        assert_eq!(reason.as_str(), label);
        assert!(reason.to_string().contains(text), "{reason}");
    }
}

/// While its holder is releasing it, a lease is not renewed: a renewal due while the
/// release is in flight is never sent.
#[tokio::test(start_paused = true)]
async fn a_lease_being_released_is_not_renewed() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    sleep(900 * MS).await;
    // The release is applied at once and answers after 500 ms; the renewal was due at 1 s.
    store.set(Fault::LateRenewSlowRelease(Duration::ZERO, 500 * MS));
    assert!(lease.release().await.unwrap());
    sleep(2 * S).await;
    assert_eq!(store.count("renew"), 0, "renewed while being released");
}

/// A renewal reply that arrives after the deadline, even one whose new deadline would
/// still lie ahead, never revives the lease: the process was not provably holding it in
/// between (a freeze while the renewal was in flight).
#[tokio::test(start_paused = true)]
async fn a_reply_after_the_deadline_never_revives_the_lease() {
    for i in 0..10 {
        let store = Scripted::default();
        store.set(Fault::SlowRenew(100 * MS));
        let c = client(&store, config(3 * S).build().unwrap());
        let lease = c.try_acquire(key()).await.unwrap();
        sleep(S + 10 * MS).await; // the renewal sent at 1 s is in flight
        // Frozen until 3.1 s: past the 2.965 s deadline, before the 3.965 s the reply
        // would give.
        advance(2090 * MS).await;
        sleep(MS).await;
        assert_eq!(
            lease.lost_reason(),
            Some(LostReason::Expired),
            "round {i}: a late reply revived the lease"
        );
    }
}

/// A lease acquired while the scheduler sleeps idle (its last lease gone) wakes it when its
/// first renewal is due before the planned wake-up: a 300 ms lease is renewed at 100 ms.
#[tokio::test(start_paused = true)]
async fn a_new_lease_wakes_an_idle_scheduler_in_time() {
    let store = Scripted::default();
    let c = client(&store, config(300 * MS).build().unwrap());
    let a = c.try_acquire(key()).await.unwrap();
    assert!(a.release().await.unwrap());
    sleep(200 * MS).await; // the scheduler has forgotten `a` and sleeps for a second
    let t0 = Instant::now();
    let b = c.try_acquire(key()).await.unwrap();
    sleep(S).await;
    assert!(b.is_valid(), "{:?}", b.lost_reason());
    assert_eq!(store.times("renew")[0] - t0, 100 * MS);
}

/// Shutdown returns once the releases queued by the dropped leases were answered, not
/// before: a release answering after 200 ms delays it by those 200 ms.
#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_the_releases_to_be_answered() {
    let store = Scripted::default();
    let c = client(&store, config(3 * S).build().unwrap());
    let lease = c.try_acquire(key()).await.unwrap();
    store.set(Fault::LateRenewSlowRelease(Duration::ZERO, 200 * MS));
    tokio::spawn(async move {
        let _ = lease.lost().await;
        drop(lease); // queues a release on the scheduler
    });
    let t0 = Instant::now();
    let report = c.shutdown(5 * S).await;
    assert!(report.releases_done);
    assert_eq!(
        Instant::now() - t0,
        200 * MS,
        "returned before the release was answered"
    );
    assert_eq!(store.count("release"), 1);
}

/// Renewals that time out without reaching the failure count lose the lease at its
/// deadline with `StoreUnavailable` (the store could not be reached), not `Expired`.
#[tokio::test(start_paused = true)]
async fn unreachable_until_the_deadline_is_store_unavailable() {
    let store = Scripted::default();
    let c = client(
        &store,
        config(3 * S)
            .renew_failures_before_lost(100)
            .build()
            .unwrap(),
    );
    let t0 = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    store.faults.set_unreachable(Some(Unreachable::Hang));
    assert_eq!(lease.lost().await, LostReason::StoreUnavailable);
    assert_eq!(Instant::now() - t0, 2965 * MS, "at the deadline");
}

/// A renewal answered `Renewed` while its holder is releasing the lease does not extend
/// it: the observer sees it refused.
#[tokio::test(start_paused = true)]
async fn a_renewal_answered_during_the_release_is_refused() {
    use leasehold_core::{LeaseObserver, RenewalEvent, RenewalPhase};
    #[derive(Debug, Default)]
    struct Phases(Mutex<Vec<RenewalPhase>>);
    impl LeaseObserver for Phases {
        fn renewal(&self, e: &RenewalEvent<'_>) {
            self.0.lock().unwrap().push(e.phase);
        }
    }
    let store = Scripted::default();
    let phases = Arc::new(Phases::default());
    let c = LeaseClient::builder(Arc::new(store.clone()), config(3 * S).build().unwrap())
        .observer(phases.clone())
        .build();
    let lease = c.try_acquire(key()).await.unwrap();
    // The renewal sent at 1 s answers at 1.2 s; the release begun at 1.1 s answers at 1.4 s.
    store.set(Fault::SlowRenewSlowRelease(200 * MS, 300 * MS));
    sleep(1100 * MS).await;
    assert!(lease.release().await.unwrap());
    sleep(S).await;
    assert_eq!(
        *phases.0.lock().unwrap(),
        [RenewalPhase::Sent, RenewalPhase::Refused]
    );
}

/// The client's random numbers for recipes (a semaphore's first slot) come from its
/// random source, spread over the whole range and never past it.
#[test]
fn random_below_spreads_over_its_range() {
    let cfg = LeaseConfig::new(Duration::from_secs(3)).unwrap();
    let c = LeaseClient::with_rng(Arc::new(MemoryStore::new()), cfg, StdRng::seed_from_u64(5));
    assert_eq!(c.random_below(0), 0);
    assert_eq!(c.random_below(1), 0);
    let mut seen = [0u32; 10];
    for _ in 0..1000 {
        seen[c.random_below(10) as usize] += 1;
    }
    assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
}
