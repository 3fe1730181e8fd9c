//! The lease-table store: one row per key, one SQL statement per operation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Capabilities, Changes, Fence, FenceDurability, Key, LeaseInfo, OwnerToken,
    Record, ReleaseOutcome, RenewOutcome, Store, StoreError, WaitStore, WatchStore,
};
use leasehold_sql::lease::{released, renewed, ttl_us};
use sqlx::postgres::PgPool;

use crate::config::{
    DEFAULT_LEASE_TABLE, DEFAULT_RECORD_TABLE, DEFAULT_WAIT_SESSIONS, PgConfig, Pooler, TableName,
};
use crate::listen::Listener;
use crate::sql::{Arg, bound, col, digest64, fence_of, held};
use crate::tables::{Tables, table_methods};
use crate::wait::{LockId, PARKED_IDLE_MS, Queue, Sessions, TableHead, turnstile};
use crate::watch::{self, Watches};
use crate::{BACKEND_TABLE, error, schema};

const BACKEND: &str = BACKEND_TABLE;

/// The statements, rendered once for the configured table.
struct Sql {
    acquire: Arc<str>,
    /// The acquire on the wait-queue head's session: also releases the turnstile when
    /// granted.
    acquire_head: Arc<str>,
    /// On the head's session: is the row free, and how long is it held for?
    check: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    inspect: Arc<str>,
    list: Arc<str>,
    break_lease: Arc<str>,
}

/// The channel the table's release notifications go to: `leasehold_` and 16 hex digits
/// of SHA-256 of the table (as in SQL).
fn channel(table: &TableName) -> String {
    format!("leasehold_{:016x}", digest64(&[&table.sql()]))
}

/// `now_us`: the database clock in µs since the Unix epoch, the fence floor (docs/design.md §5).
const NOW_US: &str = "(extract(epoch FROM n.t) * 1000000)::bigint";

/// A query giving `hi`, `lo`: the turnstile of key `$1` in `table` (as [`turnstile`]
/// computes it), so that the acquire statement keeps its three parameters.
fn turnstile_sql(table: &str) -> String {
    let mut prefix = b"leasehold-wait\0".to_vec();
    prefix.extend_from_slice(table.as_bytes());
    prefix.push(0);
    let hex: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "SELECT ('x' || encode(substring(s.d FROM 1 FOR 4), 'hex'))::bit(32)::int4 AS hi, \
           ('x' || encode(substring(s.d FROM 5 FOR 4), 'hex'))::bit(32)::int4 AS lo \
         FROM (SELECT sha256(decode('{hex}', 'hex') || convert_to($1, 'UTF8')) AS d) s"
    )
}

impl Sql {
    fn new(table: &TableName) -> Self {
        let channel = channel(table);
        let records = table.sibling(DEFAULT_RECORD_TABLE);
        let t = table.sql();
        let turnstile = turnstile_sql(&t);
        let remaining = "GREATEST(0, (extract(epoch FROM (l.expires_at - n.t)) * 1000000)::bigint)";
        // One statement, three sub-statements on one snapshot:
        // - `upd` grants by updating the key's row when it is free, expired or the
        //   caller's. Its WHERE is evaluated on the snapshot and, for a row changed since,
        //   re-checked on the latest committed version after waiting for its row lock
        //   (READ COMMITTED), so two contenders can never both be granted.
        // - `ins` grants a key seen for the first time; a concurrent first insert makes it
        //   do nothing (reported as held).
        // - otherwise the row, as the snapshot sees it, gives the holder's remaining TTL.
        // A contender that finds the lease held therefore only reads: no row lock, no
        // transaction id, no WAL, no fsync. (An `INSERT … ON CONFLICT DO UPDATE … WHERE`
        // would lock and dirty the row even when its WHERE fails, making every failed
        // attempt a durable write that queues on the row: see the README's benchmark.)
        // A new grant also needs the key's turnstile (see `wait`): a transaction-scoped
        // try, which PostgreSQL refuses while a waiter holds it or queues for it, so that
        // nobody takes the lease past the queue. A contender that finds the row free but
        // the turnstile taken is told the lease is held for up to its own TTL (the head of
        // the queue is about to take it).
        let body = format!(
            "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), \
             h AS MATERIALIZED ({turnstile}), \
             cur AS MATERIALIZED (SELECT l.owner, l.expires_at FROM {t} l WHERE l.key = $1), \
             upd AS ( \
               UPDATE {t} l SET owner = $2, \
                 fence = CASE WHEN l.owner = $2 AND l.expires_at > n.t \
                              THEN l.fence ELSE GREATEST(l.fence + 1, {NOW_US}) END, \
                 expires_at = n.t + $3::bigint * interval '1 microsecond' \
               FROM n, h \
               WHERE l.key = $1 AND ((l.owner = $2 AND l.expires_at > n.t) \
                 OR ((l.owner IS NULL OR l.expires_at <= n.t) \
                     AND pg_try_advisory_xact_lock(h.hi, h.lo))) \
               RETURNING l.fence \
             ), \
             ins AS ( \
               INSERT INTO {t} (key, owner, fence, expires_at) \
               SELECT $1, $2, GREATEST(1, {NOW_US}), n.t + $3::bigint * interval '1 microsecond' \
               FROM n WHERE NOT EXISTS (SELECT 1 FROM cur) \
               ON CONFLICT (key) DO NOTHING \
               RETURNING fence \
             ), \
             res AS ( \
               SELECT true AS acquired, fence, NULL::bigint AS remaining_us FROM upd \
               UNION ALL SELECT true, fence, NULL FROM ins \
               UNION ALL SELECT false, NULL, \
                 CASE WHEN cur.owner IS NULL OR cur.expires_at <= n.t THEN $3::bigint \
                   ELSE GREATEST(0, (extract(epoch FROM (cur.expires_at - n.t)) * 1000000)::bigint) END \
                 FROM cur, n WHERE NOT EXISTS (SELECT 1 FROM upd) AND NOT EXISTS (SELECT 1 FROM ins) \
             ) "
        );
        // A grant notifies the key's watchers, if it has any (`watch`); a same-owner
        // re-acquire (an extension) too, which the contract allows.
        let watched = watch::notify_sql(&records, "$1", "res.acquired");
        let acquire =
            format!("{body}SELECT acquired, fence, remaining_us, {watched} AS watched FROM res");
        // The head's session holds the turnstile at session level: its try succeeds, and a
        // grant releases the session-level hold (the transaction-level one ends at commit,
        // when the next waiter in the queue gets it).
        let acquire_head = format!(
            "{body}SELECT acquired, fence, remaining_us, \
               CASE WHEN acquired THEN pg_advisory_unlock(h.hi, h.lo) END AS unlocked, \
               CASE WHEN acquired THEN set_config('idle_session_timeout', '0', false) END AS idle, \
               {watched} AS watched \
             FROM res, h"
        );
        let check = format!(
            "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), \
             r AS MATERIALIZED ( \
               SELECT COALESCE(l.owner IS NOT NULL AND l.expires_at > n.t, false) AS held, \
                 COALESCE(GREATEST(0, (extract(epoch FROM (l.expires_at - n.t)) * 1000000)::bigint), 0) \
                   AS remaining_us \
               FROM n LEFT JOIN {t} l ON l.key = $1) \
             SELECT NOT r.held AS free, r.remaining_us, \
               set_config('idle_session_timeout', \
                 ((CASE WHEN r.held THEN r.remaining_us / 1000 ELSE 0 END) + {PARKED_IDLE_MS})::text, false) AS idle \
             FROM r"
        );
        let renew = format!(
            "UPDATE {t} SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond' \
             WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()"
        );
        // A release is not flushed to disk before it is acknowledged (`synchronous_commit`
        // off for its own transaction): if the server loses it in a crash, the lease
        // simply runs until its TTL. It notifies the waiters only when a waiter holds the
        // key's turnstile (the head of its queue); otherwise nobody waits on this key and
        // it takes no notification lock. Likewise for the key's watchers.
        let watched = watch::notify_sql(&records, "$1", "count(*) > 0");
        let release = format!(
            "WITH u AS ( \
               UPDATE {t} SET owner = NULL, expires_at = clock_timestamp() \
               WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp() RETURNING 1 \
             ) \
             SELECT count(*) AS released, \
               CASE WHEN count(*) = 0 THEN false \
                    WHEN pg_try_advisory_xact_lock($3::int4, $4::int4) THEN false \
                    ELSE pg_notify('{channel}', $5)::text = '' END AS notified, \
               {watched} AS watched, \
               set_config('synchronous_commit', 'off', true) AS commit_mode \
             FROM u"
        );
        let inspect = format!(
            "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
             SELECT l.key, l.owner, l.fence, {remaining} AS remaining_us FROM {t} l, n \
             WHERE l.key = $1 AND l.owner IS NOT NULL AND l.expires_at > n.t"
        );
        let list = format!(
            "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
             SELECT l.key, l.owner, l.fence, {remaining} AS remaining_us FROM {t} l, n \
             WHERE l.key LIKE $1 ESCAPE '\\' AND l.owner IS NOT NULL AND l.expires_at > n.t \
             ORDER BY l.key"
        );
        // Break also wakes the head of the key's queue, if there is one, and notifies
        // the key's watchers.
        let watched = watch::notify_sql(&records, "$1", "true");
        let break_lease = format!(
            "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), b AS ( \
               INSERT INTO {t} AS l (key, owner, fence, expires_at) \
               SELECT $1, NULL, GREATEST(1, {NOW_US}), n.t FROM n \
               ON CONFLICT (key) DO UPDATE SET owner = NULL, \
                 expires_at = LEAST(l.expires_at, EXCLUDED.expires_at), \
                 fence = GREATEST(l.fence + 1, EXCLUDED.fence) \
               RETURNING l.fence \
             ) \
             SELECT b.fence, \
               CASE WHEN pg_try_advisory_xact_lock($2::int4, $3::int4) THEN false \
                    ELSE pg_notify('{channel}', $4)::text = '' END AS notified, \
               {watched} AS watched \
             FROM b"
        );
        Self {
            acquire: acquire.into(),
            acquire_head: acquire_head.into(),
            check: check.into(),
            renew: renew.into(),
            release: release.into(),
            inspect: inspect.into(),
            list: list.into(),
            break_lease: break_lease.into(),
        }
    }
}

/// A lease store on a PostgreSQL table (backend name `"postgres"`).
///
/// ## Behavior
/// - Each operation is **one SQL statement** in its own implicit transaction, on a pooled
///   connection: acquire is an `UPDATE … WHERE` the key's row is free, expired or the
///   caller's `RETURNING` the fence, with an `INSERT … ON CONFLICT DO NOTHING` for a key
///   seen for the first time and the holder's remaining TTL otherwise, all in one
///   statement (CTEs); renew and release are `UPDATE … WHERE key AND owner AND
///   expires_at > clock_timestamp()`.
/// - A contender that finds the lease held only reads (no row lock, no WAL write), so a
///   herd of waiters does not queue on the row or on the disk.
/// - Expiry is measured on **the database's clock** (`clock_timestamp()`), never the
///   client's.
/// - The fence lives in the lease row. A new grant sets it to
///   `GREATEST(last + 1, database clock in µs)`, a same-owner re-acquire keeps it, release
///   keeps the row (owner `NULL`), and [`break_lease`](Store::break_lease) advances it: it
///   never goes back while the table exists, and the clock floor keeps it above earlier
///   fences even if the table is restored from an old backup ([`FenceDurability::Durable`]).
/// - Concurrent acquires of one key serialise on its row lock: the store is correct under
///   contention, and its throughput is bounded by one row's lock hand-over (see the
///   crate's README for measured figures).
/// - The TTL is enforced by the database: a paused or dead holder's row simply expires.
///   The pool reconnects after a connection is killed (docs/faults.md row 16: the next renewal uses
///   a new connection).
/// - `wait_released` is not supported: waiters back off with jitter, bounded by the
///   holder's remaining TTL, which `Held` reports.
/// - [`watch`](WatchStore::watch) notifies every grant, release and break of a key and every
///   write of its record, by any client, with `LISTEN`/`NOTIFY`; the statements send the
///   `NOTIFY` only while somebody watches the key, so the hot path pays no round trip and
///   no `NOTIFY` for it (see the crate's README, "Watching"). Not behind a
///   transaction-pooling proxy (`Unsupported`).
///
/// ## Cancel safety
/// Every operation may be dropped at an await (the caller's timeout). A statement already
/// sent may still commit: the holder treats that as an ambiguous reply and retries with
/// the same owner token, which returns the same fence.
///
/// ## Failure model
/// A fence is durable once the acquire statement committed (with the server's `fsync` and
/// `synchronous_commit` on). With asynchronous replication, a promoted replica can lack
/// the last grants; the clock floor then still yields higher fences unless the new
/// primary's clock is behind by more than the outage. A lease granted on the old primary
/// may be granted again on the new one: the guard still rejects the older fence.
#[derive(Clone)]
pub struct PgLeaseStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The pool, the lease table and the records table.
    base: Tables,
    /// The table as in SQL (part of each key's turnstile).
    table_sql: String,
    sql: Sql,
    /// Waiters' queues (`None`: waiting is off, or impossible behind a proxy).
    queue: Option<Queue>,
    /// The channel of the change notices (`watch`), which writers notify even behind a
    /// transaction-pooling proxy.
    watch_channel: String,
    /// Change notices (`None` behind a transaction-pooling proxy, where `LISTEN` and
    /// session locks cannot work).
    watches: Option<Watches>,
}

impl fmt::Debug for PgLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLeaseStore")
            .field("target", &self.inner.base.target)
            .field("table", &self.inner.base.table)
            .finish_non_exhaustive()
    }
}

impl PgLeaseStore {
    /// Connects a pool as `config` says (one connection is opened at once, so a wrong
    /// address or password fails here) and uses the configured table (default
    /// `leasehold_leases`). Does not create the table: call [`migrate`](Self::migrate).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing but a closing connection.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`](leasehold_core::StoreErrorKind::Config) for authentication
    /// and other configuration problems,
    /// [`StoreErrorKind::Unavailable`](leasehold_core::StoreErrorKind::Unavailable) when the
    /// server cannot be reached.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig};
    /// use leasehold_postgres::{PgConfig, PgLeaseStore};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PgConfig::from_url("postgres://app@db.internal/app")?;
    /// let store = PgLeaseStore::connect(&config).await?;
    /// store.migrate().await?; // idempotent; or run sql/lease_table.sql at deployment
    /// let client = LeaseClient::new(Arc::new(store), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.acquire("job:invoices", Duration::from_secs(30)).await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: &PgConfig) -> Result<Self, StoreError> {
        let pool = crate::config::open_pool(config, BACKEND).await?;
        let simple = config.get_pooler() == Pooler::Transaction;
        let table = config.table_or(DEFAULT_LEASE_TABLE);
        let queue = (!simple && config.get_wait_sessions() > 0).then(|| {
            let prefix = config.get_application_name();
            Self::queue(
                &table,
                config.options_named(&format!("{prefix}/wait")),
                config.options_named(&format!("{prefix}/listen")),
                config.get_wait_sessions() as usize,
            )
        });
        let watches = (!simple).then(|| {
            let name = format!("{}/watch", config.get_application_name());
            let records = table.sibling(DEFAULT_RECORD_TABLE);
            Watches::new(BACKEND, config.options_named(&name), &records)
        });
        let base = Tables::new(BACKEND, pool, simple, table, config.target());
        Ok(Self::assemble(base, queue, watches))
    }

    /// A store on an existing pool (whatever its settings) and table. Waiters wait on
    /// sessions of their own, opened with the pool's connect options (up to
    /// [`DEFAULT_WAIT_SESSIONS`] at once).
    pub fn with_pool(pool: PgPool, table: TableName) -> Self {
        leasehold_sql::tls::install_provider();
        let options = (*pool.connect_options()).clone();
        let queue = Self::queue(
            &table,
            options.clone(),
            options.clone(),
            DEFAULT_WAIT_SESSIONS as usize,
        );
        let watches = Watches::new(BACKEND, options, &table.sibling(DEFAULT_RECORD_TABLE));
        let base = Tables::new(BACKEND, pool, false, table, "(caller's pool)".to_owned());
        Self::assemble(base, Some(queue), Some(watches))
    }

    /// The store on `base`, with its waiters' `queue` and its `watches` (if any).
    fn assemble(base: Tables, queue: Option<Queue>, watches: Option<Watches>) -> Self {
        let inner = Inner {
            table_sql: base.table.sql(),
            sql: Sql::new(&base.table),
            watch_channel: watch::channel(base.records.table()),
            base,
            queue,
            watches,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    fn queue(
        table: &TableName,
        wait: sqlx::postgres::PgConnectOptions,
        listen: sqlx::postgres::PgConnectOptions,
        max_sessions: usize,
    ) -> Queue {
        let sql = Sql::new(table);
        let head = TableHead {
            table: table.sql(),
            check: sql.check.clone(),
            listener: Listener::new(listen, channel(table)),
        };
        let sessions = Arc::new(Sessions::new(BACKEND, wait, max_sessions.min(16)));
        Queue::new(BACKEND, sessions, Some(head), max_sessions)
    }

    table_methods!(schema::lease_table_sql);

    /// The channel of the store's change notices ([`WatchStore::watch`]): `leasehold_watch_`
    /// and 16 hex digits, one per records table (so both stores of one schema share it).
    /// Each notice's payload names the key as 16 hex digits of its watch lock, and is sent
    /// only while somebody watches the key (see the crate's README). Writers notify
    /// watchers even behind a transaction-pooling proxy, where this store cannot watch.
    pub fn watch_channel(&self) -> &str {
        &self.inner.watch_channel
    }

    /// The acquire statement's SQL (for benchmarks that compare it with raw throughput).
    /// Parameters: `$1` key (text), `$2` owner (bytea, 16 bytes), `$3` TTL in µs (bigint).
    pub fn acquire_sql(&self) -> &str {
        &self.inner.sql.acquire
    }
}

#[async_trait]
impl Store for PgLeaseStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.fifo_wait = self.inner.queue.is_some();
        caps.reports_remaining = true;
        // A renewal sets the row's expiry to the server's now + the TTL asked.
        caps.sets_expiry = true;
        caps.fence_durability = FenceDurability::Durable;
        caps
    }

    /// With waiting sessions (`leasehold_wait_sessions` above 0, not behind a
    /// transaction-pooling proxy).
    fn waiter(&self) -> Option<&dyn WaitStore> {
        self.inner.queue.as_ref().map(|_| self as &dyn WaitStore)
    }

    /// Not behind a transaction-pooling proxy (LISTEN needs a session).
    fn watcher(&self) -> Option<&dyn WatchStore> {
        self.inner.watches.as_ref().map(|_| self as &dyn WatchStore)
    }

    /// # Cancel safety
    /// Cancel safe in the sense of [`Store`]: a statement already sent may still grant.
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let args = [
            Arg::Text(key.as_str()),
            Arg::Bytes(&owner.as_bytes()[..]),
            Arg::Int(ttl_us(BACKEND, ttl)?),
        ];
        let queue = self.inner.queue.as_ref();
        let row = match queue.and_then(|q| q.claim(key, owner)) {
            // This owner's turn has come: acquire on the head's session.
            Some(mut claim) => {
                let res = bound(&self.inner.sql.acquire_head, &args)
                    .fetch_optional(claim.conn())
                    .await;
                match res {
                    Ok(Some(row)) if col::<bool>(BACKEND, &row, "acquired")? => {
                        let conn = claim.granted();
                        if let Some(q) = queue {
                            q.put_session(conn);
                        }
                        Some(row)
                    }
                    Ok(row) => {
                        claim.held();
                        row
                    }
                    // Dropping the claim closes the session (and its turnstile).
                    Err(e) => return Err(error::map(BACKEND, "acquire", e)),
                }
            }
            None => {
                let _alive = queue.map(|q| q.acquiring(key, owner));
                self.inner
                    .base
                    .rows("acquire", &self.inner.sql.acquire, &args)
                    .await?
                    .into_iter()
                    .next()
            }
        };
        let Some(row) = row else {
            // The key's first row was inserted concurrently, after this statement's
            // snapshot: held, remaining unknown.
            return Ok(AcquireOutcome::Held { remaining: None });
        };
        let acquired: bool = col(BACKEND, &row, "acquired")?;
        if acquired {
            let fence: i64 = col(BACKEND, &row, "fence")?;
            if let Some(q) = queue {
                q.note_granted(key, owner);
            }
            Ok(AcquireOutcome::Acquired {
                fence: fence_of(BACKEND, fence)?,
                ttl,
            })
        } else {
            let remaining: i64 = col(BACKEND, &row, "remaining_us")?;
            if let Some(q) = queue {
                q.note_held(key, owner);
            }
            Ok(held(Some(remaining)))
        }
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let args = [
            Arg::Text(key.as_str()),
            Arg::Bytes(&owner.as_bytes()[..]),
            Arg::Int(ttl_us(BACKEND, ttl)?),
        ];
        let base = &self.inner.base;
        let changed = base.execute("renew", &self.inner.sql.renew, &args).await?;
        Ok(renewed(changed == 1, ttl))
    }

    /// Not flushed to disk before it answers (see the crate's README): a release lost in
    /// a server crash only leaves the lease to expire at its TTL.
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let (hi, lo) = turnstile_args(&self.inner.table_sql, key);
        let payload = format!("{:016x}", turnstile(&self.inner.table_sql, key).bits());
        let args = [
            Arg::Text(key.as_str()),
            Arg::Bytes(&owner.as_bytes()[..]),
            Arg::Int4(hi),
            Arg::Int4(lo),
            Arg::Text(&payload),
        ];
        let base = &self.inner.base;
        let rows = base.rows("release", &self.inner.sql.release, &args).await?;
        let count: i64 = match rows.first() {
            Some(row) => col(BACKEND, row, "released")?,
            None => 0,
        };
        if count == 1
            && let Some(q) = &self.inner.queue
        {
            q.released_here(key);
        }
        Ok(released(count == 1))
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        self.inner.base.inspect(&self.inner.sql.inspect, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        self.inner.base.list(&self.inner.sql.list, prefix).await
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let (hi, lo) = turnstile_args(&self.inner.table_sql, key);
        let payload = format!("{:016x}", turnstile(&self.inner.table_sql, key).bits());
        let args = [
            Arg::Text(key.as_str()),
            Arg::Int4(hi),
            Arg::Int4(lo),
            Arg::Text(&payload),
        ];
        let base = &self.inner.base;
        base.break_lease(&self.inner.sql.break_lease, &args).await
    }

    /// One transaction on the records table: `INSERT … ON CONFLICT (key) DO UPDATE …
    /// WHERE fence < EXCLUDED.fence`, then a read of the row (behind a transaction pooler:
    /// both in one simple-protocol query).
    ///
    /// # Cancel safety
    /// A dropped call may have committed the record.
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`](leasehold_core::StoreErrorKind::InvalidInput) for a
    /// fence above `i64::MAX` or a value longer than
    /// [`MAX_RECORD_LEN`](leasehold_core::MAX_RECORD_LEN);
    /// [`StoreErrorKind::Config`](leasehold_core::StoreErrorKind::Config) when
    /// the records table is missing (run [`migrate`](Self::migrate)).
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        let b = &self.inner.base;
        b.records
            .put(&b.pool, BACKEND, b.simple, key, fence, value)
            .await
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let b = &self.inner.base;
        b.records.get(&b.pool, BACKEND, b.simple, key).await
    }

    async fn diagnose(&self) -> Result<leasehold_core::Diagnosis, StoreError> {
        crate::doctor::diagnose(&self.inner.base, false).await
    }
}

#[async_trait]
impl WaitStore for PgLeaseStore {
    /// Joins the key's wait queue (a session of its own, blocked in the server's lock
    /// queue) and returns when it is this caller's turn and the lease is free — woken by
    /// the release or break notification, or at the holder's expiry — or at `timeout`.
    /// `owner` then acquires with its own request. The turn is kept for `owner` if its
    /// acquire of `key` last answered `Held` on this store (the holder side's loop); a
    /// wait by any other owner queues too, and passes the turn on when it comes.
    ///
    /// # Cancel safety
    /// Cancel safe: a contender's place in the queue is kept for a short grace period (for
    /// its next call or acquire), then given up; any other caller's is given up at once.
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        match &self.inner.queue {
            Some(q) => q.wait(key, owner, timeout).await,
            None => Err(StoreError::unsupported(
                BACKEND,
                if self.inner.base.simple {
                    "waiting for release (behind a transaction-pooling proxy)"
                } else {
                    "waiting for release (leasehold_wait_sessions=0)"
                },
            )),
        }
    }
}

#[async_trait]
impl WatchStore for PgLeaseStore {
    /// `LISTEN`s on the store's watch session (one per store instance, opened by the first
    /// watch, closed with the last stream) and holds the key's watch lock there, so that
    /// every grant, release and break of the lease `key` and every write of the record
    /// `key`, by any client, sends a notice at its commit (see the crate's README).
    /// Behind a transaction-pooling proxy: `Unsupported` (`LISTEN` and session locks do
    /// not survive the transaction), and the store offers no watcher ([`Store::watcher`]
    /// is `None`).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call gives its subscription up; dropping the stream ends the
    /// watch.
    ///
    /// # Errors
    /// [`StoreErrorKind::Unsupported`](leasehold_core::StoreErrorKind::Unsupported) behind a
    /// transaction-pooling proxy; connection errors, or
    /// [`StoreErrorKind::Timeout`](leasehold_core::StoreErrorKind::Timeout) when the watch
    /// is not set up within 10 s.
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        match &self.inner.watches {
            Some(w) => w.watch(key).await,
            None => Err(StoreError::unsupported(
                BACKEND,
                "watching (LISTEN and session locks do not work behind a transaction-pooling proxy)",
            )),
        }
    }
}

/// The two int4 halves of `key`'s turnstile.
fn turnstile_args(table: &str, key: &Key) -> (i32, i32) {
    match turnstile(table, key) {
        LockId::Pair(hi, lo) => (hi, lo),
        LockId::Big(v) => ((v >> 32) as i32, v as i32),
    }
}
