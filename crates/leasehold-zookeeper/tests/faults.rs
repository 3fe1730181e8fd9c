//! docs/faults.md row 22, ZooKeeper session faults: (a) a holder process frozen (`SIGSTOP`) past its
//! session timeout; (b) a member of a three-member ensemble killed while a lease is held,
//! a contender asking for it all along.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{
    Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome, RenewOutcome, Store,
};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{WorkerProcess, ZK_TICK, ZkEnsemble, ZkServer};
use leasehold_zookeeper::ZkStore;

const CHILD_URL: &str = "LEASEHOLD_ZK_ROW22_URL";
const CHILD_KEY: &str = "LEASEHOLD_ZK_ROW22_KEY";
const TTL: Duration = Duration::from_secs(2);

/// `at` on CLOCK_MONOTONIC in nanoseconds: comparable between processes of one host
/// (`Instant` reads the same clock but does not show its value).
fn mono_ns(at: Instant) -> i128 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    let now_ns = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec());
    let here = Instant::now();
    if at >= here {
        now_ns + (at - here).as_nanos() as i128
    } else {
        now_ns - (here - at).as_nanos() as i128
    }
}

/// The holder process: acquires `key`, says `HELD <fence>`, checks its lease every 2 ms
/// and says `VALID_UNTIL <CLOCK_MONOTONIC ns>` whenever its validity deadline moves.
/// When a check comes more than 500 ms after the one before (it was frozen), it says
/// `GAP ok=<whether the lease still looked valid>`; once the lease is lost it says
/// `LOST <reason>`, renews through the store directly (`RENEW <outcome>`) and ends.
async fn holder_process(url: String, key: String) {
    let store = Arc::new(ZkStore::open(&url).await.expect("open"));
    let client = LeaseClient::new(store.clone(), LeaseConfig::new(TTL).unwrap());
    let key = Key::new(key).unwrap();
    let lease = client.try_acquire(&key).await.expect("acquire");
    println!("HELD {}", lease.fence().get());
    let mut prev = Instant::now();
    let mut said = None;
    loop {
        let until = lease.valid_until();
        if said != Some(until) {
            println!("VALID_UNTIL {}", mono_ns(until.into()));
            said = Some(until);
        }
        let now = Instant::now();
        let ok = lease.ensure_valid().is_ok();
        if now - prev > Duration::from_millis(500) {
            println!("GAP ok={ok}");
        }
        prev = now;
        if !ok {
            println!("LOST {:?}", lease.lost_reason());
            // The first request after the freeze may go out on the expired session: the
            // release finds nothing of its own (the ensemble deleted the session's nodes),
            // which is not an error.
            // A loaded machine can leave the first request after the resume without a reply
            // within the store's timeout (an ambiguous error, said as `RELEASE_AGAIN`);
            // the release is then asked again through the store, as a caller would, until
            // it is answered (said as `RELEASE Ok(<whether it released>)`).
            let owner = *lease.owner();
            let mut released = lease.release().await;
            for _ in 0..5 {
                match &released {
                    Err(e)
                        if e.is_retryable()
                            || e.store_error().is_some_and(|s| s.is_ambiguous()) =>
                    {
                        println!("RELEASE_AGAIN {e}");
                        released = store
                            .release(&key, &owner)
                            .await
                            .map(|r| r == ReleaseOutcome::Released)
                            .map_err(Into::into);
                    }
                    _ => break,
                }
            }
            println!("RELEASE {released:?}");
            let renewed = store.renew(&key, &owner, TTL).await;
            println!("RENEW {renewed:?}");
            std::process::exit(0);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// docs/faults.md row 22 (a): the holder process is frozen for its session timeout + 3 s. The
/// ensemble expires its session (its node goes), another process acquires with a higher
/// fence while it is frozen, and the holder's first look at its lease after it wakes says
/// lost; its release answers not owner (no error) and its renewal is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_22_holder_frozen_past_its_session_timeout_loses_and_is_taken_over() {
    if let (Ok(url), Ok(key)) = (std::env::var(CHILD_URL), std::env::var(CHILD_KEY)) {
        holder_process(url, key).await;
        return;
    }
    let _proof = proves(Backend::Zookeeper, Fault::ProcessPause);
    let zk = tokio::task::spawn_blocking(ZkServer::start).await.unwrap();
    let url = format!(
        "zookeeper://127.0.0.1:{}/row22?session_timeout={}ms&tick_time={}ms",
        zk.port(),
        TTL.as_millis(),
        ZK_TICK.as_millis()
    );
    let key = "row22:frozen";
    let mut cmd = WorkerProcess::test_command(
        "row_22_holder_frozen_past_its_session_timeout_loses_and_is_taken_over",
    );
    cmd.env(CHILD_URL, &url).env(CHILD_KEY, key);
    let holder = WorkerProcess::spawn(cmd);
    let held = tokio::task::block_in_place(|| {
        holder.wait_for_line(|l| l.starts_with("HELD "), Duration::from_secs(60))
    })
    .unwrap_or_else(|| panic!("the holder did not acquire: {:?}", holder.lines()));
    let fence_a: u64 = held["HELD ".len()..].trim().parse().unwrap();
    // Let it enter its checking loop (and stay within its first renewal interval).
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| holder.pause());
    let paused_at = Instant::now();

    // B renews until the end (each renewal a quorum write, from the TTL its longer
    // session grants in full), which a loaded machine must not make it lose.
    let b_url = format!(
        "zookeeper://127.0.0.1:{}/row22?session_timeout={}ms&tick_time={}ms",
        zk.port(),
        (TTL * 4).as_millis(),
        ZK_TICK.as_millis()
    );
    let other = Arc::new(ZkStore::open(&b_url).await.unwrap());
    let client = LeaseClient::new(other.clone(), LeaseConfig::new(TTL * 2).unwrap());
    let k = Key::new(key).unwrap();
    let lease_b = client
        .acquire(&k, TTL * 5)
        .await
        .expect("another process acquires once the frozen holder's session expired");
    let taken_after = paused_at.elapsed();
    // B's winning acquire was sent no earlier than this (its grant's validity counts from
    // that send); the ensemble let B in only after it expired A's session.
    let b_sent = mono_ns((lease_b.valid_until() - client.config().validity(lease_b.ttl())).into());
    assert!(
        lease_b.fence().get() > fence_a,
        "the new holder's fence {} must be above the frozen holder's {fence_a}",
        lease_b.fence()
    );
    let a_valid_until: i128 = holder
        .lines()
        .iter()
        .filter_map(|l| l.strip_prefix("VALID_UNTIL "))
        .map(|v| v.trim().parse().unwrap())
        .max()
        .expect("the holder said its deadline");
    // One acquire call (list, create, list) of slack: B's stamp precedes its requests.
    let slack = 100_000_000;
    assert!(
        a_valid_until <= b_sent + slack,
        "the frozen holder's validity deadline is {} ms after B's grant was sent",
        (a_valid_until - b_sent) / 1_000_000
    );
    eprintln!(
        "row 22 (a): taken over {taken_after:?} after the freeze; the frozen holder's deadline \
         was {} ms before B's acquire was sent",
        (b_sent - a_valid_until) / 1_000_000
    );
    let resume_at = paused_at + TTL + Duration::from_secs(3);
    tokio::time::sleep_until(resume_at.into()).await;
    holder.resume();
    let lost = tokio::task::block_in_place(|| {
        holder.wait_for_line(|l| l.starts_with("RENEW "), Duration::from_secs(30))
    });
    let lines = holder.lines();
    assert!(
        lost.is_some(),
        "the holder never reported its lease lost: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l == "GAP ok=false"),
        "the holder's first look at its lease after the freeze must say lost: {lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l == "GAP ok=true"),
        "the frozen holder believed it held the lease after the freeze: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l == "RELEASE Ok(false)"),
        "the frozen holder's release must answer not owner, without an error: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l == "RENEW Ok(NotOwner)"),
        "the frozen holder's renewal must be refused: {lines:?}"
    );
    // The new holder is untouched.
    let info = other.inspect(&k).await.unwrap().expect("held by B");
    assert_eq!(
        (info.owner, info.fence),
        (*lease_b.owner(), lease_b.fence())
    );
    assert!(lease_b.release().await.unwrap());
}

/// Watches `lease` for `span` while `contender` asks for `k` every 100 ms: the lease
/// stays valid, or, once lost, never looks valid again; whenever the contender is granted
/// it, the holder must no longer believe (its deadline passed before the grant's reply)
/// and the contender's fence is higher. Returns whether it was lost, and the contender's
/// grant (released again).
async fn watch(
    lease: &leasehold_core::Lease,
    span: Duration,
    contender: &ZkStore,
    k: &Key,
) -> (bool, Option<u64>) {
    let until = Instant::now() + span;
    let c = OwnerToken::random();
    let mut taken = None;
    while Instant::now() < until {
        if taken.is_none() {
            match contender.acquire(k, &c, lease.ttl()).await {
                Ok(leasehold_core::AcquireOutcome::Acquired { fence, .. }) => {
                    let replied = Instant::now();
                    assert!(
                        !lease.is_valid(),
                        "a second holder while the first still believes it holds the lease"
                    );
                    assert!(
                        lease.valid_until() <= replied.into(),
                        "the holder's deadline is after the contender's grant reply"
                    );
                    assert!(fence > lease.fence(), "fences only rise");
                    taken = Some(fence.get());
                    while let Err(e) = contender.release(k, &c).await {
                        assert!(e.is_retryable(), "contender release: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                Ok(_) => {}
                // During an election or with the contender's member gone.
                Err(e) => assert!(e.is_retryable(), "contender: {e}"),
            }
        }
        if lease.lost_reason().is_some() {
            assert!(!lease.is_valid(), "a lost lease looked valid");
            return (true, taken);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (lease.lost_reason().is_some(), taken)
}

/// docs/faults.md row 22 (b): a member of the ensemble is killed while a lease is held (first the
/// leader, then a follower), and a contender on its own session asks for the lease every
/// 100 ms. The lease is kept through the fail-over (the contender is refused), or reported
/// lost; if lost, whoever gets the key next does so with a higher fence and only once the
/// lost lease no longer looks valid (its deadline passed before the grant's reply). Fences
/// only rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_22_ensemble_member_killed_while_held_keeps_or_loses_the_lease_honestly() {
    let _proof = proves(Backend::Zookeeper, Fault::FailOver);
    let ensemble = Arc::new(
        tokio::task::spawn_blocking(ZkEnsemble::start)
            .await
            .unwrap(),
    );
    let ttl = Duration::from_secs(4);
    let url = format!(
        "zookeeper://{}/row22b?session_timeout={}ms&timeout=2s&tick_time={}ms",
        ensemble.connect_string(),
        ttl.as_millis(),
        ZK_TICK.as_millis()
    );
    let store: Arc<dyn Store> = Arc::new(ZkStore::open(&url).await.unwrap());
    let observer = ZkStore::open(&url).await.unwrap();
    let client = LeaseClient::new(store.clone(), LeaseConfig::new(ttl).unwrap());
    let k = Key::new("row22:ensemble").unwrap();
    let probe = Key::new("row22:probe").unwrap();
    let mut last_fence = 0u64;
    let mut lease = client.try_acquire(&k).await.unwrap();
    last_fence = last_fence.max(lease.fence().get());
    for round in 0..2 {
        let victim = if round == 0 {
            ensemble.leader().expect("a leader")
        } else {
            (0..ZkEnsemble::SIZE)
                .find(|i| Some(*i) != ensemble.leader())
                .unwrap()
        };
        let e = ensemble.clone();
        tokio::task::spawn_blocking(move || e.kill(victim))
            .await
            .unwrap();
        let (lost, taken) = watch(&lease, ttl * 3, &observer, &k).await;
        eprintln!(
            "row 22 (b): member {victim} killed (round {round}): lease lost = {lost}, taken \
             by the contender: {taken:?}"
        );
        assert!(
            lost || taken.is_none(),
            "the contender got a lease its holder kept"
        );
        if let Some(f) = taken {
            last_fence = last_fence.max(f);
        }
        if lost {
            let next = client
                .acquire(&k, ttl * 4)
                .await
                .expect("the key is free again after the lost lease's session ended");
            assert!(!lease.is_valid(), "two valid leases");
            assert!(next.fence() > lease.fence(), "fences only rise");
            assert!(
                next.fence().get() > last_fence,
                "fence {} after the contender's {last_fence}",
                next.fence()
            );
            lease = next;
        } else {
            let info = loop {
                match observer.inspect(&k).await {
                    Ok(i) => break i,
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    Err(e) => panic!("inspect: {e}"),
                }
            };
            let info = info.expect("a kept lease is in the store");
            assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
        }
        last_fence = last_fence.max(lease.fence().get());
        // A fresh grant on another key: above every fence so far.
        let o = OwnerToken::random();
        let f = loop {
            match observer.acquire(&probe, &o, ttl).await {
                Ok(leasehold_core::AcquireOutcome::Acquired { fence, .. }) => break fence.get(),
                Ok(held) => panic!("probe: {held:?}"),
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(200)).await,
                Err(e) => panic!("probe: {e}"),
            }
        };
        assert!(
            f > last_fence,
            "fence {f} after the kill is not above {last_fence}"
        );
        last_fence = f;
        observer.release(&probe, &o).await.unwrap();
        let e = ensemble.clone();
        tokio::task::spawn_blocking(move || e.start_again(victim))
            .await
            .unwrap();
    }
    assert!(lease.is_valid());
    assert!(matches!(
        store.renew(&k, lease.owner(), ttl).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    assert!(lease.release().await.unwrap());
}
