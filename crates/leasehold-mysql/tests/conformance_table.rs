//! The conformance suite on the MariaDB lease-table store, one private server per case,
//! reached through a fault proxy (blackholed for `make_unreachable`); `forget` clears the
//! lease row's owner from a direct connection.

mod common;

use std::sync::Arc;

use leasehold_conformance::Fixture;
use leasehold_mysql::MySqlLeaseStore;
use leasehold_testkit::FaultProxy;

async fn fixture() -> Fixture {
    let db = common::start_db();
    let proxy = Arc::new(FaultProxy::start(db.addr()));
    let store = MySqlLeaseStore::open(&common::url_through(&proxy, "mysql"))
        .await
        .expect("open the store");
    let admin = common::admin(&db).await;
    Fixture {
        store: Arc::new(store),
        faults: Arc::new(common::MyFaults {
            admin,
            proxy,
            kind: common::Kind::Table,
        }),
        ttl: common::TTL,
        guard: Box::new(db),
    }
}

leasehold_conformance::conformance_suite!(fixture);
