//! Issue 14.4 / docs/faults.md row 26 against a real server: one client holding 100,000 leases on
//! a private, healthy Redis loses none, renews them in batches (one script call per 1,000
//! leases per renew interval, plus a few), keeps its resident memory per lease in bounds,
//! and still fires each lost signal by its own deadline once the store stops answering.
//! Asserts counts and memory, never a speed (the CPU share is printed, for the notes).

mod common;

use std::time::Duration;

use common::Standalone;
use futures::stream::{self, StreamExt};
use leasehold_core::{LeaseClient, LeaseConfig, RENEW_BATCH};
use leasehold_testkit::ProxyMode;

/// How many leases to hold: 20,000 by default (what a debug build on two loaded cores
/// acquires and renews with room to spare in the test command); the 100,000 with
/// `LEASEHOLD_MANY_LEASES=100000` in a release build:
/// `LEASEHOLD_MANY_LEASES=100000 cargo test --release -p leasehold-redis --test many_leases -- --nocapture`.
fn leases_to_hold() -> usize {
    std::env::var("LEASEHOLD_MANY_LEASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// This process's resident memory in bytes (`/proc/self/statm`): everything the process
/// uses, the allocator's overhead included.
fn resident() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// CPU time of this process (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the 14th field.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ = 100 on Linux
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_a_hundred_thousand_leases_loses_none_and_renews_in_batches() {
    let n = leases_to_hold();
    let s = Standalone::start().await;
    let ttl = Duration::from_secs(10);
    let cfg = LeaseConfig::new(ttl).unwrap();
    let client = LeaseClient::new(s.store.clone(), cfg.clone());
    // Warm up (connection, scripts), so that the memory measured is the leases'.
    client
        .try_acquire("warm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = resident();
    let mut leases = Vec::with_capacity(n);
    // 256 acquires in flight at a time, as issue 29 measured: the memory the burst leaves
    // in the allocator counts too.
    let mut grants = stream::iter(0..n)
        .map(|i| client.try_acquire(format!("many:{i}")))
        .buffered(256);
    while let Some(lease) = grants.next().await {
        leases.push(lease.unwrap());
    }
    drop(grants);
    let calls_before = s.evalsha_calls().await;
    let cpu_before = cpu_time();
    // Three renew intervals (3.3 s each).
    let hold = cfg.renew_interval() * 3;
    tokio::time::sleep(hold).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let calls = s.evalsha_calls().await - calls_before;
    let per_lease = (resident() - before) / n as i64;
    eprintln!(
        "{n} leases: {calls} renewal script calls in {hold:?}, {per_lease} bytes per lease, \
         CPU {:.0} % of one core while holding",
        100.0 * cpu.as_secs_f64() / hold.as_secs_f64()
    );
    let lost: Vec<_> = leases
        .iter()
        .filter_map(|l| l.lost_reason().map(|r| (l.key().to_string(), r)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {n} leases lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    // Each lease renewed about three times, in batches: about n / RENEW_BATCH calls per
    // interval, plus the few the coalescing window lets through. (One call per renewal
    // would be 300,000.)
    let intervals = 4; // the hold, and the interval under way when it started
    assert!(
        calls <= (intervals * (n / RENEW_BATCH + 12)) as u64,
        "{calls} renewal calls for {n} leases over {intervals} renew intervals"
    );
    // Resident memory is a noisy measure (the allocator's arenas, a loaded machine): with 256
    // acquires in flight, debug runs of the default 20,000 leases measured 887–923 bytes per
    // lease (1,175 before issue 29's changes; 1,147 with 256 bytes added to each lease's
    // shared state, which this bound caught), release runs of 100,000 leases 685 (see
    // docs/benchmarks.md); this bound catches a regression of about 180 bytes per lease
    // without failing on noise.
    assert!(
        per_lease < 1100,
        "{per_lease} bytes of resident memory per lease held"
    );

    // The store stops answering: every lease is lost by its own deadline (the validity
    // deadline counts from the send of its last accepted renewal), not much later.
    s.proxy.set_mode(ProxyMode::Blackhole);
    let latest = leases.iter().map(|l| l.valid_until()).max().unwrap();
    tokio::time::sleep_until(latest).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let late: Vec<_> = leases
        .iter()
        .filter(|l| {
            l.lost()
                .lost_at()
                .is_none_or(|at| at > l.valid_until() + Duration::from_millis(500))
        })
        .map(|l| (l.key().to_string(), l.valid_until(), l.lost().lost_at()))
        .collect();
    assert!(
        late.is_empty(),
        "{} of {n} lost signals missing or more than 500 ms after the deadline, e.g. {:?}",
        late.len(),
        &late[..late.len().min(3)]
    );
    s.proxy.set_mode(ProxyMode::Pass);
    drop(leases);
    client.shutdown(Duration::from_secs(5)).await;
}
