#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod backoff;
mod client;
pub mod clock;
pub mod config;
pub mod election;
mod ended;
mod error;
mod ext;
pub mod guard;
mod key;
pub mod kind;
mod lease;
pub mod memory;
pub mod metrics;
mod observer;
mod registry;
mod scheduler;
pub mod semaphore;
mod store;
mod token;
pub mod url;
mod watchdog;
pub mod wrap;

pub use backoff::Backoff;
pub use client::{LeaseClient, LeaseClientBuilder, ShutdownReport};
pub use config::{ConfigError, LeaseConfig, LeaseConfigBuilder};
pub use election::{Election, Leader, Leadership};
pub use ended::EndedGrants;
pub use error::{Action, Error, StoreError, StoreErrorKind};
pub use ext::{
    AcquireAnyOutcome, BatchStore, Changes, CheckedAcquire, RENEW_BATCH, RecordCheck, WaitStore,
    WatchStore, acquire_any, acquire_any_checked, acquire_any_checked_in_two_calls,
    acquire_any_one_by_one, renew_many,
};
pub use guard::{GuardDecision, Idempotency, ResourceName, ResourceNameError};
pub use key::{IntoKey, Key, KeyError, MAX_KEY_LEN};
pub use kind::ResourceKind;
pub use lease::{Lease, LostFuture, LostReason, LostSignal};
pub use observer::{LeaseObserver, RenewalEvent, RenewalPhase};
pub use registry::{OpenFuture, Registry, StoreFactory};
pub use semaphore::{Permit, Semaphore};
pub use store::{
    AcquireOutcome, Capabilities, FenceDurability, LeaseInfo, MAX_RECORD_LEN, Record,
    ReleaseOutcome, RenewOutcome, Store,
};
pub use token::{Fence, OwnerToken, ParseOwnerTokenError};
pub use tokio_util::sync::CancellationToken;

#[cfg(test)]
mod bounds {
    fn is_send_sync<T: Send + Sync>() {}
    #[test]
    fn bounds() {
        is_send_sync::<super::LeaseClient>();
        is_send_sync::<super::Lease>();
        is_send_sync::<super::LostSignal>();
        is_send_sync::<super::Error>();
        is_send_sync::<std::sync::Arc<dyn super::Store>>();
    }
}
