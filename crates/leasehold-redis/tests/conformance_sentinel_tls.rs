//! The shared conformance suite against a primary and replica found through three
//! sentinels over TLS only (`rediss+sentinel://`: sentinels, data servers and replication
//! listen with TLS and on no plaintext port), each data server behind a fault proxy that
//! passes the TLS bytes; the holder process opens the store from its URL. The full tier:
//! `scripts/test --full` runs it (docs/connections.md).

mod common;

leasehold_conformance::conformance_suite!(
    common::sentinel_tls_fixture,
    backend = Redis,
    holder = common::open_store,
    ignore = "full tier: conformance over Sentinel TLS"
);
