//! A follower cut off from the leader while the holder still reaches it: the holder's
//! renewals must not be confirmed by that follower alone (issue 24, item 1; `docs/design.md`,
//! "ZooKeeper: a renewal confirmed by a quorum write").
//!
//! Three members whose links to each other go through fault proxies. The holder H is
//! connected to one follower F only; the contender C to the two other members (the
//! majority). F is cut from the others while H still reaches it: F keeps serving H from
//! its own copy until it gives up on the leader (`syncLimit`, here 10 s), while the leader
//! expires H's session (it hears of H only through F's reports) about one session timeout
//! after the cut, deletes H's node and lets C in. H must believe it holds the lease at no
//! instant C holds it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireOutcome, Key, LeaseClient, LeaseConfig, OwnerToken, Store};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{ZK_TICK, ZkEnsemble, ZkEnsembleOptions};
use leasehold_zookeeper::ZkStore;
use tokio::time::Instant;

/// H's session timeout, and the TTL it asks for (the store grants less: see the design).
const SESSION: Duration = Duration::from_secs(4);
/// F gives up on the leader after `SYNC_LIMIT` ticks of silence (10 s): well after the
/// leader expired H's session (about [`SESSION`] after the cut) and C got the lease.
const SYNC_LIMIT: u32 = 40;
/// How long H is watched once C holds the lease (F still serves H all along).
const WATCH: Duration = Duration::from_secs(3);

/// The URL of a store connected to the members `members` only.
fn url(ensemble: &ZkEnsemble, members: &[usize], session: Duration) -> String {
    let ports = ensemble.ports();
    let hosts: Vec<String> = members
        .iter()
        .map(|&i| format!("127.0.0.1:{}", ports[i]))
        .collect();
    format!(
        "zookeeper://{}/partition?session_timeout={}ms&timeout=1s&tick_time={}ms",
        hosts.join(","),
        session.as_millis(),
        ZK_TICK.as_millis()
    )
}

/// Issue 24, item 1: H, behind a follower cut off from the leader, is not valid at any
/// instant the contender C holds the lease: its deadline passed before C's grant was
/// answered, and sampled every few milliseconds while C holds (and F still serves H), H's
/// `is_valid()` stays false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_behind_a_follower_cut_from_the_leader_is_invalid_while_a_contender_holds() {
    let _proof = proves(Backend::Zookeeper, Fault::NetworkPartition);
    let ensemble = Arc::new(
        tokio::task::spawn_blocking(|| {
            ZkEnsemble::start_with(ZkEnsembleOptions {
                proxied_peers: true,
                sync_limit: SYNC_LIMIT,
            })
        })
        .await
        .unwrap(),
    );
    let leader = ensemble.leader().expect("a leader");
    let f = (0..ZkEnsemble::SIZE).find(|&i| i != leader).unwrap();
    let majority: Vec<usize> = (0..ZkEnsemble::SIZE).filter(|&i| i != f).collect();

    let h_store = Arc::new(ZkStore::open(&url(&ensemble, &[f], SESSION)).await.unwrap());
    let h_client = LeaseClient::new(h_store.clone(), LeaseConfig::new(SESSION).unwrap());
    let key = Key::new("partition:follower").unwrap();
    let lease_h = h_client.try_acquire(&key).await.expect("H acquires");
    // Steady state: a renewal confirmed (the deadline moved).
    let first = lease_h.valid_until();
    let until = Instant::now() + SESSION * 3;
    while lease_h.valid_until() == first {
        assert!(Instant::now() < until, "H's lease was never renewed");
        assert!(lease_h.is_valid(), "H lost its lease before the cut");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let c_store = ZkStore::open(&url(&ensemble, &majority, SESSION))
        .await
        .unwrap();
    let c_owner = OwnerToken::random();

    ensemble.isolate(f);
    let t0 = Instant::now();
    let ms = |at: Instant| {
        if at >= t0 {
            (at - t0).as_millis() as i64
        } else {
            -((t0 - at).as_millis() as i64)
        }
    };

    // C polls until the leader has expired H's session and C gets the lease.
    let (c_sent, c_answered, c_fence) = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "C never got the lease: the leader did not expire H's session"
        );
        let sent = Instant::now();
        match c_store.acquire(&key, &c_owner, SESSION).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => break (sent, Instant::now(), fence),
            Ok(AcquireOutcome::Held { .. }) => {}
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("C's acquire: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let h_valid_at_grant = lease_h.is_valid();
    let h_deadline = lease_h.valid_until();
    let f_mode = ensemble.mode(f);
    eprintln!(
        "cut at t0; C's winning acquire sent at +{} ms, answered at +{} ms; H's deadline at +{} \
         ms; F's mode then: {f_mode:?}",
        ms(c_sent),
        ms(c_answered),
        ms(h_deadline)
    );
    assert_eq!(
        f_mode.as_deref(),
        Some("follower"),
        "F gave up on the leader before C got the lease: the dangerous window did not open \
         (raise SYNC_LIMIT)"
    );
    assert!(
        c_fence > lease_h.fence(),
        "C's fence {c_fence} must be above H's {}",
        lease_h.fence()
    );
    assert!(
        !h_valid_at_grant,
        "H still believed it held the lease when C's grant was answered (H's deadline +{} ms, \
         C's grant sent +{} ms after the cut)",
        ms(h_deadline),
        ms(c_sent)
    );
    let info = c_store.inspect(&key).await.unwrap().expect("held by C");
    assert_eq!((info.owner, info.fence), (c_owner, c_fence));
    // The leader let C in only after it expired H's session: H's deadline came first.
    assert!(
        h_deadline <= c_answered,
        "H's deadline (+{} ms) is after C's grant was answered (+{} ms)",
        ms(h_deadline),
        ms(c_answered)
    );

    // Every instant C holds the lease, while F still serves H: H is not valid.
    let end = Instant::now() + WATCH;
    let mut samples = 0u32;
    while Instant::now() < end {
        assert!(
            !lease_h.is_valid(),
            "H believes it holds the lease {} ms after C got it (H's deadline +{} ms after the cut)",
            c_answered.elapsed().as_millis(),
            ms(lease_h.valid_until())
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        ensemble.mode(f).as_deref(),
        Some("follower"),
        "F stopped serving before the watch ended"
    );
    eprintln!("H sampled {samples} times while C held the lease: never valid");
}
