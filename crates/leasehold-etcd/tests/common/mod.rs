//! Helpers shared by the integration tests: a private etcd, a store through a fault
//! proxy, fault hooks for the conformance suite.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture, Network};
use leasehold_core::{Key, Store};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::{EtcdCluster, EtcdServer, FaultProxy, ProxyMode};

/// The base TTL of the suite's timed cases. etcd leases have one-second resolution and
/// etcd expires them up to ~0.5 s late (its expiry loop), so the suite's short leases
/// (TTL/4 = 1 s) need a TTL of whole seconds with room around them.
pub const FIXTURE_TTL: Duration = Duration::from_secs(4);

/// The bound on each store call in the tests.
pub const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// A private etcd, a fault proxy in front of it, and a store through the proxy.
pub struct Solo {
    pub server: Arc<EtcdServer>,
    pub proxy: Arc<FaultProxy>,
    pub store: Arc<EtcdStore>,
}

impl Solo {
    pub async fn start() -> Self {
        let server = Arc::new(
            tokio::task::spawn_blocking(EtcdServer::start)
                .await
                .unwrap(),
        );
        let proxy = Arc::new(FaultProxy::start(server.addr()));
        let config = EtcdConfig::new([format!("127.0.0.1:{}", proxy.port())])
            .unwrap()
            .op_timeout(OP_TIMEOUT)
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .unwrap();
        let store = Arc::new(EtcdStore::connect(config).await.expect("connect"));
        Self {
            server,
            proxy,
            store,
        }
    }

    /// A store straight to the server (not through the proxy).
    pub async fn direct(&self) -> EtcdStore {
        EtcdStore::open(&self.server.url()).await.expect("open")
    }

    /// A raw etcd client straight to the server.
    pub async fn raw(&self) -> etcd_client::Client {
        etcd_client::Client::connect([format!("http://127.0.0.1:{}", self.server.port())], None)
            .await
            .expect("raw etcd client")
    }
}

/// Conformance fault hooks: `forget` revokes the lease's etcd lease directly on the
/// server (an early expiry: etcd deletes the key with it); `make_unreachable` blackholes
/// the proxies.
pub struct EtcdFaults {
    pub store: Arc<EtcdStore>,
    pub proxies: Vec<Arc<FaultProxy>>,
    pub raw: etcd_client::Client,
}

/// The store's queue of waiters for a key: the entries under `<lease key>\0`, read on
/// the server.
#[async_trait]
impl leasehold_conformance::Queue for EtcdFaults {
    async fn waiting(&self, key: &Key) -> usize {
        let prefix = format!("{}\0", self.store.lease_key(key));
        let resp = self
            .raw
            .clone()
            .get(
                prefix,
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .expect("read the queue");
        usize::try_from(resp.count()).expect("a count")
    }
}

#[async_trait]
impl Faults for EtcdFaults {
    async fn forget(&self, key: &Key) {
        let mut raw = self.raw.clone();
        let resp = raw
            .get(self.store.lease_key(key), None)
            .await
            .expect("forget: read the lease key");
        let kv = resp
            .kvs()
            .first()
            .expect("forget: the lease key was not there");
        raw.lease_revoke(kv.lease())
            .await
            .expect("forget: revoke the etcd lease");
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

/// The conformance fixture on a single-member etcd: the store reaches it through a fault
/// proxy; other processes open it from its URL.
pub async fn solo_fixture() -> Fixture {
    let s = Solo::start().await;
    let faults = EtcdFaults {
        store: s.store.clone(),
        proxies: vec![s.proxy.clone()],
        raw: s.raw().await,
    };
    let url = s.server.url();
    let direct = open_store(url.clone()).await;
    let network = Network::new(vec![s.proxy.clone()], direct, s.server.clone())
        .op_bound(OP_TIMEOUT)
        // An acquire is several requests (read, grant, transaction): a dropped reply
        // may come before the transaction was sent.
        .lost_reply_applies(false)
        // etcd reports a lease's time to live in whole seconds, rounded down.
        .remaining_resolution(Duration::from_secs(1));
    let faults = Arc::new(faults);
    Fixture::new(s.store.clone(), faults.clone(), FIXTURE_TTL)
        .queue(faults)
        .other_processes(url)
        .network(network)
        .expects_watcher()
        .expects_waiter()
        .keep_alive(s)
}

/// Opens a store from a URL (in the holder process of the conformance suite, and for the
/// fixture's direct store).
pub async fn open_store(url: String) -> Arc<dyn Store> {
    Arc::new(EtcdStore::open(&url).await.expect("open the store"))
}

/// A private three-member etcd cluster, a fault proxy in front of each member, and a
/// store through the three proxies (the client balances over them).
pub struct Trio {
    pub cluster: Arc<EtcdCluster>,
    pub proxies: Vec<Arc<FaultProxy>>,
    pub store: Arc<EtcdStore>,
}

impl Trio {
    pub async fn start() -> Self {
        let cluster = Arc::new(
            tokio::task::spawn_blocking(EtcdCluster::start)
                .await
                .unwrap(),
        );
        let proxies: Vec<Arc<FaultProxy>> = cluster
            .members()
            .iter()
            .map(|m| Arc::new(FaultProxy::start(m.addr())))
            .collect();
        let config = EtcdConfig::new(proxies.iter().map(|p| format!("127.0.0.1:{}", p.port())))
            .unwrap()
            .op_timeout(OP_TIMEOUT)
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .unwrap();
        let store = Arc::new(EtcdStore::connect(config).await.expect("connect"));
        Self {
            cluster,
            proxies,
            store,
        }
    }

    /// A raw etcd client straight to every member.
    pub async fn raw(&self) -> etcd_client::Client {
        let endpoints: Vec<String> = self
            .cluster
            .endpoints()
            .iter()
            .map(|e| format!("http://{e}"))
            .collect();
        etcd_client::Client::connect(endpoints, None)
            .await
            .expect("raw etcd client")
    }
}

/// The conformance fixture on a three-member etcd cluster: the store reaches the members
/// through one fault proxy each; other processes open it from the URL listing all three.
pub async fn cluster_fixture() -> Fixture {
    let t = Trio::start().await;
    let faults = EtcdFaults {
        store: t.store.clone(),
        proxies: t.proxies.clone(),
        raw: t.raw().await,
    };
    let url = t.cluster.url();
    let direct = open_store(url.clone()).await;
    let network = Network::new(t.proxies.clone(), direct, t.cluster.clone())
        .op_bound(OP_TIMEOUT)
        .lost_reply_applies(false)
        // etcd reports a lease's time to live in whole seconds, rounded down.
        .remaining_resolution(Duration::from_secs(1));
    let faults = Arc::new(faults);
    Fixture::new(t.store.clone(), faults.clone(), FIXTURE_TTL)
        .queue(faults)
        .other_processes(url)
        .network(network)
        .expects_watcher()
        .expects_waiter()
        .keep_alive(t)
}
