//! Waiting for a lease without polling, in a fair order: the server's lock queue.
//!
//! A caller that waits for a key ([`WaitStore::wait_released`](leasehold_core::WaitStore::wait_released)) joins
//! the key's queue: a session dedicated to it blocks in `pg_advisory_lock` on a lock
//! derived from the key, and PostgreSQL grants that lock to its waiters one at a time, in
//! the order they asked. Holding it makes the waiter the *head* of the queue:
//!
//! - in the advisory-lock store the queue lock *is* the lease's lock, so the head holds
//!   the lock the moment the holder lets go of it (release, break, expiry of its session,
//!   a crash);
//! - in the lease-table store it is a separate lock per key (the *turnstile*); the head
//!   then waits, on a release notification (`LISTEN`) or the holder's remaining TTL, until
//!   the row is free. A contender's head takes a notification as the release without
//!   re-checking the row (its own acquire checks it anyway, and sends the head back to
//!   waiting if the lease is still held), so its wait may return early, for instance when
//!   the store's listening connection (re)connects and wakes every head.
//!
//! Then the head is *ready*: the wait returns, and the waiter acquires with **its own
//! request**, sent by the holder side (its validity deadline counts from that send), on
//! the head's session. A new grant needs the queue lock (the acquire statements try it,
//! transaction-scoped, and PostgreSQL refuses a try while anyone holds it or waits for it),
//! so nobody can take the lease past the queue, and the next waiter becomes head when the
//! grant releases it.
//!
//! Each waiting owner has its own entry and session, so the order is per waiter across
//! every process. An entry is bound to the owner that `wait_released` names, when that
//! owner's `acquire` of the key last answered `Held` on this store (the holder side's loop:
//! acquire, `Held`, wait as the same owner, acquire again), whichever task or thread makes
//! the calls. A wait by an owner this store has not told `Held` (a caller of
//! `wait_released` alone, who may acquire as someone else) still queues, and passes the turn
//! on as soon as it is ready.
//!
//! Entries never outlive their owner for long: an entry whose owner is neither waiting nor
//! acquiring for [`GRACE`] leaves the queue (its session is closed, which also releases a
//! lock it holds), and a session that holds the turn has an `idle_session_timeout`, so
//! a frozen or partitioned waiter process holds up the queue for at most
//! [`PARKED_IDLE_MS`] (or, in the lease-table store, the holder's remaining TTL plus that).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind};
use leasehold_sql::presence::{HasPresence, Presence};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::error;
use crate::listen::Listener;

/// How long an entry is kept while its owner is neither waiting nor acquiring.
pub(crate) const GRACE: Duration = Duration::from_millis(500);

/// `idle_session_timeout` of a queue session that holds the turn while the lease is free:
/// a frozen waiter process holds up the queue for at most this long.
pub(crate) const PARKED_IDLE_MS: u64 = 2000;

/// A contender is forgotten at its grant; once 4096 are noted, also those noted longer
/// ago than this (owners that stopped trying).
const CONTENDER_FRESH: Duration = Duration::from_secs(5);

/// How long a head waits for the listening connection before it falls back to re-checking.
const LISTEN_WAIT: Duration = Duration::from_secs(1);
/// How often a head re-checks when notifications are not available.
const RECHECK_WITHOUT_LISTENER: Duration = Duration::from_millis(250);

/// An advisory lock, in the bigint form (the advisory-lock store's lease lock) or the
/// two-int4 form (the lease-table store's turnstile: `objsubid = 2` in `pg_locks`, apart
/// from every bigint lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LockId {
    Big(i64),
    Pair(i32, i32),
}

impl LockId {
    /// The same 64 bits as an unsigned number (the notification payload, in hex).
    pub(crate) fn bits(self) -> u64 {
        match self {
            LockId::Big(v) => v as u64,
            LockId::Pair(hi, lo) => (u64::from(hi as u32) << 32) | u64::from(lo as u32),
        }
    }

    /// The two-int4 form of 64 bits.
    pub(crate) fn pair(bits: u64) -> Self {
        LockId::Pair((bits >> 32) as u32 as i32, bits as u32 as i32)
    }

    /// The arguments of `pg_advisory_lock` and friends, as SQL literals.
    fn args(self) -> String {
        match self {
            LockId::Big(v) => format!("({v})::bigint"),
            LockId::Pair(hi, lo) => format!("({hi})::int4, ({lo})::int4"),
        }
    }

    /// Joins the lock's queue and returns once this session holds the lock: one
    /// simple-protocol round trip whose `SET`s apply to the `SELECT` after them (a
    /// server-wide `statement_timeout` or `lock_timeout` would otherwise end the wait;
    /// the idle timeout bounds how long a frozen process keeps the turn).
    fn lock_sql(self) -> String {
        format!(
            "SET statement_timeout = 0; SET lock_timeout = 0; \
             SET idle_session_timeout = {PARKED_IDLE_MS}; SELECT pg_advisory_lock({})",
            self.args()
        )
    }

    /// Releases the session-level lock and resets the idle timeout.
    fn unlock_sql(self) -> String {
        format!(
            "SELECT pg_advisory_unlock({}), set_config('idle_session_timeout', '0', false)",
            self.args()
        )
    }
}

/// Dedicated sessions (not pooled): connected on demand, a few kept for reuse.
pub(crate) struct Sessions {
    backend: &'static str,
    connect: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    keep: usize,
}

impl Sessions {
    pub(crate) fn new(backend: &'static str, connect: PgConnectOptions, keep: usize) -> Self {
        Self {
            backend,
            connect,
            idle: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// An idle session, if one is kept.
    pub(crate) fn take_idle(&self) -> Option<PgConnection> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Keeps `conn` for reuse, or closes it when enough are kept.
    pub(crate) fn put_idle(&self, conn: PgConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.keep {
            idle.push(conn);
        } else {
            drop(idle);
            close(conn);
        }
    }

    /// A new session.
    pub(crate) async fn connect(&self, what: &str) -> Result<PgConnection, StoreError> {
        PgConnection::connect_with(&self.connect)
            .await
            .map_err(|e| error::map(self.backend, what, e))
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        for c in std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner())) {
            close(c);
        }
    }
}

/// Closes a connection in the background (graceful Terminate), or drops it.
pub(crate) fn close(conn: PgConnection) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), conn.close()).await;
        });
    }
}

/// The lease-table store's part of the wait: until the row is free.
pub(crate) struct TableHead {
    /// The lease table, as in SQL (part of each turnstile's id).
    pub(crate) table: String,
    /// `$1` key → `free` (bool), `remaining_us` (bigint); sets the session's
    /// `idle_session_timeout` to the remaining TTL plus [`PARKED_IDLE_MS`].
    pub(crate) check: Arc<str>,
    pub(crate) listener: Listener,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting in the server's queue (or, as head, for the row to be free).
    Queued,
    /// Holds the turn while the lease is free: its owner may claim it.
    Ready,
    Done(End),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The owner acquired on the head's session.
    Claimed,
    /// A bystander's wait passed the turn on.
    Passed,
    /// Left the queue: owner gone, session lost, or the turn went unclaimed.
    Left,
    /// The session could not be had; `failure` says why.
    Failed,
}

struct Entry {
    key: Key,
    /// The owner the turn is kept for; `None`: a bystander's wait, which passes it on.
    owner: Option<OwnerToken>,
    lock: LockId,
    state: watch::Sender<State>,
    /// The head's session while it is ready (taken by a claim).
    parked: Mutex<Option<PgConnection>>,
    presence: Presence,
    failure: Mutex<Option<(StoreErrorKind, String)>>,
}

impl Entry {
    fn parked(&self) -> MutexGuard<'_, Option<PgConnection>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Resolves once the entry has been without a waiter or an acquiring owner for
    /// [`GRACE`] (at once for a bystander's wait).
    async fn abandoned(&self) {
        self.presence
            .abandoned(if self.owner.is_none() {
                Duration::ZERO
            } else {
                GRACE
            })
            .await;
    }
}

impl HasPresence for Entry {
    fn presence(&self) -> &Presence {
        &self.presence
    }
}

type Active = leasehold_sql::presence::Active<Entry>;

struct Shared {
    backend: &'static str,
    sessions: Arc<Sessions>,
    head: Option<TableHead>,
    permits: Arc<Semaphore>,
    max_sessions: usize,
    entries: Mutex<HashMap<(Key, OwnerToken), Arc<Entry>>>,
    /// Contenders: the owners whose acquire of a key answered `Held` (and has not been
    /// granted since), with when.
    contenders: Mutex<HashMap<(Key, OwnerToken), Instant>>,
}

/// A store's wait queues.
#[derive(Clone)]
pub(crate) struct Queue {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("waiting", &self.entries().len())
            .field("max_sessions", &self.shared.max_sessions)
            .finish()
    }
}

/// A ready head's session, taken by its owner's acquire. Report the outcome with
/// [`granted`](Self::granted) or [`held`](Self::held); dropped otherwise, the entry ends
/// and the session is closed (which releases whatever lock it holds).
pub(crate) struct Claim {
    queue: Queue,
    entry: Arc<Entry>,
    conn: Option<PgConnection>,
    _active: Active,
}

impl Claim {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("claimed session")
    }

    /// The owner acquired: the session is the caller's now.
    pub(crate) fn granted(mut self) -> PgConnection {
        let conn = self.conn.take().expect("claimed session");
        self.queue.finish(&self.entry, End::Claimed);
        conn
    }

    /// Still held (the lease was taken meanwhile): the head goes back to waiting.
    pub(crate) fn held(mut self) {
        let conn = self.conn.take().expect("claimed session");
        *self.entry.parked() = Some(conn);
        self.entry.state.send_replace(State::Queued);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            close(conn);
            self.queue.finish(&self.entry, End::Left);
        }
    }
}

/// Marks an owner as acquiring while alive (so its queue entry is kept).
pub(crate) struct Acquiring(#[allow(dead_code)] Option<Active>);

impl Queue {
    pub(crate) fn new(
        backend: &'static str,
        sessions: Arc<Sessions>,
        head: Option<TableHead>,
        max_sessions: usize,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                backend,
                sessions,
                head,
                permits: Arc::new(Semaphore::new(max_sessions)),
                max_sessions,
                entries: Mutex::new(HashMap::new()),
                contenders: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<(Key, OwnerToken), Arc<Entry>>> {
        self.shared
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn contenders(&self) -> MutexGuard<'_, HashMap<(Key, OwnerToken), Instant>> {
        self.shared
            .contenders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that `owner`'s acquire of `key` answered `Held`: `owner`'s next wait for `key`
    /// keeps the turn for it.
    pub(crate) fn note_held(&self, key: &Key, owner: &OwnerToken) {
        let now = Instant::now();
        let mut contenders = self.contenders();
        if contenders.len() >= 4096 {
            contenders.retain(|_, at| now.duration_since(*at) < CONTENDER_FRESH);
        }
        contenders.insert((key.clone(), *owner), now);
    }

    /// Forgets `owner` as a contender for `key` (its acquire was granted).
    pub(crate) fn note_granted(&self, key: &Key, owner: &OwnerToken) {
        self.contenders().remove(&(key.clone(), *owner));
    }

    /// The ready head's session of `owner`'s entry for `key`, if it has one.
    pub(crate) fn claim(&self, key: &Key, owner: &OwnerToken) -> Option<Claim> {
        let entry = self.entries().get(&(key.clone(), *owner)).cloned()?;
        if entry.state() != State::Ready {
            return None;
        }
        let active = Active::new(entry.clone(), false);
        let conn = entry.parked().take()?;
        Some(Claim {
            queue: self.clone(),
            entry,
            conn: Some(conn),
            _active: active,
        })
    }

    /// Tells this process's head of `key`'s queue (if any) that the lease was released by
    /// this store, without waiting for the notification to come back from the server.
    pub(crate) fn released_here(&self, key: &Key) {
        if let Some(head) = &self.shared.head {
            head.listener.wake_local(head.lock_of(key).bits());
        }
    }

    /// Keeps a session (a claimed head's, done with) for the next waiter.
    pub(crate) fn put_session(&self, conn: PgConnection) {
        self.shared.sessions.put_idle(conn);
    }

    /// Keeps `owner`'s entry for `key` (if any) alive while an acquire is under way.
    pub(crate) fn acquiring(&self, key: &Key, owner: &OwnerToken) -> Acquiring {
        let entry = self.entries().get(&(key.clone(), *owner)).cloned();
        Acquiring(entry.map(|e| Active::new(e, false)))
    }

    /// Waits until `owner`'s turn has come and the lease is free, or for `timeout`.
    pub(crate) async fn wait(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400 * 365));
        let entry = self.entry(key, owner)?;
        let _active = Active::new(entry.clone(), true);
        let mut rx = entry.state.subscribe();
        let _ = tokio::time::timeout_at(deadline, rx.wait_for(|s| *s != State::Queued)).await;
        if entry.state() == State::Done(End::Failed) {
            let (kind, message) = entry
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or((StoreErrorKind::Unavailable, "waiting failed".to_owned()));
            return Err(StoreError::new(kind, self.shared.backend, message));
        }
        Ok(())
    }

    /// `owner`'s entry for `key`, joining the queue if it has none: bound to `owner` if it
    /// is a contender for `key`, else a bystander's (not kept, passes the turn on).
    fn entry(&self, key: &Key, owner: &OwnerToken) -> Result<Arc<Entry>, StoreError> {
        let mut entries = self.entries();
        if let Some(e) = entries.get(&(key.clone(), *owner))
            && !matches!(e.state(), State::Done(_))
        {
            return Ok(e.clone());
        }
        let owner = self
            .contenders()
            .contains_key(&(key.clone(), *owner))
            .then_some(*owner);
        let permit = self.shared.permits.clone().try_acquire_owned().map_err(|_| {
            StoreError::new(
                StoreErrorKind::Busy,
                self.shared.backend,
                format!(
                    "{} callers of this store wait already, each on a session of its own: raise \
                     leasehold_wait_sessions (and max_connections) for more",
                    self.shared.max_sessions
                ),
            )
        })?;
        let lock = self.lock_of(key);
        let entry = Arc::new(Entry {
            key: key.clone(),
            owner,
            lock,
            state: watch::Sender::new(State::Queued),
            parked: Mutex::new(None),
            presence: Presence::new(),
            failure: Mutex::new(None),
        });
        if let Some(o) = owner {
            entries.insert((key.clone(), o), entry.clone());
        }
        drop(entries);
        tokio::spawn(run(self.clone(), entry.clone(), permit));
        Ok(entry)
    }

    fn lock_of(&self, key: &Key) -> LockId {
        match &self.shared.head {
            Some(h) => h.lock_of(key),
            None => LockId::Big(crate::advisory::advisory_lock_id(key.as_str())),
        }
    }

    /// Ends `entry` with `end` unless it has ended already, and forgets it.
    fn finish(&self, entry: &Arc<Entry>, end: End) {
        entry.state.send_if_modified(|s| {
            if matches!(s, State::Done(_)) {
                false
            } else {
                *s = State::Done(end);
                true
            }
        });
        if let Some(o) = entry.owner {
            let mut entries = self.entries();
            if entries
                .get(&(entry.key.clone(), o))
                .is_some_and(|e| Arc::ptr_eq(e, entry))
            {
                entries.remove(&(entry.key.clone(), o));
            }
        }
    }
}

impl TableHead {
    /// The turnstile of `key`.
    pub(crate) fn lock_of(&self, key: &Key) -> LockId {
        crate::table::turnstile(&self.table, key)
    }
}

/// The life of one entry: queue, wait to be head (and, in the lease-table store, for the
/// row to be free), be claimed or pass the turn on.
async fn run(queue: Queue, entry: Arc<Entry>, permit: OwnedSemaphorePermit) {
    let end = life(&queue, &entry).await;
    drop(permit);
    queue.finish(&entry, end);
}

async fn life(queue: &Queue, entry: &Arc<Entry>) -> End {
    let shared = &queue.shared;
    let conn = match shared.sessions.take_idle() {
        Some(c) => Some(c),
        None => {
            let connect = shared.sessions.connect("connecting a waiting session");
            tokio::select! {
                c = connect => match c {
                    Ok(c) => Some(c),
                    Err(e) => {
                        *entry.failure.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some((e.kind(), e.message().to_owned()));
                        return End::Failed;
                    }
                },
                () = entry.abandoned() => None,
            }
        }
    };
    let Some(mut conn) = conn else {
        return End::Left;
    };
    // Join the queue. Leaving it early closes the session: its request leaves the queue
    // (or, granted meanwhile, is released) when the server sees the connection gone.
    let queued = {
        let lock = sqlx::raw_sql(AssertSqlSafe(entry.lock.lock_sql())).execute(&mut conn);
        tokio::select! {
            r = lock => Some(r),
            () = entry.abandoned() => None,
        }
    };
    match queued {
        None => {
            drop(conn);
            return End::Left;
        }
        Some(Err(e)) => {
            tracing::debug!(key = %entry.key, error = %error::map(shared.backend, "waiting in the queue", e), "left the wait queue");
            drop(conn);
            return End::Left;
        }
        Some(Ok(_)) => {}
    }
    loop {
        if let Some(head) = &shared.head {
            match until_free(head, entry, &mut conn, shared.backend).await {
                Ok(true) => {}
                Ok(false) | Err(()) => {
                    drop(conn);
                    return End::Left;
                }
            }
        }
        if entry.owner.is_none() {
            // Pass the turn on before the waiter is told, so that its own next request
            // does not find the lock held by this session.
            let res = sqlx::raw_sql(AssertSqlSafe(entry.lock.unlock_sql()))
                .execute(&mut conn)
                .await;
            if res.is_ok() {
                shared.sessions.put_idle(conn);
            }
            return End::Passed;
        }
        *entry.parked() = Some(conn);
        entry.state.send_replace(State::Ready);
        let mut rx = entry.state.subscribe();
        loop {
            let abandoned = tokio::select! {
                _ = rx.wait_for(|s| *s != State::Ready) => false,
                () = entry.abandoned() => true,
            };
            if abandoned {
                if let Some(c) = entry.parked().take() {
                    // Unclaimed: ending the session passes the turn on.
                    close(c);
                    return End::Left;
                }
                // A claim is under way: wait for its outcome.
                let _ = rx.wait_for(|s| *s != State::Ready).await;
            }
            match entry.state() {
                State::Ready => continue,
                State::Done(end) => return end,
                State::Queued => break,
            }
        }
        // The claim found the lease held: wait for it again, as head.
        match entry.parked().take() {
            Some(c) => conn = c,
            None => return End::Left,
        }
    }
}

/// As head of a lease-table queue: waits until the row is free. `Ok(false)`: abandoned.
async fn until_free(
    head: &TableHead,
    entry: &Entry,
    conn: &mut PgConnection,
    backend: &'static str,
) -> Result<bool, ()> {
    let id = entry.lock.bits();
    loop {
        let reg = head.listener.register(id);
        let notified = reg.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let listening = tokio::select! {
            l = head.listener.listening(LISTEN_WAIT) => l,
            () = entry.abandoned() => return Ok(false),
        };
        let row = {
            let check = sqlx::query(AssertSqlSafe(head.check.clone()))
                .bind(entry.key.as_str())
                .fetch_one(&mut *conn);
            tokio::select! {
                r = check => r,
                () = entry.abandoned() => return Ok(false),
            }
        };
        let row = row.map_err(|e| {
            tracing::debug!(key = %entry.key, error = %error::map(backend, "waiting for a release", e), "head session lost");
        })?;
        let free: bool = row.try_get("free").map_err(|_| ())?;
        if free {
            return Ok(true);
        }
        let remaining: i64 = row.try_get("remaining_us").map_err(|_| ())?;
        let mut wait = crate::table::micros(remaining).max(Duration::from_millis(1));
        if !listening {
            wait = wait.min(RECHECK_WITHOUT_LISTENER);
        }
        let released = tokio::select! {
            () = &mut notified => true,
            () = tokio::time::sleep(wait) => false,
            () = entry.abandoned() => return Ok(false),
        };
        // Released (or broken, or the listener reconnected): an owner's own acquire checks
        // the row anyway (and, finding it held, sends the head back here), so it is told at
        // once instead of after one more round trip.
        if released && entry.owner.is_some() {
            return Ok(true);
        }
    }
}
