//! The store contract every backend implements (docs/design.md §3).

use std::time::Duration;

use async_trait::async_trait;

use crate::ended::EndedGrants;
use crate::error::StoreError;
use crate::ext::{BatchStore, WaitStore, WatchStore};
use crate::key::Key;
use crate::token::{Fence, OwnerToken};

/// The longest [`Record`] value a store accepts, in bytes.
pub const MAX_RECORD_LEN: usize = 4096;

/// A small value kept by the store next to its leases, written only by a higher fence
/// (see [`Store::put_record`]). Leader election publishes the leader's value in one; a
/// semaphore records its number of permits in one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The fence the value was written at.
    pub fence: Fence,
    /// The value (at most [`MAX_RECORD_LEN`] bytes).
    pub value: Vec<u8>,
}

impl Record {
    /// The record as one byte string: the fence (8 bytes, big-endian), then the value —
    /// for stores that keep a record in a single value (etcd, ZooKeeper).
    pub fn to_fenced_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.value.len());
        out.extend_from_slice(&self.fence.get().to_be_bytes());
        out.extend_from_slice(&self.value);
        out
    }

    /// Reads [`to_fenced_bytes`](Self::to_fenced_bytes) back; `None` when `data` is
    /// shorter than a fence or its value is longer than [`MAX_RECORD_LEN`] (not written
    /// by leasehold).
    pub fn from_fenced_bytes(data: &[u8]) -> Option<Self> {
        let (head, value) = data.split_at_checked(8)?;
        if value.len() > MAX_RECORD_LEN {
            return None;
        }
        let fence = u64::from_be_bytes(head.try_into().ok()?);
        Some(Self {
            fence: Fence(fence),
            value: value.to_vec(),
        })
    }
}

/// The reply to [`Store::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lease is ours. A same-owner re-acquire returns the same fence.
    Acquired {
        /// The fence of this grant.
        fence: Fence,
        /// The TTL the store granted (stores that round TTLs report what they set).
        ttl: Duration,
    },
    /// Another owner holds the lease.
    Held {
        /// The holder's remaining TTL, when the store reports it.
        remaining: Option<Duration>,
    },
}

/// The reply to [`Store::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// Extended.
    Renewed {
        /// The TTL the store granted.
        ttl: Duration,
    },
    /// The lease is not held by this owner (expired, released, or taken by another).
    NotOwner,
}

/// The reply to [`Store::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Deleted.
    Released,
    /// The lease was not held by this owner; nothing was changed.
    NotOwner,
}

/// What [`Store::inspect`] reports about a held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The key.
    pub key: Key,
    /// The holder's token.
    pub owner: OwnerToken,
    /// The holder's fence.
    pub fence: Fence,
    /// The remaining TTL, when the store reports it.
    pub remaining: Option<Duration>,
}

/// How far a backend's fences survive the store itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceDurability {
    /// Fences live in process memory: they die with the process.
    Process,
    /// Fences survive a store restart when the store persists data, and are floored at
    /// the store's clock in microseconds so they do not go back after data loss
    /// (unless the store's clock moved back by more than the outage).
    ClockFloored,
    /// Fences are stored durably by a transactional database.
    Durable,
    /// Fences come from a cluster-wide monotonic number (etcd revision, ZooKeeper zxid).
    Consensus,
}

/// Facts about a backend that the client and the conformance suite rely on. What a backend
/// can do beyond the [`Store`] contract is not a flag here but an extension reached from
/// the store ([`Store::batch`], [`Store::watcher`], [`Store::waiter`],
/// [`Store::ended_grants`]): a store without one answers `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Waiters get the lease in the order they started waiting, across processes: the
    /// store keeps them in a queue and lets nobody past it (Redis with notifications,
    /// PostgreSQL's server-side lock queue).
    pub fifo_wait: bool,
    /// [`AcquireOutcome::Held`] and [`LeaseInfo`] carry the remaining TTL.
    pub reports_remaining: bool,
    /// The lease is bound to a session (advisory lock, `GET_LOCK`): the store ends it when
    /// the session dies; its TTL is enforced by the holder, not the store.
    pub session_bound: bool,
    /// How far fences survive the store.
    pub fence_durability: FenceDurability,
    /// The store may drop a held lease before its TTL on its own (Redis under an evicting
    /// `maxmemory-policy`, accepted explicitly): a second holder can then be let in while
    /// the first still believes it holds the lease. Exclusion is not guaranteed; only the
    /// fence, checked by the storage that receives the writes, protects the data.
    pub may_evict: bool,
}

impl Capabilities {
    /// The minimal set: no queue of waiters, no remaining TTL reported, not bound to a
    /// session, fences in process memory, no eviction.
    pub const fn minimal() -> Self {
        Self {
            fifo_wait: false,
            reports_remaining: false,
            session_bound: false,
            fence_durability: FenceDurability::Process,
            may_evict: false,
        }
    }
}

/// A backend: the atomic operations of the store contract (docs/design.md §3) against one
/// real external system, which every store implements, and the extensions that only some
/// stores have, each reached by an accessor that answers `None` where the store lacks it
/// ([`batch`](Self::batch), [`watcher`](Self::watcher), [`waiter`](Self::waiter),
/// [`ended_grants`](Self::ended_grants)). Used as a trait object (`Arc<dyn Store>`), so
/// the store can be chosen at run time from a URL (see [`Registry`](crate::Registry)).
///
/// Every operation is one atomic step on the store. Expiry is measured on the store's own
/// clock. Implementations need not apply timeouts: the caller bounds every call.
///
/// A policy wrapper such as [`TimeoutStore`](crate::wrap::TimeoutStore) forwards the
/// extensions of the store it wraps: its accessors answer `Some` exactly where the
/// wrapped store's do.
///
/// # Cancel safety
/// Callers may drop any of these futures (on timeout). An operation that was sent may
/// still take effect; the holder treats that as an ambiguous reply.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The backend's name, used as the `backend` metric label (`"memory"`, `"redis"`).
    fn backend(&self) -> &'static str;

    /// Facts about this backend.
    fn capabilities(&self) -> Capabilities;

    /// If `key` is free or expired: issue a fence higher than every fence ever issued for
    /// `key`, record `owner` and the fence, set the TTL. If held by `owner` already: extend
    /// it and return the same fence. Otherwise report it held.
    ///
    /// A store that queues its waiters may, when the lease is released (or found free
    /// with someone waiting), *reserve* it for the first waiter: record that waiter's
    /// owner with a new fence and a short TTL, and tell it. The waiter's `acquire` then
    /// finds the key held by its own owner and extends it (same fence), so its validity
    /// counts from that request's send, as for any grant; anyone else is answered
    /// `Held` meanwhile (no one gets past the queue).
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError>;

    /// Compare-and-extend: extend the TTL only if `owner` holds `key`.
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError>;

    /// Compare-and-delete: remove the lease only if `owner` holds `key`.
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError>;

    /// The current holder of `key`, if any.
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError>;

    /// The held leases whose keys start with `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError>;

    /// Admin: remove whatever lease holds `key` *and advance its fence*, so writes by the
    /// evicted holder are rejected by the guard. Returns the fence now recorded.
    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError>;

    /// Fenced write of a small record, in a namespace of its own (a record named `k` and
    /// the lease `k` are unrelated): store `value` at `fence` under `key` if no record is
    /// stored there or the stored one has a *lower* fence, in one atomic step; return the
    /// record stored after the call — ours, or the one that kept its place. Records never
    /// expire (one per election or semaphore name). The caller checks `value.len() <=`
    /// [`MAX_RECORD_LEN`].
    ///
    /// With `fence` 0 this is "set if absent, else read" (a semaphore's permit count).
    ///
    /// # Cancel safety
    /// A dropped call may have written the record.
    async fn put_record(&self, key: &Key, fence: Fence, value: &[u8])
    -> Result<Record, StoreError>;

    /// The record stored under `key` by [`put_record`](Self::put_record), if any.
    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// The store's batch operations ([`BatchStore`]: many renewals in one call, one lease
    /// of several keys), if it has its own. `None` (the default): callers renew each lease
    /// on its own, concurrently, and take one of several keys with
    /// [`acquire_any_one_by_one`](crate::acquire_any_one_by_one) (see
    /// [`renew_many`](crate::renew_many) and [`acquire_any`](crate::acquire_any), which
    /// choose).
    fn batch(&self) -> Option<&dyn BatchStore> {
        None
    }

    /// The store's change notices ([`WatchStore`]), if it notifies. `None` (the default):
    /// a watcher reads again on a timer (an election's observers poll).
    fn watcher(&self) -> Option<&dyn WatchStore> {
        None
    }

    /// The store's release notices for waiting acquires ([`WaitStore`]), if it has them.
    /// `None` (the default): a waiting acquire retries with backoff.
    fn waiter(&self) -> Option<&dyn WaitStore> {
        None
    }

    /// Where this store reports a grant that ended on its side while its holder may still
    /// believe it holds it — a session-bound lease whose server session it saw end (the
    /// server restarted, the session was killed) — so that every
    /// [`LeaseClient`](crate::LeaseClient) on it loses that lease at once
    /// ([`LostReason::SessionEnded`](crate::LostReason::SessionEnded)) instead of at its
    /// next renewal. A client subscribes once, when it is built. The store reports
    /// ([`EndedGrants::report`]) *before* it lets go of anything that may still hold the
    /// grant, and keeps that until the holder's deadline when the report says no client
    /// has the grant.
    ///
    /// `None` (the default): the store reports nothing, as a store whose leases end only
    /// by expiry (its holders learn at their renewals, and their deadlines come first).
    fn ended_grants(&self) -> Option<&EndedGrants> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_bytes_round_trip_and_refuse_what_is_not_a_record() {
        let r = Record {
            fence: Fence(u64::MAX),
            value: vec![0, 255, b'x'],
        };
        assert_eq!(Record::from_fenced_bytes(&r.to_fenced_bytes()), Some(r));
        let empty = Record {
            fence: Fence(1),
            value: vec![],
        };
        assert_eq!(
            Record::from_fenced_bytes(&empty.to_fenced_bytes()),
            Some(empty)
        );
        assert_eq!(
            Record::from_fenced_bytes(&[1, 2, 3]),
            None,
            "shorter than a fence"
        );
        assert_eq!(
            Record::from_fenced_bytes(&vec![0; 8 + MAX_RECORD_LEN + 1]),
            None,
            "a value over the limit"
        );
        assert!(Record::from_fenced_bytes(&vec![0; 8 + MAX_RECORD_LEN]).is_some());
    }
}
