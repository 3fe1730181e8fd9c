//! An in-memory store: one process only. For single-process programs and for users' own
//! tests; it passes the whole conformance suite. To make it misbehave in tests, wrap it
//! in a `FaultStore` (`wrap::FaultStore`, with the `test-util` feature).
//!
//! Expiry uses tokio's clock, so it follows paused time in tests. Fences live in process
//! memory ([`FenceDurability::Process`]): they start again at 1 in a new process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::StoreError;
use crate::key::Key;
use crate::store::doctor::{Diagnosis, Finding, Verdict};
use crate::store::{
    AcquireOutcome, Capabilities, FenceDurability, LeaseInfo, Record, ReleaseOutcome, RenewOutcome,
    Store,
};
use crate::store::{Changes, WaitStore, WatchStore};
use crate::token::{Fence, OwnerToken};

const BACKEND: &str = "memory";

#[derive(Debug, Clone)]
struct Held {
    owner: OwnerToken,
    fence: Fence,
    expires_at: Instant,
}

#[derive(Debug, Default)]
struct State {
    leases: HashMap<Key, Held>,
    /// The last fence issued per key; never removed, never lowered.
    fences: HashMap<Key, u64>,
    records: HashMap<Key, Record>,
}

impl State {
    fn live(&self, key: &Key, now: Instant) -> Option<&Held> {
        self.leases.get(key).filter(|h| h.expires_at > now)
    }
}

/// The in-memory store. Cloning shares the same leases.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    released: Arc<Notify>,
    /// Counts the changes [`WatchStore::watch`] notifies (of any key: a watcher of one key
    /// is also woken by the others', which the contract allows).
    changes: Arc<tokio::sync::watch::Sender<u64>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the watchers.
    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Fault hook: the store forgets the record at `key` (as a store restarted without
    /// persistence would). Feature `test-util`.
    #[cfg(feature = "test-util")]
    pub fn forget_record(&self, key: &Key) {
        self.lock().records.remove(key);
    }

    /// Fault hook: the store forgets the lease at `key` (as if it expired early or the
    /// store lost it). The fence counter is kept. Feature `test-util`.
    #[cfg(feature = "test-util")]
    pub fn forget(&self, key: &Key) {
        self.lock().leases.remove(key);
        self.released.notify_waiters();
        self.changed();
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fifo_wait: false,
            reports_remaining: true,
            session_bound: false,
            fence_durability: FenceDurability::Process,
            may_evict: false,
            hands_off: false,
            sets_expiry: true,
        }
    }

    fn watcher(&self) -> Option<&dyn WatchStore> {
        Some(self)
    }

    /// The server is this process: leases and fences end with it.
    async fn diagnose(&self) -> Result<Diagnosis, StoreError> {
        let mut d = Diagnosis::new();
        d.fact(
            "server version",
            "the in-memory store of leasehold-core, in this process",
        );
        d.fact("TLS", "not applicable: nothing leaves the process");
        d.finding(Finding::new(
            "restart with persistence",
            Verdict::DoesNotHold,
            "storage=process memory",
            "leases and fences end with the process; another process sees none of them",
        ));
        Ok(d)
    }

    fn waiter(&self) -> Option<&dyn WaitStore> {
        Some(self)
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(h) = s.live(key, now) {
            if h.owner != *owner {
                return Ok(AcquireOutcome::Held {
                    remaining: Some(h.expires_at - now),
                });
            }
            let fence = h.fence;
            s.leases.get_mut(key).expect("live").expires_at = now + ttl;
            return Ok(AcquireOutcome::Acquired { fence, ttl });
        }
        let last = s.fences.entry(key.clone()).or_insert(0);
        *last += 1;
        let fence = Fence(*last);
        s.leases.insert(
            key.clone(),
            Held {
                owner: *owner,
                fence,
                expires_at: now + ttl,
            },
        );
        drop(s);
        self.changed();
        Ok(AcquireOutcome::Acquired { fence, ttl })
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        let now = Instant::now();
        let mut s = self.lock();
        match s.leases.get_mut(key) {
            Some(h) if h.expires_at > now && h.owner == *owner => {
                h.expires_at = now + ttl;
                Ok(RenewOutcome::Renewed { ttl })
            }
            _ => Ok(RenewOutcome::NotOwner),
        }
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let now = Instant::now();
        let mut s = self.lock();
        let ours = s.live(key, now).is_some_and(|h| h.owner == *owner);
        if !ours {
            return Ok(ReleaseOutcome::NotOwner);
        }
        s.leases.remove(key);
        drop(s);
        self.released.notify_waiters();
        self.changed();
        Ok(ReleaseOutcome::Released)
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let now = Instant::now();
        Ok(self.lock().live(key, now).map(|h| LeaseInfo {
            key: key.clone(),
            owner: h.owner,
            fence: h.fence,
            remaining: Some(h.expires_at - now),
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        let now = Instant::now();
        let s = self.lock();
        let mut out: Vec<LeaseInfo> = s
            .leases
            .iter()
            .filter(|(k, h)| k.as_str().starts_with(prefix) && h.expires_at > now)
            .map(|(k, h)| LeaseInfo {
                key: k.clone(),
                owner: h.owner,
                fence: h.fence,
                remaining: Some(h.expires_at - now),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let mut s = self.lock();
        s.leases.remove(key);
        let last = s.fences.entry(key.clone()).or_insert(0);
        *last += 1;
        let fence = Fence(*last);
        drop(s);
        self.released.notify_waiters();
        self.changed();
        Ok(fence)
    }

    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        let mut s = self.lock();
        let mut written = false;
        let slot = s.records.entry(key.clone()).or_insert_with(|| {
            written = true;
            Record {
                fence,
                value: value.to_vec(),
            }
        });
        if slot.fence < fence {
            *slot = Record {
                fence,
                value: value.to_vec(),
            };
            written = true;
        }
        let stored = slot.clone();
        drop(s);
        if written {
            self.changed();
        }
        Ok(stored)
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().records.get(key).cloned())
    }
}

#[async_trait]
impl WaitStore for MemoryStore {
    async fn wait_released(
        &self,
        key: &Key,
        _owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let deadline = crate::clock::saturating_add(Instant::now(), timeout);
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let expires_at = match self.lock().live(key, Instant::now()) {
                None => return Ok(()),
                Some(h) => h.expires_at,
            };
            // Expiry is not notified: wake at the holder's expiry at the latest.
            let wake = expires_at.min(deadline);
            if tokio::time::timeout_at(wake, notified).await.is_err() && wake == deadline {
                return Ok(());
            }
        }
    }
}

#[async_trait]
impl WatchStore for MemoryStore {
    async fn watch(&self, _key: &Key) -> Result<Changes, StoreError> {
        let rx = self.changes.subscribe();
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some((Ok(()), rx))
        })
        .boxed())
    }
}
