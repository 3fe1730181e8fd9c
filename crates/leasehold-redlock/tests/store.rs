//! Store tests against private servers: URLs and bad input, node failures (docs/faults.md rows 12
//! and 13), restarts of nodes that keep their data (the append-only file on), and a history
//! check of the fences across changing majorities.

mod common;
// The simulated operating-system crash of a Redis server, shared with leasehold-redis.
#[path = "../../leasehold-redis/tests/support/os_crash.rs"]
mod os_crash;

use std::sync::Arc;
use std::time::Duration;

use common::{Set, cli};
use leasehold_core::{
    AcquireOutcome, Fence, Key, Lease, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome,
    RenewOutcome, Store, StoreErrorKind,
};
use leasehold_redlock::{RedlockConfig, RedlockStore};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{ProxyMode, RedisOptions, RedisServer};
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(3);

fn key(name: &str) -> Key {
    Key::new(format!("store:{name}")).unwrap()
}

fn fence_of(what: &str, o: AcquireOutcome) -> Fence {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{what}: expected a grant, got {other:?}"),
    }
}

/// Acquires as a fresh owner, retrying retryable errors for up to 10 s (a node just cut
/// off or brought back).
async fn acquire_fresh(store: &RedlockStore, k: &Key, ttl: Duration) -> (OwnerToken, Fence) {
    let owner = OwnerToken::random();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.acquire(k, &owner, ttl).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => return (owner, fence),
            Ok(held) => panic!("acquire of a free key: {held:?}"),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("acquire of a free key: {e}"),
        }
    }
}

/// Whether server `i` holds the lease key of `k`.
async fn on_node(set: &Set, i: usize, k: &Key) -> bool {
    cli(&set.servers[i], &["EXISTS", &set.store.lease_key(k)])
        .await
        .trim()
        == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_sets_get_typed_errors() {
    for bad in [
        "redis://127.0.0.1:1",
        "redlock://127.0.0.1:1,127.0.0.1:2",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:1",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout=0s",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/2",
    ] {
        let err = RedlockStore::open(bad).await.expect_err(bad);
        assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}: {err}");
    }
    // Nothing listens on these ports (taken from the allocator, never bound).
    let ports: Vec<u16> = (0..3).map(|_| leasehold_testkit::free_port()).collect();
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        ports[0], ports[1], ports[2]
    );
    let err = RedlockStore::open(&url).await.expect_err("no node is up");
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
}

/// docs/faults.md row 25 for Redlock: a node whose `maxmemory-policy` may evict keys forgets
/// leases early, so the store refuses to open (a `Config` error naming the node and the
/// policy) unless `allow_eviction=true` says it is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_may_evict_keys_is_refused_unless_allowed() {
    let _proof = proves(Backend::Redlock, Fault::Eviction);
    let set = Set::start().await;
    let evicting = set.servers[1].port();
    assert_eq!(
        set.cli(1, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
            .await,
        "OK"
    );
    let err = RedlockStore::open(&set.url())
        .await
        .expect_err("an evicting node");
    assert_eq!(err.kind(), StoreErrorKind::Config, "{err}");
    assert!(
        err.to_string().contains("allkeys-lru") && err.to_string().contains(&evicting.to_string()),
        "{err}"
    );
    let allowed = format!("{}?allow_eviction=true", set.url());
    let store = RedlockStore::open(&allowed)
        .await
        .expect("accepted explicitly");
    assert!(store.config().eviction_allowed());
    assert!(
        RedlockStore::open(&format!("{}?allow_eviction=maybe", set.url()))
            .await
            .is_err()
    );
    // Back to noeviction: opens without the parameter.
    assert_eq!(
        set.cli(1, &["CONFIG", "SET", "maxmemory-policy", "noeviction"])
            .await,
        "OK"
    );
    RedlockStore::open(&set.url())
        .await
        .expect("noeviction everywhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_checked_and_never_shown() {
    let servers: Vec<RedisServer> = tokio::task::spawn_blocking(|| {
        (0..3)
            .map(|_| RedisServer::start_with(RedisOptions::new().password("right-pw-123")))
            .collect()
    })
    .await
    .unwrap();
    let nodes: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let wrong = format!("redlock://:wrong-pw-456@{}", nodes.join(","));
    let err = RedlockStore::open(&wrong)
        .await
        .expect_err("wrong password");
    assert_eq!(err.kind(), StoreErrorKind::Config, "{err}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("wrong-pw-456"), "{shown}");
    let none = format!("redlock://{}", nodes.join(","));
    let err = RedlockStore::open(&none).await.expect_err("no password");
    assert_eq!(err.kind(), StoreErrorKind::Config, "{err}");
    let right = format!("redlock://:right-pw-123@{}", nodes.join(","));
    let store = RedlockStore::open(&right).await.expect("right password");
    assert!(!format!("{store:?}").contains("right-pw-123"));
    let k = key("auth");
    let owner = OwnerToken::random();
    fence_of("auth", store.acquire(&k, &owner, TTL).await.unwrap());
    assert_eq!(
        store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_on_one_node_is_corrupt_not_free() {
    let set = Set::start().await;
    let k = key("wrong-type");
    set.cli(0, &["RPUSH", &set.store.lease_key(&k), "x"]).await;
    let err = set
        .store
        .acquire(&k, &OwnerToken::random(), TTL)
        .await
        .expect_err("a list in the way");
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert!(!on_node(&set, 1, &k).await && !on_node(&set, 2, &k).await);
    assert_eq!(
        set.cli(0, &["TYPE", &set.store.lease_key(&k)]).await,
        "list"
    );
}

/// docs/faults.md row 12: one node of three killed, then one paused: the store still grants,
/// renews, inspects and releases on the majority, within the per-node timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_or_paused_still_grants() {
    let set = Set::start().await;
    let store = &set.store;
    let k = key("minority");
    set.servers[2].kill();
    let (a, fa) = acquire_fresh(store, &k, TTL).await;
    assert!(on_node(&set, 0, &k).await && on_node(&set, 1, &k).await);
    assert!(matches!(
        store.renew(&k, &a, TTL).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    let info = store.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.owner, info.fence), (a, fa));
    match store.acquire(&k, &OwnerToken::random(), TTL).await.unwrap() {
        AcquireOutcome::Held { remaining } => assert!(remaining.is_some()),
        other => panic!("a second owner was granted a held lease: {other:?}"),
    }
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(!on_node(&set, 0, &k).await && !on_node(&set, 1, &k).await);

    // Node 2 back, node 1 paused (SIGSTOP): its requests time out, the other two decide.
    set.servers[2].start_again();
    set.servers[1].pause();
    let started = Instant::now();
    let (b, fb) = acquire_fresh(store, &k, TTL).await;
    eprintln!("acquire with a paused node took {:?}", started.elapsed());
    assert!(fb > fa, "fence {fb} after {fa}");
    assert_eq!(
        store.release(&k, &b).await.unwrap(),
        ReleaseOutcome::Released
    );
    set.servers[1].resume();
    let (c, fc) = acquire_fresh(store, &k, TTL).await;
    assert!(fc > fb, "fence {fc} after {fb}");
    store.release(&k, &c).await.unwrap();
}

/// The lease and fence keys of `k` on every node, as `GET` shows them.
async fn keys_on_nodes(set: &Set, k: &Key) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in &set.servers {
        let lease = cli(s, &["GET", &set.store.lease_key(k)]).await;
        let fence = cli(s, &["GET", &set.store.fence_key(k)]).await;
        out.push((lease, fence));
    }
    out
}

/// For a TTL from `back`: a contender asking every 100 ms is refused each time while the
/// holder stays valid, and the holder renews (a deadline past `back` plus the validity of
/// its last grant comes from a renewal sent after `back`).
async fn kept_through(what: &str, lease: &Lease, contender: &RedlockStore, back: Instant) {
    let other = OwnerToken::random();
    let mut refused = 0;
    while back.elapsed() < lease_ttl() {
        match contender.acquire(lease.key(), &other, lease_ttl()).await {
            Ok(AcquireOutcome::Held { .. }) => refused += 1,
            Ok(granted) => panic!(
                "{what}: a contender got the lease while its holder held it (valid: {}): \
                 {granted:?}",
                lease.is_valid()
            ),
            // A connection the restart broke.
            Err(e) => assert!(e.is_retryable(), "{what}: {e}"),
        }
        assert!(
            lease.is_valid(),
            "{what}: the holder lost its lease: {:?}",
            lease.lost_reason()
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        refused >= 10,
        "{what}: the contender was answered only {refused} times"
    );
    let validity = LeaseConfig::new(lease_ttl()).unwrap().validity(lease.ttl());
    assert!(
        lease.valid_until() > back + validity,
        "{what}: no renewal after the restart (deadline {:?} after it)",
        lease.valid_until().saturating_duration_since(back)
    );
}

/// The TTL of the lease held across restarts.
fn lease_ttl() -> Duration {
    Duration::from_secs(6)
}

/// Restarts of nodes that keep their data (`appendonly yes`, `appendfsync everysec`): a
/// lease held and renewed by a lease client on all three nodes; each node in turn is
/// killed (`kill -9`, no time for a sync) and started again on its directory, then all
/// three at once. Redis wrote each grant and renewal to the file before it replied, and
/// the kernel keeps what was written when the process dies: every node comes back with
/// the lease key (owner and fence) and the fence key as they were, and the holder stays
/// valid. After the restart of all three, for a TTL (past the expiry of anything granted
/// before it: a set restarted empty would let the contender in at once), a contender is
/// refused each time while the holder stays valid, and the holder's renewals go on on
/// the restarted nodes; the next fence after its release is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_restarted_with_their_data_keep_the_lease_its_fence_and_its_renewals() {
    let _proof = proves(Backend::Redlock, Fault::RestartWithPersistence);
    let set = Set::start_with(3, RedisOptions::new().appendonly(true)).await;
    let contender = RedlockStore::open(&set.url()).await.unwrap();
    let client = LeaseClient::new(set.store.clone(), LeaseConfig::new(lease_ttl()).unwrap());
    let k = key("persisted");
    let lease = client.try_acquire(&k).await.unwrap();
    let fence = lease.fence();
    let held = keys_on_nodes(&set, &k).await;
    for (i, (l, f)) in held.iter().enumerate() {
        assert!(
            l.starts_with(&lease.owner().to_hex()) && !f.is_empty(),
            "setup: node {i} has no lease ({l:?}) or fence ({f:?})"
        );
    }
    for (i, s) in set.servers.iter().enumerate() {
        let s = s.clone();
        tokio::task::spawn_blocking(move || s.restart())
            .await
            .unwrap();
        let back = Instant::now();
        assert_eq!(
            keys_on_nodes(&set, &k).await,
            held,
            "node {i} restarted: the lease or fence keys changed"
        );
        // Two of three nodes would refuse even had it come back empty: the restarted
        // node's own answer is checked by its keys, and the whole set's below.
        assert!(
            lease.is_valid(),
            "node {i} restarted: the holder lost its lease"
        );
        assert!(
            lease.valid_until() > back,
            "node {i} restarted: the holder's deadline passed"
        );
    }
    let s = set.servers.clone();
    tokio::task::spawn_blocking(move || {
        for s in &s {
            s.kill();
        }
        for s in &s {
            s.start_again();
        }
    })
    .await
    .unwrap();
    let back = Instant::now();
    assert_eq!(
        keys_on_nodes(&set, &k).await,
        held,
        "every node restarted: the lease or fence keys changed"
    );
    kept_through("every node restarted", &lease, &contender, back).await;
    let info = set.store.inspect(&k).await.unwrap().expect("still held");
    assert_eq!((info.owner, info.fence), (*lease.owner(), fence));
    assert!(lease.release().await.unwrap());
    let (o, next) = acquire_fresh(&set.store, &k, TTL).await;
    assert!(next > fence, "fence {next} after {fence}");
    set.store.release(&k, &o).await.unwrap();
}

/// An operating-system crash of one node with `appendonly yes` and `appendfsync everysec`
/// (the default), simulated as on a single server (`os_crash::os_crash_after`, docs/faults.md
/// row 31: the node's file cut back to its last sync), under a holder with a bare majority
/// (the third node cut off when it acquired): the node loses the holder's grant, so with
/// the third node back a contender gets the lease while the holder still believes; its
/// fence is higher (written back to a majority, floored at the node clocks), so the guard
/// rejects the older holder's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_os_crash_under_a_bare_majority_holder_loses_its_grant_fences_still_rise() {
    let _proof = proves(Backend::Redlock, Fault::RestartWithPersistence);
    let set = Set::start_with(3, RedisOptions::new().appendonly(true)).await;
    // A long TTL: the holder still believes when the contender asks.
    let client = LeaseClient::new(
        set.store.clone(),
        LeaseConfig::new(Duration::from_secs(30)).unwrap(),
    );
    set.proxies[2].set_mode(ProxyMode::Reset);
    let (k, lease) = os_crash::os_crash_after(&set.servers[1], "lh-test:sync-marker", |round| {
        let client = client.clone();
        async move {
            let k = key(&format!("os-crash-{round}"));
            let lease = client.try_acquire(&k).await.unwrap();
            (k, lease)
        }
    })
    .await;
    set.proxies[2].set_mode(ProxyMode::Pass);
    assert!(
        on_node(&set, 0, &k).await,
        "setup: the grant is not on node 0"
    );
    assert!(
        !on_node(&set, 1, &k).await,
        "the crashed node kept the grant of its last second"
    );
    assert!(!on_node(&set, 2, &k).await, "setup: node 2 took part");
    let (c, fc) = acquire_fresh(&set.store, &k, TTL).await;
    assert!(
        lease.is_valid(),
        "the holder stopped believing before the contender's grant"
    );
    assert!(
        fc > lease.fence(),
        "fence went back: {fc} <= {}",
        lease.fence()
    );
    set.store.release(&k, &c).await.unwrap();
}

/// docs/faults.md row 12: two nodes of three down: the acquire is refused (never a grant), ends
/// within its bounds, and leaves no lock on the live node; the same with the two nodes
/// blackholed (their requests time out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_refuses_and_leaves_no_keys() {
    let set = Set::start().await;
    let store = &set.store;
    let k = key("majority");
    // Straight to the servers (a proxy accepts connections for a dead server).
    let direct = RedlockStore::open(&set.url()).await.unwrap();
    set.servers[1].kill();
    set.servers[2].kill();
    for attempt in 0..3 {
        let r = timeout(
            Duration::from_secs(5),
            direct.acquire(&k, &OwnerToken::random(), TTL),
        )
        .await
        .expect("an acquire with two nodes down must end by itself");
        match r {
            Ok(AcquireOutcome::Acquired { fence, .. }) => {
                panic!("granted by one node of three (fence {fence})")
            }
            Ok(AcquireOutcome::Held { .. }) => {}
            // The first request on a connection the kill broke may count as sent
            // (ambiguous); after that the nodes refuse connections: nothing was sent.
            Err(e) if attempt == 0 => assert!(e.is_retryable(), "{e}"),
            Err(e) => assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}"),
        }
        assert!(
            !on_node(&set, 0, &k).await,
            "a refused acquire left its lock on the live node"
        );
    }
    set.servers[1].start_again();
    set.servers[2].start_again();
    set.proxies[1].set_mode(ProxyMode::Blackhole);
    set.proxies[2].set_mode(ProxyMode::Blackhole);
    let r = timeout(
        Duration::from_secs(5),
        store.acquire(&k, &OwnerToken::random(), TTL),
    )
    .await
    .expect("an acquire with two nodes blackholed must end by itself");
    match r {
        Ok(AcquireOutcome::Acquired { fence, .. }) => {
            panic!("granted by one node of three (fence {fence})")
        }
        Ok(AcquireOutcome::Held { .. }) => {}
        Err(e) => assert!(e.is_retryable(), "{e}"),
    }
    assert!(
        !on_node(&set, 0, &k).await,
        "a refused acquire left its lock on the live node"
    );
    set.proxies[1].set_mode(ProxyMode::Pass);
    set.proxies[2].set_mode(ProxyMode::Pass);
    let (o, _) = acquire_fresh(store, &k, TTL).await;
    store.release(&k, &o).await.unwrap();
}

/// docs/faults.md rows 12 and 13: a node restarted empty (`kill -9`, no persistence) while a
/// lease is held on all three, and the lease deleted early on one node, leave the holder
/// its majority: nobody else gets the lease, its renewals go on. Deleted on two nodes,
/// the lease goes to the next owner with a higher fence (what the guard needs) and the
/// first holder's renewal says it lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_or_forgetting_keeps_one_holder_and_fences_rise() {
    let _proof = proves(Backend::Redlock, Fault::RestartWithoutPersistence);
    let set = Set::start().await;
    let store = &set.store;
    let k = key("restart");
    let (a, fa) = acquire_fresh(store, &k, TTL).await;
    set.servers[1].restart();
    assert!(!on_node(&set, 1, &k).await, "setup: the node kept its data");
    for _ in 0..3 {
        match store.acquire(&k, &OwnerToken::random(), TTL).await {
            Ok(AcquireOutcome::Held { .. }) => {}
            Ok(o) => panic!("restart: a second holder while the first holds two of three: {o:?}"),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        assert!(
            matches!(
                store.renew(&k, &a, TTL).await,
                Ok(RenewOutcome::Renewed { .. })
            ),
            "restart: the holder's renewal on its majority failed"
        );
    }
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    let (b, fb) = acquire_fresh(store, &k, TTL).await;
    assert!(fb > fa, "restart: fence {fb} is not above {fa}");
    assert_eq!(
        store.release(&k, &b).await.unwrap(),
        ReleaseOutcome::Released
    );

    // Row 13, on a lease held on all three nodes: deleted on one node, still one holder.
    let (a, fa) = acquire_fresh(store, &k, TTL).await;
    set.cli(0, &["DEL", &store.lease_key(&k)]).await;
    match store.acquire(&k, &OwnerToken::random(), TTL).await {
        Ok(AcquireOutcome::Held { .. }) => {}
        Ok(o) => panic!("early expiry on one node: a second holder: {o:?}"),
        Err(e) => assert!(e.is_retryable(), "{e}"),
    }
    // Deleted on two: the next owner gets it, with a higher fence.
    set.cli(2, &["DEL", &store.lease_key(&k)]).await;
    let (b, fb) = acquire_fresh(store, &k, TTL).await;
    assert!(
        fb > fa,
        "early expiry on two nodes: fence {fb} is not above {fa}"
    );
    assert_eq!(
        store.renew(&k, &a, TTL).await.unwrap(),
        RenewOutcome::NotOwner
    );
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::NotOwner
    );
    let info = store.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.owner, info.fence), (b, fb));
    assert_eq!(
        store.release(&k, &b).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// docs/faults.md row 12, the case the crate docs name as outside the failure model: the holder
/// has a bare majority (one node was cut off when it acquired), one of its two nodes
/// restarts empty at once, and the cut-off node comes back. A second owner then gets the
/// lease while the first may still hold it (Redlock needs a restarted node to stay down
/// for a TTL), but its fence is above the first's: the clock floor of the emptied node
/// carries the order, so the guard rejects the first holder's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_majority_losing_a_node_to_restart_still_gets_rising_fences() {
    let _proof = proves(Backend::Redlock, Fault::RestartWithoutPersistence);
    let set = Set::start().await;
    let store = &set.store;
    let k = key("bare-majority");
    set.proxies[2].set_mode(ProxyMode::Reset);
    // Earlier holders on the same two nodes: their counters are ahead of node 2's.
    for _ in 0..5 {
        let (o, _) = acquire_fresh(store, &k, TTL).await;
        store.release(&k, &o).await.unwrap();
    }
    let (_a, fa) = acquire_fresh(store, &k, TTL).await;
    assert!(!on_node(&set, 2, &k).await, "setup: node 2 took part");
    set.servers[1].restart();
    set.proxies[2].set_mode(ProxyMode::Pass);
    let (b, fb) = acquire_fresh(store, &k, TTL).await;
    eprintln!(
        "bare majority: a second holder after the restart (documented), fences {fa} then {fb}"
    );
    assert!(
        fb > fa,
        "restart empty: the next fence {fb} is not above the holder's {fa}"
    );
    store.release(&k, &b).await.unwrap();
}

/// The grants of a key in order, checked like the storage-side guard would see them:
/// every new holder's fence is above every fence issued before it.
fn check_history(history: &[(OwnerToken, Fence, usize)]) {
    for w in history.windows(2) {
        let ((_, f1, d1), (_, f2, d2)) = (w[0], w[1]);
        assert!(
            f2 > f1,
            "fence history: the grant with node {d2} cut off got fence {f2}, not above the \
             previous grant's {f1} (node {d1} cut off): the guard would accept the older \
             holder's writes after the newer one's. Full history: {:?}",
            history.iter().map(|(_, f, d)| (*f, *d)).collect::<Vec<_>>()
        );
    }
}

/// Fences of successive holders rise when consecutive majorities share only one node,
/// even when one node's fence counter is far ahead of the others' clocks (its clock ran
/// ahead, or it issued fences the others never saw): the chosen fence is written back
/// to a majority, so the shared node carries it. The maximum of per-node candidates
/// without that second round fails this history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_when_successive_majorities_share_one_node() {
    let set = Set::start().await;
    let store = &set.store;
    let k = key("history");
    // Node 0 is far ahead: 5e15 µs is the year 2128.
    set.cli(0, &["SET", &store.fence_key(&k), "5000000000000000"])
        .await;
    let mut history = Vec::new();
    for round in 0..9 {
        let cut = [2, 0, 1][round % 3];
        set.proxies[cut].set_mode(ProxyMode::Reset);
        let (owner, fence) = acquire_fresh(store, &k, TTL).await;
        history.push((owner, fence, cut));
        assert_eq!(
            store.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        set.proxies[cut].set_mode(ProxyMode::Pass);
        check_history(&history);
    }
    assert!(history[0].1 > Fence(5_000_000_000_000_000));
}

/// `break_lease` with one node down: the lease is gone, the holder's renewal says so,
/// and the next grant's fence is above the broken one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_with_a_node_down_advances_the_fence() {
    let set = Set::start().await;
    let store: Arc<dyn Store> = set.store.clone();
    let k = key("break");
    let (a, fa) = acquire_fresh(&set.store, &k, TTL).await;
    set.servers[0].kill();
    let broken = store.break_lease(&k).await.expect("break on two of three");
    assert!(broken > fa);
    assert_eq!(store.inspect(&k).await.unwrap(), None);
    assert_eq!(
        store.renew(&k, &a, TTL).await.unwrap(),
        RenewOutcome::NotOwner
    );
    set.servers[0].start_again();
    let (b, fb) = acquire_fresh(&set.store, &k, TTL).await;
    assert!(fb > broken, "fence {fb} after the break's {broken}");
    store.release(&k, &b).await.unwrap();
}

/// The reported TTL is the validity: the TTL less the time the acquire took and the
/// drift allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_granted_ttl_is_the_validity() {
    let set = Set::start().await;
    let k = key("validity");
    let owner = OwnerToken::random();
    let drift = set.store.config().drift(TTL);
    let started = Instant::now();
    let outcome = set.store.acquire(&k, &owner, TTL).await.unwrap();
    let took = started.elapsed();
    let AcquireOutcome::Acquired { ttl, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        ttl <= TTL - drift,
        "{ttl:?} is not below the TTL less the drift"
    );
    assert!(
        ttl >= TTL - drift - took,
        "{ttl:?} is below the TTL less the drift and the whole call ({took:?})"
    );
    let renewed = set.store.renew(&k, &owner, TTL).await.unwrap();
    let RenewOutcome::Renewed { ttl } = renewed else {
        panic!("{renewed:?}")
    };
    assert!(ttl <= TTL - drift);
    set.store.release(&k, &owner).await.unwrap();
    // A configured drift larger than the TTL leaves no validity: never a grant.
    let nodes: Vec<String> = set
        .servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let cfg = RedlockConfig::new(&nodes)
        .unwrap()
        .drift_min(Duration::from_secs(2))
        .unwrap();
    let greedy = RedlockStore::connect(cfg).await.unwrap();
    let err = greedy
        .acquire(&k, &OwnerToken::random(), Duration::from_secs(1))
        .await
        .expect_err("no validity left");
    assert!(err.is_retryable(), "{err}");
    for i in 0..3 {
        assert!(
            !on_node(&set, i, &k).await,
            "the refused grant was left on node {i}"
        );
    }
}

/// Five nodes: two down still leave a majority (three); three down refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_tolerate_two_down_and_refuse_with_three() {
    let set = Set::start_n(5).await;
    let k = key("five");
    let direct = RedlockStore::open(&set.url()).await.unwrap();
    assert_eq!(direct.config().quorum(), 3);
    set.servers[0].kill();
    set.servers[3].kill();
    let (a, fa) = acquire_fresh(&direct, &k, TTL).await;
    let info = direct.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.owner, info.fence), (a, fa));
    assert_eq!(
        direct.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    set.servers[4].kill();
    for _ in 0..3 {
        match direct.acquire(&k, &OwnerToken::random(), TTL).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => {
                panic!("granted by two nodes of five (fence {fence})")
            }
            Ok(AcquireOutcome::Held { .. }) => {}
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    for i in [1, 2] {
        assert!(
            !on_node(&set, i, &k).await,
            "a refused acquire left its lock on node {i}"
        );
    }
}

/// The ACL rules the store needs on each node, for keys under `prefix` (the README
/// shows the same list).
fn acl_rules(prefix: &str) -> Vec<String> {
    [
        "on",
        ">acl-pass",
        "resetkeys",
        &format!("~{prefix}*"),
        "resetchannels",
        "-@all",
        "+ping",
        "+evalsha",
        "+script|load",
        "+get",
        "+set",
        "+pexpire",
        "+pttl",
        "+del",
        "+time",
        // Reading maxmemory-policy when the store opens (docs/faults.md row 25).
        "+info",
        // Listing leases.
        "+scan",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Every operation works for an ACL user limited to the store's key prefix and the
/// commands above; outside its prefix, or without a command it needs, it gets a `Config`
/// error, never "held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_acl_user() {
    let set = Set::start().await;
    let prefix = "acl-app:";
    for i in 0..3 {
        let mut args = vec!["ACL".to_owned(), "SETUSER".into(), "leasehold".into()];
        args.extend(acl_rules(prefix));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(set.cli(i, &args).await, "OK");
    }
    let nodes: Vec<String> = set
        .servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!(
        "redlock://leasehold:acl-pass@{}?prefix={prefix}",
        nodes.join(",")
    );
    let store = RedlockStore::open(&url)
        .await
        .expect("open as the ACL user");
    let k = key("acl");
    let (a, fa) = acquire_fresh(&store, &k, TTL).await;
    assert!(matches!(
        store.renew(&k, &a, TTL).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(store.inspect(&k).await.unwrap().map(|i| i.fence), Some(fa));
    let listed = store.list("store:").await.expect("list");
    assert_eq!(
        listed.iter().map(|i| (&i.key, i.fence)).collect::<Vec<_>>(),
        vec![(&k, fa)]
    );
    let broken = store.break_lease(&k).await.unwrap();
    assert!(broken > fa);
    let (b, fb) = acquire_fresh(&store, &k, TTL).await;
    assert!(fb > broken);
    assert_eq!(
        store.release(&k, &b).await.unwrap(),
        ReleaseOutcome::Released
    );
    // Records: GET and SET inside their scripts.
    let stored = store.put_record(&k, fb, b"v").await.expect("put_record");
    assert_eq!(stored.fence, fb);
    let got = store.get_record(&k).await.expect("get_record");
    assert_eq!(got.map(|r| r.value), Some(b"v".to_vec()));
    let outside = format!(
        "redlock://leasehold:acl-pass@{}?prefix=other:",
        nodes.join(",")
    );
    let other = RedlockStore::open(&outside).await.unwrap();
    let err = other
        .acquire(&k, &OwnerToken::random(), TTL)
        .await
        .expect_err("outside its prefix");
    assert_eq!(err.kind(), StoreErrorKind::Config, "{err}");
    assert!(!format!("{err:?}").contains("acl-pass"), "{err:?}");
    // Without TIME (called inside the scripts): a configuration error too.
    for i in 0..3 {
        assert_eq!(
            set.cli(i, &["ACL", "SETUSER", "leasehold", "-time"]).await,
            "OK"
        );
    }
    let err = store
        .acquire(&key("acl-no-time"), &OwnerToken::random(), TTL)
        .await
        .expect_err("TIME refused");
    assert_eq!(err.kind(), StoreErrorKind::Config, "{err}");
}

/// `list` answers the majority view: a lease held on a majority is listed (owner and
/// fence as `inspect` reports them), a partial lock on one node only is not, nor are the
/// fence and record keys beside the leases, nor leases under another prefix. With one node
/// blackholed it still lists every lease a majority holds, but a key it cannot tell about
/// (the partial lock might be on the silent node too) makes it fail, as `inspect` of that
/// key does; with two nodes blackholed it cannot tell at all. Either way a retryable
/// error, never a partial answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_answers_the_majority_view() {
    let set = Set::start().await;
    let store = &set.store;
    let (a, b) = (key("list-a"), key("list-b"));
    let (owner_a, fa) = acquire_fresh(store, &a, TTL * 10).await;
    let (owner_b, fb) = acquire_fresh(store, &b, TTL * 10).await;
    store
        .put_record(&key("list-record"), fa, b"v")
        .await
        .expect("put_record");
    // A partial lock: the lease key on one node only (an acquire that reached only it).
    let partial = key("list-partial");
    let stray = format!("{}:1", OwnerToken::random().to_hex());
    cli(
        &set.servers[0],
        &["SET", &store.lease_key(&partial), &stray, "PX", "60000"],
    )
    .await;
    let elsewhere = Key::new("elsewhere:list").unwrap();
    acquire_fresh(store, &elsewhere, TTL * 10).await;
    let expected = vec![(a.clone(), owner_a, fa), (b.clone(), owner_b, fb)];
    let listed = |list: Vec<leasehold_core::LeaseInfo>| {
        list.into_iter()
            .map(|i| (i.key, i.owner, i.fence))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(store.list("store:list-").await.expect("list")),
        expected,
        "the leases a majority holds, in key order, and nothing else"
    );
    assert_eq!(
        listed(store.list("store:list-a").await.expect("list")),
        expected[..1],
        "by prefix"
    );
    // One node cut off: the partial lock might be on it too, so its key's majority view
    // is unknown, as `inspect` says; list says so too rather than guess.
    set.proxies[1].set_mode(ProxyMode::Blackhole);
    let err = store
        .list("store:list-")
        .await
        .expect_err("a candidate whose majority view is unknown");
    assert!(err.is_retryable(), "{err}");
    // Without it, a majority still answers for every lease.
    cli(&set.servers[0], &["DEL", &store.lease_key(&partial)]).await;
    assert_eq!(
        listed(
            store
                .list("store:list-")
                .await
                .expect("list with one node cut off")
        ),
        expected
    );
    // Two: no majority to tell from.
    set.proxies[2].set_mode(ProxyMode::Blackhole);
    let err = store
        .list("store:list-")
        .await
        .expect_err("list with two of three nodes cut off");
    assert!(err.is_retryable(), "{err}");
}

/// Calls `f` until it answers without a retryable error, for up to 10 s (a node just
/// killed or brought back: the first request on a broken connection fails).
async fn retrying<T, F, Fut>(what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, leasehold_core::StoreError>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Records and majority overlap: a record put while node 2 is down lands on nodes 0 and
/// 1; node 2 comes back empty and node 0 is killed; the read from nodes 1 and 2 still
/// returns it (node 1 is in both majorities), and writes it back to node 2 (read repair).
/// A lower fence is then refused by the majority, and a higher one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_put_on_a_majority_is_read_by_any_later_majority() {
    let set = Set::start().await;
    let store = &set.store;
    let k = key("election/overlap");
    let rk = store.record_key(&k);
    let value: &[u8] = b"leader\0\xffaddr";
    set.servers[2].kill();
    let stored = retrying("put with node 2 down", || {
        store.put_record(&k, Fence(1 << 60), value)
    })
    .await;
    assert_eq!(
        (stored.fence, stored.value.as_slice()),
        (Fence(1 << 60), value)
    );
    assert_eq!(set.cli(0, &["EXISTS", &rk]).await.trim(), "1");
    assert_eq!(set.cli(1, &["EXISTS", &rk]).await.trim(), "1");
    set.servers[2].start_again();
    assert_eq!(
        set.cli(2, &["EXISTS", &rk]).await.trim(),
        "0",
        "setup: node 2 has the record"
    );
    set.servers[0].kill();
    let got = retrying("get with node 0 down", || store.get_record(&k)).await;
    assert_eq!(
        got.map(|r| (r.fence, r.value)),
        Some((Fence(1 << 60), value.to_vec())),
        "the read majority (1, 2) overlaps the write majority (0, 1) at node 1"
    );
    assert_eq!(
        set.cli(2, &["EXISTS", &rk]).await.trim(),
        "1",
        "the read wrote the record back to node 2"
    );
    let kept = retrying("lower put", || store.put_record(&k, Fence(5), b"old")).await;
    assert_eq!(kept.fence, Fence(1 << 60), "a lower fence is refused");
    let newer = retrying("higher put", || {
        store.put_record(&k, Fence((1 << 60) + 1), b"next")
    })
    .await;
    assert_eq!(newer.value, b"next");
    set.servers[0].start_again();
    let got = retrying("get with every node up", || store.get_record(&k)).await;
    assert_eq!(got.map(|r| r.value), Some(b"next".to_vec()));
}
