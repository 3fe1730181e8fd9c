//! The conformance suite and the shared fault cases (docs/faults.md rows 2, 4, 5, 6, 7, 8, 24) on
//! the lease-table store, against a private PostgreSQL behind a fault proxy; the guard
//! case writes through the PostgreSQL guard; the holder process of the `kill -9` and
//! near-miss cases opens the store straight to the server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture, Network};
use leasehold_core::{Key, Store};
use leasehold_postgres::PgLeaseStore;
use leasehold_postgres::sqlx::{self, PgPool};
use leasehold_testkit::{FaultProxy, PostgresOptions, ProxyMode};

struct TableFaults {
    admin: PgPool,
    proxy: Arc<FaultProxy>,
}

#[async_trait]
impl Faults for TableFaults {
    async fn forget(&self, key: &Key) {
        // Early expiry: the row stays (and with it the fence), the lease is gone.
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

/// Opens the store in the holder process.
async fn open(url: String) -> Arc<dyn Store> {
    Arc::new(common::table_store(&url).await)
}

async fn fixture() -> Fixture {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let proxy = Arc::new(FaultProxy::start(pg.addr()));
    let store: PgLeaseStore = common::table_store(&common::url_for(proxy.addr())).await;
    let admin = common::admin_pool(&pg).await;
    let direct = common::table_store(&pg.url()).await;
    let writes = common::PgWrites::new(admin.clone()).await;
    let network = Network::new(vec![proxy.clone()], Arc::new(direct), pg.clone());
    let queue = Arc::new(common::PgQueue {
        pool: admin.clone(),
        table: true,
    });
    Fixture::new(
        Arc::new(store),
        Arc::new(TableFaults {
            admin,
            proxy: proxy.clone(),
        }),
        Duration::from_secs(2),
    )
    .guard(Arc::new(writes))
    .queue(queue)
    .other_processes(pg.url())
    .network(network)
    .expects_watcher()
    .expects_waiter()
    .keep_alive((pg, proxy))
}

leasehold_conformance::conformance_suite!(fixture, backend = Postgres, holder = open);
leasehold_conformance::fault_suite!(fixture, backend = Postgres, holder = open);
