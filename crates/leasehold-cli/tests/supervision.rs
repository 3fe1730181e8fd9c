//! Issue 24: what `leasehold run` reports and does around its command — a `--grace`
//! that must fit the TTL the store granted, the guard's clock, a command whose end is seen
//! only after the lease's deadline, and a command stopped from outside.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_testkit::WorkerProcess;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

mod common;

use common::{BIN, Env, stderr, wait_for_file};

/// The state letter of a process (`/proc/PID/stat`, field 3: `R`, `S`, `T`, `Z`, …), or
/// `None` once it is gone.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The parent of a process (`/proc/PID/stat`, field 4).
fn parent(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// Waits until `pid` is in state `want` (or gone, for `None`); fails the test after 20 s.
fn wait_state(pid: i32, want: Option<char>, what: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    while state(pid) != want {
        assert!(Instant::now() < until, "{what}: state {:?}", state(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The pid written on the first line of `path`.
fn pid_in(path: &Path) -> i32 {
    wait_for_file(path, Duration::from_secs(20))
        .trim()
        .parse()
        .unwrap()
}

/// Kills, on drop, the processes (and process groups) a failing test may leave behind.
struct Cleanup {
    pids: Vec<i32>,
    groups: Vec<i32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for &g in &self.groups {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
        for &p in &self.pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
}

fn held(env: &Env, store: Option<&str>, key: &str) -> bool {
    let mut cmd = env.cmd();
    if let Some(s) = store {
        cmd.args(["--store", s]);
    }
    let out = cmd.args(["inspect", key, "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["held"] == true
}

// --- Item 2: --grace against the TTL the store granted --------------------------------

/// ZooKeeper grants min(TTL, session timeout): `--ttl 30s` on a 4 s session is a 4 s
/// lease. The default grace (TTL/5) is a fifth of the granted TTL, not of the asked one:
/// a one-second command completes instead of being stopped at once.
#[cfg(feature = "zookeeper")]
#[test]
fn default_grace_is_a_fifth_of_the_ttl_zookeeper_granted() {
    let zk = leasehold_testkit::ZkServer::start();
    let url = format!("{}?session_timeout=4s", zk.url());
    let env = Env::new();
    let out = env.run(&[
        "--store",
        &url,
        "run",
        "--json",
        "--key",
        "job:zk-grace",
        "--ttl",
        "30s",
        "--",
        "sh",
        "-c",
        "sleep 1",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!held(&env, Some(&url), "job:zk-grace"), "released");
}

/// A `--grace` that fits the asked TTL but not the granted one is refused before the
/// command starts, with an error naming both TTLs; the lease is released.
#[cfg(feature = "zookeeper")]
#[test]
fn grace_too_long_for_the_ttl_zookeeper_granted_is_refused_naming_both_ttls() {
    let zk = leasehold_testkit::ZkServer::start();
    let url = format!("{}?session_timeout=4s", zk.url());
    let env = Env::new();
    let marker = env.path("ran");
    let out = env.run(&[
        "--store",
        &url,
        "run",
        "--key",
        "job:zk-grace-long",
        "--ttl",
        "30s",
        "--grace",
        "5s",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--grace 5s"), "{err}");
    // The grant is under the 4 s session (less the leader's report lag): both TTLs named.
    assert!(
        err.contains("granted") && err.contains("of the 30s asked"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");
    assert!(!held(&env, Some(&url), "job:zk-grace-long"), "released");
}

// --- Item 7: the guard's clock ---------------------------------------------------------

/// The guard waits for the validity deadline on a `CLOCK_BOOTTIME` timer set at the
/// absolute deadline (`TFD_TIMER_ABSTIME`): the kernel counts a host suspend against it
/// and fires it at the resume if the deadline passed meanwhile, so a frozen `run` plus a
/// suspend cannot delay the kill. Read from `/proc/GUARD/fdinfo`: clock 7
/// (`CLOCK_BOOTTIME`), flags 01, and the time left is the lease's, not capped at 60 s.
#[test]
fn the_guard_waits_on_a_boottime_timer_set_at_the_absolute_deadline() {
    let env = Env::new();
    let pidfile = env.path("command.pid");
    let mut run = env.cmd();
    run.args([
        "run",
        "--key",
        "job:guard-clock",
        "--ttl",
        "5m",
        "--",
        "sh",
        "-c",
        "echo $$ > \"$0\"; exec sleep 600",
        pidfile.to_str().unwrap(),
    ]);
    let run = WorkerProcess::spawn(run);
    let command = pid_in(&pidfile);
    let _cleanup = Cleanup {
        pids: vec![command],
        groups: vec![command],
    };
    let run_pid = parent(command);
    assert_eq!(run_pid, run.pid() as i32);
    let until = Instant::now() + Duration::from_secs(20);
    let timer = loop {
        let guard = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|&p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.windows(7).any(|w| w == b"__guard"))
                    && std::fs::read_to_string(format!("/proc/{p}/stat"))
                        .is_ok_and(|_| parent(p) == run_pid)
            })
            .expect("the guard process");
        let timers: Vec<String> = std::fs::read_dir(format!("/proc/{guard}/fdinfo"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter(|info| info.contains("clockid:"))
            .collect();
        if let Some(t) = timers.into_iter().find(|t| !t.contains("it_value: (0, 0)")) {
            break t;
        }
        assert!(
            Instant::now() < until,
            "the guard has no armed timerfd: it does not wait on a clock that counts a suspend"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let field = |name: &str| {
        timer
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {timer}"))
            .trim()
            .to_owned()
    };
    assert_eq!(field("clockid:"), "7", "CLOCK_BOOTTIME: {timer}");
    assert_eq!(field("settime flags:"), "01", "TFD_TIMER_ABSTIME: {timer}");
    let left: u64 = field("it_value:")
        .trim_start_matches('(')
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        left > 60 && left <= 300,
        "{left} s left on the guard's timer for a 5 min lease: {timer}"
    );
    run.signal(Signal::SIGTERM);
    let status = run
        .wait_timeout(Duration::from_secs(20))
        .expect("run exits on SIGTERM");
    assert_eq!(status.code(), Some(128 + 15));
}

// --- Item 8: a command whose end is seen after the deadline ----------------------------

/// `leasehold run` is frozen (SIGSTOP) while its command finishes, and stays frozen past
/// its lease (another run takes the key meanwhile). Resumed, it cannot tell whether the
/// command ended before or after the deadline: it must not report plain success, but
/// `completed_after_loss` with exit 71, the command's own status alongside.
#[test]
fn a_command_whose_end_is_seen_after_the_deadline_is_not_reported_as_success() {
    let env = Env::new();
    let pidfile = env.path("command.pid");
    let go = env.path("go");
    let mut run = env.cmd();
    run.args([
        "run",
        "--json",
        "--key",
        "job:frozen-end",
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        "echo $$ > \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.02; done; exit 0",
        pidfile.to_str().unwrap(),
        go.to_str().unwrap(),
    ]);
    let run = WorkerProcess::spawn(run);
    let command = pid_in(&pidfile);
    let _cleanup = Cleanup {
        pids: vec![command],
        groups: vec![command],
    };
    let run_pid = Pid::from_raw(run.pid() as i32);
    kill(run_pid, Signal::SIGSTOP).unwrap();
    wait_state(run_pid.as_raw(), Some('T'), "leasehold run stops");
    // The command ends while its supervisor is frozen, well before the deadline: it is a
    // zombie nobody reaps.
    std::fs::write(&go, "").unwrap();
    wait_state(command, Some('Z'), "the command ends");
    // Past the lease: another run acquires the key.
    let second = env.run(&[
        "run",
        "--key",
        "job:frozen-end",
        "--wait",
        "20s",
        "--",
        "true",
    ]);
    assert!(second.status.success(), "{}", stderr(&second));
    kill(run_pid, Signal::SIGCONT).unwrap();
    let status = run
        .wait_timeout(Duration::from_secs(20))
        .expect("run exits once resumed");
    let lines = run.lines();
    let v: serde_json::Value = serde_json::from_str(lines.last().expect("a JSON line")).unwrap();
    assert_eq!(status.code(), Some(71), "{v}");
    assert_eq!(v["outcome"], "completed_after_loss", "{v}");
    assert_eq!(v["exit_code"], 71, "{v}");
    assert_eq!(v["command_exit_code"], 0, "{v}");
    assert_eq!(v["released"], false, "{v}");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("check")),
        "{v}"
    );
}

// --- Item 10: a command stopped from outside --------------------------------------------

/// A script without job control (`bash -c`) starts a helper in the background and runs
/// `leasehold run`. The command is stopped from outside (`kill -STOP`, as a debugger, a
/// container pause or a cgroup freezer would): `run`, the script and the helper go on
/// (none in state T), the command stays stopped until it is continued, then completes.
#[test]
fn a_command_stopped_from_outside_stops_neither_leasehold_nor_its_caller() {
    let env = Env::new();
    let sibling_file = env.path("sibling.pid");
    let pidfile = env.path("command.pid");
    let go = env.path("go");
    let log = env.path("run.log");
    let script = "sleep 300 & echo $! > \"$1\"
\"$2\" --log info run --key job:outside-stop -- sh -c 'echo $$ > \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.02; done' \"$3\" \"$4\" 2> \"$5\"
echo \"run:$?\"";
    let mut cmd = env.command("bash");
    cmd.args(["-c", script, "script"])
        .args([&sibling_file, Path::new(BIN), &pidfile, &go, &log])
        // Its own process group, as a script started by cron or a CI runner has: should
        // leasehold stop its group, the test is not stopped with it.
        .process_group(0);
    let script = WorkerProcess::spawn(cmd);
    let script_pid = script.pid() as i32;
    let sibling = pid_in(&sibling_file);
    let command = pid_in(&pidfile);
    let _cleanup = Cleanup {
        pids: vec![sibling, command],
        groups: vec![script_pid, command],
    };
    let run_pid = parent(command);
    assert_eq!(parent(run_pid), script_pid, "run is the script's child");
    kill(Pid::from_raw(command), Signal::SIGSTOP).unwrap();
    wait_state(command, Some('T'), "the command stops");
    // Until leasehold has seen the stop (its log says so), and once more after, nothing
    // else may be stopped.
    let until = Instant::now() + Duration::from_secs(20);
    let not_stopped = || {
        for (pid, who) in [
            (script_pid, "the script"),
            (sibling, "its helper"),
            (run_pid, "leasehold run"),
        ] {
            assert_ne!(state(pid), Some('T'), "{who} was stopped with the command");
        }
    };
    loop {
        not_stopped();
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        if logged.contains("stopped from outside") {
            break;
        }
        assert!(
            Instant::now() < until,
            "leasehold never saw the stop: {logged}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    not_stopped();
    assert_eq!(state(command), Some('T'), "the command stays stopped");
    // Continued from outside, the command completes and so do run and the script.
    kill(Pid::from_raw(command), Signal::SIGCONT).unwrap();
    std::fs::write(&go, "").unwrap();
    let run_status = script
        .wait_for_line(|l| l.starts_with("run:"), Duration::from_secs(20))
        .expect("run ends");
    assert_eq!(
        run_status,
        "run:0",
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let status = script
        .wait_timeout(Duration::from_secs(20))
        .expect("the script ends");
    assert!(status.success());
    assert_eq!(state(sibling).map(|s| s != 'T'), Some(true));
    assert!(!held(&env, None, "job:outside-stop"), "released");
}
