//! The shared conformance suite against a private 3-master Redis Cluster, each node
//! reached through its own fault proxy.

mod common;

leasehold_conformance::conformance_suite!(common::cluster_fixture);
