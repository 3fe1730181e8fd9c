//! Semaphores: at most N holders of one name at a time, each with its own lease, lost
//! signal and fence (Redisson's permit semaphore, Curator's `InterProcessSemaphoreV2`,
//! DistributedLock's semaphore).
//!
//! A semaphore `NAME` with N permits is N **slots**, each an ordinary lease keyed
//! `NAME#0` … `NAME#<N-1>`; a permit is the lease of one slot. So everything a lease
//! guarantees holds per slot on every store: one holder per slot (hence at most N per
//! name), a fence that rises with every grant of the slot, a lost signal, and a crashed
//! holder's permit coming back when its lease expires, not before. The fence is per
//! slot: guard writes with the **slot key** as the resource name
//! ([`Permit::key`]), never with the semaphore's name, or the N holders would reject
//! each other's writes.
//!
//! N is stored with the name (the [record](crate::Record) `semaphore/NAME`, written once
//! if absent, read back by every acquire): a caller asking for another N is refused with
//! [`Error::PermitsMismatch`] before it takes a slot, so every caller counts against the
//! same bound. To change N, use a new name. A store that loses its records (Redis
//! restarted without persistence) forgets N with them: the next caller's N is stored
//! then, and callers with another N are refused from their next acquire on (a permit
//! already held stays held).
//!
//! Taking a permit is one [`acquire_any`] over the slots,
//! rotated from a random start so that callers spread over them: the first free slot in
//! that order is granted. On a store that does it in one atomic call
//! ([`BatchStore::atomic_acquire_any`](crate::BatchStore::atomic_acquire_any): one Lua
//! script on a single Redis server or a Sentinel set) the check of N goes in the same call
//! ([`BatchStore::acquire_any_checked`](crate::BatchStore::acquire_any_checked)): one store call per
//! attempt, whatever N. Elsewhere N is checked with a record call of its own first, and the slots are tried with one `acquire` each, in that order, until
//! one is granted, as long as no reply has been lost (the caller then holds no slot);
//! after a lost reply the retry is the store's `acquire_any`, which first looks for the
//! slot the lost reply may have granted, so a caller never ends up with two. While all
//! slots are held it retries with jittered backoff bounded by the shortest remaining TTL
//! reported, until the wait ends. Waiters are not served in order (a permit freed goes to
//! whoever asks next), even on a store that queues the waiters of a single lease.
//!
//! The name is a semaphore's and nothing else's ([`kind`](crate::recipes::kind)): once a permit is
//! granted, one round trip more (two reads at once) checks that the lease `NAME` is free
//! and the record `election/NAME` absent; if not, the permit is released and the call
//! answers [`Error::KindMismatch`]. A handle's first acquire makes the same check before
//! its first store call, so that a semaphore refused on a lease's or an election's name
//! does not mark it as a semaphore's.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use leasehold_core::{Error, LeaseClient, LeaseConfig, memory::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
//! let exports = client.semaphore("export:tenant-42", 2)?;
//! let a = exports.acquire(Duration::from_secs(30)).await?;
//! let b = exports.acquire(Duration::from_secs(30)).await?;
//! assert_ne!(a.key(), b.key()); // two slots: guard each write with its own slot key
//! // A third must wait for a permit: here it gives up at once.
//! assert!(matches!(exports.try_acquire().await, Err(Error::WaitTimeout { .. })));
//! // Everyone must agree on the number of permits.
//! assert!(matches!(
//!     client.semaphore("export:tenant-42", 3)?.try_acquire().await,
//!     Err(Error::PermitsMismatch { stored: 2, asked: 3, .. })
//! ));
//! a.release().await?;
//! let c = exports.try_acquire().await?;
//! # drop((b, c)); Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;

use crate::error::{Error, StoreError, StoreErrorKind};
use crate::key::{IntoKey, Key};
use crate::lease::{AcquireStep, LeaseClient, StepCall};
use crate::lease::{Lease, LostSignal};
use crate::store::{
    AcquireAnyOutcome, CheckedAcquire, RecordCheck, acquire_any, acquire_any_checked, first_granted,
};
use crate::store::{LeaseInfo, Record};
use crate::token::Fence;

/// The most permits a semaphore may have (each is a slot a waiting caller may try).
pub const MAX_PERMITS: u32 = 1024;

/// A semaphore: a name and its number of permits. Cheap to clone.
#[derive(Clone)]
pub struct Semaphore {
    client: LeaseClient,
    name: Key,
    permits: u32,
    slots: Arc<[Key]>,
    record: Key,
    /// Whether an acquire of this handle found the name a semaphore's (its kind checked
    /// after a grant): later acquires skip the check before their first store call.
    confirmed: Arc<AtomicBool>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// One permit: the lease of one slot of the semaphore. Dropping it releases the slot in
/// the background, as dropping a [`Lease`] does.
#[derive(Debug)]
pub struct Permit {
    lease: Lease,
    slot: u32,
}

impl Permit {
    /// The slot this permit holds (`0..permits`).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's lease key, `NAME#SLOT`: the resource name to guard this holder's writes
    /// with (the fence is per slot).
    pub fn key(&self) -> &Key {
        self.lease.key()
    }

    /// The fence of this grant of the slot.
    pub fn fence(&self) -> Fence {
        self.lease.fence()
    }

    /// The slot's lease (deadline, [`Lease::run`], ...).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Fires when the permit is lost (the slot's lease's [`Lease::lost`]).
    pub fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    /// The lease, to hand to code that takes one.
    pub fn into_lease(self) -> Lease {
        self.lease
    }

    /// Gives the permit back. `Ok(false)` when it had already been lost.
    ///
    /// # Cancel safety
    /// As [`Lease::release`].
    pub async fn release(self) -> Result<bool, Error> {
        self.lease.release().await
    }
}

impl LeaseClient {
    /// The semaphore `name` with `permits` permits.
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] for 0 or more than [`MAX_PERMITS`]; [`Error::InvalidKey`]
    /// for a name that is not a valid key or too long to name its slots.
    pub fn semaphore(&self, name: impl IntoKey, permits: u32) -> Result<Semaphore, Error> {
        let name = name.into_key()?;
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::InvalidPermits {
                permits,
                max: MAX_PERMITS,
            });
        }
        let slots = (0..permits)
            .map(|i| Key::new(format!("{name}#{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let record = Key::new(format!("semaphore/{name}"))?;
        Ok(Semaphore {
            client: self.clone(),
            name,
            permits,
            slots: slots.into(),
            record,
            confirmed: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &Key {
        &self.name
    }

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The lease key of `slot` (`NAME#SLOT`), if `slot < permits`.
    pub fn slot_key(&self, slot: u32) -> Option<&Key> {
        self.slots.get(slot as usize)
    }

    /// Takes a permit if one is free now.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LeaseClient::try_acquire`].
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] (all permits held), [`Error::PermitsMismatch`], and the
    /// errors of [`LeaseClient::try_acquire`].
    pub async fn try_acquire(&self) -> Result<Permit, Error> {
        self.acquire(Duration::ZERO).await
    }

    /// Takes a permit, waiting up to `wait` (`Duration::MAX`: as long as it takes) while
    /// all are held.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no permit behind (as
    /// [`LeaseClient::try_acquire`]).
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] (all permits still held when the wait ended),
    /// [`Error::PermitsMismatch`] (the store holds another N for this name),
    /// [`Error::KindMismatch`] (the name is a lease's or an election's: see
    /// [`kind`](crate::recipes::kind)),
    /// [`Error::Store`] (the last retryable error when the wait ended),
    /// [`Error::ShuttingDown`].
    pub async fn acquire(&self, wait: Duration) -> Result<Permit, Error> {
        let started = Instant::now();
        let deadline = crate::clock::saturating_add(started, wait);
        let store = self.client.store();
        let atomic = store.batch().is_some_and(|b| b.atomic_acquire_any());
        // Checked on every acquire, not once per handle: a store that lost the record
        // (Redis restarted without persistence) may have taken another caller's N since.
        // Where the store takes any of the slots in one atomic call, the check goes in
        // that call (`acquire_any_checked`: one call per attempt); elsewhere it is a call
        // of its own first. A retryable failure (a timeout under load) is retried until
        // the deadline.
        let value = self.permits.to_string();
        let check = atomic.then_some(RecordCheck {
            key: &self.record,
            value: value.as_bytes(),
        });
        // A name in use as a lease or an election is refused before this handle's first
        // acquire can write the record that makes it a semaphore's (`crate::recipes::kind`).
        if !self.confirmed.load(Ordering::Relaxed) {
            self.client
                .check_semaphore_kind(&self.name, deadline)
                .await?;
        }
        let mut attempt = 0u32;
        while check.is_none() {
            match self.check_permits(&value).await {
                Ok(()) => break,
                Err(Error::Store(e)) if e.is_retryable() && Instant::now() < deadline => {
                    let delay = self.client.backoff_delay(attempt);
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(delay.min(left)).await;
                    attempt = attempt.saturating_add(1);
                }
                Err(e) => return Err(e),
            }
        }
        // One attempt per round over every slot (one `acquire_any` where the store does it
        // atomically), rotated from a random start so that callers spread over the slots;
        // the client waits between rounds.
        let n = self.permits as usize;
        let first = self.client.random_below(self.permits) as usize;
        let keys: Vec<Key> = (0..n)
            .map(|i| self.slots[(first + i) % n].clone())
            .collect();
        let left = deadline.saturating_duration_since(Instant::now());
        let step = Slots {
            semaphore: self,
            keys: &keys,
            check,
            atomic,
        };
        let permit = match self.client.acquire_with(&step, Some(left)).await {
            Ok((lease, index)) => Permit {
                lease,
                slot: ((first + index) % n) as u32,
            },
            Err(Error::WaitTimeout { key, .. }) => {
                return Err(Error::WaitTimeout {
                    key,
                    waited: started.elapsed(),
                });
            }
            Err(e) => return Err(e),
        };
        // A lease (or an election) must not hold the name: checked now that the record is
        // in the store, so that a lease taken at the same moment sees it (`crate::recipes::kind`).
        let valid_until = permit.lease.valid_until();
        if let Err(e) = self
            .client
            .check_semaphore_kind(&self.name, valid_until)
            .await
        {
            // Not released (a timeout): dropping the lease releases it in the background.
            let _ = permit.release().await;
            return Err(e);
        }
        self.confirmed.store(true, Ordering::Relaxed);
        Ok(permit)
    }

    /// The permits held now: `(slot, holder)` for each held slot.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn holders(&self) -> Result<Vec<(u32, LeaseInfo)>, Error> {
        let store = self.client.store();
        let limit = self.client.config().op_timeout();
        let mut out = Vec::new();
        for (slot, key) in (0u32..).zip(self.slots.iter()) {
            let call = store.inspect(key);
            if let Some(info) = StoreError::bounded(store.backend(), "inspect", limit, call).await?
            {
                out.push((slot, info));
            }
        }
        Ok(out)
    }

    /// Stores N (`value`, in decimal) with the name if absent; refuses a caller whose N
    /// differs.
    async fn check_permits(&self, value: &str) -> Result<(), Error> {
        let store = self.client.store();
        let limit = self.client.config().op_timeout();
        let call = store.put_record(&self.record, Fence(0), value.as_bytes());
        let stored = StoreError::bounded(store.backend(), "put record", limit, call).await?;
        if stored.value == value.as_bytes() {
            return Ok(());
        }
        Err(mismatch(
            &self.name,
            &self.record,
            self.permits,
            &stored,
            store.backend(),
        ))
    }
}

/// A permit's acquire step: one of the slots, with the check of N where the store takes
/// any slot in one atomic call.
struct Slots<'a> {
    semaphore: &'a Semaphore,
    /// The slots, in the order to try them.
    keys: &'a [Key],
    /// The semaphore's record and N as it is stored, checked in the same store call.
    check: Option<RecordCheck<'a>>,
    /// Whether the store takes any of the slots in one atomic call.
    atomic: bool,
}

#[async_trait]
impl AcquireStep for Slots<'_> {
    fn name(&self) -> &Key {
        &self.semaphore.name
    }

    fn keys(&self) -> &[Key] {
        self.keys
    }

    /// One `acquire_any_checked` with a check; else one `acquire_any` where it is atomic
    /// or after a lost reply (the owner's slot must be found first); else one `acquire`
    /// per slot in order (an owner that has had only `Held` answers holds none).
    async fn attempt(&self, call: &StepCall<'_>) -> Result<AcquireAnyOutcome, Error> {
        let (store, owner, ttl) = (call.store(), call.owner(), call.ttl());
        if let Some(check) = self.check {
            let checked = acquire_any_checked(store, self.keys, owner, ttl, check);
            return match call.bounded("acquire", checked).await? {
                CheckedAcquire::Passed(outcome) => Ok(outcome),
                CheckedAcquire::Refused(stored) => Err(mismatch(
                    &self.semaphore.name,
                    check.key,
                    self.semaphore.permits,
                    &stored,
                    store.backend(),
                )),
            };
        }
        let outcome = if call.may_hold() || self.atomic {
            call.bounded("acquire", acquire_any(store, self.keys, owner, ttl))
                .await
        } else {
            first_granted(self.keys, |key| {
                call.bounded("acquire", store.acquire(key, owner, ttl))
            })
            .await
        };
        Ok(outcome?)
    }
}

/// The error for a semaphore record that does not hold `permits` as this crate writes it
/// (decimal): [`Error::PermitsMismatch`] for another number, `Corrupt` for anything else.
fn mismatch(
    name: &Key,
    record: &Key,
    permits: u32,
    stored: &Record,
    backend: &'static str,
) -> Error {
    let number = std::str::from_utf8(&stored.value)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|n| n.to_string().as_bytes() == stored.value.as_slice() && *n != permits);
    match number {
        Some(stored) => Error::PermitsMismatch {
            name: name.clone(),
            stored,
            asked: permits,
        },
        None => StoreError::new(
            StoreErrorKind::Corrupt,
            backend,
            format!("the record `{record}` does not hold a number of permits"),
        )
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::config::LeaseConfig;
    use crate::recipes::test_client as client;
    use crate::store::Store;
    use crate::store::memory::MemoryStore;
    use crate::token::OwnerToken;

    #[tokio::test(start_paused = true)]
    async fn at_most_n_holders_and_slots_are_exclusive() {
        let store = MemoryStore::new();
        let sem = client(&store).semaphore("sem:n", 3).unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
                tokio::spawn(async move {
                    let p = sem.acquire(Duration::from_secs(600)).await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    p.release().await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            3,
            "never more than N, and N reached"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn permits_are_checked_against_the_store() {
        let store = MemoryStore::new();
        let c = client(&store);
        assert!(matches!(
            c.semaphore("sem:x", 0),
            Err(Error::InvalidPermits { .. })
        ));
        assert!(matches!(
            c.semaphore("sem:x", MAX_PERMITS + 1),
            Err(Error::InvalidPermits { .. })
        ));
        let two = c.semaphore("sem:x", 2).unwrap();
        let p = two.try_acquire().await.unwrap();
        let err = c
            .semaphore("sem:x", 5)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::PermitsMismatch {
                    stored: 2,
                    asked: 5,
                    ..
                }
            ),
            "{err}"
        );
        // A record that is not a number is reported, not parsed as something else.
        store
            .put_record(&Key::new("semaphore/sem:bad").unwrap(), Fence(0), b"two")
            .await
            .unwrap();
        let err = c
            .semaphore("sem:bad", 2)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err();
        assert_eq!(
            err.store_error().map(|e| e.kind()),
            Some(StoreErrorKind::Corrupt)
        );
        p.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn every_acquire_checks_the_stored_number_of_permits() {
        let store = MemoryStore::new();
        let c = client(&store);
        let two = c.semaphore("sem:lost", 2).unwrap();
        two.try_acquire().await.unwrap().release().await.unwrap();
        // The store loses its records (a restart without persistence): the next caller's
        // N is stored, and the handle that checked 2 before is refused from now on.
        store.forget_record(&Key::new("semaphore/sem:lost").unwrap());
        let three = c.semaphore("sem:lost", 3).unwrap();
        three.try_acquire().await.unwrap().release().await.unwrap();
        let err = two.try_acquire().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::PermitsMismatch {
                    stored: 3,
                    asked: 2,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_unreachable_for_a_while_is_waited_out_not_reported() {
        use crate::wrap::{FaultStore, Unreachable};
        let faulty = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
        faulty.set_unreachable(Some(Unreachable::Refuse));
        let c = LeaseClient::new(
            faulty.clone(),
            LeaseConfig::new(Duration::from_secs(3)).unwrap(),
        );
        let sem = c.semaphore("sem:down", 2).unwrap();
        let err = sem.try_acquire().await.unwrap_err();
        assert!(
            err.is_retryable(),
            "no wait: the store's error, retryable: {err}"
        );
        let restore = {
            let faulty = faulty.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                faulty.set_unreachable(None);
            })
        };
        let p = sem.acquire(Duration::from_secs(30)).await.unwrap();
        restore.await.unwrap();
        p.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_permit_returns_after_its_ttl_only() {
        let store = MemoryStore::new();
        let c = client(&store);
        let sem = c.semaphore("sem:crash", 1).unwrap();
        let p = sem.try_acquire().await.unwrap();
        let fence = p.fence();
        p.into_lease().abandon(); // the holder "crashed": not renewed, not released
        let err = sem.acquire(Duration::from_secs(2)).await.unwrap_err();
        assert!(matches!(err, Error::WaitTimeout { .. }), "{err}");
        let again = sem.acquire(Duration::from_secs(10)).await.unwrap();
        assert!(again.fence() > fence, "fences per slot rise");
        assert_eq!(sem.holders().await.unwrap().len(), 1);
    }

    /// Random numbers that are all zero: a semaphore starts at slot 0.
    struct Zeros;

    impl rand::RngCore for Zeros {
        fn next_u32(&mut self) -> u32 {
            0
        }
        fn next_u64(&mut self) -> u64 {
            0
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            dst.fill(0);
        }
    }

    /// A semaphore of 3 on a fault-injecting memory store, whose slot 0 another owner
    /// holds, tried from slot 0: a permit is granted slot 1.
    async fn faulty_semaphore() -> (Arc<crate::wrap::FaultStore>, Semaphore, OwnerToken) {
        let faulty = Arc::new(crate::wrap::FaultStore::new(Arc::new(MemoryStore::new())));
        let cfg = LeaseConfig::new(Duration::from_secs(3)).unwrap();
        let sem = LeaseClient::with_rng(faulty.clone(), cfg, Zeros)
            .semaphore("sem:faulty", 3)
            .unwrap();
        let other = OwnerToken::random();
        faulty
            .acquire(sem.slot_key(0).unwrap(), &other, Duration::from_secs(60))
            .await
            .unwrap();
        (faulty, sem, other)
    }

    /// Who holds each slot.
    async fn slot_owners(store: &dyn Store, sem: &Semaphore) -> Vec<Option<OwnerToken>> {
        let mut out = Vec::new();
        for slot in 0..sem.permits() {
            let info = store.inspect(sem.slot_key(slot).unwrap()).await.unwrap();
            out.push(info.map(|i| i.owner));
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn slots_are_tried_one_by_one_until_a_reply_is_lost() {
        use crate::wrap::{Injection, Op};
        let (faulty, sem, other) = faulty_semaphore().await;
        // The memory store has no atomic acquire_any: a caller that has lost no reply
        // holds no slot, so it tries them with plain acquires and never calls it.
        assert!(!faulty.batch().unwrap().atomic_acquire_any());
        for _ in 0..3 {
            faulty.inject(Op::AcquireAny, Injection::HangBeforeApply);
        }
        let p = sem.try_acquire().await.unwrap();
        assert_eq!(p.slot(), 1);
        assert_eq!(
            slot_owners(&*faulty, &sem).await,
            vec![Some(other), Some(*p.lease().owner()), None]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_lost_reply_the_owners_slot_is_taken_again_not_a_freed_one() {
        use crate::store::AcquireAnyOutcome;
        use crate::wrap::{Injection, Op, Swallowed};
        let (faulty, sem, other) = faulty_semaphore().await;
        // Slot 0's `Held` is lost: from then on the owner may hold a slot, so the retry
        // is one `acquire_any`, which grants slot 1 and never answers. Meanwhile slot 0
        // is freed; the next retry must return slot 1 (the owner's, same fence), not
        // take slot 0 as well.
        faulty.inject(Op::Acquire, Injection::AmbiguousAfterApply);
        faulty.inject(Op::AcquireAny, Injection::HangAfterApply);
        let freer = {
            let (faulty, slot0) = (faulty.clone(), sem.slot_key(0).unwrap().clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                faulty.release(&slot0, &other).await.unwrap();
            })
        };
        let p = sem.try_acquire().await.unwrap();
        freer.await.unwrap();
        let swallowed = faulty.take_swallowed();
        assert!(
            matches!(
                swallowed[..],
                [
                    Swallowed::Acquire(Ok(crate::store::AcquireOutcome::Held { .. })),
                    Swallowed::AcquireAny(Ok(AcquireAnyOutcome::Acquired { index: 1, fence, .. }))
                ] if fence == p.fence()
            ),
            "the retry returns the grant whose reply was lost: {swallowed:?} vs {}",
            p.fence()
        );
        assert_eq!(p.slot(), 1);
        assert_eq!(
            slot_owners(&*faulty, &sem).await,
            vec![None, Some(*p.lease().owner()), None],
            "one slot for the permit"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_acquire_never_answered_releases_its_owner_on_every_slot() {
        use crate::wrap::{Injection, Op};
        let (faulty, sem, other) = faulty_semaphore().await;
        // The first attempt (slot 0: held) and its two retries (slot 1 granted, then
        // extended) are applied and never answered.
        faulty.inject(Op::Acquire, Injection::HangAfterApply);
        for _ in 0..2 {
            faulty.inject(Op::AcquireAny, Injection::HangAfterApply);
        }
        let err = sem.try_acquire().await.unwrap_err();
        assert_eq!(
            err.store_error().map(|e| e.kind()),
            Some(StoreErrorKind::Timeout),
            "{err}"
        );
        assert_eq!(faulty.take_swallowed().len(), 3);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            slot_owners(&*faulty, &sem).await,
            vec![Some(other), None, None],
            "the slot granted without a reply is released, the other holder's is not"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_refused_after_a_lost_reply_releases_the_slot_that_reply_granted() {
        use crate::wrap::{FaultStore, Injection, Op, Swallowed};
        let memory = Arc::new(MemoryStore::new());
        let faulty = Arc::new(FaultStore::new(memory.clone()));
        // The client takes the atomic path: the check of N rides in each attempt's
        // `acquire_any_checked` (here the default's two calls).
        faulty.claim_atomic_acquire_any();
        let cfg = LeaseConfig::new(Duration::from_secs(3)).unwrap();
        let sem = LeaseClient::with_rng(faulty.clone(), cfg, Zeros)
            .semaphore("sem:checked", 3)
            .unwrap();
        let other = OwnerToken::random();
        faulty
            .acquire(sem.slot_key(0).unwrap(), &other, Duration::from_secs(60))
            .await
            .unwrap();
        // The first attempt writes N = 3 and is granted slot 1, but its reply is lost.
        // Meanwhile the record is lost and another caller stores N = 2: the retry's check
        // is refused, and the slot the lost reply granted must not stay held.
        faulty.inject(Op::AcquireAny, Injection::HangAfterApply);
        let changer = {
            let memory = memory.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let record = Key::new("semaphore/sem:checked").unwrap();
                memory.forget_record(&record);
                memory.put_record(&record, Fence(0), b"2").await.unwrap();
            })
        };
        let err = sem.try_acquire().await.unwrap_err();
        changer.await.unwrap();
        assert!(
            matches!(
                err,
                Error::PermitsMismatch {
                    stored: 2,
                    asked: 3,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            matches!(
                faulty.take_swallowed()[..],
                [Swallowed::AcquireAny(Ok(
                    crate::store::AcquireAnyOutcome::Acquired { index: 1, .. }
                ))]
            ),
            "setup: slot 1 granted without a reply"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            slot_owners(&*faulty, &sem).await,
            vec![Some(other), None, None],
            "the slot granted without a reply is released after the refused check"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_permit_acquire_releases_its_owner_on_every_slot() {
        use crate::wrap::{Injection, Op};
        let (faulty, sem, other) = faulty_semaphore().await;
        faulty.inject(Op::Acquire, Injection::AmbiguousAfterApply);
        faulty.inject(Op::AcquireAny, Injection::HangAfterApply);
        let res = tokio::time::timeout(Duration::from_millis(100), sem.try_acquire()).await;
        assert!(res.is_err(), "cancelled while the call hangs");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            slot_owners(&*faulty, &sem).await,
            vec![Some(other), None, None],
            "the slot granted to the cancelled call is released"
        );
    }
}
