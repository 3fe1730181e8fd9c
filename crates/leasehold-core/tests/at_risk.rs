//! The at-risk state (docs/design.md §4, "At risk"): a lease is at risk from its first
//! failed or timed-out renewal until a renewal is confirmed or its deadline passes, its
//! health changes are told to a waiting future, and `leasehold_leases_at_risk` counts it
//! only meanwhile. On tokio's paused clock, so every instant is exact: the memory store
//! behind the fault wrapper, which refuses or blackholes every call on demand.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::memory::MemoryStore;
use leasehold_core::metrics::{AT_RISK_TOTAL, LEASES_AT_RISK};
use leasehold_core::wrap::{FaultStore, Unreachable};
use leasehold_core::{Health, HealthChanges, Lease, LeaseClient, LeaseConfig, LostReason, Store};
use metrics_util::debugging::DebugValue;
use tokio::time::{Instant, sleep, sleep_until};

const TTL: Duration = Duration::from_secs(3);
const EVERY: Duration = Duration::from_secs(1);
const OP_TIMEOUT: Duration = Duration::from_millis(400);

/// Renewed every second, each call bounded by 400 ms, lost after `failures` failed
/// renewals in a row; retried a quarter interval (250 ms) after a failure.
fn config(failures: u32) -> LeaseConfig {
    LeaseConfig::builder(TTL)
        .renew_interval(EVERY)
        .op_timeout(OP_TIMEOUT)
        .renew_failures_before_lost(failures)
        .watchdog_thread(false)
        .build()
        .unwrap()
}

/// A lease on the memory store behind the fault wrapper, lost after `failures` failed
/// renewals in a row, and the stream of its health changes (from the grant).
async fn held(failures: u32) -> (Arc<FaultStore>, LeaseClient, Lease, HealthChanges) {
    let store = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
    let client = LeaseClient::new(store.clone(), config(failures));
    let lease = client.try_acquire("job:a").await.unwrap();
    let changes = lease.health_changes();
    (store, client, lease, changes)
}

/// The gauge's value and the counter's (zero when never recorded).
fn at_risk_metrics(metrics: &[common::Recorded]) -> (f64, u64) {
    let mut gauge = 0.0;
    let mut count = 0;
    for (ck, v) in metrics {
        match (ck.key().name(), v) {
            (LEASES_AT_RISK, DebugValue::Gauge(g)) => gauge += g.into_inner(),
            (AT_RISK_TOTAL, DebugValue::Counter(c)) => count += c,
            _ => {}
        }
    }
    (gauge, count)
}

#[test]
fn a_refused_renewal_puts_the_lease_at_risk_until_one_is_confirmed() {
    let ((), metrics) = common::recorded(async {
        let start = Instant::now();
        let (store, _client, lease, mut changes) = held(3).await;
        assert_eq!(lease.health(), Health::Held);

        // The first renewal (at 1 s) is refused.
        store.set_unreachable(Some(Unreachable::Refuse));
        let seen = changes.next().await;
        let at = Instant::now();
        assert_eq!(at, start + EVERY, "at risk the moment the renewal failed");
        assert_eq!(
            seen,
            Health::AtRisk {
                since: at,
                deadline: lease.valid_until()
            }
        );
        assert_eq!(lease.health(), seen);
        assert!(lease.is_valid(), "still held while at risk");

        // The retry, a quarter interval later, fails too: still the same spell.
        sleep(EVERY / 4 + Duration::from_millis(10)).await;
        assert_eq!(lease.health(), seen, "a second failure starts no new spell");

        // The store answers again: the next retry is confirmed.
        store.set_unreachable(None);
        assert_eq!(changes.next().await, Health::Held);
        assert_eq!(Instant::now(), start + EVERY + EVERY / 2);
        assert_eq!(lease.health(), Health::Held);
        lease.release().await.unwrap();
    });
    assert_eq!(
        at_risk_metrics(&metrics),
        (0.0, 1),
        "one spell, counted once, and the gauge back at zero"
    );
}

#[test]
fn a_timed_out_renewal_puts_the_lease_at_risk_at_its_timeout_not_before() {
    let ((), metrics) = common::recorded(async {
        let start = Instant::now();
        let (store, client, lease, mut changes) = held(3).await;
        store.set_unreachable(Some(Unreachable::Hang));

        // In flight, unanswered, but within its timeout: held.
        sleep_until(start + EVERY + OP_TIMEOUT - Duration::from_millis(1)).await;
        assert_eq!(lease.health(), Health::Held);

        let seen = changes.next().await;
        assert_eq!(Instant::now(), start + EVERY + OP_TIMEOUT);
        assert!(
            matches!(seen, Health::AtRisk { since, .. } if since == start + EVERY + OP_TIMEOUT)
        );
        drop(lease);
        client.shutdown(Duration::from_secs(1)).await;
    });
    assert_eq!(
        at_risk_metrics(&metrics),
        (0.0, 1),
        "a lease dropped while at risk is no longer counted at risk"
    );
}

#[test]
fn an_at_risk_lease_is_lost_at_its_deadline_and_the_change_is_told() {
    let ((), metrics) = common::recorded(async {
        // Enough failures allowed that only the deadline loses it.
        let (store, _client, lease, mut changes) = held(100).await;
        let deadline = lease.valid_until();
        store.set_unreachable(Some(Unreachable::Refuse));
        assert!(
            matches!(changes.next().await, Health::AtRisk { deadline: d, .. } if d == deadline)
        );
        // Retries fail all along; the next change is the loss, at the deadline.
        assert!(matches!(changes.next().await, Health::Lost(_)));
        assert_eq!(Instant::now(), deadline);
        assert!(!lease.is_valid());
        // Lost is final: every later call answers at once.
        assert!(matches!(changes.next().await, Health::Lost(_)));
        assert_eq!(Instant::now(), deadline);
    });
    assert_eq!(at_risk_metrics(&metrics), (0.0, 1));
}

#[test]
fn a_lease_lost_at_once_is_never_at_risk() {
    let ((), metrics) = common::recorded(async {
        let (store, _client, lease, mut changes) = held(3).await;
        // An operator breaks it: the next renewal answers "not the owner".
        store.break_lease(lease.key()).await.unwrap();
        assert_eq!(changes.next().await, Health::Lost(LostReason::NotOwner));
        assert_eq!(lease.health(), Health::Lost(LostReason::NotOwner));
    });
    assert_eq!(at_risk_metrics(&metrics), (0.0, 0));
}

#[test]
fn with_one_failure_allowed_a_failed_renewal_loses_the_lease_without_a_spell_at_risk() {
    let ((), metrics) = common::recorded(async {
        let (store, _client, _lease, mut changes) = held(1).await;
        store.set_unreachable(Some(Unreachable::Refuse));
        assert!(matches!(changes.next().await, Health::Lost(_)));
    });
    assert_eq!(at_risk_metrics(&metrics), (0.0, 0));
}

#[test]
fn a_change_while_nobody_waited_is_returned_by_the_next_wait() {
    common::recorded(async {
        let start = Instant::now();
        let (store, _client, lease, mut changes) = held(3).await;
        store.set_unreachable(Some(Unreachable::Refuse));
        // Nobody waits while the lease goes at risk.
        sleep_until(start + EVERY + Duration::from_millis(100)).await;
        let before = Instant::now();
        assert!(matches!(changes.next().await, Health::AtRisk { .. }));
        assert_eq!(Instant::now(), before, "answered at once");
        // A wait cancelled before any change loses nothing.
        tokio::select! {
            _ = changes.next() => panic!("no change yet"),
            () = sleep(Duration::from_millis(10)) => {}
        }
        store.set_unreachable(None);
        assert_eq!(changes.next().await, Health::Held);
        drop(lease);
    });
}
