//! The scheduled-job examples in `ops/` run as processes: the systemd unit's `ExecStart`
//! line and the Kubernetes CronJob's command, each started twice at once against a real
//! PostgreSQL (the store the unit names), as two replicas' timers would. The job runs
//! once; the copy that ran it exits as soon as it is done, leaving the lease in the store
//! for `--hold-at-least`; a third start afterwards (a replica whose clock fired later)
//! does not run it again.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{BIN, Env, stderr, stdout};
use leasehold_testkit::{Postgres, PostgresOptions, WorkerProcess};

const PASSWORD: &str = "unit-test-password";

/// A PostgreSQL server with the role and database the examples name (`leasehold`, by
/// password over TCP), its tables made by `leasehold migrate`.
fn store(env: &Env) -> (Postgres, String) {
    let pg = Postgres::start_with(PostgresOptions::new().password_role("leasehold"));
    pg.psql(&format!(
        "CREATE ROLE leasehold LOGIN PASSWORD '{PASSWORD}'"
    ));
    pg.psql("CREATE DATABASE leasehold OWNER leasehold");
    let url = format!(
        "postgres://leasehold:{PASSWORD}@127.0.0.1:{}/leasehold",
        pg.port()
    );
    env.run_ok(&["--store", &url, "migrate"]);
    (pg, url)
}

/// A job that notes each run in `log` and takes a moment.
fn job(env: &Env) -> (String, std::path::PathBuf) {
    let log = env.path("runs.log");
    let script = env.path("nightly-invoices");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"ran $$\" >> {}\nsleep 0.3\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (script.display().to_string(), log)
}

/// Starts `argv` twice at once with `envs`, then once more after both ended: the job runs
/// once, every start exits 0, and the one that ran it does not wait out the minimum hold.
fn runs_once(env: &Env, argv: &[String], envs: &[(String, String)], log: &Path) {
    let start = |n: usize| {
        let mut cmd = env.command(&argv[0]);
        cmd.args(&argv[1..]);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.env("LEASEHOLD_LOG", format!("info,replica={n}"));
        WorkerProcess::spawn(cmd)
    };
    let began = Instant::now();
    let (a, b) = (start(1), start(2));
    for (name, p) in [("first", a), ("second", b)] {
        let status = p.wait_timeout(Duration::from_secs(60)).unwrap_or_else(|| {
            panic!("the {name} start did not end (waiting out --hold-at-least?)")
        });
        assert_eq!(status.code(), Some(0), "the {name} start");
    }
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "the starts took {:?}",
        began.elapsed()
    );
    let runs = std::fs::read_to_string(log).unwrap_or_default();
    assert_eq!(
        runs.lines().count(),
        1,
        "two starts at once ran the job: {runs}"
    );
    // A replica whose timer fired later: the job is done, the lease still kept.
    let late = start(3)
        .wait_timeout(Duration::from_secs(60))
        .expect("the late start ends");
    assert_eq!(late.code(), Some(0));
    let runs = std::fs::read_to_string(log).unwrap();
    assert_eq!(
        runs.lines().count(),
        1,
        "a later start ran it again: {runs}"
    );
}

/// How long the store at `url` (the embedded default: `None`) still keeps the lease `key`
/// (it must be held).
fn kept_for(env: &Env, url: Option<&str>, key: &str) -> Duration {
    let mut args = Vec::new();
    if let Some(url) = url {
        args.extend(["--store", url]);
    }
    args.extend(["inspect", "--json", key]);
    let out = env.run_ok(&args);
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["held"], true, "not kept after the job: {v}");
    Duration::from_millis(v["lease"]["remaining_ms"].as_u64().expect("remaining_ms"))
}

/// The examples' `--hold-at-least 10m`, less the test's own time so far.
fn about_ten_minutes(left: Duration) {
    assert!(
        left > Duration::from_secs(9 * 60) && left <= Duration::from_secs(10 * 60),
        "kept for {left:?} more"
    );
}

/// `NAME=VALUE` lines of `[Service]` and the `ExecStart=` line of a unit file, with
/// `${VAR}` taken from `vars` as systemd does (the unit writes no quotes).
fn unit(path: &Path, vars: &HashMap<&str, String>) -> (Vec<(String, String)>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let expand = |s: &str| {
        let mut s = s.to_owned();
        for (k, v) in vars {
            s = s.replace(&format!("${{{k}}}"), v);
        }
        assert!(!s.contains("${"), "an unknown variable in {s}");
        s
    };
    let mut envs = Vec::new();
    let mut exec = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Environment=") {
            let (k, v) = rest.split_once('=').unwrap();
            envs.push((k.to_owned(), expand(v)));
        } else if let Some(rest) = line.strip_prefix("ExecStart=") {
            assert!(exec.is_none(), "one ExecStart");
            exec = Some(expand(rest).split_whitespace().map(str::to_owned).collect());
        }
    }
    (envs, exec.expect("an ExecStart line"))
}

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

#[test]
fn the_systemd_unit_runs_the_job_once_across_two_replicas_timers() {
    let env = Env::new();
    let (pg, url) = store(&env);
    let (script, log) = job(&env);
    let creds = env.path("credentials");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("leasehold-db-password"), PASSWORD).unwrap();
    let vars = HashMap::from([("CREDENTIALS_DIRECTORY", creds.display().to_string())]);
    let (envs, mut argv) = unit(&repo("ops/systemd/nightly-invoices.service"), &vars);
    // This machine's paths and server for the unit's.
    assert_eq!(argv[0], "/usr/local/bin/leasehold");
    argv[0] = BIN.to_owned();
    assert_eq!(argv.last().unwrap(), "/usr/local/bin/nightly-invoices");
    *argv.last_mut().unwrap() = script;
    let envs: Vec<_> = envs
        .into_iter()
        .map(|(k, v)| {
            let v = v.replace("db.internal", &format!("127.0.0.1:{}", pg.port()));
            (k, v)
        })
        .collect();
    assert!(envs.iter().any(|(k, _)| k == "LEASEHOLD_STORE"), "{envs:?}");
    runs_once(&env, &argv, &envs, &log);
    about_ten_minutes(kept_for(&env, Some(&url), "nightly-invoices"));
}

#[test]
fn the_kubernetes_cronjob_runs_the_job_once_across_two_clusters() {
    let env = Env::new();
    let (_pg, url) = store(&env);
    let (script, log) = job(&env);
    let yaml =
        std::fs::read_to_string(repo("ops/kubernetes/nightly-invoices-cronjob.yaml")).unwrap();
    let line = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("command:"))
        .expect("a command: line");
    let mut argv: Vec<String> = serde_json::from_str(line.trim()).expect("a JSON list");
    assert_eq!(argv[0], "leasehold");
    argv[0] = BIN.to_owned();
    assert_eq!(argv.last().unwrap(), "/app/nightly-invoices");
    *argv.last_mut().unwrap() = script;
    // The Secret's URL.
    let envs = vec![("LEASEHOLD_STORE".to_owned(), url.clone())];
    runs_once(&env, &argv, &envs, &log);
    about_ten_minutes(kept_for(&env, Some(&url), "nightly-invoices"));
}

/// `--hold-at-least` on a store that keeps no lease for a set time (an advisory lock,
/// bound to its session): `run` stays, holding the lease, until the minimum has passed,
/// says so, and a start meanwhile does not run the job.
#[test]
fn on_a_session_bound_store_run_stays_until_the_minimum_hold_has_passed() {
    let env = Env::new();
    let (pg, _) = store(&env);
    let url = format!(
        "postgres+advisory://leasehold:{PASSWORD}@127.0.0.1:{}/leasehold",
        pg.port()
    );
    env.run_ok(&["--store", &url, "migrate"]);
    let (script, log) = job(&env);
    let run = |min: &str| {
        let mut cmd = env.cmd();
        cmd.args([
            "--store",
            &url,
            "run",
            "--key",
            "nightly-invoices",
            "--no-wait",
            "--conflict-exit-code",
            "0",
            "--hold-at-least",
            min,
            "--",
            &script,
        ]);
        cmd
    };
    let began = Instant::now();
    let first = run("3s").output().unwrap();
    let took = began.elapsed();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(took >= Duration::from_secs(3), "returned after {took:?}");
    assert!(
        stderr(&first)
            .contains("leasehold stays, holding the lease, until the minimum hold has passed"),
        "{}",
        stderr(&first)
    );
    // While one holds it for the minimum, a second start does not run the job.
    let holder = WorkerProcess::spawn(run("20s"));
    let until = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count()
        < 2
    {
        assert!(Instant::now() < until, "the second run never ran the job");
        std::thread::sleep(Duration::from_millis(20));
    }
    let other: std::process::Output = run("1s").output().unwrap();
    assert_eq!(other.status.code(), Some(0), "{}", stderr(&other));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap().lines().count(),
        2,
        "ran while another start held the lease for its minimum"
    );
    drop(holder);
}

/// `run --json --hold-at-least`: on the embedded SQLite store (which keeps a lease for a
/// set time) the lease is left in the store, `left_until_ms` says until when, and nothing
/// is said about staying; a minimum already past is a plain release.
#[test]
fn the_json_line_says_until_when_the_lease_is_left_in_the_store() {
    let env = Env::new();
    let run = |min: &str| {
        env.run(&[
            "run",
            "--json",
            "--no-wait",
            "--key",
            "job:left",
            "--hold-at-least",
            min,
            "--",
            "true",
        ])
    };
    #[allow(clippy::disallowed_methods)] // compared with the Unix ms of the JSON line
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let before = now_ms();
    let out = run("1m");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["released"], false, "{v}");
    let until = v["left_until_ms"].as_u64().expect("left_until_ms");
    assert!(
        until >= before + 60_000 - 1_000 && until <= now_ms() + 60_000,
        "left until {until}, a minute after {before}?"
    );
    assert!(
        !stderr(&out).contains("leasehold stays"),
        "{}",
        stderr(&out)
    );
    assert!(kept_for(&env, None, "job:left") > Duration::from_secs(50));

    let out = run("1ms");
    // Held by the first run's minimum: not acquired.
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    env.run_ok(&["break", "job:left"]);
    let out = run("1ms");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["released"], true, "{v}");
    assert!(v["left_until_ms"].is_null(), "{v}");
}
