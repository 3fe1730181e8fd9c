//! Exit codes. The child's own status passes through; leasehold's own outcomes use codes
//! from `sysexits.h`, as `flock(1)` does, so they do not collide with common child codes.

/// Bad flags, a bad URL or a bad duration (`flock` uses 64 too).
pub const USAGE: u8 = 64;
/// The store failed (unreachable, authentication, permissions, corrupt data).
pub const STORE: u8 = 69;
/// The lease was lost while the command ran; the command was stopped.
pub const LEASE_LOST: u8 = 70;
/// The command ran to its end, but `run` saw its end only after the lease's validity
/// deadline had passed (or the lease was lost): it cannot vouch that the command ran under
/// the lease to the end. Check the work. (`EX_OSERR` in `sysexits.h`; here the second of
/// the lease-loss statuses.)
pub const COMPLETED_AFTER_LOSS: u8 = 71;
/// The lease was lost (or about to be, with less than `--grace` left) before the command
/// could be started: it was not started. (`EX_OSFILE` in `sysexits.h`; here the third of
/// the lease-loss statuses.)
pub const LOST_BEFORE_START: u8 = 72;
/// `install-completions`: a file or directory could not be created (`EX_CANTCREAT`).
pub const CANNOT_CREATE: u8 = 73;
/// `man`, `completions`: standard output could not be written (`EX_IOERR`).
pub const IO_ERROR: u8 = 74;
/// The lease was not acquired: held by another owner past `--wait`, or at once with
/// `--no-wait`. `--conflict-exit-code` changes it (like `flock -E`).
pub const NOT_ACQUIRED: u8 = 75;
/// `doctor --require`: a row it asks for does not hold for this deployment
/// (`EX_CONFIG`: the store's configuration does not give it).
pub const NOT_HOLDING: u8 = 78;
/// The command could not be started (not found, not executable).
pub const CANNOT_EXECUTE: u8 = 126;
