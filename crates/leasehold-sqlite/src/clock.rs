//! The host clock that SQLite leases expire on (docs/design.md §3.2, "Expiry runs on the store's clock").
//!
//! A SQLite lease file is shared by the processes of one host, so the store can use a
//! host-wide clock that never jumps and counts suspended time: `CLOCK_BOOTTIME`, the clock
//! the holder's own deadline runs on (`leasehold_core::clock`). It restarts at zero on every
//! boot, so each expiry is tagged with the boot id (`/proc/sys/kernel/random/boot_id`): an
//! expiry written under another boot has passed.
//!
//! The wall clock decides no expiry. It is the lower bound of new fences
//! ([`HostClock::wall_clock_us`]): the only host clock that keeps growing across reboots.
//!
//! | platform | expiry clock |
//! | --- | --- |
//! | Linux, Android | `CLOCK_BOOTTIME` µs + the boot id |
//! | other | the wall clock, tagged `wall-clock` (steps of the wall clock shift expiries) |
//!
//! Every process sharing a file must read the same `CLOCK_BOOTTIME`: processes of one host
//! in one time namespace. A container with a time namespace of its own (`unshare --time`,
//! some container runtimes) may see `CLOCK_BOOTTIME` with another offset while reading the
//! same boot id: sharing a lease file with it is **not supported**.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{StoreError, StoreErrorKind};

use crate::BACKEND;

/// A reading of the host clock: which boot, and how far into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTime {
    /// Identifies the boot of the host (on Linux the kernel's random boot id, a UUID).
    /// Expiries recorded under another boot id have passed.
    pub boot_id: String,
    /// `CLOCK_BOOTTIME` (time since boot, suspended time included) in microseconds.
    pub boottime_us: i64,
}

/// The clock a [`SqliteStore`](crate::SqliteStore) reads while it holds the database's
/// write lock. The default is [`SystemHostClock`]; tests inject a [`ManualHostClock`]
/// through [`SqliteConfig::clock`](crate::SqliteConfig::clock).
///
/// Every process that shares a lease file must use clocks that agree (the same boot ids
/// and the same `boottime_us` at the same instant).
pub trait HostClock: Send + Sync + fmt::Debug + 'static {
    /// Now. `boottime_us` must never decrease while `boot_id` stays the same.
    ///
    /// # Errors
    /// A [`StoreError`] when the clock cannot be read (the store's operation fails).
    fn now(&self) -> Result<HostTime, StoreError>;

    /// The wall clock in microseconds since the Unix epoch. Never used for expiry: it is
    /// the lower bound of new fences (`max(last + 1, wall clock)`), which keeps them above
    /// every earlier fence after a reboot that lost the last commits (`synchronous=normal`)
    /// unless the wall clock moved back by more than the outage, and it converts the
    /// expiries of the old file format, which were on the wall clock.
    fn wall_clock_us(&self) -> i64 {
        wall_us()
    }
}

/// The host's wall clock in microseconds since the Unix epoch (0 before 1970). Only for
/// fence floors, informational timestamps, converting leases of the old file format
/// (whose expiries are on this clock) and, off Linux/Android, the documented fallback.
pub(crate) fn wall_us() -> i64 {
    #[allow(clippy::disallowed_methods)] // fence floor and timestamps (expiry: off Linux only)
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn clock_error(msg: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, BACKEND, msg)
}

/// The host's clock: `CLOCK_BOOTTIME` and the kernel's boot id on Linux and Android; the
/// wall clock elsewhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemHostClock;

#[cfg(any(target_os = "linux", target_os = "android"))]
impl HostClock for SystemHostClock {
    fn now(&self) -> Result<HostTime, StoreError> {
        let boot_id = boot_id()?;
        // The core's reading, so that a host suspend a test injects there
        // (`leasehold_core::clock::suspend_host`) moves the store's expiry clock too.
        let t = leasehold_core::clock::boottime()
            .ok_or_else(|| clock_error("cannot read CLOCK_BOOTTIME"))?;
        let us = i64::try_from(t.as_micros()).unwrap_or(i64::MAX);
        Ok(HostTime {
            boot_id,
            boottime_us: us,
        })
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
impl HostClock for SystemHostClock {
    fn now(&self) -> Result<HostTime, StoreError> {
        Ok(HostTime {
            boot_id: "wall-clock".to_owned(),
            boottime_us: wall_us(),
        })
    }
}

/// The kernel's boot id, read once per process (it cannot change under a running process).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_id() -> Result<String, StoreError> {
    const PATH: &str = "/proc/sys/kernel/random/boot_id";
    static BOOT_ID: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            let raw =
                std::fs::read_to_string(PATH).map_err(|e| format!("cannot read {PATH}: {e}"))?;
            let id = raw.trim();
            if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_graphic()) {
                return Err(format!("{PATH} holds no boot id: {id:?}"));
            }
            Ok(id.to_owned())
        })
        .clone()
        .map_err(clock_error)
}

/// A clock for tests: time only moves when told to.
///
/// It starts at boot `manual-boot-0`, `CLOCK_BOOTTIME` 1 s, wall clock 2023-11-14.
/// [`advance`](Self::advance) lets time pass (both clocks), [`step_wall`](Self::step_wall)
/// steps the wall clock alone (NTP, an operator), [`reboot`](Self::reboot) starts a new
/// boot.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// use leasehold_sqlite::{HostClock, ManualHostClock, SqliteConfig};
/// let clock = Arc::new(ManualHostClock::new());
/// let config = SqliteConfig::new("/tmp/leases.db").clock(clock.clone());
/// let t0 = clock.now()?;
/// clock.step_wall(-3600 * 1_000_000);
/// assert_eq!(clock.now()?, t0); // a wall-clock step is not an expiry-clock step
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now()?.boottime_us, t0.boottime_us + 5_000_000);
/// # Ok::<(), leasehold_core::StoreError>(())
/// ```
#[derive(Debug)]
pub struct ManualHostClock {
    state: Mutex<Manual>,
}

#[derive(Debug, Clone)]
struct Manual {
    boot: u64,
    boottime_us: i64,
    wall_us: i64,
}

impl Default for ManualHostClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualHostClock {
    /// A clock at boot `manual-boot-0`, 1 s after boot.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(Manual {
                boot: 0,
                boottime_us: 1_000_000,
                wall_us: 1_700_000_000_000_000,
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Manual) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Time passes: both clocks move forward by `d`.
    pub fn advance(&self, d: Duration) {
        let us = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        self.with(|s| {
            s.boottime_us = s.boottime_us.saturating_add(us);
            s.wall_us = s.wall_us.saturating_add(us);
        });
    }

    /// The wall clock alone is stepped by `us` microseconds (negative: backwards).
    pub fn step_wall(&self, us: i64) {
        self.with(|s| s.wall_us = s.wall_us.saturating_add(us));
    }

    /// The host reboots: a new boot id, `CLOCK_BOOTTIME` starts again at 1 s. The wall
    /// clock goes on.
    pub fn reboot(&self) {
        self.with(|s| {
            s.boot += 1;
            s.boottime_us = 1_000_000;
        });
    }
}

impl HostClock for ManualHostClock {
    fn now(&self) -> Result<HostTime, StoreError> {
        Ok(self.with(|s| HostTime {
            boot_id: format!("manual-boot-{}", s.boot),
            boottime_us: s.boottime_us,
        }))
    }

    fn wall_clock_us(&self) -> i64 {
        self.with(|s| s.wall_us)
    }
}

/// A clock held by a configuration: equal when it is the same clock.
#[derive(Clone)]
pub(crate) struct ClockHandle(pub(crate) Arc<dyn HostClock>);

impl fmt::Debug for ClockHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for ClockHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ClockHandle {}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn the_system_clock_is_boottime_with_the_kernels_boot_id() {
        let a = SystemHostClock.now().unwrap();
        let b = SystemHostClock.now().unwrap();
        assert_eq!(a.boot_id, b.boot_id);
        assert_eq!(a.boot_id.len(), 36, "a UUID: {}", a.boot_id);
        assert!(b.boottime_us >= a.boottime_us);
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
        let boot = i64::try_from(Duration::from(t).as_micros()).unwrap();
        assert!(boot >= b.boottime_us && boot - b.boottime_us < 60_000_000);
        // Far below the wall clock in µs: the two are never confused.
        assert!(a.boottime_us < SystemHostClock.wall_clock_us() / 1000);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualHostClock::new();
        let t0 = c.now().unwrap();
        let w0 = c.wall_clock_us();
        c.step_wall(3_600_000_000);
        assert_eq!(c.now().unwrap(), t0);
        assert_eq!(c.wall_clock_us(), w0 + 3_600_000_000);
        c.advance(Duration::from_millis(1500));
        assert_eq!(c.now().unwrap().boottime_us, t0.boottime_us + 1_500_000);
        c.reboot();
        let t1 = c.now().unwrap();
        assert_ne!(t1.boot_id, t0.boot_id);
        assert_eq!(t1.boottime_us, 1_000_000);
        assert_eq!(c.wall_clock_us(), w0 + 3_601_500_000);
    }
}
