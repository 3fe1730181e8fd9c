//! [`SqliteStore`]: the [`Store`] implementation.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Capabilities, Fence, FenceDurability, Key, LeaseInfo, OwnerToken, Record,
    ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind, WaitStore,
};
use leasehold_sql::guard::{fence_from_i64, fence_to_i64};
use leasehold_sql::lease::{micros, released, remaining, renewed, ttl_us};
use leasehold_sql::{Failure, with_conn};
use sqlx::Connection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use crate::BACKEND;
use crate::clock::{HostClock, HostTime};
use crate::config::{SqliteConfig, Synchronous};
use crate::error::SqliteErrors;
use crate::schema;
use crate::wait::{Bells, CROSS_PROCESS_POLL, GRACE, Turn};

/// A leasehold [`Store`] in one SQLite database file, shared by every process of one host
/// that opens the same file.
///
/// Each write is one SQLite transaction: `BEGIN IMMEDIATE` (which takes the database's
/// write lock, waiting at most the busy timeout), read the lease row, decide, write,
/// `COMMIT`. An acquire first reads the row without the lock and answers `Held` at once
/// when another owner's lease is live. Writers of one store take turns on an async mutex
/// (first come, first served) rather than in SQLite's busy handler. Expiry is measured on
/// the host's `CLOCK_BOOTTIME` tagged with the boot id ([`HostClock`]), read while the
/// write lock is held, never on the wall clock; see the crate docs for the schema and the
/// failure model.
///
/// Cheap to share: wrap it in an `Arc` (it is `Send + Sync`). It owns a small pool of
/// connections; an operation that is cancelled or times out closes its connection rather
/// than returning it to the pool.
pub struct SqliteStore {
    config: SqliteConfig,
    pool: SqlitePool,
    clock: Arc<dyn HostClock>,
    op_bound: Duration,
    /// This process's writers take turns here (FIFO) instead of in SQLite's busy handler,
    /// which sleeps in steps of up to 100 ms; other processes still meet the busy timeout.
    writer: tokio::sync::Mutex<()>,
    /// The release bells of this file, shared with this process's other stores on it.
    bells: Arc<Bells>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("config", &self.config.to_string())
            .finish_non_exhaustive()
    }
}

/// One lease row as stored: owner, fence, boot id, expiry.
type RawRow = (Option<String>, i64, Option<String>, Option<i64>);

/// The longest TTL a store call accepts, in µs: no live lease expires further ahead.
const MAX_TTL_US: i64 = leasehold_core::config::MAX_TTL.as_micros() as i64;

/// What a lease row means at `now`.
enum State {
    /// No row: the key was never used.
    Missing,
    /// Held by `owner` until `expires_us` (on the current boot's clock).
    Live {
        owner: OwnerToken,
        fence: i64,
        expires_us: i64,
    },
    /// Released or expired; `fence` is the last fence issued.
    Free { fence: i64 },
}

impl State {
    /// The lease of `key` in this state at `now`, if it is live.
    fn info(self, key: Key, now: &HostTime) -> Option<LeaseInfo> {
        let State::Live {
            owner,
            fence,
            expires_us,
        } = self
        else {
            return None;
        };
        Some(LeaseInfo {
            key,
            owner,
            fence: fence_from_i64(fence),
            remaining: Some(remaining(expires_us, now.boottime_us)),
        })
    }
}

fn corrupt(key: &str, what: impl std::fmt::Display) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        BACKEND,
        format!("the lease row of `{key}` is not a leasehold lease: {what}"),
    )
}

fn interpret(key: &str, row: Option<RawRow>, now: &HostTime) -> Result<State, StoreError> {
    let Some((owner, fence, boot_id, expires)) = row else {
        return Ok(State::Missing);
    };
    if fence <= 0 {
        return Err(corrupt(key, format!("fence {fence} is not positive")));
    }
    let Some(hex) = owner else {
        return Ok(State::Free { fence });
    };
    let owner =
        OwnerToken::from_str(&hex).map_err(|_| corrupt(key, "the owner is not 32 hex digits"))?;
    let (Some(boot_id), Some(expires_us)) = (boot_id, expires) else {
        return Err(corrupt(key, "an owner without an expiry"));
    };
    if boot_id != now.boot_id || expires_us <= now.boottime_us {
        // Set under another boot (whose clock is gone), or run out.
        return Ok(State::Free { fence });
    }
    if expires_us - now.boottime_us > MAX_TTL_US {
        return Err(corrupt(
            key,
            "it expires further ahead than the longest TTL (24 h)",
        ));
    }
    Ok(State::Live {
        owner,
        fence,
        expires_us,
    })
}

/// `max(last + 1, floor)`: the next fence, floored at the wall clock in microseconds.
fn next_fence(key: &str, last: i64, floor: i64) -> Result<i64, StoreError> {
    let next = last
        .checked_add(1)
        .ok_or_else(|| corrupt(key, "the fence is exhausted"))?;
    Ok(next.max(floor).max(1))
}

const SELECT_ROW: &str =
    "SELECT owner, fence, boot_id, expires_boot_us FROM leasehold_leases WHERE lease_key = ?1";

async fn read_row(conn: &mut SqliteConnection, key: &str) -> Result<Option<RawRow>, Failure> {
    Ok(sqlx::query_as::<_, RawRow>(SELECT_ROW)
        .bind(key)
        .fetch_optional(conn)
        .await?)
}

async fn acquire_tx(
    conn: &mut SqliteConnection,
    clock: &dyn HostClock,
    key: &str,
    owner: &OwnerToken,
    ttl_us: i64,
) -> Result<AcquireOutcome, Failure> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let now = clock.now()?;
    let expires = now.boottime_us.saturating_add(ttl_us);
    let fence = match interpret(key, read_row(&mut tx, key).await?, &now)? {
        State::Live {
            owner: holder,
            fence,
            expires_us,
        } => {
            if holder != *owner {
                tx.rollback().await?;
                return Ok(AcquireOutcome::Held {
                    remaining: Some(remaining(expires_us, now.boottime_us)),
                });
            }
            sqlx::query("UPDATE leasehold_leases SET expires_boot_us = ?1 WHERE lease_key = ?2")
                .bind(expires)
                .bind(key)
                .execute(&mut *tx)
                .await?;
            fence
        }
        State::Free { fence: last } => {
            let fence = next_fence(key, last, clock.wall_clock_us())?;
            sqlx::query(
                "UPDATE leasehold_leases SET owner = ?1, fence = ?2, boot_id = ?3, \
                 expires_boot_us = ?4 WHERE lease_key = ?5",
            )
            .bind(owner.to_hex())
            .bind(fence)
            .bind(&now.boot_id)
            .bind(expires)
            .bind(key)
            .execute(&mut *tx)
            .await?;
            fence
        }
        State::Missing => {
            let fence = next_fence(key, 0, clock.wall_clock_us())?;
            sqlx::query(
                "INSERT INTO leasehold_leases (lease_key, owner, fence, boot_id, expires_boot_us) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .bind(key)
            .bind(owner.to_hex())
            .bind(fence)
            .bind(&now.boot_id)
            .bind(expires)
            .execute(&mut *tx)
            .await?;
            fence
        }
    };
    tx.commit().await?;
    Ok(AcquireOutcome::Acquired {
        fence: fence_from_i64(fence),
        ttl: micros(ttl_us),
    })
}

/// Renews (`Some(ttl_us)`) or releases (`None`) the live lease of `owner` in one write
/// transaction; whether it was held.
async fn update_own_tx(
    conn: &mut SqliteConnection,
    clock: &dyn HostClock,
    key: &str,
    owner: &OwnerToken,
    renew_ttl_us: Option<i64>,
) -> Result<bool, Failure> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let now = clock.now()?;
    let query = match renew_ttl_us {
        Some(ttl_us) => sqlx::query(
            "UPDATE leasehold_leases SET expires_boot_us = ?5 \
             WHERE lease_key = ?1 AND owner = ?2 AND boot_id = ?3 AND expires_boot_us > ?4",
        )
        .bind(key)
        .bind(owner.to_hex())
        .bind(&now.boot_id)
        .bind(now.boottime_us)
        .bind(now.boottime_us.saturating_add(ttl_us)),
        None => sqlx::query(
            "UPDATE leasehold_leases SET owner = NULL, boot_id = NULL, expires_boot_us = NULL \
             WHERE lease_key = ?1 AND owner = ?2 AND boot_id = ?3 AND expires_boot_us > ?4",
        )
        .bind(key)
        .bind(owner.to_hex())
        .bind(&now.boot_id)
        .bind(now.boottime_us),
    };
    let done = query.execute(&mut *tx).await?.rows_affected();
    tx.commit().await?;
    Ok(done == 1)
}

async fn break_tx(
    conn: &mut SqliteConnection,
    clock: &dyn HostClock,
    key: &str,
) -> Result<Fence, Failure> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    // Only the fence matters: breaking is also how an operator clears a corrupt owner.
    let last: Option<i64> =
        sqlx::query_scalar("SELECT fence FROM leasehold_leases WHERE lease_key = ?1")
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
    let fence = next_fence(key, last.unwrap_or(0).max(0), clock.wall_clock_us())?;
    sqlx::query(
        "INSERT INTO leasehold_leases (lease_key, owner, fence, boot_id, expires_boot_us) \
         VALUES (?1, NULL, ?2, NULL, NULL) \
         ON CONFLICT (lease_key) DO UPDATE SET owner = NULL, fence = excluded.fence, \
         boot_id = NULL, expires_boot_us = NULL",
    )
    .bind(key)
    .bind(fence)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(fence_from_i64(fence))
}

async fn list_rows(
    conn: &mut SqliteConnection,
    now: &HostTime,
    prefix: &str,
) -> Result<Vec<(String, RawRow)>, Failure> {
    type Row = (String, Option<String>, i64, Option<String>, Option<i64>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT lease_key, owner, fence, boot_id, expires_boot_us FROM leasehold_leases \
         WHERE owner IS NOT NULL AND boot_id = ?1 AND expires_boot_us > ?2 \
           AND substr(lease_key, 1, length(?3)) = ?3 \
         ORDER BY lease_key",
    )
    .bind(&now.boot_id)
    .bind(now.boottime_us)
    .bind(prefix)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(k, o, f, b, e)| (k, (o, f, b, e)))
        .collect())
}

/// The record row of `key`: fence and value.
const SELECT_RECORD: &str = "SELECT fence, value FROM leasehold_records WHERE record_key = ?1";

/// Stores `value` at `fence` under `key` unless a record with a fence at least as high is
/// there, and reads back what is stored, in one write transaction.
async fn put_record_tx(
    conn: &mut SqliteConnection,
    key: &Key,
    fence: i64,
    value: &[u8],
) -> Result<Record, Failure> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(
        "INSERT INTO leasehold_records (record_key, fence, value) VALUES (?1, ?2, ?3) \
         ON CONFLICT (record_key) DO UPDATE SET fence = excluded.fence, value = excluded.value \
         WHERE excluded.fence > leasehold_records.fence",
    )
    .bind(key.as_str())
    .bind(fence)
    .bind(value)
    .execute(&mut *tx)
    .await?;
    let (fence, value): (i64, Vec<u8>) = sqlx::query_as(SELECT_RECORD)
        .bind(key.as_str())
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(leasehold_sql::record::from_i64(BACKEND, key, fence, value)?)
}

/// The format of the lease table: `None` when it does not exist, 1 (expiry on the wall
/// clock, `expires_at_us`), 2 (expiry on the boot clock, `boot_id` + `expires_boot_us`).
/// Whether every table, view and trigger besides the lease table is there (the records,
/// the guard's and the idempotency record's).
async fn schema_complete(conn: &mut SqliteConnection) -> Result<bool, Failure> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE name IN \
         ('leasehold_records', 'leasehold_guard', 'leasehold_idempotency', \
          'leasehold_guard_check', 'leasehold_guard_check_insert')",
    )
    .fetch_one(conn)
    .await?;
    Ok(n == 5)
}

async fn lease_table_format(conn: &mut SqliteConnection) -> Result<Option<u8>, Failure> {
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('leasehold_leases')")
            .fetch_all(conn)
            .await?;
    let has = |c: &str| columns.iter().any(|n| n == c);
    Ok(if columns.is_empty() {
        None
    } else if has("boot_id") && has("expires_boot_us") && !has("expires_at_us") {
        Some(2)
    } else if has("expires_at_us") && !has("boot_id") {
        Some(1)
    } else {
        return Err(Failure::Store(StoreError::new(
            StoreErrorKind::Config,
            BACKEND,
            format!("the table leasehold_leases has columns leasehold does not know: {columns:?}"),
        )));
    })
}

/// Rewrites a lease table of format 1 (expiry on the wall clock) into format 2, inside
/// the caller's write transaction (see [`schema::CONVERT_FROM_FORMAT_1`]). The last read
/// of the wall clock for an expiry: what a held lease had left on it carries over, at most
/// the longest TTL. A leasehold of format 1 still running on the file then fails every
/// operation (its column is gone): it can never misread a lease of format 2.
async fn convert_from_format_1(
    conn: &mut SqliteConnection,
    clock: &dyn HostClock,
) -> Result<(), Failure> {
    let now = clock.now()?;
    let wall = clock.wall_clock_us();
    let [create, copy, drop, rename] = schema::CONVERT_FROM_FORMAT_1;
    sqlx::raw_sql(create).execute(&mut *conn).await?;
    sqlx::query(copy)
        .bind(wall)
        .bind(&now.boot_id)
        .bind(now.boottime_us)
        .bind(MAX_TTL_US)
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(drop).execute(&mut *conn).await?;
    sqlx::raw_sql(rename).execute(&mut *conn).await?;
    tracing::info!("sqlite lease table converted to format 2 (expiry on CLOCK_BOOTTIME)");
    Ok(())
}

impl SqliteStore {
    /// Opens (creating it if missing) the database file of `config`, switches it to WAL,
    /// and creates leasehold's tables if missing ([`migrate`](Self::migrate)). The file's
    /// directory must exist: it is never created.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves at most a created file behind.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an invalid configuration, and (with the
    /// [`Refusal::File`](leasehold_core::Refusal::File) [`refusal`](StoreError::refusal)) a
    /// missing directory or a file that cannot be created, opened or written; [`StoreErrorKind::Busy`] when another process holds the
    /// database locked for longer than the busy timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig};
    /// use leasehold_sqlite::{SqliteConfig, SqliteStore, Synchronous};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("leases.db"); // e.g. /var/lib/myapp/leases.db
    /// let config = SqliteConfig::new(path)
    ///     .busy_timeout(Duration::from_millis(500)) // below the client's operation timeout
    ///     .synchronous(Synchronous::Full);
    /// let store = Arc::new(SqliteStore::connect(config).await?);
    /// let client = LeaseClient::new(store.clone(), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.try_acquire("job:report").await?;
    /// assert!(lease.release().await?);
    /// store.close().await;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: SqliteConfig) -> Result<Self, StoreError> {
        config.validate()?;
        let path = config.path();
        // The file is created if missing, but never its directory: a mistyped path must
        // fail here, not leave a new directory tree with an empty database behind.
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
            && !parent.is_dir()
        {
            return Err(StoreError::new(
                StoreErrorKind::Config,
                BACKEND,
                format!(
                    "the directory {} of the SQLite database does not exist (or is not a \
                     directory): create it, or fix the path",
                    parent.display()
                ),
            )
            .refused(leasehold_core::Refusal::File));
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match config.get_synchronous() {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(config.get_busy_timeout())
            .foreign_keys(false);
        let busy = config.get_busy_timeout();
        let pool = SqlitePoolOptions::new()
            .max_connections(config.get_max_connections())
            .min_connections(0)
            .acquire_timeout(busy + Duration::from_secs(1))
            .test_before_acquire(false)
            .connect_lazy_with(options);
        let mut store = Self {
            bells: Arc::new(Bells::default()),
            clock: config.get_clock(),
            // A transaction waits at most the busy timeout for the lock (BEGIN IMMEDIATE),
            // and queues behind this process's other writers. Past twice the busy timeout
            // plus slack, something is wrong with the file system: give up, never hang.
            op_bound: busy * 2 + Duration::from_secs(5),
            writer: tokio::sync::Mutex::new(()),
            config,
            pool,
        };
        store.migrate().await?;
        // The file exists now: its canonical path names it.
        store.bells = Bells::of_file(store.config.path());
        tracing::debug!(config = %store.config, "sqlite store opened");
        Ok(store)
    }

    /// Parses `url` (see [`SqliteConfig::from_url`]) and [`connect`](Self::connect)s.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`connect`](Self::connect).
    ///
    /// # Errors
    /// As [`SqliteConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold_core::{Store, StoreErrorKind};
    /// use leasehold_sqlite::SqliteStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "sqlite:///var/lib/myapp/leases.db?busy_timeout=500ms";
    /// # let dir = tempfile::tempdir()?;
    /// # let url = &format!("sqlite://{}/leases.db?busy_timeout=500ms", dir.path().display());
    /// let store = SqliteStore::open(url).await?;
    /// assert_eq!(store.backend(), "sqlite");
    ///
    /// // A bad URL is a configuration error, found before any file is touched.
    /// let err = SqliteStore::open("sqlite://leases.db?busy_timout=5s").await.unwrap_err();
    /// assert_eq!(err.kind(), StoreErrorKind::Config);
    /// # Ok(()) }
    /// ```
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(SqliteConfig::from_url(url)?).await
    }

    /// Creates the lease table, the records table and the guard tables if they do not exist
    /// (idempotent; see [`LEASES_SCHEMA`](crate::LEASES_SCHEMA),
    /// [`RECORDS_SCHEMA`](crate::RECORDS_SCHEMA) and [`GUARD_SCHEMA`](crate::GUARD_SCHEMA)).
    /// [`connect`](Self::connect) calls it.
    ///
    /// # Cancel safety
    /// Cancel safe: the tables are created or converted by one transaction, or not.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when the file cannot be written, [`StoreErrorKind::Busy`]
    /// when it stays locked past the busy timeout.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // SQLite gives some refusals at once instead of after its busy timeout: a new file
        // switched to WAL by another process opening it at the same moment answers
        // "database is locked" to this connection's first statement. Asked again until
        // the busy timeout has passed, as the timeout promises.
        let start = tokio::time::Instant::now();
        loop {
            match self.migrate_once().await {
                Err(e)
                    if e.kind() == StoreErrorKind::Busy
                        && start.elapsed() < self.config.get_busy_timeout() =>
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                done => return done,
            }
        }
    }

    async fn migrate_once(&self) -> Result<(), StoreError> {
        self.run("migrate", true, async |conn| {
            // A plain read first: a file already in the current format, with every table,
            // needs no write lock (a frozen writer elsewhere must not make opening the store
            // fail).
            if lease_table_format(conn).await? == Some(2) && schema_complete(conn).await? {
                return Ok(());
            }
            // Every change in one transaction that takes the write lock first: processes
            // opening a new file at once then wait for each other (the busy timeout). A
            // `CREATE … IF NOT EXISTS` on its own reads the schema before it writes, and
            // SQLite refuses at once, without waiting, a write on a read that another
            // process's commit has made stale.
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            match lease_table_format(&mut tx).await? {
                None => {
                    sqlx::raw_sql(schema::LEASES_SCHEMA)
                        .execute(&mut *tx)
                        .await?;
                }
                Some(1) => convert_from_format_1(&mut tx, &*self.clock).await?,
                _ => {}
            }
            // Added beside format 2 (older versions never read it): created when missing.
            sqlx::raw_sql(schema::RECORDS_SCHEMA)
                .execute(&mut *tx)
                .await?;
            crate::guard::migrate_in(&mut tx).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Deletes the rows of keys nobody holds (released, expired, or set under another
    /// boot) whose last fence is more than `older_than` below the wall clock in µs, so
    /// that a file with one key per entity does not keep a row for every entity ever
    /// locked. Rows are kept after release on purpose (they carry the fence); deleting one
    /// of these is safe because the next grant on that key gets its fence from the wall
    /// clock in µs (`max(last + 1, wall clock)`), which is above the deleted fence by the
    /// statement's own condition. A held lease's row is never deleted. Returns the number
    /// of rows deleted.
    ///
    /// # Cancel safety
    /// Cancel safe: one write transaction.
    ///
    /// # Errors
    /// As any write: [`StoreErrorKind::Busy`] when the file stays locked.
    pub async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        let age = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let clock = self.clock.clone();
        self.run("prune", true, async move |conn| {
            let now = clock.now()?;
            let below = clock.wall_clock_us().saturating_sub(age);
            let deleted = sqlx::query(
                "DELETE FROM leasehold_leases WHERE fence < ?1 AND (owner IS NULL \
                 OR boot_id IS NOT ?2 OR expires_boot_us IS NULL OR expires_boot_us <= ?3)",
            )
            .bind(below)
            .bind(&now.boot_id)
            .bind(now.boottime_us)
            .execute(conn)
            .await?
            .rows_affected();
            Ok(deleted)
        })
        .await
    }

    /// The configuration.
    pub fn config(&self) -> &SqliteConfig {
        &self.config
    }

    /// The connection pool, e.g. to run the [`guard`](crate::guard) in the same database
    /// file. Begin guard transactions with `begin_with("BEGIN IMMEDIATE")`.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes every pooled connection (waiting for operations in flight).
    ///
    /// # Cancel safety
    /// Cancel safe: the pool is marked closed at the first poll; connections still close.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Runs `body` on a pooled connection, bounded by the store's operation bound; with
    /// `write`, behind the store's writer mutex. The connection is closed rather than
    /// pooled if the body is cancelled, times out or breaks it.
    async fn run<T>(
        &self,
        op: &str,
        write: bool,
        body: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T, Failure>,
    ) -> Result<T, StoreError> {
        StoreError::bounded(BACKEND, op, self.op_bound, async {
            let _writer = if write {
                Some(self.writer.lock().await)
            } else {
                None
            };
            with_conn(&self.pool, &SqliteErrors, op, body).await
        })
        .await
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.reports_remaining = true;
        // A renewal sets the row's expiry to now + the TTL asked.
        caps.sets_expiry = true;
        caps.fence_durability = match self.config.get_synchronous() {
            Synchronous::Full => FenceDurability::Durable,
            Synchronous::Normal => FenceDurability::ClockFloored,
        };
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
        let ttl_us = ttl_us(BACKEND, ttl)?;
        // A lease held by another owner needs no write lock: a plain read tells (WAL
        // readers never wait), so contenders do not queue behind the writers.
        let row = self
            .run("acquire", false, async |conn| {
                read_row(conn, key.as_str()).await
            })
            .await?;
        let now = self.clock.now()?;
        let held = match interpret(key.as_str(), row, &now)? {
            State::Live {
                owner: holder,
                expires_us,
                ..
            } if holder != *owner => Some(remaining(expires_us, now.boottime_us)),
            // Free: but an owner of this process that waited first takes it first (it is
            // told its turn came, and asks within moments): told held for up to its TTL.
            State::Free { .. } | State::Missing if !self.bells.may_acquire(key, owner) => Some(ttl),
            _ => None,
        };
        if let Some(remaining) = held {
            self.bells.held(key, owner);
            return Ok(AcquireOutcome::Held {
                remaining: Some(remaining),
            });
        }
        let outcome = self
            .run("acquire", true, async |conn| {
                acquire_tx(conn, &*self.clock, key.as_str(), owner, ttl_us).await
            })
            .await?;
        match outcome {
            AcquireOutcome::Acquired { .. } => self.bells.granted(key, owner),
            AcquireOutcome::Held { .. } => self.bells.held(key, owner),
        }
        Ok(outcome)
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let ttl_us = ttl_us(BACKEND, ttl)?;
        let held = self
            .run("renew", true, async |conn| {
                update_own_tx(conn, &*self.clock, key.as_str(), owner, Some(ttl_us)).await
            })
            .await?;
        Ok(renewed(held, ttl))
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let held = self
            .run("release", true, async |conn| {
                update_own_tx(conn, &*self.clock, key.as_str(), owner, None).await
            })
            .await?;
        if held {
            self.bells.released(key, owner);
        }
        Ok(released(held))
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let row = self
            .run("inspect", false, async |conn| {
                read_row(conn, key.as_str()).await
            })
            .await?;
        let now = self.clock.now()?;
        Ok(interpret(key.as_str(), row, &now)?.info(key.clone(), &now))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        let now = self.clock.now()?;
        let rows = self
            .run("list", false, async |conn| {
                list_rows(conn, &now, prefix).await
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (name, row) in rows {
            if !name.starts_with(prefix) {
                continue;
            }
            let key = Key::new(&name).map_err(|e| corrupt(&name, e))?;
            out.extend(interpret(&name, Some(row), &now)?.info(key, &now));
        }
        Ok(out)
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let fence = self
            .run("break", true, async |conn| {
                break_tx(conn, &*self.clock, key.as_str()).await
            })
            .await?;
        self.bells.broken(key);
        tracing::info!(key = %key, %fence, "sqlite lease broken");
        Ok(fence)
    }

    /// One write transaction (`BEGIN IMMEDIATE`): an `INSERT … ON CONFLICT DO UPDATE …
    /// WHERE excluded.fence > fence` into `leasehold_records`, then a read of the row.
    ///
    /// # Cancel safety
    /// A dropped call may have committed the record (its connection is closed).
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for a value longer than
    /// [`MAX_RECORD_LEN`](leasehold_core::MAX_RECORD_LEN) or a fence above `i64::MAX`;
    /// [`StoreErrorKind::Busy`] when the file stays locked.
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        leasehold_sql::record::check_value(BACKEND, value)?;
        let fence = fence_to_i64(BACKEND, fence)?;
        self.run("put record", true, async |conn| {
            put_record_tx(conn, key, fence, value).await
        })
        .await
    }

    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let row: Option<(i64, Vec<u8>)> = self
            .run("get record", false, async |conn| {
                Ok(sqlx::query_as(SELECT_RECORD)
                    .bind(key.as_str())
                    .fetch_optional(conn)
                    .await?)
            })
            .await?;
        row.map(|(fence, value)| leasehold_sql::record::from_i64(BACKEND, key, fence, value))
            .transpose()
    }

    /// The file, SQLite's version and journal, and the restart row by `synchronous`.
    async fn diagnose(&self) -> Result<leasehold_core::Diagnosis, StoreError> {
        let (version, journal): (String, String) = self
            .run("diagnose", false, async |conn| {
                let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                    .fetch_one(&mut *conn)
                    .await?;
                let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
                    .fetch_one(&mut *conn)
                    .await?;
                Ok((version, journal))
            })
            .await?;
        Ok(crate::doctor::judge(&self.config, &version, &journal))
    }
}

#[async_trait]
impl WaitStore for SqliteStore {
    /// Returns when `key` is free for `owner` (released, broken or expired), or when
    /// `timeout` has passed; `Ok` either way.
    ///
    /// A release or a break made through any [`SqliteStore`] of this process on the same
    /// file wakes the waiter at once (an in-process notification; no polling). An owner
    /// whose acquire was just told `Held` by a store of this process waits in the
    /// process's queue of that key: it is woken when its turn comes, in arrival order, and
    /// newcomers of this process are told `Held` while it is first (an owner that neither
    /// waits nor acquires for 500 ms loses its place). A holder granted by another process
    /// cannot notify: while such a holder holds the lease, the waiter re-reads the lease
    /// row (a plain WAL read, no write lock) every
    /// [`CROSS_PROCESS_POLL`](crate::CROSS_PROCESS_POLL) (100 ms). Every wait also ends at
    /// the holder's expiry, so a holder that crashed costs at most its remaining TTL, and
    /// a break made by another process (`leasehold break`) is seen at the latest then.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; a dropped wait keeps its place in the queue for 500 ms
    /// (for the next call or the owner's acquire), then gives it up.
    ///
    /// # Errors
    /// As [`inspect`](Store::inspect), when the lease row cannot be read.
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let bell = self.bells.listen(key);
        let queued = self.bells.claim(key, owner);
        let wait = async {
            loop {
                let rung = bell.notify().notified();
                tokio::pin!(rung);
                rung.as_mut().enable();
                // An owner queued here is woken by its own bell, in turn.
                let own = queued.as_ref().map(|q| q.bell().notified());
                tokio::pin!(own);
                if let Some(n) = own.as_mut().as_pin_mut() {
                    n.enable();
                }
                let row = self
                    .run("wait", false, async |conn| {
                        read_row(conn, key.as_str()).await
                    })
                    .await?;
                let now = self.clock.now()?;
                let nap = match interpret(key.as_str(), row, &now)? {
                    State::Live {
                        owner: holder,
                        expires_us,
                        ..
                    } if holder != *owner => {
                        let nap =
                            remaining(expires_us, now.boottime_us).max(Duration::from_millis(1));
                        if self.bells.held_here(key, &holder) {
                            nap
                        } else {
                            nap.min(CROSS_PROCESS_POLL)
                        }
                    }
                    // Free (or ours). A bare wait returns; a queued owner when its turn came.
                    _ => match queued.as_ref().map(|_| self.bells.turn(key, owner)) {
                        None | Some(Turn::Mine) => return Ok(()),
                        // The first owner was woken and is about to ask.
                        Some(Turn::Waiting) => GRACE,
                        Some(Turn::Lapses(at)) => at
                            .saturating_duration_since(std::time::Instant::now())
                            .max(Duration::from_millis(1)),
                    },
                };
                let own_rung = async {
                    match own.as_mut().as_pin_mut() {
                        Some(n) => n.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = rung, if queued.is_none() => return Ok(()),
                    () = own_rung => {}
                    () = tokio::time::sleep(nap) => {}
                }
            }
        };
        // The read itself is bounded too: the wait never outlasts `timeout`.
        match tokio::time::Instant::now().checked_add(timeout) {
            Some(deadline) => tokio::time::timeout_at(deadline, wait)
                .await
                .unwrap_or(Ok(())),
            None => wait.await,
        }
    }
}
