//! What operators and scripts rely on: exit statuses and one-line errors for every
//! subcommand, `run --json`, the man page and completions, and the metrics as Prometheus
//! tooling sees them (the `/metrics` output linted by `promtool`, the dashboard and the
//! alerting rules naming only metrics the core records).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use leasehold::metrics::{ALL, Kind};

mod common;

use common::{BIN, Env, fed, require, stderr, stdout, wait_for_file};

/// The repository root (the ops/ and docs/ files live there).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

// --- Exit statuses and errors -------------------------------------------------------

/// Every subcommand users see.
const SUBCOMMANDS: [&str; 12] = [
    "run",
    "inspect",
    "list",
    "break",
    "leader",
    "observe",
    "migrate",
    "doctor",
    "demo",
    "completions",
    "man",
    "install-completions",
];

/// Issue 13.3: each subcommand, given bad input — a bad URL, a bad duration, a key with a
/// control character, an unreachable store — fails with exactly one line on standard
/// error (no panic, no backtrace) and the exit status its `--help` documents.
#[test]
fn every_subcommand_fails_with_one_line_and_its_documented_status() {
    let env = Env::new();
    let port = leasehold_testkit::free_port();
    let down = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let unwritable = env.path("file");
    std::fs::write(&unwritable, "").unwrap();
    let under_a_file = unwritable.join("data");
    let cases: Vec<(Vec<&str>, i32)> = vec![
        // run
        (
            vec!["--store", "nope://h/", "run", "--key", "k", "--", "true"],
            64,
        ),
        (
            vec!["run", "--key", "k", "--ttl", "3 fortnights", "--", "true"],
            64,
        ),
        (vec!["run", "--key", "k", "--wait", "-1s", "--", "true"], 64),
        (vec!["run", "--key", "a\u{1}b", "--", "true"], 64),
        (
            vec!["--store", &down, "run", "--key", "k", "--", "true"],
            69,
        ),
        // inspect
        (vec!["--store", "redis://h:notaport/", "inspect", "k"], 64),
        (vec!["inspect", "line\nbreak"], 64),
        (vec!["--store", &down, "inspect", "k"], 69),
        // list
        (vec!["--store", "not a url", "list"], 64),
        (vec!["--store", &down, "list", "job:"], 69),
        // break
        (vec!["--store", "mysql://h:99999/db", "break", "k"], 64),
        (vec!["break", "tab\there"], 64),
        (vec!["--store", &down, "break", "k"], 69),
        (
            vec!["run", "--key", "k", "--permits", "0", "--", "true"],
            64,
        ),
        (
            vec!["run", "--key", "k", "--permits", "1025", "--", "true"],
            64,
        ),
        // leader, observe
        (vec!["--store", "nope://h/", "leader", "k"], 64),
        (vec!["leader", "bell\u{7}"], 64),
        (vec!["--store", &down, "leader", "k"], 69),
        (vec!["observe", "k", "--interval", "0s"], 64),
        (vec!["--store", &down, "observe", "k"], 69),
        // migrate
        (vec!["--store", "nope://h/", "migrate"], 64),
        (vec!["migrate", "--store", "postgres://h:notaport/db"], 64),
        (vec!["migrate", "--print", "--store", "memory://"], 64),
        (vec!["--store", &down, "migrate"], 69),
        // doctor
        (vec!["--store", "nope://h/", "doctor"], 64),
        (vec!["doctor", "--require", "mostly"], 64),
        (vec!["doctor", "--row", "eviction"], 64),
        (vec!["--store", &down, "doctor"], 69),
        // demo
        (vec!["demo", "--ttl", "soon"], 64),
        (vec!["demo", "--ttl", "1ms"], 64),
        // completions, man, install-completions
        (vec!["completions", "tcsh"], 64),
        (vec!["man", "extra"], 64),
        (vec!["install-completions", "--shell", "csh"], 64),
        (
            vec![
                "install-completions",
                "--data-dir",
                under_a_file.to_str().unwrap(),
            ],
            73,
        ),
        // global
        (vec!["--metrics-addr", "nowhere", "list"], 64),
        (vec!["--log", "[[[", "list"], 64),
    ];
    for (args, code) in &cases {
        let out = env.run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {err}");
        assert_eq!(
            err.lines().count(),
            1,
            "{args:?}: one line expected on stderr, got {err:?}"
        );
        assert!(err.starts_with("leasehold: "), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{args:?}: {err}"
        );
    }
}

/// The exit statuses of one subcommand, as its `--help` lists them.
fn statuses_in_help(env: &Env, sub: &str) -> BTreeSet<u8> {
    let out = env.run(&[sub, "--help"]);
    assert!(out.status.success(), "{sub} --help");
    let help = stdout(&out);
    let block = help
        .split_once("\nExit status")
        .unwrap_or_else(|| panic!("{sub} --help has no exit statuses:\n{help}"))
        .1;
    block
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// `docs/cli.md`'s exit-status table: subcommand → statuses.
fn statuses_in_docs() -> BTreeMap<String, BTreeSet<u8>> {
    let doc = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let section = doc
        .split_once("\n## Exit statuses\n")
        .expect("docs/cli.md has an Exit statuses section")
        .1;
    let section = section.split_once("\n## ").map_or(section, |(s, _)| s);
    let mut table: BTreeMap<String, BTreeSet<u8>> = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `run` | 64 | meaning |
        if cells.len() >= 4
            && let Some(sub) = cells[1].strip_prefix('`').and_then(|c| c.strip_suffix('`'))
            && let Ok(code) = cells[2].parse::<u8>()
        {
            table.entry(sub.to_owned()).or_default().insert(code);
        }
    }
    table
}

#[test]
fn each_subcommand_documents_its_exit_statuses_in_its_help_and_in_docs_cli_md() {
    let env = Env::new();
    let docs = statuses_in_docs();
    for sub in SUBCOMMANDS {
        let help = statuses_in_help(&env, sub);
        assert!(help.contains(&64), "{sub}: {help:?}");
        // `run` passes the command's own status through; the others have 0.
        let mut documented = docs.get(sub).cloned().unwrap_or_default();
        if sub == "run" {
            documented.remove(&0);
        }
        assert_eq!(help, documented, "{sub}: --help vs docs/cli.md");
    }
    assert_eq!(
        docs.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        SUBCOMMANDS.into_iter().collect(),
        "docs/cli.md documents a subcommand that does not exist, or misses one"
    );
}

/// The last line of standard output: `run --json`'s result object.
fn result_of(out: &Output) -> serde_json::Value {
    let printed = stdout(out);
    let last = printed.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {printed:?}"))
}

/// `run --json` tells a script what the exit status alone cannot: whether 75 came from
/// the command or meant "not acquired", the fence it ran under, whether it was released.
#[test]
fn run_json_tells_the_commands_status_from_leaseholds_own() {
    let env = Env::new();
    let out = env.run(&[
        "run",
        "--json",
        "--key",
        "job:j",
        "--",
        "sh",
        "-c",
        "echo hello; exit 75",
    ]);
    assert_eq!(out.status.code(), Some(75));
    assert!(stdout(&out).starts_with("hello\n"), "{}", stdout(&out));
    let v = result_of(&out);
    assert_eq!(v["outcome"], "completed", "{v}");
    assert_eq!(v["exit_code"], 75, "{v}");
    assert_eq!(v["key"], "job:j");
    assert!(v["fence"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["owner"].as_str().unwrap().len(), 32, "{v}");
    assert_eq!(v["released"], true, "{v}");
    assert!(v["held_ms"].is_u64(), "{v}");
    assert!(v["error"].is_null(), "{v}");

    // Held by another run: 75 again, but "not_acquired".
    let pidfile = env.path("holder.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = env
        .cmd()
        .args(["run", "--key", "job:j", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for_file(&pidfile, Duration::from_secs(20));
    let out = env.run(&["run", "--json", "--key", "job:j", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    let v = result_of(&out);
    assert_eq!(v["outcome"], "not_acquired", "{v}");
    assert_eq!(v["exit_code"], 75);
    assert!(v["fence"].is_null() && v["released"] == false, "{v}");
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    let _ = holder.kill();
    let _ = holder.wait();

    // Bad input: the object still comes, with the one-line error.
    let out = env.run(&["run", "--json", "--key", "a\u{7}b", "--", "true"]);
    assert_eq!(out.status.code(), Some(64));
    let v = result_of(&out);
    assert_eq!(v["outcome"], "usage", "{v}");
    assert!(v["error"].as_str().unwrap().contains("invalid key"), "{v}");

    let out = env.run(&["run", "--json", "--key", "k", "--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(126));
    assert_eq!(result_of(&out)["outcome"], "cannot_execute");
}

// --- Man page and completions ------------------------------------------------------

/// Issue 13.5: `leasehold man` is one page that covers every subcommand, and groff
/// renders it without a single warning.
#[test]
fn man_prints_a_page_groff_renders_without_warnings() {
    require("groff", "groff-base");
    let env = Env::new();
    let out = env.run_ok(&["man"]);
    let page = stdout(&out);
    assert!(page.contains("\n.TH LEASEHOLD 1 "), "{page}");
    for section in ["NAME", "SYNOPSIS", "OPTIONS", "COMMANDS", "EXIT STATUS"] {
        assert!(
            page.contains(&format!(".SH {section}\n"))
                || page.contains(&format!(".SH \"{section}\"\n")),
            "{section} missing"
        );
    }
    for sub in SUBCOMMANDS {
        assert!(
            page.contains(&format!(".SS \"leasehold {sub}\"\n")),
            "no subsection for {sub}"
        );
    }
    assert!(page.is_ascii(), "groff reads ASCII");
    let rendered = fed(
        Command::new("groff").args(["-man", "-Tutf8", "-ww", "-z"]),
        &page,
    );
    assert!(rendered.status.success());
    assert_eq!(stderr(&rendered), "", "groff warnings");
}

#[test]
fn install_completions_writes_the_man_page_and_each_shells_completions() {
    let env = Env::new();
    let data = env.path("share");
    let out = env.run_ok(&["install-completions", "--data-dir", data.to_str().unwrap()]);
    let written: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    let expected = [
        "man/man1/leasehold.1",
        "bash-completion/completions/leasehold",
        "zsh/site-functions/_leasehold",
        "fish/vendor_completions.d/leasehold.fish",
    ];
    assert_eq!(written.len(), expected.len(), "{written:?}");
    for (line, rel) in written.iter().zip(expected) {
        let path = data.join(rel);
        assert_eq!(line, path.to_str().unwrap());
        let content = std::fs::read_to_string(&path).unwrap();
        assert!(content.contains("leasehold"), "{rel}");
    }
    let man = std::fs::read_to_string(data.join(expected[0])).unwrap();
    assert_eq!(man, stdout(&env.run(&["man"])));
    // The bash completion parses.
    let bash = Command::new("bash")
        .arg("-n")
        .arg(data.join(expected[1]))
        .output()
        .unwrap();
    assert!(bash.status.success(), "{}", stderr(&bash));
    // Default: $XDG_DATA_HOME, one shell when asked.
    env.run_ok(&["install-completions", "--shell", "bash"]);
    assert!(
        env.path("data/bash-completion/completions/leasehold")
            .is_file()
    );
    assert!(env.path("data/man/man1/leasehold.1").is_file());
    assert!(!env.path("data/zsh").exists());
}

/// Printing into a pipe closed early (`| head -1`) ends quietly, with no panic.
#[test]
fn a_closed_pipe_is_not_a_panic() {
    for args in [&["man"][..], &["completions", "zsh"][..]] {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(stderr(&out), "", "{args:?}");
    }
    // The admin commands print after a store round trip: the pipe is closed by then.
    let env = Env::new();
    let sqlite = format!("sqlite://{}", env.path("pipe.db").display());
    for args in [
        &["inspect", "job:k"][..],
        &["list", "--json"][..],
        &["break", "job:k"][..],
        &["migrate", "--print"][..],
    ] {
        let mut child = env
            .cmd()
            .args(["--store", &sqlite])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

// --- Metrics, dashboard, alerts -----------------------------------------------------

/// Issue 13.4c: the `/metrics` output of a running `leasehold run`, after a renewal, is
/// accepted by `promtool check metrics` (names, types, help, units), and has the slack
/// histogram with buckets.
#[test]
fn promtool_accepts_the_metrics_of_a_running_leasehold() {
    require("promtool", "prometheus");
    let env = Env::new();
    let port = leasehold_testkit::free_port();
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; sleep 3", pidfile.display());
    let mut holder = env
        .cmd()
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["run", "--key", "job:scraped", "--ttl", "1500ms", "--"])
        .args(["sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&pidfile, Duration::from_secs(20));
    // Renewals every 500 ms (a TTL of 1.5 s leaves each 250 ms on a loaded machine, where
    // 600 ms left 100 ms and SQLite's fsync could miss it): wait until one was confirmed.
    let until = Instant::now() + Duration::from_secs(20);
    let body = loop {
        std::thread::sleep(Duration::from_millis(300));
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        if body.contains("leasehold_renewal_slack_seconds_bucket") {
            break body;
        }
        assert!(Instant::now() < until, "no renewal slack in {body}");
    };
    for name in [
        "leasehold_acquire_total",
        "leasehold_renew_total",
        "leasehold_renew_latency_seconds_bucket",
        "# HELP leasehold_renewal_slack_seconds",
        "# TYPE leasehold_renewal_slack_seconds histogram",
    ] {
        assert!(body.contains(name), "{name} missing from {body}");
    }
    let checked = fed(Command::new("promtool").args(["check", "metrics"]), &body);
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {} {}\n{body}",
        stdout(&checked),
        stderr(&checked)
    );
    let status = holder.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// Every `leasehold_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("leasehold_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// A rename of a metric in the core breaks this test until the dashboard and the rules
/// follow it.
#[test]
fn dashboard_and_alert_rules_use_only_metrics_the_core_records() {
    for file in [
        "ops/grafana/leasehold.json",
        "ops/prometheus/leasehold-rules.yml",
        "ops/prometheus/leasehold-rules.test.yml",
    ] {
        let content = std::fs::read_to_string(root().join(file)).unwrap();
        let names = metric_names(&content);
        assert!(names.len() >= 3, "{file}: {names:?}");
        for name in &names {
            let known = ALL.iter().any(|(base, kind)| match kind {
                Kind::Counter | Kind::Gauge => name == base,
                Kind::Histogram => ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| *name == format!("{base}{s}")),
            });
            assert!(known, "{file} uses {name}, which the core does not record");
        }
    }
    // Each alert is there, and the dashboard shows every metric.
    let rules = std::fs::read_to_string(root().join("ops/prometheus/leasehold-rules.yml")).unwrap();
    for alert in [
        "LeaseholdLeaseLost",
        "LeaseholdFenceRejected",
        "LeaseholdAcquireErrors",
        "LeaseholdRenewalSlackLow",
        "LeaseholdLeasesAtRisk",
    ] {
        assert!(rules.contains(&format!("alert: {alert}")), "{alert}");
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("ops/grafana/leasehold.json")).unwrap(),
    )
    .unwrap();
    let exprs: String = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned() + "\n")
        .collect();
    for (base, _) in ALL {
        assert!(exprs.contains(base), "the dashboard does not show {base}");
    }
}
