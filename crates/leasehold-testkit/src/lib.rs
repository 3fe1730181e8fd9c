//! Test support for leasehold backend suites.
//!
//! * Private servers, each started as a direct child of the test process on
//!   its own port and temporary directory, and killed on drop:
//!   [`RedisServer`], [`RedisCluster`], [`Postgres`], [`PgBouncer`], [`MariaDb`],
//!   [`EtcdServer`], [`EtcdCluster`], [`ZkServer`], [`ZkEnsemble`].
//! * [`tls`]: a private CA and certificates made at test time ([`TlsFiles`]), for
//!   [`Postgres`], [`MariaDb`], [`EtcdServer`], the Redis servers ([`RedisOptions::tls`],
//!   [`RedisCluster::start_tls`], [`RedisSentinelSet::start_tls`]) and ZooKeeper
//!   ([`ZkServer::start_tls`], [`ZkEnsemble::start_tls`]) started with TLS required.
//! * [`FaultProxy`]: a TCP proxy that delays, drops replies, blackholes or
//!   resets connections ([`ProxyMode`]).
//! * [`WorkerProcess`]: run a worker as its own OS process, read its stdout
//!   line by line, pause it with `SIGSTOP`, kill it.
//! * [`FakeWallClock`]: step the wall clock of one child process (libfaketime).
//! * [`free_port`] / [`free_port_with_bus`].
//! * [`proof`]: a guarantee test's tag (the store and fault it proves), checked against
//!   the faults the test kit saw it inject.
//!
//! Setup failures panic with a clear message; a missing server binary panics
//! with "X not found: install package Y" (tests never skip silently).
//!
//! The server types are synchronous (they shell out to `redis-cli`, `psql`,
//! ...): from an async test, call them directly during setup or through
//! `tokio::task::spawn_blocking` when the runtime must keep running.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold_testkit::{FaultProxy, ProxyMode, RedisServer, WorkerProcess};
//!
//! let redis = RedisServer::start();
//! let proxy = FaultProxy::start(redis.addr());
//! // Point the client under test at the proxy ...
//! let url = format!("redis://{}/", proxy.addr());
//! # let _ = url;
//! // ... then break the network, or the server.
//! proxy.set_mode(ProxyMode::DropReplies);
//! redis.pause();
//! redis.resume();
//!
//! let mut cmd = std::process::Command::new("my-worker");
//! cmd.arg(redis.url());
//! let worker = WorkerProcess::spawn(cmd);
//! worker.wait_for_line(|l| l.starts_with("acquired"), Duration::from_secs(30));
//! worker.pause(); // a GC pause longer than the TTL
//! ```
#![forbid(unsafe_code)]

mod cluster;
mod etcd;
mod etcd_cluster;
mod faketime;
mod mariadb;
mod pgbouncer;
mod port;
mod postgres;
mod process;
pub mod proof;
mod proxy;
mod ready;
mod redis;
mod sentinel;
mod server;
pub mod tls;
mod util;
mod worker;
mod zookeeper;

pub use cluster::RedisCluster;
pub use etcd::{EtcdOptions, EtcdServer};
pub use etcd_cluster::EtcdCluster;
pub use faketime::{FakeWallClock, faketime_library};
pub use mariadb::{MariaDb, MariaDbOptions};
pub use pgbouncer::{PgBouncer, PoolMode};
pub use port::{free_port, free_port_with_bus};
pub use postgres::{Postgres, PostgresOptions, postgres_bin_dir};
pub use process::ServerProcess;
pub use proxy::{FaultProxy, ProxyMode};
pub use redis::{RedisOptions, RedisServer};
pub use sentinel::{RedisSentinelSet, SENTINEL_ADMIN_USER};
pub use tls::{ServerCert, TlsFiles};
pub use util::renderings;
pub use worker::WorkerProcess;
pub use zookeeper::{
    DEFAULT_SYNC_LIMIT as ZK_DEFAULT_SYNC_LIMIT, MAX_SESSION_TIMEOUT as ZK_MAX_SESSION_TIMEOUT,
    MIN_SESSION_TIMEOUT as ZK_MIN_SESSION_TIMEOUT, TICK as ZK_TICK, ZOOKEEPER_JAR, ZkEnsemble,
    ZkEnsembleOptions, ZkServer,
};

/// Re-export of [`nix::sys::signal::Signal`], the type taken by the
/// `signal` methods.
pub use nix::sys::signal::Signal;
