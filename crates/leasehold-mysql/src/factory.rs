//! [`MySqlFactory`]: opens a MariaDB/MySQL store from a URL for a [`leasehold_core::Registry`].

use std::sync::Arc;

use leasehold_core::{OpenFuture, Store, StoreFactory};

use crate::config::MySqlConfig;
use crate::getlock::MySqlGetLockStore;
use crate::store::MySqlLeaseStore;

/// Serves `mysql://` and `mariadb://` ([`MySqlLeaseStore`], the lease table) and
/// `mysql+getlock://` and `mariadb+getlock://` ([`MySqlGetLockStore`], `GET_LOCK`
/// sessions). See [`MySqlConfig::from_url`] for the rest of the URL.
///
/// ```
/// # use std::sync::Arc;
/// let mut registry = leasehold_core::Registry::new();
/// registry.register(Arc::new(leasehold_mysql::MySqlFactory));
/// assert!(registry.schemes().any(|s| s == "mysql+getlock"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MySqlFactory;

impl StoreFactory for MySqlFactory {
    fn schemes(&self) -> &[&'static str] {
        &["mysql", "mariadb", "mysql+getlock", "mariadb+getlock"]
    }

    /// Parses the URL and connects (checking or creating the tables), so that a wrong
    /// address or password is reported by `open`, not by the first lease.
    fn open(&self, url: &str) -> OpenFuture {
        let getlock = url
            .split_once("://")
            .is_some_and(|(scheme, _)| scheme.ends_with("+getlock"));
        let parsed = MySqlConfig::from_url(url);
        Box::pin(async move {
            let config = parsed?;
            Ok(if getlock {
                Arc::new(MySqlGetLockStore::connect(config).await?) as Arc<dyn Store>
            } else {
                Arc::new(MySqlLeaseStore::connect(config).await?) as Arc<dyn Store>
            })
        })
    }
}
