#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config;
mod factory;
mod store;

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_PREFIX, EtcdConfig, MAX_PREFIX_LEN,
};
pub use factory::EtcdFactory;
pub use store::EtcdStore;

/// The backend name reported by [`EtcdStore`].
pub const BACKEND: &str = "etcd";

#[cfg(test)]
mod bounds {
    fn is_send_sync<T: Send + Sync>() {}
    #[test]
    fn bounds() {
        is_send_sync::<super::EtcdStore>();
        is_send_sync::<super::EtcdConfig>();
        is_send_sync::<super::EtcdFactory>();
    }

    fn assert_send<T: Send>(_: &T) {}

    /// The futures callers hold across threads are `Send` (checked at compile time; the
    /// function is never called).
    #[allow(dead_code)]
    fn futures_are_send(config: super::EtcdConfig, store: super::EtcdStore) {
        use leasehold_core::Store;
        assert_send(&super::EtcdStore::open("etcd://127.0.0.1:2379"));
        assert_send(&super::EtcdStore::connect(config));
        let key = leasehold_core::Key::new("job:x").unwrap();
        let owner = leasehold_core::OwnerToken::random();
        let ttl = std::time::Duration::from_secs(1);
        let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(store);
        assert_send(&store.acquire(&key, &owner, ttl));
        assert_send(&store.renew(&key, &owner, ttl));
        assert_send(&store.release(&key, &owner));
        assert_send(&store.inspect(&key));
        assert_send(&store.list("job:"));
        assert_send(&store.break_lease(&key));
    }
}
