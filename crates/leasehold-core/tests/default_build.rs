//! Issue 25.4: no public item in a default build can make a store lie. The test hooks
//! (`FaultStore` and its types, `Forward`, `MemoryStore::forget` and `forget_record`) are
//! compiled only with the `test-util` feature, in the core and so in the facade, which
//! re-exports the core.
//!
//! This cannot be shown from inside the workspace: its crates' dev-dependencies turn
//! `test-util` on, and cargo unifies features, so every test binary and doctest here is
//! built with the hooks. So the test builds a crate of its own, outside the workspace,
//! that depends on `leasehold-core` and `leasehold` the way a user does (default
//! features), with `cargo check`: it must fail on exactly the hooks, and the same crate
//! with `test-util` on must build (so the failure is the feature's, not a broken probe).
//! It runs cargo offline, with the workspace's lock file, in a target directory of its
//! own under the workspace's `target/tmp` (the first run checks the core's dependencies:
//! tens of seconds; later runs reuse them).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The probe's source: each item below exists only with `test-util`.
const PROBE: &str = r#"
pub use leasehold_core::wrap::{FaultStore, Forward, Injection, Op, Swallowed, Unreachable};
pub use leasehold::wrap::FaultStore as FacadeFaultStore;

pub fn forget(store: &leasehold_core::memory::MemoryStore, key: &leasehold_core::Key) {
    store.forget(key);
    store.forget_record(key);
}
"#;

/// What a default build must refuse, each as the compiler names it.
const REFUSED: &[&str] = &[
    "`leasehold_core::wrap::FaultStore`",
    "`leasehold_core::wrap::Forward`",
    "`leasehold_core::wrap::Injection`",
    "`leasehold_core::wrap::Op`",
    "`leasehold_core::wrap::Swallowed`",
    "`leasehold_core::wrap::Unreachable`",
    "`leasehold::wrap::FaultStore`",
    "no method named `forget` found",
    "no method named `forget_record` found",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

/// Writes the probe crate under `dir` and returns its manifest.
fn write_probe(dir: &Path, root: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let path = |krate: &str| root.join("crates").join(krate).display().to_string();
    let manifest = format!(
        r#"[package]
name = "default-build-probe"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
leasehold-core = {{ path = {core:?} }}
leasehold = {{ path = {facade:?} }}

# Not a member of the leasehold workspace.
[workspace]
"#,
        core = path("leasehold-core"),
        facade = path("leasehold"),
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("src/lib.rs"), PROBE).unwrap();
    // The workspace's versions, so that nothing needs fetching.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    dir.join("Cargo.toml")
}

fn check(manifest: &Path, target: &Path, features: &[&str]) -> Output {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("check")
        .arg("--offline")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("CARGO_BUILD_TARGET_DIR");
    for f in features {
        cmd.arg("--features").arg(f);
    }
    cmd.output().expect("run cargo")
}

#[test]
fn a_default_build_has_no_test_hooks() {
    let root = workspace();
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("default-build-probe");
    let manifest = write_probe(&base.join("crate"), &root);
    let target = base.join("target");

    let default = check(&manifest, &target, &[]);
    let stderr = String::from_utf8_lossy(&default.stderr);
    assert!(
        !default.status.success(),
        "a default build compiled the test hooks:\n{stderr}"
    );
    let missing: Vec<&&str> = REFUSED.iter().filter(|r| !stderr.contains(**r)).collect();
    assert!(
        missing.is_empty(),
        "a default build must refuse each test hook; not refused (or the probe failed for another reason): {missing:?}\n{stderr}"
    );

    // The control: with the feature on, the same probe builds.
    let with = check(&manifest, &target, &["leasehold-core/test-util"]);
    assert!(
        with.status.success(),
        "the probe does not build even with test-util:\n{}",
        String::from_utf8_lossy(&with.stderr)
    );
}
