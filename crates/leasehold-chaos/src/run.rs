//! The orchestrator: private servers, worker processes, the fault injector, and the check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_postgres::sqlx::{self, postgres::PgPoolOptions};
use leasehold_testkit::{FaultProxy, Postgres, ProxyMode, RedisServer, WorkerProcess};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checker::{CheckConfig, Violation, check};
use crate::history::{AuditRow, Event, FinalState, Op, Phase, parse_lines};
use crate::mono::mono_ns;
use crate::worker::Recorder;

/// Which store holds the leases (the guard and the data are always in PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// A private redis-server (no persistence).
    Redis,
    /// The lease table in the private PostgreSQL.
    Postgres,
}

/// One chaos run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The lease store.
    pub store: StoreKind,
    /// Worker processes.
    pub workers: usize,
    /// How long the workload runs.
    pub duration: Duration,
    /// Lease TTL.
    pub ttl: Duration,
    /// The control run: guard off.
    pub unfenced: bool,
    /// Inject faults.
    pub faults: bool,
    /// Where the events, the summary and the timeline go.
    pub out: PathBuf,
    /// Seed of the fault schedule.
    pub seed: u64,
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    /// Every event, sorted by time.
    pub events: Vec<Event>,
    /// What the protected storage holds.
    pub state: FinalState,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
}

const KEY: &str = "chaos:counter";

struct Servers {
    pg: Postgres,
    redis: Option<RedisServer>,
    proxy: FaultProxy,
}

impl Servers {
    fn restart_store(&self) {
        match &self.redis {
            Some(r) => r.restart(), // kill -9, start again at once, no persistence
            None => {
                self.pg.stop_immediate();
                self.pg.start_again();
            }
        }
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
    .arg(spec.out.join(format!("{name}.jsonl")));
    if spec.unfenced {
        c.arg("--unfenced");
    }
    c
}

fn spawn_worker(spec: &RunSpec, name: &str, lease_url: &str, pg_url: &str) -> WorkerProcess {
    let w = WorkerProcess::spawn(worker_command(spec, name, lease_url, pg_url));
    w.wait_for_line(|l| l.starts_with("READY"), Duration::from_secs(60))
        .unwrap_or_else(|| panic!("worker {name} did not start: {:?}", w.lines()));
    w
}

fn fault(rec: &Recorder, target: &str, detail: &str, counts: &mut BTreeMap<String, u64>) {
    rec.record(Event {
        op: Some(Op::Fault),
        key: target.into(),
        detail: detail.into(),
        ..Default::default()
    });
    let kind = detail
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    *counts.entry(kind).or_default() += 1;
}

/// Runs the workload with faults, then checks the history.
///
/// # Errors
/// Set-up failures, as text.
pub fn run(spec: &RunSpec) -> Result<Report, String> {
    std::fs::create_dir_all(&spec.out).map_err(|e| e.to_string())?;
    for entry in std::fs::read_dir(&spec.out)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        if entry.path().extension().is_some_and(|x| x == "jsonl") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let pg = Postgres::start();
    let redis = (spec.store == StoreKind::Redis).then(RedisServer::start);
    let upstream = redis.as_ref().map_or(pg.addr(), |r| r.addr());
    let proxy = FaultProxy::start(upstream);
    let servers = Servers { pg, redis, proxy };
    let pg_url = servers.pg.url();
    let (lease_url, direct_lease_url) = match spec.store {
        StoreKind::Redis => (
            format!("redis://127.0.0.1:{}/", servers.proxy.port()),
            servers.redis.as_ref().map(|r| r.url()).unwrap_or_default(),
        ),
        StoreKind::Postgres => (
            format!(
                "postgres://postgres@127.0.0.1:{}/postgres",
                servers.proxy.port()
            ),
            format!("{pg_url}?leasehold_migrate=true"),
        ),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&pg_url)
            .await
            .map_err(|e| e.to_string())?;
        crate::worker::prepare_data(&pool, KEY).await?;
        // Creates the lease table once, before the workers start.
        crate::registry()
            .open(&direct_lease_url)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    })?;

    let names: Vec<String> = (1..=spec.workers).map(|i| format!("w{i}")).collect();
    let mut workers: Vec<WorkerProcess> = names
        .iter()
        .map(|n| spawn_worker(spec, n, &lease_url, &pg_url))
        .collect();
    let rec =
        Recorder::open(&spec.out.join("injector.jsonl"), "injector").map_err(|e| e.to_string())?;
    let mut counts = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let ttl = spec.ttl;
    let started = Instant::now();
    // Per worker: resume at this instant, if paused.
    let mut paused: Vec<Option<Instant>> = vec![None; workers.len()];
    let mut seen_lines: Vec<usize> = vec![0; workers.len()];
    let mut next_fault = started + ttl * 2;
    let mut proxy_restore: Option<Instant> = None;
    while started.elapsed() < spec.duration {
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        for (i, w) in workers.iter().enumerate() {
            if paused[i].is_some_and(|t| now >= t) {
                w.resume();
                paused[i] = None;
                fault(&rec, &names[i], "sigcont", &mut counts);
            }
        }
        if let Some(t) = proxy_restore
            && now >= t
        {
            servers.proxy.reset_all();
            servers.proxy.set_mode(ProxyMode::Pass);
            proxy_restore = None;
            fault(&rec, "proxy", "proxy pass", &mut counts);
        }
        if !spec.faults {
            continue;
        }
        // Freeze a worker between its validity check and its write, now and then.
        for (i, w) in workers.iter().enumerate() {
            let n = w.line_count();
            let preparing = n > seen_lines[i]
                && w.lines()[seen_lines[i]..]
                    .iter()
                    .any(|l| l.starts_with("PREPARING"));
            seen_lines[i] = n;
            if preparing && paused[i].is_none() && rng.random_bool(0.2) {
                w.pause();
                paused[i] = Some(now + ttl * 5 / 2);
                fault(&rec, &names[i], "sigstop before-write", &mut counts);
            }
        }
        if now < next_fault {
            continue;
        }
        next_fault = now
            + Duration::from_millis(
                rng.random_range(ttl.as_millis() as u64..ttl.as_millis() as u64 * 3),
            );
        let i = rng.random_range(0..workers.len());
        match rng.random_range(0..6) {
            0 if paused[i].is_none() => {
                workers[i].pause();
                let d = ttl.mul_f64(rng.random_range(0.3..2.5));
                paused[i] = Some(now + d);
                fault(&rec, &names[i], "sigstop random", &mut counts);
            }
            1 if paused[i].is_none() => {
                fault(&rec, &names[i], "kill9", &mut counts);
                workers[i].kill();
                workers[i] = spawn_worker(spec, &names[i], &lease_url, &pg_url);
                seen_lines[i] = 0;
            }
            2 => {
                fault(&rec, "store", "restart-store", &mut counts);
                servers.restart_store();
            }
            3 if proxy_restore.is_none() => {
                let mode = match rng.random_range(0..4) {
                    0 => ProxyMode::Delay(ttl * 2 / 5),
                    1 => ProxyMode::DropReplies,
                    2 => ProxyMode::Blackhole,
                    _ => ProxyMode::Reset,
                };
                fault(
                    &rec,
                    "proxy",
                    &format!("proxy {mode:?}").to_lowercase(),
                    &mut counts,
                );
                servers.proxy.set_mode(mode);
                proxy_restore = Some(now + ttl.mul_f64(rng.random_range(0.3..1.5)));
            }
            _ => {}
        }
    }
    // Wind down: resume everyone, stop the workers, let their leases run out.
    for (i, w) in workers.iter().enumerate() {
        if paused[i].is_some() {
            w.resume();
            fault(&rec, &names[i], "sigcont", &mut counts);
        }
    }
    servers.proxy.set_mode(ProxyMode::Pass);
    std::thread::sleep(ttl);
    for (i, w) in workers.iter().enumerate() {
        fault(&rec, &names[i], "kill9 end-of-run", &mut counts);
        w.kill();
    }
    std::thread::sleep(ttl * 3);
    let state = rt.block_on(collect(&pg_url, &direct_lease_url, &rec))?;
    drop(servers);

    let mut events = Vec::new();
    for entry in std::fs::read_dir(&spec.out)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        if entry.path().extension().is_some_and(|x| x == "jsonl") {
            let text = std::fs::read_to_string(entry.path()).map_err(|e| e.to_string())?;
            events.extend(parse_lines(&text)?);
        }
    }
    events.sort_by_key(|e| e.t);
    let cfg = CheckConfig {
        // Redis runs without persistence here: a restart forgets the leases (FAULTS 9-10).
        restart_loses_leases: spec.store == StoreKind::Redis,
        ..CheckConfig::for_ttl_ns(ttl.as_nanos() as u64)
    };
    let violations = check(&events, &state, &cfg);
    Ok(Report {
        events,
        state,
        violations,
        faults: counts,
    })
}

/// Reads the final state of the protected data and checks the store for leftovers.
async fn collect(pg_url: &str, lease_url: &str, rec: &Recorder) -> Result<FinalState, String> {
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
    let store = crate::registry()
        .open(lease_url)
        .await
        .map_err(|e| e.to_string())?;
    let key = leasehold::Key::new(KEY).map_err(|e| e.to_string())?;
    let held = store.inspect(&key).await.map_err(|e| e.to_string())?;
    rec.record(Event {
        t: mono_ns(),
        worker: "harness".into(),
        op: Some(Op::Inspect),
        phase: Some(Phase::Ok),
        key: KEY.into(),
        owner: held.map(|h| h.owner.to_hex()).unwrap_or_default(),
        ..Default::default()
    });
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

/// Where a report's files go.
pub fn summary_path(out: &Path) -> PathBuf {
    out.join("summary.json")
}
