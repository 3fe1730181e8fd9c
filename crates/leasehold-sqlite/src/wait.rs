//! Waking waiters without polling where a process can: the in-process release bells, and
//! the in-process queue.
//!
//! Every [`SqliteStore`](crate::SqliteStore) of this process that opened the same database
//! file (the same canonical path) shares one [`Bells`]: per key, the owners of this process
//! that wait after their acquire was told `Held`, in arrival order, each with its own
//! [`Notify`]; a [`Notify`] for bare waits (`wait_released` alone); and a record of the
//! owners whose leases were granted through these stores (so that a waiter knows whether
//! a release will ring). A release or a break made through any of those stores rings the
//! bare waits' bell and the first queued owner's (and, while the first ones are not
//! waiting, the next ones', up to one that is). A free lease goes to the first queued owner
//! of this process: a newcomer of this process is told `Held` meanwhile. A queued owner
//! that neither waits nor acquires for [`GRACE`] loses its place. Other processes cannot
//! ring the bells nor see the queue: a waiter whose holder was granted elsewhere re-reads
//! the lease row every [`CROSS_PROCESS_POLL`] (never later than the holder's remaining
//! TTL), and a newcomer of another process may take a free lease before the queue.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use leasehold_core::{Key, OwnerToken};
use tokio::sync::Notify;

/// How often a waiter re-reads the lease row when its holder was granted by another
/// process (whose release cannot ring this process's bell). A waiter whose holder was
/// granted in this process is woken by the release itself and re-reads only at the
/// holder's expiry. Either way a wait never outlasts the holder's remaining TTL.
pub const CROSS_PROCESS_POLL: Duration = Duration::from_millis(100);

/// Above this many recorded holders (leases granted here and not released: some may have
/// expired unreleased), the records are cleared; a missing record only makes a waiter
/// re-read the row as it does for another process's holder.
const MAX_HOLDERS: usize = 100_000;

/// How long a queued owner keeps its place while it neither waits nor acquires.
pub(crate) const GRACE: Duration = Duration::from_millis(500);

/// How long an owner told `Held` makes its next wait join the queue (rather than be a
/// bare wait, which takes no place).
const NOTED_FRESH: Duration = Duration::from_secs(5);

/// An owner of this process waiting for a key, in the key's queue: its own bell, and
/// whether it is still around.
struct Claim {
    owner: OwnerToken,
    bell: Arc<Notify>,
    /// Its `wait_released` calls under way.
    waiting: usize,
    /// When it last asked (acquire or wait) or stopped waiting.
    last: Instant,
}

impl Claim {
    fn alive(&self, now: Instant) -> bool {
        self.waiting > 0 || now.duration_since(self.last) < GRACE
    }
}

#[derive(Default)]
struct Inner {
    /// Per key with waiters: its bell and how many waiters listen.
    bells: HashMap<Key, (Arc<Notify>, usize)>,
    /// Per key: the owner last granted through a store of this process, if not released.
    holders: HashMap<Key, OwnerToken>,
    /// Per key: the owners of this process that wait after being told `Held`, in
    /// arrival order.
    queues: HashMap<Key, VecDeque<Claim>>,
    /// The owners told `Held` lately, and when: their next wait joins the queue.
    noted: HashMap<(Key, OwnerToken), Instant>,
}

impl Inner {
    /// `key`'s queue without the owners that went away; `None` when empty.
    fn queue(&mut self, key: &Key) -> Option<&mut VecDeque<Claim>> {
        let now = Instant::now();
        let q = self.queues.get_mut(key)?;
        q.retain(|c| c.alive(now));
        if q.is_empty() {
            self.queues.remove(key);
            return None;
        }
        self.queues.get_mut(key)
    }
}

/// The release bells of one database file, shared by the stores of this process.
#[derive(Default)]
pub(crate) struct Bells {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Bells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Bells")
            .field("keys_waited_for", &inner.bells.len())
            .field("holders", &inner.holders.len())
            .finish()
    }
}

/// Every database file's bells in this process, by canonical path.
static FILES: LazyLock<Mutex<HashMap<PathBuf, Weak<Bells>>>> = LazyLock::new(Default::default);

impl Bells {
    /// The bells of the database file at `path` (shared with every store of this process
    /// on the same file).
    pub(crate) fn of_file(path: &Path) -> Arc<Bells> {
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = files.get(&canonical).and_then(Weak::upgrade) {
            return b;
        }
        files.retain(|_, w| w.strong_count() > 0);
        let b = Arc::new(Bells::default());
        files.insert(canonical, Arc::downgrade(&b));
        b
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Listens to `key`'s bell until the returned guard is dropped.
    pub(crate) fn listen(self: &Arc<Self>, key: &Key) -> Listening {
        let mut inner = self.lock();
        let entry = inner
            .bells
            .entry(key.clone())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Listening {
            bells: self.clone(),
            key: key.clone(),
            notify: entry.0.clone(),
        }
    }

    /// Rings `key`'s bells: every bare waiter re-checks, and so does the first owner of
    /// the key's queue (only it may take the lease) — and, while the first ones are not
    /// waiting (they may have gone away), the owners behind them, up to one that waits.
    fn ring(inner: &mut Inner, key: &Key) {
        if let Some((n, _)) = inner.bells.get(key) {
            n.notify_waiters();
        }
        if let Some(q) = inner.queue(key) {
            for c in q.iter() {
                c.bell.notify_one();
                if c.waiting > 0 {
                    break;
                }
            }
        }
    }

    /// `owner`'s acquire of `key` found it held: its next wait joins the key's queue (or
    /// keeps its place).
    pub(crate) fn held(&self, key: &Key, owner: &OwnerToken) {
        let mut inner = self.lock();
        let now = Instant::now();
        if inner.noted.len() >= 4096 {
            inner
                .noted
                .retain(|_, at| now.duration_since(*at) < NOTED_FRESH);
        }
        inner.noted.insert((key.clone(), *owner), now);
        if let Some(c) = inner
            .queues
            .get_mut(key)
            .and_then(|q| q.iter_mut().find(|c| c.owner == *owner))
        {
            c.last = now;
        }
    }

    /// Whether `owner` may take `key` now: nobody of this process queues for it, or
    /// `owner` is first. (Other processes' newcomers are not held back.)
    pub(crate) fn may_acquire(&self, key: &Key, owner: &OwnerToken) -> bool {
        let mut inner = self.lock();
        let Some(q) = inner.queue(key) else {
            return true;
        };
        if let Some(c) = q.iter_mut().find(|c| c.owner == *owner) {
            c.last = Instant::now();
        }
        q.front().is_some_and(|c| c.owner == *owner)
    }

    /// `owner`'s place in `key`'s queue while it waits, joining at the back if it was told
    /// `Held` lately; `None` for a bare wait.
    pub(crate) fn claim(self: &Arc<Self>, key: &Key, owner: &OwnerToken) -> Option<Waiting> {
        let mut inner = self.lock();
        let noted = inner
            .noted
            .get(&(key.clone(), *owner))
            .is_some_and(|at| at.elapsed() < NOTED_FRESH);
        let q = inner.queues.entry(key.clone()).or_default();
        let bell = match q.iter_mut().find(|c| c.owner == *owner) {
            Some(c) => {
                c.waiting += 1;
                c.bell.clone()
            }
            None if noted => {
                let bell = Arc::new(Notify::new());
                q.push_back(Claim {
                    owner: *owner,
                    bell: bell.clone(),
                    waiting: 1,
                    last: Instant::now(),
                });
                bell
            }
            None => {
                if q.is_empty() {
                    inner.queues.remove(key);
                }
                return None;
            }
        };
        Some(Waiting {
            bells: self.clone(),
            key: key.clone(),
            owner: *owner,
            bell,
        })
    }

    /// Whose turn it is in `key`'s queue, as `owner` sees it.
    pub(crate) fn turn(&self, key: &Key, owner: &OwnerToken) -> Turn {
        let mut inner = self.lock();
        let Some(q) = inner.queue(key) else {
            return Turn::Mine;
        };
        match q.front() {
            Some(c) if c.owner == *owner => Turn::Mine,
            Some(c) if c.waiting > 0 => Turn::Waiting,
            Some(c) => Turn::Lapses(c.last + GRACE),
            None => Turn::Mine,
        }
    }

    /// `owner` was granted `key` through a store of this process: it leaves the queue.
    pub(crate) fn granted(&self, key: &Key, owner: &OwnerToken) {
        let mut inner = self.lock();
        inner.noted.remove(&(key.clone(), *owner));
        if let Some(q) = inner.queues.get_mut(key) {
            q.retain(|c| c.owner != *owner);
            if q.is_empty() {
                inner.queues.remove(key);
            }
        }
        if inner.holders.len() >= MAX_HOLDERS && !inner.holders.contains_key(key) {
            inner.holders.clear();
        }
        inner.holders.insert(key.clone(), *owner);
    }

    /// `owner` released `key`: its waiters are woken.
    pub(crate) fn released(&self, key: &Key, owner: &OwnerToken) {
        let mut inner = self.lock();
        if inner.holders.get(key) == Some(owner) {
            inner.holders.remove(key);
        }
        Self::ring(&mut inner, key);
    }

    /// `key` was broken: its waiters are woken.
    pub(crate) fn broken(&self, key: &Key) {
        let mut inner = self.lock();
        inner.holders.remove(key);
        Self::ring(&mut inner, key);
    }

    /// Whether `owner`'s lease of `key` was granted in this process (so its release rings
    /// the bell).
    pub(crate) fn held_here(&self, key: &Key, owner: &OwnerToken) -> bool {
        self.lock().holders.get(key) == Some(owner)
    }
}

/// A waiter listening to a key's bell; stops listening when dropped.
pub(crate) struct Listening {
    bells: Arc<Bells>,
    key: Key,
    notify: Arc<Notify>,
}

impl Listening {
    /// The bell.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let mut inner = self.bells.lock();
        if let Some(entry) = inner.bells.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                inner.bells.remove(&self.key);
            }
        }
    }
}

/// Whose turn it is in a key's queue, as seen by one owner.
pub(crate) enum Turn {
    /// The owner's (or nobody queues).
    Mine,
    /// The first owner's, who is waiting (it is woken by the release).
    Waiting,
    /// The first owner's, who is not waiting: its place lapses then unless it comes back.
    Lapses(Instant),
}

/// An owner waiting in its key's queue; stops waiting (and keeps its place for [`GRACE`])
/// when dropped.
pub(crate) struct Waiting {
    bells: Arc<Bells>,
    key: Key,
    owner: OwnerToken,
    bell: Arc<Notify>,
}

impl Waiting {
    /// The owner's own bell, rung when its turn may have come.
    pub(crate) fn bell(&self) -> &Notify {
        &self.bell
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut inner = self.bells.lock();
        if let Some(q) = inner.queues.get_mut(&self.key)
            && let Some(i) = q.iter().position(|c| c.owner == self.owner)
        {
            let c = &mut q[i];
            c.waiting = c.waiting.saturating_sub(1);
            c.last = Instant::now();
            if i == 0 && c.waiting == 0 {
                // The first owner stopped waiting: about to acquire, or gone (cancelled,
                // out of time) after its turn came. The owners behind it look again, and
                // take its place if it does not come back within the grace period.
                for next in q.iter().skip(1) {
                    next.bell.notify_one();
                    if next.waiting > 0 {
                        break;
                    }
                }
            }
        }
    }
}
