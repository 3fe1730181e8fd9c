#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod failure;
pub mod guard;
pub mod lease;
mod pool;
mod presence;
pub mod record;
pub mod server_watch;
pub mod tls;
pub mod wait;

pub use failure::{ErrorModel, Failure, Phase};
pub use pool::{Checkout, with_conn};

/// The longest `older_than` the stores' `prune` passes to the database, in µs (ten years):
/// a longer one is cut to it, so that the server's date arithmetic cannot overflow.
pub fn prune_age_us(older_than: std::time::Duration) -> i64 {
    const MAX: i64 = 10 * 365 * 24 * 3600 * 1_000_000;
    i64::try_from(older_than.as_micros()).map_or(MAX, |us| us.min(MAX))
}
