//! Helpers shared by the integration tests: three private Redis servers, a fault proxy in
//! front of each, a Redlock store through the proxies, fault hooks for the conformance
//! suite.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture, Network, Pausable};
use leasehold_core::{Key, Store};
use leasehold_redlock::{RedlockConfig, RedlockStore};
use leasehold_testkit::{FaultProxy, ProxyMode, RedisOptions, RedisServer};

/// The base TTL of the suite's timed cases.
pub const FIXTURE_TTL: Duration = Duration::from_secs(1);

/// The bound on one request to one node in the tests (the store also caps it at TTL/3
/// for acquires and renewals): generous, for a loaded machine.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The longest one store call takes before it fails by itself: at most two rounds and a
/// release of partial locks, each bounded by the node timeout.
pub const OP_BOUND: Duration = Duration::from_millis(1500);

/// Independent servers, a fault proxy in front of each, and a store through the proxies.
pub struct Set {
    pub servers: Vec<Arc<RedisServer>>,
    pub proxies: Vec<Arc<FaultProxy>>,
    pub store: Arc<RedlockStore>,
}

/// The servers of a set, paused and resumed together (docs/faults.md row 4).
pub struct Servers(pub Vec<Arc<RedisServer>>);

impl Pausable for Servers {
    fn pause(&self) {
        for s in &self.0 {
            s.pause();
        }
    }
    fn resume(&self) {
        for s in &self.0 {
            s.resume();
        }
    }
}

impl Set {
    /// Three servers.
    pub async fn start() -> Self {
        Self::start_n(3).await
    }

    /// `n` servers.
    pub async fn start_n(n: usize) -> Self {
        Self::start_with(n, RedisOptions::new()).await
    }

    /// `n` servers started with `opts` (e.g. the append-only file on).
    pub async fn start_with(n: usize, opts: RedisOptions) -> Self {
        let servers: Vec<Arc<RedisServer>> = tokio::task::spawn_blocking(move || {
            (0..n)
                .map(|_| Arc::new(RedisServer::start_with(opts.clone())))
                .collect()
        })
        .await
        .unwrap();
        let proxies: Vec<Arc<FaultProxy>> = servers
            .iter()
            .map(|s| Arc::new(FaultProxy::start(s.addr())))
            .collect();
        let config = RedlockConfig::new(proxies.iter().map(|p| format!("127.0.0.1:{}", p.port())))
            .unwrap()
            .node_timeout(NODE_TIMEOUT)
            .unwrap()
            .connect_timeout(Duration::from_millis(300))
            .unwrap();
        let store = Arc::new(RedlockStore::connect(config).await.expect("connect"));
        Self {
            servers,
            proxies,
            store,
        }
    }

    /// `redlock://` to the servers directly (not through the proxies).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redlock://{}", nodes.join(","))
    }

    /// `redis-cli` against server `i` directly, off the runtime.
    pub async fn cli(&self, i: usize, args: &[&str]) -> String {
        cli(&self.servers[i], args).await
    }
}

/// `redis-cli` against `server`, off the runtime.
pub async fn cli(server: &Arc<RedisServer>, args: &[&str]) -> String {
    let server = server.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.cli(&args)
    })
    .await
    .unwrap()
}

/// Conformance fault hooks: `forget` deletes the lease key on every server (an early
/// expiry everywhere; the fence keys stay); `make_unreachable` blackholes every proxy.
pub struct RedlockFaults {
    pub store: Arc<RedlockStore>,
    pub servers: Vec<Arc<RedisServer>>,
    pub proxies: Vec<Arc<FaultProxy>>,
}

#[async_trait]
impl Faults for RedlockFaults {
    async fn forget(&self, key: &Key) {
        let lease_key = self.store.lease_key(key);
        let mut deleted = 0;
        for s in &self.servers {
            if cli(s, &["DEL", &lease_key]).await.trim() == "1" {
                deleted += 1;
            }
        }
        assert!(
            deleted >= self.store.config().quorum(),
            "forget: the lease key was on {deleted} servers only"
        );
    }

    async fn make_unreachable(&self) {
        for p in &self.proxies {
            p.set_mode(ProxyMode::Blackhole);
        }
    }

    async fn restore(&self) {
        for p in &self.proxies {
            p.set_mode(ProxyMode::Pass);
        }
    }
}

/// The conformance fixture on three independent servers, each behind a fault proxy;
/// other processes open the set from its URL (straight to the servers).
pub async fn fixture() -> Fixture {
    let s = Set::start().await;
    let faults = RedlockFaults {
        store: s.store.clone(),
        servers: s.servers.clone(),
        proxies: s.proxies.clone(),
    };
    let url = s.url();
    let direct = open_store(url.clone()).await;
    let network = Network::new(
        s.proxies.clone(),
        direct,
        Arc::new(Servers(s.servers.clone())),
    )
    .op_bound(OP_BOUND)
    // An acquire is two rounds, and a refused one releases what it was granted: a
    // dropped reply does not always leave the grant in place.
    .lost_reply_applies(false);
    Fixture::new(s.store.clone(), Arc::new(faults), FIXTURE_TTL)
        .other_processes(url)
        .network(network)
        .keep_alive(s)
}

/// Opens a store from a URL (in the holder process of the conformance suite, and for the
/// fixture's direct store).
pub async fn open_store(url: String) -> Arc<dyn Store> {
    Arc::new(RedlockStore::open(&url).await.expect("open the store"))
}
