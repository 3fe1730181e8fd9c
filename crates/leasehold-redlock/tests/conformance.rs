//! The shared conformance suite and the shared fault cases (docs/faults.md rows 2, 4, 5, 6, 7, 8,
//! 24) against three private Redis servers, each reached through a fault proxy; the
//! holder process of the `kill -9` and near-miss cases opens the set from its URL.

mod common;

leasehold_conformance::conformance_suite!(
    common::fixture,
    backend = Redlock,
    holder = common::open_store
);
leasehold_conformance::fault_suite!(
    common::fixture,
    backend = Redlock,
    holder = common::open_store
);
