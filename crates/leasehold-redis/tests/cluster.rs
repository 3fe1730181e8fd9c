//! Redis Cluster specifics against a private 3-master cluster: hash tags checked with the
//! server's `CLUSTER KEYSLOT`, slot migration while a lease is held (docs/faults.md row 15),
//! listing across primaries, a node killed and restarted without its data, and with it (the
//! append-only file on).

mod common;
#[path = "support/os_crash.rs"]
mod os_crash;

use std::sync::Arc;
use std::time::Duration;

use common::Cluster;
use leasehold_core::{
    AcquireOutcome, Fence, Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome, RenewOutcome,
    Store, StoreErrorKind,
};
use leasehold_core::{BatchStore, WaitStore, WatchStore};
use leasehold_redis::{RedisConfig, RedisFactory, RedisStore};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{RedisCluster, RedisOptions};
use tokio::time::{Instant, sleep, timeout};

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

/// The subscribers of `channel`: sharded (`SHARDNUMSUB` on the node serving `slot`) and
/// classic (`NUMSUB` on every node, joined by ` | `), as each node's `redis-cli` prints
/// them.
fn subscriptions(c: &Cluster, slot: u16, channel: &str) -> (String, String) {
    tokio::task::block_in_place(|| {
        (
            c.cluster
                .node_for_slot(slot)
                .cli(&["PUBSUB", "SHARDNUMSUB", channel]),
            c.cluster
                .nodes()
                .iter()
                .map(|n| n.cli(&["PUBSUB", "NUMSUB", channel]))
                .collect::<Vec<_>>()
                .join(" | "),
        )
    })
}

async fn acquired(store: &dyn Store, k: &Key, o: &OwnerToken, ttl: Duration) -> Fence {
    match store.acquire(k, o, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{k}: expected Acquired, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tricky_keys_keep_lease_and_fence_in_one_slot() {
    let c = Cluster::start().await;
    let tricky = [
        "{a}x",
        "x{a}",
        "{}a",
        "{}{a}",
        "{{a}}",
        "a}{b}",
        "}",
        "}a",
        "{",
        "{}",
        "a{",
        "%",
        "%7D",
        "{a",
        "a}",
        "}{",
        "job:{tenant-1}:x",
        "job:ü{é}",
    ];
    let ttl = Duration::from_secs(10);
    let mut slots = std::collections::HashSet::new();
    for name in tricky {
        let k = key(name);
        let (lease_key, fence_key) = (c.store.lease_key(&k), c.store.fence_key(&k));
        let (ls, fs) = tokio::task::block_in_place(|| {
            (c.cluster.keyslot(&lease_key), c.cluster.keyslot(&fence_key))
        });
        assert_eq!(
            ls, fs,
            "{name:?}: {lease_key} and {fence_key} are in different slots"
        );
        slots.insert(ls);
        // The scripts run (no CROSSSLOT) and the keys stay distinct.
        let o = OwnerToken::random();
        acquired(&*c.store, &k, &o, ttl).await;
        assert_eq!(
            c.store.inspect(&k).await.unwrap().unwrap().owner,
            o,
            "{name:?}"
        );
    }
    assert!(slots.len() > 5, "keys should spread over slots: {slots:?}");
    for name in tricky {
        let k = key(name);
        let info = c.store.inspect(&k).await.unwrap().unwrap();
        assert_eq!(
            c.store.release(&k, &info.owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_15_slot_migrated_while_held() {
    let c = Cluster::start().await;
    // Generous: a renewal cancelled by its timeout makes the store reconnect to the whole
    // cluster, which must fit in the next renewal's timeout on a loaded machine.
    let ttl = Duration::from_secs(3);
    let client = LeaseClient::new(c.store.clone(), LeaseConfig::new(ttl).unwrap());
    let k = key("job:migrating");
    let lease = client.try_acquire(&k).await.unwrap();
    let lease_key = c.store.lease_key(&k);
    let fence_key = c.store.fence_key(&k);
    let cluster = c.cluster.clone();
    let (slot, from) = tokio::task::block_in_place(|| {
        let slot = cluster.keyslot(&lease_key);
        (slot, cluster.node_index_for_slot(slot))
    });
    let to = (from + 1) % 3;
    let (source, target) = (&c.cluster.nodes()[from], &c.cluster.nodes()[to]);
    let slot_s = slot.to_string();

    // Half way: IMPORTING/MIGRATING set, the lease key moved, the fence key not yet.
    tokio::task::block_in_place(|| {
        assert_eq!(
            target.cli(&[
                "CLUSTER",
                "SETSLOT",
                &slot_s,
                "IMPORTING",
                c.cluster.node_id(from)
            ]),
            "OK"
        );
        assert_eq!(
            source.cli(&[
                "CLUSTER",
                "SETSLOT",
                &slot_s,
                "MIGRATING",
                c.cluster.node_id(to)
            ]),
            "OK"
        );
        let port = target.port().to_string();
        assert_eq!(
            source.cli(&["MIGRATE", "127.0.0.1", &port, &lease_key, "0", "5000"]),
            "OK"
        );
    });
    // The holder's renew (one key) follows ASK to the target.
    assert_eq!(
        c.store.renew(&k, lease.owner(), ttl).await.unwrap(),
        RenewOutcome::Renewed { ttl }
    );
    let info = c.store.inspect(&k).await.unwrap().unwrap();
    assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
    // Another owner's acquire (two keys, split between the nodes for now) never gets it:
    // the cluster answers TRYAGAIN until the slot is whole again.
    let contender = {
        let store = c.store.clone();
        let k = k.clone();
        tokio::spawn(async move { store.acquire(&k, &OwnerToken::random(), ttl).await })
    };
    sleep(Duration::from_millis(100)).await;
    // Finish the migration.
    tokio::task::block_in_place(|| {
        let port = target.port().to_string();
        assert_eq!(
            source.cli(&["MIGRATE", "127.0.0.1", &port, &fence_key, "0", "5000"]),
            "OK"
        );
        let set = ["CLUSTER", "SETSLOT", &slot_s, "NODE", c.cluster.node_id(to)];
        for node in c.cluster.nodes() {
            assert_eq!(node.cli(&set), "OK");
        }
    });
    match contender.await.unwrap() {
        Ok(AcquireOutcome::Held { .. }) => {}
        Err(e) if e.is_retryable() => {}
        other => panic!("a contender during the migration got {other:?}"),
    }
    // The lease kept renewing through the move (MOVED followed), never lost.
    sleep(ttl).await;
    assert!(
        lease.is_valid(),
        "lost during the migration: {:?}",
        lease.lost_reason()
    );
    let info = c.store.inspect(&k).await.unwrap().unwrap();
    assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
    assert_eq!(
        tokio::task::block_in_place(|| c.cluster.node_index_for_slot(slot)),
        to
    );
    // A second, complete migration with the testkit's helper, then release and re-grant.
    let cluster = c.cluster.clone();
    tokio::task::spawn_blocking(move || cluster.migrate_slot(slot, to, from))
        .await
        .unwrap();
    sleep(ttl / 2).await;
    assert!(lease.is_valid());
    let before = lease.fence();
    assert!(lease.release().await.unwrap());
    let next = client.try_acquire(&k).await.unwrap();
    assert!(next.fence() > before);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_covers_every_primary() {
    let c = Cluster::start().await;
    let ttl = Duration::from_secs(10);
    let mut held = Vec::new();
    for i in 0..30 {
        let k = key(&format!("job:spread-{i}"));
        let o = OwnerToken::random();
        let f = acquired(&*c.store, &k, &o, ttl).await;
        held.push((k, o, f));
    }
    acquired(&*c.store, &key("other:x"), &OwnerToken::random(), ttl).await;
    let nodes: std::collections::HashSet<usize> = tokio::task::block_in_place(|| {
        held.iter()
            .map(|(k, _, _)| {
                c.cluster
                    .node_index_for_slot(c.cluster.keyslot(&c.store.lease_key(k)))
            })
            .collect()
    });
    assert_eq!(nodes.len(), 3, "the keys should land on every node");
    let list = c.store.list("job:spread-").await.unwrap();
    assert_eq!(list.len(), 30);
    for info in list {
        let (_, o, f) = held.iter().find(|(k, _, _)| *k == info.key).unwrap();
        assert_eq!((info.owner, info.fence), (*o, *f));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_urls_open_through_the_registry() {
    let c = Cluster::start().await;
    let seeds: Vec<String> = c
        .cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let mut registry = leasehold_core::Registry::new();
    registry.register(Arc::new(RedisFactory));
    // A dead seed first: the client tries the next one.
    let url = format!(
        "redis+cluster://127.0.0.1:{},{}/?prefix=reg:&timeout=2s",
        leasehold_testkit::free_port(),
        seeds.join(",")
    );
    let store = registry.open(&url).await.unwrap();
    let k = key("job:registry");
    let o = OwnerToken::random();
    let f = acquired(&*store, &k, &o, Duration::from_secs(5)).await;
    assert_eq!(
        c.cli(&["GET", "reg:{job:registry}"]).await,
        format!("{}:{f}", o.to_hex())
    );
    let cfg = RedisConfig::from_url(&url).unwrap();
    assert!(cfg.is_cluster());
    assert_eq!(RedisConfig::from_url(&cfg.to_string()).unwrap(), cfg);
    // No live seed: Unavailable, quickly.
    let dead = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{}/?connect_timeout=500ms",
        leasehold_testkit::free_port(),
        leasehold_testkit::free_port()
    );
    let e = timeout(Duration::from_secs(5), RedisStore::open(&dead))
        .await
        .expect("bounded")
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_kill_9_and_restart_fences_never_go_back() {
    let _proof = proves(Backend::RedisCluster, Fault::RestartWithoutPersistence);
    let c = Cluster::start().await;
    let ttl = Duration::from_secs(5);
    let k = key("job:node-crash");
    let mut highest = Fence(0);
    for _ in 0..50 {
        let o = OwnerToken::random();
        let f = acquired(&*c.store, &k, &o, ttl).await;
        assert!(f > highest);
        highest = f;
        c.store.release(&k, &o).await.unwrap();
    }
    let cluster = c.cluster.clone();
    let fence_key = c.store.fence_key(&k);
    tokio::task::spawn_blocking(move || {
        let node = cluster.node_for_slot(cluster.keyslot(&fence_key));
        node.restart(); // SIGKILL, start again at once: same id and slots, no data
        cluster.wait_state_ok(Duration::from_secs(30));
        assert_eq!(
            node.cli(&["EXISTS", &fence_key]),
            "0",
            "the fence key was lost"
        );
    })
    .await
    .unwrap();
    let mut next = None;
    for _ in 0..20 {
        match c.store.acquire(&k, &OwnerToken::random(), ttl).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => {
                next = Some(fence);
                break;
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let next = next.expect("acquire after the node restart");
    assert!(next > highest, "fence went back: {next} <= {highest}");
}

/// docs/faults.md row 9 on a cluster whose nodes run with the append-only file on
/// (`appendfsync everysec`, the default): the node owning a held, renewed lease's slot is
/// killed (`kill -9`, no time for a sync) and started again on its directory. Redis wrote
/// the grant and every renewal to the file before it replied, and the kernel keeps what
/// was written when the process dies: the node comes back with the lease, its owner and
/// its fence. For a TTL after the node is back (past the expiry of anything granted before
/// the kill), a contender asking every 100 ms is refused each time while the holder stays
/// valid; the holder's renewals go on on the restarted node; the next fence after its
/// release is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_kill_9_with_appendonly_keeps_the_lease_and_its_fence() {
    let _proof = proves(Backend::RedisCluster, Fault::RestartWithPersistence);
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| {
            RedisCluster::start_with(3, RedisOptions::new().appendonly(true))
        })
        .await
        .unwrap(),
    );
    let nodes: Vec<String> = cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!(
        "redis+cluster://{}/?timeout=2s&connect_timeout=1s",
        nodes.join(",")
    );
    let store = Arc::new(RedisStore::open(&url).await.unwrap());
    let contender = RedisStore::open(&url).await.unwrap();
    let ttl = Duration::from_secs(6);
    let config = LeaseConfig::new(ttl).unwrap();
    let client = LeaseClient::new(store.clone(), config.clone());
    let k = key("job:node-crash-persisted");
    let lease = client.try_acquire(&k).await.unwrap();
    // A renewal before the crash, so that the file holds one too.
    let granted = lease.valid_until();
    while lease.valid_until() == granted {
        assert!(lease.is_valid(), "lost before the crash");
        sleep(Duration::from_millis(50)).await;
    }
    let (fence_key, lease_key) = (store.fence_key(&k), store.lease_key(&k));
    let fence_record = {
        let (cluster, fk) = (cluster.clone(), fence_key.clone());
        tokio::task::spawn_blocking(move || cluster.cli(&["GET", &fk]))
            .await
            .unwrap()
    };
    let before = {
        let (cluster, lk) = (cluster.clone(), lease_key.clone());
        tokio::task::spawn_blocking(move || {
            let node = cluster.node_for_slot(cluster.keyslot(&lk));
            let before = node.cli(&["GET", &lk]);
            node.restart(); // SIGKILL, start again on the same directory (and config file)
            cluster.wait_state_ok(Duration::from_secs(30));
            let after = node.cli(&["GET", &lk]);
            assert_eq!(after, before, "the node came back without the lease");
            before
        })
        .await
        .unwrap()
    };
    assert_eq!(
        before,
        format!("{}:{}", lease.owner().to_hex(), lease.fence()),
        "the lease key holds the owner and fence"
    );
    let back = Instant::now();
    let fence_after = {
        let (cluster, fk) = (cluster.clone(), fence_key.clone());
        tokio::task::spawn_blocking(move || cluster.cli(&["GET", &fk]))
            .await
            .unwrap()
    };
    assert_eq!(fence_after, fence_record, "the fence record survived");
    // For a TTL after the node is back: the contender is refused every time, the holder
    // stays valid, and it renews on the restarted node (its deadline moves past `back`).
    let other = OwnerToken::random();
    let mut refused = 0;
    while back.elapsed() < ttl {
        match contender.acquire(&k, &other, ttl).await {
            Ok(AcquireOutcome::Held { .. }) => refused += 1,
            Ok(granted) => panic!(
                "a contender got the lease after the node restart while its holder held it                  (valid: {}): {granted:?}",
                lease.is_valid()
            ),
            // The connection to the restarted node broke with it.
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        assert!(
            lease.is_valid(),
            "the holder lost its lease after the node restart: {:?}",
            lease.lost_reason()
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        refused >= 10,
        "the contender was answered only {refused} times"
    );
    // A deadline past `back` + the validity comes from a renewal sent after `back`.
    assert!(
        lease.valid_until() > back + config.validity(ttl),
        "no renewal on the restarted node: the deadline is {:?} after it came back",
        lease.valid_until().saturating_duration_since(back)
    );
    let info = store.inspect(&k).await.unwrap().expect("still held");
    assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
    let old = lease.fence();
    assert!(lease.release().await.unwrap());
    let next = client.try_acquire(&k).await.unwrap();
    assert!(next.fence() > old, "fence {} after {old}", next.fence());
    assert!(next.release().await.unwrap());
}

/// docs/faults.md row 31 on a cluster node: an operating-system crash of the node owning
/// the keys, with `appendfsync everysec` (the default), simulated as on a single server
/// (`os_crash::os_crash_after`): the acknowledged writes of the last second are lost. Holder
/// H's grant vanished, so a contender acquires at once while H still believes; holder H2's
/// renewal vanished, so the node frees its lease earlier than H2's deadline. Fences still
/// rise: the contender's is above H's (the node's clock floor), though H's fence record
/// was lost too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_os_crash_with_everysec_loses_the_last_second_fences_still_rise() {
    let _proof = proves(Backend::RedisCluster, Fault::RestartWithPersistence);
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| {
            RedisCluster::start_with(3, RedisOptions::new().appendonly(true))
        })
        .await
        .unwrap(),
    );
    let nodes: Vec<String> = cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!(
        "redis+cluster://{}/?timeout=2s&connect_timeout=1s",
        nodes.join(",")
    );
    let store = Arc::new(RedisStore::open(&url).await.unwrap());
    let ttl = Duration::from_secs(30);
    let config = LeaseConfig::new(ttl).unwrap();
    let client = LeaseClient::new(store.clone(), config.clone());
    // Keys whose slots one node owns: H2's, then one per attempt of the crash window.
    let keys: Vec<Key> = tokio::task::block_in_place(|| {
        let node_of = |k: &Key| cluster.node_index_for_slot(cluster.keyslot(&store.lease_key(k)));
        let first = key("job:os-crash-renewed");
        let idx = node_of(&first);
        let mut keys = vec![first];
        keys.extend(
            (0..)
                .map(|i| key(&format!("job:os-crash-{i}")))
                .filter(|k| node_of(k) == idx)
                .take(5),
        );
        keys
    });
    let idx = tokio::task::block_in_place(|| {
        cluster.node_index_for_slot(cluster.keyslot(&store.lease_key(&keys[0])))
    });
    let node = cluster.node(idx);
    // H2's lease, granted before the window (synced by the time the window opens).
    let renew_ttl = Duration::from_secs(8);
    let (k2, h2) = (keys[0].clone(), OwnerToken::random());
    store.acquire(&k2, &h2, renew_ttl).await.unwrap();
    let marker = format!("{}:sync-marker", store.lease_key(&k2));
    let (k, lease, renewed_at) = os_crash::os_crash_after(node, &marker, |round| {
        let client = client.clone();
        let (store, k2, h2) = (store.clone(), k2.clone(), h2);
        let k = keys[1 + round as usize].clone();
        async move {
            let lease = client.try_acquire(&k).await.unwrap();
            let renewed_at = Instant::now();
            assert_eq!(
                store.renew(&k2, &h2, renew_ttl).await.unwrap(),
                RenewOutcome::Renewed { ttl: renew_ttl }
            );
            (k, lease, renewed_at)
        }
    })
    .await;
    tokio::task::block_in_place(|| cluster.wait_state_ok(Duration::from_secs(30)));
    // H's grant is gone: a contender acquires at once, while H still believes, with a
    // higher fence (the clock floor).
    let contender = OwnerToken::random();
    let mut got = None;
    for _ in 0..20 {
        match store.acquire(&k, &contender, ttl).await {
            Ok(r) => {
                got = Some(r);
                break;
            }
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let fence = match got.expect("the node answers after the restart") {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("the lost grant is still there: {other:?}"),
    };
    assert!(
        lease.is_valid(),
        "H stopped believing before the contender's grant"
    );
    assert!(
        fence > lease.fence(),
        "fence went back: {fence} <= {}",
        lease.fence()
    );
    // H2's lease is there (its grant was synced) but its renewal is gone: the node frees
    // it before H2's deadline.
    let info = store
        .inspect(&k2)
        .await
        .unwrap()
        .expect("H2's grant was synced");
    assert_eq!(info.owner, h2);
    let store_frees_at = Instant::now() + info.remaining.unwrap();
    let h2_deadline = renewed_at + config.validity(renew_ttl);
    assert!(
        store_frees_at < h2_deadline,
        "H2's renewal survived the crash (the node frees the lease {:?} after H2's deadline)",
        store_frees_at - h2_deadline
    );
    // H learns at its next renewal.
    assert_eq!(
        store.renew(&k, lease.owner(), ttl).await.unwrap(),
        RenewOutcome::NotOwner
    );
}

/// `holder` holds `k` while `waiter` waits on it as a fresh owner; the shard subscriber
/// count of `k`'s channel on its own node and the classic ones on every node while it
/// waits; then the holder releases and the waiter must return soon (the holder's TTL is
/// 30 s away).
async fn notified_on(
    c: &Cluster,
    holder: &RedisStore,
    waiter: Arc<RedisStore>,
    tag: &str,
) -> (String, String) {
    let k = key(&format!("job:notify-{tag}"));
    let h = OwnerToken::random();
    acquired(holder, &k, &h, Duration::from_secs(30)).await;
    let wait = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            waiter
                .wait_released(&k, &OwnerToken::random(), Duration::from_secs(60))
                .await
        })
    };
    let channel = format!("{}:released", c.store.lease_key(&k));
    let slot = tokio::task::block_in_place(|| c.cluster.keyslot(&channel));
    let counts = || subscriptions(c, slot, &channel);
    // Subscribed before it queues: look until the subscription shows (bounded).
    let mut seen = counts();
    for _ in 0..50 {
        if !(seen.0.ends_with("\n0") && seen.1.split(" | ").all(|n| n.ends_with("\n0"))) {
            break;
        }
        sleep(Duration::from_millis(100)).await;
        seen = counts();
    }
    assert!(
        !wait.is_finished(),
        "the wait returned while the lease was held"
    );
    assert_eq!(
        holder.release(&k, &h).await.unwrap(),
        ReleaseOutcome::Released
    );
    timeout(Duration::from_secs(5), wait)
        .await
        .expect("woken by the release, not at the holder's TTL")
        .unwrap()
        .unwrap();
    seen
}

/// On a Cluster, release notifications are sharded by default (issue 14.2): the waiter
/// subscribes with `SSUBSCRIBE` on the node that owns the key's slot, and nobody holds a
/// classic subscription; with `sharded_pubsub=false` (on every client) it is the other way
/// round. Either way the release wakes the waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_are_sharded_on_a_cluster() {
    let c = Cluster::start().await;
    assert!(c.config.sharded_pubsub());
    let sharded = Arc::new(RedisStore::new(c.config.clone()).unwrap());
    let (shard, classic) = notified_on(&c, &c.store, sharded, "sharded").await;
    assert!(shard.ends_with("\n1"), "SHARDNUMSUB: {shard:?}");
    assert!(
        classic.split(" | ").all(|n| n.ends_with("\n0")),
        "NUMSUB: {classic:?}"
    );

    let url = format!("{}&sharded_pubsub=false", c.config);
    let cfg = RedisConfig::from_url(&url).unwrap();
    assert!(!cfg.sharded_pubsub());
    let classic_holder = RedisStore::new(cfg.clone()).unwrap();
    let classic_store = Arc::new(RedisStore::new(cfg).unwrap());
    let (shard, classic) = notified_on(&c, &classic_holder, classic_store, "classic").await;
    assert!(shard.ends_with("\n0"), "SHARDNUMSUB: {shard:?}");
    assert!(
        classic.split(" | ").any(|n| n.ends_with("\n1")),
        "NUMSUB: {classic:?}"
    );
}

/// A watch on a Cluster subscribes with `SSUBSCRIBE` on the key's node (no classic
/// subscription anywhere) and hears a grant made by another store. When that node
/// restarts, the watch ends with the error of a lost pub/sub connection — the cluster
/// client subscribes again by itself once the node is back, and the notices published
/// meanwhile would otherwise be missed without a word — and a new watch hears the next
/// grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_cluster_is_sharded_and_reports_a_node_restart() {
    use futures::StreamExt;
    let c = Cluster::start().await;
    let other = RedisStore::new(c.config.clone()).unwrap();
    let k = key("job:watched");
    let mut changes = c.store.watch(&k).await.unwrap();
    let channel = format!("{}:released", c.store.lease_key(&k));
    let slot = tokio::task::block_in_place(|| c.cluster.keyslot(&channel));
    let (shard, classic) = subscriptions(&c, slot, &channel);
    assert!(shard.ends_with("\n1"), "SHARDNUMSUB: {shard:?}");
    assert!(
        classic.split(" | ").all(|n| n.ends_with("\n0")),
        "NUMSUB: {classic:?}"
    );
    let o = OwnerToken::random();
    acquired(&other, &k, &o, Duration::from_secs(30)).await;
    let notice = timeout(Duration::from_secs(5), changes.next()).await;
    assert!(matches!(notice, Ok(Some(Ok(())))), "{notice:?}");

    let cluster = c.cluster.clone();
    tokio::task::spawn_blocking(move || {
        cluster.node_for_slot(slot).restart();
        cluster.wait_state_ok(Duration::from_secs(30));
    })
    .await
    .unwrap();
    let end = timeout(Duration::from_secs(15), async {
        loop {
            match changes.next().await {
                Some(Ok(())) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the watch said nothing of the node restart");
    let e = end.expect("an error, not the bare end").unwrap_err();
    assert!(e.to_string().contains("pub/sub connection was lost"), "{e}");

    let mut changes = timeout(Duration::from_secs(20), async {
        loop {
            match c.store.watch(&k).await {
                Ok(c) => return c,
                Err(_) => sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
    .expect("watching again after the node restart");
    let o = OwnerToken::random();
    let mut tries = 0;
    loop {
        match other.acquire(&k, &o, Duration::from_secs(30)).await {
            Ok(AcquireOutcome::Acquired { .. }) => break,
            other => {
                tries += 1;
                assert!(tries < 20, "acquire after the node restart: {other:?}");
                sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let notice = timeout(Duration::from_secs(5), changes.next()).await;
    assert!(matches!(notice, Ok(Some(Ok(())))), "{notice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_work_on_a_cluster_one_slot_at_a_time() {
    let c = Cluster::start().await;
    assert!(
        !c.store.atomic_acquire_any(),
        "the slots hash to different Cluster slots: no one script"
    );
    let client = LeaseClient::new(
        c.store.clone(),
        LeaseConfig::new(Duration::from_secs(30)).unwrap(),
    );
    let sem = client.semaphore("export:cluster", 3).unwrap();
    let a = sem.try_acquire().await.unwrap();
    let b = sem.try_acquire().await.unwrap();
    let d = sem.try_acquire().await.unwrap();
    let mut taken = vec![a.slot(), b.slot(), d.slot()];
    taken.sort();
    assert_eq!(taken, vec![0, 1, 2], "three permits, three slots");
    let err = sem.try_acquire().await.unwrap_err();
    assert!(
        matches!(err, leasehold_core::Error::WaitTimeout { .. }),
        "{err}"
    );
    // The owner's own slot comes first on a Cluster too (the default `acquire_any`).
    let me = OwnerToken::random();
    let keys: Vec<Key> = (0..3).map(|i| key(&format!("cluster:any#{i}"))).collect();
    let f2 = acquired(&*c.store, &keys[2], &me, Duration::from_secs(5)).await;
    match c
        .store
        .acquire_any(&keys, &me, Duration::from_secs(5))
        .await
        .unwrap()
    {
        leasehold_core::AcquireAnyOutcome::Acquired { index, fence, .. } => {
            assert_eq!((index, fence), (2, f2), "the owner's key, same fence");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.store.inspect(&keys[0]).await.unwrap(), None);
    let fence = b.fence();
    let slot = b.slot();
    b.release().await.unwrap();
    let again = sem.try_acquire().await.unwrap();
    assert_eq!(again.slot(), slot, "the freed slot");
    assert!(again.fence() > fence, "fences per slot rise");
    drop((a, d, again));
}
