//! Chaos run and history checker for leasehold.
//!
//! Workers record every event as a JSON line stamped with `CLOCK_MONOTONIC` nanoseconds;
//! the guard keeps an audit row per protected write in the same transaction; the checker
//! (the `leasehold-checker` crate, re-exported here as [`checker`] and [`history`])
//! replays both and checks the invariants C1–C10 of `docs/faults.md`, and in semaphore mode
//! C11 (a semaphore's bound). Its own tests feed it hand-made bad histories; the control
//! runs here, each with a broken part, must make it fail.
#![forbid(unsafe_code)]

pub mod broken;
pub mod mono;
pub mod report;
pub mod run;
pub mod schedule;
pub mod worker;

pub use leasehold_checker::{
    AuditRow, CheckConfig, Event, FaultKind, FinalState, Op, Phase, Violation, check, checker,
    history, parse_lines,
};

/// A duration in humantime's words (`2s`, `30m`), for the command line.
///
/// # Errors
/// The parser's message.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// The stores the harness can run against: every store the `leasehold` crate is built
/// with here (Redis, PostgreSQL, etcd, ZooKeeper and Redlock).
pub fn registry() -> leasehold::store::Registry {
    leasehold::registry()
}
