#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config;
mod factory;
mod store;

pub use config::{
    DEFAULT_CHROOT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_SESSION_TIMEOUT,
    MAX_CHROOT_LEN, ZkConfig,
};
pub use factory::ZkFactory;
pub use store::ZkStore;

/// The backend name reported by [`ZkStore`].
pub const BACKEND: &str = "zookeeper";

#[cfg(test)]
mod bounds {
    fn is_send_sync<T: Send + Sync>() {}
    #[test]
    fn bounds() {
        is_send_sync::<super::ZkStore>();
        is_send_sync::<super::ZkConfig>();
        is_send_sync::<super::ZkFactory>();
    }

    fn assert_send<T: Send>(_: &T) {}

    /// The futures callers hold across threads are `Send` (checked at compile time; the
    /// function is never called).
    #[allow(dead_code)]
    fn futures_are_send(config: super::ZkConfig, store: super::ZkStore) {
        use leasehold_core::Store;
        assert_send(&super::ZkStore::open("zookeeper://127.0.0.1:2181"));
        assert_send(&super::ZkStore::connect(config));
        let key = leasehold_core::Key::new("job:x").unwrap();
        let owner = leasehold_core::OwnerToken::random();
        let ttl = std::time::Duration::from_secs(1);
        let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(store);
        assert_send(&store.acquire(&key, &owner, ttl));
        assert_send(&store.renew(&key, &owner, ttl));
        assert_send(&store.release(&key, &owner));
        assert_send(&store.inspect(&key));
        assert_send(&store.wait_released(&key, &owner, ttl));
        assert_send(&store.list("job:"));
        assert_send(&store.break_lease(&key));
    }
}

#[cfg(test)]
mod keys {
    #[test]
    fn keys_become_one_path_component_and_back() {
        for k in ["job:a", "a/b", "..", ".", "x%y z", "ü:é", "a-b_c:9"] {
            let enc = crate::store::encode_key(k);
            assert!(
                !enc.contains('/') && enc != "." && enc != "..",
                "{k} -> {enc}"
            );
            let back = leasehold_core::url::percent_decode(&enc).unwrap();
            assert_eq!(back, k);
        }
    }
}
