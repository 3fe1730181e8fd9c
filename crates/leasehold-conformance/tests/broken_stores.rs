//! The suite must be able to fail: deliberately broken stores make the cases that guard
//! against their flaw panic.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::memory::{MemoryStore, Unreachable};
use leasehold::{
    AcquireOutcome, Capabilities, Fence, Key, LeaseInfo, OwnerToken, ReleaseOutcome, RenewOutcome,
    Store, StoreError,
};
use leasehold_conformance::{Faults, Fixture, cases};

#[derive(Debug, Clone, Copy)]
enum Flaw {
    /// Every grant gets fence 1.
    FenceNeverAdvances,
    /// Renew and release succeed for any owner.
    AnyOwner,
    /// Leases never expire.
    IgnoresExpiry,
}

#[derive(Debug)]
struct Broken {
    inner: MemoryStore,
    flaw: Flaw,
}

const FOREVER: Duration = Duration::from_secs(24 * 60 * 60);

impl Broken {
    /// The owner to act as: the real holder when the flaw ignores owners.
    async fn as_owner(&self, key: &Key, owner: &OwnerToken) -> OwnerToken {
        match self.flaw {
            Flaw::AnyOwner => match self.inner.inspect(key).await {
                Ok(Some(info)) => info.owner,
                _ => *owner,
            },
            _ => *owner,
        }
    }
    fn ttl(&self, ttl: Duration) -> Duration {
        match self.flaw {
            Flaw::IgnoresExpiry if StoreError::check_ttl("broken", ttl).is_ok() => FOREVER,
            _ => ttl,
        }
    }
}

#[async_trait]
impl Store for Broken {
    fn backend(&self) -> &'static str {
        "broken"
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
        let out = self.inner.acquire(key, owner, self.ttl(ttl)).await?;
        Ok(match (self.flaw, out) {
            (Flaw::FenceNeverAdvances, AcquireOutcome::Acquired { ttl, .. }) => {
                AcquireOutcome::Acquired {
                    fence: Fence(1),
                    ttl,
                }
            }
            (Flaw::IgnoresExpiry, AcquireOutcome::Acquired { fence, .. }) => {
                AcquireOutcome::Acquired { fence, ttl }
            }
            (_, out) => out,
        })
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let owner = self.as_owner(key, owner).await;
        let out = self.inner.renew(key, &owner, self.ttl(ttl)).await?;
        Ok(match out {
            RenewOutcome::Renewed { .. } => RenewOutcome::Renewed { ttl },
            o => o,
        })
    }
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let owner = self.as_owner(key, owner).await;
        self.inner.release(key, &owner).await
    }
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let info = self.inner.inspect(key).await?;
        Ok(info.map(|mut i| {
            if let Flaw::FenceNeverAdvances = self.flaw {
                i.fence = Fence(1);
            }
            i.remaining = i.remaining.map(|r| r.min(Duration::from_secs(1)));
            i
        }))
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

struct MemoryFaults(MemoryStore);

#[async_trait]
impl Faults for MemoryFaults {
    async fn forget(&self, key: &Key) {
        self.0.forget(key);
    }
    async fn make_unreachable(&self) {
        self.0.set_unreachable(Some(Unreachable::Hang));
    }
    async fn restore(&self) {
        self.0.set_unreachable(None);
    }
}

fn fixture(flaw: Flaw) -> Fixture {
    let inner = MemoryStore::new();
    Fixture {
        store: Arc::new(Broken {
            inner: inner.clone(),
            flaw,
        }),
        faults: Arc::new(MemoryFaults(inner)),
        ttl: Duration::from_millis(600),
        guard: Box::new(()),
    }
}

type Case = fn(&'static Fixture) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `case` against a store with `flaw` and asserts that it fails.
async fn must_fail(flaw: Flaw, name: &str, case: Case) {
    let fx: &'static Fixture = Box::leak(Box::new(fixture(flaw)));
    let outcome = tokio::spawn(case(fx)).await;
    match outcome {
        Err(e) if e.is_panic() => {}
        other => panic!("case {name} passed against a store with {flaw:?}: {other:?}"),
    }
}

macro_rules! must_fail {
    ($flaw:expr, $($case:ident),+ $(,)?) => {
        $( must_fail($flaw, stringify!($case), |fx| Box::pin(cases::$case(fx))).await; )+
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_that_never_advances_is_caught() {
    must_fail!(
        Flaw::FenceNeverAdvances,
        concurrent_contenders_exclusive_and_fences_increase,
        fence_never_reused_after_release,
        fence_never_reused_after_expiry,
        lost_within_one_renew_interval_after_forget,
        waiting_acquire_gets_released_lease,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_or_release_for_any_owner_is_caught() {
    must_fail!(
        Flaw::AnyOwner,
        only_owner_renews_or_releases,
        late_release_leaves_new_owner_intact,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_expiry_is_caught() {
    must_fail!(
        Flaw::IgnoresExpiry,
        fence_never_reused_after_expiry,
        late_release_leaves_new_owner_intact,
    );
}

#[test]
fn every_case_is_listed() {
    assert_eq!(leasehold_conformance::CASES.len(), 16);
    assert!(leasehold_conformance::CASES.contains(&"capabilities_are_honest"));
}
