//! Black-box tests of the `leasehold` binary against SQLite (the default) and a private
//! Redis.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_testkit::{FaultProxy, ProxyMode, RedisServer, WorkerProcess};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// A `leasehold` command whose default store lives in this test's directory.
    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("XDG_STATE_HOME", self.dir.path())
            .env_remove("LEASEHOLD_STORE")
            .env_remove("RUST_LOG");
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn wait_for_file(path: &Path, timeout: Duration) -> String {
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

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

#[test]
fn the_command_sees_its_lease_and_its_exit_status_passes_through() {
    let env = Env::new();
    let before_ms = now_ns() / 1_000_000;
    let out = env.run(&[
        "run",
        "--key",
        "job:vars",
        "--",
        "sh",
        "-c",
        "echo \"$LEASEHOLD_KEY $LEASEHOLD_FENCE $LEASEHOLD_OWNER $LEASEHOLD_VALID_UNTIL\"; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let line = String::from_utf8(out.stdout).unwrap();
    let parts: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(parts.len(), 4, "{line}");
    assert_eq!(parts[0], "job:vars");
    assert!(parts[1].parse::<u64>().unwrap() > 0);
    assert_eq!(parts[2].len(), 32);
    let valid_until: u128 = parts[3].parse().unwrap();
    assert!(
        valid_until > before_ms && valid_until < before_ms + 11_000,
        "{valid_until}"
    );
    // The default store lives in $XDG_STATE_HOME/leasehold/.
    assert!(env.path("leasehold").is_dir());
    // Released afterwards.
    let out = env.run(&["inspect", "job:vars", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false);
}

/// Starts `n` concurrent `leasehold run`s on one key whose commands log start/end times,
/// and checks the intervals never overlap.
fn no_overlap(env: &Env, store: Option<&str>, n: usize) {
    let log = env.path("overlap.log");
    let script = format!(
        "echo \"start $(date +%s%N) $LEASEHOLD_FENCE\" >> {log}; sleep 0.3; echo \"end $(date +%s%N) $LEASEHOLD_FENCE\" >> {log}",
        log = log.display()
    );
    let children: Vec<_> = (0..n)
        .map(|_| {
            let mut c = env.cmd();
            if let Some(s) = store {
                c.args(["--store", s]);
            }
            c.args([
                "run",
                "--key",
                "job:overlap",
                "--wait",
                "60s",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<(String, u128, u64)> = text
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            (
                p[0].to_owned(),
                p[1].parse().unwrap(),
                p[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(events.len(), 2 * n, "{text}");
    let mut sorted = events.clone();
    sorted.sort_by_key(|e| e.1);
    let mut last_fence = 0;
    for pair in sorted.chunks(2) {
        assert_eq!(
            (pair[0].0.as_str(), pair[1].0.as_str()),
            ("start", "end"),
            "overlap in {text}"
        );
        assert_eq!(pair[0].2, pair[1].2, "overlap in {text}");
        assert!(pair[0].2 > last_fence, "fences must grow: {text}");
        last_fence = pair[0].2;
    }
}

#[test]
fn concurrent_runs_on_sqlite_never_overlap() {
    no_overlap(&Env::new(), None, 4);
}

#[test]
fn concurrent_runs_on_redis_never_overlap() {
    let redis = RedisServer::start();
    no_overlap(&Env::new(), Some(&redis.url()), 4);
}

#[test]
fn killed_holder_frees_the_lease_after_the_ttl() {
    let env = Env::new();
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut holder = env.cmd();
    holder.args([
        "run",
        "--key",
        "job:crash",
        "--ttl",
        "2s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let holder = WorkerProcess::spawn(holder);
    let child: i32 = wait_for_file(&pidfile, Duration::from_secs(20))
        .trim()
        .parse()
        .unwrap();
    // kill -9 of `leasehold run` itself (not its command).
    kill(Pid::from_raw(holder.pid() as i32), Signal::SIGKILL).unwrap();
    holder
        .wait_timeout(Duration::from_secs(10))
        .expect("killed");
    let started = Instant::now();
    let out = env.run(&["run", "--key", "job:crash", "--wait", "20s", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "acquired before the TTL ran out"
    );
    // The orphaned command is not ours to stop any more; clean it up.
    let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
}

#[test]
fn holder_frozen_past_its_ttl_stops_its_command_and_reports_lease_lost() {
    let env = Env::new();
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut holder = env.cmd();
    holder.args([
        "run",
        "--key",
        "job:frozen",
        "--ttl",
        "1s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let holder = WorkerProcess::spawn(holder);
    let child: i32 = wait_for_file(&pidfile, Duration::from_secs(20))
        .trim()
        .parse()
        .unwrap();
    // SIGSTOP `leasehold run` only: its command keeps running.
    let pid = Pid::from_raw(holder.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let out = env.run(&["run", "--key", "job:frozen", "--wait", "10s", "--", "true"]);
    assert!(
        out.status.success(),
        "another run acquires: {}",
        stderr(&out)
    );
    holder.resume();
    let status = holder
        .wait_timeout(Duration::from_secs(10))
        .expect("exits after resuming");
    assert_eq!(status.code(), Some(70), "lease lost exit code");
    let until = Instant::now() + Duration::from_secs(5);
    while alive(child) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(child), "the command was stopped");
}

#[test]
fn unreachable_store_stops_the_command_before_the_lease_expires() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let env = Env::new();
    let log = env.path("term.log");
    let script = format!(
        "trap 'echo \"TERM $(date +%s%N)\" >> {log}; exit 0' TERM; echo \"up\" >> {log}; while :; do sleep 0.05; done",
        log = log.display()
    );
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let mut holder = env.cmd();
    holder.args([
        "--store",
        &url,
        "run",
        "--key",
        "job:netsplit",
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let holder = WorkerProcess::spawn(holder);
    wait_for_file(&log, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(1200)); // a renewal or two went through
    proxy.set_mode(ProxyMode::Blackhole);
    // The store-side expiry, read from Redis directly (not through the proxy).
    let keys = redis.cli(&["--scan"]);
    let lease_key = keys
        .lines()
        .find(|k| !k.ends_with(":fence") && !k.is_empty())
        .unwrap_or_else(|| panic!("no lease key in {keys:?}"))
        .to_owned();
    let before = now_ns();
    let pttl: u128 = redis.cli(&["pttl", &lease_key]).trim().parse().unwrap();
    assert!(pttl > 0, "lease key without expiry: {pttl}");
    let store_expiry = before + pttl * 1_000_000;
    let status = holder
        .wait_timeout(Duration::from_secs(15))
        .expect("leasehold exits");
    assert_eq!(status.code(), Some(70));
    let text = std::fs::read_to_string(&log).unwrap();
    let term: u128 = text
        .lines()
        .find_map(|l| l.strip_prefix("TERM "))
        .expect("the command got SIGTERM")
        .parse()
        .unwrap();
    assert!(
        term < store_expiry,
        "SIGTERM {} ms after the store-side expiry",
        (term - store_expiry) / 1_000_000
    );
    // The lease is still in Redis: it expires there on its own.
    proxy.set_mode(ProxyMode::Pass);
}

#[test]
fn signals_are_forwarded_to_the_command() {
    let env = Env::new();
    let log = env.path("sig.log");
    let script = format!(
        "trap 'echo HUP >> {log}' HUP; trap 'echo TERM >> {log}; exit 7' TERM; echo up >> {log}; while :; do sleep 0.05; done",
        log = log.display()
    );
    let mut holder = env.cmd();
    holder.args(["run", "--key", "job:signals", "--", "sh", "-c", &script]);
    let holder = WorkerProcess::spawn(holder);
    wait_for_file(&log, Duration::from_secs(20));
    holder.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    holder.signal(Signal::SIGTERM);
    let status = holder.wait_timeout(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(7));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("HUP") && text.contains("TERM"), "{text}");
    let out = env.run(&["inspect", "job:signals", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false, "released after the command exited");
}

#[test]
fn contended_no_wait_uses_the_conflict_exit_code() {
    let env = Env::new();
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = env.cmd();
    holder.args(["run", "--key", "job:busy", "--", "sh", "-c", &script]);
    let holder = WorkerProcess::spawn(holder);
    wait_for_file(&pidfile, Duration::from_secs(20));
    let out = env.run(&["run", "--key", "job:busy", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let out = env.run(&["run", "--key", "job:busy", "--wait", "300ms", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let out = env.run(&[
        "run",
        "--key",
        "job:busy",
        "--no-wait",
        "--conflict-exit-code",
        "0",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0));
    // inspect/list/break see it; break evicts it and advances the fence.
    let out = env.run(&["inspect", "job:busy", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], true);
    let fence = v["lease"]["fence"].as_u64().unwrap();
    let out = env.run(&["list", "job:", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    let out = env.run(&["break", "job:busy", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["fence"].as_u64().unwrap() > fence);
    // The evicted holder learns at its next renewal and exits with "lease lost".
    let status = holder
        .wait_timeout(Duration::from_secs(15))
        .expect("evicted holder exits");
    assert_eq!(status.code(), Some(70));
}

#[test]
fn bad_usage_gets_one_line_and_the_usage_exit_code() {
    let env = Env::new();
    let cases: &[&[&str]] = &[
        &["run", "--key", "k"],
        &["run", "--bogus", "--key", "k", "--", "true"],
        &["run", "--key", "k", "--ttl", "0s", "--", "true"],
        &["run", "--key", "k", "--ttl", "banana", "--", "true"],
        &["run", "--key", "", "--", "true"],
        &[
            "run", "--key", "k", "--ttl", "10s", "--grace", "6s", "--", "true",
        ],
        &[
            "--store",
            "nope://user:s3cret-pw@host/",
            "run",
            "--key",
            "k",
            "--",
            "true",
        ],
        &[
            "--store",
            "redis://user:s3cret-pw@127.0.0.1:notaport/",
            "run",
            "--key",
            "k",
            "--",
            "true",
        ],
        &["--store", "not a url", "inspect", "k"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = env.run(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line expected, got {err}"
        );
        assert!(err.starts_with("leasehold: "), "{err}");
        assert!(!err.contains("s3cret-pw"), "password leaked: {err}");
    }
    let out = env.run(&["run", "--key", "k", "--", "/nonexistent/command"]);
    assert_eq!(out.status.code(), Some(126));
}

#[test]
fn help_and_completions() {
    let env = Env::new();
    for sub in ["run", "inspect", "list", "break", "completions"] {
        let out = env.run(&[sub, "--help"]);
        assert!(out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Example"),
            "{sub} --help lacks examples"
        );
    }
    let out = env.run(&["completions", "bash"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("leasehold"));
}

#[test]
fn demo_shows_the_guard_rejecting_the_stale_write_and_corruption_without_it() {
    let env = Env::new();
    let html = env.path("fenced.html");
    let out = env.run(&["demo", "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("REJECTED by the guard"), "{text}");
    assert!(text.contains("consistent"), "{text}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<svg") && page.contains("write rejected"),
        "{page}"
    );

    let html = env.path("unfenced.html");
    let out = env.run(&["demo", "--unfenced", "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("CORRUPTED"), "{text}");
    assert!(!text.contains("REJECTED"), "{text}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("unfenced writes"));
}

#[test]
fn metrics_endpoint_and_json_logs() {
    let env = Env::new();
    let port = leasehold_testkit::free_port();
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = env.cmd();
    holder
        .args([
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
            "--log",
            "info",
        ])
        .args(["run", "--key", "job:metrics", "--", "sh", "-c", &script])
        .stderr(Stdio::piped());
    let holder = holder.spawn().unwrap();
    wait_for_file(&pidfile, Duration::from_secs(20));
    let body = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    };
    assert!(body.contains("leasehold_acquire_total"), "{body}");
    assert!(body.contains("result=\"acquired\""), "{body}");
    assert!(body.contains("resource_type=\"job\""), "{body}");
    kill(Pid::from_raw(holder.id() as i32), Signal::SIGTERM).unwrap();
    let out = holder.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("lease acquired"))
        .unwrap_or_else(|| panic!("{err}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["fields"]["key"], "job:metrics", "{line}");
}

#[test]
fn max_hold_stops_a_command_that_ignores_sigterm() {
    let env = Env::new();
    let pidfile = env.path("child.pid");
    // The command ignores SIGTERM: only SIGKILL, sent within the grace, stops it.
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        pidfile.display()
    );
    let started = Instant::now();
    let out = env
        .cmd()
        .args([
            "run",
            "--key",
            "job:maxhold",
            "--ttl",
            "2s",
            "--max-hold",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(70), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = stderr(&out);
    assert!(
        err.contains("maximum hold") && err.contains("killing"),
        "{err}"
    );
    let child: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!alive(child), "the command is gone");
    let out = env.run(&["inspect", "job:maxhold", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false, "released after max hold");
}

#[test]
fn memory_store_is_refused_by_every_subcommand() {
    let env = Env::new();
    let cases: &[&[&str]] = &[
        &["run", "--key", "k", "--", "true"],
        &["inspect", "k"],
        &["list"],
        &["break", "k"],
    ];
    for args in cases {
        for via_env in [false, true] {
            let mut cmd = env.cmd();
            if via_env {
                cmd.env("LEASEHOLD_STORE", "memory://");
            } else {
                cmd.args(["--store", "memory://"]);
            }
            let out = cmd.args(*args).output().unwrap();
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.starts_with("leasehold: ") && err.contains("memory://"),
                "{err}"
            );
            assert!(out.stdout.is_empty(), "{args:?}");
        }
    }
}

#[test]
fn extreme_durations_never_panic() {
    let env = Env::new();
    let huge = [
        "500000000000y",
        "584942417355y",
        "18446744073709551615s",
        "18446744073709551615s 999999999ns",
        "99999999999999999999999999ns",
    ];
    // (flag, value): refused with exit 64 and one line.
    let mut refused: Vec<(&str, &str)> = vec![
        ("--ttl", "0"),
        ("--ttl", "0s"),
        ("--ttl", "1ns"),
        ("--ttl", "9ms"),
        ("--ttl", "25h"),
        ("--wait", "400d"),
        ("--max-hold", "0"),
        ("--max-hold", "0s"),
        ("--max-hold", "400d"),
        ("--grace", "5s"),
        ("--grace", "1y"),
    ];
    for flag in ["--ttl", "--wait", "--max-hold", "--grace"] {
        refused.extend(huge.iter().map(|v| (flag, *v)));
    }
    for (i, (flag, value)) in refused.iter().enumerate() {
        let key = format!("job:dur{i}");
        let out = env.run(&["run", "--key", &key, flag, value, "--", "true"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{flag} {value}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{flag} {value}: {err}");
        assert!(err.starts_with("leasehold: "), "{flag} {value}: {err}");
    }
    // Accepted: the command runs and its status passes through.
    let accepted: &[(&str, &str)] = &[
        ("--ttl", "10ms"),
        ("--ttl", "24h"),
        ("--wait", "0"),
        ("--wait", "1ns"),
        ("--wait", "365d"),
        ("--max-hold", "365d"),
        ("--grace", "0"),
        ("--grace", "1ns"),
    ];
    for (i, (flag, value)) in accepted.iter().enumerate() {
        let key = format!("job:ok{i}");
        let out = env.run(&[
            "run", "--key", &key, flag, value, "--", "sh", "-c", "exit 5",
        ]);
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{flag} {value}: {err}");
        // A 10 ms lease may time out on the way or be lost before the command ends (one
        // line, store error or lease lost); anything else is a bug.
        let ok = match *value {
            "10ms" => {
                matches!(out.status.code(), Some(5 | 69 | 70))
                    && err.lines().filter(|l| l.starts_with("leasehold: ")).count() <= 1
            }
            _ => out.status.code() == Some(5),
        };
        assert!(ok, "{flag} {value}: {:?} {err}", out.status);
    }
    // While held by another run, a zero or tiny wait is a conflict, not a hang or a panic.
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = env.cmd();
    holder.args(["run", "--key", "job:held", "--", "sh", "-c", &script]);
    let _holder = WorkerProcess::spawn(holder);
    wait_for_file(&pidfile, Duration::from_secs(20));
    for wait in ["0", "1ns"] {
        let out = env.run(&["run", "--key", "job:held", "--wait", wait, "--", "true"]);
        assert_eq!(
            out.status.code(),
            Some(75),
            "--wait {wait}: {}",
            stderr(&out)
        );
    }
    // --max-hold 1ns: the lease is lost at once and the command stopped.
    let out = env.run(&[
        "run",
        "--key",
        "job:tiny-hold",
        "--max-hold",
        "1ns",
        "--",
        "sleep",
        "30",
    ]);
    assert_eq!(out.status.code(), Some(70), "{}", stderr(&out));
}
