//! The history checker of leasehold's chaos runs.
//!
//! Workers of a chaos run (the `leasehold-chaos` crate) record every event as a JSON line
//! stamped with `CLOCK_MONOTONIC` nanoseconds; the guard keeps an audit row per protected
//! write in the same transaction. [`check`] replays both and checks the invariants C1–C10
//! of `docs/faults.md`, and in semaphore mode C11 (a semaphore's bound).
//!
//! A crate of its own so that it is a pure function over a history, with no store, runtime
//! or process in it: its tests (`tests/checker`) feed it hand-made histories, good and bad,
//! and its mutation score is measured against them alone (`scripts/mutants checker`).
#![forbid(unsafe_code)]

pub mod checker;
pub mod history;

pub use checker::{CheckConfig, Violation, check};
pub use history::{AuditRow, Event, FaultKind, FinalState, MemberRole, Op, Phase, parse_lines};
