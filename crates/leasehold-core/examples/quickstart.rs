//! The story leasehold exists for, on the in-memory store (no server needed):
//!
//! 1. worker A acquires the lease (fence 1) and starts writing;
//! 2. A is frozen (a GC pause, a VM suspension) for longer than the TTL;
//! 3. the lease expires in the store; worker B acquires it (fence 2) and writes;
//! 4. A wakes up: its lost signal has already fired, and the phantom write it still
//!    attempts is rejected by the guard, because fence 1 < fence 2.
//!
//! Run: `cargo run -p leasehold --example quickstart`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_core::memory::MemoryStore;
use leasehold_core::{Fence, LeaseClient, LeaseConfig};

/// The protected storage: it remembers the highest fence it accepted and rejects lower
/// ones, in the same critical section as the write (a database does this in one
/// transaction; see the guards of the database backends).
#[derive(Default)]
struct GuardedLedger {
    inner: Mutex<(u64, Vec<String>)>,
}

impl GuardedLedger {
    fn write(&self, fence: Fence, entry: &str) -> Result<(), u64> {
        let mut s = self.inner.lock().unwrap();
        if fence.get() < s.0 {
            return Err(s.0);
        }
        s.0 = fence.get();
        s.1.push(format!("{entry} (fence {fence})"));
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let t = move || format!("{:>6.2}s", start.elapsed().as_secs_f64());
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(GuardedLedger::default());
    let config = LeaseConfig::new(Duration::from_secs(1))?;
    let key = "job:nightly-invoices";

    // Worker A runs on its own runtime thread, so freezing that thread freezes A entirely.
    let rt_a = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client_a = LeaseClient::new(store.clone(), config.clone());
    let lease_a = rt_a.block_on(client_a.try_acquire(key))?;
    println!("{} A acquired {key} with fence {}", t(), lease_a.fence());
    ledger
        .write(lease_a.fence(), "A: invoice batch 1")
        .expect("A holds the lease");
    println!("{} A wrote invoice batch 1", t());

    let a_thread = {
        let ledger = ledger.clone();

        std::thread::spawn(move || {
            println!("{} A is frozen (think: a 3 s GC pause)", t());
            std::thread::sleep(Duration::from_secs(3)); // nothing of A runs, not even renewal
            println!(
                "{} A wakes up: lost signal fired = {}, reason = {:?}",
                t(),
                lease_a.lost().is_lost(),
                lease_a.lost_reason()
            );
            // A careless worker writes anyway (or was already mid-write when it froze):
            match ledger.write(lease_a.fence(), "A: invoice batch 2 (phantom)") {
                Ok(()) => println!("{} A's phantom write was ACCEPTED: data corrupted", t()),
                Err(highest) => println!(
                    "{} A's write with fence {} was REJECTED by the guard (highest accepted: {highest})",
                    t(),
                    lease_a.fence()
                ),
            }
            rt_a.block_on(async move {
                println!(
                    "{} A releases: still held = {}",
                    t(),
                    lease_a.release().await.unwrap_or(false)
                );
            });
        })
    };

    let rt_b = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt_b.block_on(async {
        let client_b = LeaseClient::new(store.clone(), config.clone());
        let lease_b = client_b.acquire(key, Duration::from_secs(10)).await?;
        println!(
            "{} B acquired {key} with fence {} (A's lease expired in the store)",
            t(),
            lease_b.fence()
        );
        ledger
            .write(lease_b.fence(), "B: invoice batch 2")
            .expect("B holds the lease");
        println!("{} B wrote invoice batch 2", t());
        tokio::time::sleep(Duration::from_millis(2500)).await;
        println!(
            "{} B releases: still held = {}",
            t(),
            lease_b.release().await?
        );
        Ok::<_, leasehold_core::Error>(())
    })?;
    a_thread.join().expect("worker A");

    println!("\nledger:");
    for entry in &ledger.inner.lock().unwrap().1 {
        println!("  {entry}");
    }
    Ok(())
}
