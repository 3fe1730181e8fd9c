//! Policies as store wrappers, as `object_store` does with `LimitStore` and
//! `ThrottleStore`: each wraps any [`Store`] and is a [`Store`] itself.
//!
//! - [`TimeoutStore`] bounds every call (acquire, renew, release, inspect, list, break,
//!   wait) by a duration, so that nothing on any path can hang on a blackholed store.
//! - `FaultStore` (feature `test-util`) injects faults in process, for tests: a reply
//!   lost after the store applied the call, a call that never answers, or a store that is
//!   unreachable altogether. Network faults (delay, blackhole, reset) are the fault
//!   proxy's job.
//! - `Forward` (feature `test-util`): a test's store that passes every call to another
//!   and overrides only what it changes.
//!
//! A wrapper forwards the extensions of the store it wraps ([`Store::batch`],
//! [`Store::watcher`], [`Store::waiter`], [`Store::ended_grants`]).

#[cfg(feature = "test-util")]
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
#[cfg(feature = "test-util")]
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
#[cfg(feature = "test-util")]
use crate::error::StoreErrorKind;
use crate::key::Key;
use crate::lease::ended::EndedGrants;
use crate::store::{
    AcquireAnyOutcome, BatchStore, Changes, CheckedAcquire, RecordCheck, WaitStore, WatchStore,
};
use crate::store::{
    AcquireOutcome, Capabilities, LeaseInfo, Record, ReleaseOutcome, RenewOutcome, Store,
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
}

/// An operation of the store contract that a fault can be planned for.
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`Store::acquire`].
    Acquire,
    /// [`Store::renew`].
    Renew,
    /// [`Store::release`].
    Release,
    /// [`BatchStore::acquire_any`] (one planned fault for the whole call, whichever store
    /// calls it makes).
    AcquireAny,
}

/// What happens to one planned call.
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Injection {
    /// The wrapped store applies the call; its reply is swallowed and the caller gets a
    /// [`StoreErrorKind::Ambiguous`] error (a connection reset after the request was sent).
    AmbiguousAfterApply,
    /// The wrapped store applies the call; the reply never comes (only the caller's
    /// timeout ends the call).
    HangAfterApply,
    /// The call never reaches the wrapped store and never answers (a blackhole).
    HangBeforeApply,
}

/// How an unreachable [`FaultStore`] behaves, for every call until it is reachable again.
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unreachable {
    /// Every call fails at once with [`StoreErrorKind::Unavailable`] (nothing applied).
    Refuse,
    /// Every call hangs (until the caller's timeout), like a blackholed network.
    Hang,
}

/// A reply that the caller never saw.
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Swallowed {
    /// An acquire's reply (or the wrapped store's error, as text).
    Acquire(Result<AcquireOutcome, String>),
    /// A renewal's reply.
    Renew(Result<RenewOutcome, String>),
    /// A release's reply.
    Release(Result<ReleaseOutcome, String>),
    /// An [`acquire_any`](BatchStore::acquire_any)'s reply.
    AcquireAny(Result<AcquireAnyOutcome, String>),
}

#[cfg(feature = "test-util")]
#[derive(Debug, Default)]
struct State {
    planned: HashMap<Op, VecDeque<Injection>>,
    swallowed: Vec<Swallowed>,
    unreachable: Option<Unreachable>,
    watch_hidden: bool,
    acquire_any_atomic: bool,
}

/// Wraps a store and injects faults into its calls, for tests: each call of an operation
/// takes the next [`Injection`] planned for it with [`inject`](Self::inject), and
/// [`set_unreachable`](Self::set_unreachable) makes every call fail or hang. Everything
/// else passes through. Feature `test-util`: it can make a store lie about itself, so it
/// is never in a default build.
///
/// It always has a batch ([`Store::batch`]): its renewals go one by one through its own
/// `renew` (planned renewal faults apply to them), and its
/// [`acquire_any`](BatchStore::acquire_any) is one faultable call ([`Op::AcquireAny`]) of
/// the wrapped store's (or the default over it). Its watcher and waiter are the wrapped
/// store's.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::wrap::{FaultStore, Injection, Op};
/// use leasehold_core::{LeaseClient, LeaseConfig, memory::MemoryStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), leasehold_core::Error> {
/// let store = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
/// // The first acquire is applied, but its reply is lost.
/// store.inject(Op::Acquire, Injection::AmbiguousAfterApply);
/// let client = LeaseClient::new(store.clone(), LeaseConfig::new(Duration::from_secs(10))?);
/// // The client retries with the same owner token and gets the grant it made.
/// let lease = client.try_acquire("job:x").await?;
/// assert_eq!(store.take_swallowed().len(), 1);
/// # drop(lease); Ok(()) }
/// ```
#[cfg(feature = "test-util")]
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn Store>,
    state: Mutex<State>,
}

#[cfg(feature = "test-util")]
impl FaultStore {
    /// Wraps `inner`; no fault planned.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            state: Mutex::new(State::default()),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plans `injection` for the next call of `op` not yet planned for.
    pub fn inject(&self, op: Op, injection: Injection) {
        self.lock()
            .planned
            .entry(op)
            .or_default()
            .push_back(injection);
    }

    /// Makes every call fail or hang (`Some`), or pass again (`None`).
    pub fn set_unreachable(&self, mode: Option<Unreachable>) {
        self.lock().unreachable = mode;
    }

    /// From now on the store offers no watcher ([`Store::watcher`] is `None`), as a store
    /// without notifications: to test how callers do without them.
    pub fn hide_watch(&self) {
        self.lock().watch_hidden = true;
    }

    /// From now on the store says its [`acquire_any`](BatchStore::acquire_any) is one
    /// atomic call ([`BatchStore::atomic_acquire_any`]) whatever the wrapped store does, so
    /// that a client takes that path (one `acquire_any` or `acquire_any_checked` per
    /// attempt): to test that path over a store that does not have it (a lie). The calls
    /// themselves are unchanged.
    pub fn claim_atomic_acquire_any(&self) {
        self.lock().acquire_any_atomic = true;
    }

    /// The replies swallowed since the last call, oldest first.
    pub fn take_swallowed(&self) -> Vec<Swallowed> {
        std::mem::take(&mut self.lock().swallowed)
    }

    fn next(&self, op: Op) -> Option<Injection> {
        self.lock()
            .planned
            .get_mut(&op)
            .and_then(VecDeque::pop_front)
    }

    /// Passes when reachable; fails or hangs forever otherwise.
    async fn reach(&self) -> Result<(), StoreError> {
        let mode = self.lock().unreachable;
        match mode {
            None => Ok(()),
            Some(Unreachable::Refuse) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                self.inner.backend(),
                "store is unreachable (fault injected)",
            )),
            Some(Unreachable::Hang) => std::future::pending().await,
        }
    }

    /// Runs `call` (a call of `op` on the wrapped store, not yet polled) as planned: it
    /// passes, never reaches the store, or is applied and its reply swallowed (kept by
    /// `swallow`).
    async fn faulted<T>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, StoreError>>,
        swallow: fn(Result<T, String>) -> Swallowed,
    ) -> Result<T, StoreError> {
        self.reach().await?;
        let injection = match self.next(op) {
            None => return call.await,
            Some(Injection::HangBeforeApply) => return std::future::pending().await,
            Some(i) => i,
        };
        let reply = call.await.map_err(|e| e.to_string());
        self.lock().swallowed.push(swallow(reply));
        match injection {
            Injection::AmbiguousAfterApply => Err(StoreError::new(
                StoreErrorKind::Ambiguous,
                self.inner.backend(),
                "connection reset after the request was sent (fault injected)",
            )),
            Injection::HangAfterApply | Injection::HangBeforeApply => std::future::pending().await,
        }
    }
}

#[cfg(feature = "test-util")]
#[async_trait]
impl Store for FaultStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn batch(&self) -> Option<&dyn BatchStore> {
        Some(self)
    }

    fn watcher(&self) -> Option<&dyn WatchStore> {
        if self.lock().watch_hidden {
            return None;
        }
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
        self.faulted(Op::Acquire, call, Swallowed::Acquire).await
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let call = self.inner.renew(key, owner, ttl);
        self.faulted(Op::Renew, call, Swallowed::Renew).await
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let call = self.inner.release(key, owner);
        self.faulted(Op::Release, call, Swallowed::Release).await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        self.reach().await?;
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        self.reach().await?;
        self.inner.list(prefix).await
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        self.reach().await?;
        self.inner.break_lease(key).await
    }

    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        self.reach().await?;
        self.inner.put_record(key, fence, value).await
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.reach().await?;
        self.inner.get_record(key).await
    }
}

#[cfg(feature = "test-util")]
#[async_trait]
impl BatchStore for FaultStore {
    /// Each renewal through this store's own `renew`, all at once.
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        Ok(crate::store::renew_each(self, leases, ttl).await)
    }

    fn atomic_acquire_any(&self) -> bool {
        self.lock().acquire_any_atomic || self.inner.batch().is_some_and(|b| b.atomic_acquire_any())
    }

    async fn acquire_any(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireAnyOutcome, StoreError> {
        let call = crate::store::acquire_any(&*self.inner, keys, owner, ttl);
        self.faulted(Op::AcquireAny, call, Swallowed::AcquireAny)
            .await
    }
}

#[cfg(feature = "test-util")]
#[async_trait]
impl WatchStore for FaultStore {
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        self.reach().await?;
        let hidden = self.lock().watch_hidden;
        match self.inner.watcher() {
            Some(w) if !hidden => w.watch(key).await,
            _ => Err(StoreError::unsupported(self.inner.backend(), "watching")),
        }
    }
}

#[cfg(feature = "test-util")]
#[async_trait]
impl WaitStore for FaultStore {
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.reach().await?;
        match self.inner.waiter() {
            Some(w) => w.wait_released(key, owner, timeout).await,
            None => Err(StoreError::unsupported(
                self.inner.backend(),
                "waiting for release",
            )),
        }
    }
}
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
#[cfg(feature = "test-util")]
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

#[cfg(feature = "test-util")]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn key() -> Key {
        Key::new("job:wrap").unwrap()
    }

    /// A store whose every call hangs.
    fn hung() -> Arc<dyn Store> {
        let f = FaultStore::new(Arc::new(MemoryStore::new()));
        f.set_unreachable(Some(Unreachable::Hang));
        Arc::new(f)
    }

    #[tokio::test(start_paused = true)]
    async fn every_call_is_bounded() {
        let t = TimeoutStore::new(hung(), Duration::from_secs(2));
        let o = OwnerToken::random();
        let ttl = Duration::from_secs(10);
        let kinds = [
            t.acquire(&key(), &o, ttl).await.map(drop),
            t.renew(&key(), &o, ttl).await.map(drop),
            t.release(&key(), &o).await.map(drop),
            t.inspect(&key()).await.map(drop),
            t.list("").await.map(drop),
            t.break_lease(&key()).await.map(drop),
            t.put_record(&key(), Fence(1), b"v").await.map(drop),
            t.get_record(&key()).await.map(drop),
            crate::store::acquire_any(&t, &[key()], &o, ttl)
                .await
                .map(drop),
        ];
        for r in kinds {
            assert_eq!(r.unwrap_err().kind(), StoreErrorKind::Timeout);
        }
        let start = tokio::time::Instant::now();
        let waiter = t.waiter().expect("the wrapped store's waiter");
        let err = waiter
            .wait_released(&key(), &OwnerToken::random(), Duration::from_secs(5))
            .await;
        assert_eq!(err.unwrap_err().kind(), StoreErrorKind::Timeout);
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(7),
            "its own wait plus the bound"
        );
        assert_eq!(t.timeout(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_store_passes_answers_through() {
        let t = TimeoutStore::new(Arc::new(MemoryStore::new()), Duration::from_secs(2));
        let o = OwnerToken::random();
        let ttl = Duration::from_secs(10);
        assert!(matches!(
            t.acquire(&key(), &o, ttl).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        assert_eq!(t.inspect(&key()).await.unwrap().unwrap().owner, o);
        assert_eq!(t.backend(), "memory");
        assert_eq!(t.capabilities(), MemoryStore::new().capabilities());
    }

    #[tokio::test]
    async fn injections_are_taken_in_order_per_operation() {
        let f = FaultStore::new(Arc::new(MemoryStore::new()));
        let (o, ttl) = (OwnerToken::random(), Duration::from_secs(10));
        f.inject(Op::Acquire, Injection::AmbiguousAfterApply);
        let err = f.acquire(&key(), &o, ttl).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Ambiguous);
        // Applied: the holder is recorded, and the swallowed reply is the grant.
        assert_eq!(f.inspect(&key()).await.unwrap().unwrap().owner, o);
        let swallowed = f.take_swallowed();
        assert!(
            matches!(
                swallowed[..],
                [Swallowed::Acquire(Ok(AcquireOutcome::Acquired { .. }))]
            ),
            "{swallowed:?}"
        );
        assert!(f.take_swallowed().is_empty());
        // Nothing planned any more: calls pass.
        assert!(f.acquire(&key(), &o, ttl).await.is_ok());
        f.inject(Op::Release, Injection::AmbiguousAfterApply);
        assert!(f.release(&key(), &o).await.is_err());
        assert_eq!(f.inspect(&key()).await.unwrap(), None, "applied");
        f.inject(Op::Renew, Injection::AmbiguousAfterApply);
        assert!(f.renew(&key(), &o, ttl).await.is_err());
        assert!(matches!(
            f.take_swallowed()[..],
            [
                Swallowed::Release(Ok(ReleaseOutcome::Released)),
                Swallowed::Renew(Ok(RenewOutcome::NotOwner))
            ]
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn hangs_before_and_after_applying() {
        let f = FaultStore::new(Arc::new(MemoryStore::new()));
        let (o, ttl) = (OwnerToken::random(), Duration::from_secs(10));
        let bound = Duration::from_secs(1);
        f.inject(Op::Acquire, Injection::HangBeforeApply);
        assert!(
            tokio::time::timeout(bound, f.acquire(&key(), &o, ttl))
                .await
                .is_err()
        );
        assert_eq!(f.inspect(&key()).await.unwrap(), None, "not applied");
        f.inject(Op::Acquire, Injection::HangAfterApply);
        assert!(
            tokio::time::timeout(bound, f.acquire(&key(), &o, ttl))
                .await
                .is_err()
        );
        assert!(f.inspect(&key()).await.unwrap().is_some(), "applied");
    }

    #[tokio::test]
    async fn unreachable_refuses_or_hangs_every_call_until_restored() {
        let f = FaultStore::new(Arc::new(MemoryStore::new()));
        f.set_unreachable(Some(Unreachable::Refuse));
        assert_eq!(
            f.list("").await.unwrap_err().kind(),
            StoreErrorKind::Unavailable
        );
        assert_eq!(
            f.break_lease(&key()).await.unwrap_err().kind(),
            StoreErrorKind::Unavailable
        );
        f.set_unreachable(None);
        assert!(f.list("").await.is_ok());
        assert_eq!(f.inner().backend(), "memory");
    }
}
