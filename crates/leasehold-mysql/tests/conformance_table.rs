//! The conformance suite and the shared fault cases (docs/faults.md rows 2, 4, 5, 6, 7, 8, 24) on
//! the MariaDB lease-table store, one private server per case, reached through a fault
//! proxy (blackholed for `make_unreachable`); `forget` clears the lease row's owner from a
//! direct connection; the guard case writes through the MySQL guard; the holder process of
//! the `kill -9` and near-miss cases opens the store straight to the server.

mod common;

use std::sync::Arc;

async fn fixture() -> leasehold_conformance::Fixture {
    common::conformance_fixture(common::Kind::Table).await
}

async fn open(url: String) -> Arc<dyn leasehold_core::Store> {
    common::open_store(common::Kind::Table, url).await
}

leasehold_conformance::conformance_suite!(fixture, backend = Mysql, holder = open);
leasehold_conformance::fault_suite!(fixture, backend = Mysql, holder = open);
