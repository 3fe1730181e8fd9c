//! Issue 10.10 / FAULTS row 26 against a real server: one client holding ten thousand
//! leases on a private, healthy Redis loses none. Asserts no loss, never a speed.

mod common;

use std::time::Duration;

use common::Standalone;
use leasehold_core::{LeaseClient, LeaseConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_ten_thousand_leases_loses_none() {
    const N: usize = 10_000;
    let s = Standalone::start().await;
    let ttl = Duration::from_secs(10);
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(ttl).unwrap());
    let mut leases = Vec::with_capacity(N);
    for i in 0..N {
        leases.push(client.try_acquire(format!("many:{i}")).await.unwrap());
    }
    // Several renew intervals (3.3 s each).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let lost: Vec<_> = leases
        .iter()
        .filter_map(|l| l.lost_reason().map(|r| (l.key().to_string(), r)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {N} leases lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    for lease in leases {
        assert!(lease.release().await.unwrap());
    }
}
