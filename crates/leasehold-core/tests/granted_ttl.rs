//! Issue 24.2: a store may grant less than the TTL asked (ZooKeeper grants at most its
//! session timeout; etcd rounds). Every renewal is scheduled from the TTL the store
//! granted, and a grant too short for the configuration to renew in time is refused and
//! released. Deterministic, on tokio's paused clock, over a memory store that caps grants.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::wrap::{FaultStore, Injection, Op};
use leasehold_core::{
    AcquireOutcome, Action, ConfigError, Error, Key, LeaseClient, LeaseConfig, LostReason,
    OwnerToken, RenewOutcome, Store, StoreError, WaitStore, WatchStore,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::{Instant, sleep};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// A memory store that grants at most `cap` (on acquires and renewals alike, as
/// ZooKeeper grants at most its session timeout) and records when renewals arrive.
#[derive(Debug, Clone, Default)]
struct Capped {
    inner: MemoryStore,
    cap: Arc<Mutex<Option<Duration>>>,
    renewals: Arc<Mutex<Vec<Instant>>>,
}

impl Capped {
    fn new(cap: Duration) -> Self {
        let s = Self::default();
        s.set_cap(Some(cap));
        s
    }
    fn set_cap(&self, cap: Option<Duration>) {
        *self.cap.lock().unwrap() = cap;
    }
    fn grant(&self, asked: Duration) -> Duration {
        self.cap.lock().unwrap().map_or(asked, |c| asked.min(c))
    }
    /// When renewals arrived, counted from `since`.
    fn renewals_since(&self, since: Instant) -> Vec<Duration> {
        let r = self.renewals.lock().unwrap();
        r.iter().map(|t| *t - since).collect()
    }
}

#[async_trait]
impl leasehold_core::wrap::Forward for Capped {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        "capped"
    }
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.inner.acquire(key, owner, self.grant(ttl)).await
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.renewals.lock().unwrap().push(Instant::now());
        self.inner.renew(key, owner, self.grant(ttl)).await
    }
    fn watcher(&self) -> Option<&dyn WatchStore> {
        self.inner.watcher()
    }
    fn waiter(&self) -> Option<&dyn WaitStore> {
        self.inner.waiter()
    }
}

/// A 30 s lease with the defaults (renew every 10 s, calls bounded by 5 s).
fn config_30s() -> LeaseConfig {
    // The watchdog thread runs on the real clock; these tests run on the paused one.
    LeaseConfig::builder(30 * S)
        .watchdog_thread(false)
        .build()
        .unwrap()
}

fn client(store: Arc<dyn Store>, cfg: LeaseConfig) -> LeaseClient {
    LeaseClient::with_rng(store, cfg, StdRng::seed_from_u64(7))
}

fn key() -> Key {
    Key::new("job:granted").unwrap()
}

/// Samples `lease`'s validity every 50 ms for `hold`, and fails at the first instant it
/// is not valid.
async fn hold_and_sample(lease: &leasehold_core::Lease, started: Instant, hold: Duration) {
    while Instant::now() - started < hold {
        assert!(
            lease.is_valid(),
            "lost {:?} after {:?} of {hold:?} (granted ttl {:?})",
            lease.lost_reason(),
            Instant::now() - started,
            lease.ttl()
        );
        sleep(50 * MS).await;
    }
}

/// The case of the issue: a 30 s lease on a store that grants 10 s. The heartbeat renews
/// every third of the *granted* TTL, so the first renewal goes out long before the 10 s
/// grant's deadline, and the lease is held over many renewal intervals.
#[tokio::test(start_paused = true)]
async fn a_shorter_grant_is_renewed_before_its_own_deadline() {
    let store = Capped::new(10 * S);
    let cfg = config_30s();
    let c = client(Arc::new(store.clone()), cfg.clone());
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(lease.ttl(), 10 * S, "the lease reports the TTL granted");
    let deadline = lease.valid_until() - sent;
    assert_eq!(deadline, cfg.validity(10 * S));
    hold_and_sample(&lease, sent, 20 * (10 * S) / 3).await;
    let renewals = store.renewals_since(sent);
    assert!(
        renewals[0] < deadline,
        "first renewal at {:?}, after the deadline {deadline:?}",
        renewals[0]
    );
    // The granted TTL's defaults: every 10 s / 3 (tokio's timers fire on whole
    // milliseconds, rounded up).
    let interval = Duration::from_nanos(3_333_333_333);
    let on_time = |d: Duration| d >= interval && d <= interval + MS;
    assert!(on_time(renewals[0]), "{renewals:?}");
    assert!(renewals.len() >= 19, "{renewals:?}");
    for pair in renewals.windows(2) {
        assert!(on_time(pair[1] - pair[0]), "{renewals:?}");
    }
    assert_eq!(lease.ttl(), 10 * S);
    assert!(lease.release().await.unwrap());
}

/// A renewal that reports a shorter TTL than the grant before it: the next renewal is
/// scheduled from the TTL that renewal reported.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_grants_less_reschedules_from_its_ttl() {
    let store = Capped::default();
    let c = client(Arc::new(store.clone()), config_30s());
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(lease.ttl(), 30 * S);
    store.set_cap(Some(6 * S));
    hold_and_sample(&lease, sent, 60 * S).await;
    let renewals = store.renewals_since(sent);
    assert_eq!(
        renewals[0],
        10 * S,
        "the 30 s grant's interval: {renewals:?}"
    );
    assert_eq!(
        renewals[1] - renewals[0],
        2 * S,
        "the 6 s grant's interval: {renewals:?}"
    );
    assert_eq!(lease.ttl(), 6 * S, "the TTL the last renewal granted");
    drop(lease);
}

/// A renewal that grants less moved the store's expiry earlier: the holder's deadline
/// follows it down (it is not kept at the longer grant's), and so does the watchdog.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_grants_less_shortens_the_deadline() {
    let store = Capped::default();
    let cfg = config_30s();
    let c = client(Arc::new(store.clone()), cfg.clone());
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(lease.valid_until() - sent, cfg.validity(30 * S));
    store.set_cap(Some(6 * S));
    sleep(10 * S + MS).await;
    let renewals = store.renewals_since(sent);
    assert_eq!(renewals, [10 * S], "one renewal so far");
    assert_eq!(lease.ttl(), 6 * S);
    assert_eq!(
        lease.valid_until() - sent,
        10 * S + cfg.validity(6 * S),
        "the deadline of the 6 s grant, not that of the 30 s one before it"
    );
    drop(lease);
}

/// On the real clock, with the runtime starved right after a renewal that granted less:
/// the watchdog thread fires the lost signal at the shorter grant's deadline, not at the
/// longer one it was first given.
#[test]
fn the_watchdog_follows_a_deadline_moved_earlier() {
    use std::time::Instant as StdInstant;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ttl = 3 * S;
    let cfg = LeaseConfig::new(ttl).unwrap();
    let store = Capped::default();
    let before = StdInstant::now();
    let (lease, watcher) = rt.block_on(async {
        let c = LeaseClient::new(Arc::new(store.clone()), cfg.clone());
        let lease = c.try_acquire(key()).await.unwrap();
        let token = lease.lost_token();
        let watcher = std::thread::spawn(move || {
            futures::executor::block_on(token.cancelled());
            StdInstant::now()
        });
        store.set_cap(Some(600 * MS));
        // The first renewal (at 1 s) grants 600 ms: renewed again every 200 ms.
        while lease.ttl() != 600 * MS {
            assert!(lease.is_valid(), "{:?}", lease.lost_reason());
            sleep(MS).await;
        }
        (lease, watcher)
    });
    let renewed = store.renewals.lock().unwrap()[0].into_std();
    let deadline = lease.valid_until().into_std();
    assert!(deadline <= renewed + cfg.validity(600 * MS));
    // Starve the runtime: no renewal, no scheduler check, for longer than the first grant.
    rt.block_on(async { std::thread::sleep(ttl) });
    let fired = watcher.join().unwrap();
    assert!(fired >= deadline, "fired {:?} early", deadline - fired);
    assert!(
        fired < before + cfg.validity(ttl),
        "fired {:?} after the renewal: at the first grant's deadline, not the renewal's",
        fired - renewed
    );
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    rt.block_on(async { drop(lease) });
}

/// The same-owner re-acquire (a retry after the reply of a granted acquire was lost) is
/// timed from the TTL granted too.
#[tokio::test(start_paused = true)]
async fn a_same_owner_reacquire_is_timed_from_the_grant() {
    let store = Capped::new(10 * S);
    let faulty = Arc::new(FaultStore::new(Arc::new(store.clone())));
    faulty.inject(Op::Acquire, Injection::AmbiguousAfterApply);
    let c = client(faulty.clone(), config_30s());
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(faulty.take_swallowed().len(), 1, "the first reply was lost");
    assert_eq!(lease.ttl(), 10 * S);
    hold_and_sample(&lease, sent, 60 * S).await;
    drop(lease);
}

/// A semaphore's permits and an election's leadership take their leases through the same
/// path: timed from the grant as well.
#[tokio::test(start_paused = true)]
async fn permits_and_leadership_are_timed_from_the_grant() {
    let store = Capped::new(10 * S);
    let c = client(Arc::new(store.clone()), config_30s());
    let sem = c.semaphore("pool:granted", 2).unwrap();
    let sent = Instant::now();
    let permit = sem.try_acquire().await.unwrap();
    assert_eq!(permit.lease().ttl(), 10 * S);
    let leadership = c
        .election("leader:granted")
        .unwrap()
        .campaign(b"me".to_vec(), S)
        .await
        .unwrap();
    assert_eq!(leadership.lease().ttl(), 10 * S);
    while Instant::now() - sent < 60 * S {
        assert!(
            permit.lease().is_valid(),
            "{:?}",
            permit.lease().lost_reason()
        );
        assert!(
            leadership.is_leader(),
            "{:?}",
            leadership.lease().lost_reason()
        );
        sleep(50 * MS).await;
    }
    drop((permit, leadership));
}

/// `max_hold` is an absolute duration: a shorter grant neither shortens nor lengthens it.
#[tokio::test(start_paused = true)]
async fn max_hold_does_not_follow_the_grant() {
    let store = Capped::new(10 * S);
    let cfg = LeaseConfig::builder(30 * S)
        .watchdog_thread(false)
        .max_hold(25 * S)
        .build()
        .unwrap();
    let c = client(Arc::new(store.clone()), cfg);
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(lease.lost().await, LostReason::MaxHoldExceeded);
    assert_eq!(Instant::now() - sent, 25 * S);
}

/// A configuration whose fixed margin (5 s) leaves room to renew a 30 s lease but not a
/// 6 s one.
fn tight_config() -> LeaseConfig {
    LeaseConfig::builder(30 * S)
        .watchdog_thread(false)
        .renew_interval(10 * S)
        .op_timeout(14 * S)
        .margin(5 * S)
        .build()
        .unwrap()
}

/// Polls until nothing holds `key` in `store` (the background release was answered),
/// within `bound` of paused time.
async fn until_free(store: &dyn Store, key: &Key, bound: Duration) {
    let start = Instant::now();
    while store.inspect(key).await.unwrap().is_some() {
        assert!(
            Instant::now() - start < bound,
            "{key} still held after {bound:?}"
        );
        sleep(MS).await;
    }
}

/// A grant that fails the configuration's own fit check is refused with an error naming
/// both TTLs, and released at once, not handed out to be lost later.
#[tokio::test(start_paused = true)]
async fn a_grant_with_no_room_to_renew_is_refused_and_released() {
    let store = Capped::new(6 * S);
    let c = client(Arc::new(store.clone()), tight_config());
    let started = Instant::now();
    let err = c.try_acquire(key()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("30s") && text.contains("6s"),
        "the error names both TTLs: {text}"
    );
    assert_eq!(err.action(), Action::Reconfigure, "{err:?}");
    assert!(
        matches!(
            err,
            Error::InvalidConfig(ConfigError::GrantTooShort { asked, granted, .. })
                if asked == 30 * S && granted == 6 * S
        ),
        "{err:?}"
    );
    until_free(&store, &key(), 14 * S).await;
    assert!(Instant::now() - started < S, "released at once");
    // The same key, on a store that grants what is asked, is taken at once.
    store.set_cap(None);
    let lease = c.try_acquire(key()).await.unwrap();
    assert_eq!(lease.ttl(), 30 * S);
    drop(lease);
}

/// The refusal holds on the semaphore path too: the permit granted is released.
#[tokio::test(start_paused = true)]
async fn a_permit_with_no_room_to_renew_is_refused_and_released() {
    let store = Capped::new(6 * S);
    let c = client(Arc::new(store.clone()), tight_config());
    let sem = c.semaphore("pool:tight", 2).unwrap();
    let err = sem.try_acquire().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig(ConfigError::GrantTooShort { asked, granted, .. })
                if asked == 30 * S && granted == 6 * S
        ),
        "{err:?}"
    );
    for slot in 0..2 {
        until_free(&store, sem.slot_key(slot).unwrap(), 14 * S).await;
    }
}

/// The log lines written while a test runs, for the warnings the core logs.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

impl Logged {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }
}

impl std::io::Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A renewal that grants too little to renew in time keeps the lease until its deadline
/// (the grant is right for that long) and says so once, when the granted TTL changes to
/// it: not at every later renewal that grants the same.
#[tokio::test(start_paused = true)]
async fn a_renewal_granting_too_little_to_renew_in_time_is_warned_about_once() {
    const WARNING: &str = "a renewal granted a ttl too short to renew in time";
    let logged = Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test's runtime has one thread: the scheduler task logs through this default.
    let _default = tracing::subscriber::set_default(subscriber);
    let store = Capped::default();
    let c = client(Arc::new(store.clone()), tight_config());
    let sent = Instant::now();
    let lease = c.try_acquire(key()).await.unwrap();
    store.set_cap(Some(6 * S));
    while lease.ttl() != 6 * S {
        assert!(lease.is_valid(), "{:?}", lease.lost_reason());
        sleep(MS).await;
    }
    assert_eq!(store.renewals_since(sent).len(), 1, "the first renewal");
    assert_eq!(
        logged.count(WARNING),
        1,
        "warned at the renewal that changed the TTL"
    );
    // Renewed again at the same short grant: no second warning.
    while store.renewals_since(sent).len() < 2 && lease.is_valid() {
        sleep(MS).await;
    }
    sleep(MS).await;
    assert_eq!(
        logged.count(WARNING),
        1,
        "not warned again for the same grant"
    );
    drop(lease);
}
