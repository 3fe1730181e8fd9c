//! Issue 17 item 4: the coupons example (`examples/coupons.rs`), run as users run it.
//!
//! Fenced, exactly ten coupons go out, no request gets two, and the worker frozen
//! (SIGSTOP) past its lease's TTL has its late write rejected by the guard; the run exits
//! 0. `--unfenced`, the same workers overrun the promotion. On SQLite always; on a private
//! PostgreSQL (data, and lease) and Redis (lease only) when the `postgres` and `redis`
//! features are on.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The example binary, built beside this test by `cargo test` / `cargo nextest` (which
/// build a package's examples with its tests).
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = dir.join("examples").join("coupons");
    assert!(
        path.exists(),
        "{} not built: run the tests with cargo test or cargo nextest, which build examples",
        path.display()
    );
    path
}

/// A finished run: whether it exited 0, its output, and its `summary` line's fields.
struct Run {
    success: bool,
    output: String,
    summary: HashMap<String, String>,
}

impl Run {
    fn get(&self, field: &str) -> i64 {
        self.summary
            .get(field)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no `{field}` in the summary:\n{}", self.output))
    }
}

/// Runs the example with `args`, killing it after three minutes.
fn run(args: &[&str]) -> Run {
    let mut child = Command::new(example())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(180) {
            // Its workers die with it (kill_on_drop) once it is gone.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "coupons {args:?} still running after 3 minutes:\n{}",
                out.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = format!(
        "{}\n--- stderr ---\n{}",
        out.join().unwrap(),
        err.join().unwrap()
    );
    let summary = output
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("summary "))
        .unwrap_or_else(|| panic!("no summary line ({status}):\n{output}"))
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Run {
        success: status.success(),
        output,
        summary,
    }
}

/// A fenced run: exit 0, exactly ten coupons, counter in step, no request twice, the
/// frozen worker's late write rejected, and the duplicate deliveries skipped.
fn assert_fenced(run: &Run) {
    assert!(run.success, "{}", run.output);
    assert_eq!(run.summary["mode"], "fenced", "{}", run.output);
    assert_eq!(run.get("issued"), 10, "{}", run.output);
    assert_eq!(run.get("counter"), 10, "{}", run.output);
    assert_eq!(run.get("double_counted"), 0, "{}", run.output);
    assert!(run.get("rejected_stale_writes") >= 1, "{}", run.output);
    assert!(run.get("duplicates") >= 1, "{}", run.output);
    assert!(
        run.output.contains("stale write REJECTED by the guard"),
        "{}",
        run.output
    );
}

/// An unfenced run: the frozen worker's write overruns the promotion.
fn assert_unfenced(run: &Run) {
    assert!(run.success, "{}", run.output);
    assert_eq!(run.summary["mode"], "unfenced", "{}", run.output);
    assert!(run.get("issued") > 10, "{}", run.output);
    assert_eq!(run.get("rejected_stale_writes"), 0, "{}", run.output);
}

#[test]
fn sqlite_fenced_issues_exactly_ten_and_rejects_the_frozen_workers_write() {
    assert_fenced(&run(&[]));
}

#[test]
fn sqlite_unfenced_overruns() {
    assert_unfenced(&run(&["--unfenced"]));
}

#[cfg(all(feature = "postgres", feature = "redis"))]
#[test]
fn postgres_data_with_a_postgres_or_redis_lease() {
    let pg = leasehold_testkit::Postgres::start();
    let redis = leasehold_testkit::RedisServer::start();
    let data = pg.url();
    let pg_lease = format!("{}?leasehold_migrate=true", pg.url());
    let redis_lease = redis.url();
    // Runs share the database; each uses its own promotion, guard row and records.
    assert_fenced(&run(&["--lease-url", &pg_lease, "--data-url", &data]));
    assert_fenced(&run(&["--lease-url", &redis_lease, "--data-url", &data]));
    assert_unfenced(&run(&["--unfenced", "--data-url", &data]));
}
