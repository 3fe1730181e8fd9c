//! [`SqliteFactory`]: opens a [`SqliteStore`] from a URL for a [`leasehold_core::Registry`].

use std::sync::Arc;

use leasehold_core::{OpenFuture, Store, StoreFactory};

use crate::config::SqliteConfig;
use crate::store::SqliteStore;

/// Serves the URL scheme `sqlite` (see [`SqliteConfig::from_url`]).
///
/// ```
/// # use std::sync::Arc;
/// let mut registry = leasehold_core::Registry::new();
/// registry.register(Arc::new(leasehold_sqlite::SqliteFactory));
/// assert!(registry.schemes().any(|s| s == "sqlite"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SqliteFactory;

impl StoreFactory for SqliteFactory {
    fn schemes(&self) -> &[&'static str] {
        &["sqlite"]
    }

    /// Parses the URL, opens (creating if missing) the file and its tables, so that a bad
    /// path is reported by `open`, not by the first lease.
    fn open(&self, url: &str) -> OpenFuture {
        let parsed = SqliteConfig::from_url(url);
        Box::pin(async move {
            let store = SqliteStore::connect(parsed?).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }
}
