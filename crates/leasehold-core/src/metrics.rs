//! Metric names (docs/design.md §7) and the helpers that record them through the `metrics` facade.
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
//! | `leasehold_renewal_slack_seconds` | histogram | (validity left — old deadline − now — when a renewal is confirmed) |
//! | `leasehold_lease_lost_total` | counter | `reason` (see [`LostReason::as_str`]; a [shutdown](crate::LeaseClient::shutdown) is not a loss and is not counted) |
//! | `leasehold_fence_rejected_total` | counter | (recorded by the guards; `resource_type` only) |
//! | `leasehold_leases_at_risk` | gauge | (leases of this process at risk now: a renewal failed, none confirmed since, deadline not passed) |
//! | `leasehold_at_risk_total` | counter | (at-risk spells begun: counted even when shorter than a scrape interval) |
//!
//! **Renewal slack** is how much validity the lease still had when the store's
//! confirmation of a renewal arrived: how close the holder came to losing it. With the
//! defaults (renew every TTL/3, 1 % drift) a healthy lease is confirmed with about
//! two thirds of its TTL left, minus the renewal's latency; a failed renewal retried after
//! a quarter of the renew interval costs a twelfth of the TTL more. Slack near zero means
//! the store's latency (or failed attempts) is eating the validity window.
//!
//! [`ALL`] lists every name, and [`SECONDS_BUCKETS`] is a bucket layout for the
//! histograms for exporters that need one (the `leasehold` command uses it), so that
//! dashboards can aggregate quantiles across processes.

use std::time::Duration;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

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
/// `leasehold_renewal_slack_seconds`
pub const RENEWAL_SLACK: &str = "leasehold_renewal_slack_seconds";
/// `leasehold_lease_lost_total`
pub const LEASE_LOST_TOTAL: &str = "leasehold_lease_lost_total";
/// `leasehold_fence_rejected_total`
pub const FENCE_REJECTED_TOTAL: &str = "leasehold_fence_rejected_total";

/// `leasehold_leases_at_risk`
pub const LEASES_AT_RISK: &str = "leasehold_leases_at_risk";
/// `leasehold_at_risk_total`
pub const AT_RISK_TOTAL: &str = "leasehold_at_risk_total";

/// Every metric the core and the guards record, with its kind.
pub const ALL: &[(&str, Kind)] = &[
    (ACQUIRE_TOTAL, Kind::Counter),
    (ACQUIRE_DURATION, Kind::Histogram),
    (CONTENTION_TOTAL, Kind::Counter),
    (HOLD_DURATION, Kind::Histogram),
    (RENEW_TOTAL, Kind::Counter),
    (RENEW_LATENCY, Kind::Histogram),
    (RENEWAL_SLACK, Kind::Histogram),
    (LEASE_LOST_TOTAL, Kind::Counter),
    (FENCE_REJECTED_TOTAL, Kind::Counter),
    (LEASES_AT_RISK, Kind::Gauge),
    (AT_RISK_TOTAL, Kind::Counter),
];

/// The kind of a metric in [`ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic counter (`_total`).
    Counter,
    /// A histogram of seconds (exported as `_bucket`, `_sum`, `_count`, or as a summary).
    Histogram,
    /// A gauge: a count now, which goes up and down.
    Gauge,
}

/// Histogram buckets, in seconds, for every leasehold histogram: 1 ms to a day, about
/// 2.5× apart, so that latencies, slack and hold times of TTLs from 10 ms to 24 h all
/// fall in useful buckets. Give them to an exporter that renders histograms with
/// buckets (e.g. `metrics-exporter-prometheus`'s `set_buckets`).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0,
    150.0, 300.0, 900.0, 1800.0, 3600.0, 10800.0, 28800.0, 86400.0,
];

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
    describe_histogram!(
        RENEWAL_SLACK,
        Unit::Seconds,
        "Validity a lease had left (old deadline minus now) when a renewal was confirmed."
    );
    describe_counter!(
        LEASE_LOST_TOTAL,
        "Leases lost, by reason (a shutdown is not counted)."
    );
    describe_gauge!(
        LEASES_AT_RISK,
        "Leases at risk now: a renewal failed and none was confirmed since."
    );
    describe_counter!(
        AT_RISK_TOTAL,
        "At-risk spells begun: the first failed renewal of a lease not lost for it."
    );
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

pub(crate) fn renewed(
    backend: &'static str,
    rt: &str,
    result: &'static str,
    leases: u64,
    latency: Duration,
) {
    counter!(RENEW_TOTAL, "backend" => backend, "resource_type" => rt.to_owned(), "result" => result)
        .increment(leases);
    histogram!(RENEW_LATENCY, "backend" => backend, "resource_type" => rt.to_owned())
        .record(latency.as_secs_f64());
}

/// A renewal confirmed with `slack` of validity left on the old deadline.
pub(crate) fn renewal_slack(backend: &'static str, rt: &str, slack: Duration) {
    histogram!(RENEWAL_SLACK, "backend" => backend, "resource_type" => rt.to_owned())
        .record(slack.as_secs_f64());
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

/// A lease's at-risk spell began (its first failed renewal of the spell).
pub(crate) fn at_risk_began(backend: &'static str, rt: &str) {
    let rt = rt.to_owned();
    counter!(AT_RISK_TOTAL, "backend" => backend, "resource_type" => rt.clone()).increment(1);
    gauge!(LEASES_AT_RISK, "backend" => backend, "resource_type" => rt).increment(1.0);
}

/// A lease's at-risk spell ended (a renewal confirmed, or the lease lost, released or
/// dropped).
pub(crate) fn at_risk_ended(backend: &'static str, rt: &str) {
    gauge!(LEASES_AT_RISK, "backend" => backend, "resource_type" => rt.to_owned()).decrement(1.0);
}

/// Records a write rejected by a guard because its fence was below the highest accepted.
/// For guard implementations (the database crates).
pub fn fence_rejected(resource_type: &str) {
    counter!(FENCE_REJECTED_TOTAL, "resource_type" => resource_type.to_owned()).increment(1);
}
