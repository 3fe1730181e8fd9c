//! Black-box tests of the `leasehold` binary against SQLite (the default) and a private
//! Redis.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_testkit::{FaultProxy, ProxyMode, RedisServer, WorkerProcess};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;

use common::{BIN, Env, stderr, wait_for_file};

/// The wall clock, to compare with what the shell commands under test stamp with
/// `date +%s%N` (and with `LEASEHOLD_VALID_UNTIL`): they have no other clock.
#[allow(clippy::disallowed_methods)] // compared with `date` in the commands under test
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
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
    let out = env.run_ok(&["inspect", "job:vars", "--json"]);
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

/// `redis+sentinel://` from the command line (issue 16 item 5): runs find the primary
/// through the sentinels and never overlap.
#[test]
fn concurrent_runs_through_sentinel_never_overlap() {
    let set = leasehold_testkit::RedisSentinelSet::start("cli");
    no_overlap(&Env::new(), Some(&set.url()), 3);
}

/// `leasehold run --store zookeeper://…` on a private ZooKeeper: the command sees a fence
/// (the holder node's czxid), a second run gets a higher one, and the lease is released.
#[cfg(feature = "zookeeper")]
#[test]
fn run_on_zookeeper_passes_the_fence_and_releases() {
    let zk = leasehold_testkit::ZkServer::start();
    let url = format!("{}?session_timeout=4s", zk.url());
    let env = Env::new();
    let mut fences = Vec::new();
    for _ in 0..2 {
        let out = env.run_ok(&[
            "--store",
            &url,
            "run",
            "--key",
            "job:zk",
            "--ttl",
            "4s",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE",
        ]);
        let fence: u64 = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .expect("the command printed its fence");
        assert!(fence > 0);
        fences.push(fence);
    }
    assert!(fences[1] > fences[0], "{fences:?}");
    let out = env.run_ok(&["--store", &url, "inspect", "job:zk", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false);
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
    env.run_ok(&["run", "--key", "job:crash", "--wait", "20s", "--", "true"]);
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

/// When Redis expires the lease whose key matches `pattern` (wall clock, ns), read from
/// the server directly (not through a proxy in front of it).
fn store_expiry_ns(redis: &RedisServer, pattern: &str) -> u128 {
    let keys = redis.cli(&["--scan", "--pattern", pattern]);
    let lease_key = keys
        .lines()
        .find(|k| !k.ends_with(":fence") && !k.is_empty())
        .unwrap_or_else(|| panic!("no lease key in {keys:?}"))
        .to_owned();
    let before = now_ns();
    let pttl: u128 = redis.cli(&["pttl", &lease_key]).trim().parse().unwrap();
    assert!(pttl > 0, "lease key without expiry: {pttl}");
    before + pttl * 1_000_000
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
    let store_expiry = store_expiry_ns(&redis, "*job:netsplit*");
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

/// Waits until the log at `path` has a line starting with `prefix`, and returns its rest.
fn wait_for_line(path: &std::path::Path, prefix: &str, timeout: Duration) -> String {
    let until = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(rest) = text.lines().find_map(|l| l.strip_prefix(prefix)) {
            return rest.to_owned();
        }
        assert!(Instant::now() < until, "no {prefix:?} line in {text:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `--at-risk-signal USR1` and LEASEHOLD_HEALTH_FILE, against Redis behind the fault
/// proxy: a renewal lost in a blackhole puts the lease at risk; the command gets USR1 and
/// reads `at_risk <deadline>` (a deadline before the store's own expiry) while the lease
/// is still its own in Redis; once a renewal is confirmed it gets USR1 again and reads
/// `held`, and it runs to its end.
#[test]
fn the_command_is_told_when_the_lease_is_at_risk_and_when_it_is_held_again() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let env = Env::new();
    let log = env.path("health.log");
    let done = env.path("done");
    // With --ttl 12s: renewed every 4 s, each renewal bounded by 2 s, retried 1 s after a
    // failure, lost at the second failure in a row. The test has the second
    // (1 s) between the first failure and the retry to let the network back.
    let script = format!(
        "trap 'echo \"USR1 $(cat \"$LEASEHOLD_HEALTH_FILE\")\" >> {log}' USR1; \
         echo \"up $(cat \"$LEASEHOLD_HEALTH_FILE\")\" >> {log}; \
         while [ ! -e {done} ]; do sleep 0.02; done; echo end >> {log}",
        log = log.display(),
        done = done.display(),
    );
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let mut holder = env.cmd();
    holder.args([
        "--store",
        &url,
        "run",
        "--key",
        "job:at-risk",
        "--ttl",
        "12s",
        "--at-risk-signal",
        "usr1",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let holder = WorkerProcess::spawn(holder);
    assert_eq!(wait_for_line(&log, "up ", Duration::from_secs(20)), "held");
    proxy.set_mode(ProxyMode::Blackhole);
    let at_risk = wait_for_line(&log, "USR1 at_risk ", Duration::from_secs(12));
    proxy.set_mode(ProxyMode::Pass);
    let deadline_ms: u128 = at_risk.parse().expect("a deadline in Unix ms");
    // The lease is still the holder's, and expires there after the deadline the command
    // was given.
    let store_expiry_ms = store_expiry_ns(&redis, "*job:at-risk*") / 1_000_000;
    assert!(
        deadline_ms < store_expiry_ms,
        "the command's deadline is {} ms past the store's expiry",
        deadline_ms - store_expiry_ms
    );
    assert_eq!(
        wait_for_line(&log, "USR1 held", Duration::from_secs(12)),
        "",
        "held again once a renewal is confirmed"
    );
    std::fs::write(&done, "").unwrap();
    let status = holder
        .wait_timeout(Duration::from_secs(15))
        .expect("leasehold exits");
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.ends_with("end\n"), "{text}");
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
    let out = env.run_ok(&["break", "job:busy", "--json"]);
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
    let out = env.run_ok(&["demo", "--html", html.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("REJECTED by the guard"), "{text}");
    assert!(text.contains("consistent"), "{text}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<svg") && page.contains("write rejected"),
        "{page}"
    );

    let html = env.path("unfenced.html");
    let out = env.run_ok(&["demo", "--unfenced", "--html", html.to_str().unwrap()]);
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

// ---------------------------------------------------------------------------------------
// Issue 10: a lease stays in the store until its command's whole process group is gone;
// a command never runs on unsupervised; durations never panic; no memory:// store;
// interactive use behaves like `flock` or `timeout --foreground`.

/// The real Python interpreter (not a wrapper script such as a pyenv shim), so that a
/// command's first action is not delayed by a wrapper.
fn python() -> &'static str {
    static PY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "python3 runs");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

/// Python: appends a `CLOCK_BOOTTIME` stamp (ns) to `argv[1]` every 20 ms, forever.
const TICKER: &str = "import sys, time
f = open(sys.argv[1], 'a')
while True:
    f.write('%d\\n' % time.clock_gettime_ns(time.CLOCK_BOOTTIME))
    f.flush()
    time.sleep(0.02)
";

/// Python: appends one `CLOCK_BOOTTIME` stamp (ns) to `argv[1]`.
const STAMP: &str = "import sys, time
open(sys.argv[1], 'a').write('%d\\n' % time.clock_gettime_ns(time.CLOCK_BOOTTIME))
";

/// `CLOCK_BOOTTIME` now, in ns: the clock the commands stamp with.
fn boottime_ns() -> u128 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
    t.tv_sec() as u128 * 1_000_000_000 + t.tv_nsec() as u128
}

/// The stamps in a file (read once its writers are gone).
fn stamps(path: &Path) -> Vec<u128> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether a process exists and is not a zombie (a killed process whose parent is frozen
/// stays a zombie, but runs no more).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat[stat.rfind(')').map_or(0, |i| i + 1)..]
        .split_whitespace()
        .next()
        .unwrap_or("X");
    !matches!(state, "Z" | "X")
}

fn wait_gone(pids: &[i32], timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    while pids.iter().any(|&p| running(p)) {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Kills, on drop, processes a failing test may leave behind once their supervisor is gone.
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if running(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// `sh -c` script for a command that starts a ticking grandchild in its own process group
/// and waits for it: `$0` python, `$1` the ticker, `$2` the tick file, `$3` gets
/// "<command pid> <grandchild pid>".
const TICKING_FAMILY: &str = "\"$0\" -c \"$1\" \"$2\" & echo \"$$ $!\" > \"$3\"; wait";

fn family_pids(path: &Path) -> (i32, i32) {
    let text = wait_for_file(path, Duration::from_secs(20));
    let mut it = text.split_whitespace().map(|p| p.parse::<i32>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// The measured scenario of issue 10.1: `--max-hold` ends the lease of a command that
/// ignores SIGTERM while a second run waits for the key. The second command must start
/// only after the first one's last sign of life.
fn max_hold_releases_only_after_the_command_is_gone(env: &Env, store: Option<&str>) {
    let first_log = env.path("first.log");
    let second_log = env.path("second.log");
    let mut first = env.cmd();
    if let Some(s) = store {
        first.args(["--store", s]);
    }
    first.args([
        "run",
        "--key",
        "job:maxhold-overlap",
        "--ttl",
        "10s",
        "--max-hold",
        "2s",
        "--grace",
        "1900ms",
        "--",
        "sh",
        "-c",
        "trap '' TERM; \"$0\" -c \"$1\" \"$2\"",
        python(),
        TICKER,
        first_log.to_str().unwrap(),
    ]);
    let first = WorkerProcess::spawn(first);
    wait_for_file(&first_log, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    let second_asked = boottime_ns();
    let mut second = env.cmd();
    if let Some(s) = store {
        second.args(["--store", s]);
    }
    let second = second
        .args([
            "run",
            "--key",
            "job:maxhold-overlap",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "\"$0\" -c \"$1\" \"$2\"",
            python(),
            STAMP,
            second_log.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(second.status.success(), "{}", stderr(&second));
    let status = first
        .wait_timeout(Duration::from_secs(20))
        .expect("the first run ends");
    assert_eq!(status.code(), Some(70), "lease lost exit code");
    let last = stamps(&first_log).into_iter().max().unwrap();
    let started = stamps(&second_log)[0];
    assert!(
        last > second_asked,
        "the first command should have run on (ignoring SIGTERM) after the second asked"
    );
    assert!(
        started > last,
        "the second command started {} ms before the first one's last record",
        (last - started) / 1_000_000
    );
}

#[test]
fn max_hold_keeps_the_lease_until_a_command_ignoring_sigterm_is_gone_on_sqlite() {
    max_hold_releases_only_after_the_command_is_gone(&Env::new(), None);
}

#[test]
fn max_hold_keeps_the_lease_until_a_command_ignoring_sigterm_is_gone_on_redis() {
    let redis = RedisServer::start();
    max_hold_releases_only_after_the_command_is_gone(&Env::new(), Some(&redis.url()));
}

/// docs/faults.md rows 1 and 28: `leasehold run` frozen past its TTL. Its command and the
/// command's grandchild die by the validity deadline, before the store-side expiry, while
/// the supervisor is still frozen; the next holder starts after their last record.
#[test]
fn frozen_supervisor_its_command_group_dies_by_the_validity_deadline() {
    let redis = RedisServer::start();
    let env = Env::new();
    let ticks = env.path("ticks.log");
    let pids = env.path("pids");
    let second_log = env.path("second.log");
    let url = redis.url();
    let mut holder = env.cmd();
    holder.args([
        "--store",
        &url,
        "run",
        "--key",
        "job:frozen-group",
        "--ttl",
        "8s",
        "--",
        "sh",
        "-c",
        TICKING_FAMILY,
        python(),
        TICKER,
        ticks.to_str().unwrap(),
        pids.to_str().unwrap(),
    ]);
    let holder = WorkerProcess::spawn(holder);
    let (command, grandchild) = family_pids(&pids);
    let _cleanup = KillOnDrop(vec![command, grandchild]);
    wait_for_file(&ticks, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(holder.pid() as i32), Signal::SIGSTOP).unwrap();
    // A renewal sent just before the freeze lands; none can follow.
    std::thread::sleep(Duration::from_millis(300));
    let keys = redis.cli(&["--scan"]);
    let lease_key = keys
        .lines()
        .find(|k| !k.ends_with(":fence") && !k.is_empty())
        .unwrap_or_else(|| panic!("no lease key in {keys:?}"))
        .to_owned();
    let pttl: u128 = redis.cli(&["pttl", &lease_key]).trim().parse().unwrap();
    let store_expiry = boottime_ns() + pttl * 1_000_000;
    assert!(pttl > 0, "lease key without expiry: {pttl}");
    let second = env
        .cmd()
        .args([
            "--store",
            &url,
            "run",
            "--key",
            "job:frozen-group",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "\"$0\" -c \"$1\" \"$2\"",
            python(),
            STAMP,
            second_log.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        wait_gone(&[command, grandchild], Duration::from_secs(10)),
        "the command group runs on while its supervisor is frozen"
    );
    assert!(holder.is_running(), "the supervisor is still frozen");
    let last = stamps(&ticks).into_iter().max().unwrap();
    let started = stamps(&second_log)[0];
    assert!(
        last < store_expiry,
        "the command ran {} ms past the store-side expiry",
        (last - store_expiry) / 1_000_000
    );
    assert!(
        started > last,
        "the next holder started {} ms before the frozen holder's command's last record",
        (last - started) / 1_000_000
    );
    holder.resume();
    let status = holder
        .wait_timeout(Duration::from_secs(10))
        .expect("exits after resuming");
    assert_eq!(status.code(), Some(70), "lease lost exit code");
}

/// docs/faults.md row 28: `kill -9` of `leasehold run`. Its command and the command's grandchild
/// are gone long before the TTL (30 s) could run out.
#[test]
fn killed_supervisor_takes_its_whole_command_group_with_it() {
    let env = Env::new();
    let ticks = env.path("ticks.log");
    let pids = env.path("pids");
    let mut holder = env.cmd();
    holder.args([
        "run",
        "--key",
        "job:orphan",
        "--ttl",
        "30s",
        "--",
        "sh",
        "-c",
        TICKING_FAMILY,
        python(),
        TICKER,
        ticks.to_str().unwrap(),
        pids.to_str().unwrap(),
    ]);
    let holder = WorkerProcess::spawn(holder);
    let (command, grandchild) = family_pids(&pids);
    let _cleanup = KillOnDrop(vec![command, grandchild]);
    wait_for_file(&ticks, Duration::from_secs(20));
    kill(Pid::from_raw(holder.pid() as i32), Signal::SIGKILL).unwrap();
    holder
        .wait_timeout(Duration::from_secs(10))
        .expect("killed");
    assert!(
        wait_gone(&[command, grandchild], Duration::from_secs(10)),
        "the command group runs on unsupervised"
    );
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
        // A 10 ms lease may time out on the way, be lost before the command starts, while
        // it runs, or before its end is seen (one line: store error, 72, 70 or 71);
        // anything else is a bug.
        let ok = match *value {
            "10ms" => {
                matches!(out.status.code(), Some(5 | 69 | 70 | 71 | 72))
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
    // --max-hold 1ns: the lease is lost at once: before the command starts (72, the
    // guard process takes a while to start), or just after, and the command is stopped
    // (70).
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
    assert!(
        matches!(out.status.code(), Some(70 | 72)),
        "{:?}: {}",
        out.status,
        stderr(&out)
    );
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

// --- Under a pseudo-terminal -----------------------------------------------------------

/// Python: a terminal with a job-control shell in it. `argv[1]` gets the shell's reports
/// ("shell <pid> job <pid>", "stopped <sig>", "continued", "exit <code>", "signal <sig>");
/// `argv[2:]` is the job, run in its own process group in the terminal's foreground, as
/// an interactive shell runs it. SIGUSR1 to the shell is `fg` after the job stopped.
/// Our stdin is typed into the terminal; what the terminal shows goes to our stdout.
const TERMINAL: &str = r#"
import ctypes, os, pty, select, signal, sys, time

report_path, argv = sys.argv[1], sys.argv[2:]

def report(line):
    with open(report_path, 'a') as f:
        f.write(line + '\n')

# Orphans of the session come here (PR_SET_CHILD_SUBREAPER), so the test finds them all.
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
pid, master = pty.fork()
if pid == 0:
    for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP):
        signal.signal(s, signal.SIG_IGN)
    fg = []
    signal.signal(signal.SIGUSR1, lambda *_: fg.append(1))
    job = os.fork()
    if job == 0:
        os.setpgid(0, 0)
        os.tcsetpgrp(0, os.getpgrp())
        for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP, signal.SIGUSR1,
                  signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE):
            signal.signal(s, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    try:
        os.setpgid(job, job)
    except OSError:
        pass
    os.tcsetpgrp(0, job)
    report('shell %d job %d' % (os.getpid(), job))
    while True:
        _, status = os.waitpid(job, os.WUNTRACED)
        if os.WIFSTOPPED(status):
            os.tcsetpgrp(0, os.getpgrp())
            report('stopped %d' % os.WSTOPSIG(status))
            while not fg:
                time.sleep(0.01)
            fg.clear()
            os.tcsetpgrp(0, job)
            os.killpg(job, signal.SIGCONT)
            report('continued')
        elif os.WIFEXITED(status):
            report('exit %d' % os.WEXITSTATUS(status))
            break
        elif os.WIFSIGNALED(status):
            report('signal %d' % os.WTERMSIG(status))
            break
    os._exit(0)

out = sys.stdout.buffer
fds = [master, 0]
while True:
    ready, _, _ = select.select(fds, [], [], 0.1)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    if master in ready:
        try:
            data = os.read(master, 4096)
        except OSError:
            data = b''
        if not data:
            break
        out.write(data)
        out.flush()
    if 0 in ready:
        data = os.read(0, 4096)
        if data:
            os.write(master, data)
        else:
            fds.remove(0)
"#;

/// `leasehold` run by a job-control shell in a pseudo-terminal. Dropping it kills every
/// process it started.
struct Terminal {
    child: std::process::Child,
    input: std::process::ChildStdin,
    screen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    report: PathBuf,
}

impl Terminal {
    /// `leasehold ARGS` as the job.
    fn start(env: &Env, args: &[&str]) -> Self {
        let mut job = vec![BIN];
        job.extend_from_slice(args);
        Self::start_job(env, &job)
    }

    /// `ARGV` as the job.
    fn start_job(env: &Env, argv: &[&str]) -> Self {
        use std::io::Read;
        let report = env.path("terminal.report");
        let mut child = env
            .command(python())
            .args(["-c", TERMINAL])
            .arg(&report)
            .args(argv)
            .current_dir(env.dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let mut output = child.stdout.take().unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shown = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = output.read(&mut buf) {
                shown.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Self {
            child,
            input,
            screen,
            report,
        }
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().unwrap()).into_owned()
    }

    fn type_keys(&mut self, keys: &[u8]) {
        use std::io::Write;
        self.input.write_all(keys).unwrap();
        self.input.flush().unwrap();
    }

    fn wait_screen(&self, text: &str, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while !self.screen().contains(text) {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// The first report line starting with `prefix` after the first `skip` such lines.
    fn wait_report(&self, prefix: &str, skip: usize, timeout: Duration) -> Option<String> {
        let until = Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(&self.report).unwrap_or_default();
            if let Some(line) = text.lines().filter(|l| l.starts_with(prefix)).nth(skip) {
                return Some(line.to_owned());
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn shell_pid(&self) -> i32 {
        let line = self
            .wait_report("shell ", 0, Duration::from_secs(20))
            .expect("the shell started");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn descendants(&self) -> Vec<i32> {
        let mut parent_of = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                && let Some(ppid) = stat[stat.rfind(')').map_or(0, |i| i + 1)..]
                    .split_whitespace()
                    .nth(1)
                    .and_then(|p| p.parse::<i32>().ok())
            {
                parent_of.push((pid, ppid));
            }
        }
        let mut found = vec![self.child.id() as i32];
        let mut i = 0;
        while i < found.len() {
            let parent = found[i];
            found.extend(
                parent_of
                    .iter()
                    .filter(|(_, pp)| *pp == parent)
                    .map(|(p, _)| *p),
            );
            i += 1;
        }
        found.remove(0);
        found
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        for pid in self.descendants() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn interactive_a_command_reads_the_terminal() {
    let env = Env::new();
    let mut term = Terminal::start(
        &env,
        &[
            "run",
            "--key",
            "job:tty-read",
            "--",
            "sh",
            "-c",
            "read x; echo got:$x",
        ],
    );
    term.type_keys(b"hello\n");
    assert!(
        term.wait_screen("got:hello", Duration::from_secs(20)),
        "the command never read the line; the terminal shows {:?}",
        term.screen()
    );
    assert_eq!(
        term.wait_report("exit", 0, Duration::from_secs(20)),
        Some("exit 0".into())
    );
}

/// Python: on SIGQUIT, records it in `argv[1]` and exits 9.
const ON_QUIT: &str = "import signal, sys, time
def quit(*_):
    open(sys.argv[1], 'a').write('QUIT\\n')
    sys.exit(9)
signal.signal(signal.SIGQUIT, quit)
print('ready', flush=True)
while True:
    time.sleep(0.05)
";

#[test]
fn interactive_ctrl_backslash_reaches_the_command_and_leasehold_reports_its_status() {
    let env = Env::new();
    let log = env.path("quit.log");
    let mut term = Terminal::start(
        &env,
        &[
            "run",
            "--key",
            "job:tty-quit",
            "--",
            python(),
            "-c",
            ON_QUIT,
            log.to_str().unwrap(),
        ],
    );
    assert!(
        term.wait_screen("ready", Duration::from_secs(20)),
        "{:?}",
        term.screen()
    );
    term.type_keys(b"\x1c");
    let end = term.wait_report("exit", 0, Duration::from_secs(20));
    let report = std::fs::read_to_string(&term.report).unwrap_or_default();
    assert_eq!(end, Some("exit 9".into()), "{report}");
    assert_eq!(std::fs::read_to_string(&log).unwrap_or_default(), "QUIT\n");
    let out = env.run(&["inspect", "job:tty-quit", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false, "released after the command exited");
}

/// Whether process `pid`'s group becomes its terminal's foreground group within
/// `timeout` (`/proc/PID/stat`: `pgrp` is field 5, `tpgid` field 8).
fn owns_terminal(pid: i32, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest: Vec<&str> = stat
                .rsplit_once(')')
                .map_or(vec![], |(_, r)| r.split_whitespace().collect());
            if rest.len() > 5 && rest[2] == rest[5] {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Ctrl-Z stops the command and its job; `fg` continues both, and the command has the
/// terminal again. With `via_script`, `leasehold run` is called by a script: the job the
/// shell sees stopped is the script, in whose process group leasehold runs.
fn ctrl_z_and_fg(via_script: bool) {
    let env = Env::new();
    let ticks = env.path("ticks");
    let stop = env.path("stop");
    let pidfile = env.path("command.pid");
    let mut args: Vec<&str> = Vec::new();
    if via_script {
        args.extend(["sh", "-c", "\"$0\" \"$@\"; echo script-saw:$?"]);
    }
    args.extend([
        BIN,
        "run",
        "--key",
        "job:tty-stop",
        "--",
        // bash, not dash: dash starts `sleep` with vfork, and a Ctrl-Z that lands between
        // the vfork and the exec stops the child while the command itself waits for it in
        // uninterruptible sleep, never stopping — no job control could see that job stop.
        "bash",
        "-c",
        "echo $$ > \"$2\"; echo ready; while [ ! -e \"$1\" ]; do echo t >> \"$0\"; sleep 0.05; done; read x; echo got:$x",
        ticks.to_str().unwrap(),
        stop.to_str().unwrap(),
        pidfile.to_str().unwrap(),
    ]);
    let mut term = Terminal::start_job(&env, &args);
    let count = || {
        std::fs::read_to_string(&ticks)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert!(
        term.wait_screen("ready", Duration::from_secs(20)),
        "{:?}",
        term.screen()
    );
    wait_for_file(&ticks, Duration::from_secs(20));
    // A user types Ctrl-Z at a command that has the terminal: wait until leasehold has
    // handed it over (on a loaded machine the command can print before that).
    let pid: i32 = wait_for_file(&pidfile, Duration::from_secs(20))
        .trim()
        .parse()
        .unwrap();
    assert!(
        owns_terminal(pid, Duration::from_secs(20)),
        "the command never got the terminal"
    );
    term.type_keys(b"\x1a");
    let stopped = term.wait_report("stopped", 0, Duration::from_secs(20));
    assert!(stopped.is_some(), "the shell never saw the job stop");
    let before = count();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        count(),
        before,
        "the command ran on while its job was stopped"
    );
    // fg: the shell gives the job the terminal and continues it.
    kill(Pid::from_raw(term.shell_pid()), Signal::SIGUSR1).unwrap();
    assert!(
        term.wait_report("continued", 0, Duration::from_secs(20))
            .is_some()
    );
    let until = Instant::now() + Duration::from_secs(20);
    while count() <= before + 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(count() > before + 2, "the command did not continue");
    // And it owns the terminal again: it reads a line typed there.
    std::fs::write(&stop, "").unwrap();
    term.type_keys(b"after\n");
    assert!(
        term.wait_screen("got:after", Duration::from_secs(20)),
        "{:?}",
        term.screen()
    );
    assert_eq!(
        term.wait_report("exit", 0, Duration::from_secs(20)),
        Some("exit 0".into())
    );
    if via_script {
        // The shell reports the exit as soon as the script ends; the terminal may show its
        // last line a moment later.
        assert!(
            term.wait_screen("script-saw:0", Duration::from_secs(20)),
            "{:?}",
            term.screen()
        );
    }
}

#[test]
fn interactive_ctrl_z_stops_the_job_and_fg_resumes_the_command_in_the_foreground() {
    ctrl_z_and_fg(false);
}

#[test]
fn interactive_ctrl_z_stops_a_script_calling_leasehold_and_fg_resumes_it() {
    ctrl_z_and_fg(true);
}

/// The store becomes unreachable under a command that ignores SIGTERM: SIGKILL comes at
/// the latest at the validity deadline, so the command's last record precedes the
/// store-side expiry.
#[test]
fn unreachable_store_kills_a_command_ignoring_sigterm_before_the_lease_expires() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let env = Env::new();
    let ticks = env.path("ticks.log");
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let mut holder = env.cmd();
    holder.args([
        "--store",
        &url,
        "run",
        "--key",
        "job:netsplit-kill",
        "--ttl",
        "4s",
        "--grace",
        "1900ms",
        "--",
        "sh",
        "-c",
        "trap '' TERM; \"$0\" -c \"$1\" \"$2\"",
        python(),
        TICKER,
        ticks.to_str().unwrap(),
    ]);
    let holder = WorkerProcess::spawn(holder);
    wait_for_file(&ticks, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(1500)); // a renewal went through
    proxy.set_mode(ProxyMode::Blackhole);
    // A renewal sent just before the blackhole lands; none can follow.
    std::thread::sleep(Duration::from_millis(200));
    let keys = redis.cli(&["--scan"]);
    let lease_key = keys
        .lines()
        .find(|k| !k.ends_with(":fence") && !k.is_empty())
        .unwrap_or_else(|| panic!("no lease key in {keys:?}"))
        .to_owned();
    let pttl: u128 = redis.cli(&["pttl", &lease_key]).trim().parse().unwrap();
    let store_expiry = boottime_ns() + pttl * 1_000_000;
    assert!(pttl > 0, "lease key without expiry: {pttl}");
    let status = holder
        .wait_timeout(Duration::from_secs(20))
        .expect("leasehold exits");
    assert_eq!(status.code(), Some(70));
    let last = stamps(&ticks).into_iter().max().unwrap();
    assert!(
        last < store_expiry,
        "the command ran {} ms past the store-side expiry",
        (last - store_expiry) / 1_000_000
    );
    proxy.set_mode(ProxyMode::Pass);
}

/// Issue 12.3: `inspect`, `list` and `break` never hang on an unreachable store: behind a
/// blackholed proxy, each exits 69 with one line, in well under a minute.
#[test]
fn admin_commands_on_a_blackholed_store_fail_in_time() {
    let pg = leasehold_testkit::Postgres::start();
    let proxy = FaultProxy::start(pg.addr());
    let env = Env::new();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?leasehold_migrate=true",
        proxy.port()
    );
    env.run_ok(&["--store", &url, "list"]);
    proxy.set_mode(ProxyMode::Blackhole);
    for args in [
        &["inspect", "job:x"][..],
        &["list"][..],
        &["break", "job:x"][..],
    ] {
        let started = Instant::now();
        let out = env
            .cmd()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap();
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out).lines().count(),
            1,
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(took < Duration::from_secs(45), "{args:?} took {took:?}");
    }
}
