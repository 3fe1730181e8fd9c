//! [`ZkFactory`]: opens a [`ZkStore`] from a URL for a [`leasehold_core::Registry`].

use std::sync::Arc;

use leasehold_core::{OpenFuture, Store, StoreFactory};

use crate::session::ZkStore;

/// Serves the URL scheme `zookeeper`.
///
/// ```
/// # use std::sync::Arc;
/// let mut registry = leasehold_core::Registry::new();
/// registry.register(Arc::new(leasehold_zookeeper::ZkFactory));
/// assert!(registry.schemes().any(|s| s == "zookeeper"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ZkFactory;

impl StoreFactory for ZkFactory {
    fn schemes(&self) -> &[&'static str] {
        &["zookeeper"]
    }

    /// Parses the URL and establishes the session (bounded by the connect timeout), so
    /// that a wrong address is reported by `open`, not by the first lease.
    fn open(&self, url: &str) -> OpenFuture {
        let parsed = crate::ZkConfig::from_url(url);
        Box::pin(async move {
            let store = ZkStore::connect(parsed?).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }
}
