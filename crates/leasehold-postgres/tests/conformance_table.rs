//! The conformance suite on the lease-table store, against a private PostgreSQL behind a
//! fault proxy.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::Key;
use leasehold_conformance::{Faults, Fixture};
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

async fn fixture() -> Fixture {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let proxy = Arc::new(FaultProxy::start(pg.addr()));
    let store: PgLeaseStore = common::table_store(&common::url_for(proxy.addr())).await;
    let admin = common::admin_pool(&pg).await;
    Fixture {
        store: Arc::new(store),
        faults: Arc::new(TableFaults {
            admin,
            proxy: proxy.clone(),
        }),
        ttl: Duration::from_secs(2),
        guard: Box::new((pg, proxy)),
    }
}

leasehold_conformance::conformance_suite!(fixture);
