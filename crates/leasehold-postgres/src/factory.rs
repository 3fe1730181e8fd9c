//! Opening the PostgreSQL stores from a URL through [`leasehold_core::Registry`].

use std::sync::Arc;

use leasehold_core::{OpenFuture, Store, StoreFactory};

use crate::config::PgConfig;
use crate::{PgAdvisoryStore, PgLeaseStore};

/// The [`StoreFactory`] of both PostgreSQL stores:
///
/// | URL scheme | store |
/// | --- | --- |
/// | `postgres://`, `postgresql://` | [`PgLeaseStore`] (lease table) |
/// | `postgres+advisory://`, `postgresql+advisory://` | [`PgAdvisoryStore`] (session advisory locks) |
///
/// The rest of the URL is [`PgConfig`]'s: `user:password@host:port/database`, sqlx's
/// parameters, and `leasehold_schema`, `leasehold_table`, `leasehold_pool_size`,
/// `leasehold_migrate=true` (create the table on open).
///
/// ```no_run
/// # async fn demo() -> Result<(), leasehold_core::StoreError> {
/// let mut registry = leasehold_core::Registry::new();
/// registry.register(std::sync::Arc::new(leasehold_postgres::PgFactory));
/// let store = registry.open("postgres://app@db/leases?leasehold_schema=locks").await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PgFactory;

impl StoreFactory for PgFactory {
    fn schemes(&self) -> &[&'static str] {
        &[
            "postgres",
            "postgresql",
            "postgres+advisory",
            "postgresql+advisory",
        ]
    }

    fn open(&self, url: &str) -> OpenFuture {
        let parsed = PgConfig::from_url(url);
        let advisory =
            url.starts_with("postgres+advisory:") || url.starts_with("postgresql+advisory:");
        Box::pin(async move {
            let config = parsed?;
            if advisory {
                let store = PgAdvisoryStore::connect(&config).await?;
                if config.get_migrate_on_open() {
                    store.migrate().await?;
                }
                Ok(Arc::new(store) as Arc<dyn Store>)
            } else {
                let store = PgLeaseStore::connect(&config).await?;
                if config.get_migrate_on_open() {
                    store.migrate().await?;
                }
                Ok(Arc::new(store) as Arc<dyn Store>)
            }
        })
    }
}
