//! The conformance suite over TLS with a client certificate and a digest identity, against
//! a private ZooKeeper that serves only TLS (`ZkServer::start_tls`, `ssl.clientAuth=need`),
//! reached through a fault proxy (the server's certificate names 127.0.0.1, the proxy's
//! address too). The full tier: `scripts/test --full` runs it (docs/connections.md).
//!
//! Its first runs found that ZooKeeper 3.8's TLS (Netty) server may answer an auth packet
//! sent with the connect request before the connect itself, under load; the store now
//! authenticates once the session is established (see `ZkStore`'s session).

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::{Fixture, Network};
use leasehold_core::Store;
use leasehold_testkit::{FaultProxy, ServerCert, ZK_TICK, ZkServer};
use leasehold_zookeeper::ZkStore;
use zookeeper_client as zk;

const USER: &str = "leasehold";
const PASSWORD: &str = "sentinel-zk-conformance-pw";

/// `zookeeper://leasehold:…@127.0.0.1:port/leasehold?…&tls=true&cacert=…&cert=…&key=…`.
fn url(zk: &ZkServer, port: u16) -> String {
    let tls = zk.tls().expect("a TLS server");
    format!(
        "zookeeper://{USER}:{PASSWORD}@127.0.0.1:{port}/leasehold?session_timeout={}ms&timeout={}ms&connect_timeout=20s&tick_time={}ms&tls=true&cacert={}&cert={}&key={}",
        common::SESSION_TIMEOUT.as_millis(),
        common::OP_TIMEOUT.as_millis(),
        ZK_TICK.as_millis(),
        tls.ca_cert().display(),
        tls.client_cert().display(),
        tls.client_key().display()
    )
}

/// A raw client over TLS, authenticated as the stores' identity (the fault hooks delete
/// nodes only it may delete). Made first, with generous timeouts: the server JVM's first
/// TLS handshake is slow while several test servers start at once.
async fn raw(zk: &ZkServer) -> zk::Client {
    // `zookeeper-client` builds its TLS configuration with the process-wide provider (the
    // store installs ring when it opens; this client comes first).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = zk.tls().expect("a TLS server");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap();
    let options = zk::TlsOptions::new()
        .with_pem_ca(&read(tls.ca_cert()))
        .unwrap()
        .with_pem_identity(&read(tls.client_cert()), &read(tls.client_key()))
        .unwrap();
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(30))
        .with_connection_timeout(Duration::from_secs(20))
        .with_tls(options)
        .with_auth("digest", format!("{USER}:{PASSWORD}").as_bytes())
        .secure_connect(&zk.connect_string())
        .await
        .expect("raw zookeeper client over TLS")
}

async fn fixture() -> Fixture {
    let zk = Arc::new(
        tokio::task::spawn_blocking(|| ZkServer::start_tls(ServerCert::Localhost, true))
            .await
            .unwrap(),
    );
    let raw = raw(&zk).await;
    let proxy = Arc::new(FaultProxy::start(zk.addr()));
    let store = Arc::new(
        ZkStore::open(&url(&zk, proxy.port()))
            .await
            .expect("open over TLS through the proxy"),
    );
    let direct_url = url(&zk, zk.port());
    let faults = Arc::new(common::ZkFaults {
        store: store.clone(),
        proxies: vec![proxy.clone()],
        raw,
    });
    let direct = open(direct_url.clone()).await;
    let network = Network::new(vec![proxy.clone()], direct, zk.clone())
        .op_bound(common::OP_TIMEOUT)
        .lost_reply_applies(false);
    Fixture::new(store, faults.clone(), common::FIXTURE_TTL)
        .queue(faults)
        .other_processes(direct_url)
        .network(network)
        .expects_batch()
        .expects_watcher()
        .expects_waiter()
        .keep_alive((zk, proxy))
}

async fn open(url: String) -> Arc<dyn Store> {
    common::open_store(url).await
}

leasehold_conformance::conformance_suite!(
    fixture,
    backend = Zookeeper,
    holder = open,
    ignore = "full tier: conformance over TLS"
);
