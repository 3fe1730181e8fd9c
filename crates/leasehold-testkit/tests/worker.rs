//! WorkerProcess: stdout lines, pause/resume, signals, kill, cleanup.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::thread;
use std::time::Duration;

use leasehold_testkit::{Signal, WorkerProcess};

const LONG: Duration = Duration::from_secs(20);

fn sh(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    cmd
}

fn tick_number(line: &str) -> Option<u64> {
    line.strip_prefix("tick ")?.parse().ok()
}

fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        !matches!(rest.split_whitespace().next(), Some("Z" | "X"))
    })
}

#[test]
fn lines_pause_resume_kill() {
    let worker = WorkerProcess::spawn(sh(
        "echo start; i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.05; done",
    ));
    assert!(worker.pid() > 0);
    assert_eq!(
        worker.wait_for_line(|l| l == "start", LONG).as_deref(),
        Some("start")
    );
    let (idx, _) = worker
        .wait_for_line_from(0, |l| tick_number(l) == Some(3), LONG)
        .expect("tick 3");
    assert_eq!(worker.lines()[idx], "tick 3");

    worker.pause();
    assert!(worker.is_paused());
    // Let lines already in the pipe drain, then nothing new may appear.
    thread::sleep(Duration::from_millis(500));
    let frozen = worker.line_count();
    thread::sleep(Duration::from_millis(800));
    assert_eq!(worker.line_count(), frozen, "a paused worker printed");
    assert!(worker.is_running());

    worker.resume();
    assert!(!worker.is_paused());
    let (next, line) = worker
        .wait_for_line_from(frozen, |l| tick_number(l).is_some(), LONG)
        .expect("ticks after resume");
    assert!(next >= frozen, "{line}");

    worker.kill();
    assert!(!worker.is_running());
    let status = worker.wait_timeout(Duration::from_secs(1)).expect("exited");
    assert_eq!(status.signal(), Some(9));
    // Stdout closes once the whole tree is gone.
    assert!(
        worker
            .wait_for_line(|l| l == "never printed", LONG)
            .is_none()
    );
    assert!(worker.stdout_closed());
}

#[test]
fn exit_status_and_closed_stdout() {
    let worker = WorkerProcess::spawn(sh("echo a; printf 'b\\r\\n'; printf 'no newline'; exit 3"));
    let status = worker.wait_timeout(LONG).expect("worker exits");
    assert_eq!(status.code(), Some(3));
    // Waiting for a line that never comes returns as soon as stdout closes.
    let started = std::time::Instant::now();
    assert!(worker.wait_for_line(|l| l == "zzz", LONG).is_none());
    assert!(started.elapsed() < LONG);
    assert_eq!(worker.lines(), ["a", "b", "no newline"]);
    assert_eq!(worker.exit_status().and_then(|s| s.code()), Some(3));
    assert!(!worker.is_running());
}

#[test]
fn signal_reaches_the_worker() {
    let worker = WorkerProcess::spawn(sh(
        "trap 'echo got term; exit 0' TERM; echo ready; while true; do sleep 0.05; done",
    ));
    worker.wait_for_line(|l| l == "ready", LONG).expect("ready");
    worker.signal(Signal::SIGTERM);
    worker
        .wait_for_line(|l| l == "got term", LONG)
        .expect("trap ran");
    assert_eq!(worker.wait_timeout(LONG).and_then(|s| s.code()), Some(0));
}

#[test]
fn drop_kills_the_whole_tree() {
    let worker = WorkerProcess::spawn(sh("sleep 1000 & echo $!; wait"));
    let line = worker
        .wait_for_line(|l| l.parse::<u32>().is_ok(), LONG)
        .expect("background pid");
    let grandchild: u32 = line.parse().unwrap();
    let pid = worker.pid();
    assert!(is_alive(grandchild));
    drop(worker);
    assert!(!is_alive(pid), "worker survived drop");
    assert!(!is_alive(grandchild), "grandchild survived drop");
}

#[test]
#[should_panic(expected = "has exited")]
fn pausing_an_exited_worker_panics() {
    let worker = WorkerProcess::spawn(sh("exit 0"));
    worker.wait_timeout(LONG).expect("exits");
    worker.pause();
}
