//! Waking waiters without polling where a process can: the in-process release bells.
//!
//! Every [`SqliteStore`](crate::SqliteStore) of this process that opened the same database
//! file (the same canonical path) shares one [`Bells`]: a [`Notify`] per key that has a
//! waiter, rung by a release or a break made through any of those stores, and a record of
//! the owners whose leases were granted through them (so that a waiter knows whether a
//! release will ring its bell). Other processes cannot ring it: a waiter whose holder was
//! granted elsewhere re-reads the lease row every [`CROSS_PROCESS_POLL`] (never later than
//! the holder's remaining TTL).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Duration;

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

#[derive(Default)]
struct Inner {
    /// Per key with waiters: its bell and how many waiters listen.
    bells: HashMap<Key, (Arc<Notify>, usize)>,
    /// Per key: the owner last granted through a store of this process, if not released.
    holders: HashMap<Key, OwnerToken>,
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

    /// Rings `key`'s bell: every waiter listening now re-checks.
    fn ring(inner: &Inner, key: &Key) {
        if let Some((n, _)) = inner.bells.get(key) {
            n.notify_waiters();
        }
    }

    /// `owner` was granted `key` through a store of this process.
    pub(crate) fn granted(&self, key: &Key, owner: &OwnerToken) {
        let mut inner = self.lock();
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
        Self::ring(&inner, key);
    }

    /// `key` was broken: its waiters are woken.
    pub(crate) fn broken(&self, key: &Key) {
        let mut inner = self.lock();
        inner.holders.remove(key);
        Self::ring(&inner, key);
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
