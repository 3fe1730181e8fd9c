//! The conformance suite on the in-memory store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::{Faults, Fixture};
use leasehold_core::Key;
use leasehold_core::memory::{MemoryStore, Unreachable};

struct MemoryFaults(MemoryStore);

#[async_trait]
impl Faults for MemoryFaults {
    async fn forget(&self, key: &Key) {
        self.0.forget(key);
    }
    async fn make_unreachable(&self) {
        self.0.set_unreachable(Some(Unreachable::Hang));
    }
    async fn restore(&self) {
        self.0.set_unreachable(None);
    }
}

async fn fixture() -> Fixture {
    let store = MemoryStore::new();
    Fixture::new(
        Arc::new(store.clone()),
        Arc::new(MemoryFaults(store)),
        Duration::from_millis(600),
    )
    .no_guard("the in-memory store has no storage-side guard")
    .this_process_only()
}

leasehold_conformance::conformance_suite!(fixture);
