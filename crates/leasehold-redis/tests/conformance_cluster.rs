//! The shared conformance suite and the shared fault cases (docs/faults.md rows 2, 4, 5, 6, 7, 8,
//! 24) against a private 3-master Redis Cluster, each node reached through its own fault
//! proxy (every fault is applied to all of them; row 4 freezes every node).

mod common;

leasehold_conformance::conformance_suite!(
    common::cluster_fixture,
    backend = RedisCluster,
    holder = common::open_store
);
leasehold_conformance::fault_suite!(
    common::cluster_fixture,
    backend = RedisCluster,
    holder = common::open_store
);
