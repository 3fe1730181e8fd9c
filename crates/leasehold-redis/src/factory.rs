//! [`RedisFactory`]: opens a [`RedisStore`] from a URL for a [`leasehold_core::Registry`].

use std::sync::Arc;

use leasehold_core::{OpenFuture, Store, StoreFactory};

use crate::store::RedisStore;

/// Serves the URL schemes `redis`, `rediss`, `redis+cluster`, `rediss+cluster`,
/// `redis+sentinel` and `rediss+sentinel`.
///
/// ```
/// # use std::sync::Arc;
/// let mut registry = leasehold_core::Registry::new();
/// registry.register(Arc::new(leasehold_redis::RedisFactory));
/// assert!(registry.schemes().any(|s| s == "redis+cluster"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisFactory;

impl StoreFactory for RedisFactory {
    fn schemes(&self) -> &[&'static str] {
        &[
            "redis",
            "rediss",
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
        ]
    }

    /// Parses the URL and connects (bounded by the connect timeout), so that a wrong
    /// address or password is reported by `open`, not by the first lease.
    fn open(&self, url: &str) -> OpenFuture {
        let parsed = crate::RedisConfig::from_url(url);
        Box::pin(async move {
            let store = RedisStore::connect(parsed?).await?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }
}
