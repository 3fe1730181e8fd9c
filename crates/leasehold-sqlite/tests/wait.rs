//! Waiting without polling where a process can (issue 14 item 6): a release or a break
//! made through any store of this process on the same file wakes a waiter at once; the
//! holder's expiry ends every wait; a wait ends at its timeout; the waiters of one process
//! are served in arrival order, and a newcomer of the process does not take the lease past
//! them. (A holder in another
//! process, which cannot notify, is in `processes.rs`:
//! `a_release_in_another_process_is_seen_within_the_poll_interval`.)
//!
//! Every store here is its own instance with its own connections on one file. Time bounds
//! are generous: they tell a wake-up from a wait for the holder's expiry (30 s away), never
//! measure speed.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::waiting::slow_polling_client;
use leasehold_core::{AcquireOutcome, Key, OwnerToken, ReleaseOutcome, Store};
use leasehold_sqlite::{SqliteConfig, SqliteStore};
use tokio::time::{Instant, sleep, timeout};

/// A long holder TTL: a waiter that polled would wait for it.
const LONG_TTL: Duration = Duration::from_secs(30);
/// Generous bound on a wake-up that should take milliseconds.
const SOON: Duration = Duration::from_secs(3);

async fn open(path: &std::path::Path) -> Arc<dyn Store> {
    let s = SqliteStore::connect(SqliteConfig::new(path)).await.unwrap();
    assert!(s.waiter().is_some());
    Arc::new(s)
}

fn key(s: &str) -> Key {
    Key::new(format!("wait:{s}")).unwrap()
}

fn fence(o: AcquireOutcome) -> leasehold_core::Fence {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn spawn_wait(
    store: &Arc<dyn Store>,
    k: &Key,
    t: Duration,
) -> tokio::task::JoinHandle<Result<(), leasehold_core::StoreError>> {
    let (w, k) = (store.clone(), k.clone());
    tokio::spawn(async move {
        let waiter = w.waiter().expect("a waiter");
        waiter.wait_released(&k, &OwnerToken::random(), t).await
    })
}

async fn open_in(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    open(&dir.path().join("wait.db")).await
}

// The checks every SQL store shares (`leasehold_conformance::waiting`), each store
// instance another connection pool on the same file.
leasehold_conformance::waiting_suite!(setup = tempfile::tempdir().unwrap(), open = open_in);

/// Several waiters in this process each get the lease soon after the release, one after
/// the other; a wait that was cancelled leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_the_process_get_the_lease_one_after_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.db");
    let holder = open(&path).await;
    let k = key("many");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let cancelled = spawn_wait(&holder, &k, Duration::from_secs(60));
    let mut waiting = Vec::new();
    for _ in 0..4 {
        let client = slow_polling_client(open(&path).await);
        let k = k.clone();
        waiting.push(tokio::spawn(async move {
            let lease = client.acquire(k, Duration::from_secs(120)).await.unwrap();
            assert!(lease.release().await.unwrap());
        }));
    }
    sleep(Duration::from_secs(1)).await;
    cancelled.abort();
    holder.release(&k, &h).await.unwrap();
    let released = Instant::now();
    // One after the other, each releasing at once: every waiter gets its turn soon.
    for w in waiting {
        timeout(SOON * 2, w)
            .await
            .expect("every waiter gets the lease soon")
            .unwrap();
    }
    assert!(released.elapsed() < SOON * 2);
}

/// Three waiters of this process (each a client on a store of its own, on one file) queue
/// one after the other: released, they get the lease in the order they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_the_process_are_served_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fifo.db");
    let holder = open(&path).await;
    let k = key("fifo");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let client = slow_polling_client(open(&path).await);
        let (got, k) = (got.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.acquire(k, Duration::from_secs(120)).await.unwrap();
            got.lock().unwrap().push(i);
            sleep(Duration::from_millis(200)).await;
            assert!(lease.release().await.unwrap());
        }));
        // Each is queued before the next asks.
        sleep(Duration::from_millis(500)).await;
    }
    holder.release(&k, &h).await.unwrap();
    for t in tasks {
        timeout(SOON * 2, t).await.expect("all served").unwrap();
    }
    assert_eq!(*got.lock().unwrap(), vec![0, 1, 2]);
}

/// A waiter of this process is queued when the holder releases: a newcomer's acquire
/// right after the release (through another store of the process) is told the lease is
/// held, and the waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_of_the_process_does_not_take_the_lease_past_a_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("barging.db");
    let holder = open(&path).await;
    let newcomer = open(&path).await;
    let waiter = slow_polling_client(open(&path).await);
    let k = key("barging");
    let h = OwnerToken::random();
    let first = fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let waiting = {
        let k = k.clone();
        tokio::spawn(async move { waiter.acquire(k, Duration::from_secs(120)).await })
    };
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

/// Waiters of this process that give up (a wait that runs out, an acquire that is
/// cancelled), queued first, hold up the queue for at most the grace period (500 ms): the
/// next waiter gets the lease within seconds of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quitters.db");
    let holder = open(&path).await;
    let k = key("quitters");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let impatient = slow_polling_client(open(&path).await);
    let gave_up = impatient
        .acquire(k.as_str(), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(gave_up, leasehold_core::Error::WaitTimeout { .. }),
        "{gave_up:?}"
    );
    let cancelled = slow_polling_client(open(&path).await);
    let cancelled_task = {
        let k = k.clone();
        tokio::spawn(async move { cancelled.acquire(k, Duration::from_secs(120)).await })
    };
    let patient = slow_polling_client(open(&path).await);
    let patient_task = {
        let k = k.clone();
        tokio::spawn(async move { patient.acquire(k, Duration::from_secs(120)).await })
    };
    sleep(Duration::from_millis(500)).await;
    cancelled_task.abort();
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    let released = Instant::now();
    let lease = timeout(SOON, patient_task)
        .await
        .expect("the patient waiter is not held up by those who left")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < SOON);
    assert!(lease.release().await.unwrap());
}

/// An owner of this process told `Held` that waits, gets its turn and then never acquires
/// holds up the queue only for the grace period (500 ms): the waiter behind it, which the
/// release did not wake, gets the lease within seconds, and meanwhile a newcomer is told
/// to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_left_unclaimed_is_passed_on_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("unclaimed.db");
    let holder = open(&path).await;
    let k = key("unclaimed");
    let h = OwnerToken::random();
    fence(holder.acquire(&k, &h, LONG_TTL).await.unwrap());
    let idle = open(&path).await;
    let o = OwnerToken::random();
    assert!(matches!(
        idle.acquire(&k, &o, LONG_TTL).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));
    let first = {
        let (idle, k) = (idle.clone(), k.clone());
        tokio::spawn(async move {
            let waiter = idle.waiter().expect("a waiter");
            waiter.wait_released(&k, &o, Duration::from_secs(60)).await
        })
    };
    sleep(Duration::from_millis(500)).await;
    let patient = slow_polling_client(open(&path).await);
    let patient_task = {
        let k = k.clone();
        tokio::spawn(async move { patient.acquire(k, Duration::from_secs(120)).await })
    };
    sleep(Duration::from_millis(500)).await;
    holder.release(&k, &h).await.unwrap();
    let released = Instant::now();
    timeout(SOON, first).await.unwrap().unwrap().unwrap();
    assert!(matches!(
        holder
            .acquire(&k, &OwnerToken::random(), LONG_TTL)
            .await
            .unwrap(),
        AcquireOutcome::Held { .. }
    ));
    let lease = timeout(SOON, patient_task)
        .await
        .expect("the next waiter gets the lease once the unclaimed turn is given up")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < SOON);
    assert!(lease.release().await.unwrap());
}
