//! The store contract (docs/design.md §3): the [`Store`] trait every backend implements,
//! and what some stores do beyond it, each extension a trait reached from the store by an
//! accessor that answers `None` on a store without it, so a store that lacks one says so
//! by its type, not by an error at run time.
//!
//! - [`BatchStore`] ([`Store::batch`]): many renewals in one call, and one lease of
//!   several keys (a semaphore's permit), atomically where the store can. Callers go
//!   through [`renew_many`], [`acquire_any`] and [`acquire_any_checked`], which use the
//!   store's batch or, without one, a default built on the [`Store`] calls.
//! - [`WatchStore`] ([`Store::watcher`]): change notices of a key, so an election's
//!   observers need not poll.
//! - [`WaitStore`] ([`Store::waiter`]): release notices, so a waiting acquire need not
//!   back off blindly.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::key::Key;
use crate::lease::ended::EndedGrants;
use crate::store::doctor::Diagnosis;
use crate::store::types::{
    AcquireAnyOutcome, AcquireOutcome, Capabilities, Changes, CheckedAcquire, LeaseInfo, Record,
    RecordCheck, ReleaseOutcome, RenewOutcome, WaitOutcome,
};
use crate::token::{Fence, OwnerToken};

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
    /// `Held` meanwhile (no one gets past the queue). A store that
    /// [hands off](crate::Capabilities::hands_off) grants it outright to a waiter that
    /// heartbeats, for that waiter's TTL, and tells it ([`WaitStore::wait_turn`]); its
    /// acquire, if it sends one, is answered the same way (same fence, TTL extended).
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError>;

    /// [`acquire`](Self::acquire) for a caller that will not wait if `key` is held
    /// ([`LeaseClient::try_acquire`](crate::LeaseClient::try_acquire)): the same contract
    /// and the same answers. A store may take a way that is cheaper when the key is free
    /// but that a caller about to wait must not take (ZooKeeper creates its node first, as
    /// Curator's lock does: for a moment a held key shows it in the queue). The default
    /// is [`acquire`](Self::acquire). A store that implements it says so with
    /// [`has_acquire_no_wait`](Self::has_acquire_no_wait); the client asks it only then.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    async fn acquire_no_wait(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.acquire(key, owner, ttl).await
    }

    /// Whether [`acquire_no_wait`](Self::acquire_no_wait) takes a way of its own (the
    /// default: no). When it does not, a try asks with [`acquire`](Self::acquire) directly,
    /// which saves the default's second boxed call.
    fn has_acquire_no_wait(&self) -> bool {
        false
    }

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
    /// [`MAX_RECORD_LEN`](crate::MAX_RECORD_LEN).
    ///
    /// With `fence` 0 this is "set if absent, else read" (a semaphore's permit count).
    ///
    /// # Cancel safety
    /// A dropped call may have written the record.
    async fn put_record(&self, key: &Key, fence: Fence, value: &[u8])
    -> Result<Record, StoreError>;

    /// The record stored under `key` by [`put_record`](Self::put_record), if any.
    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// What the store can tell about its deployment: the server it reached, the TLS and
    /// identity of the connection, and the server settings that decide the rows of
    /// `docs/guarantees.md` ([`Diagnosis`]) — what `leasehold doctor` prints. It reads
    /// only: nothing is acquired or written. The default knows nothing and says so: no
    /// fact, no row, one warning naming the store; every store of leasehold overrides it.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn diagnose(&self) -> Result<Diagnosis, StoreError> {
        let mut d = Diagnosis::new();
        d.warn(format!(
            "the {} store reports nothing about its deployment (it does not implement \
             Store::diagnose): no row of docs/guarantees.md is judged",
            self.backend()
        ));
        Ok(d)
    }

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

/// The batch operations of a store that has its own ([`Store::batch`]): renewals of many
/// leases in one call, and one lease of several keys. A store whose batch is one atomic
/// call says so with [`atomic_acquire_any`](Self::atomic_acquire_any).
#[async_trait]
pub trait BatchStore: Store {
    /// [`renew`](Store::renew) for many leases at once: one result per `(key, owner)` of
    /// `leases`, in the same order. A batch is not atomic; each lease is renewed (or not)
    /// on its own, as `renew` would. `Err` means the batch as a whole failed, and is then
    /// as ambiguous for every lease in it as the same error from `renew` for one.
    ///
    /// The renewal scheduler sends a client's due renewals through this in batches of at
    /// most [`RENEW_BATCH`](crate::RENEW_BATCH), so a store that sends a batch in one round trip (the Redis
    /// store does) renews 100,000 leases with a hundred round trips. A store without a
    /// batch has each renewal sent on its own, concurrently ([`renew_many`]).
    ///
    /// # Cancel safety
    /// As `renew`: a dropped call may have renewed any of the leases.
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError>;

    /// Whether [`acquire_any`](Self::acquire_any) is one atomic store call over all its
    /// keys (one Lua script on one Redis server), instead of the default's one call per
    /// key ([`acquire_any_one_by_one`]); then [`acquire_any_checked`](Self::acquire_any_checked)
    /// is one call too, check and acquire together. Either way the answers have the same
    /// meaning. Default: `false`.
    fn atomic_acquire_any(&self) -> bool {
        false
    }

    /// Takes one lease of several at once (a semaphore's permit: one of its slots):
    ///
    /// 1. if one of `keys` is held by `owner` already (an earlier call whose reply was
    ///    lost, or a reservation of a store that queues its waiters), extend it and return
    ///    it with its fence, as [`acquire`](Store::acquire) of that key would;
    /// 2. otherwise grant the first key, in the order given, that `acquire` would grant
    ///    (with a new fence, higher than every fence of that key);
    /// 3. otherwise answer [`AcquireAnyOutcome::Held`](crate::AcquireAnyOutcome::Held) with the shortest remaining TTL the
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
    /// until one is granted.
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
    /// [`put_record`](Store::put_record) at fence 0 would); if it then holds another
    /// value, nothing is acquired and the stored record is answered
    /// ([`CheckedAcquire::Refused`](crate::CheckedAcquire::Refused)); else the answer of `acquire_any`
    /// ([`CheckedAcquire::Passed`](crate::CheckedAcquire::Passed)). A semaphore checks its number of permits so.
    ///
    /// The default, [`acquire_any_checked_in_two_calls`], makes the two calls,
    /// `put_record` then `acquire_any`. A store whose `acquire_any` is one atomic call
    /// ([`atomic_acquire_any`](Self::atomic_acquire_any)) makes this one call too, check
    /// and acquire together.
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

/// The change notices of a store that has them ([`Store::watcher`]).
#[async_trait]
pub trait WatchStore: Store {
    /// Watches `key`: once this returns, the stream yields an item after every grant
    /// (a new holder, not an extension), release and break of the lease `key` and every
    /// write of the record `key` (see [`Changes`](crate::Changes)); several changes may share one item,
    /// and an item may come without a change. An expiry need not be notified: a watcher
    /// also reads again on a timer of its own (`Election::observe`: its interval).
    /// Watching changes nothing in the store and joins no queue of waiters (it must not
    /// hold up anyone acquiring `key`).
    ///
    /// # Cancel safety
    /// Cancel safe; dropping the stream ends the watch.
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError>;
}

/// The release notices of a store that has them ([`Store::waiter`]), for waiting
/// acquires.
#[async_trait]
pub trait WaitStore: Store {
    /// Returns when `key` may have become free for `owner` (released or expired, or
    /// handed to `owner` by a store that queues its waiters), or when `timeout` has
    /// passed, whichever is first; `Ok` either way. The caller re-checks by acquiring as
    /// `owner`, the owner whose acquire of `key` last answered `Held`.
    ///
    /// # Cancel safety
    /// Callers may drop it at any time (the client bounds every wait); it changes no
    /// lease.
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError>;

    /// As [`wait_released`](Self::wait_released), for a waiter that asks for `ttl`, on a
    /// store that may hand the lease over without a confirming acquire: it answers
    /// [`WaitOutcome::Granted`] when the store granted the lease to `owner` and told it
    /// so, with the send instant of the waiter's last request the store answered "still
    /// waiting" before the grant (see [`HandedGrant`](crate::HandedGrant); a store must never report a later
    /// one, such as a request it processed after the grant). Otherwise, and by default
    /// (stores that keep the confirming acquire), [`WaitOutcome::Retry`].
    ///
    /// # Cancel safety
    /// Callers may drop it at any time. A grant it was about to report stays with
    /// `owner` in the store (the caller's next acquire as `owner` finds it and extends
    /// it, with the same fence; the caller releases `owner` if it stops trying), or lapses
    /// at its TTL.
    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        let _ = ttl;
        self.wait_released(key, owner, timeout)
            .await
            .map(|()| WaitOutcome::Retry)
    }
}

/// [`BatchStore::renew_many`] of `store`'s batch; on a store without one, each renewal
/// sent on its own, all at once ([`Store::renew`] per lease, results in the order of
/// `leases`).
///
/// # Cancel safety
/// As [`BatchStore::renew_many`].
///
/// # Errors
/// The batch's error; without a batch, none (each renewal's error is its result).
pub async fn renew_many<S: Store + ?Sized>(
    store: &S,
    leases: &[(Key, OwnerToken)],
    ttl: Duration,
) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
    match store.batch() {
        Some(batch) => batch.renew_many(leases, ttl).await,
        None => Ok(renew_each(store, leases, ttl).await),
    }
}

/// Each renewal of `leases` sent on its own, all at once: the renewals of a store without
/// a batch.
pub(crate) async fn renew_each<S: Store + ?Sized>(
    store: &S,
    leases: &[(Key, OwnerToken)],
    ttl: Duration,
) -> Vec<Result<RenewOutcome, StoreError>> {
    futures::future::join_all(
        leases
            .iter()
            .map(|(key, owner)| store.renew(key, owner, ttl)),
    )
    .await
}

/// [`BatchStore::acquire_any`] of `store`'s batch; on a store without one,
/// [`acquire_any_one_by_one`].
///
/// # Cancel safety
/// As [`BatchStore::acquire_any`].
///
/// # Errors
/// The first error of a store call.
pub async fn acquire_any<S: Store + ?Sized>(
    store: &S,
    keys: &[Key],
    owner: &OwnerToken,
    ttl: Duration,
) -> Result<AcquireAnyOutcome, StoreError> {
    match store.batch() {
        Some(batch) => batch.acquire_any(keys, owner, ttl).await,
        None => acquire_any_one_by_one(store, keys, owner, ttl).await,
    }
}

/// [`BatchStore::acquire_any_checked`] of `store`'s batch; on a store without one,
/// [`acquire_any_checked_in_two_calls`].
///
/// # Cancel safety
/// As [`BatchStore::acquire_any_checked`].
///
/// # Errors
/// The first error of a store call.
pub async fn acquire_any_checked<S: Store + ?Sized>(
    store: &S,
    keys: &[Key],
    owner: &OwnerToken,
    ttl: Duration,
    check: RecordCheck<'_>,
) -> Result<CheckedAcquire, StoreError> {
    match store.batch() {
        Some(batch) => batch.acquire_any_checked(keys, owner, ttl, check).await,
        None => acquire_any_checked_in_two_calls(store, keys, owner, ttl, check).await,
    }
}

/// [`BatchStore::acquire_any_checked`] in two calls, for any store (the trait's default,
/// and what [`acquire_any_checked`] does on a store without a batch):
/// [`Store::put_record`] of the check's value at fence 0, then, if the record holds that
/// value, [`acquire_any`] (the store's own, or the one-by-one default). Not atomic: the record may change between the two.
///
/// # Cancel safety
/// As [`BatchStore::acquire_any_checked`].
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
    acquire_any(store, keys, owner, ttl)
        .await
        .map(CheckedAcquire::Passed)
}

/// [`BatchStore::acquire_any`] with one call per key, for any store (the trait's default,
/// and what [`acquire_any`] does on a store without a batch):
/// a [`renew_many`] of every key as `owner` finds a key `owner` holds already, which
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
/// As [`BatchStore::acquire_any`].
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
        let renewed = renew_many(store, &leases, ttl).await?;
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

/// Calls `acquire` (a [`Store::acquire`] of one key) on each of `keys` in order until one
/// answers `Acquired`: that key's position and grant; else `Held` with the shortest
/// remaining TTL reported. The first error ends it.
pub async fn first_granted<'k, F, Fut>(
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
    use crate::store::memory::MemoryStore;

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
        let got = acquire_any_one_by_one(&store, &ks, &me, ttl).await.unwrap();
        let AcquireAnyOutcome::Acquired {
            index: 1, fence, ..
        } = got
        else {
            panic!("the first free key in order: {got:?}");
        };
        // Key 0 is free again, key 1 is ours: ours is extended, key 0 is left alone.
        store.release(&ks[0], &other).await.unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        let again = acquire_any_one_by_one(&store, &ks, &me, ttl).await.unwrap();
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
        let got = acquire_any_one_by_one(&store, &ks, &me, ttl).await.unwrap();
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
            acquire_any_one_by_one(&store, &ks, &me, ttl).await.unwrap(),
            AcquireAnyOutcome::Held {
                remaining: Some(Duration::from_secs(3))
            }
        );
        assert_eq!(
            acquire_any_one_by_one(&store, &[], &me, ttl).await.unwrap(),
            AcquireAnyOutcome::Held { remaining: None },
            "nothing to grant"
        );
    }
}
