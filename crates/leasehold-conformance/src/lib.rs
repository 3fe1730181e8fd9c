//! The conformance suite every leasehold store must pass.
//!
//! Each case is a plain `async fn(&Fixture)` that panics on failure. A backend's tests
//! provide an async function returning a [`Fixture`] (the store, its fault hooks, a base
//! TTL, and whatever keeps its server alive) and expand [`conformance_suite!`], which
//! generates one `#[tokio::test]` per case, so every backend runs every case and a
//! missing case is impossible.
//!
//! ```ignore
//! async fn fixture() -> leasehold_conformance::Fixture { /* start a server … */ }
//! leasehold_conformance::conformance_suite!(fixture);
//! ```
//!
//! Capabilities are parameters, not reasons to skip: a backend that lacks one must say
//! so through [`Capabilities`](leasehold::Capabilities), and the suite checks that it
//! answers `Unsupported` for it.
#![forbid(unsafe_code)]

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::{Key, LeaseClient, LeaseConfig, Store};

pub mod cases;

/// Fault hooks a backend's fixture provides to the suite.
#[async_trait]
pub trait Faults: Send + Sync {
    /// Makes the store forget the lease at `key` (as if it expired early), keeping the
    /// fence counter.
    async fn forget(&self, key: &Key);
    /// Makes the store unreachable (calls hang or fail) until [`restore`](Self::restore).
    async fn make_unreachable(&self);
    /// Makes the store reachable again.
    async fn restore(&self);
}

/// What each case runs against.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// Its fault hooks.
    pub faults: Arc<dyn Faults>,
    /// The base TTL of timed cases: long enough for a renewal round trip on a loaded
    /// machine (e.g. 1 s for a local server).
    pub ttl: Duration,
    /// Keeps servers, proxies and temporary directories alive for the case.
    pub guard: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// The default configuration for this fixture's TTL.
    pub fn config(&self) -> LeaseConfig {
        LeaseConfig::new(self.ttl).expect("fixture ttl is valid")
    }

    /// A client with the default configuration.
    pub fn client(&self) -> LeaseClient {
        LeaseClient::new(self.store.clone(), self.config())
    }
}

/// Calls `$crate::$mac!($args ; case, case, …)` with the one list of every case, so the
/// generated tests and [`CASES`] cannot drift apart.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($mac:ident ! ($($args:tt)*)) => {
        $crate::$mac! { $($args)* ;
            acquire_release,
            contended_try_acquire,
            concurrent_contenders_exclusive_and_fences_increase,
            same_owner_reacquire_returns_same_fence,
            fence_never_reused_after_release,
            fence_never_reused_after_expiry,
            late_release_leaves_new_owner_intact,
            only_owner_renews_or_releases,
            renew_extends_ttl,
            inspect_reports_holder,
            max_hold_fires_lost,
            lost_within_one_renew_interval_after_forget,
            lost_before_expiry_when_unreachable,
            waiting_acquire_gets_released_lease,
            bad_input_gets_typed_errors,
            capabilities_are_honest,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_names {
    (; $($case:ident),* $(,)?) => {
        &[$(stringify!($case)),*]
    };
}

/// The names of every case, as [`conformance_suite!`] generates them.
pub const CASES: &[&str] = __with_cases!(__case_names!());

/// Generates one `#[tokio::test]` per conformance case, each calling `$fixture().await`.
///
/// `$fixture` is a path to an `async fn() -> Fixture`. The calling crate needs `tokio`
/// (with the `macros` and `rt-multi-thread` features) as a dev-dependency.
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:path) => {
        $crate::__with_cases!(__case_tests!($fixture));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_tests {
    ($fixture:path ; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $fixture().await;
                $crate::cases::$case(&fixture).await;
            }
        )*
    };
}
