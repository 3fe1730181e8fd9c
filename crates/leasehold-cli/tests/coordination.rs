//! Issue 17 in the command: `run --permits N` runs at most N copies across processes,
//! `leader` shows the holder of the election's lease, `observe` prints each change.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{Env, stderr, stdout, wait_for_file};

/// Six `run --permits 2` on one key, each command logging its start and end (with its
/// slot and fence): never more than two at once at any moment, never two on one slot,
/// and the fences of each slot rise.
#[test]
fn run_with_permits_runs_at_most_n_copies() {
    let env = Env::new();
    let log = env.path("permits.log");
    let script = format!(
        "echo \"start $(date +%s%N) $LEASEHOLD_PERMIT_SLOT $LEASEHOLD_FENCE $LEASEHOLD_KEY\" >> {log}; \
         sleep 0.4; echo \"end $(date +%s%N) $LEASEHOLD_PERMIT_SLOT $LEASEHOLD_FENCE $LEASEHOLD_KEY\" >> {log}",
        log = log.display()
    );
    let children: Vec<_> = (0..6)
        .map(|_| {
            env.cmd()
                .args([
                    "run",
                    "--key",
                    "job:permits",
                    "--permits",
                    "2",
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
    let mut events: Vec<(u128, bool, u32, u64, String)> = text
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            (
                p[1].parse().unwrap(),
                p[0] == "start",
                p[2].parse().unwrap(),
                p[3].parse().unwrap(),
                p[4].to_owned(),
            )
        })
        .collect();
    assert_eq!(events.len(), 12, "{text}");
    events.sort_by_key(|e| (e.0, e.1)); // an end before a start at the same instant
    let (mut running, mut most) = (0, 0);
    let mut on_slot = [false; 2];
    let mut last_fence = [0u64; 2];
    for (_, start, slot, fence, key) in &events {
        assert_eq!(
            key,
            &format!("job:permits#{slot}"),
            "LEASEHOLD_KEY is the slot: {text}"
        );
        let s = *slot as usize;
        if *start {
            running += 1;
            most = most.max(running);
            assert!(running <= 2, "three copies at once: {text}");
            assert!(!on_slot[s], "two copies on slot {slot}: {text}");
            assert!(
                *fence > last_fence[s],
                "fences of slot {slot} must rise: {text}"
            );
            on_slot[s] = true;
            last_fence[s] = *fence;
        } else {
            running -= 1;
            on_slot[s] = false;
        }
    }
    assert_eq!(most, 2, "two copies should have run together: {text}");

    // Another N for the same key is refused: bad usage.
    let out = env.run(&[
        "run",
        "--key",
        "job:permits",
        "--permits",
        "3",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("has 2 permits"), "{}", stderr(&out));
    // All permits held and --no-wait: not acquired (75).
    let holders: Vec<_> = (0..2)
        .map(|i| {
            let ready = env.path(&format!("ready{i}"));
            let c = env
                .cmd()
                .args([
                    "run",
                    "--key",
                    "job:permits",
                    "--permits",
                    "2",
                    "--",
                    "sh",
                    "-c",
                    &format!(
                        "echo $LEASEHOLD_PERMIT_SLOT > {}; sleep 30",
                        ready.display()
                    ),
                ])
                .spawn()
                .unwrap();
            wait_for_file(&ready, Duration::from_secs(30));
            c
        })
        .collect();
    let out = env.run(&[
        "run",
        "--key",
        "job:permits",
        "--permits",
        "2",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    for mut c in holders {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        c.wait().unwrap();
    }
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

/// `leader` shows the `run` that holds the election's lease, with its fence as the term;
/// `observe` prints no leader, that leader, then no leader again.
#[test]
fn leader_and_observe_follow_a_run_campaigner() {
    let env = Env::new();
    let v = json(&env.run_ok(&["leader", "leader:nightly", "--json"]));
    assert_eq!(v["leader"], serde_json::Value::Null, "{v}");

    let mut observer = env
        .cmd()
        .args(["observe", "leader:nightly", "--interval", "50ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(observer.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["leader"], serde_json::Value::Null, "{first}");

    let fence_file = env.path("fence");
    let mut holder = env
        .cmd()
        .args([
            "run",
            "--key",
            "leader:nightly",
            "--",
            "sh",
            "-c",
            &format!("echo $LEASEHOLD_FENCE > {}; sleep 1", fence_file.display()),
        ])
        .spawn()
        .unwrap();
    let fence: u64 = wait_for_file(&fence_file, Duration::from_secs(30))
        .trim()
        .parse()
        .unwrap();
    let v = json(&env.run_ok(&["leader", "leader:nightly", "--json"]));
    assert_eq!(v["leader"]["term"], fence, "{v}");
    assert_eq!(
        v["leader"]["value"],
        serde_json::Value::Null,
        "run publishes no value: {v}"
    );
    let text = stdout(&env.run_ok(&["leader", "leader:nightly"]));
    assert!(text.contains(&format!("term {fence}")), "{text}");
    assert!(holder.wait().unwrap().success());

    let seen: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(seen["leader"]["term"], fence, "{seen}");
    let gone: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(gone["leader"], serde_json::Value::Null, "{gone}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(observer.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = observer.wait().unwrap();
    assert!(status.success(), "observe exits 0 on SIGTERM: {status:?}");
}
