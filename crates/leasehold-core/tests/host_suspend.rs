//! docs/faults.md row 33 on the real clock: a host suspend injected where the process reads
//! `CLOCK_BOOTTIME` (`clock::suspend_host`), so the whole path a lease is timed on runs —
//! `SystemClock`, the reading of both clocks, their difference, the never-decreasing
//! maximum — and not a `ManualClock`. Nothing tells the library: the background tasks
//! notice as after a real resume.
//!
//! The injection is process-wide and for good, so this file is its own test binary, and each
//! test below runs in a process of its own under `cargo nextest` (what `scripts/test` runs).

use std::time::{Duration, Instant as StdInstant};

use leasehold_core::clock::{Clock, SUSPEND_CHECK, SystemClock, boottime, suspend_host};
use leasehold_core::memory::MemoryStore;
use leasehold_core::{Key, LeaseClient, LeaseConfig, LostReason};

const S: Duration = Duration::from_secs(1);

/// The suspended time the system clock reads moves by what was injected, `CLOCK_BOOTTIME`
/// with it, and the monotonic clock does not.
#[test]
fn an_injected_suspend_moves_the_boot_clock_and_the_suspended_time_only() {
    let (b0, s0, m0) = (
        boottime().unwrap(),
        SystemClock.suspended(),
        StdInstant::now(),
    );
    suspend_host(7 * S);
    let (b1, s1, m1) = (
        boottime().unwrap(),
        SystemClock.suspended(),
        StdInstant::now(),
    );
    let took = m1 - m0;
    assert!(took < S, "the monotonic clock moved {took:?}");
    assert!(
        b1 - b0 >= 7 * S && b1 - b0 < 7 * S + took + S / 10,
        "boot clock {b0:?} → {b1:?}"
    );
    assert!(
        s1 - s0 >= 7 * S - S / 10 && s1 - s0 < 7 * S + S / 10,
        "suspended {s0:?} → {s1:?}"
    );
    // It never goes back.
    for _ in 0..100 {
        assert!(SystemClock.suspended() >= s1);
    }
}

/// With the watchdog thread (the default), on the real clock: a suspend past the deadline
/// fires the lost signal within `SUSPEND_CHECK` of the resume, with nobody asking, and
/// every question says lost. A lease taken after the suspend is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_past_the_deadline_on_the_system_clock_fires_the_lost_signal() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let client = LeaseClient::new(store, LeaseConfig::new(3 * S).unwrap());
    let lease = client
        .try_acquire(Key::new("job:suspend").unwrap())
        .await
        .unwrap();
    let token = lease.lost_token();
    assert!(lease.is_valid());
    suspend_host(10 * S);
    let at = StdInstant::now();
    tokio::time::timeout(SUSPEND_CHECK + S / 2, token.cancelled())
        .await
        .expect("the lost signal fires within SUSPEND_CHECK of the resume");
    assert!(at.elapsed() <= SUSPEND_CHECK + S / 2);
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    assert!(!lease.is_valid());
    assert!(lease.remaining().is_zero());
    let next = client
        .try_acquire(Key::new("job:after").unwrap())
        .await
        .unwrap();
    tokio::time::sleep(S).await;
    assert!(
        next.is_valid(),
        "a lease taken after the suspend is not affected"
    );
    assert!(next.remaining() > S);
}

/// A suspend shorter than the validity left keeps the lease, on the real clock: the next
/// renewal extends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_suspend_on_the_system_clock_keeps_the_lease() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let client = LeaseClient::new(store, LeaseConfig::new(3 * S).unwrap());
    let lease = client
        .try_acquire(Key::new("job:short").unwrap())
        .await
        .unwrap();
    let before = lease.remaining();
    suspend_host(S);
    let after = lease.remaining();
    assert!(
        after <= before - S + S / 10 && after + S + S / 2 >= before,
        "{before:?} → {after:?}"
    );
    tokio::time::sleep(4 * S).await;
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());
}

/// The runtime is blocked (its scheduler cannot run), and the host is suspended for a
/// minute while a lease of 30 s is held: the watchdog thread reads the suspended time
/// again at its next look and fires the lost signal then — not at the deadline the lease
/// had on the monotonic clock before the suspend, half a minute later. (The wait is
/// bounded at 20 s, well short of that deadline, and is no measure of speed: the thread
/// looks every `SUSPEND_CHECK`.)
#[test]
fn the_watchdog_thread_sees_a_host_suspend_while_the_runtime_is_blocked() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, lease) = rt.block_on(async {
        let store = std::sync::Arc::new(MemoryStore::new());
        let client = LeaseClient::new(store, LeaseConfig::new(30 * S).unwrap());
        let lease = client
            .try_acquire(Key::new("job:blocked").unwrap())
            .await
            .unwrap();
        (client, lease)
    });
    let token = lease.lost_token();
    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = std::thread::spawn(move || {
        futures::executor::block_on(token.cancelled());
        let _ = tx.send(());
    });
    // Blocks the runtime on purpose: only the watchdog thread can fire the signal.
    rt.block_on(async {
        suspend_host(60 * S);
        rx.recv_timeout(20 * S)
            .expect("the watchdog fires the lost signal long before the pre-suspend deadline");
    });
    watcher.join().unwrap();
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    rt.block_on(async { drop((lease, client)) });
}
