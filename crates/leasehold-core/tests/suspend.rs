//! Issue 10.3 and 10.11: every question about a lease reads the clock on the spot, and
//! the clock counts host suspension. A [`ManualClock`] models a suspend (or a freeze) as a
//! jump of the lease clock that no task and no timer sees happen, which is exactly the
//! moment these APIs must get right.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant as StdInstant};

use leasehold_core::clock::{ManualClock, SUSPEND_CHECK};
use leasehold_core::memory::MemoryStore;
use leasehold_core::{Error, Key, LeaseClient, LeaseConfig, LostReason, Store};
use tokio::time::sleep;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn client(store: &MemoryStore, clock: &Arc<ManualClock>, watchdog: bool) -> LeaseClient {
    let cfg = LeaseConfig::builder(3 * S)
        .watchdog_thread(watchdog)
        .build()
        .unwrap();
    LeaseClient::builder(Arc::new(store.clone()), cfg)
        .clock(clock.clone())
        .build()
}

fn key(n: &str) -> Key {
    Key::new(format!("job:{n}")).unwrap()
}

/// Issue 10.3, deterministic: the deadline passes while nothing runs (the watchdog thread
/// is off, and no task gets a turn between the jump and the questions).
#[tokio::test(start_paused = true)]
async fn lost_apis_check_the_clock_on_the_spot() {
    let store = MemoryStore::new();
    let clock = Arc::new(ManualClock::new());
    let c = client(&store, &clock, false);

    let lease = c.try_acquire(key("a")).await.unwrap();
    let lost = lease.lost();
    let token = lease.lost_token();
    clock.suspend(10 * S);
    // No background task has run: the token (which cannot read a clock) lags...
    assert!(
        !token.is_cancelled(),
        "the test must not let the scheduler run"
    );
    // ...but every question reads the clock.
    assert!(lost.is_lost());
    assert_eq!(lost.reason(), Some(LostReason::Expired));
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    assert!(token.is_cancelled(), "asking fired the signal for everyone");

    let lease = c.try_acquire(key("b")).await.unwrap();
    let mut wait = lease.lost().wait();
    assert!(futures::poll!(&mut wait).is_pending());
    clock.suspend(10 * S);
    assert_eq!(futures::poll!(&mut wait), Poll::Ready(LostReason::Expired));

    // `run` never polls the work again once the deadline has passed, even if the freeze
    // happened inside the work and no task ran since.
    let lease = c.try_acquire(key("c")).await.unwrap();
    let polls = AtomicUsize::new(0);
    let work = std::future::poll_fn(|cx| {
        if polls.fetch_add(1, Ordering::SeqCst) == 0 {
            clock.suspend(10 * S);
        }
        cx.waker().wake_by_ref();
        Poll::<()>::Pending
    });
    let res = lease.run(work).await;
    assert!(
        matches!(res, Err(Error::LeaseLost(LostReason::Expired))),
        "{res:?}"
    );
    assert_eq!(
        polls.load(Ordering::SeqCst),
        1,
        "work polled after the deadline"
    );
}

/// Issue 10.11: a suspend longer than the validity window loses the lease even if nobody
/// asks: the scheduler notices within `SUSPEND_CHECK`, renews nothing, and the store
/// still lists the holder (releasing is the holder's act).
#[tokio::test(start_paused = true)]
async fn a_host_suspend_past_the_deadline_loses_the_lease() {
    let store = MemoryStore::new();
    let clock = Arc::new(ManualClock::new());
    let c = client(&store, &clock, false);
    let lease = c.try_acquire(key("suspend")).await.unwrap();
    let token = lease.lost_token();
    sleep(1500 * MS).await; // renewed at 1 s: valid until 3.965 s
    assert!(lease.is_valid());
    clock.suspend(5 * S);
    tokio::time::timeout(SUSPEND_CHECK + MS, token.cancelled())
        .await
        .expect("the scheduler notices a suspend within SUSPEND_CHECK");
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    assert!(lease.remaining().is_zero());
    let info = store.inspect(&key("suspend")).await.unwrap();
    assert_eq!(info.map(|i| i.owner), Some(*lease.owner()));
}

/// A suspend shorter than the validity left keeps the lease: the next renewal is due at
/// once and extends it.
#[tokio::test(start_paused = true)]
async fn a_short_suspend_keeps_the_lease() {
    let store = MemoryStore::new();
    let clock = Arc::new(ManualClock::new());
    let c = client(&store, &clock, false);
    let lease = c.try_acquire(key("short")).await.unwrap();
    sleep(1500 * MS).await; // valid until 3.965 s
    let before = lease.remaining();
    clock.suspend(S);
    assert_eq!(lease.remaining(), before - S);
    sleep(10 * S).await;
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());
}

/// Issue 10.11, with the watchdog thread: the runtime is blocked (nothing async runs), the
/// clock jumps past the deadline, and the thread fires the lost signal, seen from another
/// thread.
#[test]
fn the_watchdog_thread_sees_a_suspend_while_the_runtime_is_blocked() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = MemoryStore::new();
    let clock = Arc::new(ManualClock::new());
    let (lease, token) = rt.block_on(async {
        let c = client(&store, &clock, true);
        let lease = c.try_acquire(key("watchdog")).await.unwrap();
        let token = lease.lost_token();
        (lease, token)
    });
    let watcher = std::thread::spawn(move || {
        futures::executor::block_on(token.cancelled());
        StdInstant::now()
    });
    let suspended_at = rt.block_on(async {
        std::thread::sleep(200 * MS);
        clock.suspend(20 * S);
        let at = StdInstant::now();
        std::thread::sleep(1500 * MS);
        at
    });
    let fired_at = watcher.join().unwrap();
    let after = fired_at.saturating_duration_since(suspended_at);
    assert!(after < 1200 * MS, "fired {after:?} after the suspend");
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    rt.block_on(async { drop(lease) });
}

/// A store whose first acquire's reply comes back after a host suspend longer than the
/// TTL: the grant was made before the suspend, so it has expired by the time the reply is
/// read.
#[derive(Debug)]
struct SuspendsOnReply {
    inner: MemoryStore,
    clock: Arc<ManualClock>,
    by: Duration,
    on_renew: bool,
    suspended: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl leasehold_core::wrap::Forward for SuspendsOnReply {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        "suspends-on-reply"
    }
    async fn acquire(
        &self,
        key: &Key,
        owner: &leasehold_core::OwnerToken,
        ttl: Duration,
    ) -> Result<leasehold_core::AcquireOutcome, leasehold_core::StoreError> {
        let reply = self.inner.acquire(key, owner, ttl).await;
        if !self.on_renew && !self.suspended.swap(true, Ordering::SeqCst) {
            self.clock.suspend(self.by);
        }
        reply
    }
    /// With `on_renew`, renewals grant 6 s and the first one's reply is read after the
    /// suspend.
    async fn renew(
        &self,
        key: &Key,
        owner: &leasehold_core::OwnerToken,
        _ttl: Duration,
    ) -> Result<leasehold_core::RenewOutcome, leasehold_core::StoreError> {
        let reply = self.inner.renew(key, owner, 6 * S).await;
        if self.on_renew && !self.suspended.swap(true, Ordering::SeqCst) {
            self.clock.suspend(self.by);
        }
        reply
    }
    fn watcher(&self) -> Option<&dyn leasehold_core::WatchStore> {
        self.inner.watcher()
    }
    fn waiter(&self) -> Option<&dyn leasehold_core::WaitStore> {
        self.inner.waiter()
    }
}

/// An acquire whose reply is read after the validity it would grant has passed (a host
/// suspend between the send and the reply) does not hand out that lease: its holder would
/// start work on a lease the store has already expired. It is asked again, and the lease
/// handed out is timed from that later send. The edge: a reply read at the very instant
/// the validity ends is too late as well (the call is bounded by the operation timeout,
/// below the validity window, but a suspend is not).
#[tokio::test(start_paused = true)]
async fn a_grant_read_after_its_validity_passed_is_not_handed_out() {
    let cfg = LeaseConfig::builder(3 * S)
        .watchdog_thread(false)
        .build()
        .unwrap();
    for by in [10 * S, cfg.validity(3 * S)] {
        let clock = Arc::new(ManualClock::new());
        let store = SuspendsOnReply {
            inner: MemoryStore::new(),
            clock: clock.clone(),
            by,
            on_renew: false,
            suspended: Default::default(),
        };
        let c = LeaseClient::builder(Arc::new(store), cfg.clone())
            .clock(clock.clone())
            .build();
        let lease = c
            .try_acquire(key("late-reply"))
            .await
            .expect("asked again after the late reply");
        assert!(
            lease.is_valid(),
            "suspended {by:?}: handed out a lease already past its deadline"
        );
        assert!(lease.remaining() > S, "{:?} left", lease.remaining());
    }
}

/// The same edge on a renewal: a reply read at the very instant the validity it grants
/// ends (here a renewal granting 6 s of a 30 s lease, so that instant is still before the
/// deadline the acquire gave) extends nothing. The observer sees it refused, and the lease
/// is lost.
#[tokio::test(start_paused = true)]
async fn a_renewal_read_when_its_validity_ends_is_refused() {
    use leasehold_core::{LeaseObserver, RenewalEvent, RenewalPhase};
    #[derive(Debug, Default)]
    struct Phases(std::sync::Mutex<Vec<RenewalPhase>>);
    impl LeaseObserver for Phases {
        fn renewal(&self, e: &RenewalEvent<'_>) {
            self.0.lock().unwrap().push(e.phase);
        }
    }
    let cfg = LeaseConfig::builder(30 * S)
        .watchdog_thread(false)
        .build()
        .unwrap();
    let clock = Arc::new(ManualClock::new());
    let store = SuspendsOnReply {
        inner: MemoryStore::new(),
        clock: clock.clone(),
        by: cfg.validity(6 * S),
        on_renew: true,
        suspended: Default::default(),
    };
    let phases = Arc::new(Phases::default());
    let c = LeaseClient::builder(Arc::new(store), cfg.clone())
        .clock(clock.clone())
        .observer(phases.clone())
        .build();
    let lease = c.try_acquire(key("late-renewal")).await.unwrap();
    assert!(
        cfg.validity(30 * S) > cfg.renew_interval() + cfg.validity(6 * S),
        "the instant is before the acquire's deadline"
    );
    assert_eq!(lease.lost().await, LostReason::Expired);
    assert_eq!(
        phases.0.lock().unwrap()[..2],
        [RenewalPhase::Sent, RenewalPhase::Refused]
    );
}
