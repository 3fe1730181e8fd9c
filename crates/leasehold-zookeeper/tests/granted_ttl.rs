//! Issue 24.2 on the real ZooKeeper store: a grant's TTL is at most the session timeout
//! less the leader's report lag and the round trip (`ZkStore::report_lag`), so a lease asked
//! for longer is granted less. The client renews it on the TTL granted
//! (not the TTL asked), and refuses a grant too short for its configuration to renew in
//! time, releasing it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold_core::{
    ConfigError, Error, LeaseClient, LeaseConfig, LeaseObserver, RenewalEvent, RenewalPhase, Store,
};
use leasehold_testkit::{ZK_TICK, ZkServer};
use leasehold_zookeeper::ZkStore;
use tokio::time::{Instant, sleep};

const S: Duration = Duration::from_secs(1);

/// The session timeout asked (and negotiated: the test server grants 0.5 s to 60 s); a
/// lease is granted this less the report lag and the round trip.
const SESSION: Duration = Duration::from_secs(6);

/// The TTL asked, five session timeouts.
const ASKED: Duration = Duration::from_secs(30);

/// Counts the renewals the client saw accepted.
#[derive(Debug, Default)]
struct Accepted(AtomicU64);

impl LeaseObserver for Accepted {
    fn renewal(&self, event: &RenewalEvent<'_>) {
        if event.phase == RenewalPhase::Accepted {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn server() -> ZkServer {
    tokio::task::spawn_blocking(ZkServer::start).await.unwrap()
}

/// A store on its own session, whose timeout is [`SESSION`].
async fn store(zk: &ZkServer) -> Arc<ZkStore> {
    let url = format!(
        "zookeeper://127.0.0.1:{}/granted?session_timeout={}ms&tick_time={}ms",
        zk.port(),
        SESSION.as_millis(),
        ZK_TICK.as_millis()
    );
    let store = ZkStore::open(&url).await.expect("open");
    assert_eq!(store.negotiated_session_timeout().await.unwrap(), SESSION);
    Arc::new(store)
}

/// The TTL a store grants at most: the session timeout less the report lag.
async fn most_granted(store: &ZkStore) -> Duration {
    SESSION - store.report_lag().await.expect("report lag")
}

/// Whether `granted` is what a ZooKeeper store grants at most (`most`), less a round trip
/// of at most a second.
fn is_grant_of(granted: Duration, most: Duration) -> bool {
    granted <= most && granted + S > most
}

/// `leasehold run --ttl 30s` on ZooKeeper with a 6 s session: the grant is under 6 s, and
/// the lease is renewed every third of it (the defaults' third, of the TTL granted) and held for three
/// session timeouts and more — not lost before its first renewal at 10 s, as when the
/// renew interval followed the TTL asked. Sampled every 50 ms; the end is observed (three session timeouts and nine
/// accepted renewals), and another session is refused the key all along and at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_asked_longer_than_the_session_is_renewed_on_the_grant() {
    let zk = server().await;
    let accepted = Arc::new(Accepted::default());
    let config = LeaseConfig::new(ASKED).unwrap();
    let mine = store(&zk).await;
    let most = most_granted(&mine).await;
    let client = LeaseClient::builder(mine, config.clone())
        .observer(accepted.clone())
        .build();
    let other = LeaseClient::new(store(&zk).await, config.clone());
    let started = Instant::now();
    let lease = client.try_acquire("job:granted").await.unwrap();
    let granted = lease.ttl();
    assert!(
        is_grant_of(granted, most),
        "the lease reports the TTL granted: {granted:?}, at most {most:?}"
    );
    let third = config.renew_interval_for(granted);
    assert!(granted / 3 - third < Duration::from_micros(1), "{third:?}");
    let first_deadline = lease.valid_until();
    let mut probed = 0;
    while accepted.0.load(Ordering::Relaxed) < 9 || started.elapsed() < 3 * SESSION {
        assert!(
            lease.is_valid(),
            "lost ({:?}) after {:?} with {} renewals accepted",
            lease.lost_reason(),
            started.elapsed(),
            accepted.0.load(Ordering::Relaxed)
        );
        if Instant::now() >= first_deadline {
            assert!(
                accepted.0.load(Ordering::Relaxed) >= 1,
                "no renewal accepted by the first grant's deadline"
            );
        }
        // Now and then, another session tries the key: the store holds it for us.
        if probed * 2 * S <= started.elapsed() {
            probed += 1;
            assert!(
                matches!(
                    other.try_acquire("job:granted").await,
                    Err(Error::Contended { .. })
                ),
                "another session got the key after {:?}",
                started.elapsed()
            );
        }
        assert!(started.elapsed() < 4 * ASKED, "renewals stalled");
        sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= 3 * SESSION, "{:?}", started.elapsed());
    assert!(lease.is_valid(), "{:?}", lease.lost_reason());
    assert!(
        is_grant_of(lease.ttl(), most),
        "every renewal grants what the session backs: {:?}",
        lease.ttl()
    );
    assert!(lease.release().await.unwrap(), "still ours in the store");
}

/// A configuration whose fixed 5 s margin fits a 30 s lease but not a grant under 6 s: the
/// ZooKeeper grant is refused with an error naming both TTLs, and its node is deleted at
/// once (another session takes the key long before the grant would have expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_with_no_room_to_renew_is_refused_and_released() {
    let zk = server().await;
    let config = LeaseConfig::builder(ASKED)
        .renew_interval(10 * S)
        .op_timeout(14 * S)
        .margin(5 * S)
        .build()
        .unwrap();
    let mine = store(&zk).await;
    let most = most_granted(&mine).await;
    let client = LeaseClient::new(mine.clone(), config);
    let other = LeaseClient::new(store(&zk).await, LeaseConfig::new(SESSION).unwrap());
    let started = Instant::now();
    let err = client.try_acquire("job:tight").await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::InvalidConfig(ConfigError::GrantTooShort { asked, granted, .. })
                if *asked == ASKED && is_grant_of(*granted, most)
        ),
        "{err:?}"
    );
    let Error::InvalidConfig(ConfigError::GrantTooShort { granted, .. }) = &err else {
        unreachable!()
    };
    let text = err.to_string();
    assert!(
        text.contains("30s") && text.contains(&format!("{granted:?}")),
        "{text}"
    );
    let taken = loop {
        match other.try_acquire("job:tight").await {
            Ok(lease) => break lease,
            Err(Error::Contended { .. }) => {
                assert!(
                    started.elapsed() < SESSION,
                    "the refused grant was not released: still held after {:?}",
                    started.elapsed()
                );
                sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        mine.inspect(taken.key()).await.unwrap().map(|i| i.owner),
        Some(*taken.owner())
    );
    assert!(taken.release().await.unwrap());
}
