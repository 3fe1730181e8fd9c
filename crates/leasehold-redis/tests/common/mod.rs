//! Helpers shared by the integration tests: private servers, stores through a fault
//! proxy, fault hooks for the conformance suite.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture, Network};
use leasehold_core::{Key, Store};
use leasehold_redis::{NodeAddr, RedisConfig, RedisConfigBuilder, RedisStore};
use leasehold_testkit::{FaultProxy, ProxyMode, RedisCluster, RedisOptions, RedisServer};

/// A fresh key prefix per test, so tests that share a server never collide.
pub fn prefix(test: &str) -> String {
    format!("lh-test:{test}:")
}

/// A standalone server, a fault proxy in front of it, and a store through the proxy.
pub struct Standalone {
    pub server: Arc<RedisServer>,
    pub proxy: Arc<FaultProxy>,
    pub store: Arc<RedisStore>,
}

impl Standalone {
    pub async fn start() -> Self {
        Self::start_with(RedisOptions::new(), |b| b).await
    }

    pub async fn start_with(
        opts: RedisOptions,
        tweak: impl FnOnce(RedisConfigBuilder) -> RedisConfigBuilder,
    ) -> Self {
        let server = Arc::new(
            tokio::task::spawn_blocking(move || RedisServer::start_with(opts))
                .await
                .unwrap(),
        );
        let proxy = Arc::new(FaultProxy::start(server.addr()));
        let mut b = RedisConfigBuilder::standalone("127.0.0.1", proxy.port())
            .op_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(1));
        if let Some(pw) = server.options().effective_password() {
            b = b.password(pw);
        }
        let store = Arc::new(RedisStore::new(tweak(b).build().unwrap()).unwrap());
        Self {
            server,
            proxy,
            store,
        }
    }

    /// `redis-cli` against the server directly (not through the proxy), off the runtime.
    pub async fn cli(&self, args: &[&str]) -> String {
        let server = self.server.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            server.cli(&args)
        })
        .await
        .unwrap()
    }

    /// `calls` of `cmdstat_evalsha` in the server's `INFO commandstats`: the script calls
    /// it has run.
    #[allow(dead_code)] // Not every test binary counts calls.
    pub async fn evalsha_calls(&self) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]).await;
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

/// A 3-master cluster, one fault proxy per node, and a store that reaches every node
/// through its proxy (the cluster's own addresses are remapped to the proxies).
pub struct Cluster {
    pub cluster: Arc<RedisCluster>,
    pub proxies: Vec<Arc<FaultProxy>>,
    pub store: Arc<RedisStore>,
    pub config: RedisConfig,
}

impl Cluster {
    pub async fn start() -> Self {
        Self::start_with(|b| b).await
    }

    pub async fn start_with(tweak: impl FnOnce(RedisConfigBuilder) -> RedisConfigBuilder) -> Self {
        let cluster = Arc::new(
            tokio::task::spawn_blocking(|| RedisCluster::start(3))
                .await
                .unwrap(),
        );
        let proxies: Vec<Arc<FaultProxy>> = cluster
            .addrs()
            .into_iter()
            .map(|a| Arc::new(FaultProxy::start(a)))
            .collect();
        let mut b = RedisConfigBuilder::cluster(
            proxies.iter().map(|p| NodeAddr::new("127.0.0.1", p.port())),
        )
        .op_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(1));
        for (node, proxy) in cluster.ports().into_iter().zip(&proxies) {
            b = b.map_address(
                NodeAddr::new("127.0.0.1", node),
                NodeAddr::new("127.0.0.1", proxy.port()),
            );
        }
        let config = tweak(b).build().unwrap();
        let store = Arc::new(RedisStore::new(config.clone()).unwrap());
        Self {
            cluster,
            proxies,
            store,
            config,
        }
    }

    /// `redis-cli -c` against a live node, off the runtime.
    pub async fn cli(&self, args: &[&str]) -> String {
        let cluster = self.cluster.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cluster.cli(&args)
        })
        .await
        .unwrap()
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        for p in &self.proxies {
            p.set_mode(mode);
        }
    }
}

/// Conformance fault hooks: `forget` deletes the lease key directly on the server,
/// `make_unreachable` blackholes the proxies.
pub struct RedisFaults {
    pub store: Arc<RedisStore>,
    pub proxies: Vec<Arc<FaultProxy>>,
    pub cli: Box<dyn Fn(Vec<String>) -> String + Send + Sync>,
}

/// The store's queue of waiters for a key: its sorted set `<lease key>:q`, read on the
/// server.
#[async_trait]
impl leasehold_conformance::Queue for RedisFaults {
    async fn waiting(&self, key: &Key) -> usize {
        let queue = format!("{}:q", self.store.lease_key(key));
        let cli = &self.cli;
        let out = tokio::task::block_in_place(|| cli(vec!["ZCARD".into(), queue]));
        out.trim()
            .parse()
            .unwrap_or_else(|e| panic!("ZCARD answered {out:?}: {e}"))
    }
}

#[async_trait]
impl Faults for RedisFaults {
    async fn forget(&self, key: &Key) {
        let lease_key = self.store.lease_key(key);
        let cli = &self.cli;
        let out = tokio::task::block_in_place(|| cli(vec!["DEL".into(), lease_key]));
        assert_eq!(out.trim(), "1", "forget: the lease key was not there");
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

/// The conformance fixture on a standalone server: the store reaches it through a fault
/// proxy; other processes open it from its URL.
pub async fn standalone_fixture() -> Fixture {
    let s = Standalone::start().await;
    let server = s.server.clone();
    let faults = RedisFaults {
        store: s.store.clone(),
        proxies: vec![s.proxy.clone()],
        cli: Box::new(move |args| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            server.cli(&args)
        }),
    };
    let url = s.server.authed_url();
    let direct = open_store(url.clone()).await;
    let network = Network::new(vec![s.proxy.clone()], direct, s.server.clone())
        .op_bound(s.store.config().op_timeout())
        .lost_reply_applies(true);
    let faults = Arc::new(faults);
    Fixture::new(s.store.clone(), faults.clone(), Duration::from_secs(1))
        .queue(faults)
        .other_processes(url)
        .network(network)
        // Batches always; notifications are on by default.
        .expects_batch()
        .expects_watcher()
        .expects_waiter()
        .keep_alive(s)
}

/// The conformance fixture on a 3-master cluster, each node behind its own fault proxy;
/// other processes open it from a `redis+cluster://` URL naming every node.
pub async fn cluster_fixture() -> Fixture {
    let c = Cluster::start().await;
    let cluster = c.cluster.clone();
    let faults = RedisFaults {
        store: c.store.clone(),
        proxies: c.proxies.clone(),
        cli: Box::new(move |args| {
            let mut full = vec!["-c"];
            full.extend(args.iter().map(String::as_str));
            cluster.any_live_node().cli(&full)
        }),
    };
    let nodes: Vec<String> = c
        .cluster
        .ports()
        .into_iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("redis+cluster://{}/", nodes.join(","));
    let direct = open_store(url.clone()).await;
    let network = Network::new(c.proxies.clone(), direct, c.cluster.clone())
        .op_bound(c.config.op_timeout())
        .lost_reply_applies(true);
    let faults = Arc::new(faults);
    Fixture::new(c.store.clone(), faults.clone(), Duration::from_secs(1))
        .queue(faults)
        .other_processes(url)
        .network(network)
        // Batches always; notifications are on by default.
        .expects_batch()
        .expects_watcher()
        .expects_waiter()
        .keep_alive(c)
}

/// The conformance fixture on a primary and replica behind three sentinels: the store
/// asks the sentinels for the primary and reaches each data server through its own fault
/// proxy (the sentinels' addresses for them are remapped); other processes open it from
/// its `redis+sentinel://` URL.
pub async fn sentinel_fixture() -> Fixture {
    let set = Arc::new(
        tokio::task::spawn_blocking(|| leasehold_testkit::RedisSentinelSet::start("conform"))
            .await
            .unwrap(),
    );
    sentinel_fixture_on(set, Duration::from_secs(1)).await
}

/// [`sentinel_fixture`] over TLS only (`rediss+sentinel://`): sentinels, servers and
/// replication listen with TLS and on no plaintext port; the proxies pass the TLS bytes.
/// The cases' TTL is 6 s (1 s without TLS): a new connection makes TLS handshakes with a
/// sentinel, the primary and each replica (its clock) before its first request.
pub async fn sentinel_tls_fixture() -> Fixture {
    let set = Arc::new(
        tokio::task::spawn_blocking(|| {
            leasehold_testkit::RedisSentinelSet::start_tls(
                "conformtls",
                leasehold_testkit::ServerCert::Localhost,
                false,
            )
        })
        .await
        .unwrap(),
    );
    sentinel_fixture_on(set, Duration::from_secs(6)).await
}

async fn sentinel_fixture_on(
    set: Arc<leasehold_testkit::RedisSentinelSet>,
    ttl: Duration,
) -> Fixture {
    let proxies: Vec<Arc<FaultProxy>> = set
        .servers()
        .iter()
        .map(|s| Arc::new(FaultProxy::start(s.addr())))
        .collect();
    let mut b = RedisConfigBuilder::sentinel(
        set.sentinel_ports()
            .into_iter()
            .map(|p| NodeAddr::new("127.0.0.1", p)),
        set.master_name(),
    )
    .op_timeout(Duration::from_secs(2))
    .connect_timeout(Duration::from_secs(1));
    if let Some(tls) = set.tls() {
        // Every new connection makes TLS handshakes with a sentinel, the primary and the
        // replica, and the redis client loads the system's CA store for each: more time to
        // connect on a loaded machine.
        b = b
            .tls(leasehold_redis::TlsSettings {
                ca_file: Some(tls.ca_cert()),
                client_cert: None,
            })
            .op_timeout(Duration::from_secs(4))
            .connect_timeout(Duration::from_secs(3));
    }
    for (s, p) in set.servers().iter().zip(&proxies) {
        b = b.map_address(
            NodeAddr::new("127.0.0.1", s.port()),
            NodeAddr::new("127.0.0.1", p.port()),
        );
    }
    let store = Arc::new(RedisStore::new(b.build().unwrap()).unwrap());
    let cli_set = set.clone();
    let faults = RedisFaults {
        store: store.clone(),
        proxies: proxies.clone(),
        cli: Box::new(move |args| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cli_set.primary().cli(&args)
        }),
    };
    let url = match set.tls() {
        Some(_) => format!("{}&connect_timeout=3s", set.url()),
        None => set.url(),
    };
    let direct = open_store(url.clone()).await;
    let network = Network::new(proxies, direct, set.clone())
        .op_bound(store.config().op_timeout())
        .lost_reply_applies(true);
    let faults = Arc::new(faults);
    Fixture::new(store, faults.clone(), ttl)
        .queue(faults)
        .other_processes(url)
        .network(network)
        // Batches always; notifications are on by default.
        .expects_batch()
        .expects_watcher()
        .expects_waiter()
        .keep_alive(set)
}

/// Opens a store from a URL (in the holder process of the conformance suite, and for the
/// fixtures' direct stores).
pub async fn open_store(url: String) -> Arc<dyn Store> {
    Arc::new(RedisStore::open(&url).await.expect("open the store"))
}
