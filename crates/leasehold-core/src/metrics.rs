//! Metric names (DESIGN §7) and the helpers that record them through the `metrics` facade.
//!
//! Every metric carries the labels `backend` and `resource_type` (the part of the key
//! before its first `:`), plus the label in the table below. A full key is never a label.
//!
//! | metric | kind | label |
//! | --- | --- | --- |
//! | `leasehold_acquire_total` | counter | `result`: acquired, contended, timeout, error |
//! | `leasehold_acquire_duration_seconds` | histogram | `result` |
//! | `leasehold_contention_total` | counter | |
//! | `leasehold_hold_duration_seconds` | histogram | `end`: released, lost, shutdown, abandoned |
//! | `leasehold_renew_total` | counter | `result`: renewed, not_owner, error |
//! | `leasehold_renew_latency_seconds` | histogram | |
//! | `leasehold_lease_lost_total` | counter | `reason` (see [`LostReason::as_str`]; a [shutdown](crate::LeaseClient::shutdown) is not a loss and is not counted) |
//! | `leasehold_fence_rejected_total` | counter | (recorded by the guards; `resource_type` only) |

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};

use crate::lease::LostReason;

/// `leasehold_acquire_total`
pub const ACQUIRE_TOTAL: &str = "leasehold_acquire_total";
/// `leasehold_acquire_duration_seconds`
pub const ACQUIRE_DURATION: &str = "leasehold_acquire_duration_seconds";
/// `leasehold_contention_total`
pub const CONTENTION_TOTAL: &str = "leasehold_contention_total";
/// `leasehold_hold_duration_seconds`
pub const HOLD_DURATION: &str = "leasehold_hold_duration_seconds";
/// `leasehold_renew_total`
pub const RENEW_TOTAL: &str = "leasehold_renew_total";
/// `leasehold_renew_latency_seconds`
pub const RENEW_LATENCY: &str = "leasehold_renew_latency_seconds";
/// `leasehold_lease_lost_total`
pub const LEASE_LOST_TOTAL: &str = "leasehold_lease_lost_total";
/// `leasehold_fence_rejected_total`
pub const FENCE_REJECTED_TOTAL: &str = "leasehold_fence_rejected_total";

/// Registers descriptions and units of every metric with the installed recorder. Call once
/// after installing a recorder (the CLI does).
pub fn describe() {
    describe_counter!(ACQUIRE_TOTAL, "Acquisition calls by result.");
    describe_histogram!(
        ACQUIRE_DURATION,
        Unit::Seconds,
        "Duration of acquisition calls, waiting included."
    );
    describe_counter!(
        CONTENTION_TOTAL,
        "Acquire attempts that found the lease held by another owner."
    );
    describe_histogram!(
        HOLD_DURATION,
        Unit::Seconds,
        "How long leases were held, by how they ended."
    );
    describe_counter!(RENEW_TOTAL, "Renewals by result.");
    describe_histogram!(
        RENEW_LATENCY,
        Unit::Seconds,
        "Heartbeat latency: time from sending a renewal to its reply."
    );
    describe_counter!(LEASE_LOST_TOTAL, "Leases lost, by reason.");
    describe_counter!(
        FENCE_REJECTED_TOTAL,
        "Writes rejected by a guard because their fence was stale."
    );
}

pub(crate) fn acquire(backend: &'static str, rt: &str, result: &'static str, took: Duration) {
    let rt = rt.to_owned();
    counter!(ACQUIRE_TOTAL, "backend" => backend, "resource_type" => rt.clone(), "result" => result)
        .increment(1);
    histogram!(ACQUIRE_DURATION, "backend" => backend, "resource_type" => rt, "result" => result)
        .record(took.as_secs_f64());
}

pub(crate) fn contention(backend: &'static str, rt: &str) {
    counter!(CONTENTION_TOTAL, "backend" => backend, "resource_type" => rt.to_owned()).increment(1);
}

pub(crate) fn renewed(backend: &'static str, rt: &str, result: &'static str, latency: Duration) {
    counter!(RENEW_TOTAL, "backend" => backend, "resource_type" => rt.to_owned(), "result" => result)
        .increment(1);
    histogram!(RENEW_LATENCY, "backend" => backend, "resource_type" => rt.to_owned())
        .record(latency.as_secs_f64());
}

/// A hold that ended without a loss: `end` is `released`, `shutdown` or `abandoned`.
pub(crate) fn hold_ended(backend: &'static str, rt: &str, end: &'static str, held: Duration) {
    histogram!(HOLD_DURATION, "backend" => backend, "resource_type" => rt.to_owned(), "end" => end)
        .record(held.as_secs_f64());
}

pub(crate) fn lease_lost(backend: &'static str, rt: &str, reason: LostReason, held: Duration) {
    let rt = rt.to_owned();
    counter!(LEASE_LOST_TOTAL, "backend" => backend, "resource_type" => rt.clone(), "reason" => reason.as_str())
        .increment(1);
    histogram!(HOLD_DURATION, "backend" => backend, "resource_type" => rt, "end" => "lost")
        .record(held.as_secs_f64());
}

/// Records a write rejected by a guard because its fence was below the highest accepted.
/// For guard implementations (the database crates).
pub fn fence_rejected(resource_type: &str) {
    counter!(FENCE_REJECTED_TOTAL, "resource_type" => resource_type.to_owned()).increment(1);
}
