#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

// The model, one folder each: `store` (the contract every backend implements, its
// extensions, the in-memory store and the URL registry), `lease` (the holder's side: the
// client, the lease handle, renewal, the deadline watchdog), `recipes` (elections and
// semaphores, built on the client's public acquire step) and `wrap` (policies as store
// wrappers). The files at the top are the vocabulary all of them share.
pub mod clock;
pub mod config;
mod error;
pub mod guard;
mod key;
pub mod lease;
pub mod metrics;
pub mod recipes;
pub mod store;
pub mod tls;
#[cfg(feature = "tls-session")]
pub mod tls_session;
mod token;
pub mod wrap;

pub use config::backoff;
pub use recipes::{election, kind, semaphore};
pub use store::{doctor, memory, url};

pub use config::backoff::Backoff;
pub use config::{ConfigError, LeaseConfig, LeaseConfigBuilder};
pub use election::{Election, Leader, Leadership};
pub use error::{Action, Error, Refusal, StoreError, StoreErrorKind};
pub use guard::{GuardDecision, Idempotency, ResourceName, ResourceNameError};
pub use key::{IntoKey, Key, KeyError, MAX_KEY_LEN};
pub use kind::ResourceKind;
pub use lease::EndedGrants;
pub use lease::{AcquireStep, LeaseClient, LeaseClientBuilder, ShutdownReport, StepCall};
pub use lease::{Health, HealthChanges, HoldEnd, Lease, LostFuture, LostReason, LostSignal};
pub use lease::{LeaseObserver, RenewalEvent, RenewalPhase};
pub use semaphore::{Permit, Semaphore};
pub use store::doctor::{Diagnosis, Fact, Finding, Verdict};
pub use store::{
    AcquireAnyOutcome, BatchStore, Changes, CheckedAcquire, RENEW_BATCH, RecordCheck, WaitStore,
    WatchStore, acquire_any, acquire_any_checked, acquire_any_checked_in_two_calls,
    acquire_any_one_by_one, first_granted, renew_many,
};
pub use store::{
    AcquireOutcome, Capabilities, FenceDurability, HandedGrant, LeaseInfo, MAX_RECORD_LEN, Record,
    ReleaseOutcome, RenewOutcome, Store, WaitOutcome,
};
pub use store::{OpenFuture, Registry, StoreFactory};
pub use tls::{TlsFailure, TlsProblem};
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
