#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod auth; // digest authentication and the ACL of every node created
mod config; // the `zookeeper://` URL and settings
mod doctor; // `Store::diagnose`: the ensemble held against docs/guarantees.md
mod error; // ZooKeeper client errors as `StoreError`s
mod factory; // `StoreFactory`
mod paths; // node paths: key directories, queue nodes, records
mod records; // `put_record` / `get_record`
mod session; // `ZkStore` itself: its session, how much of its timeout a grant may use
mod store; // `Store` (and `BatchStore`) for `ZkStore`
mod tls; // TLS options from the URL's files; `TlsFailure`
mod wait; // `WaitStore`: a place in the key's queue
mod watch; // `WatchStore`: change notices

pub use config::{
    DEFAULT_CHROOT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_SESSION_TIMEOUT,
    MAX_CHROOT_LEN, ZkConfig,
};
pub use factory::ZkFactory;
pub use session::ZkStore;
pub use tls::{TlsFailure, TlsProblem};

/// The backend name reported by [`ZkStore`].
pub const BACKEND: &str = "zookeeper";

#[cfg(test)]
leasehold_conformance::send_sync!(
    [ZkStore, ZkConfig, ZkFactory],
    fn(config: ZkConfig) {
        ZkStore::open("zookeeper://127.0.0.1:2181");
        ZkStore::connect(config)
    }
);

#[cfg(test)]
mod keys {
    #[test]
    fn keys_become_one_path_component_and_back() {
        for k in ["job:a", "a/b", "..", ".", "x%y z", "ü:é", "a-b_c:9"] {
            let enc = crate::paths::encode_key(k);
            assert!(
                !enc.contains('/') && enc != "." && enc != "..",
                "{k} -> {enc}"
            );
            let back = leasehold_core::url::percent_decode(&enc).unwrap();
            assert_eq!(back, k);
        }
    }

    /// No key's directory is the records directory; an earlier client's `list` reads that
    /// name as the key `.records`, whose lease directory is another node.
    #[test]
    fn the_records_directory_is_no_key_directory() {
        let dir = crate::paths::RECORDS_DIR;
        let as_key = leasehold_core::url::percent_decode(dir).unwrap();
        assert_eq!(as_key, ".records");
        assert_eq!(crate::paths::encode_key(&as_key), "%2Erecords");
        assert_ne!(crate::paths::encode_key(&as_key), dir);
    }
}
