//! The conformance suite on the lease-table store over TLS (`sslmode=verify-full`) against
//! a private PostgreSQL that requires it (`hostnossl … reject`); the guard case writes
//! through the PostgreSQL guard on a TLS pool. The full tier: `scripts/test --full` runs
//! it (docs/connections.md).

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture};
use leasehold_core::{Key, Store};
use leasehold_postgres::sqlx::{self, PgPool};
use leasehold_testkit::{FaultProxy, Postgres, PostgresOptions, ProxyMode, ServerCert};

struct TlsFaults {
    admin: PgPool,
    proxy: Arc<FaultProxy>,
}

#[async_trait]
impl Faults for TlsFaults {
    async fn forget(&self, key: &Key) {
        sqlx::query(
            "UPDATE leasehold_leases SET owner = NULL, expires_at = clock_timestamp() WHERE key = $1",
        )
        .bind(key.as_str())
        .execute(&self.admin)
        .await
        .expect("forget");
    }
    async fn make_unreachable(&self) {
        self.proxy.set_mode(ProxyMode::Blackhole);
    }
    async fn restore(&self) {
        self.proxy.set_mode(ProxyMode::Pass);
    }
}

/// `postgres://postgres@127.0.0.1:PORT/postgres` with full verification against `pg`'s CA.
fn url(pg: &Postgres, port: u16) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        pg.tls().expect("a TLS server").ca_cert().display()
    )
}

async fn open(url: String) -> Arc<dyn Store> {
    Arc::new(common::table_store(&url).await)
}

async fn fixture() -> Fixture {
    let pg = Arc::new(common::start_pg(PostgresOptions::new().tls(ServerCert::Localhost)).await);
    let proxy = Arc::new(FaultProxy::start(pg.addr()));
    let store = common::table_store(&url(&pg, proxy.port())).await;
    let direct = url(&pg, pg.port());
    let admin = PgPool::connect(&direct).await.expect("admin pool over TLS");
    let writes = common::PgWrites::new(admin.clone()).await;
    let queue = Arc::new(common::PgQueue {
        pool: admin.clone(),
        table: true,
    });
    Fixture::new(
        Arc::new(store),
        Arc::new(TlsFaults {
            admin,
            proxy: proxy.clone(),
        }),
        Duration::from_secs(2),
    )
    .guard(Arc::new(writes))
    .queue(queue)
    .other_processes(direct)
    .expects_watcher()
    .expects_waiter()
    .keep_alive((pg, proxy))
}

leasehold_conformance::conformance_suite!(
    fixture,
    backend = Postgres,
    holder = open,
    ignore = "full tier: conformance over TLS"
);
