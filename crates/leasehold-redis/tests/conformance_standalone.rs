//! The shared conformance suite against a private standalone `redis-server`, reached
//! through a fault proxy.

mod common;

leasehold_conformance::conformance_suite!(common::standalone_fixture);
