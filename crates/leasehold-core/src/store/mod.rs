//! The store side: the [contract](Store) every backend implements and its extensions
//! (docs/design.md §3), the words it speaks, the in-memory store, and the registry that
//! opens a store from a URL.

mod contract;
pub mod doctor;
pub mod memory;
pub(crate) mod registry;
mod types;
pub mod url;

#[cfg(feature = "test-util")]
pub(crate) use contract::renew_each;
pub use contract::{
    BatchStore, Store, WaitStore, WatchStore, acquire_any, acquire_any_checked,
    acquire_any_checked_in_two_calls, acquire_any_one_by_one, first_granted, renew_many,
};
pub use registry::{OpenFuture, Registry, StoreFactory};
pub use types::{
    AcquireAnyOutcome, AcquireOutcome, Capabilities, Changes, CheckedAcquire, FenceDurability,
    HandedGrant, LeaseInfo, MAX_RECORD_LEN, RENEW_BATCH, Record, RecordCheck, ReleaseOutcome,
    RenewOutcome, WaitOutcome,
};
