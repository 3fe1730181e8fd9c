//! The conformance suite and the shared fault cases (docs/faults.md rows 2, 4, 5, 6, 7, 8, 24) on
//! the advisory-lock store, against a private PostgreSQL behind a fault proxy; the guard
//! case writes through the PostgreSQL guard; the holder process of the `kill -9` and
//! near-miss cases opens the store straight to the server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture, Network};
use leasehold_core::{Key, Store};
use leasehold_postgres::{PgAdvisoryStore, PgConfig};
use leasehold_testkit::{FaultProxy, PostgresOptions, ProxyMode};

struct AdvisoryFaults {
    /// A second store straight to the server, for terminating the holder's session.
    admin: PgAdvisoryStore,
    proxy: Arc<FaultProxy>,
}

#[async_trait]
impl Faults for AdvisoryFaults {
    async fn forget(&self, key: &Key) {
        // The session holding the lock ends: the lock (the lease) is gone, the fence row
        // stays.
        let n = self.admin.terminate_holder(key).await.expect("terminate");
        assert_eq!(n, 1, "exactly one session held {key}");
    }
    async fn make_unreachable(&self) {
        self.proxy.set_mode(ProxyMode::Blackhole);
    }
    async fn restore(&self) {
        self.proxy.set_mode(ProxyMode::Pass);
    }
}

async fn connect(url: &str) -> PgAdvisoryStore {
    PgAdvisoryStore::connect(&PgConfig::from_url(url).unwrap())
        .await
        .expect("connect")
}

/// Opens the store in the holder process.
async fn open(url: String) -> Arc<dyn Store> {
    Arc::new(connect(&url).await)
}

async fn fixture() -> Fixture {
    let pg = Arc::new(common::start_pg(PostgresOptions::new()).await);
    let proxy = Arc::new(FaultProxy::start(pg.addr()));
    let store = connect(&common::url_for(proxy.addr())).await;
    store.migrate().await.expect("migrate");
    let admin = connect(&pg.url()).await;
    let writes = common::PgWrites::new(common::admin_pool(&pg).await).await;
    let network = Network::new(vec![proxy.clone()], Arc::new(admin.clone()), pg.clone());
    let queue = Arc::new(common::PgQueue {
        pool: common::admin_pool(&pg).await,
        table: false,
    });
    Fixture::new(
        Arc::new(store),
        Arc::new(AdvisoryFaults {
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

leasehold_conformance::conformance_suite!(fixture, backend = PostgresAdvisory, holder = open);
leasehold_conformance::fault_suite!(fixture, backend = PostgresAdvisory, holder = open);
