//! The conformance suite on the advisory-lock store, against a private PostgreSQL behind
//! a fault proxy.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::Key;
use leasehold_conformance::{Faults, Fixture};
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

async fn fixture() -> Fixture {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let proxy = Arc::new(FaultProxy::start(pg.addr()));
    let config = PgConfig::from_url(&common::url_for(proxy.addr())).unwrap();
    let store = PgAdvisoryStore::connect(&config).await.expect("connect");
    store.migrate().await.expect("migrate");
    let admin = PgAdvisoryStore::connect(&PgConfig::from_url(&pg.url()).unwrap())
        .await
        .expect("admin");
    Fixture {
        store: Arc::new(store),
        faults: Arc::new(AdvisoryFaults {
            admin,
            proxy: proxy.clone(),
        }),
        ttl: Duration::from_secs(2),
        guard: Box::new((pg, proxy)),
    }
}

leasehold_conformance::conformance_suite!(fixture);
