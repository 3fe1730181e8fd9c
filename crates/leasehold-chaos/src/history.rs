//! The history: one JSON line per event, stamped with `CLOCK_MONOTONIC` nanoseconds
//! (shared by every process of one host).

use serde::{Deserialize, Serialize};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Acquire a lease.
    Acquire,
    /// Renew (recorded by the heartbeat's outcome: the lease's new deadline).
    Renew,
    /// Release.
    Release,
    /// A protected write through the guard.
    Write,
    /// The lost signal fired.
    Lost,
    /// A fault injected by the harness.
    Fault,
    /// A final inspection of the store by the harness (after the run).
    Inspect,
}

/// The phase of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Started.
    Invoke,
    /// Succeeded (for writes: committed and accepted by the guard).
    Ok,
    /// Failed definitely (for writes: rejected by the guard, or rolled back).
    Fail,
    /// Outcome unknown (timeout, reset): may have taken effect.
    Unknown,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Event {
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub t: u64,
    /// Worker name (or `"injector"`, `"harness"`).
    pub worker: String,
    /// The operation.
    pub op: Option<Op>,
    /// Its phase.
    pub phase: Option<Phase>,
    /// The lease key or protected resource.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Owner token (hex).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// Fence of the lease (acquire ok, write, lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// Requested TTL in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The holder's validity deadline (monotonic ns) after this acquire/renew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<u64>,
    /// Write: the commit sequence number from the guard's audit table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Free text: fault kind, lost reason, error.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A row of the guard's audit table, written in the same transaction as the protected
/// write (or, with the guard off, just with the write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRow {
    /// Commit order.
    pub seq: u64,
    /// The protected resource.
    pub resource: String,
    /// The writer's fence.
    pub fence: u64,
    /// The writer's owner token.
    pub owner: String,
}

/// What the protected storage holds at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FinalState {
    /// Audit rows in commit order.
    pub audit: Vec<AuditRow>,
    /// The read-modify-write counter per resource.
    pub counters: Vec<(String, u64)>,
}

/// Parses JSON lines; blank lines are skipped.
///
/// # Errors
/// The line number and the parse error of the first bad line.
pub fn parse_lines(text: &str) -> Result<Vec<Event>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}
