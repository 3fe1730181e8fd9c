//! Waiting for a lease without polling, in a fair order: the server's lock queue. The
//! queue itself (entries, turns, hand-off, grace) is [`leasehold_sql::wait`]; this is the
//! PostgreSQL part of it.
//!
//! A waiter's session blocks in `pg_advisory_lock` on a lock derived from the key, which
//! PostgreSQL grants to its waiters one at a time, in the order they asked:
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
//! The ready head's owner acquires with **its own request**, sent by the holder side (its
//! validity deadline counts from that send), on the head's session, taken from the queue
//! ([`Queue::claim`](leasehold_sql::wait::Queue::claim)). A new grant needs the queue lock
//! (the acquire statements try it, transaction-scoped, and PostgreSQL refuses a try while
//! anyone holds it or waits for it), so nobody takes the lease past the queue.
//!
//! A wait by an owner this store has not told `Held` has an entry of its own, which leaves
//! as soon as its wait ends; an owner told `Held` claims the turn until it is granted. A
//! left entry's session is closed (which releases a lock it holds), and a session holding
//! the turn has an `idle_session_timeout`: a frozen or partitioned waiter holds up the
//! queue for at most [`PARKED_IDLE_MS`] (in the lease-table store, the holder's remaining
//! TTL plus that).

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Key, OwnerToken, StoreError};
use leasehold_sql::lease::micros;
use leasehold_sql::wait::{self, Dialect, Idle, Joined, Policy, Turn};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::error;
use crate::listen::Listener;
use crate::sql::digest64;

/// `idle_session_timeout` of a queue session that holds the turn while the lease is free:
/// a frozen waiter process holds up the queue for at most this long.
pub(crate) const PARKED_IDLE_MS: u64 = 2000;

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

/// The turnstile of `key` in table `table` (as in SQL): the advisory lock its waiters
/// queue on, in the two-int4 form (`objsubid = 2` in `pg_locks`), made of the first 8
/// bytes of SHA-256 of `leasehold-wait`, the table and the key, NUL-separated.
pub(crate) fn turnstile(table: &str, key: &Key) -> LockId {
    LockId::pair(digest64(&["leasehold-wait", table, key.as_str()]))
}

/// Dedicated sessions (not pooled): connected on demand, a few kept for reuse.
pub(crate) struct Sessions {
    backend: &'static str,
    connect: PgConnectOptions,
    idle: Idle<PgConnection>,
}

impl Sessions {
    pub(crate) fn new(backend: &'static str, connect: PgConnectOptions, keep: usize) -> Self {
        Self {
            backend,
            connect,
            idle: Idle::new(keep, close),
        }
    }

    /// An idle session, if one is kept.
    pub(crate) fn take_idle(&self) -> Option<PgConnection> {
        self.idle.take()
    }

    /// Keeps `conn` for reuse, or closes it when enough are kept.
    pub(crate) fn put_idle(&self, conn: PgConnection) {
        self.idle.put(conn);
    }

    /// A new session.
    pub(crate) async fn connect(&self, what: &str) -> Result<PgConnection, StoreError> {
        PgConnection::connect_with(&self.connect)
            .await
            .map_err(|e| error::map_connect(self.backend, what, e, &self.connect))
    }
}

/// Closes a connection in the background (graceful Terminate), or drops it.
pub(crate) fn close(conn: PgConnection) {
    wait::close_later(conn, Duration::from_secs(2));
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

impl TableHead {
    /// The turnstile of `key`.
    pub(crate) fn lock_of(&self, key: &Key) -> LockId {
        turnstile(&self.table, key)
    }

    /// As head of `key`'s queue: waits until the row is free (`false`: the session was
    /// lost). A contender (`claims`) is told at a notification without a re-check.
    async fn until_free(
        &self,
        conn: &mut PgConnection,
        key: &Key,
        claims: bool,
        backend: &'static str,
    ) -> bool {
        let id = self.lock_of(key).bits();
        loop {
            let reg = self.listener.register(id);
            let notified = reg.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let listening = self.listener.listening(LISTEN_WAIT).await;
            let row = sqlx::query(AssertSqlSafe(self.check.clone()))
                .bind(key.as_str())
                .fetch_one(&mut *conn)
                .await;
            let row = match row {
                Ok(row) => row,
                Err(e) => {
                    tracing::debug!(key = %key, error = %error::map(backend, "waiting for a release", e), "head session lost");
                    return false;
                }
            };
            let Ok(free) = row.try_get::<bool, _>("free") else {
                return false;
            };
            if free {
                return true;
            }
            let Ok(remaining) = row.try_get::<i64, _>("remaining_us") else {
                return false;
            };
            let mut wait = micros(remaining).max(Duration::from_millis(1));
            if !listening {
                wait = wait.min(RECHECK_WITHOUT_LISTENER);
            }
            let released = tokio::select! {
                () = &mut notified => true,
                () = tokio::time::sleep(wait) => false,
            };
            // Released (or broken, or the listener reconnected): an owner's own acquire
            // checks the row anyway (and, finding it held, sends the head back here), so it
            // is told at once instead of after one more round trip.
            if released && claims {
                return true;
            }
        }
    }
}

/// The PostgreSQL part of a store's wait queue.
pub(crate) struct PgWait {
    backend: &'static str,
    sessions: Arc<Sessions>,
    /// The lease-table store's turnstiles; `None`: the advisory-lock store's, whose queue
    /// lock is the lease lock.
    head: Option<TableHead>,
}

impl PgWait {
    fn lock_of(&self, key: &Key) -> LockId {
        match &self.head {
            Some(h) => h.lock_of(key),
            None => LockId::Big(crate::sql::advisory_lock_id(key.as_str())),
        }
    }
}

impl Dialect for PgWait {
    type Session = PgConnection;

    fn take_idle(&self) -> Option<PgConnection> {
        self.sessions.take_idle()
    }

    async fn connect(&self) -> Result<PgConnection, StoreError> {
        self.sessions.connect("connecting a waiting session").await
    }

    async fn join(&self, conn: &mut PgConnection, key: &Key) -> Joined {
        let lock = sqlx::raw_sql(AssertSqlSafe(self.lock_of(key).lock_sql()))
            .execute(conn)
            .await;
        match lock {
            Ok(_) => Joined::Head,
            Err(e) => {
                tracing::debug!(key = %key, error = %error::map(self.backend, "waiting in the queue", e), "left the wait queue");
                Joined::Lost
            }
        }
    }

    async fn until_free(
        &self,
        conn: &mut PgConnection,
        key: &Key,
        _owner: &OwnerToken,
        claims: bool,
    ) -> bool {
        match &self.head {
            Some(head) => head.until_free(conn, key, claims, self.backend).await,
            None => true,
        }
    }

    async fn pass(&self, mut conn: PgConnection, key: &Key) {
        let res = sqlx::raw_sql(AssertSqlSafe(self.lock_of(key).unlock_sql()))
            .execute(&mut conn)
            .await;
        if res.is_ok() {
            self.sessions.put_idle(conn);
        }
    }

    /// Dropped: its request leaves the queue (or, granted meanwhile, is released) when the
    /// server sees the connection gone.
    fn abandon(&self, conn: PgConnection) {
        drop(conn);
    }

    fn leave(&self, conn: PgConnection) {
        close(conn);
    }
}

/// A store's wait queues.
#[derive(Clone, Debug)]
pub(crate) struct Queue(wait::Queue<PgWait>);

impl Deref for Queue {
    type Target = wait::Queue<PgWait>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Queue {
    pub(crate) fn new(
        backend: &'static str,
        sessions: Arc<Sessions>,
        head: Option<TableHead>,
        max_sessions: usize,
    ) -> Self {
        let policy = Policy {
            backend,
            max_sessions,
            busy: format!(
                "{max_sessions} callers of this store wait already, each on a session of its \
                 own: raise leasehold_wait_sessions (and max_connections) for more"
            ),
            bystanders_keep_place: false,
            contender_for: None,
            overflow_wait: Some(Duration::from_secs(86_400 * 365)),
        };
        let dialect = PgWait {
            backend,
            sessions,
            head,
        };
        Self(wait::Queue::new(dialect, policy))
    }

    /// Tells this process's head of `key`'s queue (if any) that the lease was released by
    /// this store, without waiting for the notification to come back from the server.
    pub(crate) fn released_here(&self, key: &Key) {
        if let Some(head) = &self.dialect().head {
            head.listener.wake_local(head.lock_of(key).bits());
        }
    }

    /// Keeps a session (a claimed head's, done with) for the next waiter.
    pub(crate) fn put_session(&self, conn: PgConnection) {
        self.dialect().sessions.put_idle(conn);
    }

    /// Keeps `owner`'s entry for `key` (if any) alive while an acquire is under way.
    pub(crate) fn acquiring(&self, key: &Key, owner: &OwnerToken) -> Turn<PgWait> {
        self.turn(key, owner)
    }
}
