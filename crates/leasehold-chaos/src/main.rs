//! `leasehold-chaos`: run workers under faults and check the history.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use leasehold_chaos::run::{RunSpec, StoreKind};
use leasehold_chaos::worker::WorkerSpec;
use leasehold_chaos::{report, run, worker};

/// Chaos run and history checker for leasehold.
#[derive(Debug, Parser)]
#[command(name = "leasehold-chaos", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run N workers against a private store with the seed's faults, then check the
    /// history. Exits 0 when the run showed what it must: with the guard, no violation,
    /// every planned fault kind fired and at least one stale write rejected (without
    /// faults: no lost signal and no rejected write); without the guard (--unfenced), the
    /// scripted stale write flagged under C1 and C5.
    Run(RunSpec),
    /// Check a recorded run again (its directory: events, final-state.json,
    /// summary.json), e.g. after a change to the checker. Exits 1 on violations.
    Check {
        /// The run's output directory.
        #[arg(long, default_value = "target/chaos")]
        out: PathBuf,
    },
    /// (internal) One worker process.
    #[command(hide = true)]
    Worker(WorkerSpec),
}

fn main() -> ExitCode {
    // The ZooKeeper client's TLS turns on rustls's aws-lc-rs beside the ring the SQL
    // driver asks for: name the process's provider before any TLS connection is made.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match Cli::parse().command {
        Cmd::Worker(spec) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
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
        Cmd::Run(spec) => {
            let report = match run::run(&spec) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("leasehold-chaos: {e}");
                    return ExitCode::from(2);
                }
            };
            let mode = match (spec.permits, spec.overcommit) {
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
                "leasehold chaos run: {:?} store, {} workers, {:?}, TTL {:?}, faults {}, seed {}, guard {}{mode}",
                spec.store,
                spec.workers,
                spec.duration,
                spec.ttl,
                spec.faults
                    .to_possible_value()
                    .map_or("?".into(), |v| v.get_name().to_owned()),
                spec.seed,
                if spec.unfenced { "OFF (control)" } else { "on" }
            );
            println!("{title}\n{}", report::table(&report));
            let _ = std::fs::write(
                spec.out.join("timeline.html"),
                report::html(&report, &title),
            );
            let failed = run::verdict(&spec, &report);
            let summary = serde_json::json!({
                "store": format!("{:?}", spec.store),
                "unfenced": spec.unfenced,
                "faults": spec.faults,
                "seed": spec.seed,
                "ttl_ms": spec.ttl.as_millis() as u64,
                "duration_ms": spec.duration.as_millis() as u64,
                "permits": spec.permits,
                "overcommit": spec.overcommit,
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
                run::summary_path(&spec.out),
                serde_json::to_string_pretty(&summary).unwrap_or_default(),
            );
            println!(
                "events, summary.json and timeline.html in {}",
                spec.out.display()
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
        Some("PostgresTls") => StoreKind::PostgresTls,
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
