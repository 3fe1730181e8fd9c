//! `leasehold_renewal_slack_seconds` on tokio's paused clock: the value recorded when a
//! renewal is confirmed is exactly the validity left on the old deadline at that moment.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::metrics::{ALL, Kind, RENEWAL_SLACK};
use leasehold_core::{
    Key, LeaseClient, LeaseConfig, OwnerToken, RenewOutcome, Store, StoreError, StoreErrorKind,
};
use metrics_util::debugging::DebugValue;

/// Every renewal answers after `LATENCY` (applied at once); the renewals numbered in
/// `fail` (1-based) fail at once instead.
#[derive(Debug)]
struct SlowRenewals {
    inner: MemoryStore,
    renewals: AtomicU32,
    fail: &'static [u32],
}

const LATENCY: Duration = Duration::from_millis(200);

#[async_trait]
impl leasehold_core::wrap::Forward for SlowRenewals {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        "slow"
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let n = self.renewals.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail.contains(&n) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "slow",
                "injected",
            ));
        }
        let out = self.inner.renew(key, owner, ttl).await;
        tokio::time::sleep(LATENCY).await;
        out
    }
}

/// The slack values recorded, in order, for `fail`ed renewals, and the config used.
fn record(fail: &'static [u32], run_for: Duration) -> (Vec<f64>, LeaseConfig) {
    let config = LeaseConfig::builder(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .op_timeout(Duration::from_millis(500))
        .watchdog_thread(false)
        .build()
        .unwrap();
    let cfg = config.clone();
    let ((), metrics) = common::recorded(async move {
        let store = SlowRenewals {
            inner: MemoryStore::new(),
            renewals: AtomicU32::new(0),
            fail,
        };
        let client = LeaseClient::new(Arc::new(store), cfg);
        let lease = client.try_acquire("job:slack").await.unwrap();
        tokio::time::sleep(run_for).await;
        assert!(lease.is_valid());
        assert!(lease.release().await.unwrap());
    });
    let mut values = Vec::new();
    for (ck, v) in metrics {
        if ck.key().name() != RENEWAL_SLACK {
            continue;
        }
        let labels: Vec<_> = ck
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        assert!(
            labels.contains(&("backend".into(), "slow".into())),
            "{labels:?}"
        );
        assert!(
            labels.contains(&("resource_type".into(), "job".into())),
            "{labels:?}"
        );
        assert_eq!(labels.len(), 2, "{labels:?}");
        match v {
            DebugValue::Histogram(h) => values.extend(h.into_iter().map(|x| x.into_inner())),
            other => panic!("{RENEWAL_SLACK} is not a histogram: {other:?}"),
        }
    }
    (values, config)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[test]
fn slack_is_the_validity_left_when_each_renewal_is_confirmed() {
    // Acquired at t=0, valid until V = validity(3 s). Renewals are sent every second from
    // the previous send and confirmed 200 ms later, so each is confirmed at send + 0.2 s
    // with the previous grant (sent 1 s earlier) valid until that send + V: slack is
    // V − 1 s − 0.2 s, every time. Three renewals in 3.5 s.
    let (values, config) = record(&[], Duration::from_millis(3500));
    let v = config.validity(config.ttl());
    let expected = secs(v - Duration::from_millis(1200));
    assert_eq!(values, vec![expected; 3]);
}

#[test]
fn a_failed_renewal_shows_as_less_slack_on_the_retry() {
    // The first renewal (t=1 s) fails at once; the retry goes a quarter of the renew
    // interval later (t=1.25 s) and is confirmed at t=1.45 s, with the acquire's grant
    // (valid until V) still in force: slack V − 1.45 s. The next renewal is sent 1 s after
    // the retry's send (t=2.25 s), confirmed at 2.45 s, the retry's grant valid until
    // 1.25 s + V: slack V − 1.2 s again.
    let (values, config) = record(&[1], Duration::from_millis(2600));
    let v = config.validity(config.ttl());
    assert_eq!(
        values,
        vec![
            secs(v - Duration::from_millis(1450)),
            secs(v - Duration::from_millis(1200)),
        ]
    );
}

#[test]
fn the_slack_metric_is_in_the_list_of_metrics() {
    assert!(ALL.contains(&(RENEWAL_SLACK, Kind::Histogram)));
    // Every counter ends in `_total`, every histogram in `_seconds`, and no gauge in
    // `_total` (Prometheus naming).
    for (name, kind) in ALL {
        match kind {
            Kind::Counter => assert!(name.ends_with("_total"), "{name}"),
            Kind::Histogram => assert!(name.ends_with("_seconds"), "{name}"),
            Kind::Gauge => assert!(!name.ends_with("_total"), "{name}"),
        }
    }
}

#[test]
fn every_metric_is_described_once_described() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        leasehold_core::metrics::describe();
        // A snapshot lists what was recorded: record each once.
        for (name, kind) in ALL {
            match kind {
                Kind::Counter => metrics::counter!(*name).increment(1),
                Kind::Histogram => metrics::histogram!(*name).record(1.0),
                Kind::Gauge => metrics::gauge!(*name).set(1.0),
            }
        }
    });
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(snapshot.len(), ALL.len());
    for (key, unit, description, _) in snapshot {
        let name = key.key().name().to_owned();
        assert!(description.is_some(), "{name} has no description");
        if name.ends_with("_seconds") {
            assert_eq!(unit, Some(metrics::Unit::Seconds), "{name}");
        }
    }
}
