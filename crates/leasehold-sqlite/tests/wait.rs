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
use leasehold_core::{AcquireOutcome, Key, OwnerToken, Store};
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
// instance another connection pool on the same file; the queue holds this process's
// waiters (a holder in another process cannot notify), so `fifo_wait` is not claimed.
leasehold_conformance::waiting_suite!(
    fifo_in_process,
    contenders = 6,
    setup = tempfile::tempdir().unwrap(),
    open = open_in
);

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
