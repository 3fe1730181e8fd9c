//! Issue 10.12: graceful shutdown of a `LeaseClient` (a worker that received SIGTERM):
//! renewal stops, the work under each lease is told to stop (lost signal with reason
//! `Shutdown`, not counted as a lost lease), the leases are released once their work has
//! stopped, and never before.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::memory::MemoryStore;
use leasehold_core::{Error, Key, LeaseClient, LeaseConfig, LostReason, Store};
use metrics_util::debugging::DebugValue;
use tokio::time::{Instant, sleep};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn client(store: &MemoryStore) -> LeaseClient {
    let cfg = LeaseConfig::builder(3 * S)
        .watchdog_thread(false)
        .build()
        .unwrap();
    LeaseClient::new(Arc::new(store.clone()), cfg)
}

fn key(i: usize) -> Key {
    Key::new(format!("job:shutdown-{i}")).unwrap()
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_work_then_releases_each_lease() {
    let store = MemoryStore::new();
    let c = client(&store);
    let mut workers = Vec::new();
    for i in 0..3 {
        let lease = c.try_acquire(key(i)).await.unwrap();
        workers.push(tokio::spawn(async move {
            // The work runs until the lease is lost; then it rolls back (100, 200 and
            // 300 ms) and lets go of the lease.
            let res = lease.run(sleep(3600 * S)).await;
            sleep(100 * MS * (i as u32 + 1)).await;
            drop(lease);
            res
        }));
    }
    sleep(5 * S).await; // a few renewals
    let t0 = Instant::now();
    let report = c.shutdown(10 * S).await;
    assert_eq!(
        Instant::now() - t0,
        300 * MS,
        "returns once the last work stopped"
    );
    assert_eq!(report.held, 3);
    assert_eq!(report.still_held, 0);
    assert!(report.releases_done);
    for w in workers {
        let res = w.await.unwrap();
        assert!(
            matches!(res, Err(Error::LeaseLost(LostReason::Shutdown))),
            "{res:?}"
        );
    }
    // Released, not left to expire: another process gets each key at once.
    let other = client(&store);
    for i in 0..3 {
        assert_eq!(store.inspect(&key(i)).await.unwrap(), None);
        let lease = other.try_acquire(key(i)).await.unwrap();
        assert!(lease.release().await.unwrap());
    }
    // The client grants nothing more.
    assert!(matches!(
        c.try_acquire(key(9)).await,
        Err(Error::ShuttingDown)
    ));
}

#[tokio::test(start_paused = true)]
async fn shutdown_never_releases_a_lease_whose_work_did_not_stop() {
    let store = MemoryStore::new();
    let c = client(&store);
    let stubborn = c.try_acquire(key(0)).await.unwrap();
    let polite = c.try_acquire(key(1)).await.unwrap();
    let lost = stubborn.lost();
    tokio::spawn(async move {
        let _ = polite.lost().await;
        drop(polite);
    });
    let t0 = Instant::now();
    let report = c.shutdown(S).await;
    assert_eq!(Instant::now() - t0, S, "waits until the deadline");
    assert_eq!((report.held, report.still_held), (2, 1));
    assert_eq!(lost.reason(), Some(LostReason::Shutdown));
    // The stubborn holder's code may still run: its lease stays in the store, unrenewed,
    // until it expires...
    let info = store.inspect(&key(0)).await.unwrap().unwrap();
    assert_eq!(info.owner, *stubborn.owner());
    assert_eq!(store.inspect(&key(1)).await.unwrap(), None);
    sleep(2 * S).await;
    assert_eq!(
        store.inspect(&key(0)).await.unwrap(),
        None,
        "expired, never renewed"
    );
    // ...and letting go of it later is harmless.
    assert!(!stubborn.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_lease_acquired_while_shutting_down_is_told_at_once() {
    let store = MemoryStore::new();
    let c = client(&store);
    let first = c.try_acquire(key(0)).await.unwrap();
    drop(first);
    // Shut down, with no lease held; an acquire that races it either fails or is
    // stopped at once.
    let report = c.shutdown(S).await;
    assert_eq!(report.still_held, 0);
    assert!(matches!(
        c.acquire(key(1), S).await,
        Err(Error::ShuttingDown)
    ));
}

#[test]
fn a_shutdown_is_not_counted_as_a_lost_lease() {
    let ((), metrics) = common::recorded(async {
        let store = MemoryStore::new();
        let c = client(&store);
        let lease = c.try_acquire(key(0)).await.unwrap();
        let lost = lease.lost();
        tokio::spawn(async move {
            let _ = lease.lost().await;
            drop(lease);
        });
        let report = c.shutdown(S).await;
        assert_eq!(report.still_held, 0);
        assert_eq!(lost.reason(), Some(LostReason::Shutdown));
    });
    let snapshot = metrics;
    let lost: u64 = snapshot
        .iter()
        .filter(|(ck, ..)| ck.key().name() == "leasehold_lease_lost_total")
        .map(|(.., v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum();
    assert_eq!(lost, 0, "a shutdown counted as a lost lease");
    let ended_by_shutdown = snapshot.iter().any(|(ck, ..)| {
        ck.key().name() == "leasehold_hold_duration_seconds"
            && ck
                .key()
                .labels()
                .any(|l| l.key() == "end" && l.value() == "shutdown")
    });
    assert!(ended_by_shutdown);
}
