//! Change notices ([`WatchStore::watch`](leasehold_core::WatchStore::watch)) of both stores:
//! `LISTEN`/`NOTIFY`, sent only while somebody watches the key.
//!
//! **Who watches.** A watcher of key `k` holds, on its store's one watch session, the
//! advisory lock `W(k)` in *shared* mode (two-int4 form, `objsubid = 2` in `pg_locks`,
//! made of the first 8 bytes of SHA-256 of `leasehold-watch`, the records table as in SQL
//! and the key, NUL-separated: [`lock_of`]). Any number of watchers, in any process, hold
//! it at once.
//!
//! **Who notifies.** Every statement that grants, releases or breaks a lease, or writes a
//! record, ends with [`notify_sql`]: when it changed something, it *tries* `W(k)` in
//! exclusive mode for its own transaction (`pg_try_advisory_xact_lock`, which never
//! waits). The try fails only while a watcher holds the shared lock (or queues for it, or
//! another writer of `k` holds it for the moment of its own commit); then, and only then,
//! the statement calls `pg_notify(channel, payload)`, which the server sends at commit.
//! Nobody watching: one lock-table entry for the transaction, no `NOTIFY`, no round trip,
//! no statement more.
//!
//! **No notice is missed.** The watch session `LISTEN`s before it asks for `W(k)`, and
//! [`Watches::watch`] returns only once the server granted it. A writer whose try comes
//! later fails it and notifies; a writer whose try came earlier holds `W(k)` until it
//! commits, so the watcher's shared lock (and `watch`) waits for that commit: its change
//! is older than the watch.
//!
//! **Channel and payload.** One channel per records table (both stores of one schema
//! share it, as they share the records): `leasehold_watch_` and 16 hex digits of SHA-256
//! of `leasehold-watch-channel` and the records table, 32 bytes, well under the 63 of an
//! identifier. The payload is `W(k)` as 16 hex digits whatever the key, never the key
//! itself (which may be long and hold any character), so the 8000-byte payload limit
//! cannot be reached. Two keys sharing 64 bits of digest share notices,
//! which the contract allows (a spurious notice).
//!
//! **One session per store.** It is opened by the first watch and closed when the last
//! stream is dropped (which releases every `W` lock it held). It pings every
//! [`PING_EVERY`] and has an `idle_session_timeout` of [`SESSION_IDLE`]: a watcher
//! process that freezes or vanishes stops costing `NOTIFY`s after that long. A session
//! that fails (a ping unanswered within [`SETUP`], a reset, a server restart) ends every
//! stream on it with an `Err` item: notices may have been lost, the watcher reads again
//! and watches anew (a new session).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{Changes, Key, StoreError, StoreErrorKind};
use sqlx::postgres::{PgConnectOptions, PgListener};
use tokio::sync::{mpsc, oneshot};

use crate::config::TableName;
use crate::error;
use crate::listen::listener_pool;
use crate::sql::digest64;
use crate::wait::LockId;

/// Bounds setting a watch up (connecting, `LISTEN`, the shared lock) and each ping.
pub(crate) const SETUP: Duration = Duration::from_secs(10);
/// The watch session's `lock_timeout` (and, one second more, its `statement_timeout`): a
/// watch lock that is not granted within this fails that one watch (`Busy`), before
/// [`SETUP`] would end the whole session.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(8);
/// How often an idle watch session is pinged (which also finds a dead connection).
pub(crate) const PING_EVERY: Duration = Duration::from_secs(2);
/// The watch session's `idle_session_timeout`: how long the server keeps the `W` locks
/// (and so keeps notifying) of a watcher process that stopped answering.
pub(crate) const SESSION_IDLE: Duration = Duration::from_secs(15);

/// The channel of the records table `records` (as in SQL).
pub(crate) fn channel(records: &TableName) -> String {
    format!(
        "leasehold_watch_{:016x}",
        digest64(&["leasehold-watch-channel", &records.sql()])
    )
}

/// `W(key)`: the advisory lock that says somebody watches `key` (see the module docs).
pub(crate) fn lock_of(records_sql: &str, key: &Key) -> LockId {
    LockId::pair(digest64(&["leasehold-watch", records_sql, key.as_str()]))
}

/// The payload of `W(key)`'s notices: its 64 bits in hex (what `notify_sql` sends).
#[cfg(test)]
fn payload_of(lock: LockId) -> String {
    format!("{:016x}", lock.bits())
}

/// A boolean SQL expression for the end of a statement that may have changed `key_sql`
/// (a text expression, e.g. `$1`): when `changed_sql` is true and somebody watches, it
/// sends the notice (at commit) and is true; otherwise false, without notifying. The lock
/// and payload are computed in the statement (one SHA-256) so that no statement needs a
/// parameter more; the scalar subquery is only evaluated when `changed_sql` is true.
pub(crate) fn notify_sql(records: &TableName, key_sql: &str, changed_sql: &str) -> String {
    let mut prefix = b"leasehold-watch\0".to_vec();
    prefix.extend_from_slice(records.sql().as_bytes());
    prefix.push(0);
    let hex: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
    let channel = channel(records);
    format!(
        "(CASE WHEN {changed_sql} THEN (SELECT CASE WHEN pg_try_advisory_xact_lock(w.hi, w.lo) \
           THEN false ELSE pg_notify('{channel}', w.payload)::text = '' END FROM ( \
             SELECT ('x' || encode(substring(s.d FROM 1 FOR 4), 'hex'))::bit(32)::int4 AS hi, \
               ('x' || encode(substring(s.d FROM 5 FOR 4), 'hex'))::bit(32)::int4 AS lo, \
               encode(substring(s.d FROM 1 FOR 8), 'hex') AS payload \
             FROM (SELECT sha256(decode('{hex}', 'hex') || convert_to({key_sql}, 'UTF8')) AS d) s) w) \
         ELSE false END)"
    )
}

/// One store's watches: the watch session (started on demand) and what it is told.
pub(crate) struct Watches {
    backend: &'static str,
    connect: PgConnectOptions,
    channel: String,
    records_sql: String,
    /// The running session, if any. Commands are sent under this lock, so a session that
    /// takes itself out of it (under the lock) gets no command after.
    slot: Arc<Mutex<Option<Session>>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("channel", &self.channel)
            .field("running", &lock(&self.slot).is_some())
            .finish()
    }
}

#[derive(Clone)]
struct Session {
    generation: u64,
    cmds: mpsc::UnboundedSender<Cmd>,
}

enum Cmd {
    Watch {
        sub: u64,
        lock: LockId,
        notices: mpsc::Sender<Result<(), StoreError>>,
        ready: oneshot::Sender<Result<(), StoreError>>,
    },
    Unwatch {
        sub: u64,
    },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends `Unwatch` for its subscription when dropped (with the stream, or with a `watch`
/// call dropped before it returned).
struct Unwatch {
    sub: u64,
    cmds: mpsc::UnboundedSender<Cmd>,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        // A session that has ended no longer holds anything.
        let _ = self.cmds.send(Cmd::Unwatch { sub: self.sub });
    }
}

impl Watches {
    /// Watches of a store whose records table is `records`, on sessions opened with
    /// `connect`.
    pub(crate) fn new(
        backend: &'static str,
        connect: PgConnectOptions,
        records: &TableName,
    ) -> Self {
        Self {
            backend,
            connect,
            channel: channel(records),
            records_sql: records.sql(),
            slot: Arc::new(Mutex::new(None)),
            next: AtomicU64::new(1),
        }
    }

    /// The channel the notices go to.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Watches `key`: returns once the watch session listens and holds `W(key)`, within
    /// [`SETUP`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call gives its subscription up (the session lets go of
    /// `W(key)` if nobody else here watches it).
    pub(crate) async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        let sub = self.next.fetch_add(1, Ordering::Relaxed);
        let (notices, rx) = mpsc::channel(1);
        let (ready, answer) = oneshot::channel();
        let cmd = Cmd::Watch {
            sub,
            lock: lock_of(&self.records_sql, key),
            notices,
            ready,
        };
        let unwatch = {
            let mut slot = lock(&self.slot);
            let session = match slot.as_ref() {
                Some(s) if !s.cmds.is_closed() => s.clone(),
                _ => {
                    let generation = slot.as_ref().map_or(1, |s| s.generation + 1);
                    let s = self.spawn(generation);
                    *slot = Some(s.clone());
                    s
                }
            };
            // The session takes itself out of the slot (under this lock) before it stops
            // reading commands, so this send reaches a running session.
            if session.cmds.send(cmd).is_err() {
                return Err(self.lost("the watch session ended"));
            }
            Unwatch {
                sub,
                cmds: session.cmds,
            }
        };
        match tokio::time::timeout(SETUP, answer).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(_)) => return Err(self.lost("the watch session ended")),
            Err(_) => {
                return Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    self.backend,
                    format!("setting the watch up took longer than {SETUP:?}"),
                ));
            }
        }
        Ok(
            futures::stream::unfold((rx, unwatch), |(mut rx, unwatch)| async move {
                let item = rx.recv().await?;
                Some((item, (rx, unwatch)))
            })
            .boxed(),
        )
    }

    fn lost(&self, what: &str) -> StoreError {
        StoreError::new(StoreErrorKind::Unavailable, self.backend, what)
    }

    fn spawn(&self, generation: u64) -> Session {
        let (cmds, rx) = mpsc::unbounded_channel();
        let task = Task {
            backend: self.backend,
            channel: self.channel.clone(),
            slot: self.slot.clone(),
            generation,
            cmds: rx,
            subs: HashMap::new(),
            by_lock: HashMap::new(),
        };
        tokio::spawn(task.run(self.connect.clone()));
        Session { generation, cmds }
    }
}

/// The watch session's task: it owns the connection, takes and gives up the `W` locks as
/// told, and hands each notice to the streams of its lock.
struct Task {
    backend: &'static str,
    channel: String,
    slot: Arc<Mutex<Option<Session>>>,
    generation: u64,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    /// Subscription → its lock.
    subs: HashMap<u64, LockId>,
    /// Lock → the streams of its subscriptions (the lock is held while this is not empty).
    by_lock: HashMap<LockId, HashMap<u64, mpsc::Sender<Result<(), StoreError>>>>,
}

/// What woke the task.
enum Event {
    Cmd(Option<Cmd>),
    Notice(Result<Option<sqlx::postgres::PgNotification>, sqlx::Error>),
    Ping,
}

impl Task {
    async fn run(mut self, connect: PgConnectOptions) {
        let pool = listener_pool(connect, SETUP);
        let end = match tokio::time::timeout(SETUP, self.connect(&pool)).await {
            Ok(Ok(listener)) => self.serve(listener).await,
            Ok(Err(e)) => Err(error::map(self.backend, "connecting the watch session", e)),
            Err(_) => Err(self.timeout("connecting the watch session")),
        };
        if let Err(e) = end {
            tracing::debug!(error = %e, "watch session ended");
            self.fail(&e);
        }
        // Ends the session (the listener, dropped, gave its connection back).
        let _ = tokio::time::timeout(Duration::from_secs(2), pool.close()).await;
    }

    async fn connect(&self, pool: &sqlx::PgPool) -> Result<PgListener, sqlx::Error> {
        let mut l = PgListener::connect_with(pool).await?;
        l.ignore_pool_close_event(true);
        // A lost connection ends the session: its locks are gone with it, so it must not
        // come back silently.
        l.eager_reconnect(false);
        let idle = SESSION_IDLE.as_millis().to_string();
        let lock_wait = LOCK_WAIT.as_millis().to_string();
        let statement = (LOCK_WAIT + Duration::from_secs(1)).as_millis().to_string();
        sqlx::query(
            "SELECT set_config('idle_session_timeout', $1, false), \
               set_config('lock_timeout', $2, false), set_config('statement_timeout', $3, false)",
        )
        .bind(idle)
        .bind(lock_wait)
        .bind(statement)
        .execute(&mut l)
        .await?;
        l.listen(&self.channel).await?;
        Ok(l)
    }

    fn timeout(&self, what: &str) -> StoreError {
        StoreError::new(
            StoreErrorKind::Timeout,
            self.backend,
            format!("{what}: no answer within {SETUP:?}"),
        )
    }

    /// Serves until the last stream is gone (`Ok`) or the session fails (`Err`).
    async fn serve(&mut self, mut listener: PgListener) -> Result<(), StoreError> {
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.subs.is_empty() {
                // Nothing watched: stop, unless a command is waiting (taken under the
                // slot's lock, so that none can arrive after the session left the slot).
                let mut slot = lock(&self.slot);
                match self.cmds.try_recv() {
                    Ok(cmd) => {
                        drop(slot);
                        self.command(&mut listener, cmd).await?;
                        continue;
                    }
                    Err(_) => {
                        if slot
                            .as_ref()
                            .is_some_and(|s| s.generation == self.generation)
                        {
                            *slot = None;
                        }
                        return Ok(());
                    }
                }
            }
            let event = tokio::select! {
                cmd = self.cmds.recv() => Event::Cmd(cmd),
                // Cancel safe: sqlx reads a message only once it is whole.
                n = listener.try_recv() => Event::Notice(n),
                _ = ping.tick() => Event::Ping,
            };
            match event {
                Event::Cmd(Some(cmd)) => self.command(&mut listener, cmd).await?,
                // Every sender is gone (the store and every stream were dropped).
                Event::Cmd(None) => return Ok(()),
                Event::Notice(Ok(Some(n))) => self.deliver(n.payload()),
                Event::Notice(Ok(None)) => {
                    return Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        self.backend,
                        "the watch session's connection was lost",
                    ));
                }
                Event::Notice(Err(e)) => return Err(error::map(self.backend, "watching", e)),
                Event::Ping => {
                    let ping = sqlx::raw_sql("SELECT 1").execute(&mut listener);
                    match tokio::time::timeout(SETUP, ping).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(error::map(self.backend, "watching", e)),
                        Err(_) => return Err(self.timeout("pinging the watch session")),
                    }
                }
            }
        }
    }

    async fn command(&mut self, listener: &mut PgListener, cmd: Cmd) -> Result<(), StoreError> {
        match cmd {
            Cmd::Watch {
                sub,
                lock,
                notices,
                ready,
            } => {
                let first = !self.by_lock.contains_key(&lock);
                self.subs.insert(sub, lock);
                self.by_lock.entry(lock).or_default().insert(sub, notices);
                if first {
                    match self
                        .advisory(listener, "pg_advisory_lock_shared", lock)
                        .await
                    {
                        Ok(()) => {}
                        // The server refused this one lock (not granted within the lock
                        // timeout, its lock table full): only this watch fails, the session
                        // goes on.
                        Err(Failure::Refused(e)) => {
                            self.subs.remove(&sub);
                            self.by_lock.remove(&lock);
                            let _ = ready.send(Err(e));
                            return Ok(());
                        }
                        Err(Failure::Lost(e)) => {
                            let _ = ready.send(Err(copy(&e)));
                            return Err(e);
                        }
                    }
                }
                let _ = ready.send(Ok(()));
            }
            Cmd::Unwatch { sub } => {
                let Some(lock) = self.subs.remove(&sub) else {
                    return Ok(());
                };
                let last = self.by_lock.get_mut(&lock).is_some_and(|s| {
                    s.remove(&sub);
                    s.is_empty()
                });
                if last {
                    self.by_lock.remove(&lock);
                    // Whether the lock is still held is unknown after any failure here: end
                    // the session, which releases it.
                    self.advisory(listener, "pg_advisory_unlock_shared", lock)
                        .await
                        .map_err(Failure::into_error)?;
                }
            }
        }
        Ok(())
    }

    /// Runs `function(hi, lo)` on the session, within [`SETUP`].
    async fn advisory(
        &self,
        listener: &mut PgListener,
        function: &'static str,
        lock: LockId,
    ) -> Result<(), Failure> {
        let (hi, lo) = match lock {
            LockId::Pair(hi, lo) => (hi, lo),
            // Not made by `lock_of`; the same 64 bits in the two-int4 form.
            LockId::Big(v) => ((v >> 32) as i32, v as i32),
        };
        let call = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {function}($1, $2)")))
            .bind(hi)
            .bind(lo)
            .execute(&mut *listener);
        match tokio::time::timeout(SETUP, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e @ sqlx::Error::Database(_))) => {
                Err(Failure::Refused(error::map(self.backend, "watching", e)))
            }
            Ok(Err(e)) => Err(Failure::Lost(error::map(self.backend, "watching", e))),
            // The statement may still run: the session's state is unknown.
            Err(_) => Err(Failure::Lost(self.timeout("taking the watch lock"))),
        }
    }

    fn deliver(&mut self, payload: &str) {
        let Ok(bits) = u64::from_str_radix(payload, 16) else {
            return;
        };
        if let Some(streams) = self.by_lock.get(&LockId::pair(bits)) {
            for s in streams.values() {
                // Full: a notice is already waiting to be read, which covers this one.
                let _ = s.try_send(Ok(()));
            }
        }
    }

    /// Ends every stream and every pending watch with `err`, after taking the session out
    /// of the slot (so no new command comes).
    fn fail(&mut self, err: &StoreError) {
        {
            let mut slot = lock(&self.slot);
            if slot
                .as_ref()
                .is_some_and(|s| s.generation == self.generation)
            {
                *slot = None;
            }
        }
        self.cmds.close();
        while let Ok(cmd) = self.cmds.try_recv() {
            if let Cmd::Watch { ready, .. } = cmd {
                let _ = ready.send(Err(copy(err)));
            }
        }
        for (_, streams) in self.by_lock.drain() {
            for (_, s) in streams {
                // Full: the stream still ends (its sender is dropped here), which says the
                // same thing.
                let _ = s.try_send(Err(copy(err)));
            }
        }
    }
}

/// How a statement on the watch session failed.
enum Failure {
    /// The server answered with an error: the session is fine.
    Refused(StoreError),
    /// No answer, or the connection failed: the session must end.
    Lost(StoreError),
}

impl Failure {
    fn into_error(self) -> StoreError {
        match self {
            Failure::Refused(e) | Failure::Lost(e) => e,
        }
    }
}

/// A copy of `e`'s kind, backend, message and schema mark (its source is not `Clone`).
fn copy(e: &StoreError) -> StoreError {
    e.reworded(e.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_fits_an_identifier_and_payload_is_hex() {
        let t = TableName::new(Some(&"s".repeat(63)), &"t".repeat(63)).unwrap();
        let c = channel(&t);
        assert_eq!(c.len(), 32);
        assert!(c.len() <= crate::MAX_IDENTIFIER_LEN);
        let key = Key::new("k".repeat(leasehold_core::MAX_KEY_LEN)).unwrap();
        let p = payload_of(lock_of(&t.sql(), &key));
        assert_eq!(p.len(), 16);
        assert!(p.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(
            lock_of(&t.sql(), &key),
            lock_of(&TableName::new(None, "t").unwrap().sql(), &key),
            "each records table has its own locks"
        );
    }
}
