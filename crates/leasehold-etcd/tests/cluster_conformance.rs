//! The shared conformance suite and the shared fault cases against a private
//! three-member etcd cluster, each member reached through its own fault proxy; the holder
//! process of the `kill -9` and near-miss cases opens it from the URL listing all three
//! members.

mod common;

leasehold_conformance::conformance_suite!(
    common::cluster_fixture,
    backend = Etcd,
    holder = common::open_store
);
leasehold_conformance::fault_suite!(
    common::cluster_fixture,
    backend = Etcd,
    holder = common::open_store
);
