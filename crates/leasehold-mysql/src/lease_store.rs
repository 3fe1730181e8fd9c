//! [`MySqlLeaseStore`]: leases as rows of a table, expiry on the server's clock.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Capabilities, Fence, FenceDurability, Key, LeaseInfo, OwnerToken,
    ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind,
};
use leasehold_sql::Failure;
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{Connection, MySql, MySqlConnection, MySqlPool};

use crate::config::MySqlConfig;
use crate::conn::{Db, StoreTable};
use crate::error::is_deadlock;
use crate::schema::{LEASES_SCHEMA, now_us};

/// The backend name of [`MySqlLeaseStore`].
pub const BACKEND_TABLE: &str = "mysql";

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
/// Cheap to share: wrap it in an `Arc`. It owns a pool of connections; an operation that is
/// cancelled, times out or breaks its connection closes it rather than returning it to
/// the pool.
pub struct MySqlLeaseStore {
    db: Db,
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
    let token =
        OwnerToken::from_str(owner).map_err(|_| corrupt(key, "the owner is not 32 hex digits"))?;
    let expires = expires.ok_or_else(|| corrupt(key, "an owner without an expiry"))?;
    Ok((expires > now).then_some((token, expires)))
}

fn remaining(expires: i64, now: i64) -> Duration {
    Duration::from_micros(u64::try_from(expires.saturating_sub(now)).unwrap_or(0))
}

fn ttl_us(ttl: Duration) -> Result<i64, StoreError> {
    StoreError::check_ttl(BACKEND_TABLE, ttl)?;
    Ok(i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX))
}

/// Escapes `%`, `_` and the escape character `!` for `LIKE … ESCAPE '!'`.
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}

const ACQUIRE: &str = concat!(
    "INSERT INTO leasehold_leases (lease_key, owner, fence, expires_at_us) ",
    "VALUES (?, ?, GREATEST(1, ",
    now_us!(),
    "), ",
    now_us!(),
    " + ?) ",
    "ON DUPLICATE KEY UPDATE ",
    // A row is taken while it has an owner and has not expired (or has no expiry: corrupt,
    // left alone so the read below reports it). Assignments run left to right and later
    // ones see earlier results: the order below is right for that and for MariaDB's
    // SIMULTANEOUS_ASSIGNMENT mode alike.
    "fence = IF(owner IS NOT NULL AND (expires_at_us IS NULL OR expires_at_us > ",
    now_us!(),
    "), ",
    "fence, GREATEST(fence + 1, ",
    now_us!(),
    ")), ",
    "owner = IF(owner IS NOT NULL AND (expires_at_us IS NULL OR expires_at_us > ",
    now_us!(),
    ") ",
    "AND owner <> ?, owner, ?), ",
    "expires_at_us = IF(owner IS NOT NULL AND (expires_at_us IS NULL OR expires_at_us > ",
    now_us!(),
    ") ",
    "AND owner <> ?, expires_at_us, ",
    now_us!(),
    " + ?)"
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
) -> Result<Row, Failure> {
    let hex = owner.to_hex();
    let mut attempt = 0;
    loop {
        let r = sqlx::query(ACQUIRE)
            .bind(key)
            .bind(&hex)
            .bind(ttl_us)
            .bind(&hex)
            .bind(&hex)
            .bind(&hex)
            .bind(ttl_us)
            .execute(&mut *conn)
            .await;
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

impl MySqlLeaseStore {
    /// A store for `config`, without connecting: the first operation connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an invalid configuration.
    pub fn new(config: MySqlConfig) -> Result<Self, StoreError> {
        Ok(Self {
            db: Db::new(config, BACKEND_TABLE)?,
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

    /// Creates the lease table ([`LEASES_SCHEMA`](crate::LEASES_SCHEMA)) unless it exists
    /// (idempotent; no DDL is sent when it exists).
    ///
    /// # Cancel safety
    /// Cancel safe: the table is created by one statement, or not.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] without the privilege to create it.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db.migrate(TABLE).await
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &MySqlConfig {
        &self.db.config
    }

    /// The connection pool (e.g. to run the [`guard`](crate::guard) on the same database).
    pub fn pool(&self) -> &MySqlPool {
        &self.db.pool
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
        caps.list = true;
        caps.break_lease = true;
        caps.fence_durability = FenceDurability::Durable;
        caps
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let ttl_us = ttl_us(ttl)?;
        let (row_owner, fence, expires, now) = self
            .db
            .run("acquire", async |conn| {
                acquire_stmt(conn, key.as_str(), owner, ttl_us).await
            })
            .await?;
        let token = row_owner
            .as_deref()
            .map(|o| {
                OwnerToken::from_str(o)
                    .map_err(|_| corrupt(key.as_str(), "the owner is not 32 hex digits"))
            })
            .transpose()?;
        if token == Some(*owner) {
            return Ok(AcquireOutcome::Acquired {
                fence: Fence(fence),
                ttl,
            });
        }
        // Held by another owner (or, rarely, broken or expired right after our statement).
        let remaining = match live(key.as_str(), row_owner.as_deref(), expires, now)? {
            Some((_, expires)) => remaining(expires, now),
            None => Duration::ZERO,
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
        let ttl_us = ttl_us(ttl)?;
        let query = sqlx::query(RENEW)
            .bind(ttl_us)
            .bind(key.as_str())
            .bind(owner.to_hex());
        let matched = self.update_own("renew", query).await?;
        Ok(if matched {
            RenewOutcome::Renewed { ttl }
        } else {
            RenewOutcome::NotOwner
        })
    }

    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let query = sqlx::query(RELEASE).bind(key.as_str()).bind(owner.to_hex());
        let matched = self.update_own("release", query).await?;
        Ok(if matched {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwner
        })
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
        let Some((owner, fence, expires, now)) = row else {
            return Ok(None);
        };
        Ok(
            live(key.as_str(), owner.as_deref(), expires, now)?.map(|(owner, expires)| LeaseInfo {
                key: key.clone(),
                owner,
                fence: Fence(fence),
                remaining: Some(remaining(expires, now)),
            }),
        )
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
            let name = String::from_utf8(name).map_err(|_| corrupt("?", "the key is not UTF-8"))?;
            if !name.starts_with(prefix) {
                continue;
            }
            let key = Key::new(&name).map_err(|_| corrupt(&name, "not a valid key"))?;
            if let Some((owner, expires)) = live(&name, owner.as_deref(), expires, now)? {
                out.push(LeaseInfo {
                    key,
                    owner,
                    fence: Fence(fence),
                    remaining: Some(remaining(expires, now)),
                });
            }
        }
        Ok(out)
    }

    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let fence = self
            .db
            .run("break", async |conn| break_tx(conn, key.as_str()).await)
            .await?;
        tracing::info!(key = %key, fence, "mysql lease broken");
        Ok(Fence(fence))
    }
}
