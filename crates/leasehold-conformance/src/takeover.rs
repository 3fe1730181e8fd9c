//! The contender probe for session-bound stores (advisory locks, `GET_LOCK`): a server
//! restarted under a held lease must end the holder's lease before the restarted server
//! can grant the lock to anyone else.
//!
//! A holds a lease with a 30 s TTL (its next renewal 10 s away, so a renewal cannot be
//! what tells it); the server is restarted; B, another store on the same server, tries the
//! lock every 2 ms from before the restart on, so it gets it as soon as the restarted
//! server accepts connections. A's `is_valid()` is read the moment B's acquire returns.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Fence, Key, LeaseClient, LeaseConfig, LostReason, OwnerToken, Store,
};
use tokio::time::{Instant, sleep, timeout};

/// How long the probe waits for B's grant and for A's lost signal after the restart.
const LONG: Duration = Duration::from_secs(60);

/// What the contender saw when it first got the lock after the server went away.
#[derive(Debug)]
pub struct Takeover {
    /// When the server began to go away.
    pub stopped_at: Instant,
    /// When A's lost signal fired, and why.
    pub lost: (Instant, LostReason),
    /// When B sent the acquire that was granted.
    pub b_sent: Instant,
    /// When that acquire returned.
    pub b_got: Instant,
    /// A's `is_valid()` read the moment B's acquire returned `Acquired`.
    pub a_valid_when_b_got_it: bool,
    /// A's fence and B's.
    pub fences: (Fence, Fence),
}

/// Runs the probe: A holds `key` through `a`, `restart` (a blocking call) restarts the
/// server, B tries `key` through `b` (a store on the same server) every 2 ms, each try
/// bounded by `attempt` (each store's TTL for B's grants is `attempt` too).
///
/// # Panics
/// When A cannot acquire, B gets the lock before the restart, or B's grant or A's lost
/// signal does not come within a minute of the restart.
pub async fn restart_takeover(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    key: &str,
    attempt: Duration,
    restart: impl FnOnce() + Send + 'static,
) -> Takeover {
    let client = LeaseClient::new(a, LeaseConfig::new(Duration::from_secs(30)).unwrap());
    let lease = Arc::new(client.try_acquire(key).await.unwrap());
    let lost = {
        let signal = lease.lost();
        tokio::spawn(async move {
            let reason = signal.wait().await;
            (Instant::now(), reason)
        })
    };
    let probe = {
        let (lease, key) = (lease.clone(), Key::new(key).unwrap());
        tokio::spawn(async move {
            let owner = OwnerToken::random();
            loop {
                let sent = Instant::now();
                let got = timeout(attempt, b.acquire(&key, &owner, attempt)).await;
                if let Ok(Ok(AcquireOutcome::Acquired { fence, .. })) = got {
                    let a_valid = lease.is_valid();
                    return (sent, Instant::now(), a_valid, fence);
                }
                sleep(Duration::from_millis(2)).await;
            }
        })
    };
    // B is turned away while A holds.
    sleep(Duration::from_millis(100)).await;
    assert!(!probe.is_finished(), "B got the lock while A held it");
    let stopped_at = Instant::now();
    tokio::task::spawn_blocking(restart).await.unwrap();
    let (b_sent, b_got, a_valid_when_b_got_it, b_fence) = timeout(LONG, probe)
        .await
        .expect("B gets the lock after the restart")
        .unwrap();
    let lost = timeout(LONG, lost)
        .await
        .expect("A's lost signal fires")
        .unwrap();
    Takeover {
        stopped_at,
        lost,
        b_sent,
        b_got,
        a_valid_when_b_got_it,
        fences: (lease.fence(), b_fence),
    }
}

/// No instant at which B held the lock while A still believed: A reads invalid the moment
/// B's acquire returns `Acquired` (`is_valid()` is read on the spot), having lost it to the
/// store's server watch (`SessionEnded`), not to a renewal; fences rise. The time the lost
/// signal's waiter woke up is printed, an upper bound on the detection.
///
/// # Panics
/// When any of that does not hold.
pub fn assert_lost_before_the_takeover(t: &Takeover) {
    let (lost_at, reason) = t.lost;
    eprintln!(
        "A lost the lease ({reason:?}) {:?} after the restart began, {:?} before B got the lock (B's granted acquire took {:?})",
        lost_at.saturating_duration_since(t.stopped_at),
        t.b_got.saturating_duration_since(lost_at),
        t.b_got.saturating_duration_since(t.b_sent),
    );
    assert!(
        !t.a_valid_when_b_got_it,
        "B got the lock (fence {}) while A (fence {}) still believed it held it; A's lost signal ({reason:?}) was seen {:?} after B got it",
        t.fences.1.get(),
        t.fences.0.get(),
        lost_at.saturating_duration_since(t.b_got),
    );
    assert_eq!(reason, LostReason::SessionEnded);
    assert!(t.fences.1 > t.fences.0, "fences rise across the restart");
}
