//! Picking a store at run time from a URL.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::{StoreError, StoreErrorKind};
use crate::store::Store;
use crate::store::memory::MemoryStore;

/// The future returned by a [`StoreFactory`].
pub type OpenFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn Store>, StoreError>> + Send>>;

/// Opens stores for the URL schemes it serves. Each backend crate provides one.
pub trait StoreFactory: Send + Sync {
    /// The URL schemes served, e.g. `["redis", "rediss"]`.
    fn schemes(&self) -> &[&'static str];
    /// Opens (connects) a store for `url`. Errors must not contain the URL's credentials.
    fn open(&self, url: &str) -> OpenFuture;
}

/// A set of [`StoreFactory`]s by URL scheme; [`open`](Self::open) picks one at run time.
///
/// The core knows no backend but the in-memory one (`memory://`, a new empty store per
/// call); applications register the backends they link. (The `leasehold` crate's
/// `registry()` and `open()` register every backend its features enable.)
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use leasehold_core::Registry;
///
/// let mut registry = Registry::new();
/// // registry.register(Arc::new(leasehold_sqlite::SqliteFactory)); // and so on, per backend
/// assert_eq!(registry.schemes().collect::<Vec<_>>(), ["memory"]);
/// ```
#[derive(Clone)]
pub struct Registry {
    factories: BTreeMap<&'static str, Arc<dyn StoreFactory>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("schemes", &self.factories.keys().collect::<Vec<_>>())
            .finish()
    }
}

struct MemoryFactory;

impl StoreFactory for MemoryFactory {
    fn schemes(&self) -> &[&'static str] {
        &["memory"]
    }
    fn open(&self, _url: &str) -> OpenFuture {
        Box::pin(async { Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>) })
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// A registry that knows `memory://`.
    pub fn new() -> Self {
        let mut r = Self {
            factories: BTreeMap::new(),
        };
        r.register(Arc::new(MemoryFactory));
        r
    }

    /// Adds (or replaces) the factory for each of its schemes.
    pub fn register(&mut self, factory: Arc<dyn StoreFactory>) -> &mut Self {
        for scheme in factory.schemes() {
            self.factories.insert(scheme, factory.clone());
        }
        self
    }

    /// The schemes known.
    pub fn schemes(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.factories.keys().copied()
    }

    /// Opens the store that `url` names.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped open leaves nothing behind but a connection being closed.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for a URL without a scheme or with an unknown scheme (the
    /// message names only the scheme, never the rest of the URL); whatever the factory
    /// returns otherwise.
    ///
    /// # Examples
    ///
    /// `open` is a method: make (or share) a registry, then open URLs with it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{LeaseClient, LeaseConfig, Registry, StoreErrorKind};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = Registry::new();
    /// let url = std::env::var("LEASE_STORE").unwrap_or_else(|_| "memory://".into());
    /// let store = registry.open(&url).await?;
    /// let client = LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(10))?);
    /// # let _ = client;
    ///
    /// // An unknown scheme is a configuration error that never echoes the URL's secrets.
    /// let err = registry.open("nosuch://user:s3cret@host/").await.unwrap_err();
    /// assert_eq!(err.kind(), StoreErrorKind::Config);
    /// assert!(!err.to_string().contains("s3cret"));
    /// # Ok(()) }
    /// ```
    pub async fn open(&self, url: &str) -> Result<Arc<dyn Store>, StoreError> {
        let scheme = url
            .split_once("://")
            .map(|(s, _)| s)
            .filter(|s| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            })
            .ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::Config,
                    "registry",
                    "store URL must look like scheme://…",
                )
            })?;
        let factory = self.factories.get(scheme).ok_or_else(|| {
            let known: Vec<_> = self.schemes().collect();
            StoreError::new(
                StoreErrorKind::Config,
                "registry",
                format!(
                    "unknown store URL scheme `{scheme}`; known: {}",
                    known.join(", ")
                ),
            )
        })?;
        factory.open(url).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn open_by_scheme_and_never_echo_credentials() {
        let r = Registry::new();
        assert_eq!(r.open("memory://").await.unwrap().backend(), "memory");
        let e = r.open("nope://user:s3cr3t@host/").await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config);
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
        assert!(!format!("{e:?}").contains("s3cr3t"));
        let e = r.open("user:s3cr3t@host").await.unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }
}
