//! Tests on the real clock: the watchdog thread under a starved runtime, and metrics.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use leasehold_core::memory::MemoryStore;
use leasehold_core::{Key, LeaseClient, LeaseConfig, LostReason};
use metrics_util::debugging::DebugValue;

/// docs/faults.md row 23: the async runtime is blocked by CPU work; the lost signal still fires
/// at the validity deadline, seen from another thread.
#[test]
fn starved_runtime_still_fires_lost_at_the_deadline() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ttl = Duration::from_millis(300);
    let (lease, watcher) = rt.block_on(async {
        let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(ttl).unwrap());
        // The deadline counts from the acquire's send, which is after this instant (an
        // instant taken after the call returns would make a slow reply look like an early
        // signal).
        let acquired = StdInstant::now();
        let lease = client.try_acquire("job:starved").await.unwrap();
        let token = lease.lost_token();
        let watcher = std::thread::spawn(move || {
            futures::executor::block_on(token.cancelled());
            acquired.elapsed()
        });
        (lease, watcher)
    });
    // Starve the runtime: nothing in it can run for 1.5 s (five TTLs).
    rt.block_on(async { std::thread::sleep(Duration::from_millis(1500)) });
    let fired_after = watcher.join().unwrap();
    assert!(
        fired_after >= Duration::from_millis(280),
        "fired early: {fired_after:?}"
    );
    // The watchdog slept with nothing to watch (up to a second): a new lease with an
    // earlier deadline must wake it, so it fires at ~0.3 s, not at its next idle wake-up.
    assert!(
        fired_after < Duration::from_millis(800),
        "fired late: {fired_after:?}"
    );
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    assert!(!lease.is_valid());
    rt.block_on(async { drop(lease) });
}

/// A metric's name, its labels and its value.
type Sample = (String, Vec<(String, String)>, DebugValue);

fn counter(snapshot: &[Sample], name: &str, label: (&str, &str)) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name && labels.iter().any(|(k, v)| k == label.0 && v == label.1)
        })
        .map(|(_, _, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

#[test]
fn metrics_have_the_documented_names_and_labels() {
    let ((), metrics) = common::recorded(async {
        let store = MemoryStore::new();
        let cfg = LeaseConfig::builder(Duration::from_secs(3))
            .watchdog_thread(false)
            .build()
            .unwrap();
        let client = LeaseClient::new(Arc::new(store.clone()), cfg);
        let key = Key::new("invoice:2026-11-secret-customer").unwrap();
        let lease = client.try_acquire(&key).await.unwrap();
        assert!(client.try_acquire(&key).await.is_err());
        tokio::time::sleep(Duration::from_millis(1100)).await; // one renewal
        store.forget(&key);
        assert_eq!(lease.lost().await, LostReason::NotOwner);
        let second = client.try_acquire(&key).await.unwrap();
        assert!(second.release().await.unwrap());
    });
    let snapshot: Vec<_> = metrics
        .into_iter()
        .map(|(ck, v)| {
            let key = ck.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, v)
        })
        .collect();
    assert_eq!(
        counter(&snapshot, "leasehold_acquire_total", ("result", "acquired")),
        2
    );
    assert_eq!(
        counter(
            &snapshot,
            "leasehold_acquire_total",
            ("result", "contended")
        ),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "leasehold_contention_total",
            ("resource_type", "invoice")
        ),
        1
    );
    assert_eq!(
        counter(&snapshot, "leasehold_renew_total", ("result", "renewed")),
        1
    );
    assert_eq!(
        counter(&snapshot, "leasehold_renew_total", ("result", "not_owner")),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "leasehold_lease_lost_total",
            ("reason", "not_owner")
        ),
        1
    );
    // One hold ended by a release (the second lease), one by a loss (the first).
    let holds = |end: &str| {
        snapshot
            .iter()
            .filter(|(n, labels, _)| {
                n == "leasehold_hold_duration_seconds"
                    && labels.iter().any(|(k, v)| k == "end" && v == end)
            })
            .map(|(_, _, v)| match v {
                DebugValue::Histogram(h) => h.len(),
                _ => 0,
            })
            .sum::<usize>()
    };
    assert_eq!((holds("released"), holds("lost")), (1, 1));
    let names: std::collections::BTreeSet<_> = snapshot.iter().map(|s| s.0.as_str()).collect();
    for name in [
        "leasehold_acquire_duration_seconds",
        "leasehold_hold_duration_seconds",
        "leasehold_renew_latency_seconds",
    ] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    assert!(
        names.contains("leasehold_renewal_slack_seconds"),
        "a confirmed renewal records its slack: {names:?}"
    );
    for name in &names {
        assert!(
            leasehold_core::metrics::ALL.iter().any(|(n, _)| n == name),
            "{name} is recorded but not in metrics::ALL"
        );
    }
    for (name, labels, _) in &snapshot {
        for (k, v) in labels {
            assert!(
                !v.contains("secret-customer"),
                "{name} has the full key as label {k}"
            );
        }
        assert!(
            labels.iter().any(|(k, v)| k == "backend" && v == "memory"),
            "{name} lacks backend"
        );
    }
}
