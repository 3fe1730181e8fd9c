//! Helpers shared by the integration tests: private ZooKeeper servers, a store through
//! fault proxies, fault hooks for the conformance suite.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture, Network, Pausable};
use leasehold_core::{Key, Store};
use leasehold_testkit::{FaultProxy, ProxyMode, ZK_TICK, ZkEnsemble, ZkServer};
use leasehold_zookeeper::{ZkConfig, ZkStore};
use zookeeper_client as zk;

/// The base TTL of the suite's timed cases. The suite's short leases are TTL/4.
pub const FIXTURE_TTL: Duration = Duration::from_secs(3);

/// The session timeout the stores ask for (the test servers grant 0.5 s to 60 s): every
/// grant's TTL is bounded by it, less the report lag (1.725 s here: the stores give the
/// servers' 250 ms tick), and the suite renews leases for longer than the base TTL
/// (`renew_many` with 3 × TTL must outlive 1.7 × TTL) and blackholes the network for up
/// to about 2 × TTL (row 7) expecting the held lease to survive, while a `kill -9`ed
/// holder must be taken over within 3 × TTL + 2 s (the session's expiry frees it).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(8);

/// The three-member ensemble's base TTL and session timeout: every write there is a quorum
/// write (a sync to disk on two JVMs), several times slower than on one server on this
/// loaded two-core machine, and the suite's short leases (TTL/4, TTL/2) must outlive a
/// few acquires in a row.
pub const ENSEMBLE_TTL: Duration = Duration::from_secs(4);
/// The ensemble's session timeout (see [`SESSION_TIMEOUT`] for the bounds on it).
pub const ENSEMBLE_SESSION_TIMEOUT: Duration = Duration::from_secs(11);

/// The bound on each store call in the tests.
pub const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the servers are: one standalone server or a three-member ensemble.
pub enum Servers {
    Solo(Arc<ZkServer>),
    Ensemble(Arc<ZkEnsemble>),
}

impl Servers {
    pub async fn solo() -> Self {
        Self::Solo(Arc::new(
            tokio::task::spawn_blocking(ZkServer::start).await.unwrap(),
        ))
    }

    pub async fn ensemble() -> Self {
        Self::Ensemble(Arc::new(
            tokio::task::spawn_blocking(ZkEnsemble::start)
                .await
                .unwrap(),
        ))
    }

    pub fn ports(&self) -> Vec<u16> {
        match self {
            Self::Solo(s) => vec![s.port()],
            Self::Ensemble(e) => e.ports(),
        }
    }

    /// The base TTL of the suite on these servers.
    pub fn ttl(&self) -> Duration {
        match self {
            Self::Solo(_) => FIXTURE_TTL,
            Self::Ensemble(_) => ENSEMBLE_TTL,
        }
    }

    /// The session timeout the stores ask for on these servers.
    pub fn session_timeout(&self) -> Duration {
        match self {
            Self::Solo(_) => SESSION_TIMEOUT,
            Self::Ensemble(_) => ENSEMBLE_SESSION_TIMEOUT,
        }
    }

    /// The URL straight to the servers, with the fixture's session timeout.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "zookeeper://{}/leasehold?session_timeout={}ms&timeout={}ms&tick_time={}ms",
            hosts.join(","),
            self.session_timeout().as_millis(),
            OP_TIMEOUT.as_millis(),
            ZK_TICK.as_millis()
        )
    }

    pub fn connect_string(&self) -> String {
        match self {
            Self::Solo(s) => s.connect_string(),
            Self::Ensemble(e) => e.connect_string(),
        }
    }

    fn pausable(&self) -> Arc<dyn Pausable> {
        match self {
            Self::Solo(s) => s.clone(),
            Self::Ensemble(e) => e.clone(),
        }
    }
}

/// Private servers, a fault proxy in front of each, and a store through the proxies.
pub struct Setup {
    pub servers: Servers,
    pub proxies: Vec<Arc<FaultProxy>>,
    pub store: Arc<ZkStore>,
}

impl Setup {
    pub async fn start(servers: Servers) -> Self {
        let proxies: Vec<Arc<FaultProxy>> = servers
            .ports()
            .into_iter()
            .map(|p| Arc::new(FaultProxy::start(([127, 0, 0, 1], p).into())))
            .collect();
        let config = ZkConfig::new(proxies.iter().map(|p| format!("127.0.0.1:{}", p.port())))
            .unwrap()
            .session_timeout(servers.session_timeout())
            .unwrap()
            .op_timeout(OP_TIMEOUT)
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .unwrap()
            .tick_time(ZK_TICK)
            .unwrap();
        let store = Arc::new(ZkStore::connect(config).await.expect("connect"));
        Self {
            servers,
            proxies,
            store,
        }
    }

    /// A store straight to the servers (not through the proxies).
    pub async fn direct(&self) -> ZkStore {
        ZkStore::open(&self.servers.url()).await.expect("open")
    }
}

/// A raw ZooKeeper client straight to the servers.
pub async fn raw(connect_string: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect_string)
        .await
        .expect("raw zookeeper client")
}

/// Conformance fault hooks: `forget` deletes the holder's node directly on the server (an
/// early end of the lease); `make_unreachable` blackholes the proxies.
pub struct ZkFaults {
    pub store: Arc<ZkStore>,
    pub proxies: Vec<Arc<FaultProxy>>,
    pub raw: zk::Client,
}

/// The store's queue of waiters for a key: the nodes of the key's directory after the
/// first (the holder's), read on the server.
#[async_trait]
impl leasehold_conformance::Queue for ZkFaults {
    async fn waiting(&self, key: &Key) -> usize {
        let dir = self.store.lease_dir(key);
        self.raw.sync(&dir).await.expect("sync with the leader");
        match self.raw.list_children(&dir).await {
            Ok(children) => children.len().saturating_sub(1),
            Err(zk::Error::NoNode) => 0,
            Err(e) => panic!("list the key's queue: {e}"),
        }
    }
}

#[async_trait]
impl Faults for ZkFaults {
    async fn forget(&self, key: &Key) {
        let dir = self.store.lease_dir(key);
        // The raw client may read from a member that has not yet applied the holder's
        // create (ZooKeeper serves reads from any member): bring it up to date first.
        self.raw
            .sync(&dir)
            .await
            .expect("forget: sync with the leader");
        let mut children = self
            .raw
            .list_children(&dir)
            .await
            .expect("forget: list the key's queue");
        children.sort_by_key(|n| n.rsplit_once('-').map(|(_, s)| s.to_owned()));
        let first = children.first().expect("forget: the key's queue is empty");
        self.raw
            .delete(&format!("{dir}/{first}"), None)
            .await
            .expect("forget: delete the holder's node");
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

async fn fixture(servers: Servers) -> Fixture {
    let s = Setup::start(servers).await;
    let faults = ZkFaults {
        store: s.store.clone(),
        proxies: s.proxies.clone(),
        raw: raw(&s.servers.connect_string()).await,
    };
    let url = s.servers.url();
    let direct = open_store(url.clone()).await;
    let network = Network::new(s.proxies.clone(), direct, s.servers.pausable())
        .op_bound(OP_TIMEOUT)
        // An acquire is several requests (list, create, list): a dropped reply may come
        // before the create was sent.
        .lost_reply_applies(false);
    let ttl = s.servers.ttl();
    let faults = Arc::new(faults);
    Fixture::new(s.store.clone(), faults.clone(), ttl)
        .queue(faults)
        .other_processes(url)
        .network(network)
        .expects_batch()
        .expects_watcher()
        .expects_waiter()
        .keep_alive(s)
}

/// The conformance fixture on a standalone server, through a fault proxy.
pub async fn solo_fixture() -> Fixture {
    fixture(Servers::solo().await).await
}

/// The conformance fixture on a three-member ensemble, through a fault proxy per member.
pub async fn ensemble_fixture() -> Fixture {
    fixture(Servers::ensemble().await).await
}

/// Opens a store from a URL (in the holder process of the conformance suite, and for the
/// fixture's direct store).
pub async fn open_store(url: String) -> Arc<dyn Store> {
    Arc::new(ZkStore::open(&url).await.expect("open the store"))
}
