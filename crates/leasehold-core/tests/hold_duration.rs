//! `leasehold_hold_duration_seconds` records each hold once, under how it ended: a released
//! lease as `released` with the time it was held, a lost one as `lost` only (dropping its
//! handle afterwards adds no `released`). Tokio's paused clock, the memory store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::memory::MemoryStore;
use leasehold_core::metrics::HOLD_DURATION;
use leasehold_core::{Key, LeaseClient, LeaseConfig, Store};
use metrics_util::debugging::DebugValue;

#[test]
fn each_hold_is_recorded_once_under_how_it_ended() {
    let config = LeaseConfig::builder(Duration::from_secs(3))
        .watchdog_thread(false)
        .build()
        .unwrap();
    let ((), metrics) = common::recorded(async move {
        let store = Arc::new(MemoryStore::new());
        let client = LeaseClient::new(store.clone(), config);
        let released = client.try_acquire("hold:released").await.unwrap();
        let lost = client.try_acquire("hold:lost").await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(released.release().await.unwrap());
        // Taken from its holder: its first renewal finds it gone.
        store
            .break_lease(&Key::new("hold:lost").unwrap())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(lost.lost_reason().is_some(), "hold:lost must be lost");
        drop(lost);
        tokio::time::sleep(Duration::from_millis(10)).await;
    });
    let mut seen = Vec::new();
    for (ck, v) in metrics {
        if ck.key().name() != HOLD_DURATION {
            continue;
        }
        let end = common::label(&ck, "end");
        let DebugValue::Histogram(samples) = v else {
            panic!("{HOLD_DURATION} is not a histogram: {v:?}");
        };
        for s in samples {
            seen.push((end.clone(), s.into_inner()));
        }
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        [("lost".to_owned(), 1.0), ("released".to_owned(), 0.5)],
        "one sample per hold: (end, seconds held)"
    );
}
