//! `leasehold_renew_total` counts each lease of a batch under its own resource type and
//! result: a batch that renews some leases and finds another taken is not one count of
//! one kind (tokio's paused clock, the memory store behind a batching wrapper).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::metrics::RENEW_TOTAL;
use leasehold_core::{
    BatchStore, Key, LeaseClient, LeaseConfig, OwnerToken, RenewOutcome, Store, StoreError,
};
use metrics_util::debugging::DebugValue;

/// The memory store, renewing in batches (each counted).
#[derive(Debug, Default)]
struct Batching {
    inner: MemoryStore,
    batches: AtomicUsize,
}

impl leasehold_core::wrap::Forward for Batching {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        "batching"
    }
    fn batch(&self) -> Option<&dyn BatchStore> {
        Some(self)
    }
}

#[async_trait]
impl BatchStore for Batching {
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        leasehold_core::renew_many(&self.inner, leases, ttl).await
    }
}

#[test]
fn each_lease_of_a_batch_is_counted_under_its_type_and_result() {
    let config = LeaseConfig::builder(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .watchdog_thread(false)
        .build()
        .unwrap();
    let (batches, metrics) = common::recorded(async move {
        let store = Arc::new(Batching::default());
        let client = LeaseClient::new(store.clone(), config);
        let mut leases = Vec::new();
        for key in ["job:a", "job:b", "job:c", "tenant:a"] {
            leases.push(client.try_acquire(key).await.unwrap());
        }
        // Taken from its holder before the first renewal: that renewal finds it gone.
        store
            .break_lease(&Key::new("job:c").unwrap())
            .await
            .unwrap();
        // One renewal round (due at 1 s, all four at once).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(leases[2].lost_reason().is_some(), "job:c must be lost");
        for lease in [&leases[0], &leases[1], &leases[3]] {
            assert!(lease.is_valid(), "{} must still be held", lease.key());
        }
        store.batches.load(Ordering::SeqCst)
    });
    assert_eq!(batches, 1, "the four renewals due together go in one batch");
    let mut counts = BTreeMap::new();
    for (ck, v) in metrics {
        if ck.key().name() != RENEW_TOTAL {
            continue;
        }
        let DebugValue::Counter(n) = v else {
            panic!("{RENEW_TOTAL} is not a counter: {v:?}");
        };
        assert_eq!(common::label(&ck, "backend"), "batching");
        counts.insert(
            (
                common::label(&ck, "resource_type"),
                common::label(&ck, "result"),
            ),
            n,
        );
    }
    let expected: BTreeMap<(String, String), u64> = [
        (("job".into(), "not_owner".into()), 1),
        (("job".into(), "renewed".into()), 2),
        (("tenant".into(), "renewed".into()), 1),
    ]
    .into();
    assert_eq!(counts, expected);
}
