//! A recipe written outside the crate on the client's public acquire step
//! (`LeaseClient::acquire_with` + `AcquireStep`), as the semaphore is inside it: the API
//! the recipes are built on is public and enough (docs/design.md §9).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::memory::MemoryStore;
use leasehold_core::{
    AcquireAnyOutcome, AcquireStep, Error, Key, LeaseClient, LeaseConfig, StepCall, Store,
    first_granted,
};

/// Takes the first free of its keys; refuses with an error of its own when told to.
struct FirstFree {
    name: Key,
    keys: Vec<Key>,
    refuse: AtomicBool,
}

#[async_trait]
impl AcquireStep for FirstFree {
    fn name(&self) -> &Key {
        &self.name
    }

    fn keys(&self) -> &[Key] {
        &self.keys
    }

    async fn attempt(&self, call: &StepCall<'_>) -> Result<AcquireAnyOutcome, Error> {
        if self.refuse.load(Ordering::Relaxed) {
            return Err(Error::InvalidPermits { permits: 0, max: 1 });
        }
        let store = call.store();
        let each = |key| call.bounded("acquire", store.acquire(key, call.owner(), call.ttl()));
        Ok(first_granted(&self.keys, each).await?)
    }
}

#[tokio::test(start_paused = true)]
async fn a_recipe_outside_the_crate_takes_leases_through_the_public_step() {
    let store = Arc::new(MemoryStore::new());
    let config = LeaseConfig::new(Duration::from_secs(10)).unwrap();
    let client = LeaseClient::new(store.clone(), config);
    let keys: Vec<Key> = ["pair#0", "pair#1"].map(|k| Key::new(k).unwrap()).into();
    let step = FirstFree {
        name: Key::new("pair").unwrap(),
        keys: keys.clone(),
        refuse: AtomicBool::new(false),
    };

    let (first, i) = client.acquire_with(&step, None).await.unwrap();
    let (second, j) = client.acquire_with(&step, None).await.unwrap();
    assert_eq!((i, j), (0, 1));
    assert_eq!(first.key(), &keys[0]);
    assert_eq!(second.key(), &keys[1]);
    assert!(first.is_valid() && second.is_valid());

    // Both held: no wait answers Contended at once, naming the step.
    match client.acquire_with(&step, None).await {
        Err(Error::Contended { key, .. }) => assert_eq!(key.as_str(), "pair"),
        other => panic!("expected Contended, got {other:?}"),
    }
    // A wait ends at its deadline with WaitTimeout.
    let waited = client
        .acquire_with(&step, Some(Duration::from_secs(1)))
        .await;
    assert!(
        matches!(waited, Err(Error::WaitTimeout { .. })),
        "{waited:?}"
    );

    // A released key is taken again, with a higher fence.
    let fence = first.fence();
    assert!(first.release().await.unwrap());
    let (again, k) = client.acquire_with(&step, None).await.unwrap();
    assert_eq!(k, 0);
    assert!(again.fence() > fence);
    assert!(again.release().await.unwrap());

    // A refusal of the step's own ends the call with its error and takes nothing.
    step.refuse.store(true, Ordering::Relaxed);
    let refused = client
        .acquire_with(&step, Some(Duration::from_secs(1)))
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidPermits { .. })),
        "{refused:?}"
    );
    assert!(store.inspect(&keys[0]).await.unwrap().is_none());
    assert!(second.release().await.unwrap());
}
