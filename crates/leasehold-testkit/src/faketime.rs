//! [`FakeWallClock`]: steps the wall clock of *one* process with libfaketime (Debian
//! package `faketime`), never the host's.
//!
//! The process is started with libfaketime preloaded and `DONT_FAKE_MONOTONIC=1`, so only
//! `CLOCK_REALTIME` (what `SystemTime::now` reads) moves: `CLOCK_MONOTONIC` and
//! `CLOCK_BOOTTIME` stay the host's. The offset is read from a file that
//! [`set`](FakeWallClock::set) rewrites; the process sees a change within
//! [`FakeWallClock::PICKUP`] (libfaketime caches it for a second).
//!
//! A program linked with jemalloc (Debian's `redis-server`) deadlocks before `main` under
//! plain [`apply`](FakeWallClock::apply): run it with
//! [`apply_with_glibc_malloc`](FakeWallClock::apply_with_glibc_malloc), which says why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where Debian and others install the preload library.
const CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The libfaketime preload library, if installed.
pub fn faketime_library() -> Option<PathBuf> {
    let arch_dirs = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join("faketime/libfaketime.so.1"));
    CANDIDATES
        .iter()
        .map(PathBuf::from)
        .chain(arch_dirs)
        .find(|p| p.is_file())
}

/// The wall-clock offset of the processes started through [`apply`](Self::apply).
#[derive(Debug)]
pub struct FakeWallClock {
    dir: tempfile::TempDir,
    library: PathBuf,
}

impl FakeWallClock {
    /// How long after [`set`](Self::set) a process may still see the previous offset.
    pub const PICKUP: Duration = Duration::from_secs(2);

    /// A clock at offset `+0`.
    ///
    /// # Panics
    /// "libfaketime not found: install package faketime" when the library is missing.
    pub fn new() -> Self {
        let library = faketime_library().expect("libfaketime not found: install package faketime");
        let dir = tempfile::Builder::new()
            .prefix("leasehold-faketime-")
            .tempdir()
            .expect("temporary directory");
        let clock = Self { dir, library };
        clock.set("+0");
        clock
    }

    fn spec(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// Sets the offset of the wall clock from the real one, in libfaketime's relative
    /// syntax: `+0`, `+1h`, `-2h`, `+90m`, `-30s`.
    pub fn set(&self, offset: &str) {
        assert!(
            offset.starts_with('+') || offset.starts_with('-'),
            "a relative offset such as +1h, not {offset:?}"
        );
        let tmp = self.dir.path().join("offset.tmp");
        std::fs::write(&tmp, format!("{offset}\n")).expect("write the offset");
        std::fs::rename(&tmp, self.spec()).expect("replace the offset");
        if steps(offset) {
            crate::proof::record(crate::proof::Injected::WallClockStepped);
        }
    }

    /// The preload library.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// Makes `cmd` run under this clock: only its wall clock is offset.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_PRELOAD", &self.library)
            .env("FAKETIME_TIMESTAMP_FILE", self.spec())
            .env("FAKETIME_CACHE_DURATION", "1")
            .env("DONT_FAKE_MONOTONIC", "1")
            .env_remove("FAKETIME");
    }

    /// [`apply`](Self::apply) for a program linked with jemalloc, such as Debian's
    /// `redis-server`: glibc is preloaded after libfaketime, so that glibc's `malloc`
    /// serves the program instead of jemalloc's.
    ///
    /// Why: libfaketime 0.9.10 initialises itself at the first clock read, and its
    /// initialisation looks up symbols that glibc 2.34 and later no longer export
    /// (`__ftime`); each failed lookup allocates its error message. jemalloc reads the
    /// clock while it initialises, through libfaketime, so the lookup's allocation enters
    /// jemalloc's initialisation again and the process deadlocks on jemalloc's own lock
    /// before `main` (seen with `gdb`: jemalloc init → `clock_gettime` → libfaketime init
    /// → `dlsym` → `malloc` → jemalloc init). `FAKETIME_NO_CACHE`, `DONT_FAKE_MONOTONIC`,
    /// `FAKETIME` in the environment, `libfaketimeMT`, preloading jemalloc first and
    /// `--jemalloc-bg-thread no` change nothing. With glibc preloaded after libfaketime,
    /// the lookup order finds glibc's `malloc` before the program's jemalloc, so
    /// libfaketime's initialisation never enters jemalloc; jemalloc stays linked (its
    /// statistics calls still answer) but allocates nothing. A test of the program's
    /// clock does not depend on its allocator.
    pub fn apply_with_glibc_malloc(&self, cmd: &mut Command) {
        self.apply(cmd);
        let mut preload = self.library.as_os_str().to_owned();
        preload.push(" libc.so.6");
        cmd.env("LD_PRELOAD", preload);
    }
}

/// Whether a relative offset (`+1h`, `-30s`, `+0`) moves the clock: a non-zero number.
fn steps(offset: &str) -> bool {
    let digits: String = offset[1..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse::<f64>().is_ok_and(|n| n != 0.0)
}

impl Default for FakeWallClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_non_zero_offset_steps_the_clock() {
        for o in ["+1h", "-1h", "+30d", "-30s", "+0.5s", "+90m"] {
            assert!(super::steps(o), "{o}");
        }
        for o in ["+0", "-0", "+0s", "+0.0h", "+"] {
            assert!(!super::steps(o), "{o}");
        }
    }
}
