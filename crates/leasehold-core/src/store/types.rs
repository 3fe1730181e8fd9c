//! The words of the store contract: what a store answers, what it reports about a lease,
//! the records it keeps, and the facts a backend states about itself.

use std::time::Duration;

use crate::error::StoreError;
use crate::key::Key;
use crate::token::{Fence, OwnerToken};

/// The longest [`Record`] value a store accepts, in bytes.
pub const MAX_RECORD_LEN: usize = 4096;

/// A small value kept by the store next to its leases, written only by a higher fence
/// (see [`Store::put_record`](crate::Store::put_record)). Leader election publishes the leader's value in one; a
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

/// How a [`WaitStore::wait_turn`](crate::WaitStore::wait_turn) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The key may now be free for the waiter (released, expired, reserved for it), or
    /// the wait's time is up: acquire again, as the same owner, to find out.
    Retry,
    /// The store handed the lease to the waiter and the waiter learned it from the store's
    /// own notice: it holds the lease without a confirming acquire (docs/design.md,
    /// "Hand-off without a confirming acquire").
    Granted(HandedGrant),
}

/// A lease a store handed to a waiting owner ([`WaitOutcome::Granted`]).
///
/// Its validity counts from [`waiting_sent_at`](Self::waiting_sent_at): the send of a
/// request of the waiter's that the store answered "still waiting" **and** processed
/// before it made this grant. The store's expiry of the grant is its own clock at the
/// grant plus `ttl`, which is later than that request's processing plus `ttl`, so the
/// holder's deadline (`waiting_sent_at` plus its validity of `ttl`) is never after the
/// store's expiry, however late the notice of the grant arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandedGrant {
    /// The grant's fence (a new one, above every fence issued for the key before).
    pub fence: Fence,
    /// The TTL the store set at the grant: at most the one the waiter asked for.
    pub ttl: Duration,
    /// When the waiter sent its last request that the store answered "still waiting"
    /// before the grant (on tokio's clock).
    pub waiting_sent_at: tokio::time::Instant,
}

/// The reply to [`Store::acquire`](crate::Store::acquire).
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

/// The reply to [`Store::renew`](crate::Store::renew).
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

/// The reply to [`Store::release`](crate::Store::release).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Deleted.
    Released,
    /// The lease was not held by this owner; nothing was changed.
    NotOwner,
}

/// What [`Store::inspect`](crate::Store::inspect) reports about a held lease.
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
/// can do beyond the [`Store`](crate::Store) contract is not a flag here but an extension reached from
/// the store ([`Store::batch`](crate::Store::batch), [`Store::watcher`](crate::Store::watcher), [`Store::waiter`](crate::Store::waiter),
/// [`Store::ended_grants`](crate::Store::ended_grants)): a store without one answers `None`.
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
    /// A waiting owner may be handed the lease by the store's notice, without an acquire
    /// to confirm it ([`WaitStore::wait_turn`](crate::WaitStore::wait_turn) answers
    /// [`WaitOutcome::Granted`]; docs/design.md section 11): Redis with notifications.
    /// Elsewhere a waiter confirms with an acquire of its own.
    pub hands_off: bool,
    /// A renewal sets the lease's store-side expiry to the TTL asked, counted from when the
    /// store processed it, for any TTL up to [`MAX_TTL`](crate::config::MAX_TTL) (longer
    /// or shorter than the one before), and answers with that TTL: a holder can leave its
    /// lease in the store for a chosen time and go ([`Lease::release_after`](crate::Lease::release_after)).
    /// Redis (not through Sentinel), the SQL lease tables and SQLite; not a store whose
    /// expiry is fixed at the grant (etcd's lease TTL), bound to a session (ZooKeeper,
    /// advisory locks, `GET_LOCK`), or answered as the validity left after the round trips
    /// (Redlock) or less a replica-clock allowance (Sentinel).
    pub sets_expiry: bool,
}

impl Capabilities {
    /// The minimal set: no queue of waiters, no remaining TTL reported, not bound to a
    /// session, fences in process memory, no eviction, no hand-off by notice, no expiry
    /// set by a renewal.
    pub const fn minimal() -> Self {
        Self {
            fifo_wait: false,
            reports_remaining: false,
            session_bound: false,
            fence_durability: FenceDurability::Process,
            may_evict: false,
            hands_off: false,
            sets_expiry: false,
        }
    }
}

/// The most leases the renewal scheduler sends in one [`renew_many`](crate::renew_many) call.
pub const RENEW_BATCH: usize = 1000;

/// The change notices of one key, from [`WatchStore::watch`](crate::WatchStore::watch): each item says that the
/// lease or the record of the key may have changed since the previous item (or since the
/// watch began); the watcher reads again to learn what changed. An `Err` item, or the end
/// of the stream, says notices may have been missed: read again and watch anew.
pub type Changes = futures::stream::BoxStream<'static, Result<(), StoreError>>;

/// The record [`BatchStore::acquire_any_checked`](crate::BatchStore::acquire_any_checked) checks: it must hold `value` (written if
/// absent) for the acquire to go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordCheck<'a> {
    /// The record's key (in the records' name space, apart from the leases).
    pub key: &'a Key,
    /// The value it must hold, at most [`MAX_RECORD_LEN`](crate::MAX_RECORD_LEN) bytes.
    pub value: &'a [u8],
}

/// The reply to [`BatchStore::acquire_any_checked`](crate::BatchStore::acquire_any_checked).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckedAcquire {
    /// The record holds the value: the answer of [`BatchStore::acquire_any`](crate::BatchStore::acquire_any).
    Passed(AcquireAnyOutcome),
    /// The record holds another value (this one): nothing was acquired.
    Refused(Record),
}

/// The reply to [`BatchStore::acquire_any`](crate::BatchStore::acquire_any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireAnyOutcome {
    /// `keys[index]` is ours, as [`AcquireOutcome::Acquired`] for that key.
    Acquired {
        /// The position of the key in the call's `keys`.
        index: usize,
        /// The fence of this grant (the same fence when the key was held by the owner).
        fence: Fence,
        /// The TTL the store granted.
        ttl: Duration,
    },
    /// Every key is held by another owner (or reserved for another waiter).
    Held {
        /// The shortest remaining TTL the store reported, if it reported one.
        remaining: Option<Duration>,
    },
}

impl From<AcquireOutcome> for AcquireAnyOutcome {
    /// The answer for a call of one key (its index 0).
    fn from(outcome: AcquireOutcome) -> Self {
        match outcome {
            AcquireOutcome::Acquired { fence, ttl } => Self::Acquired {
                index: 0,
                fence,
                ttl,
            },
            AcquireOutcome::Held { remaining } => Self::Held { remaining },
        }
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
