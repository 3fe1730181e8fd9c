//! A store wrapper that injects faults into its calls, for tests (feature `test-util`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use crate::error::StoreErrorKind;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::key::Key;
use crate::lease::ended::EndedGrants;
use crate::store::doctor::Diagnosis;
use crate::store::{
    AcquireAnyOutcome, AcquireOutcome, BatchStore, Capabilities, Changes, LeaseInfo, Record,
    ReleaseOutcome, RenewOutcome, Store, WaitOutcome, WaitStore, WatchStore,
};
use crate::token::{Fence, OwnerToken};

/// An operation of the store contract that a fault can be planned for.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unreachable {
    /// Every call fails at once with [`StoreErrorKind::Unavailable`] (nothing applied).
    Refuse,
    /// Every call hangs (until the caller's timeout), like a blackholed network.
    Hang,
}

/// A reply that the caller never saw.
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
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn Store>,
    state: Mutex<State>,
}

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

    async fn diagnose(&self) -> Result<Diagnosis, StoreError> {
        self.reach().await?;
        self.inner.diagnose().await
    }
}

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

    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        self.reach().await?;
        match self.inner.waiter() {
            Some(w) => w.wait_turn(key, owner, ttl, timeout).await,
            None => Err(StoreError::unsupported(
                self.inner.backend(),
                "waiting for release",
            )),
        }
    }
}
