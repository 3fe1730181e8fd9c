//! GET_LOCK session faults.
//!
//! - `killed_session_loses_lease_and_another_acquires` (docs/faults.md row 19): `KILL` of the holder's
//!   connection fires its lost signal within one renew interval and another store takes
//!   the lease with a higher fence; then a break from another store (which `KILL`s the
//!   holder's session) does the same.
//! - `holder_process_paused_past_its_ttl_keeps_the_lock_until_it_wakes` (docs/faults.md row 1
//!   for a session-bound store): a frozen holder process keeps its session, so the lock
//!   outlives the TTL until it wakes, then its lost signal fires and only then is the lock
//!   free; `holder_process_killed_frees_the_lock_at_once` (row 3): a `kill -9`ed holder
//!   frees it at once.
//!
//! - `renewal_timeout_loses_lease_before_lock_is_free` (issue 10.2, docs/faults.md row 7): a renewal
//!   blackholed past the store's operation bound makes the keeper end its session (which
//!   frees the lock); the holder must be told `NotOwner` by that very renewal, so that no
//!   other process ever holds the lock while the first still believes it holds the lease.
//! - `renewal_abandoned_by_its_caller_keeps_the_lock_until_lost_is_reported`: the same when
//!   the heartbeat's own bound is the shorter one and it gives up on the renewal before the
//!   keeper does: the lock must stay held until the holder has been told it lost it.
//! - `a_timed_out_renewal_keeps_the_lock_until_the_loss_is_recorded_on_the_lease` (issue
//!   24.6): the timed-out renewal shares its batch with a slow one, so its `NotOwner` is
//!   taken in only when the slow one answers: the keeper records the loss on the lease
//!   before it lets the session go.
//! - `crash_restart_…` and `clean_restart_loses_the_lease_before_the_restarted_server_grants_it`
//!   (issue 24.3, docs/faults.md row 9): the server's end is seen on the store's server watch session,
//!   and the holder loses its lease before the restarted server can grant the lock to a
//!   contender that tries every 2 ms; fences keep rising.
//!
//! Child processes are this test binary run again with the spawning test selected and
//! `LEASEHOLD_MYSQL_WORKER` set: that test runs the worker instead of its body
//! (`run_worker_if_child`). No test exists only to be a worker.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::takeover::{self, assert_lost_before_the_takeover, restart_takeover};
use leasehold_core::{
    AcquireOutcome, Error, Fence, Key, Lease, LeaseClient, LeaseConfig, LostReason, OwnerToken,
    RenewOutcome, Store, StoreError, StoreErrorKind,
};
use leasehold_mysql::{MySqlGetLockStore, lock_name};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{FaultProxy, ProxyMode, WorkerProcess};
use tokio::time::{Instant, sleep, timeout};

const WORKER_ENV: &str = "LEASEHOLD_MYSQL_WORKER";
const LONG: Duration = Duration::from_secs(60);

fn config() -> LeaseConfig {
    LeaseConfig::new(common::TTL).unwrap()
}

async fn open(url: &str) -> Arc<MySqlGetLockStore> {
    Arc::new(
        MySqlGetLockStore::open(&format!("{url}?timeout=1s&connect_timeout=2s"))
            .await
            .expect("open the store"),
    )
}

fn getlock_url(db: &common::Server) -> String {
    db.url().replacen("mysql://", "mysql+getlock://", 1)
}

/// In a child process started by [`worker`]: holds `gl:held` (`@held <fence>`) until its
/// lost signal fires (`@lost <reason> <when, CLOCK_BOOTTIME µs>`), then waits to be killed; returns `true` so the
/// test returns. In the test process: `false`.
async fn run_worker_if_child() -> bool {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return false;
    };
    let store = open(&url).await;
    let client = LeaseClient::new(store, config());
    let lease = client.try_acquire("gl:held").await.expect("acquire");
    println!("@held {}", lease.fence().get());
    let reason = lease.lost().await;
    // When the library declared it lost, on CLOCK_BOOTTIME (every process's clock).
    let lost_at = lease.lost().lost_at().expect("the lost signal fired");
    let ago = tokio::time::Instant::now().saturating_duration_since(lost_at);
    let now = leasehold_core::clock::boottime().expect("CLOCK_BOOTTIME");
    println!("@lost {} {}", reason.as_str(), (now - ago).as_micros());
    sleep(LONG).await;
    true
}

/// Starts this test binary again running only `test` (the caller, which begins with
/// `run_worker_if_child`), as the worker.
fn worker(test: &str, url: &str) -> WorkerProcess {
    let mut cmd = WorkerProcess::test_command(test);
    cmd.env(WORKER_ENV, url);
    WorkerProcess::spawn(cmd)
}

fn wait_line(w: &WorkerProcess, prefix: &str) -> String {
    let prefixed = format!("@{prefix}");
    tokio::task::block_in_place(|| w.wait_for_line(|l| l.starts_with(&prefixed), LONG))
        .unwrap_or_else(|| panic!("no `{prefix}` line from the worker: {:?}", w.lines()))
        .trim_start_matches('@')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_session_loses_lease_and_another_acquires() {
    let db = common::start_db();
    let admin = common::admin(&db).await;
    let url = getlock_url(&db);
    let a = open(&url).await;
    let b = open(&url).await;
    let key = Key::new("job:killed").unwrap();

    let client_a = LeaseClient::new(a.clone(), config());
    let lease = client_a.try_acquire(&key).await.unwrap();
    let id = a.connection_id(&key).expect("A holds a session");
    let used: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
        .bind(lock_name(&key))
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(
        used,
        Some(id),
        "the store reports the session holding the lock"
    );
    // B cannot take it while A's session lives.
    let client_b = LeaseClient::new(b.clone(), config());
    assert!(matches!(
        client_b.try_acquire(&key).await,
        Err(Error::Contended {
            remaining: None,
            ..
        })
    ));

    let killed = common::kill_lock_holder(&admin, &key).await;
    assert_eq!(killed, id);
    let bound = config().renew_interval() + config().op_timeout() + Duration::from_secs(1);
    let reason = timeout(bound, lease.lost())
        .await
        .expect("lost fires within one renew interval after the KILL");
    // Its keeper's renewal fails on the dead session and records the loss on the lease.
    assert!(
        matches!(
            reason,
            LostReason::SessionEnded | LostReason::NotOwner | LostReason::RenewFailed { .. }
        ),
        "{reason:?}"
    );
    // Forgotten right after: the loss is recorded on the lease first.
    timeout(Duration::from_secs(5), async {
        while a.held_count() > 0 {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the dead session is forgotten");
    let taken = client_b
        .acquire(&key, common::TTL * 2)
        .await
        .expect("another store acquires after the KILL");
    assert!(taken.fence() > lease.fence());
    assert!(!lease.release().await.unwrap(), "A's release finds nothing");
    let info = b.inspect(&key).await.unwrap().expect("B holds");
    assert_eq!((info.owner, info.fence), (*taken.owner(), taken.fence()));

    // An operator breaks B's lease from A's store: B's session is KILLed, the fence moves.
    let broken = a.break_lease(&key).await.expect("break through KILL");
    assert!(broken > taken.fence());
    let reason = timeout(bound, taken.lost())
        .await
        .expect("B's lost fires after the break");
    assert!(
        matches!(
            reason,
            LostReason::SessionEnded | LostReason::NotOwner | LostReason::RenewFailed { .. }
        ),
        "{reason:?}"
    );
    assert_eq!(a.inspect(&key).await.unwrap(), None);
    let next = client_a
        .try_acquire(&key)
        .await
        .expect("free after the break");
    assert!(next.fence() > broken);
    assert!(next.release().await.unwrap());
}

/// docs/faults.md row 1 on `GET_LOCK`: a holder process frozen (`SIGSTOP`) past its TTL
/// keeps its session, so the lock outlives the TTL while it is frozen: a contender asking
/// every 50 ms for two TTLs is refused, and the store shows the frozen holder's fence. On
/// resume the holder learns it lost the lease, and only then does its keeper let the
/// session go: a contender asking every 2 ms from before the resume gets the lock after
/// the instant the holder's library declared the lease lost (both read on
/// `CLOCK_BOOTTIME`), with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_paused_past_its_ttl_keeps_the_lock_until_it_wakes() {
    const TEST: &str = "holder_process_paused_past_its_ttl_keeps_the_lock_until_it_wakes";
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::MysqlGetlock, Fault::ProcessPause);
    let db = common::start_db();
    let url = getlock_url(&db);
    let store = open(&url).await;
    let key = Key::new("gl:held").unwrap();
    let holder = worker(TEST, &url);
    let held: u64 = wait_line(&holder, "held")[5..].parse().unwrap();
    tokio::task::block_in_place(|| holder.pause());
    let paused_at = Instant::now();
    let other = OwnerToken::random();
    let mut refused = 0;
    while paused_at.elapsed() < common::TTL * 2 {
        match store.acquire(&key, &other, common::TTL).await.unwrap() {
            AcquireOutcome::Held { .. } => refused += 1,
            got => panic!("a contender got the lock of a frozen holder: {got:?}"),
        }
        let info = store.inspect(&key).await.unwrap().expect("visible as held");
        assert_eq!(info.fence.get(), held, "the frozen holder's lease");
        sleep(Duration::from_millis(50)).await;
    }
    assert!(refused >= 5, "the contender asked only {refused} times");
    let contender = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(AcquireOutcome::Acquired { fence, .. }) =
                    store.acquire(&key, &other, common::TTL).await
                {
                    let at = leasehold_core::clock::boottime().expect("CLOCK_BOOTTIME");
                    return (at.as_micros(), fence);
                }
                sleep(Duration::from_millis(2)).await;
            }
        })
    };
    sleep(Duration::from_millis(100)).await;
    assert!(
        !contender.is_finished(),
        "the contender got the lock while the holder was frozen"
    );
    holder.resume();
    let lost = wait_line(&holder, "lost");
    let words: Vec<&str> = lost.split_whitespace().collect();
    assert!(
        ["expired", "not_owner", "renew_failed"].contains(&words[1]),
        "{lost}"
    );
    let lost_at: u128 = words[2].parse().unwrap();
    let (got_at, fence) = timeout(LONG, contender)
        .await
        .expect("free once the holder woke up")
        .unwrap();
    assert!(
        lost_at <= got_at,
        "the contender got the lock {} µs before the frozen holder learned it had lost it",
        lost_at - got_at
    );
    eprintln!(
        "the contender got the lock {} µs after the holder learned it had lost it",
        got_at - lost_at
    );
    assert!(
        fence.get() > held,
        "the next fence {fence} must be above {held}"
    );
    assert_eq!(
        store.release(&key, &other).await.unwrap(),
        leasehold_core::ReleaseOutcome::Released
    );
}

/// docs/faults.md row 3 on `GET_LOCK`: while a holder process lives nobody else gets the
/// lock; once it is killed (`kill -9`) the server ends its session and frees the lock at
/// once (here: within two TTLs), with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_killed_frees_the_lock_at_once() {
    const TEST: &str = "holder_process_killed_frees_the_lock_at_once";
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::MysqlGetlock, Fault::HolderCrash);
    let db = common::start_db();
    let url = getlock_url(&db);
    let store = open(&url).await;
    let client = LeaseClient::new(store.clone(), config());
    let key = Key::new("gl:held").unwrap();
    let holder = worker(TEST, &url);
    let held: u64 = wait_line(&holder, "held")[5..].parse().unwrap();
    assert!(
        matches!(client.try_acquire(&key).await, Err(Error::Contended { .. })),
        "a live holder's lock was granted to another owner"
    );
    tokio::task::block_in_place(|| holder.kill());
    let killed_at = Instant::now();
    let lease = client
        .acquire(&key, common::TTL * 3)
        .await
        .expect("free after kill -9");
    assert!(lease.fence().get() > held);
    assert!(
        killed_at.elapsed() < common::TTL * 2,
        "takeover took {:?}",
        killed_at.elapsed()
    );
    assert!(lease.release().await.unwrap());
}

/// What one renewal through [`Recorded`] returned, and when.
type Renewal = (Instant, Result<RenewOutcome, StoreErrorKind>);

/// A store that delegates to the GET_LOCK store and records every renewal that returned
/// (a renewal whose caller gave up first is not recorded).
#[derive(Debug)]
struct Recorded {
    inner: Arc<MySqlGetLockStore>,
    renewals: Mutex<Vec<Renewal>>,
}

impl Recorded {
    fn renewals(&self) -> Vec<Renewal> {
        self.renewals.lock().unwrap().clone()
    }
}

#[async_trait]
impl leasehold_core::wrap::Forward for Recorded {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let r = self.inner.renew(key, owner, ttl).await;
        let seen = r.as_ref().copied().map_err(StoreError::kind);
        self.renewals.lock().unwrap().push((Instant::now(), seen));
        r
    }
}

/// What happened when a renewal of A's lease was blackholed.
struct Takeover {
    /// A's renewals after the blackhole began.
    renewals: Vec<Renewal>,
    /// When A's keeper let its session go (A's store no longer lists the lease).
    session_ended: Instant,
    /// When A's lost signal fired, and why.
    lost: (Instant, LostReason),
    /// When B's acquire returned, and whether A still believed it held the lease then.
    taken: (Instant, bool),
    fences: (Fence, Fence),
}

/// A holds `key` through a fault proxy with the store bound `store_timeout` and the
/// heartbeat configuration `config`; right after a successful renewal the proxy blackholes
/// A's traffic. As soon as A's keeper has ended its session (its store forgets the lease;
/// the socket's end is held by the blackhole), the proxy passes again, so the server frees
/// the lock at once. Meanwhile B, straight to the server, tries to acquire every few
/// milliseconds, and looks at A's lease the moment it gets the lock.
async fn blackholed_renewal(key: &str, store_timeout: &str, config: LeaseConfig) -> Takeover {
    let db = common::start_db();
    let proxy = FaultProxy::start(db.addr());
    let a_store = Arc::new(
        MySqlGetLockStore::open(&format!(
            "mysql+getlock://root@127.0.0.1:{}/test?timeout={store_timeout}&connect_timeout=2s",
            proxy.port()
        ))
        .await
        .expect("open A's store"),
    );
    let recorded = Arc::new(Recorded {
        inner: a_store.clone(),
        renewals: Mutex::default(),
    });
    let client_a = LeaseClient::new(recorded.clone(), config);
    let client_b = LeaseClient::new(open(&getlock_url(&db)).await, self::config());
    let key = Key::new(key).unwrap();

    let lease: Arc<Lease> = Arc::new(client_a.try_acquire(&key).await.expect("A acquires"));
    timeout(LONG, async {
        while !recorded
            .renewals()
            .iter()
            .any(|(_, r)| matches!(r, Ok(RenewOutcome::Renewed { .. })))
        {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("A renews once through the healthy proxy");
    let healthy = recorded.renewals().len();
    proxy.set_mode(ProxyMode::Blackhole);

    let lost = {
        let signal = lease.lost();
        tokio::spawn(async move {
            let reason = signal.wait().await;
            (Instant::now(), reason)
        })
    };
    let taker = {
        let lease = lease.clone();
        let key = key.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(taken) = client_b.try_acquire(&key).await {
                    let at = Instant::now();
                    let a_believes = lease.is_valid();
                    return (at, a_believes, taken);
                }
                sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let session_ended = timeout(LONG, async {
        while a_store.held_count() > 0 {
            sleep(Duration::from_millis(2)).await;
        }
        Instant::now()
    })
    .await
    .expect("A's keeper ends its session");
    proxy.set_mode(ProxyMode::Pass);

    let (taken_at, a_believes, taken) = timeout(LONG, taker)
        .await
        .expect("B acquires once A's session is gone")
        .unwrap();
    let lost = timeout(LONG, lost)
        .await
        .expect("A's lost signal fires")
        .unwrap();
    let renewals = recorded.renewals()[healthy..].to_vec();
    let fences = (lease.fence(), taken.fence());
    assert!(taken.release().await.unwrap());
    Takeover {
        renewals,
        session_ended,
        lost,
        taken: (taken_at, a_believes),
        fences,
    }
}

/// No moment where B holds the lock while A believes it holds the lease.
fn assert_no_overlap(t: &Takeover) {
    let (lost_at, reason) = t.lost;
    let (taken_at, a_believes) = t.taken;
    assert!(
        !a_believes && lost_at <= taken_at,
        "B acquired fence {} while A (fence {}) still believed it held the lease: A lost it \
         ({reason:?}) {:?} after B got it; A's keeper ended its session {:?} before B got it; \
         A's renewals since the blackhole: {:?}",
        t.fences.1.get(),
        t.fences.0.get(),
        lost_at.saturating_duration_since(taken_at),
        taken_at.saturating_duration_since(t.session_ended),
        t.renewals,
    );
    assert!(t.fences.1 > t.fences.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_timeout_loses_lease_before_lock_is_free() {
    let _proof = proves(Backend::MysqlGetlock, Fault::NetworkPartition);
    // The keeper's bound (the store's `timeout`, 400 ms) is well under the heartbeat's
    // (1 s), so the keeper answers that renewal itself.
    let config = LeaseConfig::builder(Duration::from_secs(3))
        .op_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let t = blackholed_renewal("job:slow-renew", "400ms", config).await;
    assert_no_overlap(&t);
    let (lost_at, reason) = t.lost;
    // Recorded on the lease by the keeper before it let the session go.
    assert_eq!(reason, LostReason::SessionEnded, "{:?}", t.renewals);
    // The very renewal that timed out reports the loss: no retryable error first.
    let (answered_at, answer) = *t
        .renewals
        .iter()
        .find(|(_, r)| !matches!(r, Ok(RenewOutcome::Renewed { .. })))
        .expect("a renewal failed");
    assert_eq!(
        answer,
        Ok(RenewOutcome::NotOwner),
        "the renewal that timed out: {:?}",
        t.renewals
    );
    assert!(
        lost_at.saturating_duration_since(answered_at) < Duration::from_secs(1),
        "lost fired {:?} after the renewal answered",
        lost_at.saturating_duration_since(answered_at)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_abandoned_by_its_caller_keeps_the_lock_until_lost_is_reported() {
    let _proof = proves(Backend::MysqlGetlock, Fault::NetworkPartition);
    // The heartbeat gives up on a renewal after 300 ms, the keeper only after 1 s: by then
    // nobody waits for its answer. Retries come 300 ms apart; 3 failures lose the lease.
    let config = LeaseConfig::builder(Duration::from_secs(3))
        .renew_interval(Duration::from_millis(1200))
        .op_timeout(Duration::from_millis(300))
        .renew_failures_before_lost(3)
        .build()
        .unwrap();
    let t = blackholed_renewal("job:abandoned-renew", "1s", config).await;
    assert_no_overlap(&t);
    // The keeper records the loss on the lease when it gives up on the session (after the
    // heartbeat gave up on the renewal); a retry told `NotOwner` first, or on a starved
    // machine the validity deadline, may come before.
    assert!(
        matches!(
            t.lost.1,
            LostReason::SessionEnded | LostReason::NotOwner | LostReason::Expired
        ),
        "{:?}: {:?}",
        t.lost.1,
        t.renewals
    );
}

/// The contender probe of issue 24.3 ([`leasehold_conformance::takeover`]): B is another
/// store on the same server.
async fn restart_probe(key: &str, restart: fn(&common::Server)) -> takeover::Takeover {
    let db = Arc::new(common::start_db());
    let url = getlock_url(&db);
    let (a, b) = (open(&url).await, open(&url).await);
    let server = db.clone();
    let t = restart_takeover(a, b, key, Duration::from_secs(2), move || restart(&server)).await;
    drop(db); // The server lives until the probe has seen the takeover.
    t
}

/// Issue 24.3, docs/faults.md row 9 for `GET_LOCK`: the server killed (`kill -9`: the kernel closes
/// every session's socket) and started again: A loses its lease before the restarted
/// server can grant the lock to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_restart_loses_the_lease_before_the_restarted_server_grants_it() {
    let _proof = proves(Backend::MysqlGetlock, Fault::RestartWithPersistence);
    let t = restart_probe("gl:crash-probe", |db| db.restart()).await;
    assert_lost_before_the_takeover(&t);
}

/// The same with a clean shutdown (`SIGTERM`: the server ends every session, then stops)
/// and a start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restart_loses_the_lease_before_the_restarted_server_grants_it() {
    let _proof = proves(Backend::MysqlGetlock, Fault::RestartWithPersistence);
    let t = restart_probe("gl:clean-probe", |db| {
        db.stop();
        db.start_again();
    })
    .await;
    assert_lost_before_the_takeover(&t);
}

/// The GET_LOCK store through which the renewal of `slow` answers late and the renewal of
/// every other key times out, in the same batch: once armed, `slow`'s renewal is served
/// first, then the proxy blackholes the store's traffic (so the other renewals get no
/// answer and their keeper gives up on them), and `slow`'s answer is held back a while.
#[derive(Debug)]
struct SlowBatch {
    inner: Arc<MySqlGetLockStore>,
    proxy: Arc<FaultProxy>,
    slow: Key,
    hold_back: Duration,
    armed: std::sync::atomic::AtomicBool,
    blackholed: tokio::sync::watch::Sender<bool>,
}

#[async_trait]
impl leasehold_core::wrap::Forward for SlowBatch {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        if !self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return self.inner.renew(key, owner, ttl).await;
        }
        if *key == self.slow {
            let r = self.inner.renew(key, owner, ttl).await;
            self.proxy.set_mode(ProxyMode::Blackhole);
            self.blackholed.send_replace(true);
            sleep(self.hold_back).await;
            return r;
        }
        let mut blackholed = self.blackholed.subscribe();
        let _ = blackholed.wait_for(|b| *b).await;
        self.inner.renew(key, owner, ttl).await
    }
}

/// Issue 24.6: a renewal that times out in the keeper (400 ms) is answered `NotOwner`, but
/// its batch is handed to the heartbeat only when the slowest renewal in it answers
/// (900 ms, under the heartbeat's 1 s bound): the lock must stay held until the loss is
/// recorded on the lease. B tries the lock every 2 ms from the moment A's keeper has let the
/// session go (the proxy then passes again, so the server frees the lock at once) and reads
/// A's `is_valid()` the moment it gets the lock: it must already be false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_renewal_keeps_the_lock_until_the_loss_is_recorded_on_the_lease() {
    let _proof = proves(Backend::MysqlGetlock, Fault::NetworkPartition);
    let db = common::start_db();
    let proxy = Arc::new(FaultProxy::start(db.addr()));
    // B's store, opened first with the usual bounds, creates the schema; A's, whose 400 ms
    // bound is the keeper's under test, does not (a slow machine could miss it there).
    let b_store = open(&getlock_url(&db)).await;
    let a_store = Arc::new(
        MySqlGetLockStore::open(&format!(
            "mysql+getlock://root@127.0.0.1:{}/test?timeout=400ms&connect_timeout=2s&migrate=false",
            proxy.port()
        ))
        .await
        .expect("open A's store"),
    );
    let store = Arc::new(SlowBatch {
        inner: a_store.clone(),
        proxy: proxy.clone(),
        slow: Key::new("gl:batch-slow").unwrap(),
        hold_back: Duration::from_millis(900),
        armed: false.into(),
        blackholed: tokio::sync::watch::Sender::new(false),
    });
    let config = LeaseConfig::builder(Duration::from_secs(3))
        .renew_interval(Duration::from_millis(1200))
        .op_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let client_a = LeaseClient::new(store.clone(), config);
    let client_b = LeaseClient::new(b_store, self::config());
    // Acquired together: their renewals fall into one batch.
    let timed_out = Arc::new(client_a.try_acquire("gl:batch-timed-out").await.unwrap());
    let slow = client_a.try_acquire("gl:batch-slow").await.unwrap();
    store.armed.store(true, std::sync::atomic::Ordering::SeqCst);

    let lost = {
        let signal = timed_out.lost();
        tokio::spawn(async move {
            let reason = signal.wait().await;
            (Instant::now(), reason)
        })
    };
    timeout(LONG, async {
        while a_store.held_count() > 1 {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("A's keeper lets the timed-out lease's session go");
    proxy.set_mode(ProxyMode::Pass);
    let (b_sent, a_valid_at_send, a_valid, taken) = timeout(LONG, async {
        loop {
            let a_valid_at_send = timed_out.is_valid();
            let sent = Instant::now();
            if let Ok(taken) = client_b.try_acquire("gl:batch-timed-out").await {
                return (sent, a_valid_at_send, timed_out.is_valid(), taken);
            }
            sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("B acquires once A's session is gone");
    let (lost_at, reason) = timeout(LONG, lost).await.expect("A's lost fires").unwrap();
    assert!(
        !a_valid_at_send && !a_valid,
        "B got the lock (fence {}) while A's lease (fence {}) was still valid (when B sent \
         its acquire: {a_valid_at_send}, when B got it: {a_valid}); A's lost signal \
         ({reason:?}) was seen {:?} after B sent it",
        taken.fence().get(),
        timed_out.fence().get(),
        lost_at.saturating_duration_since(b_sent),
    );
    assert_eq!(reason, LostReason::SessionEnded);
    assert!(taken.fence() > timed_out.fence());
    assert!(taken.release().await.unwrap());
    drop(slow);
}

/// Issue 24.6 without a client: a renewal that times out in the keeper is answered
/// `NotOwner`, but no lease client has the grant to record the loss on (a direct caller of
/// the store), so the keeper keeps the session, and the lock, until the TTL has passed
/// since the last renewal that went through was sent; then it lets it go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_callers_timed_out_renewal_keeps_the_lock_until_the_ttl() {
    let _proof = proves(Backend::MysqlGetlock, Fault::NetworkPartition);
    let db = common::start_db();
    let proxy = FaultProxy::start(db.addr());
    // B's store creates the schema with the usual bounds (as in the test above).
    let b = open(&getlock_url(&db)).await;
    let a = MySqlGetLockStore::open(&format!(
        "mysql+getlock://root@127.0.0.1:{}/test?timeout=400ms&connect_timeout=2s&migrate=false",
        proxy.port()
    ))
    .await
    .expect("open A's store");
    let key = Key::new("gl:direct").unwrap();
    let (owner, ttl) = (OwnerToken::random(), Duration::from_secs(3));
    assert!(matches!(
        a.acquire(&key, &owner, ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let renewed_at = Instant::now();
    assert!(matches!(
        a.renew(&key, &owner, ttl).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    proxy.set_mode(ProxyMode::Blackhole);
    assert_eq!(
        a.renew(&key, &owner, ttl).await.unwrap(),
        RenewOutcome::NotOwner,
        "the renewal that timed out"
    );
    // A session the keeper closed now would free the lock at once.
    proxy.set_mode(ProxyMode::Pass);
    let taken_at = timeout(LONG, async {
        let other = OwnerToken::random();
        loop {
            if let Ok(AcquireOutcome::Acquired { .. }) = b.acquire(&key, &other, ttl).await {
                return Instant::now();
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the lock is let go after the TTL");
    assert!(
        taken_at >= renewed_at + ttl,
        "the lock was let go {:?} after the last renewal was sent, before the TTL ({ttl:?})",
        taken_at - renewed_at
    );
}
