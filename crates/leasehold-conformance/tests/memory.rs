//! The conformance suite on the in-memory store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture};
use leasehold_core::Key;
use leasehold_core::memory::MemoryStore;
use leasehold_core::wrap::{FaultStore, Unreachable};

/// The memory store's fault hooks: `forget` on the store itself, unreachability through
/// the fault-injecting wrapper the fixture's store sits behind.
struct MemoryFaults(MemoryStore, Arc<FaultStore>);

#[async_trait]
impl Faults for MemoryFaults {
    async fn forget(&self, key: &Key) {
        self.0.forget(key);
    }
    async fn make_unreachable(&self) {
        self.1.set_unreachable(Some(Unreachable::Hang));
    }
    async fn restore(&self) {
        self.1.set_unreachable(None);
    }
}

async fn fixture() -> Fixture {
    let store = MemoryStore::new();
    let faults = Arc::new(FaultStore::new(Arc::new(store.clone())));
    Fixture::new(
        faults.clone(),
        Arc::new(MemoryFaults(store, faults)),
        Duration::from_millis(600),
    )
    .this_process_only()
    // The fault-injecting wrapper always has a batch (the defaults over the memory
    // store, through its faultable calls); the watcher and waiter are the memory store's.
    .expects_batch()
    .expects_watcher()
    .expects_waiter()
}

leasehold_conformance::conformance_suite!(fixture, backend = Memory);
