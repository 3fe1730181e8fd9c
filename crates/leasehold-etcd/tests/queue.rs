//! The waiting queue (FIFO across processes, as etcd's `concurrency.Mutex`): waiters are
//! served in arrival order, each woken only by its predecessor; a free lease with a live
//! waiter ahead is not taken by a newcomer; a waiter that goes away drops out by itself.

mod common;

use std::time::Duration;

use common::Solo;
use leasehold_core::WaitStore;
use leasehold_core::{AcquireOutcome, Fence, Key, OwnerToken, Store};

fn key(name: &str) -> Key {
    Key::new(format!("etcd-queue:{name}")).unwrap()
}

fn fence_of(o: AcquireOutcome) -> Fence {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn is_held(o: &AcquireOutcome) -> bool {
    matches!(o, AcquireOutcome::Held { remaining: Some(r) } if *r > Duration::ZERO)
}

/// The owners queued for `k` (raw read of `<lease key>\0…`), in create-revision order.
async fn queued(s: &Solo, k: &Key) -> Vec<String> {
    let mut raw = s.raw().await;
    let resp = raw
        .get(
            format!("{}\0", s.store.lease_key(k)),
            Some(etcd_client::GetOptions::new().with_prefix().with_sort(
                etcd_client::SortTarget::Create,
                etcd_client::SortOrder::Ascend,
            )),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| kv.value_str().unwrap().to_owned())
        .collect()
}

const TTL: Duration = Duration::from_secs(10);
const LONG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_in_order_and_newcomers_queue_behind_them() {
    let s = Solo::start().await;
    let k = key("order");
    let (a, w1, w2, newcomer) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let fa = fence_of(s.store.acquire(&k, &a, TTL).await.unwrap());
    let spawn_wait = |w: OwnerToken| {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move { store.wait_released(&k, &w, LONG).await })
    };
    let wait1 = spawn_wait(w1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wait2 = spawn_wait(w2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(queued(&s, &k).await, vec![w1.to_string(), w2.to_string()]);
    // Queue entries are not leases.
    let listed = s.store.list("etcd-queue:").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].owner, a);

    // The release wakes the first waiter only.
    assert_eq!(
        s.store.release(&k, &a).await.unwrap(),
        leasehold_core::ReleaseOutcome::Released
    );
    tokio::time::timeout(Duration::from_secs(5), wait1)
        .await
        .expect("the first waiter is woken by the release")
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !wait2.is_finished(),
        "the release woke the second waiter too"
    );
    // Free, but a live waiter is ahead: a newcomer and the second waiter are turned away.
    let o = s.store.acquire(&k, &newcomer, TTL).await.unwrap();
    assert!(is_held(&o), "a newcomer got past the queue: {o:?}");
    let o = s.store.acquire(&k, &w2, TTL).await.unwrap();
    assert!(is_held(&o), "the second waiter got past the first: {o:?}");
    assert_eq!(s.store.inspect(&k).await.unwrap(), None);
    // The first waiter confirms: a new, higher fence; its entry leaves the queue.
    let f1 = fence_of(s.store.acquire(&k, &w1, TTL).await.unwrap());
    assert!(f1 > fa);
    assert_eq!(queued(&s, &k).await, vec![w2.to_string()]);
    // The second waiter, now first, watches the lease key: not woken by w1's grant.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !wait2.is_finished(),
        "the second waiter was woken while w1 holds"
    );
    s.store.release(&k, &w1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), wait2)
        .await
        .expect("the second waiter is woken by w1's release")
        .unwrap()
        .unwrap();
    let f2 = fence_of(s.store.acquire(&k, &w2, TTL).await.unwrap());
    assert!(f2 > f1);
    assert!(queued(&s, &k).await.is_empty());
    s.store.release(&k, &w2).await.unwrap();
    // Nobody waits: a newcomer takes the free lease at once.
    let f3 = fence_of(s.store.acquire(&k, &newcomer, TTL).await.unwrap());
    assert!(f3 > f2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_goes_away_drops_out_of_the_queue() {
    let s = Solo::start().await;
    let k = key("gone");
    let (a, w, newcomer) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    fence_of(s.store.acquire(&k, &a, TTL).await.unwrap());
    let wait = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move { store.wait_released(&k, &w, LONG).await })
    };
    // Waiting longer than the entry's own TTL (2 s): its keep-alives hold its place.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(queued(&s, &k).await, vec![w.to_string()]);
    // The waiter goes away (its wait dropped, as when its process dies).
    wait.abort();
    s.store.release(&k, &a).await.unwrap();
    let o = s.store.acquire(&k, &newcomer, TTL).await.unwrap();
    assert!(is_held(&o), "a newcomer got past a live waiter: {o:?}");
    // Its entry lapses within its TTL (plus etcd's expiry lag): the newcomer gets in.
    let started = tokio::time::Instant::now();
    loop {
        match s.store.acquire(&k, &newcomer, TTL).await.unwrap() {
            AcquireOutcome::Acquired { .. } => break,
            AcquireOutcome::Held { .. } => {
                assert!(
                    started.elapsed() < Duration::from_secs(8),
                    "the gone waiter's entry never lapsed"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert!(queued(&s, &k).await.is_empty());
}

/// docs/faults.md row 21, third part: a waiter's etcd lease revoked (its queue entry deleted by
/// etcd). The waiter is not handed the lock: its wait ends (the caller re-checks), its
/// `acquire` is still `Held` while the lease is held, and it can only wait again at the
/// end of the line, behind the waiter that was behind it. Fences keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_etcd_lease_is_revoked_loses_its_place_not_the_exclusion() {
    let s = Solo::start().await;
    let k = key("revoked");
    let (a, w1, w2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let fa = fence_of(s.store.acquire(&k, &a, TTL).await.unwrap());
    let spawn_wait = |w: OwnerToken| {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move { store.wait_released(&k, &w, LONG).await })
    };
    let wait1 = spawn_wait(w1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wait2 = spawn_wait(w2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(queued(&s, &k).await, vec![w1.to_string(), w2.to_string()]);
    // Revoke w1's etcd lease behind its back.
    let mut raw = s.raw().await;
    let entry = format!("{}\0{w1}", s.store.lease_key(&k));
    let lease = raw.get(entry, None).await.unwrap().kvs()[0].lease();
    raw.lease_revoke(lease).await.unwrap();
    // Its wait ends (within its keep-alive period), with the lease still held by a.
    tokio::time::timeout(Duration::from_secs(5), wait1)
        .await
        .expect("the revoked waiter's wait ends")
        .unwrap()
        .unwrap();
    let o = s.store.acquire(&k, &w1, TTL).await.unwrap();
    assert!(is_held(&o), "a revoked waiter got the lock: {o:?}");
    assert_eq!(queued(&s, &k).await, vec![w2.to_string()]);
    // It waits again: at the end of the line now.
    let wait1 = spawn_wait(w1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(queued(&s, &k).await, vec![w2.to_string(), w1.to_string()]);
    s.store.release(&k, &a).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), wait2)
        .await
        .expect("w2, now first, is woken by the release")
        .unwrap()
        .unwrap();
    let o = s.store.acquire(&k, &w1, TTL).await.unwrap();
    assert!(
        is_held(&o),
        "the revoked waiter got past the one ahead: {o:?}"
    );
    let f2 = fence_of(s.store.acquire(&k, &w2, TTL).await.unwrap());
    assert!(f2 > fa);
    assert!(!wait1.is_finished(), "w1 was woken while w2 holds");
    s.store.release(&k, &w2).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), wait1)
        .await
        .expect("w1 is woken by w2's release")
        .unwrap()
        .unwrap();
    let f1 = fence_of(s.store.acquire(&k, &w1, TTL).await.unwrap());
    assert!(f1 > f2);
}

/// The first in line learns of the release as etcd writes it, while other keys are
/// written all the time. etcd hands a watch that starts at a past revision its events only
/// on its sync loop, every 100 ms; the waiter's watch used to start at the revision of
/// its last read, so a write between that read and the watch (here: always) held the
/// hand-off up to 100 ms, half of that on the median. The waiter now watches its whole
/// line from etcd's current revision, before it reads the line. Twelve hand-offs: the
/// median wake must be well under half the sync period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_in_line_is_woken_by_the_release_while_other_keys_are_written() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = Solo::start().await;
    let k = key("busy");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (mut raw, stop) = (s.raw().await, stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                raw.put("etcd-queue:noise", n.to_string(), None)
                    .await
                    .unwrap();
                n += 1;
            }
            n
        })
    };
    let mut holder = OwnerToken::random();
    fence_of(s.store.acquire(&k, &holder, TTL).await.unwrap());
    let mut wakes = Vec::new();
    for _ in 0..12 {
        let w = OwnerToken::random();
        assert!(is_held(&s.store.acquire(&k, &w, TTL).await.unwrap()));
        let wait = {
            let (store, k) = (s.store.clone(), k.clone());
            tokio::spawn(async move {
                let woke = store.wait_turn(&k, &w, TTL, LONG).await;
                (woke, std::time::Instant::now())
            })
        };
        let end = std::time::Instant::now() + LONG;
        while queued(&s, &k).await != vec![w.to_string()] {
            assert!(
                std::time::Instant::now() < end,
                "the waiter never got in line"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released = std::time::Instant::now();
        s.store.release(&k, &holder).await.unwrap();
        let (woke, at) = tokio::time::timeout(LONG, wait)
            .await
            .expect("the release woke the waiter")
            .unwrap();
        woke.unwrap();
        wakes.push(at.saturating_duration_since(released));
        fence_of(s.store.acquire(&k, &w, TTL).await.unwrap());
        holder = w;
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(writes > 100, "the writer wrote {writes} times only");
    wakes.sort();
    assert!(
        wakes[wakes.len() / 2] < Duration::from_millis(25),
        "the first in line learned of the release late (sorted: {wakes:?})"
    );
}

/// The first in line acts on the lease key's deletion only: a waiter behind it that goes
/// away (its queue entry lapses and etcd deletes it, which its one watch of the line is
/// told of) does not wake it; the release does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_in_line_is_not_woken_by_a_deletion_behind_it() {
    let s = Solo::start().await;
    let k = key("behind");
    let (a, w1, w2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    fence_of(s.store.acquire(&k, &a, TTL).await.unwrap());
    let spawn_wait = |w: OwnerToken| {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move {
            let woke = store.wait_turn(&k, &w, TTL, LONG).await;
            (woke, std::time::Instant::now())
        })
    };
    let until_queued = |want: Vec<String>| {
        let s = &s;
        let k = &k;
        async move {
            let end = std::time::Instant::now() + LONG;
            while queued(s, k).await != want {
                assert!(std::time::Instant::now() < end, "never queued: {want:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let wait1 = spawn_wait(w1);
    until_queued(vec![w1.to_string()]).await;
    let wait2 = spawn_wait(w2);
    until_queued(vec![w1.to_string(), w2.to_string()]).await;
    // The second waiter goes away: its entry lapses within the queue's grace.
    wait2.abort();
    until_queued(vec![w1.to_string()]).await;
    let released = std::time::Instant::now();
    s.store.release(&k, &a).await.unwrap();
    let (woke, at) = tokio::time::timeout(LONG, wait1)
        .await
        .expect("the release woke the first in line")
        .unwrap();
    woke.unwrap();
    assert!(
        at >= released,
        "the first in line was woken {:?} before the release, by the deletion behind it",
        released.duration_since(at)
    );
}
