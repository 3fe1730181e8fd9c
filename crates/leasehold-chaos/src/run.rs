//! The orchestrator: private servers, worker processes, the fault injector, and the check.
//!
//! Every worker slot (`w1` … `wN`) reaches the lease store through its own fault proxy
//! (its own path to the store), and its data through a direct connection to PostgreSQL.
//! Each process of a slot is an incarnation (`w1#0`, then `w1#1` after a kill); every
//! fault is recorded against the incarnation or the path it hit. The faults follow the
//! seed's [`schedule`](crate::schedule), drawn before the run starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::Store;
use leasehold::postgres::sqlx::{self, postgres::PgPoolOptions};
use leasehold_testkit::{
    EtcdCluster, EtcdServer, FaultProxy, Postgres, ProxyMode, RedisSentinelSet, RedisServer,
    WorkerProcess, ZkEnsemble,
};

use crate::checker::{CheckConfig, check};
use crate::history::{AuditRow, Event, FaultKind, FinalState, MemberRole, Op, Phase, parse_lines};
use crate::schedule::{FaultSet, HOLDER, PlanKind, PlannedFault, plan_kinds};
use crate::worker::Recorder;

pub use crate::report::Report;

/// Which store holds the leases (the guard and the data are always in PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// A private redis-server (no persistence).
    Redis,
    /// The lease table in the private PostgreSQL.
    Postgres,
    /// As [`Postgres`](Self::Postgres), the server requiring TLS (plaintext rejected by
    /// `pg_hba.conf`): every connection — the workers' leases through their proxies, their
    /// guarded writes, the harness's reads — is verified in full (`sslmode=verify-full`
    /// against the run's private CA). The store fault restarts the server.
    PostgresTls,
    /// A private single-member etcd (restarting the store kills and restarts it).
    Etcd,
    /// A private ZooKeeper server (session timeout = TTL); the store restart kills it
    /// (`kill -9`, the member kill) and starts it again.
    Zookeeper,
    /// Redlock over three private redis-servers (no persistence); the store fault kills
    /// one node (`kill -9`) and starts it again empty, a different node each time.
    Redlock,
    /// A private three-member etcd cluster; every worker slot reaches each member through
    /// a proxy of its own. The store fault kills one member (`kill -9`: the leader the
    /// first time, then the next member each time) and starts it again on its data.
    EtcdCluster,
    /// A private three-member ZooKeeper ensemble (session timeout = TTL), the store URL
    /// listing every member through the slot's own proxies. The store fault kills one
    /// member (`kill -9`: the leader the first time, then the next member each time) and
    /// starts it again on its data.
    ZookeeperEnsemble,
    /// A private Redis primary with one replica and three sentinels, reached through
    /// `redis+sentinel://` with `min_replicas=1`. The store fault is a forced fail-over
    /// (`SENTINEL FAILOVER`: the replica is promoted, the old primary demoted).
    ///
    /// The workers find the data servers through the sentinels and connect to the
    /// primary directly, so a slot's proxies sit only in front of the sentinels: the proxy
    /// faults would not touch the lease path and are left out of this store's schedule
    /// (it has freezes, kills, the fail-over and the stale write).
    RedisSentinel,
}

impl StoreKind {
    /// The random fault kinds that can fire on this store (see
    /// [`RedisSentinel`](Self::RedisSentinel) for the one that has fewer).
    pub fn fault_kinds(self) -> &'static [PlanKind] {
        match self {
            Self::RedisSentinel => &[PlanKind::Sigstop, PlanKind::Kill9, PlanKind::RestartStore],
            _ => &PlanKind::RANDOM,
        }
    }
}

/// The master name of the Sentinel set in a chaos run.
const SENTINEL_MASTER: &str = "chaos";

/// The Redlock set's size in a chaos run.
const REDLOCK_NODES: usize = 3;

/// One chaos run (the `run` command's arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct RunSpec {
    /// The lease store.
    #[arg(long, value_enum, default_value = "redis")]
    pub store: StoreKind,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// How long the workload runs (long soaks: e.g. --duration 30m).
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration)]
    pub duration: Duration,
    /// Lease TTL.
    #[arg(long, default_value = "2s", value_parser = crate::parse_duration)]
    pub ttl: Duration,
    /// The control run: the same workload with the guard switched off.
    #[arg(long)]
    pub unfenced: bool,
    /// Which faults: all (every kind, plus the scripted stale write), stale-write
    /// (only the scripted stale write: the control runs), none.
    #[arg(long, value_enum, default_value = "all")]
    pub faults: FaultSet,
    /// Output directory (events, summary, timeline).
    #[arg(long, default_value = "target/chaos")]
    pub out: PathBuf,
    /// Seed of the fault schedule.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Semaphore mode: the workers take permits of an N-permit semaphore (N ≥ 2)
    /// instead of the lease; every per-key rule applies per slot key, and C11 checks
    /// that at most N windows on its slots are in force at once.
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=i64::from(leasehold::semaphore::MAX_PERMITS)))]
    pub permits: Option<u32>,
    /// (C11's control run) skip the semaphore: take random slot leases over N+1
    /// slots. Needs --permits.
    #[arg(long, hide = true, requires = "permits")]
    pub overcommit: bool,
    /// (the checker's control runs, test builds only) run the workers with a
    /// deliberately broken part (see [`crate::broken`]); a build for users refuses it.
    #[arg(long, hide = true, value_enum)]
    pub broken: Option<crate::broken::Broken>,
}

impl RunSpec {
    /// The lease keys the workers may take (each also a protected resource): the run's
    /// key, or in semaphore mode its slot keys (one more when overcommitting).
    pub fn keys(&self) -> Vec<String> {
        match self.permits {
            None => vec![KEY.to_owned()],
            Some(n) => (0..n + u32::from(self.overcommit))
                .map(|i| format!("{KEY}#{i}"))
                .collect(),
        }
    }
}

const KEY: &str = "chaos:counter";

struct Servers {
    pg: Postgres,
    redis: Option<RedisServer>,
    etcd: Option<EtcdServer>,
    zk: Option<leasehold_testkit::ZkServer>,
    etcd_cluster: Option<EtcdCluster>,
    zk_ensemble: Option<ZkEnsemble>,
    sentinel: Option<Arc<RedisSentinelSet>>,
    /// A fail-over under way (Sentinel): it takes ~10 s to complete (the old primary is
    /// demoted only after the sentinels have seen it report itself primary for a while),
    /// so it runs on a thread of its own while the harness goes on.
    failover: std::cell::RefCell<Option<std::thread::JoinHandle<String>>>,
    proxies: Vec<FaultProxy>,
    /// Redlock: the nodes.
    redlock: Vec<RedisServer>,
    /// Redlock, etcd cluster, ZooKeeper ensemble: per worker slot its proxies to nodes
    /// (members) 1.. (`proxies[i]` goes to node 0); a slot's path fault applies to all
    /// of its proxies.
    member_proxies: Vec<Vec<FaultProxy>>,
    restarts: std::cell::Cell<usize>,
    /// The member killed by the first member kill (the leader then, if one said so).
    first_killed: std::cell::Cell<usize>,
}

/// How long a member kill waits for a member to say it leads: on a loaded machine a
/// single reading can miss the leader (a late answer), and the first kill must hit it.
const LEADER_WAIT: Duration = Duration::from_secs(10);

impl Servers {
    /// The store fault: records `restart-store` (with what it hits), does it, and records
    /// `store-back` once the store serves again.
    ///
    /// False when the store is still busy with the previous fault (a fail-over under
    /// way): the caller tries again later.
    fn restart_store(&self, rec: &Recorder) -> bool {
        if self.failover.borrow().is_some() {
            return false;
        }
        let n = self.restarts.get();
        self.restarts.set(n + 1);
        // A member of a three-member cluster: the leader first (the fail-over case, docs/faults.md
        // row 21/22), then the next member each time, so every member is killed in turn.
        let member = |size: usize, leader: Option<usize>| {
            if n == 0 {
                self.first_killed.set(leader.unwrap_or(0));
            }
            let i = (self.first_killed.get() + n) % size;
            // The checker reads the member's role (a follower's kill renews no lease).
            let role = if leader == Some(i) {
                MemberRole::Leader
            } else {
                MemberRole::Follower
            };
            let detail = format!("member {} ({role:?}) kill -9 and start again", i + 1);
            (i, role, detail.to_lowercase())
        };
        if let Some(c) = &self.etcd_cluster {
            let (i, role, detail) = member(c.members().len(), c.wait_for_leader(LEADER_WAIT));
            member_fault(rec, role, &detail);
            c.member(i).kill();
            c.start_again(i); // on its data directory; waits until it is healthy again
            fault(rec, "store", FaultKind::StoreBack, "");
            return true;
        }
        if let Some(z) = &self.zk_ensemble {
            let (i, role, detail) = member(ZkEnsemble::SIZE, z.wait_for_leader(LEADER_WAIT));
            member_fault(rec, role, &detail);
            z.kill(i);
            z.start_again(i); // on its data directory; waits until it serves again
            fault(rec, "store", FaultKind::StoreBack, "");
            return true;
        }
        if let Some(s) = &self.sentinel {
            let old = s.primary_port();
            fault(rec, "store", FaultKind::RestartStore, "forced fail-over");
            // Waits until every sentinel names the new primary and the old one is a
            // replica; `store-back` is recorded then (`poll_store_back`).
            let s = Arc::clone(s);
            let handle = std::thread::spawn(move || {
                // Sentinel may still be finishing the previous fail-over (`INPROGRESS`):
                // try again, a second apart.
                for _ in 0..5 {
                    let s = Arc::clone(&s);
                    if let Ok(new) = std::panic::catch_unwind(move || s.failover()) {
                        return format!("primary {old} -> {new}");
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                "the fail-over failed".to_owned()
            });
            *self.failover.borrow_mut() = Some(handle);
            return true;
        }
        fault(rec, "store", FaultKind::RestartStore, "");
        self.restart_single(n);
        fault(rec, "store", FaultKind::StoreBack, "");
        true
    }

    /// Records `store-back` once a fail-over under way has completed (`wait`: waits for
    /// it). True while one is still under way.
    fn poll_store_back(&self, rec: &Recorder, wait: bool) -> bool {
        let mut slot = self.failover.borrow_mut();
        if slot.as_ref().is_some_and(|h| wait || h.is_finished()) {
            let detail = match slot.take().map(std::thread::JoinHandle::join) {
                Some(Ok(detail)) => detail,
                _ => "the fail-over failed".to_owned(),
            };
            fault(rec, "store", FaultKind::StoreBack, &detail);
        }
        slot.is_some()
    }

    fn restart_single(&self, n: usize) {
        if let Some(etcd) = &self.etcd {
            // kill -9 and start again: etcd keeps its keys, leases and revision.
            etcd.restart();
            return;
        }
        if let Some(zk) = &self.zk {
            zk.restart(); // kill -9, start again on the same data directory
            return;
        }
        if !self.redlock.is_empty() {
            // One node at a time: kill -9, start again at once, empty.
            self.redlock[n % self.redlock.len()].restart();
            return;
        }
        match &self.redis {
            Some(r) => r.restart(), // kill -9, start again at once, no persistence
            None => {
                self.pg.stop_immediate();
                self.pg.start_again();
            }
        }
    }

    /// Every proxy of worker slot `i`.
    fn path(&self, i: usize) -> impl Iterator<Item = &FaultProxy> {
        self.proxies
            .get(i)
            .into_iter()
            .chain(self.member_proxies.get(i).into_iter().flatten())
    }
}

fn worker_command(spec: &RunSpec, name: &str, lease_url: &str, pg_url: &str) -> Command {
    let exe = std::env::current_exe().expect("own executable");
    let mut c = Command::new(exe);
    c.args([
        "worker",
        "--name",
        name,
        "--lease-url",
        lease_url,
        "--pg-url",
        pg_url,
        "--key",
        KEY,
    ])
    .arg("--ttl")
    .arg(format!("{}ms", spec.ttl.as_millis()))
    .arg("--events")
    .arg(spec.out.join(format!("{}.jsonl", name.replace('#', "-"))));
    if spec.unfenced {
        c.arg("--unfenced");
    }
    if let Some(n) = spec.permits {
        c.arg("--permits").arg(n.to_string());
    }
    if spec.overcommit {
        c.arg("--overcommit");
    }
    if let Some(b) = spec.broken {
        c.arg("--broken").arg(b.as_str());
    }
    c
}

/// One worker slot: its current incarnation and its own proxy.
struct Slot {
    name: String,
    incarnation: u32,
    process: WorkerProcess,
    lease_url: String,
    /// A random freeze ends at this instant.
    frozen_until: Option<Instant>,
    /// The proxy's fault ends at this instant.
    proxy_until: Option<Instant>,
    /// Stdout lines of the current incarnation read so far.
    seen: usize,
    /// The fence it holds, by its own last `ACQUIRED` / `RELEASING` line (fences are per
    /// key: in semaphore mode two slots' fences are not comparable).
    holding: Option<u64>,
}

impl Slot {
    fn id(&self) -> String {
        format!("{}#{}", self.name, self.incarnation)
    }

    /// Reads the new stdout lines: what the worker holds now.
    fn follow(&mut self) {
        let n = self.process.line_count();
        if n <= self.seen {
            return;
        }
        for line in &self.process.lines()[self.seen..n] {
            if let Some(f) = line.strip_prefix("ACQUIRED ") {
                self.holding = f.split_whitespace().next().and_then(|f| f.parse().ok());
            } else if line.starts_with("RELEASING") {
                self.holding = None;
            }
        }
        self.seen = n;
    }
}

fn spawn_worker(spec: &RunSpec, id: &str, lease_url: &str, pg_url: &str) -> WorkerProcess {
    let w = WorkerProcess::spawn(worker_command(spec, id, lease_url, pg_url));
    w.wait_for_line(|l| l.starts_with("READY"), Duration::from_secs(60))
        .unwrap_or_else(|| panic!("worker {id} did not start: {:?}", w.lines()));
    w
}

fn fault(rec: &Recorder, target: &str, kind: FaultKind, detail: &str) {
    rec.record(Event {
        op: Some(Op::Fault),
        key: target.into(),
        fault: Some(kind),
        detail: detail.into(),
        ..Default::default()
    });
}

/// Records a `restart-store` that kills one member of a cluster, with its role.
fn member_fault(rec: &Recorder, role: MemberRole, detail: &str) {
    rec.record(Event {
        op: Some(Op::Fault),
        key: "store".into(),
        fault: Some(FaultKind::RestartStore),
        member: Some(role),
        detail: detail.into(),
        ..Default::default()
    });
}

/// The scripted stale write, once armed.
enum Script {
    /// Waiting for a worker (not frozen, its path not faulty) to print `PREPARING`
    /// (lines from these indexes on, per slot).
    Armed { from: Vec<usize> },
    /// Frozen between its check and its write.
    Frozen {
        slot: usize,
        since: Instant,
        /// Its `PREPARING` line.
        line: usize,
        fence: u64,
        /// The key it holds (the slot key in semaphore mode): only a newer write on that
        /// key makes its write stale.
        key: String,
        /// Every slot's line count at the freeze.
        marks: Vec<usize>,
        miss_checked: bool,
    },
    /// Woken after a newer write: left alone until it has written and released.
    Woken {
        slot: usize,
        since: Instant,
        /// Lines from its `PREPARING` on.
        from: usize,
    },
}

impl Script {
    /// The slot the script holds (no other fault may touch it meanwhile).
    fn slot(&self) -> Option<usize> {
        match self {
            Self::Armed { .. } => None,
            Self::Frozen { slot, .. } | Self::Woken { slot, .. } => Some(*slot),
        }
    }
}

/// The first line at index `from` or later that starts with `word `, with its index,
/// the fence after the word and the key after the fence (`word <fence> <key>`).
fn find_line(w: &WorkerProcess, from: usize, word: &str) -> Option<(usize, u64, String)> {
    if w.line_count() <= from {
        return None;
    }
    w.lines().iter().enumerate().skip(from).find_map(|(i, l)| {
        let mut rest = l.strip_prefix(word)?.strip_prefix(' ')?.split_whitespace();
        let fence = rest.next()?.parse().ok()?;
        Some((i, fence, rest.next().unwrap_or_default().to_owned()))
    })
}

/// Runs the workload with the seed's faults, then checks the history.
///
/// # Errors
/// Set-up failures, as text.
pub fn run(spec: &RunSpec) -> Result<Report, String> {
    crate::broken::allowed(spec.broken)?;
    std::fs::create_dir_all(&spec.out).map_err(|e| e.to_string())?;
    for entry in std::fs::read_dir(&spec.out)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        if entry.path().extension().is_some_and(|x| x == "jsonl") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let mut schedule = plan_kinds(
        spec.seed,
        spec.faults,
        spec.workers,
        spec.duration,
        spec.ttl,
        spec.store.fault_kinds(),
    );
    if spec.store == StoreKind::RedisSentinel {
        schedule = space_failovers(schedule, spec.ttl, spec.duration.saturating_sub(spec.ttl));
    }
    let pg = if spec.store == StoreKind::PostgresTls {
        Postgres::start_with(
            leasehold_testkit::PostgresOptions::new().tls(leasehold_testkit::ServerCert::Localhost),
        )
    } else {
        Postgres::start()
    };
    let redis = (spec.store == StoreKind::Redis).then(RedisServer::start);
    let etcd = (spec.store == StoreKind::Etcd).then(EtcdServer::start);
    let zk = (spec.store == StoreKind::Zookeeper).then(leasehold_testkit::ZkServer::start);
    let redlock: Vec<RedisServer> = if spec.store == StoreKind::Redlock {
        (0..REDLOCK_NODES).map(|_| RedisServer::start()).collect()
    } else {
        Vec::new()
    };
    let etcd_cluster = (spec.store == StoreKind::EtcdCluster).then(EtcdCluster::start);
    let zk_ensemble = (spec.store == StoreKind::ZookeeperEnsemble).then(ZkEnsemble::start);
    let sentinel = (spec.store == StoreKind::RedisSentinel)
        .then(|| Arc::new(RedisSentinelSet::start(SENTINEL_MASTER)));
    // Every node (member) of a multi-node store, in order; a slot's first proxy goes to
    // the first.
    let nodes: Vec<std::net::SocketAddr> = if let Some(c) = &etcd_cluster {
        c.members().iter().map(|m| m.addr()).collect()
    } else if let Some(z) = &zk_ensemble {
        z.ports()
            .into_iter()
            .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p)))
            .collect()
    } else if let Some(s) = &sentinel {
        // The sentinels (the data path goes to the primary they name, past the proxies).
        s.sentinel_ports()
            .into_iter()
            .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p)))
            .collect()
    } else {
        redlock.iter().map(RedisServer::addr).collect()
    };
    let upstream = match (&redis, &etcd, &zk, nodes.first()) {
        (Some(r), _, _, _) => r.addr(),
        (None, Some(e), _, _) => e.addr(),
        (None, None, Some(z), _) => z.addr(),
        (None, None, None, Some(n)) => *n,
        (None, None, None, None) => pg.addr(),
    };
    let proxies = (0..spec.workers)
        .map(|_| FaultProxy::start(upstream))
        .collect();
    let member_proxies = (0..spec.workers)
        .map(|_| {
            nodes
                .iter()
                .skip(1)
                .map(|&n| FaultProxy::start(n))
                .collect()
        })
        .collect();
    let servers = Servers {
        pg,
        redis,
        etcd,
        zk,
        etcd_cluster,
        zk_ensemble,
        sentinel,
        failover: std::cell::RefCell::new(None),
        proxies,
        redlock,
        member_proxies,
        restarts: std::cell::Cell::new(0),
        first_killed: std::cell::Cell::new(0),
    };
    let zk_params = format!("/chaos?session_timeout={}ms", spec.ttl.as_millis());
    let hosts = |ports: Vec<u16>| {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        hosts.join(",")
    };
    // With TLS, every PostgreSQL URL of the run verifies the server in full.
    let pg_tls = servers
        .pg
        .tls()
        .map(|t| format!("sslmode=verify-full&sslrootcert={}", t.ca_cert().display()));
    let pg_url = match &pg_tls {
        Some(params) => format!("{}?{params}", servers.pg.url()),
        None => servers.pg.url(),
    };
    let with_param = |url: &str, param: &str| {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{param}")
    };
    let nodes_url = |ports: Vec<u16>| {
        format!(
            "redlock://{}?node_timeout={}ms",
            hosts(ports),
            (spec.ttl.as_millis() / 10).max(1)
        )
    };
    let lease_url_via = |i: usize| {
        let proxy = &servers.proxies[i];
        match spec.store {
            StoreKind::Redis => format!("redis://127.0.0.1:{}/", proxy.port()),
            StoreKind::Postgres => {
                format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port())
            }
            StoreKind::PostgresTls => format!(
                "postgres://postgres@127.0.0.1:{}/postgres?{}",
                proxy.port(),
                pg_tls.as_deref().unwrap_or_default()
            ),
            StoreKind::Etcd => format!("etcd://127.0.0.1:{}", proxy.port()),
            StoreKind::Zookeeper => {
                format!("zookeeper://127.0.0.1:{}{zk_params}", proxy.port())
            }
            StoreKind::Redlock => nodes_url(servers.path(i).map(FaultProxy::port).collect()),
            StoreKind::EtcdCluster => {
                format!(
                    "etcd://{}",
                    hosts(servers.path(i).map(FaultProxy::port).collect())
                )
            }
            StoreKind::ZookeeperEnsemble => format!(
                "zookeeper://{}{zk_params}",
                hosts(servers.path(i).map(FaultProxy::port).collect())
            ),
            StoreKind::RedisSentinel => format!(
                "redis+sentinel://{}/{SENTINEL_MASTER}?min_replicas=1",
                hosts(servers.path(i).map(FaultProxy::port).collect())
            ),
        }
    };
    let direct_lease_url = match spec.store {
        StoreKind::Redis => servers.redis.as_ref().map(|r| r.url()).unwrap_or_default(),
        StoreKind::Postgres | StoreKind::PostgresTls => {
            with_param(&pg_url, "leasehold_migrate=true")
        }
        StoreKind::Etcd => servers.etcd.as_ref().map(|e| e.url()).unwrap_or_default(),
        StoreKind::Zookeeper => servers
            .zk
            .as_ref()
            .map(|z| format!("zookeeper://127.0.0.1:{}{zk_params}", z.port()))
            .unwrap_or_default(),
        StoreKind::Redlock => nodes_url(servers.redlock.iter().map(RedisServer::port).collect()),
        StoreKind::EtcdCluster => servers
            .etcd_cluster
            .as_ref()
            .map(EtcdCluster::url)
            .unwrap_or_default(),
        StoreKind::ZookeeperEnsemble => servers
            .zk_ensemble
            .as_ref()
            .map(|z| format!("zookeeper://{}{zk_params}", z.connect_string()))
            .unwrap_or_default(),
        StoreKind::RedisSentinel => servers
            .sentinel
            .as_ref()
            .map(|s| format!("{}?min_replicas=1", s.url()))
            .unwrap_or_default(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // The harness's own view of the store (not through any proxy), for inspections.
    let store: Arc<dyn Store> = rt.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&pg_url)
            .await
            .map_err(|e| e.to_string())?;
        for key in spec.keys() {
            crate::worker::prepare_data(&pool, &key).await?;
        }
        // Creates the lease table once, before the workers start.
        crate::registry()
            .open(&direct_lease_url)
            .await
            .map_err(|e| e.to_string())
    })?;
    let keys = spec
        .keys()
        .into_iter()
        .map(leasehold::Key::new)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;

    let mut slots: Vec<Slot> = (0..servers.proxies.len())
        .map(|i| {
            let name = format!("w{}", i + 1);
            let lease_url = lease_url_via(i);
            let process = spawn_worker(spec, &format!("{name}#0"), &lease_url, &pg_url);
            Slot {
                name,
                incarnation: 0,
                process,
                lease_url,
                frozen_until: None,
                proxy_until: None,
                seen: 0,
                holding: None,
            }
        })
        .collect();
    let rec =
        Recorder::open(&spec.out.join("injector.jsonl"), "injector").map_err(|e| e.to_string())?;
    // Every key in turn, all within TTL/4 (a store that does not answer stalls the
    // injector no longer than with one key).
    // The final one (after every worker is gone) records a failure too (`inspect fail`,
    // its error in `detail` after `final: `): C8b judges only what it saw.
    let inspect = |store: &Arc<dyn Store>, detail: &str| {
        let last = detail == "final";
        let failed = |key: &leasehold::Key, why: String| {
            rec.record(Event {
                worker: "harness".into(),
                op: Some(Op::Inspect),
                phase: Some(Phase::Fail),
                key: key.as_str().into(),
                detail: format!("final: {why}"),
                ..Default::default()
            });
        };
        let bound = if last { spec.ttl * 2 } else { spec.ttl / 4 };
        rt.block_on(async {
            let mut done = 0;
            let within = tokio::time::timeout(bound, async {
                for key in &keys {
                    match store.inspect(key).await {
                        Ok(held) => rec.record(Event {
                            worker: "harness".into(),
                            op: Some(Op::Inspect),
                            phase: Some(Phase::Ok),
                            key: key.as_str().into(),
                            owner: held.as_ref().map(|h| h.owner.to_hex()).unwrap_or_default(),
                            fence: held.map(|h| h.fence.get()),
                            detail: detail.into(),
                            ..Default::default()
                        }),
                        Err(e) if last => failed(key, e.to_string()),
                        Err(_) => {}
                    }
                    done += 1;
                }
            })
            .await;
            if within.is_err() && last {
                for key in &keys[done..] {
                    failed(key, format!("no answer within {bound:?}"));
                }
            }
        });
    };
    let mut fired: BTreeMap<PlanKind, u64> = BTreeMap::new();
    let mut notes = Vec::new();
    let ttl = spec.ttl;
    let slot_index = |target: &str| {
        target
            .strip_prefix('w')
            .and_then(|n| n.parse::<usize>().ok())
            .map(|n| n - 1)
    };
    let started = Instant::now();
    let mut next = 0;
    let mut deferred: Vec<PlannedFault> = Vec::new();
    let mut script: Option<Script> = None;
    let mut last_kill: Option<Instant> = None;
    let mut next_inspect = started;
    // Since the store was last back: when, and each slot's incarnation and line count.
    // At the start it counts as long ago: the first fail-over needs only a write.
    let mut since_back: Option<(Instant, Vec<(u32, usize)>)> = Some((
        started
            .checked_sub(Duration::from_millis(FAILOVER_SPACING_MS))
            .unwrap_or(started),
        slots.iter().map(|s| (s.incarnation, 0)).collect(),
    ));
    // The run goes on past its duration until the stale write and every deferred fault
    // are done (bounded).
    let cap = spec.duration + ttl * 4;
    loop {
        let elapsed = started.elapsed();
        // A kill's takeover bound (3×TTL, C9) must pass before the end-of-run kill.
        let failing_over = servers.poll_store_back(&rec, false);
        if !failing_over && since_back.is_none() {
            // Back (or never failed over): the store must serve from here on.
            since_back = Some((
                Instant::now(),
                slots
                    .iter()
                    .map(|s| (s.incarnation, s.process.line_count()))
                    .collect(),
            ));
        }
        let pending = failing_over
            || script.is_some()
            || !deferred.is_empty()
            || last_kill.is_some_and(|k| k.elapsed() < ttl * 3);
        if elapsed >= cap || (elapsed >= spec.duration && !pending) {
            if pending {
                notes.push(
                    "the stale write or a deferred fault did not complete before the cap".into(),
                );
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        let now = Instant::now();
        for s in &mut slots {
            s.follow();
            if s.frozen_until.is_some_and(|t| now >= t) {
                s.process.resume();
                s.frozen_until = None;
                fault(&rec, &s.id(), FaultKind::Sigcont, "");
            }
            if s.proxy_until.is_some_and(|t| now >= t) {
                for proxy in servers.path(slot_index(&s.name).unwrap_or(0)) {
                    proxy.set_mode(ProxyMode::Pass);
                    proxy.reset_all();
                }
                s.proxy_until = None;
                fault(&rec, &s.name, FaultKind::ProxyPass, "");
            }
        }
        if now >= next_inspect {
            inspect(&store, "");
            next_inspect = now + ttl / 4;
        }
        // The scripted stale write.
        script = match script.take() {
            None => None,
            Some(Script::Armed { mut from }) => {
                let mut frozen = None;
                for (i, s) in slots.iter().enumerate() {
                    let Some((line, fence, key)) = find_line(&s.process, from[i], "PREPARING")
                    else {
                        continue;
                    };
                    from[i] = line + 1;
                    if s.frozen_until.is_none() && s.proxy_until.is_none() && frozen.is_none() {
                        s.process.pause();
                        fault(&rec, &s.id(), FaultKind::Sigstop, "stale-write");
                        frozen = Some(Script::Frozen {
                            slot: i,
                            since: Instant::now(),
                            line,
                            fence,
                            key,
                            marks: slots.iter().map(|s| s.process.line_count()).collect(),
                            miss_checked: false,
                        });
                    }
                }
                frozen.or(Some(Script::Armed { from }))
            }
            Some(Script::Woken { slot, since, from }) => {
                // Left alone until its stale write is done (it releases after it).
                let done = find_line(&slots[slot].process, from, "RELEASING").is_some();
                (!done && now < since + ttl * 2).then_some(Script::Woken { slot, since, from })
            }
            Some(Script::Frozen {
                slot,
                since,
                line,
                fence,
                key,
                marks,
                miss_checked,
            }) => {
                let s = &slots[slot];
                let newer = slots
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != slot)
                    .any(|(i, o)| {
                        let mut from = marks[i];
                        while let Some((l, f, k)) = find_line(&o.process, from, "WROTE") {
                            if f > fence && k == key {
                                return true;
                            }
                            from = l + 1;
                        }
                        false
                    });
                if !miss_checked && now >= since + Duration::from_millis(50) {
                    if find_line(&s.process, line, "WRITING").is_some() {
                        // Frozen too late: it was already writing. Wake it, try again.
                        s.process.resume();
                        fault(&rec, &s.id(), FaultKind::Sigcont, "stale-write missed");
                        notes.push(format!(
                            "stale write on {} missed its freeze; re-armed",
                            s.id()
                        ));
                        Some(Script::Armed {
                            from: slots.iter().map(|s| s.process.line_count()).collect(),
                        })
                    } else {
                        Some(Script::Frozen {
                            slot,
                            since,
                            line,
                            fence,
                            key,
                            marks,
                            miss_checked: true,
                        })
                    }
                } else if miss_checked && newer {
                    s.process.resume();
                    fault(&rec, &s.id(), FaultKind::Sigcont, "stale-write");
                    *fired.entry(PlanKind::StaleWrite).or_default() += 1;
                    Some(Script::Woken {
                        slot,
                        since: now,
                        from: line + 1,
                    })
                } else if now >= since + ttl * 8 {
                    s.process.resume();
                    fault(&rec, &s.id(), FaultKind::Sigcont, "stale-write gave up");
                    notes.push(format!(
                        "stale write on {}: no newer write in 8 TTL",
                        s.id()
                    ));
                    None
                } else {
                    Some(Script::Frozen {
                        slot,
                        since,
                        line,
                        fence,
                        key,
                        marks,
                        miss_checked,
                    })
                }
            }
        };
        // Planned faults that are due (deferred ones first).
        while next < schedule.len() && elapsed >= Duration::from_millis(schedule[next].offset_ms) {
            deferred.push(schedule[next].clone());
            next += 1;
        }
        let due = std::mem::take(&mut deferred);
        for f in due {
            // The holder: a worker that holds the lease by its own account and is neither
            // frozen nor cut off (the one with the highest fence if several believe so).
            let slot = if f.target == HOLDER {
                slots
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| {
                        s.holding.is_some()
                            && s.frozen_until.is_none()
                            && s.proxy_until.is_none()
                            && script.as_ref().and_then(Script::slot) != Some(*i)
                    })
                    .max_by_key(|(_, s)| s.holding)
                    .map(|(i, _)| i)
            } else {
                slot_index(&f.target)
            };
            if f.target == HOLDER && slot.is_none() {
                deferred.push(f);
                continue;
            }
            if f.kind == PlanKind::StaleWrite {
                script = Some(Script::Armed {
                    from: slots.iter().map(|s| s.process.line_count()).collect(),
                });
                continue;
            }
            let busy = slot.is_some_and(|i| {
                slots[i].frozen_until.is_some()
                    || slots[i].proxy_until.is_some()
                    || script.as_ref().and_then(Script::slot) == Some(i)
            }) || (f.kind == PlanKind::RestartStore && failing_over)
                // While the scripted stale write waits for a newer holder's write, no
                // holder is killed or frozen: the kills a busy run deferred would
                // otherwise fire one after another on each new holder before it wrote
                // (`--store redis-sentinel --duration 120s --seed 29`: 28 kills, the stale
                // write gave up).
                || (matches!(script, Some(Script::Frozen { .. }))
                    && (f.kind == PlanKind::Kill9 || f.target == HOLDER));
            if busy {
                deferred.push(f);
                continue;
            }
            let late = elapsed.as_millis() as u64 - f.offset_ms;
            let late_note = (late > ttl.as_millis() as u64 / 2)
                .then(|| format!("{} on {} fired {late} ms late", f.kind.as_str(), f.target));
            let hold = Duration::from_millis(f.hold_ms);
            let why = if f.target == HOLDER { "holder" } else { "" };
            match (f.kind, slot) {
                (PlanKind::Sigstop, Some(i)) => {
                    let s = &mut slots[i];
                    s.process.pause();
                    s.frozen_until = Some(Instant::now() + hold);
                    fault(&rec, &s.id(), FaultKind::Sigstop, why);
                }
                (PlanKind::Kill9, Some(i)) => {
                    let s = &mut slots[i];
                    fault(&rec, &s.id(), FaultKind::Kill9, why);
                    s.process.kill();
                    // A holder's kill that came after it had started to release (its
                    // `RELEASING` line not read yet) missed the window: fire it again.
                    std::thread::sleep(Duration::from_millis(20));
                    let missed =
                        f.target == HOLDER && find_line(&s.process, s.seen, "RELEASING").is_some();
                    s.incarnation += 1;
                    s.process = spawn_worker(spec, &s.id(), &s.lease_url, &pg_url);
                    s.seen = 0;
                    s.holding = None;
                    last_kill = Some(Instant::now());
                    if missed {
                        notes.push(format!(
                            "kill9 of {} came after it started to release; fired again",
                            s.name
                        ));
                        deferred.push(f);
                        match &mut script {
                            Some(Script::Armed { from }) => from[i] = 0,
                            Some(Script::Frozen { marks, .. }) => marks[i] = 0,
                            Some(Script::Woken { .. }) | None => {}
                        }
                        continue;
                    }
                    // The new incarnation's lines start from zero.
                    match &mut script {
                        Some(Script::Armed { from }) => from[i] = 0,
                        Some(Script::Frozen { marks, .. }) => marks[i] = 0,
                        Some(Script::Woken { .. }) | None => {}
                    }
                }
                (PlanKind::RestartStore, _) => {
                    // A Sentinel fail-over stops every write for ~11 s: not while the
                    // scripted stale write waits for a newer holder's write, and not
                    // before the store has served again since the last one (see
                    // `sentinel_served`).
                    let blocks_writes = spec.store == StoreKind::RedisSentinel;
                    if (blocks_writes
                        && (script.is_some() || !sentinel_served(&slots, &since_back)))
                        || !servers.restart_store(&rec)
                    {
                        deferred.push(f);
                        continue;
                    }
                    since_back = None;
                }
                (kind, Some(i)) => {
                    let (mode, recorded) = match kind {
                        PlanKind::ProxyDelay => {
                            (ProxyMode::Delay(ttl * 2 / 5), FaultKind::ProxyDelay)
                        }
                        PlanKind::ProxyDropReplies => {
                            (ProxyMode::DropReplies, FaultKind::ProxyDropReplies)
                        }
                        PlanKind::ProxyBlackhole => {
                            (ProxyMode::Blackhole, FaultKind::ProxyBlackhole)
                        }
                        _ => (ProxyMode::Reset, FaultKind::ProxyReset),
                    };
                    fault(&rec, &slots[i].name, recorded, why);
                    for proxy in servers.path(i) {
                        proxy.set_mode(mode);
                    }
                    slots[i].proxy_until = Some(Instant::now() + hold);
                }
                (kind, None) => {
                    notes.push(format!(
                        "{} has no valid target {}",
                        kind.as_str(),
                        f.target
                    ));
                    continue;
                }
            }
            notes.extend(late_note);
            *fired.entry(f.kind).or_default() += 1;
        }
    }
    // Wind down: resume everyone, restore every path, stop the workers, let their leases
    // run out in the store, and look at it one last time.
    for s in &mut slots {
        if s.frozen_until.take().is_some() {
            s.process.resume();
            fault(&rec, &s.id(), FaultKind::Sigcont, "end of run");
        }
    }
    for (i, s) in slots.iter_mut().enumerate() {
        if s.proxy_until.take().is_some() {
            for proxy in servers.path(i) {
                proxy.set_mode(ProxyMode::Pass);
            }
            fault(&rec, &s.name, FaultKind::ProxyPass, "end of run");
        }
    }
    servers.poll_store_back(&rec, true);
    std::thread::sleep(ttl / 2);
    for s in &slots {
        fault(&rec, &s.id(), FaultKind::EndKill, "");
        s.process.kill();
    }
    std::thread::sleep(ttl * 3 / 2);
    // Through a store opened afresh: the harness's own connection may not have outlived
    // the run's faults (a ZooKeeper session expires while its member is killed).
    let fresh = rt.block_on(async {
        tokio::time::timeout(ttl * 2, crate::registry().open(&direct_lease_url)).await
    });
    let last = match fresh {
        Ok(Ok(s)) => s,
        _ => Arc::clone(&store),
    };
    inspect(&last, "final");
    let state = rt.block_on(collect(&pg_url))?;
    drop(servers);
    let _ = std::fs::write(
        spec.out.join(STATE_FILE),
        serde_json::to_string(&state).unwrap_or_default(),
    );
    let events = read_events(&spec.out)?;
    let cfg = check_config(spec.store, ttl, spec.permits);
    let violations = check(&events, &state, &cfg);
    Ok(Report {
        events,
        state,
        violations,
        schedule,
        fired,
        notes,
    })
}

/// The final state of the protected data, as saved in a run's directory.
pub const STATE_FILE: &str = "final-state.json";

/// Every event of a run's directory, sorted by time.
///
/// # Errors
/// Unreadable files or bad lines, as text.
pub fn read_events(dir: &Path) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        if entry.path().extension().is_some_and(|x| x == "jsonl") {
            let text = std::fs::read_to_string(entry.path()).map_err(|e| e.to_string())?;
            events.extend(parse_lines(&text)?);
        }
    }
    events.sort_by_key(|e| e.t);
    Ok(events)
}

/// Whether a Sentinel store has served since its last fail-over ended (`since_back`):
/// [`FAILOVER_SPACING_MS`] have passed and a worker has had a write acknowledged since
/// (a `WROTE` line). After `store-back` the demoted primary resyncs from the new one, and
/// with `min_replicas=1` no acquire, renewal or release is acknowledged meanwhile (each
/// times out after the operation timeout, "it may have been applied"): a fail-over fired
/// on the planned offsets alone can land again before the store served anything, and a
/// long run (`--duration 120s --seed 29`) then spends most of its time failing over, with
/// the scripted stale write never fired.
fn sentinel_served(slots: &[Slot], since_back: &Option<(Instant, Vec<(u32, usize)>)>) -> bool {
    let Some((back, marks)) = since_back else {
        return false;
    };
    back.elapsed() >= Duration::from_millis(FAILOVER_SPACING_MS)
        && slots.iter().zip(marks).any(|(s, &(inc, from))| {
            let from = if s.incarnation == inc { from } else { 0 };
            find_line(&s.process, from, "WROTE").is_some()
        })
}

/// The least time between two planned fail-overs of a Sentinel run. A forced fail-over
/// takes ~10 s (Sentinel demotes the old primary only after seeing it report itself
/// primary for a while, then it resyncs), and with `min_replicas=1` no write is served
/// meanwhile: fail-overs planned closer than this would only queue up behind each other
/// (fired late, or not before the run ends).
const FAILOVER_SPACING_MS: u64 = 15_000;

/// Spaces the planned fail-overs (`restart-store`): none before 4 TTLs into the run, and
/// each at least [`FAILOVER_SPACING_MS`] after the one kept before it — the scripted stale
/// write (a holder frozen past its TTL, a newer holder's write, then the frozen one's) needs
/// writes to be served meanwhile. A fail-over planned before 4 TTLs is postponed to then
/// (the seed may have planned the run's only one early: dropping it left runs without a
/// fail-over, seed 126291537); one that cannot keep the spacing before `end` (the last
/// planned offset) is dropped, except that the first is always kept.
fn space_failovers(schedule: Vec<PlannedFault>, ttl: Duration, end: Duration) -> Vec<PlannedFault> {
    let first_ms = ttl.as_millis() as u64 * 4;
    let end_ms = end.as_millis() as u64;
    let mut last: Option<u64> = None;
    let mut out: Vec<PlannedFault> = schedule
        .into_iter()
        .filter_map(|mut f| {
            if f.kind != PlanKind::RestartStore {
                return Some(f);
            }
            match last {
                None if f.offset_ms.max(first_ms) <= end_ms => {
                    f.offset_ms = f.offset_ms.max(first_ms);
                }
                Some(l) if f.offset_ms >= l + FAILOVER_SPACING_MS && f.offset_ms <= end_ms => {}
                _ => return None,
            }
            last = Some(f.offset_ms);
            Some(f)
        })
        .collect();
    out.sort_by_key(|f| f.offset_ms);
    out
}

/// The checker's configuration for a run on `store` with `ttl` (and in semaphore mode,
/// `permits`).
pub fn check_config(store: StoreKind, ttl: Duration, permits: Option<u32>) -> CheckConfig {
    let base = CheckConfig::for_ttl_ns(ttl.as_nanos() as u64);
    CheckConfig {
        // Sentinel with min_replicas=1: a grant the replica did not acknowledge is
        // answered ambiguously, and a fail-over to that replica forgets it; the owner's
        // retry is then granted afresh, with a higher fence (C8a's exemption for it).
        failover_forgets_unacknowledged: store == StoreKind::RedisSentinel,
        // Redlock's acquire records each node's candidate fence in round one and the
        // highest in round two: an inspection between the rounds may see a lower
        // candidate than the fence the call returns (leasehold-redlock's README, inspect).
        inspect_sees_candidates: store == StoreKind::Redlock,
        // Redis runs without persistence here: a restart forgets the leases (docs/faults.md rows 9–10);
        // a Redlock node restarted empty at once can take a bare majority's lease with
        // it (docs/faults.md rows 12–13, see leasehold-redlock's failure model).
        // The etcd cluster and the ZooKeeper ensemble lose nothing: one member is killed
        // at a time and the other two keep the quorum, with the leases (sessions) in it.
        restart_loses_leases: matches!(store, StoreKind::Redis | StoreKind::Redlock),
        // etcd's and ZooKeeper's leader (a restarted single server, or the member elected
        // after the leader's kill) gives every lease (session) a fresh TTL: a killed holder's
        // lease outlives the restart by a TTL, so C9's bound starts again when the store is
        // back (`leasehold-etcd/tests/store.rs::a_restart_gives_a_dead_holders_lease_a_fresh_ttl`,
        // `leasehold-zookeeper/tests/store.rs::a_restart_gives_a_silent_holders_session_a_fresh_timeout`).
        restart_renews_leases: matches!(
            store,
            StoreKind::Etcd
                | StoreKind::EtcdCluster
                | StoreKind::Zookeeper
                | StoreKind::ZookeeperEnsemble
        ),
        permits,
        ..base
    }
}

/// Reads the final state of the protected data.
async fn collect(pg_url: &str) -> Result<FinalState, String> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(pg_url)
        .await
        .map_err(|e| e.to_string())?;
    let rows: Vec<(i64, String, i64, String)> =
        sqlx::query_as("SELECT seq, resource, fence, owner FROM chaos_audit ORDER BY seq")
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
    let counters: Vec<(String, i64)> = sqlx::query_as("SELECT resource, value FROM chaos_counter")
        .fetch_all(&pool)
        .await
        .map_err(|e| e.to_string())?;
    Ok(FinalState {
        audit: rows
            .into_iter()
            .map(|(seq, resource, fence, owner)| AuditRow {
                seq: seq as u64,
                resource,
                fence: fence as u64,
                owner,
            })
            .collect(),
        counters: counters.into_iter().map(|(r, v)| (r, v as u64)).collect(),
    })
}

/// What a run must show, beyond its violations, for its kind; the failed expectations
/// (empty: the run showed what it must).
///
/// - Guard on: no violation. With faults, every kind in the schedule fired at least
///   once and the guard rejected at least one write. Without faults, no lost signal
///   (no `lost` event, no check or probe answering lost) and no rejected write.
/// - Guard off (control): the scripted stale write fired and the checker flagged it
///   under both C1 and C5.
/// - Overcommitting (semaphore mode, C11's control): the checker flagged C11.
pub fn verdict(spec: &RunSpec, report: &Report) -> Vec<String> {
    let counts = crate::report::summary(report);
    let count = |k: &str| counts.get(k).copied().unwrap_or(0);
    let mut failed = Vec::new();
    let planned: std::collections::BTreeSet<PlanKind> =
        report.schedule.iter().map(|f| f.kind).collect();
    for kind in &planned {
        if report.fired.get(kind).copied().unwrap_or(0) == 0 {
            failed.push(format!("planned fault kind {} never fired", kind.as_str()));
        }
    }
    if let Some(part) = spec.broken {
        let rules = crate::checker::rules(&report.violations);
        for needed in part.rules() {
            if !rules.contains(needed) {
                failed.push(format!(
                    "control run with the broken part {}: {needed} did not fire",
                    part.as_str()
                ));
            }
        }
        return failed;
    }
    if spec.overcommit {
        if !crate::checker::rules(&report.violations).contains("C11") {
            failed
                .push("overcommit control run: the broken bound was not flagged under C11".into());
        }
        return failed;
    }
    if spec.unfenced {
        let rules = crate::checker::rules(&report.violations);
        for needed in ["C1", "C5"] {
            if !rules.contains(needed) {
                failed.push(format!(
                    "control run: the stale write was not flagged under {needed}"
                ));
            }
        }
        if spec.faults == FaultSet::None {
            failed.push("a control run needs the scripted stale write".into());
        }
        return failed;
    }
    if !report.violations.is_empty() {
        failed.push(format!("{} violations", report.violations.len()));
    }
    match spec.faults {
        FaultSet::None => {
            for k in [
                crate::report::LOST_SIGNALS,
                crate::report::LOST_OBSERVATIONS,
                crate::report::WRITES_REJECTED,
            ] {
                if count(k) != 0 {
                    failed.push(format!("fault-free run: {} {k}", count(k)));
                }
            }
        }
        FaultSet::StaleWrite | FaultSet::All | FaultSet::Kill => {
            if count(crate::report::WRITES_REJECTED) == 0 {
                failed.push("the guard rejected no stale write".into());
            }
        }
    }
    failed.extend(unexercised(spec, report));
    failed
}

/// What a fenced run claims to exercise and did not (empty: all of it), each as a
/// failed expectation (the run proves nothing, which is not a violation):
/// - the final inspection was recorded for every key, without an error (C8b judges only
///   what it saw);
/// - with the scripted stale write: it fired (its holder woke after a newer holder's
///   write);
/// - with every fault: at least one lost signal resolved (a `lost` event: C4 and C10
///   judge only the windows that lost), and at least one kill landed inside its
///   incarnation's window (C9 judges only those).
pub fn unexercised(spec: &RunSpec, report: &Report) -> Vec<String> {
    let mut failed = Vec::new();
    let events = &report.events;
    for key in spec.keys() {
        let seen = events
            .iter()
            .find(|e| e.op == Some(Op::Inspect) && e.key == key && e.detail.starts_with("final"));
        match seen {
            Some(e) if e.phase == Some(Phase::Ok) => {}
            Some(e) => failed.push(format!(
                "the final inspection of {key} failed ({})",
                e.detail
            )),
            None => failed.push(format!("the final inspection of {key} was not recorded")),
        }
    }
    if matches!(spec.faults, FaultSet::StaleWrite | FaultSet::All)
        && report
            .fired
            .get(&PlanKind::StaleWrite)
            .copied()
            .unwrap_or(0)
            == 0
    {
        failed.push("the scripted stale write never fired".into());
    }
    if spec.faults == FaultSet::All {
        if !events.iter().any(|e| e.op == Some(Op::Lost)) {
            failed.push("no lost signal resolved in the run".into());
        }
        let planned_kill = report.schedule.iter().any(|f| f.kind == PlanKind::Kill9);
        if planned_kill && !events.iter().any(|k| kill_in_window(events, k)) {
            failed.push("no kill landed inside a holder's window".into());
        }
    }
    failed
}

/// Whether `k` is a `kill9` of an incarnation that held a lease then: its acquire was
/// granted before the kill, and it had not started to release it.
fn kill_in_window(events: &[Event], k: &Event) -> bool {
    if k.op != Some(Op::Fault) || k.fault != Some(FaultKind::Kill9) {
        return false;
    }
    let mine: Vec<&Event> = events
        .iter()
        .filter(|e| e.worker == k.key && e.t <= k.t)
        .collect();
    mine.iter()
        .rev()
        .find(|e| {
            e.op == Some(Op::Release) && e.phase == Some(Phase::Invoke)
                || e.op == Some(Op::Acquire) && e.phase == Some(Phase::Ok)
        })
        .is_some_and(|e| e.op == Some(Op::Acquire))
}

/// Where a report's files go.
pub fn summary_path(out: &Path) -> PathBuf {
    out.join("summary.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed's 18 s Sentinel schedule (TTL 2 s) keeps a fail-over, none before 4 TTLs,
    /// spaced by [`FAILOVER_SPACING_MS`], in time order.
    #[test]
    fn every_sentinel_schedule_keeps_a_spaced_failover() {
        let (ttl, duration) = (Duration::from_secs(2), Duration::from_secs(18));
        for seed in 0..2_000 {
            let planned = plan_kinds(
                seed,
                FaultSet::All,
                4,
                duration,
                ttl,
                StoreKind::RedisSentinel.fault_kinds(),
            );
            let spaced = space_failovers(planned, ttl, duration - ttl);
            let failovers: Vec<u64> = spaced
                .iter()
                .filter(|f| f.kind == PlanKind::RestartStore)
                .map(|f| f.offset_ms)
                .collect();
            assert!(!failovers.is_empty(), "seed {seed}: no fail-over kept");
            assert!(failovers[0] >= 8_000, "seed {seed}: {failovers:?}");
            assert!(
                failovers
                    .windows(2)
                    .all(|w| w[1] >= w[0] + FAILOVER_SPACING_MS),
                "seed {seed}: {failovers:?}"
            );
            assert!(
                spaced.windows(2).all(|w| w[0].offset_ms <= w[1].offset_ms),
                "seed {seed}: not in time order"
            );
        }
    }
}
