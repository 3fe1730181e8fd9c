//! [`FaultStore`]: a wrapper that injects faults into the calls of any store, so that a
//! case can provoke an ambiguous reply on every backend the same way (no proxy needed).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Capabilities, Fence, Key, LeaseInfo, OwnerToken, ReleaseOutcome, RenewOutcome,
    Store, StoreError, StoreErrorKind,
};

/// An operation of the store contract that a fault can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`Store::acquire`].
    Acquire,
    /// [`Store::renew`].
    Renew,
    /// [`Store::release`].
    Release,
}

/// What happens to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// The wrapped store applies the call; its reply is swallowed and the caller gets an
    /// [`StoreErrorKind::Ambiguous`] error (a connection reset after the request was sent).
    AmbiguousAfterApply,
    /// The wrapped store applies the call; the reply never comes (the caller's timeout
    /// ends the call).
    HangAfterApply,
    /// The call never reaches the wrapped store and never answers (a blackhole).
    HangBeforeApply,
}

/// A reply that the caller never saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swallowed {
    /// An acquire's reply (or the error the wrapped store gave).
    Acquire(Result<AcquireOutcome, String>),
    /// A renewal's reply.
    Renew(Result<RenewOutcome, String>),
    /// A release's reply.
    Release(Result<ReleaseOutcome, String>),
}

#[derive(Debug, Default)]
struct State {
    planned: HashMap<Op, VecDeque<Injection>>,
    swallowed: Vec<Swallowed>,
}

/// Wraps a store; each call of an operation takes the next [`Injection`] planned for it
/// (if any) with [`inject`](Self::inject). Everything else passes through.
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

    async fn after_apply(&self, injection: Injection, swallowed: Swallowed) -> StoreError {
        self.lock().swallowed.push(swallowed);
        match injection {
            Injection::AmbiguousAfterApply => StoreError::new(
                StoreErrorKind::Ambiguous,
                self.inner.backend(),
                "connection reset after the request was sent (fault injected)",
            ),
            Injection::HangAfterApply | Injection::HangBeforeApply => {
                std::future::pending::<()>().await;
                unreachable!()
            }
        }
    }
}

fn shown<T>(r: &Result<T, StoreError>) -> Result<T, String>
where
    T: Clone,
{
    match r {
        Ok(v) => Ok(v.clone()),
        Err(e) => Err(e.to_string()),
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

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        match self.next(Op::Acquire) {
            None => self.inner.acquire(key, owner, ttl).await,
            Some(Injection::HangBeforeApply) => std::future::pending().await,
            Some(i) => {
                let reply = self.inner.acquire(key, owner, ttl).await;
                Err(self.after_apply(i, Swallowed::Acquire(shown(&reply))).await)
            }
        }
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        match self.next(Op::Renew) {
            None => self.inner.renew(key, owner, ttl).await,
            Some(Injection::HangBeforeApply) => std::future::pending().await,
            Some(i) => {
                let reply = self.inner.renew(key, owner, ttl).await;
                Err(self.after_apply(i, Swallowed::Renew(shown(&reply))).await)
            }
        }
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        match self.next(Op::Release) {
            None => self.inner.release(key, owner).await,
            Some(Injection::HangBeforeApply) => std::future::pending().await,
            Some(i) => {
                let reply = self.inner.release(key, owner).await;
                Err(self.after_apply(i, Swallowed::Release(shown(&reply))).await)
            }
        }
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        self.inner.inspect(key).await
    }

    async fn wait_released(&self, key: &Key, timeout: Duration) -> Result<(), StoreError> {
        self.inner.wait_released(key, timeout).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        self.inner.list(prefix).await
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        self.inner.break_lease(key).await
    }
}
