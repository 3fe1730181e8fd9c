#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod batch; // concurrent operations sent as one script call per slot
mod clocks; // the replicas' clock offsets (Sentinel)
mod config; // the `redis://` URLs and settings
mod conn; // the connection, replaced after an error
mod discovery; // a client for one node, and the primary found through the sentinels
mod doctor; // `Store::diagnose`: settings held against docs/guarantees.md
mod error; // redis errors as `StoreError`s
mod factory; // `StoreFactory`
mod keys; // the key layout: prefix, hash tag, escaping
mod notify; // the pub/sub connection waiters and watchers share
mod policy; // the server's `maxmemory-policy`
pub mod records; // `put_record` / `get_record` scripts
mod scripts; // the Lua scripts, one per operation
mod store; // `RedisStore`, its `Store` impl and its batch, wait and watch extensions
pub mod tls; // `TlsFailure`, and clients over TLS (shared with Redlock)
pub mod wire; // the store format Redis and Redlock share

pub use config::{
    DEFAULT_CLOCK_CHECK, DEFAULT_CLUSTER_RETRIES, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FENCE_RETENTION,
    DEFAULT_MAX_CLOCK_OFFSET, DEFAULT_OP_TIMEOUT, DEFAULT_POLICY_CHECK, DEFAULT_QUEUE_GRACE,
    MAX_CLOCK_OFFSET, MAX_FENCE_RETENTION, MAX_MASTER_NAME_LEN, MAX_MIN_REPLICAS, NodeAddr,
    RedisConfig, RedisConfigBuilder, SentinelAuth, TlsSettings, Topology,
};
pub use error::{Cause, ClockOffset, EvictingPolicy};
pub use factory::RedisFactory;
pub use keys::{DEFAULT_PREFIX, MAX_PREFIX_LEN};
pub use scripts::STORE_FORMAT;
pub use store::{RedisStore, WATCH_MARK_TTL, WATCH_REFRESH};
pub use tls::{TlsFailure, TlsProblem};

/// The backend name reported by [`RedisStore`] (single server and Cluster alike).
pub const BACKEND: &str = "redis";

#[cfg(test)]
leasehold_conformance::send_sync!(
    [RedisStore, RedisConfig, RedisFactory],
    fn(config: RedisConfig) {
        RedisStore::open("redis://127.0.0.1/");
        RedisStore::connect(config)
    }
);
