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

/// A one-key step whose key is free by its own rule, not the store's: it answers `Held`
/// (another owner's 10 s left) until told otherwise, and counts its attempts.
struct OwnRule {
    key: Key,
    attempts: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl AcquireStep for OwnRule {
    fn name(&self) -> &Key {
        &self.key
    }

    fn keys(&self) -> &[Key] {
        std::slice::from_ref(&self.key)
    }

    async fn attempt(&self, _call: &StepCall<'_>) -> Result<AcquireAnyOutcome, Error> {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        Ok(AcquireAnyOutcome::Held {
            remaining: Some(Duration::from_secs(10)),
        })
    }
}

/// A step that does not wait for the store's release notice (the trait's default) is
/// retried on the configured backoff while its deadline lasts, even though its one key is
/// held in the store: its `Held` is its own rule's, which no release of that key answers.
#[tokio::test(start_paused = true)]
async fn a_step_that_does_not_wait_for_releases_is_retried_on_the_backoff() {
    let ms = Duration::from_millis(1);
    let store = Arc::new(MemoryStore::new());
    let config = LeaseConfig::builder(Duration::from_secs(10))
        .watchdog_thread(false)
        .backoff(leasehold_core::Backoff::new(10 * ms, 100 * ms).unwrap())
        .build()
        .unwrap();
    let key = Key::new("own-rule").unwrap();
    // The key is held in the store for all of the wait: a client that waited for its
    // release would make one attempt and sleep to the deadline.
    let other = LeaseClient::new(store.clone(), config.clone());
    let held = other.try_acquire(key.clone()).await.unwrap();
    let client = LeaseClient::new(store.clone(), config);
    let step = OwnRule {
        key,
        attempts: Default::default(),
    };
    let waited = client.acquire_with(&step, Some(2000 * ms)).await;
    assert!(
        matches!(waited, Err(Error::WaitTimeout { .. })),
        "{waited:?}"
    );
    // Full jitter below 100 ms: about 40 attempts in 2 s; never as few as 10.
    let attempts = step.attempts.load(Ordering::Relaxed);
    assert!(
        attempts >= 10,
        "{attempts} attempts in 2 s on a 100 ms backoff"
    );
    drop(held);
}

/// The memory store, counting the calls of each way to acquire. It does not declare its
/// way for a try (`Forward::has_acquire_no_wait`'s default); [`Declared`] does.
#[derive(Debug, Default)]
struct CountingWays {
    inner: MemoryStore,
    acquires: std::sync::atomic::AtomicU32,
    tries: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl leasehold_core::wrap::Forward for CountingWays {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &leasehold_core::OwnerToken,
        ttl: Duration,
    ) -> Result<leasehold_core::AcquireOutcome, leasehold_core::StoreError> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(key, owner, ttl).await
    }

    async fn acquire_no_wait(
        &self,
        key: &Key,
        owner: &leasehold_core::OwnerToken,
        ttl: Duration,
    ) -> Result<leasehold_core::AcquireOutcome, leasehold_core::StoreError> {
        self.tries.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire_no_wait(key, owner, ttl).await
    }
}

/// [`CountingWays`], declaring its way for a try.
#[derive(Debug, Default)]
struct Declared(CountingWays);

#[async_trait]
impl leasehold_core::wrap::Forward for Declared {
    fn inner(&self) -> &dyn Store {
        &self.0
    }

    fn has_acquire_no_wait(&self) -> bool {
        true
    }

    async fn acquire_no_wait(
        &self,
        key: &Key,
        owner: &leasehold_core::OwnerToken,
        ttl: Duration,
    ) -> Result<leasehold_core::AcquireOutcome, leasehold_core::StoreError> {
        Store::acquire_no_wait(&self.0, key, owner, ttl).await
    }
}

/// `try_acquire` asks the store with `acquire_no_wait` when the store declares one (a store
/// may then take a way that a caller about to wait must not: ZooKeeper creates its node
/// first), and with `acquire` when it does not — a forwarding store, unless it says so
/// (the default `acquire_no_wait` would only add a boxed call); an acquire with a wait,
/// even one of zero, asks with `acquire`, held key or free.
#[tokio::test]
async fn a_try_asks_the_store_not_to_wait_and_an_acquire_with_a_wait_does_not() {
    let plain = Arc::new(CountingWays::default());
    assert!(!Store::has_acquire_no_wait(&*plain));
    let client = LeaseClient::new(
        plain.clone(),
        LeaseConfig::new(Duration::from_secs(10)).unwrap(),
    );
    let lease = client.try_acquire("ways:plain").await.unwrap();
    assert!(lease.release().await.unwrap());
    let counts = (
        plain.acquires.load(Ordering::Relaxed),
        plain.tries.load(Ordering::Relaxed),
    );
    assert_eq!(
        counts,
        (1, 0),
        "a store without a way of its own is asked to acquire"
    );
    let declared = Arc::new(Declared::default());
    let store = &declared.0;
    let config = LeaseConfig::builder(Duration::from_secs(10))
        .watchdog_thread(false)
        .build()
        .unwrap();
    let client = LeaseClient::new(declared.clone(), config);
    let counts = || {
        (
            store.acquires.load(Ordering::Relaxed),
            store.tries.load(Ordering::Relaxed),
        )
    };
    let lease = client.try_acquire("ways:k").await.unwrap();
    assert_eq!(counts(), (0, 1));
    assert!(matches!(
        client.try_acquire("ways:k").await,
        Err(Error::Contended { .. })
    ));
    assert_eq!(counts(), (0, 2));
    assert!(lease.release().await.unwrap());
    let lease = client.acquire("ways:k", Duration::ZERO).await.unwrap();
    assert_eq!(counts(), (1, 2));
    let waited = client.acquire("ways:k", Duration::from_millis(50)).await;
    assert!(
        matches!(waited, Err(Error::WaitTimeout { .. })),
        "{waited:?}"
    );
    let (acquires, tries) = counts();
    assert!(
        acquires >= 2 && tries == 2,
        "{acquires} acquires, {tries} tries"
    );
    assert!(lease.release().await.unwrap());
}
