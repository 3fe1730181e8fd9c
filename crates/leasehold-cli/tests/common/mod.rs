#![allow(dead_code)] // each test file that includes this module uses a different part of it
//! What the `leasehold` command's test files share: the built binary and a private
//! environment per test (its own state and data directories, no store or log settings
//! inherited from the caller).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

    /// A `leasehold` command whose default store lives in this test's directory.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("XDG_STATE_HOME", self.dir.path())
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env_remove("LEASEHOLD_STORE")
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE");
        c
    }

    /// Runs `leasehold ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}
