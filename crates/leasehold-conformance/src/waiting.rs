//! Waiting for a lease across store instances (as other processes would), one check for
//! every store whose `wait_released` is woken by a release made elsewhere (the SQL
//! stores). Not cases of the suite: the suite's fixture has one store instance, these need
//! several on the same database. Each takes `open`, which opens another store instance on
//! the same database or file each time it is called.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Backoff, Error, Fence, Key, LeaseClient, LeaseConfig, OwnerToken,
    ReleaseOutcome, Store, StoreError,
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

    // Expired: the holder (a bare store call, nothing renews it) holds for 2 s. The store
    // set the expiry when it ran the grant, after it was sent: so a wait that returns
    // before `sent + ttl` returned before the expiry, however late the grant's reply came
    // back (counting from the reply, a reply delayed under load passed for an early wake).
    let k = key("expiry");
    let ttl = Duration::from_secs(2);
    let sent = Instant::now();
    fence(
        holder
            .acquire(&k, &OwnerToken::random(), ttl)
            .await
            .unwrap(),
    );
    let w = OwnerToken::random();
    let wait = spawn_wait_as(&waiter, &k, &w, Duration::from_secs(60));
    timeout(ttl + SOON, wait)
        .await
        .expect("woken soon after the holder's expiry")
        .unwrap()
        .expect("wait_released ok");
    // 20 ms for the stores' own expiry granularity and the two clocks' rates.
    assert!(
        sent.elapsed() >= ttl - Duration::from_millis(20),
        "returned before the expiry: {:?} after the grant was sent",
        sent.elapsed()
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

/// Whether the store claims [`Capabilities::fifo_wait`] (a queue across processes), as
/// the suite's `fifo` arm requires and its `fifo_in_process` arm (a queue within one
/// process only, as SQLite's) forbids.
///
/// [`Capabilities::fifo_wait`]: leasehold_core::Capabilities::fifo_wait
pub async fn claims_fifo_wait(open: impl AsyncFn() -> Arc<dyn Store>, claimed: bool) {
    let store = open().await;
    assert_eq!(
        store.capabilities().fifo_wait,
        claimed,
        "fifo_wait claimed as the waiting suite's arm says"
    );
}

/// A waiting client on a store of its own, as another process.
fn spawn_waiting(client: LeaseClient, k: &Key) -> JoinHandle<Result<leasehold_core::Lease, Error>> {
    let k = k.clone();
    tokio::spawn(async move { client.acquire(k, Duration::from_secs(120)).await })
}

/// A waiter is queued when the holder releases: a newcomer's acquire right after the
/// release is told the lease is held, and the waiter gets it.
pub async fn a_newcomer_does_not_take_the_lease_past_a_waiter(
    open: impl AsyncFn() -> Arc<dyn Store>,
) {
    let holder = open().await;
    let newcomer = open().await;
    let k = key("barging");
    let h = OwnerToken::random();
    let first = fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let waiting = spawn_waiting(slow_polling_client(open().await), &k);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    match newcomer
        .acquire(&k, &OwnerToken::random(), LONG_TTL)
        .await
        .unwrap()
    {
        AcquireOutcome::Held { remaining } => assert!(remaining.is_some()),
        other => panic!("a newcomer took the lease past the waiter: {other:?}"),
    }
    let lease = timeout(SOON, waiting).await.unwrap().unwrap().unwrap();
    assert!(lease.fence() > first);
    assert!(lease.release().await.unwrap());
}

/// Three waiters, each a client on a store of its own (as three processes), queue one
/// after the other — each seen queued in the store before the next one asks: released,
/// they get the lease in the order they came.
pub async fn waiters_of_several_instances_are_served_in_arrival_order(
    open: impl AsyncFn() -> Arc<dyn Store>,
    queue: &Queueing,
) {
    let holder = open().await;
    let k = key("fifo");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let client = slow_polling_client(queue.wrap(open().await, i));
        let (got, key) = (got.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.acquire(key, Duration::from_secs(120)).await.unwrap();
            got.lock().unwrap().push(i);
            sleep(Duration::from_millis(300)).await;
            assert!(lease.release().await.unwrap());
        }));
        queue.until_queued(&k, i + 1, &format!("waiter {i}")).await;
    }
    holder.release(&k, &h).await.unwrap();
    for t in tasks {
        timeout(SOON * 2, t).await.expect("all served").unwrap();
    }
    assert_eq!(*got.lock().unwrap(), vec![0, 1, 2]);
}

/// What the contenders case records, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Contender `i` started waiting in the store ([`Queueing::wrap`]).
    Queued(usize),
    /// Contender `i` was granted the lease.
    Granted(usize),
}

/// `contenders` contenders, each on a store of its own (as many processes), loop on one
/// key: acquire with a wait, hold 3 ms, release, acquire again at once. Each has waited
/// once (on another key, uncounted) before the loops start, so that no counted wait is
/// the one that first opens a session to wait in. Each gets its
/// turns in arrival order: while a contender waits in the store's queue (from the moment
/// it is seen there to its grant), no other contender is granted the lease twice — once
/// for a contender ahead of it, and no more: one that came back after it queued is behind
/// it. A store whose queue is on a server ([`Queueing::Server`]) is allowed one turn more,
/// for a waiter whose request to join the queue was on its way when it was seen waiting.
/// The bound counts turns, not time: a slow machine changes when each turn comes, not
/// whose it is. Over 20 grants per contender, each also has between half and one and a
/// half times its share (a contender that is never passed over but rarely asks).
pub async fn contenders_take_turns_in_arrival_order(
    open: impl AsyncFn() -> Arc<dyn Store>,
    queue: &Queueing,
    contenders: usize,
) {
    let grants = 20 * contenders;
    let log = Arc::new(Mutex::new(Vec::<Turn>::new()));
    let granted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(contenders));
    let config = LeaseConfig::builder(Duration::from_secs(10))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(100)).unwrap())
        .build()
        .unwrap();
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..contenders {
        stores.push(open().await);
    }
    // Each contender waits once before the turns are counted (not logged): a store that
    // opens a session to wait in joins the server's queue only once it is connected, later
    // than its wait was seen, and connections open in no set order. After this every
    // contender has a session kept for its next wait.
    let holder = open().await;
    let warm = key("fair-warm");
    let h = OwnerToken::random();
    fence(holder.acquire(&warm, &h, LONG_TTL).await.unwrap());
    let mut warming = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let client = LeaseClient::new(queue.wrap(store.clone(), i), config.clone());
        let k = warm.clone();
        warming.push(tokio::spawn(async move {
            let lease = client.acquire(k, Duration::from_secs(60)).await.unwrap();
            assert!(lease.release().await.unwrap());
        }));
        queue
            .until_queued(&warm, i + 1, &format!("warm-up waiter {i}"))
            .await;
    }
    holder.release(&warm, &h).await.unwrap();
    for t in warming {
        timeout(SOON * 4, t)
            .await
            .expect("the warm-up ends")
            .unwrap();
    }
    let mut tasks = Vec::new();
    for (i, store) in stores.into_iter().enumerate() {
        let store = queue.wrap_logged(store, i, log.clone());
        let client = LeaseClient::new(store, config.clone());
        let (log, granted, start) = (log.clone(), granted.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            while granted.load(std::sync::atomic::Ordering::SeqCst) < grants {
                let lease = client
                    .acquire("wait:fair", Duration::from_secs(60))
                    .await
                    .expect("a turn within a minute");
                log.lock().unwrap().push(Turn::Granted(i));
                granted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                sleep(Duration::from_millis(3)).await;
                assert!(lease.release().await.unwrap());
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("the contenders finish")
            .unwrap();
    }
    let log = log.lock().unwrap().clone();
    let order: Vec<usize> = log
        .iter()
        .filter_map(|t| match t {
            Turn::Granted(i) => Some(*i),
            Turn::Queued(_) => None,
        })
        .take(grants)
        .collect();
    let allowed = match queue {
        Queueing::InProcess => 1,
        Queueing::Server(_) => 2,
    };
    // While each contender waits, nobody else gets more than `allowed` turns.
    let mut waiting: HashMap<usize, HashMap<usize, usize>> = HashMap::new();
    let mut waits = 0;
    for turn in &log {
        match *turn {
            Turn::Queued(i) => {
                waiting.entry(i).or_default();
            }
            Turn::Granted(j) => {
                if waiting.remove(&j).is_some() {
                    waits += 1;
                }
                for (i, others) in &mut waiting {
                    let n = others.entry(j).or_default();
                    *n += 1;
                    assert!(
                        *n <= allowed,
                        "contender {i} waited in the queue while {j} had {n} turns: {log:?}"
                    );
                }
            }
        }
    }
    assert!(
        waits >= grants / 2,
        "setup: too few turns were waited for in the queue ({waits} of {grants})"
    );
    let share = grants / contenders;
    let counts: Vec<usize> = (0..contenders)
        .map(|i| order.iter().filter(|&&j| j == i).count())
        .collect();
    assert!(
        counts.iter().all(|&c| c >= share / 2 && c <= share * 3 / 2),
        "turns per contender {counts:?}, share {share}"
    );
}

/// How the queue checks see a waiter queued in the store.
pub enum Queueing {
    /// The queue is in this process, and a waiter joins it when its `wait_released` is
    /// first polled (SQLite's): a waiter is queued once that first poll is over (seen
    /// through a wrapper of its store).
    InProcess,
    /// The queue is on the server: how many owners wait in it for a key, read there.
    Server(Box<dyn crate::Queue>),
}

impl std::fmt::Debug for Queueing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InProcess => f.write_str("InProcess"),
            Self::Server(_) => f.write_str("Server(..)"),
        }
    }
}

impl Queueing {
    /// `store` as waiter `i` uses it: for [`Queueing::InProcess`], wrapped so that its waits
    /// are seen.
    fn wrap(&self, store: Arc<dyn Store>, i: usize) -> Arc<dyn Store> {
        self.wrap_with(store, i, None)
    }

    /// [`wrap`](Self::wrap), and each wait of waiter `i` noted in `log` once the waiter is
    /// queued (on a server queue: once it is seen waiting, its request to join the queue
    /// on its way).
    fn wrap_logged(
        &self,
        store: Arc<dyn Store>,
        i: usize,
        log: Arc<Mutex<Vec<Turn>>>,
    ) -> Arc<dyn Store> {
        self.wrap_with(store, i, Some(log))
    }

    fn wrap_with(
        &self,
        store: Arc<dyn Store>,
        i: usize,
        log: Option<Arc<Mutex<Vec<Turn>>>>,
    ) -> Arc<dyn Store> {
        Arc::new(Seen {
            inner: store,
            i,
            log,
            seen: SEEN.clone(),
        })
    }

    /// Waits until `n` waiters are queued for `k`.
    async fn until_queued(&self, k: &Key, n: usize, what: &str) {
        match self {
            Queueing::Server(q) => crate::until_queued(&**q, k, n, SOON * 10, what).await,
            Queueing::InProcess => {
                let deadline = Instant::now() + SOON * 10;
                loop {
                    let seen = SEEN.lock().unwrap().get(k).map_or(0, |s| s.len());
                    if seen >= n {
                        return;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{what}: never seen queued ({seen} of {n} waiters)"
                    );
                    sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// The waiters seen queued by [`Seen`], per key: each test uses keys of its own.
static SEEN: std::sync::LazyLock<Arc<Mutex<SeenWaiters>>> =
    std::sync::LazyLock::new(Default::default);

/// The waiters (by number) seen queued for each key.
type SeenWaiters = HashMap<Key, std::collections::HashSet<usize>>;

/// A waiter's store, seeing its waits: once the inner `wait_released` has been polled
/// once, the waiter is noted (in [`SEEN`], and in the contenders' log).
#[derive(Debug)]
struct Seen {
    inner: Arc<dyn Store>,
    i: usize,
    log: Option<Arc<Mutex<Vec<Turn>>>>,
    seen: Arc<Mutex<SeenWaiters>>,
}

impl leasehold_core::wrap::Forward for Seen {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn waiter(&self) -> Option<&dyn leasehold_core::WaitStore> {
        self.inner
            .waiter()
            .map(|_| self as &dyn leasehold_core::WaitStore)
    }
}

#[async_trait::async_trait]
impl leasehold_core::WaitStore for Seen {
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        t: Duration,
    ) -> Result<(), StoreError> {
        let mut wait = std::pin::pin!(wait(&*self.inner).wait_released(key, owner, t));
        let first = futures::poll!(wait.as_mut());
        self.note(key);
        match first {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => wait.await,
        }
    }

    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        t: Duration,
    ) -> Result<leasehold_core::WaitOutcome, StoreError> {
        let mut wait = std::pin::pin!(wait(&*self.inner).wait_turn(key, owner, ttl, t));
        let first = futures::poll!(wait.as_mut());
        self.note(key);
        match first {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => wait.await,
        }
    }
}

impl Seen {
    /// Notes that this waiter is waiting on `key` (its wait was polled once).
    fn note(&self, key: &Key) {
        self.seen
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .insert(self.i);
        if let Some(log) = &self.log {
            let mut log = log.lock().unwrap();
            // One note per wait for a turn (a wait woken early goes on in its place).
            let last = log.iter().rev().find(|t| match t {
                Turn::Queued(j) | Turn::Granted(j) => *j == self.i,
            });
            if last != Some(&Turn::Queued(self.i)) {
                log.push(Turn::Queued(self.i));
            }
        }
    }
}

/// A waiter that gives up (its wait runs out, or its acquire is cancelled), queued first,
/// leaves the queue: the next waiter gets the lease within seconds of the release.
pub async fn waiters_that_give_up_leave_the_queue(open: impl AsyncFn() -> Arc<dyn Store>) {
    let holder = open().await;
    let k = key("quitters");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let impatient = slow_polling_client(open().await);
    let gave_up = impatient
        .acquire(k.as_str(), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(gave_up, Error::WaitTimeout { .. }), "{gave_up:?}");
    let cancelled = spawn_waiting(slow_polling_client(open().await), &k);
    let patient = spawn_waiting(slow_polling_client(open().await), &k);
    sleep(Duration::from_millis(500)).await;
    cancelled.abort();
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    let released = Instant::now();
    let lease = timeout(SOON, patient)
        .await
        .expect("the patient waiter is not held up by those who left")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < SOON);
    assert!(lease.release().await.unwrap());
}

/// One `#[tokio::test]` per shared wait check of this module, for a store's test file:
/// `setup` is evaluated at the start of each test and kept for its length (a private
/// server, a temporary directory); `open` is an async function taking `&` that value and
/// returning a new store instance (`Arc<dyn Store>`) on it, as another process would open.
///
/// With `fifo, contenders = N,` first, for a store that claims `fifo_wait` (a queue across
/// processes), it adds the queue's checks: no newcomer past a waiter, arrival order across
/// instances, waiters that give up leave the queue, N contenders taking turns, and the
/// claim itself; `queue` is an async function taking `&` the setup's value and returning
/// the [`Queue`](crate::Queue) that reads the store's queue on the server.
/// `fifo_in_process` is for a store whose queue holds the waiters of one process only
/// (SQLite): the same checks on instances of one process ([`Queueing::InProcess`]), and no
/// claim.
///
/// ```ignore
/// leasehold_conformance::waiting_suite!(setup = common::start_db(), open = open);
/// leasehold_conformance::waiting_suite!(fifo, contenders = 6, setup = common::start_db(), open = open, queue = queue);
/// ```
#[macro_export]
macro_rules! waiting_suite {
    (fifo, contenders = $n:expr, setup = $setup:expr, open = $open:expr, queue = $queue:expr) => {
        $crate::waiting_suite!(@queue $n, true, $setup, $open,
            |env| async move { $crate::waiting::Queueing::Server(($queue)(env).await) });
    };
    (fifo_in_process, contenders = $n:expr, setup = $setup:expr, open = $open:expr) => {
        $crate::waiting_suite!(@queue $n, false, $setup, $open,
            |_| async { $crate::waiting::Queueing::InProcess });
    };
    (@queue $n:expr, $claimed:expr, $setup:expr, $open:expr, $queue:expr) => {
        $crate::waiting_suite!(setup = $setup, open = $open);
        $crate::waiting_suite!(@one a_newcomer_does_not_take_the_lease_past_a_waiter,
            a_newcomer_does_not_take_the_lease_past_a_waiter, $setup, $open);
        $crate::waiting_suite!(@one waiters_that_give_up_leave_the_queue,
            waiters_that_give_up_leave_the_queue, $setup, $open);
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiters_of_several_instances_are_served_in_arrival_order() {
            let env = $setup;
            let queue = ($queue)(&env).await;
            $crate::waiting::waiters_of_several_instances_are_served_in_arrival_order(
                async || ($open)(&env).await,
                &queue,
            )
            .await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contenders_take_turns_in_arrival_order() {
            let env = $setup;
            let queue = ($queue)(&env).await;
            $crate::waiting::contenders_take_turns_in_arrival_order(
                async || ($open)(&env).await,
                &queue,
                $n,
            )
            .await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fifo_wait_is_claimed_as_the_queue_reaches() {
            let env = $setup;
            $crate::waiting::claims_fifo_wait(async || ($open)(&env).await, $claimed).await;
        }
    };
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
