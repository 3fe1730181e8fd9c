//! The history: one JSON line per event, stamped with `CLOCK_MONOTONIC` nanoseconds
//! (shared by every process of one host).
//!
//! # Identity
//!
//! Every worker process is one *incarnation* of a worker slot: `w2#0` is the first
//! process of slot `w2`, `w2#1` the process the injector started after killing it. Every
//! event of a worker carries its incarnation in [`Event::worker`]; the injector records a
//! fault against the incarnation it hit (a `kill9` of `w2#0` says nothing about `w2#1`),
//! or against the slot's own path to the store (its fault proxy, `w2`), or the store.
//!
//! # What each event means
//!
//! | op | phase | recorded by | `t` is |
//! | --- | --- | --- | --- |
//! | `acquire` | `invoke` / `ok` / `fail` | worker | before the call / after the reply |
//! | `renew` | `invoke` | the library's `leasehold::LeaseObserver` (`Sent`) | after the client read its clock for the send, before the request goes out |
//! | `renew` | `ok` | observer (`Accepted`): the client extended the deadline to `valid_until` | after the extension |
//! | `renew` | `fail` | observer: `detail` is `refused` (the store renewed, the client did not extend) or `not_owner` | after the reply |
//! | `renew` | `unknown` | observer (`Failed`: error or timeout) | after the reply |
//! | `check` | `ok` | worker: `lost` is its `LostSignal::is_lost()` answer | **before** it asked |
//! | `write` | `invoke` | worker: `lost` is its `is_lost()` answer asked right before the write (the probe) | **before** the probe, so before the write |
//! | `write` | `ok` / `fail` / `unknown` | worker: accepted (with the audit `seq`), rejected or failed, unknown | after the transaction |
//! | `lost` | `ok` | worker's watcher task: the lost signal resolved | after it resolved |
//! | `release` | `invoke` / `ok` / `fail` / `unknown` | worker | before the call / after the reply |
//! | `fault` | — | injector: `fault` is the kind, `key` the target | when applied |
//! | `inspect` | `ok` | injector: the store's own record of the key (`owner`, `fence`); `detail` `final` for the last one | after the reply |

use serde::{Deserialize, Serialize};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Acquire a lease.
    Acquire,
    /// A renewal by the library's heartbeat, as its observer saw it.
    Renew,
    /// Release.
    Release,
    /// A protected write through the guard.
    Write,
    /// The holder asked its lease whether it is lost (`lost` holds the answer).
    Check,
    /// The lost signal fired.
    Lost,
    /// A fault injected by the harness (`fault` holds the kind).
    Fault,
    /// An inspection of the store by the harness.
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

/// The kinds of fault the injector records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// `SIGSTOP` to a worker incarnation (`key`): frozen until its `Sigcont`.
    Sigstop,
    /// `SIGCONT` to a worker incarnation.
    Sigcont,
    /// `kill -9` of a worker incarnation during the run.
    Kill9,
    /// The harness kills every worker at the end of the run (not a fault under test).
    EndKill,
    /// The store is killed and started again (`key` `store`); it is back at `StoreBack`.
    RestartStore,
    /// The restarted store answers again.
    StoreBack,
    /// A slot's proxy (`key` the slot) delays every chunk.
    ProxyDelay,
    /// A slot's proxy forwards requests and drops the replies.
    ProxyDropReplies,
    /// A slot's proxy swallows everything.
    ProxyBlackhole,
    /// A slot's proxy resets every connection.
    ProxyReset,
    /// A slot's proxy passes everything again (its connections are reset).
    ProxyPass,
}

impl FaultKind {
    /// The kebab-case name (as in the JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sigstop => "sigstop",
            Self::Sigcont => "sigcont",
            Self::Kill9 => "kill9",
            Self::EndKill => "end-kill",
            Self::RestartStore => "restart-store",
            Self::StoreBack => "store-back",
            Self::ProxyDelay => "proxy-delay",
            Self::ProxyDropReplies => "proxy-drop-replies",
            Self::ProxyBlackhole => "proxy-blackhole",
            Self::ProxyReset => "proxy-reset",
            Self::ProxyPass => "proxy-pass",
        }
    }

    /// Whether this kind puts a slot's proxy into a fault mode.
    pub fn is_proxy_fault(self) -> bool {
        matches!(
            self,
            Self::ProxyDelay | Self::ProxyDropReplies | Self::ProxyBlackhole | Self::ProxyReset
        )
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Event {
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub t: u64,
    /// Worker incarnation (`w2#0`), or `"injector"`, `"harness"`.
    pub worker: String,
    /// The operation.
    pub op: Option<Op>,
    /// Its phase.
    pub phase: Option<Phase>,
    /// The lease key or protected resource (in semaphore mode the permit's slot key,
    /// `NAME#<i>`, except for an acquire's `invoke` and `fail`, which name the semaphore:
    /// no slot is known yet); for a fault, its target (a worker incarnation, a slot's
    /// path, or `store`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Owner token (hex).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// Fence of the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// Requested TTL in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The holder's validity deadline (monotonic ns) after this acquire or accepted
    /// renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<u64>,
    /// Renewal events: the validity left, as the client computed it at the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_ns: Option<u64>,
    /// Check and write invoke: the holder's `is_lost()` answer. Renewal events: whether
    /// the lost signal had fired before the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<bool>,
    /// Write: the commit sequence number from the guard's audit table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Fault events: the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultKind>,
    /// A `restart-store` that kills one member of a cluster (an etcd cluster, a
    /// ZooKeeper ensemble): which role that member had. `None`: a single server, or a
    /// fail-over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<MemberRole>,
    /// Free text: lost reason, renewal outcome, error, why a fault was injected.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The role of the cluster member a `restart-store` kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemberRole {
    /// The leader: the member elected after it gives every lease a fresh TTL (etcd) or
    /// every session a fresh timeout (ZooKeeper).
    Leader,
    /// A follower: no leader changes, nothing is renewed.
    Follower,
}

/// The slot of a worker incarnation: `w2` for `w2#1`.
pub fn slot_of(incarnation: &str) -> &str {
    incarnation.split('#').next().unwrap_or(incarnation)
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
