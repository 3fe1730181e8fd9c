//! The advisory-lock store: a session-level `pg_try_advisory_lock` on a connection
//! dedicated to each holder.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Capabilities, Changes, EndedGrants, Fence, FenceDurability, Key, LeaseInfo,
    OwnerToken, Record, ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind, WaitStore,
    WatchStore,
};
use leasehold_sql::lease::renewed;
use leasehold_sql::server_watch::{ServerWatch, Watching};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener};

use crate::config::{DEFAULT_ADVISORY_TABLE, DEFAULT_RECORD_TABLE, PgConfig, TableName};
use crate::listen::listener_pool;
use crate::sql::{Arg, advisory_lock_id, bound, col, fence_of, held, ttl_us};
use crate::tables::{Tables, table_methods};
use crate::wait::{Queue, Sessions, close};
use crate::watch::{self, Watches};
use crate::{BACKEND_ADVISORY, error, schema};

const BACKEND: &str = BACKEND_ADVISORY;

/// How many idle dedicated connections are kept for reuse by later acquisitions and
/// waiters, at least (the pool size, if larger).
const IDLE_CONNECTIONS: usize = 4;

/// How long `break_lease` waits for the evicted holder's session to end.
const TERMINATE_WAIT_MS: i64 = 5000;

/// How long an acquire waits for the server watch's session to open.
const SERVER_WATCH_OPEN: Duration = Duration::from_secs(10);

/// `(classid, objid)` of a bigint advisory lock as `pg_locks` shows them.
fn lock_parts(id: i64) -> (i64, i64) {
    let u = id as u64;
    ((u >> 32) as i64, (u & 0xffff_ffff) as i64)
}

/// Matches the row `a`'s advisory lock in `pg_locks x` (granted, in this database).
const LOCK_OF_ROW: &str = "x.locktype = 'advisory' AND x.objsubid = 1 AND x.granted \
     AND x.classid::bigint = ((a.lock_id >> 32) & 4294967295) \
     AND x.objid::bigint = (a.lock_id & 4294967295) \
     AND x.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())";

struct Sql {
    precheck: Arc<str>,
    acquire: Arc<str>,
    /// The acquire on a waiter's session that already holds the lock (its turn came).
    acquire_parked: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    inspect: Arc<str>,
    list: Arc<str>,
    break_lease: Arc<str>,
    terminate_holder: Arc<str>,
}

impl Sql {
    fn new(table: &TableName) -> Self {
        let t = table.sql();
        let records = table.sibling(DEFAULT_RECORD_TABLE);
        // Each grant, release and break notifies the key's watchers, if it has any.
        let watched_grant = watch::notify_sql(&records, "$2", "l.got");
        let watched_release = watch::notify_sql(&records, "$1", "n.n > 0");
        let watched_break = watch::notify_sql(&records, "$1", "true");
        let remaining = "GREATEST(0, (extract(epoch FROM (a.expires_at - clock_timestamp())) * 1000000)::bigint)";
        // Through the pool: is the lock held by any session, and for how long (per row)?
        let precheck = format!(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks x WHERE x.locktype = 'advisory' \
               AND x.objsubid = 1 AND x.granted AND x.classid::bigint = $2 AND x.objid::bigint = $3 \
               AND x.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())) AS held, \
             COALESCE((SELECT {remaining} FROM {t} a WHERE a.key = $1 AND a.owner IS NOT NULL), $4) \
               AS remaining_us"
        );
        // On the dedicated connection, one statement: try the lock; if granted, advance the
        // fence counter row while holding it, record owner and pid, set the server-side
        // idle timeout that enforces the TTL and the connection's application_name.
        let acquire_with = |got: &str| {
            format!(
                "WITH l AS MATERIALIZED ( \
               SELECT {got} AS got, pg_backend_pid() AS pid, clock_timestamp() AS t \
             ), up AS ( \
               INSERT INTO {t} AS a (key, lock_id, owner, fence, holder_pid, expires_at) \
               SELECT $2, $1, $3, GREATEST(1, (extract(epoch FROM l.t) * 1000000)::bigint), l.pid, \
                      l.t + $4::bigint * interval '1 microsecond' \
               FROM l WHERE l.got \
               ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, owner = EXCLUDED.owner, \
                 fence = GREATEST(a.fence + 1, EXCLUDED.fence), holder_pid = EXCLUDED.holder_pid, \
                 expires_at = EXCLUDED.expires_at \
               RETURNING a.fence \
             ) \
             SELECT l.got, l.pid, (SELECT fence FROM up) AS fence, \
               CASE WHEN l.got THEN set_config('idle_session_timeout', $5, false) || \
                                    set_config('application_name', $6, false) END AS settings, \
               CASE WHEN NOT l.got THEN COALESCE((SELECT {remaining} FROM {t} a WHERE a.key = $2 AND a.owner IS NOT NULL), $4) \
                 END AS remaining_us, \
               {watched_grant} AS watched \
             FROM l"
            )
        };
        let acquire = acquire_with("pg_try_advisory_lock($1)");
        // The waiter's session got the lock in the queue (`wait`): it holds it already.
        let acquire_parked = acquire_with("true");
        // On the holder's connection: still this session's lock, still this owner's row?
        // Then extend the row and reset the idle timeout.
        let renew = format!(
            "WITH l AS MATERIALIZED ( \
               SELECT pg_backend_pid() AS pid, EXISTS (SELECT 1 FROM pg_catalog.pg_locks x \
                 WHERE x.locktype = 'advisory' AND x.pid = pg_backend_pid() AND x.objsubid = 1 \
                   AND x.granted AND x.classid::bigint = $2 AND x.objid::bigint = $3) AS held \
             ), up AS ( \
               UPDATE {t} a SET expires_at = clock_timestamp() + $5::bigint * interval '1 microsecond' \
               FROM l WHERE a.key = $1 AND a.owner = $4 AND a.holder_pid = l.pid AND l.held \
               RETURNING a.fence \
             ) \
             SELECT l.pid, l.held, f.fence, \
               CASE WHEN f.fence IS NOT NULL THEN set_config('idle_session_timeout', $6, false) END AS idle \
             FROM l LEFT JOIN (SELECT fence FROM up) f ON true"
        );
        // On the holder's connection: clear the row first, then unlock (the unlock is
        // evaluated on the aggregate's single row, after the update ran), and reset the
        // session for reuse. Not flushed to disk before it answers (`synchronous_commit`
        // off for its own transaction): the lock, which is the lease, is gone at once
        // anyway, and the next grant's commit flushes the row with it.
        let release = format!(
            "WITH u AS ( \
               UPDATE {t} SET owner = NULL, holder_pid = NULL, expires_at = clock_timestamp() \
               WHERE key = $1 AND owner = $2 AND holder_pid = pg_backend_pid() RETURNING 1 \
             ), n AS (SELECT count(*) AS n FROM u) \
             SELECT n.n AS cleared, pg_advisory_unlock($3) AS unlocked, \
               set_config('idle_session_timeout', '0', false) || set_config('application_name', $4, false) AS reset, \
               set_config('synchronous_commit', 'off', true) AS commit_mode, \
               {watched_release} AS watched \
             FROM n"
        );
        let inspect = format!(
            "SELECT a.key, a.owner, a.fence, {remaining} AS remaining_us FROM {t} a \
             WHERE a.key = $1 AND a.owner IS NOT NULL \
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks x WHERE x.pid = a.holder_pid AND {LOCK_OF_ROW})"
        );
        let list = format!(
            "SELECT a.key, a.owner, a.fence, {remaining} AS remaining_us FROM {t} a \
             WHERE a.key LIKE $1 ESCAPE '\\' AND a.owner IS NOT NULL \
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks x WHERE x.pid = a.holder_pid AND {LOCK_OF_ROW}) \
             ORDER BY a.key"
        );
        // Advance the fence and clear the owner (so the holder's next renewal fails even
        // before its session ends), then end whichever session holds the lock.
        let break_lease = format!(
            "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), up AS ( \
               INSERT INTO {t} AS a (key, lock_id, owner, fence, holder_pid, expires_at) \
               SELECT $1, $2, NULL, GREATEST(1, (extract(epoch FROM n.t) * 1000000)::bigint), NULL, n.t FROM n \
               ON CONFLICT (key) DO UPDATE SET owner = NULL, holder_pid = NULL, \
                 expires_at = LEAST(a.expires_at, EXCLUDED.expires_at), \
                 fence = GREATEST(a.fence + 1, EXCLUDED.fence) \
               RETURNING a.fence \
             ) \
             SELECT (SELECT fence FROM up) AS fence, \
               (SELECT count(pg_catalog.pg_terminate_backend(h.pid, {TERMINATE_WAIT_MS})) FROM ( \
                  SELECT x.pid FROM pg_catalog.pg_locks x WHERE x.locktype = 'advisory' \
                    AND x.objsubid = 1 AND x.granted AND x.classid::bigint = $3 AND x.objid::bigint = $4 \
                    AND x.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) \
                  OFFSET 0) h) AS terminated, \
               {watched_break} AS watched"
        );
        let terminate_holder = "SELECT count(pg_catalog.pg_terminate_backend(h.pid, 5000)) FROM ( \
               SELECT x.pid FROM pg_catalog.pg_locks x WHERE x.locktype = 'advisory' \
                 AND x.objsubid = 1 AND x.granted AND x.classid::bigint = $1 AND x.objid::bigint = $2 \
                 AND x.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) \
               OFFSET 0) h"
            .to_owned();
        Self {
            precheck: precheck.into(),
            acquire: acquire.into(),
            acquire_parked: acquire_parked.into(),
            renew: renew.into(),
            release: release.into(),
            inspect: inspect.into(),
            list: list.into(),
            break_lease: break_lease.into(),
            terminate_holder: terminate_holder.into(),
        }
    }
}

/// One held lease: its dedicated session.
struct Holder {
    owner: OwnerToken,
    fence: Fence,
    /// `pg_backend_pid()` at acquisition; a change means the connection is not one session.
    pid: i32,
    /// `None` once the session is known to be gone.
    conn: tokio::sync::Mutex<Option<PgConnection>>,
}

impl Holder {
    /// Closes `holder`'s session, if it is still open and nothing else refers to it.
    fn close(holder: Arc<Self>) {
        if let Ok(h) = Arc::try_unwrap(holder)
            && let Some(conn) = h.conn.into_inner()
        {
            close(conn);
        }
    }
}

struct Inner {
    /// The pool (for inspect, list, break, records and pre-checks) and the tables.
    base: Tables,
    app_prefix: String,
    sql: Sql,
    holders: Mutex<HashMap<Key, Arc<Holder>>>,
    /// Dedicated sessions kept for reuse (holders' and waiters').
    sessions: Arc<Sessions>,
    /// Waiters' queues (`None`: waiting is off).
    queue: Option<Queue>,
    /// Change notices.
    watches: Watches,
    /// The session that sees the server end its sessions, and its connection settings.
    server_watch: ServerWatch,
    server_watch_options: PgConnectOptions,
    /// Where the leases whose sessions ended are reported.
    ended: EndedGrants,
}

/// A lease store on PostgreSQL session-level advisory locks (backend name
/// `"postgres-advisory"`, URL scheme `postgres+advisory://`).
///
/// ## Behavior
/// - **The lock is the lease.** Acquire takes `pg_try_advisory_lock(id)` on a connection
///   dedicated to that lease (not pooled while held), with
///   `id = `[`advisory_lock_id`]`(key)`. In the same statement, while the lock is held, it
///   advances the key's fence counter row (`GREATEST(last + 1, database clock in µs)`),
///   records the owner and the session's `pg_backend_pid()`, names the session
///   `application_name = <prefix>/<owner token>`, and sets the session's
///   `idle_session_timeout` to the TTL.
/// - **TTL.** The TTL is enforced by the server's `idle_session_timeout` (PostgreSQL 14
///   or newer): a holder that does not renew within the TTL — paused, partitioned, or
///   simply not renewing — has its session ended by the server, which releases the lock.
///   The holder's own deadline (docs/design.md §4.1) comes earlier, so the holder always believes
///   it lost the lease before the server frees it.
/// - **Renew** is one round trip on the holder's connection that checks the lock is still
///   held by this very session (`pg_locks`, `pid = pg_backend_pid()`), extends the row and
///   resets the idle timeout. When the session was terminated
///   (`pg_terminate_backend`, network reset) the renewal fails, the store answers
///   `NotOwner`, and the lease is lost **within one renew interval** (docs/faults.md row 16).
/// - **Server restarts are seen at once.** The store keeps a *server watch*: one more
///   session (`<prefix>/server-watch`, idle timeout off) that is only read. A restart or
///   crash of the server ends it with every lock's session, and every lease the store holds
///   is then lost at once ([`LostReason::SessionEnded`](leasehold_core::LostReason), through
///   [`Store::ended_grants`]), before the restarted server can grant the lock again. A lock
///   is taken only while the server watch is open (it opens with the store), and kept only
///   if the same one is still open when the grant is recorded. A crash of the server's host
///   or a restart behind a partition sends nothing: only the fence protects then.
/// - **Release** clears the row, then unlocks, in one statement, and keeps the connection
///   for reuse. Dropping the store closes every held session, releasing its locks.
/// - Only the store instance (the process) that acquired a lease can renew or release it:
///   the lock belongs to its session. Others see it through `inspect`/`list` (which
///   report a row only while its recorded session holds the lock) and can
///   [`break_lease`](Store::break_lease) it, which advances the fence and ends the holder's
///   session with `pg_terminate_backend` (needs the same role, or membership in
///   `pg_signal_backend`).
/// - [`watch`](WatchStore::watch) notifies every grant, release and break of a key and every
///   write of its record, by any client, with `LISTEN`/`NOTIFY`, sent only while somebody
///   watches the key (see the crate's README, "Watching"); a lease that ends with
///   its holder's session is not notified, as an expiry.
/// - Connections: one pool (default 10) for inspect/list/break and acquisition pre-checks,
///   the server watch, plus one dedicated connection per held lease and up to 4 idle ones
///   kept for reuse.
///   Mind `max_connections` when holding many leases at once.
///
/// ## Cancel safety
/// Every operation may be dropped at an await (the caller's timeout): a dropped acquire
/// drops its session, which releases any lock it took (nothing is orphaned); a dropped
/// renew or release leaves the holder's session with a reply pending, which the next
/// call on it waits for.
///
/// ## Transaction-pooling proxies break session locks
/// PgBouncer in `transaction` (or `statement`) pooling mode hands each transaction to
/// whichever server connection is free: the advisory lock stays on the server connection
/// that ran the acquire, the next statement (a renewal) may run on another, and another
/// client may be handed the connection that holds the lock and release it or run its own
/// work while it is held. `idle_session_timeout` is also applied to the wrong session.
/// Connect this store **directly to PostgreSQL, or through a pooler in `session` mode**.
/// What can be detected is detected: each renewal compares `pg_backend_pid()` with the
/// pid recorded at acquisition and fails with [`StoreErrorKind::Config`] ("backend pid
/// changed") when it differs, after which the lease is lost. Use the lease-table store
/// ([`PgLeaseStore`](crate::PgLeaseStore)) behind transaction-pooling proxies.
///
/// ## Failure model
/// A session-bound lease ends with its session. The fence counter row is durable like any
/// committed row; after a crash the server restarts with no locks held, and the next
/// grant's fence is above every earlier one.
#[derive(Clone)]
pub struct PgAdvisoryStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for PgAdvisoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgAdvisoryStore")
            .field("target", &self.inner.base.target)
            .field("table", &self.inner.base.table)
            .field("held", &self.lock_holders().len())
            .finish_non_exhaustive()
    }
}

fn ms_setting(ttl: Duration) -> String {
    // Whole milliseconds, rounded up: the server never ends the session early.
    let ms = ttl.as_micros().div_ceil(1000).max(1);
    ms.to_string()
}

fn truncate_app_name(s: String) -> String {
    // application_name is truncated by the server at 63 bytes; cut on a char boundary.
    if s.len() <= 63 {
        return s;
    }
    let mut end = 63;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl PgAdvisoryStore {
    /// Connects the pool as `config` says (one connection is opened at once, so a wrong
    /// address or password fails here); dedicated connections use the same settings. The
    /// table defaults to `leasehold_advisory`. Does not create it: call
    /// [`migrate`](Self::migrate).
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for authentication and other configuration problems, and
    /// for a config that says it goes through a transaction-pooling proxy
    /// ([`Pooler::Transaction`](crate::Pooler::Transaction)): session locks cannot work
    /// there. [`StoreErrorKind::Unavailable`] when the server cannot be reached.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig};
    /// use leasehold_postgres::{PgAdvisoryStore, PgConfig};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // A direct connection (or a session-mode pooler): the lock lives in a session.
    /// let config = PgConfig::from_url("postgres+advisory://app@db.internal/app")?;
    /// let store = PgAdvisoryStore::connect(&config).await?;
    /// store.migrate().await?;
    /// let client = LeaseClient::new(Arc::new(store), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.acquire("job:invoices", Duration::from_secs(30)).await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: &PgConfig) -> Result<Self, StoreError> {
        if config.get_pooler() == crate::config::Pooler::Transaction {
            return Err(StoreError::new(
                StoreErrorKind::Config,
                BACKEND,
                "the advisory-lock store cannot work behind a transaction-pooling proxy \
                 (leasehold_pooler=transaction): its locks live in a database session. Use \
                 the lease-table store (postgres://…?leasehold_pooler=transaction), or \
                 connect directly or through a pooler in session mode",
            ));
        }
        let prefix = config.get_application_name().to_owned();
        let pool = crate::config::open_pool(config, BACKEND).await?;
        let table = config.table_or(DEFAULT_ADVISORY_TABLE);
        let sql = Sql::new(&table);
        let sessions = Arc::new(Sessions::new(
            BACKEND,
            config.options_named(&prefix),
            IDLE_CONNECTIONS.max(config.get_pool_size() as usize),
        ));
        let queue = (config.get_wait_sessions() > 0).then(|| {
            Queue::new(
                BACKEND,
                sessions.clone(),
                None,
                config.get_wait_sessions() as usize,
            )
        });
        let watches = Watches::new(
            BACKEND,
            config.options_named(&format!("{prefix}/watch")),
            &table.sibling(DEFAULT_RECORD_TABLE),
        );
        let server_watch_options =
            config.options_named(&truncate_app_name(format!("{prefix}/server-watch")));
        let store = Self {
            inner: Arc::new(Inner {
                base: Tables::new(BACKEND, pool, false, table, config.target()),
                app_prefix: prefix,
                sql,
                holders: Mutex::new(HashMap::new()),
                sessions,
                queue,
                watches,
                server_watch: ServerWatch::new(BACKEND),
                server_watch_options,
                ended: EndedGrants::new(),
            }),
        };
        // Opened now, so the first acquire finds it open (if it cannot be, the first
        // acquire tries again).
        if let Err(e) = store.server_watch_up().await {
            tracing::debug!(error = %e, "server watch not opened yet");
        }
        Ok(store)
    }

    table_methods!(schema::advisory_table_sql);

    /// The channel of the store's change notices ([`WatchStore::watch`]), shared with the
    /// lease-table store of the same schema: see
    /// [`PgLeaseStore::watch_channel`](crate::PgLeaseStore::watch_channel).
    pub fn watch_channel(&self) -> &str {
        self.inner.watches.channel()
    }

    /// The `application_name` of the session that holds `owner`'s lease:
    /// `<prefix>/<owner token in hex>`, cut to 63 bytes.
    pub fn application_name_for(&self, owner: &OwnerToken) -> String {
        truncate_app_name(format!("{}/{owner}", self.inner.app_prefix))
    }

    /// The keys this store instance holds sessions for, with their backend pids.
    pub fn lock_holders(&self) -> Vec<(Key, i32)> {
        let mut v: Vec<_> = self
            .holders()
            .iter()
            .map(|(k, h)| (k.clone(), h.pid))
            .collect();
        v.sort();
        v
    }

    /// Ends whichever session holds `key`'s advisory lock (`pg_terminate_backend`, waiting
    /// up to 5 s for it to end) without touching the fence row. A fault hook for tests:
    /// the holder loses the lease at its next renewal. Returns how many sessions ended.
    ///
    /// # Cancel safety
    /// Cancel safe; the termination may already have been sent.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] without the privilege to terminate the session.
    pub async fn terminate_holder(&self, key: &Key) -> Result<u64, StoreError> {
        let (hi, lo) = lock_parts(advisory_lock_id(key.as_str()));
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(self.inner.sql.terminate_holder.clone()))
            .bind(hi)
            .bind(lo)
            .fetch_one(&self.inner.base.pool)
            .await
            .map_err(|e| error::map(BACKEND, "terminate holder", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn holders(&self) -> MutexGuard<'_, HashMap<Key, Arc<Holder>>> {
        self.inner.holders()
    }

    /// Spawns the server watch's task, handed to [`ServerWatch`].
    fn server_watch_task(&self) -> impl FnOnce(Watching) -> tokio::task::JoinHandle<()> + use<> {
        let inner = Arc::downgrade(&self.inner);
        let options = self.inner.server_watch_options.clone();
        move |watching| tokio::spawn(watch_server(inner, options, watching))
    }

    /// Waits until the server watch is up (starting it if needed); its term. Called right
    /// before the statement that takes the lock, or the first one on a session that holds
    /// it already (see [`ServerWatch::up`]).
    async fn server_watch_up(&self) -> Result<u64, StoreError> {
        let task = self.server_watch_task();
        self.inner.server_watch.up(SERVER_WATCH_OPEN, task).await
    }

    fn holder(&self, key: &Key) -> Option<Arc<Holder>> {
        self.holders().get(key).cloned()
    }

    /// Forgets `holder` for `key` if it is still the one recorded.
    fn forget(&self, key: &Key, holder: &Arc<Holder>) {
        let mut map = self.holders();
        if map.get(key).is_some_and(|h| Arc::ptr_eq(h, holder)) {
            map.remove(key);
        }
    }

    /// Closes `holder`'s session (`conn`, its lock held), if still open, and forgets the
    /// holder of `key`.
    fn let_go(
        &self,
        key: &Key,
        holder: &Arc<Holder>,
        mut conn: tokio::sync::MutexGuard<'_, Option<PgConnection>>,
    ) {
        if let Some(c) = conn.take() {
            close(c);
        }
        drop(conn);
        self.forget(key, holder);
    }

    fn take_idle(&self) -> Option<PgConnection> {
        self.inner.sessions.take_idle()
    }

    fn put_idle(&self, conn: PgConnection) {
        self.inner.sessions.put_idle(conn);
    }

    async fn connect_dedicated(&self) -> Result<PgConnection, StoreError> {
        self.inner
            .sessions
            .connect("connecting a holder session")
            .await
    }

    /// The acquire statement `sql` (the try, or the parked session's) with its parameters.
    fn acquire_on<'q>(
        &self,
        sql: &Arc<str>,
        key: &'q Key,
        owner: &'q OwnerToken,
        ttl: Duration,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        bound(sql, &[])
            .bind(advisory_lock_id(key.as_str()))
            .bind(key.as_str())
            .bind(&owner.as_bytes()[..])
            .bind(ttl_us(ttl))
            .bind(ms_setting(ttl))
            .bind(self.application_name_for(owner))
    }

    /// Tries the lock on a kept or new session (after asking the pool whether it is taken
    /// at all, before opening one). `Ok(Err(held))` when it is taken.
    async fn acquire_fresh(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Result<(sqlx::postgres::PgRow, PgConnection, u64), AcquireOutcome>, StoreError>
    {
        let lock_id = advisory_lock_id(key.as_str());
        let (hi, lo) = lock_parts(lock_id);
        // A kept idle session may have been ended meanwhile (server restart, a DBA's
        // idle timeout): then try once more on a fresh session. A dead session cannot have
        // taken the lock, so the retry is safe.
        let mut reused = self.take_idle();
        loop {
            let from_idle = reused.is_some();
            let mut conn = match reused.take() {
                Some(c) => c,
                None => {
                    // Opening a session costs a fork on the server: first ask the pool
                    // whether the lock is taken at all.
                    let args = [
                        Arg::Text(key.as_str()),
                        Arg::Int(hi),
                        Arg::Int(lo),
                        Arg::Int(ttl_us(ttl)),
                    ];
                    let row = bound(&self.inner.sql.precheck, &args)
                        .fetch_one(&self.inner.base.pool)
                        .await
                        .map_err(|e| error::map(BACKEND, "acquire", e))?;
                    if col::<bool>(BACKEND, &row, "held")? {
                        return Ok(Err(held(col(BACKEND, &row, "remaining_us")?)));
                    }
                    self.connect_dedicated().await?
                }
            };
            let term = match self.server_watch_up().await {
                Ok(term) => term,
                Err(e) => {
                    self.put_idle(conn);
                    return Err(e);
                }
            };
            // If this future is dropped from here on, `conn` is dropped with it: the
            // session ends and any lock it took is released.
            let res = self
                .acquire_on(&self.inner.sql.acquire, key, owner, ttl)
                .fetch_one(&mut conn)
                .await;
            match res {
                Ok(row) => return Ok(Ok((row, conn, term))),
                Err(e) if from_idle && error::is_connection_loss(&e) => {
                    close(conn);
                    continue;
                }
                Err(e) => {
                    // The lock may have been taken before the error: ending the session
                    // releases it.
                    close(conn);
                    return Err(error::map(BACKEND, "acquire", e));
                }
            }
        }
    }

    /// Renews on the holder's session. `Ok(false)`: the lock is gone (the holder is
    /// forgotten and its session closed).
    async fn renew_on(
        &self,
        key: &Key,
        holder: &Arc<Holder>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let (hi, lo) = lock_parts(advisory_lock_id(key.as_str()));
        let mut guard = holder.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            self.let_go(key, holder, guard);
            return Ok(false);
        };
        let ms = ms_setting(ttl);
        let args = [
            Arg::Text(key.as_str()),
            Arg::Int(hi),
            Arg::Int(lo),
            Arg::Bytes(&holder.owner.as_bytes()[..]),
            Arg::Int(ttl_us(ttl)),
            Arg::Text(&ms),
        ];
        let res = bound(&self.inner.sql.renew, &args)
            .fetch_one(&mut *conn)
            .await;
        let row = match res {
            Ok(row) => row,
            Err(e) if error::is_connection_loss(&e) => {
                // The session is gone, and its lock with it.
                tracing::debug!(%key, error = %error::map(BACKEND, "renew", e), "holder session lost");
                self.let_go(key, holder, guard);
                return Ok(false);
            }
            Err(e) => return Err(error::map(BACKEND, "renew", e)),
        };
        let pid: i32 = col(BACKEND, &row, "pid")?;
        let held: bool = col(BACKEND, &row, "held")?;
        let fence: Option<i64> = col(BACKEND, &row, "fence")?;
        if pid != holder.pid {
            self.let_go(key, holder, guard);
            return Err(StoreError::new(
                StoreErrorKind::Config,
                BACKEND,
                format!(
                    "backend pid changed from {} to {pid} on the holder's connection: session-level \
                     advisory locks need one server session per connection (a transaction-pooling \
                     proxy such as PgBouncer in transaction mode breaks them); the lease is lost",
                    holder.pid
                ),
            ));
        }
        if !held || fence.is_none() {
            self.let_go(key, holder, guard);
            return Ok(false);
        }
        Ok(true)
    }
}

impl Inner {
    fn holders(&self) -> MutexGuard<'_, HashMap<Key, Arc<Holder>>> {
        self.holders.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The server watch's task (see [`leasehold_sql::server_watch`]): a session that only
/// reads — a `PgListener` listening on nothing, which reads its connection while idle —
/// until the server ends it (a restart sends `FATAL` and closes, a crash closes) or the
/// connection breaks. Then every lease the store holds is reported ended, at once.
async fn watch_server(inner: Weak<Inner>, options: PgConnectOptions, mut watching: Watching) {
    let pool = listener_pool(options, SERVER_WATCH_OPEN);
    let listener = async {
        let mut l = PgListener::connect_with(&pool).await?;
        l.ignore_pool_close_event(true);
        l.eager_reconnect(false);
        // Never ended for being idle: its end must mean the server ended its sessions.
        sqlx::query("SET idle_session_timeout = 0")
            .execute(&mut l)
            .await?;
        Ok::<_, sqlx::Error>(l)
    }
    .await;
    let mut listener = match listener {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %error::map(BACKEND, "watching the server", e), "server watch not opened");
            watching.ended(|| ());
            return;
        }
    };
    watching.opened();
    let why = loop {
        match listener.try_recv().await {
            // Nothing is listened for; a notice is no end.
            Ok(Some(_)) => continue,
            Ok(None) => break "the connection ended".to_owned(),
            Err(e) => break error::map(BACKEND, "watching the server", e).to_string(),
        }
    };
    let Some(inner) = inner.upgrade() else { return };
    watching.report_ended(&inner.ended, &why, || {
        let holders = inner.holders();
        holders
            .iter()
            .map(|(k, h)| (k.clone(), h.owner, h.fence))
            .collect()
    });
}

impl Drop for Inner {
    fn drop(&mut self) {
        let holders = std::mem::take(self.holders.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (_, h) in holders {
            Holder::close(h);
        }
    }
}

#[async_trait]
impl Store for PgAdvisoryStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn ended_grants(&self) -> Option<&EndedGrants> {
        Some(&self.inner.ended)
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.reports_remaining = true;
        caps.session_bound = true;
        caps.fence_durability = FenceDurability::Durable;
        caps.fifo_wait = self.inner.queue.is_some();
        caps
    }

    /// With waiting sessions (`leasehold_wait_sessions` above 0).
    fn waiter(&self) -> Option<&dyn WaitStore> {
        self.inner.queue.as_ref().map(|_| self as &dyn WaitStore)
    }

    fn watcher(&self) -> Option<&dyn WatchStore> {
        Some(self)
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        if let Some(h) = self.holder(key)
            && h.owner == *owner
        {
            // A retry by the holder (after an ambiguous reply): extend, same fence.
            if self.renew_on(key, &h, ttl).await? {
                return Ok(AcquireOutcome::Acquired {
                    fence: h.fence,
                    ttl,
                });
            }
        }
        // The server watch is up before the lock is taken (its session opens meanwhile),
        // and the grant is installed only while the same watch is up: a server that ends
        // its sessions from then on has this lease reported ended with every other.
        self.inner.server_watch.start(self.server_watch_task());
        let queue = self.inner.queue.as_ref();
        let row = match queue.and_then(|q| q.claim(key, owner)) {
            // This owner's turn came in the queue: its session holds the lock already.
            Some(mut claim) => {
                // Dropping the claim closes the session, and the lock with it.
                let term = self.server_watch_up().await?;
                let res = self
                    .acquire_on(&self.inner.sql.acquire_parked, key, owner, ttl)
                    .fetch_one(claim.conn())
                    .await;
                match res {
                    Ok(row) => (row, claim.granted(), term),
                    // Dropping the claim closes the session, and the lock with it.
                    Err(e) => return Err(error::map(BACKEND, "acquire", e)),
                }
            }
            None => {
                let _alive = queue.map(|q| q.acquiring(key, owner));
                match self.acquire_fresh(key, owner, ttl).await? {
                    Ok(row) => row,
                    Err(held) => {
                        if let Some(q) = queue {
                            q.note_held(key, owner);
                        }
                        return Ok(held);
                    }
                }
            }
        };
        let (row, conn, term) = row;
        let got: bool = col(BACKEND, &row, "got")?;
        if !got {
            let remaining: Option<i64> = col(BACKEND, &row, "remaining_us")?;
            self.put_idle(conn);
            if let Some(q) = queue {
                q.note_held(key, owner);
            }
            return Ok(held(remaining));
        }
        let decoded = (|| -> Result<(i32, Fence), StoreError> {
            let pid: i32 = col(BACKEND, &row, "pid")?;
            let fence: Option<i64> = col(BACKEND, &row, "fence")?;
            let fence = fence.ok_or_else(|| {
                StoreError::new(StoreErrorKind::Other, BACKEND, "acquire returned no fence")
            })?;
            Ok((pid, fence_of(BACKEND, fence)?))
        })();
        let (pid, fence) = match decoded {
            Ok(v) => v,
            Err(e) => {
                close(conn);
                return Err(e);
            }
        };
        let mut holder = Some(Arc::new(Holder {
            owner: *owner,
            fence,
            pid,
            conn: tokio::sync::Mutex::new(Some(conn)),
        }));
        // Replaces a stale local holder of another owner, whose session must be gone since
        // this session got the lock.
        let installed = self.inner.server_watch.while_up(term, || {
            let holder = holder.take().expect("installed once");
            self.holders().insert(key.clone(), holder)
        });
        let Some(old) = installed else {
            // The server ended its sessions meanwhile, maybe this one: let it go.
            if let Some(h) = holder {
                Holder::close(h);
            }
            return Err(self.inner.server_watch.went_down("acquire"));
        };
        if let Some(old) = old {
            Holder::close(old);
        }
        if let Some(q) = queue {
            q.note_granted(key, owner);
        }
        Ok(AcquireOutcome::Acquired { fence, ttl })
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        let Some(h) = self.holder(key).filter(|h| h.owner == *owner) else {
            return Ok(RenewOutcome::NotOwner);
        };
        Ok(renewed(self.renew_on(key, &h, ttl).await?, ttl))
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let Some(h) = self.holder(key).filter(|h| h.owner == *owner) else {
            return Ok(ReleaseOutcome::NotOwner);
        };
        let lock_id = advisory_lock_id(key.as_str());
        let mut guard = h.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            self.let_go(key, &h, guard);
            return Ok(ReleaseOutcome::NotOwner);
        };
        let args = [
            Arg::Text(key.as_str()),
            Arg::Bytes(&owner.as_bytes()[..]),
            Arg::Int(lock_id),
            Arg::Text(&self.inner.app_prefix),
        ];
        let res = bound(&self.inner.sql.release, &args)
            .fetch_one(&mut *conn)
            .await;
        let conn = guard.take().expect("checked above");
        drop(guard);
        self.forget(key, &h);
        let row = match res {
            Ok(row) => row,
            Err(e) if error::is_connection_loss(&e) => {
                close(conn);
                return Ok(ReleaseOutcome::NotOwner);
            }
            Err(e) => {
                // Ending the session releases the lock whatever the error was.
                close(conn);
                return Err(error::map(BACKEND, "release", e));
            }
        };
        let cleared: i64 = col(BACKEND, &row, "cleared")?;
        let unlocked: bool = col(BACKEND, &row, "unlocked")?;
        if cleared == 1 && unlocked {
            self.put_idle(conn);
            Ok(ReleaseOutcome::Released)
        } else {
            close(conn);
            Ok(ReleaseOutcome::NotOwner)
        }
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        self.inner.base.inspect(&self.inner.sql.inspect, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        self.inner.base.list(&self.inner.sql.list, prefix).await
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let lock_id = advisory_lock_id(key.as_str());
        let (hi, lo) = lock_parts(lock_id);
        let args = [
            Arg::Text(key.as_str()),
            Arg::Int(lock_id),
            Arg::Int(hi),
            Arg::Int(lo),
        ];
        let base = &self.inner.base;
        base.break_lease(&self.inner.sql.break_lease, &args).await
    }

    /// On the pool (records are not session-bound): one transaction on the records table,
    /// `INSERT … ON CONFLICT (key) DO UPDATE … WHERE fence < EXCLUDED.fence`, then a read
    /// of the row.
    ///
    /// # Cancel safety
    /// A dropped call may have committed the record.
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for a fence above `i64::MAX` or a value longer than
    /// [`MAX_RECORD_LEN`](leasehold_core::MAX_RECORD_LEN); [`StoreErrorKind::Config`] when
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
        crate::doctor::diagnose(&self.inner.base, true).await
    }
}

#[async_trait]
impl WaitStore for PgAdvisoryStore {
    /// Joins the queue of the key's advisory lock on a session of its own
    /// (`pg_advisory_lock`) and returns when that session holds the lock — the server
    /// hands it over when the holder releases, is broken or its session ends (expiry,
    /// crash) — or at `timeout`. `owner` then acquires with its own request, on that
    /// session. The lock is kept for `owner` if its acquire of `key` last answered `Held`
    /// on this store (the holder side's loop); a wait by any other owner queues too, and
    /// passes the lock on as soon as it gets it.
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
                "waiting for release (leasehold_wait_sessions=0)",
            )),
        }
    }
}

#[async_trait]
impl WatchStore for PgAdvisoryStore {
    /// `LISTEN`s on the store's watch session (one per store instance, opened by the first
    /// watch, closed with the last stream) and holds the key's watch lock there, so that
    /// every grant, release and break of the lease `key` and every write of the record
    /// `key`, by any client, sends a notice at its commit (see the crate's README). A
    /// lease that ends with its holder's session (expiry by `idle_session_timeout`, a
    /// crash, [`terminate_holder`](Self::terminate_holder)) is not notified, as an expiry.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call gives its subscription up; dropping the stream ends the
    /// watch.
    ///
    /// # Errors
    /// Connection errors, or [`StoreErrorKind::Timeout`] when the watch is not set up
    /// within 10 s.
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        self.inner.watches.watch(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_id_is_stable() {
        // First 8 bytes of SHA-256("") = e3b0c44298fc1c14.
        assert_eq!(advisory_lock_id(""), 0xe3b0_c442_98fc_1c14_u64 as i64);
        assert_eq!(lock_parts(advisory_lock_id("")), (0xe3b0_c442, 0x98fc_1c14));
        assert_ne!(advisory_lock_id("a"), advisory_lock_id("b"));
    }

    #[test]
    fn settings() {
        assert_eq!(ms_setting(Duration::from_micros(10_001)), "11");
        assert_eq!(ms_setting(Duration::from_secs(2)), "2000");
        let long = truncate_app_name(format!("{}/{}", "é".repeat(40), "x"));
        assert!(long.len() <= 63);
    }
}
