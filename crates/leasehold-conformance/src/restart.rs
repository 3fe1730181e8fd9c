//! A server restarted under a held lease on a store whose leases outlive a restart (the
//! lease table of PostgreSQL and MariaDB/MySQL): nothing changes for the holder, and no
//! contender is granted the lease meanwhile. Shared by those stores' restart tests.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_core::{AcquireOutcome, Key, LeaseClient, LeaseConfig, OwnerToken, Store};
use tokio::time::{Instant, timeout};

/// How long the restart and the renewal after it may take, at most.
const LONG: Duration = Duration::from_secs(60);

/// A holds `key` through a lease client on `a` (TTL 30 s, renewed every 3 s, and lost only
/// at its deadline however many renewals fail: a restart of a few seconds fits), while B,
/// another store on the same server, asks for the lease every 5 ms; `restart` (blocking)
/// restarts the server. Checks, while it happens and after, that the restart changed
/// nothing: B is never granted the lease, and is refused by the restarted server; A's
/// lease stays valid and is renewed after the restart; the store shows A's owner and
/// fence; A still holds it at its release; the next fence is higher.
pub async fn restart_under_a_held_lease(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    key: &str,
    contender_ttl: Duration,
    restart: impl FnOnce() + Send + 'static,
) {
    let config = LeaseConfig::builder(Duration::from_secs(30))
        .renew_interval(Duration::from_secs(3))
        .op_timeout(Duration::from_secs(2))
        .renew_failures_before_lost(1_000)
        .build()
        .unwrap();
    let client = LeaseClient::new(a, config.clone());
    let lease = Arc::new(client.try_acquire(key).await.unwrap());
    let key = Key::new(key).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // B's answers: `Err((fence, A valid))` at a grant, else when it was last refused.
    let contender = {
        let (b, key, lease, stop) = (b.clone(), key.clone(), lease.clone(), stop.clone());
        tokio::spawn(async move {
            let owner = OwnerToken::random();
            let mut refused = None;
            while !stop.load(Ordering::SeqCst) {
                match timeout(contender_ttl, b.acquire(&key, &owner, contender_ttl)).await {
                    Ok(Ok(AcquireOutcome::Acquired { fence, .. })) => {
                        return Err((fence, lease.is_valid()));
                    }
                    Ok(Ok(AcquireOutcome::Held { .. })) => refused = Some(Instant::now()),
                    // The server is down or coming back: errors and timeouts.
                    Ok(Err(_)) | Err(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(refused)
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!contender.is_finished(), "B got the lease while A held it");
    let began = Instant::now();
    tokio::task::spawn_blocking(restart).await.unwrap();
    let back = Instant::now();
    // Only a renewal sent after the restart moves A's deadline past `back + validity`.
    let validity = config.validity(config.ttl());
    let renewed = timeout(LONG, async {
        loop {
            assert!(
                lease.is_valid(),
                "A lost its lease across the restart: {:?}",
                lease.lost_reason()
            );
            let now = Instant::now();
            if now + lease.remaining() >= back + validity {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("A renews its lease after the restart");
    eprintln!(
        "the server was back {:?} after the restart began; A renewed {:?} later",
        back - began,
        renewed - back
    );
    let info = b
        .inspect(&key)
        .await
        .unwrap()
        .expect("held after the restart");
    assert_eq!(
        (info.owner, info.fence),
        (*lease.owner(), lease.fence()),
        "the store must show A's lease after the restart"
    );
    stop.store(true, Ordering::SeqCst);
    let refused = match contender.await.unwrap() {
        Ok(refused) => refused,
        Err((fence, a_valid)) => panic!(
            "B was granted the lease (fence {fence}, A's {}) across the restart; A {}",
            lease.fence(),
            if a_valid {
                "still believed it held it"
            } else {
                "had lost it"
            }
        ),
    };
    assert!(
        refused.is_some_and(|at| at > back),
        "B was never refused by the restarted server (last refused: {refused:?})"
    );
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());
    let a_fence = lease.fence();
    let lease = Arc::try_unwrap(lease).expect("B's task has ended");
    assert!(
        lease.release().await.unwrap(),
        "A no longer held its lease at its release"
    );
    match b
        .acquire(&key, &OwnerToken::random(), contender_ttl)
        .await
        .unwrap()
    {
        AcquireOutcome::Acquired { fence, .. } => assert!(
            fence > a_fence,
            "the next fence {fence} must be above A's {a_fence}"
        ),
        held => panic!("not free after A's release: {held:?}"),
    }
}
