//! Quiet, honest output (issue 27 item 5), black-box on the embedded SQLite store: with
//! standard error redirected to a file, as in a cron job or a CI log, every subcommand
//! writes plain text (no ANSI escape), a success says nothing on standard error (no WARN),
//! and no message says the same words twice ("lease lost (lease lost (…))"). On a
//! terminal the log has colour, unless `NO_COLOR` is set to a non-empty value.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;

use common::{Env, stderr, wait_for_file};

const ESC: u8 = 0x1b;

/// What a command wrote, with its standard error in a file (never a terminal).
struct Captured {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` with standard output piped and standard error redirected to a file.
fn capture(env: &Env, name: &str, cmd: &mut Command) -> Captured {
    let path = env.path(&format!("{name}.stderr"));
    let out = cmd
        .stdin(Stdio::null())
        .stderr(File::create(&path).unwrap())
        .output()
        .unwrap();
    Captured {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: std::fs::read_to_string(&path).unwrap(),
    }
}

/// Lowercase words of `s`, punctuation trimmed.
fn words(s: &str) -> Vec<String> {
    s.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The first line of `text` that, right after a `(` or a `:`, repeats two words it said
/// before ("lease lost while the command ran (lease lost (…))", "invalid key: invalid
/// key"), if any: an error wrapping an error that already says the outer words.
fn stutter(text: &str) -> Option<String> {
    for line in text.lines() {
        for (i, c) in line.char_indices() {
            if c != '(' && c != ':' {
                continue;
            }
            let next: Vec<String> = words(&line[i + 1..]).into_iter().take(2).collect();
            if next.len() < 2 {
                continue;
            }
            if words(&line[..i]).windows(2).any(|w| w == next.as_slice()) {
                return Some(line.to_owned());
            }
        }
    }
    None
}

#[test]
fn the_stutter_check_sees_a_stutter() {
    assert!(stutter("leasehold: lease lost while the command ran (lease lost (x))").is_some());
    assert!(stutter("invalid key: invalid key: empty").is_some());
    assert!(stutter("leasehold: lease lost while the command ran (the store said so)").is_none());
    assert!(stutter("12:34:56 a b: c d").is_none());
}

/// Plain, quiet, honest: no escape byte anywhere, nothing on standard error, no stutter
/// in what the command says (help pages, man pages, completions and SQL are prose or code,
/// not messages: checked for escapes only).
fn assert_quiet_success(what: &str, c: &Captured) {
    assert!(c.status.success(), "{what}: {:?}: {}", c.status, c.stderr);
    assert!(
        !c.stdout.as_bytes().contains(&ESC) && !c.stderr.as_bytes().contains(&ESC),
        "{what}: an ANSI escape on a redirected stream: {:?} {:?}",
        c.stdout,
        c.stderr
    );
    assert_eq!(
        c.stderr, "",
        "{what}: a success says nothing on standard error"
    );
    let prose = ["--help", "--version", "--print", "completions", "man"]
        .iter()
        .any(|p| what.contains(&format!("\"{p}\"")));
    if !prose {
        assert_eq!(stutter(&c.stdout), None, "{what}");
    }
}

#[test]
fn every_subcommand_is_plain_and_quiet_with_stderr_in_a_file() {
    let env = Env::new();
    let html = env.path("demo.html");
    let html = html.to_str().unwrap();
    let data = env.path("data");
    let data = data.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["--help"],
        &["run", "--help"],
        &["--version"],
        &["migrate"],
        &["migrate", "--json"],
        &["migrate", "--print"],
        &["run", "--key", "job:out", "--", "true"],
        &["run", "--key", "job:out", "--json", "--", "true"],
        &["inspect", "job:out"],
        &["inspect", "job:out", "--json"],
        &["list"],
        &["list", "--json"],
        // No holder: the fence still advances. A held lease is broken below.
        &["break", "job:out"],
        &["break", "job:out", "--json"],
        &["leader", "leader:out"],
        &["leader", "leader:out", "--json"],
        &["demo", "--html", html],
        &["demo", "--unfenced"],
        &["completions", "bash"],
        &["completions", "zsh"],
        &["man"],
        &["install-completions", "--data-dir", data],
    ];
    for args in cases {
        let c = capture(&env, "case", env.cmd().args(*args));
        assert_quiet_success(&format!("{args:?}"), &c);
    }
}

/// A successful `break` of a held lease says what it did on standard output and nothing
/// on standard error; the evicted `run` fails (70) with one message that says "lease
/// lost" once.
#[test]
fn break_of_a_held_lease_is_quiet_and_the_evicted_run_does_not_stutter() {
    let env = Env::new();
    let started = env.path("started");
    let holder_err = env.path("holder.stderr");
    let mut holder = env
        .cmd()
        .args(["run", "--key", "job:held", "--ttl", "1s", "--", "sh", "-c"])
        .arg(format!("echo up > {}; sleep 60", started.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&holder_err).unwrap())
        .spawn()
        .unwrap();
    wait_for_file(&started, Duration::from_secs(30));
    let c = capture(&env, "break", env.cmd().args(["break", "job:held"]));
    assert_quiet_success("break of a held lease", &c);
    assert!(c.stdout.contains("evicted owner"), "{}", c.stdout);

    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = holder.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = holder.kill();
            panic!("the evicted run did not stop");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&holder_err).unwrap();
    assert_eq!(status.code(), Some(70), "{err}");
    assert!(!err.as_bytes().contains(&ESC), "{err:?}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("leasehold: lease lost while the command ran ("),
        "{err}"
    );
    assert_eq!(last.matches("lease lost").count(), 1, "{last}");
    assert_eq!(stutter(&err), None, "{err}");
}

/// `observe` until its first line, then SIGTERM: nothing on standard error.
#[test]
fn observe_is_plain_and_quiet_with_stderr_in_a_file() {
    let env = Env::new();
    let err = env.path("observe.stderr");
    let mut observer = env
        .cmd()
        .args(["observe", "leader:out", "--interval", "50ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(observer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("\"leader\":null"), "{line}");
    kill(Pid::from_raw(observer.id() as i32), Signal::SIGTERM).unwrap();
    let status = observer.wait().unwrap();
    let c = Captured {
        status,
        stdout: line,
        stderr: std::fs::read_to_string(&err).unwrap(),
    };
    assert_quiet_success("observe", &c);
}

/// Runs `leasehold --log info break KEY` with standard error on a new terminal (a pty)
/// and `NO_COLOR` as given; returns what reached the terminal.
fn stderr_on_a_terminal(env: &Env, no_color: Option<&str>) -> Vec<u8> {
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut cmd = env.cmd();
    cmd.args(["--log", "info", "break", "job:tty"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave));
    match no_color {
        Some(v) => cmd.env("NO_COLOR", v),
        None => cmd.env_remove("NO_COLOR"),
    };
    let mut child = cmd.spawn().unwrap();
    // The child holds the only other end now (`cmd` owns the parent's copy: drop it).
    drop(cmd);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut master = File::from(pty.master);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            // Linux: EIO once no process has the terminal open and it is drained.
            Err(_) => break,
        }
    }
    seen
}

#[test]
fn the_log_has_colour_on_a_terminal_unless_no_color_is_set() {
    let env = Env::new();
    let plain = |b: &[u8]| !b.contains(&ESC);
    let coloured = stderr_on_a_terminal(&env, None);
    assert!(
        String::from_utf8_lossy(&coloured).contains("lease broken"),
        "{coloured:?}"
    );
    assert!(!plain(&coloured), "colour on a terminal");
    // no-color.org: an empty NO_COLOR does not count.
    assert!(!plain(&stderr_on_a_terminal(&env, Some(""))));
    let off = stderr_on_a_terminal(&env, Some("1"));
    assert!(String::from_utf8_lossy(&off).contains("lease broken"));
    assert!(
        plain(&off),
        "NO_COLOR=1: {:?}",
        String::from_utf8_lossy(&off)
    );

    // The same log in a file has no colour, whatever NO_COLOR says.
    let c = capture(
        &env,
        "file",
        env.cmd()
            .args(["--log", "info", "break", "job:tty"])
            .env_remove("NO_COLOR"),
    );
    assert!(c.stderr.contains("lease broken"), "{}", c.stderr);
    assert!(!c.stderr.as_bytes().contains(&ESC), "{:?}", c.stderr);
    assert!(!c.stderr.contains("WARN"), "{}", c.stderr);
}

/// `--help` names the environment variables without `=` and a value: an unset variable
/// is not shown as `[env: LEASEHOLD_LOG=]`, a set one does not leak (a store URL may hold
/// a password).
#[test]
fn help_names_environment_variables_without_values() {
    let env = Env::new();
    for set in [false, true] {
        let mut cmd = env.cmd();
        cmd.arg("--help");
        if set {
            cmd.env("LEASEHOLD_LOG", "warn")
                .env("LEASEHOLD_STORE", "sqlite:///tmp/sEcReT.db");
        } else {
            cmd.env_remove("LEASEHOLD_LOG");
        }
        let out = cmd.output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(help.contains("LEASEHOLD_LOG]"), "{help}");
        assert!(help.contains("LEASEHOLD_STORE]"), "{help}");
        assert!(!help.contains("LEASEHOLD_LOG="), "{help}");
        assert!(!help.contains("sEcReT"), "{help}");
    }
}

/// Failures are one plain line on standard error, without a stutter.
#[test]
fn failures_are_one_plain_line_without_a_stutter() {
    let env = Env::new();
    let cases: &[&[&str]] = &[
        &["inspect", ""],
        &["run", "--key", "job:x", "--ttl", "1ms", "--", "true"],
        &["run", "--key", "job:x", "--", "/nonexistent/program"],
        &["--store", "bogus://x", "list"],
        &["--store", "memory://", "list"],
        &["--log", "leasehold=nonsense[", "list"],
        &["demo", "--ttl", "soon"],
        &["observe", "x", "--interval", "0s"],
    ];
    for args in cases {
        let c = capture(&env, "failure", env.cmd().args(*args));
        assert!(!c.status.success(), "{args:?}");
        assert!(
            !c.stderr.as_bytes().contains(&ESC),
            "{args:?}: {:?}",
            c.stderr
        );
        assert_eq!(c.stderr.lines().count(), 1, "{args:?}: {}", c.stderr);
        assert!(!c.stderr.contains("WARN"), "{args:?}: {}", c.stderr);
        assert_eq!(stutter(&c.stderr), None, "{args:?}");
    }
}
