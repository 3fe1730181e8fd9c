//! [`RedlockFactory`]: opens a [`RedlockStore`] from a URL for a [`leasehold_core::Registry`].

use std::sync::Arc;

use leasehold_core::{OpenFuture, Store, StoreFactory};

use crate::store::RedlockStore;

/// Serves the URL scheme `redlock`.
///
/// ```
/// # use std::sync::Arc;
/// let mut registry = leasehold_core::Registry::new();
/// registry.register(Arc::new(leasehold_redlock::RedlockFactory));
/// assert!(registry.schemes().any(|s| s == "redlock"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RedlockFactory;

impl StoreFactory for RedlockFactory {
    fn schemes(&self) -> &[&'static str] {
        &["redlock"]
    }

    /// Parses the URL and connects to a majority of the nodes (bounded by the connect
    /// timeout), so that a wrong address or password is reported by `open`.
    fn open(&self, url: &str) -> OpenFuture {
        let parsed = crate::RedlockConfig::from_url(url);
        Box::pin(async move {
            let store = RedlockStore::connect(parsed?).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }
}
