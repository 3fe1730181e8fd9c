//! The ZooKeeper store against a private three-member ensemble whose members serve their
//! clients only over TLS (each a Netty `secureClientPort` with `ssl.clientAuth=need`, no
//! plaintext client port; `leasehold_testkit::ZkEnsemble::start_tls`): a lease taken
//! through one member stays held, and is renewed over TLS through another member, when the
//! member its session is connected to is killed; then it is released.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireOutcome, Key, LeaseClient, LeaseConfig, OwnerToken, Store};
use leasehold_testkit::ZkEnsemble;
use leasehold_zookeeper::ZkStore;
use tokio::time::{Instant, sleep};

/// The lease's TTL: longer than a member's death, the client's reconnection (a TLS
/// handshake with another member) and, when the leader died, an election.
const TTL: Duration = Duration::from_secs(6);
const PASSWORD: &str = "zk-ensemble-tls-pw-93c1";

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// `zookeeper://app:PASSWORD@h1:p1,h2:p2,h3:p3/leasehold?…&tls=true&cacert=…&cert=…&key=…`.
fn url(ensemble: &ZkEnsemble) -> String {
    let tls = ensemble.tls().expect("TLS files");
    format!(
        "zookeeper://app:{PASSWORD}@{}/leasehold?session_timeout=11s&timeout=2s&connect_timeout=5s&tick_time=250ms\
         &tls=true&cacert={}&cert={}&key={}",
        ensemble.connect_string(),
        tls.ca_cert().display(),
        tls.client_cert().display(),
        tls.client_key().display()
    )
}

/// The running members that list a connection with a session in their `cons` (asked over
/// TLS): a line with `sid=0x…`. The four-letter word's own connection has no session.
fn members_with_a_session(ensemble: &ZkEnsemble) -> Vec<usize> {
    (0..ZkEnsemble::SIZE)
        .filter(|&i| ensemble.is_running(i))
        .filter(|&i| {
            ensemble
                .four_letter_word(i, "cons")
                .lines()
                .any(|l| l.contains("sid=0x"))
        })
        .collect()
}

/// Waits (`limit` at most) until exactly one member other than `not` holds the store's
/// session, and returns it.
async fn session_on(ensemble: &Arc<ZkEnsemble>, not: Option<usize>, limit: Duration) -> usize {
    let end = Instant::now() + limit;
    loop {
        let e = ensemble.clone();
        let on = blocking(move || members_with_a_session(&e)).await;
        if let [m] = on.as_slice()
            && Some(*m) != not
        {
            return *m;
        }
        assert!(
            Instant::now() < end,
            "the session is on members {on:?} after {limit:?} (not on {not:?} wanted)"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// A lease held through a TLS-only ensemble survives the death of the member its session
/// is connected to: the client reconnects over TLS (verified, with its client
/// certificate) to another member, the lease's renewals go on through it, the lease is
/// never lost, a contender is refused; then it is released and the contender gets it
/// with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outlives_the_death_of_its_member_over_tls() {
    let started = Instant::now();
    let ensemble = Arc::new(blocking(|| ZkEnsemble::start_tls(true)).await);
    eprintln!("TLS ensemble up in {:?}", started.elapsed());
    let url = url(&ensemble);
    let store = Arc::new(ZkStore::open(&url).await.expect("open over TLS"));
    assert!(store.config().uses_tls());
    let shown = format!("{store:?} {}", store.config());
    assert!(!shown.contains(PASSWORD), "{shown}");

    let client = LeaseClient::new(store.clone(), LeaseConfig::new(TTL).unwrap());
    let k = Key::new("zk-ensemble-tls:job").unwrap();
    let lease = client.try_acquire(&k).await.expect("a free key is granted");
    let first = session_on(&ensemble, None, Duration::from_secs(10)).await;
    let leader = blocking({
        let e = ensemble.clone();
        move || e.leader()
    })
    .await;
    eprintln!("session on member {first}, the leader is {leader:?}: killing member {first}");

    let e = ensemble.clone();
    blocking(move || e.kill(first)).await;
    let killed_at = Instant::now();
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());

    // The client reconnects to another member, over TLS.
    let second = session_on(&ensemble, Some(first), TTL * 3).await;
    eprintln!(
        "session on member {second} {:?} after the kill",
        killed_at.elapsed()
    );
    // A renewal confirmed from now on went through `second` (the first member is dead).
    let before = lease.valid_until();
    let end = Instant::now() + TTL * 2;
    while lease.valid_until() <= before {
        assert!(
            lease.is_valid(),
            "the lease was lost after the member died: {:?}",
            lease.lost_reason()
        );
        assert!(
            Instant::now() < end,
            "no renewal through member {second} within {:?}",
            TTL * 2
        );
        sleep(Duration::from_millis(50)).await;
    }
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());

    // The store still shows the lease, with its owner and fence; a contender is refused.
    let info = store
        .inspect(&k)
        .await
        .unwrap()
        .expect("the lease is in the store");
    assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
    let contender = ZkStore::open(&url).await.expect("a contender over TLS");
    let other = OwnerToken::random();
    assert!(matches!(
        contender.acquire(&k, &other, TTL).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));

    let fence = lease.fence();
    assert!(lease.release().await.unwrap(), "released while held");
    // The contender's session may sit on a follower that has not applied the release yet
    // (ZooKeeper orders each session's own view, not another's): it sees the lease held
    // until then, never granted early. Wait for the grant, bounded.
    let end = Instant::now() + TTL * 2;
    let next = loop {
        match contender.acquire(&k, &other, TTL).await.unwrap() {
            AcquireOutcome::Acquired { fence, .. } => break fence,
            AcquireOutcome::Held { .. } if Instant::now() < end => {
                sleep(Duration::from_millis(50)).await;
            }
            other => panic!(
                "the key is not free {:?} after the release: {other:?}",
                TTL * 2
            ),
        }
    };
    assert!(next > fence, "{next} after {fence}");
}
