//! The conformance suite on the MariaDB GET_LOCK store, one private server per case,
//! reached through a fault proxy (blackholed for `make_unreachable`); `forget` KILLs the
//! session holding the lock (FAULTS 19).

mod common;

use std::sync::Arc;

use leasehold_conformance::Fixture;
use leasehold_mysql::MySqlGetLockStore;
use leasehold_testkit::FaultProxy;

async fn fixture() -> Fixture {
    let db = common::start_db();
    let proxy = Arc::new(FaultProxy::start(db.addr()));
    let store = MySqlGetLockStore::open(&common::url_through(&proxy, "mysql+getlock"))
        .await
        .expect("open the store");
    let admin = common::admin(&db).await;
    Fixture {
        store: Arc::new(store),
        faults: Arc::new(common::MyFaults {
            admin,
            proxy,
            kind: common::Kind::GetLock,
        }),
        ttl: common::TTL,
        guard: Box::new(db),
    }
}

leasehold_conformance::conformance_suite!(fixture);
