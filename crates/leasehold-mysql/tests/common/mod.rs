//! Shared test support: a private MariaDB, an admin pool straight to it, fault hooks.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::Faults;
use leasehold_core::Key;
use leasehold_testkit::{FaultProxy, MariaDb, MariaDbOptions, ProxyMode};
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;

/// A private MariaDB with its own temporary-files directory.
pub struct Server {
    pub db: MariaDb,
    _tmp: tempfile::TempDir,
}

impl std::ops::Deref for Server {
    type Target = MariaDb;
    fn deref(&self) -> &MariaDb {
        &self.db
    }
}

/// Starts a private MariaDB (blocking the calling worker thread, not the runtime).
///
/// Concurrent `mariadb-install-db` runs sharing `/tmp` sometimes delete each other's
/// temporary tables and fail ("Unknown table 'mysql.tmp_user_sys'"), and the test kit
/// gives them no other `TMPDIR`: a failed install is retried. Each server gets its own
/// `--tmpdir`.
pub fn start_db() -> Server {
    tokio::task::block_in_place(|| {
        let tmp = tempfile::Builder::new()
            .prefix("leasehold-mysql-tmp-")
            .tempdir_in("/tmp")
            .expect("temporary directory");
        let mysql = nix::unistd::User::from_name("mysql")
            .ok()
            .flatten()
            .expect("OS user mysql: install mariadb-server");
        std::os::unix::fs::chown(
            tmp.path(),
            Some(mysql.uid.as_raw()),
            Some(mysql.gid.as_raw()),
        )
        .expect("chown the server's tmpdir");
        let options = MariaDbOptions::new()
            .arg("--innodb-buffer-pool-size=32M")
            .arg("--max-connections=300")
            .arg(format!("--tmpdir={}", tmp.path().display()));
        for attempt in 1.. {
            let start = std::panic::AssertUnwindSafe(|| MariaDb::start_with(options.clone()));
            match std::panic::catch_unwind(start) {
                Ok(db) => return Server { db, _tmp: tmp },
                Err(e) if attempt < 6 => {
                    let msg = e
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .unwrap_or("?");
                    if !msg.contains("mariadb-install-db failed") {
                        std::panic::resume_unwind(e);
                    }
                    eprintln!("mariadb-install-db collided with another install: retrying");
                    std::thread::sleep(Duration::from_millis(100 * attempt));
                }
                Err(e) => std::panic::resume_unwind(e),
            }
        }
        unreachable!()
    })
}

/// A pool straight to the server (not through any proxy), as root.
pub async fn admin(db: &MariaDb) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(4)
        .connect(&db.url())
        .await
        .expect("admin connection")
}

/// Which store a fixture tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Table,
    GetLock,
}

/// `forget`: clear the lease row (table) or KILL the lock's session (GET_LOCK, docs/faults.md row 19);
/// `make_unreachable`: blackhole the proxy the store talks through.
pub struct MyFaults {
    pub admin: MySqlPool,
    pub proxy: Arc<FaultProxy>,
    pub kind: Kind,
}

/// KILLs the session holding `key`'s GET_LOCK; returns its connection id.
pub async fn kill_lock_holder(admin: &MySqlPool, key: &Key) -> u64 {
    let id: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
        .bind(leasehold_mysql::lock_name(key))
        .fetch_one(admin)
        .await
        .unwrap();
    let id = id.unwrap_or_else(|| panic!("nobody holds the lock of {key}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
        .execute(admin)
        .await
        .unwrap();
    id
}

#[async_trait]
impl Faults for MyFaults {
    async fn forget(&self, key: &Key) {
        match self.kind {
            Kind::Table => {
                sqlx::query(
                    "UPDATE leasehold_leases SET owner = NULL, expires_at_us = NULL WHERE lease_key = ?",
                )
                .bind(key.as_str())
                .execute(&self.admin)
                .await
                .unwrap();
            }
            Kind::GetLock => {
                kill_lock_holder(&self.admin, key).await;
            }
        }
    }

    async fn make_unreachable(&self) {
        self.proxy.set_mode(ProxyMode::Blackhole);
    }

    async fn restore(&self) {
        self.proxy.set_mode(ProxyMode::Pass);
    }
}

/// The URL of the server listening on `port` (itself, or a proxy in front of it), with
/// short bounds for tests.
fn url_on(port: u16, scheme: &str) -> String {
    format!(
        "{scheme}://root@127.0.0.1:{port}/test?timeout=1s&connect_timeout=1s&max_connections=16"
    )
}

/// The URL of `db` through `proxy`, with short bounds for tests.
pub fn url_through(proxy: &FaultProxy, scheme: &str) -> String {
    url_on(proxy.port(), scheme)
}

pub const TTL: Duration = Duration::from_millis(1500);

impl leasehold_conformance::Pausable for Server {
    fn pause(&self) {
        self.db.pause();
    }
    fn resume(&self) {
        self.db.resume();
    }
}

/// The conformance suite's stale-writer case writes through the MySQL guard: the guard
/// check and an upsert of `conformance_data`, in one transaction.
pub struct MyWrites {
    pool: MySqlPool,
}

impl MyWrites {
    /// Creates the guard tables and the data table on `pool`.
    pub async fn new(pool: MySqlPool) -> Self {
        leasehold_mysql::guard::migrate(&pool)
            .await
            .expect("guard tables");
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS conformance_data \
             (resource VARCHAR(255) PRIMARY KEY, value TEXT NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("data table");
        Self { pool }
    }
}

#[async_trait]
impl leasehold_conformance::FencedWrites for MyWrites {
    async fn write(
        &self,
        resource: &str,
        fence: leasehold_core::Fence,
        value: &str,
    ) -> Result<bool, leasehold_core::StoreError> {
        use leasehold_mysql::store_error;
        let name =
            leasehold_core::ResourceName::new(resource).expect("the suite's names are valid");
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        if !leasehold_mysql::guard::check_and_advance(&mut tx, &name, fence)
            .await?
            .is_accepted()
        {
            tx.rollback().await.map_err(store_error)?;
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO conformance_data (resource, value) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE value = VALUES(value)",
        )
        .bind(resource)
        .bind(value)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(true)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, leasehold_core::StoreError> {
        sqlx::query_scalar("SELECT value FROM conformance_data WHERE resource = ?")
            .bind(resource)
            .fetch_optional(&self.pool)
            .await
            .map_err(leasehold_mysql::store_error)
    }
}

/// The URL of `db` itself (not through a proxy), with the same bounds as
/// [`url_through`].
pub fn url_direct(db: &MariaDb, scheme: &str) -> String {
    url_on(db.port(), scheme)
}

/// The conformance fixture for `kind`: the store through a fault proxy, a direct store,
/// the guard, the holder process's URL.
pub async fn conformance_fixture(kind: Kind) -> leasehold_conformance::Fixture {
    let db = Arc::new(start_db());
    let proxy = Arc::new(FaultProxy::start(db.addr()));
    let scheme = match kind {
        Kind::Table => "mysql",
        Kind::GetLock => "mysql+getlock",
    };
    let store = open_store(kind, url_through(&proxy, scheme)).await;
    let direct_url = url_direct(&db, scheme);
    let direct = open_store(kind, direct_url.clone()).await;
    let admin = admin(&db).await;
    let writes = MyWrites::new(admin.clone()).await;
    let queue = Arc::new(MyQueue(admin.clone()));
    let network = leasehold_conformance::Network::new(vec![proxy.clone()], direct, db.clone())
        .op_bound(Duration::from_secs(1));
    leasehold_conformance::Fixture::new(
        store,
        Arc::new(MyFaults {
            admin,
            proxy: proxy.clone(),
            kind,
        }),
        TTL,
    )
    .guard(Arc::new(writes))
    .queue(queue)
    .other_processes(direct_url)
    .network(network)
    .expects_waiter()
    .keep_alive((db, proxy))
}

/// Opens a store of `kind` from `url`.
pub async fn open_store(kind: Kind, url: String) -> Arc<dyn leasehold_core::Store> {
    match kind {
        Kind::Table => Arc::new(
            leasehold_mysql::MySqlLeaseStore::open(&url)
                .await
                .expect("open the store"),
        ),
        Kind::GetLock => Arc::new(
            leasehold_mysql::MySqlGetLockStore::open(&url)
                .await
                .expect("open the store"),
        ),
    }
}

/// The lease keys that have a row in `table` (`leasehold_leases`, `leasehold_locks`), sorted:
/// what `prune` left.
pub async fn keys_in(pool: &sqlx::MySqlPool, table: &str) -> Vec<String> {
    sqlx::query_scalar::<_, Vec<u8>>(sqlx::AssertSqlSafe(format!(
        "SELECT lease_key FROM {table} ORDER BY lease_key"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|k| String::from_utf8(k).unwrap())
    .collect()
}

/// The stores' queue of waiters as the server holds it: each waiter is a session in
/// `GET_LOCK` (the lease table's turnstile, or the `GET_LOCK` store's lock itself), and the
/// table store's first waiter sleeps in the server until it is woken — not the `GET_LOCK`
/// store's server watch, which sleeps too (`DO SLEEP(30)`). One key is waited on at a time
/// in the tests that read it.
pub struct MyQueue(pub MySqlPool);

#[async_trait]
impl leasehold_conformance::Queue for MyQueue {
    async fn waiting(&self, _: &Key) -> usize {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' \
             OR (STATE = 'User sleep' AND INFO NOT LIKE 'DO SLEEP%')",
        )
        .fetch_one(&self.0)
        .await
        .expect("read the sessions");
        usize::try_from(n).expect("a count")
    }
}

/// [`MyQueue`] on `db`, for the waiting suite.
pub async fn queue(db: &Server) -> Box<dyn leasehold_conformance::Queue> {
    Box::new(MyQueue(admin(db).await))
}
