//! The ZooKeeper store against a private plaintext ZooKeeper on Netty's connection factory
//! (`ZkServer::start_netty`, the factory a TLS server must use): a grant and a release go
//! through, and the server's log shows that Netty, not the default NIO factory, serves the
//! client port, while `ZkServer::start`'s log shows NIO.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, Key, OwnerToken, ReleaseOutcome, Store};
use leasehold_testkit::ZkServer;
use leasehold_zookeeper::ZkStore;

/// The logger that binds the client port of a server on Netty's factory.
const NETTY: &str = "NettyServerCnxnFactory";
/// The logger that binds it on the default factory.
const NIO: &str = "NIOServerCnxnFactory";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_server_on_netty_grants_and_releases() {
    let zk = tokio::task::spawn_blocking(ZkServer::start_netty)
        .await
        .unwrap();
    let log = zk.log();
    assert!(log.contains(NETTY), "no {NETTY} in the log:\n{log}");
    assert!(!log.contains(NIO), "{NIO} in the log:\n{log}");
    assert!(zk.tls().is_none());

    let url = format!(
        "zookeeper://127.0.0.1:{}/leasehold?session_timeout=8s&timeout=2s&connect_timeout=5s",
        zk.port()
    );
    let store = ZkStore::open(&url).await.expect("open over plaintext");
    assert!(!store.config().uses_tls());
    let k = Key::new("zk-netty:smoke").unwrap();
    let me = OwnerToken::random();
    let ttl = Duration::from_secs(3);
    let AcquireOutcome::Acquired { .. } = store.acquire(&k, &me, ttl).await.unwrap() else {
        panic!("a free key was not granted");
    };
    let other = OwnerToken::random();
    assert!(matches!(
        store.acquire(&k, &other, ttl).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));
    assert!(matches!(
        store.release(&k, &me).await.unwrap(),
        ReleaseOutcome::Released
    ));
    assert!(matches!(
        store.acquire(&k, &other, ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}

/// The control: the default server's log names NIO's factory and not Netty's, so the
/// check above tells the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_server_runs_nio() {
    let zk = tokio::task::spawn_blocking(ZkServer::start).await.unwrap();
    let log = zk.log();
    assert!(log.contains(NIO), "no {NIO} in the log:\n{log}");
    assert!(!log.contains(NETTY), "{NETTY} in the log:\n{log}");
}
