#![allow(dead_code)] // each test file that includes this module uses a different part of it
//! What the `leasehold` command's test files share: the built binary, a private
//! environment per test (its own state and data directories, no store or log settings
//! inherited from the caller), and the small process helpers every file needs.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `leasehold` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A test's own directory: the default (SQLite) store and installed files live there.
pub struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The test's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the test's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `program` with this test's environment: a `leasehold` it starts keeps its default
    /// store in this test's directory.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("XDG_STATE_HOME", self.dir.path())
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env_remove("LEASEHOLD_STORE")
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE");
        c
    }

    /// A `leasehold` command whose default store lives in this test's directory.
    pub fn cmd(&self) -> Command {
        self.command(BIN)
    }

    /// Runs `leasehold ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    /// Runs `leasehold ARGS` to completion and asserts that it succeeded.
    pub fn run_ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        out
    }
}

/// Bytes a process wrote, as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn stdout(o: &Output) -> String {
    text(&o.stdout)
}

pub fn stderr(o: &Output) -> String {
    text(&o.stderr)
}

/// Runs `cmd` to completion with `input` on its standard input (a script for `psql`,
/// `mariadb`, `sqlite3`, `groff`, `promtool`), capturing its output.
pub fn fed(cmd: &mut Command, input: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_program()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The content of `path` once it holds a whole line (a pid, a fence, a status written by
/// a command under test); fails the test after `timeout`.
pub fn wait_for_file(path: &Path, timeout: Duration) -> String {
    let until = Instant::now() + timeout;
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        assert!(Instant::now() < until, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A program the tests cannot do without: a missing one fails the test (never a skip).
pub fn require(program: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap()
        .status
        .success();
    assert!(
        found,
        "{program} is missing: install the Debian package {package} (scripts/test does, as root)"
    );
}
