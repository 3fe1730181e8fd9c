//! Grants a store saw end on its own side, told to the holders at once.
//!
//! A session-bound lease (an advisory lock, `GET_LOCK`) ends with the server session that
//! holds it: when the server restarts, every lock dies with its session, and the restarted
//! server grants the lock to the next contender as soon as it accepts connections. A holder
//! that learned of it only at its next renewal (up to a renew interval later) would believe
//! it holds the lease while the other does. A store that *sees* a session end reports it
//! through [`EndedGrants`]; every [`LeaseClient`](crate::LeaseClient) on that store marks
//! the lease lost ([`LostReason::SessionEnded`]) before the report returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::clock::{At, LeaseClock};
use crate::key::Key;
use crate::lease::lost::LostReason;
use crate::lease::shared::LeaseShared;
use crate::token::{Fence, OwnerToken};

/// A client's table is swept of ended entries when it has grown to this many at least.
const MIN_SWEEP: usize = 64;

/// Where a store reports that a grant ended on the store's side while its holder may still
/// believe it holds it — the session holding a session-bound lock ended (the server
/// restarted, the session was killed) — so that the holder loses the lease at once rather
/// than at its next renewal.
///
/// A store that can see such ends keeps one and returns it from
/// [`Store::ended_grants`](crate::Store::ended_grants); every
/// [`LeaseClient`](crate::LeaseClient) built on the store subscribes to it then. Stores
/// whose leases end only by expiry have none: their holders learn at their renewals (and
/// at their deadlines), which come before the store-side expiry.
///
/// A store keeps one `EndedGrants`, returns it from `ended_grants`, and calls
/// [`report`](Self::report) with the grant's key, owner and fence when it sees the session
/// holding that grant end, *before* it lets go of anything that may still hold the lock.
#[derive(Debug, Default)]
pub struct EndedGrants {
    clients: Mutex<Vec<Weak<Tracked>>>,
}

impl EndedGrants {
    /// Nobody subscribed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports that the grant of `key` to `owner` at `fence` ended on the store's side.
    /// Every client of the store that holds that lease marks it lost
    /// ([`LostReason::SessionEnded`]: `is_valid()` is false, the lost signal fired) before
    /// this returns. A report that comes before the client has taken the grant in (its
    /// acquire's reply still on its way) is kept, and the lease is lost the moment it is.
    ///
    /// Returns `true` when a client had the grant: no holder believes it holds it any more
    /// (lost now, or ended before). `false` when no client knows it yet (a caller of the
    /// store's own methods, or an acquire whose reply is on its way): the store cannot
    /// tell whether the holder still believes, so it should keep anything it can still
    /// hold (a session that may hold the lock) until the holder's deadline.
    pub fn report(&self, key: &Key, owner: &OwnerToken, fence: Fence) -> bool {
        let clients: Vec<Arc<Tracked>> = {
            let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
            clients.retain(|c| c.strong_count() > 0);
            clients.iter().filter_map(Weak::upgrade).collect()
        };
        let mut known = false;
        for client in clients {
            known |= client.ended(key, owner, fence);
        }
        known
    }

    /// Subscribes a client whose leases are timed on `clock` and never valid longer than
    /// `ttl` after their acquire's send (how long an early report is kept).
    pub(crate) fn subscribe(&self, clock: LeaseClock, ttl: Duration) -> Arc<Tracked> {
        let tracked = Arc::new(Tracked {
            clock,
            keep_early: ttl,
            state: Mutex::new(State {
                leases: HashMap::new(),
                sweep_at: MIN_SWEEP,
            }),
        });
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&tracked));
        tracked
    }
}

/// One client's leases on a store that reports ended grants.
#[derive(Debug)]
pub(crate) struct Tracked {
    clock: LeaseClock,
    keep_early: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    leases: HashMap<(Key, OwnerToken), Entry>,
    /// The size at which the table is next swept (twice its size after the last sweep),
    /// so the sweeps cost a constant per entry.
    sweep_at: usize,
}

#[derive(Debug)]
enum Entry {
    /// A lease of this client.
    Held {
        fence: Fence,
        lease: Weak<LeaseShared>,
    },
    /// A grant reported ended before any lease of it was tracked here.
    Ended { fence: Fence, at: At },
}

impl State {
    fn sweep_if_due(&mut self, now: At, keep_early: Duration) {
        if self.leases.len() < self.sweep_at {
            return;
        }
        self.leases.retain(|_, e| match e {
            Entry::Held { lease, .. } => lease.upgrade().is_some_and(|l| !l.is_done()),
            Entry::Ended { at, .. } => now.since(*at) < keep_early,
        });
        self.sweep_at = (self.leases.len() * 2).max(MIN_SWEEP);
    }
}

impl Tracked {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in a lease just granted; lost at once if its grant was reported ended.
    pub(crate) fn track(&self, lease: &Arc<LeaseShared>) {
        let now = self.clock.now();
        let ended_before = {
            let mut s = self.lock();
            s.sweep_if_due(now, self.keep_early);
            let entry = Entry::Held {
                fence: lease.fence,
                lease: Arc::downgrade(lease),
            };
            let old = s.leases.insert((lease.key.clone(), lease.owner), entry);
            matches!(old, Some(Entry::Ended { fence, .. }) if fence == lease.fence)
        };
        if ended_before {
            lease.mark_lost(LostReason::SessionEnded);
        }
    }

    /// The grant `(key, owner, fence)` ended: loses its lease here, if any. Whether this
    /// client had the grant.
    fn ended(&self, key: &Key, owner: &OwnerToken, fence: Fence) -> bool {
        let now = self.clock.now();
        let lease = {
            let mut s = self.lock();
            s.sweep_if_due(now, self.keep_early);
            let id = (key.clone(), *owner);
            match s.leases.get(&id) {
                // Another fence of the same owner is another grant: this one is nobody's
                // (an owner's acquire takes in one grant and ends). The entry stays until
                // a sweep finds the lease ended, so a report again is known too.
                Some(Entry::Held { fence: f, lease }) => {
                    (*f == fence).then(|| lease.upgrade()).flatten()
                }
                _ => {
                    s.leases.insert(id, Entry::Ended { fence, at: now });
                    return false;
                }
            }
        };
        if let Some(lease) = lease {
            lease.mark_lost(LostReason::SessionEnded);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::store::AcquireOutcome;
    use crate::store::memory::MemoryStore;
    use crate::{LeaseClient, LeaseConfig, Store, StoreError};

    /// The memory store, reporting ended grants; a grant of a key starting with `dies:`
    /// is reported ended before its acquire answers (its session died with the reply on
    /// its way).
    #[derive(Debug, Default)]
    struct Reporting {
        inner: MemoryStore,
        ended: EndedGrants,
    }

    #[async_trait]
    impl crate::wrap::Forward for Reporting {
        fn inner(&self) -> &dyn Store {
            &self.inner
        }
        fn backend(&self) -> &'static str {
            "reporting"
        }
        fn ended_grants(&self) -> Option<&EndedGrants> {
            Some(&self.ended)
        }
        async fn acquire(
            &self,
            key: &Key,
            owner: &OwnerToken,
            ttl: Duration,
        ) -> Result<AcquireOutcome, StoreError> {
            let got = self.inner.acquire(key, owner, ttl).await?;
            if let AcquireOutcome::Acquired { fence, .. } = got
                && key.as_str().starts_with("dies:")
            {
                assert!(!self.ended.report(key, owner, fence), "not taken in yet");
            }
            Ok(got)
        }
    }

    fn config() -> LeaseConfig {
        LeaseConfig::builder(Duration::from_secs(3))
            .watchdog_thread(false)
            .build()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_reported_grant_is_lost_before_the_report_returns() {
        let store = Arc::new(Reporting::default());
        let (a, b) = (
            LeaseClient::new(store.clone(), config()),
            LeaseClient::new(store.clone(), config()),
        );
        let mine = a.try_acquire("s:one").await.unwrap();
        let other = b.try_acquire("s:two").await.unwrap();
        let signal = mine.lost();
        assert!(store.ended.report(mine.key(), mine.owner(), mine.fence()));
        // At once, before the runtime runs anything else.
        assert!(!mine.is_valid());
        assert!(signal.is_lost());
        assert_eq!(mine.lost_reason(), Some(LostReason::SessionEnded));
        assert!(other.is_valid(), "another lease is untouched");
        // The scheduler forgets it and renews the other one on.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(other.is_valid());
        assert_eq!(mine.lost_reason(), Some(LostReason::SessionEnded));
        // Reported again: known (nobody believes it), nothing more happens.
        assert!(store.ended.report(mine.key(), mine.owner(), mine.fence()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_outliving_its_client_is_still_told() {
        let store = Arc::new(Reporting::default());
        let lease = {
            let client = LeaseClient::new(store.clone(), config());
            client.try_acquire("s:kept").await.unwrap()
        };
        assert!(
            store
                .ended
                .report(lease.key(), lease.owner(), lease.fence())
        );
        assert_eq!(lease.lost_reason(), Some(LostReason::SessionEnded));
    }

    #[tokio::test(start_paused = true)]
    async fn another_grant_of_the_same_owner_or_an_unknown_one_is_not_lost() {
        let store = Arc::new(Reporting::default());
        let a = LeaseClient::new(store.clone(), config());
        let lease = a.try_acquire("s:one").await.unwrap();
        let stale = Fence(lease.fence().get() + 1);
        assert!(
            store.ended.report(lease.key(), lease.owner(), stale),
            "another grant: nobody holds that one"
        );
        assert!(lease.is_valid());
        let nobody = OwnerToken::random();
        assert!(
            !store.ended.report(lease.key(), &nobody, lease.fence()),
            "no client has it: the store must keep what it holds"
        );
        assert!(lease.is_valid());
        // Without a client, nobody is told.
        let alone = EndedGrants::new();
        assert!(!alone.report(lease.key(), lease.owner(), lease.fence()));
        assert!(lease.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_before_the_grant_is_taken_in_loses_it_when_it_is() {
        let store = Arc::new(Reporting::default());
        let a = LeaseClient::new(store.clone(), config());
        let lease = a.try_acquire("dies:early").await.unwrap();
        assert!(!lease.is_valid());
        assert_eq!(lease.lost_reason(), Some(LostReason::SessionEnded));
    }

    #[tokio::test(start_paused = true)]
    async fn early_reports_are_kept_one_ttl_and_the_table_stays_small() {
        let ended = EndedGrants::new();
        let ttl = Duration::from_secs(3);
        let clock = LeaseClock::default();
        let tracked = ended.subscribe(clock.clone(), ttl);
        let owner = OwnerToken::random();
        let grant = |key: &str, fence: u64| {
            let now = clock.now();
            Arc::new(LeaseShared::new(
                crate::lease::shared::Grant {
                    key: Key::new(key).unwrap(),
                    owner,
                    fence: Fence(fence),
                    ttl,
                    sent_at: now,
                    valid_until: now.add(Duration::from_secs(2)),
                },
                "test",
                clock.clone(),
            ))
        };
        let key = Key::new("s:early").unwrap();
        assert!(!ended.report(&key, &owner, Fence(1)));
        assert!(!ended.report(&key, &owner, Fence(2)), "the latest report");
        let first = grant("s:early", 1);
        tracked.track(&first);
        assert_eq!(
            first.lost_reason(),
            None,
            "another grant than the one reported"
        );
        // Kept one TTL at most.
        let key = Key::new("s:late").unwrap();
        assert!(!ended.report(&key, &owner, Fence(5)));
        tokio::time::sleep(ttl + Duration::from_secs(1)).await;
        for i in 0..MIN_SWEEP {
            let filler = Key::new(format!("s:filler{i}")).unwrap();
            assert!(!ended.report(&filler, &owner, Fence(1)));
        }
        let later = grant("s:late", 5);
        tracked.track(&later);
        assert_eq!(
            later.lost_reason(),
            None,
            "an early report older than a TTL is gone"
        );
        let n = tracked.lock().leases.len();
        assert!(n <= MIN_SWEEP + 2, "{n} entries: not swept");
        drop(later);
        drop(tracked);
        assert!(
            !ended.report(&key, &owner, Fence(5)),
            "a dropped client is not told"
        );
        assert!(ended.clients.lock().unwrap().is_empty());
    }

    /// A sweep runs once the table reaches its threshold (not one entry later), drops
    /// exactly the entries nobody needs (a lease that ended or was dropped, an early report
    /// a TTL old), keeps the rest (a live lease, a younger report), and sets the next
    /// threshold at twice what it kept.
    #[tokio::test(start_paused = true)]
    async fn a_sweep_drops_exactly_the_entries_nobody_needs() {
        let clock = LeaseClock::default();
        let keep_early = Duration::from_secs(3);
        let t0 = clock.now();
        let owner = OwnerToken::random();
        let shared = |key: &str| {
            Arc::new(LeaseShared::new(
                crate::lease::shared::Grant {
                    key: Key::new(key).unwrap(),
                    owner,
                    fence: Fence(1),
                    ttl: keep_early,
                    sent_at: t0,
                    valid_until: t0.add(Duration::from_secs(2)),
                },
                "test",
                clock.clone(),
            ))
        };
        let id = |key: &str| (Key::new(key).unwrap(), owner);
        let held = |l: &Arc<LeaseShared>| Entry::Held {
            fence: Fence(1),
            lease: Arc::downgrade(l),
        };
        let mut s = State {
            leases: HashMap::new(),
            sweep_at: MIN_SWEEP,
        };
        // 40 live leases: kept, and the next threshold is 80, above MIN_SWEEP.
        let live: Vec<_> = (0..40).map(|i| shared(&format!("live{i}"))).collect();
        for (i, l) in live.iter().enumerate() {
            s.leases.insert(id(&format!("live{i}")), held(l));
        }
        let ended = shared("ended");
        ended.mark_lost(LostReason::Expired);
        s.leases.insert(id("ended"), held(&ended));
        s.leases.insert(id("dropped"), held(&shared("dropped")));
        s.leases.insert(
            id("old-report"),
            Entry::Ended {
                fence: Fence(1),
                at: t0,
            },
        );
        s.leases.insert(
            id("young-report"),
            Entry::Ended {
                fence: Fence(1),
                at: t0.add(Duration::from_secs(1)),
            },
        );
        let now = t0.add(keep_early);
        // One short of the threshold: nothing happens.
        s.sweep_at = s.leases.len() + 1;
        s.sweep_if_due(now, keep_early);
        assert_eq!(s.leases.len(), 44);
        // At the threshold: swept.
        s.sweep_at = s.leases.len();
        s.sweep_if_due(now, keep_early);
        let mut kept: Vec<&str> = s.leases.keys().map(|(k, _)| k.as_str()).collect();
        kept.sort_unstable();
        assert_eq!(kept.len(), 41, "{kept:?}");
        assert!(kept.contains(&"young-report") && !kept.contains(&"old-report"));
        assert!(!kept.contains(&"ended") && !kept.contains(&"dropped"));
        assert_eq!(s.sweep_at, 82);
        drop(live);
    }
}
