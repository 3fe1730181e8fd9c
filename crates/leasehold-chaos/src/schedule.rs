//! The fault schedule: every fault's kind, target and offset, drawn from the seed alone
//! before the run starts. The same seed gives the same schedule; the run records it.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Which faults a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultSet {
    /// No fault at all: no lost signal and no rejected write may show up.
    None,
    /// Only the scripted stale write (the control runs).
    StaleWrite,
    /// The scripted stale write and every other kind, at least once each.
    All,
    /// One kill of the holder at 1.5×TTL, nothing else (a broken part's control run).
    #[value(hide = true)]
    Kill,
}

/// A kind of planned fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanKind {
    /// Freeze the next worker that prepares a write (target `next-writer`: whichever
    /// holds the lease then) between its validity check and its write, keep it frozen
    /// until another holder's write with a higher fence is acknowledged, then wake it: its
    /// write is the stale write the guard must reject (and, without the guard, the one
    /// the checker must flag).
    StaleWrite,
    /// `SIGSTOP` the target slot's worker for `hold`, wherever it is.
    Sigstop,
    /// `kill -9` the lease holder's worker and start a new incarnation.
    Kill9,
    /// Kill the store and start it again at once.
    RestartStore,
    /// The target slot's proxy delays every chunk by 0.4×TTL for `hold`.
    ProxyDelay,
    /// The target slot's proxy drops every reply for `hold`.
    ProxyDropReplies,
    /// The target slot's proxy swallows everything for `hold`.
    ProxyBlackhole,
    /// The target slot's proxy resets every connection for `hold`.
    ProxyReset,
}

impl PlanKind {
    /// Every kind but the scripted stale write.
    pub const RANDOM: [PlanKind; 7] = [
        PlanKind::Sigstop,
        PlanKind::Kill9,
        PlanKind::RestartStore,
        PlanKind::ProxyDelay,
        PlanKind::ProxyDropReplies,
        PlanKind::ProxyBlackhole,
        PlanKind::ProxyReset,
    ];

    /// The kebab-case name (as in the JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StaleWrite => "stale-write",
            Self::Sigstop => "sigstop",
            Self::Kill9 => "kill9",
            Self::RestartStore => "restart-store",
            Self::ProxyDelay => "proxy-delay",
            Self::ProxyDropReplies => "proxy-drop-replies",
            Self::ProxyBlackhole => "proxy-blackhole",
            Self::ProxyReset => "proxy-reset",
        }
    }
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFault {
    /// When, from the start of the workload, in ms.
    pub offset_ms: u64,
    /// What.
    pub kind: PlanKind,
    /// On what: a worker slot (`w2`), `holder` (whichever worker holds the lease when it
    /// fires), `store`, or `next-writer` (the stale write).
    pub target: String,
    /// How long it lasts, in ms (0 for instant faults and the stale write, which lasts
    /// until another holder has written).
    pub hold_ms: u64,
}

/// The stale write's target: the next worker to prepare a write.
pub const NEXT_WRITER: &str = "next-writer";

/// A fault's target: the worker that holds the lease when the fault fires.
pub const HOLDER: &str = "holder";

/// The schedule of a run: drawn from `seed` alone.
///
/// The stale write is armed at TTL/2 (its target is whichever worker prepares a write
/// next: the lease holder, which no seed can choose). With [`FaultSet::All`], from 1.5×TTL
/// on, a fault every 0.4–0.9×TTL, the first seven one of each kind in the seed's order
/// (a kill among the first three),
/// then kinds drawn at random, until a TTL before the end (kills stop 2.5×TTL before the
/// end, so a takeover can be seen).
///
/// Targets: a kill always hits the [`HOLDER`] (the worker that holds the lease when the
/// fault fires: a takeover is only seen after a holder dies); a freeze or a proxy fault
/// hits the holder or a fixed slot, as the seed says (a fixed slot when a lasting fault on
/// the holder is still planned then). A fixed slot is one with nothing
/// else planned on it at that time (and half a TTL after); freezes and proxy faults on
/// the holder do not overlap each other. At run time a fault whose target is busy (frozen, its path
/// faulty, or no holder yet) waits until it is free, and the run goes on (bounded) until
/// every planned fault has fired.
pub fn plan(
    seed: u64,
    set: FaultSet,
    workers: usize,
    duration: Duration,
    ttl: Duration,
) -> Vec<PlannedFault> {
    plan_kinds(seed, set, workers, duration, ttl, &PlanKind::RANDOM)
}

/// [`plan`] drawing only from `kinds` (a subset of [`PlanKind::RANDOM`], for a store on
/// which some kinds cannot fire); with every kind it is exactly [`plan`] (the same seed
/// gives the same schedule). An empty `kinds` plans only the stale write.
pub fn plan_kinds(
    seed: u64,
    set: FaultSet,
    workers: usize,
    duration: Duration,
    ttl: Duration,
    kinds: &[PlanKind],
) -> Vec<PlannedFault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ttl_ms = ttl.as_millis() as u64;
    let end = (duration.as_millis() as u64).saturating_sub(ttl_ms);
    let mut out = Vec::new();
    if set == FaultSet::None || workers == 0 {
        return out;
    }
    if set == FaultSet::Kill {
        out.push(PlannedFault {
            offset_ms: ttl_ms * 3 / 2,
            kind: PlanKind::Kill9,
            target: HOLDER.into(),
            hold_ms: 0,
        });
        return out;
    }
    let mut busy = vec![0u64; workers];
    let mut holder_busy = 0u64;
    out.push(PlannedFault {
        offset_ms: ttl_ms / 2,
        kind: PlanKind::StaleWrite,
        target: NEXT_WRITER.into(),
        hold_ms: 0,
    });
    if set == FaultSet::StaleWrite || kinds.is_empty() {
        return out;
    }
    let mut pending = kinds.to_vec();
    pending.shuffle(&mut rng);
    // A kill needs time after it for a takeover: among the first three.
    if let Some(k) = pending.iter().position(|&k| k == PlanKind::Kill9)
        && k >= 3
    {
        pending.swap(k, rng.random_range(0..3));
    }
    let mut t = ttl_ms * 3 / 2;
    while t < end {
        let kind = pending
            .first()
            .copied()
            .unwrap_or_else(|| kinds[rng.random_range(0..kinds.len())]);
        let hold_ms = match kind {
            PlanKind::Sigstop => (ttl_ms as f64 * rng.random_range(0.3..2.5)) as u64,
            PlanKind::ProxyDelay
            | PlanKind::ProxyDropReplies
            | PlanKind::ProxyBlackhole
            | PlanKind::ProxyReset => (ttl_ms as f64 * rng.random_range(0.3..1.5)) as u64,
            _ => 0,
        };
        let step = (ttl_ms as f64 * rng.random_range(0.4..0.9)) as u64;
        let at_holder = kind == PlanKind::Kill9 || rng.random_bool(0.5);
        let target = if kind == PlanKind::RestartStore {
            Some("store".to_owned())
        } else if kind == PlanKind::Kill9 && t + ttl_ms * 5 / 2 > end + ttl_ms {
            None
        } else if kind == PlanKind::Kill9 {
            // Instant: at run time it hits a holder that is not frozen or cut off.
            Some(HOLDER.to_owned())
        } else if at_holder && holder_busy <= t {
            holder_busy = t + hold_ms + ttl_ms / 2;
            Some(HOLDER.to_owned())
        } else {
            // A fixed slot (also when the holder is taken by an earlier fault).
            let free: Vec<usize> = (0..workers).filter(|&i| busy[i] <= t).collect();
            (!free.is_empty()).then(|| {
                let i = free[rng.random_range(0..free.len())];
                busy[i] = t + hold_ms + ttl_ms / 2;
                format!("w{}", i + 1)
            })
        };
        if let Some(target) = target {
            out.push(PlannedFault {
                offset_ms: t,
                kind,
                target,
                hold_ms,
            });
            if !pending.is_empty() {
                pending.remove(0);
            }
        } else if !pending.is_empty() {
            // No target for it now: the next pending kind goes first next time.
            pending.rotate_left(1);
        }
        t += step;
    }
    out
}
