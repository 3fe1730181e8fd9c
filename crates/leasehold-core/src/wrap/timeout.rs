//! A store wrapper that bounds every call by a timeout.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::key::Key;
use crate::lease::ended::EndedGrants;
use crate::store::doctor::Diagnosis;
use crate::store::{
    AcquireAnyOutcome, AcquireOutcome, BatchStore, Capabilities, Changes, CheckedAcquire,
    LeaseInfo, Record, RecordCheck, ReleaseOutcome, RenewOutcome, Store, WaitOutcome, WaitStore,
    WatchStore,
};
use crate::token::{Fence, OwnerToken};

/// Bounds every call of the wrapped store by a timeout: a call that has not answered in
/// time fails with [`Timeout`](crate::StoreErrorKind::Timeout) (an
/// ambiguous failure: it may have been applied). Its extensions are the wrapped store's,
/// bounded the same way; [`wait_released`](WaitStore::wait_released) is bounded by its own
/// `timeout` plus this one.
///
/// [`LeaseClient`](crate::LeaseClient) already bounds its own calls by the configuration's
/// operation timeout; wrap a store in this for the other paths (an admin tool's inspect,
/// list and break).
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{Store, memory::MemoryStore, wrap::TimeoutStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), leasehold_core::StoreError> {
/// let store = TimeoutStore::new(Arc::new(MemoryStore::new()), Duration::from_secs(5));
/// assert!(store.list("job:").await?.is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TimeoutStore {
    inner: Arc<dyn Store>,
    timeout: Duration,
}

impl TimeoutStore {
    /// Wraps `inner`, bounding each call by `timeout`.
    pub fn new(inner: Arc<dyn Store>, timeout: Duration) -> Self {
        Self { inner, timeout }
    }

    /// The bound.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn bounded<T>(
        &self,
        op: &'static str,
        limit: Duration,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        StoreError::bounded(self.inner.backend(), op, limit, call).await
    }
}

#[async_trait]
impl Store for TimeoutStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn batch(&self) -> Option<&dyn BatchStore> {
        self.inner.batch().map(|_| self as &dyn BatchStore)
    }

    fn watcher(&self) -> Option<&dyn WatchStore> {
        self.inner.watcher().map(|_| self as &dyn WatchStore)
    }

    fn waiter(&self) -> Option<&dyn WaitStore> {
        self.inner.waiter().map(|_| self as &dyn WaitStore)
    }

    fn ended_grants(&self) -> Option<&EndedGrants> {
        self.inner.ended_grants()
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let call = self.inner.acquire(key, owner, ttl);
        self.bounded("acquire", self.timeout, call).await
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let call = self.inner.renew(key, owner, ttl);
        self.bounded("renew", self.timeout, call).await
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let call = self.inner.release(key, owner);
        self.bounded("release", self.timeout, call).await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let call = self.inner.inspect(key);
        self.bounded("inspect", self.timeout, call).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        let call = self.inner.list(prefix);
        self.bounded("list", self.timeout, call).await
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let call = self.inner.break_lease(key);
        self.bounded("break", self.timeout, call).await
    }

    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        let call = self.inner.put_record(key, fence, value);
        self.bounded("put record", self.timeout, call).await
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let call = self.inner.get_record(key);
        self.bounded("get record", self.timeout, call).await
    }

    async fn diagnose(&self) -> Result<Diagnosis, StoreError> {
        let call = self.inner.diagnose();
        self.bounded("diagnose", self.timeout, call).await
    }
}

/// The wrapped store's batch (or, should it have none by now, the defaults over it),
/// each call bounded.
#[async_trait]
impl BatchStore for TimeoutStore {
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        let call = crate::store::renew_many(&*self.inner, leases, ttl);
        self.bounded("renew", self.timeout, call).await
    }

    fn atomic_acquire_any(&self) -> bool {
        self.inner.batch().is_some_and(|b| b.atomic_acquire_any())
    }

    async fn acquire_any(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireAnyOutcome, StoreError> {
        let call = crate::store::acquire_any(&*self.inner, keys, owner, ttl);
        self.bounded("acquire", self.timeout, call).await
    }

    async fn acquire_any_checked(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
        check: RecordCheck<'_>,
    ) -> Result<CheckedAcquire, StoreError> {
        let call = crate::store::acquire_any_checked(&*self.inner, keys, owner, ttl, check);
        self.bounded("acquire", self.timeout, call).await
    }
}

/// The wrapped store's watch; setting it up is bounded, the notices come when they come.
#[async_trait]
impl WatchStore for TimeoutStore {
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        let call = async {
            match self.inner.watcher() {
                Some(w) => w.watch(key).await,
                None => Err(StoreError::unsupported(self.inner.backend(), "watching")),
            }
        };
        self.bounded("watch", self.timeout, call).await
    }
}

/// The wrapped store's wait, bounded by its own `timeout` plus this one.
#[async_trait]
impl WaitStore for TimeoutStore {
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let call = async {
            match self.inner.waiter() {
                Some(w) => w.wait_released(key, owner, timeout).await,
                None => Err(StoreError::unsupported(
                    self.inner.backend(),
                    "waiting for release",
                )),
            }
        };
        let limit = timeout.saturating_add(self.timeout);
        self.bounded("wait for release", limit, call).await
    }

    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        let call = async {
            match self.inner.waiter() {
                Some(w) => w.wait_turn(key, owner, ttl, timeout).await,
                None => Err(StoreError::unsupported(
                    self.inner.backend(),
                    "waiting for release",
                )),
            }
        };
        let limit = timeout.saturating_add(self.timeout);
        self.bounded("wait for release", limit, call).await
    }
}
