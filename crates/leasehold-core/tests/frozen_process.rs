//! Issue 10.3 with a real frozen process: a worker holds a lease, is stopped with SIGSTOP
//! past its validity deadline, and resumed with SIGCONT. Its first act on resume is to ask
//! `LostSignal::is_lost()`: the answer must be `true`.
//!
//! The worker keeps every background helper out of the way, so only the on-the-spot clock
//! check can give the right answer: the watchdog thread is off and the worker's (single
//! threaded) runtime is blocked by its own loop, so the renewal scheduler never runs.
//!
//! The worker is this same test binary, started again with an environment variable.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::memory::MemoryStore;
use leasehold_core::{LeaseClient, LeaseConfig};

const WORKER: &str = "LEASEHOLD_FROZEN_WORKER";
const TEST: &str = "a_frozen_worker_hears_lost_first_thing_on_resume";

/// The worker: acquire a 1 s lease, then every 5 ms print `tick <before ns> <after ns>
/// <is_lost>` (times since the worker started, read just before and just after asking),
/// until 300 ms after it has seen its clock jump by more than a second (the freeze), or
/// for 30 s if no freeze comes (a loaded machine may be slow to send it).
fn worker() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = LeaseConfig::builder(Duration::from_secs(1))
            .watchdog_thread(false)
            .build()
            .unwrap();
        let client = LeaseClient::new(Arc::new(MemoryStore::new()), cfg);
        let lease = client.try_acquire("job:frozen").await.unwrap();
        let lost = lease.lost();
        let t0 = Instant::now();
        println!("acquired");
        // Blocks the runtime on purpose: nothing async runs from here on.
        let mut last = Duration::ZERO;
        let mut thawed: Option<Duration> = None;
        while t0.elapsed() < Duration::from_secs(30) {
            let before = t0.elapsed();
            let is_lost = lost.is_lost();
            let after = t0.elapsed();
            println!("tick {} {} {is_lost}", before.as_nanos(), after.as_nanos());
            if thawed.is_none() && after > last + Duration::from_secs(1) {
                thawed = Some(after);
            }
            if thawed.is_some_and(|at| after > at + Duration::from_millis(300)) {
                break;
            }
            last = after;
            std::thread::sleep(Duration::from_millis(5));
        }
        std::mem::forget(lease);
    });
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn a_frozen_worker_hears_lost_first_thing_on_resume() {
    if std::env::var_os(WORKER).is_some() {
        return worker();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(WORKER, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("worker output").unwrap();
        if line.ends_with("acquired") {
            break;
        }
    }
    // Freeze only once the worker's loop is seen running (a few ticks read), so a slow
    // start on a loaded machine cannot make the freeze miss the loop.
    let (ticking_tx, ticking) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in lines.map_while(Result::ok) {
            all.push(line);
            if all.len() == 20 {
                let _ = ticking_tx.send(());
            }
        }
        all
    });
    ticking
        .recv_timeout(Duration::from_secs(30))
        .expect("the worker never started ticking");
    let started = Instant::now();
    signal(pid, "-STOP");
    // Frozen for 2 s: well past the 0.985 s validity window.
    std::thread::sleep(Duration::from_secs(2));
    signal(pid, "-CONT");
    let status = child.wait().unwrap();
    assert!(status.success(), "worker failed: {status}");
    assert!(started.elapsed() >= Duration::from_secs(2));
    let ticks: Vec<(u128, u128, bool)> = reader
        .join()
        .unwrap()
        .iter()
        .filter_map(|l| {
            let mut f = l.strip_prefix("tick ")?.split(' ');
            Some((
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect();
    let gap = Duration::from_secs(1).as_nanos();
    // The freeze fell either between two ticks (a tick's `before` is more than a second
    // after the previous tick's `after`) or, rarely, inside one tick's question (its
    // `after` is more than a second after its own `before`: that answer may go either
    // way). `resumed` is the first tick whose question was asked entirely after the freeze.
    let (resumed, settled) = ticks
        .iter()
        .enumerate()
        .find_map(|(i, t)| {
            if t.1 > t.0 + gap {
                Some((i + 1, i))
            } else if i > 0 && t.0 > ticks[i - 1].1 + gap {
                Some((i, i))
            } else {
                None
            }
        })
        .unwrap_or_else(|| panic!("no freeze seen in the ticks: {ticks:?}"));
    assert!(resumed < ticks.len(), "no tick after the freeze");
    assert!(
        ticks[..settled].iter().all(|t| !t.2),
        "lost before the freeze: {:?}",
        &ticks[..resumed]
    );
    assert!(
        ticks[resumed].2,
        "first question after resuming answered not lost: {:?}",
        &ticks[resumed.saturating_sub(2)..(resumed + 3).min(ticks.len())]
    );
    assert!(ticks[resumed..].iter().all(|t| t.2));
}
