//! The at-risk state against a real `redis-server` behind the fault proxy (docs/design.md
//! §4, "At risk"): a holder whose renewal times out in a blackhole is at risk from that
//! moment, while the store still lists it as the holder and its deadline is before the
//! store's own expiry; a renewal confirmed after the network returns makes it held again.

mod common;

use std::time::Duration;

use common::Standalone;
use leasehold_core::{Health, LeaseClient, LeaseConfig, Store};
use leasehold_redis::RedisStore;
use leasehold_testkit::{ProxyMode, RedisOptions};
use tokio::time::{Instant, timeout};

const TTL: Duration = Duration::from_secs(4);
const EVERY: Duration = Duration::from_secs(1);
const OP_TIMEOUT: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_lost_in_a_blackhole_puts_the_holder_at_risk_until_one_is_confirmed() {
    let s = Standalone::start_with(RedisOptions::new(), |b| b.op_timeout(OP_TIMEOUT)).await;
    // The server itself, not through the proxy: what the store says meanwhile.
    let direct = RedisStore::open(&s.server.url()).await.unwrap();
    // Renewed every second; lost only at the deadline or after 10 failures, so that the
    // network can come back in time.
    let config = LeaseConfig::builder(TTL)
        .renew_interval(EVERY)
        .op_timeout(OP_TIMEOUT)
        .renew_failures_before_lost(10)
        .build()
        .unwrap();
    let client = LeaseClient::new(s.store.clone(), config);
    let lease = client.try_acquire("job:at-risk").await.unwrap();
    let mut changes = lease.health_changes();
    s.proxy.set_mode(ProxyMode::Blackhole);
    let cut = Instant::now();

    let seen = timeout(TTL, changes.next()).await.expect("at risk in time");
    let Health::AtRisk { since, deadline } = seen else {
        panic!("the first change in a blackhole is to at risk, not {seen:?}");
    };
    // No earlier than the renewal's own timeout after the cut, no later than the next
    // renewal plus its timeout (and some scheduling).
    assert!(
        since >= cut + OP_TIMEOUT.min(EVERY),
        "at risk before any renewal could time out"
    );
    assert!(
        since <= cut + EVERY + OP_TIMEOUT + Duration::from_millis(300),
        "at risk {:?} after the cut",
        since - cut
    );
    assert_eq!(deadline, lease.valid_until());
    // The moment in between: still the holder in the store, and the store's expiry is
    // after the holder's deadline.
    let asked = Instant::now();
    let info = direct
        .inspect(lease.key())
        .await
        .unwrap()
        .expect("still in the store while at risk");
    assert_eq!(info.owner, *lease.owner());
    let store_expiry = asked + info.remaining.expect("Redis reports the PTTL");
    assert!(
        deadline < store_expiry,
        "the holder's deadline is {:?} past the store's expiry",
        deadline - store_expiry
    );
    assert!(lease.is_valid(), "held while at risk");

    s.proxy.set_mode(ProxyMode::Pass);
    let back = timeout(deadline - Instant::now(), changes.next())
        .await
        .expect("held again before the deadline");
    assert_eq!(back, Health::Held);
    assert!(
        lease.valid_until() > deadline,
        "a confirmed renewal moved the deadline"
    );
    assert!(lease.release().await.unwrap());
}
