//! [`MySqlGetLockStore`]: leases as `GET_LOCK` locks, each held by its own session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Capabilities, EndedGrants, Fence, FenceDurability, Key, LeaseInfo, OwnerToken,
    Record, ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind, WaitStore,
};
use leasehold_sql::Failure;
use leasehold_sql::lease::{released, renewed};
use leasehold_sql::server_watch::{ServerWatch, Watching};
use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::config::MySqlConfig;
use crate::conn::{Db, StoreTable, db_methods};
use crate::error::Phase;
use crate::schema::LOCKS_SCHEMA;
use crate::sql::{like_prefix, listed_key, now_us, parse_owner};

/// The backend name of [`MySqlGetLockStore`].
pub const BACKEND_GETLOCK: &str = "mysql-getlock";

/// The fence and holder table.
const TABLE: StoreTable = StoreTable {
    name: "leasehold_locks",
    schema: LOCKS_SCHEMA,
};

/// The prefix of a lock name that is the key itself.
pub const LOCK_NAME_PREFIX: &str = "leasehold:";
/// The prefix of a lock name that is a hash of the key.
pub const HASHED_LOCK_NAME_PREFIX: &str = "leasehold#";
/// The longest lock name MySQL accepts (MySQL 5.7+ refuses longer names).
pub const MAX_LOCK_NAME_LEN: usize = 64;

/// The `GET_LOCK` name of a lease key.
///
/// - A key of at most 54 bytes made only of `a-z`, `0-9` and `: . _ / @ -` is used as it
///   is: `leasehold:` + key (at most 64 characters). Such names compare the same on every
///   server whatever its collation (MySQL compares lock names case-insensitively on some
///   versions; these names have no case to fold).
/// - Any other key (longer, upper case, spaces, non-ASCII, …) is hashed:
///   `leasehold#` + the first 54 hex digits (216 bits) of the SHA-256 of the key's UTF-8
///   bytes — 64 characters.
///
/// The two forms never collide (`:` versus `#`). The table `leasehold_locks` maps every
/// name back to its key, and a name found mapped to another key is reported as
/// [`StoreErrorKind::Corrupt`].
///
/// ```
/// use leasehold_core::Key;
/// use leasehold_mysql::lock_name;
/// assert_eq!(lock_name(&Key::new("job:invoices").unwrap()), "leasehold:job:invoices");
/// let hashed = lock_name(&Key::new("Job:Invoices").unwrap());
/// assert!(hashed.starts_with("leasehold#") && hashed.len() == 64);
/// ```
pub fn lock_name(key: &Key) -> String {
    let k = key.as_str();
    let plain = LOCK_NAME_PREFIX.len() + k.len() <= MAX_LOCK_NAME_LEN
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b":._/@-".contains(&b));
    if plain {
        return format!("{LOCK_NAME_PREFIX}{k}");
    }
    let digest = Sha256::digest(k.as_bytes());
    let mut name = String::with_capacity(MAX_LOCK_NAME_LEN);
    name.push_str(HASHED_LOCK_NAME_PREFIX);
    for b in digest.iter() {
        name.push_str(&format!("{b:02x}"));
    }
    name.truncate(MAX_LOCK_NAME_LEN);
    name
}

enum Cmd {
    /// Check the lock is still held by the session; if so, push the local expiry to
    /// `sent + ttl`.
    Renew {
        ttl: Duration,
        sent: Instant,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// `RELEASE_LOCK` and end the session.
    Release {
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
}

struct Holder {
    id: u64,
    owner: OwnerToken,
    fence: Fence,
    connection_id: u64,
    cmds: mpsc::Sender<Cmd>,
}

type Held = Arc<Mutex<HashMap<Key, Holder>>>;

/// Sessions whose lock was released cleanly, kept for the next acquire or wait (opening a
/// session is most of a hand-off's cost): at most [`IDLE_SESSIONS`], each for
/// [`IDLE_SESSION_AGE`].
type Idle = Arc<Mutex<Vec<(MySqlConnection, Instant)>>>;

/// How many idle lock sessions a store keeps.
const IDLE_SESSIONS: usize = 8;
/// How long an idle lock session is kept.
const IDLE_SESSION_AGE: Duration = Duration::from_secs(2);

/// How long a lock the server's queue handed to a waiting session stays reserved for the
/// waiting owner's `acquire`; unclaimed by then, the session ends and the server hands the
/// lock to the next in its queue.
pub const GETLOCK_RESERVE_GRACE: Duration = Duration::from_secs(1);

/// `wait_timeout` of a waiting session: a frozen waiter process keeps a lock reserved for
/// it at most this long after its `GET_LOCK` returned.
const RESERVED_IDLE_SECS: u64 = 2;

/// The longest single `GET_LOCK` wait asked of the server (a longer wait returns then,
/// as a timeout: the caller waits again).
const MAX_WAIT_SECS: f64 = 86_400.0;

/// The statement the server watch's session waits in, again and again: a running statement
/// is never ended for idleness (`wait_timeout`), and the server ends it at once when it
/// shuts down or the session is killed. `DO`, not `SELECT`: MySQL's `max_execution_time`
/// applies to `SELECT`s only.
const SERVER_WATCH_SLEEP: &str = "DO SLEEP(30)";

/// A lock the server's queue granted to a waiting session, kept for its owner's acquire.
struct Reservation {
    id: u64,
    owner: OwnerToken,
    conn: MySqlConnection,
    connection_id: u64,
}

type Reserved = Arc<Mutex<HashMap<Key, Reservation>>>;

/// A session waiting in the server's queue; ended from another session if dropped before
/// it is taken (a queued `GET_LOCK` stays queued until granted otherwise).
struct WaitingSession {
    db: Arc<Db>,
    conn: Option<MySqlConnection>,
    id: u64,
}

impl Drop for WaitingSession {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            crate::conn::kill_session(&self.db, conn, self.id, "leaving the lock queue");
        }
    }
}

fn lock(held: &Mutex<HashMap<Key, Holder>>) -> MutexGuard<'_, HashMap<Key, Holder>> {
    held.lock().unwrap_or_else(|p| p.into_inner())
}

/// A leasehold [`Store`] on MariaDB/MySQL user locks (`GET_LOCK`): each held lease owns a
/// dedicated connection (a server session) holding `GET_LOCK(name, 0)`. The server ends
/// the lock with the session — a killed connection, a crashed holder process — so the
/// lease is *session bound* ([`Capabilities::session_bound`]).
///
/// - **Names**: see [`lock_name`] (keys longer than 54 bytes or with other characters than
///   `a-z0-9:._/@-` are hashed).
/// - **Fences**: a row per lock name in `leasehold_locks`
///   ([`LOCKS_SCHEMA`](crate::LOCKS_SCHEMA)), advanced to `max(last + 1, server clock in
///   µs)` by the new holder's session *while it holds the lock*, in one transaction that
///   also records the holder's owner token and `CONNECTION_ID()`.
/// - **TTL**: the server does not expire user locks. The store enforces the TTL in the
///   holder's process: each lock's session is released when `ttl` passes after the last
///   acquire or renew was sent without another renewal. A holder process that is frozen
///   (`SIGSTOP`) keeps its session, so the lock outlives the TTL until it runs again (its
///   lease client then reports the lease lost) or its connection dies; a crashed process
///   frees it at once.
/// - **Renew** checks `IS_USED_LOCK(name) = CONNECTION_ID()` on the lock's own session; a
///   session that was killed or broke answers `NotOwner`, and so does a check that gets no
///   reply within the store's `timeout`: the session is then closed (freeing the lock) only
///   once the loss is recorded on the holder's lease ([`Store::ended_grants`]: a lease
///   client marks it lost, [`LostReason::SessionEnded`](leasehold_core::LostReason),
///   before the keeper goes on), or, when no lease client has it (a direct caller), once
///   the TTL has passed since the last renewal that went through. A `NotOwner` handed over
///   is not enough: the heartbeat takes a batch of renewals in when the slowest answers.
///   An error answered by the server on a live session stays a retryable error and the lock
///   stays held.
/// - **Server restarts are seen at once.** The store keeps a *server watch*: one more
///   session that runs `DO SLEEP(30)` again and again. A shutdown or crash of the server
///   ends it with every lock's session, and every lease the store holds is then lost at
///   once (`SessionEnded`), before the restarted server can grant the lock again. A lock is
///   taken only while the server watch is open (it opens with [`connect`](Self::connect),
///   else with the first acquire), and kept only if the same one is still open when the
///   grant is recorded. A crash of the server's host or a restart behind a partition sends
///   nothing: only the fence protects then.
/// - **Process bound**: only the store instance that acquired a lease can renew or release
///   it (it owns the session); another instance answers `NotOwner`. Dropping the store
///   ends all its sessions, releasing their locks.
/// - **Break** releases a lease held by this store, or `KILL`s the session holding the
///   lock (which needs the privilege to kill that connection), then advances the fence.
/// - **Inspect / list** read `leasehold_locks` and `IS_USED_LOCK`; the remaining TTL is
///   unknown to other processes, so it is not reported.
/// - **Waiting** queues in the server's own lock queue (`GET_LOCK` with a timeout), in
///   arrival order; the lock the server hands a waiter is reserved for its owner's acquire
///   for [`GETLOCK_RESERVE_GRACE`] (see [`WaitStore::wait_released`] on this type).
pub struct MySqlGetLockStore {
    db: Arc<Db>,
    held: Held,
    reserved: Reserved,
    idle: Idle,
    next_id: AtomicU64,
    /// The session that sees the server end its sessions.
    watch: ServerWatch,
    /// Where the leases whose sessions ended are reported.
    ended: Arc<EndedGrants>,
}

impl std::fmt::Debug for MySqlGetLockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlGetLockStore")
            .field("config", &self.db.config.to_string())
            .field("held", &lock(&self.held).len())
            .finish_non_exhaustive()
    }
}

fn corrupt(key: &str, what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        BACKEND_GETLOCK,
        format!("the lock row of `{key}` is not leasehold's: {what}"),
    )
}

const RECORD_HOLDER: &str = concat!(
    "INSERT INTO leasehold_locks (lock_name, lease_key, fence, owner, connection_id) ",
    "VALUES (?, ?, GREATEST(1, ",
    now_us!(),
    "), ?, CONNECTION_ID()) ",
    "ON DUPLICATE KEY UPDATE fence = GREATEST(fence + 1, ",
    now_us!(),
    "), ",
    "owner = ?, connection_id = CONNECTION_ID()"
);

const BREAK: &str = concat!(
    "INSERT INTO leasehold_locks (lock_name, lease_key, fence, owner, connection_id) ",
    "VALUES (?, ?, GREATEST(1, ",
    now_us!(),
    "), NULL, NULL) ",
    "ON DUPLICATE KEY UPDATE fence = GREATEST(fence + 1, ",
    now_us!(),
    "), ",
    "owner = NULL, connection_id = NULL"
);

/// Deletes the rows whose lock nobody holds and whose fence is more than `?` µs old.
const PRUNE: &str = concat!(
    "DELETE FROM leasehold_locks WHERE IS_USED_LOCK(lock_name) IS NULL ",
    "AND CAST(fence AS SIGNED) < ",
    now_us!(),
    " - ?"
);

/// Advances the fence and records the holder, in one transaction on the lock's session.
async fn record_holder(
    conn: &mut MySqlConnection,
    name: &str,
    key: &str,
    owner: &OwnerToken,
) -> Result<u64, Failure> {
    let hex = owner.to_hex();
    let mut tx = conn.begin().await?;
    sqlx::query(RECORD_HOLDER)
        .bind(name)
        .bind(key)
        .bind(&hex)
        .bind(&hex)
        .execute(&mut *tx)
        .await?;
    let (fence, stored_key): (u64, Vec<u8>) =
        sqlx::query_as("SELECT fence, lease_key FROM leasehold_locks WHERE lock_name = ?")
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
    if stored_key != key.as_bytes() {
        return Err(Failure::Store(corrupt(
            key,
            "its lock name is recorded for another key",
        )));
    }
    tx.commit().await?;
    Ok(fence)
}

async fn still_held(conn: &mut MySqlConnection, name: &str) -> Result<bool, sqlx::Error> {
    let held: Option<i64> =
        sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) = CONNECTION_ID() AS SIGNED)")
            .bind(name)
            .fetch_one(conn)
            .await?;
    Ok(held == Some(1))
}

/// The `CONNECTION_ID()` of the session that holds `name`'s lock, if any.
async fn used_by(conn: &mut MySqlConnection, name: &str) -> Result<Option<u64>, sqlx::Error> {
    sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
        .bind(name)
        .fetch_one(conn)
        .await
}

async fn release_lock(conn: &mut MySqlConnection, name: &str) -> Result<bool, sqlx::Error> {
    let released: Option<i64> = sqlx::query_scalar("SELECT CAST(RELEASE_LOCK(?) AS SIGNED)")
        .bind(name)
        .fetch_one(conn)
        .await?;
    Ok(released == Some(1))
}

/// What a statement on a lock's session came to.
enum Answer<T> {
    Done(T),
    /// The server answered with an error and the session is intact (it still holds its
    /// lock): the call may be retried.
    Refused(StoreError),
    /// No usable answer (timeout, broken connection, a reply that cannot be read): the
    /// session cannot be used again, and may be gone already with its lock.
    Unusable(StoreError),
}

/// Owns one lock's session until the lease ends: answers renew and release, and releases
/// the lock when its TTL passes without a renewal.
///
/// The session (and so the lock) ends only once its holder cannot believe it still holds
/// the lease: after a renewal was answered `NotOwner`, a release, the TTL, or the store
/// being dropped. A session that became unusable while nobody waited for the answer (the
/// caller gave up on the renewal first) is kept open, *stale*, until the next renewal can
/// be told `NotOwner` or the TTL passes.
struct Keeper {
    db: Arc<Db>,
    held: Weak<Mutex<HashMap<Key, Holder>>>,
    idle: Weak<Mutex<Vec<(MySqlConnection, Instant)>>>,
    key: Key,
    name: String,
    id: u64,
    owner: OwnerToken,
    fence: Fence,
    ended: Arc<EndedGrants>,
}

impl Keeper {
    async fn run(
        self,
        mut conn: MySqlConnection,
        mut deadline: Instant,
        mut cmds: mpsc::Receiver<Cmd>,
    ) {
        let mut stale = false;
        let mut clean = false;
        let end = loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    None => break "store dropped",
                    Some(Cmd::Renew { reply, .. }) if stale => {
                        let _ = reply.send(Ok(false));
                        if self.loss_recorded() {
                            break "lost recorded";
                        }
                    }
                    Some(Cmd::Renew { ttl, sent, reply }) => {
                        match self.call("renew", still_held(&mut conn, &self.name)).await {
                            Answer::Done(true) => {
                                deadline = deadline.max(sent + ttl);
                                let _ = reply.send(Ok(true));
                            }
                            Answer::Done(false) => {
                                let _ = reply.send(Ok(false));
                                break "lock no longer held by its session";
                            }
                            // The session still holds the lock: a retryable failure.
                            Answer::Refused(e) => {
                                let _ = reply.send(Err(e));
                            }
                            // The session is gone or about to be (we close it): so is its
                            // lock, and the lease with it. The holder must have lost the
                            // lease before the lock is let go, and a `NotOwner` handed over
                            // is not that: the heartbeat takes in a batch of renewals when
                            // the slowest has answered. So the loss is recorded on the lease
                            // first; when no client has the lease (a direct caller), the
                            // session is kept until the TTL has passed.
                            Answer::Unusable(e) => {
                                tracing::warn!(key = %self.key, error = %e, "mysql lock session lost");
                                let _ = reply.send(Ok(false));
                                if self.loss_recorded() {
                                    break "session lost";
                                }
                                stale = true;
                            }
                        }
                    }
                    Some(Cmd::Release { reply }) if stale => {
                        let _ = reply.send(Err(StoreError::new(
                            StoreErrorKind::Ambiguous,
                            BACKEND_GETLOCK,
                            "release: the lock's session stopped answering; it is closed, which frees the lock",
                        )));
                        break "released (stale session closed)";
                    }
                    Some(Cmd::Release { reply }) => {
                        let r = match self.call("release", release_lock(&mut conn, &self.name)).await {
                            Answer::Done(released) => {
                                clean = released;
                                Ok(released)
                            }
                            Answer::Refused(e) | Answer::Unusable(e) => Err(e),
                        };
                        let _ = reply.send(r);
                        break "released";
                    }
                },
                () = tokio::time::sleep_until(deadline) => {
                    if !stale {
                        let _ = self.call("expire", release_lock(&mut conn, &self.name)).await;
                    }
                    break "expired";
                }
            }
        };
        tracing::debug!(key = %self.key, end, "mysql lock session ends");
        if let Some(held) = self.held.upgrade() {
            let mut held = lock(&held);
            if held.get(&self.key).is_some_and(|h| h.id == self.id) {
                held.remove(&self.key);
            }
        }
        // Commands queued meanwhile get no answer: their callers see `NotOwner` at once
        // rather than after the close below.
        drop(cmds);
        // A session that let its lock go cleanly serves the next acquire or wait.
        if clean && let Some(idle) = self.idle.upgrade() {
            let mut idle = lock_idle(&idle);
            if idle.len() < IDLE_SESSIONS {
                idle.push((conn, Instant::now()));
                return;
            }
        }
        // Closing politely is bounded; dropping the connection closes its socket, and the
        // server then ends the session and frees the lock.
        let _ = tokio::time::timeout(Duration::from_secs(1), conn.close()).await;
    }

    /// Records the loss of the lease on its holder's lease handle (every client of the
    /// store that has it): whether one did, so that no holder believes any more.
    fn loss_recorded(&self) -> bool {
        self.ended.report(&self.key, &self.owner, self.fence)
    }

    /// Runs `fut` on the session, bounded by the operation timeout.
    async fn call<T>(
        &self,
        op: &str,
        fut: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Answer<T> {
        match tokio::time::timeout(self.db.config.get_timeout(), fut).await {
            Ok(Ok(v)) => Answer::Done(v),
            Ok(Err(e)) => {
                let f = Failure::from(e);
                let usable = !f.breaks_connection(&*self.db);
                let e = self.db.error(f, op, Phase::Statement);
                if usable {
                    Answer::Refused(e)
                } else {
                    Answer::Unusable(e)
                }
            }
            // The statement may still be running, its reply still on its way: the
            // connection is out of step and is never used again.
            Err(_) => Answer::Unusable(StoreError::timeout(
                BACKEND_GETLOCK,
                op,
                self.db.config.get_timeout(),
            )),
        }
    }
}

impl MySqlGetLockStore {
    /// A store for `config`, without connecting: the first operation connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an invalid configuration.
    pub fn new(config: MySqlConfig) -> Result<Self, StoreError> {
        Ok(Self {
            db: Arc::new(Db::new(config, BACKEND_GETLOCK)?),
            held: Arc::default(),
            reserved: Arc::default(),
            idle: Arc::default(),
            next_id: AtomicU64::new(1),
            watch: ServerWatch::new(BACKEND_GETLOCK),
            ended: Arc::default(),
        })
    }

    /// A store for `config`, connected now; with `migrate` on (the default) the table
    /// `leasehold_locks` is created if missing, otherwise its presence is checked.
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
        // Opened now, so the first acquire finds it open (if it cannot be, the first
        // acquire tries again).
        if let Err(e) = store.server_watch_up().await {
            tracing::debug!(error = %e, "server watch not opened yet");
        }
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
    /// use leasehold_mysql::MySqlGetLockStore;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // Each held lease keeps its own session; renew and release go through this store.
    /// let store = MySqlGetLockStore::open("mysql+getlock://app:secret@db:3306/app").await?;
    /// let client = LeaseClient::new(Arc::new(store), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.acquire("job:invoices", Duration::from_secs(30)).await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(MySqlConfig::from_url(url)?).await
    }

    db_methods!(TABLE);

    /// The server's `CONNECTION_ID()` of the session holding `key`, if this store holds it.
    /// (What an operator would `KILL` to take the lease away.)
    pub fn connection_id(&self, key: &Key) -> Option<u64> {
        lock(&self.held).get(key).map(|h| h.connection_id)
    }

    /// How many leases this store holds (open lock sessions).
    pub fn held_count(&self) -> usize {
        lock(&self.held).len()
    }

    /// Deletes the rows of `leasehold_locks` whose lock nobody holds (`IS_USED_LOCK` is
    /// `NULL`) and whose fence was issued longer ago than `older_than` (at most ten years);
    /// returns how many. The next holder of a pruned key records a fence floored at the
    /// server clock in microseconds, higher than the deleted one. A held lock's row is never
    /// deleted. Without this, the table keeps one row per key ever locked.
    ///
    /// # Cancel safety
    /// Cancel safe: one `DELETE`, applied or not.
    ///
    /// # Errors
    /// As any operation; [`StoreErrorKind::Config`] without `DELETE` privilege.
    pub async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.db.prune(PRUNE, older_than).await
    }

    /// Spawns the server watch's task, handed to [`ServerWatch`].
    fn server_watch_task(&self) -> impl FnOnce(Watching) -> tokio::task::JoinHandle<()> + use<> {
        let (db, held) = (self.db.clone(), Arc::downgrade(&self.held));
        let ended = Arc::downgrade(&self.ended);
        move |watching| tokio::spawn(watch_server(db, held, ended, watching))
    }

    /// Waits until the server watch is up (starting it if needed); its term. Called right
    /// before the statement that takes the lock, or the first one on a session that holds
    /// it already (see [`ServerWatch::up`]).
    async fn server_watch_up(&self) -> Result<u64, StoreError> {
        let within = self.db.config.get_connect_timeout() * 2;
        self.watch.up(within, self.server_watch_task()).await
    }

    /// The command channel of `key`'s keeper if `owner` holds it here (and its fence).
    fn holder_of(&self, key: &Key, owner: &OwnerToken) -> Option<(mpsc::Sender<Cmd>, Fence)> {
        lock(&self.held)
            .get(key)
            .filter(|h| h.owner == *owner)
            .map(|h| (h.cmds.clone(), h.fence))
    }

    /// Sends a command to a keeper and returns its answer; `false` if the keeper is gone
    /// (and its lock session with it).
    async fn ask(
        cmds: &mpsc::Sender<Cmd>,
        make: impl FnOnce(oneshot::Sender<Result<bool, StoreError>>) -> Cmd,
    ) -> Result<bool, StoreError> {
        let (tx, rx) = oneshot::channel();
        if cmds.send(make(tx)).await.is_err() {
            return Ok(false);
        }
        rx.await.unwrap_or(Ok(false))
    }

    async fn acquire_fresh(
        &self,
        key: &Key,
        owner: &OwnerToken,
        name: &str,
        asked: Asked,
    ) -> Result<AcquireOutcome, StoreError> {
        // Cheap check first, so contenders do not open a session each time.
        let used = self
            .db
            .run("acquire", async move |conn| Ok(used_by(conn, name).await?))
            .await?;
        if used.is_some() {
            return Ok(AcquireOutcome::Held { remaining: None });
        }
        let (mut conn, reused) = self.session("acquire").await?;
        let term = self.server_watch_up().await?;
        let try_lock = "SELECT CAST(GET_LOCK(?, 0) AS SIGNED), CAST(CONNECTION_ID() AS UNSIGNED)";
        let got: (Option<i64>, u64) = match sqlx::query_as(try_lock)
            .bind(name)
            .fetch_one(&mut conn)
            .await
        {
            Ok(got) => got,
            // A kept session the server ended meanwhile: a new one.
            Err(_) if reused => {
                conn = self.db.dedicated("acquire").await?;
                sqlx::query_as(try_lock)
                    .bind(name)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| self.db.error(e.into(), "acquire", Phase::Statement))?
            }
            Err(e) => return Err(self.db.error(e.into(), "acquire", Phase::Statement)),
        };
        let (got, connection_id) = got;
        match got {
            Some(1) => {}
            Some(0) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), conn.close()).await;
                return Ok(AcquireOutcome::Held { remaining: None });
            }
            _ => {
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    BACKEND_GETLOCK,
                    format!("GET_LOCK failed for `{key}`"),
                ));
            }
        }
        // We hold the lock; if this future is dropped from here on, dropping `conn` ends
        // the session and the server frees the lock.
        self.install(key, owner, name, conn, connection_id, asked, term)
            .await
    }

    /// Records `owner` as the holder on `conn`, the session holding `name`'s lock (a new
    /// fence), and hands the session to a keeper, if the server watch is still up at the
    /// term it was up at before the lock's session last answered (else the session is let
    /// go).
    #[allow(clippy::too_many_arguments)]
    async fn install(
        &self,
        key: &Key,
        owner: &OwnerToken,
        name: &str,
        mut conn: MySqlConnection,
        connection_id: u64,
        asked: Asked,
        term: u64,
    ) -> Result<AcquireOutcome, StoreError> {
        let Asked { ttl, sent } = asked;
        let fence = record_holder(&mut conn, name, key.as_str(), owner)
            .await
            .map_err(|f| self.db.error(f, "acquire", Phase::Statement))?;
        let fence = Fence(fence);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(8);
        let keeper = Keeper {
            db: self.db.clone(),
            held: Arc::downgrade(&self.held),
            idle: Arc::downgrade(&self.idle),
            key: key.clone(),
            name: name.to_owned(),
            id,
            owner: *owner,
            fence,
            ended: self.ended.clone(),
        };
        // Any previous holder entry for this key is stale (we got the lock): dropping its
        // sender ends its keeper.
        let installed = self.watch.while_up(term, || {
            let holder = Holder {
                id,
                owner: *owner,
                fence,
                connection_id,
                cmds: tx,
            };
            lock(&self.held).insert(key.clone(), holder);
        });
        if installed.is_none() {
            // The server ended its sessions meanwhile, maybe this one: dropping it frees
            // the lock if it still holds it.
            drop(conn);
            return Err(self.watch.went_down("acquire"));
        }
        tokio::spawn(keeper.run(conn, sent + ttl, rx));
        Ok(AcquireOutcome::Acquired { fence, ttl })
    }

    /// A lock session: a recent idle one, else a new one; and whether it was reused (a
    /// reused session that fails is replaced once by a new one).
    async fn session(&self, op: &str) -> Result<(MySqlConnection, bool), StoreError> {
        let reused = {
            let mut idle = lock_idle(&self.idle);
            idle.retain(|(_, at)| at.elapsed() < IDLE_SESSION_AGE);
            idle.pop()
        };
        match reused {
            Some((conn, _)) => Ok((conn, true)),
            None => Ok((self.db.dedicated(op).await?, false)),
        }
    }

    /// The lock of `key` reserved for `owner` by a wait of this store, taken.
    fn take_reservation(&self, key: &Key, owner: &OwnerToken) -> Option<Reservation> {
        let mut reserved = lock_reserved(&self.reserved);
        if reserved.get(key).is_some_and(|r| r.owner == *owner) {
            reserved.remove(key)
        } else {
            None
        }
    }

    /// Turns a reservation into the lease: the session gets its normal idle timeout back,
    /// then is recorded as the holder (a new fence).
    async fn claim(
        &self,
        key: &Key,
        owner: &OwnerToken,
        name: &str,
        mut r: Reservation,
        asked: Asked,
    ) -> Result<AcquireOutcome, StoreError> {
        // Dropping the reservation ends its session, and the lock with it.
        let term = self.server_watch_up().await?;
        r.conn
            .execute("SET SESSION wait_timeout = @@GLOBAL.wait_timeout")
            .await
            .map_err(|e| self.db.error(e.into(), "acquire", Phase::Statement))?;
        self.install(key, owner, name, r.conn, r.connection_id, asked, term)
            .await
    }

    /// Queues a session for `name`'s lock in the server (`GET_LOCK` with a timeout) and,
    /// when the server grants it, keeps it reserved for `owner` for
    /// [`GETLOCK_RESERVE_GRACE`].
    async fn queue_for(
        &self,
        key: &Key,
        owner: &OwnerToken,
        name: &str,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        async fn setup(conn: &mut MySqlConnection) -> Result<u64, sqlx::Error> {
            conn.execute(AssertSqlSafe(format!(
                "SET SESSION wait_timeout = {RESERVED_IDLE_SECS}"
            )))
            .await?;
            sqlx::query_scalar::<_, u64>("SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
                .fetch_one(conn)
                .await
        }
        let (mut conn, reused) = self.session("wait").await?;
        let id = match self
            .db
            .bounded("wait", async { Ok(setup(&mut conn).await) })
            .await?
        {
            Ok(id) => id,
            // A kept session the server ended meanwhile: a new one.
            Err(_) if reused => {
                conn = self.db.dedicated("wait").await?;
                self.db
                    .bounded("wait", async {
                        setup(&mut conn)
                            .await
                            .map_err(|e| self.db.error(e.into(), "wait", Phase::Statement))
                    })
                    .await?
            }
            Err(e) => return Err(self.db.error(e.into(), "wait", Phase::Statement)),
        };
        let mut waiting = WaitingSession {
            db: self.db.clone(),
            conn: Some(conn),
            id,
        };
        let Some(conn) = waiting.conn.as_mut() else {
            return Ok(());
        };
        let secs = timeout.as_secs_f64().min(MAX_WAIT_SECS);
        let request = sqlx::query_scalar::<_, Option<i64>>("SELECT CAST(GET_LOCK(?, ?) AS SIGNED)")
            .bind(name)
            .bind(secs)
            .fetch_one(&mut *conn);
        let bound = timeout.saturating_add(self.db.config.get_timeout());
        let got = match tokio::time::timeout(bound, request).await {
            Ok(got) => got,
            // The server did not answer in time: leave the queue (the drop kills the
            // session); the caller re-checks.
            Err(_) => return Ok(()),
        };
        match got {
            Ok(Some(1)) => {}
            // Timed out in the queue: the session holds nothing.
            Ok(_) => return Ok(()),
            Err(e) => return Err(self.db.error(e.into(), "wait", Phase::Statement)),
        }
        let Some(conn) = waiting.conn.take() else {
            return Ok(());
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let previous = lock_reserved(&self.reserved).insert(
            key.clone(),
            Reservation {
                id,
                owner: *owner,
                conn,
                connection_id: waiting.id,
            },
        );
        // A previous reservation of this key cannot hold the lock any more (the server
        // granted it to this session): its session is gone or going.
        drop(previous);
        let reserved = Arc::downgrade(&self.reserved);
        let (db, key) = (self.db.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(GETLOCK_RESERVE_GRACE).await;
            let Some(reserved) = reserved.upgrade() else {
                return;
            };
            let unclaimed = {
                let mut reserved = lock_reserved(&reserved);
                match reserved.get(&key) {
                    Some(r) if r.id == id => reserved.remove(&key),
                    _ => None,
                }
            };
            if let Some(r) = unclaimed {
                tracing::debug!(key = %key, "a lock reserved for a waiter went unclaimed; passed on");
                crate::conn::kill_session(&db, r.conn, r.connection_id, "passing a lock on");
            }
        });
        Ok(())
    }
}

/// What an acquire asked for, and when it was sent.
#[derive(Debug, Clone, Copy)]
struct Asked {
    ttl: Duration,
    sent: Instant,
}

/// The server watch's task (see [`leasehold_sql::server_watch`]): a session that waits in
/// [`SERVER_WATCH_SLEEP`] again and again until the server ends it (a shutdown ends every
/// session, a crash closes every socket) or the connection breaks. Then every lease the
/// store holds is reported ended, at once.
async fn watch_server(
    db: Arc<Db>,
    held: Weak<Mutex<HashMap<Key, Holder>>>,
    ended: Weak<EndedGrants>,
    mut watching: Watching,
) {
    let mut conn = match db.dedicated("watching the server").await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!(error = %e, "server watch not opened");
            watching.ended(|| ());
            return;
        }
    };
    // MariaDB's statement time limit, if one is set: not for this session (MySQL has no
    // such variable, and refuses; its `max_execution_time` spares `DO`).
    let _ = conn.execute("SET SESSION max_statement_time = 0").await;
    watching.opened();
    let why = loop {
        match conn.execute(SERVER_WATCH_SLEEP).await {
            Ok(_) => {}
            // Interrupted (`KILL QUERY`, a time limit): the session lives on.
            Err(e) if !crate::error::breaks_connection(&e) => {
                tracing::debug!(error = %e, "server watch statement interrupted");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => break db.error(e.into(), "watching the server", Phase::Statement),
        }
    };
    let (Some(held), Some(ended)) = (held.upgrade(), ended.upgrade()) else {
        return;
    };
    watching.report_ended(&ended, &why, || {
        let holders = lock(&held);
        holders
            .iter()
            .map(|(k, h)| (k.clone(), h.owner, h.fence))
            .collect()
    });
}

fn lock_idle(
    idle: &Mutex<Vec<(MySqlConnection, Instant)>>,
) -> MutexGuard<'_, Vec<(MySqlConnection, Instant)>> {
    idle.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_reserved(
    reserved: &Mutex<HashMap<Key, Reservation>>,
) -> MutexGuard<'_, HashMap<Key, Reservation>> {
    reserved.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait]
impl Store for MySqlGetLockStore {
    fn backend(&self) -> &'static str {
        BACKEND_GETLOCK
    }

    fn ended_grants(&self) -> Option<&EndedGrants> {
        Some(&self.ended)
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.session_bound = true;
        caps.fifo_wait = true;
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
        StoreError::check_ttl(BACKEND_GETLOCK, ttl)?;
        let sent = Instant::now();
        if let Some((cmds, fence)) = self.holder_of(key, owner) {
            // A retry by the holder: extend, same fence.
            if Self::ask(&cmds, |reply| Cmd::Renew { ttl, sent, reply }).await? {
                return Ok(AcquireOutcome::Acquired { fence, ttl });
            }
        }
        // The server watch is up before the lock is taken (its session opens meanwhile),
        // and the grant is installed only while the same watch is up: a server that ends
        // its sessions from then on has this lease reported ended with every other.
        self.watch.start(self.server_watch_task());
        let asked = Asked { ttl, sent };
        let name = lock_name(key);
        if let Some(r) = self.take_reservation(key, owner) {
            // The server's queue handed the lock to this owner's wait.
            return self
                .db
                .bounded("acquire", self.claim(key, owner, &name, r, asked))
                .await;
        }
        self.db
            .bounded("acquire", self.acquire_fresh(key, owner, &name, asked))
            .await
    }

    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        StoreError::check_ttl(BACKEND_GETLOCK, ttl)?;
        let sent = Instant::now();
        let Some((cmds, _)) = self.holder_of(key, owner) else {
            return Ok(RenewOutcome::NotOwner);
        };
        let matched = Self::ask(&cmds, |reply| Cmd::Renew { ttl, sent, reply }).await?;
        Ok(renewed(matched, ttl))
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let cmds = {
            let mut held = lock(&self.held);
            match held.get(key) {
                Some(h) if h.owner == *owner => held.remove(key).map(|h| h.cmds),
                _ => None,
            }
        };
        let Some(cmds) = cmds else {
            return Ok(ReleaseOutcome::NotOwner);
        };
        Ok(released(
            Self::ask(&cmds, |reply| Cmd::Release { reply }).await?,
        ))
    }

    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        type Row = (Option<u64>, Option<String>, Option<u64>, Option<u64>);
        let name = lock_name(key);
        let (used, owner, fence, holder): Row = self
            .db
            .run("inspect", async move |conn| {
                Ok(sqlx::query_as(
                    "SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED), l.owner, l.fence, l.connection_id \
                     FROM (SELECT 1 AS one) d LEFT JOIN leasehold_locks l ON l.lock_name = ?",
                )
                .bind(&name)
                .bind(&name)
                .fetch_one(conn)
                .await?)
            })
            .await?;
        let Some(used) = used else { return Ok(None) };
        match (owner, fence, holder) {
            (Some(owner), Some(fence), Some(holder)) if holder == used => Ok(Some(LeaseInfo {
                key: key.clone(),
                owner: parse_owner(key.as_str(), &owner, corrupt)?,
                fence: Fence(fence),
                remaining: None,
            })),
            _ => Err(StoreError::new(
                StoreErrorKind::Busy,
                BACKEND_GETLOCK,
                format!("the lock of `{key}` is being acquired; ask again"),
            )),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        type Row = (Vec<u8>, Option<String>, u64, Option<u64>, Option<u64>);
        let pattern = like_prefix(prefix);
        let rows: Vec<Row> = self.db.run("list", async move |conn| {
            Ok(sqlx::query_as(
                "SELECT lease_key, owner, fence, connection_id, CAST(IS_USED_LOCK(lock_name) AS UNSIGNED) \
                 FROM leasehold_locks WHERE lease_key LIKE ? ESCAPE '!' ORDER BY lease_key",
            )
            .bind(pattern)
            .fetch_all(conn)
            .await?)
        }).await?;
        let mut out = Vec::new();
        for (name, owner, fence, holder, used) in rows {
            let (Some(owner), Some(holder), Some(used)) = (owner, holder, used) else {
                continue;
            };
            if holder != used {
                continue;
            }
            let Some(key) = listed_key(name, prefix, corrupt)? else {
                continue;
            };
            out.push(LeaseInfo {
                owner: parse_owner(key.as_str(), &owner, corrupt)?,
                key,
                fence: Fence(fence),
                remaining: None,
            });
        }
        Ok(out)
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        // A lock reserved for a waiter here is ended by the `KILL` below, as any holder's.
        drop(lock_reserved(&self.reserved).remove(key));
        let local = lock(&self.held).remove(key).map(|h| h.cmds);
        if let Some(cmds) = local
            && let Err(e) = Self::ask(&cmds, |reply| Cmd::Release { reply }).await
        {
            tracing::warn!(key = %key, error = %e, "releasing the lock to break it failed; its session is closed");
        }
        let name = lock_name(key);
        let (fence, killed) = self
            .db
            .run("break", async move |conn| {
                let mut tx = conn.begin().await?;
                // Lock the row: a new holder cannot record itself until the break commits.
                sqlx::query("SELECT fence FROM leasehold_locks WHERE lock_name = ? FOR UPDATE")
                    .bind(&name)
                    .fetch_optional(&mut *tx)
                    .await?;
                let used = used_by(&mut tx, &name).await?;
                if let Some(id) = used {
                    sqlx::query(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query(BREAK)
                    .bind(&name)
                    .bind(key.as_str())
                    .execute(&mut *tx)
                    .await?;
                let fence: u64 =
                    sqlx::query_scalar("SELECT fence FROM leasehold_locks WHERE lock_name = ?")
                        .bind(&name)
                        .fetch_one(&mut *tx)
                        .await?;
                tx.commit().await?;
                Ok::<_, Failure>((fence, used))
            })
            .await?;
        if let Some(id) = killed {
            // KILL is asynchronous: wait (within the operation bound) until the killed
            // session has let the lock go.
            let name = lock_name(key);
            self.db
                .bounded("break", async {
                    loop {
                        let used = self
                            .db
                            .run("break", async |conn| Ok(used_by(conn, &name).await?))
                            .await?;
                        if used != Some(id) {
                            return Ok(());
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await?;
        }
        tracing::info!(key = %key, fence, killed, "mysql GET_LOCK lease broken");
        Ok(Fence(fence))
    }

    /// On the pool (records are not session-bound): one transaction on
    /// `leasehold_records` (shared by both stores), `INSERT … ON DUPLICATE KEY UPDATE
    /// value = IF(fence < new, …), fence = IF(fence < new, …)`, then a read of the row. A
    /// deadlock (rolled back whole) is retried.
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
        crate::doctor::diagnose(&self.db, true).await
    }
}

#[async_trait]
impl WaitStore for MySqlGetLockStore {
    /// Waits in the server's own queue for the lock (`GET_LOCK` with the timeout, on a
    /// session of its own; no polling). When the server grants it, the lock is kept
    /// reserved for `owner` for [`GETLOCK_RESERVE_GRACE`]: `owner`'s `acquire` through
    /// this store takes it (a new fence), anyone else is answered `Held`; unclaimed, it
    /// passes to the next waiter. The server grants the lock to its waiters in arrival
    /// order, so waiters of every process are served first come, first served.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait leaves the server's queue (its session is killed from
    /// another); a lock already reserved stays so for the grace at most.
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let ours = self.holder_of(key, owner).is_some()
            || lock_reserved(&self.reserved)
                .get(key)
                .is_some_and(|r| r.owner == *owner);
        if ours {
            return Ok(());
        }
        self.queue_for(key, owner, &lock_name(key), timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(k: &str) -> String {
        lock_name(&Key::new(k).unwrap())
    }

    #[test]
    fn plain_names_are_the_key() {
        assert_eq!(name("job:invoices"), "leasehold:job:invoices");
        let longest = "a".repeat(MAX_LOCK_NAME_LEN - LOCK_NAME_PREFIX.len());
        assert_eq!(name(&longest), format!("leasehold:{longest}"));
        assert_eq!(name(&longest).len(), MAX_LOCK_NAME_LEN);
    }

    #[test]
    fn other_names_are_hashed_to_64_characters() {
        let too_long = "a".repeat(MAX_LOCK_NAME_LEN - LOCK_NAME_PREFIX.len() + 1);
        for k in [
            too_long.as_str(),
            "Job:Invoices",
            "job invoices",
            "jöb",
            "{}",
            "job:a*b",
            &"k".repeat(leasehold_core::MAX_KEY_LEN),
        ] {
            let n = name(k);
            assert!(n.starts_with(HASHED_LOCK_NAME_PREFIX), "{k}: {n}");
            assert_eq!(n.len(), MAX_LOCK_NAME_LEN, "{k}: {n}");
            assert!(n.is_ascii());
        }
        // Case, spaces and lengths never collide.
        let keys = ["Job:x", "job:X", "JOB:X", "job:x ", " job:x", "job:x"];
        let names: std::collections::BTreeSet<_> = keys.iter().map(|k| name(k)).collect();
        assert_eq!(names.len(), keys.len());
        // Deterministic (documented form): SHA-256 of the key's bytes, 54 hex digits.
        assert_eq!(
            name("Job:Invoices"),
            format!(
                "leasehold#{}",
                &Sha256::digest(b"Job:Invoices")
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()[..54]
            )
        );
    }

    #[test]
    fn like_prefixes_are_literal() {
        assert_eq!(like_prefix("a_b%c!"), "a!_b!%c!!%");
        assert_eq!(like_prefix(""), "%");
    }
}
