//! # leasehold-redis
//!
//! A [`leasehold_core::Store`] on Redis (one server) or Redis Cluster: [`RedisStore`], configured
//! by [`RedisConfig`] (from a URL or a builder), and [`RedisFactory`] for a
//! [`leasehold_core::Registry`].
//!
//! ```no_run
//! # use std::{sync::Arc, time::Duration};
//! # use leasehold_core::{LeaseClient, LeaseConfig};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = leasehold_redis::RedisStore::open("redis://127.0.0.1:6379/?prefix=billing:").await?;
//! let client = LeaseClient::new(Arc::new(store), LeaseConfig::new(Duration::from_secs(10))?);
//! let lease = client.acquire("job:nightly-invoices", Duration::from_secs(30)).await?;
//! // ... pass lease.fence() with every protected write ...
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## URLs
//!
//! ```text
//! redis://[user[:password]@]host[:port][/db][?param=value&...]
//! rediss://[user[:password]@]host[:port][/db][?...]                 TLS
//! redis+cluster://[user[:password]@]host1[:port1],host2[:port2],...[/][?...]
//! rediss+cluster://...                                               Cluster over TLS
//! ```
//!
//! The port defaults to 6379, the database to 0 (a Cluster has database 0 only). User
//! name and password are percent-decoded. IPv6 hosts go in brackets (`[::1]:6379`).
//! Parameters:
//!
//! | parameter | default | meaning |
//! | --- | --- | --- |
//! | `prefix` | `leasehold:` | namespace prefix of every key and channel; no `{}`, glob characters, whitespace or control characters; ≤ 128 bytes |
//! | `timeout` | `5s` | bound on each operation, connecting included (`500ms`, `2s`, `1m`, or a number of ms) |
//! | `connect_timeout` | `2s` | bound on establishing a connection |
//! | `notify` | `true` | publish releases and let waiters subscribe (`false`: `wait_released` is unsupported) |
//! | `allow_eviction` | `false` | accept a server whose `maxmemory-policy` may evict keys (see "Eviction"): opens with a warning and [`Capabilities::may_evict`](leasehold_core::Capabilities::may_evict); exclusion is then not guaranteed |
//! | `policy_check` | `10s` | how often the eviction policy is read again on a connection already checked |
//! | `cluster_retries` | `6` | cluster only: retries on `MOVED`/`ASK`/`TRYAGAIN` within one operation |
//! | `tls_ca` | system roots | TLS only: PEM file of the CA(s) to trust |
//! | `tls_cert`, `tls_key` | none | TLS only: PEM files of a client certificate and key (mutual TLS) |
//!
//! Unknown parameters are rejected (a typo must not silently fall back to a default). TLS
//! certificates are always verified (there is no `#insecure`). The password never appears
//! in `Debug`, `Display`, errors or logs: [`RedisConfig`]'s `Display` prints the URL with
//! `<redacted>` in its place, and error texts from the server or the client library are
//! scrubbed of it.
//!
//! ## Keys
//!
//! For a lease key `k` and prefix `p`, the lease is the string `p{e}` and the fence counter
//! the string `p{e}:fence`, where `e` is `k` with `%`, `{`, `}` percent-encoded. Both share
//! the hash tag `e`, so every script touches one Cluster slot whatever `k` looks like
//! (`{a}x`, `}`, `a}{b}`...). Release notifications go to the channel `p{e}:released`.
//! The lease value is `<owner as 32 hex digits>:<fence>`, with a `PX` expiry; the fence key
//! holds the last fence issued and never expires (one small key per lease name ever used).
//!
//! ## Operations
//!
//! One Lua script per operation, sent with `EVALSHA` and loaded on `NOSCRIPT`:
//! acquire (free: fence = `max(last + 1, TIME in µs)`, `SET` lease `PX ttl`, `SET` fence;
//! same owner: `PEXPIRE`, same fence; held: the remaining `PTTL`), renew
//! (compare-and-`PEXPIRE`), release (compare-and-`DEL`, then `PUBLISH`), inspect (`GET` +
//! `PTTL`), break (`DEL`, advance the fence, `PUBLISH`). Listing uses `SCAN MATCH` (on every
//! primary of a Cluster, found with `CLUSTER SLOTS`) and one inspect per lease.
//!
//! A lease key holding anything else than `<32 lowercase hex>:<fence>` with an expiry — a
//! list, a hash, another string, a key without TTL — and a fence key holding anything else
//! than a positive integer below 2^53 are reported as [`leasehold_core::StoreErrorKind::Corrupt`],
//! never treated as free and never overwritten. (`SET NX` on a list answers nil, not
//! `WRONGTYPE`; the scripts read with `GET`, which does fail on a list, and check the type.)
//!
//! Every script echoes a per-request id that the store checks, so a reply is never taken
//! for another request's reply; a connection on which a request timed out, failed or was
//! cancelled by its caller in flight is dropped and the next call connects afresh (this is
//! why the store keeps its own connection holder rather than
//! `redis::aio::ConnectionManager`, which keeps using a connection whose request timed
//! out).
//!
//! ## Errors
//!
//! | cause | kind |
//! | --- | --- |
//! | connection refused, connect timeout, connect I/O error | `Unavailable` (nothing was sent) |
//! | no reply within the operation timeout | `Timeout` (may have been applied) |
//! | connection broken after sending, reply for another request | `Ambiguous` (may have been applied) |
//! | `LOADING`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`, `BUSY`, `OOM`, `MISCONF` | `Busy` |
//! | `NOAUTH`, `WRONGPASS`, authentication failure, `NOPERM`, bad URL, TLS handshake failure | `Config` |
//! | an evicting `maxmemory-policy` (source: [`EvictingPolicy`]), `INFO` not allowed, no policy in `INFO` | `Config` |
//! | a TTL outside 10 ms ..= 24 h (checked before anything is sent) | `InvalidInput` |
//! | wrong type or bad value at the lease or fence key | `Corrupt` |
//!
//! ## Fences and the failure model
//!
//! Fences are floored at the server's clock: `fence = max(last + 1, TIME in µs)`
//! ([`leasehold_core::FenceDurability::ClockFloored`]), so they are large numbers (about 1.8e15
//! today). They never go down while Redis keeps its data. When Redis loses the fence key —
//! a restart without persistence, `kill -9` before the append-only file was synced, a
//! replica promoted before it received the last writes — the next fence is still above
//! every fence issued before, **unless the server's clock moved back by more than the time
//! the failure took** (from the last grant before the loss to the first grant after it).
//! A lease itself does not survive such a loss: the holder's next renewal answers
//! `NotOwner` and its lost signal fires, and anybody can acquire at once — two holders may
//! then overlap in time, which is why the protected storage must check the fence (the
//! guard). Redis expires keys by its wall clock; a server paused longer than a TTL expires
//! the lease when it resumes, never later; the holder gives the lease up at its local
//! deadline before that.
//!
//! ## Eviction
//!
//! Under any `maxmemory-policy` but `noeviction` Redis may delete a held lease key before
//! its TTL (`volatile-*` evict keys with a TTL, as every lease key has; `allkeys-*` any
//! key) and a second holder then acquires while the first still holds it by its own
//! clock. Fence keys have no TTL: `volatile-*` never evict them, and a fence key evicted
//! by an `allkeys-*` policy is a data loss as above (the next fence is floored at the
//! server's clock: fences do not go back). The store therefore reads `maxmemory_policy`
//! with `INFO memory` on every new connection (when opening and after every reconnect), on
//! every primary of a Cluster, and again once the last check is older than `policy_check`,
//! and refuses any policy but `noeviction` with a [`StoreErrorKind::Config`] error whose
//! source is an [`EvictingPolicy`], unless the URL accepts eviction with
//! `allow_eviction=true` (a warning is logged and
//! [`Capabilities::may_evict`](leasehold_core::Capabilities::may_evict) is set). A user that may
//! not run `INFO` is refused too (fail closed). A refusal after a reconnect fails every
//! operation, renewals included, so a held lease is lost by its deadline.
//!
//! [`StoreErrorKind::Config`]: leasehold_core::StoreErrorKind::Config
//!
//! ## Cluster
//!
//! `redis+cluster://` uses the `redis` crate's async cluster client: it discovers the
//! topology with `CLUSTER SLOTS`, follows `MOVED` and `ASK` redirections (and retries
//! `TRYAGAIN`, answered for a two-key script while its slot is half migrated), so a lease
//! whose slot is migrated while held keeps working: renew, release and the next acquire
//! reach the new owner of the slot, with the same owner and fence. Release notifications
//! use classic pub/sub, which Redis Cluster delivers on every node.
//!
//! ## Least privilege
//!
//! Everything works for an ACL user limited to the prefix and these commands (Redis 7
//! checks the commands a script runs too; `+info` reads the eviction policy); on a Cluster
//! add `+cluster|slots +ping`:
//!
//! ```text
//! ACL SETUSER leasehold on >CHANGE-ME resetkeys ~leasehold:* resetchannels &leasehold:* -@all +evalsha +script|load +get +set +pexpire +pttl +del +time +publish +subscribe +unsubscribe +scan +info
//! ```
//!
//! ## Cancel safety
//!
//! Every operation can be dropped at any await: nothing is left half done on the client
//! side. A request already sent may still be applied by the server, which the lease
//! client handles as an ambiguous reply (a retry with the same owner returns the same
//! fence).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config;
mod conn;
mod error;
mod factory;
mod keys;
mod notify;
mod policy;
mod scripts;
mod store;

pub use config::{
    DEFAULT_CLUSTER_RETRIES, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_POLICY_CHECK,
    NodeAddr, RedisConfig, RedisConfigBuilder, TlsSettings, Topology,
};
pub use error::{Cause, EvictingPolicy};
pub use factory::RedisFactory;
pub use keys::{DEFAULT_PREFIX, MAX_PREFIX_LEN};
pub use scripts::source as script_source;
pub use store::RedisStore;

/// The backend name reported by [`RedisStore`] (single server and Cluster alike).
pub const BACKEND: &str = "redis";

#[cfg(test)]
mod bounds {
    fn is_send_sync<T: Send + Sync>() {}
    #[test]
    fn bounds() {
        is_send_sync::<super::RedisStore>();
        is_send_sync::<super::RedisConfig>();
        is_send_sync::<super::RedisFactory>();
    }
}
