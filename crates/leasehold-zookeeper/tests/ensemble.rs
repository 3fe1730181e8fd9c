//! The shared conformance suite and the shared fault cases against a private three-member
//! ZooKeeper ensemble, reached through a fault proxy per member.

mod common;

leasehold_conformance::conformance_suite!(
    common::ensemble_fixture,
    backend = Zookeeper,
    holder = common::open_store
);
leasehold_conformance::fault_suite!(
    common::ensemble_fixture,
    backend = Zookeeper,
    holder = common::open_store
);
