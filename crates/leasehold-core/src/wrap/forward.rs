//! A base for tests' stores that pass every call to another (feature `test-util`).

use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::key::Key;
use crate::lease::ended::EndedGrants;
use crate::store::doctor::Diagnosis;
use crate::store::{
    AcquireOutcome, BatchStore, Capabilities, LeaseInfo, Record, ReleaseOutcome, RenewOutcome,
    Store, WaitStore, WatchStore,
};
use crate::token::{Fence, OwnerToken};

/// A test's store that passes every call to another ([`inner`](Self::inner)) and
/// overrides only what it changes: every type that implements it is a [`Store`], each
/// operation the inner store's unless overridden here. Feature `test-util`.
///
/// Its extensions are none unless it overrides their accessors, as the old defaults had
/// it: a batch of the inner store would bypass this store's own `renew`. To pass one on
/// untouched, return the inner store's (`self.inner().watcher()`); to change one,
/// implement the extension trait for this type and return `Some(self)`.
///
/// Implement it by its path (`impl leasehold_core::wrap::Forward for MyStore`) rather than
/// importing it: with both `Forward` and `Store` in scope, a call such as `store.acquire(..)`
/// on the concrete type is ambiguous.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::Duration;
/// use leasehold_core::{Key, OwnerToken, RenewOutcome, Store, StoreError, memory::MemoryStore};
///
/// /// The memory store, counting renewals.
/// #[derive(Debug, Default)]
/// struct Counting {
///     inner: MemoryStore,
///     renewals: AtomicU32,
/// }
///
/// #[async_trait::async_trait]
/// impl leasehold_core::wrap::Forward for Counting {
///     fn inner(&self) -> &dyn Store {
///         &self.inner
///     }
///     async fn renew(&self, key: &Key, owner: &OwnerToken, ttl: Duration) -> Result<RenewOutcome, StoreError> {
///         self.renewals.fetch_add(1, Ordering::Relaxed);
///         self.inner.renew(key, owner, ttl).await
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// let store = Counting::default();
/// let (key, owner) = (Key::new("job:x").unwrap(), OwnerToken::random());
/// store.acquire(&key, &owner, Duration::from_secs(10)).await?;
/// store.renew(&key, &owner, Duration::from_secs(10)).await?;
/// assert_eq!(store.renewals.load(Ordering::Relaxed), 1);
/// assert!(store.watcher().is_none(), "no extension unless it says so");
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Forward: Send + Sync + std::fmt::Debug + 'static {
    /// The store every call not overridden goes to.
    fn inner(&self) -> &dyn Store;

    /// [`Store::backend`]: the inner store's.
    fn backend(&self) -> &'static str {
        self.inner().backend()
    }

    /// [`Store::capabilities`]: the inner store's.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`Store::acquire`].
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.inner().acquire(key, owner, ttl).await
    }

    /// [`Store::acquire_no_wait`]: this store's own [`acquire`](Self::acquire) (so a
    /// wrapper that changes `acquire` changes a try alike) unless overridden.
    async fn acquire_no_wait(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        Forward::acquire(self, key, owner, ttl).await
    }

    /// [`Store::has_acquire_no_wait`]: no, unless overridden (with
    /// [`acquire_no_wait`](Self::acquire_no_wait)).
    fn has_acquire_no_wait(&self) -> bool {
        false
    }

    /// [`Store::renew`].
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.inner().renew(key, owner, ttl).await
    }

    /// [`Store::release`].
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        self.inner().release(key, owner).await
    }

    /// [`Store::inspect`].
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        self.inner().inspect(key).await
    }

    /// [`Store::list`].
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        self.inner().list(prefix).await
    }

    /// [`Store::break_lease`].
    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        self.inner().break_lease(key).await
    }

    /// [`Store::put_record`].
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        self.inner().put_record(key, fence, value).await
    }

    /// [`Store::get_record`].
    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner().get_record(key).await
    }

    /// [`Store::diagnose`].
    async fn diagnose(&self) -> Result<Diagnosis, StoreError> {
        self.inner().diagnose().await
    }

    /// [`Store::batch`]: none unless overridden.
    fn batch(&self) -> Option<&dyn BatchStore> {
        None
    }

    /// [`Store::watcher`]: none unless overridden.
    fn watcher(&self) -> Option<&dyn WatchStore> {
        None
    }

    /// [`Store::waiter`]: none unless overridden.
    fn waiter(&self) -> Option<&dyn WaitStore> {
        None
    }

    /// [`Store::ended_grants`]: the inner store's (a grant it reports ended is one this
    /// store handed out).
    fn ended_grants(&self) -> Option<&EndedGrants> {
        self.inner().ended_grants()
    }
}

#[async_trait]
impl<T: Forward> Store for T {
    fn backend(&self) -> &'static str {
        Forward::backend(self)
    }

    fn capabilities(&self) -> Capabilities {
        Forward::capabilities(self)
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        Forward::acquire(self, key, owner, ttl).await
    }

    async fn acquire_no_wait(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        Forward::acquire_no_wait(self, key, owner, ttl).await
    }

    fn has_acquire_no_wait(&self) -> bool {
        Forward::has_acquire_no_wait(self)
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        Forward::renew(self, key, owner, ttl).await
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        Forward::release(self, key, owner).await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        Forward::inspect(self, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        Forward::list(self, prefix).await
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        Forward::break_lease(self, key).await
    }

    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        Forward::put_record(self, key, fence, value).await
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        Forward::get_record(self, key).await
    }

    async fn diagnose(&self) -> Result<Diagnosis, StoreError> {
        Forward::diagnose(self).await
    }

    fn batch(&self) -> Option<&dyn BatchStore> {
        Forward::batch(self)
    }

    fn watcher(&self) -> Option<&dyn WatchStore> {
        Forward::watcher(self)
    }

    fn waiter(&self) -> Option<&dyn WaitStore> {
        Forward::waiter(self)
    }

    fn ended_grants(&self) -> Option<&EndedGrants> {
        Forward::ended_grants(self)
    }
}
