//! The suite must be able to fail. Each broken store below has one deliberate flaw; the
//! hand-written table [`KILLS`] says which case each flaw must make fail and at which
//! assertion (a words of its panic message), and the tests check both: a case that passes
//! against its broken store, or fails for another reason (a setup panic, another
//! assertion), fails the test. [`every_case_is_killed`] fails when a case of the suite is
//! killed by no broken store; [`the_hand_written_list_is_the_suite`] compares the
//! hand-written list of cases with the one the suite's macros generate tests from.
//!
//! Most broken stores wrap the in-memory store. The holder-process case (`kill -9`) and
//! the fault cases need a store that another process can open and that a fault proxy can
//! sit in front of: their broken stores wrap a Redis store on a private `redis-server`.

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use leasehold_conformance::{CASES, FAULT_CASES, Faults, FencedWrites, Fixture, Network, Queue};
use leasehold_core::memory::MemoryStore;
use leasehold_core::wrap::{FaultStore, Unreachable};
use leasehold_core::{
    AcquireAnyOutcome, AcquireOutcome, BatchStore, Capabilities, Changes, CheckedAcquire, Fence,
    FenceDurability, Key, LeaseInfo, OwnerToken, Record, RecordCheck, ReleaseOutcome, RenewOutcome,
    Store, StoreError, WaitOutcome, WaitStore, WatchStore,
};
use leasehold_redis::{RedisConfigBuilder, RedisStore};
use leasehold_testkit::{FaultProxy, RedisServer};

// ---------------------------------------------------------------------------------------
// The flaws.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Flaw {
    /// Every grant gets fence 1.
    FenceNeverAdvances,
    /// Renew and release succeed for any owner.
    AnyOwner,
    /// Leases never expire.
    IgnoresExpiry,
    /// Acquire reads, then writes: it checks that the key is free, waits a little (a
    /// widened race window, so the race is lost every time, not by luck), then overwrites
    /// whatever lease came in between.
    RacyAcquire,
    /// A same-owner acquire (a retry after an ambiguous reply) issues a new fence: every
    /// acquire re-grants the lease after it is granted.
    NewFenceOnRetry,
    /// Renew answers `Renewed` without asking the store.
    RenewDoesNothing,
    /// A batch renewal answers in the wrong order (its results reversed).
    BatchMisorders,
    /// Renew of a lease that expired (and nobody else took) grants it again.
    RenewAfterOwnExpiry,
    /// Inspect answers from a cache of grants that never sees releases or expiry.
    InspectLies,
    /// List leaves out the last lease.
    ListMisses,
    /// The capabilities claim the remaining TTL is reported, but it is not.
    ClaimsTooMuch,
    /// TTLs out of range are clamped into range instead of refused.
    AcceptsAnyTtl,
    /// The storage-side guard accepts every fence (the store itself is sound).
    GuardIgnoresFence,
    /// The store keeps a lease for a quarter of the TTL it reports.
    ExpiresEarly,
    /// Each call is given 200 ms; a call that fails or takes longer is answered with a guess
    /// ("free", "not yours") instead of an error.
    GuessesWhenUnreachable,
    /// The fixture does not declare whether other processes can open the store: the case
    /// that needs a holder process must fail, not skip.
    Undeclared,
    /// The capabilities claim durable fences for a store in process memory.
    ClaimsDurableFences,
    /// The capabilities claim first-come-first-served waiting, but a woken waiter waits
    /// longer the earlier it arrived (last come, first served).
    ClaimsFifo,
    /// `put_record` overwrites whatever is stored, whatever its fence.
    RecordIgnoresFence,
    /// The watch is set up but never tells of a change.
    WatchMisses,
    /// The store passes on no watcher (as a wrapper that forgets to forward its inner
    /// store's), while its fixture declares one. (The old flaw "the capabilities deny
    /// watching, but the store watches" cannot be written any more: a store without a
    /// watcher has no `watch` to call.)
    DropsWatcher,
    /// `acquire_any` acquires each key in order without first looking for one the owner
    /// holds: after a lost reply the owner may end up with two keys.
    AcquireAnyIgnoresOwner,
    /// `acquire_any_checked` writes an absent record but acquires whatever value the
    /// record holds.
    CheckIgnoresRecord,
    /// `get_record` reads a copy that lags [`RECORD_LAG`] behind the writes (as a read
    /// from a lagging replica would): a record just written reads as absent.
    RecordReadsLag,
    /// Acquire grants a held key to another owner (it breaks the holder's lease first).
    GrantsHeld,
    /// `wait_released` is never woken by a release: it returns at its timeout only.
    NeverWakes,
    /// The client counts the validity window from the reply, not the send: the store
    /// grants three quarters of the TTL asked and reports as granted that plus the time
    /// the call took, so the client's deadline (send + validity of the reported TTL) is
    /// the reply + the validity of what was granted.
    ValidityFromReply,
    /// `diagnose` judges a row that is no fault of `docs/guarantees.md` ("split brain"),
    /// and one row twice.
    DiagnosisInventsRows,
    /// The capabilities claim `hands_off`, but the waiter is never handed the lease: it
    /// confirms with an acquire.
    ClaimsHandOff,
    /// A hand-off's validity counts from the notice's arrival, not from a request the
    /// store answered "still waiting" before the grant.
    HandOffFromNotice,
    /// A renewal keeps the TTL the lease was granted with (as etcd's keep-alive does)
    /// while it answers the TTL asked, and the capabilities claim `sets_expiry` (the
    /// memory store's claim, kept).
    RenewKeepsGrantedTtl,
}

impl Flaw {
    const ALL: [Flaw; 31] = [
        Flaw::FenceNeverAdvances,
        Flaw::AnyOwner,
        Flaw::IgnoresExpiry,
        Flaw::RacyAcquire,
        Flaw::NewFenceOnRetry,
        Flaw::RenewDoesNothing,
        Flaw::BatchMisorders,
        Flaw::RenewAfterOwnExpiry,
        Flaw::InspectLies,
        Flaw::ListMisses,
        Flaw::ClaimsTooMuch,
        Flaw::AcceptsAnyTtl,
        Flaw::GuardIgnoresFence,
        Flaw::ExpiresEarly,
        Flaw::GuessesWhenUnreachable,
        Flaw::Undeclared,
        Flaw::ClaimsDurableFences,
        Flaw::ClaimsFifo,
        Flaw::RecordIgnoresFence,
        Flaw::WatchMisses,
        Flaw::DropsWatcher,
        Flaw::AcquireAnyIgnoresOwner,
        Flaw::CheckIgnoresRecord,
        Flaw::RecordReadsLag,
        Flaw::GrantsHeld,
        Flaw::NeverWakes,
        Flaw::ValidityFromReply,
        Flaw::DiagnosisInventsRows,
        Flaw::ClaimsHandOff,
        Flaw::HandOffFromNotice,
        Flaw::RenewKeepsGrantedTtl,
    ];

    fn parse(s: &str) -> Flaw {
        *Self::ALL
            .iter()
            .find(|f| format!("{f:?}") == s)
            .unwrap_or_else(|| panic!("no flaw {s}"))
    }
}

/// Far beyond any test.
const FOREVER: Duration = Duration::from_secs(24 * 60 * 60);
/// The window between the read and the write of [`Flaw::RacyAcquire`]: every contender of
/// the exclusion case reads "free" before the first one writes.
const RACE_WINDOW: Duration = Duration::from_millis(20);
/// How long [`Flaw::GuessesWhenUnreachable`] gives a call.
const GUESS_AFTER: Duration = Duration::from_millis(200);
/// How far the record reads of [`Flaw::RecordReadsLag`] lag behind the writes.
const RECORD_LAG: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Broken {
    inner: Arc<dyn Store>,
    flaw: Flaw,
    /// The grants seen, for [`Flaw::InspectLies`].
    cache: Mutex<HashMap<Key, LeaseInfo>>,
    /// The order in which owners first waited: the broken store's queue, as the suite
    /// reads it ([`Queue`]), and the order [`Flaw::ClaimsFifo`] reverses.
    arrivals: Mutex<HashMap<OwnerToken, u32>>,
    /// The records written blindly, for [`Flaw::RecordIgnoresFence`].
    records: Mutex<HashMap<Key, Record>>,
    /// When each record was first written, for [`Flaw::RecordReadsLag`].
    written: Mutex<HashMap<Key, tokio::time::Instant>>,
    /// The TTL each key was last granted, for [`Flaw::RenewKeepsGrantedTtl`].
    granted: Mutex<HashMap<Key, Duration>>,
}

impl Broken {
    fn new(inner: Arc<dyn Store>, flaw: Flaw) -> Self {
        Self {
            inner,
            flaw,
            cache: Mutex::new(HashMap::new()),
            arrivals: Mutex::new(HashMap::new()),
            records: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            granted: Mutex::new(HashMap::new()),
        }
    }

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

    /// The TTL the store really sets.
    fn ttl(&self, ttl: Duration) -> Duration {
        let valid = StoreError::check_ttl("broken", ttl).is_ok();
        match self.flaw {
            Flaw::IgnoresExpiry if valid => FOREVER,
            Flaw::ExpiresEarly if valid => (ttl / 4).max(leasehold_core::config::MIN_TTL),
            Flaw::AcceptsAnyTtl => ttl.clamp(
                leasehold_core::config::MIN_TTL,
                leasehold_core::config::MAX_TTL,
            ),
            _ => ttl,
        }
    }

    async fn guess<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
        guess: T,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(GUESS_AFTER, call).await {
            Ok(Ok(v)) => Ok(v),
            _ => Ok(guess),
        }
    }

    async fn acquire_inner(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        match self.flaw {
            Flaw::RacyAcquire => match self.inner.inspect(key).await? {
                Some(info) if info.owner != *owner => Ok(AcquireOutcome::Held {
                    remaining: info.remaining,
                }),
                Some(_) => self.inner.acquire(key, owner, ttl).await,
                None => {
                    tokio::time::sleep(RACE_WINDOW).await;
                    // The blind write: whatever was granted in between is overwritten.
                    self.inner.break_lease(key).await?;
                    self.inner.acquire(key, owner, ttl).await
                }
            },
            Flaw::NewFenceOnRetry => match self.inner.acquire(key, owner, ttl).await? {
                AcquireOutcome::Acquired { .. } => {
                    self.inner.break_lease(key).await?;
                    self.inner.acquire(key, owner, ttl).await
                }
                held => Ok(held),
            },
            Flaw::GuessesWhenUnreachable => {
                self.guess(
                    self.inner.acquire(key, owner, ttl),
                    AcquireOutcome::Held { remaining: None },
                )
                .await
            }
            Flaw::GrantsHeld => match self.inner.acquire(key, owner, ttl).await? {
                AcquireOutcome::Held { .. } => {
                    self.inner.break_lease(key).await?;
                    self.inner.acquire(key, owner, ttl).await
                }
                granted => Ok(granted),
            },
            Flaw::ValidityFromReply => {
                let started = tokio::time::Instant::now();
                let granted = (ttl - ttl / 4).max(leasehold_core::config::MIN_TTL);
                match self.inner.acquire(key, owner, granted).await? {
                    AcquireOutcome::Acquired { fence, ttl } => Ok(AcquireOutcome::Acquired {
                        fence,
                        ttl: ttl + started.elapsed(),
                    }),
                    held => Ok(held),
                }
            }
            _ => self.inner.acquire(key, owner, ttl).await,
        }
    }
}

use std::future::Future;

#[async_trait]
impl Store for Broken {
    fn backend(&self) -> &'static str {
        "broken"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.flaw == Flaw::ClaimsDurableFences {
            caps.fence_durability = FenceDurability::Durable;
        }
        if self.flaw == Flaw::ClaimsFifo {
            caps.fifo_wait = true;
        }
        // Its waits answer `Retry` (through `wait_released`), except with the flaw that
        // hands off (wrongly).
        caps.hands_off = match self.flaw {
            Flaw::ClaimsHandOff => true,
            Flaw::HandOffFromNotice => caps.hands_off,
            _ => false,
        };
        caps
    }

    /// Always: its batch renewals, `acquire_any` and `acquire_any_checked` run through
    /// its own (possibly flawed) calls.
    fn batch(&self) -> Option<&dyn BatchStore> {
        Some(self)
    }

    fn watcher(&self) -> Option<&dyn WatchStore> {
        if self.flaw == Flaw::DropsWatcher {
            return None;
        }
        self.inner.watcher().map(|_| self as &dyn WatchStore)
    }

    fn waiter(&self) -> Option<&dyn WaitStore> {
        self.inner.waiter().map(|_| self as &dyn WaitStore)
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let out = self.acquire_inner(key, owner, self.ttl(ttl)).await?;
        if let AcquireOutcome::Acquired { ttl, .. } = out {
            self.granted.lock().unwrap().insert(key.clone(), ttl);
        }
        Ok(match (self.flaw, out) {
            (Flaw::FenceNeverAdvances, AcquireOutcome::Acquired { ttl, .. }) => {
                AcquireOutcome::Acquired {
                    fence: Fence(1),
                    ttl,
                }
            }
            (
                Flaw::IgnoresExpiry | Flaw::ExpiresEarly | Flaw::AcceptsAnyTtl,
                AcquireOutcome::Acquired { fence, .. },
            ) => AcquireOutcome::Acquired { fence, ttl },
            (Flaw::InspectLies, out @ AcquireOutcome::Acquired { fence, .. }) => {
                let info = LeaseInfo {
                    key: key.clone(),
                    owner: *owner,
                    fence,
                    remaining: Some(ttl),
                };
                self.cache.lock().unwrap().insert(key.clone(), info);
                out
            }
            (Flaw::ClaimsTooMuch, AcquireOutcome::Held { .. }) => {
                AcquireOutcome::Held { remaining: None }
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
        let mut real_ttl = self.ttl(ttl);
        if self.flaw == Flaw::RenewKeepsGrantedTtl
            && let Some(granted) = self.granted.lock().unwrap().get(key)
        {
            real_ttl = *granted;
        }
        let out = match self.flaw {
            Flaw::RenewDoesNothing => {
                StoreError::check_ttl("broken", ttl)?;
                RenewOutcome::Renewed { ttl }
            }
            Flaw::GuessesWhenUnreachable => {
                self.guess(
                    self.inner.renew(key, owner, real_ttl),
                    RenewOutcome::NotOwner,
                )
                .await?
            }
            Flaw::RenewAfterOwnExpiry => match self.inner.renew(key, owner, real_ttl).await? {
                RenewOutcome::NotOwner if self.inner.inspect(key).await?.is_none() => {
                    match self.inner.acquire(key, owner, real_ttl).await? {
                        AcquireOutcome::Acquired { ttl, .. } => RenewOutcome::Renewed { ttl },
                        AcquireOutcome::Held { .. } => RenewOutcome::NotOwner,
                    }
                }
                out => out,
            },
            _ => {
                let owner = self.as_owner(key, owner).await;
                self.inner.renew(key, &owner, real_ttl).await?
            }
        };
        Ok(match out {
            RenewOutcome::Renewed { .. } => RenewOutcome::Renewed { ttl },
            o => o,
        })
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        if self.flaw == Flaw::GuessesWhenUnreachable {
            return self
                .guess(self.inner.release(key, owner), ReleaseOutcome::NotOwner)
                .await;
        }
        let owner = self.as_owner(key, owner).await;
        self.inner.release(key, &owner).await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let info = match self.flaw {
            Flaw::GuessesWhenUnreachable => self.guess(self.inner.inspect(key), None).await?,
            Flaw::InspectLies => match self.inner.inspect(key).await? {
                None => self.cache.lock().unwrap().get(key).cloned(),
                some => some,
            },
            _ => self.inner.inspect(key).await?,
        };
        Ok(info.map(|mut i| {
            match self.flaw {
                Flaw::FenceNeverAdvances => i.fence = Fence(1),
                Flaw::IgnoresExpiry => {
                    i.remaining = i.remaining.map(|r| r.min(Duration::from_secs(1)));
                }
                Flaw::ClaimsTooMuch => i.remaining = None,
                _ => {}
            }
            i
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        let mut list = match self.flaw {
            Flaw::GuessesWhenUnreachable => self.guess(self.inner.list(prefix), vec![]).await?,
            _ => self.inner.list(prefix).await?,
        };
        match self.flaw {
            Flaw::ListMisses => {
                list.pop();
            }
            Flaw::ClaimsTooMuch => list.iter_mut().for_each(|i| i.remaining = None),
            _ => {}
        }
        Ok(list)
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        self.inner.break_lease(key).await
    }

    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        if self.flaw == Flaw::RecordIgnoresFence {
            let record = Record {
                fence,
                value: value.to_vec(),
            };
            self.records
                .lock()
                .unwrap()
                .insert(key.clone(), record.clone());
            return Ok(record);
        }
        let stored = self.inner.put_record(key, fence, value).await?;
        if self.flaw == Flaw::RecordReadsLag {
            let now = tokio::time::Instant::now();
            self.written
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_insert(now);
        }
        Ok(stored)
    }

    async fn diagnose(&self) -> Result<leasehold_core::Diagnosis, StoreError> {
        let mut d = self.inner.diagnose().await?;
        if self.flaw == Flaw::DiagnosisInventsRows {
            let invented = leasehold_core::Finding::new(
                "split brain",
                leasehold_core::Verdict::Holds,
                "quorum=1",
                "one node is a majority of one",
            );
            d.finding(invented);
        }
        Ok(d)
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        if let Some(at) = self.written.lock().unwrap().get(key)
            && at.elapsed() < RECORD_LAG
        {
            return Ok(None);
        }
        if let Some(r) = self.records.lock().unwrap().get(key) {
            return Ok(Some(r.clone()));
        }
        self.inner.get_record(key).await
    }
}

#[async_trait]
impl BatchStore for Broken {
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        let mut out = Vec::with_capacity(leases.len());
        for (key, owner) in leases {
            out.push(self.renew(key, owner, ttl).await);
        }
        if self.flaw == Flaw::BatchMisorders {
            out.reverse();
        }
        Ok(out)
    }

    async fn acquire_any(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireAnyOutcome, StoreError> {
        if self.flaw != Flaw::AcquireAnyIgnoresOwner {
            // The default, through this store's flawed `acquire` and `renew_many`.
            return leasehold_core::acquire_any_one_by_one(self, keys, owner, ttl).await;
        }
        let mut shortest: Option<Duration> = None;
        for (index, key) in keys.iter().enumerate() {
            match self.acquire(key, owner, ttl).await? {
                AcquireOutcome::Acquired { fence, ttl } => {
                    return Ok(AcquireAnyOutcome::Acquired { index, fence, ttl });
                }
                AcquireOutcome::Held { remaining } => {
                    shortest = match (shortest, remaining) {
                        (Some(s), Some(r)) => Some(s.min(r)),
                        (s, r) => s.or(r),
                    };
                }
            }
        }
        Ok(AcquireAnyOutcome::Held {
            remaining: shortest,
        })
    }

    async fn acquire_any_checked(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
        check: RecordCheck<'_>,
    ) -> Result<CheckedAcquire, StoreError> {
        if self.flaw == Flaw::CheckIgnoresRecord {
            self.put_record(check.key, Fence(0), check.value).await?;
            return self
                .acquire_any(keys, owner, ttl)
                .await
                .map(CheckedAcquire::Passed);
        }
        // The default, through this store's (possibly flawed) record and acquire calls.
        leasehold_core::acquire_any_checked_in_two_calls(self, keys, owner, ttl, check).await
    }
}

#[async_trait]
impl WatchStore for Broken {
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        let Some(watcher) = self.inner.watcher() else {
            return Err(StoreError::unsupported("broken", "watching"));
        };
        let changes = watcher.watch(key).await?;
        if self.flaw == Flaw::WatchMisses {
            // Keeps the watch alive and says nothing.
            return Ok(changes.filter(|_| std::future::ready(false)).boxed());
        }
        Ok(changes)
    }
}

#[async_trait]
impl WaitStore for Broken {
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let Some(waiter) = self.inner.waiter() else {
            return Err(StoreError::unsupported("broken", "waiting for release"));
        };
        if self.flaw == Flaw::NeverWakes {
            tokio::time::sleep(timeout).await;
            return Ok(());
        }
        // Its queue: the order in which owners first waited (for `Queue`).
        let arrived = {
            let mut a = self.arrivals.lock().unwrap();
            let n = a.len() as u32;
            *a.entry(*owner).or_insert(n)
        };
        let res = waiter.wait_released(key, owner, timeout).await;
        if self.flaw == Flaw::ClaimsFifo {
            tokio::time::sleep(Duration::from_millis(200) * 10u32.saturating_sub(arrived)).await;
        }
        res
    }

    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        match (self.flaw, self.inner.waiter()) {
            (Flaw::HandOffFromNotice, Some(waiter)) => {
                match waiter.wait_turn(key, owner, ttl, timeout).await? {
                    WaitOutcome::Granted(mut g) => {
                        g.waiting_sent_at = tokio::time::Instant::now();
                        Ok(WaitOutcome::Granted(g))
                    }
                    WaitOutcome::Retry => Ok(WaitOutcome::Retry),
                }
            }
            _ => self
                .wait_released(key, owner, timeout)
                .await
                .map(|()| WaitOutcome::Retry),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fixtures.

/// The memory store's fault hooks: `forget` on the store itself, unreachability through
/// the fault-injecting wrapper the fixture's store sits behind.
struct MemoryFaults(MemoryStore, Arc<FaultStore>);

#[async_trait]
impl Faults for MemoryFaults {
    async fn forget(&self, key: &Key) {
        self.0.forget(key);
    }
    async fn make_unreachable(&self) {
        self.1.set_unreachable(Some(Unreachable::Hang));
    }
    async fn restore(&self) {
        self.1.set_unreachable(None);
    }
}

/// A guard that accepts every fence ([`Flaw::GuardIgnoresFence`]), in memory.
#[derive(Default)]
struct FenceBlindGuard {
    rows: Mutex<HashMap<String, String>>,
}

#[async_trait]
impl FencedWrites for FenceBlindGuard {
    async fn write(&self, resource: &str, _: Fence, value: &str) -> Result<bool, StoreError> {
        let mut rows = self.rows.lock().unwrap();
        rows.insert(resource.to_owned(), value.to_owned());
        Ok(true)
    }
    async fn read(&self, resource: &str) -> Result<Option<String>, StoreError> {
        Ok(self.rows.lock().unwrap().get(resource).cloned())
    }
}

fn memory_fixture(flaw: Flaw) -> Fixture {
    let inner = MemoryStore::new();
    let faults = Arc::new(FaultStore::new(Arc::new(inner.clone())));
    let broken = Arc::new(Broken::new(faults.clone(), flaw));
    let fx = Fixture::new(
        broken.clone(),
        Arc::new(MemoryFaults(inner, faults)),
        Duration::from_millis(600),
    )
    .queue(Arc::new(Arrivals(broken)));
    if flaw == Flaw::Undeclared {
        return fx;
    }
    // Every other flaw's stale-writer case writes through the embedded SQLite guard.
    let fx = if flaw == Flaw::GuardIgnoresFence {
        fx.guard(Arc::new(FenceBlindGuard::default()))
    } else {
        fx
    };
    fx.this_process_only()
        .expects_batch()
        .expects_watcher()
        .expects_waiter()
}

/// The broken store's queue: the owners that have waited (one key is waited on per case).
struct Arrivals(Arc<Broken>);

#[async_trait]
impl Queue for Arrivals {
    async fn waiting(&self, _: &Key) -> usize {
        self.0.arrivals.lock().unwrap().len()
    }
}

/// The fault hooks of the Redis-backed fixture: none of the cases run on it uses them.
struct NoFaults;

#[async_trait]
impl Faults for NoFaults {
    async fn forget(&self, _: &Key) {
        panic!("setup: the Redis-backed broken fixture has no `forget` hook");
    }
    async fn make_unreachable(&self) {
        panic!("setup: the Redis-backed broken fixture has no `make_unreachable` hook");
    }
    async fn restore(&self) {}
}

/// A private `redis-server`, a fault proxy in front of it, the broken store through the
/// proxy and a sound store straight to the server.
async fn redis_fixture(flaw: Flaw) -> Fixture {
    let server = Arc::new(
        tokio::task::spawn_blocking(RedisServer::start)
            .await
            .expect("redis-server"),
    );
    let proxy = Arc::new(FaultProxy::start(server.addr()));
    let op_bound = Duration::from_secs(2);
    let config = RedisConfigBuilder::standalone("127.0.0.1", proxy.port())
        .op_timeout(op_bound)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect("config");
    let store = Arc::new(RedisStore::new(config).expect("store"));
    let direct = Arc::new(RedisStore::open(&server.url()).await.expect("direct store"));
    let network = Network::new(vec![proxy.clone()], direct, server.clone())
        .op_bound(op_bound)
        .lost_reply_applies(true);
    Fixture::new(
        Arc::new(Broken::new(store, flaw)),
        Arc::new(NoFaults),
        Duration::from_secs(1),
    )
    .other_processes(format!("{flaw:?}|{}", server.url()))
    .network(network)
    .expects_batch()
    .expects_watcher()
    .expects_waiter()
    .keep_alive((server, proxy))
}

/// Opens the Redis-backed broken store in the holder process: `<flaw>|<url>`.
async fn open(spec: String) -> Arc<dyn Store> {
    let (flaw, url) = spec.split_once('|').expect("flaw|url");
    let store = RedisStore::open(url).await.expect("open the store");
    Arc::new(Broken::new(Arc::new(store), Flaw::parse(flaw)))
}

// ---------------------------------------------------------------------------------------
// Which flaw kills which case, and why.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Memory,
    Redis,
}

#[derive(Debug)]
struct Kill {
    case: &'static str,
    flaw: Flaw,
    on: On,
    /// Words of the panic message of the assertion that must fail.
    reason: &'static str,
}

const fn kill(case: &'static str, flaw: Flaw, on: On, reason: &'static str) -> Kill {
    Kill {
        case,
        flaw,
        on,
        reason,
    }
}

use Flaw::*;
use On::{Memory, Redis};

/// Every case of the suite and of the fault suite, written out by hand.
const ALL_CASES: &[&str] = &[
    "acquire_release",
    "contended_try_acquire",
    "concurrent_contenders_exclusive_and_fences_increase",
    "same_owner_reacquire_returns_same_fence",
    "fence_never_reused_after_release",
    "fence_never_reused_after_expiry",
    "late_release_leaves_new_owner_intact",
    "only_owner_renews_or_releases",
    "renew_extends_ttl",
    "renew_many_answers_each_lease_in_order",
    "release_after_keeps_the_lease_for_the_minimum_hold",
    "renewal_after_own_expiry_is_refused",
    "inspect_reports_holder",
    "max_hold_fires_lost",
    "lost_within_one_renew_interval_after_forget",
    "lost_before_expiry_when_unreachable",
    "waiting_acquire_gets_released_lease",
    "waiters_are_served_in_arrival_order",
    "hand_off_is_as_claimed",
    "ambiguous_acquire_reply_returns_same_lease",
    "stale_writer_rejected_by_guard",
    "holder_killed_is_taken_over_after_its_ttl",
    "bad_input_gets_typed_errors",
    "capabilities_are_honest",
    "diagnosis_names_the_server_and_judges_only_its_stores_rows",
    "records_are_fenced_writes",
    "racing_record_writes_keep_the_highest_fence",
    "one_leader_at_a_time_and_terms_rise",
    "semaphore_admits_at_most_n_holders",
    "lost_permit_returns_after_its_ttl_only",
    "watch_notices_grants_releases_and_record_writes",
    "acquire_any_takes_the_owners_key_or_the_first_free_one",
    "acquire_any_checked_takes_nothing_behind_another_value",
    "a_name_is_one_kind_of_resource",
    "row_01_holder_frozen_past_its_deadline_hears_lost_first_on_resume",
    "row_14_holder_wall_clock_jumps_change_nothing",
    "row_33_host_suspend_past_the_deadline_loses_the_lease",
    "row_02_near_miss_freeze_keeps_the_lease",
    "row_04_server_paused_lost_before_store_expiry",
    "row_05_lost_reply_retry_returns_same_lease",
    "row_06_slow_replies_shorten_validity_and_too_slow_fails",
    "row_07_blackhole_no_answer_and_recovery",
    "row_07_blackhole_puts_the_holder_at_risk_first",
    "row_08_reset_mid_command_idempotent_retry",
    "row_24_cancelled_acquires_leave_nothing_behind",
];

const KILLS: &[Kill] = &[
    kill(
        "row_07_blackhole_puts_the_holder_at_risk_first",
        ExpiresEarly,
        Redis,
        "at risk: the server no longer has the lease",
    ),
    kill(
        "release_after_keeps_the_lease_for_the_minimum_hold",
        RenewKeepsGrantedTtl,
        Memory,
        "before the minimum hold",
    ),
    kill(
        "capabilities_are_honest",
        RenewKeepsGrantedTtl,
        Memory,
        "sets_expiry:",
    ),
    kill(
        "row_01_holder_frozen_past_its_deadline_hears_lost_first_on_resume",
        IgnoresExpiry,
        Redis,
        "frozen past its deadline: not taken over",
    ),
    kill(
        "row_01_holder_frozen_past_its_deadline_hears_lost_first_on_resume",
        ExpiresEarly,
        Redis,
        "frozen past its deadline: taken over before its TTL ran out",
    ),
    kill(
        "row_14_holder_wall_clock_jumps_change_nothing",
        ExpiresEarly,
        Redis,
        "a contender got the lease after the holder's jump",
    ),
    kill(
        "row_33_host_suspend_past_the_deadline_loses_the_lease",
        IgnoresExpiry,
        Memory,
        "host suspend: not taken over",
    ),
    kill(
        "a_name_is_one_kind_of_resource",
        RecordReadsLag,
        Memory,
        "a lease beside a semaphore's permits must be refused",
    ),
    kill(
        "a_name_is_one_kind_of_resource",
        InspectLies,
        Memory,
        "a refused lease must be released",
    ),
    kill(
        "acquire_any_checked_takes_nothing_behind_another_value",
        CheckIgnoresRecord,
        Memory,
        "must refuse a record holding another value",
    ),
    kill(
        "acquire_any_checked_takes_nothing_behind_another_value",
        RecordIgnoresFence,
        Memory,
        "must refuse a record holding another value",
    ),
    kill(
        "watch_notices_grants_releases_and_record_writes",
        WatchMisses,
        Memory,
        "no notice of a grant",
    ),
    kill(
        "capabilities_are_honest",
        DropsWatcher,
        Memory,
        "the fixture expects a watcher",
    ),
    kill(
        "acquire_any_takes_the_owners_key_or_the_first_free_one",
        AcquireAnyIgnoresOwner,
        Memory,
        "acquire_any must return the key the owner holds",
    ),
    kill(
        "acquire_any_takes_the_owners_key_or_the_first_free_one",
        FenceNeverAdvances,
        Memory,
        "the fence of key 0 must rise",
    ),
    kill(
        "acquire_any_takes_the_owners_key_or_the_first_free_one",
        RacyAcquire,
        Memory,
        "two owners were granted one key at once by acquire_any",
    ),
    kill(
        "acquire_any_takes_the_owners_key_or_the_first_free_one",
        ClaimsTooMuch,
        Memory,
        "the store claims to report the remaining TTL",
    ),
    kill(
        "records_are_fenced_writes",
        RecordIgnoresFence,
        Memory,
        "same fence: kept, not overwritten",
    ),
    kill(
        "racing_record_writes_keep_the_highest_fence",
        RecordIgnoresFence,
        Memory,
        "the highest fence of racing writes must be what stays",
    ),
    kill(
        "one_leader_at_a_time_and_terms_rise",
        RacyAcquire,
        Memory,
        "two leaders at once",
    ),
    kill(
        "one_leader_at_a_time_and_terms_rise",
        FenceNeverAdvances,
        Memory,
        "leader() reads the current leader's term and value",
    ),
    kill(
        "semaphore_admits_at_most_n_holders",
        RacyAcquire,
        Memory,
        "two holders on slot",
    ),
    kill(
        "semaphore_admits_at_most_n_holders",
        RecordIgnoresFence,
        Memory,
        "another number of permits must be refused",
    ),
    kill(
        "lost_permit_returns_after_its_ttl_only",
        ExpiresEarly,
        Memory,
        "before its TTL ran out",
    ),
    kill(
        "lost_permit_returns_after_its_ttl_only",
        IgnoresExpiry,
        Memory,
        "never came back",
    ),
    kill(
        "acquire_release",
        InspectLies,
        Memory,
        "released key is free",
    ),
    kill(
        "contended_try_acquire",
        GrantsHeld,
        Memory,
        "expected Contended",
    ),
    kill(
        "contended_try_acquire",
        ClaimsTooMuch,
        Memory,
        "store claims to report the remaining TTL",
    ),
    kill(
        "concurrent_contenders_exclusive_and_fences_increase",
        RacyAcquire,
        Memory,
        "two holders at once",
    ),
    kill(
        "concurrent_contenders_exclusive_and_fences_increase",
        FenceNeverAdvances,
        Memory,
        "fences must strictly increase",
    ),
    kill(
        "same_owner_reacquire_returns_same_fence",
        NewFenceOnRetry,
        Memory,
        "same owner re-acquire must return the same fence",
    ),
    kill(
        "fence_never_reused_after_release",
        FenceNeverAdvances,
        Memory,
        "after release is not above",
    ),
    kill(
        "fence_never_reused_after_expiry",
        IgnoresExpiry,
        Memory,
        "an expired lease must be free",
    ),
    kill(
        "fence_never_reused_after_expiry",
        FenceNeverAdvances,
        Memory,
        "after expiry is not above",
    ),
    kill(
        "late_release_leaves_new_owner_intact",
        AnyOwner,
        Memory,
        "a late release by the old owner must find nothing",
    ),
    kill(
        "only_owner_renews_or_releases",
        AnyOwner,
        Memory,
        "only the owner may renew",
    ),
    kill(
        "only_owner_renews_or_releases",
        RenewAfterOwnExpiry,
        Memory,
        "renew after release must not resurrect the lease",
    ),
    kill(
        "renew_extends_ttl",
        RenewDoesNothing,
        Memory,
        "renewed lease still held",
    ),
    kill(
        "renew_many_answers_each_lease_in_order",
        BatchMisorders,
        Memory,
        "renew_many answered another lease's result",
    ),
    kill(
        "renew_many_answers_each_lease_in_order",
        AnyOwner,
        Memory,
        "renew_many answered another lease's result",
    ),
    kill(
        "renew_many_answers_each_lease_in_order",
        RenewDoesNothing,
        Memory,
        "renew_many answered another lease's result",
    ),
    kill(
        "renew_many_answers_each_lease_in_order",
        ExpiresEarly,
        Memory,
        "a lease renewed by renew_many expired at its first TTL",
    ),
    kill(
        "renewal_after_own_expiry_is_refused",
        RenewAfterOwnExpiry,
        Memory,
        "a renewal after the owner's own lease expired must be refused",
    ),
    kill(
        "inspect_reports_holder",
        InspectLies,
        Memory,
        "inspect reports a released lease",
    ),
    kill(
        "max_hold_fires_lost",
        IgnoresExpiry,
        Memory,
        "key still held after max hold",
    ),
    kill(
        "lost_within_one_renew_interval_after_forget",
        RenewAfterOwnExpiry,
        Memory,
        "lost fires within one renew interval",
    ),
    kill(
        "lost_within_one_renew_interval_after_forget",
        FenceNeverAdvances,
        Memory,
        "must be above the forgotten lease's",
    ),
    kill(
        "lost_before_expiry_when_unreachable",
        RenewDoesNothing,
        Memory,
        "lost fires while the store is unreachable",
    ),
    kill(
        "waiting_acquire_gets_released_lease",
        NeverWakes,
        Memory,
        "the waiter was not woken by the release",
    ),
    kill(
        "waiting_acquire_gets_released_lease",
        FenceNeverAdvances,
        Memory,
        "must be above the released holder's",
    ),
    kill(
        "waiters_are_served_in_arrival_order",
        ClaimsFifo,
        Memory,
        "served out of arrival order",
    ),
    kill(
        "hand_off_is_as_claimed",
        ClaimsHandOff,
        Memory,
        "the store claims hands_off, but a release with its waiter queued answered Retry",
    ),
    kill(
        "hand_off_is_as_claimed",
        HandOffFromNotice,
        Redis,
        "valid from a request of the wait sent before the release",
    ),
    kill(
        "ambiguous_acquire_reply_returns_same_lease",
        NewFenceOnRetry,
        Memory,
        "the retry must return the fence of the grant whose reply was lost",
    ),
    kill(
        "stale_writer_rejected_by_guard",
        GuardIgnoresFence,
        Memory,
        "the guard accepted a stale write",
    ),
    kill(
        "stale_writer_rejected_by_guard",
        FenceNeverAdvances,
        Memory,
        "must be above the old holder's",
    ),
    kill(
        "holder_killed_is_taken_over_after_its_ttl",
        ExpiresEarly,
        Redis,
        "taken over before the TTL ran out",
    ),
    kill(
        "holder_killed_is_taken_over_after_its_ttl",
        IgnoresExpiry,
        Redis,
        "not taken over within",
    ),
    kill(
        "holder_killed_is_taken_over_after_its_ttl",
        Undeclared,
        Memory,
        "the fixture must declare whether another process can open its store",
    ),
    kill(
        "holder_killed_is_taken_over_after_its_ttl",
        ClaimsDurableFences,
        Memory,
        "must say its fences live in process memory",
    ),
    kill(
        "diagnosis_names_the_server_and_judges_only_its_stores_rows",
        DiagnosisInventsRows,
        Memory,
        "`split brain` is not a fault of docs/guarantees.md",
    ),
    kill(
        "bad_input_gets_typed_errors",
        AcceptsAnyTtl,
        Memory,
        "a bad ttl was accepted",
    ),
    kill(
        "capabilities_are_honest",
        ClaimsTooMuch,
        Memory,
        "reports_remaining claim",
    ),
    kill(
        "capabilities_are_honest",
        ListMisses,
        Memory,
        "list by prefix",
    ),
    kill(
        "row_02_near_miss_freeze_keeps_the_lease",
        ExpiresEarly,
        Redis,
        "two holders during a near-miss freeze",
    ),
    kill(
        "row_04_server_paused_lost_before_store_expiry",
        RenewDoesNothing,
        Redis,
        "lost fires while the server is paused",
    ),
    kill(
        "row_05_lost_reply_retry_returns_same_lease",
        NewFenceOnRetry,
        Redis,
        "the retry must return the fence of the grant whose reply was lost",
    ),
    kill(
        "row_06_slow_replies_shorten_validity_and_too_slow_fails",
        ValidityFromReply,
        Redis,
        "the validity window must count from the send",
    ),
    kill(
        "row_06_slow_replies_shorten_validity_and_too_slow_fails",
        IgnoresExpiry,
        Redis,
        "a too-slow acquire left a lease behind",
    ),
    kill(
        "row_07_blackhole_no_answer_and_recovery",
        GuessesWhenUnreachable,
        Redis,
        "answered through a blackhole",
    ),
    kill(
        "row_08_reset_mid_command_idempotent_retry",
        NewFenceOnRetry,
        Redis,
        "the retry must return the fence of the grant whose reply was lost",
    ),
    kill(
        "row_24_cancelled_acquires_leave_nothing_behind",
        IgnoresExpiry,
        Redis,
        "a lease was left behind after 3 × TTL",
    ),
];

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else {
        "<a panic without a message>".to_owned()
    }
}

/// Panics print one line each, without a backtrace: every case run here is expected to
/// panic, and a page of backtrace per expected panic pushed the one that matters (a case
/// that failed at another assertion than its flaw's, which names both) out of the part of
/// the output CI shows.
fn one_line_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            eprintln!("panicked at {at}: {}", panic_message(info.payload()));
        }));
    });
}

/// Runs the case of `kill` against its broken store and checks that it fails, at the
/// assertion `kill.reason` names.
async fn must_fail(kill: &Kill) {
    one_line_panics();
    // Started again as the holder process of a case: play it (and end there).
    leasehold_conformance::holder::run_if_child(open).await;
    let case = CASES
        .iter()
        .chain(FAULT_CASES)
        .find(|c| c.name == kill.case)
        .unwrap_or_else(|| panic!("no case named {}", kill.case));
    let fx = match kill.on {
        On::Memory => memory_fixture(kill.flaw),
        On::Redis => redis_fixture(kill.flaw).await,
    };
    let outcome = AssertUnwindSafe((case.run)(&fx)).catch_unwind().await;
    drop(fx);
    match outcome {
        Ok(()) => panic!(
            "case {} passed against a store with {:?} ({:?})",
            kill.case, kill.flaw, kill.on
        ),
        Err(payload) => {
            let message = panic_message(&*payload);
            assert!(
                message.contains(kill.reason),
                "case {} failed against a store with {:?}, but not with `{}`: {message}",
                kill.case,
                kill.flaw,
                kill.reason
            );
            eprintln!("{} killed by {:?}: {message}", kill.case, kill.flaw);
        }
    }
}

/// Runs every entry of [`KILLS`] with `flaw`.
async fn flaw_is_caught(flaw: Flaw) {
    let kills: Vec<&Kill> = KILLS.iter().filter(|k| k.flaw == flaw).collect();
    assert!(!kills.is_empty(), "{flaw:?} kills no case in KILLS");
    for k in kills {
        must_fail(k).await;
    }
}

macro_rules! flaw_tests {
    ($($test:ident: $flaw:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                flaw_is_caught(Flaw::$flaw).await;
            }
        )*

        /// Every flaw has a test above.
        const TESTED: &[Flaw] = &[$(Flaw::$flaw),*];
    };
}

flaw_tests! {
    fence_that_never_advances_is_caught: FenceNeverAdvances,
    renew_or_release_for_any_owner_is_caught: AnyOwner,
    ignoring_expiry_is_caught: IgnoresExpiry,
    racy_read_then_write_acquire_is_caught: RacyAcquire,
    new_fence_on_same_owner_retry_is_caught: NewFenceOnRetry,
    renew_that_does_nothing_is_caught: RenewDoesNothing,
    batch_renewal_in_the_wrong_order_is_caught: BatchMisorders,
    renew_after_own_expiry_is_caught: RenewAfterOwnExpiry,
    inspect_that_lies_is_caught: InspectLies,
    list_that_misses_leases_is_caught: ListMisses,
    capabilities_that_claim_too_much_are_caught: ClaimsTooMuch,
    out_of_range_ttls_accepted_are_caught: AcceptsAnyTtl,
    guard_that_ignores_fences_is_caught: GuardIgnoresFence,
    early_expiry_is_caught: ExpiresEarly,
    guessing_when_unreachable_is_caught: GuessesWhenUnreachable,
    undeclared_extras_are_caught: Undeclared,
    fences_claimed_durable_are_caught: ClaimsDurableFences,
    fifo_claimed_falsely_is_caught: ClaimsFifo,
    records_written_whatever_the_fence_are_caught: RecordIgnoresFence,
    a_watch_that_misses_changes_is_caught: WatchMisses,
    a_watcher_dropped_by_the_store_is_caught: DropsWatcher,
    acquire_any_that_ignores_the_owners_key_is_caught: AcquireAnyIgnoresOwner,
    a_checked_acquire_that_ignores_the_record_is_caught: CheckIgnoresRecord,
    record_reads_that_lag_behind_the_writes_are_caught: RecordReadsLag,
    granting_a_held_key_is_caught: GrantsHeld,
    a_waiter_never_woken_is_caught: NeverWakes,
    validity_counted_from_the_reply_is_caught: ValidityFromReply,
    a_diagnosis_that_invents_rows_is_caught: DiagnosisInventsRows,
    a_hand_off_claimed_falsely_is_caught: ClaimsHandOff,
    a_hand_off_valid_from_its_notice_is_caught: HandOffFromNotice,
    an_expiry_claimed_settable_but_kept_is_caught: RenewKeepsGrantedTtl,
}

#[test]
fn every_flaw_has_a_test() {
    let tested: BTreeSet<Flaw> = TESTED.iter().copied().collect();
    let all: BTreeSet<Flaw> = Flaw::ALL.iter().copied().collect();
    assert_eq!(tested, all, "a flaw without a test (or a test twice)");
    assert_eq!(TESTED.len(), Flaw::ALL.len());
}

#[test]
fn the_hand_written_list_is_the_suite() {
    let generated: Vec<&str> = CASES.iter().chain(FAULT_CASES).map(|c| c.name).collect();
    let generated_set: BTreeSet<&str> = generated.iter().copied().collect();
    let written: BTreeSet<&str> = ALL_CASES.iter().copied().collect();
    assert_eq!(
        generated.len(),
        generated_set.len(),
        "a case listed twice by the macros"
    );
    assert_eq!(
        ALL_CASES.len(),
        written.len(),
        "a case written twice in ALL_CASES"
    );
    let missing: Vec<_> = generated_set.difference(&written).collect();
    let extra: Vec<_> = written.difference(&generated_set).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "ALL_CASES differs from the suite: not written {missing:?}, not in the suite {extra:?}"
    );
}

#[test]
fn every_case_is_killed() {
    let killed: BTreeSet<&str> = KILLS.iter().map(|k| k.case).collect();
    let never: Vec<&&str> = ALL_CASES.iter().filter(|c| !killed.contains(**c)).collect();
    assert!(
        never.is_empty(),
        "cases that no broken store makes fail: {never:?}"
    );
    let unknown: Vec<&&str> = killed.iter().filter(|c| !ALL_CASES.contains(c)).collect();
    assert!(unknown.is_empty(), "KILLS names unknown cases: {unknown:?}");
    for k in KILLS {
        assert!(!k.reason.trim().is_empty(), "{k:?}: no reason");
    }
}

/// The contenders check of the waiting suite fails on a store that does not serve its
/// waiters in turn: the in-memory store (its instances here share one store), whose
/// release wakes every waiter, and whose releaser, acquiring again at once, takes the
/// lease past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfair_turns_are_caught() {
    let store = MemoryStore::new();
    let open = async || Arc::new(store.clone()) as Arc<dyn Store>;
    let outcome = AssertUnwindSafe(
        leasehold_conformance::waiting::contenders_take_turns_in_arrival_order(
            open,
            &leasehold_conformance::waiting::Queueing::InProcess,
            6,
        ),
    )
    .catch_unwind()
    .await;
    let payload = outcome.expect_err("the contenders check passed on a store without turns");
    let message = panic_message(&*payload);
    assert!(
        message.contains("waited in the queue while"),
        "the contenders check failed, but not on the turns: {message}"
    );
}
