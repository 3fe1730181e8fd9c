//! The checks that keep a name one kind of resource ([kinds](crate::kind)): what
//! `leasehold run`, elections and semaphores ask before and after they take a name.

use tokio::time::Instant;

use crate::error::{Error, StoreError};
use crate::key::{IntoKey, Key};
use crate::lease::{Lease, LeaseClient};
use crate::recipes::kind::{ResourceKind, election_record, semaphore_record};

impl LeaseClient {
    /// Refuses `lease`, a lease just granted by [`acquire`](Self::acquire) or
    /// [`try_acquire`](Self::try_acquire), when its name is a semaphore's: the lease is
    /// released and the call answers [`Error::KindMismatch`]. Otherwise returns it. One
    /// read of the record `semaphore/NAME` (none on a store without records, where no
    /// semaphore can exist). This is what `leasehold run --key` does; the plain acquire
    /// does not (see [the kinds](crate::recipes::kind)).
    ///
    /// Checking after the grant, not before, is what makes it hold against a semaphore's
    /// first permit taken at the same moment.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call drops the lease, which releases it in the background.
    ///
    /// # Errors
    /// [`Error::KindMismatch`]; [`Error::Store`] when the record cannot be read (retryable
    /// errors are retried while the lease is valid; the lease is released either way).
    pub async fn check_lease_kind(&self, lease: Lease) -> Result<Lease, Error> {
        self.checked_lease(lease, ResourceKind::Lease).await
    }

    /// What kind of resource `name` is, as the store records it now: a semaphore (its
    /// record `semaphore/NAME` exists), an election (its record `election/NAME` exists),
    /// a lease (the lease `NAME` is held, no record), or `None` (nothing marks it: any kind
    /// may take it). Reads only; for tools (`leasehold leader` refuses a semaphore's name
    /// with it). A name marked both ways (taken by callers that do not check) is reported
    /// as a semaphore.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// [`Error::InvalidKey`], [`Error::Store`].
    pub async fn kind_of(&self, name: impl IntoKey) -> Result<Option<ResourceKind>, Error> {
        let name = name.into_key()?;
        let (semaphore, election, lease) = futures::future::join3(
            self.read_mark(semaphore_record(&name)),
            self.read_mark(election_record(&name)),
            self.read_lease(&name),
        )
        .await;
        Ok(if semaphore? {
            Some(ResourceKind::Semaphore)
        } else if election? {
            Some(ResourceKind::Election)
        } else if lease? {
            Some(ResourceKind::Lease)
        } else {
            None
        })
    }

    /// [`check_lease_kind`](Self::check_lease_kind) for a lease taken as `asked` (a lease,
    /// or an election's leadership).
    pub(crate) async fn checked_lease(
        &self,
        lease: Lease,
        asked: ResourceKind,
    ) -> Result<Lease, Error> {
        let record = semaphore_record(lease.key());
        let read = || self.read_mark(record.clone());
        match self.retrying(lease.valid_until(), read).await {
            Ok(false) => Ok(lease),
            Ok(true) => {
                let name = lease.key().clone();
                // Not released (a timeout): dropping the lease releases it in the background.
                let _ = lease.release().await;
                Err(Error::KindMismatch {
                    name,
                    found: ResourceKind::Semaphore,
                    asked,
                })
            }
            Err(e) => {
                let _ = lease.release().await;
                Err(e.into())
            }
        }
    }

    /// For the semaphore `name`: refuses when the lease `NAME` is held (a lease, or an
    /// election's leader) or the record `election/NAME` exists (an election, with or without
    /// a leader). A retryable error is retried until `deadline`. Called once a permit is
    /// granted (so the semaphore's record is in the store: what makes it race-free), and
    /// before a handle's first acquire writes that record (so that a mistaken semaphore
    /// does not mark a lease's or an election's name as its own).
    pub(crate) async fn check_semaphore_kind(
        &self,
        name: &Key,
        deadline: Instant,
    ) -> Result<(), Error> {
        let read = || async {
            let (election, lease) =
                futures::future::join(self.read_mark(election_record(name)), self.read_lease(name))
                    .await;
            Ok(match (election?, lease?) {
                (true, _) => Some(ResourceKind::Election),
                (false, true) => Some(ResourceKind::Lease),
                (false, false) => None,
            })
        };
        match self.retrying(deadline, read).await? {
            None => Ok(()),
            Some(found) => Err(Error::KindMismatch {
                name: name.clone(),
                found,
                asked: ResourceKind::Semaphore,
            }),
        }
    }

    /// Whether the record `record` exists (`false` for `None`: a name too long to have it).
    async fn read_mark(&self, record: Option<Key>) -> Result<bool, StoreError> {
        let store = self.store();
        let Some(record) = record else {
            return Ok(false);
        };
        let limit = self.config().op_timeout();
        StoreError::bounded(
            store.backend(),
            "get record",
            limit,
            store.get_record(&record),
        )
        .await
        .map(|r| r.is_some())
    }

    /// Whether the lease `name` is held.
    async fn read_lease(&self, name: &Key) -> Result<bool, StoreError> {
        let store = self.store();
        let limit = self.config().op_timeout();
        StoreError::bounded(store.backend(), "inspect", limit, store.inspect(name))
            .await
            .map(|l| l.is_some())
    }

    /// `call`, again after a backoff (never past `deadline`) while it fails with a
    /// retryable error before `deadline`.
    async fn retrying<T, F: Future<Output = Result<T, StoreError>>>(
        &self,
        deadline: Instant,
        mut call: impl FnMut() -> F,
    ) -> Result<T, StoreError> {
        let mut attempt = 0u32;
        loop {
            match call().await {
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(self.backoff_delay(attempt).min(left)).await;
                    attempt = attempt.saturating_add(1);
                }
                done => return done,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::config::LeaseConfig;
    use crate::store::memory::MemoryStore;
    use crate::store::{AcquireOutcome, LeaseInfo, Record, ReleaseOutcome, RenewOutcome, Store};
    use crate::token::{Fence, OwnerToken};

    fn client(store: Arc<dyn Store>) -> LeaseClient {
        LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(3)).unwrap())
    }

    fn key(name: &str) -> Key {
        Key::new(name).unwrap()
    }

    fn refused(err: &Error, found: ResourceKind, asked: ResourceKind) -> bool {
        matches!(err, Error::KindMismatch { found: f, asked: a, .. } if *f == found && *a == asked)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_on_a_semaphores_name_is_refused_and_left_free() {
        let store = MemoryStore::new();
        let c = client(Arc::new(store.clone()));
        let permit = c
            .semaphore("exports", 2)
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        let lease = c.try_acquire("exports").await.unwrap();
        let err = c
            .check_lease_kind(lease)
            .await
            .expect_err("a lease beside a semaphore's permits must be refused");
        assert!(
            refused(&err, ResourceKind::Semaphore, ResourceKind::Lease),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("`exports` is a semaphore") && text.contains("semaphore/exports"),
            "the error names the kind and what marks it: {text}"
        );
        assert_eq!(err.action(), crate::Action::Reconfigure);
        assert_eq!(
            store.inspect(&key("exports")).await.unwrap(),
            None,
            "the refused lease is released"
        );
        // The name stays a semaphore's once its permits are all given back.
        permit.release().await.unwrap();
        let lease = c.try_acquire("exports").await.unwrap();
        let err = c.check_lease_kind(lease).await.unwrap_err();
        assert!(
            refused(&err, ResourceKind::Semaphore, ResourceKind::Lease),
            "{err}"
        );
        assert_eq!(
            c.kind_of("exports").await.unwrap(),
            Some(ResourceKind::Semaphore)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_semaphore_on_a_held_leases_name_is_refused_and_marks_nothing() {
        let store = MemoryStore::new();
        let c = client(Arc::new(store.clone()));
        let lease = c.try_acquire("exports").await.unwrap();
        let sem = c.semaphore("exports", 2).unwrap();
        let err = sem
            .try_acquire()
            .await
            .expect_err("a permit beside a held lease must be refused");
        assert!(
            refused(&err, ResourceKind::Lease, ResourceKind::Semaphore),
            "{err}"
        );
        assert_eq!(
            c.kind_of("exports").await.unwrap(),
            Some(ResourceKind::Lease)
        );
        assert!(
            err.to_string()
                .contains("another owner holds the lease `exports`"),
            "{err}"
        );
        assert!(sem.holders().await.unwrap().is_empty(), "no slot left held");
        assert_eq!(
            store.get_record(&key("semaphore/exports")).await.unwrap(),
            None,
            "a refused semaphore does not mark the lease's name as its own"
        );
        // So the lease's next holders are not locked out by the mistaken caller.
        lease.release().await.unwrap();
        let next = c.try_acquire("exports").await.unwrap();
        let next = c.check_lease_kind(next).await.unwrap();
        next.release().await.unwrap();
        assert_eq!(
            c.kind_of("exports").await.unwrap(),
            None,
            "a free lease marks nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_election_on_a_semaphores_name_is_refused_and_publishes_nothing() {
        let store = MemoryStore::new();
        let c = client(Arc::new(store.clone()));
        let permit = c
            .semaphore("billing", 1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap();
        let election = c.election("billing").unwrap();
        let err = election
            .campaign("me", Duration::ZERO)
            .await
            .expect_err("a campaign beside a semaphore's permits must be refused");
        assert!(
            refused(&err, ResourceKind::Semaphore, ResourceKind::Election),
            "{err}"
        );
        assert_eq!(
            store.inspect(&key("billing")).await.unwrap(),
            None,
            "released"
        );
        assert_eq!(
            store.get_record(&key("election/billing")).await.unwrap(),
            None,
            "no value published"
        );
        assert_eq!(election.leader().await.unwrap(), None);
        drop(permit);
    }

    #[tokio::test(start_paused = true)]
    async fn a_semaphore_on_an_elections_name_is_refused_with_or_without_a_leader() {
        let store = MemoryStore::new();
        let c = client(Arc::new(store.clone()));
        let election = c.election("billing").unwrap();
        let leader = election.campaign("me", Duration::ZERO).await.unwrap();
        let sem = c.semaphore("billing", 3).unwrap();
        let err = sem
            .try_acquire()
            .await
            .expect_err("a permit beside a leader must be refused");
        assert!(
            refused(&err, ResourceKind::Election, ResourceKind::Semaphore),
            "{err}"
        );
        assert!(err.to_string().contains("election/billing"), "{err}");
        assert!(sem.holders().await.unwrap().is_empty());
        // Nobody leads: the name is still an election's (its record stays).
        leader.resign().await.unwrap();
        let err = sem.try_acquire().await.unwrap_err();
        assert!(
            refused(&err, ResourceKind::Election, ResourceKind::Semaphore),
            "{err}"
        );
        assert_eq!(
            store.get_record(&key("semaphore/billing")).await.unwrap(),
            None,
            "a refused semaphore does not mark the election's name as its own"
        );
        assert_eq!(
            c.kind_of("billing").await.unwrap(),
            Some(ResourceKind::Election)
        );
        // So campaigns go on.
        election.campaign("next", Duration::ZERO).await.unwrap();
    }

    /// A handle that has held a permit skips the check before its first store call; a
    /// lease taken meanwhile without a check (the plain acquire) is seen once the next
    /// permit is granted, and that permit is released, not handed out.
    #[tokio::test(start_paused = true)]
    async fn a_permit_granted_beside_an_unchecked_lease_is_given_back() {
        let store = MemoryStore::new();
        let c = client(Arc::new(store.clone()));
        let sem = c.semaphore("exports", 2).unwrap();
        sem.try_acquire().await.unwrap().release().await.unwrap();
        let lease = c.try_acquire("exports").await.unwrap(); // unchecked
        let err = sem
            .try_acquire()
            .await
            .expect_err("a permit granted beside a lease must be refused");
        assert!(
            refused(&err, ResourceKind::Lease, ResourceKind::Semaphore),
            "{err}"
        );
        assert!(
            sem.holders().await.unwrap().is_empty(),
            "the granted slot is released"
        );
        assert!(lease.is_valid(), "the lease is left alone");
    }

    /// A lease and an election are one kind: `leasehold run --key NAME` is a campaigner of
    /// the election NAME. They exclude each other through the one lease, in both orders.
    #[tokio::test(start_paused = true)]
    async fn a_lease_and_an_election_on_one_name_exclude_each_other() {
        let store = MemoryStore::new();
        let c = client(Arc::new(store.clone()));
        let election = c.election("leader:nightly").unwrap();
        let lease = c.try_acquire("leader:nightly").await.unwrap();
        let lease = c.check_lease_kind(lease).await.unwrap();
        let err = election
            .campaign("me", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::WaitTimeout { .. }), "{err}");
        let seen = election.leader().await.unwrap().unwrap();
        assert_eq!(
            (seen.term, seen.value),
            (lease.fence(), None),
            "the lease leads"
        );
        lease.release().await.unwrap();
        let leader = election.campaign("me", Duration::ZERO).await.unwrap();
        let err = c.try_acquire("leader:nightly").await.unwrap_err();
        assert!(matches!(err, Error::Contended { .. }), "{err}");
        leader.resign().await.unwrap();
        // A lease on an election's name is its kind: taken once the leader resigned.
        let lease = c.try_acquire("leader:nightly").await.unwrap();
        let lease = c.check_lease_kind(lease).await.unwrap();
        lease.release().await.unwrap();
    }

    /// A memory store whose every call waits a little before and after it is applied, a
    /// different while each time: racing callers interleave their calls in many orders.
    #[derive(Debug)]
    struct Jittery {
        inner: MemoryStore,
        calls: AtomicU64,
    }

    impl Jittery {
        async fn around<T>(&self, call: impl Future<Output = T>) -> T {
            let n = self.calls.fetch_add(1, Ordering::Relaxed);
            // A fixed scramble of the call number: 0..=3 ms before, 0..=3 ms after.
            let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
            tokio::time::sleep(Duration::from_micros((h & 3) * 1000 + 100)).await;
            let out = call.await;
            tokio::time::sleep(Duration::from_micros((h >> 2 & 3) * 1000 + 100)).await;
            out
        }
    }

    #[async_trait]
    impl crate::wrap::Forward for Jittery {
        fn inner(&self) -> &dyn Store {
            &self.inner
        }
        fn backend(&self) -> &'static str {
            "jittery"
        }
        async fn acquire(
            &self,
            key: &Key,
            owner: &OwnerToken,
            ttl: Duration,
        ) -> Result<AcquireOutcome, StoreError> {
            self.around(self.inner.acquire(key, owner, ttl)).await
        }
        async fn renew(
            &self,
            key: &Key,
            owner: &OwnerToken,
            ttl: Duration,
        ) -> Result<RenewOutcome, StoreError> {
            self.around(self.inner.renew(key, owner, ttl)).await
        }
        async fn release(
            &self,
            key: &Key,
            owner: &OwnerToken,
        ) -> Result<ReleaseOutcome, StoreError> {
            self.around(self.inner.release(key, owner)).await
        }
        async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
            self.around(self.inner.inspect(key)).await
        }
        async fn put_record(
            &self,
            key: &Key,
            fence: Fence,
            value: &[u8],
        ) -> Result<Record, StoreError> {
            self.around(self.inner.put_record(key, fence, value)).await
        }
        async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
            self.around(self.inner.get_record(key)).await
        }
    }

    /// Two first uses of a fresh name, of two kinds, started at the same instant, in many
    /// interleavings of their store calls (with the record check of a semaphore in the
    /// same call as its acquire, and apart): never both hold it. Both may be refused.
    #[tokio::test(start_paused = true)]
    async fn racing_first_uses_of_a_name_never_both_hold_it() {
        let jittery = Arc::new(Jittery {
            inner: MemoryStore::new(),
            calls: AtomicU64::new(0),
        });
        let (mut both_refused, mut rounds) = (0, 0);
        for atomic in [false, true] {
            let faulty = Arc::new(crate::wrap::FaultStore::new(jittery.clone()));
            if atomic {
                faulty.claim_atomic_acquire_any();
            }
            let c = client(faulty);
            for round in 0..60 {
                rounds += 1;
                let name = format!("race:{atomic}:{round}");
                let sem = c.semaphore(name.as_str(), 2).unwrap();
                // Skew the start of the semaphore by a few calls' worth, so that every
                // step of one may meet every step of the other.
                let skew = Duration::from_micros(round % 12 * 700);
                let permit = async {
                    tokio::time::sleep(skew).await;
                    sem.try_acquire().await
                };
                let (held, other) = if round % 2 == 0 {
                    let lease = async {
                        let lease = c.try_acquire(name.as_str()).await?;
                        c.check_lease_kind(lease).await
                    };
                    let (p, l) = tokio::join!(permit, lease);
                    (
                        p.map(drop).map_err(|e| e.to_string()),
                        l.map(drop).map_err(|e| e.to_string()),
                    )
                } else {
                    let election = c.election(name.as_str()).unwrap();
                    let (p, e) = tokio::join!(permit, election.campaign("v", Duration::ZERO));
                    (
                        p.map(drop).map_err(|e| e.to_string()),
                        e.map(drop).map_err(|e| e.to_string()),
                    )
                };
                // Both outcomes are in: anything granted was held until now.
                assert!(
                    held.is_err() || other.is_err(),
                    "round {round} (atomic {atomic}): a semaphore and a lease both hold `{name}`"
                );
                for r in [&held, &other] {
                    if let Err(e) = r {
                        assert!(e.contains("a name is one kind of resource"), "{e}");
                    }
                }
                if held.is_err() && other.is_err() {
                    both_refused += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(
            both_refused < rounds,
            "every round refused both: the race never let one through"
        );
    }
}
