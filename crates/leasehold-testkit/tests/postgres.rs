//! Private PostgreSQL: start, query, pause, immediate stop and restart.

use std::time::Duration;

use leasehold_testkit::{Postgres, PostgresOptions};

/// The `/proc` state letter of every descendant of `pid` and of `pid` itself.
fn tree_states(pid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let state = rest
            .split_whitespace()
            .next()
            .unwrap()
            .chars()
            .next()
            .unwrap();
        out.push((p, state));
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
                continue;
            };
            let rest = &stat[stat.rfind(')').unwrap() + 1..];
            let ppid: u32 = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
            if ppid == p {
                frontier.push(child);
            }
        }
    }
    out
}

#[test]
fn start_query_stop_immediate_start_again() {
    let pg = Postgres::start();
    let port = pg.port();
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    );
    assert_eq!(pg.psql("select 1"), "1");
    assert_eq!(pg.psql("show fsync"), "off");
    pg.psql("create table t (id int primary key, v text)");
    pg.psql("insert into t values (1, 'one'), (2, 'two')");
    assert_eq!(pg.psql("select v from t order by id"), "one\ntwo");
    assert!(pg.try_psql("select * from no_such_table").is_err());

    let old_pid = pg.pid();
    pg.stop_immediate();
    assert!(!pg.is_running());
    assert!(pg.try_psql("select 1").is_err());
    pg.start_again();
    assert_ne!(pg.pid(), old_pid);
    assert_eq!(pg.port(), port);
    assert_eq!(pg.psql("select count(*) from t"), "2");
    assert!(pg.log().contains("database system was interrupted"));

    // A crash: SIGKILL of the postmaster and its backends, then recovery.
    pg.kill();
    assert!(!pg.is_running());
    pg.start_again();
    assert_eq!(pg.psql("select count(*) from t"), "2");

    pg.restart();
    assert_eq!(pg.psql("select 1"), "1");
}

#[test]
fn pause_freezes_postmaster_and_backends() {
    let pg = Postgres::start();
    let tree = tree_states(pg.pid());
    assert!(
        tree.len() > 1,
        "postmaster has background processes: {tree:?}"
    );
    pg.pause();
    assert!(pg.is_paused());
    let tree = tree_states(pg.pid());
    assert!(
        // Stopped, or a zombie the stopped postmaster has not reaped yet.
        tree.iter().all(|&(_, state)| state == 'T' || state == 'Z'),
        "not every process is stopped: {tree:?}"
    );
    // A new connection cannot complete its startup while paused.
    let mut cmd = pg.psql_command();
    cmd.env("PGCONNECT_TIMEOUT", "2").arg("-c").arg("select 1");
    let started = std::time::Instant::now();
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() >= Duration::from_millis(1500));

    pg.resume();
    assert!(!pg.is_paused());
    assert_eq!(pg.psql("select 1"), "1");
}

#[test]
fn fsync_option_and_settings() {
    let pg = Postgres::start_with(
        PostgresOptions::new()
            .fsync(true)
            .setting("max_connections", "37"),
    );
    assert_eq!(pg.psql("show fsync"), "on");
    assert_eq!(pg.psql("show max_connections"), "37");
    // psql runs against the private server, never the system one.
    assert_eq!(pg.psql("show port"), pg.port().to_string());
}

#[test]
fn drop_cleans_up_paused_and_killed_servers() {
    let paused = Postgres::start();
    let tree: Vec<u32> = tree_states(paused.pid())
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let dir = paused.data_dir();
    paused.pause();
    drop(paused);
    for pid in &tree {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} left behind"
        );
    }
    assert!(!dir.exists(), "data directory left behind");

    let killed = Postgres::start();
    let tree: Vec<u32> = tree_states(killed.pid())
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    killed.kill();
    for pid in &tree {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} left behind after kill"
        );
    }
    drop(killed);
}
