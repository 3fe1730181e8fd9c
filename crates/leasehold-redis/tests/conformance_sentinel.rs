//! The shared conformance suite and the shared fault cases (docs/faults.md rows 2, 4, 5, 6, 7, 8,
//! 24) against a private primary and replica found through three sentinels
//! (`redis+sentinel://`), each data server behind a fault proxy; the holder process of the
//! `kill -9` and near-miss cases opens the store from its URL.

mod common;

leasehold_conformance::conformance_suite!(
    common::sentinel_fixture,
    backend = Redis,
    holder = common::open_store
);
leasehold_conformance::fault_suite!(
    common::sentinel_fixture,
    backend = Redis,
    holder = common::open_store
);
