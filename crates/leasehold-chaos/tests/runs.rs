//! Bounded chaos runs (FAULTS "History checker"): with the guard the checker finds no
//! violation on either store; the control run without the guard must make it fail.
//! Long soaks: `cargo run -p leasehold-chaos -- run --duration 30m`.

use std::path::PathBuf;
use std::process::Command;

fn run(name: &str, args: &[&str]) -> (bool, String) {
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{name}"));
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold-chaos"))
        .arg("run")
        .args(args)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .expect("run leasehold-chaos");
    let text = format!(
        "{}\n{}\n(events and timeline in {})",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        out_dir.display()
    );
    println!("{text}");
    (out.status.success(), text)
}

#[test]
fn redis_store_with_the_guard_has_no_violation() {
    let (ok, text) = run(
        "redis",
        &["--store", "redis", "--duration", "30s", "--seed", "11"],
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("violations                                      0"),
        "{text}"
    );
}

#[test]
fn postgres_store_with_the_guard_has_no_violation() {
    let (ok, text) = run(
        "postgres",
        &["--store", "postgres", "--duration", "30s", "--seed", "12"],
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("violations                                      0"),
        "{text}"
    );
}

#[test]
fn control_run_without_the_guard_is_caught() {
    let (ok, text) = run(
        "control",
        &[
            "--store",
            "redis",
            "--unfenced",
            "--duration",
            "20s",
            "--seed",
            "13",
        ],
    );
    assert!(
        ok,
        "the checker must report a violation without the guard:\n{text}"
    );
    assert!(text.contains("C1") || text.contains("C7"), "{text}");
}
