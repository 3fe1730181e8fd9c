#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

use std::sync::Arc;

use store::Registry;

// What a user of leases names, at the root; what a store's writer needs, under `store`.
pub use leasehold_core::{
    AcquireStep, Action, Backoff, CancellationToken, ConfigError, Diagnosis, Election, Error,
    Fence, Finding, GuardDecision, Health, HealthChanges, HoldEnd, Idempotency, IntoKey, Key,
    KeyError, Leader, Leadership, Lease, LeaseClient, LeaseClientBuilder, LeaseConfig,
    LeaseConfigBuilder, LeaseInfo, LeaseObserver, LostFuture, LostReason, LostSignal, MAX_KEY_LEN,
    OwnerToken, ParseOwnerTokenError, Permit, Refusal, RenewalEvent, RenewalPhase, ResourceKind,
    ResourceName, ResourceNameError, Semaphore, ShutdownReport, StepCall, Store, StoreError,
    StoreErrorKind, Verdict,
};
pub use leasehold_core::{
    TlsFailure, TlsProblem, clock, config, election, guard, kind, memory, metrics, semaphore, tls,
    wrap,
};

/// For people who write a store: the contract every backend implements and its
/// extensions, the words it speaks, the helpers that give a store without a batch the
/// batch operations, the registry that opens a store from a URL, URL parsing, and the
/// in-memory store. Check a new store with the conformance suite (feature `conformance`).
pub mod store {
    pub use leasehold_core::store::*;
    pub use leasehold_core::{EndedGrants, url};
}

/// The Redis store (`redis://`, `rediss://`, `redis+cluster://`): the
/// [`leasehold-redis`](https://docs.rs/leasehold-redis) crate.
#[cfg(feature = "redis")]
pub use leasehold_redis as redis;

/// The PostgreSQL stores (`postgres://`, `postgres+advisory://`) and guard: the
/// [`leasehold-postgres`](https://docs.rs/leasehold-postgres) crate.
#[cfg(feature = "postgres")]
pub use leasehold_postgres as postgres;

/// The MariaDB/MySQL stores (`mysql://`, `mariadb://`, `mysql+getlock://`) and guard: the
/// [`leasehold-mysql`](https://docs.rs/leasehold-mysql) crate.
#[cfg(feature = "mysql")]
pub use leasehold_mysql as mysql;

/// The embedded SQLite store (`sqlite://`) and guard: the
/// [`leasehold-sqlite`](https://docs.rs/leasehold-sqlite) crate.
#[cfg(feature = "sqlite")]
pub use leasehold_sqlite as sqlite;

/// The etcd store (`etcd://`): the [`leasehold-etcd`](https://docs.rs/leasehold-etcd)
/// crate.
#[cfg(feature = "etcd")]
pub use leasehold_etcd as etcd;

/// The Redlock store over independent Redis servers (`redlock://`): the
/// [`leasehold-redlock`](https://docs.rs/leasehold-redlock) crate.
#[cfg(feature = "redlock")]
pub use leasehold_redlock as redlock;
/// The ZooKeeper store (`zookeeper://`): the
/// [`leasehold-zookeeper`](https://docs.rs/leasehold-zookeeper) crate.
#[cfg(feature = "zookeeper")]
pub use leasehold_zookeeper as zookeeper;

/// The conformance suite every store must pass, for people who write their own store:
/// the [`leasehold-conformance`](https://docs.rs/leasehold-conformance) crate (feature
/// `conformance`, meant for dev-dependencies).
#[cfg(feature = "conformance")]
pub use leasehold_conformance as conformance;

/// A [`Registry`] of every store this build enables (its cargo features), plus the
/// in-memory store (`memory://`).
pub fn registry() -> Registry {
    #[allow(unused_mut)]
    let mut r = Registry::new();
    #[cfg(feature = "redis")]
    r.register(Arc::new(leasehold_redis::RedisFactory));
    #[cfg(feature = "postgres")]
    r.register(Arc::new(leasehold_postgres::PgFactory));
    #[cfg(feature = "mysql")]
    r.register(Arc::new(leasehold_mysql::MySqlFactory));
    #[cfg(feature = "sqlite")]
    r.register(Arc::new(leasehold_sqlite::SqliteFactory));
    #[cfg(feature = "etcd")]
    r.register(Arc::new(leasehold_etcd::EtcdFactory));
    #[cfg(feature = "zookeeper")]
    r.register(Arc::new(leasehold_zookeeper::ZkFactory));
    #[cfg(feature = "redlock")]
    r.register(Arc::new(leasehold_redlock::RedlockFactory));
    r
}

/// Opens the store named by `url`, with any store this build enables: `redis://…`,
/// `postgres://…`, `mysql://…`, `sqlite://…`, `etcd://…`, `zookeeper://…`, `redlock://…`, `memory://` (see each store's URL
/// parameters).
///
/// # Cancel safety
/// Cancel safe: a dropped call leaves no store open.
///
/// # Errors
/// [`StoreErrorKind::Config`] for an unknown or disabled scheme (the message names the
/// cargo feature to enable) or a URL the store refuses; the store's own errors when it
/// cannot be reached.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold::{LeaseClient, LeaseConfig, StoreErrorKind};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // From the configuration: "redis://…", "postgres://…", "sqlite:///var/lib/app/leases.db", …
/// let url = std::env::var("LEASE_STORE").unwrap_or_else(|_| "memory://".into());
/// let client = LeaseClient::new(leasehold::open(&url).await?, LeaseConfig::new(Duration::from_secs(10))?);
/// let lease = client.try_acquire("job:nightly-invoices").await?;
/// lease.release().await?;
///
/// // A store this build leaves out names the feature that brings it.
/// # #[cfg(not(feature = "redis"))] {
/// let err = leasehold::open("redis://127.0.0.1/").await.unwrap_err();
/// assert_eq!(err.kind(), StoreErrorKind::Config);
/// assert!(err.to_string().contains("`redis` feature"));
/// # }
/// # Ok(()) }
/// ```
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let registry = registry();
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if !registry.schemes().any(|s| s == scheme)
        && let Some(feature) = feature_of(scheme)
    {
        return Err(StoreError::new(
            StoreErrorKind::Config,
            "registry",
            format!(
                "the `{scheme}://` store is not in this build: enable the `{feature}` feature of the leasehold crate"
            ),
        ));
    }
    registry.open(url).await
}

/// The cargo feature that brings the store of `scheme`.
fn feature_of(scheme: &str) -> Option<&'static str> {
    Some(match scheme {
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
        | "rediss+sentinel" => "redis",
        "postgres" | "postgresql" | "postgres+advisory" | "postgresql+advisory" => "postgres",
        "mysql" | "mariadb" | "mysql+getlock" | "mariadb+getlock" => "mysql",
        "sqlite" => "sqlite",
        "etcd" => "etcd",
        "zookeeper" => "zookeeper",
        "redlock" => "redlock",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_is_always_there_and_a_disabled_store_names_its_feature() {
        assert!(open("memory://").await.is_ok());
        let err = open("nosuch://x").await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Config);
        #[cfg(not(feature = "redis"))]
        {
            let err = open("redis://127.0.0.1:1/").await.unwrap_err();
            assert!(err.to_string().contains("`redis` feature"), "{err}");
        }
        #[cfg(not(feature = "etcd"))]
        {
            let err = open("etcd://127.0.0.1:1").await.unwrap_err();
            assert!(err.to_string().contains("`etcd` feature"), "{err}");
        }
        #[cfg(not(feature = "zookeeper"))]
        {
            let err = open("zookeeper://127.0.0.1:1/x").await.unwrap_err();
            assert!(err.to_string().contains("`zookeeper` feature"), "{err}");
        }
        #[cfg(not(feature = "redlock"))]
        {
            let err = open("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
                .await
                .unwrap_err();
            assert!(err.to_string().contains("`redlock` feature"), "{err}");
        }
    }

    #[test]
    fn every_scheme_of_every_store_maps_to_its_feature() {
        #[cfg(feature = "full")]
        for scheme in registry().schemes().filter(|s| *s != "memory") {
            assert!(feature_of(scheme).is_some(), "{scheme}");
        }
        assert_eq!(feature_of("postgres+advisory"), Some("postgres"));
        assert_eq!(feature_of("etcd"), Some("etcd"));
        assert_eq!(feature_of("zookeeper"), Some("zookeeper"));
        assert_eq!(feature_of("redlock"), Some("redlock"));
        assert_eq!(feature_of("memory"), None);
    }
}

/// The repository's `README.md`, compiled and run as this crate's doctests
/// (`cargo test -p leasehold --doc`), so its examples cannot drift from the API. Only in
/// doctest builds: never in the documentation or a user's build.
///
/// `src/repository-readme` is a symlink to the repository's README (no `.md` name, so no
/// tool reads it as a second copy of the document, whose relative links resolve from the
/// repository root only); `cargo package` stores the file it points to, so the packaged
/// crate's doctests compile too.
#[cfg(doctest)]
#[doc = include_str!("repository-readme")]
pub struct RepositoryReadme;

/// The repository's `docs/library.md` (the library beyond the README's first program),
/// compiled and run as doctests too, through the symlink `src/library-doc`, as the README.
#[cfg(doctest)]
#[doc = include_str!("library-doc")]
pub struct LibraryGuide;
