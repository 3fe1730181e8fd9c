//! The holder's side: the [client](LeaseClient) that acquires, the [lease](Lease) handle
//! with its fence, deadline and lost signal, the renewal scheduler and the deadline
//! watchdog (docs/design.md §4 and §5).

pub(crate) mod client;
pub(crate) mod ended;
mod handle;
mod health;
mod live;
mod lost;
pub(crate) mod observer;
pub(crate) mod scheduler;
pub(crate) mod shared;
pub(crate) mod step;
mod watchdog;

pub use client::{LeaseClient, LeaseClientBuilder, ShutdownReport};
pub use ended::EndedGrants;
pub use handle::{HoldEnd, Lease, LostFuture, LostSignal};
pub use health::{Health, HealthChanges};
pub use lost::LostReason;
pub use observer::{LeaseObserver, RenewalEvent, RenewalPhase};
pub use step::{AcquireStep, StepCall};
