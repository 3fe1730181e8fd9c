#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config; // the `etcd://` URL and settings
mod conn; // `EtcdStore` itself: its client, etcd lease calls, lease key values
mod doctor; // `Store::diagnose`: the cluster held against docs/guarantees.md
mod error; // etcd client errors as `StoreError`s
mod factory; // `StoreFactory`
mod records; // `put_record` / `get_record`
mod store; // `Store` for `EtcdStore`
mod tls; // TLS options from the URL's files, `TlsFailure`
mod wait; // `WaitStore`: the waiting queue
mod watch; // `WatchStore`: change notices

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_PREFIX, EtcdConfig, MAX_PREFIX_LEN,
};
pub use conn::EtcdStore;
pub use factory::EtcdFactory;
pub use tls::{TlsFailure, TlsProblem};

/// The backend name reported by [`EtcdStore`].
pub const BACKEND: &str = "etcd";

#[cfg(test)]
leasehold_conformance::send_sync!(
    [EtcdStore, EtcdConfig, EtcdFactory],
    fn(config: EtcdConfig) {
        EtcdStore::open("etcd://127.0.0.1:2379");
        EtcdStore::connect(config)
    }
);
