//! Waiting for a lease of the lease-table store without polling, in arrival order: the
//! server's `GET_LOCK` queue. The queue itself (entries, turns, hand-off, grace) is
//! [`leasehold_sql::wait`]; this is the MariaDB/MySQL part of it.
//!
//! A waiter's session blocks in `GET_LOCK(turnstile, …)` on the key's *turnstile*
//! ([`turnstile`]: a lock name derived from the database, the table and the key, distinct
//! from every `GET_LOCK` store name). The server grants a user lock to its waiters one at a
//! time, in the order they asked. The head then waits for the lease row to be free in one
//! statement on its session, `SELECT … IF(held, SLEEP(remaining TTL), 0)`:
//!
//! - a **release** or a **break** (by any process using the lease table) ends that sleep:
//!   right after its statement, the releasing session looks up who holds the turnstile
//!   (`IS_USED_LOCK`) and sends `KILL QUERY` for that session, which wakes `SLEEP` at
//!   once (MariaDB/MySQL have no `LISTEN/NOTIFY`; this is one). A head that was not asleep
//!   yet reads the row after the release and finds it free;
//! - the holder's **expiry** ends it: the sleep is the holder's remaining TTL, measured on
//!   the server's clock (a renewal sends the head back to sleep for the new remainder).
//!
//! The ready head's owner acquires with its own request through the pool, naming the
//! head's session ([`Queue::turn`](leasehold_sql::wait::Queue::turn)); a grant needs the
//! turnstile free or held by that session (`COALESCE(IS_USED_LOCK(turnstile), head) =
//! head`). `KILL QUERY` needs the releasing session's user to own the head's session (the
//! same MariaDB/MySQL user) or the privilege to kill others' (`CONNECTION ADMIN` /
//! `SUPER`); without it a head wakes at the holder's expiry at the latest.
//!
//! A wait by an owner whose acquire has not answered `Held` in the last [`OWNER_FRESH`]
//! passes the turn on as soon as it comes; its entry keeps its place for the owner's next
//! wait like a contender's. A left entry's session is killed (which releases a turnstile
//! it holds), and every waiting session has a `wait_timeout` of [`PARKED_IDLE_SECS`]: a
//! frozen or partitioned waiter holds up the queue for at most the holder's remaining TTL
//! plus that.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Key, OwnerToken, StoreError};
use leasehold_sql::wait::{self, Dialect, Idle, Joined, Policy};
use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, Executor, MySqlConnection};

use crate::conn::Db;
use crate::error::error_number;
use crate::sql::now_us;

/// The prefix of a turnstile's lock name.
pub(crate) const TURNSTILE_PREFIX: &str = "leasehold-wait#";

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

/// A waiting session: its connection and `CONNECTION_ID()`; `kept` when it waited before
/// (the server may have ended it since, after its `wait_timeout`).
pub(crate) struct Session {
    conn: MySqlConnection,
    id: u64,
    kept: bool,
}

/// The MariaDB/MySQL part of the lease-table store's wait queue.
pub(crate) struct MySqlWait {
    db: Arc<Db>,
    /// Waiting sessions kept for the next waiter (they hold no user lock).
    idle: Idle<Session>,
}

impl MySqlWait {
    /// Ends the session `id` (a queued or head session being left): killing it from
    /// another session removes its request from the queue, or releases the turnstile it
    /// holds, at once. Dropping `conn` alone would leave a request queued until granted.
    fn kill(&self, s: Session) {
        crate::conn::kill_session(&self.db, s.conn, s.id, "leaving the wait queue");
    }

    /// Sets a waiting session's idle timeout and reads its `CONNECTION_ID()`.
    async fn setup(&self, mut conn: MySqlConnection) -> Result<Session, StoreError> {
        let db = &self.db;
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
}

impl Dialect for MySqlWait {
    type Session = Session;

    fn take_idle(&self) -> Option<Session> {
        self.idle.take()
    }

    async fn connect(&self) -> Result<Session, StoreError> {
        let conn = self.db.dedicated("connecting a waiting session").await?;
        self.setup(conn).await
    }

    async fn join(&self, s: &mut Session, key: &Key) -> Joined {
        let name = turnstile(self.db.config.get_database(), key);
        loop {
            let got = sqlx::query_scalar::<_, Option<i64>>("SELECT CAST(GET_LOCK(?, ?) AS SIGNED)")
                .bind(&name)
                .bind(QUEUE_SECS)
                .fetch_one(&mut s.conn)
                .await;
            match got {
                Ok(Some(1)) => return Joined::Head,
                // Timed out, or interrupted by a `KILL QUERY` meant for this session's
                // previous use: ask again.
                Ok(_) => continue,
                Err(e) if error_number(&e) == Some(INTERRUPTED) => continue,
                // A kept session the server ended meanwhile: a new one.
                Err(_) if s.kept => return Joined::Stale,
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "waiting session lost");
                    return Joined::Lost;
                }
            }
        }
    }

    /// Until the row is free for `owner`, or a release or a break wakes the head.
    async fn until_free(&self, s: &mut Session, key: &Key, owner: &OwnerToken, _: bool) -> bool {
        let owner = owner.to_hex();
        loop {
            let r = sqlx::query_as::<_, (i64, Option<i64>)>(HEAD_CHECK)
                .bind(&owner)
                .bind(i64::try_from(UNKNOWN_REMAINING.as_micros()).unwrap_or(i64::MAX))
                .bind(key.as_str())
                .fetch_one(&mut s.conn)
                .await;
            match r {
                Ok((free, _)) if free != 0 => return true,
                // Woken by a release or a break (`SLEEP` returns 1 when killed).
                Ok((_, Some(1))) => return true,
                Err(e) if error_number(&e) == Some(INTERRUPTED) => return true,
                // Slept until the holder's expiry: look again.
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "waiting session lost");
                    return false;
                }
            }
        }
    }

    async fn pass(&self, mut s: Session, _: &Key) {
        let pass = sqlx::query("SELECT RELEASE_ALL_LOCKS()").execute(&mut s.conn);
        match tokio::time::timeout(self.db.config.get_timeout(), pass).await {
            Ok(Ok(_)) => self.idle.put(Session { kept: true, ..s }),
            _ => self.kill(s),
        }
    }

    fn abandon(&self, s: Session) {
        self.kill(s);
    }

    fn leave(&self, s: Session) {
        self.kill(s);
    }

    fn ticket(&self, s: &Session) -> u64 {
        s.id
    }
}

/// The lease-table store's wait queues.
#[derive(Clone, Debug)]
pub(crate) struct Queue(wait::Queue<MySqlWait>);

impl Deref for Queue {
    type Target = wait::Queue<MySqlWait>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Queue {
    pub(crate) fn new(db: Arc<Db>) -> Self {
        let policy = Policy {
            backend: db.backend,
            max_sessions: MAX_WAITING,
            busy: format!(
                "{MAX_WAITING} owners wait on this store already, each on a session of its own"
            ),
            bystanders_keep_place: true,
            contender_for: Some(OWNER_FRESH),
            overflow_wait: None,
        };
        let dialect = MySqlWait {
            db,
            idle: Idle::new(8, |s: Session| {
                wait::close_later(s.conn, Duration::from_secs(1))
            }),
        };
        Self(wait::Queue::new(dialect, policy))
    }

    /// The turnstile of `key` in this store's database.
    pub(crate) fn turnstile(&self, key: &Key) -> String {
        turnstile(self.dialect().db.config.get_database(), key)
    }

    /// Notes that `owner`'s acquire of `key` answered `Held` (its next wait claims the
    /// turn) or was granted.
    pub(crate) fn note(&self, key: &Key, owner: &OwnerToken, held: bool) {
        if held {
            self.note_held(key, owner);
        } else {
            self.note_granted(key, owner);
        }
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
