//! [`MySqlLeaseStore`]: leases as rows of a table, expiry on the server's clock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Capabilities, Fence, FenceDurability, Key, LeaseInfo, OwnerToken, Record,
    ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind, WaitStore,
};
use leasehold_sql::Failure;
use leasehold_sql::lease::{released, remaining, renewed};
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{Connection, MySql, MySqlConnection};

use crate::BACKEND_TABLE;
use crate::config::MySqlConfig;
use crate::conn::{Db, StoreTable, db_methods};
use crate::error::is_deadlock;
use crate::schema::LEASES_SCHEMA;
use crate::sql::{like_prefix, listed_key, now_us, parse_owner};
use crate::wait::{Queue, wake_head};

/// The lease table.
const TABLE: StoreTable = StoreTable {
    name: "leasehold_leases",
    schema: LEASES_SCHEMA,
};

/// How many times a statement that lost a deadlock (and was rolled back whole) is retried.
const DEADLOCK_RETRIES: u32 = 5;

/// A leasehold [`Store`] in a table of a MariaDB/MySQL database, with expiry on the
/// **server's** clock.
///
/// Acquire, renew and release are each one autocommitted statement (acquire then reads its
/// row back), so no row lock is ever left waiting on a client that went away; break is
/// one short transaction. See the crate docs for the schema and the failure model.
///
/// Waiters ([`WaitStore::wait_released`]) queue in the server, in arrival order, on a
/// `GET_LOCK` session each, and are woken by a release or a break from any process (or
/// the holder's expiry); nobody acquires past the queue. See the crate docs ("Waiting").
///
/// Cheap to share: wrap it in an `Arc`. It owns a pool of connections; an operation that is
/// cancelled, times out or breaks its connection closes it rather than returning it to
/// the pool.
pub struct MySqlLeaseStore {
    db: Arc<Db>,
    queue: Queue,
}

impl std::fmt::Debug for MySqlLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlLeaseStore")
            .field("config", &self.db.config.to_string())
            .finish_non_exhaustive()
    }
}

/// A row as read back: owner, fence, expiry, and the server's clock.
type Row = (Option<String>, u64, Option<i64>, i64);

fn corrupt(key: &str, what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        BACKEND_TABLE,
        format!("the lease row of `{key}` is not a leasehold lease: {what}"),
    )
}

/// `Some((owner, expires_at_us))` if the row holds a live lease, `None` if free.
fn live(
    key: &str,
    owner: Option<&str>,
    expires: Option<i64>,
    now: i64,
) -> Result<Option<(OwnerToken, i64)>, StoreError> {
    let Some(owner) = owner else { return Ok(None) };
    let token = parse_owner(key, owner, corrupt)?;
    let expires = expires.ok_or_else(|| corrupt(key, "an owner without an expiry"))?;
    Ok((expires > now).then_some((token, expires)))
}

/// The lease `row` of `key` holds, if it is live.
fn info(key: Key, (owner, fence, expires, now): Row) -> Result<Option<LeaseInfo>, StoreError> {
    let live = live(key.as_str(), owner.as_deref(), expires, now)?;
    Ok(live.map(|(owner, expires)| LeaseInfo {
        key,
        owner,
        fence: Fence(fence),
        remaining: Some(remaining(expires, now)),
    }))
}

/// Whether the row is granted to the caller (`?` = the caller's owner token, twice), on
/// the row's values before the update (or, for `expires_at_us`, after `owner` was set:
/// the same answer). `VALUES(owner)` is the caller's token, or `NULL` when the key's
/// turnstile is taken by a waiter other than the caller (see [`ACQUIRE`]).
macro_rules! granted {
    () => {
        concat!(
            "(NOT (owner IS NOT NULL AND (expires_at_us IS NULL OR expires_at_us > ",
            now_us!(),
            ") AND owner <> ?) AND ((owner <=> ? AND expires_at_us IS NOT NULL AND expires_at_us > ",
            now_us!(),
            ") OR VALUES(owner) IS NOT NULL))"
        )
    };
}

/// The acquire: one `INSERT … ON DUPLICATE KEY UPDATE`. Parameters: key, turnstile, head,
/// head, owner, ttl, then owner ×3, owner ×3, owner ×2, ttl.
///
/// A row is taken while it has an owner and has not expired (or has no expiry: corrupt,
/// left alone so the read below reports it). A free row is granted only when the key's
/// turnstile (the lock its waiters queue on, see `wait`) is free or held by the caller's
/// own waiting session (`head`, its `CONNECTION_ID()`; 0 for none): `IS_USED_LOCK` is read
/// once, into the inserted `owner` (`NULL` when barred), so that every assignment below
/// agrees. Each assignment depends only on the row's values before the update, except
/// `expires_at_us`, which reads `owner` after it was set and gets the same answer: right
/// for MySQL's left-to-right assignments and MariaDB's `SIMULTANEOUS_ASSIGNMENT` alike.
const ACQUIRE: &str = concat!(
    "INSERT INTO leasehold_leases (lease_key, owner, fence, expires_at_us) ",
    "VALUES (?, IF(COALESCE(IS_USED_LOCK(?), ?) <> ?, NULL, ?), GREATEST(1, ",
    now_us!(),
    "), ",
    now_us!(),
    " + ?) ",
    "ON DUPLICATE KEY UPDATE ",
    "fence = IF(",
    granted!(),
    " AND NOT (owner <=> ? AND expires_at_us IS NOT NULL AND expires_at_us > ",
    now_us!(),
    "), GREATEST(fence + 1, ",
    now_us!(),
    "), fence), ",
    "owner = IF(",
    granted!(),
    ", ?, owner), ",
    "expires_at_us = IF(",
    granted!(),
    ", ",
    now_us!(),
    " + ?, expires_at_us)"
);

const READ: &str = concat!(
    "SELECT owner, fence, expires_at_us, ",
    now_us!(),
    " FROM leasehold_leases WHERE lease_key = ?"
);

const RENEW: &str = concat!(
    "UPDATE leasehold_leases SET expires_at_us = ",
    now_us!(),
    " + ? ",
    "WHERE lease_key = ? AND owner = ? AND expires_at_us > ",
    now_us!()
);

const RELEASE: &str = concat!(
    "UPDATE leasehold_leases SET owner = NULL, expires_at_us = NULL ",
    "WHERE lease_key = ? AND owner = ? AND expires_at_us > ",
    now_us!()
);

const BREAK: &str = concat!(
    "INSERT INTO leasehold_leases (lease_key, owner, fence, expires_at_us) ",
    "VALUES (?, NULL, GREATEST(1, ",
    now_us!(),
    "), NULL) ",
    "ON DUPLICATE KEY UPDATE fence = GREATEST(fence + 1, ",
    now_us!(),
    "), owner = NULL, expires_at_us = NULL"
);

/// Deletes the rows nobody holds whose fence is more than `?` µs old.
const PRUNE: &str = concat!(
    "DELETE FROM leasehold_leases WHERE (owner IS NULL OR expires_at_us IS NULL OR expires_at_us < ",
    now_us!(),
    ") AND CAST(fence AS SIGNED) < ",
    now_us!(),
    " - ?"
);

const LIST: &str = concat!(
    "SELECT lease_key, owner, fence, expires_at_us, ",
    now_us!(),
    " FROM leasehold_leases WHERE lease_key LIKE ? ESCAPE '!' ",
    "AND owner IS NOT NULL AND expires_at_us > ",
    now_us!(),
    " ORDER BY lease_key"
);

async fn acquire_stmt(
    conn: &mut MySqlConnection,
    key: &str,
    owner: &OwnerToken,
    ttl_us: i64,
    turnstile: &str,
    head: u64,
) -> Result<Row, Failure> {
    let hex = owner.to_hex();
    let mut attempt = 0;
    loop {
        let mut q = sqlx::query(ACQUIRE)
            .bind(key)
            .bind(turnstile)
            .bind(head)
            .bind(head)
            .bind(&hex)
            .bind(ttl_us);
        // fence: granted (2) + live mine (1); owner: granted (2) + value; expires: granted (2).
        for _ in 0..8 {
            q = q.bind(&hex);
        }
        let r = q.bind(ttl_us).execute(&mut *conn).await;
        match r {
            Ok(_) => break,
            Err(e) if is_deadlock(&e) && attempt < DEADLOCK_RETRIES => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 3)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let row: Option<Row> = sqlx::query_as(READ)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
    row.ok_or_else(|| {
        Failure::Store(StoreError::new(
            StoreErrorKind::Other,
            BACKEND_TABLE,
            format!("the lease row of `{key}` vanished right after it was written"),
        ))
    })
}

async fn break_tx(conn: &mut MySqlConnection, key: &str) -> Result<u64, Failure> {
    let mut tx = conn.begin().await?;
    sqlx::query(BREAK).bind(key).execute(&mut *tx).await?;
    let fence: u64 = sqlx::query_scalar("SELECT fence FROM leasehold_leases WHERE lease_key = ?")
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(fence)
}

/// Wakes the head of `key`'s wait queue after a release or a break. A failure is logged:
/// the head then wakes at the holder's expiry.
async fn wake(conn: &mut MySqlConnection, key: &Key, turnstile: &str) {
    if let Err(e) = wake_head(conn, turnstile).await {
        tracing::warn!(key = %key, error = %e, "could not wake the head of the wait queue (it wakes at the lease's expiry): are all processes the same MariaDB/MySQL user?");
    }
}

impl MySqlLeaseStore {
    /// A store for `config`, without connecting: the first operation connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an invalid configuration.
    pub fn new(config: MySqlConfig) -> Result<Self, StoreError> {
        let db = Arc::new(Db::new(config, BACKEND_TABLE)?);
        Ok(Self {
            queue: Queue::new(db.clone()),
            db,
        })
    }

    /// A store for `config`, connected now; with `migrate` on (the default) the table is
    /// created if missing, otherwise its presence is checked.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves at most a created table behind.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for a wrong password, an unknown database or a missing
    /// table; [`StoreErrorKind::Unavailable`] when the server cannot be reached.
    pub async fn connect(config: MySqlConfig) -> Result<Self, StoreError> {
        let store = Self::new(config)?;
        store.db.prepare(TABLE).await?;
        Ok(store)
    }

    /// Parses `url` (see [`MySqlConfig::from_url`]) and [`connect`](Self::connect)s.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`connect`](Self::connect).
    ///
    /// # Errors
    /// As [`MySqlConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig};
    /// use leasehold_mysql::MySqlLeaseStore;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Arc::new(MySqlLeaseStore::open("mysql://app:secret@db:3306/app?timeout=2s").await?);
    /// let client = LeaseClient::new(store.clone(), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.acquire("job:invoices", Duration::from_secs(30)).await?;
    /// lease.release().await?;
    /// store.close().await;
    /// # Ok(()) }
    /// ```
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(MySqlConfig::from_url(url)?).await
    }

    db_methods!(TABLE);

    /// Deletes the rows of keys nobody holds whose last fence is more than `older_than`
    /// below the server clock in µs, so that a store with one key per entity does not
    /// keep a row for every entity ever locked. Rows are kept after release on purpose
    /// (they carry the fence); deleting one of these is safe because the next grant on
    /// that key gets its fence from the server clock in µs (`GREATEST(last + 1, now)`),
    /// which is above the deleted fence by the statement's own condition. A held lease's
    /// row is never deleted. Needs `DELETE` on the table. Returns the number of rows
    /// deleted.
    ///
    /// # Cancel safety
    /// Cancel safe: one statement.
    ///
    /// # Errors
    /// As any operation; [`StoreErrorKind::Config`] without `DELETE` privilege.
    pub async fn prune(&self, older_than: std::time::Duration) -> Result<u64, StoreError> {
        self.db.prune(PRUNE, older_than).await
    }

    /// Runs a renew or release statement (a conditional `UPDATE` of the caller's live
    /// lease); whether it matched the row.
    async fn update_own(
        &self,
        op: &str,
        query: Query<'_, MySql, MySqlArguments>,
    ) -> Result<bool, StoreError> {
        self.db
            .run(op, async move |conn| {
                Ok(query.execute(conn).await?.rows_affected() == 1)
            })
            .await
    }

    /// Closes every pooled connection.
    ///
    /// # Cancel safety
    /// Cancel safe: the pool is marked closed at the first poll; connections still close.
    pub async fn close(&self) {
        self.db.pool.close().await;
    }
}

#[async_trait]
impl Store for MySqlLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND_TABLE
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.reports_remaining = true;
        // Waiters queue in the server (a GET_LOCK turnstile per key), in arrival order.
        caps.fifo_wait = true;
        // A renewal sets the row's expiry to the server's now + the TTL asked.
        caps.sets_expiry = true;
        caps.fence_durability = FenceDurability::Durable;
        caps
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
        let ttl_us = leasehold_sql::lease::ttl_us(BACKEND_TABLE, ttl)?;
        let turnstile = self.queue.turnstile(key);
        let turn = self.queue.turn(key, owner);
        let head = turn.head();
        let (row_owner, fence, expires, now) = self
            .db
            .run("acquire", async |conn| {
                acquire_stmt(conn, key.as_str(), owner, ttl_us, &turnstile, head).await
            })
            .await?;
        let token = row_owner
            .as_deref()
            .map(|o| parse_owner(key.as_str(), o, corrupt))
            .transpose()?;
        if token == Some(*owner) {
            turn.outcome(true);
            self.queue.note(key, owner, false);
            return Ok(AcquireOutcome::Acquired {
                fence: Fence(fence),
                ttl,
            });
        }
        turn.outcome(false);
        self.queue.note(key, owner, true);
        // Held by another owner; or free, but the head of the key's wait queue is about to
        // take it (or, rarely, broken or expired right after our statement): held for up
        // to the caller's own TTL.
        let remaining = match live(key.as_str(), row_owner.as_deref(), expires, now)? {
            Some((_, expires)) => remaining(expires, now),
            None => ttl,
        };
        Ok(AcquireOutcome::Held {
            remaining: Some(remaining),
        })
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let query = sqlx::query(RENEW)
            .bind(leasehold_sql::lease::ttl_us(BACKEND_TABLE, ttl)?)
            .bind(key.as_str())
            .bind(owner.to_hex());
        Ok(renewed(self.update_own("renew", query).await?, ttl))
    }

    /// Compare-and-delete; a release also wakes the head of the key's wait queue (see
    /// [`wait_released`](Self::wait_released)).
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let turnstile = self.queue.turnstile(key);
        let matched = self
            .db
            .run("release", async |conn| {
                let done = sqlx::query(RELEASE)
                    .bind(key.as_str())
                    .bind(owner.to_hex())
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1;
                if done {
                    wake(conn, key, &turnstile).await;
                }
                Ok(done)
            })
            .await?;
        Ok(released(matched))
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let row: Option<Row> = self
            .db
            .run("inspect", async move |conn| {
                Ok(sqlx::query_as(READ)
                    .bind(key.as_str())
                    .fetch_optional(conn)
                    .await?)
            })
            .await?;
        Ok(row.map(|row| info(key.clone(), row)).transpose()?.flatten())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        type ListRow = (Vec<u8>, Option<String>, u64, Option<i64>, i64);
        let pattern = like_prefix(prefix);
        let rows: Vec<ListRow> = self
            .db
            .run("list", async move |conn| {
                Ok(sqlx::query_as(LIST).bind(pattern).fetch_all(conn).await?)
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (name, owner, fence, expires, now) in rows {
            let Some(key) = listed_key(name, prefix, corrupt)? else {
                continue;
            };
            out.extend(info(key, (owner, fence, expires, now))?);
        }
        Ok(out)
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let turnstile = self.queue.turnstile(key);
        let fence = self
            .db
            .run("break", async |conn| {
                let fence = break_tx(conn, key.as_str()).await?;
                wake(conn, key, &turnstile).await;
                Ok(fence)
            })
            .await?;
        tracing::info!(key = %key, fence, "mysql lease broken");
        Ok(Fence(fence))
    }

    /// One transaction on `leasehold_records` (shared by both stores): `INSERT … ON
    /// DUPLICATE KEY UPDATE value = IF(fence < new, …), fence = IF(fence < new, …)`, then
    /// a read of the row. A deadlock (rolled back whole) is retried.
    ///
    /// # Cancel safety
    /// A dropped call may have committed the record (its connection is closed).
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for a value longer than
    /// [`MAX_RECORD_LEN`](leasehold_core::MAX_RECORD_LEN); [`StoreErrorKind::Config`] when
    /// the records table is missing (connect with `migrate=true` or call `migrate`).
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        crate::records::put(&self.db, key, fence, value).await
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        crate::records::get(&self.db, key).await
    }

    async fn diagnose(&self) -> Result<leasehold_core::Diagnosis, StoreError> {
        crate::doctor::diagnose(&self.db, false).await
    }
}

#[async_trait]
impl WaitStore for MySqlLeaseStore {
    /// Returns when `owner`'s turn in `key`'s wait queue has come and the lease is free
    /// (released, broken or expired), or when `timeout` has passed; `Ok` either way.
    ///
    /// The owner waits in the server's queue on a session of its own (`GET_LOCK` on the
    /// key's turnstile, in arrival order across every process), woken by a release or a
    /// break from any process (`KILL QUERY` of the head's `SLEEP`) or by the holder's
    /// expiry; the owner's next acquire is then granted past every newcomer. See the
    /// crate docs ("Waiting").
    ///
    /// # Cancel safety
    /// Cancel safe: the place in the queue is kept for a short grace period (500 ms, for
    /// the next call or the owner's acquire), then given up.
    ///
    /// # Errors
    /// [`StoreErrorKind::Busy`] when 64 owners wait on this store already;
    /// [`StoreErrorKind::Unavailable`] (or as the server answered) when no waiting
    /// session can be opened.
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.queue.wait(key, owner, timeout).await
    }
}
