//! Compiles the examples of the repository's `README.md` as doctests
//! (`cargo test -p leasehold-readme --doc`), so the README cannot drift from the API.
//! Not a library; never published.
#![forbid(unsafe_code)]

#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct Readme;
