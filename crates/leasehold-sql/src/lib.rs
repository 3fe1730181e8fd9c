//! # leasehold-sql
//!
//! The layer the sqlx-based stores of leasehold share — [`leasehold-sqlite`],
//! [`leasehold-postgres`] and [`leasehold-mysql`] — written once, generic over
//! [`sqlx::Database`] where it can be:
//!
//! - [`bounded`]: an operation bounded in time, a [`Timeout`] when the bound runs out;
//! - [`Checkout`] and [`with_conn`]: a pooled connection that goes back to the pool only
//!   when the operation using it ran to its end without breaking it (cancelled, timed out
//!   or broken, it is closed);
//! - [`Failure`]: an error inside an operation, from the driver or decided by the store,
//!   and [`ErrorModel`], the hook where each backend puts its own reading of driver
//!   errors (result codes, error numbers, SQLSTATEs stay in the backend);
//! - [`guard`]: the steps the storage-side guards share (fence columns, counting a
//!   rejection, idempotency answers). The guards take a [`ResourceName`], validated once,
//!   and a `&mut sqlx::Transaction`, so a guard call outside a transaction does not
//!   compile.
//!
//! Users depend on `leasehold` (or a backend crate), not on this crate.
//!
//! [`leasehold-sqlite`]: https://docs.rs/leasehold-sqlite
//! [`leasehold-postgres`]: https://docs.rs/leasehold-postgres
//! [`leasehold-mysql`]: https://docs.rs/leasehold-mysql
//! [`Timeout`]: leasehold_core::StoreErrorKind::Timeout
//! [`ResourceName`]: leasehold_core::ResourceName
#![forbid(unsafe_code)]

mod failure;
pub mod guard;
mod pool;

pub use failure::{ErrorModel, Failure, Phase};
pub use pool::{Checkout, bounded, with_conn};
