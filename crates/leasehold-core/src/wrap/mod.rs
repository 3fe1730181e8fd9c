//! Policies as store wrappers, as `object_store` does with `LimitStore` and
//! `ThrottleStore`: each wraps any [`Store`](crate::Store) and is a [`Store`](crate::Store) itself.
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
//! A wrapper forwards the extensions of the store it wraps ([`Store::batch`](crate::Store::batch),
//! [`Store::watcher`](crate::Store::watcher), [`Store::waiter`](crate::Store::waiter), [`Store::ended_grants`](crate::Store::ended_grants)).

#[cfg(feature = "test-util")]
mod fault;
#[cfg(feature = "test-util")]
mod forward;
mod timeout;

#[cfg(feature = "test-util")]
pub use fault::{FaultStore, Injection, Op, Swallowed, Unreachable};
#[cfg(feature = "test-util")]
pub use forward::Forward;
pub use timeout::TimeoutStore;

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::error::StoreErrorKind;
    use crate::key::Key;
    use crate::store::memory::MemoryStore;
    use crate::store::{AcquireOutcome, ReleaseOutcome, RenewOutcome, Store};
    use crate::token::{Fence, OwnerToken};

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

    /// `leasehold doctor` asks through the command's timeout wrapper: every wrapper hands
    /// on the diagnosis of the store it wraps, and bounds or refuses it as any call.
    #[tokio::test(start_paused = true)]
    async fn wrappers_pass_the_diagnosis_through_and_bound_it() {
        let own = MemoryStore::new().diagnose().await.unwrap();
        assert_eq!(
            own.fact_value("server version"),
            Some("the in-memory store of leasehold-core, in this process")
        );
        assert_eq!(
            own.row("restart with persistence").map(|f| f.verdict),
            Some(crate::Verdict::DoesNotHold)
        );
        let timeout = TimeoutStore::new(Arc::new(MemoryStore::new()), Duration::from_secs(2));
        assert_eq!(timeout.diagnose().await.unwrap(), own);
        let fault = FaultStore::new(Arc::new(MemoryStore::new()));
        assert_eq!(fault.diagnose().await.unwrap(), own);
        fault.set_unreachable(Some(Unreachable::Refuse));
        assert_eq!(
            fault.diagnose().await.unwrap_err().kind(),
            StoreErrorKind::Unavailable
        );
        let t = TimeoutStore::new(hung(), Duration::from_secs(2));
        assert_eq!(
            t.diagnose().await.unwrap_err().kind(),
            StoreErrorKind::Timeout
        );

        #[derive(Debug, Default)]
        struct Passing(MemoryStore);
        #[async_trait::async_trait]
        impl Forward for Passing {
            fn inner(&self) -> &dyn Store {
                &self.0
            }
        }
        assert_eq!(Store::diagnose(&Passing::default()).await.unwrap(), own);

        /// A store with no diagnosis of its own says it knows nothing.
        #[derive(Debug, Default)]
        struct Silent(MemoryStore);
        #[async_trait::async_trait]
        impl Store for Silent {
            fn backend(&self) -> &'static str {
                "silent"
            }
            fn capabilities(&self) -> crate::store::Capabilities {
                self.0.capabilities()
            }
            async fn acquire(
                &self,
                k: &Key,
                o: &OwnerToken,
                t: Duration,
            ) -> Result<AcquireOutcome, crate::StoreError> {
                self.0.acquire(k, o, t).await
            }
            async fn renew(
                &self,
                k: &Key,
                o: &OwnerToken,
                t: Duration,
            ) -> Result<RenewOutcome, crate::StoreError> {
                self.0.renew(k, o, t).await
            }
            async fn release(
                &self,
                k: &Key,
                o: &OwnerToken,
            ) -> Result<ReleaseOutcome, crate::StoreError> {
                self.0.release(k, o).await
            }
            async fn inspect(
                &self,
                k: &Key,
            ) -> Result<Option<crate::store::LeaseInfo>, crate::StoreError> {
                self.0.inspect(k).await
            }
            async fn list(
                &self,
                p: &str,
            ) -> Result<Vec<crate::store::LeaseInfo>, crate::StoreError> {
                self.0.list(p).await
            }
            async fn break_lease(&self, k: &Key) -> Result<Fence, crate::StoreError> {
                self.0.break_lease(k).await
            }
            async fn put_record(
                &self,
                k: &Key,
                f: Fence,
                v: &[u8],
            ) -> Result<crate::store::Record, crate::StoreError> {
                self.0.put_record(k, f, v).await
            }
            async fn get_record(
                &self,
                k: &Key,
            ) -> Result<Option<crate::store::Record>, crate::StoreError> {
                self.0.get_record(k).await
            }
        }
        let silent = Silent::default().diagnose().await.unwrap();
        assert!(
            silent.facts.is_empty() && silent.findings.is_empty(),
            "{silent:?}"
        );
        assert_eq!(
            silent.warnings,
            [
                "the silent store reports nothing about its deployment (it does not implement \
              Store::diagnose): no row of docs/guarantees.md is judged"
            ]
        );
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
