//! `leasehold-chaos`: run workers under faults and check the history.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use leasehold_chaos::run::{RunSpec, StoreKind};
use leasehold_chaos::schedule::FaultSet;
use leasehold_chaos::worker::WorkerSpec;
use leasehold_chaos::{report, run, worker};

/// Chaos run and history checker for leasehold.
#[derive(Debug, Parser)]
#[command(name = "leasehold-chaos", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run N workers against a private store with the seed's faults, then check the
    /// history. Exits 0 when the run showed what it must: with the guard, no violation,
    /// every planned fault kind fired and at least one stale write rejected (without
    /// faults: no lost signal and no rejected write); without the guard (--unfenced), the
    /// scripted stale write flagged under C1 and C5.
    Run {
        /// The lease store.
        #[arg(long, value_enum, default_value = "redis")]
        store: StoreKind,
        /// Worker processes.
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// How long the workload runs (long soaks: e.g. --duration 30m).
        #[arg(long, default_value = "30s", value_parser = duration)]
        duration: Duration,
        /// Lease TTL.
        #[arg(long, default_value = "2s", value_parser = duration)]
        ttl: Duration,
        /// The control run: the same workload with the guard switched off.
        #[arg(long)]
        unfenced: bool,
        /// Which faults: all (every kind, plus the scripted stale write), stale-write
        /// (only the scripted stale write: the control runs), none.
        #[arg(long, value_enum, default_value = "all")]
        faults: FaultSet,
        /// Output directory (events, summary, timeline).
        #[arg(long, default_value = "target/chaos")]
        out: PathBuf,
        /// Seed of the fault schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Semaphore mode: the workers take permits of an N-permit semaphore (N ≥ 2)
        /// instead of the lease; every per-key rule applies per slot key, and C11 checks
        /// that at most N windows on its slots are in force at once.
        #[arg(long, value_parser = clap::value_parser!(u32).range(2..=i64::from(leasehold::semaphore::MAX_PERMITS)))]
        permits: Option<u32>,
        /// (C11's control run) skip the semaphore: take random slot leases over N+1
        /// slots. Needs --permits.
        #[arg(long, hide = true, requires = "permits")]
        overcommit: bool,
    },
    /// Check a recorded run again (its directory: events, final-state.json,
    /// summary.json), e.g. after a change to the checker. Exits 1 on violations.
    Check {
        /// The run's output directory.
        #[arg(long, default_value = "target/chaos")]
        out: PathBuf,
    },
    /// (internal) One worker process.
    #[command(hide = true)]
    Worker {
        #[arg(long)]
        name: String,
        #[arg(long)]
        lease_url: String,
        #[arg(long)]
        pg_url: String,
        #[arg(long)]
        key: String,
        #[arg(long, value_parser = duration)]
        ttl: Duration,
        #[arg(long)]
        events: PathBuf,
        #[arg(long)]
        unfenced: bool,
        #[arg(long)]
        permits: Option<u32>,
        #[arg(long)]
        overcommit: bool,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Worker {
            name,
            lease_url,
            pg_url,
            key,
            ttl,
            events,
            unfenced,
            permits,
            overcommit,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let spec = WorkerSpec {
                name,
                lease_url,
                pg_url,
                key,
                ttl,
                unfenced,
                permits,
                overcommit,
                events,
            };
            match rt.block_on(worker::run(spec, leasehold_chaos::registry())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("worker: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Cmd::Check { out } => match recheck(&out) {
            Ok(violations) => {
                for v in &violations {
                    println!("{v}");
                }
                println!("{} violations", violations.len());
                if violations.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("leasehold-chaos: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Run {
            store,
            workers,
            duration,
            ttl,
            unfenced,
            faults,
            out,
            seed,
            permits,
            overcommit,
        } => {
            let spec = RunSpec {
                store,
                workers,
                duration,
                ttl,
                unfenced,
                faults,
                out: out.clone(),
                seed,
                permits,
                overcommit,
            };
            let report = match run::run(&spec) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("leasehold-chaos: {e}");
                    return ExitCode::from(2);
                }
            };
            let mode = match (permits, overcommit) {
                (None, _) => String::new(),
                (Some(n), false) => format!(", semaphore of {n} permits"),
                (Some(n), true) => {
                    format!(
                        ", semaphore of {n} permits OVERCOMMITTED over {} slots (control)",
                        n + 1
                    )
                }
            };
            let title = format!(
                "leasehold chaos run: {store:?} store, {workers} workers, {duration:?}, TTL {ttl:?}, faults {}, seed {seed}, guard {}{mode}",
                faults
                    .to_possible_value()
                    .map_or("?".into(), |v| v.get_name().to_owned()),
                if unfenced { "OFF (control)" } else { "on" }
            );
            println!("{title}\n{}", report::table(&report));
            let _ = std::fs::write(out.join("timeline.html"), report::html(&report, &title));
            let failed = run::verdict(&spec, &report);
            let summary = serde_json::json!({
                "store": format!("{store:?}"),
                "unfenced": unfenced,
                "faults": faults,
                "seed": seed,
                "ttl_ms": ttl.as_millis() as u64,
                "duration_ms": duration.as_millis() as u64,
                "permits": permits,
                "overcommit": overcommit,
                "schedule": report.schedule,
                "fired": report.fired.iter().map(|(k, n)| (k.as_str(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
                "operations": report::summary(&report),
                "violations": report.violations.iter().map(|v| serde_json::json!({
                    "invariant": v.invariant,
                    "rule": v.rule,
                    "detail": v.detail,
                })).collect::<Vec<_>>(),
                "notes": report.notes,
                "failed_expectations": failed,
            });
            let _ = std::fs::write(
                run::summary_path(&out),
                serde_json::to_string_pretty(&summary).unwrap_or_default(),
            );
            println!(
                "events, summary.json and timeline.html in {}",
                out.display()
            );
            if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                for f in &failed {
                    eprintln!("leasehold-chaos: {f}");
                }
                ExitCode::from(1)
            }
        }
    }
}

/// Checks the run recorded in `out` again.
fn recheck(out: &std::path::Path) -> Result<Vec<leasehold_chaos::Violation>, String> {
    let read =
        |name: &str| std::fs::read_to_string(out.join(name)).map_err(|e| format!("{name}: {e}"));
    let summary: serde_json::Value =
        serde_json::from_str(&read("summary.json")?).map_err(|e| e.to_string())?;
    let state: leasehold_chaos::FinalState =
        serde_json::from_str(&read(run::STATE_FILE)?).map_err(|e| e.to_string())?;
    let store = match summary["store"].as_str() {
        Some("Redis") => StoreKind::Redis,
        Some("Postgres") => StoreKind::Postgres,
        Some("Etcd") => StoreKind::Etcd,
        Some("Zookeeper") => StoreKind::Zookeeper,
        Some("Redlock") => StoreKind::Redlock,
        Some("EtcdCluster") => StoreKind::EtcdCluster,
        Some("ZookeeperEnsemble") => StoreKind::ZookeeperEnsemble,
        Some("RedisSentinel") => StoreKind::RedisSentinel,
        other => return Err(format!("unknown store {other:?} in summary.json")),
    };
    let ttl = Duration::from_millis(
        summary["ttl_ms"]
            .as_u64()
            .ok_or("no ttl_ms in summary.json")?,
    );
    // Absent (a lease run, or a run recorded before semaphore mode): no C11.
    let permits = summary["permits"]
        .as_u64()
        .map(|n| u32::try_from(n).map_err(|_| format!("permits {n} out of range in summary.json")))
        .transpose()?;
    let events = run::read_events(out)?;
    Ok(leasehold_chaos::check(
        &events,
        &state,
        &run::check_config(store, ttl, permits),
    ))
}
