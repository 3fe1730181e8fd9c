//! The checker must be able to fail: every rule of every invariant is fed a history that
//! breaks it, every exemption is probed just inside (passes) and just outside (flagged),
//! and clean histories pass. Each test asserts the exact set of rules flagged, so a rule
//! that fires for the wrong reason fails the test too.
//!
//! One module per invariant (`c1` … `c11`, named as in `src/checker.rs`), `clean` for the
//! histories that must pass, and `history` for the helpers that build histories.

mod history;

mod c1;
mod c10;
mod c11;
mod c2;
mod c3;
mod c4;
mod c5;
mod c6;
mod c7;
mod c8;
mod c9;
mod clean;
