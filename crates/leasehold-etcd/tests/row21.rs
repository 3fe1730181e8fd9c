//! docs/faults.md row 21 on a private three-member etcd cluster: the leader killed while a lease
//! is held and renewed, and a non-leader member stopped (`SIGSTOP`) or killed while it is
//! the holder's only endpoint. In each, the holder either keeps the lease (its renewals go on
//! after the fault) or hears it lost no later than its validity deadline; a contender that
//! keeps trying never gets the lease while the holder still believes it holds it; fences
//! only rise (also across the killed member's restart).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, Fence, Key, Lease, LeaseClient, LeaseConfig};
use leasehold_etcd::EtcdStore;
use leasehold_testkit::EtcdCluster;
use leasehold_testkit::proof::{Backend, Fault, proves};
use tokio::time::Instant;

/// Whole seconds (etcd's resolution) with room for elections on a loaded machine.
const TTL: Duration = Duration::from_secs(6);
/// How long after the fault the contender keeps trying.
const WATCH: Duration = Duration::from_secs(20);
/// Slack for the lost signal's delivery after the deadline on a shared 2-core machine
/// (the holder's own `is_valid` checks the deadline on the spot, with no slack).
const SIGNAL_SLACK: Duration = Duration::from_secs(1);

fn key(name: &str) -> Key {
    Key::new(format!("row21:{name}")).unwrap()
}

async fn client(url: &str) -> LeaseClient {
    let store = EtcdStore::open(&format!("{url}?timeout=2s&connect_timeout=1s"))
        .await
        .expect("open the store");
    let config = LeaseConfig::builder(TTL)
        .op_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    LeaseClient::new(Arc::new(store), config)
}

async fn start_cluster() -> Arc<EtcdCluster> {
    Arc::new(
        tokio::task::spawn_blocking(EtcdCluster::start)
            .await
            .unwrap(),
    )
}

async fn leader(cluster: &Arc<EtcdCluster>) -> usize {
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.wait_for_leader(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the cluster has a leader")
}

/// The contender tries `k` every 200 ms for `WATCH` or until it gets it. Whenever it gets
/// the lease, the holder must no longer believe it holds it (its deadline passed before
/// the contender's reply), and the contender's fence must be above the holder's.
async fn contend(holder: &Lease, contender: &LeaseClient, k: &Key) -> Option<Lease> {
    let end = Instant::now() + WATCH;
    while Instant::now() < end {
        match contender.try_acquire(k).await {
            Ok(lease) => {
                let replied = Instant::now();
                assert!(
                    !holder.is_valid(),
                    "a second holder while the first still believes it holds the lease"
                );
                assert!(
                    holder.valid_until() <= replied,
                    "the holder's deadline {:?} was after the contender's grant reply {replied:?}",
                    holder.valid_until()
                );
                assert!(
                    lease.fence() > holder.fence(),
                    "fences went down: {:?} after {:?}",
                    lease.fence(),
                    holder.fence()
                );
                return Some(lease);
            }
            Err(Error::Contended { .. }) => {}
            // During an election or with a member stopped, calls may fail: keep trying.
            Err(e) => tracing::debug!(error = %e, "contender: acquire failed"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Either the holder kept the lease through the fault (still valid, and renewed after
/// `fault_at`: its deadline is more than a TTL past it), or it heard lost no later than
/// its deadline (plus the signal's delivery slack). True when kept.
fn kept_or_lost_in_time(holder: &Lease, fault_at: Instant) -> bool {
    if holder.is_valid() {
        assert!(
            holder.valid_until() > fault_at + TTL,
            "valid, but not renewed since the fault: deadline {:?}, fault at {fault_at:?}",
            holder.valid_until()
        );
        return true;
    }
    let lost = holder.lost();
    let lost_at = lost
        .lost_at()
        .expect("invalid, so the lost signal has fired");
    assert!(
        lost_at <= holder.valid_until() + SIGNAL_SLACK,
        "lost signalled at {lost_at:?}, after the deadline {:?} ({:?})",
        holder.valid_until(),
        lost.reason()
    );
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_21a_leader_killed_while_held_kept_or_lost_in_time_fences_rise() {
    let _proof = proves(Backend::Etcd, Fault::FailOver);
    let cluster = start_cluster().await;
    let a = client(&cluster.url()).await;
    let b = client(&cluster.url()).await;
    let k = key("leader-killed");
    let holder = a.try_acquire(&k).await.expect("acquire");
    // A renewal or two before the fault.
    tokio::time::sleep(TTL / 2).await;
    assert!(holder.is_valid());
    let lead = leader(&cluster).await;
    let fault_at = Instant::now();
    {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.member(lead).kill())
            .await
            .unwrap();
    }
    let new_leader = leader(&cluster).await;
    assert_ne!(new_leader, lead, "a new leader is elected");
    let taken = contend(&holder, &b, &k).await;
    let kept = kept_or_lost_in_time(&holder, fault_at);
    eprintln!(
        "row 21a: kept {kept}, taken {}, lost {:?}",
        taken.is_some(),
        holder.lost_reason()
    );
    if kept {
        assert!(taken.is_none());
    }
    // The killed member comes back; fences keep rising.
    {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.start_again(lead))
            .await
            .unwrap();
    }
    let mut highest: Fence = holder.fence();
    if let Some(l) = &taken {
        highest = highest.max(l.fence());
    }
    let c = client(&cluster.url()).await;
    let _ = holder.release().await;
    if let Some(l) = taken {
        let _ = l.release().await;
    }
    let next = c
        .acquire(&k, TTL * 3)
        .await
        .expect("acquire after the restart");
    assert!(next.fence() > highest, "{:?} <= {highest:?}", next.fence());
}

/// How the holder's only member is lost in [`member_lost_under_the_holder`].
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// Frozen (`SIGSTOP`): the holder's requests hang until their timeouts.
    Paused,
    /// Killed (`kill -9`): the holder's connections are refused.
    Killed,
}

/// A follower is the holder's only endpoint (the contender's are the two others) and is
/// lost under the held, renewed lease. The holder cannot reach the cluster: it cannot keep
/// the lease; the two members left (a quorum) let the contender in once the holder's etcd
/// lease expired, never while the holder still believes (checked at each of the
/// contender's grants by `contend`), and the holder heard lost by its deadline. With the
/// member back, the old holder's release leaves the new lease intact, and the next grant
/// through that member has a higher fence.
async fn member_lost_under_the_holder(loss: Loss) {
    let cluster = start_cluster().await;
    let lead = leader(&cluster).await;
    let follower = (lead + 1) % 3;
    let others: Vec<String> = (0..3)
        .filter(|i| *i != follower)
        .map(|i| format!("127.0.0.1:{}", cluster.member(i).port()))
        .collect();
    // The holder's only endpoint is the follower; the contender's are the two others.
    let a = client(&cluster.member(follower).url()).await;
    let b = client(&format!("etcd://{}", others.join(","))).await;
    let k = key("member-lost");
    let holder = a.try_acquire(&k).await.expect("acquire");
    tokio::time::sleep(TTL / 2).await;
    assert!(holder.is_valid());
    let fault_at = Instant::now();
    {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || match loss {
            Loss::Paused => c.member(follower).pause(),
            Loss::Killed => c.member(follower).kill(),
        })
        .await
        .unwrap();
    }
    let taken = contend(&holder, &b, &k).await;
    let kept = kept_or_lost_in_time(&holder, fault_at);
    eprintln!(
        "row 21 ({loss:?}): kept {kept}, taken {}, lost {:?}",
        taken.is_some(),
        holder.lost_reason()
    );
    // The holder cannot reach the cluster: it cannot have kept the lease, and the two
    // members left (a quorum) let the contender in once the holder's etcd lease expired.
    assert!(!kept, "renewed through a lost member?");
    let taken = taken.expect("the contender gets the lease after the holder's TTL");
    {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || match loss {
            Loss::Paused => c.member(follower).resume(),
            Loss::Killed => c.start_again(follower),
        })
        .await
        .unwrap();
    }
    // Back: the old holder's release does not touch the new holder's lease.
    assert!(
        !holder.release().await.unwrap_or(false),
        "the old holder released a lease it had lost"
    );
    assert!(taken.is_valid());
    let fence = taken.fence();
    assert!(taken.release().await.unwrap());
    let next = a
        .acquire(&k, TTL * 3)
        .await
        .expect("acquire through the member back in the cluster");
    assert!(next.fence() > fence);
}

/// The holder's only member frozen (`SIGSTOP`): its renewals time out (docs/guarantees.md,
/// etcd × server paused, on a cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_21b_member_stopped_under_the_holder_kept_or_lost_in_time_fences_rise() {
    let _proof = proves(Backend::Etcd, Fault::ServerPaused);
    member_lost_under_the_holder(Loss::Paused).await;
}

/// The holder's only member killed (`kill -9`) and started again: a member of the cluster
/// lost under the holder (docs/guarantees.md, etcd × fail-over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_21c_member_killed_under_the_holder_lost_in_time_fences_rise() {
    let _proof = proves(Backend::Etcd, Fault::FailOver);
    member_lost_under_the_holder(Loss::Killed).await;
}
