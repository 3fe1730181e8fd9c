#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config; // the `redlock://` URL and settings
mod doctor; // `Store::diagnose`: the nodes held against docs/guarantees.md
mod factory; // `StoreFactory`
mod node; // one node of the set: its connection and errors
mod scripts; // the Lua scripts run on each node
mod store; // `RedlockStore` and its `Store` impl

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_DRIFT_MIN, DEFAULT_NODE_TIMEOUT,
    DEFAULT_PREFIX, MAX_NODES, MAX_PREFIX_LEN, MIN_NODES, Node, RedlockConfig, TlsSettings,
};
pub use factory::RedlockFactory;
pub use leasehold_redis::{TlsFailure, TlsProblem};
pub use store::RedlockStore;

/// The backend name reported by [`RedlockStore`].
pub const BACKEND: &str = "redlock";

#[cfg(test)]
leasehold_conformance::send_sync!(
    [RedlockStore, RedlockConfig, RedlockFactory],
    fn(config: RedlockConfig) {
        RedlockStore::open("redlock://h:1,h:2,h:3");
        RedlockStore::connect(config)
    }
);

#[cfg(test)]
mod debug {
    #[test]
    fn debug_never_shows_the_password() {
        let c = super::RedlockConfig::from_url("redlock://u:sentinel-pw@h:1,h:2,h:3").unwrap();
        let store = super::RedlockStore::new(c).unwrap();
        let shown = format!("{store:?}");
        assert!(!shown.contains("sentinel-pw"), "{shown}");
    }
}
