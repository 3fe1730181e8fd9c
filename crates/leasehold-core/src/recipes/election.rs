//! Leader election on a lease, as etcd's `concurrency.Election` and Curator's leader
//! latch offer it.
//!
//! The leader is whoever holds the lease named after the election; its **term** is that
//! lease's fence, so it rises with every new leader and the leader passes it with its
//! writes like any fence (the guard rejects a deposed leader's writes). The leader's
//! value (an address, a name) is published in a [record](crate::Record) written at the
//! term, so a deposed leader can never overwrite its successor's value.
//!
//! `leasehold run --key NAME` campaigns for the election `NAME` (without a value):
//! elections and leases share one name space, and are one [kind](crate::recipes::kind) of
//! resource. A semaphore is another: a campaign on a semaphore's name is refused
//! ([`Error::KindMismatch`]) once its lease is granted, before it publishes anything.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use leasehold_core::{Error, LeaseClient, LeaseConfig, memory::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
//! let election = client.election("leader:billing")?;
//!
//! // Waits (here up to 30 s) to become the leader.
//! let leadership = election.campaign("10.0.0.7:8080", Duration::from_secs(30)).await?;
//! let leader = election.leader().await?.expect("someone leads");
//! assert_eq!(leader.term, leadership.term());
//! assert_eq!(leader.value.as_deref(), Some(&b"10.0.0.7:8080"[..]));
//!
//! // Lead until done or until the lease is lost, whichever comes first.
//! tokio::select! {
//!     _ = leadership.lost() => { /* stop acting as the leader at once */ }
//!     _ = tokio::time::sleep(Duration::from_millis(10)) => {}
//! }
//! leadership.resign().await?;
//! assert!(election.leader().await?.is_none());
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::error::{Error, StoreError};
use crate::key::{IntoKey, Key};
use crate::lease::client::LeaseClient;
use crate::lease::{Lease, LostSignal};
use crate::store::Changes;
use crate::store::{MAX_RECORD_LEN, Record};
use crate::token::{Fence, OwnerToken};

/// An election: a name to campaign for, read and observe. Cheap to clone.
#[derive(Clone)]
pub struct Election {
    client: LeaseClient,
    name: Key,
    record: Key,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The current leader, as [`Election::leader`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's lease owner token.
    pub owner: OwnerToken,
    /// The term: the leader's lease fence. A later leader has a higher term.
    pub term: Fence,
    /// The value the leader published; `None` for a moment after it won (it publishes the
    /// value right after its lease is granted) and for a leader that campaigned without
    /// one (`leasehold run`).
    pub value: Option<Vec<u8>>,
}

/// Being the leader: the lease of the election's name, and the value published with it.
///
/// Dropping it resigns (releases the lease in the background), as dropping a [`Lease`]
/// does.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    value: Vec<u8>,
}

impl Leadership {
    /// The term: this leadership's fence. Pass it with every write the leader makes.
    pub fn term(&self) -> Fence {
        self.lease.fence()
    }

    /// The value this leader published.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The lease behind the leadership (its deadline, [`Lease::run`], ...).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Fires when the leadership is lost: the same signal as the lease's
    /// [`Lease::lost`]. Stop acting as the leader when it does.
    pub fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    /// Whether the leadership is still valid (the lease's validity deadline has not
    /// passed and it was not lost).
    pub fn is_leader(&self) -> bool {
        self.lease.is_valid()
    }

    /// Steps down: releases the lease, so another campaigner can win. `Ok(false)` when the
    /// lease had already been lost.
    ///
    /// # Cancel safety
    /// As [`Lease::release`].
    pub async fn resign(self) -> Result<bool, Error> {
        self.lease.release().await
    }
}

impl LeaseClient {
    /// The election named `name` (a lease key; its value is kept in the record named
    /// `election/NAME`).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a name that is not a valid key or is too long to make the
    /// record's name.
    pub fn election(&self, name: impl IntoKey) -> Result<Election, Error> {
        let name = name.into_key()?;
        let record = Key::new(format!("election/{name}"))?;
        Ok(Election {
            client: self.clone(),
            name,
            record,
        })
    }
}

impl Election {
    /// The election's name (the lease key the leader holds).
    pub fn name(&self) -> &Key {
        &self.name
    }

    /// Waits up to `wait` (`Duration::MAX`: as long as it takes) to become the leader,
    /// then publishes `value` at the new term and returns the leadership.
    ///
    /// # Cancel safety
    /// Cancel safe: a campaign dropped while waiting leaves nothing behind; dropped after
    /// winning, the lease is released as a dropped lease is.
    ///
    /// # Errors
    /// [`Error::ValueTooLong`], [`Error::WaitTimeout`] (not elected in time),
    /// [`Error::LeaseLost`] (lost before the value was published, or a later leader had
    /// already published), [`Error::KindMismatch`] (the name is a semaphore's; the lease
    /// is released), [`Error::Store`], and the errors of [`LeaseClient::acquire`].
    pub async fn campaign(
        &self,
        value: impl Into<Vec<u8>>,
        wait: Duration,
    ) -> Result<Leadership, Error> {
        let value = value.into();
        check_len(&value)?;
        let store = self.client.store().clone();
        let lease = self.client.acquire(&self.name, wait).await?;
        // Not a semaphore's name: read now that the lease is granted (`crate::recipes::kind`).
        let lease = self
            .client
            .checked_lease(lease, crate::recipes::kind::ResourceKind::Election)
            .await?;
        let term = lease.fence();
        let limit = self.client.config().op_timeout();
        let mut attempt = 0;
        let stored = loop {
            let call = store.put_record(&self.record, term, &value);
            match StoreError::bounded(store.backend(), "put record", limit, call).await {
                Ok(stored) => break stored,
                Err(e) if e.is_retryable() && lease.is_valid() => {
                    tokio::time::sleep(self.client.backoff_delay(attempt)).await;
                    attempt = attempt.saturating_add(1);
                }
                Err(e) => return Err(e.into()),
            }
        };
        if stored.fence != term {
            // A later term published first: this lease was lost and someone else won.
            return Err(Error::LeaseLost(
                lease
                    .lost_reason()
                    .unwrap_or(crate::lease::LostReason::NotOwner),
            ));
        }
        lease.ensure_valid()?;
        Ok(Leadership { lease, value })
    }

    /// The current leader, if any.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let store = self.client.store();
        let limit = self.client.config().op_timeout();
        let backend = store.backend();
        // A new leader between the two reads shows as a record newer than the lease read:
        // read again.
        for _ in 0..3 {
            let holder =
                StoreError::bounded(backend, "inspect", limit, store.inspect(&self.name)).await?;
            let Some(holder) = holder else {
                return Ok(None);
            };
            let record: Option<Record> =
                StoreError::bounded(backend, "get record", limit, store.get_record(&self.record))
                    .await?;
            if record.as_ref().is_some_and(|r| r.fence > holder.fence) {
                continue;
            }
            return Ok(Some(Leader {
                owner: holder.owner,
                term: holder.fence,
                value: record.filter(|r| r.fence == holder.fence).map(|r| r.value),
            }));
        }
        Err(StoreError::new(
            crate::StoreErrorKind::Busy,
            backend,
            "the leader changed on every read; try again",
        )
        .into())
    }

    /// The leader now, then each change of leader (another term, no leader, or the value
    /// published). A store error is yielded as an item and observing goes on. The stream
    /// never ends; drop it to stop.
    ///
    /// Where the store notifies changes (it has a [`Store::watcher`](crate::Store::watcher)),
    /// a change is read as soon as the store tells of it (a grant, a release, the value
    /// published), without polling; the leader is still read every `interval` as well,
    /// which bounds how late an expiry (not notified) or a lost notice is seen. Elsewhere
    /// the leader is read every `interval`. Observing never joins a store's queue of
    /// waiters, which would hold up the campaigners.
    pub fn observe(
        &self,
        interval: Duration,
    ) -> impl Stream<Item = Result<Option<Leader>, Error>> + Send + 'static {
        let interval = interval.max(Duration::from_millis(1));
        let state = Observing {
            election: self.clone(),
            last: None,
            changes: None,
            started: false,
        };
        futures::stream::unfold(state, move |mut state| async move {
            loop {
                if state.started {
                    state.wait(interval).await;
                }
                state.started = true;
                // Watch before reading, so no change after the read goes unnoticed.
                state.watch().await;
                match state.election.leader().await {
                    Ok(now) if state.last.as_ref() == Some(&now) => {}
                    Ok(now) => {
                        state.last = Some(now.clone());
                        return Some((Ok(now), state));
                    }
                    Err(e) => return Some((Err(e), state)),
                }
            }
        })
    }
}

/// The state of [`Election::observe`].
struct Observing {
    election: Election,
    last: Option<Option<Leader>>,
    /// The store's change notices of the lease and of the value record, while watching.
    changes: Option<Changes>,
    started: bool,
}

impl Observing {
    /// Starts watching if the store notifies and no watch is running. A failure leaves
    /// this round to polling; the next round tries again.
    async fn watch(&mut self) {
        let store = self.election.client.store();
        if self.changes.is_some() {
            return;
        }
        let Some(watcher) = store.watcher() else {
            return;
        };
        let limit = self.election.client.config().op_timeout();
        let backend = store.backend();
        let lease =
            StoreError::bounded(backend, "watch", limit, watcher.watch(&self.election.name));
        let record = StoreError::bounded(
            backend,
            "watch",
            limit,
            watcher.watch(&self.election.record),
        );
        match futures::future::join(lease, record).await {
            (Ok(lease), Ok(record)) => {
                self.changes = Some(futures::stream::select(lease, record).boxed());
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(election = %self.election.name, error = %e, "watch failed; polling");
            }
        }
    }

    /// Waits for a change notice or `interval`, whichever comes first. A failed or ended
    /// watch is dropped (to be set up again) after its wait.
    async fn wait(&mut self, interval: Duration) {
        let Some(changes) = self.changes.as_mut() else {
            tokio::time::sleep(interval).await;
            return;
        };
        tokio::select! {
            notice = changes.next() => {
                if !matches!(notice, Some(Ok(()))) {
                    self.changes = None;
                    // A watch that fails at once must not turn into a busy loop.
                    tokio::time::sleep(interval.min(Duration::from_millis(100))).await;
                }
            }
            () = tokio::time::sleep(interval) => {}
        }
    }
}

fn check_len(value: &[u8]) -> Result<(), Error> {
    if value.len() > MAX_RECORD_LEN {
        return Err(Error::ValueTooLong {
            len: value.len(),
            max: MAX_RECORD_LEN,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::StreamExt;

    use super::*;
    use crate::config::LeaseConfig;
    use crate::recipes::test_client as client;
    use crate::store::Store;
    use crate::store::memory::MemoryStore;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn campaign_resign_and_terms_rise() {
        let store = MemoryStore::new();
        let c = client(&store);
        let e = c.election("leader:t").unwrap();
        assert_eq!(e.leader().await.unwrap(), None);
        let a = e.campaign("a", Duration::ZERO).await.unwrap();
        assert!(a.is_leader());
        let waiting = {
            let e = e.clone();
            tokio::spawn(async move { e.campaign("b", Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "one leader at a time");
        let leader = e.leader().await.unwrap().unwrap();
        assert_eq!(
            (leader.term, leader.value.as_deref()),
            (a.term(), Some(&b"a"[..]))
        );
        let term_a = a.term();
        assert!(a.resign().await.unwrap());
        let b = waiting.await.unwrap().unwrap();
        assert!(b.term() > term_a, "terms rise");
        assert_eq!(
            e.leader().await.unwrap().unwrap().value.as_deref(),
            Some(&b"b"[..])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_ends_the_leadership() {
        let store = MemoryStore::new();
        let c = client(&store);
        let e = c.election("leader:lost").unwrap();
        let a = e.campaign("a", Duration::ZERO).await.unwrap();
        store.forget(e.name());
        tokio::time::timeout(Duration::from_secs(3), a.lost())
            .await
            .expect("lost fires");
        assert!(!a.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn a_deposed_leader_cannot_overwrite_the_value() {
        let store = MemoryStore::new();
        let c = client(&store);
        let e = c.election("leader:deposed").unwrap();
        let record = Key::new("election/leader:deposed").unwrap();
        // A later term already published (a successor won while this campaign stalled).
        store
            .put_record(&record, Fence(1_000), b"new")
            .await
            .unwrap();
        let err = e.campaign("old", Duration::ZERO).await.unwrap_err();
        assert!(matches!(err, Error::LeaseLost(_)), "{err}");
        assert_eq!(
            store.get_record(&record).await.unwrap().unwrap().value,
            b"new".to_vec()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bad_input_and_missing_records_are_typed_errors() {
        let store = MemoryStore::new();
        let c = client(&store);
        let e = c.election("leader:big").unwrap();
        let err = e
            .campaign(vec![0u8; MAX_RECORD_LEN + 1], Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ValueTooLong { .. }), "{err}");
        assert!(matches!(
            c.election("x".repeat(crate::MAX_KEY_LEN)),
            Err(Error::InvalidKey(_))
        ));
        assert!(matches!(c.election(""), Err(Error::InvalidKey(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn observe_yields_each_change() {
        let store = MemoryStore::new();
        let c = client(&store);
        let e = c.election("leader:obs").unwrap();
        let mut changes = Box::pin(e.observe(Duration::from_millis(100)));
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let a = e.campaign("a", Duration::ZERO).await.unwrap();
        let seen = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!((seen.term, seen.value), (a.term(), Some(b"a".to_vec())));
        a.resign().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let b = e.campaign("b", Duration::ZERO).await.unwrap();
        let seen = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!(seen.term, b.term());
    }

    /// With a store that notifies, each change is seen at once, not at the next poll: the
    /// interval here is an hour, and every change is seen within a second (paused time).
    #[tokio::test(start_paused = true)]
    async fn observe_follows_the_store_notices_not_the_interval() {
        let store = MemoryStore::new();
        let c = client(&store);
        let e = c.election("leader:notices").unwrap();
        let mut changes = Box::pin(e.observe(Duration::from_secs(3600)));
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(1), changes.next())
                .await
                .expect("a change is seen at once, not at the next poll")
                .unwrap()
                .unwrap()
        };
        assert_eq!(next().await, None);
        let a = e.campaign("a", Duration::ZERO).await.unwrap();
        let mut seen = next().await.unwrap();
        if seen.value.is_none() {
            // The grant, then the value published a moment later.
            seen = next().await.unwrap();
        }
        assert_eq!((seen.term, seen.value), (a.term(), Some(b"a".to_vec())));
        a.resign().await.unwrap();
        assert_eq!(next().await, None);
    }

    /// A store that does not notify is polled every interval.
    #[tokio::test(start_paused = true)]
    async fn observe_polls_a_store_that_does_not_notify() {
        let quiet = crate::wrap::FaultStore::new(Arc::new(MemoryStore::new()));
        quiet.hide_watch();
        assert!(quiet.watcher().is_none());
        let c = LeaseClient::new(
            Arc::new(quiet),
            LeaseConfig::new(Duration::from_secs(3)).unwrap(),
        );
        let e = c.election("leader:quiet").unwrap();
        let mut changes = Box::pin(e.observe(Duration::from_secs(5)));
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let polled = Instant::now();
        let a = e.campaign("a", Duration::ZERO).await.unwrap();
        let seen = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!(seen.term, a.term());
        assert!(
            polled.elapsed() >= Duration::from_secs(5),
            "seen at the next poll"
        );
    }
}
