//! Waiting for a lease of the lease-table store without polling, in arrival order: the
//! server's `GET_LOCK` queue.
//!
//! A caller that waits for a key ([`WaitStore::wait_released`](leasehold_core::WaitStore::wait_released)) joins
//! the key's queue: a session dedicated to the waiting owner blocks in
//! `GET_LOCK(turnstile, …)` on the key's *turnstile* ([`turnstile`]: a lock name derived
//! from the database, the table and the key, distinct from every `GET_LOCK` store name).
//! The server grants a user lock to its waiters one at a time, in the order they asked.
//! Holding the turnstile makes the waiter the *head* of the queue; the head then waits
//! for the lease row to be free in one statement on its session,
//! `SELECT … IF(held, SLEEP(remaining TTL), 0)`:
//!
//! - a **release** or a **break** (by any process using the lease table) ends that sleep:
//!   right after its statement, the releasing session looks up who holds the turnstile
//!   (`IS_USED_LOCK`) and sends `KILL QUERY` for that session, which wakes `SLEEP` at
//!   once (MariaDB/MySQL have no `LISTEN/NOTIFY`; this is one). A head that was not asleep
//!   yet reads the row after the release and finds it free;
//! - the holder's **expiry** ends it: the sleep is the holder's remaining TTL, measured on
//!   the server's clock (a renewal sends the head back to sleep for the new remainder).
//!
//! Then the head is *ready*: the wait returns and the waiter acquires with **its own
//! request** through the pool, naming its session; a grant needs the turnstile to be
//! free or held by the caller's own session (`COALESCE(IS_USED_LOCK(turnstile), head) =
//! head` in the acquire statement), so nobody takes the lease past the queue, and the
//! next waiter becomes head when the granted head lets the turnstile go.
//!
//! `KILL QUERY` needs the releasing session's user to own the head's session (the same
//! MariaDB/MySQL user) or the privilege to kill others' (`CONNECTION ADMIN` / `SUPER`).
//! Without it a head wakes at the holder's expiry at the latest.
//!
//! Each waiting owner has its own entry and session, so the order is per waiter across
//! every process. A wait by an owner whose acquire has not just answered `Held` through this
//! store (a bare `wait_released`, not a lease client's) passes the turn on as soon as it
//! comes, and returns. Entries never outlive their owner for long: an entry whose owner is
//! neither waiting nor acquiring for [`GRACE`] leaves the queue (its session is killed,
//! which also releases a turnstile it holds), and every waiting session has a
//! `wait_timeout` of [`PARKED_IDLE_SECS`], so the session of a frozen or partitioned waiter
//! process ends at most that long after its statement ends: such a waiter holds up the
//! queue for at most the holder's remaining TTL plus [`PARKED_IDLE_SECS`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind};
use leasehold_sql::presence::{HasPresence, Presence};
use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::conn::Db;
use crate::error::error_number;
use crate::schema::now_us;

/// The prefix of a turnstile's lock name.
pub(crate) const TURNSTILE_PREFIX: &str = "leasehold-wait#";

/// How long an entry is kept while its owner is neither waiting nor acquiring.
pub(crate) const GRACE: Duration = Duration::from_millis(500);

/// `wait_timeout` of a waiting session: a frozen waiter process holds up the queue for at
/// most this long after its session's statement ended.
pub(crate) const PARKED_IDLE_SECS: u64 = 2;

/// How many owners of one store may wait at once, each on a session of its own; more
/// back off and retry.
pub(crate) const MAX_WAITING: usize = 64;

/// How long an owner's acquire that answered `Held` makes its next wait a claim on the
/// turn (rather than a bare wait, which passes the turn on).
const OWNER_FRESH: Duration = Duration::from_secs(5);

/// How long one `GET_LOCK` request stays in the queue before it is renewed.
const QUEUE_SECS: u64 = 3600;

/// How long a head sleeps when the row's expiry cannot be read (a corrupt row).
const UNKNOWN_REMAINING: Duration = Duration::from_secs(1);

/// `ER_QUERY_INTERRUPTED`: a statement ended by `KILL QUERY`.
const INTERRUPTED: u16 = 1317;

/// The turnstile of `key` in `database` (the lease table's): `leasehold-wait#` and the first
/// 49 hex digits of the SHA-256 of `leasehold-wait`, the database, `leasehold_leases` and the
/// key, NUL-separated (64 characters, lower case: the same on every server whatever its
/// collation of lock names).
pub(crate) fn turnstile(database: &str, key: &Key) -> String {
    let mut h = Sha256::new();
    for (i, part) in ["leasehold-wait", database, "leasehold_leases", key.as_str()]
        .iter()
        .enumerate()
    {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(part.as_bytes());
    }
    let mut name = String::with_capacity(64);
    name.push_str(TURNSTILE_PREFIX);
    for b in h.finalize().iter() {
        name.push_str(&format!("{b:02x}"));
    }
    name.truncate(64);
    name
}

/// The head's statement: reads the row and, while another owner's lease is live, sleeps
/// for its remaining TTL. `free` = 1 when the row is free for the waiter.
const HEAD_CHECK: &str = concat!(
    "SELECT CAST(x.live = 0 AS SIGNED) AS free, ",
    "CAST(IF(x.live, SLEEP(x.rem_us / 1000000), 0) AS SIGNED) AS woken FROM (",
    "SELECT COALESCE(l.owner IS NOT NULL AND (l.expires_at_us IS NULL OR l.expires_at_us > ",
    now_us!(),
    ") AND l.owner <> ?, 0) AS live, ",
    "COALESCE(GREATEST(1000, l.expires_at_us - ",
    now_us!(),
    "), ?) AS rem_us ",
    "FROM (SELECT 1 AS one) d LEFT JOIN leasehold_leases l ON l.lease_key = ?) x"
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting in the server's queue, or, as head, for the row to be free.
    Queued,
    /// Holds the turnstile (on the session with this `CONNECTION_ID()`) while the lease is
    /// free: its owner may acquire.
    Ready(u64),
    /// The owner's acquire was granted: the turnstile is passed on.
    Claimed,
    Done(End),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Passed the turnstile on after the grant.
    Passed,
    /// Left the queue: owner gone, or the session lost.
    Left,
    /// No session could be had; `failure` says why.
    Failed,
}

struct Entry {
    key: Key,
    owner: OwnerToken,
    /// The owner's acquire answered `Held` just before it waited: it will claim the turn.
    /// A bare `wait_released` passes the turn on as soon as it comes.
    claims: bool,
    state: watch::Sender<State>,
    presence: Presence,
    failure: Mutex<Option<(StoreErrorKind, String)>>,
}

impl Entry {
    fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Resolves once the entry has been without a waiter or an acquiring owner for
    /// [`GRACE`].
    async fn abandoned(&self) {
        self.presence.abandoned(GRACE).await;
    }
}

impl HasPresence for Entry {
    fn presence(&self) -> &Presence {
        &self.presence
    }
}

type Active = leasehold_sql::presence::Active<Entry>;

struct Shared {
    db: Arc<Db>,
    permits: Arc<Semaphore>,
    entries: Mutex<HashMap<(Key, OwnerToken), Arc<Entry>>>,
    /// Waiting sessions kept for the next waiter (they hold no user lock).
    idle: Mutex<Vec<Session>>,
    /// Owners whose acquire answered `Held`, per key, and when.
    noted: Mutex<HashMap<(Key, OwnerToken), Instant>>,
}

/// The lease-table store's wait queues.
#[derive(Clone)]
pub(crate) struct Queue {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("waiting", &self.entries().len())
            .finish()
    }
}

/// An owner's acquire as the head of its queue (or not): keeps the entry alive, and tells
/// it the outcome.
pub(crate) struct Turn {
    entry: Option<(Arc<Entry>, u64)>,
    _active: Option<Active>,
}

impl Turn {
    /// The `CONNECTION_ID()` of the head's session when the owner is the ready head; 0
    /// (no session) otherwise.
    pub(crate) fn head(&self) -> u64 {
        self.entry.as_ref().map_or(0, |(_, id)| *id)
    }

    /// The acquire was granted (`true`) or found the lease held.
    pub(crate) fn outcome(self, granted: bool) {
        if let Some((entry, id)) = &self.entry {
            let next = if granted {
                State::Claimed
            } else {
                State::Queued
            };
            entry.state.send_if_modified(|s| {
                if *s == State::Ready(*id) {
                    *s = next;
                    true
                } else {
                    false
                }
            });
        }
    }
}

impl Queue {
    pub(crate) fn new(db: Arc<Db>) -> Self {
        Self {
            shared: Arc::new(Shared {
                db,
                permits: Arc::new(Semaphore::new(MAX_WAITING)),
                entries: Mutex::new(HashMap::new()),
                idle: Mutex::new(Vec::new()),
                noted: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<(Key, OwnerToken), Arc<Entry>>> {
        self.shared
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The turnstile of `key` in this store's database.
    pub(crate) fn turnstile(&self, key: &Key) -> String {
        turnstile(self.shared.db.config.get_database(), key)
    }

    fn noted(&self) -> MutexGuard<'_, HashMap<(Key, OwnerToken), Instant>> {
        self.shared.noted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that `owner`'s acquire of `key` answered `Held` (its next wait claims the
    /// turn) or was granted.
    pub(crate) fn note(&self, key: &Key, owner: &OwnerToken, held: bool) {
        let mut noted = self.noted();
        if held {
            let now = Instant::now();
            if noted.len() >= 4096 {
                noted.retain(|_, at| now.duration_since(*at) < OWNER_FRESH);
            }
            noted.insert((key.clone(), *owner), now);
        } else {
            noted.remove(&(key.clone(), *owner));
        }
    }

    /// `owner`'s turn at acquiring `key`: the head's session if it is the ready head, and
    /// its entry kept alive meanwhile.
    pub(crate) fn turn(&self, key: &Key, owner: &OwnerToken) -> Turn {
        let Some(entry) = self.entries().get(&(key.clone(), *owner)).cloned() else {
            return Turn {
                entry: None,
                _active: None,
            };
        };
        let active = Active::new(entry.clone(), false);
        let head = match entry.state() {
            State::Ready(id) => Some((entry, id)),
            _ => None,
        };
        Turn {
            entry: head,
            _active: Some(active),
        }
    }

    /// Waits until `owner`'s turn has come and the lease is free, or for `timeout`.
    pub(crate) async fn wait(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let entry = self.entry(key, owner)?;
        let _active = Active::new(entry.clone(), true);
        let mut rx = entry.state.subscribe();
        let ready = rx.wait_for(|s| !matches!(s, State::Queued | State::Claimed));
        match tokio::time::Instant::now().checked_add(timeout) {
            Some(deadline) => {
                let _ = tokio::time::timeout_at(deadline, ready).await;
            }
            None => {
                let _ = ready.await;
            }
        }
        if entry.state() == State::Done(End::Failed) {
            let (kind, message) = entry
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or((StoreErrorKind::Unavailable, "waiting failed".to_owned()));
            return Err(StoreError::new(kind, self.shared.db.backend, message));
        }
        Ok(())
    }

    /// `owner`'s entry for `key`, joining the queue if it has none.
    fn entry(&self, key: &Key, owner: &OwnerToken) -> Result<Arc<Entry>, StoreError> {
        let mut entries = self.entries();
        if let Some(e) = entries.get(&(key.clone(), *owner))
            && !matches!(e.state(), State::Done(_))
        {
            return Ok(e.clone());
        }
        let permit = self.shared.permits.clone().try_acquire_owned().map_err(|_| {
            StoreError::new(
                StoreErrorKind::Busy,
                self.shared.db.backend,
                format!("{MAX_WAITING} owners wait on this store already, each on a session of its own"),
            )
        })?;
        let claims = self
            .noted()
            .get(&(key.clone(), *owner))
            .is_some_and(|at| at.elapsed() < OWNER_FRESH);
        let entry = Arc::new(Entry {
            key: key.clone(),
            owner: *owner,
            claims,
            state: watch::Sender::new(State::Queued),
            presence: Presence::new(),
            failure: Mutex::new(None),
        });
        entries.insert((key.clone(), *owner), entry.clone());
        drop(entries);
        tokio::spawn(run(self.clone(), entry.clone(), permit));
        Ok(entry)
    }

    /// Ends `entry` with `end` and forgets it.
    fn finish(&self, entry: &Arc<Entry>, end: End) {
        entry.state.send_replace(State::Done(end));
        let mut entries = self.entries();
        let k = (entry.key.clone(), entry.owner);
        if entries.get(&k).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            entries.remove(&k);
        }
    }

    fn take_idle(&self) -> Option<Session> {
        self.shared
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
    }

    fn put_idle(&self, s: Session) {
        let mut idle = self.shared.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < 8 {
            idle.push(s);
        } else {
            drop(idle);
            close(s.conn);
        }
    }

    /// Ends the session `id` (a queued or head session being left): killing it from
    /// another session removes its request from the queue, or releases the turnstile it
    /// holds, at once. Dropping `conn` alone would leave a request queued until granted.
    fn kill(&self, conn: MySqlConnection, id: u64) {
        crate::conn::kill_session(&self.shared.db, conn, id, "leaving the wait queue");
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        for s in std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner())) {
            close(s.conn);
        }
    }
}

/// Closes a connection in the background (politely), or drops it.
fn close(conn: MySqlConnection) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.close()).await;
        });
    }
}

/// Wakes the head of `key`'s queue, if any (after a release or a break): `KILL QUERY` for
/// the session holding the turnstile ends its `SLEEP`. On the caller's connection.
pub(crate) async fn wake_head(
    conn: &mut MySqlConnection,
    turnstile: &str,
) -> Result<(), sqlx::Error> {
    let head: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
        .bind(turnstile)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(id) = head {
        match conn
            .execute(AssertSqlSafe(format!("KILL QUERY {id}")))
            .await
        {
            Ok(_) => {}
            // 1094: the session ended meanwhile.
            Err(e) if error_number(&e) == Some(1094) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn run(queue: Queue, entry: Arc<Entry>, permit: OwnedSemaphorePermit) {
    let end = life(&queue, &entry).await;
    drop(permit);
    queue.finish(&entry, end);
}

/// A waiting session: its connection and `CONNECTION_ID()`; `kept` when it waited before
/// (the server may have ended it since, after its `wait_timeout`).
struct Session {
    conn: MySqlConnection,
    id: u64,
    kept: bool,
}

/// A waiting session: a kept one (set up already), or a new one.
async fn session(queue: &Queue) -> Result<Session, StoreError> {
    if let Some(s) = queue.take_idle() {
        return Ok(s);
    }
    new_session(queue).await
}

async fn new_session(queue: &Queue) -> Result<Session, StoreError> {
    let conn = queue
        .shared
        .db
        .dedicated("connecting a waiting session")
        .await?;
    setup(queue, conn).await
}

/// Sets a waiting session's idle timeout and reads its `CONNECTION_ID()`.
async fn setup(queue: &Queue, mut conn: MySqlConnection) -> Result<Session, StoreError> {
    let db = &queue.shared.db;
    let statements = async {
        conn.execute(AssertSqlSafe(format!(
            "SET SESSION wait_timeout = {PARKED_IDLE_SECS}"
        )))
        .await?;
        sqlx::query_scalar::<_, u64>("SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
            .fetch_one(&mut conn)
            .await
    };
    match tokio::time::timeout(db.config.get_timeout(), statements).await {
        Ok(Ok(id)) => Ok(Session {
            conn,
            id,
            kept: false,
        }),
        Ok(Err(e)) => Err(db.error(e.into(), "waiting", crate::error::Phase::Statement)),
        Err(_) => Err(StoreError::timeout(
            db.backend,
            "waiting",
            db.config.get_timeout(),
        )),
    }
}

/// The life of one entry: queue, wait to be head and for the row to be free, be claimed
/// and pass the turnstile on.
async fn life(queue: &Queue, entry: &Arc<Entry>) -> End {
    let name = queue.turnstile(&entry.key);
    let got = tokio::select! {
        s = session(queue) => Some(s),
        () = entry.abandoned() => None,
    };
    let mut s = match got {
        None => return End::Left,
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            *entry.failure.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((e.kind(), e.message().to_owned()));
            return End::Failed;
        }
    };
    // Join the queue; the server grants the turnstile to its waiters in arrival order.
    loop {
        let request = sqlx::query_scalar::<_, Option<i64>>("SELECT CAST(GET_LOCK(?, ?) AS SIGNED)")
            .bind(&name)
            .bind(QUEUE_SECS)
            .fetch_one(&mut s.conn);
        let got = tokio::select! {
            r = request => r,
            () = entry.abandoned() => {
                queue.kill(s.conn, s.id);
                return End::Left;
            }
        };
        match got {
            Ok(Some(1)) => break,
            // Timed out, or interrupted by a `KILL QUERY` meant for this session's
            // previous use: ask again.
            Ok(_) => continue,
            Err(e) if error_number(&e) == Some(INTERRUPTED) => continue,
            // A kept session the server ended meanwhile: a new one.
            Err(_) if s.kept => {
                drop(s.conn);
                let fresh = tokio::select! {
                    r = new_session(queue) => r,
                    () = entry.abandoned() => return End::Left,
                };
                s = match fresh {
                    Ok(f) => f,
                    Err(e) => {
                        *entry.failure.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some((e.kind(), e.message().to_owned()));
                        return End::Failed;
                    }
                };
            }
            Err(e) => {
                tracing::debug!(key = %entry.key, error = %e, "waiting session lost");
                drop(s.conn);
                return End::Left;
            }
        }
    }
    let owner = entry.owner.to_hex();
    let mut rx = entry.state.subscribe();
    loop {
        // Head: until the row is free for this owner.
        loop {
            let check = sqlx::query_as::<_, (i64, Option<i64>)>(HEAD_CHECK)
                .bind(&owner)
                .bind(i64::try_from(UNKNOWN_REMAINING.as_micros()).unwrap_or(i64::MAX))
                .bind(entry.key.as_str())
                .fetch_one(&mut s.conn);
            let r = tokio::select! {
                r = check => r,
                () = entry.abandoned() => {
                    queue.kill(s.conn, s.id);
                    return End::Left;
                }
            };
            match r {
                Ok((free, _)) if free != 0 => break,
                // Woken by a release or a break (`SLEEP` returns 1 when killed): the
                // owner's own acquire reads the row anyway.
                Ok((_, Some(1))) => break,
                Err(e) if error_number(&e) == Some(INTERRUPTED) => break,
                // Slept until the holder's expiry: look again.
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(key = %entry.key, error = %e, "waiting session lost");
                    drop(s.conn);
                    return End::Left;
                }
            }
        }
        if !entry.claims {
            // A bare wait: pass the turn on before the waiter is told.
            break;
        }
        entry.state.send_replace(State::Ready(s.id));
        let abandoned = tokio::select! {
            _ = rx.wait_for(|st| *st != State::Ready(s.id)) => false,
            () = entry.abandoned() => true,
        };
        if abandoned {
            // The turn went unclaimed: let the turnstile go with the session.
            queue.kill(s.conn, s.id);
            return End::Left;
        }
        match entry.state() {
            State::Claimed => break,
            // The lease was taken meanwhile: wait for it again, as head.
            _ => continue,
        }
    }
    // Granted (or a bare wait's turn): pass the turnstile on, and keep the session for
    // the next waiter.
    let pass = sqlx::query("SELECT RELEASE_ALL_LOCKS()").execute(&mut s.conn);
    match tokio::time::timeout(queue.shared.db.config.get_timeout(), pass).await {
        Ok(Ok(_)) => queue.put_idle(Session { kept: true, ..s }),
        _ => queue.kill(s.conn, s.id),
    }
    End::Passed
}
