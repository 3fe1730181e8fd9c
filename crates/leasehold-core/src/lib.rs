//! # leasehold
//!
//! Distributed leases with fencing tokens. A [`Lease`] is an exclusive, time-bounded right
//! to act on a named resource, held in an external [`Store`]; its [`Fence`] grows with
//! every grant, so the storage that receives the protected writes can reject a holder
//! that lost the lease while it was paused.
//!
//! This crate is the core: key, owner token, fence, configuration, the store contract, the
//! lease handle, the renewal scheduler, the acquire policy, errors and metrics, plus an
//! in-memory store. Backends live in their own crates behind the [`Store`] trait.
//!
//! ## What it guarantees, and what it does not
//! - At most one holder believes it holds a lease at a time, *as long as* processes are
//!   not paused longer than the validity window and clocks drift less than the configured
//!   factor. A paused process can wake up believing it holds a lease that another process
//!   has since acquired; [`Lease::is_valid`] then reports `false` and the lost signal fires
//!   as soon as it runs again, but a write already under way can still land. Only the
//!   storage that receives the write can stop it, by checking the fence in the same
//!   transaction as the write (the guard).
//! - Releasing is the holder's act. A lost lease stays in the store until its holder
//!   releases or drops the [`Lease`], or until the store expires it: the library never
//!   frees a lease while the code that believed it held it may still be running.
//! - Every question about a lease ([`Lease::is_valid`], [`LostSignal::is_lost`],
//!   [`LostSignal::wait`], [`Lease::run`]) compares the deadline with the clock on the
//!   spot, so code that runs first after a freeze gets the truth before any background
//!   task has run; [`Lease::lost_token`] is a notification that may lag by the time the
//!   background tasks take to run again. (Tests: `tests/suspend.rs`,
//!   `tests/frozen_process.rs`.)
//! - The lost signal fires at the validity deadline even when the async runtime is
//!   starved: a process-wide OS watchdog thread fires it. (Test: `tests/realtime.rs`.)
//! - Deadlines count time the host spent suspended (`CLOCK_BOOTTIME` on Linux; other
//!   platforms count only monotonic time, see [`clock`]). (Test: `tests/suspend.rs`.)
//! - Every schedule (first renewal, `max_hold`, the validity deadline) counts from the send
//!   of the request that granted or renewed the lease, never from its reply. (Test:
//!   `tests/timing.rs`.)
//! - A lease released by its holder never reports lost, even when a renewal in flight is
//!   answered `NotOwner` after the release. (Test: `tests/timing.rs`.)
//! - No duration overflows: durations added to instants saturate (`Duration::MAX` as a
//!   wait means "as long as it takes"). (Test: `tests/properties.rs`.)
//! - One client can hold many leases: the renewal scheduler's work per event grows with
//!   the logarithm of the number of leases. (Test: `tests/many_leases.rs`.)
//! - [`LeaseClient::shutdown`] stops renewals, tells the work under each lease to stop, and
//!   waits (bounded) for the holders to let go; it never releases a lease whose holder's
//!   code may still run. (Tests: `tests/shutdown.rs`, and the SQLite crate's
//!   `graceful_shutdown` test of its `graceful_worker` example.)
//! - A lease is not exactly-once: retries and crashes after commit repeat work. Pair the
//!   fence check with an idempotency record.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod backoff;
mod client;
pub mod clock;
pub mod config;
mod error;
pub mod guard;
mod key;
mod lease;
pub mod memory;
pub mod metrics;
mod observer;
mod registry;
mod scheduler;
mod store;
mod token;
pub mod url;
mod watchdog;
pub mod wrap;

pub use backoff::Backoff;
pub use client::{LeaseClient, LeaseClientBuilder, ShutdownReport};
pub use config::{ConfigError, LeaseConfig, LeaseConfigBuilder};
pub use error::{Action, Error, StoreError, StoreErrorKind};
pub use guard::{GuardDecision, Idempotency, ResourceName, ResourceNameError};
pub use key::{IntoKey, Key, KeyError, MAX_KEY_LEN};
pub use lease::{Lease, LostFuture, LostReason, LostSignal};
pub use observer::{LeaseObserver, RenewalEvent, RenewalPhase};
pub use registry::{OpenFuture, Registry, StoreFactory};
pub use store::{
    AcquireOutcome, Capabilities, FenceDurability, LeaseInfo, ReleaseOutcome, RenewOutcome, Store,
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
