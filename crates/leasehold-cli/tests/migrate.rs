//! `leasehold migrate` and the SQL guard from a shell, black-box against private servers:
//! a fresh database sends the shell user to `leasehold migrate` (with the URL, without the
//! password), `migrate` creates everything (idempotent, `--print`, `--json`, bounded, exit
//! codes), and on PostgreSQL, MariaDB and SQLite a stale shell job's write is rejected by
//! the database-side guard after a newer holder wrote. The job scripts are the ones
//! `docs/shell.md` shows (a test checks that the document holds them verbatim).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasehold_testkit::{MariaDb, Postgres, WorkerProcess};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;

use common::{Env, fed, require, stderr, stdout, wait_for_file};

/// The user documentation these tests follow.
const SHELL_DOC: &str = include_str!("../../../docs/shell.md");

/// The PostgreSQL job of `docs/shell.md`.
const PG_JOB: &str = r#"#!/bin/sh
# job-pg.sh: run by `leasehold run`, which sets LEASEHOLD_KEY and LEASEHOLD_FENCE.
set -eu
psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 --single-transaction \
    -v key="$LEASEHOLD_KEY" -v fence="$LEASEHOLD_FENCE" -f - <<'SQL'
SELECT leasehold_guard(:'key', :fence) AS previous_fence \gset
INSERT INTO ledger (fence, note) VALUES (:fence, 'invoice run');
SQL
"#;

/// The MariaDB/MySQL job of `docs/shell.md`.
const MARIADB_JOB: &str = r#"#!/bin/sh
# job-mariadb.sh: run by `leasehold run`, which sets LEASEHOLD_KEY and LEASEHOLD_FENCE.
set -eu
mariadb --host="$DB_HOST" --port="$DB_PORT" --user="$DB_USER" "$DB_NAME" <<SQL
START TRANSACTION;
CALL leasehold_guard('$LEASEHOLD_KEY', $LEASEHOLD_FENCE);
INSERT INTO ledger (fence, note) VALUES ($LEASEHOLD_FENCE, 'invoice run');
COMMIT;
SQL
"#;

/// The SQLite job of `docs/shell.md`.
const SQLITE_JOB: &str = r#"#!/bin/sh
# job-sqlite.sh: run by `leasehold run`, which sets LEASEHOLD_KEY and LEASEHOLD_FENCE.
set -eu
sqlite3 -bail "$DB_FILE" <<SQL
.timeout 5000
BEGIN IMMEDIATE;
INSERT INTO leasehold_guard_check (resource, fence) VALUES ('$LEASEHOLD_KEY', $LEASEHOLD_FENCE);
INSERT INTO ledger (fence, note) VALUES ($LEASEHOLD_FENCE, 'invoice run');
COMMIT;
SQL
"#;

/// Exit code `code` and exactly one line on stderr.
fn assert_one_line(out: &Output, code: i32, what: &str) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
    err
}

fn psql_db(pg: &Postgres, db: &str, sql: &str) -> String {
    let out = pg
        .psql_command()
        .args(["-d", db, "-c", sql])
        .output()
        .unwrap();
    assert!(out.status.success(), "{sql}: {}", stderr(&out));
    stdout(&out).trim_end().to_owned()
}

/// Applies a `--print`ed script with `psql` the way a DBA would (as its header says:
/// `-q`, one transaction), and checks that it printed nothing.
fn psql_apply(pg: &Postgres, db: &str, script: &str) {
    let out = fed(
        pg.psql_command()
            .args(["-d", db, "-q", "--single-transaction", "-f", "-"]),
        script,
    );
    assert!(out.status.success(), "psql -f: {}", stderr(&out));
    assert_eq!(
        (stdout(&out).as_str(), stderr(&out).as_str()),
        ("", ""),
        "the printed SQL is quiet on success (no tags, no NOTICE)"
    );
}

#[test]
fn the_docs_show_the_scripts_the_tests_run() {
    for (name, script) in [
        ("job-pg.sh", PG_JOB),
        ("job-mariadb.sh", MARIADB_JOB),
        ("job-sqlite.sh", SQLITE_JOB),
    ] {
        assert!(
            SHELL_DOC.contains(script),
            "docs/shell.md must show {name} exactly as tests/migrate.rs runs it"
        );
    }
}

#[test]
fn a_fresh_postgres_names_migrate_and_migrate_makes_run_work() {
    let pg = Postgres::start();
    let env = Env::new();
    for (db, scheme) in [
        ("fresh_table", "postgres"),
        ("fresh_adv", "postgres+advisory"),
    ] {
        psql_db(&pg, "postgres", &format!("CREATE DATABASE {db}"));
        // A password in the URL (the server trusts local connections, so it is not checked)
        // must never be echoed back.
        let url = format!("{scheme}://postgres:SeCrEt@127.0.0.1:{}/{db}", pg.port());
        let shown = format!("{scheme}://postgres@127.0.0.1:{}/{db}", pg.port());
        let run = |env: &Env| env.run(&["--store", &url, "run", "--key", "job:x", "--", "true"]);
        let out = run(&env);
        let err = assert_one_line(&out, 69, "run on a fresh database");
        assert!(
            err.contains(&format!("leasehold migrate --store '{shown}'")),
            "{err}"
        );
        assert!(err.contains("leasehold_migrate=true"), "{err}");
        assert!(!err.contains("SeCrEt"), "{err}");
        // inspect says the same.
        let out = env.run(&["--store", &url, "inspect", "job:x"]);
        let err = assert_one_line(&out, 69, "inspect on a fresh database");
        assert!(err.contains("leasehold migrate --store"), "{err}");

        let out = env.run_ok(&["--store", &url, "migrate", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            v["store"],
            if scheme == "postgres" {
                "postgres"
            } else {
                "postgres-advisory"
            }
        );
        assert!(!stdout(&out).contains("SeCrEt"));
        let objects: Vec<String> = v["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(objects.len(), 5, "{objects:?}");
        assert!(objects.iter().any(|o| o.contains("leasehold_records")));
        assert!(
            objects
                .iter()
                .any(|o| o.contains("leasehold_guard(text, bigint)"))
        );
        // Idempotent, and in text.
        let out = env.run_ok(&["--store", &url, "migrate"]);
        assert!(stdout(&out).contains("ready"), "{}", stdout(&out));
        let out = run(&env);
        assert!(out.status.success(), "after migrate: {}", stderr(&out));
        assert_eq!(
            psql_db(&pg, db, "SELECT leasehold_guard('r', 1) IS NULL"),
            "t"
        );
    }
}

#[test]
fn printed_postgres_sql_is_what_a_dba_applies_and_run_then_works() {
    let pg = Postgres::start();
    let env = Env::new();
    psql_db(&pg, "postgres", "CREATE DATABASE dba");
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/dba?leasehold_schema=locks",
        pg.port()
    );
    let out = env.run_ok(&["--store", &url, "migrate", "--print"]);
    let script = stdout(&out);
    assert!(script.contains("CREATE OR REPLACE FUNCTION \"locks\".leasehold_guard"));
    assert!(script.contains(r#"CREATE TABLE IF NOT EXISTS "locks"."leasehold_records""#));
    // --print connects to nothing: the database has nothing yet.
    assert_eq!(
        psql_db(
            &pg,
            "dba",
            "SELECT to_regclass('locks.leasehold_leases') IS NULL"
        ),
        "t"
    );
    assert!(script.contains("-- Apply with: psql -q "), "{script}");
    psql_apply(&pg, "dba", &script);
    // Again: everything exists, and IF NOT EXISTS says so only in a NOTICE, which the
    // script silences.
    psql_apply(&pg, "dba", &script);
    env.run_ok(&["--store", &url, "run", "--key", "job:x", "--", "true"]);
    assert_eq!(
        psql_db(&pg, "dba", "SELECT locks.leasehold_guard('r', 2) IS NULL"),
        "t"
    );
}

#[test]
fn bad_urls_are_usage_errors_and_an_unreachable_store_fails_in_time() {
    let env = Env::new();
    for (url, what) in [
        (
            "postgres://u@127.0.0.1:1/db?leasehold_nope=1",
            "unknown parameter",
        ),
        ("mysql://u@127.0.0.1:1/db?migrate=maybe", "bad value"),
        ("nosuch://x", "unknown scheme"),
        ("memory://", "memory"),
    ] {
        for extra in [&[][..], &["--print"][..]] {
            let out = env
                .cmd()
                .args(["--store", url, "migrate"])
                .args(extra)
                .output()
                .unwrap();
            assert_one_line(&out, 64, what);
        }
    }
    // A closed port: refused at once, exit 69, one line.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    for scheme in ["postgres", "mysql"] {
        let url = format!("{scheme}://u:pw@127.0.0.1:{port}/db");
        let out = env.run(&["--store", &url, "migrate"]);
        let err = assert_one_line(&out, 69, scheme);
        assert!(!err.contains("pw@"), "{err}");
    }
    // A server that accepts and never answers: bounded.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://u@127.0.0.1:{}/db",
        silent.local_addr().unwrap().port()
    );
    let started = Instant::now();
    let out = env.run(&["--store", &url, "migrate"]);
    assert_one_line(&out, 69, "silent server");
    assert!(started.elapsed() < Duration::from_secs(45));
    // The help documents the exit codes.
    let out = env.run(&["migrate", "--help"]);
    let help = stdout(&out);
    for code in ["  0   migrated", "  64  bad usage", "  69  store error"] {
        assert!(help.contains(code), "{code}: {help}");
    }
}

#[test]
fn mariadb_fresh_database_migrate_and_print() {
    let db = MariaDb::start();
    let env = Env::new();
    for (name, scheme) in [("fresh_table", "mysql"), ("fresh_lock", "mysql+getlock")] {
        db.sql(&format!("CREATE DATABASE {name}"));
        // migrate=false: the stores would create their table on connect otherwise.
        let url = format!(
            "{scheme}://root@127.0.0.1:{}/{name}?migrate=false",
            db.port()
        );
        let out = env.run(&["--store", &url, "run", "--key", "job:x", "--", "true"]);
        let err = assert_one_line(&out, 69, "run on a fresh database");
        assert!(err.contains("leasehold migrate --store"), "{err}");
        for _ in 0..2 {
            let out = env.run_ok(&["--store", &url, "migrate", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["objects"].as_array().unwrap().len(), 5, "{v}");
        }
        env.run_ok(&["--store", &url, "run", "--key", "job:x", "--", "true"]);
        let n = db.sql(&format!(
            "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = '{name}' \
             AND ROUTINE_NAME = 'leasehold_guard'"
        ));
        assert_eq!(n, "1");
    }
    // --print, applied with the mariadb client to an empty database, is enough.
    db.sql("CREATE DATABASE dba");
    let url = format!("mysql://root@127.0.0.1:{}/dba?migrate=false", db.port());
    let out = env.run_ok(&["--store", &url, "migrate", "--print"]);
    let script = stdout(&out);
    assert!(script.contains("DELIMITER"), "{script}");
    assert!(script.contains("leasehold_records"), "{script}");
    let applied = fed(db.client_command().arg("dba"), &script);
    assert!(applied.status.success(), "{}", stderr(&applied));
    env.run_ok(&["--store", &url, "run", "--key", "job:x", "--", "true"]);
}

#[test]
fn sqlite_migrate_and_print() {
    let env = Env::new();
    let file = env.path("app.db");
    let url = format!("sqlite://{}", file.display());
    let out = env.run_ok(&["--store", &url, "migrate", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["store"], "sqlite");
    let out = env.run_ok(&["--store", &url, "migrate", "--print"]);
    let script = stdout(&out);
    assert!(script.contains("leasehold_records"), "{script}");
    // The printed script builds a working database with the sqlite3 shell, twice.
    let dba = env.path("dba.db");
    for _ in 0..2 {
        let applied = sqlite3(&dba, &script);
        assert!(applied.status.success(), "{}", stderr(&applied));
    }
    let out = sqlite3(
        &dba,
        "INSERT INTO leasehold_guard_check VALUES ('r', 2);\nINSERT INTO leasehold_guard_check VALUES ('r', 1);\n",
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("stale fence rejected"),
        "{}",
        stderr(&out)
    );
    let url = format!("sqlite://{}", dba.display());
    env.run_ok(&["--store", &url, "run", "--key", "job:x", "--", "true"]);
}

fn sqlite3(db: &Path, script: &str) -> Output {
    require("sqlite3", "sqlite3");
    fed(Command::new("sqlite3").arg("-bail").arg(db), script)
}

/// The guard process `leasehold run` (pid `run`) started: its child running `__guard`.
fn guard_pid_of(run: u32) -> i32 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid: Option<u32> = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if ppid == Some(run) && cmdline.split(|b| *b == 0).any(|a| a == b"__guard") {
                return pid;
            }
        }
        assert!(Instant::now() < until, "no guard process under {run}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The stale-writer story from a shell, on any store and database:
///
/// 1. A `leasehold run` whose command writes `first.fence` and then waits for `go` (its
///    pause) before running `job`.
/// 2. A's `leasehold run` and its guard process are frozen (`SIGSTOP`): nothing on the
///    host can stop A's command any more, and A's lease expires in the store.
/// 3. B's `leasehold run` takes the lease (a higher fence) and runs `job`: committed.
/// 4. A's command is woken (`go`) and runs `job` with its old fence: the database-side
///    guard rejects it and its transaction rolls back.
///
/// Returns (A's fence, B's fence, A's job output); A's job and A's `leasehold run` must
/// fail.
fn stale_writer_story(
    env: &Env,
    store: &str,
    job: &str,
    job_env: &[(&str, String)],
) -> (u64, u64, String) {
    let script = env.path("job.sh");
    std::fs::write(&script, job).unwrap();
    let first_fence = env.path("first.fence");
    let go = env.path("go");
    let first_status = env.path("first.status");
    let first_out = env.path("first.out");
    let paused = format!(
        "echo \"$LEASEHOLD_FENCE\" > {fence}; while [ ! -e {go} ]; do sleep 0.05; done; \
         sh {script} > {out} 2>&1; s=$?; echo $s > {status}; exit $s",
        fence = first_fence.display(),
        go = go.display(),
        script = script.display(),
        out = first_out.display(),
        status = first_status.display(),
    );
    let mut first = env.cmd();
    first
        .args([
            "--store",
            store,
            "run",
            "--key",
            "job:invoices",
            "--ttl",
            "3s",
        ])
        .args(["--", "sh", "-c", &paused]);
    for (k, v) in job_env {
        first.env(k, v);
    }
    let first = WorkerProcess::spawn(first);
    let fence_a: u64 = wait_for_file(&first_fence, Duration::from_secs(30))
        .trim()
        .parse()
        .unwrap();
    let guard = guard_pid_of(first.pid());
    kill(Pid::from_raw(guard), Signal::SIGSTOP).unwrap();
    kill(Pid::from_raw(first.pid() as i32), Signal::SIGSTOP).unwrap();

    let mut second = env.cmd();
    second
        .args([
            "--store",
            store,
            "run",
            "--key",
            "job:invoices",
            "--wait",
            "60s",
        ])
        .args(["--", "sh", "-c", "echo \"$LEASEHOLD_FENCE\"; sh \"$0\""])
        .arg(&script);
    for (k, v) in job_env {
        second.env(k, v);
    }
    let out = second.output().unwrap();
    assert!(
        out.status.success(),
        "the second holder's job: {}",
        stderr(&out)
    );
    let fence_b: u64 = stdout(&out).lines().next().unwrap().trim().parse().unwrap();
    assert!(fence_b > fence_a, "{fence_b} > {fence_a}");

    std::fs::write(&go, "").unwrap();
    let status = wait_for_file(&first_status, Duration::from_secs(30));
    let output = std::fs::read_to_string(&first_out).unwrap();
    assert_ne!(status.trim(), "0", "the stale job must fail: {output}");

    kill(Pid::from_raw(guard), Signal::SIGCONT).unwrap();
    first.resume();
    let exit = first
        .wait_timeout(Duration::from_secs(20))
        .expect("the first run exits once resumed");
    // Its command ended while it was frozen: it sees that end only after the lease's
    // deadline, so it reports 71 (completed_after_loss), whatever the command's status.
    assert_eq!(exit.code(), Some(71), "the first run: {exit:?}");
    (fence_a, fence_b, output)
}

#[test]
fn postgres_shell_job_stale_write_is_rejected_by_the_sql_guard() {
    let pg = Postgres::start();
    let env = Env::new();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port());
    env.run_ok(&["--store", &url, "migrate"]);
    pg.psql("CREATE TABLE ledger (fence bigint NOT NULL, note text NOT NULL)");
    let psql_dir = pg.bin_dir().to_path_buf();
    let path = format!(
        "{}:{}",
        psql_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (fence_a, fence_b, output) = stale_writer_story(
        &env,
        &url,
        PG_JOB,
        &[("DATABASE_URL", url.clone()), ("PATH", path)],
    );
    assert!(output.contains("leasehold_guard: fence"), "{output}");
    assert!(
        output.contains(&format!("fence {fence_a} rejected")),
        "{output}"
    );
    assert!(
        output.contains(&format!("current fence is {fence_b}")),
        "{output}"
    );
    assert_eq!(
        pg.psql("SELECT string_agg(fence::text, ',') FROM ledger"),
        fence_b.to_string(),
        "only the second holder's write"
    );
    assert_eq!(
        pg.psql("SELECT fence FROM leasehold_guard WHERE resource = 'job:invoices'"),
        fence_b.to_string()
    );
}

/// Issue 27 item 5: the PostgreSQL job of `docs/shell.md` prints nothing when its write
/// is accepted (psql's tags off with `-q`, the guard's answer kept by `\gset`), and
/// `leasehold run` around it adds nothing either.
#[test]
fn postgres_shell_job_prints_nothing_on_success() {
    let pg = Postgres::start();
    let env = Env::new();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port());
    env.run_ok(&["--store", &url, "migrate"]);
    pg.psql("CREATE TABLE ledger (fence bigint NOT NULL, note text NOT NULL)");
    let script = env.path("job-pg.sh");
    std::fs::write(&script, PG_JOB).unwrap();
    let path = format!(
        "{}:{}",
        pg.bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for round in 0..2 {
        let out = env
            .cmd()
            .args(["--store", &url, "run", "--key", "job:invoices", "--", "sh"])
            .arg(&script)
            .env("DATABASE_URL", &url)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "round {round}: {}", stderr(&out));
        assert_eq!(
            (stdout(&out).as_str(), stderr(&out).as_str()),
            ("", ""),
            "round {round}: an accepted write prints nothing"
        );
    }
    assert_eq!(pg.psql("SELECT count(*) FROM ledger"), "2");
}

#[test]
fn mariadb_shell_job_stale_write_is_rejected_by_the_procedure() {
    let db = MariaDb::start();
    let env = Env::new();
    let url = format!("mysql://root@127.0.0.1:{}/test", db.port());
    env.run_ok(&["--store", &url, "migrate"]);
    db.sql(
        "CREATE TABLE ledger (fence BIGINT UNSIGNED NOT NULL, note TEXT NOT NULL) ENGINE=InnoDB",
    );
    let (fence_a, fence_b, output) = stale_writer_story(
        &env,
        &url,
        MARIADB_JOB,
        &[
            ("DB_HOST", "127.0.0.1".into()),
            ("DB_PORT", db.port().to_string()),
            ("DB_USER", "root".into()),
            ("DB_NAME", "test".into()),
        ],
    );
    assert!(
        output.contains(&format!(
            "leasehold_guard: fence {fence_a} rejected for job:invoices: current fence {fence_b}"
        )),
        "{output}"
    );
    assert_eq!(
        db.sql("SELECT GROUP_CONCAT(fence) FROM ledger"),
        fence_b.to_string(),
        "only the second holder's write"
    );
}

#[test]
fn sqlite_shell_job_stale_write_is_rejected_by_the_trigger() {
    let env = Env::new();
    // The leases in the default store; the application's data in its own file, which
    // `leasehold migrate` prepares with the guard.
    let app = env.path("app.db");
    let app_url = format!("sqlite://{}", app.display());
    env.run_ok(&["--store", &app_url, "migrate"]);
    let created = sqlite3(
        &app,
        "CREATE TABLE ledger (fence INTEGER NOT NULL, note TEXT NOT NULL);\n",
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let store = format!("sqlite://{}", env.path("leases.db").display());
    let (_fence_a, fence_b, output) = stale_writer_story(
        &env,
        &store,
        SQLITE_JOB,
        &[("DB_FILE", app.display().to_string())],
    );
    assert!(output.contains("stale fence rejected"), "{output}");
    let data = sqlite3(
        &app,
        "SELECT group_concat(fence) FROM ledger;\nSELECT fence FROM leasehold_guard WHERE resource = 'job:invoices';\n",
    );
    assert_eq!(
        stdout(&data),
        format!("{fence_b}\n{fence_b}\n"),
        "only the second holder's write"
    );
}
