//! Deliberately broken parts, for the checker's control runs only: each breaks one
//! promise of a worker or of its store, so that a real run (real servers, real worker
//! processes, the same harness as every other run) records a history that one rule of
//! the [`checker`](crate::checker) must flag.
//!
//! They are selected by the hidden `--broken` option of `run`, which only a build with
//! the crate's `broken` feature accepts: the feature is switched on for this crate's own
//! tests (its dev-dependency on itself), never in a build a user installs, whose `run`
//! refuses the option. A worker is passed the part by the harness; the harness's own
//! view of the store (its inspections) is never broken.

use std::sync::Arc;

use leasehold::Store;

use crate::schedule::FaultSet;

/// A broken part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Broken {
    /// The worker ignores its lost signal: it does not watch it, its checks and write
    /// probes answer "not lost" without asking, and it goes on working a TTL after its
    /// write before it releases (C4a, C4b, C4c).
    IgnoreLost,
    /// Beside the library's heartbeat, the worker runs one of its own that renews on a
    /// timer whatever its validity or lost signal says, through a store whose renewal
    /// answers "renewed" even when the owner no longer holds the lease, and accepts every
    /// such answer (C6a, C6b, C6c).
    ZombieHeartbeat,
    /// The worker acknowledges its write, then rolls the transaction back (C7a).
    AckBeforeCommit,
    /// The worker's read-modify-write skips the increment on every even audit row: an
    /// accepted write whose update is lost (C7b).
    LostUpdate,
    /// The store's acquire breaks the holder's lease when the key is held and grants it
    /// (a store that ignores the holder): two holders at once (C3), and the evicted one
    /// loses its lease with no fault on its path (C10).
    StealOnAcquire,
    /// The store keeps every lease ten times the TTL it was asked for but answers the
    /// asked TTL (a store that ignores expiry): a killed holder is not taken over
    /// (C9), and its lease is still there at the final inspection (C8b).
    StretchTtl,
    /// The store answers an acquire with its grant, then grants the same owner again
    /// with a new fence (a retried owner given a new fence): one owner, two fences (C8a).
    NewFenceForOwner,
    /// The store answers every grant with fence 1 (its fence counter is broken; its
    /// own records keep the real fences): one fence, many owners (C2).
    SameFence,
}

impl Broken {
    /// Every part.
    pub const ALL: [Broken; 8] = [
        Broken::IgnoreLost,
        Broken::ZombieHeartbeat,
        Broken::AckBeforeCommit,
        Broken::LostUpdate,
        Broken::StealOnAcquire,
        Broken::StretchTtl,
        Broken::NewFenceForOwner,
        Broken::SameFence,
    ];

    /// The command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IgnoreLost => "ignore-lost",
            Self::ZombieHeartbeat => "zombie-heartbeat",
            Self::AckBeforeCommit => "ack-before-commit",
            Self::LostUpdate => "lost-update",
            Self::StealOnAcquire => "steal-on-acquire",
            Self::StretchTtl => "stretch-ttl",
            Self::NewFenceForOwner => "new-fence-for-owner",
            Self::SameFence => "same-fence",
        }
    }

    /// The rules the part must make fire.
    pub fn rules(self) -> &'static [&'static str] {
        match self {
            Self::IgnoreLost => &["C4a", "C4b", "C4c"],
            Self::ZombieHeartbeat => &["C6a", "C6b", "C6c"],
            Self::AckBeforeCommit => &["C7a"],
            Self::LostUpdate => &["C7b"],
            Self::StealOnAcquire => &["C3", "C10"],
            Self::StretchTtl => &["C9", "C8b"],
            Self::NewFenceForOwner => &["C8a"],
            Self::SameFence => &["C2"],
        }
    }

    /// The faults its run needs: a holder frozen past its TTL (the scripted stale
    /// write), a holder killed, or none (so that no fault explains anything).
    pub fn faults(self) -> FaultSet {
        match self {
            Self::IgnoreLost | Self::ZombieHeartbeat => FaultSet::StaleWrite,
            Self::StretchTtl => FaultSet::Kill,
            _ => FaultSet::None,
        }
    }
}

/// Whether this build accepts broken parts (the `broken` feature, on for the crate's own
/// tests only).
pub const AVAILABLE: bool = cfg!(feature = "broken");

/// Refuses a broken part in a build that is not for tests.
///
/// # Errors
/// When `part` is set and the build has no `broken` feature.
pub fn allowed(part: Option<Broken>) -> Result<(), String> {
    match part {
        Some(p) if !AVAILABLE => Err(format!(
            "--broken {} is a control run of the checker's tests; this build does not have it",
            p.as_str()
        )),
        _ => Ok(()),
    }
}

/// The worker's store with the part's breakage, if the part is a store's.
pub fn wrap_store(inner: Arc<dyn Store>, part: Option<Broken>) -> Arc<dyn Store> {
    #[cfg(feature = "broken")]
    if let Some(
        p @ (Broken::StealOnAcquire
        | Broken::StretchTtl
        | Broken::NewFenceForOwner
        | Broken::SameFence),
    ) = part
    {
        return Arc::new(BrokenStore { inner, part: p });
    }
    #[cfg(not(feature = "broken"))]
    let _ = part;
    inner
}

/// The zombie heartbeat's store: a renewal is answered "renewed" whatever the store said.
/// A build without the `broken` feature has no zombie heartbeat ([`allowed`] refuses the
/// part) and gets the store as it is.
pub fn yes_renewals(inner: Arc<dyn Store>) -> Arc<dyn Store> {
    #[cfg(feature = "broken")]
    return Arc::new(BrokenStore {
        inner,
        part: Broken::ZombieHeartbeat,
    });
    #[cfg(not(feature = "broken"))]
    inner
}

#[cfg(feature = "broken")]
use store::BrokenStore;

#[cfg(feature = "broken")]
mod store {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use leasehold::store::{AcquireOutcome, RenewOutcome};
    use leasehold::{Fence, Key, OwnerToken, Store, StoreError};

    use super::Broken;

    /// A store that forwards every call to `inner` but the acquire and renewal its part
    /// breaks (the core's test-util [`Forward`](leasehold::wrap::Forward) base: no
    /// extension passes through, so no batch bypasses the broken renewal).
    #[derive(Debug)]
    pub(super) struct BrokenStore {
        pub(super) inner: Arc<dyn Store>,
        pub(super) part: Broken,
    }

    /// How much longer than asked [`Broken::StretchTtl`] keeps a lease.
    const STRETCH: u32 = 10;

    #[async_trait]
    impl leasehold::wrap::Forward for BrokenStore {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }

        async fn acquire(
            &self,
            key: &Key,
            owner: &OwnerToken,
            ttl: Duration,
        ) -> Result<AcquireOutcome, StoreError> {
            match self.part {
                Broken::StretchTtl => match self.inner.acquire(key, owner, ttl * STRETCH).await? {
                    AcquireOutcome::Acquired { fence, .. } => {
                        Ok(AcquireOutcome::Acquired { fence, ttl })
                    }
                    other => Ok(other),
                },
                Broken::StealOnAcquire => match self.inner.acquire(key, owner, ttl).await? {
                    AcquireOutcome::Held { .. } => {
                        self.inner.break_lease(key).await?;
                        self.inner.acquire(key, owner, ttl).await
                    }
                    other => Ok(other),
                },
                Broken::NewFenceForOwner => {
                    let first = self.inner.acquire(key, owner, ttl).await?;
                    if matches!(first, AcquireOutcome::Acquired { .. }) {
                        self.inner.break_lease(key).await?;
                        self.inner.acquire(key, owner, ttl).await?;
                    }
                    Ok(first)
                }
                Broken::SameFence => match self.inner.acquire(key, owner, ttl).await? {
                    AcquireOutcome::Acquired { ttl, .. } => Ok(AcquireOutcome::Acquired {
                        fence: Fence(1),
                        ttl,
                    }),
                    other => Ok(other),
                },
                _ => self.inner.acquire(key, owner, ttl).await,
            }
        }

        async fn renew(
            &self,
            key: &Key,
            owner: &OwnerToken,
            ttl: Duration,
        ) -> Result<RenewOutcome, StoreError> {
            match self.part {
                Broken::StretchTtl => match self.inner.renew(key, owner, ttl * STRETCH).await? {
                    RenewOutcome::Renewed { .. } => Ok(RenewOutcome::Renewed { ttl }),
                    other => Ok(other),
                },
                Broken::ZombieHeartbeat => {
                    let _ = self.inner.renew(key, owner, ttl).await?;
                    Ok(RenewOutcome::Renewed { ttl })
                }
                _ => self.inner.renew(key, owner, ttl).await,
            }
        }
    }
}
