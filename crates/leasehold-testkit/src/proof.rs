//! Proof that a guarantee test caused the fault it is about, on the store it is about.
//!
//! `docs/guarantees.md` has one row per store and fault, and names the tests that prove
//! it. A test proves a row only if it injects that row's fault into that row's store, so
//! each such test is **tagged** with the row it proves, by its first statement:
//!
//! ```no_run
//! use leasehold_testkit::proof::{Backend, Fault, proves};
//! # fn test() {
//! let _proof = proves(Backend::Redis, Fault::ServerPaused);
//! // … start the servers, hold a lease, pause the server, assert …
//! # }
//! ```
//!
//! The tag is read twice:
//!
//! * **statically**, by `leasehold-conformance/tests/guarantees.rs`, which reads the body of
//!   every test a row names and fails unless at least one of them is tagged with the row's
//!   store and fault (a shared conformance case is tagged `fx.proves(Fault::…)`, and its
//!   store is the one its suite macro names in the backend's test file);
//! * **at run time**, by the [`Proof`] it returns: the test kit records every fault it
//!   injects in this process (a server or worker paused, killed or restarted, a proxy
//!   blackholing, a wall clock stepped, a suspend of the boot clock, …; see [`Injected`]),
//!   and when the proof is dropped at the end of a test that did not panic it fails the
//!   test unless a fault of the tagged kind was injected and, on a networked store, a
//!   server of the tagged store was started. A tag that claims a fault the test never
//!   causes cannot pass.
//!
//! The journal is per process. Under `cargo nextest` (what `scripts/test` runs) every
//! test is a process of its own, so a proof sees exactly its own test's faults; under
//! `cargo test` tests share their binary's process and a proof may be satisfied by a
//! fault another test of the same binary injected.

use std::fmt;
use std::sync::Mutex;

/// A store of `docs/guarantees.md`'s table (plus the in-memory store, which has no row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// A single Redis server (and Redis behind Sentinel).
    Redis,
    /// Redis Cluster.
    RedisCluster,
    /// PostgreSQL's lease table.
    Postgres,
    /// PostgreSQL's advisory locks.
    PostgresAdvisory,
    /// MariaDB/MySQL's lease table.
    Mysql,
    /// MariaDB/MySQL's `GET_LOCK`.
    MysqlGetlock,
    /// SQLite, the embedded default.
    Sqlite,
    /// etcd.
    Etcd,
    /// ZooKeeper.
    Zookeeper,
    /// Redlock over independent Redis nodes.
    Redlock,
    /// The in-memory store of the core: it has no row, and its proofs check nothing.
    Memory,
}

impl Backend {
    /// Every store with rows in the table.
    pub const ROWS: [Backend; 10] = [
        Backend::Redis,
        Backend::RedisCluster,
        Backend::Postgres,
        Backend::PostgresAdvisory,
        Backend::Mysql,
        Backend::MysqlGetlock,
        Backend::Sqlite,
        Backend::Etcd,
        Backend::Zookeeper,
        Backend::Redlock,
    ];

    /// The store's name in the table's first column (`redis-cluster`, `mysql-getlock`…).
    pub const fn row_name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis-cluster",
            Backend::Postgres => "postgres",
            Backend::PostgresAdvisory => "postgres-advisory",
            Backend::Mysql => "mysql",
            Backend::MysqlGetlock => "mysql-getlock",
            Backend::Sqlite => "sqlite",
            Backend::Etcd => "etcd",
            Backend::Zookeeper => "zookeeper",
            Backend::Redlock => "redlock",
            Backend::Memory => "memory",
        }
    }

    /// The store by its name in a tag (`RedisCluster`).
    pub fn from_variant(name: &str) -> Option<Backend> {
        Self::ROWS
            .into_iter()
            .chain([Backend::Memory])
            .find(|b| format!("{b:?}") == name)
    }

    /// The server program whose start the proof requires (`None`: the store is a file).
    const fn started(self) -> Option<&'static str> {
        match self {
            Backend::Redis | Backend::Redlock => Some(REDIS),
            Backend::RedisCluster => Some(REDIS_CLUSTER),
            Backend::Postgres | Backend::PostgresAdvisory => Some(POSTGRES),
            Backend::Mysql | Backend::MysqlGetlock => Some(MARIADB),
            Backend::Etcd => Some(ETCD),
            Backend::Zookeeper => Some(ZOOKEEPER),
            Backend::Sqlite | Backend::Memory => None,
        }
    }

    /// The server program a server-side fault of this store must hit.
    const fn server(self) -> Option<&'static str> {
        match self {
            Backend::RedisCluster => Some(REDIS),
            other => other.started(),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.row_name())
    }
}

/// A fault of the table's second column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The holder's process frozen (`SIGSTOP`: a GC pause, a VM stall).
    ProcessPause,
    /// The holder's process killed (`kill -9`).
    HolderCrash,
    /// The store's server killed or stopped and started again with its data.
    RestartWithPersistence,
    /// The store's server started again without its data.
    RestartWithoutPersistence,
    /// A member of a replicated store lost, or a fail-over to a replica.
    FailOver,
    /// The store's server frozen (`SIGSTOP`).
    ServerPaused,
    /// The holder's wall clock stepped.
    ClockJump,
    /// The holder's host suspended: its boot clock moves, its monotonic clock does not.
    HostSuspend,
    /// The network between the holder and the store blackholed.
    NetworkPartition,
    /// The store configured to evict keys.
    Eviction,
    /// A transaction pooler between the holder and the store.
    TransactionPooler,
}

impl Fault {
    /// Every fault of the table.
    pub const ALL: [Fault; 11] = [
        Fault::ProcessPause,
        Fault::HolderCrash,
        Fault::RestartWithPersistence,
        Fault::RestartWithoutPersistence,
        Fault::FailOver,
        Fault::ServerPaused,
        Fault::ClockJump,
        Fault::HostSuspend,
        Fault::NetworkPartition,
        Fault::Eviction,
        Fault::TransactionPooler,
    ];

    /// The fault's name in the table's second column (`process pause`).
    pub const fn row_name(self) -> &'static str {
        match self {
            Fault::ProcessPause => "process pause",
            Fault::HolderCrash => "holder crash",
            Fault::RestartWithPersistence => "restart with persistence",
            Fault::RestartWithoutPersistence => "restart without persistence",
            Fault::FailOver => "fail-over",
            Fault::ServerPaused => "server paused",
            Fault::ClockJump => "clock jump",
            Fault::HostSuspend => "host suspend",
            Fault::NetworkPartition => "network partition",
            Fault::Eviction => "eviction",
            Fault::TransactionPooler => "transaction pooler",
        }
    }

    /// The fault by its name in a tag (`ProcessPause`).
    pub fn from_variant(name: &str) -> Option<Fault> {
        Self::ALL.into_iter().find(|f| format!("{f:?}") == name)
    }

    /// Whether `event`, injected in a test of `backend`, is this fault.
    fn is(self, event: &Injected, backend: Backend) -> bool {
        let on_store = |server: &str| backend.server() == Some(server);
        match (self, event) {
            (Fault::ProcessPause, Injected::WorkerPaused) => true,
            (Fault::HolderCrash, Injected::WorkerKilled) => true,
            (
                Fault::RestartWithPersistence,
                Injected::ServerRestarted {
                    server,
                    persistent: true,
                },
            ) => on_store(server),
            (
                Fault::RestartWithoutPersistence,
                Injected::ServerRestarted {
                    server,
                    persistent: false,
                },
            ) => on_store(server),
            (Fault::FailOver, Injected::Failover(server)) => on_store(server),
            (Fault::ServerPaused, Injected::ServerPaused(server)) => on_store(server),
            (Fault::ClockJump, Injected::WallClockStepped) => true,
            (Fault::HostSuspend, Injected::HostSuspended) => true,
            (Fault::NetworkPartition, Injected::Partitioned) => true,
            (Fault::Eviction, Injected::EvictingPolicy(server)) => on_store(server),
            (Fault::TransactionPooler, Injected::TransactionPooler) => true,
            // SQLite has no server: its "restart" is the host's (another boot id), and a
            // process frozen inside its write transaction is what stalls everyone else.
            (Fault::RestartWithPersistence, Injected::HostRebooted) => backend == Backend::Sqlite,
            (Fault::ServerPaused, Injected::WorkerPaused) => backend == Backend::Sqlite,
            _ => false,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.row_name())
    }
}

/// `redis-server`, as the test kit names it.
pub const REDIS: &str = "redis-server";
/// A Redis Cluster (its nodes are `redis-server`s).
pub const REDIS_CLUSTER: &str = "redis-cluster";
/// `postgres`.
pub const POSTGRES: &str = "postgres";
/// `mariadbd`.
pub const MARIADB: &str = "mariadbd";
/// `etcd`.
pub const ETCD: &str = "etcd";
/// ZooKeeper.
pub const ZOOKEEPER: &str = "zookeeper";

/// One thing the test kit did to a test's world, as it recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Injected {
    /// A server (or a Redis Cluster) started for the first time: its program.
    ServerStarted(&'static str),
    /// A [`WorkerProcess`](crate::WorkerProcess) frozen (`SIGSTOP`).
    WorkerPaused,
    /// A [`WorkerProcess`](crate::WorkerProcess) killed (`SIGKILL`).
    WorkerKilled,
    /// A server frozen (`SIGSTOP`).
    ServerPaused(&'static str),
    /// A server started again after a kill or a stop, on its old data directory, keeping
    /// its data (`persistent`) or not (a Redis without an append-only file).
    ServerRestarted {
        /// The server's program.
        server: &'static str,
        /// Whether what it acknowledged before survives.
        persistent: bool,
    },
    /// A fail-over: a Sentinel fail-over, or a member of an etcd cluster or ZooKeeper
    /// ensemble killed or stopped.
    Failover(&'static str),
    /// A [`FaultProxy`](crate::FaultProxy) set to blackhole, or an ensemble member cut off.
    Partitioned,
    /// A [`FakeWallClock`](crate::FakeWallClock) set to an offset other than `+0`.
    WallClockStepped,
    /// The boot clock moved on without the monotonic clock (a host suspend, injected at
    /// the system-clock layer by the code that reads the clock).
    HostSuspended,
    /// A server set to evict keys.
    EvictingPolicy(&'static str),
    /// A transaction-mode pooler started in front of a server.
    TransactionPooler,
    /// The host rebooted (a store file seen from another boot).
    HostRebooted,
}

static JOURNAL: Mutex<Vec<Injected>> = Mutex::new(Vec::new());

fn journal() -> std::sync::MutexGuard<'static, Vec<Injected>> {
    JOURNAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records that `event` happened. The test kit's own controls call it; code outside the
/// test kit that injects a fault by its own means (the core's suspend of the boot clock,
/// SQLite's host clock) calls it where it does so, never a test body.
pub fn record(event: Injected) {
    tracing::debug!(?event, "fault injected");
    journal().push(event);
}

/// Everything recorded in this process so far.
pub fn recorded() -> Vec<Injected> {
    journal().clone()
}

/// Tags the test as proving `backend` × `fault` (see the [module docs](self)); keep the
/// returned proof alive to the end of the test.
#[must_use = "the proof checks the test when it is dropped at the end of the test"]
pub fn proves(backend: Backend, fault: Fault) -> Proof {
    Proof { backend, fault }
}

/// A test's claim to prove one row: checked when it is dropped (see the [module
/// docs](self)).
#[derive(Debug)]
pub struct Proof {
    backend: Backend,
    fault: Fault,
}

impl Proof {
    /// The row this proof is for.
    pub fn row(&self) -> (Backend, Fault) {
        (self.backend, self.fault)
    }

    /// What is wrong with the proof given the events `seen`: `None` if it holds.
    pub fn verdict(&self, seen: &[Injected]) -> Option<String> {
        if self.backend == Backend::Memory {
            return None;
        }
        let (backend, fault) = (self.backend, self.fault);
        if let Some(server) = backend.started()
            && !seen.contains(&Injected::ServerStarted(server))
        {
            return Some(format!(
                "tagged {backend} × {fault}, but no {server} was started: the test runs on \
                 another store; recorded {seen:?}"
            ));
        }
        if !seen.iter().any(|e| fault.is(e, backend)) {
            return Some(format!(
                "tagged {backend} × {fault}, but that fault was never injected; recorded \
                 {seen:?}"
            ));
        }
        None
    }
}

impl Drop for Proof {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let seen = recorded();
        if let Some(wrong) = self.verdict(&seen) {
            panic!("{wrong}");
        }
        let hits = seen
            .iter()
            .filter(|e| self.fault.is(e, self.backend))
            .count();
        println!(
            "proof: {} × {}: the fault was injected {hits} time(s)",
            self.backend, self.fault
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_needs_its_fault_on_its_store() {
        let p = proves(Backend::Redis, Fault::ServerPaused);
        let started = Injected::ServerStarted(REDIS);
        assert!(p.verdict(&[]).is_some());
        assert!(p.verdict(std::slice::from_ref(&started)).is_some());
        assert!(
            p.verdict(&[started.clone(), Injected::ServerPaused(POSTGRES)])
                .is_some(),
            "a pause of another store's server"
        );
        assert!(
            p.verdict(&[
                Injected::ServerStarted(POSTGRES),
                Injected::ServerPaused(REDIS)
            ])
            .is_some(),
            "no redis-server started"
        );
        assert!(
            p.verdict(&[started.clone(), Injected::WorkerPaused])
                .is_some()
        );
        assert_eq!(p.verdict(&[started, Injected::ServerPaused(REDIS)]), None);
        std::mem::forget(p);
    }

    #[test]
    fn persistence_decides_which_restart_row() {
        let with = proves(Backend::Redis, Fault::RestartWithPersistence);
        let without = proves(Backend::Redis, Fault::RestartWithoutPersistence);
        let seen = [
            Injected::ServerStarted(REDIS),
            Injected::ServerRestarted {
                server: REDIS,
                persistent: false,
            },
        ];
        assert!(with.verdict(&seen).is_some());
        assert_eq!(without.verdict(&seen), None);
        std::mem::forget((with, without));
    }

    #[test]
    fn sqlite_needs_no_server_and_its_exemptions_are_its_own() {
        let p = proves(Backend::Sqlite, Fault::ServerPaused);
        assert_eq!(p.verdict(&[Injected::WorkerPaused]), None);
        let q = proves(Backend::Postgres, Fault::ServerPaused);
        assert!(
            q.verdict(&[Injected::ServerStarted(POSTGRES), Injected::WorkerPaused])
                .is_some(),
            "a paused worker is a server pause on SQLite only"
        );
        let r = proves(Backend::Etcd, Fault::RestartWithPersistence);
        assert!(
            r.verdict(&[Injected::ServerStarted(ETCD), Injected::HostRebooted])
                .is_some()
        );
        std::mem::forget((p, q, r));
    }

    #[test]
    fn a_cluster_is_proven_on_its_nodes_not_on_a_lone_server() {
        let p = proves(Backend::RedisCluster, Fault::ServerPaused);
        assert!(
            p.verdict(&[
                Injected::ServerStarted(REDIS),
                Injected::ServerPaused(REDIS)
            ])
            .is_some()
        );
        assert_eq!(
            p.verdict(&[
                Injected::ServerStarted(REDIS_CLUSTER),
                Injected::ServerPaused(REDIS)
            ]),
            None
        );
        std::mem::forget(p);
    }

    #[test]
    fn names_round_trip() {
        for f in Fault::ALL {
            assert_eq!(Fault::from_variant(&format!("{f:?}")), Some(f));
        }
        for b in Backend::ROWS {
            assert_eq!(Backend::from_variant(&format!("{b:?}")), Some(b));
        }
        assert_eq!(Fault::from_variant("Nope"), None);
    }

    #[test]
    fn a_dropped_proof_without_its_fault_fails_the_test() {
        let r = std::panic::catch_unwind(|| {
            let _p = proves(Backend::Zookeeper, Fault::FailOver);
        });
        let msg = r.expect_err("must panic");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("zookeeper × fail-over"), "{msg}");
    }
}
