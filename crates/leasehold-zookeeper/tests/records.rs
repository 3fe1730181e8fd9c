//! Fenced records on ZooKeeper beyond the shared case (`records_are_fenced_writes`):
//! racing writes keep the highest fence, a record is a persistent node apart from the
//! lease directories (and hidden from `list`), and a record written before the
//! ensemble's leader is killed is read after it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Servers, Setup, raw};
use leasehold_core::{Fence, Key, OwnerToken, Record, Store, StoreError, StoreErrorKind};
use leasehold_testkit::ZkEnsemble;
use leasehold_zookeeper::ZkStore;
use zookeeper_client as zk;

fn key(name: &str) -> Key {
    Key::new(format!("zk-record:{name}")).unwrap()
}

fn rec(fence: u64, value: &[u8]) -> Record {
    Record {
        fence: Fence(fence),
        value: value.to_vec(),
    }
}

/// Retries `f` while the ensemble elects a leader or the session moves to a live member.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// A record is the persistent node `<root>/%2erecords/<key, escaped>` holding the fence
/// (8 bytes, big-endian) and the value; `list` does not show the records directory; a
/// node too short to hold a fence is `Corrupt`, never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_persistent_nodes_apart_from_the_leases() {
    let s = Setup::start(Servers::solo().await).await;
    let k = Key::new("job:a/b.c").unwrap();
    let owner = OwnerToken::random();
    s.store
        .acquire(&k, &owner, Duration::from_secs(5))
        .await
        .unwrap();
    s.store
        .put_record(&k, Fence(258), b"\0\xffbytes")
        .await
        .unwrap();
    assert_eq!(
        s.store.record_path(&k),
        "/leasehold/%2erecords/job:a%2Fb%2Ec"
    );
    let raw = raw(&s.servers.connect_string()).await;
    let (data, stat) = raw.get_data(&s.store.record_path(&k)).await.unwrap();
    assert_eq!(data, b"\0\0\0\0\0\0\x01\x02\0\xffbytes");
    assert_eq!(stat.ephemeral_owner, 0, "persistent: records never expire");
    let mut children = raw.list_children("/leasehold").await.unwrap();
    children.sort();
    assert_eq!(children, vec!["%2erecords", "job:a%2Fb%2Ec"]);
    let listed: Vec<Key> = s
        .store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(listed, vec![k.clone()], "the lease, not the record");

    let short = key("short");
    raw.create(
        &s.store.record_path(&short),
        b"1234567",
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .unwrap();
    for e in [
        s.store.get_record(&short).await.map(drop),
        s.store.put_record(&short, Fence(9), b"x").await.map(drop),
    ] {
        let e = e.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    }
    let (data, _) = raw.get_data(&s.store.record_path(&short)).await.unwrap();
    assert_eq!(data, b"1234567", "never overwritten");
}

/// A record written before the leader of a three-member ensemble is killed is read after
/// it, and fenced writes go on: a lower fence is refused, a higher one written; once the
/// killed member is back, a store on it alone reads the latest record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_before_the_leader_is_killed_are_read_after() {
    let ensemble = Arc::new(
        tokio::task::spawn_blocking(ZkEnsemble::start)
            .await
            .unwrap(),
    );
    let url = format!(
        "zookeeper://{}/records?session_timeout=8000ms&timeout=2s",
        ensemble.connect_string()
    );
    let store = ZkStore::open(&url).await.expect("open");
    let k = key("leader-killed");
    let before = rec(5, b"before\0\xff");
    assert_eq!(
        store.put_record(&k, Fence(5), &before.value).await.unwrap(),
        before
    );
    let leader = {
        let e = ensemble.clone();
        tokio::task::spawn_blocking(move || {
            let end = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(l) = e.leader() {
                    return l;
                }
                assert!(std::time::Instant::now() < end, "no leader");
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .await
        .unwrap()
    };
    {
        let e = ensemble.clone();
        tokio::task::spawn_blocking(move || e.kill(leader))
            .await
            .unwrap();
    }
    assert_eq!(
        eventually("get after the kill", || store.get_record(&k)).await,
        Some(before.clone())
    );
    assert_eq!(
        eventually("lower fence", || store.put_record(&k, Fence(4), b"late")).await,
        before,
        "a lower fence is refused after the fail-over"
    );
    let after = rec(6, b"after");
    assert_eq!(
        eventually("higher fence", || store.put_record(&k, Fence(6), b"after")).await,
        after
    );
    {
        let e = ensemble.clone();
        tokio::task::spawn_blocking(move || e.start_again(leader))
            .await
            .unwrap();
    }
    let port = ensemble.ports()[leader];
    let only_it = ZkStore::open(&format!(
        "zookeeper://127.0.0.1:{port}/records?session_timeout=8000ms&timeout=2s&connect_timeout=10s"
    ))
    .await
    .expect("open the restarted member");
    assert_eq!(
        eventually("get from the restarted member", || only_it.get_record(&k)).await,
        Some(after)
    );
}
