//! Fenced records on etcd beyond the shared case (`records_are_fenced_writes`): racing
//! writes keep the highest fence, a record lives in its own key apart from the lease
//! keys, and a record written before the cluster's leader is killed is read after it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Solo;
use leasehold_core::{Fence, Key, Record, Store, StoreError};
use leasehold_etcd::EtcdStore;
use leasehold_testkit::EtcdCluster;

fn key(name: &str) -> Key {
    Key::new(format!("etcd-record:{name}")).unwrap()
}

fn rec(fence: u64, value: &[u8]) -> Record {
    Record {
        fence: Fence(fence),
        value: value.to_vec(),
    }
}

/// Retries `f` while the cluster elects a leader or the client finds a live member.
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

/// A record is one etcd key, `<prefix>\0records\0<key>`, holding the fence (8 bytes,
/// big-endian) and the value, on no etcd lease; a value there too short to hold a fence
/// is `Corrupt`, never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_one_key_each_apart_from_the_leases() {
    let s = Solo::start().await;
    let k = key("layout");
    let value = b"\0\xffbytes";
    s.store.put_record(&k, Fence(258), value).await.unwrap();
    let mut raw = s.raw().await;
    let record_key = s.store.record_key(&k);
    assert_eq!(record_key, format!("leasehold/\0records\0{}", k.as_str()));
    let resp = raw.get(record_key.as_str(), None).await.unwrap();
    let kv = &resp.kvs()[0];
    assert_eq!(kv.value(), b"\0\0\0\0\0\0\x01\x02\0\xffbytes");
    assert_eq!(kv.lease(), 0, "records never expire");
    assert_eq!(s.store.list("").await.unwrap(), vec![], "not a lease");

    raw.put(s.store.record_key(&key("short")), "1234567", None)
        .await
        .unwrap();
    for e in [
        s.store.get_record(&key("short")).await.map(drop),
        s.store
            .put_record(&key("short"), Fence(9), b"x")
            .await
            .map(drop),
    ] {
        let e = e.unwrap_err();
        assert_eq!(e.kind(), leasehold_core::StoreErrorKind::Corrupt, "{e}");
    }
    let resp = raw
        .get(s.store.record_key(&key("short")), None)
        .await
        .unwrap();
    assert_eq!(resp.kvs()[0].value(), b"1234567", "never overwritten");
}

/// A record written before the leader of a three-member cluster is killed is read after
/// it (from the survivors, then from the killed member alone once it is back), and
/// fenced writes go on: a lower fence is refused, a higher one written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_before_the_leader_is_killed_are_read_after() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(EtcdCluster::start)
            .await
            .unwrap(),
    );
    let store = EtcdStore::open(&format!("{}?timeout=2s&connect_timeout=1s", cluster.url()))
        .await
        .expect("open");
    let k = key("leader-killed");
    let before = rec(5, b"before\0\xff");
    assert_eq!(
        store.put_record(&k, Fence(5), &before.value).await.unwrap(),
        before
    );
    let leader = {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.wait_for_leader(Duration::from_secs(20)))
            .await
            .unwrap()
            .expect("a leader")
    };
    {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.member(leader).kill())
            .await
            .unwrap();
    }
    let next = {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.wait_for_leader(Duration::from_secs(20)))
            .await
            .unwrap()
            .expect("a new leader")
    };
    assert_ne!(next, leader);
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
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.start_again(leader))
            .await
            .unwrap();
    }
    let only_it = EtcdStore::open(&cluster.member(leader).url())
        .await
        .expect("open the restarted member");
    assert_eq!(
        eventually("get from the restarted member", || only_it.get_record(&k)).await,
        Some(after)
    );
}
