//! Issue 24 item 9 in the command, on the embedded SQLite store: a name is one kind of
//! resource. `run --key NAME` is refused while NAME is a semaphore (`run --permits N`), a
//! semaphore is refused while `run --key NAME` holds the lease, and `leader`/`observe`
//! refuse a semaphore's name; each refusal is bad usage (64), names the kind, runs no
//! command and leaves nothing held.

mod common;

use std::process::{Child, Stdio};
use std::time::Duration;

use common::{Env, stderr, stdout, wait_for_file};

/// `leasehold run --key KEY [EXTRA...] -- sh -c 'echo > READY; sleep 30'`, returned once
/// its command runs.
fn holder(env: &Env, key: &str, extra: &[&str], ready: &str) -> Child {
    let ready = env.path(ready);
    let mut args = vec!["run", "--key", key];
    args.extend_from_slice(extra);
    let script = format!("echo held > {}; sleep 30", ready.display());
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let child = env
        .cmd()
        .args(&args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(30));
    child
}

/// Ends a holder (SIGTERM to `leasehold run`, passed on to its command).
fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    child.wait().unwrap();
}

/// `run --key NAME ARGS -- sh -c 'echo > RAN'`: its output, and whether the command ran.
fn attempt(env: &Env, key: &str, extra: &[&str]) -> (std::process::Output, bool) {
    let ran = env.path(&format!("ran-{}", extra.join("")));
    let _ = std::fs::remove_file(&ran);
    let script = format!("echo ran > {}", ran.display());
    let mut args = vec!["run", "--key", key, "--no-wait", "--json"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let out = env.run(&args);
    (out, ran.exists())
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

fn held(env: &Env, key: &str) -> bool {
    let out = env.run_ok(&["inspect", key, "--json"]);
    json(&out)["held"] == serde_json::Value::Bool(true)
}

/// While two `--permits 2` holders of `exports` run, `run --key exports` is refused (and
/// after they are gone too: the name stays a semaphore's), naming the semaphore; its
/// command never runs and the lease `exports` is left free.
#[test]
fn run_on_a_semaphores_name_is_refused() {
    let env = Env::new();
    let permits: Vec<Child> = (0..2)
        .map(|i| holder(&env, "exports", &["--permits", "2"], &format!("p{i}")))
        .collect();
    let (out, ran) = attempt(&env, "exports", &[]);
    assert!(!ran, "the command ran beside the semaphore's permits");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("`exports` is a semaphore") && err.contains("one kind of resource"),
        "the error names the kind: {err}"
    );
    let v = json(&out);
    assert_eq!(v["outcome"], "usage", "{v}");
    assert_eq!(v["fence"], serde_json::Value::Null, "not acquired: {v}");
    assert!(!held(&env, "exports"), "the refused lease is released");
    for p in permits {
        stop(p);
    }
    let (out, ran) = attempt(&env, "exports", &[]);
    assert!(!ran && out.status.code() == Some(64), "{}", stderr(&out));
    // The semaphore itself goes on.
    let (out, ran) = attempt(&env, "exports", &["--permits", "2"]);
    assert!(ran && out.status.success(), "{}", stderr(&out));
}

/// While `run --key exports` holds the lease, `run --key exports --permits 2` is refused,
/// naming the lease; its command never runs, it holds no slot, and it does not make the
/// name a semaphore's: once the lease is free, `run --key exports` runs again.
#[test]
fn a_semaphore_on_a_running_leases_name_is_refused() {
    let env = Env::new();
    let lease = holder(&env, "exports", &[], "lease");
    let (out, ran) = attempt(&env, "exports", &["--permits", "2"]);
    assert!(!ran, "the command ran beside the lease's holder");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("`exports` is a lease") && err.contains("cannot be used as a semaphore"),
        "the error names the kind: {err}"
    );
    assert!(
        !held(&env, "exports#0") && !held(&env, "exports#1"),
        "no slot held"
    );
    stop(lease);
    let (out, ran) = attempt(&env, "exports", &[]);
    assert!(ran && out.status.success(), "{}", stderr(&out));
}

/// `leader` and `observe` of a semaphore's name are bad usage, naming the semaphore.
#[test]
fn leader_and_observe_refuse_a_semaphores_name() {
    let env = Env::new();
    let (out, _) = attempt(&env, "exports", &["--permits", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for args in [
        &["leader", "exports", "--json"][..],
        &["observe", "exports", "--interval", "50ms"][..],
    ] {
        let out = env
            .cmd()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // `observe` runs until stopped: a refusal ends it at once.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let mut out = out;
        loop {
            if out.try_wait().unwrap().is_some() {
                break;
            }
            if std::time::Instant::now() > until {
                let _ = out.kill();
                panic!("{args:?} did not refuse a semaphore's name");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = out.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("`exports` is a semaphore"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}
