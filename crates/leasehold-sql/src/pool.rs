//! Pooled connections that never go back to the pool broken.

use std::ops::{Deref, DerefMut};

use leasehold_core::StoreError;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

use crate::failure::{ErrorModel, Failure, Phase};

/// A pooled connection that is **closed** instead of returned to the pool, unless the
/// operation using it marks it [`keep`](Self::keep) after running to its end. A checkout
/// dropped early — its operation cancelled, timed out or failed in a way that may have
/// broken the connection — therefore never hands a connection in an unknown state (a
/// statement half sent, a reply still on its way, a transaction open) to the next
/// operation.
///
/// It dereferences to the driver's connection (`&mut *checkout` is a
/// `&mut SqliteConnection`, `&mut MySqlConnection`, …).
#[derive(Debug)]
pub struct Checkout<DB: Database> {
    conn: PoolConnection<DB>,
    keep: bool,
}

impl<DB: Database> Checkout<DB> {
    /// Takes a connection from `pool` (waiting at most the pool's acquire timeout).
    ///
    /// When no connection is idle, the pool's wait — and the new connection it may open —
    /// runs in a task of its own: if this call is dropped (its operation cancelled or cut
    /// off by its time bound), that task still finishes and its connection goes to the
    /// pool, for the next operation. Cutting the connect off instead would throw away the
    /// work of every connect that takes longer than an operation's bound (a TLS handshake
    /// on a loaded machine, a distant server), and every later operation would start
    /// another one and throw it away too: the store would never complete an operation
    /// again. A connect runs at most the pool's acquire timeout (the store's connect
    /// timeout).
    ///
    /// # Cancel safety
    /// Cancel safe: a connection is handed out only when the call completes; one opened
    /// for a call that was dropped is pooled.
    ///
    /// # Errors
    /// The pool's error: timed out, closed, or a new connection that failed.
    pub async fn acquire(pool: &Pool<DB>) -> Result<Self, sqlx::Error> {
        let conn = if pool.num_idle() > 0 {
            // The common case: an idle connection, handed out (after the pool's own checks)
            // without a task.
            pool.acquire().await?
        } else {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => rt.spawn(pool.acquire()).await.map_err(|e| {
                    sqlx::Error::Io(std::io::Error::other(format!(
                        "the task opening a connection ended without one: {e}"
                    )))
                })??,
                Err(_) => pool.acquire().await?,
            }
        };
        Ok(Self { conn, keep: false })
    }

    /// Returns the connection to the pool when the checkout is dropped.
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Whether the connection goes back to the pool when the checkout is dropped.
    pub fn is_kept(&self) -> bool {
        self.keep
    }
}

impl<DB: Database> Deref for Checkout<DB> {
    type Target = DB::Connection;
    fn deref(&self) -> &DB::Connection {
        &self.conn
    }
}

impl<DB: Database> DerefMut for Checkout<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }
}

impl<DB: Database> Drop for Checkout<DB> {
    fn drop(&mut self) {
        if !self.keep {
            self.conn.close_on_drop();
        }
    }
}

/// Runs `body` on a connection from `pool` and maps its [`Failure`] with `model`.
///
/// The connection goes back to the pool when `body` succeeds or fails without breaking it
/// ([`Failure::breaks_connection`]); it is closed when `body` breaks it or when this
/// future is dropped before `body` ended. For a time bound, wrap the call in
/// [`StoreError::bounded`]: at the bound it drops this future, so the connection, whose
/// reply may still be on its way, is closed.
///
/// ```
/// # async fn f(pool: sqlx::SqlitePool, model: &dyn leasehold_sql::ErrorModel) -> Result<(), leasehold_core::StoreError> {
/// let n: i64 = leasehold_sql::with_conn(&pool, model, "count", async |conn| {
///     Ok(sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(conn).await?)
/// })
/// .await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Cancel safe as far as the pool goes: a dropped call closes its connection.
///
/// # Errors
/// The pool's error mapped in [`Phase::Connect`] (nothing was sent), or `body`'s failure
/// mapped in [`Phase::Statement`].
pub async fn with_conn<DB, M, T>(
    pool: &Pool<DB>,
    model: &M,
    op: &str,
    body: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, Failure>,
) -> Result<T, StoreError>
where
    DB: Database,
    M: ErrorModel + ?Sized,
{
    let mut checkout = Checkout::acquire(pool)
        .await
        .map_err(|e| model.store_error(e, op, Phase::Connect))?;
    let result = body(&mut checkout).await;
    let usable = match &result {
        Ok(_) => true,
        Err(f) => !f.breaks_connection(model),
    };
    if usable {
        checkout.keep();
    }
    result.map_err(|f| f.into_store(model, op, Phase::Statement))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasehold_core::StoreErrorKind;
    use sqlx::sqlite::SqlitePoolOptions;
    use sqlx::{Sqlite, SqliteConnection, SqlitePool};

    use super::*;
    use crate::failure::tests::TestModel;

    /// One in-memory database per connection, at most one connection: whether an
    /// operation meets the connection of the previous one shows in a TEMP table.
    async fn pool() -> SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .test_before_acquire(false)
            .connect("sqlite::memory:")
            .await
            .unwrap()
    }

    async fn mark(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("CREATE TEMP TABLE marker (x INTEGER)")
            .execute(conn)
            .await
            .map(|_| ())
    }

    /// Whether the next checkout gets the marked connection back.
    async fn same_connection(pool: &SqlitePool) -> bool {
        let mut c: Checkout<Sqlite> = Checkout::acquire(pool).await.unwrap();
        c.keep();
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM sqlite_temp_master WHERE name = 'marker'")
                .fetch_one(&mut *c)
                .await
                .unwrap();
        if n == 1 {
            sqlx::raw_sql("DROP TABLE temp.marker")
                .execute(&mut *c)
                .await
                .unwrap();
        }
        n == 1
    }

    #[tokio::test]
    async fn a_checkout_closes_its_connection_unless_kept() {
        let pool = pool().await;
        let mut c: Checkout<Sqlite> = Checkout::acquire(&pool).await.unwrap();
        assert!(!c.is_kept());
        mark(&mut c).await.unwrap();
        c.keep();
        assert!(c.is_kept());
        drop(c);
        assert!(
            same_connection(&pool).await,
            "a kept connection is pooled again"
        );

        let mut c: Checkout<Sqlite> = Checkout::acquire(&pool).await.unwrap();
        mark(&mut c).await.unwrap();
        drop(c);
        assert!(
            !same_connection(&pool).await,
            "a connection not kept is closed"
        );
    }

    /// `with_conn` with a body that marks its connection, then ends with `outcome`.
    async fn marked<T>(
        pool: &SqlitePool,
        op: &str,
        outcome: Result<T, Failure>,
    ) -> Result<T, StoreError> {
        with_conn(pool, &TestModel, op, async |conn: &mut SqliteConnection| {
            mark(conn).await?;
            outcome
        })
        .await
    }

    #[tokio::test]
    async fn with_conn_pools_the_connection_only_when_it_is_usable() {
        let pool = pool().await;
        assert_eq!(marked(&pool, "ok", Ok(1)).await.unwrap(), 1);
        assert!(same_connection(&pool).await, "success: pooled");

        // A failure that leaves the connection usable: mapped, connection pooled.
        let harmless = Err(Failure::Sql(sqlx::Error::RowNotFound));
        let e = marked::<()>(&pool, "harmless", harmless).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Other, "a statement error");
        assert!(e.message().starts_with("harmless: "), "{e}");
        assert!(same_connection(&pool).await, "harmless failure: pooled");

        // Failures that may have broken it: closed.
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        let unknown = StoreError::new(StoreErrorKind::Ambiguous, "test", "unknown");
        for (failure, kind) in [
            (Failure::Sql(io), StoreErrorKind::Other),
            (Failure::Store(unknown), StoreErrorKind::Ambiguous),
        ] {
            let e = marked::<()>(&pool, "breaking", Err(failure))
                .await
                .unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
            assert!(
                !same_connection(&pool).await,
                "breaking failure: closed ({e})"
            );
        }
    }

    #[tokio::test]
    async fn with_conn_cut_short_by_its_bound_closes_the_connection() {
        let pool = pool().await;
        let e = StoreError::bounded(
            "test",
            "slow",
            Duration::from_millis(50),
            with_conn(
                &pool,
                &TestModel,
                "slow",
                async |conn: &mut SqliteConnection| {
                    mark(conn).await?;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(())
                },
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Timeout);
        assert!(!same_connection(&pool).await, "cancelled: closed");
    }

    /// A connect slower than an operation's bound: the operation times out, the connect
    /// finishes in its own task and its connection is pooled; the next operation uses it
    /// and no second connection is opened.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connect_cut_off_by_its_operations_bound_still_pools_its_connection() {
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = opened.clone();
        let pool: SqlitePool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .test_before_acquire(false)
            .after_connect(move |_conn, _meta| {
                let counter = counter.clone();
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(())
                })
            })
            .connect_lazy("sqlite::memory:")
            .unwrap();
        let op = |bound| {
            StoreError::bounded(
                "test",
                "op",
                bound,
                with_conn(
                    &pool,
                    &TestModel,
                    "op",
                    async |conn: &mut SqliteConnection| {
                        Ok(sqlx::query_scalar::<_, i64>("SELECT 1")
                            .fetch_one(conn)
                            .await?)
                    },
                ),
            )
        };
        let e = op(Duration::from_millis(20)).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}");
        // The connect goes on without the operation; its connection is pooled.
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while pool.num_idle() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the connection cut off was never pooled");
        assert_eq!(op(Duration::from_secs(5)).await.unwrap(), 1);
        assert_eq!(
            opened.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the second operation used the first one's connection"
        );
    }

    #[tokio::test]
    async fn with_conn_without_a_connection_fails_in_the_connect_phase() {
        let pool = pool().await;
        pool.close().await;
        let e = with_conn(
            &pool,
            &TestModel,
            "closed",
            async |_: &mut SqliteConnection| Ok(()),
        )
        .await
        .unwrap_err();
        // TestModel maps Phase::Connect to Busy.
        assert_eq!(e.kind(), StoreErrorKind::Busy, "{e}");
        assert!(e.message().starts_with("closed: "), "{e}");
    }
}
