#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod failure;
pub mod guard;
mod pool;

pub use failure::{ErrorModel, Failure, Phase};
pub use pool::{Checkout, bounded, with_conn};
