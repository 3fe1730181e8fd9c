//! [`EtcdFactory`]: opens an [`EtcdStore`] from a URL for a [`leasehold_core::Registry`].

use std::sync::Arc;

use leasehold_core::{OpenFuture, Store, StoreFactory};

use crate::conn::EtcdStore;

/// Serves the URL scheme `etcd`.
///
/// ```
/// # use std::sync::Arc;
/// let mut registry = leasehold_core::Registry::new();
/// registry.register(Arc::new(leasehold_etcd::EtcdFactory));
/// assert!(registry.schemes().any(|s| s == "etcd"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct EtcdFactory;

impl StoreFactory for EtcdFactory {
    fn schemes(&self) -> &[&'static str] {
        &["etcd"]
    }

    /// Parses the URL and connects (bounded by the connect and operation timeouts), so
    /// that a wrong address or password is reported by `open`, not by the first lease.
    fn open(&self, url: &str) -> OpenFuture {
        let parsed = crate::EtcdConfig::from_url(url);
        Box::pin(async move {
            let store = EtcdStore::connect(parsed?).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }
}
