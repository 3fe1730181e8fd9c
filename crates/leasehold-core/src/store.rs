//! The store contract every backend implements (docs/design.md §3).

use std::time::Duration;

use async_trait::async_trait;

use crate::ended::EndedGrants;
use crate::error::StoreError;
use crate::key::Key;
use crate::token::{Fence, OwnerToken};

/// The most leases the renewal scheduler sends in one [`Store::renew_many`] call.
pub const RENEW_BATCH: usize = 1000;

/// The longest [`Record`] value a store accepts, in bytes.
pub const MAX_RECORD_LEN: usize = 4096;

/// The change notices of one key, from [`Store::watch`]: each item says that the lease
/// or the record of the key may have changed since the previous item (or since the watch
/// began); the watcher reads again to learn what changed. An `Err` item, or the end of the
/// stream, says notices may have been missed: read again and watch anew.
pub type Changes = futures::stream::BoxStream<'static, Result<(), StoreError>>;

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

/// What a backend can do. The conformance suite checks each claim, and checks that a
/// backend which lacks an optional capability says so by returning
/// [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`Store::wait_released`] notifies on release instead of returning `Unsupported`.
    pub wait_for_release: bool,
    /// Waiters get the lease in the order they started waiting, across processes: the
    /// store keeps them in a queue and lets nobody past it (Redis with notifications,
    /// PostgreSQL's server-side lock queue).
    pub fifo_wait: bool,
    /// [`AcquireOutcome::Held`] and [`LeaseInfo`] carry the remaining TTL.
    pub reports_remaining: bool,
    /// [`Store::list`] works.
    pub list: bool,
    /// [`Store::break_lease`] works.
    pub break_lease: bool,
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
    /// [`Store::put_record`] and [`Store::get_record`] work (leader election's values
    /// and semaphores' permit counts).
    pub records: bool,
    /// [`Store::watch`] notifies changes instead of returning `Unsupported` (an election's
    /// observers learn of a new leader without polling).
    pub watch: bool,
    /// [`Store::acquire_any`] is one atomic store call over all its keys (one Lua script
    /// on one Redis server), instead of the default's one call per key
    /// ([`acquire_any_one_by_one`]). Either way its answer has the same meaning.
    pub atomic_acquire_any: bool,
}

impl Capabilities {
    /// The minimal set: none of the optional operations, fences in process memory.
    pub const fn minimal() -> Self {
        Self {
            wait_for_release: false,
            fifo_wait: false,
            reports_remaining: false,
            list: false,
            break_lease: false,
            session_bound: false,
            fence_durability: FenceDurability::Process,
            may_evict: false,
            records: false,
            watch: false,
            atomic_acquire_any: false,
        }
    }
}

/// A backend: the four atomic operations of docs/design.md §3 against one real external system,
/// plus optional hooks. Used as a trait object (`Arc<dyn Store>`), so the store can be
/// chosen at run time from a URL (see [`Registry`](crate::Registry)).
///
/// Every operation is one atomic step on the store. Expiry is measured on the store's own
/// clock. Implementations need not apply timeouts: the caller bounds every call.
///
/// # Cancel safety
/// Callers may drop any of these futures (on timeout). An operation that was sent may
/// still take effect; the holder treats that as an ambiguous reply.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The backend's name, used as the `backend` metric label (`"memory"`, `"redis"`).
    fn backend(&self) -> &'static str;

    /// What this backend can do.
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

    /// [`renew`](Self::renew) for many leases at once: one result per `(key, owner)` of
    /// `leases`, in the same order. A batch is not atomic; each lease is renewed (or not)
    /// on its own, as `renew` would. `Err` means the batch as a whole failed, and is then
    /// as ambiguous for every lease in it as the same error from `renew` for one.
    ///
    /// The renewal scheduler sends a client's due renewals through this in batches of at
    /// most [`RENEW_BATCH`], so a store that sends a batch in one round trip (the Redis
    /// store does) renews 100,000 leases with a hundred round trips. The default sends
    /// each renewal on its own, concurrently.
    ///
    /// # Cancel safety
    /// As `renew`: a dropped call may have renewed any of the leases.
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        Ok(futures::future::join_all(
            leases
                .iter()
                .map(|(key, owner)| self.renew(key, owner, ttl)),
        )
        .await)
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

    /// Compare-and-delete: remove the lease only if `owner` holds `key`.
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError>;

    /// The current holder of `key`, if any.
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError>;

    /// Returns when `key` may have become free for `owner` (released or expired, or
    /// handed to `owner` by a store that queues its waiters), or when `timeout` has
    /// passed, whichever is first; `Ok` either way. The caller re-checks by acquiring as
    /// `owner`, the owner whose acquire of `key` last answered `Held`. Backends without
    /// notifications return `Unsupported` (the default).
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let _ = (key, owner, timeout);
        Err(StoreError::unsupported(
            self.backend(),
            "waiting for release",
        ))
    }

    /// The held leases whose keys start with `prefix`. Default: `Unsupported`.
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        let _ = prefix;
        Err(StoreError::unsupported(self.backend(), "listing leases"))
    }

    /// Admin: remove whatever lease holds `key` *and advance its fence*, so writes by the
    /// evicted holder are rejected by the guard. Returns the fence now recorded.
    /// Default: `Unsupported`.
    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let _ = key;
        Err(StoreError::unsupported(self.backend(), "breaking a lease"))
    }

    /// Fenced write of a small record, in a namespace of its own (a record named `k` and
    /// the lease `k` are unrelated): store `value` at `fence` under `key` if no record is
    /// stored there or the stored one has a *lower* fence, in one atomic step; return the
    /// record stored after the call — ours, or the one that kept its place. Records never
    /// expire (one per election or semaphore name). The caller checks `value.len() <=`
    /// [`MAX_RECORD_LEN`]. Default: `Unsupported`.
    ///
    /// With `fence` 0 this is "set if absent, else read" (a semaphore's permit count).
    ///
    /// # Cancel safety
    /// A dropped call may have written the record.
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        let _ = (key, fence, value);
        Err(StoreError::unsupported(self.backend(), "records"))
    }

    /// The record stored under `key` by [`put_record`](Self::put_record), if any.
    /// Default: `Unsupported`.
    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let _ = key;
        Err(StoreError::unsupported(self.backend(), "records"))
    }

    /// Watches `key`: once this returns, the stream yields an item after every grant
    /// (a new holder, not an extension), release and break of the lease `key` and every
    /// write of the record `key` (see [`Changes`]); several changes may share one item,
    /// and an item may come without a change. An expiry need not be notified: a watcher
    /// also reads again on a timer of its own (`Election::observe`: its interval). Watching changes nothing in the
    /// store and joins no queue of waiters (it must not hold up anyone acquiring `key`).
    /// Default: `Unsupported`.
    ///
    /// # Cancel safety
    /// Cancel safe; dropping the stream ends the watch.
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        let _ = key;
        Err(StoreError::unsupported(self.backend(), "watching"))
    }

    /// Takes one lease of several at once (a semaphore's permit: one of its slots):
    ///
    /// 1. if one of `keys` is held by `owner` already (an earlier call whose reply was
    ///    lost, or a reservation of a store that queues its waiters), extend it and return
    ///    it with its fence, as [`acquire`](Self::acquire) of that key would;
    /// 2. otherwise grant the first key, in the order given, that `acquire` would grant
    ///    (with a new fence, higher than every fence of that key);
    /// 3. otherwise answer [`AcquireAnyOutcome::Held`] with the shortest remaining TTL the
    ///    store reported (`None` if it reported none).
    ///
    /// When it answers `Ok`, `owner` holds at most one of `keys` (the one returned, if
    /// any). Each key behaves as under `acquire` for this owner (a key reserved for
    /// another waiter is `Held`). An empty `keys` is answered `Held { remaining: None }`.
    /// `Err` is as ambiguous for every key of the call as the same error from `acquire`
    /// for one: the caller retries with the same owner, or releases `owner` on every key.
    ///
    /// The default is [`acquire_any_one_by_one`]: a [`renew_many`](Self::renew_many) of
    /// all the keys (to find one held by `owner`), then one `acquire` per key in order
    /// until one is granted. A store that does it in one atomic call says so with
    /// [`Capabilities::atomic_acquire_any`].
    ///
    /// # Cancel safety
    /// As `acquire`: a dropped call may have granted (or extended) one of the keys.
    async fn acquire_any(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireAnyOutcome, StoreError> {
        acquire_any_one_by_one(self, keys, owner, ttl).await
    }

    /// [`acquire_any`](Self::acquire_any) behind a check of a record: the record
    /// `check.key` is written with `check.value` if none is stored (as
    /// [`put_record`](Self::put_record) at fence 0 would); if it then holds another
    /// value, nothing is acquired and the stored record is answered
    /// ([`CheckedAcquire::Refused`]); else the answer of `acquire_any`
    /// ([`CheckedAcquire::Passed`]). A semaphore checks its number of permits so.
    ///
    /// The default, [`acquire_any_checked_in_two_calls`], makes the two calls,
    /// `put_record` then `acquire_any`. A store whose
    /// `acquire_any` is one atomic call ([`Capabilities::atomic_acquire_any`]) makes this
    /// one call too, check and acquire together.
    ///
    /// # Cancel safety
    /// As `acquire_any`: a dropped call may have written the record and granted (or
    /// extended) one of the keys.
    async fn acquire_any_checked(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
        check: RecordCheck<'_>,
    ) -> Result<CheckedAcquire, StoreError> {
        acquire_any_checked_in_two_calls(self, keys, owner, ttl, check).await
    }
}

/// [`Store::acquire_any_checked`] in two calls, for any store (the trait's default):
/// [`Store::put_record`] of the check's value at fence 0, then, if the record holds that
/// value, [`Store::acquire_any`]. Not atomic: the record may change between the two.
///
/// # Cancel safety
/// As [`Store::acquire_any_checked`].
///
/// # Errors
/// The first error of a store call.
pub async fn acquire_any_checked_in_two_calls<S: Store + ?Sized>(
    store: &S,
    keys: &[Key],
    owner: &OwnerToken,
    ttl: Duration,
    check: RecordCheck<'_>,
) -> Result<CheckedAcquire, StoreError> {
    let stored = store.put_record(check.key, Fence(0), check.value).await?;
    if stored.value != check.value {
        return Ok(CheckedAcquire::Refused(stored));
    }
    store
        .acquire_any(keys, owner, ttl)
        .await
        .map(CheckedAcquire::Passed)
}

/// The record [`Store::acquire_any_checked`] checks: it must hold `value` (written if
/// absent) for the acquire to go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordCheck<'a> {
    /// The record's key (in the records' name space, apart from the leases).
    pub key: &'a Key,
    /// The value it must hold, at most [`MAX_RECORD_LEN`] bytes.
    pub value: &'a [u8],
}

/// The reply to [`Store::acquire_any_checked`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckedAcquire {
    /// The record holds the value: the answer of [`Store::acquire_any`].
    Passed(AcquireAnyOutcome),
    /// The record holds another value (this one): nothing was acquired.
    Refused(Record),
}

/// The reply to [`Store::acquire_any`].
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

/// [`Store::acquire_any`] with one call per key, for any store (the trait's default): a
/// [`Store::renew_many`] of every key as `owner` finds a key `owner` holds already, which
/// one `acquire` then extends and returns (any other one `owner` holds is released, so
/// that it holds one at most); without one, each key is acquired in order until one is
/// granted. So `owner` holds at most one of `keys` when it answers `Ok`, and a key
/// granted before an error stays granted: the error is ambiguous for every key.
///
/// It costs one `renew_many` and up to `keys.len()` acquires; a single key is one
/// `acquire`. Not atomic: a key freed after its acquire answered `Held` is not seen by
/// this call.
///
/// # Cancel safety
/// As [`Store::acquire_any`].
///
/// # Errors
/// The first error of a store call.
pub async fn acquire_any_one_by_one<S: Store + ?Sized>(
    store: &S,
    keys: &[Key],
    owner: &OwnerToken,
    ttl: Duration,
) -> Result<AcquireAnyOutcome, StoreError> {
    if keys.len() > 1 {
        let leases: Vec<(Key, OwnerToken)> = keys.iter().map(|k| (k.clone(), *owner)).collect();
        let renewed = store.renew_many(&leases, ttl).await?;
        let mut held = Vec::new();
        for (index, r) in renewed.into_iter().enumerate() {
            if let RenewOutcome::Renewed { .. } = r? {
                held.push(index);
            }
        }
        if let Some((&first, others)) = held.split_first() {
            for &other in others {
                store.release(&keys[other], owner).await?;
            }
            // Just renewed: `acquire` finds it held by `owner` and returns its fence.
            if let AcquireOutcome::Acquired { fence, ttl } =
                store.acquire(&keys[first], owner, ttl).await?
            {
                return Ok(AcquireAnyOutcome::Acquired {
                    index: first,
                    fence,
                    ttl,
                });
            }
        }
    }
    first_granted(keys, |key| store.acquire(key, owner, ttl)).await
}

/// Calls `acquire` (an [`Store::acquire`] of one key) on each of `keys` in order until one
/// answers `Acquired`: that key's position and grant; else `Held` with the shortest
/// remaining TTL reported. The first error ends it.
pub(crate) async fn first_granted<'k, F, Fut>(
    keys: &'k [Key],
    mut acquire: F,
) -> Result<AcquireAnyOutcome, StoreError>
where
    F: FnMut(&'k Key) -> Fut,
    Fut: Future<Output = Result<AcquireOutcome, StoreError>>,
{
    let mut shortest: Option<Duration> = None;
    for (index, key) in keys.iter().enumerate() {
        match acquire(key).await? {
            AcquireOutcome::Acquired { fence, ttl } => {
                return Ok(AcquireAnyOutcome::Acquired { index, fence, ttl });
            }
            AcquireOutcome::Held { remaining } => {
                if let Some(r) = remaining {
                    shortest = Some(shortest.map_or(r, |s| s.min(r)));
                }
            }
        }
    }
    Ok(AcquireAnyOutcome::Held {
        remaining: shortest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    fn keys(n: usize) -> Vec<Key> {
        (0..n)
            .map(|i| Key::new(format!("any#{i}")).unwrap())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_any_one_by_one_prefers_the_owners_key_then_the_first_free_one() {
        let store = MemoryStore::new();
        let ks = keys(4);
        let (me, other) = (OwnerToken::random(), OwnerToken::random());
        let ttl = Duration::from_secs(10);
        store.acquire(&ks[0], &other, ttl).await.unwrap();
        // The first free key in order.
        let got = store.acquire_any(&ks, &me, ttl).await.unwrap();
        let AcquireAnyOutcome::Acquired {
            index: 1, fence, ..
        } = got
        else {
            panic!("the first free key in order: {got:?}");
        };
        // Key 0 is free again, key 1 is ours: ours is extended, key 0 is left alone.
        store.release(&ks[0], &other).await.unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        let again = store.acquire_any(&ks, &me, ttl).await.unwrap();
        assert_eq!(
            again,
            AcquireAnyOutcome::Acquired {
                index: 1,
                fence,
                ttl
            },
            "the owner's key, with its fence"
        );
        assert_eq!(store.inspect(&ks[0]).await.unwrap(), None, "not granted");
        let info = store.inspect(&ks[1]).await.unwrap().unwrap();
        assert_eq!(info.remaining, Some(ttl), "extended");
        // Two keys of the owner (a misuse): one is kept, the other released.
        store.acquire(&ks[3], &me, ttl).await.unwrap();
        let got = store.acquire_any(&ks, &me, ttl).await.unwrap();
        assert!(
            matches!(got, AcquireAnyOutcome::Acquired { index: 1, .. }),
            "{got:?}"
        );
        assert_eq!(store.inspect(&ks[3]).await.unwrap(), None, "at most one");
        // All held by others: the shortest remaining TTL.
        let them = OwnerToken::random();
        for (k, secs) in ks.iter().zip([7, 3, 9, 4]) {
            store.break_lease(k).await.unwrap();
            store
                .acquire(k, &them, Duration::from_secs(secs))
                .await
                .unwrap();
        }
        assert_eq!(
            store.acquire_any(&ks, &me, ttl).await.unwrap(),
            AcquireAnyOutcome::Held {
                remaining: Some(Duration::from_secs(3))
            }
        );
        assert_eq!(
            store.acquire_any(&[], &me, ttl).await.unwrap(),
            AcquireAnyOutcome::Held { remaining: None },
            "nothing to grant"
        );
    }

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
