#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Fence, Key, LeaseClient, LeaseConfig, Store, StoreError};
use leasehold_testkit::{
    EtcdCluster, EtcdServer, FaultProxy, MariaDb, Postgres, ProxyMode, RedisCluster, RedisServer,
    ZkEnsemble, ZkServer,
};

/// The guarantee tests' tags ([`Fixture::proves`]), from the test kit.
pub use leasehold_testkit::proof;

pub mod cases;
pub mod coordination;
pub mod fault_cases;
pub mod growth;
pub mod guard;
pub mod holder;
pub mod holder_faults;
pub mod restart;
pub mod takeover;
pub mod waiting;
pub mod watching;

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

/// Writes through a backend's storage-side guard (docs/design.md §6), for the stale-writer case.
#[async_trait]
pub trait FencedWrites: Send + Sync {
    /// In **one transaction** of the guarded storage: checks `fence` against the highest
    /// fence accepted for `resource`; if it is not lower, writes `value` as `resource`'s
    /// value, advances the guard and commits (`Ok(true)`); otherwise rolls back, leaving
    /// nothing behind (`Ok(false)`).
    async fn write(&self, resource: &str, fence: Fence, value: &str) -> Result<bool, StoreError>;
    /// The value of the last accepted write to `resource`, if any.
    async fn read(&self, resource: &str) -> Result<Option<String>, StoreError>;
}

/// The storage-side guard the stale-writer case writes through, with the fences of the
/// fixture's store. The guard lives in the database that receives the writes, not in the
/// lease store, so every store's holders are fenced by one: the case always runs.
#[derive(Clone, Default)]
pub enum GuardSupport {
    /// The SQLite guard in an embedded database of the case's own
    /// ([`guard::EmbeddedGuard`]): for a store whose own database has no guard.
    #[default]
    Embedded,
    /// Writes through the guard in the store's own database.
    Writes(Arc<dyn FencedWrites>),
}

impl std::fmt::Debug for GuardSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded => f.write_str("Embedded"),
            Self::Writes(_) => f.write_str("Writes(..)"),
        }
    }
}

/// Reads a store's queue of waiters on its server, for the arrival-order cases: each
/// waiter is seen queued in the store before the next one arrives, an observed state
/// rather than a pause a loaded machine can outlast.
#[async_trait]
pub trait Queue: Send + Sync {
    /// How many owners wait in the store's queue for `key` (not counting its holder).
    async fn waiting(&self, key: &Key) -> usize;
}

/// Waits until `queue` shows at least `n` owners waiting for `key`; fails with `what` after
/// `within`.
pub async fn until_queued(queue: &dyn Queue, key: &Key, n: usize, within: Duration, what: &str) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let seen = queue.waiting(key).await;
        if seen >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never seen queued in the store ({seen} of {n} waiters after {within:?})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether another OS process can open the store under test (for the `kill -9` and the
/// near-miss freeze cases, whose holder is a separate process).
#[derive(Debug, Clone, Default)]
pub enum OtherProcesses {
    /// The fixture did not say: the cases that need a holder process fail.
    #[default]
    Undeclared,
    /// The store lives in this process's memory: no other process can open it. The
    /// `kill -9` case then checks that its capabilities say its fences die with the
    /// process ([`FenceDurability::Process`](leasehold_core::FenceDurability::Process)).
    ThisProcessOnly,
    /// Another process opens the store by passing this string to the `open` function
    /// given to the suite macros (`holder = open`).
    Url(String),
}

/// A server process (or a group of them) that a fault case can freeze with `SIGSTOP`.
pub trait Pausable: Send + Sync {
    /// Freezes every process of the server (`SIGSTOP`); returns once they are stopped.
    fn pause(&self);
    /// Continues them (`SIGCONT`).
    fn resume(&self);
}

/// `Pausable` for server types by their own methods: `Type => pause, resume;`.
macro_rules! pausable {
    ($($server:ty => $pause:ident, $resume:ident;)*) => {$(
        impl Pausable for $server {
            fn pause(&self) {
                <$server>::$pause(self);
            }
            fn resume(&self) {
                <$server>::$resume(self);
            }
        }
    )*};
}

pausable! {
    RedisServer => pause, resume;
    Postgres => pause, resume;
    MariaDb => pause, resume;
    EtcdServer => pause, resume;
    ZkServer => pause, resume;
    EtcdCluster => pause_all, resume_all;
    ZkEnsemble => pause_all, resume_all;
}

impl Pausable for RedisCluster {
    fn pause(&self) {
        for node in self.nodes() {
            node.pause();
        }
    }
    fn resume(&self) {
        for node in self.nodes() {
            node.resume();
        }
    }
}

impl Pausable for leasehold_testkit::RedisSentinelSet {
    /// The data servers (not the sentinels, which start no fail-over by themselves).
    fn pause(&self) {
        for s in self.servers() {
            s.pause();
        }
    }
    fn resume(&self) {
        for s in self.servers() {
            s.resume();
        }
    }
}

impl<T: Pausable + ?Sized> Pausable for Arc<T> {
    fn pause(&self) {
        (**self).pause();
    }
    fn resume(&self) {
        (**self).resume();
    }
}

/// What the fault cases ([`fault_suite!`]) need of a networked backend.
pub struct Network {
    /// The fault proxies between [`Fixture::store`] and its server(s): one per server
    /// (per Cluster node). Every fault is applied to all of them.
    pub proxies: Vec<Arc<FaultProxy>>,
    /// A second store on the same server(s), **not** through the proxies: it sees what the
    /// server holds while the proxies misbehave.
    pub direct: Arc<dyn Store>,
    /// The server process(es), for docs/faults.md row 4.
    pub servers: Arc<dyn Pausable>,
    /// The longest a call of [`Fixture::store`] waits for an unresponsive server before it
    /// fails by itself, if the store bounds its calls (`None`: only the caller's timeout
    /// ends such a call, as the `Store` trait allows).
    pub op_bound: Option<Duration>,
    /// Whether an acquire whose reply is lost (dropped by the proxy, or reset after the
    /// request reached the server) has always been applied: the store's acquire is one
    /// request and one reply on a warm connection. The lost-reply and reset cases then
    /// insist that their first, plain, fault left the grant applied; on other stores they
    /// retry the fault until it does (and fail if it never does), so that they cannot pass
    /// vacuously either way.
    pub lost_reply_applies: bool,
    /// How much less than the time a lease has left the remaining TTL the store reports
    /// may be (its rounding): 1 ms unless declared (etcd reports whole seconds, rounded
    /// down).
    pub remaining_resolution: Duration,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("proxies", &self.proxies)
            .field("direct", &self.direct)
            .field("op_bound", &self.op_bound)
            .field("lost_reply_applies", &self.lost_reply_applies)
            .field("remaining_resolution", &self.remaining_resolution)
            .finish_non_exhaustive()
    }
}

impl Network {
    /// The proxies, the direct store and the server processes; the store does not bound
    /// its calls, and a dropped reply is not assumed to follow an applied acquire.
    pub fn new(
        proxies: Vec<Arc<FaultProxy>>,
        direct: Arc<dyn Store>,
        servers: Arc<dyn Pausable>,
    ) -> Self {
        Self {
            proxies,
            direct,
            servers,
            op_bound: None,
            lost_reply_applies: false,
            remaining_resolution: Duration::from_millis(1),
        }
    }

    /// Declares that the remaining TTL the store reports is rounded down to `resolution`.
    pub fn remaining_resolution(mut self, resolution: Duration) -> Self {
        self.remaining_resolution = resolution;
        self
    }

    /// Declares that the store ends each call by itself within `bound`.
    pub fn op_bound(mut self, bound: Duration) -> Self {
        self.op_bound = Some(bound);
        self
    }

    /// Declares whether an acquire whose reply is dropped has always been applied.
    pub fn lost_reply_applies(mut self, yes: bool) -> Self {
        self.lost_reply_applies = yes;
        self
    }

    /// Switches every proxy to `mode`.
    pub fn set_mode(&self, mode: ProxyMode) {
        for p in &self.proxies {
            p.set_mode(mode);
        }
    }

    /// Resets every connection of every proxy.
    pub fn reset_all(&self) {
        for p in &self.proxies {
            p.reset_all();
        }
    }

    /// How many connections the proxies have accepted.
    pub fn connections(&self) -> usize {
        self.proxies.iter().map(|p| p.connections()).sum()
    }
}

/// The extensions of the store contract a fixture's store offers ([`Store::batch`],
/// [`Store::watcher`], [`Store::waiter`]). `capabilities_are_honest` checks that the store
/// has exactly the ones its fixture declares, so a store (or a wrapper) that loses one is
/// caught, not quietly left to the callers' fallbacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Extensions {
    /// [`Store::batch`] answers `Some`.
    pub batch: bool,
    /// [`Store::watcher`] answers `Some`.
    pub watcher: bool,
    /// [`Store::waiter`] answers `Some`.
    pub waiter: bool,
}

impl Extensions {
    /// The extensions `store` offers.
    pub fn of(store: &dyn Store) -> Self {
        Self {
            batch: store.batch().is_some(),
            watcher: store.watcher().is_some(),
            waiter: store.waiter().is_some(),
        }
    }
}

/// What each case runs against. Build it with [`Fixture::new`] and the declarations that
/// follow it.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// Its fault hooks.
    pub faults: Arc<dyn Faults>,
    /// The base TTL of timed cases: long enough for a renewal round trip on a loaded
    /// machine (e.g. 1 s for a local server).
    pub ttl: Duration,
    /// The storage-side guard the stale-writer case writes through.
    pub guard: GuardSupport,
    /// Whether (and how) another process can open the store.
    pub processes: OtherProcesses,
    /// The network between the store and its server, for the fault cases.
    pub network: Option<Network>,
    /// The extensions the store offers (none unless declared).
    pub extensions: Extensions,
    /// The store's queue of waiters, read on its server: a store that claims
    /// [`fifo_wait`](leasehold_core::Capabilities::fifo_wait) must let the suite see it.
    pub queue: Option<Arc<dyn Queue>>,
    /// The store of `docs/guarantees.md` the fixture is, for the cases' proofs
    /// ([`proves`](Self::proves)): the suite macros set it from their `backend = …`;
    /// [`Backend::Memory`](proof::Backend::Memory) (the default) checks nothing.
    pub backend: proof::Backend,
    /// Keeps servers, proxies and temporary directories alive for the case.
    pub keep_alive: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .field("ttl", &self.ttl)
            .field("guard", &self.guard)
            .field("processes", &self.processes)
            .field("network", &self.network)
            .field("extensions", &self.extensions)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// A fixture with nothing declared beyond the store: the stale-writer case writes
    /// through the embedded SQLite guard unless the backend names its own
    /// ([`guard`](Self::guard)), the holder-process cases fail until the backend declares
    /// what it has ([`other_processes`](Self::other_processes) or
    /// [`this_process_only`](Self::this_process_only)), and the store must offer no
    /// extension until it declares which ([`expects_batch`](Self::expects_batch),
    /// [`expects_watcher`](Self::expects_watcher), [`expects_waiter`](Self::expects_waiter)).
    pub fn new(store: Arc<dyn Store>, faults: Arc<dyn Faults>, ttl: Duration) -> Self {
        Self {
            store,
            faults,
            ttl,
            guard: GuardSupport::Embedded,
            processes: OtherProcesses::Undeclared,
            network: None,
            extensions: Extensions::default(),
            queue: None,
            backend: proof::Backend::Memory,
            keep_alive: Box::new(()),
        }
    }

    /// Declares that the store has its own batch ([`Store::batch`]).
    pub fn expects_batch(mut self) -> Self {
        self.extensions.batch = true;
        self
    }

    /// Declares that the store notifies changes ([`Store::watcher`]).
    pub fn expects_watcher(mut self) -> Self {
        self.extensions.watcher = true;
        self
    }

    /// Declares that the store notifies releases to waiters ([`Store::waiter`]).
    pub fn expects_waiter(mut self) -> Self {
        self.extensions.waiter = true;
        self
    }

    /// Keeps `value` (servers, proxies, directories) alive as long as the fixture.
    pub fn keep_alive(mut self, value: impl Any + Send + Sync) -> Self {
        self.keep_alive = Box::new(value);
        self
    }

    /// Declares the guard in the backend's own database, for the stale-writer case to
    /// write through instead of the embedded SQLite guard.
    pub fn guard(mut self, writes: Arc<dyn FencedWrites>) -> Self {
        self.guard = GuardSupport::Writes(writes);
        self
    }

    /// Declares that another process opens the store from `url` (with the function given
    /// to the suite macros as `holder = open`).
    pub fn other_processes(mut self, url: impl Into<String>) -> Self {
        self.processes = OtherProcesses::Url(url.into());
        self
    }

    /// Declares that the store lives in this process only.
    pub fn this_process_only(mut self) -> Self {
        self.processes = OtherProcesses::ThisProcessOnly;
        self
    }

    /// Declares how the suite reads the store's queue of waiters (for a store that claims
    /// [`fifo_wait`](leasehold_core::Capabilities::fifo_wait)).
    pub fn queue(mut self, queue: Arc<dyn Queue>) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Declares the network between the store and its server, for [`fault_suite!`].
    pub fn network(mut self, network: Network) -> Self {
        self.network = Some(network);
        self
    }

    /// The default configuration for this fixture's TTL.
    pub fn config(&self) -> LeaseConfig {
        LeaseConfig::new(self.ttl).expect("fixture ttl is valid")
    }

    /// A client with the default configuration.
    pub fn client(&self) -> LeaseClient {
        LeaseClient::new(self.store.clone(), self.config())
    }

    /// Tags the case as proving this fixture's store × `fault` ([`proof`]): a case's first
    /// statement, `let _proof = fx.proves(Fault::…);`. When the case ends without a panic,
    /// the proof fails it unless the test kit saw `fault` injected on this store.
    pub fn proves(&self, fault: proof::Fault) -> proof::Proof {
        proof::proves(self.backend, fault)
    }
}

/// Suspends this process's host for `d`, as [`leasehold_core::clock::suspend_host`] does
/// (at the layer that reads `CLOCK_BOOTTIME`), and records it for the test's proof
/// ([`proof::Injected::HostSuspended`]).
pub fn suspend_host(d: Duration) {
    leasehold_core::clock::suspend_host(d);
    proof::record(proof::Injected::HostSuspended);
}

/// The future of one case.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// One case of the suite, by name.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's function name.
    pub name: &'static str,
    /// Runs the case.
    pub run: for<'a> fn(&'a Fixture) -> CaseFuture<'a>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

/// A store crate's unit test that its public types are `Send + Sync` and, checked at
/// compile time on futures that are built but never awaited, that the futures of its own
/// async functions are `Send` (the [`Store`] methods' futures are checked for every store
/// by `leasehold-core/tests/send.rs`). Write it at the crate root, under `#[cfg(test)]`:
/// `send_sync!([Store, Config], fn(config: Config) { Store::connect(config) })`; the
/// function's parameters give the expressions what they borrow.
#[macro_export]
macro_rules! send_sync {
    ([$($ty:ty),* $(,)?] $(, fn($($arg:ident : $arg_ty:ty),* $(,)?) { $($fut:expr);* $(;)? })?) => {
        mod send_sync {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn types_are_send_and_sync() {
                fn check<T: Send + Sync>() {}
                $(check::<$ty>();)*
            }

            $(
                #[allow(dead_code, clippy::too_many_arguments)]
                fn futures_are_send($($arg: $arg_ty),*) {
                    fn check<T: Send>(_: &T) {}
                    $(check(&$fut);)*
                }
            )?
        }
    };
}

/// Calls `$crate::$mac!($args ; module::case, …)` with the one list of every case of
/// [`cases`] and [`holder_faults`], so the generated tests and [`CASES`] cannot drift
/// apart.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($mac:ident ! ($($args:tt)*)) => {
        $crate::$mac! { $($args)* ;
            cases::acquire_release,
            cases::contended_try_acquire,
            cases::concurrent_contenders_exclusive_and_fences_increase,
            cases::same_owner_reacquire_returns_same_fence,
            cases::fence_never_reused_after_release,
            cases::fence_never_reused_after_expiry,
            cases::late_release_leaves_new_owner_intact,
            cases::only_owner_renews_or_releases,
            cases::renew_extends_ttl,
            cases::renew_many_answers_each_lease_in_order,
            cases::release_after_keeps_the_lease_for_the_minimum_hold,
            cases::renewal_after_own_expiry_is_refused,
            cases::inspect_reports_holder,
            cases::max_hold_fires_lost,
            cases::lost_within_one_renew_interval_after_forget,
            cases::lost_before_expiry_when_unreachable,
            cases::waiting_acquire_gets_released_lease,
            cases::waiters_are_served_in_arrival_order,
            cases::hand_off_is_as_claimed,
            cases::ambiguous_acquire_reply_returns_same_lease,
            cases::stale_writer_rejected_by_guard,
            cases::holder_killed_is_taken_over_after_its_ttl,
            cases::bad_input_gets_typed_errors,
            cases::capabilities_are_honest,
            cases::diagnosis_names_the_server_and_judges_only_its_stores_rows,
            cases::records_are_fenced_writes,
            cases::racing_record_writes_keep_the_highest_fence,
            cases::one_leader_at_a_time_and_terms_rise,
            cases::semaphore_admits_at_most_n_holders,
            cases::lost_permit_returns_after_its_ttl_only,
            cases::watch_notices_grants_releases_and_record_writes,
            cases::acquire_any_takes_the_owners_key_or_the_first_free_one,
            cases::acquire_any_checked_takes_nothing_behind_another_value,
            cases::a_name_is_one_kind_of_resource,
            holder_faults::row_01_holder_frozen_past_its_deadline_hears_lost_first_on_resume,
            holder_faults::row_14_holder_wall_clock_jumps_change_nothing,
            holder_faults::row_33_host_suspend_past_the_deadline_loses_the_lease,
        }
    };
}

/// Calls `$crate::$mac!($args ; module::case, …)` with the one list of every case of
/// [`fault_cases`].
#[doc(hidden)]
#[macro_export]
macro_rules! __with_fault_cases {
    ($mac:ident ! ($($args:tt)*)) => {
        $crate::$mac! { $($args)* ;
            fault_cases::row_02_near_miss_freeze_keeps_the_lease,
            fault_cases::row_04_server_paused_lost_before_store_expiry,
            fault_cases::row_05_lost_reply_retry_returns_same_lease,
            fault_cases::row_06_slow_replies_shorten_validity_and_too_slow_fails,
            fault_cases::row_07_blackhole_no_answer_and_recovery,
            fault_cases::row_07_blackhole_puts_the_holder_at_risk_first,
            fault_cases::row_08_reset_mid_command_idempotent_retry,
            fault_cases::row_24_cancelled_acquires_leave_nothing_behind,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    (; $($module:ident :: $case:ident),* $(,)?) => {
        &[$(
            $crate::Case {
                name: stringify!($case),
                run: {
                    fn run(fx: &$crate::Fixture) -> $crate::CaseFuture<'_> {
                        ::std::boxed::Box::pin($crate::$module::$case(fx))
                    }
                    run
                },
            }
        ),*]
    };
}

/// Every case of [`cases`] and [`holder_faults`], as [`conformance_suite!`] generates them.
pub const CASES: &[Case] = __with_cases!(__case_table!());

/// Every case of [`fault_cases`], as [`fault_suite!`] generates them.
pub const FAULT_CASES: &[Case] = __with_fault_cases!(__case_table!());

/// Generates one `#[tokio::test]` per conformance case, each calling `$fixture().await`.
///
/// `$fixture` is a path to an `async fn() -> Fixture`. With `holder = $open`, a path to an
/// `async fn(String) -> Arc<dyn Store>` that opens the store from the string given to
/// [`Fixture::other_processes`], each test first plays the holder process when it was
/// started as one ([`holder::run_if_child`]). The calling crate needs `tokio` (with the
/// `macros` and `rt-multi-thread` features) as a dev-dependency.
///
/// With `holder = $open, ignore = "reason"`, every test is `#[ignore = "reason"]`: a suite for a
/// heavier tier (`scripts/test --full` runs ignored tests).
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:path, backend = $backend:ident, holder = $open:path, ignore = $why:literal) => {
        $crate::__with_cases!(__case_tests!($fixture, $backend, $open, ignore = $why));
    };
    ($fixture:path, backend = $backend:ident) => {
        $crate::__with_cases!(__case_tests!($fixture, $backend, none));
    };
    ($fixture:path, backend = $backend:ident, holder = $open:path) => {
        $crate::__with_cases!(__case_tests!($fixture, $backend, $open));
    };
}

/// Generates one `#[tokio::test]` per fault case (docs/faults.md rows 2, 4, 5, 6, 7, 8, 24),
/// each calling `$fixture().await`, whose fixture must declare a [`Network`] (and, for
/// row 2, [`Fixture::other_processes`] and a `holder = $open`, as in
/// [`conformance_suite!`]).
#[macro_export]
macro_rules! fault_suite {
    ($fixture:path, backend = $backend:ident) => {
        $crate::__with_fault_cases!(__case_tests!($fixture, $backend, none));
    };
    ($fixture:path, backend = $backend:ident, holder = $open:path) => {
        $crate::__with_fault_cases!(__case_tests!($fixture, $backend, $open));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_tests {
    ($fixture:path, $backend:ident, $open:path, ignore = $why:literal ; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = $why]
            async fn $case() {
                if $crate::holder::run_if_child($open).await {
                    return;
                }
                let mut fixture = $fixture().await;
                fixture.backend = $crate::proof::Backend::$backend;
                $crate::$module::$case(&fixture).await;
            }
        )*
    };
    ($fixture:path, $backend:ident, none ; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let mut fixture = $fixture().await;
                fixture.backend = $crate::proof::Backend::$backend;
                $crate::$module::$case(&fixture).await;
            }
        )*
    };
    ($fixture:path, $backend:ident, $open:path ; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if $crate::holder::run_if_child($open).await {
                    return;
                }
                let mut fixture = $fixture().await;
                fixture.backend = $crate::proof::Backend::$backend;
                $crate::$module::$case(&fixture).await;
            }
        )*
    };
}
