//! `wait_released` across store instances (each its own ZooKeeper session): the shared
//! waiting checks of `leasehold_conformance::waiting`, on one private server.

use std::sync::Arc;

use leasehold_conformance::waiting;
use leasehold_core::Store;
use leasehold_testkit::ZkServer;
use leasehold_zookeeper::ZkStore;

async fn server() -> ZkServer {
    tokio::task::spawn_blocking(ZkServer::start).await.unwrap()
}

/// A new store instance (a new session) on `zk`. The checks hold leases for
/// `waiting::LONG_TTL`: the session timeout must back it.
async fn open(zk: &ZkServer) -> Arc<dyn Store> {
    let url = format!(
        "zookeeper://127.0.0.1:{}/wait?session_timeout={}ms",
        zk.port(),
        waiting::LONG_TTL.as_millis()
    );
    Arc::new(ZkStore::open(&url).await.expect("open"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_released_is_woken_by_a_release_from_another_store() {
    let zk = server().await;
    waiting::woken_by_a_release_from_another_store(async || open(&zk).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_client_gets_the_lease_at_its_release() {
    let zk = server().await;
    waiting::waiting_client_gets_the_lease_at_its_release(async || open(&zk).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_released_is_woken_by_break_and_expiry() {
    let zk = server().await;
    waiting::woken_by_break_and_expiry(async || open(&zk).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_released_ends_at_its_timeout() {
    let zk = server().await;
    waiting::ends_at_its_timeout(async || open(&zk).await).await;
}
