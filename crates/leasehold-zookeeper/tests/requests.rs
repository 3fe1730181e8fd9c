//! How many requests each operation sends to the server, counted by the server itself
//! (`cons`: the last request number of the store's session, which pings leave alone). An
//! uncontended acquire + release is four (list, create, list; delete), where Curator's
//! lock makes three (create, list; delete): an acquire looks before it queues, so that a
//! caller is never seen queued before it has its place. An acquire of a held key is a list
//! and a read of the holder's TTL, and leaves no node. A caller that will not wait
//! (`acquire_no_wait`, what `try_acquire` asks) takes Curator's order: three requests for a
//! free key (create, list; delete), and a held key's queue shows its node only until the
//! delete that follows the list.

mod common;

use std::time::Duration;

use common::raw;
use leasehold_core::{AcquireOutcome, Key, OwnerToken, ReleaseOutcome, Store};
use leasehold_testkit::ZkServer;
use leasehold_zookeeper::ZkStore;
use zookeeper_client as zk;

struct Solo {
    server: ZkServer,
    store: ZkStore,
    raw: zk::Client,
    session: i64,
}

impl Solo {
    async fn start() -> Self {
        let server = tokio::task::spawn_blocking(ZkServer::start).await.unwrap();
        let url = format!(
            "zookeeper://127.0.0.1:{}/requests?session_timeout=20s",
            server.port()
        );
        let store = ZkStore::open(&url).await.unwrap();
        let session = store.session_id().await.unwrap();
        let raw = raw(&server.connect_string()).await;
        Self {
            server,
            store,
            raw,
            session,
        }
    }

    fn last(&self) -> i64 {
        self.server
            .last_request_of(self.session)
            .expect("the store's session is connected to the server")
    }

    /// The requests `op` sent, and whether the key's directory (a container the server
    /// removes once empty) was made again meanwhile, which takes two more (the create
    /// that found it missing, the directory's own).
    async fn count<T>(&self, k: &Key, op: impl Future<Output = T>) -> (i64, bool, T) {
        let dir = self.store.lease_dir(k);
        let before_dir = self.raw.check_stat(&dir).await.unwrap().map(|s| s.czxid);
        let before = self.last();
        let out = op.await;
        let sent = self.last() - before;
        let after_dir = self.raw.check_stat(&dir).await.unwrap().map(|s| s.czxid);
        let remade = before_dir.is_none() || (after_dir.is_some() && after_dir != before_dir);
        (sent, remade, out)
    }
}

fn key(name: &str) -> Key {
    Key::new(format!("requests:{name}")).unwrap()
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_is_four_requests() {
    let s = Solo::start().await;
    let k = key("free");
    // Make the key's directory first: it stays while the key is used.
    let warm = OwnerToken::random();
    s.store.acquire(&k, &warm, TTL).await.unwrap();
    s.store.release(&k, &warm).await.unwrap();
    for round in 0..5 {
        let owner = OwnerToken::random();
        let (sent, remade, got) = s.count(&k, s.store.acquire(&k, &owner, TTL)).await;
        assert!(matches!(got.unwrap(), AcquireOutcome::Acquired { .. }));
        let expected = if remade { 5 } else { 3 };
        assert_eq!(
            sent, expected,
            "round {round}: an acquire of a free key: list, create, list"
        );
        let (sent, _, released) = s.count(&k, s.store.release(&k, &owner)).await;
        assert_eq!(released.unwrap(), ReleaseOutcome::Released);
        assert_eq!(sent, 1, "round {round}: a release: delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_of_a_held_key_reads_and_leaves_no_node() {
    let s = Solo::start().await;
    let k = key("held");
    let holder = OwnerToken::random();
    let (sent, remade, got) = s.count(&k, s.store.acquire(&k, &holder, TTL)).await;
    assert!(matches!(got.unwrap(), AcquireOutcome::Acquired { .. }));
    assert!(remade, "a new key's directory is made by its first acquire");
    // list (no directory yet), create (no directory), the directory, create, list
    assert_eq!(sent, 5, "the first acquire of a new key");
    let (sent, _, got) = s
        .count(&k, s.store.acquire(&k, &OwnerToken::random(), TTL))
        .await;
    assert!(matches!(got.unwrap(), AcquireOutcome::Held { .. }));
    assert_eq!(
        sent, 2,
        "an acquire of a held key: list, read the holder's TTL"
    );
    let queue = s.raw.list_children(&s.store.lease_dir(&k)).await.unwrap();
    assert_eq!(queue.len(), 1, "only the holder's node: {queue:?}");
    s.store.release(&k, &holder).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_of_a_free_key_creates_first_three_requests_a_pair() {
    let s = Solo::start().await;
    let k = key("try-free");
    let warm = OwnerToken::random();
    s.store.acquire(&k, &warm, TTL).await.unwrap();
    s.store.release(&k, &warm).await.unwrap();
    for round in 0..5 {
        let owner = OwnerToken::random();
        let (sent, remade, got) = s.count(&k, s.store.acquire_no_wait(&k, &owner, TTL)).await;
        let AcquireOutcome::Acquired { fence, .. } = got.unwrap() else {
            panic!("round {round}: a try of a free key is granted");
        };
        let expected = if remade { 4 } else { 2 };
        assert_eq!(
            sent, expected,
            "round {round}: a try of a free key: create, list"
        );
        // The fence is the node's own czxid: the node the store answered for.
        let dir = s.store.lease_dir(&k);
        let queue = s.raw.list_children(&dir).await.unwrap();
        assert_eq!(queue.len(), 1, "round {round}: one node: {queue:?}");
        let stat = s
            .raw
            .check_stat(&format!("{dir}/{}", queue[0]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(fence.get(), stat.czxid as u64, "round {round}");
        // The same owner's try again (a retry after a lost reply) is the same grant.
        let (_, _, again) = s.count(&k, s.store.acquire_no_wait(&k, &owner, TTL)).await;
        assert!(
            matches!(again.unwrap(), AcquireOutcome::Acquired { fence: f, .. } if f == fence),
            "round {round}: a retry by the same owner returns the same fence"
        );
        let (sent, _, released) = s.count(&k, s.store.release(&k, &owner)).await;
        assert_eq!(released.unwrap(), ReleaseOutcome::Released);
        assert_eq!(sent, 1, "round {round}: a release: delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_of_a_held_key_is_held_and_leaves_no_node() {
    let s = Solo::start().await;
    let k = key("try-held");
    let holder = OwnerToken::random();
    let AcquireOutcome::Acquired { fence, .. } = s.store.acquire(&k, &holder, TTL).await.unwrap()
    else {
        panic!("the first acquire is granted");
    };
    for round in 0..3 {
        let (sent, _, got) = s
            .count(&k, s.store.acquire_no_wait(&k, &OwnerToken::random(), TTL))
            .await;
        assert!(
            matches!(got.unwrap(), AcquireOutcome::Held { remaining: Some(r) } if r > Duration::ZERO),
            "round {round}: a try of a held key is held, with the holder's TTL"
        );
        assert_eq!(
            sent, 4,
            "round {round}: create, list, then the delete of ours and a read of the holder's TTL"
        );
        let queue = s.raw.list_children(&s.store.lease_dir(&k)).await.unwrap();
        assert_eq!(
            queue.len(),
            1,
            "round {round}: only the holder's node: {queue:?}"
        );
    }
    let info = s.store.inspect(&k).await.unwrap().unwrap();
    assert_eq!((info.owner, info.fence), (holder, fence));
    s.store.release(&k, &holder).await.unwrap();
}
