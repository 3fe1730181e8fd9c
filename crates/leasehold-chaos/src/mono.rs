//! `CLOCK_MONOTONIC` timestamps, comparable between the processes of one host.

use nix::time::{ClockId, clock_gettime};

/// Now, in `CLOCK_MONOTONIC` nanoseconds.
pub fn mono_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always there");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// A tokio instant (which counts on `CLOCK_MONOTONIC` on Linux) as monotonic nanoseconds.
pub fn instant_ns(t: tokio::time::Instant) -> u64 {
    let now = tokio::time::Instant::now();
    let base = mono_ns();
    if t >= now {
        base + (t - now).as_nanos() as u64
    } else {
        base.saturating_sub((now - t).as_nanos() as u64)
    }
}
